"""Bad input to `jaxbuffers.disk` (open's paths, modes and buffers, flush, `Concatenated`) and to
`host_codecs.FileStore` (paths, shapes, dtypes, modes, slot ids, data, outputs): refused with an error naming the
argument, before any file is created or written: the folder's files, the store's entries and the buffers
byte-identical; the accepted forms give exactly the documented result."""

from __future__ import annotations

import atexit
import functools
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
from bad_inputs import SETTINGS, bad_keys, bad_static_ints, bad_unit_scalars, refused, snapshot
from host_codecs import CorruptEntryError
from host_codecs.file_store import FileStore, ReadOnlyError
from jaxbuffers import disk

FEW = settings(SETTINGS, max_examples=8)
STEP = {"obs": jnp.zeros((6, 6), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
ROOT = pathlib.Path(tempfile.mkdtemp(prefix="jb-bad-disk-"))
atexit.register(shutil.rmtree, ROOT, True)


def make(**kw):
    return jb.CompressedTrajectoryBuffer.create(STEP, num_envs=1, length=8, **{"codec": "none", **kw})


def _steps(t: int) -> dict:
    i = np.arange(t)
    return {"obs": np.broadcast_to(i[None, :, None, None], (1, t, 6, 6)).astype(np.uint8), "action": i[None].astype(np.int32),
            "reward": i[None].astype(np.float32)}


BUF = disk.open(ROOT / "buf", "w", make())
BUF = BUF.add(_steps(5), terminated=np.zeros((1, 5), bool))
disk.flush(BUF)
STORE = FileStore(ROOT / "store", 6, (3,), np.uint8, mode="w")
STORE.put([0, 2], np.arange(6, dtype=np.uint8).reshape(2, 3))
STORE.flush()
BAD_PATHS = st.sampled_from([None, 1, 2.5, b"/tmp/x", "", ["a"]])


def tree() -> list[tuple]:
    """The files and folders in `ROOT` and in the disk buffer's folder with their sizes and modification times in
    nanoseconds: any write changes them (`state/` is rewritten through a rename, which changes its folder's)."""
    return sorted((str(p), st.st_size, st.st_mtime_ns) for d in (ROOT, ROOT / "buf") for p in d.iterdir() for st in [p.stat()])


DEVICE = snapshot(BUF.replace(host=None))


def stored() -> tuple:
    """What a refused call must leave as it was: the files (the disk buffer's entries and index, the store's), the
    store's entries as read, and the disk buffer's device arrays alive (nothing donated; their bytes are compared
    with `DEVICE` once per test, they are immutable otherwise)."""
    alive = [x.is_deleted() for x in jax.tree.leaves(BUF.replace(host=None))]
    return tree(), STORE.get(np.arange(6), missing="zeros").tobytes(), STORE.written(np.arange(6)).tobytes(), alive


@FEW
@given(directory=BAD_PATHS, mode=st.sampled_from([None, 1, "rw", "W", ["r"], "a"]),
       buffer=st.sampled_from([None, 3, "buf", jb.ReplayBuffer.create(STEP, 4)]))
@example(directory=None, mode="rw", buffer=3)  # was Python's "expected str, bytes or os.PathLike"; buffer=3 was named target
def test_open_bad_arguments(directory, mode, buffer):
    refused(lambda: disk.open(directory, "r"), "directory", state=stored)
    refused(lambda: disk.open(ROOT / "buf", mode), "mode", state=stored)
    if buffer is not None:
        refused(lambda: disk.open(ROOT / "buf", "r", buffer), "buffer", state=stored)
    refused(lambda: disk.open(ROOT / "new", "w", buffer), "buffer", state=stored)
    assert not (ROOT / "new").exists()


W_BUFFERS = {
    "keyframes": functools.cache(lambda: make(keyframe_interval=4)),
    "added": functools.cache(lambda: make().add(_steps(1), terminated=np.zeros((1, 1), bool))),
    "on_disk": lambda: BUF,
}


@FEW
@given(kind=st.sampled_from(sorted(W_BUFFERS)), over=st.booleans())
def test_open_w_refuses_a_buffer_it_cannot_take(kind, over):
    """Mode `"w"` with a buffer it cannot move to disk: refused before the folder is created, or (`over`) before an
    existing disk folder is replaced."""
    target = ROOT / "buf" if over else ROOT / "other"
    refused(lambda: disk.open(target, "w", W_BUFFERS[kind]()), "buffer", state=stored)


@FEW
@given(buffer=st.sampled_from([None, 3, jb.ReplayBuffer.create(STEP, 4), make()]),
       buffers=st.sampled_from([None, 3, "ab", [], [None], [BUF, 3], {"a": BUF}, [jax.vmap(lambda _: make())(jnp.arange(2))]]))
def test_flush_and_concatenated_bad_arguments(buffer, buffers):
    refused(lambda: disk.flush(buffer), "buffer", state=stored)
    refused(lambda: disk.Concatenated.create(buffers), ("buffers", "buffers[0]", "buffers[1]"), state=stored)


def test_open_w_where_a_file_is_says_it_is_a_file(tmp_path):
    (tmp_path / "notes").write_text("keep")
    for d in (tmp_path / "notes", tmp_path / "notes" / "sub"):
        with pytest.raises(NotADirectoryError, match=f"directory: {tmp_path / 'notes'} is a file, not a folder"):
            disk.open(d, "w", make())
    assert [p.name for p in tmp_path.iterdir()] == ["notes"] and (tmp_path / "notes").read_text() == "keep"


def test_concatenated_of_no_buffer_or_of_a_buffer_not_in_a_list():
    """No buffer: a ValueError; one buffer not in a list: its type named, never its repr (its arrays)."""
    for create, empty in ((disk.Concatenated.create, []), (disk.ConcatenatedEpisodes.create, ())):
        with pytest.raises(ValueError, match=f"buffers: expected at least one Compressed.*Buffer, got an empty {type(empty).__name__}"):
            create(empty)
    with pytest.raises(TypeError) as e:
        disk.Concatenated.create(BUF)
    assert str(e.value) == "buffers: expected a list of CompressedTrajectoryBuffers, got CompressedTrajectoryBuffer (one buffer: [buffer])"


CAT = disk.Concatenated.create([BUF])


@FEW
@given(key=bad_keys(), size=bad_static_ints(), gamma=bad_unit_scalars())
@example(key=None, size=2.0, gamma=7.0)  # key None and batch_size 2.0 were JAX's own errors
def test_concatenated_sampling_bad_arguments(key, size, gamma):
    k = jax.random.key(0)
    refused(lambda: CAT.sample_transitions(key, 2, gamma=0.9), "key", state=stored)
    refused(lambda: CAT.sample_transitions(k, size, gamma=0.9), "batch_size", state=stored)
    refused(lambda: CAT.sample_transitions(k, 2, n_step=size, gamma=0.9), "n_step", state=stored)
    refused(lambda: CAT.sample_transitions(k, 2, gamma=gamma), "gamma", state=stored)
    refused(lambda: CAT.sample_sequences(key, 2, 2), "key", state=stored)
    refused(lambda: CAT.sample_sequences(k, size, 2), "batch_size", state=stored)
    refused(lambda: CAT.sample_sequences(k, 2, size), "sequence_length", state=stored)
    refused(lambda: CAT.sample_sequences(k, 2, 2, period=size), "period", state=stored)


# ---------------------------------------------------------------------------------------------------------------
# host_codecs.FileStore


@FEW
@given(path=BAD_PATHS, shape=st.sampled_from([None, 3, (-1,), (1.5,), (True,), "3", [[3]]]),
       dtype=st.sampled_from([None, object, "U3", ">u2", "foo", jnp.bfloat16]), mode=st.sampled_from([None, 1, "a", ["w"]]),
       num_slots=st.sampled_from([0, -1, 1.5, True, None, "4"]))
@example(path=None, shape=(1.5,), dtype=None, mode="a", num_slots=0)  # 1.5 was rounded to 1, dtype None became float64
def test_file_store_constructor_bad_arguments(path, shape, dtype, mode, num_slots):
    """Refused before any file is created."""
    p = ROOT / "fresh"
    refused(lambda: FileStore(path, 4, (3,), np.uint8, mode="w"), "path", state=stored)
    refused(lambda: FileStore(p, 4, shape, np.uint8, mode="w"), "item_shape", state=stored)
    refused(lambda: FileStore(p, 4, (3,), dtype, mode="w"), "dtype", state=stored)
    refused(lambda: FileStore(p, 4, (3,), np.uint8, mode=mode), "mode", state=stored)
    refused(lambda: FileStore(p, num_slots, (3,), np.uint8, mode="w"), "num_slots", state=stored)
    assert not any(ROOT.glob("fresh*"))


@FEW
@given(slots=st.sampled_from([None, "a", 1.5, [0.5], [True], [6], [-7], [2**70], np.array([1.0]), [[0], [1, 2]]]),
       arrays=st.sampled_from([None, "abc", np.zeros((1, 3), np.float32), np.zeros((1, 4), np.uint8), np.zeros((2, 3), np.uint8),
                               np.zeros(3, np.uint8), [[1, 2, 3]], np.zeros((1, 3), object)]),
       missing=st.sampled_from([None, 1, "zero", ["raise"]]),
       outs=st.sampled_from([3, [np.zeros((1, 3), np.float32)], [np.zeros((2, 3), np.uint8)], [np.zeros((1, 3), np.uint8)[:, ::2]], [None]]))
@example(slots=None, arrays=None, missing=None, outs=3)  # outs=3 and slot_arrays=3 were Python's own errors
def test_file_store_put_and_get_bad_arguments(slots, arrays, missing, outs):
    refused(lambda: STORE.put(slots, np.zeros((1, 3), np.uint8)), "slots", state=stored, exc=(TypeError, ValueError, IndexError))
    refused(lambda: STORE.put([1], arrays), "arrays", state=stored)
    refused(lambda: STORE.get(slots), "slot_arrays", state=stored, exc=(TypeError, ValueError, IndexError))
    refused(lambda: STORE.get_many(3), "slot_arrays", state=stored)
    refused(lambda: STORE.get([0], missing=missing), "missing", state=stored)
    refused(lambda: STORE.get_many([[0]], outs=outs), ("outs", "outs[0]"), state=stored)


def test_file_store_read_only_and_closed():
    ro = FileStore(ROOT / "store", 6, (3,), np.uint8, mode="r")
    refused(lambda: ro.put([1], np.zeros((1, 3), np.uint8)), "put", state=stored, exc=(ReadOnlyError,))
    ro.close()
    refused(lambda: ro.get([0]), "read", state=stored, exc=(RuntimeError,))


@FEW
@given(form=st.sampled_from(["list", "int32", "uint64", "negative", "tuple_shape", "list_shape"]))
def test_file_store_accepted_forms(form):
    """The table: slot ids of any integer dtype or a list, negative ids counted from the end; `item_shape` a tuple or
    a list of ints. Each reads exactly the stored entries."""
    ids = {"list": [0, 2], "int32": np.array([0, 2], np.int32), "uint64": np.array([0, 2], np.uint64),
           "negative": [-6, -4], "tuple_shape": [0, 2], "list_shape": [0, 2]}[form]
    want = np.arange(6, dtype=np.uint8).reshape(2, 3)
    if form.endswith("shape"):
        other = FileStore(ROOT / "store", 6, (3,) if form == "tuple_shape" else [3], np.uint8, mode="r")
        np.testing.assert_array_equal(other.get(ids), want)
        other.close()
    np.testing.assert_array_equal(STORE.get(ids), want)


def test_accepted_paths_reopen_the_same_buffer():
    """A folder as a str, a `pathlib.Path` or an `os.PathLike`; `buffer` an abstract twin: the same state."""

    class Like(os.PathLike):
        def __fspath__(self):
            return str(ROOT / "buf")

    want = snapshot(BUF.replace(host=None))
    for path in (str(ROOT / "buf"), ROOT / "buf", Like()):
        got = disk.open(path, "r", jax.eval_shape(make) if isinstance(path, str) else None)
        assert snapshot(got.replace(host=None)) == want
        got.close()


def test_device_state_unchanged():
    """After the refusals of this module (and in a run of this test alone), the disk buffer's device arrays hold
    their bytes."""
    assert snapshot(BUF.replace(host=None)) == DEVICE


# ---------------------------------------------------------------------------------------------------------------
# ConcatenatedEpisodes

EP_STEP = {"obs": jnp.zeros((3,), jnp.int32), "action": jnp.int32(0), "reward": jnp.float32(0)}


def episodes(path=None, meta=jnp.int32(0)):
    """A compressed episode buffer of 2 episodes (lengths 3 and 2; obs [i, t, i + t]), in `path` (flushed) when given."""
    buf = jb.CompressedEpisodeBuffer.create(EP_STEP, max_episodes=2, max_timesteps=4, codec="none", meta={"task": meta})
    buf = buf if path is None else disk.open(path, "w", buf)
    i, t = np.arange(2)[:, None], np.arange(5)[None, :]
    obs = np.stack(np.broadcast_arrays(i, t, i + t), -1).astype(np.int32)
    eps = {"obs": obs[:, :4], "action": obs[:, :4, 1], "reward": np.zeros((2, 4), np.float32)}
    buf = buf.add_episodes(eps, np.array([3, 2], np.int32), terminated=np.ones(2, bool), final_obs=obs[[0, 1], [3, 2]],
                           meta={"task": np.array([0, 1], meta.dtype)})
    if path is not None:
        disk.flush(buf)
    return buf


EPS = [episodes(ROOT / "eps"), episodes()]  # one on disk, one in memory
CATE = disk.ConcatenatedEpisodes.create(EPS)
OTHER_META = episodes(meta=jnp.int16(0))
STACKED = jax.vmap(lambda _: jb.CompressedEpisodeBuffer.create(EP_STEP, max_episodes=2, max_timesteps=4, codec="none"))(jnp.arange(2))


@FEW
@given(buffers=st.sampled_from([None, 3, "ab", [], [None], {"a": EPS[0]}, [EPS[0], 3], [EPS[0], BUF], [BUF], [EPS[1], OTHER_META], iter(EPS),
                                    [STACKED]]))
@example(buffers=[EPS[0], OTHER_META])  # named: the differing configuration field of buffers[1]
@example(buffers=[STACKED])  # alone (no other buffer to differ from) it was taken, and its samplers failed in JAX's broadcasting
def test_concatenated_episodes_bad_buffers(buffers):
    refused(lambda: disk.ConcatenatedEpisodes.create(buffers), ("buffers", "buffers[0]", "buffers[1]"), state=stored)


BAD_WHERE = st.sampled_from([
    "x", 3, True, np.ones(2, bool), [np.ones(2, bool)], [np.ones(2, bool)] * 3, [np.ones(2, bool), np.ones(3, bool)],
    [np.ones(2, np.int32)] * 2, [[True, True]] * 2, [None, np.ones(2, bool)], lambda m: m["task"], lambda m: None,
    lambda m: np.ones(3, bool),
])


@FEW
@given(key=bad_keys(), size=bad_static_ints(), gamma=bad_unit_scalars(), where=BAD_WHERE)
@example(key=None, size=2.0, gamma=7.0, where=lambda m: m["task"])
def test_concatenated_episodes_sampling_bad_arguments(key, size, gamma, where):
    k = jax.random.key(0)
    for name, call in [("sample_episodes", lambda c, **kw: c.sample_episodes(**kw)),
                       ("sample_timesteps", lambda c, **kw: c.sample_timesteps(**kw)),
                       ("sample_transitions", lambda c, **kw: c.sample_transitions(**kw, gamma=0.9)),
                       ("sample_sequences", lambda c, **kw: c.sample_sequences(sequence_length=2, **kw))]:
        refused(lambda: call(CATE, key=key, batch_size=2), "key", state=stored)
        refused(lambda: call(CATE, key=k, batch_size=size), "batch_size", state=stored)
        refused(lambda: call(CATE, key=k, batch_size=2, where=where), "where", state=stored)
    refused(lambda: CATE.sample_transitions(k, 2, gamma=gamma), "gamma", state=stored)
    refused(lambda: CATE.sample_transitions(k, 2, n_step=size, gamma=0.9), "n_step", state=stored)
    refused(lambda: CATE.sample_sequences(k, 2, size), "sequence_length", state=stored)
    refused(lambda: CATE.can_sample(size), "batch_size", state=stored)
    refused(lambda: CATE.can_sample(2, where=where), "where", state=stored)
    refused(lambda: CATE.can_sample_sequences(2, size), "sequence_length", state=stored)


def test_concatenated_episodes_where_forms_give_the_same_samples():
    """`where` as a function of the meta dict, a list of numpy masks or a tuple of JAX masks: the same samples, every
    row from an episode that passes (task 1: the second episode of each buffer, obs [1, t, 1 + t])."""
    k = jax.random.key(3)
    forms = [lambda m: m["task"] == 1, [np.array([False, True])] * 2, (jnp.array([False, True]),) * 2]
    got = [snapshot(CATE.sample_timesteps(k, 8, where=w)) for w in forms]
    assert got[0] == got[1] == got[2]
    obs = np.asarray(CATE.sample_timesteps(k, 8, where=forms[0]).sample.item["obs"])
    assert (obs[:, 0] == 1).all() and (obs[:, 1] < 2).all() and (obs[:, 2] == 1 + obs[:, 1]).all()


def test_eager_reads_of_a_folder_changed_after_its_flush_raise_corrupt_entry_error(tmp_path):
    """Entries whose bytes changed on disk after the folder's last flush: an eager sample of a `Concatenated` over the
    reopened buffer raises `CorruptEntryError`, not JAX's runtime error carrying its text."""
    buf = disk.open(tmp_path / "b", "w", make())
    buf = buf.add(_steps(8), terminated=np.zeros((1, 8), bool))
    disk.flush(buf)
    buf.close()
    data = tmp_path / "b" / "store-0.npy"
    raw = np.load(data, mmap_mode="r+")  # every entry (all in the first copy) changed behind the folder's back
    raw += 100
    raw.flush()
    del raw
    ro = disk.open(tmp_path / "b", "r")
    with pytest.raises(CorruptEntryError, match="corrupt"):
        disk.Concatenated.create([ro]).sample_sequences(jax.random.key(0), 4, 2)
    ro.close()
