"""Bad input to `jaxbuffers.save` / `restore`: paths that are not folders' paths, objects that are not buffers, targets
of another class, configuration, shape or dtype, bad shardings and progress flags. Refused with an error naming the
argument (or, for a target the checkpoint does not match, a `CheckpointError` naming the target), before anything is
created or read: the checkpoint on disk and the buffers byte-identical; the accepted forms restore exactly the
saved buffer."""

from __future__ import annotations

import atexit
import os
import pathlib
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS, refused, snapshot

FEW = settings(SETTINGS, max_examples=10)
ITEM = {"obs": jnp.zeros((2,), jnp.float32), "a": jnp.int32(0)}
BUF = jb.ReplayBuffer.create(ITEM, capacity=4).add({"obs": np.ones((3, 2), np.float32), "a": np.arange(3, dtype=np.int32)})
ROOT = pathlib.Path(tempfile.mkdtemp(prefix="jb-bad-ckpt-"))
atexit.register(shutil.rmtree, ROOT, True)
SAVED = jb.save(ROOT / "saved", BUF, progress=False)
BAD_PATHS = st.sampled_from([None, 1, 2.5, b"/tmp/x", "", ["a"], BUF])
BAD_PROGRESS = st.sampled_from(["x", 1, 0, [True], np.array([True])])


def tree(root: pathlib.Path = ROOT) -> list[tuple]:
    """Every file and folder under `root` with its size and modification time in nanoseconds (any write changes
    them): what a refused call must leave as it was."""
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


def on_disk() -> tuple:
    return tree(), snapshot(BUF)


@SETTINGS
@given(directory=BAD_PATHS, progress=BAD_PROGRESS)
@example(directory=None, progress="x")  # was Python's "expected str, bytes or os.PathLike object"; progress="x" showed a bar
@example(directory="", progress=1)  # "" was the working folder
def test_bad_paths_and_progress(directory, progress):
    refused(lambda: jb.save(directory, BUF), "directory", state=on_disk)
    refused(lambda: jb.restore(directory), "directory", state=on_disk)
    refused(lambda: jb.save(ROOT / "new", BUF, progress=progress), "progress", state=on_disk)
    refused(lambda: jb.restore(SAVED, progress=progress), "progress", state=on_disk)


@SETTINGS
@given(buffer=st.sampled_from([None, 3, "buf", {"obs": np.zeros(2)}, BUF.storage, jb.RateLimiter.create(1.0), [BUF]]),
       fresh=st.booleans())
@example(buffer=None, fresh=True)  # the parent folders were created before the buffer was refused
def test_save_refuses_what_is_not_a_buffer(buffer, fresh):
    """Nothing is created (a missing parent folder neither) and an existing checkpoint is kept."""
    path = ROOT / "parent" / "child" if fresh else SAVED
    refused(lambda: jb.save(path, buffer), "buffer", state=on_disk)
    assert not (ROOT / "parent").exists()


def test_save_inside_jit_names_the_traced_buffer():
    """A save traced inside jit is refused naming `buffer` and where save runs; nothing is written."""
    before = on_disk()

    def step(b):
        jb.save(SAVED, b)
        return b

    with pytest.raises(TypeError, match=r"buffer: expected concrete arrays, got traced values: save runs outside jax.jit"):
        jax.jit(step)(BUF)
    assert on_disk() == before


def _orbax_save(directory: pathlib.Path, buffer) -> None:
    import orbax.checkpoint as ocp

    with ocp.Checkpointer(jb.checkpoint.BufferCheckpointHandler()) as checkpointer:
        checkpointer.save(directory, args=jb.BufferSave(buffer))


@pytest.mark.parametrize("save", [
    lambda b: jb.save(ROOT / "donated", b), lambda b: jb.save(ROOT / "donated", b, blocking=False).wait(),
    lambda b: jb.checkpoint.to_bytes({"b": b}), lambda b: _orbax_save(ROOT / "orbax", b),
], ids=["blocking", "background", "to_bytes", "orbax"])
def test_saving_a_donated_buffer_names_the_class_and_save(save):
    """A buffer whose arrays were donated to a jitted call is refused as its own methods refuse it, naming its class
    and save (not JAX's "Array has been deleted"); nothing is written."""
    buf = jb.ReplayBuffer.create(ITEM, capacity=4).add({"obs": np.ones((3, 2), np.float32), "a": np.arange(3, dtype=np.int32)})
    jax.jit(jb.ReplayBuffer.add, donate_argnums=0)(buf, {"obs": np.ones((1, 2), np.float32), "a": np.zeros(1, np.int32)})
    before = tree()
    with pytest.raises(RuntimeError, match=r"(save|BufferSave): the ReplayBuffer given holds arrays that were donated to a jitted call"):
        save(buf)
    assert [t for t in tree() if not t[0].startswith("orbax")]  # orbax makes its folder first == before


@SETTINGS
@given(target=st.sampled_from([3, "x", {"obs": np.zeros(2)}, BUF.storage, jb.RateLimiter.create(1.0)]))
def test_restore_refuses_a_target_that_is_not_a_buffer(target):
    refused(lambda: jb.restore(SAVED, target), "target", state=on_disk)


@pytest.mark.parametrize("target, came", [(5, "got int 5"), ("x", "got str 'x'"), (BUF.storage, "got dict")])
def test_a_target_that_is_not_a_buffer_is_named_with_what_came(target, came):
    """A scalar or str target is shown; a tree (of arrays, maybe large) by its type only."""
    assert str(refused(lambda: jb.restore(SAVED, target), "target", state=on_disk)).endswith(came)


TARGETS = {
    "class": lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=4),
    "capacity": lambda: jb.ReplayBuffer.create(ITEM, capacity=8),
    "shape": lambda: jb.ReplayBuffer.create({**ITEM, "obs": jnp.zeros((3,), jnp.float32)}, capacity=4),
    "dtype": lambda: jb.ReplayBuffer.create({**ITEM, "a": jnp.float32(0)}, capacity=4),
    "field": lambda: jb.ReplayBuffer.create({**ITEM, "b": jnp.int32(0)}, capacity=4),
    "stacked": lambda: jax.vmap(lambda _: jb.ReplayBuffer.create(ITEM, capacity=4))(jnp.arange(2)),
}


@FEW
@given(kind=st.sampled_from(sorted(TARGETS)), abstract=st.booleans())
def test_restore_refuses_a_target_of_another_configuration(kind, abstract):
    """A concrete or abstract target the checkpoint does not match: `CheckpointError` naming the target; the target
    unchanged."""
    target = jax.eval_shape(TARGETS[kind]) if abstract else TARGETS[kind]()
    before = snapshot(target) if not abstract else None
    refused(lambda: jb.restore(SAVED, target), ("target", "target's"), state=on_disk, exc=(jb.CheckpointError,))
    if not abstract:
        assert snapshot(target) == before


@SETTINGS
@given(sharding=st.sampled_from([3, "cpu", [jax.devices()[0]], {"storage": 1}, jax.devices()]))
def test_restore_bad_sharding(sharding):
    """A wrong kind of argument is a TypeError (section 8 of the guide), a tree of Shardings of another size a
    ValueError."""
    refused(lambda: jb.restore(SAVED, sharding=sharding), "sharding", state=on_disk, exc=(TypeError,))
    two = (jax.sharding.SingleDeviceSharding(jax.devices()[0]),) * 2
    refused(lambda: jb.restore(SAVED, sharding=two), "sharding", state=on_disk, exc=(ValueError,))


@FEW
@given(path_form=st.sampled_from(["str", "path", "pathlike"]), target=st.sampled_from(["none", "concrete", "abstract"]),
       sharding=st.sampled_from(["none", "device", "sharding"]))
def test_accepted_forms_restore_the_saved_buffer(path_form, target, sharding):
    """The table: a folder as a str, a `pathlib.Path` or any `os.PathLike`; no target, a concrete or an abstract one;
    a `jax.Device` or a `Sharding`: each restores exactly the saved bytes."""

    class Like(os.PathLike):
        def __fspath__(self):
            return str(SAVED)

    path = {"str": str(SAVED), "path": SAVED, "pathlike": Like()}[path_form]
    tgt = {"none": None, "concrete": BUF, "abstract": jax.eval_shape(lambda: BUF)}[target]
    dev = jax.devices()[0]
    shd = {"none": None, "device": dev, "sharding": jax.sharding.SingleDeviceSharding(dev)}[sharding]
    assert snapshot(jb.restore(path, tgt, sharding=shd, progress=False)) == snapshot(BUF)


# ---------------------------------------------------------------------------------------------------------------
# save(..., blocking=False) and PendingSave.wait

PENDING = jb.save(ROOT / "background", BUF, progress=False, blocking=False)
PENDING.wait()


@SETTINGS
@given(blocking=st.sampled_from(["False", "True", 0, 1, None, [True], np.array([False]), jnp.bool_(False)]),
       directory=BAD_PATHS, buffer=st.sampled_from([None, 3, BUF.storage]))
@example(blocking="False", directory=None, buffer=None)  # a truthy string saved in the foreground
@example(blocking=0, directory=None, buffer=None)  # 0 saved in the background
def test_save_bad_blocking_and_bad_arguments_of_a_background_save(blocking, directory, buffer):
    """Refused by the call itself, before a folder is created or a thread started."""
    refused(lambda: jb.save(ROOT / "new", BUF, blocking=blocking), "blocking", state=on_disk)
    refused(lambda: jb.save(directory, BUF, blocking=False), "directory", state=on_disk)
    refused(lambda: jb.save(ROOT / "new", buffer, blocking=False), "buffer", state=on_disk)
    refused(lambda: jb.save(ROOT / "new", BUF, progress="x", blocking=False), "progress", state=on_disk)
    assert not (ROOT / "new").exists()


@SETTINGS
@given(timeout=st.sampled_from(["1", True, [1.0], np.array([1.0]), 1j, float("nan"), jnp.float32(1)])
       | st.floats(-1e9, 0.0, exclude_max=True) | st.integers(-(2**40), -1))
@example(timeout="1")  # a finished save returned its folder for any timeout
@example(timeout=-1.0)
def test_wait_bad_timeout(timeout):
    """Refused naming `timeout`, whether or not the save has finished; the checkpoint is kept."""
    refused(lambda: PENDING.wait(timeout), "timeout", state=on_disk)


@FEW
@given(timeout=st.sampled_from([None, 0, 0.0, 5, 2.5, np.float32(5), np.int64(5), float("inf")]),
       blocking=st.sampled_from([False, np.False_]))
def test_wait_accepted_timeouts_give_the_saved_buffer(timeout, blocking):
    """A background save (`blocking` False or numpy's False) waited for with any accepted `timeout` holds exactly the
    buffer of the call, as a blocking save."""
    pending = jb.save(ROOT / "background", BUF, progress=False, blocking=blocking)
    assert isinstance(pending, jb.PendingSave)
    pending.wait()
    assert pending.done() and pending.wait(timeout) == ROOT / "background"
    assert snapshot(jb.restore(ROOT / "background", BUF, progress=False)) == snapshot(BUF)


# ---------------------------------------------------------------------------------------------------------------
# meta defaults (array leaves, not in the JSON config)

EP_STEP = {"obs": jnp.zeros((2,), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}


def _episodes(kind: str, default) -> jb.EpisodeBuffer:
    cls = {"device": jb.EpisodeBuffer, "compressed": jb.CompressedEpisodeBuffer}[kind]
    kw = {"codec": "none"} if kind == "compressed" else {}
    return cls.create(EP_STEP, max_episodes=2, max_timesteps=3, meta={"task": jnp.int32(default), "w": jnp.float32(0.5)}, **kw)


@pytest.mark.parametrize("kind", ["device", "compressed"])
def test_restore_refuses_a_target_whose_meta_default_differs(kind, tmp_path):
    """A concrete target whose meta field default differs from the checkpoint's: `CheckpointError` naming the field
    (was restored silently, the target's default replaced). The same defaults, and an abstract target (no values),
    restore the saved buffer."""
    saved = _episodes(kind, -1)
    path = jb.save(tmp_path / "ckpt", saved, progress=False)
    other = _episodes(kind, 7)
    before, files = snapshot(other), tree(tmp_path)
    with pytest.raises(jb.CheckpointError, match=r"meta' field 'task'.*default is -1, the target's is 7"):
        jb.restore(path, other, progress=False)
    assert snapshot(other) == before and tree(tmp_path) == files
    for target in (_episodes(kind, -1), jax.eval_shape(lambda: other)):
        got = jb.restore(path, target, progress=False)
        assert int(got.meta_defaults["task"] if kind == "device" else got.buffer.meta_defaults["task"]) == -1


# ---------------------------------------------------------------------------------------------------------------
# to_bytes / from_bytes: dicts of name -> buffer

ARCHIVE = jb.checkpoint.to_bytes({"replay": BUF})


@SETTINGS
@given(buffers=st.sampled_from([BUF, [BUF], (BUF,), None, "replay", {1: BUF}, {("a",): BUF}, {"a": 3}, {"a": BUF.storage},
                                {"a": {"b": BUF}}]))
@example(buffers=BUF)  # was AttributeError: 'ReplayBuffer' object has no attribute 'items'
def test_to_bytes_refuses_what_is_not_a_dict_of_buffers(buffers):
    """A TypeError naming `buffers` (a key or a value by its name) and what was expected, before anything is saved."""
    err = refused(lambda: jb.checkpoint.to_bytes(buffers), "buffers", state=on_disk, exc=(TypeError,))
    assert "expected" in str(err) and "got" in str(err)


@SETTINGS
@given(data=st.sampled_from([None, "archive", 3, BUF, [ARCHIVE]]),
       targets=st.sampled_from([BUF, [BUF], None, "replay", {1: BUF}, {"replay": 3}, {"replay": BUF.storage}]))
@example(data=ARCHIVE.decode("latin-1"), targets=BUF)  # a buffer for targets was AttributeError
def test_from_bytes_refuses_what_is_not_bytes_or_a_dict_of_targets(data, targets):
    refused(lambda: jb.checkpoint.from_bytes(data, {"replay": BUF}), "data", state=on_disk, exc=(TypeError,))
    refused(lambda: jb.checkpoint.from_bytes(ARCHIVE, targets), "targets", state=on_disk, exc=(TypeError,))


def test_to_bytes_names_and_the_accepted_forms():
    """Names that are not plain folder names are a ValueError naming `buffers` / `targets`; a dict of buffers round
    trips, with a target or None."""
    refused(lambda: jb.checkpoint.to_bytes({"a/b": BUF}), "buffers", state=on_disk, exc=(ValueError,))
    refused(lambda: jb.checkpoint.from_bytes(ARCHIVE, {"..": None}), "targets", state=on_disk, exc=(ValueError,))
    for target in (None, BUF, jax.eval_shape(lambda: BUF)):
        got = jb.checkpoint.from_bytes(bytearray(ARCHIVE), {"replay": target})
        assert snapshot(got["replay"]) == snapshot(BUF)
