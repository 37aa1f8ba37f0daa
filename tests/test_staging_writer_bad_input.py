"""Bad input to StagingWriter: wrong arguments and call orders (after close, before any add, a stale wrapped state)
are refused with an error of ours naming the argument, before anything is staged, flushed or sampled: the staged
steps, the wrapped buffer and its host store stay exactly as they were."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compressed_bad_input import (
    BAD_SIZES, SETTINGS, WRONG_KEYS, assert_refused, foreign_inputs, sampling_calls, torch_tensor, wrong_trajectory_add,
)
from jaxbuffers.compressed import CompressedPrioritisedTrajectoryBuffer, CompressedTrajectoryBuffer, StagingWriter, StaleBufferError

E, LENGTH, K, H, W = 2, 8, 2, 3, 4
EXAMPLE = {"obs": jnp.zeros((K, H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
KINDS = {"uniform": (CompressedTrajectoryBuffer, {}), "prioritised": (CompressedPrioritisedTrajectoryBuffer, {"window_length": 2})}


def _good(rng):
    """One step that starts and ends every lane's episode: stacks of one frame repeated (the "reset" padding), final
    observations those stacks shifted by a new frame (what frame_stack stores)."""
    obs = np.repeat(rng.integers(0, 256, (E, 1, H, W), dtype=np.uint8), K, axis=1)
    step = {"obs": obs, "action": rng.integers(0, 4, E).astype(np.int32), "reward": rng.normal(size=E).astype(np.float32)}
    final = np.concatenate([obs[:, 1:], rng.integers(0, 256, (E, 1, H, W), dtype=np.uint8)], axis=1)
    return step, {"terminated": np.array([False, True]), "truncated": np.array([True, False]), "final_obs": final}


def _writer(kind, staged=3):
    """A writer with some steps in its buffer and `staged` steps staged (max_pending 16: no flush by itself)."""
    cls, kw = KINDS[kind]
    w = StagingWriter(cls.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, codec="rle", **kw), max_pending=16)
    rng = np.random.default_rng(0)
    for i in range(4 + staged):
        step, flags = _good(rng)
        w.add(step, **flags)
        if i == 3:
            w.flush()
    assert w.pending == staged
    return w


@pytest.fixture(scope="module")
def writers():
    out = {kind: _writer(kind) for kind in KINDS}
    yield out
    for w in out.values():
        w.close()


@SETTINGS
@given(data=st.data(), kind=st.sampled_from(list(KINDS)), arg=st.sampled_from(["step", "terminated", "truncated", "final_obs"]),
       seed=st.integers(0, 2**16))
def test_add_refuses_each_wrong_argument_before_staging(writers, data, kind, arg, seed):
    w = writers[kind]
    step, flags, names = wrong_trajectory_add(data, arg, *_good(np.random.default_rng(seed)))
    assert_refused(lambda: w.add(step, **flags), names, w)


@SETTINGS
@given(data=st.data(), kind=st.sampled_from(list(KINDS)))
def test_samples_refuse_each_wrong_argument_before_flushing(writers, data, kind):
    """`gamma=7` used to flush the staged steps and then raise; every argument is now checked first."""
    w = writers[kind]
    calls = sampling_calls(kind == "prioritised", LENGTH)
    name, values, method = calls[data.draw(st.integers(0, len(calls) - 1), "call")]
    value = data.draw(values, name)
    assert_refused(lambda: method(w, value), (name,), w)
    assert w.pending == 3


@SETTINGS
@given(max_pending=BAD_SIZES, kind=st.sampled_from(list(KINDS)))
def test_construction_refuses_wrong_arguments(writers, max_pending, kind):
    buf = writers[kind]._buf
    assert_refused(lambda: StagingWriter(buf, max_pending=max_pending), ("max_pending",), buf)
    for wrong in (None, "buffer", buf.trajectory, {"buffer": buf}):
        assert_refused(lambda: StagingWriter(wrong), ("buffer",), buf)


def test_buffer_setter_refuses_other_buffers_and_pending_steps(writers):
    w = writers["uniform"]
    other = _writer("uniform", staged=0)
    for wrong in (None, other.buffer, writers["prioritised"]._buf, w._buf.trajectory):
        assert_refused(lambda: setattr(w, "buffer", wrong), ("StagingWriter.buffer",), w)
    assert_refused(lambda: setattr(w, "buffer", w._buf), ("StagingWriter.buffer",), w)  # 3 steps staged
    other.close()


def test_calls_after_close_are_refused():
    """`add` after `close()` was accepted and failed only at the next flush."""
    w = _writer("uniform")
    step, flags = _good(np.random.default_rng(5))
    w.close()
    assert w.pending == 0
    for call in (lambda: w.add(step, **flags), w.flush, lambda: w.buffer, lambda: w.sample_transitions(jax.random.key(0), 2, gamma=0.9),
                 lambda: w.sample_sequences(jax.random.key(0), 2, 2), lambda: setattr(w, "buffer", w._buf)):
        assert_refused(call, ("close",), w)
    with pytest.raises(RuntimeError, match="after close"):
        StagingWriter(w._buf)


def test_sample_before_any_add_gives_zeros():
    """Documented: sampling an empty buffer is defined (zeros, `can_sample` False), through the writer too."""
    for kind, (cls, kw) in KINDS.items():
        w = StagingWriter(cls.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, codec="rle", **kw))
        tr = w.sample_transitions(jax.random.key(0), 4, gamma=0.9)
        np.testing.assert_array_equal(np.asarray(tr.obs), 0)
        assert not bool(w.buffer.can_sample_transitions(4)) and w.buffer.host.num_writes == 0
        w.close()


def test_stale_wrapped_state_refused_at_flush_keeping_every_staged_step():
    w = _writer("uniform")
    step, flags = _good(np.random.default_rng(6))
    w._buf.add(step, **flags)  # an add outside the writer: its wrapped state is now stale
    assert_refused(w.flush, ("add",), w, errors=(StaleBufferError,))
    assert_refused(lambda: w.sample_transitions(jax.random.key(0), 2, gamma=0.9), ("add",), w, errors=(StaleBufferError,))
    w.close()


@foreign_inputs
@pytest.mark.parametrize("kind", list(KINDS))
def test_torch_tensors_and_wrong_keys_are_named_before_flushing(writers, kind):
    w = writers[kind]
    step, flags = _good(np.random.default_rng(0))
    assert_refused(lambda: w.add({**step, "obs": torch_tensor(step["obs"])}, **flags), ("step",), w)
    assert_refused(lambda: w.add(step, **{**flags, "truncated": torch_tensor(flags["truncated"])}), ("truncated",), w)
    for key in WRONG_KEYS:
        assert_refused(lambda: w.sample_transitions(key, 2, gamma=0.9), ("key",), w)
        assert_refused(lambda: w.sample_sequences(key, 2, *((2,) if kind == "uniform" else ())), ("key",), w)


def test_stacks_that_do_not_shift_are_refused_naming_the_env_before_staging():
    """Within an episode, a stack that is not the step before's shifted by one frame, or a final observation that is
    not its step's stack shifted, is refused with the buffer's message naming the env, nothing staged; the shifted
    stacks are staged and come back as given."""
    w = StagingWriter(CompressedTrajectoryBuffer.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, codec="rle"), max_pending=16)
    frames = np.random.default_rng(3).integers(0, 256, (E, 6, H, W), dtype=np.uint8)
    stack = lambda t: np.stack([frames[:, max(t - 1, 0)], frames[:, t]], axis=1)  # noqa: E731  (reset padding at t = 0)
    step = lambda obs: {"obs": obs, "action": np.zeros(E, np.int32), "reward": np.zeros(E, np.float32)}  # noqa: E731
    going = {"terminated": np.zeros(E, bool)}
    w.add(step(stack(0)), **going)
    w.add(step(stack(1)), **going)
    jumped = stack(2)
    jumped[1] = np.stack([frames[1, 3], frames[1, 4]])  # env 1 skips frames: [3, 4] after [0, 1]
    err = assert_refused(lambda: w.add(step(jumped), **going), ("step['obs']",), w, errors=(ValueError,))
    assert "env 1, step 0 of the add is not the stack the buffer rebuilds" in str(err)
    ended = {"terminated": np.zeros(E, bool), "truncated": np.array([True, False])}
    err = assert_refused(lambda: w.add(step(stack(2)), **ended, final_obs=stack(4)), ("final_obs",), w, errors=(ValueError,))
    assert "env 0" in str(err)
    w.add(step(stack(2)), **ended, final_obs=stack(3))
    assert w.pending == 3
    obs = np.asarray(w.buffer.decode_obs(w.buffer.trajectory.storage["obs"][:, :3]))
    np.testing.assert_array_equal(obs, np.stack([stack(0), stack(1), stack(2)], axis=1))
    w.close()
