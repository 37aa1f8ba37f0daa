"""On-device reduction trees over ``capacity`` non-negative leaves: :class:`SumTree`,
:class:`MinTree`, and :class:`SumMinTree` (both reductions in one heap, for prioritised replay).

All are pure functional pytrees (``flax.struct.PyTreeNode``): every method returns a new tree
and works under ``jit``, ``lax.scan`` and ``vmap`` (stack trees along a leading axis).

Layout (shared by all trees)
----------------------------
A complete binary tree over ``P = 2 ** ceil(log2(capacity))`` leaves (the capacity padded to a
power of two), stored as ONE heap array ``nodes`` with ``2 P`` rows: row 1 is the root, node ``n``
has children ``2n`` and ``2n + 1``, so depth ``l`` occupies rows ``2**l .. 2**(l+1) - 1`` and leaf
``i`` (the flat slot id, ``0 <= i < capacity``) is row ``P + i``. A row is one value
(:class:`SumTree`, :class:`MinTree`: ``nodes`` has shape ``(2 P,)``) or the pair ``(sum, min)``
(:class:`SumMinTree`: shape ``(2 P, 2)``, the two reductions interleaved so that one walk and one
cache line serve both). Row 0 is unused and, like the padding leaves ``[capacity, P)``, holds the
reduction's identity (``0`` for the sum, ``+inf`` for the min) forever: :meth:`SumTree.set`
ignores indices outside ``[0, capacity)``. One array (rather than one per level or per reduction)
keeps the pytree small, which matters for per-call dispatch cost: every leaf of a jitted
function's arguments costs host time.

Invariant: every internal node equals ``op(left child, right child)`` evaluated in the tree's
dtype. :meth:`SumTree.set` restores it after writing leaves by recomputing the ancestors of the
touched leaves from their children (never by adding deltas), so the root never accumulates rounding
drift however many updates are made. Updates are in place when the tree is donated (no copy of the
heap: the small-batch path is a ``lax.fori_loop`` whose carry is the heap; the large-batch path
keeps XLA from fusing its reads into its writes; the top levels are written back with one
``dynamic_update_slice``). Cost of a batched set of ``B`` leaves: ``O(B log P)`` (plus
``O(B log B)`` duplicate resolution on the large-batch path); never ``O(capacity)``.

Sum-tree sampling (prefix-sum search, "proportional prioritisation") follows Schaul et al.,
"Prioritized Experience Replay", ICLR 2016, appendix B.2.1.
"""

from __future__ import annotations

from typing import ClassVar

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _validate

__all__ = ["SumTree", "MinTree", "SumMinTree", "last_write_mask", "set_sum_and_min"]


# Batches up to this size update the tree with a sequential scalar walk (see _walk); larger ones
# with one vectorised gather/scatter per level (see _vector_walk). Measured on a 2-core CPU at
# P = 2**17 (full-depth walks): walk 13 us vs 490 us vectorised at B = 256, 70 vs 180 us at B = 2048,
# but 3.7 ms vs 0.8 ms at B = 32768 (the walk's random accesses miss the cache). Only the CPU was
# measured; other backends launch kernels per loop step, so they take the vectorised path for every
# batch size.
_WALK_MAX_BATCH_CPU = 4096

# A batch of B updates touches nearly every node of the levels with fewer than ~B nodes, so walking
# them once per entry is wasted work: the update stops at depth ``_dense_levels(B, depth, walk)``
# and the ``k`` levels above it are recomputed whole from the level below (``2**k - 1`` nodes, i.e.
# ``O(B)`` work). With the sequential walk (CPU) the top is recomputed by a second scalar loop, one
# node per step (``k = ceil(log2 B) + 1``: a node costs about one walk step, and
# ``B (depth - k) + 2**k`` is smallest near ``2**k = B / ln 2``); with the vectorised path by one
# vectorised combine per level (``k = ceil(log2 B) + 2``). Measured in one run on a 2-core CPU,
# P = 2**17, B = 256, one jitted call per update (dispatch included): walking all 17 levels 30.7 us;
# 7 levels + vectorised top 10 levels 31.2 us (each of the top's ~12 small ops costs about a
# microsecond of executor time per call); 8 levels + scalar-loop top 9 levels 19.3 us.
_DENSE_EXTRA_LEVELS = 1  # walk path
_DENSE_EXTRA_LEVELS_VECTOR = 2  # vectorised path

# XLA:CPU compiles a while loop whose body touches under ~1 KB per iteration (its cost model's
# bytes accessed) into one kernel ("small call"); above that, every op of the body is a separate
# thunk and the walk is 10-30x slower (measured: 300 us instead of 10 us). One unrolled level costs
# ~70 bytes, so at most _UNROLL_LEVELS levels are unrolled in the per-entry body; deeper walks run
# an inner loop over groups of _GROUP_LEVELS levels.
_UNROLL_LEVELS = 8
_GROUP_LEVELS = 4
# Batches of at least twice this many entries are walked this many at a time (see _walk); the
# inner loop then steps _GROUP_LEVELS // _WALK_CHAINS levels of all of them (8 chains did not fit
# the small-loop threshold: ~5x slower).
_WALK_CHAINS = 4
# The CPU descent (see _descend_chained) follows this many queries at once, this many levels per
# inner loop step: 4 x 2 stays under the small-loop threshold; 4 x 4 or 8 x 1 do not (measured:
# ~250 us and ~70 us instead of ~15 us at P = 2**17, Q = 256).
_DESCENT_CHAINS = 4
_DESCENT_GROUP = 2
# The vectorised descent (see _descend_vector) takes this many levels per loop step; on CPU,
# descents of up to _DESCENT_CHAINED_MAX_CPU queries take the chained loop instead (measured in
# _descend's docstring).
_DESCENT_JUMP = 3
_DESCENT_CHAINED_MAX_CPU = 64


def _walk_max_batch() -> int:
    return 0


def _descent_chained_max() -> int:
    return 0


def _tuning() -> tuple:
    """The module's tuning values above, read when a jitted update is traced. Passed to the jitted
    helpers as a static argument, so that their compile caches key on them: changing one (tests
    compare the walk and vectorised paths this way) retraces instead of reusing the old path."""
    return (_walk_max_batch(), _DENSE_EXTRA_LEVELS, _DENSE_EXTRA_LEVELS_VECTOR, _UNROLL_LEVELS, _GROUP_LEVELS, _WALK_CHAINS, _DESCENT_CHAINS, _DESCENT_GROUP, _DESCENT_JUMP, _descent_chained_max())


def _dense_levels(batch: int, depth: int, walk: bool) -> int:
    """Number of top levels (depths ``0 .. k-1``) recomputed whole after a batch of ``batch`` writes."""
    extra = _DENSE_EXTRA_LEVELS if walk else _DENSE_EXTRA_LEVELS_VECTOR
    return max(0, min(depth, (max(batch, 1) - 1).bit_length() + extra))


def _padded_size(capacity: int) -> int:
    """Smallest power of two ``>= capacity``."""
    return 1 << max(0, (int(capacity) - 1).bit_length())


def _check_capacity(capacity) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
        raise TypeError(f"capacity: expected a Python int, got {type(capacity).__name__} {capacity!r}")
    capacity = int(capacity)
    if capacity < 1:
        raise ValueError(f"capacity: expected an int >= 1, got {capacity}")
    if capacity > 2**30:
        raise ValueError(f"capacity: at most 2**30 leaves are supported (int32 node ids), got {capacity}")
    return capacity


def _check_indices(indices, what: str = "indices") -> jax.Array:
    indices = _validate.index_array(indices, what)
    if indices.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D array [B] of leaf indices, got shape {indices.shape}")
    return _validate.integer_indices(what, indices)


def last_write_mask(indices: jax.Array, where: jax.Array | None = None) -> jax.Array:
    """Which entries of a batched write survive when later writes to the same index win.

    Args:
      indices: int[B] leaf indices; only equality matters, but active entries must be ``>= 0``
        (a negative index is treated as inactive).
      where: optional bool[B]; entries with ``False`` are not writes at all (they never win and
        never shadow an earlier entry).

    Returns:
      bool[B]: ``True`` at entry ``k`` iff ``where[k]`` and no later entry ``j > k`` with
      ``where[j]`` has ``indices[j] == indices[k]``. Deterministic; ``O(B log B)`` (one stable sort).
    """
    indices = jnp.asarray(indices, jnp.int32)
    (b,) = indices.shape
    if where is None:
        where = jnp.ones((b,), bool)
    if b == 1:
        return where
    # Inactive entries get the key -1 (a group of their own: they neither win nor hide an active
    # write); a stable sort keeps batch order within each index group, so the last one wins.
    group = jnp.where(where, indices, -1)
    order = jnp.argsort(group, stable=True)
    g_sorted = group[order]
    is_last_sorted = jnp.ones((b,), bool).at[:-1].set(g_sorted[:-1] != g_sorted[1:])
    keep_sorted = is_last_sorted & (g_sorted >= 0)
    return jnp.zeros((b,), bool).at[order].set(keep_sorted, unique_indices=True)


# ------------------------------------------------------------------------------------------------
# Heap updates. A heap is an array [2P, *row]: row n holds node n (row = () for SumTree / MinTree,
# (2,) for SumMinTree's (sum, min) pair); `combine(left, right)` maps two stacks of rows [m, *row]
# to their parents [m, *row], elementwise.


def _dense_top(nodes, combine, top: int):
    """Recompute depths ``0 .. top-1`` whole from depth ``top`` (one reshape-and-combine per level)
    and write them back with ONE ``dynamic_update_slice`` of rows ``1 .. 2**top - 1`` (in place)."""
    if top <= 0:
        return nodes
    row = nodes.shape[1:]
    level = nodes[1 << top : 2 << top]
    above = []
    for _ in range(top):
        pairs = level.reshape(-1, 2, *row)  # row m: the two children of node m of the level above
        level = combine(pairs[:, 0], pairs[:, 1])
        above.append(level)
    block = jnp.concatenate(above[::-1], axis=0)  # depth 0 (root, row 1) first
    return jax.lax.dynamic_update_slice(nodes, block, (1,) + (0,) * len(row))


def _dense_top_loop(nodes, combine, top: int):
    """:func:`_dense_top` as one scalar loop: nodes ``2**top - 1`` down to 1, each recomputed from
    its two children (children before parents). On CPU the loop compiles to one small kernel, where
    the vectorised version costs one executor step per level."""
    if top <= 0:
        return nodes
    row = nodes.shape[1:]
    zeros = (jnp.int32(0),) * len(row)  # int32 like every node index (also under jax_enable_x64)
    last = (1 << top) - 1

    def body(j, nodes):
        n = jnp.asarray(last - j, jnp.int32)  # (j is a Python int under jax.disable_jit)
        kids = jax.lax.dynamic_slice(nodes, (2 * n,) + zeros, (2,) + row)
        return jax.lax.dynamic_update_slice(nodes, combine(kids[:1], kids[1:]), (n,) + zeros)

    return jax.lax.fori_loop(0, last, body, nodes)


def _walk(nodes, combine, to_rows, capacity: int, indices, values, steps: int):
    """Sequential update: for k = 0 .. B-1 write leaf ``indices[k]`` with the row
    ``to_rows(values[k])`` unless the value is NaN or the index is outside ``[0, capacity)`` (then
    rewrite leaf 0's current row: a no-op), and recompute its ``steps`` nearest ancestors from their
    children, each a ``dynamic_slice`` / ``dynamic_update_slice`` of the heap. The heap is the
    ``lax.fori_loop`` carry, so XLA updates it in place; batch order makes the last write to a leaf
    win without any sort. Every per-entry decision is made inside the loop (scalar work in the one
    compiled loop kernel) rather than by separate vector ops before it, each of which costs about
    a microsecond of executor time per call on CPU.

    Batches of at least ``2 * _WALK_CHAINS`` entries are walked ``_WALK_CHAINS`` at a time: their
    leaves are written in batch order, then their ancestors are recomputed level by level, every
    entry of the group one level up before any goes further (so a shared ancestor is recomputed
    after all the group's writes below it, as in the one-at-a-time walk: the heaps are identical,
    tested). The independent chains of reads overlap. Measured at P = 2**17 inside a ``lax.scan``, us per
    update, chained vs one at a time: B = 64 1.8 vs 2.9, B = 256 5.2-5.3 vs 6.5-6.9, B = 1024
    17.0 vs 19.7."""
    p = nodes.shape[0] // 2
    row = nodes.shape[1:]
    zeros = (jnp.int32(0),) * len(row)  # int32 like every node index (also under jax_enable_x64)
    b = indices.shape[0]
    # A single group was slower than the one-at-a-time walk (4 entries in a scan: 0.7 vs 0.4 us).
    width = _WALK_CHAINS if b >= 2 * _WALK_CHAINS else 1
    padded = -(-b // width) * width
    if padded > b:  # skipped entries (NaN) complete the last group
        indices = jnp.pad(indices, (0, padded - b))
        values = jnp.pad(values, (0, padded - b), constant_values=jnp.nan)

    def up(nodes, ns, levels: int):
        ns = list(ns)
        for _ in range(levels):
            for c, n in enumerate(ns):
                n = n >> 1
                kids = jax.lax.dynamic_slice(nodes, (2 * n,) + zeros, (2,) + row)
                nodes = jax.lax.dynamic_update_slice(nodes, combine(kids[:1], kids[1:]), (n,) + zeros)
                ns[c] = n
        return nodes, tuple(ns)

    def write_leaf(nodes, k):
        i, v = indices[k], values[k]
        ok = (i >= 0) & (i < capacity) & ~jnp.isnan(v)
        n = (jnp.where(ok, i, 0) + p).astype(jnp.int32)
        cur = jax.lax.dynamic_slice(nodes, (n,) + zeros, (1,) + row)
        return jax.lax.dynamic_update_slice(nodes, jnp.where(ok, to_rows(v[None]), cur), (n,) + zeros), n

    def group(k, nodes):
        ns = []
        for c in range(width):
            nodes, n = write_leaf(nodes, k * width + c)
            ns.append(n)
        if width * steps <= _UNROLL_LEVELS:
            return up(nodes, ns, steps)[0]
        per_step = max(1, _GROUP_LEVELS // width)
        groups, rest = divmod(steps, per_step)
        nodes, ns = jax.lax.fori_loop(0, groups, lambda _, c: up(*c, per_step), (nodes, tuple(ns)))
        return up(nodes, ns, rest)[0]

    return jax.lax.fori_loop(0, padded // width, group, nodes)


def _vector_walk(nodes, combine, node0, rows, keep, touched, steps: int):
    """Vectorised update: scatter the ``keep`` entries' rows, then one gather + scatter per level
    for the ``steps`` nearest ancestors of the ``touched`` leaves. Untouched entries recompute leaf
    0's ancestors (a no-op); duplicate parents all receive the same value, so scatter order does
    not matter.

    The recomputed parents go through ``lax.optimization_barrier`` before the scatter so that XLA
    does not fuse the gather (a read of the array being written) into the scatter, which would make
    it copy the whole heap once per level.
    """
    p = nodes.shape[0] // 2
    leaf_ids = jnp.where(keep, node0, 3 * p)  # losers / ignored entries: past the end, dropped
    nodes = nodes.at[leaf_ids].set(rows, mode="drop")
    node = jnp.where(touched, node0, p)
    for _ in range(steps):
        node = node >> 1
        kids = nodes.reshape(p, 2, *nodes.shape[1:])[node]  # row n of the pair view: node n's children
        parent = jax.lax.optimization_barrier(combine(kids[:, 0], kids[:, 1]))
        nodes = nodes.at[node].set(parent, mode="promise_in_bounds")
    return nodes


@functools.partial(jax.jit, static_argnames=("combine", "to_rows", "capacity", "unique", "tuning"))
def _update_heap(nodes, combine, to_rows, capacity: int, indices, values, where, unique: bool, tuning: tuple = ()):
    """Write ``to_rows(values)`` at leaves ``indices`` (entries with a NaN value, an index outside
    ``[0, capacity)`` or ``where`` False are skipped; the last write to a leaf wins) and restore
    every ancestor: the walk (CPU, small batches) or the vectorised path below the top ``k``
    levels, then the top levels whole.

    Jitted (the functions, capacity and ``unique`` static) so that an eager call reuses one
    compiled update per shape: unjitted, every eager ``set`` traced and compiled its loops again
    (~270-330 ms per eager ``add`` / ``set_priorities`` of a prioritised buffer). Inside a jitted
    caller it is inlined; the compiled program is the same. ``tuning`` (:func:`_tuning`) is only a
    cache key."""
    p = nodes.shape[0] // 2
    depth = p.bit_length() - 1
    b = indices.shape[0]
    walk = b <= _walk_max_batch()
    top = _dense_levels(b, depth, walk)
    nan = jnp.full((), jnp.nan, values.dtype)
    if b == 1:
        # One entry compiled with copies of the heap, on both paths: the walk's loop body copied it
        # at every level, and the vectorised path (its one-row scatters and gathers rewritten into
        # slice updates and slices) 24-46 times (XLA:CPU; found with _kernel.accelerator_paths).
        # One extra skipped entry (NaN: a no-op) keeps the update in place.
        indices, values = jnp.concatenate([indices, indices]), jnp.concatenate([values, nan[None]])
        where = None if where is None else jnp.concatenate([where, where])
    if walk:
        if where is not None:
            values = jnp.where(where, values, nan)
        nodes = _walk(nodes, combine, to_rows, capacity, indices, values, depth - top)
        return _dense_top_loop(nodes, combine, top)
    active = (indices >= 0) & (indices < capacity) & ~jnp.isnan(values)
    if where is not None:
        active = active & where
    keep = active if unique else last_write_mask(indices, active)
    nodes = _vector_walk(nodes, combine, indices + p, to_rows(values), keep, active, depth - top)
    return _dense_top(nodes, combine, top)


def _check_write(tree, indices, values, where):
    indices = _check_indices(indices)
    values = jnp.asarray(values)
    if values.shape != indices.shape:
        raise ValueError(f"values: expected shape {indices.shape} (one value per index), got {values.shape}")
    if not jnp.issubdtype(values.dtype, jnp.floating):
        raise TypeError(f"values: expected a floating dtype, got {values.dtype}")
    if where is not None:
        where = jnp.asarray(where)
        if where.shape != indices.shape or where.dtype != jnp.bool_:
            raise ValueError(f"where: expected bool{list(indices.shape)}, got {where.dtype}{list(where.shape)}")
    return indices, values, where


def _set_trees(trees, indices, values, where, unique: bool):
    for t in trees[1:]:
        if t.capacity != trees[0].capacity:
            raise ValueError(f"trees: expected equal capacities, got {trees[0].capacity} and {t.capacity}")
    indices, values, where = _check_write(trees[0], indices, values, where)
    if indices.shape[0] == 0:
        return list(trees)
    # One loop per tree: with both heaps in one loop carry XLA copied both heaps once per level per
    # step (measured in the compiled HLO). SumMinTree interleaves the two in one heap instead.
    return [
        t.replace(nodes=_update_heap(t.nodes, t._combine, t._rows, t.capacity, indices, values.astype(t.dtype), where, unique, tuning=_tuning()))
        for t in trees
    ]


def set_sum_and_min(sum_tree: "SumTree", min_tree: "MinTree", indices, values, where=None, *, unique: bool = False):
    """Write the same leaf values into a :class:`SumTree` and a :class:`MinTree` of equal capacity.

    Equivalent to ``(sum_tree.set(...), min_tree.set(...))`` (or ``set_unique`` when ``unique``),
    with the same arguments, checks and duplicate rule. (:class:`SumMinTree` keeps both in one
    heap and updates them in one pass, about twice as fast.)

    Returns:
      ``(new_sum_tree, new_min_tree)``.

    Raises:
      ValueError: the capacities differ; otherwise as :meth:`SumTree.set`.
    """
    s, m = _set_trees([sum_tree, min_tree], indices, values, where, unique)
    return s, m


def _descend_step(node, q, left_sum, right_sum):
    """One level of the descent (scalars or arrays): go left when ``q < left_sum``, else subtract
    ``left_sum`` and go right; never step into an empty subtree (fall back to the other child; if
    both are empty, which only happens in an empty tree, go left). Returns ``(child, q)``."""
    go_left = jnp.where(q < left_sum, left_sum > 0, right_sum <= 0)
    return jnp.where(go_left, 2 * node, 2 * node + 1), jnp.where(go_left, q, q - left_sum)


def _descend_levels(nodes, chains, levels: int):
    """``levels`` descent steps for each ``(node, q)`` scalar pair in ``chains`` (see _descend)."""
    row = nodes.shape[1:]
    zeros = (jnp.int32(0),) * len(row)
    size = (2,) + (1,) * len(row)  # both children's sums only (column 0 of a SumMinTree row)
    chains = list(chains)
    for _ in range(levels):
        for c, (node, q) in enumerate(chains):
            kids = jax.lax.dynamic_slice(nodes, (2 * node,) + zeros, size).reshape(2)
            chains[c] = _descend_step(node, q, kids[0], kids[1])
    return tuple(chains)


def _descend_chained(nodes: jax.Array, q: jax.Array, u2: jax.Array | None = None) -> jax.Array:
    """CPU descent: a scalar loop over the queries, ``_DESCENT_CHAINS`` of them at a time.

    Each query's descent is a chain of dependent reads (one per level); the chains of the
    queries handled together are independent, so the CPU overlaps their memory accesses. The
    loop body (``_DESCENT_CHAINS`` queries x ``_DESCENT_GROUP`` levels per inner step) stays
    under XLA:CPU's small-loop threshold, so the whole descent runs as ONE compiled kernel instead
    of ~5 executor steps per level. Measured on a 2-core CPU, ``P = 2**17``, ``Q = 256``, one
    jitted draw + descent per call: 14-15 us against 31-37 us for a level-by-level vector loop
    (dispatch floor ~6 us), with identical results; the vector loop of :func:`_descend_vector`
    (3 levels per step) is faster from ~128 queries (see :func:`_descend`). With ``u2`` the
    descent restarts below level :func:`_restart_level` (see :func:`_restart`)."""
    p = nodes.shape[0] // 2
    depth = p.bit_length() - 1
    n = q.shape[0]
    width = _DESCENT_CHAINS
    padded = -(-n // width) * width
    qp = jnp.pad(q, (0, padded - n))  # query 0 is valid; the padding's results are dropped
    row = nodes.shape[1:]
    zeros = (jnp.int32(0),) * len(row)

    def levels(chains, count):
        groups, rest = divmod(count, _DESCENT_GROUP)
        chains = jax.lax.fori_loop(0, groups, lambda _, ch: _descend_levels(nodes, ch, _DESCENT_GROUP), chains)
        return _descend_levels(nodes, chains, rest)

    def run(start, qs, count, restart=None):
        """One scalar loop over the query groups: ``count`` levels from nodes ``start`` with queries
        ``qs`` (both [padded]); returns the nodes reached and, with ``restart``, the new queries."""

        def body(k, out):
            nodes_out, q_out = out
            ch = levels(tuple((start[k * width + c], qs[k * width + c]) for c in range(width)), count)
            if restart is not None:
                sums = [jax.lax.dynamic_slice(nodes, (node,) + zeros, (1,) * (1 + len(row))).reshape(()) for node, _ in ch]
                ch = tuple((node, _restart(sm, restart[k * width + c])) for c, ((node, _), sm) in enumerate(zip(ch, sums)))
            nodes_out = jax.lax.dynamic_update_slice(nodes_out, jnp.stack([node for node, _ in ch]), (k * width,))
            q_out = jax.lax.dynamic_update_slice(q_out, jnp.stack([q for _, q in ch]), (k * width,))
            return nodes_out, q_out

        return jax.lax.fori_loop(0, padded // width, body, (jnp.zeros((padded,), jnp.int32), jnp.zeros_like(qs)))

    ones = jnp.ones((padded,), jnp.int32)
    split = depth if u2 is None else _restart_level(depth)
    if split == depth:
        return (run(ones, qp, depth)[0] - p)[:n]
    # Two loops (each one kernel): the restart inside one loop with both halves made its body too
    # large for XLA:CPU's small-loop threshold (Q = 64 in a scan: 65-74 us instead of 31-36).
    node, q2 = run(ones, qp, split, restart=jnp.pad(u2, (0, padded - n)))
    return (run(node, q2, depth - split)[0] - p)[:n]


def _restart_level(depth: int) -> int:
    """Levels decided by the stratified query before :func:`_restart` (``depth``: none): about
    half the depth, at a step boundary of the vector descent (its remainder levels, then steps of
    ``_DESCENT_JUMP``); trees of fewer than 6 levels do not restart."""
    steps, rest = divmod(depth, _DESCENT_JUMP)
    if depth < 6:
        return depth
    jumps = min(steps, max(1, int((depth / 2 - rest) / _DESCENT_JUMP + 0.5)))
    return rest + _DESCENT_JUMP * jumps


def _restart(subtree_sum: jax.Array, u2: jax.Array) -> jax.Array:
    """The query that continues a descent inside a subtree of stored sum ``subtree_sum``:
    ``u2 * subtree_sum``, kept in ``[0, subtree_sum)`` (0 for an empty subtree), in ``u2``'s dtype.

    Why: a float32 query near ``total`` is a multiple of ``ulp(total) ~ total * 2**-24``, so a
    leaf narrower than that spacing (at ``2**20`` leaves of mean 1: leaves under ~0.06) is either
    missed by every query or given a whole spacing's probability, depending on where it sits.
    Replacing the rest of the query, once the descent has chosen a subtree of sum ``S``, by a
    fresh uniform times ``S`` keeps the probability of every leaf ``v_i / total`` (the first
    levels choose the subtree with probability ``S / total``, the rest the leaf with ``v_i / S``)
    and resolves leaves down to ``~S * 2**-23`` instead (the uniforms carry 23 bits)."""
    s = subtree_sum.astype(u2.dtype)
    q = u2 * s
    return jnp.where(q < s, q, jnp.where(s > 0, jnp.nextafter(s, jnp.zeros_like(s)), jnp.zeros_like(s)))


def _descend_jump(nodes: jax.Array, node: jax.Array, q: jax.Array, k: int):
    """``k`` levels of the descent for every query from ONE gather per query: the ``2**k``
    descendants ``k`` levels below ``node`` are rows ``node * 2**k ...`` of the heap, contiguous.

    The sums of the nodes in between are recomputed from them by the tree's own additions (every
    internal node holds exactly ``left + right`` in the tree dtype, recomputed from its children
    on every update), so each level compares with the very values :func:`_descend_step` would
    read and takes the same decisions, bit for bit (tested against the chained descent).
    ``nodes``: the heap, [2P] or [2P, 2] (sums in column 0; the rows are gathered whole, since
    slicing the column first copied all of it, 1 MB at P = 2**17, on every call). Returns
    ``(node k levels down, q, that node's stored sum)``.
    """
    rows = nodes.reshape(-1, 2**k, *nodes.shape[1:])[node]  # [Q, 2**k(, 2)]: level k below node
    below = [rows if nodes.ndim == 1 else rows[:, :, 0]]  # sums, left to right
    while below[-1].shape[1] > 2:
        v = below[-1]
        total = v[:, 0::2] + v[:, 1::2]
        if total.dtype.itemsize < 4:  # XLA may keep bf16/f16 sums in float32 (excess precision): round as stored
            info = jnp.finfo(total.dtype)
            total = jax.lax.reduce_precision(total, exponent_bits=info.nexp, mantissa_bits=info.nmant)
        below.append(total)
    went_right = []  # this step's decisions so far, one bool [Q] per level
    for level in reversed(below):  # [Q, 2], [Q, 4], ...: the next level's nodes under ``node``
        cols = [level[:, i] for i in range(level.shape[1])]
        for right in went_right:  # keep the half under the path taken so far
            half = len(cols) // 2
            cols = [jnp.where(right, cols[half + i], cols[i]) for i in range(half)]
        left_sum, right_sum = cols
        node, q = _descend_step(node, q, left_sum, right_sum)
        went_right.append((node & 1) == 1)
    return node, q, jnp.where(went_right[-1], right_sum, left_sum)


def _descend_vector(nodes: jax.Array, q: jax.Array, u2: jax.Array | None = None) -> jax.Array:
    """Vectorised descent: a ``lax.fori_loop`` over groups of ``_DESCENT_JUMP`` levels, one gather
    of ``2**_DESCENT_JUMP`` contiguous descendants per query per step (:func:`_descend_jump`), so
    ``ceil(log2(P) / 3)`` loop steps instead of ``log2(P)`` (a loop step launches kernels on
    GPU/TPU, and is an executor step on CPU). Not a Python-unrolled loop: unrolled, XLA fused each
    level's gather with a recomputation of every earlier level's selects: ``O(depth**2)`` work.
    With ``u2`` the descent restarts below level :func:`_restart_level` (see :func:`_restart`)."""
    p = nodes.shape[0] // 2
    depth = p.bit_length() - 1
    steps, rest = divmod(depth, _DESCENT_JUMP)
    carry = (jnp.ones(q.shape, jnp.int32), q)
    # The remainder levels are taken first, from the root, so that the leaf ids come out of the
    # loop: taken last, XLA fused that step's gather and selects into every consumer of the ids,
    # and a gather of items then redid them per element (measured at Q = 1024: +50-80 us).
    if rest:
        carry = _descend_jump(nodes, *carry, rest)[:2]
    # The restart (if any) happens at the end of loop step ``last``, from the sum of the node the
    # step reached (one where on [Q] per step, fused into it: a second loop and a gather of the
    # node sums cost another executor step and kernel each).
    last = -1 if u2 is None or _restart_level(depth) == depth else (_restart_level(depth) - rest) // _DESCENT_JUMP - 1

    def step(i, c):
        node, q, s = _descend_jump(nodes, *c, _DESCENT_JUMP)
        return node, q if last < 0 else jnp.where(i == last, _restart(s, u2), q)

    if steps:
        carry = jax.lax.fori_loop(0, steps, step, carry)
    return carry[0] - p


@functools.partial(jax.jit, static_argnames=("tuning",))
def _descend(nodes: jax.Array, q: jax.Array, u2: jax.Array | None = None, tuning: tuple = ()) -> jax.Array:
    """The descent of :meth:`SumTree.find` for clamped queries ``q`` ([Q], the tree dtype promoted to at
    least float32): leaf ids int32[Q]. With ``u2`` ([Q] in ``[0, 1)``, same dtype) the descent
    restarts halfway down (:func:`_restart`).

    ``nodes`` is a heap [2P] of sums, or [2P, 2] with the sums in column 0 (:class:`SumMinTree`).
    On CPU, batches up to ``_DESCENT_CHAINED_MAX_CPU`` (64) queries take the chained scalar loop
    (:func:`_descend_chained`, one kernel), larger ones and other backends the vector loop
    (:func:`_descend_vector`, 3 levels per step); both make the same decisions in the same order,
    so they return the same leaves (tested). Measured at P = 2**17 on the 2-core CPU
    (2026-12-01, two runs), draw and descent, chained vs vector, us inside a ``lax.scan`` / per
    jitted call: Q = 8 5-11 vs 13-30 / 16-28 vs 28-48; Q = 64 20-22 vs 27-32 / 27-28 vs 34-41;
    Q = 128 46-49 vs 42-43 / 56-82 vs 60-78; Q = 256 57-59 vs 37-38 / 66-77 vs 66-70; Q = 1024
    118-136 vs 71-72 / 165-191 vs 120-126; Q = 2048 306-474 vs 130-195 / 313-530 vs 203-314.
    Jitted so that eager calls reuse one compiled loop.
    """
    if 0 < q.shape[0] <= _descent_chained_max():
        return _descend_chained(nodes, q, u2)
    return _descend_vector(nodes, q, u2)


def _query_dtype(dtype):
    """Queries of a bfloat16 / float16 tree are float32 (compared with the stored sums converted
    up): a 1,000-leaf bfloat16 tree reached 442 of its leaves with bfloat16 queries."""
    return jnp.promote_types(dtype, jnp.float32)


def _find(total, nodes, dtype, queries, u2=None):
    queries = jnp.asarray(queries)
    if queries.ndim != 1:
        raise ValueError(f"queries: expected a 1-D array [Q], got shape {queries.shape}")
    if not jnp.issubdtype(queries.dtype, jnp.floating):
        raise TypeError(f"queries: expected a floating dtype, got {queries.dtype}")
    q = queries.astype(_query_dtype(dtype))
    below_total = jnp.nextafter(total.astype(q.dtype), jnp.zeros_like(q, shape=()))
    q = jnp.where(jnp.isnan(q), 0, q)
    q = jnp.clip(q, 0, jnp.maximum(below_total, 0))
    return _descend(nodes, q, u2, tuning=_tuning())


def _sample_stratified(total, nodes, dtype, key, batch_size):
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size: expected a Python int >= 1, got {batch_size!r}")
    u, u2 = jax.random.uniform(key, (2, int(batch_size)), jnp.float32)
    qdt = _query_dtype(dtype)
    # The stratum width as a product with 1/B (not a division): XLA rewrites a division by a
    # constant into that product under jit but not in an eager op, which changed a last bit of
    # the queries, and so at boundaries the sampled leaf, between jit and eager.
    width = total.astype(qdt) * jnp.asarray(1.0 / batch_size, qdt)
    q = (jnp.arange(batch_size, dtype=qdt) + u.astype(qdt)) * width
    return _find(total, nodes, dtype, q, u2.astype(qdt))


class _ReductionTree(flax.struct.PyTreeNode):
    """Shared storage and batched update of the trees (see module doc)."""

    nodes: jax.Array  # shape=(2 * P, *row), dtype=float32 (or create's dtype): heap; row 1 root, leaf i at row P + i
    capacity: int = flax.struct.field(pytree_node=False)
    # Static name of the reduction ("sum", "min", "sum_min"). It makes the tree structures of the
    # classes differ: JAX 0.10.2 compares the structures of two registered dataclasses with the
    # same fields as EQUAL whatever their classes (while hashing them differently), so a jitted
    # function called with a SumTree and then a MinTree of one capacity could get the executable
    # compiled for the other class from jit's cache (measured: 57 of 400 such calls).
    reduction: str = flax.struct.field(pytree_node=False)

    _identity: ClassVar[tuple]  # one row of identity values
    _reduction: ClassVar[str]  # the value of the ``reduction`` field
    _row_ndim: ClassVar[int] = 0  # 0: one value per node; 1: a row of values per node

    @staticmethod
    def _combine(left: jax.Array, right: jax.Array) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def _rows(cls, values: jax.Array) -> jax.Array:  # pragma: no cover - abstract
        """Leaf rows [B, *row] for leaf values [B] (already checked floating)."""
        raise NotImplementedError

    @classmethod
    def create(cls, capacity: int, dtype=jnp.float32):
        """An empty tree: every node holds the reduction identity (0 for sums, +inf for minima).

        Args:
          capacity: Python int >= 1, the number of addressable leaves (flat slot ids
            ``0 .. capacity - 1``). Storage is padded to the next power of two.
          dtype: a floating dtype (float32 default; float64 needs ``jax_enable_x64``). Every
            internal sum is stored, and so rounded, in this dtype, and the last positive leaf of a
            subtree gains or loses that subtree's rounding: with bfloat16 (8-bit significand) or
            float16 sums, sampling is approximate (a review measured single leaves drawn 0 to 13x
            their due in skewed bfloat16 trees); the prioritised buffers use float32. The total
            must stay finite (float16 sums overflow at 65504): past ``inf`` the descent is
            degenerate.

        Raises:
          TypeError / ValueError: capacity not an int in ``[1, 2**30]``, or dtype not floating.
        """
        capacity = _check_capacity(capacity)
        if not jnp.issubdtype(jnp.dtype(dtype), jnp.floating):
            raise TypeError(f"dtype: expected a floating dtype, got {jnp.dtype(dtype)}")
        row = jnp.asarray(cls._identity, dtype).reshape((-1,) * cls._row_ndim)
        nodes = jnp.broadcast_to(row, (2 * _padded_size(capacity),) + row.shape)
        return cls(nodes=jnp.array(nodes), capacity=capacity, reduction=cls._reduction)

    # -- static shape facts ----------------------------------------------------------------------

    @property
    def padded_capacity(self) -> int:
        """``P``: capacity rounded up to a power of two (Python int)."""
        return self.nodes.shape[self.nodes.ndim - 1 - self._row_ndim] // 2

    @property
    def depth(self) -> int:
        """Number of levels below the root: ``log2(P)`` (Python int)."""
        return self.padded_capacity.bit_length() - 1

    @property
    def dtype(self):
        return self.nodes.dtype

    def _node_slice(self, sl):
        """``nodes`` indexed by ``sl`` along the node axis (leading stacked axes kept)."""
        return self.nodes[(..., sl) + (slice(None),) * self._row_ndim]

    @property
    def levels(self) -> tuple:
        """The heap split by depth: ``levels[l]`` = rows ``2**l .. 2**(l+1) - 1`` (copies; for tests/debugging)."""
        return tuple(self._node_slice(slice(1 << l, 2 << l)) for l in range(self.depth + 1))

    def _set(self, indices, values, where, unique):
        (tree,) = _set_trees([self], indices, values, where, unique=unique)
        return tree

    # -- writes ----------------------------------------------------------------------------------

    def set(self, indices: jax.Array, values: jax.Array, where: jax.Array | None = None):
        """Write leaf values and recompute their ancestors from their children.

        Args:
          indices: int[B], flat leaf ids. Entries outside ``[0, capacity)`` are ignored (padding
            leaves are never written).
          values: floating [B], converted to the tree's dtype (an integer array raises). A NaN
            value is not written: the entry is ignored, as if ``where`` were False, so NaN never
            enters the tree. For a sum the others must be finite and ``>= 0``: the tree does not
            sanitise them (callers such as :class:`jaxbuffers.PrioritisedReplayBuffer` apply their
            own documented policy).
          where: optional bool[B]; entries with ``False`` are ignored entirely.

        Duplicate indices within the batch are resolved deterministically: the LAST (highest batch
        position) active write to an index wins.

        Cost ``O(B log P)``, never ``O(capacity)``; in place when the tree is donated. The top
        ``k ~ log2 B`` levels are recomputed whole (``2**k - 1 = O(B)`` nodes) and only the levels
        below are updated per entry: on CPU, batches of up to 4096 entries one entry after another
        in a ``lax.fori_loop`` (batch order makes the last write win); larger batches (and every
        batch on other backends) with one vectorised gather/scatter per level after a stable sort
        that picks the last write. Both paths give the same result bit for bit (tested).

        Returns:
          A new tree.

        Raises:
          ValueError / TypeError (at trace time): indices not 1-D integer, values shape not equal
          to indices shape, values not floating, ``where`` not bool[B].
        """
        return self._set(indices, values, where, unique=False)

    def set_unique(self, indices: jax.Array, values: jax.Array, where: jax.Array | None = None):
        """:meth:`set` for callers that guarantee the active indices are distinct (no sort).

        Same arguments, checks and result as :meth:`set` when no active index repeats (e.g. the
        slots of one ring-buffer write). With repeated active indices the winner is unspecified.
        """
        return self._set(indices, values, where, unique=True)


class _ScalarTree(_ReductionTree):
    """A tree with one value per node: heap ``nodes`` of shape ``(2 P,)``."""

    @classmethod
    def _rows(cls, values):
        return values

    def root(self) -> jax.Array:
        """The reduction over all leaves: scalar of the tree's dtype."""
        return self.nodes[..., 1]

    def get(self, indices: jax.Array) -> jax.Array:
        """Leaf values at ``indices`` (int[B] in ``[0, capacity)``); returns dtype[B].

        Out-of-range indices are clamped to ``[0, P)``; callers must pass valid slot ids.
        """
        indices = _check_indices(indices)
        p = self.padded_capacity
        return self.nodes[jnp.clip(indices, 0, p - 1) + p]

    def leaves(self) -> jax.Array:
        """All ``capacity`` leaf values, dtype[capacity] (an ``O(capacity)`` copy: for tests/debugging)."""
        p = self.padded_capacity
        return self.nodes[..., p : p + self.capacity]


class SumTree(_ScalarTree):
    """Sum tree over ``capacity`` non-negative leaves with batched prefix-sum search.

    Fields:
      nodes: shape=(2 * P,), dtype=float32: the heap (see the module docstring); ``nodes[1]`` is
        the total, leaf ``i`` is ``nodes[P + i]``.
      capacity: static Python int.
      reduction: static, ``"sum"`` (see ``_ReductionTree.reduction``).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> t = SumTree.create(3).set(jnp.array([0, 1, 2]), jnp.array([0.5, 1.5, 2.0]))
      >>> t.total().item()
      4.0
      >>> t.find(jnp.array([0.0, 0.5, 3.9])).tolist()
      [0, 1, 2]
    """

    _identity: ClassVar[tuple] = (0.0,)
    _reduction: ClassVar[str] = "sum"

    @staticmethod
    def _combine(left, right):
        return left + right

    def total(self) -> jax.Array:
        """Sum of all leaves (scalar, tree dtype); exactly the pairwise sum held at the root."""
        return self.root()

    def find(self, queries: jax.Array) -> jax.Array:
        """Leaf index ``i`` whose prefix-sum interval ``[S_i, S_i + v_i)`` contains each query.

        ``S_i = sum_{j < i} v_j``. Queries are first mapped into ``[0, total)``: NaN and negative
        queries become 0, queries ``>= total`` become the largest float below ``total``. The
        descent goes left when ``q < left_sum`` and otherwise subtracts ``left_sum`` and goes
        right; if the chosen child's subtree sums to zero it takes the other child instead. Since
        every internal node is exactly ``left + right`` of non-negative values, a node with a
        positive sum always has a positive child, so whenever ``total > 0`` the result is a leaf
        with a POSITIVE value (never an empty or padding leaf), whatever the rounding.

        If ``total == 0`` (an empty tree, or one whose only positive leaves are float32 subnormals,
        which XLA:CPU flushes to zero in sums) every query returns leaf 0.

        Resolution: a query is one float (at least float32; a bfloat16 / float16 tree compares
        float32 queries with its stored sums), so near a prefix sum ``S`` only leaves wider than
        about ``S * 2**-24`` can be told apart; narrower ones are reached by some float queries
        and not by others. :meth:`sample_stratified` is not limited by this (it restarts the
        descent inside the subtree it reached).

        Args:
          queries: floating [Q].

        Returns:
          int32[Q] leaf indices in ``[0, capacity)``.
        """
        return _find(self.total(), self.nodes, self.dtype, queries)

    def sample_stratified(self, key: jax.Array, batch_size: int) -> jax.Array:
        """Stratified proportional sampling: one draw per stratum of the total, resolved to the leaf.

        Draw ``k`` starts from the query ``(k + u_k) * total / B`` (``u_k ~ U[0, 1)`` i.i.d.), which
        lies in stratum ``[k total / B, (k + 1) total / B)`` (Schaul et al. 2016, B.2.1). That query
        chooses the path through the top levels (about half the depth; trees of at most 32 padded
        leaves use it all the way, as :meth:`find` does); below them the descent continues with a second
        uniform ``u'_k`` times the sum of the subtree reached. Each index therefore has marginal
        probability ``v_i / total`` averaged over strata, and draw ``k`` lies in a subtree that
        intersects stratum ``k``.

        Why the second uniform: one float32 query near ``total`` is a multiple of about
        ``total * 2**-24``, so leaves narrower than that (at ``2**20`` leaves of mean 1, those
        under ~0.06: priority ``1e-3`` at alpha 0.6 is 0.016) were sampled 0 to ~4x their due
        depending only on their position. With the restart a leaf is resolved to about
        ``2**-23`` of its subtree's sum (the uniforms carry 23 bits; ``2**-23 * total / 2**(depth / 2)``
        for an even tree), where the tree's own float32 sums allow it (see :meth:`create`).

        Args:
          key: a PRNG key.
          batch_size: static Python int >= 1.

        Returns:
          int32[batch_size] leaf indices with positive values (leaf 0 when ``total() == 0``). The
          same under ``jit`` and eagerly (the queries are computed by the same operations).
        """
        return _sample_stratified(self.total(), self.nodes, self.dtype, key, batch_size)


class MinTree(_ScalarTree):
    """Min tree over ``capacity`` leaves; unused leaves hold ``+inf``.

    Same layout and update rule as :class:`SumTree`. :meth:`min` is the minimum over all leaves,
    ``+inf`` if no leaf was written. Used for the smallest sampling probability over the valid
    slots of a prioritised buffer (the importance-weight normaliser) in ``O(log capacity)`` per
    update instead of an ``O(capacity)`` reduction per sample.
    """

    _identity: ClassVar[tuple] = (float("inf"),)
    _reduction: ClassVar[str] = "min"

    @staticmethod
    def _combine(left, right):
        return jnp.minimum(left, right)

    def min(self) -> jax.Array:
        """Minimum over all leaves (scalar, tree dtype; ``+inf`` when empty)."""
        return self.root()


class SumMinTree(_ReductionTree):
    """A sum tree and a min-over-positive-leaves tree in ONE heap: what prioritised replay needs.

    Fields:
      nodes: shape=(2 * P, 2), dtype=float32: row ``n`` is ``(sum, min)`` of node ``n``'s subtree
        (see the module docstring for the heap layout); row 1 is the root, leaf ``i`` is row
        ``P + i``.
      capacity: static Python int.
      reduction: static, ``"sum_min"``.

    Leaf ``i`` with value ``v_i >= 0`` holds the row ``(v_i, v_i if v_i > 0 else +inf)``, and every
    internal row is ``(left_sum + right_sum, min(left_min, right_min))``, so :meth:`total` is
    ``sum_i v_i`` (pairwise, recomputed from the children, no drift) and :meth:`min` is the
    smallest POSITIVE leaf (``+inf`` if none): the importance-weight normaliser over the slots that
    can be sampled (a zero leaf, e.g. an empty slot or an invalid window, is never sampled).

    Same methods, arguments, errors and duplicate rule as :class:`SumTree` (``set``,
    ``set_unique``, ``get``, ``find``, ``sample_stratified``), plus :meth:`min`. One heap instead
    of a :class:`SumTree` and a :class:`MinTree`: one sequential walk updates both (about half the
    work of :func:`set_sum_and_min`, measured) and a jitted function carries one array instead of
    two (less dispatch time).

    Example:
      >>> import jax.numpy as jnp
      >>> t = SumMinTree.create(4).set(jnp.array([0, 1, 2]), jnp.array([0.5, 0.0, 2.0]))
      >>> t.total().item(), t.min().item()
      (2.5, 0.5)
      >>> t.find(jnp.array([0.0, 0.5, 2.4])).tolist()
      [0, 2, 2]
    """

    _identity: ClassVar[tuple] = (0.0, float("inf"))
    _reduction: ClassVar[str] = "sum_min"
    _row_ndim: ClassVar[int] = 1

    @staticmethod
    def _combine(left, right):
        # Rows [..., 2]: column 0 sums, column 1 minima (exact per column).
        return jnp.concatenate([left[..., :1] + right[..., :1], jnp.minimum(left[..., 1:], right[..., 1:])], axis=-1)

    @classmethod
    def _rows(cls, values):
        return jnp.stack([values, jnp.where(values > 0, values, jnp.inf).astype(values.dtype)], axis=-1)

    def total(self) -> jax.Array:
        """Sum of all leaves (scalar, tree dtype); exactly the pairwise sum held at the root."""
        return self.nodes[..., 1, 0]

    def min(self) -> jax.Array:
        """Smallest positive leaf (scalar, tree dtype; ``+inf`` when no leaf is positive)."""
        return self.nodes[..., 1, 1]

    def get(self, indices: jax.Array) -> jax.Array:
        """Leaf values at ``indices`` (int[B] in ``[0, capacity)``); returns dtype[B].

        Out-of-range indices are clamped to ``[0, P)``; callers must pass valid slot ids.
        """
        indices = _check_indices(indices)
        p = self.padded_capacity
        return self.nodes[jnp.clip(indices, 0, p - 1) + p, 0]

    def leaves(self) -> jax.Array:
        """All ``capacity`` leaf values, dtype[capacity] (an ``O(capacity)`` copy: for tests/debugging)."""
        p = self.padded_capacity
        return self.nodes[..., p : p + self.capacity, 0]

    def find(self, queries: jax.Array) -> jax.Array:
        """As :meth:`SumTree.find` (same clamping and guarantees) on the sum column."""
        return _find(self.total(), self.nodes, self.dtype, queries)

    def sample_stratified(self, key: jax.Array, batch_size: int) -> jax.Array:
        """As :meth:`SumTree.sample_stratified`: int32[batch_size] leaves with positive values."""
        return _sample_stratified(self.total(), self.nodes, self.dtype, key, batch_size)
