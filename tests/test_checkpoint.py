"""jaxbuffers.save / restore: model-based round trips of every buffer type, and the safety properties.

Round trips: a seeded random sequence of adds, samples and priority updates runs on a buffer that is never saved and
on one saved and restored at a random point; every output and the final state must be identical.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import typing
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb
from frame_stacks import stacked_episodes
from jaxbuffers import checkpoint as ckpt
from jaxbuffers.compressed._host import HostStores
from rollout_layouts import before_empty_slot, unwritten_zeroed

pytest.importorskip("zstandard")

E, L = 2, 6  # lanes and steps per lane of the trajectory buffers


def _rand(rng, spec, lead):
    def one(s):
        if s.dtype == jnp.bool_:
            return jnp.asarray(rng.random((*lead, *s.shape)) < 0.3)
        if jnp.issubdtype(s.dtype, jnp.floating):
            return jnp.asarray(rng.standard_normal((*lead, *s.shape)).astype(s.dtype))
        return jnp.asarray(rng.integers(0, 4, (*lead, *s.shape)).astype(s.dtype))

    return jax.tree.map(one, spec)


ITEM = {"obs": jax.ShapeDtypeStruct((3,), jnp.float32), "action": jax.ShapeDtypeStruct((), jnp.int32)}
STEP = {"obs": jax.ShapeDtypeStruct((2,), jnp.float32), "action": jax.ShapeDtypeStruct((), jnp.int32),
        "reward": jax.ShapeDtypeStruct((), jnp.float32)}
PIXELS = {"obs": jax.ShapeDtypeStruct((4, 6, 6), jnp.uint8), "action": jax.ShapeDtypeStruct((), jnp.int32),
          "reward": jax.ShapeDtypeStruct((), jnp.float32)}
ROLL = {"obs": jax.ShapeDtypeStruct((2, 5, 5), jnp.uint8), "logp": jax.ShapeDtypeStruct((), jnp.float32)}


def _replay_ops(prioritised: bool, stack: int = 0):
    """(create, add, sample, set_priorities) of an item buffer, vmapped over `stack` buffers when > 0."""
    cls = jb.PrioritisedReplayBuffer if prioritised else jb.ReplayBuffer
    create = lambda: cls.create(ITEM, capacity=8)  # noqa: E731
    add = lambda b, x: b.add(x)  # noqa: E731
    sample = lambda b, k: b.sample(k, 5)  # noqa: E731
    setp = lambda b, s, p: b.set_priorities(s.indices, p, s.generations)  # noqa: E731
    lead = (3,)
    if stack:
        create = (lambda c: lambda: jax.vmap(lambda _: c())(jnp.arange(stack)))(create)
        add, sample, setp = jax.vmap(add), jax.vmap(sample), jax.vmap(setp)
        lead = (stack, 3)
    data = lambda rng: (_rand(rng, ITEM, lead),)  # noqa: E731
    keys = (lambda k: jax.random.split(k, stack)) if stack else (lambda k: k)
    prio = (lambda rng: jnp.asarray(rng.random((*lead[:-1], 5)).astype(np.float32) + 0.1))
    return create, add, data, lambda b, k: sample(b, keys(k)), (setp if prioritised else None), prio


def _trajectory_ops(cls, spec, **kw):
    create = lambda: cls.create(spec, num_envs=E, length=L, **kw)  # noqa: E731

    def data(rng):
        obs = _rand(rng, spec["obs"], (E,))
        step, term = _rand(rng, spec, (E,)), rng.random(E) < 0.2
        if kw.get("frame_stack"):  # stacks a frame stacker makes (what frame_stack stores): each add is a whole episode
            stack = np.repeat(np.asarray(step["obs"])[:, -1:], kw["frame_stack"], axis=1)
            step, term = {**step, "obs": jnp.asarray(stack)}, np.ones(E, bool)
            obs = jnp.asarray(np.concatenate([stack[:, 1:], np.asarray(obs)[:, -1:]], axis=1))
        return step, jnp.asarray(term), jnp.asarray(rng.random(E) < 0.2), obs

    add = lambda b, s, te, tr, fo: b.add(s, terminated=te, truncated=tr, final_obs=fo)  # noqa: E731
    if "window_length" in kw:
        sample = lambda b, k: (b.sample_transitions(k, 4, n_step=2, gamma=0.9), b.sample_sequences(k, 3))  # noqa: E731
        setp = lambda b, s, p: b.set_priorities(s[0].indices, p, s[0].generations)  # noqa: E731
    else:
        sample = lambda b, k: (b.sample_transitions(k, 4, n_step=2, gamma=0.9), b.sample_sequences(k, 3, 2))  # noqa: E731
        setp = None
    prio = lambda rng: jnp.asarray(rng.random(4).astype(np.float32) + 0.1)  # noqa: E731
    return create, add, data, sample, setp, prio


def _rollout_ops(cls, spec, **kw):
    create = lambda: cls.create(spec, num_envs=E, num_steps=3, **kw)  # noqa: E731

    def data(rng):
        f = lambda: jnp.asarray(rng.standard_normal(E).astype(np.float32))  # noqa: E731
        return _rand(rng, spec, (E,)), f(), f(), jnp.asarray(rng.random(E) < 0.3)

    def add(b, s, r, v, te):
        full = b.buffer.is_full() if hasattr(b, "host") else b.is_full()
        # once full: GAE and a fresh rollout (the host stores are written by the next adds)
        b = jax.lax.cond(full, lambda b: b.compute_gae(jnp.ones(E), 0.9, 0.8).reset(), lambda b: b, b)
        return b.add(s, reward=r, value=v, terminated=te)

    sample = lambda b, k: b.compute_gae(jnp.ones(E), 0.9, 0.8).minibatches(k, 2)  # noqa: E731
    return create, add, data, sample, None, None


def _episode_ops(cls, spec, **kw):
    """An episode buffer: adds of 2 episodes of random lengths and task ids, every sampler (one filtered), and
    reward relabelling at the sampled transitions in place of priority updates."""
    create = lambda: cls.create(spec, max_episodes=3, max_timesteps=4, meta={"task_id": jnp.int32(-1)}, **kw)  # noqa: E731

    def data(rng):
        steps, lengths, final = _rand(rng, spec, (2, 4)), rng.integers(1, 5, 2).astype(np.int32), _rand(rng, spec["obs"], (2,))
        if kw.get("frame_stack"):  # stacks a frame stacker makes: what the compressed buffer stores exactly
            k = kw["frame_stack"]
            stacks, final = stacked_episodes(rng.integers(0, 4, (2, 5, *spec["obs"].shape[1:]), dtype=np.uint8), lengths, k)
            steps = {**steps, "obs": jnp.asarray(stacks)}
        return (steps, jnp.asarray(lengths), jnp.asarray(rng.random(2) < 0.4), jnp.asarray(rng.random(2) < 0.4), jnp.asarray(final),
                jnp.asarray(rng.integers(0, 2, 2).astype(np.int32)))

    def add(b, s, n, te, tr, fo, task):
        return b.add_episodes(s, n, terminated=te, truncated=tr, final_obs=fo, meta={"task_id": task})

    def sample(b, k):  # the other samplers read the same arrays (tests/test_episode.py, tests/test_compressed_episode.py)
        return b.sample_transitions(k, 4, n_step=2, gamma=0.9), b.sample_episodes(k, 2, where=lambda m: m["task_id"] == 1)

    setp = lambda b, s, p: b.update(s[0].indices, {"reward": p}, steps=s[0].steps)  # noqa: E731
    prio = lambda rng: jnp.asarray(rng.standard_normal(4).astype(np.float32))  # noqa: E731
    return create, add, data, sample, setp, prio


CASES = {
    "replay": lambda: _replay_ops(False),
    "prioritised": lambda: _replay_ops(True),
    "replay-stacked": lambda: _replay_ops(False, stack=2),
    "prioritised-stacked": lambda: _replay_ops(True, stack=2),
    "trajectory": lambda: _trajectory_ops(jb.TrajectoryBuffer, STEP, final_obs_capacity=3),
    "prioritised-trajectory": lambda: _trajectory_ops(jb.PrioritisedTrajectoryBuffer, STEP, window_length=3),
    "rollout": lambda: _rollout_ops(jb.RolloutBuffer, ROLL),
    "compressed-trajectory": lambda: _trajectory_ops(
        jb.CompressedTrajectoryBuffer, PIXELS, frame_stack=4, codec="zstd:1", dictionary_bytes=1024),
    "compressed-prioritised": lambda: _trajectory_ops(
        jb.CompressedPrioritisedTrajectoryBuffer, PIXELS, window_length=3, frame_stack=4, codec="rle"),
    "compressed-rollout": lambda: _rollout_ops(jb.CompressedRolloutBuffer, ROLL, codec="zstd:1"),
    "compressed-rollout-stacked": lambda: _rollout_ops(jb.CompressedRolloutBuffer, ROLL, codec="rle", frame_stack=2),
    "episode": lambda: _episode_ops(jb.EpisodeBuffer, STEP),
    "compressed-episode": lambda: _episode_ops(jb.CompressedEpisodeBuffer, PIXELS, frame_stack=4, codec="zstd:1", dictionary_bytes=1024),
}


@functools.cache
def _ops(case: str, jit: bool):
    """The ops of `case`, jitted when `jit`: one set per case, so the saved run reuses the programs the never-saved
    run compiled."""
    create, add, data, sample, setp, prio = CASES[case]()
    if jit:
        add, sample = jax.jit(add, donate_argnums=0), jax.jit(sample)
        setp = setp and jax.jit(setp, donate_argnums=0)
    return create, add, data, sample, setp, prio


def _run(case: str, seed: int, jit: bool, directory: Path | None, num_ops: int = 14):
    """Outputs of a seeded random op sequence; saved and restored before op `save_at` when `directory` is given."""
    create, add, data, sample, setp, prio = _ops(case, jit)
    rng = np.random.default_rng(seed)
    save_at = int(rng.integers(1, num_ops))
    buf, outs, last = create(), [], None
    for i in range(num_ops):
        if directory is not None and i == save_at:
            jb.save(directory, buf)
            buf = jb.restore(directory)
        op = 0 if i < 2 else int(rng.integers(0, 3))
        key = jax.random.key(int(rng.integers(1 << 30)))
        if op == 0 or (op == 2 and (setp is None or last is None)):
            buf = add(buf, *data(rng))
        elif op == 1:
            last = sample(buf, key)
            outs.append(jax.tree.map(np.asarray, last))
        else:
            buf = setp(buf, last, prio(rng))
            last = None
    outs.append(jax.tree.map(np.asarray, sample(buf, jax.random.key(7))))
    return outs, jax.tree.map(np.asarray, buf), save_at


# The default run: every case jitted, and eagerly one device and one compressed buffer (a save reads the same state
# either way; eager calls differ only in dispatch). The episode buffers also come back through a plain round trip each
# (test_episode_buffer_meta_defaults_come_back, test_compressed_episode_buffer_round_trip_and_wrong_config).
_EAGER_DEFAULT = {"replay", "compressed-trajectory"}
_SLOW = {(c, False) for c in CASES if c not in _EAGER_DEFAULT} | {("compressed-episode", True), ("compressed-rollout-stacked", True)}


@pytest.mark.parametrize("case, jit", [
    pytest.param(c, j, marks=[pytest.mark.slow] if (c, j) in _SLOW else [], id=f"{c}-{'jit' if j else 'eager'}")
    for c in CASES for j in (False, True)
])
def test_round_trip_matches_never_saved(case, jit, tmp_path):
    for seed in (int(jit),):
        want, want_state, _ = _run(case, seed, jit, None)
        got, got_state, save_at = _run(case, seed, jit, tmp_path / f"ck{seed}")
        assert 1 <= save_at < 14
        assert jax.tree.structure(want) == jax.tree.structure(got)
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(jax.tree.leaves(want_state), jax.tree.leaves(got_state)):
            np.testing.assert_array_equal(a, b)


def _filled_replay(capacity=64):
    buf = jb.PrioritisedReplayBuffer.create(ITEM, capacity=capacity)
    return buf.add(_rand(np.random.default_rng(0), ITEM, (capacity // 2,)))


def _buffer_dtypes() -> list[str]:
    """Every dtype jax.numpy names (numpy's, bfloat16, the float8 / float4 / int4 / uint4 / int2 ... of ml_dtypes)
    that a buffer's `create` accepts and XLA holds."""
    out = set()
    for name in dir(jnp):
        try:
            d = jnp.dtype(getattr(jnp, name))
            jb.ReplayBuffer.create({"q": np.zeros((2,), d)}, capacity=2)
        except Exception:  # noqa: BLE001 - not a dtype, or one refused (JAX, XLA or create)
            continue
        out.add(d.name)
    return sorted(out)


BUFFER_DTYPES = _buffer_dtypes()


def test_the_dtypes_round_tripped_below_include_the_ml_dtypes():
    assert {"bool", "uint8", "float32", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int4", "uint4"} <= set(BUFFER_DTYPES)


def _every_bit_pattern(dtype, shape, rng):
    """An array of `dtype` of random bits (NaN payloads included), a sub-byte value in the low bits of its byte."""
    d = np.dtype(dtype)
    if d == np.bool_:
        return rng.random(shape) < 0.5
    bits = jax.dtypes.itemsize_bits(d)
    raw = rng.integers(0, 256, (*shape, d.itemsize), dtype=np.uint8)
    if bits < 8:
        raw &= (1 << bits) - 1
    return raw.view(d).reshape(shape)


@pytest.mark.parametrize("dtype", BUFFER_DTYPES)
@pytest.mark.parametrize("read", ["direct", "orbax"])
def test_every_dtype_a_buffer_holds_round_trips_bit_for_bit(dtype, read, tmp_path, monkeypatch):
    """A buffer of each dtype (a small field and one over 1 MiB, read through a memory map where its dtype allows)
    comes back byte for byte, restored without a target, into an abstract template and into a concrete one; also
    when the arrays are read by orbax (the layout several processes write)."""
    item = {"q": np.zeros((3,), dtype), "big": np.zeros((1 << 18,), dtype)}
    create = lambda: jb.ReplayBuffer.create(item, capacity=4)  # noqa: E731
    rng = np.random.default_rng(0)
    if dtype in ("int1", "uint1"):  # JAX takes them to host memory as bool and cannot put that back: refused
        holding = lambda x: jax.ShapeDtypeStruct(x.shape, dtype)  # noqa: E731 - JAX's caches may turn int1 into bool
        buf = jax.eval_shape(create).replace(storage=jax.tree.map(holding, jax.eval_shape(create).storage))
        with pytest.raises(TypeError, match=rf"buffer\.storage\['big'\]: dtype {dtype} cannot be saved .*store the field as bool"):
            jb.save(tmp_path / "ck", buf)
        assert not list(tmp_path.iterdir())
        return
    buf = create().add({k: jnp.asarray(_every_bit_pattern(dtype, (3, *v.shape), rng)) for k, v in item.items()})
    jb.save(tmp_path / "ck", buf)
    if read == "orbax":
        monkeypatch.setattr(ckpt._zarr, "plan", lambda *a: None)
    for target in (None, jax.eval_shape(create), create()):
        back = jb.restore(tmp_path / "ck", target)
        for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(buf)):
            assert isinstance(a, jax.Array) and a.dtype == b.dtype and a.shape == b.shape
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    np.testing.assert_array_equal(np.asarray(back.sample(jax.random.key(1), 5).item["q"]).view(np.uint8),
                                  np.asarray(buf.sample(jax.random.key(1), 5).item["q"]).view(np.uint8))


def test_restored_leaves_are_jax_arrays_and_donation_is_in_place(tmp_path):
    buf = _filled_replay(4096)
    jb.save(tmp_path / "ck", buf)
    got = jb.restore(tmp_path / "ck", sharding=jax.devices()[0])
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(got))
    add = jax.jit(jb.PrioritisedReplayBuffer.add, donate_argnums=0)
    held = lambda b: [x.unsafe_buffer_pointer() for x in jax.tree.leaves(b) if x.size]  # noqa: E731 - a zero-size leaf has no storage to keep
    ptrs = held(got)
    new = add(got, _rand(np.random.default_rng(1), ITEM, (3,)))
    assert held(new) == ptrs


def test_restore_into_a_template(tmp_path):
    buf = _filled_replay()
    jb.save(tmp_path / "ck", buf)
    template = jax.eval_shape(lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=64))
    got = jb.restore(tmp_path / "ck", template)
    np.testing.assert_array_equal(got.priorities(jnp.arange(64)), buf.priorities(jnp.arange(64)))
    assert int(got.replay.head) == 32


@pytest.mark.parametrize(
    "other, field",
    [
        (lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=32), "capacity"),
        (lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=64, priority_exponent=0.5), "priority_exponent"),
        (lambda: jb.PrioritisedReplayBuffer.create({**ITEM, "obs": jax.ShapeDtypeStruct((3,), jnp.int32)}, capacity=64), "example"),
        (lambda: jb.ReplayBuffer.create(ITEM, capacity=64), "PrioritisedReplayBuffer"),
    ],
    ids=["capacity", "alpha", "dtype", "class"],
)
def test_wrong_config_is_refused_naming_the_field(other, field, tmp_path):
    jb.save(tmp_path / "ck", _filled_replay())
    target = other()
    before = jax.tree.map(np.asarray, target)
    with pytest.raises(jb.CheckpointError, match=field):
        jb.restore(tmp_path / "ck", target)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(target)):  # the target is untouched
        np.testing.assert_array_equal(a, b)


def _nested_item(reward=jnp.float32, a_shape=(3,), **more):
    return {"obs": {"a": jnp.zeros(a_shape, jnp.bfloat16), "b": jnp.zeros((2, 2), jnp.uint8), **more},
            "flag": jnp.bool_(False), "action": jnp.int32(0), "reward": jnp.zeros((), reward)}


@pytest.mark.parametrize(
    "item, says",
    [(_nested_item(jnp.float16), "example['reward']: dtype float32 in the checkpoint, float16 in the target"),
     (_nested_item(a_shape=(4,)), "example['obs']['a']: shape (3,) in the checkpoint, (4,) in the target"),
     (_nested_item(c=jnp.zeros(2)), "example['obs']: key 'c' only in the target"),
     ({**_nested_item(), "obs": [jnp.zeros((3,), jnp.bfloat16)]}, "example['obs']: a dict in the checkpoint, a list in the target")],
    ids=["dtype", "shape", "key", "structure"],
)
def test_a_nested_example_mismatch_names_the_leaf_and_what_differs(item, says, tmp_path):
    jb.save(tmp_path / "ck", jb.ReplayBuffer.create(_nested_item(), capacity=8))
    with pytest.raises(jb.CheckpointError, match=re.escape(f"config 'example' differs at {says}")) as e:
        jb.restore(tmp_path / "ck", jb.ReplayBuffer.create(item, capacity=8))
    assert str(e.value).count("differs") == 1  # the leaves that agree are not listed


class _Transition(typing.NamedTuple):
    obs: jax.Array
    action: jax.Array


def _node_items():
    """Examples whose node types buffer.json records by layout only, by id."""
    from flax import struct

    @struct.dataclass
    class Pair:
        obs: jax.Array
        action: jax.Array

    return {"namedtuple": _Transition(jnp.zeros(2), jnp.int32(0)), "dataclass": Pair(jnp.zeros(2), jnp.int32(0)),
            "nested": {"t": _Transition(jnp.zeros(2), jnp.int32(0))}}


@pytest.mark.parametrize("kind", ["namedtuple", "dataclass", "nested"])
def test_an_example_of_other_node_types_restores_into_a_target_and_without_one_names_the_type(kind, tmp_path):
    pytest.importorskip("flax")
    item = _node_items()[kind]
    batch = jax.tree.map(lambda x: jnp.stack([x + 1, x + 2]), item)
    buf = jb.ReplayBuffer.create(item, capacity=4).add(batch)
    jb.save(tmp_path / "ck", buf)
    name = type(item["t"] if kind == "nested" else item).__qualname__
    with pytest.raises(jb.CheckpointError, match=rf"config.example.*a {__name__}\.{re.escape(name)} node cannot be rebuilt.*pass target="):
        jb.restore(tmp_path / "ck")
    got = jb.restore(tmp_path / "ck", jb.ReplayBuffer.create(item, capacity=4))
    assert jax.tree.structure(got) == jax.tree.structure(buf)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(buf)):
        np.testing.assert_array_equal(a, b)
    other = jb.ReplayBuffer.create(_Transition(jnp.zeros(3), jnp.int32(0)) if kind != "nested" else {"t": (jnp.zeros(2), jnp.int32(0))}, capacity=4)
    with pytest.raises(jb.CheckpointError, match="config 'example' differs at example"):  # another layout is refused
        jb.restore(tmp_path / "ck", other)


@pytest.mark.parametrize("node", [["m.T", [["import", "os"]], [{"none": None}]], ["m.T", [["attr", "obs"]], []], "m.T"])
def test_a_crafted_node_is_refused_as_malformed(node, tmp_path):
    from jaxbuffers._checkpoint_describe import layout_target

    root = tmp_path / "ck"
    item = _Transition(jnp.zeros(2), jnp.int32(0))
    jb.save(root, jb.ReplayBuffer.create(item, capacity=4))
    meta = json.loads((root / "buffer.json").read_text())
    meta["config"]["example"] = {"node": node}
    (root / "buffer.json").write_text(json.dumps(meta))
    ckpt._write_manifest(root, ckpt._Progress(False, ""))
    for call in (lambda: jb.restore(root), lambda: jb.restore(root, jb.ReplayBuffer.create(item, capacity=4)),
                 lambda: layout_target(meta, root)):
        with pytest.raises(jb.CheckpointError, match="malformed node"):
            call()


@pytest.mark.parametrize("make", [lambda item: jb.ReplayBuffer.create(item, capacity=4),
                                  lambda item: jb.PrioritisedReplayBuffer.create(item, capacity=4),
                                  lambda item: jb.RolloutBuffer.create(item, num_envs=2, num_steps=3)], ids=["replay", "prioritised", "rollout"])
def test_a_checkpoint_without_an_example_is_read_from_its_leaves(make, tmp_path):
    """A buffer.json whose example is null (written before node layouts were recorded): restore asks for a target,
    and `layout_target` (the command-line tools) rebuilds the layout from the recorded leaves, under their paths."""
    from jaxbuffers._checkpoint_describe import layout_target

    root = tmp_path / "ck"
    item = _Transition(jnp.zeros(2), {"a": (jnp.int32(0), jnp.zeros(3, jnp.uint8))})
    buf = make(item)
    jb.save(root, buf)
    meta = json.loads((root / "buffer.json").read_text())
    meta["config"]["example"] = None
    (root / "buffer.json").write_text(json.dumps(meta))
    ckpt._write_manifest(root, ckpt._Progress(False, ""))
    with pytest.raises(jb.CheckpointError, match=f"the example of this {type(buf).__name__} is not described.*pass target="):
        jb.restore(root)
    got = jb.restore(root, layout_target(meta, root))
    paths = lambda b: [(jax.tree_util.keystr(p), x.shape, x.dtype) for p, x in jax.tree_util.tree_flatten_with_path(b)[0]]
    assert paths(got) == paths(buf)
    assert type(jb.restore(root, make(item))) is type(buf)


def test_a_dict_with_int_keys_restores_without_a_target(tmp_path):
    buf = jb.ReplayBuffer.create({0: jnp.zeros(2), 1: {"a": jnp.int32(0)}}, capacity=4)
    buf = buf.add({0: jnp.ones((2, 2)), 1: {"a": jnp.arange(2, dtype=jnp.int32)}})
    jb.save(tmp_path / "ck", buf)
    got = jb.restore(tmp_path / "ck")
    assert jax.tree.structure(got) == jax.tree.structure(buf)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(buf)):
        np.testing.assert_array_equal(a, b)


def test_a_layout_target_reads_a_namedtuple_checkpoint_with_the_saved_leaf_paths(tmp_path):
    """What the command-line tools restore with: stand-ins of the recorded layout, no user type imported."""
    from jaxbuffers._checkpoint_describe import SavedNode, layout_target

    buf = jb.ReplayBuffer.create(_Transition(jnp.zeros(2), jnp.int32(0)), capacity=4)
    buf = buf.add(_Transition(jnp.ones((2, 2)), jnp.arange(2, dtype=jnp.int32)))
    jb.save(tmp_path / "ck", buf)
    meta = json.loads((tmp_path / "ck" / "buffer.json").read_text())
    got = jb.restore(tmp_path / "ck", layout_target(meta, tmp_path / "ck"))
    assert isinstance(got.storage, SavedNode) and got.storage.type_name.endswith("_Transition")
    paths = lambda b: [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(b)[0]]
    assert paths(got) == paths(buf)
    np.testing.assert_array_equal(got.storage["action"], buf.storage.action)
    assert int(got.size()) == 2
    assert layout_target({"config": {"example": ckpt._json_config({"example": {"x": jnp.zeros(1)}})["example"]}}, tmp_path) is None


def _filled_episodes(**kw):
    create, add, data, *_ = _episode_ops(jb.EpisodeBuffer, STEP)
    buf = create() if not kw else jb.EpisodeBuffer.create(STEP, **{"max_episodes": 3, "max_timesteps": 4, "meta": {"task_id": jnp.int32(-1)}, **kw})
    return add(buf, *data(np.random.default_rng(0)))


@pytest.mark.parametrize(
    "kw, field",
    [(dict(max_episodes=4), "max_episodes' differs: 3 in the checkpoint, 4 in the target"),
     (dict(max_timesteps=5), "max_timesteps' differs"), (dict(circular=False), "circular' differs"),
     (dict(meta={"task_id": jnp.int32(-1), "goal": jnp.zeros(2)}), "meta' differs at meta: key 'goal' only in the target"),
     (dict(meta={"task_id": jnp.int16(-1)}), "meta' differs at meta['task_id']: dtype int32 in the checkpoint, int16 in the target"),
     (dict(obs_key="obs", reward_key="reward", action_key="action", meta=None), "meta' differs at meta: key 'task_id' only in the checkpoint")],
    ids=["max_episodes", "max_timesteps", "circular", "meta-field", "meta-dtype", "no-meta"],
)
def test_episode_buffer_wrong_config_is_refused(kw, field, tmp_path):
    jb.save(tmp_path / "ck", _filled_episodes())
    target = jb.EpisodeBuffer.create(STEP, **{"max_episodes": 3, "max_timesteps": 4, "meta": {"task_id": jnp.int32(-1)}, **kw})
    before = jax.tree.map(np.asarray, target)
    with pytest.raises(jb.CheckpointError, match=re.escape(f"config '{field}")):
        jb.restore(tmp_path / "ck", target)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(target)):
        np.testing.assert_array_equal(a, b)


def test_compressed_episode_buffer_round_trip_and_wrong_config(tmp_path):
    create, add, data, *_ = _episode_ops(jb.CompressedEpisodeBuffer, PIXELS, frame_stack=4, codec="rle")
    rng = np.random.default_rng(0)
    buf = add(create(), *data(rng))
    jb.save(tmp_path / "ck", buf)
    got = jb.restore(tmp_path / "ck")
    assert got.host is not buf.host and got.host.version == buf.host.version == int(got.version)
    for a, b in zip(jax.tree.leaves(got.get_all()), jax.tree.leaves(buf.get_all())):
        np.testing.assert_array_equal(a, b)
    got = add(got, *data(rng))  # the restored state is the newest of its store
    assert int(got.num_episodes()) == 3
    for kw, field in ((dict(frame_stack=4, codec="rle", padding="zero"), "padding"), (dict(codec="rle"), "frame_stack"),
                      (dict(frame_stack=4, codec="zstd:1"), "codec")):
        target = jb.CompressedEpisodeBuffer.create(PIXELS, max_episodes=3, max_timesteps=4, meta={"task_id": jnp.int32(-1)}, **kw)
        with pytest.raises(jb.CheckpointError, match=f"config '{field}'"):
            jb.restore(tmp_path / "ck", target)
        assert target.host.version == 0 and int(target.version) == 0


def test_episode_buffer_meta_defaults_come_back(tmp_path):
    """A meta default is data, not configuration: an add that omits the field after the restore gets it."""
    buf = jb.EpisodeBuffer.create(STEP, max_episodes=2, max_timesteps=3, meta={"task_id": jnp.int32(7), "goal": jnp.full(2, 0.5)})
    jb.save(tmp_path / "ck", buf)
    got = jb.restore(tmp_path / "ck")
    assert got.meta_spec == buf.meta_spec
    ep = _rand(np.random.default_rng(0), STEP, (3,))
    got = got.add_episode(ep, 2, terminated=True, final_obs=jnp.zeros(2))
    assert int(got.meta["task_id"][0]) == 7 and np.array_equal(np.asarray(got.meta["goal"][0]), [0.5, 0.5])


def test_unknown_format_version_is_refused(tmp_path):
    jb.save(tmp_path / "ck", _filled_replay())
    manifest = tmp_path / "ck" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["version"] = 99
    manifest.write_text(json.dumps(m))
    with pytest.raises(jb.CheckpointError, match="format version 99"):
        jb.restore(tmp_path / "ck")


@pytest.mark.parametrize("edit, says", [
    (lambda e: {"bytez" if k == "bytes" else k: v for k, v in e.items()}, "'bytes'"),
    (lambda e: {k: v for k, v in e.items() if k != "xxh3_64"}, "'xxh3_64'"),
    (lambda e: {**e, "bytes": str(e["bytes"])}, "'bytes'"),
    (lambda e: {**e, "bytes": -1}, "'bytes'"),
    (lambda e: {**e, "xxh3_64": 7}, "'xxh3_64'"),
    (lambda e: [e["bytes"], e["xxh3_64"]], "a dict"),
], ids=["renamed", "missing", "size-a-str", "size-negative", "checksum-an-int", "a-list"])
def test_a_damaged_manifest_entry_is_refused_naming_the_file_and_the_key(edit, says, tmp_path):
    """A manifest whose file entry lost a key, or holds a value of another type, is refused as a CheckpointError
    naming manifest.json, the file listed and the key, before any file is read."""
    root = jb.save(tmp_path / "ck", _filled_replay())
    m = json.loads((root / "manifest.json").read_text())
    m["files"]["buffer.json"] = edit(m["files"]["buffer.json"])
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(jb.CheckpointError, match=re.escape(f"{root / 'manifest.json'}: files['buffer.json']: expected ") + f".*{re.escape(says)}.*got"):
        jb.restore(root)


@pytest.mark.parametrize("edit, says", [
    (lambda m: m.__setitem__("leavez", m.pop("leaves")), "leaves: expected a list"),
    (lambda m: m["host"].__setitem__("versionz", m["host"].pop("version")), "host: expected key 'version', an int, got None"),
    (lambda m: m["host"].pop("stores"), "host: expected key 'stores', a list, got None"),
    (lambda m: m["host"].__setitem__("arrays", [1]), "host: expected key 'arrays', a dict, got [1]"),
    (lambda m: m["host"]["arrays"]["0"].__setitem__("payload", 5), "host.arrays['0']['payload']: expected [shape, dtype], got 5"),
    (lambda m: m.__setitem__("host", 3), "host: expected null or a dict"),
    (lambda m: m["host"]["stores"].__setitem__(0, None), "host.stores[0]: expected a dict with a dict 'config' (its 'num_slots' an int), got None"),
    (lambda m: m["host"]["stores"][0]["config"].__setitem__("num_slots", []), "host.stores[0]: expected a dict with a dict 'config'"),
    (lambda m: m["host"]["stores"][0].__setitem__("config", []), "host.stores[0]: expected a dict with a dict 'config'"),
    (lambda m: m["host"].__setitem__("arrays", {}), "host.arrays: expected a key '0' (one per store), got {}"),
    (lambda m: m["host"]["arrays"]["0"]["chunk"][0].__setitem__(0, None), "host.arrays['0']['chunk']: expected [shape, dtype]"),
    (lambda m: m["host"]["arrays"]["0"]["chunk"].__setitem__(1, []), "host.arrays['0']['chunk']: expected [shape, dtype]"),
    (lambda m: m["config"]["example"]["dict"][0][1].__setitem__("array", []), "expected an array entry [shape, dtype], got []"),
    (lambda m: m["config"]["example"]["dict"][0][1].__setitem__("array", [[-2], "uint8"]), "expected an array entry"),
], ids=["leaves-renamed", "version-renamed", "stores-missing", "arrays-a-list", "array-an-int", "host-an-int", "store-none",
        "store-num-slots-a-list", "store-config-a-list", "arrays-empty", "array-shape-none", "array-dtype-a-list", "example-array-empty",
        "example-array-negative"])
def test_a_damaged_buffer_description_is_refused_naming_the_file_and_the_key(edit, says, tmp_path):
    """A buffer.json (manifest rewritten to match) missing a key that restore reads, or holding a value of another
    type, is refused as a CheckpointError naming buffer.json and the key."""
    root = jb.save(tmp_path / "c", _small_compressed())
    meta = json.loads((root / "buffer.json").read_text())
    edit(meta)
    (root / "buffer.json").write_text(json.dumps(meta))
    ckpt._write_manifest(root, ckpt._Progress(False, ""))
    with pytest.raises(jb.CheckpointError, match=re.escape(says) if says.startswith("expected an array") else
                       re.escape(f"{root / 'buffer.json'}: {says}")):
        jb.restore(root)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_file_is_detected_naming_it(damage, tmp_path):
    jb.save(tmp_path / "ck", _filled_replay(4096))
    victim = max((p for p in (tmp_path / "ck" / "arrays").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(jb.CheckpointError, match=victim.name):
        jb.restore(tmp_path / "ck")


def _small_compressed(reward_dtype=jnp.float32):
    step = {"obs": jnp.zeros((6, 6), jnp.uint8), "action": jnp.int32(0), "reward": jnp.zeros((), reward_dtype)}
    frames = np.random.default_rng(0).integers(0, 255, (2, 6, 6, 6), dtype=np.uint8)
    no = jnp.zeros((2, 6), bool)
    return jb.CompressedTrajectoryBuffer.create(step, num_envs=2, length=8, codec="zstd:1").add(
        {"obs": frames, "action": jnp.zeros((2, 6), jnp.int32), "reward": jnp.ones((2, 6), reward_dtype)}, terminated=no)


def test_corrupt_host_store_file_is_detected_naming_it(tmp_path):
    """A byte flipped in a compressed buffer's packed payloads (read into host memory, hashed as read)."""
    jb.save(tmp_path / "c", _small_compressed())
    victim = next((tmp_path / "c" / "arrays" / "host.stores.0.payload").glob("[0-9]*"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(jb.CheckpointError, match=f"{victim.parent.name}/{victim.name}: checksum mismatch"):
        jb.restore(tmp_path / "c")


def test_a_file_read_in_many_blocks_by_several_threads_comes_back_whole_and_a_flipped_byte_is_caught(tmp_path, monkeypatch):
    """Files read as blocks by a pool of threads and checksummed in file order: with blocks of 64 bytes a compressed
    buffer comes back equal, and a byte flipped in the last block of its payload file is detected naming the file."""
    from jaxbuffers import _checkpoint_zarr as zarr

    monkeypatch.setattr(zarr, "_READ_BLOCK", 64)
    buf = _small_compressed()
    jb.save(tmp_path / "c", buf)
    key = jax.random.key(0)
    _assert_same(jb.restore(tmp_path / "c").sample_sequences(key, 4, 2), buf.sample_sequences(key, 4, 2))
    victim = next((tmp_path / "c" / "arrays" / "host.stores.0.payload").glob("[0-9]*"))
    data = bytearray(victim.read_bytes())
    assert len(data) > 4 * 64
    data[-3] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(jb.CheckpointError, match=f"{victim.parent.name}/{victim.name}: checksum mismatch"):
        jb.restore(tmp_path / "c")


def test_restored_compressed_buffer_holds_the_payload_read_once_and_goes_on_as_the_never_saved_one(tmp_path):
    """A compressed buffer saved and restored with the public API: its packed payloads are read once, straight into
    the arena chunks the restored store keeps (traced host memory peaks at about one payload, not two: the restore
    before this read the payload into one array and copied it into the arena). It samples as the never-saved buffer,
    and stays equal to it, with exact byte accounting, while adds overwrite its whole ring."""
    import tracemalloc

    step = {"obs": jnp.zeros((64, 64), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    rng, n = np.random.default_rng(0), 600

    def batch(k):  # random frames: zstd keeps them about as large as they are
        obs = rng.integers(0, 255, (1, k, 64, 64), dtype=np.uint8)
        return {"obs": obs, "action": jnp.asarray(rng.integers(0, 6, (1, k)), jnp.int32), "reward": jnp.ones((1, k))}

    def same_samples(a, b, seed):
        key = jax.random.key(seed)
        for x, y in zip(jax.tree.leaves(a.sample_sequences(key, 64, 4)), jax.tree.leaves(b.sample_sequences(key, 64, 4))):
            np.testing.assert_array_equal(x, y)

    def exact(b):  # what the store reports is what its chunks hold; the live payload bytes are the never-saved one's
        store = b.host.stores[0]
        held = sum(ch.data.nbytes for ch in store._arena.chunks.values())
        assert store.stats()["arena_nbytes"] == b.host_arena_nbytes == held
        return b.host_live_nbytes - b.host.recent_nbytes - store.recent_nbytes  # decoded rows kept for reads: not saved

    no = jnp.zeros((1, n), bool)
    buf = jb.CompressedTrajectoryBuffer.create(step, num_envs=1, length=n, codec="zstd:1", chunk_bytes=1 << 20).add(batch(n), terminated=no)
    jb.save(tmp_path / "c", buf)
    payload = next((tmp_path / "c" / "arrays" / "host.stores.0.payload").glob("[0-9]*")).stat().st_size
    assert payload > 2 << 20  # several chunks of at most 1 MiB
    tracemalloc.start()
    try:
        back = jb.restore(tmp_path / "c")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert payload < peak < 1.5 * payload, (peak, payload)  # one payload and the index, not a second payload
    held = {id(ch.data): ch.data for ch in back.host.stores[0]._arena.chunks.values()}
    assert len(held) > 2 and sum(h.nbytes for h in held.values()) == back.host_arena_nbytes == payload  # no slack
    assert exact(back) == exact(buf) and back.host.stores[0].stats()["dead_nbytes"] == 0
    same_samples(back, buf, 1)
    for i in range(3):  # 1.5 times around the ring: every restored entry overwritten
        more = batch(n // 2)
        back, buf = back.add(more, terminated=no[:, : n // 2]), buf.add(more, terminated=no[:, : n // 2])
        same_samples(back, buf, 2 + i)
        assert exact(back) == exact(buf)
        s = back.host.stores[0].stats()
        assert s["slack_nbytes"] <= 0.25 * s["arena_nbytes"], s
    assert not held.keys() & {id(ch.data) for ch in back.host.stores[0]._arena.chunks.values()}  # released as overwritten


def test_arrays_stored_in_several_chunks_are_read_by_orbax(tmp_path):
    """An array of the checkpoint rewritten as a zarr array of several chunks (a layout orbax reads, not a single
    chunk file): the buffer restores bit for bit, and a flipped byte in one of those chunks is still detected."""
    import tensorstore as ts
    from jaxbuffers import _checkpoint_files as files

    buf = _filled_replay(4096)
    jb.save(tmp_path / "ck", buf)
    folder = max((tmp_path / "ck" / "arrays").glob("device.*"), key=lambda p: sum(f.stat().st_size for f in p.iterdir()))
    data = np.asarray(ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(folder)}}).result().read().result())
    for f in folder.iterdir():
        f.unlink()
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(folder)},
            "metadata": {"shape": list(data.shape), "chunks": [max(1, data.shape[0] // 4), *data.shape[1:]], "dtype": data.dtype.str,
                         "compressor": None}}
    ts.open(spec, create=True).result().write(data).result()
    assert len([f for f in folder.iterdir() if not f.name.startswith(".")]) == 4
    files._write_manifest(tmp_path / "ck", files._Progress(False, ""))
    back = jb.restore(tmp_path / "ck")
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(buf)):
        np.testing.assert_array_equal(a, b)
    victim = folder / "1.0" if data.ndim == 2 else folder / "1"
    raw = bytearray(victim.read_bytes())
    raw[0] ^= 0xFF
    victim.write_bytes(bytes(raw))
    with pytest.raises(jb.CheckpointError, match=f"{folder.name}/{victim.name}: checksum mismatch"):
        jb.restore(tmp_path / "ck")


@pytest.mark.parametrize("case", ["replay", "compressed-bfloat16"])
def test_arrays_folder_is_what_orbax_writes_for_the_same_arrays(case, tmp_path):
    """`save` writes `arrays/` itself: every file is byte for byte the one orbax's PyTreeCheckpointHandler writes for
    the same tree of numpy arrays (bool, bfloat16, 0-d arrays, host stores, an empty dict of stores), and orbax reads
    it back; the manifest's checksums, taken as the files were written, are those of the files on disk."""
    ocp = pytest.importorskip("orbax.checkpoint")
    from etils import epath
    from jaxbuffers import _checkpoint_files as files

    buf = _filled_replay(256) if case == "replay" else _small_compressed(jnp.bfloat16)
    jb.save(tmp_path / "ck", buf)
    tree = jax.tree.map(np.asarray, ckpt._snapshot(buf).done()[1])
    handler = ocp.PyTreeCheckpointHandler(use_compression=False, use_ocdbt=False)
    handler.save(epath.Path(tmp_path / "orbax"), args=ocp.args.PyTreeSave(tree))
    handler.close()
    ours, theirs = tmp_path / "ck" / "arrays", tmp_path / "orbax"
    names = sorted(p.relative_to(ours).as_posix() for p in ours.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(theirs).as_posix() for p in theirs.rglob("*") if p.is_file())
    assert any(n.startswith("host.stores.0.") for n in names) == (case != "replay")
    for n in names:
        assert (ours / n).read_bytes() == (theirs / n).read_bytes(), n
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    back = ocp.PyTreeCheckpointHandler(use_compression=False, use_ocdbt=False).restore(
        epath.Path(ours), args=ocp.args.PyTreeRestore(restore_args=as_numpy))
    jax.tree.map(np.testing.assert_array_equal, back, tree)
    listed = json.loads((tmp_path / "ck" / "manifest.json").read_text())["files"]
    assert sorted(listed) == sorted(p.relative_to(tmp_path / "ck").as_posix() for p in (tmp_path / "ck").rglob("*")
                                    if p.is_file() and p.name != "manifest.json")
    for rel, info in listed.items():
        assert info == {"bytes": (tmp_path / "ck" / rel).stat().st_size,
                        "xxh3_64": files._hash_file(tmp_path / "ck" / rel, files._Progress(False, ""))}, rel


@pytest.mark.parametrize("failing", ["write", "sync"])
def test_a_failed_write_names_the_file_and_keeps_the_previous_checkpoint(failing, tmp_path, monkeypatch):
    """The disk full while a file is written, or an I/O error of a sync started during the write (a file over
    `_WRITEBACK` bytes): the save raises the error naming the file, and the previous checkpoint is kept."""
    import errno

    from jaxbuffers import _checkpoint_files as files

    old, new = _filled_replay(), _filled_replay(4096)
    jb.save(tmp_path / "ck", old)
    writev, code = os.writev, errno.ENOSPC if failing == "write" else errno.EIO

    def full(fd, views):
        if sum(len(v) for v in views) > 4096:
            raise OSError(code, os.strerror(code))
        return writev(fd, views)

    def failed_sync(fd):
        raise OSError(code, os.strerror(code))

    if failing == "write":
        monkeypatch.setattr(files.os, "writev", full)
    else:
        monkeypatch.setattr(files, "_WRITE_BLOCK", 4096)
        monkeypatch.setattr(files, "_WRITEBACK", 16384)
        monkeypatch.setattr(files, "_datasync", failed_sync)
    with pytest.raises(OSError, match=re.escape(os.strerror(code)) + r": '.*arrays/device\.\d+/0") as e:
        jb.save(tmp_path / "ck", new)
    assert e.value.errno == code
    monkeypatch.undo()
    _assert_same(jb.restore(tmp_path / "ck"), old)
    assert not list(tmp_path.glob(".ck.*"))


def test_an_array_read_back_as_another_dtype_is_refused_naming_both(tmp_path):
    """An array whose zarr metadata was edited to another dtype (read by orbax as that dtype): refused, naming the
    array, the shape and dtype it came back as and those expected."""
    from jaxbuffers import _checkpoint_files as files

    buf = jb.ReplayBuffer.create(ITEM, capacity=16).add(_rand(np.random.default_rng(0), ITEM, (4,)))
    root = jb.save(tmp_path / "ck", buf)
    leaves = json.loads((root / "buffer.json").read_text())["leaves"]
    i = next(i for i, leaf in enumerate(leaves) if leaf["path"] == ".storage['obs']")
    zarray = root / "arrays" / f"device.{i}" / ".zarray"
    zarray.write_text(zarray.read_text().replace('"<f4"', '"<i4"'))
    files._write_manifest(root, files._Progress(False, ""))
    with pytest.raises(jb.CheckpointError, match=re.escape(f"array {i} (.storage['obs']) came back as (16, 3) int32, expected (16, 3) float32")):
        jb.restore(root)


def _edit_leaf(root: Path, path: str, edit) -> None:
    """Replace the int32 values of the saved leaf `path` by `edit(values)` and rewrite the manifest to match."""
    leaves = json.loads((root / "buffer.json").read_text())["leaves"]
    i = next(i for i, leaf in enumerate(leaves) if leaf["path"] == path)
    (chunk,) = [f for f in (root / "arrays" / f"device.{i}").iterdir() if not f.name.startswith(".")]
    chunk.write_bytes(np.asarray(edit(np.frombuffer(chunk.read_bytes(), "<i4").copy()), "<i4").tobytes())
    ckpt._write_manifest(root, ckpt._Progress(False, ""))


_STACKED = jax.vmap(lambda _: jb.ReplayBuffer.create(ITEM, capacity=8))(jnp.arange(2))


@pytest.mark.parametrize("buffer, path, value, says", [
    (jb.ReplayBuffer.create(ITEM, capacity=8), ".num_valid", 100, "num_valid: expected a value in [0, 8], got 100"),
    (jb.ReplayBuffer.create(ITEM, capacity=8), ".head", -3, "head: expected a value in [0, 7], got -3"),
    (jb.ReplayBuffer.create(ITEM, capacity=8), ".added", [0, 2**30],
     "added: expected [high, low] with high >= 0 and 0 <= low < 2**30, got [0, 1073741824]"),
    (jb.PrioritisedReplayBuffer.create(ITEM, capacity=8), ".replay.head", 8, "replay.head: expected a value in [0, 7], got 8"),
    (_STACKED, ".num_valid", [3, 9], "num_valid: expected a value in [0, 8], got [3, 9]"),
    (jb.TrajectoryBuffer.create(STEP, num_envs=E, length=L), ".head", L, f"head: expected a value in [0, {L - 1}], got {L}"),
    (jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=2), ".buffer.num_valid", L + 1,
     f"buffer.num_valid: expected a value in [0, {L}], got {L + 1}"),
    (jb.EpisodeBuffer.create(STEP, max_episodes=3, max_timesteps=4), ".num_valid", -1, "num_valid: expected a value in [0, 3], got -1"),
    (jb.CompressedTrajectoryBuffer.create(PIXELS, num_envs=E, length=L), ".buffer.head", 99,
     f"buffer.head: expected a value in [0, {L - 1}], got 99"),
    (jb.RolloutBuffer.create(ITEM, num_envs=E, num_steps=4), ".step_index", -2, "step_index: expected a value in [0, 4], got -2"),
    (jb.CompressedRolloutBuffer.create(PIXELS, num_envs=E, num_steps=4), ".buffer.step_index", 5,
     "buffer.step_index: expected a value in [0, 4], got 5"),
    (jb.TrajectoryBuffer.create(STEP, num_envs=E, length=L, final_obs_capacity=3), ".final_head", [0, 3],
     "final_head: expected a value in [0, 2], got [0, 3]"),
    (jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=2, period=2), ".phase", 2,
     "phase: expected a value in [0, 1], got 2"),
    (jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=2), ".buffer.final_head", -1,
     f"buffer.final_head: expected a value in [0, {L - 1}], got [-1, -1]"),
    (jb.CompressedTrajectoryBuffer.create(PIXELS, num_envs=E, length=L), ".frame_head", 13,
     "frame_head: expected a value in [0, 12], got 13"),
    (jb.CompressedTrajectoryBuffer.create(PIXELS, num_envs=E, length=L), ".final_head", [L, 0],
     f"final_head: expected a value in [0, {L - 1}], got [{L}, 0]"),
    (jb.CompressedTrajectoryBuffer.create(PIXELS, num_envs=E, length=L), ".next_key_pos", [0, 8],
     "next_key_pos: expected a value in [0, 7], got [0, 8]"),
    (jb.CompressedTrajectoryBuffer.create(PIXELS, num_envs=E, length=L, frame_stack=4), ".next_ep_pos", [-1, 0],
     "next_ep_pos: expected a value in [0, 3], got [-1, 0]"),
    (jb.CompressedTrajectoryBuffer.create(PIXELS, num_envs=E, length=L), ".buffer.final_head", [0, L],
     f"buffer.final_head: expected a value in [0, {L - 1}], got [0, {L}]"),
    (jb.TrajectoryBuffer.create(STEP, num_envs=E, length=L, final_obs_capacity=3), ".final_owner", L,
     f"final_owner: expected a value in [-1, {L - 1}], got [[{L}, {L}, {L}], [{L}, {L}, {L}]]"),
    (jb.TrajectoryBuffer.create(STEP, num_envs=E, length=L, final_obs_capacity=3), ".lost_prefix", [0, L + 1],
     f"lost_prefix: expected a value in [0, {L}], got [0, {L + 1}]"),
], ids=["num_valid", "head", "added", "prioritised", "stacked", "trajectory", "prioritised-trajectory", "episode", "compressed",
        "rollout", "compressed-rollout", "final_head", "phase", "prioritised-final_head", "frame_head", "compressed-final_head",
        "next_key_pos", "next_ep_pos", "compressed-inner-final_head", "final_owner", "lost_prefix"])
def test_cursors_out_of_range_are_refused_naming_the_leaf(buffer, path, value, says, tmp_path):
    """A checkpoint whose ring cursor was edited (manifest rewritten to match) is refused as `with_cursors` refuses
    the value, naming the leaf: a capacity-8 buffer came back with `size() == 100`, or with `head == -3`. Every other
    cursor with a documented range (the final-observation heads, the frame ring's cursors, a prioritised trajectory's
    `phase`) is checked the same way, naming the leaf, the range and the value."""
    root = jb.save(tmp_path / "ck", buffer)
    _edit_leaf(root, path, lambda v: np.broadcast_to(value, v.shape))
    with pytest.raises(jb.CheckpointError, match=re.escape(f"{root}: array {says}")):
        jb.restore(root)
    with pytest.raises(jb.CheckpointError, match=re.escape(says)):
        jb.restore(root, buffer)
    _edit_leaf(root, path, lambda v: np.zeros_like(v))  # in range: restored
    back = jb.restore(root)
    assert int(np.max(back.step_index if hasattr(back, "step_index") else back.num_valid)) == 0


def test_a_large_cursor_out_of_range_is_named_by_its_first_bad_entry(tmp_path):
    """A cursor array of many entries (a trajectory's `final_owner`, `[num_envs, K]`) with one entry out of range: the
    error names that entry's index and value and how many are out of range, not every value of the array."""
    buffer = jb.TrajectoryBuffer.create(STEP, num_envs=E, length=64, final_obs_capacity=40)
    root = jb.save(tmp_path / "ck", buffer)
    _edit_leaf(root, ".final_owner", lambda v: np.where(np.arange(v.size) == 47, 64, v))
    with pytest.raises(jb.CheckpointError) as e:
        jb.restore(root)
    assert str(e.value) == (f"{root}: array final_owner: expected a value in [-1, 63], got 64 at [1, 7] "
                            f"(1 of {E * 40} values out of range)")


def test_crafted_pickle_is_never_executed(tmp_path, monkeypatch):
    """A buffer.json replaced by a pickle that would create a file when unpickled (manifest updated to match):
    restore refuses it as not JSON, and no pickle loader is ever called."""
    jb.save(tmp_path / "ck", _filled_replay())
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    root = tmp_path / "ck"
    (root / "buffer.json").write_bytes(pickle.dumps(Payload()))
    m = json.loads((root / "manifest.json").read_text())
    m["files"]["buffer.json"] = {"bytes": (root / "buffer.json").stat().st_size,
                                 "xxh3_64": ckpt._hash_file(root / "buffer.json", ckpt._Progress(False, ""))}
    (root / "manifest.json").write_text(json.dumps(m))

    def refuse(*a, **k):
        raise AssertionError("pickle used by restore")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(np, "load", refuse)
    with pytest.raises(jb.CheckpointError, match="buffer.json"):
        jb.restore(root)
    assert not marker.exists()


def test_crafted_class_and_dtype_are_refused(tmp_path):
    root = tmp_path / "ck"
    for key, value, msg in (("class", "os.system", "not a jaxbuffers buffer"),
                            ("config", None, re.escape(f"{root / 'buffer.json'}: config.example") + r".*dtype, got 'object'")):
        jb.save(root, _filled_replay())
        meta = json.loads((root / "buffer.json").read_text())
        if key == "class":
            meta["class"] = value
        else:
            meta["config"]["example"]["dict"][0][1]["array"][1] = "object"
        (root / "buffer.json").write_text(json.dumps(meta))
        ckpt._write_manifest(root, ckpt._Progress(False, ""))
        with pytest.raises(jb.CheckpointError, match=msg):
            jb.restore(root)


def test_save_refuses_to_replace_a_folder_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a jaxbuffers checkpoint"):
        jb.save(tmp_path / "mine", _filled_replay())
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_save_fills_an_existing_empty_folder_in_place(tmp_path, monkeypatch):
    """An empty folder (the working directory too) keeps its inode: the checkpoint is written into it, and a later
    save replaces it as any checkpoint. A checkpoint holding the working directory is refused (replacing it would
    delete the working directory)."""
    one, two = _filled_replay(16), _filled_replay(32)
    (tmp_path / "empty").mkdir()
    inode = (tmp_path / "empty").stat().st_ino
    assert jb.save(tmp_path / "empty", one) == tmp_path / "empty"
    assert (tmp_path / "empty").stat().st_ino == inode
    _assert_same(jb.restore(tmp_path / "empty"), one)
    jb.save(tmp_path / "empty", two)
    _assert_same(jb.restore(tmp_path / "empty"), two)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert jb.save(".", one) == tmp_path / "cwd"
    assert os.path.samefile(os.getcwd(), tmp_path / "cwd")
    _assert_same(jb.restore("."), one)
    for inside in (".", tmp_path / "cwd"):
        with pytest.raises(ValueError, match=f"directory: {tmp_path / 'cwd'} holds the working directory"):
            jb.save(inside, two)
    assert os.path.samefile(os.getcwd(), tmp_path / "cwd")
    _assert_same(jb.restore("."), one)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "empty"]


@pytest.mark.parametrize("inside", ["newsub", "arrays", "arrays/device.0", "a/b"])
def test_save_inside_a_checkpoint_is_refused_naming_it(inside, tmp_path):
    buf = _filled_replay(16)
    jb.save(tmp_path / "ck", buf)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=f"directory: {tmp_path / 'ck' / inside} is inside the checkpoint {tmp_path / 'ck'}"):
        jb.save(tmp_path / "ck" / inside, buf)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
    _assert_same(jb.restore(tmp_path / "ck"), buf)


def test_inside_a_checkpoint_is_where_the_folder_is_on_disk(tmp_path):
    """`ck/../new` is beside the checkpoint `ck`, not in it; a link to a folder of a checkpoint leads into it; a
    `manifest.json` or `buffer.json` that is not a jaxbuffers one does not make its folder a checkpoint."""
    buf = _filled_replay(16)
    jb.save(tmp_path / "ck", buf)
    jb.save(tmp_path / "ck" / ".." / "new", buf)
    _assert_same(jb.restore(tmp_path / "new"), buf)
    (tmp_path / "L").symlink_to(tmp_path / "ck" / "arrays")
    with pytest.raises(ValueError, match=f"directory: {tmp_path / 'L' / 'sub'} is inside the checkpoint {tmp_path / 'ck'}"):
        jb.save(tmp_path / "L" / "sub", buf)
    assert not (tmp_path / "ck" / "arrays" / "sub").exists()
    for name in ("manifest.json", "buffer.json"):
        project = tmp_path / name.split(".")[0]
        project.mkdir()
        (project / name).write_text(json.dumps({"name": "a web app", "files": {}}))
        jb.save(project / "runs" / "ckpt", buf)
        _assert_same(jb.restore(project / "runs" / "ckpt"), buf)
        assert json.loads((project / name).read_text())["name"] == "a web app"


def test_a_commit_checks_the_folder_again_and_never_replaces_the_working_directory(tmp_path, monkeypatch):
    """Two threads save to the empty working directory at once (both past the first check before either commits):
    one fills it, the other is refused at its commit (the folder is now a checkpoint holding the working directory).
    The working directory is never moved or deleted."""
    (tmp_path / "cwd").mkdir()
    inode = (tmp_path / "cwd").stat().st_ino
    monkeypatch.chdir(tmp_path / "cwd")
    snapshot, both_checked, errors = ckpt._snapshot, threading.Barrier(2), []

    def checked_then_snapshot(*args, **kwargs):
        both_checked.wait(timeout=60)
        return snapshot(*args, **kwargs)

    monkeypatch.setattr(ckpt, "_snapshot", checked_then_snapshot)
    bufs = [_filled_replay(16), _filled_replay(32)]

    def save(i):
        try:
            jb.save(".", bufs[i], progress=False)
        except Exception as e:  # noqa: BLE001 - gathered and checked below
            errors.append(e)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [type(e) for e in errors] == [ValueError] and "holds the working directory" in str(errors[0])
    assert (tmp_path / "cwd").stat().st_ino == inode and os.path.samefile(os.getcwd(), tmp_path / "cwd")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd"]
    back = jb.restore(".")
    _assert_same(back, bufs[0] if back.capacity == 16 else bufs[1])


@pytest.mark.parametrize("blocking", [True, False])
def test_a_file_written_into_the_empty_folder_during_a_save_is_kept_and_the_save_refused(blocking, tmp_path, monkeypatch):
    """The folder was empty when the save began; a file written into it before the commit makes the save fail with
    FileExistsError at the commit, and nothing is deleted."""
    (tmp_path / "ck").mkdir()
    write = ckpt._write

    def someone_writes_first(*args, **kwargs):
        (tmp_path / "ck" / "notes.txt").write_text("keep")
        return write(*args, **kwargs)

    monkeypatch.setattr(ckpt, "_write", someone_writes_first)
    with pytest.raises(FileExistsError, match="not a jaxbuffers checkpoint or an empty folder"):
        out = jb.save(tmp_path / "ck", _filled_replay(16), progress=False, blocking=blocking)
        if not blocking:
            out.wait()
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["notes.txt"] and (tmp_path / "ck" / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_save_under_a_file_says_the_file_is_not_a_folder(tmp_path):
    (tmp_path / "notes").write_text("keep")
    for path in (tmp_path / "notes" / "ck", tmp_path / "notes" / "a" / "ck", tmp_path / "notes"):
        with pytest.raises(NotADirectoryError, match=f"directory: {tmp_path / 'notes'} is a file, not a folder"):
            jb.save(path, _filled_replay(16))
    assert [p.name for p in tmp_path.iterdir()] == ["notes"] and (tmp_path / "notes").read_text() == "keep"


@pytest.mark.parametrize("through_link", [False, True])
def test_blocking_saves_to_one_folder_from_several_threads_each_replace_it(through_link, tmp_path, monkeypatch):
    """Six threads save six buffers to one folder at once (each rename slowed, so that commits would overlap): every
    save succeeds, one after the other, and the folder holds one of the buffers whole. Half the threads may name
    the folder through a link to the folder above it: it is the same folder."""
    from jaxbuffers import _checkpoint_files as files

    (tmp_path / "L").symlink_to(tmp_path)
    paths = [tmp_path / "L" / "ck" if through_link and i % 2 else tmp_path / "ck" for i in range(6)]

    bufs = [jb.ReplayBuffer.create(ITEM, capacity=16).add(_rand(np.random.default_rng(i), ITEM, (i + 1,))) for i in range(6)]
    rename, start, errors = os.rename, threading.Barrier(6), []

    def slow_rename(a, b):
        time.sleep(0.02)
        rename(a, b)

    monkeypatch.setattr(files.os, "rename", slow_rename)

    def save(i):
        start.wait()
        try:
            jb.save(paths[i], bufs[i], progress=False)
        except Exception as e:  # noqa: BLE001 - gathered and reported below
            errors.append(f"save {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    back = jb.restore(tmp_path / "ck")
    assert int(back.size()) in range(1, 7)
    _assert_same(back, bufs[int(back.size()) - 1])
    assert (tmp_path / "ck").resolve() not in files._SAVING  # the folder's lock went with its last save


def test_the_per_folder_save_locks_do_not_accumulate(tmp_path):
    """A process saving to many folders (one per step) keeps no lock for a folder once its saves are done."""
    from jaxbuffers import _checkpoint_files as files

    before = set(files._SAVING)
    for i in range(5):
        jb.save(tmp_path / f"ck_{i}", _filled_replay(16), progress=False)
    pending = jb.save(tmp_path / "ck_async", _filled_replay(16), progress=False, blocking=False)
    pending.wait()
    assert set(files._SAVING) == before


def test_save_writes_through_a_symbolic_link(tmp_path):
    """A `latest -> ckpt_N` link is kept: the folder it points to is replaced (atomically) and read back through it;
    a link to a folder not written yet creates that folder; restore follows the link to the target's `.prev`."""
    one, two = _filled_replay(16), _filled_replay(32)
    jb.save(tmp_path / "ckpt_1", one)
    (tmp_path / "latest").symlink_to("ckpt_1")  # relative, as `ln -s ckpt_1 latest` makes it
    saved = jb.save(tmp_path / "latest", two)
    assert (tmp_path / "latest").is_symlink() and os.readlink(tmp_path / "latest") == "ckpt_1"
    assert saved == tmp_path / "ckpt_1"
    _assert_same(jb.restore(tmp_path / "ckpt_1"), two)
    _assert_same(jb.restore(tmp_path / "latest"), two)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["ckpt_1", "latest"]
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").symlink_to(tmp_path / "ckpt_2")  # not written yet
    jb.save(tmp_path / "latest", one)
    assert (tmp_path / "latest").is_symlink() and (tmp_path / "ckpt_2" / "manifest.json").is_file()
    _assert_same(jb.restore(tmp_path / "latest"), one)
    os.rename(tmp_path / "ckpt_2", tmp_path / ".ckpt_2.prev")  # a crash between a save's two renames
    _assert_same(jb.restore(tmp_path / "latest"), one)


def test_stale_compressed_state_is_refused(tmp_path):
    create, add, data, *_ = CASES["compressed-trajectory"]()
    rng = np.random.default_rng(0)
    old = add(create(), *data(rng))
    add(old, *data(rng))
    with pytest.raises(jb.StaleBufferError, match="last add"):
        jb.save(tmp_path / "ck", old)


_CRASH = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    import jaxbuffers as jb
    item = {"x": jax.ShapeDtypeStruct((1 << 16,), jnp.float32)}
    buf = jb.ReplayBuffer.create(item, capacity=2048)  # 512 MiB
    buf = buf.add({"x": jnp.full((1, 1 << 16), 2.0)})
    print("saving", flush=True)
    jb.save(sys.argv[1], buf)
""")


def test_crash_mid_save_keeps_the_previous_checkpoint(tmp_path):
    small = _filled_replay()
    jb.save(tmp_path / "ck", small)
    proc = subprocess.Popen([sys.executable, "-c", _CRASH, str(tmp_path / "ck")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "saving"
        # kill once the new checkpoint's temporary folder holds some bytes
        for _ in range(600):
            tmps = list(tmp_path.glob(".ck.tmp-*"))
            if tmps and sum(p.stat().st_size for p in tmps[0].rglob("*") if p.is_file()) > 1 << 20:
                break
            if proc.poll() is not None:
                break
            import time

            time.sleep(0.05)
        assert proc.poll() is None, "the save finished before it could be interrupted"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    got = jb.restore(tmp_path / "ck")
    np.testing.assert_array_equal(got.replay.storage["obs"], small.replay.storage["obs"])
    jb.save(tmp_path / "ck", got)  # the next save removes the dead process's temporary folder
    assert not list(tmp_path.glob(".ck.tmp-*"))


def test_crash_between_renames_restores_the_previous(tmp_path):
    buf = _filled_replay()
    jb.save(tmp_path / "ck", buf)
    (tmp_path / "ck").rename(tmp_path / ".ck.prev")  # the state after the first of the two renames
    got = jb.restore(tmp_path / "ck")
    np.testing.assert_array_equal(got.replay.storage["obs"], buf.replay.storage["obs"])
    jb.save(tmp_path / "ck", got)
    assert (tmp_path / "ck").is_dir() and not (tmp_path / ".ck.prev").exists()


def test_progress_bar_can_be_forced(tmp_path, capsys):
    jb.save(tmp_path / "ck", _filled_replay(), progress=False)
    jb.restore(tmp_path / "ck", progress=False)
    assert capsys.readouterr().err == ""


def test_checkpoint_manager_saves_state_and_buffer_as_one_step(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    buf = _filled_replay()
    state = {"w": jnp.arange(4.0), "step": jnp.int32(3)}
    with ocp.CheckpointManager(tmp_path / "run", options=ocp.CheckpointManagerOptions(max_to_keep=2)) as mngr:
        mngr.save(5, args=ocp.args.Composite(state=ocp.args.StandardSave(state), buffer=jb.BufferSave(buf)))
        mngr.wait_until_finished()
    with ocp.CheckpointManager(tmp_path / "run") as mngr:
        assert mngr.latest_step() == 5
        out = mngr.restore(5, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(jax.eval_shape(lambda: state)), buffer=jb.BufferRestore()))
    np.testing.assert_array_equal(out.state["w"], state["w"])
    k = jax.random.key(3)
    for a, b in zip(jax.tree.leaves(out.buffer.sample(k, 9)), jax.tree.leaves(buf.sample(k, 9))):
        np.testing.assert_array_equal(a, b)


def _gated_write(monkeypatch):
    """Hold every checkpoint write until the returned event is set: what runs meanwhile runs while a save is pending."""
    gate, write = threading.Event(), ckpt._write

    def gated(*args):
        assert gate.wait(60)
        return write(*args)

    monkeypatch.setattr(ckpt, "_write", gated)
    return gate


def _donate_and_overwrite(buf):
    add = jax.jit(jb.PrioritisedReplayBuffer.add, donate_argnums=0)
    for i in range(2):
        buf = add(buf, _rand(np.random.default_rng(i + 1), ITEM, (buf.replay.capacity // 2,)))
    return jax.block_until_ready(buf)


def _assert_same(got, want, same=True):
    pairs = list(zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in pairs) == same  # NaN: advantages before compute_gae


def test_async_save_holds_the_state_of_the_call_while_the_buffer_is_donated(tmp_path, monkeypatch):
    buf = _filled_replay(4096)
    before = jax.tree.map(np.array, buf)
    gate = _gated_write(monkeypatch)
    pending = jb.save(tmp_path / "ck", buf, blocking=False)
    assert isinstance(pending, jb.PendingSave) and not pending.done() and not (tmp_path / "ck").exists()
    buf = _donate_and_overwrite(buf)  # every slot rewritten in place while the save waits
    gate.set()
    assert pending.wait(60) == (tmp_path / "ck").absolute() and pending.done()
    _assert_same(jb.restore(tmp_path / "ck"), before)
    _assert_same(buf, before, same=False)


def test_async_save_of_a_compressed_buffer_holds_its_host_store_of_the_call(tmp_path, monkeypatch):
    """A non-blocking save of a compressed buffer returns before its host store is exported and written; adds that
    then overwrite the whole ring three times (releasing every arena chunk the saved entries lie in) do not reach
    the checkpoint: it is file for file the blocking save of the same state."""
    step = {"obs": jnp.zeros((16, 16), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    rng, no = np.random.default_rng(0), jnp.zeros((1, 64), bool)

    def batch():
        return {"obs": rng.integers(0, 255, (1, 64, 16, 16), dtype=np.uint8),
                "action": jnp.asarray(rng.integers(0, 6, (1, 64)), jnp.int32), "reward": jnp.ones((1, 64))}

    buf = jb.CompressedTrajectoryBuffer.create(step, num_envs=1, length=64, codec="zstd:1", chunk_bytes=4096).add(batch(), terminated=no)
    jb.save(tmp_path / "blocking", buf)
    chunks = [ch.data for ch in buf.host.stores[0]._arena.chunks.values()]
    gate = _gated_write(monkeypatch)
    pending = jb.save(tmp_path / "ck", buf, blocking=False)
    for _ in range(3):
        buf = buf.add(batch(), terminated=no)
    assert not any(ch.data is c for c in chunks for ch in buf.host.stores[0]._arena.chunks.values()) and len(chunks) > 2
    gate.set()
    pending.wait(60)
    files = sorted(p.relative_to(tmp_path / "ck").as_posix() for p in (tmp_path / "ck").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "blocking").as_posix() for p in (tmp_path / "blocking").rglob("*") if p.is_file())
    for f in files:
        assert (tmp_path / "ck" / f).read_bytes() == (tmp_path / "blocking" / f).read_bytes(), f
    back, key = jb.restore(tmp_path / "ck"), jax.random.key(3)
    _assert_same(back.sample_sequences(key, 8, 4), jb.restore(tmp_path / "blocking").sample_sequences(key, 8, 4))


def test_failed_async_save_raises_on_wait_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    old = _filled_replay()
    jb.save(tmp_path / "ck", old)
    write = ckpt._write

    def fail(root, snapshot, progress):
        write(root, snapshot, progress)
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_write", fail)
    pending = jb.save(tmp_path / "ck", _donate_and_overwrite(_filled_replay()), blocking=False)
    with pytest.raises(OSError, match="disk full"):
        pending.wait(60)
    _assert_same(jb.restore(tmp_path / "ck"), old)
    assert not list(tmp_path.glob(".ck.*"))


def test_async_checkpoint_manager_snapshots_the_buffer_before_save_returns(tmp_path, monkeypatch):
    ocp = pytest.importorskip("orbax.checkpoint")
    buf = _filled_replay(4096)
    before = jax.tree.map(np.array, buf)
    gate = _gated_write(monkeypatch)
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    with ocp.CheckpointManager(tmp_path / "run", options=options) as mngr:
        mngr.save(1, args=ocp.args.Composite(buffer=jb.BufferSave(buf)))
        buf = _donate_and_overwrite(buf)
        gate.set()
        mngr.wait_until_finished()
        out = mngr.restore(1, args=ocp.args.Composite(buffer=jb.BufferRestore()))
    _assert_same(out.buffer, before)


def test_an_archive_is_refused_with_several_processes(monkeypatch):
    """`to_bytes` writes one process's archive: refused before anything is written when JAX runs several processes
    (saves and restores of every buffer there: tests/test_multihost.py)."""
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(NotImplementedError, match=r"to_bytes: jax.process_count\(\) is 2.*to_bytes archives"):
        ckpt.to_bytes({"buffer": jb.ReplayBuffer.create(ITEM, capacity=4)})


def test_store_export_import_keeps_the_dictionary_and_its_training_state():
    """Entries encoded with the zstd dictionary decode after an import, and later puts encode as the original's do."""
    from host_codecs import CompressedStore

    rng = np.random.default_rng(0)
    frames = np.repeat(rng.integers(0, 4, (1, 12, 12), dtype=np.uint8), 64, axis=0) + (rng.random((64, 12, 12)) < 0.05)
    kw = dict(codec="zstd:1", item_shape=(12, 12), dtype=np.uint8, chunk_bytes=4096, min_chunk_bytes=512,
              dictionary_bytes=512, dictionary_samples=16)
    store = CompressedStore(40, **kw)
    for a in range(0, 48, 8):  # the dictionary is built at the 16th entry; slots are overwritten after 40
        store.put(np.arange(a, a + 8) % 40, frames[a : a + 8])
    assert store.dictionary is not None
    meta, arrays = store.export_state()
    copy = CompressedStore(40, **kw)
    copy.import_state(meta, arrays)
    assert copy.dictionary.data == store.dictionary.data
    ids = np.arange(40)
    np.testing.assert_array_equal(copy.get(ids), store.get(ids))
    for s in (store, copy):
        s.put(np.arange(8), frames[48:56])
    np.testing.assert_array_equal(copy.get(ids), store.get(ids))
    assert copy.stats()["payload_nbytes"] == store.stats()["payload_nbytes"]
    with pytest.raises(ValueError, match="empty store"):
        copy.import_state(meta, arrays)
    with pytest.raises(ValueError, match="store config chunk_bytes"):
        CompressedStore(40, **{**kw, "chunk_bytes": 8192}).import_state(meta, arrays)


def test_empty_compressed_buffer_round_trips_and_keyframe_interval_is_checked(tmp_path):
    step = {"obs": jnp.zeros((6, 6), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    empty = jb.CompressedTrajectoryBuffer.create(step, num_envs=2, length=8, codec="zstd:1")
    jb.save(tmp_path / "c", empty)  # no entry stored yet
    back = jb.restore(tmp_path / "c")
    assert back.keyframe_interval == empty.keyframe_interval and int(back.size()) == 0
    other = jb.CompressedTrajectoryBuffer.create(step, num_envs=2, length=8, codec="zstd:1", keyframe_interval=2)
    with pytest.raises(jb.CheckpointError, match="keyframe_interval"):
        jb.restore(tmp_path / "c", other)


def test_a_compressed_checkpoint_written_before_delta_codec_restores(tmp_path):
    """A checkpoint whose buffer.json predates `delta_codec` (its stores coded deltas with the codec) restores with
    the deltas coded by the codec and reads back the same frames; a target of the default delta codec is refused."""
    from jaxbuffers import _checkpoint_files as files

    step = {"obs": jnp.zeros((6, 6), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    make = lambda **kw: jb.CompressedTrajectoryBuffer.create(step, num_envs=2, length=8, codec="zstd:1", **kw)  # noqa: E731
    frames = np.random.default_rng(0).integers(0, 4, (2, 6, 6, 6), dtype=np.uint8).cumsum(1).astype(np.uint8)
    no = jnp.zeros((2, 6), bool)
    buf = make(delta_codec=None).add({"obs": frames, "action": jnp.zeros((2, 6), jnp.int32), "reward": jnp.zeros((2, 6))},
                                     terminated=no, truncated=no, final_obs=frames)
    assert set(buf.host.stores[0].stats()["codecs"]) == {"zstd"}
    jb.save(tmp_path / "c", buf)
    meta = json.loads((tmp_path / "c" / "buffer.json").read_text())
    strip = lambda o: {k: strip(v) for k, v in o.items() if k != "delta_codec"} if isinstance(o, dict) else o  # noqa: E731
    (tmp_path / "c" / "buffer.json").write_text(json.dumps(strip(meta)))
    files._write_manifest(tmp_path / "c", files._Progress(False, ""))
    back = jb.restore(tmp_path / "c")
    assert back.host.stores[0].delta_codec is None
    key = jax.random.key(2)
    for a, b in zip(jax.tree.leaves(back.sample_sequences(key, 4, 3)), jax.tree.leaves(buf.sample_sequences(key, 4, 3))):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(jb.CheckpointError, match="delta_codec"):
        jb.restore(tmp_path / "c", make())


@pytest.mark.parametrize("kind", ["plain", "stacked", "compressed"])
def test_a_prioritised_trajectory_checkpoint_with_its_tree_in_lane_order_restores(tmp_path, kind):
    """A checkpoint written before the prioritised trajectory tree's leaves were ordered `slot * num_envs + lane` (its
    leaves `lane * length + slot`, no `tree_order` in buffer.json) restores, with and without a target, to the buffer
    with the same leaves: every array equal, sums included."""
    from jaxbuffers import _checkpoint_files as files
    from jaxbuffers.sum_tree import SumMinTree

    rng = np.random.default_rng(3)
    compressed = kind == "compressed"
    spec = PIXELS if compressed else STEP
    cls = jb.CompressedPrioritisedTrajectoryBuffer if compressed else jb.PrioritisedTrajectoryBuffer
    buf = cls.create(spec, num_envs=E, length=L, window_length=3, **({"codec": "rle"} if compressed else {}))
    for _ in range(4):
        buf = buf.add(_rand(rng, spec, (E, 2)), terminated=jnp.asarray(rng.random((E, 2)) < 0.3))
    s = buf.sample_sequences(jax.random.key(0), 5)
    buf = buf.set_priorities(s.indices, jnp.asarray(rng.random(5).astype(np.float32)) + 0.5, s.generations)
    inner = buf.buffer if compressed else buf
    flat = jnp.arange(E * L, dtype=jnp.int32)
    lane_order = inner.replace(tree=SumMinTree.create(E * L).set(flat, inner.tree.get((flat % L) * E + flat // L)))
    assert not np.array_equal(lane_order.tree.leaves(), inner.tree.leaves())
    old = buf.replace(buffer=lane_order) if compressed else lane_order
    if kind == "stacked":
        buf, old = (jax.tree.map(lambda x: jnp.stack([x] * 2), b) for b in (buf, old))
    jb.save(tmp_path / "c", old)
    meta = json.loads((tmp_path / "c" / "buffer.json").read_text())
    assert meta.pop("tree_order") == "slot * num_envs + lane"
    (tmp_path / "c" / "buffer.json").write_text(json.dumps(meta))
    files._write_manifest(tmp_path / "c", files._Progress(False, ""))
    for back in (jb.restore(tmp_path / "c"), jb.restore(tmp_path / "c", buf)):
        plain = lambda b: b.replace(host=None) if compressed else b  # noqa: E731 - the host stores: other tests
        for a, b in zip(jax.tree.leaves(plain(back)), jax.tree.leaves(plain(buf)), strict=True):
            np.testing.assert_array_equal(a, b)
        if compressed:
            key = jax.random.key(1)
            for a, b in zip(jax.tree.leaves(back.sample_sequences(key, 4, 3)), jax.tree.leaves(buf.sample_sequences(key, 4, 3))):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["plain", "stacked", "compressed"])
def test_a_trajectory_checkpoint_without_the_lost_final_obs_fields_restores(tmp_path, kind):
    """A checkpoint written before the trajectory buffers kept `final_owner` and `lost_prefix` (`final_obs_capacity`
    below `length`, final observations already lost) restores, with and without a target, with both computed from
    the flags: the same boundary, and the same samples and boundaries after more adds."""
    from jaxbuffers._checkpoint_upgrades import trajectory_in

    rng = np.random.default_rng(5)
    compressed = kind == "compressed"
    spec = PIXELS if compressed else STEP
    cls = jb.CompressedPrioritisedTrajectoryBuffer if compressed else jb.PrioritisedTrajectoryBuffer
    buf = cls.create(spec, num_envs=E, length=L, window_length=2, final_obs_capacity=1, **({"codec": "rle"} if compressed else {}))
    def add(b, r):
        trunc = jnp.asarray(r.random((E, 2)) < 0.4)
        return b.add(_rand(r, spec, (E, 2)), terminated=jnp.zeros((E, 2), bool), truncated=trunc, final_obs=_rand(r, spec["obs"], (E, 2)))

    for _ in range(5):
        buf = add(buf, rng)
    lost = lambda b: _traj(b).lost_prefix  # noqa: E731
    assert np.asarray(lost(buf)).any()
    old = trajectory_in(buf, lambda t: t.replace(final_owner=None, lost_prefix=None))
    if kind == "stacked":
        buf, old = (jax.tree.map(lambda x: jnp.stack([x] * 2), b) for b in (buf, old))
    jb.save(tmp_path / "c", old)
    assert not any(leaf["path"].endswith("lost_prefix") for leaf in json.loads((tmp_path / "c" / "buffer.json").read_text())["leaves"])
    for j, back in enumerate((jb.restore(tmp_path / "c"), jb.restore(tmp_path / "c", buf))):
        plain = lambda b: b.replace(host=None) if compressed else b  # noqa: E731
        for a, b in zip(jax.tree.leaves(plain(back)), jax.tree.leaves(plain(buf)), strict=True):
            np.testing.assert_array_equal(a, b)
        if kind == "stacked" or j == 1:  # `buf` is added to once (a compressed state is used once)
            continue
        mine, theirs = back, buf
        for i in range(4):
            mine, theirs = add(mine, np.random.default_rng(i)), add(theirs, np.random.default_rng(i))
            np.testing.assert_array_equal(lost(mine), lost(theirs))
        key = jax.random.key(1)
        draw = lambda b: jax.tree.leaves(b.sample_transitions(key, 8, n_step=1, gamma=0.9))  # noqa: E731
        for a, b in zip(draw(mine), draw(theirs), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("k", [None, 3])
def test_a_trajectory_checkpoint_without_the_lost_final_obs_fields_restores_uniform_and_full_ring(tmp_path, k):
    """The uniform `TrajectoryBuffer` saved before `final_owner` and `lost_prefix`, with the final-obs ring as long as
    the lanes (nothing can be lost: an empty owner table) or shorter: restored with and without a target, it has the
    tracked boundary, moves it as the tracked state does, and samples the same."""
    from jaxbuffers._checkpoint_upgrades import trajectory_in

    rng = np.random.default_rng(8)
    buf = jb.TrajectoryBuffer.create(STEP, num_envs=E, length=L, final_obs_capacity=k)
    add = lambda b, r: b.add(_rand(r, STEP, (E, 3)), terminated=jnp.asarray(r.random((E, 3)) < 0.1),  # noqa: E731
                             truncated=jnp.asarray(r.random((E, 3)) < 0.6), final_obs=_rand(r, STEP["obs"], (E, 3)))
    for _ in range(4):
        buf = add(buf, rng)
    jb.save(tmp_path / "c", trajectory_in(buf, lambda t: t.replace(final_owner=None, lost_prefix=None)))
    target = jb.TrajectoryBuffer.create(STEP, num_envs=E, length=L, final_obs_capacity=k)
    for back in (jb.restore(tmp_path / "c"), jb.restore(tmp_path / "c", target)):
        assert back.final_owner.shape == buf.final_owner.shape == (E, 0 if k is None else k)
        np.testing.assert_array_equal(back.lost_prefix, buf.lost_prefix)
        for i in range(3):
            back, buf2 = add(back, np.random.default_rng(i)), add(buf if i == 0 else buf2, np.random.default_rng(i))
            np.testing.assert_array_equal(back.lost_prefix, buf2.lost_prefix)
        key = jax.random.key(2)
        for a, b in zip(jax.tree.leaves(back.sample_transitions(key, 16, n_step=1, gamma=0.9)),
                        jax.tree.leaves(buf2.sample_transitions(key, 16, n_step=1, gamma=0.9)), strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_checkpoint_holding_an_overwritten_final_owner_restores_the_boundary_the_adds_keep(tmp_path):
    """An earlier development layout kept the owner of a final observation after its step was overwritten (this
    version keeps -1 there): restored, the owners and the lost boundary are rebuilt from the flags, so the next
    truncated add moves the boundary as in a buffer filled by this version, and the same windows can be drawn."""
    step = {"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0)}
    one = lambda b, trunc: b.add({"obs": jnp.ones((1, 2)), "action": jnp.zeros(1, jnp.int32), "reward": jnp.ones(1)},  # noqa: E731
                                 terminated=jnp.zeros(1, bool), truncated=jnp.array([trunc]), final_obs=jnp.full((1, 2), 7.0))
    buf = jb.TrajectoryBuffer.create(step, num_envs=1, length=4, final_obs_capacity=1)
    for trunc in (True, False, False, False, False):  # the truncated step 0 is overwritten by the fifth add
        buf = one(buf, trunc)
    assert buf.final_owner.tolist() == [[-1]]
    jb.save(tmp_path / "c", buf.replace(final_owner=jnp.zeros((1, 1), jnp.int32)))  # the stale owner of slot 0
    for back in (jb.restore(tmp_path / "c"), jb.restore(tmp_path / "c", jb.TrajectoryBuffer.create(step, num_envs=1, length=4,
                                                                                                 final_obs_capacity=1))):
        assert back.final_owner.tolist() == [[-1]]
        back, fresh = one(back, True), one(buf, True)
        np.testing.assert_array_equal(back.lost_prefix, fresh.lost_prefix)
        assert bool(back.can_sample_transitions(1)) == bool(fresh.can_sample_transitions(1)) is True


@pytest.mark.parametrize("stacked", [False, True])
def test_an_older_prioritised_trajectory_checkpoint_restores_with_its_lost_windows_at_priority_0(tmp_path, stacked):
    """Before `lost_prefix`, the adds gave every whole window a priority, those before a lane's newest lost final
    observation too: such a checkpoint restores with those leaves 0 (never drawn, not revived by `set_priorities`) and
    the tree's total the drawable mass."""
    from jaxbuffers._checkpoint_upgrades import trajectory_in

    rng = np.random.default_rng(6)
    buf = jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=2, final_obs_capacity=1)
    for _ in range(4):
        buf = buf.add(_rand(rng, STEP, (E, 2)), terminated=jnp.zeros((E, 2), bool), truncated=jnp.asarray(rng.random((E, 2)) < 0.5),
                      final_obs=_rand(rng, STEP["obs"], (E, 2)))
    every = jnp.arange(E * L, dtype=jnp.int32)
    whole = np.asarray(buf.buffer.replace(lost_prefix=jnp.zeros_like(buf.buffer.lost_prefix)).valid_starts(every, 2))
    assert (whole & ~np.asarray(buf.valid_starts(every))).any()  # windows an earlier version gave a priority, now lost
    fresh = float(buf.priorities(every).max())
    older = buf.replace(tree=buf.tree.set(buf._leaf(every), jnp.where(whole, fresh, 0).astype(jnp.float32)))
    older = trajectory_in(older, lambda t: t.replace(final_owner=None, lost_prefix=None))
    if stacked:
        buf, older = (jax.tree.map(lambda x: jnp.stack([x] * 2), b) for b in (buf, older))
    jb.save(tmp_path / "c", older)
    for back in (jb.restore(tmp_path / "c"), jb.restore(tmp_path / "c", buf)):
        for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(buf), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def _traj(b):
    while not isinstance(b, jb.TrajectoryBuffer):
        b = b.buffer
    return b


def test_an_unknown_tree_order_is_refused_not_read_as_the_lane_order(tmp_path):
    from jaxbuffers import _checkpoint_files as files

    buf = jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=2)
    jb.save(tmp_path / "c", buf)
    meta = json.loads((tmp_path / "c" / "buffer.json").read_text())
    (tmp_path / "c" / "buffer.json").write_text(json.dumps({**meta, "tree_order": "lane * length + slot"}))
    files._write_manifest(tmp_path / "c", files._Progress(False, ""))
    for target in (None, buf):
        with pytest.raises(jb.CheckpointError, match=re.escape("tree_order 'lane * length + slot' is not a leaf order")):
            jb.restore(tmp_path / "c", target)


def test_a_keyframe_interval_1_checkpoint_that_recorded_a_delta_codec_restores(tmp_path):
    """A `keyframe_interval=1` checkpoint whose config and stores recorded the default delta codec (builds before
    `K = 1` dropped the unused codec) restores, with and without a target, to the saved frames."""
    from jaxbuffers import _checkpoint_files as files

    step = {"obs": jnp.zeros((6, 6), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    make = lambda: jb.CompressedTrajectoryBuffer.create(step, num_envs=2, length=8, codec="zstd:1", keyframe_interval=1)  # noqa: E731
    frames = np.random.default_rng(1).integers(0, 256, (2, 6, 6, 6), dtype=np.uint8)
    no = jnp.zeros((2, 6), bool)
    buf = make().add({"obs": frames, "action": jnp.zeros((2, 6), jnp.int32), "reward": jnp.zeros((2, 6))},
                     terminated=no, truncated=no, final_obs=frames)
    assert buf.host.stores[0].delta_codec is None
    jb.save(tmp_path / "c", buf)
    meta = json.loads((tmp_path / "c" / "buffer.json").read_text())
    meta["config"]["delta_codec"] = "rle:8"
    for store in meta["host"]["stores"]:
        store["config"]["delta_codec"] = "rle:8"
    (tmp_path / "c" / "buffer.json").write_text(json.dumps(meta))
    files._write_manifest(tmp_path / "c", files._Progress(False, ""))
    key = jax.random.key(2)
    for back in (jb.restore(tmp_path / "c"), jb.restore(tmp_path / "c", make())):
        assert back.host.stores[0].delta_codec is None
        for a, b in zip(jax.tree.leaves(back.sample_sequences(key, 4, 3)), jax.tree.leaves(buf.sample_sequences(key, 4, 3))):
            np.testing.assert_array_equal(a, b)


def _sharded(mesh):
    make = lambda: jb.ReplayBuffer.create(ITEM, capacity=8, metrics=True)  # noqa: E731
    return make, jb.ShardedBuffer.create(make, mesh, "data")


def test_sharded_buffer_saved_as_its_shards(tmp_path):
    mesh = jax.make_mesh((jax.device_count(),), ("data",))  # one shard per device: 4 in the run on forced devices
    make, buf = _sharded(mesh)
    s = buf.num_shards
    buf = buf.add(_rand(np.random.default_rng(0), ITEM, (5 * s,)))
    path = jb.save(tmp_path / "sharded", buf, progress=False)
    meta = json.loads((path / "buffer.json").read_text())
    assert (meta["class"], meta["stack_shape"], meta["sharded"]) == ("ReplayBuffer", [s], {"axis": "data", "num_shards": s})
    stacked = jb.restore(path)  # without a mesh to go to: the shards, stacked
    assert type(stacked) is jb.ReplayBuffer and stacked.head.shape == (s,)
    for a, b in zip(jax.tree.leaves(stacked), jax.tree.leaves(buf.shards)):
        np.testing.assert_array_equal(a, b)
    got = jb.restore(path, jb.ShardedBuffer.create(make, mesh, "data"))  # a new empty one: only its mesh is used
    assert type(got) is jb.ShardedBuffer and (got.mesh, got.axis) == (buf.mesh, buf.axis)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(buf)):
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
        np.testing.assert_array_equal(a, b)
    key, more = jax.random.key(1), _rand(np.random.default_rng(1), ITEM, (2 * s,))
    for a, b in zip(jax.tree.leaves(got.add(more).sample(key, 6)), jax.tree.leaves(buf.add(more).sample(key, 6))):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ckpt.CheckpointError, match="stack shape"):
        jb.restore(path, make())
    with pytest.raises(TypeError, match="ShardedBuffer"):
        jb.save(tmp_path / "x", {"not": "a buffer"})


@pytest.mark.slow  # a subprocess on 4 forced host devices: the sharded checkpoint and CLI tests with 4 shards
@pytest.mark.fewer_devices(4)
def test_sharded_buffer_on_forced_devices():
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4"}
    here = Path(__file__).parent
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-k", "sharded and not forced",
                           str(here / "test_checkpoint.py"), str(here / "test_cli.py")], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "4 passed" in proc.stdout.strip().splitlines()[-1], proc.stdout[-2000:]


# --- compressed rollouts of the layout before the empty slot ---

def _roll_step(rng, n):
    return (_rand(rng, ROLL, (n,)), dict(reward=jnp.asarray(rng.standard_normal(n), jnp.float32), value=jnp.zeros(n),
                                          terminated=jnp.asarray(rng.random(n) < 0.3)))


@pytest.mark.parametrize("kw, reset", [(dict(codec="zstd:1"), False), pytest.param(dict(codec="rle", frame_stack=2), True, marks=pytest.mark.slow)])
def test_rollout_checkpoint_of_the_layout_before_the_empty_slot_restores_into_this_one(kw, reset, tmp_path):
    make = lambda: jb.CompressedRolloutBuffer.create(ROLL, num_envs=E, num_steps=3, **kw)  # noqa: E731
    rng, old = np.random.default_rng(3), before_empty_slot(make())
    for _ in range(4 if reset else 2):  # 2 of 3 rows; or a whole rollout, a reset, 1 row (the others keep their slots)
        if old.buffer.is_full():
            old = old.compute_gae(jnp.ones(E), 0.9, 0.8).reset()
        step, fields = _roll_step(rng, E)
        old = old.add(step, **fields)
    old = old.compute_gae(jnp.ones(E), 0.9, 0.8)
    path = jb.save(tmp_path / "old", old, progress=False)
    saved = json.loads((path / "buffer.json").read_text())["host"]["stores"]
    assert [s["config"]["num_slots"] for s in saved] == [old.host.num_slots]
    for got in (jb.restore(path), jb.restore(path, make())):
        assert got.host.num_slots == old.host.num_slots + 1
        ids, was = np.asarray(got.buffer.step["obs"]), np.asarray(old.buffer.step["obs"])
        filled = int(old.buffer.step_index)
        np.testing.assert_array_equal(ids[:filled], was[:filled])
        np.testing.assert_array_equal(ids[filled:], was[filled:] if reset else -1)
        for f in ("advantages", "returns", "step_index", "has_advantages"):
            np.testing.assert_array_equal(getattr(got.buffer, f), getattr(old.buffer, f))
        key = jax.random.key(5)
        want = old.minibatches(key, 2)
        _assert_same(got.minibatches(key, 2), want if reset else unwritten_zeroed(want, old))
    step, fields = _roll_step(rng, E)  # adding continues from the same head, the old slots written in place
    got, old = got.add(step, **fields), old.add(step, **fields)
    assert got.host.num_slots == old.host.num_slots + 1 and int(got.buffer.step_index) == int(old.buffer.step_index)
    want = old.gather(jnp.arange(3 * E))
    _assert_same(got.gather(jnp.arange(3 * E)), want if reset else unwritten_zeroed(want, old))


def test_rollout_checkpoint_of_another_slot_count_is_refused_naming_num_slots(tmp_path):
    buf = jb.CompressedRolloutBuffer.create(ROLL, num_envs=E, num_steps=3, codec="zstd:1")
    h = buf.host
    fewer = buf.replace(host=HostStores(h.num_slots - 2, h.codec, [i.frame_shape for i in buf.leaves], [i.dtype for i in buf.leaves], h.names))
    step, fields = _roll_step(np.random.default_rng(0), E)
    path = jb.save(tmp_path / "fewer", fewer.add(step, **fields), progress=False)
    with pytest.raises(jb.CheckpointError, match="num_slots"):
        jb.restore(path)
    traj = jb.CompressedTrajectoryBuffer.create(PIXELS, num_envs=E, length=L, codec="zstd:1")  # no upgrade for other classes
    h = traj.host
    one_fewer = traj.replace(host=HostStores(h.num_slots - 1, h.codec, [i.frame_shape for i in traj.leaves], [i.dtype for i in traj.leaves], h.names))
    path = jb.save(tmp_path / "traj", one_fewer, progress=False)
    with pytest.raises(jb.CheckpointError, match="num_slots"):
        jb.restore(path)


def test_sharded_rollout_checkpoint_of_the_layout_before_the_empty_slot_restores_into_this_one(tmp_path):
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    make = lambda: jb.CompressedRolloutBuffer.create(ROLL, num_envs=E, num_steps=3, codec="zstd:1")  # noqa: E731
    new = jb.ShardedBuffer.create(make, mesh, "data")
    s, rng = new.num_shards, np.random.default_rng(4)
    old = new.replace(shards=before_empty_slot(new.shards))
    step, fields = _roll_step(rng, E * s)
    old = old.add(step, **fields)
    path = jb.save(tmp_path / "old", old, progress=False)
    got = jb.restore(path, jb.ShardedBuffer.create(make, mesh, "data"))
    assert got.shards.host.num_slots == old.shards.host.num_slots + 1
    ids = np.asarray(got.shards.buffer.step["obs"])  # [S, T, N]
    np.testing.assert_array_equal(ids[:, :1], np.asarray(old.shards.buffer.step["obs"])[:, :1])
    np.testing.assert_array_equal(ids[:, 1:], -1)
    for _ in range(2):  # adding continues from the same head: the rollout fills, its epoch is the old one's
        step, fields = _roll_step(rng, E * s)
        got, old = got.add(step, **fields), old.add(step, **fields)
    jax.block_until_ready((got, old))  # the stores' writes run in the adds' programs, dispatched asynchronously
    for g, o in zip(got.shards.host.shards, old.shards.host.shards):
        assert g.version == o.version
    key, gae = jax.random.key(2), lambda b, v: b.compute_gae(v, 0.9, 0.8)
    got, old = got.apply(gae, jnp.ones(E * s)), old.apply(gae, jnp.ones(E * s))
    _assert_same(got.minibatches(key, 2), old.minibatches(key, 2))


def test_non_blocking_save_at_interpreter_exit_is_finished_and_a_failed_one_exits_non_zero(tmp_path):
    child = textwrap.dedent("""
        import sys, jax.numpy as jnp, jaxbuffers as jb
        from jaxbuffers import checkpoint
        buf = jb.ReplayBuffer.create({"x": jnp.zeros(100)}, capacity=1000).add({"x": jnp.ones((7, 100))})
        jb.save(sys.argv[1] + "/kept", buf)
        jb.save(sys.argv[1] + "/kept", buf.add({"x": jnp.ones((2, 100))}), blocking=False)  # the script ends here
        write = checkpoint._write
        def broken(root, snapshot, progress):  # the folder of "lost" only (the save of "kept" may not have written yet)
            if ".lost." in root.name:
                raise OSError("no space left on device")
            return write(root, snapshot, progress)
        checkpoint._write = broken
        jb.save(sys.argv[1] + "/lost", buf, blocking=False)  # fails in the background; nobody waits for it
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(jb.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", child, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"save to {tmp_path / 'lost'} failed before the interpreter exited" in proc.stderr
    assert "OSError: no space left on device" in proc.stderr and "cannot schedule new futures" not in proc.stderr
    assert int(jb.restore(tmp_path / "kept").size()) == 9  # the save pending at exit, not the one before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # no temporary folder left


def test_restore_refuses_a_sharding_that_cannot_hold_an_array_naming_it_before_reading(tmp_path, monkeypatch):
    from jax.sharding import NamedSharding, PartitionSpec as P

    buf = jb.ReplayBuffer.create({"x": jnp.zeros(3)}, capacity=8).add({"x": jnp.ones((2, 3))})
    jb.save(tmp_path / "c", buf)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
    reads = []
    monkeypatch.setattr(ckpt, "_read_arrays", lambda *a, **k: reads.append(a))
    with pytest.raises(ValueError, match=r"^sharding: NamedSharding\(.*\) cannot hold array \.head of shape \(\)"):
        jb.restore(tmp_path / "c", sharding=NamedSharding(mesh, P("d")))
    assert not reads  # refused before any array was read
    monkeypatch.undo()
    # A tree of shardings: the capacity axis split, the scalars replicated.
    shardings = jax.tree.map(lambda x: NamedSharding(mesh, P("d") if np.size(x) > 1 else P()), buf)
    out = jb.restore(tmp_path / "c", sharding=shardings)
    assert out.storage["x"].sharding == NamedSharding(mesh, P("d")) and int(out.size()) == 2


def test_a_checkpoint_with_the_earlier_metrics_arrays_is_refused_saying_so(tmp_path):
    """The usage metrics became one `totals` array before their first release: a checkpoint that lists the earlier
    arrays (here `.metrics.sampled` in place of `.metrics.totals`) is refused with a message that says to save again."""
    root = tmp_path / "ck"
    jb.save(root, _filled_replay())
    meta = json.loads((root / "buffer.json").read_text())
    leaf = next(d for d in meta["leaves"] if d["path"].endswith(".metrics.totals"))
    leaf["path"], leaf["shape"] = leaf["path"].replace(".totals", ".sampled"), [2]
    (root / "buffer.json").write_text(json.dumps(meta))
    m = json.loads((root / "manifest.json").read_text())
    m["files"]["buffer.json"] = {"bytes": (root / "buffer.json").stat().st_size,
                                 "xxh3_64": ckpt._hash_file(root / "buffer.json", ckpt._Progress(False, ""))}
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(jb.CheckpointError, match=r"\.metrics\.sampled.*earlier layout are not read, save the buffer again"):
        jb.restore(root)


def test_a_large_file_is_synced_while_written_and_hashed_as_written(tmp_path, monkeypatch):
    """A file over `_WRITEBACK` bytes: its written blocks are handed to the disk during the write (a sync started once
    a span is written), it is hashed by a second thread, and the manifest's checksum is that of the file on disk."""
    from jaxbuffers import _checkpoint_files as files

    monkeypatch.setattr(files, "_WRITE_BLOCK", 4096)
    monkeypatch.setattr(files, "_WRITEBACK", 16384)
    sizes, datasync = [], files._datasync

    def counted(fd):
        sizes.append(os.fstat(fd).st_size)
        return datasync(fd)

    monkeypatch.setattr(files, "_datasync", counted)
    buf = _filled_replay(4096)
    root = jb.save(tmp_path / "ck", buf)
    listed = json.loads((root / "manifest.json").read_text())["files"]
    large = {rel: info for rel, info in listed.items() if info["bytes"] > files._WRITEBACK}
    assert large and sizes and min(sizes) >= files._WRITEBACK
    for rel, info in large.items():
        assert info["xxh3_64"] == files._hash_file(root / rel, files._Progress(False, "")), rel
    _assert_same(jb.restore(root), buf)

