"""Tests of jaxbuffers.sum_tree: SumMinTree layout, batched updates, prefix-sum search, sampling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbuffers import sum_tree as sum_tree_module
from jaxbuffers.sum_tree import SumMinTree, last_write_mask

JIT = pytest.mark.parametrize("use_jit", [False, True], ids=["nojit", "jit"])


def maybe_jit(fn, use_jit, **kw):
    return jax.jit(fn, **kw) if use_jit else fn


def _set_fn(t, i, v, w):
    return t.set(i, v, where=w)


def _find_fn(t, q):
    return t.find(q)


_SET = {False: _set_fn, True: jax.jit(_set_fn)}  # one jit object: compiled once per shape
_FIND = {False: _find_fn, True: jax.jit(_find_fn)}


def _set(tree, idx, val, use_jit, where=None):
    idx = jnp.asarray(idx, jnp.int32)
    where = jnp.ones(idx.shape, bool) if where is None else jnp.asarray(where)
    return _SET[use_jit](tree, idx, jnp.asarray(val, jnp.float32), where)


def _find(tree, q, use_jit):
    return np.asarray(_FIND[use_jit](tree, jnp.asarray(q, jnp.float32)))


def _check_invariant(tree):
    """Every internal node equals op(children) exactly, per column; padding leaves hold the
    identity; a leaf's min is its value if positive, else +inf."""
    levels = [np.asarray(x) for x in tree.levels]
    assert [len(x) for x in levels] == [2**l for l in range(tree.depth + 1)]
    cols = [(np.add, 0.0, [l[:, 0] for l in levels]), (np.minimum, np.inf, [l[:, 1] for l in levels])]
    leaf = levels[-1][: tree.capacity]
    np.testing.assert_array_equal(leaf[:, 1], np.where(leaf[:, 0] > 0, leaf[:, 0], np.inf))
    for op, ident, lv in cols:
        for l in range(tree.depth):
            np.testing.assert_array_equal(lv[l], op(lv[l + 1][0::2], lv[l + 1][1::2]), f"level {l}")
        assert np.all(lv[-1][tree.capacity :] == ident), "a padding leaf was written"


# ------------------------------------------------------------------------------------------------
# The issue's exact case


@JIT
def test_find_issue_case(use_jit):
    tree = _set(SumMinTree.create(8), [0, 1, 2], [0.5, 1.5, 2.0], use_jit)
    assert float(tree.total()) == 4.0
    queries = [0, 0.49, 0.5, 1.99, 2.0, 3.99, np.nextafter(np.float32(4.0), np.float32(0))]
    assert _find(tree, queries, use_jit).tolist() == [0, 0, 1, 1, 2, 2, 2]


@JIT
def test_find_out_of_range_queries_clamped_and_never_empty(use_jit):
    tree = _set(SumMinTree.create(8), [0, 1, 2], [0.5, 1.5, 2.0], use_jit)
    # At/above the total, negative, NaN, inf: clamped into [0, total).
    got = _find(tree, [4.0, 4.5, 1e30, np.inf, -1.0, -np.inf, np.nan], use_jit)
    assert got.tolist() == [2, 2, 2, 2, 0, 0, 0]


@JIT
def test_find_skips_zero_weight_regions(use_jit):
    # Zeros at the start, in the middle and at the end (incl. padding: capacity 6 -> P = 8).
    tree = _set(SumMinTree.create(6), [0, 1, 2, 3, 4, 5], [0.0, 1.0, 0.0, 0.0, 2.0, 0.0], use_jit)
    q = np.linspace(-1, 4, 501, dtype=np.float32)
    got = _find(tree, q, use_jit)
    assert set(got.tolist()) == {1, 4}
    np.testing.assert_array_equal(got, np.where(q < 1.0, 1, 4))


@JIT
def test_find_with_inconsistent_query_falls_back_to_positive_leaf(use_jit):
    # A query that, after subtracting a left sum, exceeds the right subtree (as rounding can
    # produce) must still end on a positive leaf: the last positive leaf here.
    tree = _set(SumMinTree.create(4), [0, 1], [1.0, 1e-3], use_jit)
    assert _find(tree, [1.0009, 1.001, 5.0], use_jit).tolist() == [1, 1, 1]


@JIT
def test_empty_tree_returns_leaf_zero(use_jit):
    tree = SumMinTree.create(5)
    assert float(tree.total()) == 0.0
    assert _find(tree, [0.0, 1.0], use_jit).tolist() == [0, 0]
    key = jax.random.key(0)
    idx = maybe_jit(lambda t, k: t.sample_stratified(k, 4), use_jit)(tree, key)
    assert np.asarray(idx).tolist() == [0, 0, 0, 0]


def test_capacity_one():
    tree = SumMinTree.create(1).set(jnp.array([0]), jnp.array([3.0]))
    assert tree.depth == 0 and float(tree.total()) == 3.0
    assert tree.find(jnp.array([0.0, 2.9, 7.0])).tolist() == [0, 0, 0]


# ------------------------------------------------------------------------------------------------
# Updates


@JIT
def test_duplicate_indices_last_write_wins(use_jit):
    tree = _set(SumMinTree.create(8), [3, 1, 3, 1, 3], [1.0, 2.0, 5.0, 7.0, 0.25], use_jit)
    leaves = np.asarray(tree.leaves())
    assert leaves[3] == 0.25 and leaves[1] == 7.0
    assert float(tree.total()) == 7.25
    _check_invariant(tree)


_SET_BOTH = jax.jit(lambda t, i, v, w: (t.set(i, v, where=w), t.set(i, v, where=w, distinct=True)))
_FULL = {c: SumMinTree.create(c).set(jnp.arange(c), jnp.ones(c)) for c in (5, 1000)}


@given(
    capacity=st.sampled_from([5, 1000]),
    idx=st.lists(st.integers(-2, 1001), min_size=12, max_size=12, unique=True),
    val=st.lists(st.sampled_from([np.nan, -1.0, 0.0, 0.5, 2.0, np.inf]), min_size=12, max_size=12),
    where=st.lists(st.booleans(), min_size=12, max_size=12),
)
@settings(max_examples=20, deadline=None)
def test_distinct_set_equals_the_sorted_set(capacity, idx, val, where):
    """With distinct indices (inactive, out-of-range and NaN entries among them), `distinct=True` skips the last-write
    sort and gives bit for bit the tree the default update gives."""
    want, got = _SET_BOTH(_FULL[capacity], np.array(idx, np.int32), np.array(val, np.float32), np.array(where))
    for a, b in zip(got.levels, want.levels):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _check_invariant(got)


_RUN = jax.jit(lambda t, s, v: (t.set_run(s, v), t.set((s + jnp.arange(v.shape[0])) % t.capacity, v, distinct=True)))


@given(
    capacity=st.sampled_from([1, 3, 8, 1000]),
    runs=st.lists(
        st.tuples(st.integers(-3000, 3000), st.sampled_from([1, 2, 7, 1000]),
                  st.lists(st.sampled_from([np.nan, -1.0, 0.0, 0.5, 2.0, np.inf]), min_size=1000, max_size=1000)),
        min_size=1, max_size=3),
)
@settings(max_examples=25, deadline=None)
def test_set_run_equals_set_of_the_ring_slots(capacity, runs):
    """A ring run (wrapping past the capacity or not, as long as the capacity, from any start) gives bit for bit the
    tree `set` gives for its slots, with the same policy for NaN, negative and infinite values."""
    got = want = _FULL[capacity] if capacity in _FULL else SumMinTree.create(capacity)
    for start, b, val in runs:
        b = min(b, capacity)
        got = _RUN(got, start, np.array(val[:b], np.float32))[0]
        want = _RUN(want, start, np.array(val[:b], np.float32))[1]
        for x, y in zip(got.levels, want.levels):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    _check_invariant(got)


def test_distinct_set_with_duplicates_stays_consistent():
    """A broken promise of `distinct` leaves one of the duplicates' values and a consistent tree."""
    tree = SumMinTree.create(8).set(jnp.array([3, 1, 3]), jnp.array([1.0, 2.0, 5.0]), distinct=True)
    assert float(tree.leaves()[3]) in (1.0, 5.0) and float(tree.leaves()[1]) == 2.0
    _check_invariant(tree)


@JIT
def test_where_mask_and_out_of_range_indices_ignored(use_jit):
    fn = maybe_jit(lambda t, i, v, w: t.set(i, v, where=w), use_jit)
    tree = SumMinTree.create(5)  # P = 8: leaves 5..7 are padding
    idx = jnp.array([2, 2, 5, 7, -1, 4], jnp.int32)
    val = jnp.array([1.0, 9.0, 3.0, 3.0, 3.0, 2.0], jnp.float32)
    # The masked-out later write to slot 2 must not hide the earlier active one.
    tree = fn(tree, idx, val, jnp.array([True, False, True, True, True, True]))
    np.testing.assert_array_equal(np.asarray(tree.leaves()), [0, 0, 1.0, 0, 2.0])
    assert float(tree.total()) == 3.0
    _check_invariant(tree)


_LAST_WRITE_MASK = jax.jit(last_write_mask, static_argnums=2)  # one program per length and bound, not one per op


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 1000), st.booleans()), min_size=1, max_size=40))
@settings(max_examples=40, deadline=None)
def test_last_write_mask_matches_python(entries):
    # Padded to a length from a fixed set with masked-out entries (not writes: their mask is False
    # and they change no other entry's), so the program compiles once per length, not per example.
    n = next(n for n in (1, 2, 5, 13, 40) if n >= len(entries))
    entries = entries + [(0, 0, False)] * (n - len(entries))
    idx = np.array([e[0] for e in entries], np.int32)
    where = np.array([e[2] for e in entries])
    expected = np.zeros(len(entries), bool)
    last = {}
    for k, (i, _, w) in enumerate(entries):
        if w:
            last[i] = k
    expected[list(last.values())] = True
    # without a bound (a stable sort of the indices) and with one (a sort of packed int32 keys)
    for bound in (None, 10):
        got = np.asarray(_LAST_WRITE_MASK(jnp.asarray(idx), jnp.asarray(where), bound))
        np.testing.assert_array_equal(got, expected, f"bound={bound}")


@given(
    capacity=st.sampled_from([1, 5, 8, 13, 40]),
    batches=st.lists(
        st.lists(st.tuples(st.integers(-2, 45), st.integers(0, 16)), min_size=1, max_size=12),
        min_size=1,
        max_size=6,
    ),
    use_jit=st.booleans(),
)
@settings(max_examples=40, deadline=None)
def test_set_matches_python_dict(capacity, batches, use_jit):
    tree = SumMinTree.create(capacity)
    ref = np.zeros(capacity)
    for batch in batches:
        # Padded to 12 entries (masked out) so jit compiles once per capacity.
        n = len(batch)
        idx = np.array([b[0] for b in batch] + [0] * (12 - n), np.int32)
        val = np.array([b[1] / 4 for b in batch] + [99.0] * (12 - n), np.float32)  # dyadic: exact sums
        where = np.arange(12) < n
        tree = _set(tree, idx, val, use_jit, where)
        for i, v in zip(idx[:n], val[:n]):
            if 0 <= i < capacity:
                ref[i] = v
    np.testing.assert_array_equal(np.asarray(tree.leaves()), ref)
    assert float(tree.total()) == ref.sum()
    assert float(tree.min()) == (ref[ref > 0].min() if np.any(ref > 0) else np.inf)
    _check_invariant(tree)


def test_50k_updates_root_exact_and_no_empty_leaf():
    """50,000 random float32 updates in batches: the root stays the sum of the leaves (no drift)."""
    capacity, batch, steps = 5000, 250, 200  # 200 x 250 = 50,000 updates
    tree = SumMinTree.create(capacity)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, capacity, (steps, batch)).astype(np.int32)
    # Values spanning 8 orders of magnitude, with some exact zeros.
    val = (10.0 ** rng.uniform(-4, 4, (steps, batch)) * (rng.random((steps, batch)) > 0.1)).astype(np.float32)

    @jax.jit
    def run(tree, idx, val):
        return jax.lax.scan(lambda t, x: (t.set(*x), None), tree, (idx, val))[0]

    tree = run(tree, jnp.asarray(idx), jnp.asarray(val))
    # Empty the tail so the query just below the root falls in a long zero region.
    tail = jnp.arange(capacity - 700, capacity, dtype=jnp.int32)
    tree = tree.set(tail, jnp.zeros(tail.shape, jnp.float32))

    leaves = np.asarray(tree.leaves()).astype(np.float64)
    root = float(tree.total())
    assert abs(root - leaves.sum()) <= 1e-6 * leaves.sum()
    _check_invariant(tree)

    below_root = np.nextafter(np.float32(root), np.float32(0))
    queries = np.array([below_root, root, np.float32(root) * 2, 0.0], np.float32)
    got = np.asarray(jax.jit(lambda t, q: t.find(q))(tree, jnp.asarray(queries)))
    assert np.all(leaves[got] > 0), (got, leaves[got])
    assert got[0] == np.flatnonzero(leaves)[-1]
    # And many stratified samples: never a zero leaf.
    idx = np.asarray(jax.jit(lambda t, k: t.sample_stratified(k, 4096))(tree, jax.random.key(1)))
    assert np.all(leaves[idx] > 0)


# ------------------------------------------------------------------------------------------------
# Search against a numpy reference


def _reference_find(leaves: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """cumsum + searchsorted over the positive leaves (float64), queries clamped into [0, total)."""
    pos = np.flatnonzero(leaves > 0)
    cum = np.cumsum(leaves[pos].astype(np.float64))
    q = np.clip(queries.astype(np.float64), 0, np.nextafter(cum[-1], 0))
    return pos[np.searchsorted(cum, q, side="right")]


@given(
    capacity=st.sampled_from([1, 7, 64, 70]),
    values=st.lists(st.integers(0, 12), min_size=1, max_size=70),
    query_steps=st.lists(st.integers(-4, 400), min_size=30, max_size=30),
    use_jit=st.booleans(),
)
@settings(max_examples=25, deadline=None)  # each example compiles for the shapes it draws
def test_find_matches_numpy_reference_exact(capacity, values, query_steps, use_jit):
    # Integer leaves and quarter-step queries: every float32 sum is exact, so the tree must agree
    # with the float64 reference exactly, boundaries included.
    values = (values + [0] * capacity)[:capacity]
    values[-1] = max(values[-1], 1) if sum(values) == 0 else values[-1]
    leaves = np.array(values, np.float32)
    tree = _set(SumMinTree.create(capacity), np.arange(capacity), leaves, use_jit)
    q = np.array(query_steps, np.float32) / 4
    got = _find(tree, q, use_jit)
    np.testing.assert_array_equal(got, _reference_find(leaves, q))


# Capacities from a fixed set (depths 0 to 7, powers of two and not) and a fixed number of queries
# (the drawn ones repeated): one compiled program per capacity, reused across examples.
_CAPACITIES = [1, 2, 3, 5, 8, 13, 24, 45, 70]
_NUM_QUERIES = 30


@given(
    capacity_values=st.sampled_from(_CAPACITIES).flatmap(lambda c: st.tuples(st.just(c), st.lists(
        st.one_of(st.just(0.0), st.floats(2.0**-20, 2.0**20, width=32)), min_size=1, max_size=c
    ).filter(lambda v: sum(v) > 0))),
    fractions=st.lists(st.floats(0, 1), min_size=1, max_size=_NUM_QUERIES),
)
@settings(max_examples=25, deadline=None)
def test_find_with_rounding_lands_on_positive_leaf_near_reference(capacity_values, fractions):
    capacity, values = capacity_values
    leaves = np.zeros(capacity, np.float32)
    leaves[: len(values)] = values  # the leaves past the drawn values are 0
    tree = SumMinTree.create(capacity).set(jnp.arange(capacity, dtype=jnp.int32), jnp.asarray(leaves))
    total = float(tree.total())
    q = (np.resize(np.array(fractions), _NUM_QUERIES) * total).astype(np.float32)
    got = np.asarray(tree.find(jnp.asarray(q)))
    assert np.all(leaves[got] > 0)
    # Up to float32 rounding of partial sums, the leaf's prefix interval contains the query.
    cum = np.concatenate([[0.0], np.cumsum(leaves.astype(np.float64))])
    tol = 1e-5 * total
    assert np.all(cum[got] - tol <= q) and np.all(q < cum[got + 1] + tol)


_DESCEND = jax.jit(sum_tree_module._descend)


@given(
    capacity=st.sampled_from([1, 2, 3, 5, 64, 70, 3000]),
    values=st.lists(st.one_of(st.just(0.0), st.floats(2.0**-10, 2.0**10, width=32)), min_size=1, max_size=80),
    fractions=st.lists(st.floats(-0.1, 1.1), min_size=1, max_size=13),
    restart=st.booleans(),
)
@settings(max_examples=30, deadline=None)
def test_descent_lands_on_positive_leaves(capacity, values, fractions, restart):
    """For any tree (depths 0 to 12, empty trees included) and any number of queries, the descent
    with and without the restart of sample_stratified ends on a positive leaf (leaf 0 when the
    tree is empty), and without the restart it is find."""
    leaves = np.zeros(capacity, np.float32)
    idx = np.arange(len(values)) * 37 % capacity
    leaves[idx] = np.array(values, np.float32)
    # every leaf written (the unwritten ones as 0) and 13 queries (the drawn ones repeated): one
    # compiled program per capacity
    tree = SumMinTree.create(capacity).set(jnp.arange(capacity, dtype=jnp.int32), jnp.asarray(leaves))
    total = float(tree.total())
    fractions = np.resize(np.array(fractions), 13)
    q = jnp.clip(jnp.asarray(fractions * total, jnp.float32), 0, max(np.nextafter(np.float32(total), 0), 0))
    u2 = jnp.asarray(np.mod(fractions * 7.31 + 0.17, 1.0), jnp.float32) if restart else None
    got = np.asarray(_DESCEND(tree.levels, q, u2))
    if not restart:
        np.testing.assert_array_equal(np.asarray(tree.find(q)), got)
    assert tree.find(jnp.zeros((0,), jnp.float32)).shape == (0,)  # no queries: no leaves
    if total > 0:
        assert np.all(leaves[got] > 0)
    else:
        assert np.all(got == 0)


@JIT
def test_sample_stratified_one_query_per_stratum(use_jit):
    leaves = np.arange(1, 17, dtype=np.float32)  # total 136
    tree = SumMinTree.create(16).set(jnp.arange(16, dtype=jnp.int32), jnp.asarray(leaves))
    b = 8
    fn = maybe_jit(lambda t, k: t.sample_stratified(k, b), use_jit)
    cum = np.concatenate([[0.0], np.cumsum(leaves)])
    for seed in range(5):
        idx = np.asarray(fn(tree, jax.random.key(seed)))
        for k, i in enumerate(idx):
            # leaf i's interval [cum[i], cum[i+1]) must intersect stratum k.
            lo, hi = k * 136 / b, (k + 1) * 136 / b
            assert cum[i] < hi and cum[i + 1] > lo, (k, i)
        assert np.all(np.diff(idx) >= 0)  # strata are ordered


def test_restart_level_is_about_half_the_depth():
    for depth in range(0, 31):
        level = sum_tree_module._restart_level(depth)
        if depth < 6:
            assert level == depth  # no restart
            continue
        assert 1 <= level < depth and abs(level - depth / 2) <= 1, (depth, level)


@JIT
def test_stratified_sampling_resolves_leaves_below_the_float32_spacing(use_jit):
    """Leaf 0 holds 2**26, leaves 1..4095 hold 1: near the total a float32 query is a multiple of
    8, so one query alone reaches only the unit leaves with ``(i - 1) % 8 == 0`` (every draw of
    them at one residue). With the descent restarted inside the chosen subtree the unit leaves are
    drawn at every residue, at their due rate (4095 / total per draw)."""
    tree = SumMinTree.create(4096).set(jnp.arange(4096, dtype=jnp.int32), jnp.ones(4096, jnp.float32).at[0].set(2.0**26))
    draws = 250
    keys = jax.random.split(jax.random.key(3), draws)
    fn = maybe_jit(lambda t, k: t.sample_stratified(k, 4096), use_jit)
    idx = np.concatenate([np.asarray(fn(tree, keys[i])) for i in range(draws)])  # keys[i]: no 250-way unstack program
    units = idx[idx > 0]
    expected = draws * 4096 * 4095 / (2.0**26 + 4095)  # 62.5
    assert 0.5 * expected < units.size < 1.6 * expected, units.size
    assert np.unique((units - 1) % 8).size >= 6, np.unique((units - 1) % 8)
    # find (one query, no restart) keeps the documented single-query semantics: one residue only
    q = jnp.asarray(2.0**26 + np.arange(0, 4095, 0.5), jnp.float32)
    reached = np.asarray(_find(tree, q, use_jit))
    assert np.unique((reached[reached > 0] - 1) % 8).size == 1


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_trees_take_float32_queries(dtype):
    """A 1,000-leaf bfloat16 tree of ones: one float32 query in the middle of each leaf reaches
    every leaf (with the queries rounded to bfloat16 only 442 were reached), and stratified draws
    of 1,000 hit every leaf."""
    tree = SumMinTree.create(1000, dtype).set(jnp.arange(1000, dtype=jnp.int32), jnp.ones(1000, dtype))
    got = np.asarray(tree.find(jnp.arange(1000, dtype=jnp.float32) + 0.5))
    np.testing.assert_array_equal(got, np.arange(1000))
    hits = np.concatenate([np.asarray(tree.sample_stratified(jax.random.key(r), 1000)) for r in range(20)])
    counts = np.bincount(hits, minlength=1000)
    assert counts.min() > 0 and counts.max() < 60, (counts.min(), counts.max())


def test_stratified_sampling_same_under_jit_and_eagerly():
    """The stratum width is a product with 1/B in both modes (XLA turned a division by the constant
    B into that product under jit only, which moved a last bit of the queries: at B = 5000 the
    sampled leaf differed at boundaries)."""
    leaves = [  # a prioritised buffer's leaves (draw 3436 of key 5000 moved 14 -> 13)
        0.48243770003318787, 0.6540745496749878, 0.906746506690979, 0.9789913892745972, 0.8129675984382629,
        0.6542600393295288, 0.7777279615402222, 0.8598600029945374, 0.7626389265060425, 0.8305778503417969,
        0.6952560544013977, 0.41330796480178833, 0.36579379439353943, 0.9961181282997131, 0.0649968832731247,
        0.8010390996932983, 0.9265807271003723, 0.4155537784099579, 0.9283871650695801, 0.28467458486557007,
        0.39523768424987793, 0.8212697505950928,
    ]
    tree = SumMinTree.create(29).set(jnp.arange(22, dtype=jnp.int32), jnp.asarray(leaves, jnp.float32))
    sample = jax.jit(lambda t, k, b: t.sample_stratified(k, b), static_argnums=2)
    for b in (1000, 5000):
        for seed in range(3):
            key = jax.random.key(5000 + seed)
            np.testing.assert_array_equal(np.asarray(tree.sample_stratified(key, b)), np.asarray(sample(tree, key, b)))


# ------------------------------------------------------------------------------------------------
# Minima, vmap, errors


@JIT
def test_min_over_positive_leaves(use_jit):
    tree = SumMinTree.create(6)
    assert float(tree.min()) == np.inf
    tree = _set(tree, [4, 1, 4], [3.0, 2.0, 0.5], use_jit)
    assert float(tree.min()) == 0.5
    tree = _set(tree, [4], [0.0], use_jit)  # clear slot 4
    assert float(tree.min()) == 2.0
    _check_invariant(tree)


@JIT
def test_sum_min_tree_issue_case_and_min_over_positive_leaves(use_jit):
    tree = _set(SumMinTree.create(8), [0, 1, 2], [0.5, 1.5, 2.0], use_jit)
    assert float(tree.total()) == 4.0 and float(tree.min()) == 0.5
    queries = [0, 0.49, 0.5, 1.99, 2.0, 3.99, np.nextafter(np.float32(4.0), np.float32(0))]
    assert _find(tree, queries, use_jit).tolist() == [0, 0, 1, 1, 2, 2, 2]
    tree = _set(tree, [0], [0.0], use_jit)  # a zero leaf leaves the min (never sampled)
    assert float(tree.total()) == 3.5 and float(tree.min()) == 1.5
    assert _find(tree, [0.0, 1.49, 3.4], use_jit).tolist() == [1, 1, 2]
    tree = _set(tree, [1, 2], [0.0, 0.0], use_jit)
    assert float(tree.total()) == 0.0 and float(tree.min()) == np.inf
    _check_invariant(tree)
    np.testing.assert_array_equal(np.asarray(tree.get(jnp.array([0, 1, 2, 3]))), [0, 0, 0, 0])


def test_sum_min_tree_stratified_and_errors():
    tree = SumMinTree.create(6).set(jnp.array([1, 4]), jnp.array([1.0, 3.0]))
    idx = np.asarray(jax.jit(lambda t, k: t.sample_stratified(k, 8))(tree, jax.random.key(0)))
    assert idx.tolist() == [1, 1, 4, 4, 4, 4, 4, 4]  # strata of width 0.5 over [0, 4)
    with pytest.raises(ValueError, match=r"values: expected shape \(2,\)"):
        tree.set(jnp.array([0, 1]), jnp.array([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError, match="values: expected a floating"):
        tree.set(jnp.array([0, 1]), jnp.array([1, 2]))
    with pytest.raises(TypeError, match="where: expected a bool dtype"):
        tree.set(jnp.array([0, 1]), jnp.array([1.0, 2.0]), where=jnp.array([1, 0]))
    with pytest.raises(ValueError, match="batch_size"):
        tree.sample_stratified(jax.random.key(0), 0)


def test_vmap_over_stacked_trees():
    trees = jax.vmap(lambda _: SumMinTree.create(5))(jnp.arange(3))
    idx = jnp.array([[0, 1], [2, 3], [4, 4]], jnp.int32)
    val = jnp.array([[1.0, 2.0], [3.0, 0.0], [1.0, 5.0]], jnp.float32)
    trees = jax.jit(jax.vmap(lambda t, i, v: t.set(i, v)))(trees, idx, val)
    np.testing.assert_array_equal(np.asarray(trees.total()), [3.0, 3.0, 5.0])
    np.testing.assert_array_equal(np.asarray(trees.min()), [1.0, 3.0, 5.0])
    assert trees.padded_capacity == 8 and trees.depth == 3
    found = jax.vmap(lambda t: t.find(jnp.array([0.0, 2.99], jnp.float32)))(trees)
    np.testing.assert_array_equal(np.asarray(found), [[0, 1], [2, 2], [4, 4]])


def test_trace_time_errors():
    tree = SumMinTree.create(4)
    for bad in (4.0, 0, 2**30 + 1, True):
        with pytest.raises(ValueError, match="capacity"):
            SumMinTree.create(bad)
    with pytest.raises(TypeError, match="dtype"):
        SumMinTree.create(4, dtype=jnp.int32)
    with pytest.raises(ValueError, match=r"values: expected shape \(2,\)"):
        tree.set(jnp.array([0, 1]), jnp.array([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError, match="indices: expected an integer"):
        tree.set(jnp.array([0.0, 1.0]), jnp.array([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"indices: expected an integer array \(int32\), got NoneType"):
        tree.get(None)
    with pytest.raises(TypeError, match="values: expected a floating"):
        tree.set(jnp.array([0, 1]), jnp.array([1, 2]))
    with pytest.raises(ValueError, match="indices: expected a 1-D"):
        tree.set(jnp.zeros((2, 2), jnp.int32), jnp.zeros((2, 2)))
    with pytest.raises(TypeError, match="where: expected a bool dtype"):
        tree.set(jnp.array([0, 1]), jnp.array([1.0, 2.0]), where=jnp.array([1, 0]))
    with pytest.raises(ValueError, match="queries"):
        tree.find(jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="batch_size"):
        tree.sample_stratified(jax.random.key(0), 0)
    with pytest.raises(TypeError, match="distinct: expected a Python bool"):
        tree.set(jnp.array([0, 1]), jnp.array([1.0, 2.0]), distinct="True")
    # Errors surface at trace time under jit, too.
    with pytest.raises(ValueError, match="values"):
        jax.jit(lambda t: t.set(jnp.array([0, 1]), jnp.array([1.0])))(tree)


def test_set_compiles_once(compile_counter):
    fn = jax.jit(lambda t, i, v: t.set(i, v))
    tree = SumMinTree.create(100)
    tree = fn(tree, jnp.array([1, 2], jnp.int32), jnp.array([1.0, 2.0], jnp.float32))
    with compile_counter() as n:
        for k in range(3):
            tree = fn(tree, jnp.array([k, k + 3], jnp.int32), jnp.array([1.0, 2.0], jnp.float32))
    assert n() == 0


def test_donated_set_updates_every_depth_in_place():
    """A donated jitted set writes into the arrays it was given (no copy of any depth's array
    allocated for the result), for one entry and for many."""
    for batch in (1, 8, 5000):
        fn = jax.jit(lambda t, i, v: t.set(i, v), donate_argnums=0)
        idx, val = jnp.arange(batch, dtype=jnp.int32), jnp.ones(batch, jnp.float32)
        tree = fn(SumMinTree.create(100_000), idx, val)
        for _ in range(2):
            ptr = [x.unsafe_buffer_pointer() for x in tree.levels]
            tree = fn(tree, idx, 2 * val)
            assert [x.unsafe_buffer_pointer() for x in tree.levels] == ptr, batch
        assert float(tree.total()) == 2 * batch


def test_donated_set_run_updates_every_depth_in_place():
    """A donated jitted `set_run` writes into the arrays it was given, for runs that wrap around the capacity or not."""
    fn = jax.jit(lambda t, s, v: t.set_run(s, v), donate_argnums=0)
    for batch in (1, 8, 5000):
        tree, want = fn(SumMinTree.create(100_000), 0, jnp.ones(batch, jnp.float32)), np.zeros(100_000, np.float32)
        want[:batch] = 1
        for start in (99_999, 123):
            ptr = [x.unsafe_buffer_pointer() for x in tree.levels]
            tree = fn(tree, start, 2 * jnp.ones(batch, jnp.float32))
            assert [x.unsafe_buffer_pointer() for x in tree.levels] == ptr, batch
            want[(start + np.arange(batch)) % 100_000] = 2
        np.testing.assert_array_equal(np.asarray(tree.leaves()), want)
        assert float(tree.total()) == want.sum()


@pytest.mark.parametrize("batch", [1, 2, 256])
def test_donated_set_needs_no_tree_sized_temporary(batch):
    """A donated update of a few leaves works in place: its compiled program needs no temporary
    buffer of the heap's size (a one-entry write once copied the heap whole)."""
    tree = SumMinTree.create(1 << 16)
    fn = jax.jit(lambda t, i, v: t.set(i, v), donate_argnums=0)
    compiled = fn.lower(tree, jnp.zeros(batch, jnp.int32), jnp.ones(batch)).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < sum(x.nbytes for x in tree.levels) // 8


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("capacity", [1, 2, 5, 1000])
def test_infinite_leaves_are_capped_so_the_total_stays_finite(capacity, dtype):
    """A `+inf` leaf is written as `max_leaf = 2**(maxexp - 1 - depth)`: every leaf at `+inf` still gives a finite
    total, in every dtype (two +inf float32 leaves made the total inf)."""
    tree = SumMinTree.create(capacity, dtype)
    assert tree.max_leaf == 2.0 ** (jnp.finfo(dtype).maxexp - 1 - tree.depth)
    assert tree.max_leaf * tree.padded_capacity <= float(jnp.finfo(dtype).max)
    full = tree.set(jnp.arange(capacity), jnp.full((capacity,), jnp.inf, dtype))
    np.testing.assert_array_equal(np.asarray(full.leaves(), np.float64), tree.max_leaf)
    assert float(full.total()) == capacity * tree.max_leaf and float(full.min()) == tree.max_leaf
    run = tree.set_run(jnp.int32(0), jnp.full((capacity,), jnp.inf, dtype))
    assert float(run.total()) == capacity * tree.max_leaf
    _check_invariant(full)


def test_two_infinite_leaves_are_sampled_alike():
    """Two +inf leaves beside a finite one: the total is finite, both capped leaves are drawn half of the time each
    and the finite one (1.0) is kept as it was."""
    tree = SumMinTree.create(4).set(jnp.array([0, 1, 2]), jnp.array([np.inf, np.inf, 1.0], jnp.float32))
    assert np.isfinite(float(tree.total())) and float(tree.get(jnp.array([2]))[0]) == 1.0
    counts = np.bincount(np.asarray(tree.sample_stratified(jax.random.key(0), 1000)), minlength=4)
    assert abs(counts[0] - 500) <= 1 and counts[0] + counts[1] == 1000


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_finite_values_are_kept_exactly_whatever_the_cap(dtype):
    """Finite values are written as given, above `max_leaf` too (a float16 tree of 32,768 leaves has `max_leaf` 1.0
    and keeps 100)."""
    tree = SumMinTree.create(32768, dtype)
    big = 100.0 if dtype == jnp.float16 else 1e35
    assert big > tree.max_leaf
    values = np.array([big, 0.75, 0.5, 3.0], dtype)
    for got in (tree.set(jnp.arange(4), jnp.asarray(values)), tree.set_run(jnp.int32(0), jnp.asarray(values))):
        np.testing.assert_array_equal(np.asarray(got.leaves())[:4], values)
        assert np.isclose(float(got.total()), float(values.astype(np.float64).sum()), rtol=1e-3)
