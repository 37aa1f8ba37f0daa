"""Tests of jaxbuffers.compressed: exact agreement with the uncompressed buffers, frame-stack
dedup (synthetic and real Atari stacks), exactly-once ordered writes, stale-state detection."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import host_codecs
from jaxbuffers.compressed import (
    DEFAULT_CODEC,
    DEFAULT_DICTIONARY_BYTES,
    CompressedPrioritisedTrajectoryBuffer,
    CompressedRolloutBuffer,
    CompressedTrajectoryBuffer,
    StaleBufferError,
)
from frame_stacks import stacked_chunk
from jaxbuffers.compressed import _common
from jaxbuffers.episode import BufferFullError
from jaxbuffers.rollout import RolloutBuffer
from jaxbuffers.prioritised_trajectory import PrioritisedTrajectoryBuffer
from jaxbuffers.trajectory import TrajectoryBuffer

# Shrinking replays the slow jitted model many times; failures print their inputs anyway.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
H, W = 3, 5  # small frames: the logic does not depend on the size


# ------------------------------------------------------------------------------------------------
# A plain numpy frame stacker with Gymnasium FrameStackObservation semantics (the reference).


class Stacker:
    """Per-env stacks of the last k frames; padding 'reset' repeats the first frame, 'zero' zeros."""

    def __init__(self, rng, num_envs, k, padding, stack_axis, dtype=np.uint8):
        self.rng, self.e, self.k, self.padding, self.axis, self.dtype = rng, num_envs, k, padding, stack_axis, dtype
        self.stack = np.zeros((num_envs, k, H, W), dtype)
        for e in range(num_envs):
            self._reset(e)

    def frame(self):
        return self.rng.integers(0, 256, (H, W)).astype(self.dtype)

    def _reset(self, e):
        f = self.frame()
        self.stack[e] = f if self.padding == "reset" else 0
        self.stack[e, -1] = f

    def view(self, stacks):  # [E, k, H, W] -> the stored layout
        return np.moveaxis(stacks, 1, 1 + self.axis % 3) if self.axis not in (0,) else stacks

    def step(self, p_term, p_trunc):
        """One env step: returns (obs, terminated, truncated, final_obs) and advances."""
        obs = self.stack.copy()
        nxt = np.concatenate([self.stack[:, 1:], np.stack([self.frame() for _ in range(self.e)])[:, None]], axis=1)
        term = self.rng.random(self.e) < p_term
        trunc = self.rng.random(self.e) < p_trunc
        self.stack = nxt.copy()
        for e in np.flatnonzero(term | trunc):
            self._reset(e)
        return self.view(obs), term, trunc, self.view(nxt)


def make_step(obs, e, t, dict_obs, rng):
    lead = (e,) if t is None else (e, t)
    o = {"pixels": jnp.asarray(obs), "vec": jnp.asarray(rng.normal(size=lead + (2,)).astype(np.float32))} if dict_obs else jnp.asarray(obs)
    return {
        "obs": o,
        "action": jnp.asarray(rng.integers(0, 4, lead).astype(np.int32)),
        "reward": jnp.asarray(rng.normal(size=lead).astype(np.float32)),
    }


def final_tree(nxt, dict_obs, rng, lead):
    if dict_obs:
        return {"pixels": jnp.asarray(nxt), "vec": jnp.asarray(rng.normal(size=lead + (2,)).astype(np.float32))}
    return jnp.asarray(nxt)


def assert_tree_equal(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, x.dtype, y.shape, y.dtype)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def example(k, stack_axis, dict_obs, dtype=np.uint8):
    shape = [H, W]
    if k is not None:
        shape.insert(stack_axis % 3, k)
    pix = jnp.zeros(tuple(shape), dtype)
    obs = {"pixels": pix, "vec": jnp.zeros(2, jnp.float32)} if dict_obs else pix
    return {"obs": obs, "action": jnp.int32(0), "reward": jnp.float32(0)}


# ------------------------------------------------------------------------------------------------
# Model-based: compressed == uncompressed for the same adds and keys.


def _matches_strategy(f):
    return given(
    seed=st.integers(0, 2**31 - 1),
    num_envs=st.integers(1, 3),
    length=st.integers(3, 9),
    k=st.sampled_from([None, 1, 2, 4]),
    stack_axis=st.sampled_from([0, -1]),
    padding=st.sampled_from(["reset", "zero"]),
    dict_obs=st.booleans(),
    codec=st.sampled_from(["rle", "igzip:1", "zstd:3", "none"]),
    chunks=st.lists(st.integers(1, 4), min_size=1, max_size=10),
    use_jit=st.booleans(),
    p_end=st.sampled_from([0.0, 0.15, 0.4]),
    keyframe_interval=st.sampled_from([1, 2, 3, 8]),
)(f)


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=NO_SHRINK)
@_matches_strategy
def test_matches_trajectory_buffer(**kw):
    _check_matches(**kw)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=NO_SHRINK)
@_matches_strategy
def test_matches_trajectory_buffer_many(**kw):
    _check_matches(**kw)


def _check_matches(seed, num_envs, length, k, stack_axis, padding, dict_obs, codec, chunks, use_jit, p_end, keyframe_interval):
    rng = np.random.default_rng(seed)
    kk = 1 if k is None else k
    stacker = Stacker(rng, num_envs, kk, padding, stack_axis if k else 0)
    ex = example(k, stack_axis, dict_obs)
    comp = CompressedTrajectoryBuffer.create(
        ex, num_envs=num_envs, length=length, compress=("pixels",) if dict_obs else None, frame_stack=k,
        stack_axis=stack_axis, padding=padding, codec=codec, keyframe_interval=keyframe_interval,
    )
    ref = TrajectoryBuffer.create(ex, num_envs=num_envs, length=length)
    cadd = jax.jit(CompressedTrajectoryBuffer.add, donate_argnums=0) if use_jit else CompressedTrajectoryBuffer.add
    radd = TrajectoryBuffer.add
    for t in chunks * 2:  # enough steps to wrap around for most lengths
        t = min(t, length)
        steps = [stacker.step(p_end, p_end) for _ in range(t)]
        obs = np.stack([s[0] for s in steps], 1)
        term = np.stack([s[1] for s in steps], 1)
        trunc = np.stack([s[2] for s in steps], 1)
        nxt = np.stack([s[3] for s in steps], 1)
        if k is None:
            obs, nxt = obs[:, :, 0], nxt[:, :, 0]  # the whole obs is [H, W] here
        single = t == 1 and rng.random() < 0.5
        if single:
            obs, term, trunc, nxt = obs[:, 0], term[:, 0], trunc[:, 0], nxt[:, 0]
        lead = (num_envs,) if single else (num_envs, t)
        step = make_step(obs, num_envs, None if single else t, dict_obs, rng)
        fin = final_tree(nxt, dict_obs, rng, lead)
        kw = dict(terminated=jnp.asarray(term), truncated=jnp.asarray(trunc), final_obs=fin)
        comp = cadd(comp, step, **kw)
        ref = radd(ref, step, **kw)
        # every stored observation decodes exactly (the oldest ones' chains included)
        assert_tree_equal(comp.decode_obs(comp.trajectory.storage["obs"]), ref.storage["obs"])
    assert comp.host.num_writes == 2 * len(chunks)
    for i, n in enumerate(range(1, length)):
        if n > 3:
            break
        key = jax.random.key(seed + i)
        if bool(ref.can_sample_transitions(16, n_step=n)):
            assert_tree_equal(
                comp.sample_transitions(key, 16, n_step=n, gamma=0.9),
                ref.sample_transitions(key, 16, n_step=n, gamma=0.9),
            )
    L = min(3, length)
    seq = comp.sample_sequences(jax.random.key(seed), 8, L)
    assert_tree_equal(seq, ref.sample_sequences(jax.random.key(seed), 8, L))
    # the final observations of the sequences' truncated steps (zeros elsewhere), decoded
    final = jax.jit(lambda b, i: b.final_obs_at(i, L))(comp, seq.indices) if use_jit else comp.final_obs_at(seq.indices, L)
    assert_tree_equal(final, ref.final_obs_at(seq.indices, L))


def test_jitted_sampling_matches_and_compiles_once(compile_counter):
    rng = np.random.default_rng(1)
    stacker = Stacker(rng, 2, 4, "reset", 0)
    ex = example(4, 0, False)
    comp = CompressedTrajectoryBuffer.create(ex, num_envs=2, length=8, frame_stack=4, codec="rle")
    ref = TrajectoryBuffer.create(ex, num_envs=2, length=8)
    add = jax.jit(lambda b, s, kw: b.add(s, **kw), donate_argnums=0)
    sample = jax.jit(lambda b, key: b.sample_transitions(key, 8, n_step=2, gamma=0.99))
    inputs = []
    for i in range(12):
        obs, term, trunc, nxt = stacker.step(0.2, 0.2)
        step = make_step(obs, 2, None, False, rng)
        inputs.append((step, dict(terminated=jnp.asarray(term), truncated=jnp.asarray(trunc), final_obs=jnp.asarray(nxt))))
    keys = [jax.random.key(i) for i in range(12)]
    got = []
    with compile_counter() as n:
        for i, (step, kw) in enumerate(inputs):
            comp = add(comp, step, kw)
            if i >= 3:
                got.append(sample(comp, keys[i]))
        jax.block_until_ready(got)
        compiles = n()
    assert compiles == 2  # add once, sample once, for every later state of the buffer
    for i, (step, kw) in enumerate(inputs):
        ref = ref.add(step, **kw)
        if i >= 3:
            assert_tree_equal(got[i - 3], ref.sample_transitions(keys[i], 8, n_step=2, gamma=0.99))


def test_eager_add_compiles_once_however_its_keywords_are_spelt(compile_counter):
    """An eager add runs one cached program: leaving out the optional flags or passing them as None is one call."""
    ex = example(4, 0, False)
    comp = CompressedTrajectoryBuffer.create(ex, num_envs=2, length=8, frame_stack=4, codec="rle")
    step = make_step(np.zeros((2, 4, H, W), np.uint8), 2, None, False, np.random.default_rng(0))
    term = jnp.zeros(2, bool)
    comp = comp.add(step, terminated=term)  # compiles the add
    with compile_counter() as n:
        comp = comp.add(step, terminated=term, truncated=None)
        comp = comp.add(step, terminated=term, truncated=None, final_obs=None)
        comp = comp.add(step=step, terminated=term)
        jax.block_until_ready(comp)
        assert n() == 0


def test_normalize_images_matches_reference_over_255():
    rng = np.random.default_rng(2)
    stacker = Stacker(rng, 2, 3, "reset", -1)
    ex = example(3, -1, True)
    comp = CompressedTrajectoryBuffer.create(ex, num_envs=2, length=6, compress=("pixels",), frame_stack=3, stack_axis=-1, normalize_images=True, codec="igzip:1")
    ref = TrajectoryBuffer.create(ex, num_envs=2, length=6)
    for _ in range(9):
        obs, term, trunc, nxt = stacker.step(0.3, 0.0)
        step = make_step(obs, 2, None, True, rng)
        comp = comp.add(step, terminated=jnp.asarray(term))
        ref = ref.add(step, terminated=jnp.asarray(term))
    a = comp.sample_transitions(jax.random.key(0), 16, gamma=0.5)
    b = ref.sample_transitions(jax.random.key(0), 16, gamma=0.5)
    assert a.obs["pixels"].dtype == jnp.float32 and a.obs["pixels"].shape == (16, H, W, 3)
    np.testing.assert_array_equal(np.asarray(a.obs["pixels"]), np.asarray(b.obs["pixels"]).astype(np.float32) * np.float32(1 / 255))
    np.testing.assert_array_equal(np.asarray(a.next_obs["pixels"]), np.asarray(b.next_obs["pixels"]).astype(np.float32) * np.float32(1 / 255))
    assert float(a.obs["pixels"].max()) <= 1.0 and float(a.obs["pixels"].min()) >= 0.0
    np.testing.assert_allclose(np.asarray(a.obs["pixels"]), np.asarray(b.obs["pixels"]) / 255.0, rtol=2e-7)
    np.testing.assert_array_equal(np.asarray(a.obs["vec"]), np.asarray(b.obs["vec"]))  # device leaf untouched


def test_frame_dedup_stores_one_frame_per_step():
    rng = np.random.default_rng(3)
    stacker = Stacker(rng, 2, 4, "reset", 0)
    comp = CompressedTrajectoryBuffer.create(example(4, 0, False), num_envs=2, length=10, frame_stack=4, codec="none")
    for _ in range(5):
        obs, term, trunc, nxt = stacker.step(0.0, 0.0)
        comp = comp.add(make_step(obs, 2, None, False, rng), terminated=jnp.asarray(term))
    store = comp.host.stores[0]
    assert store.num_entries == 10 and store.raw_nbytes == 10 * H * W  # frames, not 4-frame stacks


def test_stack_never_mixes_episodes():
    """Hand-made case: frames are step numbers; an end (terminated or truncated) restarts padding."""
    k = 3
    ex = {"obs": jnp.zeros((k, 1, 1), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    for padding in ("reset", "zero"):
        comp = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=8, frame_stack=k, padding=padding, codec="rle")
        term = np.array([0, 0, 0, 1, 0, 0, 0, 0], bool)  # step 3 terminates
        trunc = np.array([0, 1, 0, 0, 0, 0, 0, 0], bool)  # step 1 truncated (time limit)
        p = lambda a, b, c: [a, b, c]  # noqa: E731
        z = 0  # the newest frame of step t is t + 1
        if padding == "reset":
            want = [p(1, 1, 1), p(1, 1, 2), p(3, 3, 3), p(3, 3, 4), p(5, 5, 5), p(5, 5, 6), p(5, 6, 7), p(6, 7, 8)]
        else:
            want = [p(z, z, 1), p(z, 1, 2), p(z, z, 3), p(z, 3, 4), p(z, z, 5), p(z, 5, 6), p(5, 6, 7), p(6, 7, 8)]
        obs = np.array(want, np.uint8)[None, :, :, None, None]  # the stacks a frame stacker gives
        step = {"obs": jnp.asarray(obs), "action": jnp.zeros((1, 8), jnp.int32), "reward": jnp.zeros((1, 8), jnp.float32)}
        fin = np.concatenate([obs[:, :, 1:], np.full((1, 8, 1, 1, 1), 99, np.uint8)], axis=2)  # each stack, then frame 99
        comp = comp.add(step, terminated=jnp.asarray(term[None]), truncated=jnp.asarray(trunc[None]), final_obs=jnp.asarray(fin))
        got = np.asarray(comp.decode_obs(comp.trajectory.storage["obs"]))[0, :, :, 0, 0]
        np.testing.assert_array_equal(got, np.array(want))
        # The truncated step 1 keeps its true final frame, stacked on its own episode's frames.
        tr = comp.trajectory
        fin_ids = tr.final_obs[0, 0]  # the lane's first truncation took final-ring slot 0
        final = np.asarray(comp.decode_obs(fin_ids))[:, 0, 0]
        np.testing.assert_array_equal(final, [1, 2, 99])


# ------------------------------------------------------------------------------------------------
# Exactly-once, ordered writes.


def _simple(num_envs=2, length=16, k=4):
    ex = example(k, 0, False)
    return CompressedTrajectoryBuffer.create(ex, num_envs=num_envs, length=length, frame_stack=k, codec="rle")


def _steps(n, num_envs=2, k=4, seed=0):
    rng = np.random.default_rng(seed)
    stacker = Stacker(rng, num_envs, k, "reset", 0)
    out = [stacker.step(0.1, 0.0) for _ in range(n)]
    obs = jnp.asarray(np.stack([o[0] for o in out]))  # [n, E, k, H, W]
    term = jnp.asarray(np.stack([o[1] for o in out]))
    return obs, term


def test_writes_once_under_jit_scan_and_donation():
    n = 7
    obs, term = _steps(2 * n)
    buf = _simple()

    def run_(buf, obs, term):
        def body(b, x):
            o, d = x
            step = {"obs": o, "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}
            return b.add(step, terminated=d), None
        return jax.lax.scan(body, buf, (obs, term))[0]

    buf = jax.jit(run_)(buf, obs[:n], term[:n])
    jax.block_until_ready(buf)
    assert buf.host.num_writes == n and buf.host.num_rows == 2 * n and int(buf.version) == n
    buf = jax.jit(run_, donate_argnums=0)(buf, obs[n:], term[n:])
    jax.block_until_ready(buf)
    assert buf.host.num_writes == 2 * n and buf.host.num_rows == 4 * n and int(buf.version) == 2 * n
    # The data are right too (14 steps in a 16-step lane: no wrap yet).
    ref = TrajectoryBuffer.create(example(4, 0, False), num_envs=2, length=16)
    for i in range(2 * n):
        ref = ref.add({"obs": obs[i], "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}, terminated=term[i])
    assert_tree_equal(buf.sample_sequences(jax.random.key(0), 4, 5), ref.sample_sequences(jax.random.key(0), 4, 5))


def test_decode_of_an_inner_sample_reads_only_the_rows_asked_for():
    obs, term = _steps(6)
    chunk = {"obs": jnp.swapaxes(obs, 0, 1), "action": jnp.zeros((2, 6), jnp.int32), "reward": jnp.zeros((2, 6), jnp.float32)}
    buf = _simple().add(chunk, terminated=term.T)  # one add of 6 steps per lane
    inner = buf.buffer.sample_transitions(jax.random.key(1), 5, n_step=2, gamma=0.9)
    full = buf.sample_transitions(jax.random.key(1), 5, n_step=2, gamma=0.9)
    rows = np.array([True, False, False, True, True])
    decode = jax.jit(lambda b, s, r: b.decode(s, rows=r))
    assert_tree_equal(decode(buf, inner, np.ones(5, bool)), full)  # every row: the sampler's own output
    part = decode(buf, inner, rows)
    for x, y in ((part.obs, full.obs), (part.next_obs, full.next_obs)):
        x, y = np.asarray(x), np.asarray(y)
        np.testing.assert_array_equal(x[rows], y[rows])
        assert not x[~rows].any() and y[~rows].any()  # zeros, read from the never-written slot
    with pytest.raises(TypeError, match=r"sample: expected one of \['PrioritisedSequenceSample'.*inner buffer, got dict"):
        buf.decode(inner._asdict())
    with pytest.raises(ValueError, match=r"rows: expected shape \(5,\)"):
        buf.decode(inner, rows=rows[:3])


def test_write_kept_when_result_unused():
    """An add whose result is dropped still writes (a pure_callback would be removed by XLA)."""
    obs, term = _steps(1)
    buf = _simple()
    step = {"obs": obs[0], "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}
    out = jax.jit(lambda b: b.add(step, terminated=term[0]).size() * 0)(buf)
    jax.block_until_ready(out)
    assert buf.host.num_writes == 1
    # ...and the state that was dropped cannot be continued from the old one: a fork is refused.
    with pytest.raises(Exception, match="version"):
        jax.block_until_ready(buf.add(step, terminated=term[0]))


def test_fork_and_stale_reads_are_refused():
    obs, term = _steps(20, num_envs=1)
    ex = example(4, 0, False)
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, frame_stack=4, codec="rle")
    mk = lambda i: {"obs": obs[i], "action": jnp.zeros(1, jnp.int32), "reward": jnp.zeros(1, jnp.float32)}  # noqa: E731
    for i in range(5):
        buf = buf.add(mk(i), terminated=term[i])
    old = buf
    old.sample_sequences(jax.random.key(0), 4, 2)  # fine: nothing newer written yet
    end = 5 + buf.frame_ring  # wraps the lane's frame ring once
    for i in range(5, end):
        buf = buf.add(mk(i % 20), terminated=term[i % 20])
    buf.sample_sequences(jax.random.key(0), 4, 2)  # the newest state reads fine
    with pytest.raises(Exception, match="rewritten"):
        jax.block_until_ready(old.sample_sequences(jax.random.key(0), 4, 2))
    with pytest.raises(Exception, match="version"):
        jax.block_until_ready(old.add(mk(12), terminated=term[12]))


# A write of more than ~100 KB through an io_callback never returned in a process that may use one
# CPU (JAX copies an io_callback's arguments into new arrays; reading the copy waited forever).
_ONE_CPU_ADDS = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})  # before JAX starts: its CPU client sizes itself now
import jax, jax.numpy as jnp, numpy as np
from jaxbuffers.compressed import CompressedTrajectoryBuffer
E, T = 8, 16
ex = {"obs": jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
buf = CompressedTrajectoryBuffer.create(ex, num_envs=E, length=4 * T, frame_stack=4, final_obs_capacity=4 * T)
add = jax.jit(CompressedTrajectoryBuffer.add, donate_argnums=0)
sys.path.insert(0, sys.argv[2])
from frame_stacks import stacked_chunk
rng = np.random.default_rng(0)
truncated = rng.random((E, 3 * T)) < 0.1
stacks, finals = stacked_chunk(rng.integers(0, 255, (E, 3 * T, 84, 84), np.uint8), truncated, 4)  # ~0.9 MB of new frames per add
for i in range(3):  # the next add's arrays go to the device while the last add's write runs
    part = slice(i * T, (i + 1) * T)
    step = {"obs": jnp.asarray(stacks[:, part]), "action": jnp.zeros((E, T), jnp.int32), "reward": jnp.zeros((E, T))}
    buf = add(buf, step, terminated=jnp.zeros((E, T), bool), truncated=jnp.asarray(truncated[:, part]), final_obs=jnp.asarray(finals[:, part]))
got = np.asarray(buf.decode_obs(buf.trajectory.storage["obs"][:, 2 * T : 3 * T]))
assert np.array_equal(got[..., -1, :, :], stacks[:, 2 * T :, -1, :, :]), "newest frames of the last add"
print("ok", buf.host.num_writes)
"""


def _run_fresh_process(code: str, *args: str, env: dict | None = None) -> list[str]:
    """Run ``code`` in a new Python process (JAX set up from scratch); its stdout words. Fails the
    test on a non-zero exit (showing stderr) or after 180 s (a hang)."""
    try:
        run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung (no exit after 180 s)")
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.split()


_WITHOUT_NUMBA = """
import sys
sys.modules["numba"] = None  # every import of numba fails
import jax.numpy as jnp, numpy as np
from jaxbuffers.compressed import CompressedEpisodeBuffer, CompressedTrajectoryBuffer
step = {"obs": jnp.zeros((8, 8), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
frames = np.arange(2 * 3 * 64, dtype=np.uint8).reshape(2, 3, 8, 8)
chunk = {"obs": frames, "action": np.zeros((2, 3), np.int32), "reward": np.zeros((2, 3), np.float32)}
no = np.zeros((2, 3), bool)
for buf in (CompressedTrajectoryBuffer.create(step, num_envs=2, length=8, codec="none", keyframe_interval=1),
            CompressedTrajectoryBuffer.create(step, num_envs=2, length=8, codec="none")):
    buf = buf.add(chunk, terminated=no, truncated=no, final_obs=frames)
    assert np.array_equal(np.asarray(buf.decode_obs(buf.trajectory.storage["obs"][:, :3])), frames)
ep = CompressedEpisodeBuffer.create(step, max_episodes=2, max_timesteps=8, codec="none")
ep = ep.add_episodes(chunk, np.array([3, 3]), terminated=np.array([True, True]), final_obs=frames[:, -1])
print("ok", ep.num_episodes())
"""


def test_codec_none_needs_no_delta_codec_and_no_numba():
    """`codec="none"` (K = 1: no deltas) creates, adds and reads back without numba, whose RLE is the default delta
    codec: no delta codec is built when `keyframe_interval` is 1."""
    assert _run_fresh_process(_WITHOUT_NUMBA) == ["ok", "2"]


def test_jitted_adds_in_a_process_limited_to_one_cpu():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs os.sched_setaffinity (Linux)")
    assert _run_fresh_process(_ONE_CPU_ADDS, str(min(os.sched_getaffinity(0))), os.path.dirname(__file__)) == ["ok", "3"]


_TWO_DEVICE_ADD = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxbuffers.compressed import CompressedTrajectoryBuffer
assert jax.device_count() == 2
ex = {"obs": jnp.zeros((3, 5), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
rep = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P())
b = jax.device_put(CompressedTrajectoryBuffer.create(ex, num_envs=2, length=8, codec="rle"), rep)
s = jax.device_put({"obs": jnp.ones((2, 3, 5), jnp.uint8), "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2)}, rep)
b = jax.jit(lambda b, s: b.add(s, terminated=jnp.zeros(2, bool)))(b, s)
assert np.array_equal(np.asarray(b.decode_obs(b.trajectory.storage["obs"][:, :1])), np.ones((2, 1, 3, 5), np.uint8))
print("ok", b.host.num_writes)
"""


def test_jitted_add_in_a_process_with_two_cpu_devices():
    """A partitioned program cannot hold the CPU write's side-effecting buffer_callback (XLA: "Side-
    effect HLO must have sharding"); with more than one device the write is the ordered io_callback."""
    env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()}
    assert _run_fresh_process(_TWO_DEVICE_ADD, env=env) == ["ok", "1"]


def test_not_vmappable_over_stacked_buffers():
    obs, term = _steps(1)
    buf = _simple()
    step = {"obs": obs[0], "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}
    stacked = jax.tree.map(lambda x: jnp.stack([x, x]), buf)
    batched_step = jax.tree.map(lambda x: jnp.stack([x, x]), step)
    # Our own error on every path (the write's vmap rule wraps both the buffer_callback and the io_callback).
    with pytest.raises(ValueError, match="cannot be vmapped"):
        jax.vmap(lambda b, s: b.add(s, terminated=term[0]))(stacked, batched_step)


def test_vmap_over_sample_keys_of_one_buffer():
    obs, term = _steps(6)
    buf = _simple()
    for i in range(6):
        buf = buf.add({"obs": obs[i], "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}, terminated=term[i])
    keys = jax.random.split(jax.random.key(0), 3)
    many = jax.vmap(lambda k: buf.sample_transitions(k, 4, gamma=0.9))(keys)
    for i in range(3):
        one = buf.sample_transitions(keys[i], 4, gamma=0.9)
        assert_tree_equal(jax.tree.map(lambda x: x[i], many), one)


def test_small_chunk_bytes_spread_frames_over_many_arena_chunks(atari_rollouts):
    """create(chunk_bytes=4 KiB) (below the store's default first-chunk size) works, and samples
    read frames spread over many arena chunks equal the uncompressed buffer's."""
    d = atari_rollouts
    frames = d["breakout_frames"][:120]
    ex = {"obs": jax.ShapeDtypeStruct(frames.shape[1:], jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    for codec in ("zstd:-1", "rle"):
        cb = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=128, codec=codec, chunk_bytes=1 << 12)
        tb = TrajectoryBuffer.create({"obs": jnp.zeros(frames.shape[1:], jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}, num_envs=1, length=128)
        chunk = {"obs": jnp.asarray(frames)[None], "action": jnp.zeros((1, 120), jnp.int32), "reward": jnp.zeros((1, 120), jnp.float32)}
        cb = cb.add(chunk, terminated=jnp.zeros((1, 120), bool))
        tb = tb.add(chunk, terminated=jnp.zeros((1, 120), bool))
        assert len(cb.host.stores[0]._chunks) > 2
        for s in range(3):
            want = tb.sample_transitions(jax.random.key(s), 64, gamma=0.9)
            assert_tree_equal(jax.tree.map(np.asarray, cb.sample_transitions(jax.random.key(s), 64, gamma=0.9)), jax.tree.map(np.asarray, want))


def test_in_place_callback_and_pure_callback_reads_agree():
    """Reads decode into XLA's buffers (buffer_callback) or return arrays (pure_callback), as
    _common.in_place_callbacks decides; forced each way on CPU, both give the same samples, also
    under vmap (with id trees batched differently) and for sequences."""
    obs, term = _steps(9)
    keys = jax.random.split(jax.random.key(4), 3)

    def draws():
        buf = _simple()  # a new buffer: programs are cached per buffer, with the mechanism traced
        for i in range(9):
            buf = buf.add({"obs": obs[i], "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}, terminated=term[i])
        ids0 = buf.buffer.sample_transitions(keys[2], 5, gamma=0.9).obs  # id leaves, outside the vmap
        tr = jax.jit(lambda bf, k: bf.sample_transitions(k, 5, gamma=0.9))(buf, keys[0])
        seq = jax.jit(lambda bf, k: bf.sample_sequences(k, 3, 4))(buf, keys[1])
        many = jax.jit(jax.vmap(lambda k: buf.sample_transitions(k, 4, gamma=0.9)))(keys)
        # One id tree batched by the vmap, one not: both decoded in one callback.
        mixed = jax.jit(jax.vmap(lambda k: buf.decode_obs(ids0, buf.buffer.sample_transitions(k, 5, gamma=0.9).obs)))(keys)
        for i in range(3):  # the unbatched tree decodes the same under every key
            assert_tree_equal(jax.tree.map(lambda x: np.asarray(x[i]), mixed[0]), jax.tree.map(np.asarray, buf.decode_obs(ids0)))
        return jax.tree.map(np.asarray, (tr, seq, many, mixed))

    with _common.forced_callbacks(True):
        in_place = draws()
    with _common.forced_callbacks(False):
        assert_tree_equal(draws(), in_place)


# ------------------------------------------------------------------------------------------------
# Errors.


def test_create_errors():
    ex = example(4, 0, True)
    with pytest.raises(ValueError, match="rgb"):
        CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress=("rgb",))
    with pytest.raises(TypeError, match="tuple"):
        CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress="pixels")
    with pytest.raises(ValueError, match="frame_stack=3"):
        CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress=("pixels",), frame_stack=3)
    with pytest.raises(ValueError, match="stack_axis"):
        CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress=("pixels",), frame_stack=4, stack_axis=-1)
    with pytest.raises(ValueError, match="normalize_images"):
        CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress=("vec",), normalize_images=True)
    with pytest.raises(ValueError, match="padding"):
        CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress=("pixels",), padding="same")
    with pytest.raises(ValueError, match="known codecs"):
        CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress=("pixels",), codec="brotli")
    with pytest.raises(ValueError, match="dictionary_bytes: dictionaries are for zstd codecs, got codec='rle'"):
        CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress=("pixels",), codec="rle", dictionary_bytes=4096)
    for codec, want in (("rle", 0), ("zstd:3", DEFAULT_DICTIONARY_BYTES)):  # the default: on for zstd only
        buf = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress=("pixels",), codec=codec)
        assert buf.host.stores[0].dictionary_bytes == want
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress=("pixels",), dictionary_bytes=0)
    assert buf.host.stores[0].dictionary_bytes == 0
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=f"keyframe_interval: expected a Python int >= 1, got {bad!r}"):
            CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, compress=("pixels",), keyframe_interval=bad)
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=2, length=4, compress=("pixels",), frame_stack=4, keyframe_interval=5)
    assert buf.frame_ring == 4 + 3 + 4 and buf.next_key_pos.shape == (2,)  # K - 1 frames more per lane


def test_final_obs_given_the_whole_step_says_it_is_the_observation():
    """A whole step dict as final_obs: the error says final_obs is shaped like the observation (the
    obs field), not the whole step (it reported a tree structure difference); buffer and writer."""
    from jaxbuffers.compressed import StagingWriter

    ex = {"obs": jax.ShapeDtypeStruct((H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=8, codec="rle")
    step = {"obs": np.ones((1, H, W), np.uint8), "action": np.zeros(1, np.int32), "reward": np.zeros(1, np.float32)}
    yes = np.ones(1, bool)
    msg = (r"final_obs: expected the observation only, shaped like the step's 'obs' field, not the whole step "
           r"\(got a dict with the fields \['action', 'obs', 'reward'\]\)")
    with pytest.raises(TypeError, match=msg):
        buf.add(step, terminated=~yes, truncated=yes, final_obs=step)
    writer = StagingWriter(buf)
    with pytest.raises(TypeError, match=msg):
        writer.add(step, terminated=~yes, truncated=yes, final_obs=step)
    assert writer.pending == 0
    writer.add(step, terminated=~yes, truncated=yes, final_obs=step["obs"])
    assert writer.pending == 1


def test_add_errors_name_the_field():
    buf = CompressedTrajectoryBuffer.create(example(4, 0, True), num_envs=2, length=4, compress=("pixels",), frame_stack=4)
    good = {"obs": {"pixels": jnp.zeros((2, 4, H, W), jnp.uint8), "vec": jnp.zeros((2, 2), jnp.float32)},
            "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}
    bad = dict(good, obs=dict(good["obs"], pixels=jnp.zeros((2, 4, H, W), jnp.float32)))
    with pytest.raises(TypeError, match=r"pixels.*uint8"):
        buf.add(bad, terminated=jnp.zeros(2, bool))
    bad = dict(good, obs=dict(good["obs"], pixels=jnp.zeros((2, 3, H, W), jnp.uint8)))
    with pytest.raises(ValueError, match="pixels"):
        buf.add(bad, terminated=jnp.zeros(2, bool))
    with pytest.raises(TypeError, match="final_obs"):
        buf.add(good, terminated=jnp.zeros(2, bool), truncated=jnp.zeros(2, bool))
    with pytest.raises(TypeError, match="terminated"):
        buf.add(good, terminated=jnp.zeros(2, jnp.int32))
    assert buf.host.num_writes == 0  # nothing reached the host


# ------------------------------------------------------------------------------------------------
# Prioritised variant.


@pytest.mark.slow  # many eager prioritised calls
def test_prioritised_matches_uncompressed():
    rng = np.random.default_rng(4)
    stacker = Stacker(rng, 2, 4, "reset", 0)
    ex = example(4, 0, False)
    comp = CompressedPrioritisedTrajectoryBuffer.create(ex, num_envs=2, length=8, window_length=3, frame_stack=4, codec="igzip:0")
    ref = PrioritisedTrajectoryBuffer.create(ex, num_envs=2, length=8, window_length=3)
    for i in range(11):
        obs, term, trunc, nxt = stacker.step(0.2, 0.2)
        step = make_step(obs, 2, None, False, rng)
        kw = dict(terminated=jnp.asarray(term), truncated=jnp.asarray(trunc), final_obs=jnp.asarray(nxt))
        comp, ref = comp.add(step, **kw), ref.add(step, **kw)
    a = comp.sample_transitions(jax.random.key(0), 16, beta=0.4, gamma=0.9, n_step=2)
    b = ref.sample_transitions(jax.random.key(0), 16, beta=0.4, gamma=0.9, n_step=2)
    assert_tree_equal(a, b)
    pr = jnp.arange(16, dtype=jnp.float32) + 1
    comp = comp.set_priorities(a.indices, pr, a.generations)
    ref = ref.set_priorities(b.indices, pr, b.generations)
    seq = comp.sample_sequences(jax.random.key(1), 8, beta=0.4)
    assert_tree_equal(seq, ref.sample_sequences(jax.random.key(1), 8, beta=0.4))
    assert_tree_equal(comp.final_obs_at(seq.indices, 3), ref.buffer.final_obs_at(seq.indices, 3))


# ------------------------------------------------------------------------------------------------
# Rollout buffer.


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=NO_SHRINK)
@given(
    seed=st.integers(0, 2**31 - 1),
    num_steps=st.integers(1, 6),
    num_envs=st.sampled_from([1, 2, 4]),
    adds=st.lists(st.integers(0, 8), min_size=1, max_size=3),
    normalize=st.booleans(),
    use_jit=st.booleans(),
)
def test_rollout_matches_rollout_buffer(seed, num_steps, num_envs, adds, normalize, use_jit):
    rng = np.random.default_rng(seed)
    ex = {"obs": {"pixels": jnp.zeros((H, W, 2), jnp.uint8), "vec": jnp.zeros(3, jnp.float32)}, "logp": jnp.float32(0)}
    comp = CompressedRolloutBuffer.create(ex, num_envs=num_envs, num_steps=num_steps, compress=("pixels",), normalize_images=normalize, codec="rle")
    ref = RolloutBuffer.create(ex, num_envs=num_envs, num_steps=num_steps)
    cadd = jax.jit(CompressedRolloutBuffer.add, donate_argnums=0) if use_jit else CompressedRolloutBuffer.add
    radd = jax.jit(RolloutBuffer.add)  # an eager add to a full RolloutBuffer raises BufferFullError
    for r, n_adds in enumerate(adds):  # each round: reset, then n_adds adds (may overflow)
        comp, ref = comp.reset(), ref.reset()
        for _ in range(n_adds):
            step = {"obs": {"pixels": jnp.asarray(rng.integers(0, 256, (num_envs, H, W, 2)).astype(np.uint8)),
                            "vec": jnp.asarray(rng.normal(size=(num_envs, 3)).astype(np.float32))},
                    "logp": jnp.asarray(rng.normal(size=num_envs).astype(np.float32))}
            kw = dict(reward=jnp.asarray(rng.normal(size=num_envs).astype(np.float32)), value=jnp.zeros(num_envs),
                      terminated=jnp.asarray(rng.random(num_envs) < 0.3))
            if not use_jit and int(comp.step_index) == num_steps:  # eager: refused, nothing changes
                with pytest.raises(BufferFullError):
                    cadd(comp, step, **kw)
                ref = radd(ref, step, **kw)
            else:
                comp, ref = cadd(comp, step, **kw), radd(ref, step, **kw)
                assert bool(comp.overflowed) == bool(ref.overflowed)  # jitted: the step is dropped, the flag set
    comp = comp.compute_gae(jnp.zeros(num_envs), 0.99, 0.95)
    ref = ref.compute_gae(jnp.zeros(num_envs), 0.99, 0.95)
    assert comp.host.num_rows == num_envs * sum(min(a, num_steps) for a in adds)
    m = num_steps * num_envs if (num_steps * num_envs) % 2 else 2
    a = comp.minibatches(jax.random.key(seed), m)
    b = ref.minibatches(jax.random.key(seed), m)
    if normalize:
        b = b._replace(step=dict(b.step, obs=dict(b.step["obs"], pixels=np.asarray(b.step["obs"]["pixels"]).astype(np.float32) * np.float32(1 / 255))))
    # Unfilled rows hold stale ids in the compressed buffer; compare what the learner reads.
    mask = np.asarray(b.mask)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x)[mask], np.asarray(y)[mask])


def test_rollout_gather_per_minibatch_in_scan():
    n, e = 4, 2
    ex = {"obs": jnp.zeros((H, W), jnp.uint8)}
    comp = CompressedRolloutBuffer.create(ex, num_envs=e, num_steps=n, codec="zstd:3")
    ref = RolloutBuffer.create(ex, num_envs=e, num_steps=n)
    rng = np.random.default_rng(0)
    for _ in range(n):
        step = {"obs": jnp.asarray(rng.integers(0, 256, (e, H, W)).astype(np.uint8))}
        kw = dict(reward=jnp.ones(e), value=jnp.zeros(e), terminated=jnp.zeros(e, bool))
        comp, ref = comp.add(step, **kw), ref.add(step, **kw)

    @jax.jit
    def epoch(buf, key):
        idx = buf.minibatch_indices(key, 4)
        return jax.lax.scan(lambda c, i: (c, buf.gather(i).step["obs"]), 0, idx)[1]

    reads = comp.host.num_reads
    got = epoch(comp, jax.random.key(3))
    assert comp.host.num_reads - reads == 4  # one decode per minibatch
    want = ref.gather(ref.minibatch_indices(jax.random.key(3), 4)).step["obs"]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


MECHANISMS = pytest.mark.parametrize("in_place", [True, False], ids=["buffer_callback", "io_callback"])


def _rollout(num_envs=2, num_steps=8):
    ex = {"obs": jnp.zeros((H, W), jnp.uint8), "action": jnp.int32(0)}
    return CompressedRolloutBuffer.create(ex, num_envs=num_envs, num_steps=num_steps, codec="rle")


def _rollout_add(buf, obs):
    e = obs.shape[0]
    return buf.add({"obs": obs, "action": jnp.zeros(e, jnp.int32)}, reward=jnp.ones(e), value=jnp.zeros(e), terminated=jnp.zeros(e, bool))


@MECHANISMS
def test_rollout_writes_once_under_jit_scan_donation_and_eagerly(in_place):
    """Each write mechanism, forced on CPU: one host write per executed add, in a jitted scan, with
    donation, when the add's result is unused, and eagerly (one compiled program per call)."""
    obs = jnp.asarray(np.random.default_rng(1).integers(0, 256, (8, 2, H, W)).astype(np.uint8))
    collect = lambda buf, obs: jax.lax.scan(lambda b, o: (_rollout_add(b, o), None), buf, obs)[0]  # noqa: E731
    with _common.forced_callbacks(in_place):
        buf = _rollout()
        buf = jax.block_until_ready(jax.jit(collect)(buf, obs[:3]))
        assert (buf.host.num_writes, buf.host.num_rows, int(buf.version)) == (3, 6, 3)
        buf = jax.block_until_ready(jax.jit(collect, donate_argnums=0)(buf, obs[3:5]))
        assert (buf.host.num_writes, buf.host.num_rows, int(buf.version)) == (5, 10, 5)
        buf = jax.block_until_ready(_rollout_add(buf, obs[5]))  # eager
        assert (buf.host.num_writes, int(buf.version)) == (6, 6)
        jax.block_until_ready(jax.jit(lambda b: _rollout_add(b, obs[6]).size() * 0)(buf))
        assert buf.host.num_writes == 7  # kept although its result is unused
        got = buf.gather(jnp.arange(12))  # rows 0-5 (row 6 was rewritten by the dropped state)
        np.testing.assert_array_equal(np.asarray(got.step["obs"]), np.asarray(obs[:6]).reshape(12, H, W))
        with pytest.raises(Exception, match="version"):  # the dropped add advanced the store: a fork
            jax.block_until_ready(_rollout_add(buf, obs[7]))


def test_rollout_minibatches_before_compute_gae_are_refused_eagerly_and_nan_under_jit():
    obs = jnp.asarray(np.random.default_rng(2).integers(0, 256, (2, 2, H, W)).astype(np.uint8))
    buf = _rollout_add(_rollout_add(_rollout(num_steps=2), obs[0]), obs[1])
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="num_minibatches"):  # the arguments' own error first
        buf.minibatches(key, 3)
    with pytest.raises(RuntimeError, match=r"^minibatches: .*\(has_advantages is False\); call compute_gae\("):
        buf.minibatches(key, 2)
    early = jax.jit(lambda b: b.minibatches(key, 2))(buf)
    assert np.isnan(np.asarray(early.advantages)).all() and np.isnan(np.asarray(early.returns)).all()
    np.testing.assert_array_equal(np.asarray(early.step["obs"]).reshape(4, H, W)[np.argsort(np.asarray(early.index).ravel())],
                                  np.asarray(obs).reshape(4, H, W))  # the steps themselves as stored
    done = buf.compute_gae(jnp.zeros(2), 0.9, 0.95).minibatches(key, 2)
    assert np.isfinite(np.asarray(done.advantages)).all() and np.asarray(done.advantages).any()


def test_rollout_eager_adds_read_no_cursor_from_the_device_and_still_refuse_a_full_buffer(monkeypatch):
    obs = jnp.ones((2, H, W), jnp.uint8)
    buf = _rollout_add(_rollout(num_steps=3), obs)  # a new buffer's cursor is read once
    array = type(buf.buffer.step_index)
    reads, to_int = [], array.__int__
    monkeypatch.setattr(array, "__int__", lambda x: reads.append(x.shape) or to_int(x))
    for _ in range(2):
        buf = _rollout_add(buf, obs)
    with pytest.raises(BufferFullError, match=r"step_index=3 of num_steps=3"):
        _rollout_add(buf, obs)
    assert reads == []  # each eager add knew the cursor the one before it wrote
    assert int(buf.buffer.step_index) == 3


@MECHANISMS
def test_rollout_add_refuses_vmap(in_place):
    with _common.forced_callbacks(in_place):
        stacked = jax.tree.map(lambda x: jnp.stack([x, x]), _rollout())
        obs = jnp.zeros((2, 2, H, W), jnp.uint8)
        with pytest.raises(ValueError, match="cannot be vmapped"):
            jax.vmap(_rollout_add)(stacked, obs)


def test_rollout_create_takes_sizes_as_keywords_and_size_counts_steps():
    with pytest.raises(TypeError):
        CompressedRolloutBuffer.create({"obs": jnp.zeros((H, W), jnp.uint8)}, 2, 8)
    buf = _rollout_add(_rollout(num_envs=3), jnp.zeros((3, H, W), jnp.uint8))
    assert int(buf.size()) == 3 == int(buf.buffer.size())


def test_rollout_eager_calls_compile_once_and_equal_jitted(compile_counter):
    obs = jnp.asarray(np.random.default_rng(2).integers(0, 256, (4, 2, H, W)).astype(np.uint8))

    def run(add, gae, gather):
        buf = _rollout(num_steps=4)
        for t in range(4):
            buf = add(buf, obs[t])
        buf = gae(buf, jnp.zeros(2), 0.9, 0.95)
        return buf.buffer, gather(buf, jnp.arange(8)[::-1])

    run(_rollout_add, CompressedRolloutBuffer.compute_gae, CompressedRolloutBuffer.gather)
    eager = run(_rollout_add, CompressedRolloutBuffer.compute_gae, CompressedRolloutBuffer.gather)
    buf = _rollout(num_steps=4)
    buf = _rollout_add(buf, obs[0])  # the new buffer's first add compiles (its store is a static field)
    with compile_counter() as count:
        for t in range(1, 4):
            buf = _rollout_add(buf, obs[t])
        buf.gather(jnp.arange(8))
        buf.gather(jnp.arange(8)[::-1])
    assert count() <= 1  # gather's one program for this buffer
    jitted = run(jax.jit(_rollout_add), jax.jit(CompressedRolloutBuffer.compute_gae), jax.jit(CompressedRolloutBuffer.gather))
    jax.tree.map(np.testing.assert_array_equal, eager, jitted)


# ------------------------------------------------------------------------------------------------
# Real Atari stacks: rebuilt stacks equal the recorded ones exactly.


@pytest.mark.parametrize("game, codec", [
    ("breakout", "rle"), ("breakout", "default"), pytest.param("pong", "rle", marks=pytest.mark.slow),
])
def test_real_atari_stacks_rebuilt_exactly(atari_rollouts, game, codec):
    """Every stored frame, final frame and sampled stack is the recorded one. ``default``: zstd
    with the store's trained dictionary (trained on the first 1,024 frames, then used)."""
    codec = DEFAULT_CODEC if codec == "default" else codec
    d = atari_rollouts
    frames, obs_idx, next_idx = d[f"{game}_frames"], d[f"{game}_obs_idx"], d[f"{game}_next_idx"]
    term = d[f"{game}_terminated"]
    trunc = d[f"{game}_truncated"]
    n = obs_idx.shape[0]
    ex = {"obs": jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    # Episode ends passed as truncations with the recorded next stacks as final observations, so
    # both the in-lane stacks and the final-frame path are checked at every one of them.
    ends = term | trunc
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=n, frame_stack=4, codec=codec, final_obs_capacity=int(ends.sum()) + 1)
    add = jax.jit(CompressedTrajectoryBuffer.add, donate_argnums=0)
    chunk = 2000
    for a in range(0, n, chunk):
        sl = slice(a, a + chunk)
        step = {"obs": jnp.asarray(frames[obs_idx[sl]])[None], "action": jnp.asarray(d[f"{game}_actions"][sl].astype(np.int32))[None],
                "reward": jnp.asarray(d[f"{game}_rewards"][sl])[None]}
        buf = add(buf, step, terminated=jnp.zeros((1, len(obs_idx[sl])), bool), truncated=jnp.asarray(ends[sl])[None],
                  final_obs=jnp.asarray(frames[next_idx[sl]])[None])
    ids = buf.trajectory.storage["obs"][0]
    for a in range(0, n, chunk):
        got = np.asarray(buf.decode_obs(ids[a : a + chunk]))
        want = frames[obs_idx[a : a + chunk]]
        np.testing.assert_array_equal(got, want)
    tr = buf.trajectory
    end_steps = np.flatnonzero(ends)
    assert len(end_steps) >= 3  # several episode ends (game overs) in the rollout
    fids = tr.final_obs[0, : len(end_steps)]  # the j-th episode end took final-ring slot j
    np.testing.assert_array_equal(np.asarray(buf.decode_obs(fids)), frames[next_idx[end_steps]])
    # Transitions (any step): next_obs is the recorded next stack exactly.
    for i in range(3):
        s = buf.sample_transitions(jax.random.key(i), 256, gamma=0.99)
        t = np.asarray(s.indices)
        np.testing.assert_array_equal(np.asarray(s.obs), frames[obs_idx[t]])
        np.testing.assert_array_equal(np.asarray(s.next_obs), frames[next_idx[t]])
    # The store holds one frame per step plus one per episode end.
    store = buf.host.stores[0]
    assert store.num_entries == n + len(end_steps)
    if codec == DEFAULT_CODEC:  # a dictionary was trained, and most keyframes (zstd; the deltas are RLE) use it
        key = store._codec[:n] == store.codec.tag
        assert key.any() and (store._codec[:n][~key] == host_codecs.get_codec("rle").tag).all()
        assert store.dictionary is not None and (store._meta[:n][key] == store.dictionary.meta).mean() > 0.5


def test_real_atari_channels_last(atari_rollouts):
    d = atari_rollouts
    frames, obs_idx = d["breakout_frames"], d["breakout_obs_idx"][:3000]
    term = d["breakout_terminated"][:3000]
    hwc = lambda x: np.moveaxis(x, -3, -1)  # noqa: E731  [.., 4, 84, 84] -> [.., 84, 84, 4]
    ex = {"obs": jax.ShapeDtypeStruct((84, 84, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=3000, frame_stack=4, stack_axis=-1, codec="igzip:1", normalize_images=True)
    step = {"obs": jnp.asarray(hwc(frames[obs_idx]))[None], "action": jnp.zeros((1, 3000), jnp.int32), "reward": jnp.zeros((1, 3000), jnp.float32)}
    buf = buf.add(step, terminated=jnp.asarray(term)[None])
    s = buf.sample_sequences(jax.random.key(0), 32, 8)
    t0 = np.asarray(s.indices)
    want = hwc(frames[obs_idx[t0[:, None] + np.arange(8)]]).astype(np.float32) * np.float32(1 / 255)
    np.testing.assert_array_equal(np.asarray(s.item["obs"]), want)


def test_add_from_host_equals_add_and_raises_stale_directly(atari_rollouts):
    """The eager host-write path gives the identical buffer; a stale state raises StaleBufferError."""
    import jaxbuffers as jb

    d = atari_rollouts
    frames, oi, ni = d["breakout_frames"], d["breakout_obs_idx"], d["breakout_next_idx"]
    term, act, rew = d["breakout_terminated"], d["breakout_actions"], d["breakout_rewards"]
    trunc = (np.arange(len(term)) % 37 == 5) & ~term
    ex = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}

    def make():
        return jb.CompressedTrajectoryBuffer.create(ex, num_envs=1, length=40, frame_stack=4, codec="rle", final_obs_capacity=8)

    a, b = make(), make()
    add = jax.jit(jb.CompressedTrajectoryBuffer.add)
    start = 60  # a window with a termination (Breakout's first ends fall in the first few hundred steps)
    window = slice(start, start + 90)  # wraps the 40-step lanes twice
    # the stacks a reset-padding stacker makes from the window's first step on (and after each truncation)
    stacks, finals = stacked_chunk(frames[oi[window, -1]][None], (term | trunc)[window][None], 4)
    for j, s in enumerate(range(start, start + 90)):
        step = {"obs": jnp.asarray(stacks[:, j]), "action": jnp.asarray([act[s]], jnp.int32), "reward": jnp.asarray(rew[s : s + 1])}
        kw = dict(terminated=jnp.asarray(term[s : s + 1]), truncated=jnp.asarray(trunc[s : s + 1]), final_obs=jnp.asarray(finals[:, j]))
        a = add(a, step, **kw)
        b = b.add_from_host(step, **kw)
    assert a.host.num_writes == b.host.num_writes == 90
    for k in range(3):
        x = a.sample_transitions(jax.random.key(k), 32, n_step=3, gamma=0.9)
        y = b.sample_transitions(jax.random.key(k), 32, n_step=3, gamma=0.9)
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, x), jax.tree.map(np.asarray, y))
    s = start + 90  # the next step's stack: the last one shifted, or a new episode's padded one
    frame = frames[oi[s, -1]][None, None]
    ended = bool((term | trunc)[s - 1])
    obs = np.repeat(frame, 4, axis=1) if ended else np.concatenate([stacks[:, -1, 1:], frame], axis=1)
    step = {**step, "obs": jnp.asarray(obs)}
    kw = dict(terminated=jnp.zeros(1, bool), truncated=jnp.zeros(1, bool), final_obs=jnp.asarray(obs))
    stale = b
    b = b.add_from_host(step, **kw)
    with pytest.raises(jb.StaleBufferError, match="version"):
        stale.add_from_host(step, **kw)
    with pytest.raises(TypeError, match="cannot be traced"):
        jax.jit(lambda buf: buf.add_from_host(step, **kw))(b)


# ------------------------------------------------------------------------------------------------
# StagingWriter: staged one-step adds flushed as power-of-two chunks == the same adds one by one.


def _device_leaves_equal(a, b):
    """Every device array of two compressed buffer states equal, except ``version`` (host writes)."""
    la, lb = jax.tree.leaves(a.replace(version=jnp.int32(0))), jax.tree.leaves(b.replace(version=jnp.int32(0)))
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


_staging_strategy = given(
    seed=st.integers(0, 2**31 - 1),
    num_envs=st.integers(1, 2),
    length=st.integers(3, 9),
    steps=st.integers(1, 30),
    max_pending=st.integers(1, 8),
    use_trunc=st.sampled_from(["never", "always", "mixed"]),
    dict_obs=st.booleans(),
    layout=st.sampled_from(["stack0", "stack-1", "whole"]),
    padding=st.sampled_from(["reset", "zero"]),
    normalize=st.booleans(),
    donate=st.booleans(),
)


# ~5 s an example (each draws new shapes and options, so new compiles): 2 here, 60 in the slow run.
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=NO_SHRINK)
@_staging_strategy
def test_staging_writer_equals_one_step_adds(**kw):
    _check_staging(**kw)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=NO_SHRINK)
@_staging_strategy
def test_staging_writer_equals_one_step_adds_many(**kw):
    _check_staging(**kw)


# A user's jitted sample, defined once: compiled once per buffer, not once per key.
_SAMPLE_2_STEPS = jax.jit(lambda b, kk: b.sample_transitions(kk, 16, n_step=2, gamma=0.9))


def _check_staging(seed, num_envs, length, steps, max_pending, use_trunc, dict_obs, layout, padding, normalize, donate):
    """Staged adds == one-step adds (device state and samples), and the writer's sample (a cached
    jit), the eager sample (one compiled program) and the jitted
    sample_transitions agree bit for bit; the same with a writer that donates its state at each flush."""
    from jaxbuffers.compressed import StagingWriter

    rng = np.random.default_rng(seed)
    k = 3
    axis = -1 if layout == "stack-1" else 0
    stk = Stacker(rng, num_envs, k, padding, axis)
    pix = jax.ShapeDtypeStruct((H, W, k) if axis == -1 else (k, H, W), jnp.uint8)
    obs_ex = {"pixels": pix, "vec": jax.ShapeDtypeStruct((2,), jnp.float32)} if dict_obs else pix
    ex = {"obs": obs_ex, "action": jax.ShapeDtypeStruct((), jnp.int32), "reward": jax.ShapeDtypeStruct((), jnp.float32)}
    kw = dict(frame_stack=None if layout == "whole" else k, stack_axis=axis, codec="zstd:-1", final_obs_capacity=4,
              compress=("pixels",) if dict_obs else None, padding=padding, normalize_images=normalize)
    plain = CompressedTrajectoryBuffer.create(ex, num_envs=num_envs, length=length, **kw)
    writer = StagingWriter(CompressedTrajectoryBuffer.create(ex, num_envs=num_envs, length=length, **kw), max_pending=max_pending, donate=donate)
    flush_at = set(rng.choice(steps, size=min(3, steps), replace=False).tolist())
    for t in range(steps):
        o, term, trunc, nxt = stk.step(0.15, 0.15)
        if dict_obs:
            vec = rng.standard_normal((num_envs, 2)).astype(np.float32)
            o, nxt = {"pixels": o, "vec": vec}, {"pixels": nxt, "vec": vec + 1}
        step = {"obs": o, "action": rng.integers(0, 5, num_envs).astype(np.int32), "reward": rng.standard_normal(num_envs).astype(np.float32)}
        give = use_trunc == "always" or (use_trunc == "mixed" and t % 2 == 1)
        akw = dict(terminated=term, truncated=trunc & ~term, final_obs=nxt) if give else dict(terminated=term | trunc)
        plain = plain.add_from_host(step, **akw)
        writer.add(step, **akw)
        assert writer.pending == (t + 1) % max_pending or t in flush_at or writer.pending <= max_pending
        if t in flush_at:
            writer.flush()
            assert writer.pending == 0
    staged = writer.buffer
    assert writer.pending == 0
    _device_leaves_equal(plain, staged)
    assert staged.host.num_rows == plain.host.num_rows  # same frames written, in fewer writes
    for key in range(2):
        x = plain.sample_transitions(jax.random.key(key), 16, n_step=2, gamma=0.9)
        y = writer.sample_transitions(jax.random.key(key), 16, n_step=2, gamma=0.9)  # the writer's cached jit
        z = _SAMPLE_2_STEPS(staged, jax.random.key(key))
        h = staged.sample_transitions(jax.random.key(key), 16, n_step=2, gamma=0.9)  # eager: one compiled program
        assert y.item["obs"] is y.obs  # one array, not a second copy
        for other in (y, z, h):
            jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, x), jax.tree.map(np.asarray, other))


def test_staging_writer_compiles_power_of_two_chunks_and_keeps_data_on_failure():
    from jaxbuffers.compressed import StagingWriter
    from jaxbuffers.compressed.staging import _pow2_pieces

    assert _pow2_pieces(13) == [8, 4, 1] and _pow2_pieces(16) == [16] and _pow2_pieces(1) == [1]
    assert _pow2_pieces(13, 4) == [4, 4, 4, 1] and _pow2_pieces(7, 6) == [4, 2, 1]
    ex = {"obs": jax.ShapeDtypeStruct((2, H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=50, frame_stack=2, codec="none")
    seen = []
    real = type(buf)._add_checked_frames

    def spy(self, step, frames, terminated, *args, **kw):
        seen.append(terminated.shape[1])
        assert frames[0].shape == (1, terminated.shape[1], H, W)  # only the newest frames are staged
        return real(self, step, frames, terminated, *args, **kw)

    writer = StagingWriter(buf, max_pending=16)
    step = {"obs": np.ones((1, 2, H, W), np.uint8), "action": np.zeros(1, np.int32), "reward": np.zeros(1, np.float32)}
    no = np.zeros(1, bool)
    try:
        type(buf)._add_checked_frames = spy
        for _ in range(16 + 13):
            writer.add(step, terminated=no)
        assert seen == [16] and writer.pending == 13  # auto flush at max_pending
        writer.flush()
        assert seen == [16, 8, 4, 1]
    finally:
        type(buf)._add_checked_frames = real
    # A stale wrapped state: the flush raises and every staged step stays staged.
    for _ in range(5):
        writer.add(step, terminated=no)
    good = writer._buf
    writer._buf.add_from_host(jax.tree.map(lambda x: x[:, None], step), terminated=no[:, None])  # forks the store
    with pytest.raises(StaleBufferError):
        writer.flush()
    assert writer.pending == 5
    assert writer._buf is good
    # Bad input is refused at add time, naming the field, before anything is staged.
    with pytest.raises(TypeError, match="dtype"):
        writer.add({**step, "action": np.zeros(1, np.int64)}, terminated=no)
    with pytest.raises(ValueError, match="num_envs=1"):
        writer.add(jax.tree.map(lambda x: np.concatenate([x, x]), step), terminated=np.zeros(2, bool))
    with pytest.raises(TypeError, match="bool"):
        writer.add(step, terminated=np.zeros(1, np.int32))
    with pytest.raises(TypeError, match="final_obs"):
        writer.add(step, terminated=no, truncated=no)
    assert writer.pending == 5
    with pytest.raises(TypeError, match="CompressedTrajectoryBuffer"):
        StagingWriter(TrajectoryBuffer.create({"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0)}, num_envs=1, length=4))


def test_staging_writer_donating_flush_reuses_the_state_and_keeps_a_refused_one():
    """`donate=True`: each flush gives up the state before it (read afterwards it raises), the result equals a keeping
    writer's; a stale flush is refused before anything runs, so the wrapped state stays whole and the steps staged."""
    from jaxbuffers.compressed import StagingWriter

    ex = {"obs": jax.ShapeDtypeStruct((2, H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    make = lambda: CompressedTrajectoryBuffer.create(ex, num_envs=1, length=50, frame_stack=2, codec="rle:8")  # noqa: E731
    keep, give = StagingWriter(make(), max_pending=4), StagingWriter(make(), max_pending=4, donate=True)
    stk = Stacker(np.random.default_rng(0), 1, 2, "reset", 0)
    states = []
    for t in range(11):
        o, term, trunc, nxt = stk.step(0.2, 0.2)
        step = {"obs": o, "action": np.full(1, t, np.int32), "reward": np.ones(1, np.float32)}
        for w in (keep, give):
            w.add(step, terminated=term, truncated=trunc & ~term, final_obs=nxt)
        if t in (3, 7):  # the writers flushed 4 steps
            states.append(give.buffer)
    _device_leaves_equal(keep.buffer, give.buffer)
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(states[0].trajectory.storage["action"])  # given up at the second flush
    # a stale wrapped state: the flush is refused before the donating program runs
    writer = StagingWriter(make(), max_pending=8, donate=True)
    ones = {"obs": np.ones((1, 2, H, W), np.uint8), "action": np.zeros(1, np.int32), "reward": np.zeros(1, np.float32)}
    for _ in range(3):
        writer.add(ones, terminated=np.zeros(1, bool))
    good = writer._buf
    good.add_from_host(jax.tree.map(lambda x: x[:, None], ones), terminated=np.zeros((1, 1), bool))  # forks the store
    with pytest.raises(StaleBufferError):
        writer.flush()
    assert writer.pending == 3 and writer._buf is good
    np.asarray(good.trajectory.storage["action"])  # still whole


def test_staging_writer_stages_a_final_frame_only_where_read():
    """With `truncated`, the writer stages the newest frame of a compressed final observation only for the steps whose
    final observation is read (truncated, not terminated): its staging bytes grow by one frame per such step and by
    nothing for the others, and a flush releases them; the buffer equals a writer's that flushes every step. A
    stacked (vmapped) buffer is refused when the writer is made."""
    from jaxbuffers.compressed import StagingWriter

    ex = {"obs": jax.ShapeDtypeStruct((2, H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    make = lambda: CompressedTrajectoryBuffer.create(ex, num_envs=2, length=40, frame_stack=2, codec="rle:8")  # noqa: E731
    big, small = StagingWriter(make(), max_pending=16), StagingWriter(make(), max_pending=1)
    stk = Stacker(np.random.default_rng(3), 2, 2, "reset", 0)
    base, read = big.staging_nbytes, 0
    for t in range(12):
        o, term, trunc, nxt = stk.step(0.3, 0.3)
        step = {"obs": o, "action": np.full(2, t, np.int32), "reward": np.ones(2, np.float32)}
        for w in (big, small):
            w.add(step, terminated=term, truncated=trunc, final_obs=nxt)
        read += int((trunc & ~term).sum())
        assert big.staging_nbytes == base + read * H * W  # one frame per final observation read, nothing else
    assert read > 0
    _device_leaves_equal(big.buffer, small.buffer)
    assert big.staging_nbytes == base  # the flush released the staged final frames
    with pytest.raises(ValueError, match="buffer"):
        StagingWriter(jax.tree.map(lambda x: jnp.stack([x, x]), make()))


def test_staging_writer_sample_prioritised_cached_jit_and_argument_errors(compile_counter):
    """The writer samples both buffer kinds through one cached jit: equal to the buffer's own
    sample, no recompile when gamma or beta change, arguments checked with clear errors."""
    from jaxbuffers.compressed import StagingWriter

    ex = {"obs": jax.ShapeDtypeStruct((2, H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    rng = np.random.default_rng(1)
    pw = StagingWriter(CompressedPrioritisedTrajectoryBuffer.create(ex, num_envs=1, length=16, window_length=3, frame_stack=2, codec="zstd:-1"))
    uw = StagingWriter(CompressedTrajectoryBuffer.create(ex, num_envs=1, length=16, frame_stack=2, codec="rle"))
    ends = (np.arange(12) % 5 == 4)[None]
    stacks, _ = stacked_chunk(rng.integers(0, 255, (1, 12, H, W), dtype=np.uint8), ends, 2)  # what frame_stack stores
    for t in range(12):
        step = {"obs": stacks[:, t], "action": np.full(1, t, np.int32), "reward": np.ones(1, np.float32)}
        for w in (pw, uw):
            w.add(step, terminated=ends[:, t])
    pbuf = pw.flush()
    pbuf = pbuf.set_priorities(jnp.arange(6), jnp.arange(1.0, 7.0), pbuf.buffer.generations_at(jnp.arange(6)))
    pw.buffer = pbuf
    for key in range(2):
        a = pw.sample_transitions(jax.random.key(key), 8, beta=0.4, gamma=0.5)
        b = pbuf.sample_transitions(jax.random.key(key), 8, beta=0.4, gamma=0.5)
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b))
        assert a.item["obs"] is a.obs
    uw.sample_transitions(jax.random.key(0), 8, gamma=0.5, n_step=2)
    with compile_counter() as n:
        for g, beta in ((0.9, 0.5), (0.99, 1.0)):
            pw.sample_transitions(jax.random.key(1), 8, beta=beta, gamma=g)
            uw.sample_transitions(jax.random.key(1), 8, gamma=g, n_step=2)
    assert n() == 0
    c = pw.sample_transitions(jax.random.key(0), 8, beta=1, gamma=np.float64(0.5))  # an int beta, a numpy gamma
    d = pbuf.sample_transitions(jax.random.key(0), 8, beta=1.0, gamma=0.5)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, c), jax.tree.map(np.asarray, d))
    e = pw.sample_transitions(jax.random.key(0), 8, gamma=0.5)  # beta defaults to the buffer's (1.0)
    f = pbuf.sample_transitions(jax.random.key(0), 8, gamma=0.5)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, e), jax.tree.map(np.asarray, f))
    with pytest.raises(TypeError, match="only a prioritised buffer takes beta"):
        uw.sample_transitions(jax.random.key(0), 8, gamma=0.5, beta=0.4)
    with pytest.raises(ValueError, match="gamma"):
        uw.sample_transitions(jax.random.key(0), 8, gamma=1.5)
    with pytest.raises(ValueError, match="beta"):
        pw.sample_transitions(jax.random.key(0), 8, gamma=0.5, beta=-1.0)


def test_close_frees_the_pixels_even_while_jit_caches_hold_the_store():
    """JAX's jit caches keep the host store referenced (it is static pytree data), so deleting
    the buffer does not free it; close() does, at once (after a jitted sample compiled against
    it), and later use raises."""
    from jaxbuffers.compressed import StagingWriter

    ex = {"obs": jax.ShapeDtypeStruct((2, H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    w = StagingWriter(CompressedTrajectoryBuffer.create(ex, num_envs=1, length=32, frame_stack=2, codec="zstd:-1"))
    rng = np.random.default_rng(0)
    stacks, _ = stacked_chunk(rng.integers(0, 255, (1, 20, H, W), dtype=np.uint8), np.zeros((1, 20), bool), 2)
    for t in range(20):
        step = {"obs": stacks[:, t], "action": np.zeros(1, np.int32), "reward": np.zeros(1, np.float32)}
        w.add(step, terminated=np.array([False]))
    buf = w.buffer
    w.sample_transitions(jax.random.key(0), 4, gamma=0.9)
    stores = buf.host.stores
    assert sum(st.payload_nbytes for st in stores) > 0 and sum(st.arena_nbytes for st in stores) > 0
    w.close()
    assert sum(st.payload_nbytes for st in stores) == 0 and sum(st.arena_nbytes for st in stores) == 0
    with pytest.raises(Exception, match="after close"):
        jax.block_until_ready(buf.sample_transitions(jax.random.key(0), 4, gamma=0.9))


def test_eager_sample_is_one_compiled_program_and_refuses_stale_states(compile_counter):
    """An eager sample_transitions runs one cached compiled program (no compile after the first
    call of a shape; gamma and beta traced) equal to the jitted call, and a stale state's read
    raises StaleBufferError's message from the callback."""
    ex = {"obs": jax.ShapeDtypeStruct((2, H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=8, frame_stack=2, codec="zstd:-1")
    ended = np.array([[False] * 5 + [True]])  # each chunk a whole episode: it can be added again after itself
    stacks, _ = stacked_chunk(np.arange(6 * H * W, dtype=np.uint8).reshape(1, 6, H, W), ended, 2)
    chunk = {"obs": stacks, "action": np.zeros((1, 6), np.int32), "reward": np.zeros((1, 6), np.float32)}
    buf = buf.add_from_host(chunk, terminated=ended)
    old = buf
    sample = jax.jit(lambda bf, k, g: bf.sample_transitions(k, 4, n_step=3, gamma=g))
    jax.block_until_ready((buf.sample_transitions(jax.random.key(0), 4, n_step=3, gamma=0.5), sample(buf, jax.random.key(0), 0.5)))
    with compile_counter() as n:
        for i, g in enumerate((0.5, 0.9, 0.99)):
            a = buf.sample_transitions(jax.random.key(i), 4, n_step=3, gamma=g)
            b = sample(buf, jax.random.key(i), g)
            jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b))
    assert n() == 0
    for _ in range(buf.frame_ring // 6 + 1):  # wraps: old's slots are rewritten
        buf = buf.add_from_host(chunk, terminated=ended)
    with pytest.raises(Exception, match="rewritten"):
        jax.block_until_ready(old.sample_transitions(jax.random.key(0), 8, gamma=0.5))
    with pytest.raises(StaleBufferError, match="version"):
        old.add_from_host(chunk, terminated=ended)
    # Prioritised: eager == jitted, flat samples (item is the step dict, decoded)
    pbuf = CompressedPrioritisedTrajectoryBuffer.create(ex, num_envs=1, length=8, window_length=3, frame_stack=2, codec="zstd:-1")
    ends = np.array([[False, False, True, False, False, False]])
    pstacks, _ = stacked_chunk(np.arange(6 * H * W, dtype=np.uint8).reshape(1, 6, H, W), ends, 2)
    pbuf = pbuf.add_from_host({**chunk, "obs": pstacks}, terminated=ends)
    pbuf = pbuf.set_priorities(jnp.arange(3), jnp.array([1.0, 5.0, 2.0]), pbuf.buffer.generations_at(jnp.arange(3)))
    psample = jax.jit(lambda bf, k: bf.sample_transitions(k, 6, beta=0.4, gamma=0.5))
    for key in jax.random.split(jax.random.key(3), 3):
        a = pbuf.sample_transitions(key, 6, beta=0.4, gamma=0.5)
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, psample(pbuf, key)))
        assert a.item["obs"].shape == (6, 2, H, W) and a.importance_weights.shape == (6,)


def test_final_obs_leading_axes_are_checked():
    """The compressed buffer shares the device buffer's add checks: a final_obs with other leading
    axes than the step is an error naming final_obs (it was broadcast to every lane)."""
    import jaxbuffers as jb

    ex = {"obs": jnp.zeros((4, 8, 8), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = jb.CompressedTrajectoryBuffer.create(ex, num_envs=2, length=8, frame_stack=4, stack_axis=0, codec="rle")
    step = {"obs": jnp.zeros((2, 4, 8, 8), jnp.uint8), "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2)}
    flags = dict(terminated=jnp.zeros(2, bool), truncated=jnp.ones(2, bool))
    with pytest.raises(ValueError, match=r"final_obs: expected leading axes \[2\].*got \[1\]"):
        buf.add(step, **flags, final_obs=jnp.zeros((1, 4, 8, 8), jnp.uint8))
    buf.add(step, **flags, final_obs=jnp.zeros((2, 4, 8, 8), jnp.uint8).at[:, -1].set(1))  # the right shape is accepted
    empty = jax.tree.map(lambda x: x[:, None][:, :0], step)  # a chunk of 0 steps: was an IndexError
    with pytest.raises(ValueError, match=r"step chunk \(time axis\): expected at least one item, got 0"):
        buf.add(empty, terminated=jnp.zeros((2, 0), bool))
    buf.close()


def test_create_sizes_are_python_ints_and_the_final_ring_is_at_most_length():
    """num_envs / length / final_obs_capacity went through int(): 8.7 became 8 silently; they are
    checked as everywhere else. A final-frame ring above length is length (as the device buffer)."""
    import jaxbuffers as jb

    ex = {"obs": jnp.zeros((4, 8, 8), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    kw = dict(frame_stack=4, stack_axis=0, codec="rle")
    for bad in (dict(num_envs=2.0), dict(length=8.7), dict(final_obs_capacity=2.5), dict(final_obs_capacity=0)):
        args = {"num_envs": 2, "length": 8, **bad}
        name = next(iter(bad))
        with pytest.raises(ValueError, match=f"{name}: expected a Python int"):
            jb.CompressedTrajectoryBuffer.create(ex, num_envs=args.pop("num_envs"), length=args.pop("length"), **kw, **args)
    buf = jb.CompressedTrajectoryBuffer.create(ex, num_envs=2, length=8, final_obs_capacity=50, **kw)
    assert buf.final_obs_capacity == 8
    buf.close()


def test_device_reads_match_the_wrapped_buffers_and_answer_after_close():
    """The cheap default-run part of the next test: the device-field reads of a compressed trajectory and rollout
    buffer are the wrapped buffer's, also after close (no host read compiled)."""
    ex = example(4, 0, False)
    comp = CompressedTrajectoryBuffer.create(ex, num_envs=2, length=6, frame_stack=4, codec="rle")
    roll = CompressedRolloutBuffer.create(ex, num_envs=2, num_steps=3, frame_stack=4, codec="rle")
    comp.close()
    roll.close()
    idx = jnp.arange(12)
    assert not bool(comp.final_obs_lost()) and not np.asarray(comp.valid_starts(idx, 2)).any()
    np.testing.assert_array_equal(np.asarray(comp.valid_starts(idx, 2)), np.asarray(comp.trajectory.valid_starts(idx, 2)))
    assert not np.asarray(roll.filled()).any() and int(roll.trainable_size()) == 0 and roll.float_dtype == jnp.float32
    with pytest.raises(RuntimeError, match="after close"):
        comp.check_stacks({"obs": jnp.zeros((2, 4, H, W), jnp.uint8), "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2)},
                          terminated=jnp.zeros(2, bool))


@pytest.mark.slow  # compiles a prioritised compressed buffer's decodes: the default run has the cheap part above
def test_device_reads_and_positional_reads_match_the_wrapped_buffers_and_answer_after_close():
    """The methods the compressed buffers take from the buffers they wrap: device-field reads return exactly the
    plain buffer's result (also after close); `transitions_at` / `sequences_at` decode as the samplers do and equal
    the plain buffer's; after close a host read raises RuntimeError."""
    obs, term = _steps(9, num_envs=2)
    ex = example(4, 0, False)
    comp = CompressedPrioritisedTrajectoryBuffer.create(ex, num_envs=2, length=6, window_length=2, frame_stack=4, codec="rle")
    ref = PrioritisedTrajectoryBuffer.create(ex, num_envs=2, length=6, window_length=2)
    for i in range(9):
        step = {"obs": obs[i], "action": jnp.full(2, i, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}
        comp, ref = comp.add(step, terminated=term[i]), ref.add(step, terminated=term[i])
    idx = jnp.arange(12)
    same = lambda a, b: jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b))  # noqa: E731
    same(comp.transitions_at(idx, n_step=2, gamma=0.9), ref.buffer.transitions_at(idx, n_step=2, gamma=0.9))
    same(comp.sequences_at(idx, 2), ref.buffer.sequences_at(idx, 2))
    reads = lambda b, t: (b.priorities(idx), b.generations_at(idx), b.num_valid_windows(), t.final_obs_lost(), t.valid_starts(idx, 2))  # noqa: E731
    same(reads(comp, comp), reads(ref, ref.buffer))
    roll = CompressedRolloutBuffer.create(ex, num_envs=2, num_steps=3, frame_stack=4, codec="rle")
    plain = RolloutBuffer.create(ex, num_envs=2, num_steps=3)
    kw = dict(reward=jnp.ones(2), value=jnp.zeros(2), terminated=jnp.zeros(2, bool), trainable=jnp.array([True, False]))
    roll, plain = roll.add({"obs": obs[0], "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2)}, **kw), plain.add(
        {"obs": obs[0], "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2)}, **kw)
    same((roll.filled(), roll.learn_mask(), roll.trainable_size()), (plain.filled(), plain.learn_mask(), plain.trainable_size()))
    assert roll.float_dtype == plain.float_dtype
    comp.close()
    roll.close()
    same(reads(comp, comp), reads(ref, ref.buffer))  # device fields only: they still answer
    assert int(comp.size()) == int(ref.size()) and int(roll.trainable_size()) == 1
    with pytest.raises(RuntimeError, match="after close"):
        comp.transitions_at(idx, n_step=1, gamma=0.9)


@pytest.mark.parametrize("donate", [False, True])
def test_truncate_last_equals_adding_the_step_truncated(donate):
    """`StagingWriter.truncate_last` (the step staged, or already in the buffer: `truncate_last_from_host`) after a
    step added untruncated gives the state and samples of the step added truncated with that final observation, with
    frame stacks (the next step starts an episode) and the temporal coding; a final observation that is not its
    step's stack shifted by one frame is refused before anything changes."""
    from jaxbuffers.compressed import StagingWriter

    ex = {"obs": jax.ShapeDtypeStruct((3, H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    make = lambda: CompressedTrajectoryBuffer.create(ex, num_envs=2, length=6, frame_stack=3, codec="rle:8", keyframe_interval=2)  # noqa: E731
    given_, late = StagingWriter(make(), max_pending=3), StagingWriter(make(), max_pending=3, donate=donate)
    stk = Stacker(np.random.default_rng(1), 2, 3, "reset", 0)
    no = np.zeros(2, bool)
    for t in range(13):
        o, _, trunc, nxt = stk.step(0.0, 0.3)
        step = {"obs": o, "action": np.full(2, t, np.int32), "reward": np.ones(2, np.float32)}
        given_.add(step, terminated=no, truncated=trunc, final_obs=nxt)
        late.add(step, terminated=no)
        if t % 2:
            late.flush()  # the step to truncate is in the buffer, else still staged
        late.truncate_last(trunc, nxt)
    _device_leaves_equal(given_.buffer, late.buffer)
    flat = jnp.arange(12)
    a, b = given_.buffer.transitions_at(flat, gamma=1.0), late.buffer.transitions_at(flat, gamma=1.0)
    np.testing.assert_array_equal(np.asarray(a.next_obs), np.asarray(b.next_obs))
    before = late.buffer
    with pytest.raises(ValueError, match="final_obs"):
        late.truncate_last(np.ones(2, bool), np.zeros((2, 3, H, W), np.uint8))
    assert late.pending == 0 and late._buf is before


def test_rollout_add_on_a_full_buffer_changes_nothing():
    """Eagerly, an add to a full compressed rollout raises `BufferFullError` before anything runs: the host store's
    version stays, so the same state's `reset().add` is not stale; jitted, the step is dropped and `overflowed` set."""
    kw = dict(reward=jnp.zeros(2), value=jnp.zeros(2), terminated=jnp.zeros(2, bool))
    step = {"obs": jnp.ones((2, H, W), jnp.uint8)}
    b = CompressedRolloutBuffer.create({"obs": jnp.zeros((H, W), jnp.uint8)}, num_envs=2, num_steps=1, codec="rle").add(step, **kw)
    writes = b.host.version
    with pytest.raises(BufferFullError, match="full"):
        b.add(step, **kw)
    assert b.host.version == writes and not bool(b.overflowed)
    with pytest.raises(ValueError, match="step"):  # the arguments' own refusal first, as RolloutBuffer's
        b.add({"obs": jnp.ones((3, H, W), jnp.uint8)}, **kw)
    full = b.reset().add(step, **kw)
    assert int(full.step_index) == 1
    over = jax.jit(CompressedRolloutBuffer.add)(full, step, **kw)
    assert bool(over.overflowed) and int(over.step_index) == 1


def test_compressed_buffers_have_every_public_attribute_of_the_buffers_they_wrap():
    """Every public attribute of each wrapped buffer class is the compressed class's too, except those of
    `_common.NOT_WRAPPED`, each named in the guide's section on compressed buffers; the delegated ones are the device
    buffer's own values."""
    import pathlib

    from jaxbuffers import EpisodeBuffer
    from jaxbuffers.compressed import CompressedEpisodeBuffer

    public = lambda c: {n for n in dir(c) if not n.startswith("_")} | {n for n in c.__dataclass_fields__ if not n.startswith("_")}  # noqa: E731
    pairs = [(CompressedRolloutBuffer, RolloutBuffer), (CompressedTrajectoryBuffer, TrajectoryBuffer),
             (CompressedPrioritisedTrajectoryBuffer, PrioritisedTrajectoryBuffer), (CompressedEpisodeBuffer, EpisodeBuffer)]
    for comp, wrapped in pairs:
        assert public(wrapped) - public(comp) <= set(_common.NOT_WRAPPED), comp.__name__
    guide = pathlib.Path(__file__).parents[1].joinpath("docs", "guide.md").read_text()
    section = guide[guide.index("## 4. Host-compressed pixels") : guide.index("## 5.")]
    assert all(f"`{name}`" in section for name in _common.NOT_WRAPPED)
    ex = {"obs": jnp.zeros((H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    b = CompressedPrioritisedTrajectoryBuffer.create(ex, num_envs=2, length=4, window_length=2, codec="rle")
    assert b.window_length == 2 and b.head is b.trajectory.head and b.terminated is b.trajectory.terminated
    assert b.tree is b.buffer.tree and b.obs_key == "obs" and int(b.num_valid_windows()) == 0


def test_eager_add_to_a_donated_state_is_stale():
    """A state given to a jitted add with `donate_argnums` (its arrays deleted) is refused by an eager add as stale,
    before anything runs; the state that call returned still takes adds."""
    ex = {"obs": jnp.zeros((H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    step = jax.tree.map(lambda x: jnp.stack([x]), ex)
    b0 = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=4, codec="rle")
    b1 = jax.jit(CompressedTrajectoryBuffer.add, donate_argnums=0)(b0, step, terminated=jnp.zeros(1, bool))
    with pytest.raises(StaleBufferError, match="donated"):
        b0.add(step, terminated=jnp.zeros(1, bool))
    assert int(b1.add(step, terminated=jnp.zeros(1, bool)).num_added()) == 2


def test_compress_naming_no_leaf_says_which_names_there_are():
    """`compress` names leaves inside the observation (a trajectory or episode buffer) or the step (a rollout): a
    name that matches none is refused with the names there are, or, for a bare-array observation, with the rule
    that it has none (before: "its leaves are ['<root>']")."""
    from jaxbuffers.compressed import CompressedEpisodeBuffer, CompressedRolloutBuffer

    bare = {"obs": jnp.zeros((4, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    nested = {**bare, "obs": {"pixels": jnp.zeros((4, 4), jnp.uint8), "pos": jnp.zeros(3)}}
    for make in (lambda: CompressedTrajectoryBuffer.create(bare, num_envs=1, length=4, compress=("obs",)),
                 lambda: CompressedEpisodeBuffer.create(bare, max_episodes=2, max_timesteps=4, compress=("obs",))):
        with pytest.raises(ValueError, match=r"^compress: \['obs'\] name no leaf of example_step\['obs'\]: it is one array, "
                                             r"with no names inside it; leave compress out"):
            make()
    with pytest.raises(ValueError, match=r"^compress: \['obs'\] name no leaf of example_step\['obs'\]; the names inside it are \['pixels', 'pos'\]$"):
        CompressedTrajectoryBuffer.create(nested, num_envs=1, length=4, compress=("obs",))
    with pytest.raises(ValueError, match=r"^compress: \['pixel'\] name no leaf of example_step; the names inside it are "
                                         r"\['action', 'obs', 'pixels', 'pos', 'reward'\]$"):
        CompressedRolloutBuffer.create(nested, num_envs=1, num_steps=4, compress=("pixel",))
    assert CompressedRolloutBuffer.create(nested, num_envs=1, num_steps=4, compress=("pixels",)).leaves[0].name == "example_step['obs']['pixels']"
