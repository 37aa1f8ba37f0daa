"""Tests of jaxbuffers.prioritised.PrioritisedReplayBuffer."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbuffers.prioritised import PRIORITY_MAX, PrioritisedReplayBuffer, PrioritisedSample

PRB = PrioritisedReplayBuffer
JIT = pytest.mark.parametrize("use_jit", [False, True], ids=["nojit", "jit"])
ITEM = {"id": jnp.int32(0), "v": jnp.zeros((2,), jnp.float32)}


def _batch(ids):
    ids = np.asarray(ids, np.int32)
    return {"id": jnp.asarray(ids), "v": jnp.asarray(np.stack([ids, -ids], 1).astype(np.float32))}


def _add(buf, b, p=None):
    return buf.add(b) if p is None else buf.add(b, p)


def _sample(buf, key, beta):
    return buf.sample(key, 64, beta=beta)


def _set(buf, i, p, g):
    return buf.set_priorities(i, p, g)


FNS = {
    False: {"add": _add, "sample": _sample, "set": _set},
    True: {"add": jax.jit(_add), "sample": jax.jit(_sample), "set": jax.jit(_set)},
}


def _assert_tree_valid(buf):
    """Root finite and equal to the sum of the leaves; non-valid slots are empty; min-tree agrees."""
    leaves = np.asarray(buf.tree.leaves()).astype(np.float64)
    n = int(buf.size())
    total = float(buf.tree.total())
    assert math.isfinite(total)
    assert np.all(np.isfinite(leaves))
    assert abs(total - leaves.sum()) <= 1e-6 * max(leaves.sum(), 1e-30)
    assert np.all(leaves[:n] > 0), "a valid slot has a zero leaf"
    assert np.all(leaves[n:] == 0), "an empty slot has a leaf"
    if n:
        assert float(buf.tree.min()) == np.float32(leaves[:n].min())


# ------------------------------------------------------------------------------------------------
# The issue's exact numbers


@JIT
def test_importance_weights_issue_case(use_jit):
    buf = PRB.create({"x": jnp.float32(0)}, 8, priority_exponent=1.0)
    add = jax.jit(PRB.add) if use_jit else PRB.add
    buf = add(buf, {"x": jnp.arange(3, dtype=jnp.float32)}, jnp.array([1.0, 2.0, 4.0]))
    sample = jax.jit(PRB.sample, static_argnums=2) if use_jit else PRB.sample
    out = sample(buf, jax.random.key(0), 512, beta=0.4)
    idx = np.asarray(out.indices)
    assert set(idx.tolist()) == {0, 1, 2}
    expected_p = np.array([1 / 7, 2 / 7, 4 / 7])
    expected_w = np.array([1.0, 0.757858, 0.574349])
    np.testing.assert_allclose(np.asarray(out.probabilities), expected_p[idx], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.importance_weights), expected_w[idx], rtol=1e-5)
    # The items are the ones stored at those slots.
    np.testing.assert_array_equal(np.asarray(out.item["x"]), idx.astype(np.float32))


def _chi_square_p_value(counts, expected):
    stat = float(((counts - expected) ** 2 / expected).sum())
    dof = len(counts) - 1
    try:
        from scipy.stats import chi2

        return float(chi2.sf(stat, dof)), stat
    except ImportError:  # 0.999 quantile of chi-square with 15 dof (tables): p > 0.001 iff stat < it
        assert dof == 15
        return (1.0 if stat < 37.697 else 0.0), stat


def test_sampling_frequencies_match_priorities_chi_square():
    """100k stratified draws (alpha 0.6, after wrap-around): frequencies match p^alpha / sum."""
    capacity, alpha = 16, 0.6
    buf = PRB.create({"x": jnp.float32(0)}, capacity, priority_exponent=alpha)
    rng = np.random.default_rng(0)
    # 20 adds into 16 slots: the first 4 are overwritten, so their priorities must not count.
    pri = rng.uniform(0.05, 5.0, 20).astype(np.float32)
    buf = buf.add({"x": jnp.zeros(20 - capacity)}, jnp.asarray(pri[: 20 - capacity] * 100))
    buf = buf.add({"x": jnp.zeros(capacity)}, jnp.asarray(pri[20 - capacity :]))
    keys = jax.random.split(jax.random.key(1234), 100)
    idx = jax.jit(jax.vmap(lambda k: buf.sample(k, 1000, beta=0.5).indices))(keys)
    counts = np.bincount(np.asarray(idx).ravel(), minlength=capacity).astype(np.float64)
    assert counts.sum() == 100_000
    # Item k (0-based, in add order) sits in slot k % 16; items 0..3 were overwritten.
    slot_pri = np.empty(capacity)
    for k in range(20 - capacity, 20):
        slot_pri[k % capacity] = pri[k]
    expected = slot_pri**alpha / (slot_pri**alpha).sum() * 100_000
    p_value, stat = _chi_square_p_value(counts, expected)
    assert p_value > 0.001, (stat, counts, expected)


# ------------------------------------------------------------------------------------------------
# Behaviour


@JIT
def test_new_items_get_running_max_priority(use_jit):
    f = FNS[use_jit]
    buf = PRB.create(ITEM, 8, priority_exponent=1.0)
    buf = f["add"](buf, _batch([0, 1]))
    np.testing.assert_array_equal(np.asarray(buf.tree.leaves())[:2], [1.0, 1.0])  # initial max 1
    out = f["sample"](buf, jax.random.key(0), jnp.float32(0.4))
    buf = f["set"](buf, out.indices[:1], jnp.array([5.0]), out.generations[:1])
    assert float(buf.max_priority) == 5.0
    buf = f["add"](buf, _batch([2]))
    assert float(buf.tree.get(jnp.array([2]))[0]) == 5.0
    # Explicit priorities raise the running max too.
    buf = f["add"](buf, _batch([3]), jnp.array([7.0]))
    assert float(buf.max_priority) == 7.0
    _assert_tree_valid(buf)


@JIT
def test_stale_generation_update_ignored(use_jit):
    f = FNS[use_jit]
    buf = PRB.create(ITEM, 4, priority_exponent=1.0)
    buf = f["add"](buf, _batch([0, 1, 2, 3]))
    gens = buf.generations_at(jnp.array([0, 1]))
    np.testing.assert_array_equal(np.asarray(gens), [0, 1])  # the number of the item last written
    buf = f["add"](buf, _batch([4]))  # overwrites slot 0
    assert int(buf.generations_at(jnp.array([0]))[0]) == 4
    np.testing.assert_array_equal(np.asarray(buf.generations), [4, 1, 2, 3])
    buf = f["set"](buf, jnp.array([0, 1]), jnp.array([9.0, 3.0]), gens)
    leaves = np.asarray(buf.tree.leaves())
    assert leaves[0] == 1.0  # stale: ignored
    assert leaves[1] == 3.0  # fresh: applied
    assert float(buf.max_priority) == 3.0  # the ignored 9 did not raise the max


@JIT
def test_updates_to_empty_or_out_of_range_slots_ignored(use_jit):
    f = FNS[use_jit]
    buf = f["add"](PRB.create(ITEM, 8, priority_exponent=1.0), _batch([0, 1]))
    # Slot 5 was never written (passed the generation the formula gives it), -1 and 8 are out of range.
    gens = buf.generations_at(jnp.array([5, 0, 0, 1]))
    buf = f["set"](buf, jnp.array([5, -1, 8, 1]), jnp.array([4.0, 4.0, 4.0, 2.0]), gens)
    np.testing.assert_array_equal(np.asarray(buf.tree.leaves()), [1, 2, 0, 0, 0, 0, 0, 0])
    _assert_tree_valid(buf)


@JIT
def test_duplicate_updates_last_wins(use_jit):
    f = FNS[use_jit]
    buf = f["add"](PRB.create(ITEM, 8, priority_exponent=1.0), _batch([0, 1, 2]))
    g = buf.generations_at(jnp.array([1, 2, 1, 2]))
    buf = f["set"](buf, jnp.array([1, 2, 1, 2]), jnp.array([8.0, 3.0, 0.5, 6.0]), g)
    np.testing.assert_array_equal(np.asarray(buf.tree.leaves())[:3], [1.0, 0.5, 6.0])
    # A stale later duplicate does not hide an earlier fresh one.
    g0 = buf.generations_at(jnp.array([0]))[0]
    buf = f["set"](buf, jnp.array([0, 0]), jnp.array([2.0, 9.0]), jnp.stack([g0, g0 + 7]))
    assert float(buf.tree.leaves()[0]) == 2.0


@JIT
def test_priority_policy_nan_inf_negative_zero(use_jit):
    f = FNS[use_jit]
    eps = 1e-4
    buf = PRB.create(ITEM, 8, priority_exponent=1.0, epsilon=eps)
    buf = f["add"](buf, _batch(range(6)), jnp.array([1.0, 2.0, 3.0, 1.0, 1.0, 1.0]))
    bad = jnp.array([np.nan, -3.0, 0.0, np.inf, -np.inf, 2.5], jnp.float32)
    buf = f["set"](buf, jnp.arange(6, dtype=jnp.int32), bad, buf.generations_at(jnp.arange(6)))
    leaves = np.asarray(buf.tree.leaves())
    np.testing.assert_allclose(leaves[:6], [3.0, eps, eps, PRIORITY_MAX, eps, 2.5], rtol=1e-6)
    assert float(buf.max_priority) == 3.0  # +inf is stored as the cap, and does not raise the running max
    _assert_tree_valid(buf)
    out = f["sample"](buf, jax.random.key(0), jnp.float32(1.0))
    assert np.all(np.isfinite(np.asarray(out.probabilities)))
    assert np.all(np.isfinite(np.asarray(out.importance_weights)))
    assert np.all(np.asarray(out.indices) < 6)
    # Add-time priorities follow the same policy (NaN -> current max).
    buf = f["add"](buf, _batch([6, 7]), jnp.array([np.nan, -1.0]))
    np.testing.assert_allclose(np.asarray(buf.tree.leaves())[6:], [3.0, eps], rtol=1e-6)
    _assert_tree_valid(buf)


@JIT
def test_a_corrected_inf_priority_leaves_the_running_max_at_the_finite_ones(use_jit):
    """One diverged TD error (`+inf`), corrected by the next update, leaves new items at the max of the finite
    priorities: old items keep being drawn and importance weights stay of order 1."""
    f = FNS[use_jit]
    buf = PRB.create(ITEM, 8, priority_exponent=1.0)
    buf = f["add"](buf, _batch(range(4)), jnp.array([1.0, 2.0, 3.0, 4.0]))
    g = buf.generations_at(jnp.array([0]))
    buf = f["set"](buf, jnp.array([0]), jnp.array([np.inf], jnp.float32), g)
    assert float(buf.priorities(jnp.array([0]))[0]) == np.float32(PRIORITY_MAX) and float(buf.max_priority) == 4.0
    buf = f["set"](buf, jnp.array([0]), jnp.array([0.5], jnp.float32), g)
    buf = f["add"](buf, _batch(range(4, 8)))
    np.testing.assert_allclose(np.asarray(buf.priorities(jnp.arange(8))), [0.5, 2, 3, 4, 4, 4, 4, 4], rtol=1e-6)
    out = f["sample"](buf, jax.random.key(0), jnp.float32(1.0))
    assert float(np.min(np.asarray(out.importance_weights))) > 0.05


@JIT
def test_never_samples_empty_slots(use_jit):
    f = FNS[use_jit]
    buf = PRB.create(ITEM, 1000, priority_exponent=0.6)
    buf = f["add"](buf, _batch([10, 11, 12]), jnp.array([1e-9, 0.0, 1.0]))
    for seed in range(20):
        out = f["sample"](buf, jax.random.key(seed), jnp.float32(0.4))
        idx = np.asarray(out.indices)
        assert np.all(idx < 3)
        np.testing.assert_array_equal(np.asarray(out.item["id"]), idx + 10)


@JIT
def test_empty_buffer_sample_is_defined(use_jit):
    f = FNS[use_jit]
    buf = PRB.create(ITEM, 8)
    assert not bool(buf.can_sample(1))
    out = f["sample"](buf, jax.random.key(0), jnp.float32(0.4))
    np.testing.assert_array_equal(np.asarray(out.indices), 0)
    np.testing.assert_array_equal(np.asarray(out.probabilities), 0)
    np.testing.assert_array_equal(np.asarray(out.importance_weights), 1)
    np.testing.assert_array_equal(np.asarray(out.generations), 0 - 8)  # slot - capacity: never written
    after = f["set"](buf, out.indices, jnp.full(out.indices.shape, 5.0), out.generations)
    np.testing.assert_array_equal(np.concatenate(after.tree.levels), np.concatenate(buf.tree.levels))


def test_sample_signature_is_the_uniform_one_plus_a_beta_keyword():
    """A drop-in for ReplayBuffer: sample(key, batch_size, *, beta=1.0), can_sample(batch_size, *, beta=1.0)."""
    import inspect

    from jaxbuffers import ReplayBuffer

    params = inspect.signature(PRB.sample).parameters
    assert list(params) == ["self", "key", "batch_size", "beta"]
    assert params["beta"].kind is inspect.Parameter.KEYWORD_ONLY and params["beta"].default == 1.0
    assert list(inspect.signature(PRB.can_sample).parameters) == [*inspect.signature(ReplayBuffer.can_sample).parameters, "beta"]
    buf = PRB.create(ITEM, 8).add(_batch([0, 1]), jnp.array([1.0, 3.0]))
    np.testing.assert_array_equal(buf.sample(jax.random.key(0), 4).importance_weights, buf.sample(jax.random.key(0), 4, beta=1.0).importance_weights)
    with pytest.raises(TypeError):
        buf.sample(jax.random.key(0), 4, 0.4)  # beta is a keyword


def test_alpha_zero_is_uniform_with_unit_weights():
    buf = PRB.create(ITEM, 8, priority_exponent=0.0)
    buf = buf.add(_batch([0, 1, 2, 3]), jnp.array([1.0, 100.0, 0.0, np.nan]))
    out = buf.sample(jax.random.key(0), 64, beta=0.7)
    np.testing.assert_allclose(np.asarray(out.probabilities), 0.25)
    np.testing.assert_allclose(np.asarray(out.importance_weights), 1.0)


def test_priorities_getter_roundtrip():
    buf = PRB.create(ITEM, 8, priority_exponent=0.5)
    buf = buf.add(_batch([0, 1, 2]), jnp.array([1.0, 4.0, 9.0]))
    np.testing.assert_allclose(np.asarray(buf.priorities(jnp.array([0, 1, 2, 3]))), [1, 4, 9, 0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(buf.tree.leaves())[:3], [1, 2, 3], rtol=1e-6)


def test_scan_with_donation_and_compiles_once(compile_counter):
    buf = PRB.create(ITEM, 32, priority_exponent=0.6, min_size=4)

    def step(buf, xs):
        key, ids = xs
        buf = buf.add(_batch_traced(ids))
        out = buf.sample(key, 8, beta=0.5)
        buf = buf.set_priorities(out.indices, out.item["v"][:, 0] % 5.0, out.generations)
        return buf, out.item["id"]

    @jax.jit
    def run(buf, keys, ids):
        return jax.lax.scan(step, buf, (keys, ids))

    keys = jax.random.split(jax.random.key(0), 50)
    ids = jnp.arange(150, dtype=jnp.int32).reshape(50, 3)
    buf, sampled = run(buf, keys, ids)
    assert buf.num_added() == 150
    # Everything sampled at step t was added at or before t and is still in the ring (32 slots).
    s = np.asarray(sampled)
    for t in range(50):
        assert np.all(s[t] <= 3 * t + 2) and np.all(s[t] > 3 * t + 2 - 32)
    _assert_tree_valid(buf)

    add = jax.jit(PRB.add, donate_argnums=0)
    sample = jax.jit(PRB.sample, static_argnums=2)
    buf = add(buf, _batch([1, 2]))
    sample(buf, jax.random.key(1), 8, beta=0.4)
    with compile_counter() as n:
        for k in range(3):
            before = buf.replay.storage["v"].unsafe_buffer_pointer()
            buf = add(buf, _batch([k, k + 1]))
            assert buf.replay.storage["v"].unsafe_buffer_pointer() == before  # in place when donated
            sample(buf, jax.random.key(k), 8, beta=0.4 + k / 10)
    assert n() == 0


@pytest.mark.parametrize("batch", [1, 256])
def test_donated_add_and_set_priorities_update_in_place(batch):
    """Donated jitted add / set_priorities write into the storage and the tree heap they were
    given (no copy allocated for the result)."""
    buf = PRB.create(ITEM, 100_000)
    ids = jnp.arange(batch, dtype=jnp.int32)
    add = jax.jit(lambda b, i: b.add(_batch_traced(i)), donate_argnums=0)
    update = jax.jit(lambda b, i: b.set_priorities(i, jnp.full(i.shape, 2.0), b.generations_at(i)), donate_argnums=0)
    buf = update(add(buf, ids), ids)
    for fn in (add, update, add, update):
        before = [x.unsafe_buffer_pointer() for x in (*buf.tree.levels, buf.replay.storage["v"])]
        buf = fn(buf, ids)
        assert [x.unsafe_buffer_pointer() for x in (*buf.tree.levels, buf.replay.storage["v"])] == before
    assert int(buf.size()) == 3 * batch and float(buf.max_priority) == 2.0


def test_duplicate_updates_running_max_counts_winners_only():
    """A slot updated twice in one batch: only the last (winning) priority may raise the max."""
    buf = PRB.create(ITEM, 8, priority_exponent=0.5)
    buf = buf.add(_batch([0, 1]), jnp.array([1.0, 1.0]))
    gens = buf.generations[:2]
    buf = buf.set_priorities(jnp.array([0, 0, 1]), jnp.array([9.0, 2.0, 3.0]), jnp.array([gens[0], gens[0], gens[1]]))
    assert float(buf.max_priority) == 3.0  # the overwritten 9 does not count
    np.testing.assert_allclose(np.asarray(buf.priorities(jnp.array([0, 1]))), [2.0, 3.0], rtol=1e-6)


def _batch_traced(ids):
    return {"id": ids, "v": jnp.stack([ids, -ids], 1).astype(jnp.float32)}


def test_vmap_over_stacked_buffers():
    bufs = jax.vmap(lambda _: PRB.create(ITEM, 8, priority_exponent=1.0))(jnp.arange(3))
    ids = jnp.arange(9, dtype=jnp.int32).reshape(3, 3)
    pri = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 5.0], [2.0, np.nan, 1.0]])
    bufs = jax.jit(jax.vmap(lambda b, i, p: b.add(_batch_traced(i), p)))(bufs, ids, pri)
    keys = jax.random.split(jax.random.key(0), 3)
    out = jax.jit(jax.vmap(lambda b, k: b.sample(k, 100, beta=0.4)))(bufs, keys)
    assert out.indices.shape == (3, 100)
    assert np.all(np.asarray(out.indices) < 3)
    np.testing.assert_array_equal(np.asarray(out.item["id"]), np.asarray(out.indices) + 3 * np.arange(3)[:, None])
    # Buffer 1: slot 2 holds almost all the mass.
    assert np.mean(np.asarray(out.indices[1]) == 2) > 0.9
    np.testing.assert_array_equal(np.asarray(jax.vmap(PRB.size)(bufs)), [3, 3, 3])


def test_priority_read_back_precision_is_as_documented():
    """priorities() reads p to ~6e-8 / alpha relative (the float32 leaf's rounding raised to 1/alpha;
    2.0 reads 2.000106 at alpha 1e-3)."""
    p = np.geomspace(1e-3, 1e6, 64).astype(np.float32)
    for alpha in (1.0, 0.6, 0.1, 1e-3):
        buf = PRB.create({"x": jnp.float32(0)}, 64, priority_exponent=alpha).add({"x": jnp.zeros(64)}, jnp.asarray(p))
        rel = np.abs(np.asarray(buf.priorities(jnp.arange(64)), np.float64) / p - 1)
        assert rel.max() <= 1.5 * 6e-8 / alpha + 1e-7, (alpha, rel.max())


def test_create_takes_only_its_keywords():
    with pytest.raises(TypeError, match="alpha"):
        PRB.create(ITEM, 8, alpha=0.5)
    assert PRB.create(ITEM, 8, priority_exponent=0.5, min_size=2, epsilon=1e-3).min_size == 2


def test_trace_time_errors():
    buf = PRB.create(ITEM, 8)
    with pytest.raises(ValueError, match="priority_exponent"):
        PRB.create(ITEM, 8, priority_exponent=1.5)
    with pytest.raises(ValueError, match="epsilon"):
        PRB.create(ITEM, 8, epsilon=0.0)
    with pytest.raises(TypeError, match="v"):
        buf.add({"id": jnp.zeros(2, jnp.int32), "v": jnp.zeros((2, 2), jnp.int32)})
    with pytest.raises(ValueError, match=r"priorities: expected shape \(2,\)"):
        buf.add(_batch([0, 1]), jnp.ones(3))
    with pytest.raises(TypeError, match="priorities: expected a floating"):
        buf.add(_batch([0, 1]), jnp.ones(2, jnp.int32))
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(jax.random.key(0), 0, beta=0.4)
    for bad in (None, "1"):  # named as not numbers, not reported as a 0-d array
        with pytest.raises(TypeError, match=rf"indices: expected an integer array \(int32\), got {type(bad).__name__}"):
            buf.set_priorities(bad, jnp.ones(1), jnp.zeros(1, jnp.int32))
        with pytest.raises(TypeError, match=rf"indices: expected an integer array \(int32\), got {type(bad).__name__}"):
            buf.generations_at(bad)
    with pytest.raises(ValueError, match="beta"):
        buf.sample(jax.random.key(0), 4, beta=-0.1)
    with pytest.raises(ValueError, match=r"beta: expected a scalar \(shape \(\)\), got shape \(2,\)"):
        buf.sample(jax.random.key(0), 4, beta=jnp.ones(2))
    for bad in (True, 1j, "0.4", None):
        with pytest.raises(TypeError, match="beta: expected a float >= 0 or a 0-d float array"):
            buf.sample(jax.random.key(0), 4, beta=bad)
    # an integer beta is a number: eagerly, and as the int32 tracer a Python 1 becomes under jit
    # (an annealed beta = min(1, ...) saturates at the int 1)
    want = buf.sample(jax.random.key(0), 4, beta=1.0).importance_weights
    for beta in (1, np.int64(1), jnp.int32(1)):
        np.testing.assert_array_equal(buf.sample(jax.random.key(0), 4, beta=beta).importance_weights, want)
        np.testing.assert_array_equal(jax.jit(lambda b, k, x: b.sample(k, 4, beta=x))(buf, jax.random.key(0), beta).importance_weights, want)
    with pytest.raises(ValueError, match=r"generations: expected shape \(2,\)"):
        buf.set_priorities(jnp.array([0, 1]), jnp.ones(2), jnp.ones(3, jnp.int32))
    with pytest.raises(TypeError, match="generations: expected an integer"):
        buf.set_priorities(jnp.array([0, 1]), jnp.ones(2), jnp.ones(2))
    with pytest.raises(ValueError, match="indices"):
        buf.set_priorities(jnp.zeros((2, 2), jnp.int32), jnp.ones(2), jnp.ones(2, jnp.int32))
    with pytest.raises(ValueError, match="priorities"):  # also under jit
        jax.jit(lambda b: b.add(_batch([0, 1]), jnp.ones(1)))(buf)


def test_memory_bytes_and_counts():
    buf = PRB.create(ITEM, 10)
    assert buf.memory_bytes >= 10 * 12 + 2 * 16 * 2 * 4  # items + one (sum, min) heap of 2P rows
    buf = buf.add(_batch(range(7))).add(_batch(range(5)))
    assert int(buf.size()) == 10 and bool(buf.is_full()) and buf.num_added() == 12
    assert isinstance(buf.sample(jax.random.key(0), 2, beta=0.4), PrioritisedSample)


# ------------------------------------------------------------------------------------------------
# Model-based test against a plain-Python reference


class _Model:
    """Plain-Python prioritised ring with the documented priority policy."""

    def __init__(self, capacity, alpha, eps):
        self.c, self.alpha, self.eps = capacity, alpha, eps
        self.items = [None] * capacity
        self.gen = [0] * capacity  # generation: number of the item last written to the slot
        self.count = 0
        self.pri = [0.0] * capacity
        self.head = self.n = 0
        self.max_p = 1.0

    def sanitise(self, p):
        p = float(np.float32(p))
        if math.isnan(p):
            return self.max_p
        return min(max(p, self.eps), float(np.float32(PRIORITY_MAX)))

    def add(self, ids, pri):
        ps = [self.max_p] * len(ids) if pri is None else [self.sanitise(p) for p in pri]
        for i, p in zip(ids, ps):
            s = self.head
            self.items[s], self.pri[s] = i, p
            self.gen[s] = self.count
            self.count += 1
            self.head, self.n = (s + 1) % self.c, min(self.n + 1, self.c)
        self.max_p = self.raised(ps)

    def raised(self, ps):
        """The running max after writing `ps`: a value at the cap does not raise it."""
        return max([self.max_p] + [p for p in ps if p < float(np.float32(PRIORITY_MAX))])

    def set(self, idx, pri, gens):
        written = {}  # slot -> value; later entries overwrite earlier ones
        for i, p, g in zip(idx, pri, gens):
            if 0 <= i < self.n and self.gen[i] == g:
                written[i] = self.sanitise(p)  # NaN maps to the max before this call
        for i, p in written.items():
            self.pri[i] = p
        self.max_p = self.raised(list(written.values()))

    def leaves(self):
        return np.array([self.pri[s] ** self.alpha if s < self.n else 0.0 for s in range(self.c)])


_PRIORITY = st.one_of(
    st.floats(0.0, 50.0, width=32),
    st.floats(-5.0, 0.0, width=32),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.0]),
)
_OP = st.one_of(
    st.tuples(st.just("add"), st.sampled_from([1, 3]), st.one_of(st.none(), st.lists(_PRIORITY, min_size=3, max_size=3))),
    st.tuples(st.just("sample"), st.integers(0, 2**30)),
    st.tuples(
        st.just("set"),
        st.lists(_PRIORITY, min_size=4, max_size=4),
        st.lists(st.sampled_from(["ok", "ok", "stale", "oob"]), min_size=4, max_size=4),
    ),
)


@given(
    ops=st.lists(_OP, min_size=1, max_size=15),
    alpha=st.sampled_from([0.5, 1.0]),
    use_jit=st.booleans(),
)
@settings(max_examples=30, deadline=None)
def test_model_based_against_python_reference(ops, alpha, use_jit):
    capacity, eps = 5, 1e-3
    f = FNS[use_jit]
    buf = PRB.create(ITEM, capacity, priority_exponent=alpha, epsilon=eps)
    model = _Model(capacity, alpha, eps)
    next_id, last = 0, None
    for op in ops:
        if op[0] == "add":
            _, b, pri = op
            ids = list(range(next_id, next_id + b))
            next_id += b
            p = None if pri is None else jnp.asarray(np.array(pri[:b], np.float32))
            buf = f["add"](buf, _batch(ids), p)
            model.add(ids, None if pri is None else pri[:b])
        elif op[0] == "sample":
            if model.n == 0:
                continue
            out = f["sample"](buf, jax.random.key(op[1]), jnp.float32(0.4))
            idx = np.asarray(out.indices)
            assert np.all(idx < model.n), "sampled an empty slot"
            np.testing.assert_array_equal(np.asarray(out.item["id"]), [model.items[i] for i in idx])
            np.testing.assert_array_equal(np.asarray(out.generations), [model.gen[i] for i in idx])
            leaves = model.leaves()
            np.testing.assert_allclose(np.asarray(out.probabilities), leaves[idx] / leaves.sum(), rtol=2e-5)
            w = (leaves[idx] / leaves[: model.n].min()) ** -0.4
            np.testing.assert_allclose(np.asarray(out.importance_weights), w, rtol=2e-5)
            last = out
        else:
            if last is None:
                continue
            _, pri, kinds = op
            idx = np.asarray(last.indices[:4]).copy()
            gens = np.asarray(last.generations[:4]).copy()
            for k, kind in enumerate(kinds):
                if kind == "stale":
                    gens[k] -= 1
                elif kind == "oob":
                    idx[k] = capacity + k
            p = np.array(pri, np.float32)
            buf = f["set"](buf, jnp.asarray(idx), jnp.asarray(p), jnp.asarray(gens))
            model.set(idx.tolist(), p.tolist(), gens.tolist())
        np.testing.assert_allclose(np.asarray(buf.tree.leaves()), model.leaves(), rtol=2e-6)
        assert float(buf.max_priority) == pytest.approx(model.max_p, rel=1e-6)
        assert int(buf.size()) == model.n
        _assert_tree_valid(buf)


def test_set_priorities_eager_equals_jitted():
    """Duplicates, stale, out-of-range and NaN entries: the eager call (one cached program) and
    the jitted one give the same tree and the same max, and the tree stays valid."""
    buf = PRB.create(ITEM, 64, priority_exponent=0.7)
    buf = buf.add(_batch(np.arange(40)), jnp.linspace(0.5, 2.0, 40))
    rng = np.random.default_rng(3)
    idx = jnp.asarray(rng.integers(-2, 45, 100), jnp.int32)  # duplicates, out of range, empty slots
    gens = buf.generations[jnp.clip(idx, 0, 63)]
    gens = gens.at[::7].add(1)  # some stale
    pri = jnp.asarray(rng.uniform(0, 30, 100), jnp.float32).at[5].set(jnp.nan).at[9].set(-1.0)
    eager = buf.set_priorities(idx, pri, gens)
    jitted = jax.jit(lambda b: b.set_priorities(idx, pri, gens))(buf)
    np.testing.assert_array_equal(np.concatenate(eager.tree.levels), np.concatenate(jitted.tree.levels))
    assert float(eager.max_priority) == float(jitted.max_priority) > 1.0
    _assert_tree_valid(eager)


def test_generations_wrap_with_the_item_count():
    """Generations are item numbers modulo 2**32 computed from the two-word item counter: right
    across the counter's low-word carry (2**30) and the int32 wrap (2**32), and a slot rewritten
    later gets a different generation."""
    buf = PRB.create(ITEM, 4)
    for added in (5, 2**30 - 1, 2**30 + 2, 2**32 + 1, 2**33 + 3):
        hi, lo = divmod(added, 2**30)
        b = buf.replace(replay=buf.replay.with_cursors(
            added=jnp.array([hi, lo], jnp.int32), head=added % 4, num_valid=4))
        got = np.asarray(b.generations).astype(np.int64)
        # slot i last held item k < added with k % 4 == i
        want = np.array([max(k for k in range(added - 4, added) if k % 4 == i) for i in range(4)], np.int64)
        np.testing.assert_array_equal(got % 2**32, want % 2**32)
        b2 = jax.jit(lambda b: b.add(_batch([7])))(b)  # overwrites slot added % 4
        slot = added % 4
        assert int(b2.generations_at(jnp.array([slot]))[0]) % 2**32 == added % 2**32
        assert int(b2.generations_at(jnp.array([slot]))[0]) != int(b.generations_at(jnp.array([slot]))[0])


def _same_leaf_pair(alpha):
    """Priorities `hi > lo` whose float32 leaves `p**alpha` are equal (every pair at alpha = 0)."""
    if alpha == 0:
        return 100.0, 2.0
    lo = np.float32(5.0)
    for _ in range(64):
        hi = np.nextafter(lo, np.float32(np.inf))
        if float(jnp.power(jnp.float32(hi), jnp.float32(alpha))) == float(jnp.power(jnp.float32(lo), jnp.float32(alpha))):
            return float(hi), float(lo)
        lo = hi
    raise AssertionError("no pair found")


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_losing_duplicate_does_not_raise_max(alpha):
    """Of two updates of one slot only the last raises the running max, even when the losing one
    has the same leaf p**alpha (winners are found by position, not by leaf value)."""
    hi, lo = _same_leaf_pair(alpha)
    buf = PrioritisedReplayBuffer.create({"o": jnp.zeros(())}, 4, priority_exponent=alpha).add({"o": jnp.zeros(4)})
    idx = jnp.array([1, 1])
    out = buf.set_priorities(idx, jnp.array([hi, lo], jnp.float32), buf.generations_at(idx))
    assert float(out.max_priority) == lo


def test_both_prioritised_buffers_work_with_x64_enabled():
    """jax_enable_x64 (documented as an option): node ids stay int32, sums float32."""
    from jaxbuffers import PrioritisedTrajectoryBuffer

    with jax.enable_x64(True):
        buf = PrioritisedReplayBuffer.create({"obs": jnp.zeros(4, jnp.float32)}, 512)
        buf = buf.add({"obs": jnp.ones((3, 4), jnp.float32)})
        buf = jax.jit(lambda b: b.add({"obs": jnp.ones((300, 4), jnp.float32)}))(buf)
        s = buf.sample(jax.random.key(0), 8, beta=0.4)
        buf = buf.set_priorities(s.indices, jnp.arange(1.0, 9.0, dtype=jnp.float32), s.generations)
        leaves = np.asarray(buf.tree.levels[-1][:, 0])
        np.testing.assert_allclose(float(buf.tree.total()), leaves.sum(dtype=np.float64), rtol=1e-6)
        step = {"obs": jnp.ones((2, 4), jnp.float32), "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}
        t = PrioritisedTrajectoryBuffer.create(jax.tree.map(lambda x: x[0], step), num_envs=2, length=16, window_length=2)
        for _ in range(5):
            t = t.add(step, terminated=jnp.zeros(2, bool))
        seq = t.sample_sequences(jax.random.key(1), 8, beta=0.4)
        t = t.set_priorities(seq.indices, jnp.full(8, 3.0, jnp.float32), seq.generations)
        assert float(t.tree.total()) > 0


@pytest.mark.parametrize("use_jit", [False, True])
def test_wide_out_of_range_indices_are_ignored_not_wrapped(use_jit):
    """An int64 index 2**32 + 3 (x64 enabled) or a uint32 2**31 + 3 is out of range: ignored by
    set_priorities and SumMinTree.set. A plain cast to int32 wrapped 2**32 + 3 to slot 3, which
    then took the write (its generation matched)."""
    from jaxbuffers import PrioritisedTrajectoryBuffer
    from jaxbuffers.sum_tree import SumMinTree

    maybe_jit = jax.jit if use_jit else (lambda f: f)
    with jax.enable_x64(True):
        buf = PrioritisedReplayBuffer.create({"obs": jnp.zeros(2, jnp.float32)}, 8, priority_exponent=1.0)
        buf = buf.add({"obs": jnp.ones((6, 2), jnp.float32)})
        gens = buf.generations_at(jnp.array([3, 3]))
        for idx in (jnp.array([2**32 + 3, 3 - 2**32], jnp.int64), jnp.array([2**31 + 3, 2**32 - 1], jnp.uint32)):
            out = maybe_jit(lambda b, i, g: b.set_priorities(i, jnp.array([50.0, 60.0], jnp.float32), g))(buf, idx, gens)
            np.testing.assert_array_equal(np.concatenate(out.tree.levels), np.concatenate(buf.tree.levels))
            assert float(out.max_priority) == 1.0
        # in-range int64 indices still apply
        out = buf.set_priorities(jnp.array([3], jnp.int64), jnp.array([50.0], jnp.float32), gens[:1])
        assert float(out.priorities(jnp.array([3]))[0]) == pytest.approx(50.0)

        tree = SumMinTree.create(8).set(jnp.arange(8), jnp.ones(8, jnp.float32))
        moved = maybe_jit(lambda t, i: t.set(i, jnp.full(i.shape, 9.0, jnp.float32)))(tree, jnp.array([2**32 + 3], jnp.int64))
        np.testing.assert_array_equal(np.concatenate(moved.levels), np.concatenate(tree.levels))

        step = {"obs": jnp.ones((1, 2), jnp.float32), "action": jnp.zeros(1, jnp.int32), "reward": jnp.zeros(1, jnp.float32)}
        t = PrioritisedTrajectoryBuffer.create(jax.tree.map(lambda x: x[0], step), num_envs=1, length=8, window_length=2, priority_exponent=1.0)
        for _ in range(6):
            t = t.add(step, terminated=jnp.zeros(1, bool))
        g = t.generations.reshape(-1)[jnp.array([3])]
        t2 = maybe_jit(lambda b, i: b.set_priorities(i, jnp.array([50.0], jnp.float32), g))(t, jnp.array([2**32 + 3], jnp.int64))
        np.testing.assert_array_equal(np.concatenate(t2.tree.levels), np.concatenate(t.tree.levels))
        # reads clip (documented): a huge position reads the last position, not position 3
        far = t.buffer.sequences_at(jnp.array([2**32 + 3], jnp.int64), 1)
        np.testing.assert_array_equal(np.asarray(far.indices), [7])
        assert not bool(t.buffer.valid_starts(jnp.array([2**32 + 3], jnp.int64), 2)[0])


def test_eager_calls_reuse_their_compiled_updates():
    """Called eagerly (no jit), the prioritised buffers' add and set_priorities and a tree's set
    compile once per shape: the second round of the same calls compiles nothing and gives the
    same results."""
    from jaxbuffers import PrioritisedTrajectoryBuffer
    from jaxbuffers.sum_tree import SumMinTree

    events = []
    listener = lambda name, secs, **kw: events.append(name)  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        def calls():
            buf = PrioritisedReplayBuffer.create({"obs": jnp.zeros(4)}, 100).add({"obs": jnp.ones((5, 4))})
            s = buf.sample(jax.random.key(0), 4, beta=0.4)
            buf = buf.set_priorities(s.indices, jnp.full(4, 2.0), s.generations).add({"obs": jnp.ones((3, 4))})
            step = {"obs": jnp.ones((2, 3)), "action": jnp.zeros(2), "reward": jnp.zeros(2)}
            t = PrioritisedTrajectoryBuffer.create(jax.tree.map(lambda x: x[0], step), num_envs=2, length=16, window_length=2)
            for _ in range(3):
                t = t.add(step, terminated=jnp.zeros(2, bool))
            seq = t.sample_sequences(jax.random.key(1), 4, beta=0.4)
            t = t.set_priorities(seq.indices, jnp.full(4, 3.0), seq.generations)
            tree = SumMinTree.create(64).set(jnp.arange(6), jnp.ones(6))
            return jax.block_until_ready((buf, t, tree))

        first = calls()
        events.clear()
        second = calls()
        compiles = [e for e in events if "compile" in e]
        assert not compiles, compiles[:5]
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    for u, v in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_priorities_read_zero_outside_the_buffer_and_generations_at_checks_its_indices():
    """Negative indices used to read slot 0's priority (the tree clamps), past-the-end ones 0;
    generations_at took float indices. Now both read 0 and float indices raise."""
    buf = PrioritisedReplayBuffer.create({"o": jnp.zeros(())}, 16, priority_exponent=0.5)
    buf = buf.add({"o": jnp.zeros(10)}, jnp.arange(1.0, 11.0))
    got = np.asarray(buf.priorities(jnp.array([-1, -5, 0, 9, 10, 16, 1000])))
    np.testing.assert_allclose(got, [0, 0, 1, 10, 0, 0, 0], rtol=1e-6)
    assert buf.priorities(jnp.array([[0, 1], [2, 3]])).shape == (2, 2)
    assert buf.generations_at(jnp.array([[0, 1], [2, 3]])).shape == (2, 2)
    for bad in (buf.priorities, buf.generations_at):
        with pytest.raises(TypeError, match="indices: expected an integer dtype"):
            bad(jnp.array([1.0]))


def test_numpy_int64_indices_saturate_with_x64_off():
    """With x64 off, jnp.asarray narrows a numpy int64 2**32 + 3 to 3; the buffers saturate numpy
    input before JAX converts it (eager calls)."""
    from jaxbuffers import PrioritisedTrajectoryBuffer, TrajectoryBuffer
    from jaxbuffers.sum_tree import SumMinTree

    assert not jax.config.jax_enable_x64
    buf = PrioritisedReplayBuffer.create({"obs": jnp.zeros(2, jnp.float32)}, 8, priority_exponent=1.0)
    buf = buf.add({"obs": jnp.ones((8, 2), jnp.float32)})
    gens = buf.generations_at(jnp.array([3]))
    for idx in (np.array([2**32 + 3]), np.array([2**32 + 3], np.uint64), [2**32 + 3]):
        idx = np.asarray(idx)
        out = buf.set_priorities(idx, jnp.array([100.0]), gens)
        np.testing.assert_array_equal(np.concatenate(out.tree.levels), np.concatenate(buf.tree.levels))
        assert float(buf.priorities(idx)[0]) == 0.0
    tree = SumMinTree.create(8).set(jnp.arange(8), jnp.ones(8, jnp.float32))
    np.testing.assert_array_equal(np.concatenate(tree.set(np.array([2**32 + 3]), np.array([9.0], np.float32)).levels), np.concatenate(tree.levels))

    step = {"obs": jnp.ones((3, 2), jnp.float32), "action": jnp.zeros(3, jnp.int32), "reward": jnp.zeros(3, jnp.float32)}
    t = TrajectoryBuffer.create(jax.tree.map(lambda x: x[0], step), num_envs=3, length=100)
    for _ in range(10):
        t = t.add(step, terminated=jnp.zeros(3, bool))
    far = np.array([2**32 + 3, -(2**31) - 1, 2**31])
    np.testing.assert_array_equal(np.asarray(t.sequences_at(far, 1).indices), [299, 0, 299])
    assert not np.asarray(t.valid_starts(far, 2)).any()
    # a narrow dtype whose range is below num_envs * length: 100 is a valid position (lane 1, slot 0)
    np.testing.assert_array_equal(np.asarray(t.valid_starts(jnp.array([0, 5, 100], jnp.uint8), 2)), [True, True, True])
    p = PrioritisedTrajectoryBuffer.create(jax.tree.map(lambda x: x[0], step), num_envs=3, length=16, window_length=2, priority_exponent=1.0)
    for _ in range(5):
        p = p.add(step, terminated=jnp.zeros(3, bool))
    g = p.generations_at(jnp.array([3]))
    p2 = p.set_priorities(np.array([2**32 + 3]), jnp.array([50.0]), g)
    np.testing.assert_array_equal(np.concatenate(p2.tree.levels), np.concatenate(p.tree.levels))


def test_python_ints_beyond_64_bits_are_out_of_range_indices():
    """Python ints past the 64-bit range (numpy holds them as objects) were rejected with
    "expected an integer dtype, got object"; they are indices out of range like any other:
    ignored by writes, read as 0 by priorities, clipped by sequence reads."""
    from jaxbuffers import TrajectoryBuffer
    from jaxbuffers._validate import index_array

    got = index_array([2**70, -(2**70), 3])
    assert got.dtype == np.int64 and got.tolist() == [2**63 - 1, -(2**63), 3]
    assert index_array([[2**64], [1]]).shape == (2, 1)
    assert index_array([True, False]).dtype == np.bool_  # bools are not ints here
    buf = PrioritisedReplayBuffer.create({"obs": jnp.zeros(2, jnp.float32)}, 8, priority_exponent=1.0)
    buf = buf.add({"obs": jnp.ones((8, 2), jnp.float32)})
    np.testing.assert_array_equal(np.asarray(buf.priorities([2**70, -(2**70), 2])), [0.0, 0.0, 1.0])
    out = buf.set_priorities([2**70, -(2**64)], [100.0, 100.0], [0, 0])
    np.testing.assert_array_equal(np.concatenate(out.tree.levels), np.concatenate(buf.tree.levels))
    with pytest.raises(TypeError, match=r"indices: expected an integer array \(int32\), got list"):
        buf.priorities([2**70, 1.5])
    # generations compare modulo 2**32, so clipping would change them: still rejected
    with pytest.raises(TypeError, match="generations: expected an integer"):
        buf.set_priorities([0], [5.0], [2**70])
    step = {"obs": jnp.ones((2, 2), jnp.float32), "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}
    t = TrajectoryBuffer.create(jax.tree.map(lambda x: x[0], step), num_envs=2, length=10)
    t = t.add(step, terminated=jnp.zeros(2, bool))
    assert not np.asarray(t.valid_starts([2**80], 1)).any()


def test_index_lists_with_traced_entries_and_disable_jit():
    """Index lists built inside jit ([i, 1] with a traced i) are accepted wherever arrays are, and
    every prioritised operation also runs under jax.disable_jit()."""
    from jaxbuffers import RolloutBuffer
    from jaxbuffers.sum_tree import SumMinTree

    buf = PrioritisedReplayBuffer.create({"obs": jnp.zeros(2, jnp.float32)}, 8, priority_exponent=1.0)
    buf = buf.add({"obs": jnp.ones((5, 2), jnp.float32)}, jnp.arange(1.0, 6.0))
    got = jax.jit(lambda b, i: b.priorities([i, 1]))(buf, jnp.int32(2))
    np.testing.assert_allclose(np.asarray(got), [3.0, 2.0])
    got = jax.jit(lambda b, i: b.generations_at([i, 1]))(buf, jnp.int32(2))
    np.testing.assert_array_equal(np.asarray(got), [2, 1])
    tree = jax.jit(lambda i: SumMinTree.create(4).set([i, 1], jnp.array([2.0, 3.0])))(jnp.int32(0))
    assert float(tree.total()) == 5.0
    out = buf.set_priorities([1, 2], [7.0, 8.0], buf.generations_at(jnp.array([1, 2])))  # lists, eager
    np.testing.assert_allclose(np.asarray(out.priorities(jnp.array([1, 2]))), [7.0, 8.0])
    rb = RolloutBuffer.create({"obs": jnp.zeros(2)}, num_steps=4, num_envs=2)
    got = jax.jit(lambda r, i: r.gather([i, 2]).index)(rb, jnp.int32(1))
    np.testing.assert_array_equal(np.asarray(got), [1, 2])

    with jax.disable_jit():
        b = PrioritisedReplayBuffer.create({"obs": jnp.zeros(2, jnp.float32)}, 8).add({"obs": jnp.ones((3, 2), jnp.float32)})
        s = b.sample(jax.random.key(0), 4, beta=0.4)
        b = b.set_priorities(s.indices, jnp.full(4, 2.0), s.generations)
        assert float(b.tree.total()) > 0
        assert float(SumMinTree.create(16).set(jnp.arange(3), jnp.ones(3)).total()) == 3.0


def test_weights_never_exceed_one_when_sampled_leaves_equal_the_minimum():
    """A leaf equal to the minimum has weight exactly 1: XLA may divide by the minimum as a
    product with its reciprocal (0.99999994 here), which gave weights of 1.0000001 before the
    ratio was clamped."""
    buf = PRB.create({"x": jnp.float32(0)}, 4).add({"x": jnp.arange(2.0)}, priorities=jnp.array([-1.0, 0.0]))
    for f in (lambda b: b.sample(jax.random.key(0), 4, beta=1.0), jax.jit(lambda b: b.sample(jax.random.key(0), 4, beta=1.0))):
        np.testing.assert_array_equal(np.asarray(f(buf).importance_weights), np.ones(4, np.float32))
    rng = np.random.default_rng(3)
    buf = PRB.create({"x": jnp.float32(0)}, 64, priority_exponent=0.7).add({"x": jnp.arange(64.0)}, priorities=jnp.asarray(rng.gamma(0.5, size=64), jnp.float32))
    w = np.asarray(jax.jit(lambda b, k: b.sample(k, 512, beta=1.0))(buf, jax.random.key(1)).importance_weights)
    assert w.max() <= 1.0 and w.min() > 0


def drop_in_differences(uniform: type, prioritised: type) -> set[tuple[str, str, str]]:
    """`(member, parameter, what)` for every way `prioritised` may refuse a call written for `uniform`: a public
    method, property or field (state array or static) missing; a parameter missing, of another kind or position; a
    default changed; an added parameter without a default."""
    import dataclasses
    import inspect

    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    fields = [f.name for f in dataclasses.fields(uniform) if not f.name.startswith("_")]
    out = set()
    for name in sorted({n for n in dir(uniform) if not n.startswith("_")} | set(fields)):
        if not hasattr(prioritised, name):
            out.add((name, "", "missing"))
            continue
        u, p = inspect.getattr_static(uniform, name, None), inspect.getattr_static(prioritised, name)
        if u is None or isinstance(u, property) or not callable(getattr(uniform, name)):
            continue
        su, sp = inspect.signature(getattr(uniform, name)).parameters, inspect.signature(getattr(prioritised, name)).parameters
        order_u, order_p = [n for n, x in su.items() if x.kind in positional], [n for n, x in sp.items() if x.kind in positional]
        for arg, x in su.items():
            y = sp.get(arg)
            if y is None or y.kind is not x.kind:
                out.add((name, arg, "missing" if y is None else "kind"))
            elif x.kind in positional and order_u.index(arg) != order_p.index(arg):
                out.add((name, arg, "position"))
            elif x.default is not x.empty and y.default != x.default:
                out.add((name, arg, f"default {y.default!r} for {x.default!r}"))
        for arg, y in sp.items():
            if arg not in su and y.default is y.empty and y.kind not in (y.VAR_POSITIONAL, y.VAR_KEYWORD):
                out.add((name, arg, "required"))
    return out


def test_a_drop_in_for_the_replay_buffer():
    """Every public method, property and static field of ReplayBuffer, with parameters that take its calls (get and
    with_cursors were missing)."""
    from jaxbuffers import ReplayBuffer

    assert drop_in_differences(ReplayBuffer, PRB) == set()
    buf = PRB.create(ITEM, 8).add(_batch([0, 1, 2]), jnp.array([1.0, 2.0, 3.0]))
    jax.tree.map(np.testing.assert_array_equal, buf.get(jnp.arange(8)), buf.replay.get(jnp.arange(8)))


def assert_reads_as_the_wrapped(buf, inner: str) -> None:
    """Every public field and property of the wrapped buffer `getattr(buf, inner)` reads the same on `buf` (arrays
    equal, same dtypes), but `memory_bytes` (it counts the priorities too)."""
    import dataclasses

    wrapped = getattr(buf, inner)
    cls = type(wrapped)
    names = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    names |= {n for n in dir(cls) if not n.startswith("_") and isinstance(getattr(cls, n), property)}
    for name in sorted(names - {"memory_bytes"}):
        got, want = getattr(buf, name), getattr(wrapped, name)
        assert jax.tree.structure(got) == jax.tree.structure(want), name
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert getattr(g, "dtype", None) == getattr(w, "dtype", None), name
            np.testing.assert_array_equal(np.asarray(g) if hasattr(g, "dtype") else g, w, err_msg=name)


def test_reads_the_state_fields_of_the_replay_buffer():
    """`storage`, `head`, `num_valid`, `added` and `metrics` (and every other public field and property of
    ReplayBuffer) read the wrapped buffer's, read-only."""
    buf = PRB.create(ITEM, 4).add(_batch([0, 1, 2])).add(_batch([3, 4]))
    buf = buf.record(buf.sample(jax.random.key(0), 3))
    assert_reads_as_the_wrapped(buf, "replay")
    np.testing.assert_array_equal(buf.storage["id"], [4, 1, 2, 3])
    assert int(buf.head) == 1 and int(buf.num_valid) == 4 and buf.num_added() == 5
    with pytest.raises(AttributeError):
        buf.head = jnp.int32(0)


@pytest.mark.parametrize("cursors", [dict(num_valid=8), dict(head=1, num_valid=2), dict(head=0, num_valid=0)])
def test_with_cursors_keeps_the_tree_on_the_stored_slots(cursors):
    """After with_cursors the positive leaves are exactly the stored slots: a slot kept keeps its priority, a slot
    now stored gets the running max, one no longer stored reads 0 and refuses set_priorities."""
    buf = PRB.create(ITEM, 8, priority_exponent=1.0).add(_batch([0, 1, 2]), jnp.array([1.0, 2.0, 3.0]))
    new = buf.with_cursors(**cursors)
    replay = buf.replay.with_cursors(**cursors)
    slots = jnp.arange(8, dtype=jnp.int32)
    stored = np.zeros(8, bool)
    for k in range(int(replay.num_valid)):
        stored[(int(replay.head) - 1 - k) % 8] = True
    before, after = np.asarray(buf.priorities(slots)), np.asarray(new.priorities(slots))
    np.testing.assert_array_equal(after > 0, stored)
    np.testing.assert_array_equal(after[stored], np.where(before > 0, before, 3.0)[stored])
    assert float(new.tree.total()) == pytest.approx(after.sum())
    gens = new.generations_at(slots)
    np.testing.assert_array_equal(np.asarray(new.set_priorities(slots, jnp.full(8, 5.0), gens).priorities(slots)), np.where(stored, 5.0, 0))


def test_can_sample_takes_the_samplers_beta():
    """beta= is taken (it raised TypeError) and checked as sample checks it."""
    buf = PRB.create(ITEM, 8)
    assert not bool(buf.can_sample(2, beta=0.5))
    buf = buf.add(_batch([0]))
    assert bool(buf.can_sample(2, beta=0.5))
    for call in (lambda: buf.can_sample(2, beta=-1.0), lambda: buf.sample(jax.random.key(0), 2, beta=-1.0)):
        with pytest.raises(ValueError, match="beta"):
            call()


@JIT
def test_a_list_of_python_ints_is_taken_as_float32_priorities(use_jit):
    """A list or tuple of Python numbers has no dtype: ints there are priorities like floats (they were refused as
    int64 / int32); integer arrays, numpy integers and bools stay refused."""
    buf = PRB.create(ITEM, 4, priority_exponent=1.0).add(_batch([0, 1]))
    set_p = jax.jit(PRB.set_priorities) if use_jit else PRB.set_priorities
    slots = jnp.arange(4, dtype=jnp.int32)
    for given in ([1, 2], (1, 2.5)):
        got = set_p(buf, [0, 1], given, [0, 1]).priorities(slots)
        np.testing.assert_array_equal(np.asarray(got), [given[0], given[1], 0, 0])
    np.testing.assert_array_equal(np.asarray(buf.add(_batch([2]), [3]).priorities(slots)), [1, 1, 3, 0])
    for bad in (np.array([1, 2]), jnp.array([1, 2]), [True, False], [np.int64(1), 2]):
        with pytest.raises(TypeError, match="priorities"):
            set_p(buf, [0, 1], bad, [0, 1])


def test_a_traced_negative_beta_counts_as_zero():
    """A traced beta cannot be range-checked; a negative one gave weights above 1 (documented in [0, 1])."""
    buf = PRB.create(ITEM, 8, priority_exponent=1.0).add(_batch([0, 1, 2]), jnp.array([1.0, 4.0, 16.0]))
    sample = jax.jit(lambda b, beta: b.sample(jax.random.key(1), 64, beta=beta))
    w = np.asarray(sample(buf, -1.0).importance_weights)
    np.testing.assert_array_equal(w, np.asarray(sample(buf, 0.0).importance_weights))
    assert (w == 1).all()
    assert 0 < np.asarray(sample(buf, 0.5).importance_weights).min() < 1  # a positive traced beta still weighs
