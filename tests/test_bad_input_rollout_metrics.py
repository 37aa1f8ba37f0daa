"""Bad input to `rollout_stats`: refused with an error naming the argument, eagerly and under jit, the rollout
unchanged; the accepted forms of `draws` (any integer dtype, lists, a minibatch, None) give exactly the counts of
the same indices as int32, and traced indices outside `[0, T * N)` are not counted."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS, huge_indices, non_arrays, refused, snapshot

N, T = 2, 4
BUF = jb.RolloutBuffer.create({"obs": jnp.zeros((3,), jnp.float32)}, num_envs=N, num_steps=T)
for _t in range(3):
    BUF = BUF.add({"obs": np.full((N, 3), _t, np.float32)}, reward=np.arange(N, dtype=np.float32) + _t,
                  value=np.zeros(N, np.float32), terminated=np.array([False, _t == 1]))
BUF = BUF.compute_gae(np.ones(N, np.float32), 0.9, 0.8)
STATS = jax.jit(jb.rollout_stats)


def counts(ints) -> np.ndarray:
    """draw_count of flat indices by a Python loop: those outside [0, T * N) are not counted."""
    out = np.zeros(T * N, np.int32)
    for i in ints:
        if 0 <= i < T * N:
            out[i] += 1
    return out.reshape(T, N)


@SETTINGS
@given(buf=non_arrays() | st.sampled_from([jb.RolloutBuffer, BUF.reward, jb.ReplayBuffer.create({"x": jnp.zeros(())}, capacity=2)]))
def test_bad_buffer(buf):
    refused(lambda: jb.rollout_stats(buf, [0]), "buf")


STACKED = jax.vmap(lambda r: BUF.replace(reward=BUF.reward + r))(jnp.arange(2, dtype=jnp.float32))


def test_stacked_buffer_refused_and_mapped():
    """A stacked (vmapped) rollout is refused naming `buf` (it reached JAX's broadcasting error); mapped over with
    `jax.vmap`, each member's statistics are those of that member alone."""
    refused(lambda: jb.rollout_stats(STACKED, [0]), "buf", state=STACKED, exc=(ValueError,))
    mapped = jax.vmap(jb.rollout_stats)(STACKED, jnp.zeros((2, 1), jnp.int32))
    for i in range(2):
        member = jax.tree.map(lambda x: x[i], STACKED)
        assert snapshot(jax.tree.map(lambda x: x[i], mapped)) == snapshot(jb.rollout_stats(member, [0]))


@SETTINGS
@given(draws=non_arrays(host_vector=True).filter(lambda v: v is not None and type(v) is not int)
       | st.sampled_from([np.ones(2, np.float32), np.ones(2, np.bool_), jnp.ones(3, jnp.float32), False, 1.0]))
def test_non_integer_draws(draws):
    refused(lambda: jb.rollout_stats(BUF, draws), "draws", state=BUF)
    if isinstance(draws, (np.ndarray, jax.Array)) and draws.dtype != object and draws.dtype.kind in "fb":
        refused(lambda: STATS(BUF, draws), "draws", state=BUF)


@SETTINGS
@given(idx=huge_indices())
@example(idx=([0, 2**63], [0, 2**63]))
@example(idx=([T * N - 1, -1], [T * N - 1, -1]))
def test_out_of_range_draws(idx):
    """Concrete: refused naming `draws` when any index is outside [0, T * N); otherwise the counts of the same
    indices as int32, in every accepted form."""
    value, ints = idx
    if all(0 <= i < T * N for i in ints):
        np.testing.assert_array_equal(jb.rollout_stats(BUF, value).draw_count, counts(ints))
        assert snapshot(jb.rollout_stats(BUF, value)) == snapshot(jb.rollout_stats(BUF, np.array(ints, np.int32)))
    else:
        err = refused(lambda: jb.rollout_stats(BUF, value), "draws", state=BUF, exc=(ValueError,))
        assert f"[0, {T * N})" in str(err)


@SETTINGS
@given(ints=st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(-3, T * N + 2), min_size=5, max_size=5))
@example(ints=[-1, -1, -2, T * N, 0])  # negatives do not wrap to the last steps under jit
def test_traced_out_of_range_draws_are_not_counted(ints):
    s = STATS(BUF, jnp.array(ints, jnp.int32))
    np.testing.assert_array_equal(s.draw_count, counts(ints))
    assert int(s.wasted_draws) + int(np.sum(np.where(BUF.learn_mask(), s.draw_count, 0))) == counts(ints).sum()


def test_accepted_forms_give_the_same_stats():
    """None and an empty int64 array agree, eagerly and under jit; an `[E, M, B]` array of indices, the same as a
    list, a uint8 array or under jit give the same bytes; a minibatch counts its `index`."""
    empty = snapshot(jb.rollout_stats(BUF))
    assert snapshot(jb.rollout_stats(BUF, np.zeros((0,), np.int64))) == empty == snapshot(STATS(BUF, None))
    idx = np.stack([np.random.default_rng(e).permutation(T * N).reshape(2, -1) for e in range(3)]).astype(np.int32)
    want = snapshot(jb.rollout_stats(BUF, idx))
    assert np.all(np.asarray(jb.rollout_stats(BUF, idx).draw_count) == 3)
    for form in (np.asarray(idx).tolist(), np.asarray(idx, np.uint8), STATS(BUF, idx)):
        got = form if isinstance(form, jb.RolloutStats) else jb.rollout_stats(BUF, form)
        assert snapshot(got) == want
    mb = BUF.gather(idx[0])
    assert snapshot(jb.rollout_stats(BUF, mb)) == snapshot(jb.rollout_stats(BUF, idx[0]))
