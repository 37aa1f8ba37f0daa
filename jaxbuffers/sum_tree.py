r"""On-device sum tree with minima: `SumMinTree`, the index of every prioritised buffer.

A complete binary tree over `P = 2 ** ceil(log2(capacity))` leaves (the capacity padded to a power of two) is stored
one array per depth: `levels[l]` has shape `[2**l, 2]`, so `levels[0]` is the root, node `n` of depth `l` has children
`2n` and `2n + 1` of depth `l + 1`, and leaf `i` (`0 <= i < capacity`) is row `i` of `levels[-1]`. Each row is the pair
`(sum, min)` of its subtree: leaf `i` with value $v_i \ge 0$ holds $(v_i, v_i)$ if $v_i > 0$ and $(0, +\infty)$
otherwise, and every internal row is

$$
(\mathrm{sum}, \mathrm{min})^{(l)}_n = \left(\mathrm{sum}^{(l+1)}_{2n} + \mathrm{sum}^{(l+1)}_{2n+1},\
\min(\mathrm{min}^{(l+1)}_{2n}, \mathrm{min}^{(l+1)}_{2n+1})\right).
$$

So the root holds $\sum_i v_i$ (for sampling) and the smallest POSITIVE leaf (the importance-weight normaliser over
the slots that can be sampled). The padding leaves `[capacity, P)` hold the identity `(0, +inf)` forever.

One array per depth, not one heap: an update reads depth `l + 1` and writes depth `l`, two different buffers, so
every write is an in-place scatter under donation on every backend, and each gather and scatter spans the rows of one
depth only. In a single heap array each step would gather from and scatter into the same buffer, which copies the
whole heap (or, with every scatter ordered before the next gather, makes every gather and scatter span the whole tree).

Invariant: every internal row is the combination of its children in the tree's dtype.
`SumMinTree.set` and `SumMinTree.set_run` recompute the ancestors of the written leaves from their children (never by
adding deltas), so the root never drifts. A batch of `B` writes at any indices costs `O(B log(P / B) + B log B)` (each
depth of more than `B` rows gathers and scatters `B` ancestors; the depths of at most `B` rows, `2B` rows together, are
recomputed whole). The ancestors of a run of consecutive leaves are a run of consecutive rows at every depth, so
`set_run` (the ring write of every buffer's `add`) reads and writes slices instead: `O(B + log P)`, no gather or
scatter. Both work in place when the tree is donated. The tree is a pure pytree: it works under `jit`, `lax.scan` and
`vmap`.

References:
  Schaul et al., "Prioritized Experience Replay", ICLR 2016, appendix B.2.1 (prefix-sum search and
  stratified sampling).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from jaxbuffers import _compiled, _validate

__all__ = ["SumMinTree", "last_write_mask"]


def last_write_mask(indices: jax.Array, where: jax.Array | None = None, bound: int | None = None) -> jax.Array:
    """Which entries of a batched write survive when later writes to the same index win.

    Args:
      indices: int[B] indices; only equality matters, but active entries must be `>= 0` (a
        negative index is treated as inactive).
      where: optional bool[B]; entries with `False` are not writes at all (they never win and
        never shadow an earlier entry).
      bound: optional static Python int: a promise that every active index is `< bound`. When
        `(bound + 1) * B <= 2**31` the entries are ordered by sorting one int32 key,
        `(index + 1) * B + k` (`0` for inactive entries), instead of a stable sort of the indices
        that carries the batch positions along: the same order, from a one-operand sort.

    Returns:
      bool[B]: `True` at entry `k` iff `where[k]` and no later entry `j > k` with `where[j]` has
      `indices[j] == indices[k]`. Deterministic; `O(B log B)` (one sort).
    """
    indices = jnp.asarray(indices, jnp.int32)
    (b,) = indices.shape
    where = jnp.ones((b,), bool) if where is None else where
    # Inactive entries get the key -1 (never a winner); ordering by index, then batch position, puts the last
    # write of each index at the end of its group.
    group = jnp.where(where & (indices >= 0), indices, -1)
    if bound is not None and (bound + 1) * b <= 2**31:
        key = jnp.sort((group + 1) * b + jnp.arange(b, dtype=jnp.int32))
        g, order = key // b - 1, key % b
    else:
        order = jnp.argsort(group, stable=True)
        g = group[order]
    last = jnp.ones((b,), bool).at[:-1].set(g[:-1] != g[1:]) & (g >= 0)
    return jnp.zeros((b,), bool).at[order].set(last, unique_indices=True)


def _combine(left: jax.Array, right: jax.Array) -> jax.Array:
    """Parent rows `[..., 2]` of two stacks of child rows: sums added, minima taken."""
    return jnp.stack([left[..., 0] + right[..., 0], jnp.minimum(left[..., 1], right[..., 1])], axis=-1)


def _rows(values: jax.Array) -> jax.Array:
    """Leaf rows `[B, 2]` of leaf values `[B]`: `(v, v)` for positive `v`, `(v, +inf)` otherwise."""
    return jnp.stack([values, jnp.where(values > 0, values, jnp.inf).astype(values.dtype)], axis=-1)


def _write_slice(level: jax.Array, lo: jax.Array, rows: jax.Array, write: jax.Array) -> jax.Array:
    """`level` with rows `[lo, lo + len(rows))` set to `rows` where `write` (bool per row), kept elsewhere."""
    kept = jax.lax.dynamic_slice_in_dim(level, lo, rows.shape[0])
    return jax.lax.dynamic_update_slice_in_dim(level, jnp.where(write[:, None], rows, kept), lo, 0)


def _recompute_slice(levels: list, l: int, lo: jax.Array, width: int) -> jax.Array:
    """Depth `l` with rows `[lo, lo + width)` recomputed from their children (rows `[2 lo, 2 lo + 2 width)` of `l + 1`)."""
    kids = jax.lax.dynamic_slice_in_dim(levels[l + 1], 2 * lo, 2 * width).reshape(width, 2, 2)
    return jax.lax.dynamic_update_slice_in_dim(levels[l], _combine(kids[:, 0], kids[:, 1]), lo, 0)


def _restart_level(depth: int) -> int:
    """Levels decided by the stratified query before the descent restarts (`depth`: never):
    half the depth; trees of fewer than 6 levels (at most 32 padded leaves) do not restart."""
    return depth if depth < 6 else depth // 2


def _restart(subtree_sum: jax.Array, u2: jax.Array) -> jax.Array:
    """The query that continues a descent inside a subtree of stored sum `subtree_sum`:
    `u2 * subtree_sum`, kept in `[0, subtree_sum)` (0 for an empty subtree).

    Why: a float32 query near `total` is a multiple of `ulp(total) ~ total * 2**-24`, so a leaf
    narrower than that spacing is either missed by every query or given a whole spacing's
    probability, depending on where it sits. Replacing the rest of the query, once the descent has
    chosen a subtree of sum `S`, by a fresh uniform times `S` keeps every leaf's probability
    `v_i / total` (the first levels choose the subtree with probability `S / total`, the rest the
    leaf with `v_i / S`) and resolves leaves down to `~S * 2**-23` (the uniforms carry 23 bits).
    """
    s = subtree_sum.astype(u2.dtype)
    q = u2 * s
    zero = jnp.zeros_like(s)
    return jnp.where(q < s, q, jnp.where(s > 0, jnp.nextafter(s, zero), zero))


def _descend(levels: tuple, q: jax.Array, u2: jax.Array | None = None) -> jax.Array:
    """Leaf ids int32[Q] of clamped queries `q` [Q], one vectorised step per depth: left when
    `q < left_sum`, else right with `q - left_sum`, never into an empty subtree. With `u2` ([Q] in
    `[0, 1)`) the query is replaced at `_restart_level` by `_restart`.

    The steps run in one `fori_loop` whose body reads the children of depth `l` through a
    `lax.switch` on `l` (the depths are arrays of different shapes): one compiled step, however
    deep the tree.
    """
    depth = len(levels) - 1
    if depth == 0:
        return jnp.zeros(q.shape, jnp.int32)
    children = [lambda node, kids=kids: kids.reshape(-1, 2, 2)[node, :, 0].astype(q.dtype) for kids in levels[1:]]

    def step(l, carry):
        node, q = carry
        sums = jax.lax.switch(l, children, node)  # [Q, 2]: left and right child sums
        left, right = sums[:, 0], sums[:, 1]
        go_left = jnp.where(q < left, left > 0, right <= 0)
        return jnp.where(go_left, 2 * node, 2 * node + 1), jnp.where(go_left, q, q - left)

    split = depth if u2 is None else _restart_level(depth)
    node, q = jax.lax.fori_loop(0, split, step, (jnp.zeros(q.shape, jnp.int32), q))
    if split < depth:
        node, q = jax.lax.fori_loop(split, depth, step, (node, _restart(levels[split][node, 0], u2)))
    return node


class SumMinTree(flax.struct.PyTreeNode):
    """Sums and minima over `capacity` non-negative leaves, one array per depth (see the module doc).

    Build it with `SumMinTree.create`; every method is pure and returns a new tree or arrays.

    Example:
      >>> import jax.numpy as jnp
      >>> t = SumMinTree.create(4).set(jnp.array([0, 1, 2]), jnp.array([0.5, 0.0, 2.0]))
      >>> t.total().item(), t.min().item()
      (2.5, 0.5)
      >>> t.find(jnp.array([0.0, 0.5, 2.4])).tolist()
      [0, 2, 2]
    """

    levels: tuple  # levels[l]: shape=(2**l, 2), float32 (or create's dtype): row n = (sum, min) of node n at depth l; levels[0] the root, levels[-1] the P leaves
    capacity: int = flax.struct.field(pytree_node=False)

    @classmethod
    def create(cls, capacity: int, dtype=jnp.float32) -> "SumMinTree":
        """An empty tree: every row of every depth holds the identity `(0, +inf)`.

        Args:
          capacity: Python int in `[1, 2**30]`, the number of leaves (ids `0 .. capacity - 1`);
            storage is padded to the next power of two.
          dtype: a floating dtype (float32 default). Sums are rounded in it, so bfloat16 or float16
            trees sample only approximately; the total must stay finite.

        Raises:
          ValueError: capacity not an int in `[1, 2**30]`. TypeError: dtype not floating.
        """
        capacity = _validate.static_int("capacity", capacity, maximum=2**30)
        dtype = _validate.storable_dtype("dtype", dtype)
        identity = jnp.array([0.0, jnp.inf], dtype)
        depth = (capacity - 1).bit_length()
        return cls(levels=tuple(jnp.tile(identity, (1 << l, 1)) for l in range(depth + 1)), capacity=capacity)

    @property
    def padded_capacity(self) -> int:
        """`P`: capacity rounded up to a power of two (Python int)."""
        return self.levels[-1].shape[-2]

    @property
    def depth(self) -> int:
        """Number of levels below the root: `log2(P)` (Python int)."""
        return len(self.levels) - 1

    @property
    def dtype(self):
        """The dtype of the stored sums and minima."""
        return self.levels[0].dtype

    @property
    def query_dtype(self):
        """Queries are at least float32: bfloat16 queries miss most leaves of a bfloat16 tree."""
        return jnp.promote_types(self.dtype, jnp.float32)

    def total(self) -> jax.Array:
        """Sum of all leaves (scalar, tree dtype): exactly the pairwise sum held at the root."""
        return self.levels[0][..., 0, 0]

    def min(self) -> jax.Array:
        """Smallest positive leaf (scalar, tree dtype; `+inf` when no leaf is positive)."""
        return self.levels[0][..., 0, 1]

    def leaves(self) -> jax.Array:
        """All `capacity` leaf values, dtype[capacity] (an `O(capacity)` copy: for tests)."""
        return self.levels[-1][..., : self.capacity, 0]

    @_compiled.method()
    def get(self, indices) -> jax.Array:
        """Leaf values at `indices` (int[B]): dtype[B].

        Indices outside `[0, capacity)` are clamped into it (as every buffer's reads).

        Raises:
          TypeError / ValueError: `indices` not a 1-D integer array.
        """
        i = _validate.index_vector("indices", indices)
        return self.levels[-1][jnp.clip(i, 0, self.capacity - 1), 0]

    @_compiled.method("distinct")
    def set(self, indices, values, where=None, *, distinct: bool = False) -> "SumMinTree":
        """Write leaf values and recompute their ancestors from their children.

        Args:
          indices: int[B] leaf ids. Entries outside `[0, capacity)` are ignored.
          values: floating [B], converted to the tree's dtype. A NaN value is not written (the entry is ignored, as
            if `where` were False), so NaN never enters the tree; a negative value (`-inf` included) is written as 0
            (an empty leaf) and `+inf` as the dtype's largest finite value, so every leaf stays finite and `>= 0`
            (the prioritised buffers apply their own priority policy first).
          where: optional bool[B]; entries with `False` are ignored.
          distinct: static bool; `True` promises that no two active entries share an index (the slots of a ring
            write), which skips the `O(B log B)` sort that finds the last write of each index. Duplicates then leave
            a consistent tree holding one of their values, which one unspecified.

        Returns:
          A new tree; of duplicate indices the LAST active entry wins. Cost `O(B log P + B log B)`, `O(B log P)`
          with `distinct`.

        Raises (at trace time):
          TypeError / ValueError: indices not 1-D integer, values not floating of the indices'
          shape, `where` not bool[B] (each a list, a numpy or JAX array, or a CPU torch tensor); `distinct` not a
          Python bool.
        """
        distinct = _validate.static_bool("distinct", distinct)
        indices = _validate.index_vector("indices", indices)
        (b,) = indices.shape
        values = _validate.vector("values", values, b, "floating").astype(self.dtype)
        active = (indices >= 0) & (indices < self.capacity) & ~jnp.isnan(values)
        if where is not None:
            active = active & _validate.vector("where", where, b, "bool")
        values = jnp.clip(values, 0, jnp.finfo(self.dtype).max)  # the documented policy: see the docstring
        keep = active if distinct else last_write_mask(indices, active, self.capacity)
        levels = list(self.levels)
        levels[-1] = levels[-1].at[jnp.where(keep, indices, self.padded_capacity)].set(_rows(values), mode="drop")
        node = jnp.where(active, indices, 0)  # inactive entries recompute leaf 0's ancestors: a no-op
        for l in reversed(range(self.depth)):
            if 1 << l <= b:
                # A depth of at most B rows is recomputed whole, from contiguous children: no more rows than the B
                # gathered ones, and no gather. Set over its own array, which keeps the array's sharding (an update
                # computed from sharded children may carry another) and stays in place under donation.
                kids = levels[l + 1].reshape(-1, 2, 2)
                levels[l] = levels[l].at[:].set(_combine(kids[:, 0], kids[:, 1]))
                continue
            node = node >> 1
            kids = levels[l + 1].reshape(-1, 2, 2)[node]
            levels[l] = levels[l].at[node].set(_combine(kids[:, 0], kids[:, 1]), mode="promise_in_bounds")  # duplicates write equal rows
        return self.replace(levels=tuple(levels))

    @_compiled.method()
    def set_run(self, start, values) -> "SumMinTree":
        """Write `B` leaves of a ring run, `(start + r) mod capacity <- values[r]` for `r < B`, and recompute their
        ancestors: what `set(_ring.write_indices(start, B, capacity), values, distinct=True)` gives, bit for bit.

        The run is at most two runs of consecutive leaves (`[s, s + n)` and, past the end of the capacity, `[0, B - n)`;
        one leaf never wraps), whose ancestors are at most two runs of `ceil((B - 1) / 2**k) + 1` rows at `k` levels
        above the leaves: each depth reads and writes those slices (the second may hold only kept rows). Cost
        `O(B + log P)`.

        Args:
          start: integer scalar (traced or not): the leaf of `values[0]`, taken modulo `capacity`.
          values: floating `[B]`, `1 <= B <= capacity`, converted to the tree's dtype; the policy of `set`: a NaN
            value is not written, a negative one is written as 0 and `+inf` as the dtype's largest finite value.

        Returns:
          A new tree (in place when donated).

        Raises (at trace time):
          TypeError / ValueError: `start` not an integer scalar; `values` not a floating 1-D array of length
          `1 .. capacity`.
        """
        start = _validate.index_array(start, "start", "an integer scalar", clip=False)
        start = _validate.integer_value("start", start, (), -(2**31), 2**31 - 1) % self.capacity
        values = _validate.vector("values", values, None, "floating").astype(self.dtype)
        (b,) = values.shape
        if not 1 <= b <= self.capacity:
            raise ValueError(f"values: expected a length B in [1, {self.capacity}] (the capacity), got {b}")
        rows = _rows(jnp.clip(values, 0, jnp.finfo(self.dtype).max))  # the policy of `set`
        written = ~jnp.isnan(values)
        r = jnp.arange(b, dtype=jnp.int32)
        # The run up to the end of the capacity, leaves [start, start + n), in the B rows from `lo` (kept in the
        # array); the rest wraps around to leaves [0, end), in the B rows ending at `end` (clamped at row 0: an offset
        # computed, not the constant 0, which XLA:CPU compiled into a rewrite of the whole depth).
        n, end = jnp.minimum(b, self.capacity - start), start + b - self.capacity
        lo, lo_wrapped = jnp.minimum(start, self.padded_capacity - b), jnp.maximum(end - b, 0)
        first, wrapped = jnp.clip(lo + r - start, 0, b - 1), jnp.minimum(lo_wrapped + r + n, b - 1)
        levels = list(self.levels)
        levels[-1] = _write_slice(levels[-1], lo, rows[first], (lo + r >= start) & (lo + r < start + n) & written[first])
        if b > 1:  # one leaf never wraps around
            levels[-1] = _write_slice(levels[-1], lo_wrapped, rows[wrapped], (lo_wrapped + r < end) & written[wrapped])
        for l in reversed(range(self.depth)):
            k = self.depth - l
            width = min(1 << l, ((b - 1 + (1 << k) - 1) >> k) + 1)  # the ancestors of B consecutive leaves
            # Recomputing a row whose children are up to date leaves it as it is, so the slices may hold more rows
            # than the ancestors: each is clamped into its depth; one as wide as the depth is the whole depth.
            levels[l] = _recompute_slice(levels, l, jnp.minimum(start >> k, (1 << l) - width), width)
            if b > 1 and width < 1 << l:
                levels[l] = _recompute_slice(levels, l, jnp.maximum(((end - 1) >> k) - width + 1, 0), width)
        return self.replace(levels=tuple(levels))

    @_compiled.method()
    def find(self, queries) -> jax.Array:
        r"""Leaf `i` whose prefix-sum interval $[S_i, S_i + v_i)$ contains each query, $S_i = \sum_{j<i} v_j$.

        Queries are clamped into `[0, total)` (NaN to 0). A node with a positive sum always has a
        positive child, so whenever `total() > 0` the result is a POSITIVE leaf, whatever the
        rounding; otherwise leaf 0. Near a prefix sum `S` a float32 query only tells apart leaves
        wider than about `S * 2**-24` (`sample_stratified` restarts the descent instead).

        Args:
          queries: floating [Q].

        Returns:
          int32[Q] leaf indices in `[0, capacity)`.

        Raises:
          ValueError / TypeError: queries not a 1-D floating array.
        """
        queries = _validate.vector("queries", queries, None, "floating")
        return _descend(self.levels, self._clamp(queries.astype(self.query_dtype)))

    def _clamp(self, q: jax.Array) -> jax.Array:
        below_total = jnp.nextafter(self.total().astype(q.dtype), jnp.zeros((), q.dtype))
        return jnp.clip(jnp.where(jnp.isnan(q), 0, q), 0, jnp.maximum(below_total, 0))

    @_compiled.method("batch_size")
    def sample_stratified(self, key: jax.Array, batch_size: int) -> jax.Array:
        r"""Stratified proportional sampling: one draw per stratum of the total.

        Draw `k` starts from the query

        $$
        q_k = (k + u_k) \frac{\mathrm{total}}{B}, \qquad u_k \sim U[0, 1)\ \text{i.i.d.},
        $$

        in stratum `k`. It chooses the path through the top half of the levels (all of them up to
        32 padded leaves); below, a second uniform times the subtree's sum continues (`_restart`).
        Each index has probability `v_i / total` averaged over strata, and leaves narrower than a
        float32 spacing of the total are drawn at their due rate.

        Args:
          key: a PRNG key.
          batch_size: static Python int >= 1.

        Returns:
          int32[batch_size] leaf indices with positive values (leaf 0 when `total() == 0`).

        Raises:
          ValueError: `batch_size` not an int >= 1.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        qdt = self.query_dtype
        u, u2 = jax.random.uniform(_validate.key("key", key), (2, batch_size), jnp.float32).astype(qdt)
        # A product with 1/B, not a division: XLA rewrites a division by a constant into this
        # product under jit only, which would make eager and jitted draws differ in a last bit.
        width = self.total().astype(qdt) * jnp.asarray(1.0 / batch_size, qdt)
        q = (jnp.arange(batch_size, dtype=qdt) + u) * width
        return _descend(self.levels, self._clamp(q), u2)
