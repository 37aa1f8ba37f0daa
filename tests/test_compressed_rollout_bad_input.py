"""Bad input to CompressedRolloutBuffer: every wrong argument, eager and under `jit`, is refused with an error of
ours naming it and leaves the buffer (device leaves and host store) exactly as it was, and usable."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compressed_bad_input import (
    BAD_SCALARS, BAD_SIZES, MODES, SETTINGS, WRONG_KEYS, assert_refused, corrupted, foreign_inputs, record, run_in, torch_tensor,
    wrong_array, wrong_tree,
)
from host_codecs import CorruptEntryError
from jaxbuffers.compressed import CompressedRolloutBuffer, StaleBufferError

E, T, H, W = 2, 4, 3, 4
EXAMPLE = {"obs": jnp.zeros((H, W), jnp.uint8), "action": jnp.int32(0)}
FIELDS = {"reward": np.float32, "value": np.float32, "terminated": np.bool_, "truncated": np.bool_, "final_value": np.float32, "trainable": np.bool_}


def _good(rng):
    step = {"obs": rng.integers(0, 256, (E, H, W), dtype=np.uint8), "action": rng.integers(0, 4, E).astype(np.int32)}
    fields = {k: (rng.random(E) < 0.3) if d is np.bool_ else rng.normal(size=E).astype(d) for k, d in FIELDS.items()}
    return step, fields


def _filled():
    buf = CompressedRolloutBuffer.create(EXAMPLE, num_envs=E, num_steps=T, codec="rle")
    rng = np.random.default_rng(0)
    for _ in range(2):
        step, fields = _good(rng)
        buf = buf.add(step, **fields)
    return buf


@pytest.fixture(scope="module")
def buf():
    b = _filled()
    yield b
    b.close()


@SETTINGS
@given(data=st.data(), arg=st.sampled_from(["step", *FIELDS]), mode=MODES, seed=st.integers(0, 2**16))
def test_add_refuses_each_wrong_argument_and_changes_nothing(buf, data, arg, mode, seed):
    """An eager add wrote the frames to the host before checking reward, value and the flags: the store's version
    moved and the caller's state could never be added to again. Every check now runs first."""
    step, fields = _good(np.random.default_rng(seed))
    if arg == "step":
        _, step = data.draw(wrong_tree(step), "step")
    else:
        # None is the documented default of the optional fields (truncated and final_value go together)
        _, fields[arg] = data.draw(wrong_array(fields[arg]).filter(lambda d: not (arg == "trainable" and d[1] is None)), arg)
    names = ("truncated", "final_value") if arg in ("truncated", "final_value") else (arg,)
    call, target = run_in(mode, buf, lambda b: b.add(step, **fields))
    assert_refused(call, names, target)


def test_a_refused_add_leaves_the_state_usable():
    """After each refused add, the same state takes the right add, and equals a buffer that never saw the
    wrong one."""
    rng = np.random.default_rng(1)
    buf, ref = _filled(), _filled()
    step, fields = _good(rng)
    wrong = {"reward": np.ones(E), "value": None, "terminated": np.zeros(E, np.int32), "final_value": [0.0, 1.0],
             "trainable": np.ones(E + 1, bool)}
    for name, value in wrong.items():
        assert_refused(lambda: buf.add(step, **{**fields, name: value}), (name,), buf)
    assert_refused(lambda: buf.add({**step, "obs": step["obs"].astype(np.float32)}, **fields), ("step",), buf)
    new, want = buf.add(step, **fields), ref.add(step, **fields)
    for x, y in zip(jax.tree.leaves(new), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    got, exp = new.gather(jnp.arange(E * T)), want.gather(jnp.arange(E * T))
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, got), jax.tree.map(np.asarray, exp))
    buf.close()
    ref.close()


def _calls():
    key = jax.random.key(0)
    return [
        ("last_value", None, lambda b, v: b.compute_gae(v, 0.9, 0.95)),
        ("gamma", BAD_SCALARS, lambda b, v: b.compute_gae(jnp.zeros(E), v, 0.95)),
        ("gae_lambda", BAD_SCALARS, lambda b, v: b.compute_gae(jnp.zeros(E), 0.9, v)),
        ("method", st.sampled_from(["fast", "SCAN", None, 1]), lambda b, v: b.compute_gae(jnp.zeros(E), 0.9, 0.95, v)),
        ("num_minibatches", BAD_SIZES | st.just(3), lambda b, v: b.minibatch_indices(key, v)),
        ("num_minibatches", BAD_SIZES | st.just(3), lambda b, v: b.minibatches(key, v)),
        ("indices", st.sampled_from([None, "0", np.zeros(3, np.float32), [0.5], {"a": 1}, np.zeros(2, bool)]), lambda b, v: b.gather(v)),
    ]


@SETTINGS
@given(data=st.data(), mode=MODES)
def test_methods_refuse_each_wrong_argument_and_change_nothing(buf, data, mode):
    calls = _calls()
    name, values, method = calls[data.draw(st.integers(0, len(calls) - 1), "call")]
    value = data.draw(values if values is not None else wrong_array(np.zeros(E, np.float32)).map(lambda d: d[1]), name)
    call, target = run_in(mode, buf, lambda b: method(b, value))
    assert_refused(call, (name,), target)


@SETTINGS
@given(indices=st.lists(st.integers(-2**31, 2**31 - 1), min_size=1, max_size=6))
def test_gather_clips_out_of_range_indices(buf, indices):
    """Documented: out-of-range indices are clipped to `[0, T * N)`, the decoded pixels with them."""
    idx = np.asarray(indices, np.int32)
    got, want = buf.gather(idx), buf.gather(np.clip(idx, 0, E * T - 1))
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, got), jax.tree.map(np.asarray, want))


def test_stale_state_refused_before_dispatch_and_the_newer_state_keeps_its_arrays():
    rng = np.random.default_rng(2)
    b0 = _filled()
    step, fields = _good(rng)
    b1 = b0.add(step, **fields)  # right after b1's add was dispatched: refused directly
    assert_refused(lambda: b0.add(step, **fields), ("add",), b0, b1, errors=(StaleBufferError,))
    stale = jax.tree.map(jnp.copy, b1)  # a state older than the next add
    step, fields = _good(rng)
    b1 = b1.add(step, **fields)  # the last row
    before = record(b1)
    with pytest.raises(jax.errors.JaxRuntimeError, match="StaleBufferError"):  # under the caller's own jit
        jax.block_until_ready(jax.jit(CompressedRolloutBuffer.add, donate_argnums=0)(stale, step, **fields))
    assert record(b1) == before
    mb = b1.compute_gae(jnp.zeros(E, jnp.float32), 0.9, 0.95).gather(jnp.arange(E * T))
    np.testing.assert_array_equal(np.asarray(mb.step["obs"][-E:]), step["obs"])  # the last row: the last add's pixels
    b1.close()


def test_states_share_no_arrays_so_donating_an_old_one_spares_the_new(buf):
    """What the guide promises: a state returned by a method holds no array of the state it came from."""
    def pointers(tree):
        return {x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)}

    b0 = jax.tree.map(jnp.copy, buf)
    for b1 in (b0.reset(), b0.compute_gae(jnp.zeros(E, jnp.float32), 0.9, 0.95), jax.jit(CompressedRolloutBuffer.reset)(b0)):
        assert not pointers(b0) & pointers(b1)


def test_calls_after_close_are_refused_before_dispatch():
    buf = _filled()
    step, fields = _good(np.random.default_rng(0))
    buf.close()
    for call in (lambda: buf.add(step, **fields), lambda: buf.gather(jnp.arange(4)), lambda: buf.minibatches(jax.random.key(0), 2),
                 buf.decode_entries):
        with pytest.raises(RuntimeError, match="after close"):
            call()


@foreign_inputs
def test_torch_tensors_and_wrong_keys_are_named(buf):
    step, fields = _good(np.random.default_rng(0))
    assert_refused(lambda: buf.add({**step, "obs": torch_tensor(step["obs"])}, **fields), ("step",), buf)
    assert_refused(lambda: buf.add(step, **{**fields, "reward": torch_tensor(fields["reward"])}), ("reward",), buf)
    for key in WRONG_KEYS:
        assert_refused(lambda: buf.minibatch_indices(key, 2), ("key",), buf)
        assert_refused(lambda: jax.jit(lambda b: b.minibatches(key, 2))(buf), ("key",), buf)


def test_eager_reads_raise_our_errors_not_jax_runtime_errors():
    """Called eagerly, a read of a state whose rows were rewritten (after `reset`) raises `StaleBufferError`, and one
    of a store whose bytes changed `CorruptEntryError`, not JAX's runtime error carrying their text."""
    b0 = _filled()
    b1, rng, first = b0.reset(), np.random.default_rng(3), None
    for _ in range(2):  # rewrites the rows b0 reads
        step, fields = _good(rng)
        b1, first = b1.add(step, **fields), step["obs"] if first is None else first
    with pytest.raises(StaleBufferError, match="rewritten"):
        b0.gather(jnp.arange(E))
    with pytest.raises(StaleBufferError, match="rewritten"):
        b0.decode_entries()
    with corrupted(b1.host):
        with pytest.raises(CorruptEntryError, match="corrupt"):
            b1.gather(jnp.arange(E))
        with pytest.raises(CorruptEntryError, match="corrupt"):
            b1.decode_entries()
        with pytest.raises(CorruptEntryError, match="corrupt"):
            b1.compute_gae(jnp.zeros(E, jnp.float32), 0.9, 0.95).minibatches(jax.random.key(0), 2)
    np.testing.assert_array_equal(np.asarray(b1.gather(jnp.arange(E)).step["obs"]), first)  # intact again
    b1.close()


def test_gather_entries_refuses_entries_not_of_this_buffer(buf):
    entries = buf.decode_entries()
    (e,) = entries
    for bad in ([], [e, e], [e[:, :-1]], [e.astype(np.int16)], [e[0]], (np.asarray(jnp.asarray(e)).tolist(),), e):
        with pytest.raises(ValueError, match=r"entries: expected numpy arrays \['\[n \+ 1, 3, 4\] uint8'\]"):
            buf.gather_entries(bad, jnp.arange(4))
    with pytest.raises(TypeError, match="indices"):
        buf.gather_entries(entries, jnp.arange(4.0))
    for call in (lambda b: b.decode_entries(), lambda b: b.gather_entries(entries, jnp.arange(4))):
        with pytest.raises(TypeError, match="called eagerly"):
            jax.jit(call)(buf)
