"""Tests of jaxbuffers.sum_tree: SumTree / MinTree layout, batched updates, prefix-sum search."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbuffers import _kernel
from jaxbuffers import sum_tree as sum_tree_module
from jaxbuffers.sum_tree import MinTree, SumMinTree, SumTree, last_write_mask, set_sum_and_min

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
    """Every internal node equals op(children) exactly (per column for SumMinTree); padding leaves
    hold the identity; a SumMinTree leaf's min is its value if positive, else +inf."""
    levels = [np.asarray(x) for x in tree.levels]
    assert [len(x) for x in levels] == [2**l for l in range(tree.depth + 1)]
    if isinstance(tree, SumMinTree):
        cols = [(np.add, 0.0, [l[:, 0] for l in levels]), (np.minimum, np.inf, [l[:, 1] for l in levels])]
        leaf = levels[-1][: tree.capacity]
        np.testing.assert_array_equal(leaf[:, 1], np.where(leaf[:, 0] > 0, leaf[:, 0], np.inf))
    else:
        op, ident = (np.add, 0.0) if isinstance(tree, SumTree) else (np.minimum, np.inf)
        cols = [(op, ident, levels)]
    for op, ident, lv in cols:
        for l in range(tree.depth):
            np.testing.assert_array_equal(lv[l], op(lv[l + 1][0::2], lv[l + 1][1::2]), f"level {l}")
        assert np.all(lv[-1][tree.capacity :] == ident), "a padding leaf was written"


# ------------------------------------------------------------------------------------------------
# The issue's exact case


@JIT
def test_find_issue_case(use_jit):
    tree = _set(SumTree.create(8), [0, 1, 2], [0.5, 1.5, 2.0], use_jit)
    assert float(tree.total()) == 4.0
    queries = [0, 0.49, 0.5, 1.99, 2.0, 3.99, np.nextafter(np.float32(4.0), np.float32(0))]
    assert _find(tree, queries, use_jit).tolist() == [0, 0, 1, 1, 2, 2, 2]


@JIT
def test_find_out_of_range_queries_clamped_and_never_empty(use_jit):
    tree = _set(SumTree.create(8), [0, 1, 2], [0.5, 1.5, 2.0], use_jit)
    # At/above the total, negative, NaN, inf: clamped into [0, total).
    got = _find(tree, [4.0, 4.5, 1e30, np.inf, -1.0, -np.inf, np.nan], use_jit)
    assert got.tolist() == [2, 2, 2, 2, 0, 0, 0]


@JIT
def test_find_skips_zero_weight_regions(use_jit):
    # Zeros at the start, in the middle and at the end (incl. padding: capacity 6 -> P = 8).
    tree = _set(SumTree.create(6), [0, 1, 2, 3, 4, 5], [0.0, 1.0, 0.0, 0.0, 2.0, 0.0], use_jit)
    q = np.linspace(-1, 4, 501, dtype=np.float32)
    got = _find(tree, q, use_jit)
    assert set(got.tolist()) == {1, 4}
    np.testing.assert_array_equal(got, np.where(q < 1.0, 1, 4))


@JIT
def test_find_with_inconsistent_query_falls_back_to_positive_leaf(use_jit):
    # A query that, after subtracting a left sum, exceeds the right subtree (as rounding can
    # produce) must still end on a positive leaf: the last positive leaf here.
    tree = _set(SumTree.create(4), [0, 1], [1.0, 1e-3], use_jit)
    assert _find(tree, [1.0009, 1.001, 5.0], use_jit).tolist() == [1, 1, 1]


@JIT
def test_empty_tree_returns_leaf_zero(use_jit):
    tree = SumTree.create(5)
    assert float(tree.total()) == 0.0
    assert _find(tree, [0.0, 1.0], use_jit).tolist() == [0, 0]
    key = jax.random.key(0)
    idx = maybe_jit(lambda t, k: t.sample_stratified(k, 4), use_jit)(tree, key)
    assert np.asarray(idx).tolist() == [0, 0, 0, 0]


def test_capacity_one():
    tree = SumTree.create(1).set(jnp.array([0]), jnp.array([3.0]))
    assert tree.depth == 0 and float(tree.total()) == 3.0
    assert tree.find(jnp.array([0.0, 2.9, 7.0])).tolist() == [0, 0, 0]


# ------------------------------------------------------------------------------------------------
# Updates


@JIT
def test_duplicate_indices_last_write_wins(use_jit):
    tree = _set(SumTree.create(8), [3, 1, 3, 1, 3], [1.0, 2.0, 5.0, 7.0, 0.25], use_jit)
    leaves = np.asarray(tree.leaves())
    assert leaves[3] == 0.25 and leaves[1] == 7.0
    assert float(tree.total()) == 7.25
    _check_invariant(tree)


@JIT
def test_where_mask_and_out_of_range_indices_ignored(use_jit):
    fn = maybe_jit(lambda t, i, v, w: t.set(i, v, where=w), use_jit)
    tree = SumTree.create(5)  # P = 8: leaves 5..7 are padding
    idx = jnp.array([2, 2, 5, 7, -1, 4], jnp.int32)
    val = jnp.array([1.0, 9.0, 3.0, 3.0, 3.0, 2.0], jnp.float32)
    # The masked-out later write to slot 2 must not hide the earlier active one.
    tree = fn(tree, idx, val, jnp.array([True, False, True, True, True, True]))
    np.testing.assert_array_equal(np.asarray(tree.leaves()), [0, 0, 1.0, 0, 2.0])
    assert float(tree.total()) == 3.0
    _check_invariant(tree)


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 1000), st.booleans()), min_size=1, max_size=40))
@settings(max_examples=40, deadline=None)
def test_last_write_mask_matches_python(entries):
    idx = np.array([e[0] for e in entries], np.int32)
    where = np.array([e[2] for e in entries])
    got = np.asarray(last_write_mask(jnp.asarray(idx), jnp.asarray(where)))
    expected = np.zeros(len(entries), bool)
    last = {}
    for k, (i, _, w) in enumerate(entries):
        if w:
            last[i] = k
    expected[list(last.values())] = True
    np.testing.assert_array_equal(got, expected)


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
    tree = SumTree.create(capacity)
    mtree = MinTree.create(capacity)
    ref = np.zeros(capacity)
    for batch in batches:
        # Padded to 12 entries (masked out) so jit compiles once per capacity.
        n = len(batch)
        idx = np.array([b[0] for b in batch] + [0] * (12 - n), np.int32)
        val = np.array([b[1] / 4 for b in batch] + [99.0] * (12 - n), np.float32)  # dyadic: exact sums
        where = np.arange(12) < n
        tree = _set(tree, idx, val, use_jit, where)
        mtree = _set(mtree, idx, val, use_jit, where)
        for i, v in zip(idx[:n], val[:n]):
            if 0 <= i < capacity:
                ref[i] = v
    np.testing.assert_array_equal(np.asarray(tree.leaves()), ref)
    assert float(tree.total()) == ref.sum()
    written = {int(b[0]) for batch in batches for b in batch if 0 <= b[0] < capacity}
    expected_min = min((ref[i] for i in written), default=np.inf)
    assert float(mtree.min()) == expected_min
    _check_invariant(tree)
    _check_invariant(mtree)


@pytest.mark.parametrize("cls", [SumTree, SumMinTree])
def test_50k_updates_root_exact_and_no_empty_leaf(cls):
    """50,000 random float32 updates in batches: the root stays the sum of the leaves (no drift)."""
    capacity, batch, steps = 5000, 250, 200  # 200 x 250 = 50,000 updates
    tree = cls.create(capacity)
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
@settings(max_examples=50, deadline=None)
def test_find_matches_numpy_reference_exact(capacity, values, query_steps, use_jit):
    # Integer leaves and quarter-step queries: every float32 sum is exact, so the tree must agree
    # with the float64 reference exactly, boundaries included.
    values = (values + [0] * capacity)[:capacity]
    values[-1] = max(values[-1], 1) if sum(values) == 0 else values[-1]
    leaves = np.array(values, np.float32)
    tree = _set(SumTree.create(capacity), np.arange(capacity), leaves, use_jit)
    q = np.array(query_steps, np.float32) / 4
    got = _find(tree, q, use_jit)
    np.testing.assert_array_equal(got, _reference_find(leaves, q))


@given(
    values=st.lists(
        st.one_of(st.just(0.0), st.floats(2.0**-20, 2.0**20, width=32)), min_size=1, max_size=70
    ).filter(lambda v: sum(v) > 0),
    fractions=st.lists(st.floats(0, 1), min_size=1, max_size=30),
)
@settings(max_examples=50, deadline=None)
def test_find_with_rounding_lands_on_positive_leaf_near_reference(values, fractions):
    leaves = np.array(values, np.float32)
    tree = SumTree.create(len(values)).set(jnp.arange(len(values), dtype=jnp.int32), jnp.asarray(leaves))
    total = float(tree.total())
    q = (np.array(fractions) * total).astype(np.float32)
    got = np.asarray(tree.find(jnp.asarray(q)))
    assert np.all(leaves[got] > 0)
    # Up to float32 rounding of partial sums, the leaf's prefix interval contains the query.
    cum = np.concatenate([[0.0], np.cumsum(leaves.astype(np.float64))])
    tol = 1e-5 * total
    assert np.all(cum[got] - tol <= q) and np.all(q < cum[got + 1] + tol)


_DESCENTS = {"chained": jax.jit(sum_tree_module._descend_chained), "vector": jax.jit(sum_tree_module._descend_vector)}


@given(
    capacity=st.sampled_from([1, 2, 3, 5, 64, 70, 3000]),
    values=st.lists(st.one_of(st.just(0.0), st.floats(2.0**-10, 2.0**10, width=32)), min_size=1, max_size=80),
    fractions=st.lists(st.floats(-0.1, 1.1), min_size=1, max_size=13),
    pair=st.booleans(),
    restart=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_chained_and_vector_descents_agree_exactly(capacity, values, fractions, pair, restart):
    """The CPU descent (scalar loop, 4 queries at a time, 2 levels per inner step) and the vector
    descent (3 levels per loop step from one gather of 8 descendants) return the same leaves for
    any tree and any number of queries (not only multiples of 4), for one-column and (sum, min)
    heaps, depths 0 to 12 (every remainder modulo 3), empty trees included, with and without the
    restart of sample_stratified (second uniform); and the default path (CPU) is the chained one."""
    leaves = np.zeros(capacity, np.float32)
    idx = np.arange(len(values)) * 37 % capacity
    leaves[idx] = np.array(values, np.float32)
    tree = (SumMinTree if pair else SumTree).create(capacity).set(jnp.asarray(idx, jnp.int32), jnp.asarray(leaves[idx]))
    total = float(tree.total())
    q = jnp.clip(jnp.asarray(np.array(fractions) * total, jnp.float32), 0, max(np.nextafter(np.float32(total), 0), 0))
    u2 = jnp.asarray(np.mod(np.array(fractions) * 7.31 + 0.17, 1.0), jnp.float32) if restart else None
    chained = np.asarray(_DESCENTS["chained"](tree.nodes, q, u2))
    np.testing.assert_array_equal(chained, np.asarray(_DESCENTS["vector"](tree.nodes, q, u2)))
    if not restart:
        np.testing.assert_array_equal(np.asarray(tree.find(q)), chained)
    assert tree.find(jnp.zeros((0,), jnp.float32)).shape == (0,)  # no queries: no leaves
    if total > 0:
        assert np.all(leaves[chained] > 0)
    else:
        assert np.all(chained == 0)


def test_vector_descent_agrees_after_many_updates():
    """The vector descent recomputes the sums between a node and its descendants 3 levels down
    instead of reading them; that is exact only because every internal node holds exactly
    ``left + right`` of its children. Check it on trees built by thousands of batched updates
    (walk and vectorised update paths, duplicates, zeros; float32, bfloat16 and float16), not only
    by one write."""
    rng = np.random.default_rng(7)
    cases = [(SumMinTree, jnp.float32, 100_000, 256), (SumMinTree, jnp.float32, 4096, 5000), (SumTree, jnp.float32, 777, 64)]
    cases += [(SumTree, dtype, 3000, 300) for dtype in (jnp.bfloat16, jnp.float16)]  # sums rounded as stored
    for cls, dtype, capacity, batch in cases:
        tree = cls.create(capacity, dtype=dtype)
        for _ in range(40):
            idx = rng.integers(0, capacity, batch).astype(np.int32)
            vals = rng.exponential(1.0, batch) * (rng.random(batch) > 0.2)
            tree = tree.set(jnp.asarray(idx), jnp.asarray(vals, dtype))
        total = tree.total().astype(jnp.float32)  # bf16/f16 trees take float32 queries
        q = jnp.minimum(jnp.asarray(rng.random(4096), jnp.float32) * total, jnp.nextafter(total, jnp.float32(0)))
        u2 = jnp.asarray(rng.random(4096), jnp.float32)
        for restart in (None, u2):
            np.testing.assert_array_equal(
                np.asarray(_DESCENTS["chained"](tree.nodes, q, restart)), np.asarray(_DESCENTS["vector"](tree.nodes, q, restart))
            )


@JIT
def test_sample_stratified_one_query_per_stratum(use_jit):
    leaves = np.arange(1, 17, dtype=np.float32)  # total 136
    tree = SumTree.create(16).set(jnp.arange(16, dtype=jnp.int32), jnp.asarray(leaves))
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


def test_restart_level_is_about_half_the_depth_on_a_vector_step():
    for depth in range(0, 31):
        level = sum_tree_module._restart_level(depth)
        if depth < 6:
            assert level == depth  # no restart
            continue
        rest = depth % sum_tree_module._DESCENT_JUMP
        assert 1 <= level < depth and (level - rest) % sum_tree_module._DESCENT_JUMP == 0
        assert abs(level - depth / 2) <= 2, (depth, level)


@JIT
def test_stratified_sampling_resolves_leaves_below_the_float32_spacing(use_jit):
    """Leaf 0 holds 2**26, leaves 1..4095 hold 1: near the total a float32 query is a multiple of
    8, so one query alone reaches only the unit leaves with ``(i - 1) % 8 == 0`` (every draw of
    them at one residue). With the descent restarted inside the chosen subtree the unit leaves are
    drawn at every residue, at their due rate (4095 / total per draw)."""
    tree = SumTree.create(4096).set(jnp.arange(4096, dtype=jnp.int32), jnp.ones(4096, jnp.float32).at[0].set(2.0**26))
    draws = 250
    keys = jax.random.split(jax.random.key(3), draws)
    fn = maybe_jit(lambda t, k: t.sample_stratified(k, 4096), use_jit)
    idx = np.concatenate([np.asarray(fn(tree, k)) for k in keys])
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
    tree = SumTree.create(1000, dtype).set(jnp.arange(1000, dtype=jnp.int32), jnp.ones(1000, dtype))
    got = np.asarray(tree.find(jnp.arange(1000, dtype=jnp.float32) + 0.5))
    np.testing.assert_array_equal(got, np.arange(1000))
    hits = np.concatenate([np.asarray(tree.sample_stratified(jax.random.key(r), 1000)) for r in range(20)])
    counts = np.bincount(hits, minlength=1000)
    assert counts.min() > 0 and counts.max() < 60, (counts.min(), counts.max())


def test_stratified_sampling_same_under_jit_and_eagerly():
    """The stratum width is a product with 1/B in both modes (XLA turned a division by the constant
    B into that product under jit only, which moved a last bit of the queries: at B = 5000 the
    sampled leaf differed at boundaries)."""
    leaves = [  # a prioritised buffer's leaves (found by a review: draw 3436 of key 5000 moved 14 -> 13)
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
# MinTree, vmap, errors


@JIT
def test_min_tree(use_jit):
    tree = MinTree.create(6)
    assert float(tree.min()) == np.inf
    tree = _set(tree, [4, 1, 4], [3.0, 2.0, 0.5], use_jit)
    assert float(tree.min()) == 0.5
    tree = _set(tree, [4], [np.inf], use_jit)  # "clear" slot 4
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
    with pytest.raises(ValueError, match="where"):
        tree.set(jnp.array([0, 1]), jnp.array([1.0, 2.0]), where=jnp.array([1, 0]))
    with pytest.raises(ValueError, match="batch_size"):
        tree.sample_stratified(jax.random.key(0), 0)


@pytest.mark.parametrize("cls", [SumTree, SumMinTree])
def test_vmap_over_stacked_trees(cls):
    trees = jax.vmap(lambda _: cls.create(5))(jnp.arange(3))
    idx = jnp.array([[0, 1], [2, 3], [4, 4]], jnp.int32)
    val = jnp.array([[1.0, 2.0], [3.0, 0.0], [1.0, 5.0]], jnp.float32)
    trees = jax.jit(jax.vmap(lambda t, i, v: t.set(i, v)))(trees, idx, val)
    np.testing.assert_array_equal(np.asarray(trees.total()), [3.0, 3.0, 5.0])
    if cls is SumMinTree:
        np.testing.assert_array_equal(np.asarray(trees.min()), [1.0, 3.0, 5.0])
        assert trees.padded_capacity == 8 and trees.depth == 3
    found = jax.vmap(lambda t: t.find(jnp.array([0.0, 2.99], jnp.float32)))(trees)
    np.testing.assert_array_equal(np.asarray(found), [[0, 1], [2, 2], [4, 4]])


def test_trace_time_errors():
    tree = SumTree.create(4)
    with pytest.raises(TypeError, match="capacity"):
        SumTree.create(4.0)
    with pytest.raises(ValueError, match="capacity"):
        SumTree.create(0)
    with pytest.raises(TypeError, match="dtype"):
        SumTree.create(4, dtype=jnp.int32)
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
    with pytest.raises(ValueError, match="where"):
        tree.set(jnp.array([0, 1]), jnp.array([1.0, 2.0]), where=jnp.array([1, 0]))
    with pytest.raises(ValueError, match="queries"):
        tree.find(jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="batch_size"):
        tree.sample_stratified(jax.random.key(0), 0)
    # Errors surface at trace time under jit, too.
    with pytest.raises(ValueError, match="values"):
        jax.jit(lambda t: t.set(jnp.array([0, 1]), jnp.array([1.0])))(tree)


def test_set_compiles_once(compile_counter):
    fn = jax.jit(lambda t, i, v: t.set(i, v))
    tree = SumTree.create(100)
    tree = fn(tree, jnp.array([1, 2], jnp.int32), jnp.array([1.0, 2.0], jnp.float32))
    with compile_counter() as n:
        for k in range(3):
            tree = fn(tree, jnp.array([k, k + 3], jnp.int32), jnp.array([1.0, 2.0], jnp.float32))
    assert n() == 0


# ------------------------------------------------------------------------------------------------
# The two update paths (sequential walk for small batches on CPU, vectorised per level otherwise)


class _knobs:
    """Temporarily set the module's path choices: walk threshold and dense top levels."""

    def __init__(self, walk_max=None, dense_extra=None):
        self.new = {"_WALK_MAX_BATCH_CPU": walk_max, "_DENSE_EXTRA_LEVELS": dense_extra, "_DENSE_EXTRA_LEVELS_VECTOR": dense_extra}

    def __enter__(self):
        self.old = {k: getattr(sum_tree_module, k) for k in self.new}
        for k, v in self.new.items():
            if v is not None:
                setattr(sum_tree_module, k, v)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            setattr(sum_tree_module, k, v)


_PATH_FNS = {}  # (walk_max, dense_extra) -> one jitted update of a tuple of trees, traced under those knobs


def _set_with_knobs(trees, idx, val, where, walk_max, dense_extra):
    key = (walk_max, dense_extra)
    if key not in _PATH_FNS:
        _PATH_FNS[key] = jax.jit(lambda ts, i, v, w: tuple(t.set(i, v, w) for t in ts))
    with _knobs(walk_max=walk_max, dense_extra=dense_extra):  # read at trace time
        return list(_PATH_FNS[key](tuple(trees), idx, val, where))


def _both_paths(trees, idx, val, where, dense_extra):
    """(walked, vectorised): the trees updated by the sequential walk and by the vectorised path,
    with ``dense_extra`` choosing how many top levels are recomputed whole. Batches are padded to
    20 entries with inactive ones (fewer shapes to compile)."""
    pad = 20 - len(idx)
    idx = jnp.asarray(list(idx) + [0] * pad, jnp.int32)
    val = jnp.asarray(list(val) + [7.0] * pad, jnp.float32)
    where = jnp.asarray(list(where) + [False] * pad)
    walked = _set_with_knobs(trees, idx, val, where, sum_tree_module._WALK_MAX_BATCH_CPU, dense_extra)
    vectorised = _set_with_knobs(trees, idx, val, where, 0, dense_extra)
    return walked, vectorised


@given(
    capacity=st.sampled_from([1, 2, 5, 33, 70]),
    batches=st.lists(
        st.lists(st.tuples(st.integers(-3, 75), st.floats(0.0, 100.0, width=32, allow_subnormal=False), st.booleans()), min_size=1, max_size=20),
        min_size=1, max_size=4,
    ),
    dense_extra=st.sampled_from([None, -99, 2, 99]),  # defaults; no dense top (full walk); all levels dense
)
@settings(max_examples=40, deadline=None)
def test_walk_and_vectorised_paths_agree_exactly(capacity, batches, dense_extra):
    """Random batches with many duplicates, masked and out-of-range entries: the sequential walk
    and the sorted vectorised update produce bit-identical heaps for all three trees, whatever the
    number of densely recomputed top levels, and match a Python dict reference (last active write
    wins). The SumMinTree's columns equal the SumTree and the MinTree over the positive leaves. No
    subnormal values: XLA on CPU flushes them to zero in the parent sums, which the numpy invariant
    check does not."""
    walked = [SumTree.create(capacity), MinTree.create(capacity), SumMinTree.create(capacity)]
    vectorised = list(walked)
    ref = {}
    for batch in batches:
        idx = [b[0] for b in batch]
        val = [b[1] for b in batch]
        where = [b[2] for b in batch]
        walked, _ = _both_paths(walked, idx, val, where, dense_extra)
        _, vectorised = _both_paths(vectorised, idx, val, where, dense_extra)
        for i, v, w in zip(idx, val, where):
            if w and 0 <= i < capacity:
                ref[i] = np.float32(v)
    for w, v in zip(walked, vectorised):
        np.testing.assert_array_equal(np.asarray(w.nodes), np.asarray(v.nodes))
        _check_invariant(w)
    expected = np.zeros(capacity, np.float32)
    for i, v in ref.items():
        expected[i] = v
    np.testing.assert_array_equal(np.asarray(walked[0].leaves()), expected)
    np.testing.assert_array_equal(np.asarray(walked[2].leaves()), expected)
    np.testing.assert_array_equal(np.asarray(walked[2].nodes[:, 0]), np.asarray(walked[0].nodes))
    assert float(walked[1].min()) == (min(ref.values()) if ref else np.inf)
    positive = [v for v in ref.values() if v > 0]
    assert float(walked[2].min()) == (min(positive) if positive else np.inf)


@pytest.mark.parametrize("dense_extra", [-99, -3, 2])
def test_deep_walk_grouped_levels_match_reference(dense_extra):
    """Deep trees walk their levels in an inner loop of groups (more than _UNROLL_LEVELS levels per
    entry): capacity 3000 (12 levels) with every level walked (3 groups of 4), 9 levels (2 groups
    and 1 level) and the default split. Jitted, duplicates included; exact invariant and leaves."""
    rng = np.random.default_rng(dense_extra + 100)
    trees = [SumTree.create(3000), MinTree.create(3000), SumMinTree.create(3000)]
    ref = np.zeros(3000, np.float32)
    with _knobs(dense_extra=dense_extra):
        fn = jax.jit(lambda t, i, v: t.set(i, v))
        for _ in range(3):
            idx = rng.integers(0, 3000, 64).astype(np.int32)
            idx[10:20] = idx[0]  # duplicates: the last one (position 19) wins
            val = rng.uniform(0, 5, 64).astype(np.float32)
            val[5] = 0.0
            trees = [fn(t, jnp.asarray(idx), jnp.asarray(val)) for t in trees]
            for i, v in zip(idx, val):
                ref[i] = v
    for t in trees:
        _check_invariant(t)
    np.testing.assert_array_equal(np.asarray(trees[0].leaves()), ref)
    np.testing.assert_array_equal(np.asarray(trees[2].leaves()), ref)
    assert float(trees[2].min()) == ref[ref > 0].min()


def test_large_batch_takes_vectorised_path_and_matches_walk():
    """A batch above the walk threshold goes through the vectorised path; lowering the threshold
    to 0 must not change any result (jitted, duplicates included)."""
    rng = np.random.default_rng(0)
    idx = jnp.asarray(rng.integers(-5, 1005, 300), jnp.int32)  # many duplicates, some out of range
    val = jnp.asarray(rng.uniform(0, 4, 300), jnp.float32)
    where = jnp.asarray(rng.random(300) < 0.8)
    # a new function per path: jax.jit of the same function object reuses its first trace
    fn = lambda: lambda t, m, sm: (*set_sum_and_min(t, m, idx, val, where), sm.set(idx, val, where))  # noqa: E731
    new = lambda: (SumTree.create(1000), MinTree.create(1000), SumMinTree.create(1000))  # noqa: E731
    ref = jax.jit(fn())(*new())
    with _knobs(walk_max=0):
        got = jax.jit(fn())(*new())
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(np.asarray(a.nodes), np.asarray(b.nodes))
    separate = (SumTree.create(1000).set(idx, val, where), MinTree.create(1000).set(idx, val, where))
    for a, b in zip(ref, separate):
        np.testing.assert_array_equal(np.asarray(a.nodes), np.asarray(b.nodes))
    np.testing.assert_array_equal(np.asarray(ref[2].nodes[:, 0]), np.asarray(ref[0].nodes))


def heap_copies(hlo_text: str, heap_len: int, row: str = "") -> list:
    """Lines of compiled HLO that copy a whole float32 heap of ``heap_len`` nodes (rows ``row``)."""
    heap = f"f32[{heap_len}{row}]"
    return [line for line in hlo_text.splitlines() if " copy(" in line and heap in line.split("copy(")[0]]


@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu_paths", "accelerator_paths"])
@pytest.mark.parametrize("batch", [1, 8, 256, 5000])
def test_donated_set_does_not_copy_the_heap(batch, accelerator):
    """The compiled update of donated trees contains no copy of a [2P] heap (either path, one tree
    or both trees at once: an earlier version of the walk copied both heaps at every level; the
    vectorised path, which GPU/TPU take at every batch size, copied it 24-46 times at B = 1)."""
    with _kernel.accelerator_paths() if accelerator else contextlib.nullcontext():
        _assert_no_heap_copies(batch)


def _assert_no_heap_copies(batch):
    trees = (SumTree.create(100_000), MinTree.create(100_000))
    idx = jnp.arange(batch, dtype=jnp.int32)
    val = jnp.ones(batch, jnp.float32)
    fns = {
        "set": (lambda t, i, v: t.set(i, v), trees[:1], ""),
        "set_sum_and_min": (lambda s, m, i, v: set_sum_and_min(s, m, i, v), trees, ""),
        "SumMinTree.set": (lambda t, i, v: t.set(i, v), (SumMinTree.create(100_000),), ",2"),
    }
    for name, (fn, args, row) in fns.items():
        donate = tuple(range(len(args)))
        text = jax.jit(fn, donate_argnums=donate).lower(*args, idx, val).compile().as_text()
        assert f"f32[{2 * trees[0].padded_capacity}{row}]" in text  # the pattern can match
        assert not heap_copies(text, 2 * trees[0].padded_capacity, row), name


def test_set_sum_and_min_rejects_different_capacities():
    with pytest.raises(ValueError, match="capacities"):
        set_sum_and_min(SumTree.create(4), MinTree.create(5), jnp.array([0]), jnp.array([1.0]))


def test_one_jitted_function_never_confuses_sum_and_min_trees():
    """JAX 0.10.2 compares the tree structures of two registered dataclasses with the same fields
    as equal whatever their classes, so jit's cache could hand a MinTree call the executable
    compiled for a SumTree (measured: 57 of 400 calls on same-field classes). The static
    ``reduction`` field keeps the structures apart. The structure asserts catch a regression
    deterministically; the calls check it end to end on 2 x 2 x 40 compiles (the confusion hit
    ~14% of calls, so 160 calls all miss it with probability below 1e-10)."""
    s, m = SumTree.create(5), MinTree.create(5)
    assert jax.tree.structure(s) != jax.tree.structure(m)
    assert jax.tree.structure(s) != jax.tree.structure(SumMinTree.create(5))
    f = jax.jit(lambda t: t.set(jnp.array([1]), jnp.array([2.0])))
    for capacity in range(1, 41):
        for cls, want in ((SumTree, 2.0), (MinTree, 2.0)):
            out = f(cls.create(capacity + 1))
            assert type(out) is cls and out.reduction == cls._reduction
            assert float(out.root()) == want
    # With values on both sides of the written one, the reductions differ:
    g = jax.jit(lambda t: t.set(jnp.array([0, 1]), jnp.array([1.0, 3.0])).root())
    for capacity in range(2, 42):
        assert float(g(SumTree.create(capacity))) == 4.0
        assert float(g(MinTree.create(capacity))) == 1.0


@pytest.mark.usefixtures("cpu_paths_only")  # the walk is a CPU path
def test_path_tests_really_take_both_paths(monkeypatch):
    """The walk-vs-vectorised tests change module knobs between two traces; the jitted helpers must
    retrace when a knob changes (they did not once their compile caches keyed on shapes only)."""
    traced = []
    monkeypatch.setattr(sum_tree_module, "_vector_walk", lambda *a, _f=sum_tree_module._vector_walk: traced.append("vector") or _f(*a))
    monkeypatch.setattr(sum_tree_module, "_walk", lambda *a, _f=sum_tree_module._walk: traced.append("walk") or _f(*a))
    idx, val = jnp.arange(5), jnp.ones(5, jnp.float32)
    sum_tree_module._update_heap.clear_cache()  # an earlier test may have traced these shapes
    jax.jit(lambda t: t.set(idx, val))(SumMinTree.create(37))
    with _knobs(walk_max=0):
        jax.jit(lambda t: t.set(idx, val))(SumMinTree.create(37))
    assert traced == ["walk", "vector"]
