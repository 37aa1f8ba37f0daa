r"""On-device sum tree with minima, `SumMinTree`, the index of every prioritised buffer (layout, invariant and
costs: `docs/api/replay.md`, "Sum tree").

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
    """The entries of a batched write that survive when later writes to the same index win, in `O(B log B)`: bool[B],
    `True` at `k` iff `where[k]` and no later active entry `j > k` has `indices[j] == indices[k]`.

    Args:
      indices: int[B]; only equality matters; a negative index is inactive.
      where: optional bool[B]; `False` entries are no writes (they never win nor shadow an earlier entry).
      bound: optional static int, a promise that every active index is `< bound` (a cheaper sort, the same order).
    """
    indices = jnp.asarray(indices, jnp.int32)
    (b,) = indices.shape
    where = jnp.ones((b,), bool) if where is None else where
    group = jnp.where(where & (indices >= 0), indices, -1)
    if bound is not None and (bound + 1) * b <= 2**31:  # one int32 key (index + 1) * B + k, not a stable argsort
        key = jnp.sort((group + 1) * b + jnp.arange(b, dtype=jnp.int32))
        g, order = key // b - 1, key % b
    else:
        order = jnp.argsort(group, stable=True)
        g = group[order]
    last = jnp.ones((b,), bool).at[:-1].set(g[:-1] != g[1:]) & (g >= 0)
    return jnp.zeros((b,), bool).at[order].set(last, unique_indices=True)


def _combine(kids: jax.Array) -> jax.Array:
    """Parent rows `[..., 2]` of child pairs `[..., 2, 2]` (left, right): sums added, minima taken."""
    return jnp.stack([kids[..., 0, 0] + kids[..., 1, 0], jnp.minimum(kids[..., 0, 1], kids[..., 1, 1])], axis=-1)


def _rows(values: jax.Array, max_leaf: float) -> jax.Array:
    """Leaf rows `[B, 2]` of leaf values `[B]`, negatives as 0 and `+inf` as `max_leaf`: `(v, v)` if `v > 0`, else
    `(0, +inf)`."""
    values = jnp.where(values == jnp.inf, max_leaf, jnp.maximum(values, 0))
    return jnp.stack([values, jnp.where(values > 0, values, jnp.inf).astype(values.dtype)], axis=-1)


def _write_slice(level: jax.Array, lo: jax.Array, rows: jax.Array, write: jax.Array) -> jax.Array:
    """`level` with rows `[lo, lo + len(rows))` set to `rows` where `write` (bool per row), kept elsewhere."""
    kept = jax.lax.dynamic_slice_in_dim(level, lo, rows.shape[0])
    return jax.lax.dynamic_update_slice_in_dim(level, jnp.where(write[:, None], rows, kept), lo, 0)


def _recompute_slice(levels: list, l: int, lo: jax.Array, width: int) -> jax.Array:
    """Depth `l` with rows `[lo, lo + width)` recomputed from their children (rows `[2 lo, 2 lo + 2 width)` of `l + 1`)."""
    kids = jax.lax.dynamic_slice_in_dim(levels[l + 1], 2 * lo, 2 * width).reshape(width, 2, 2)
    return jax.lax.dynamic_update_slice_in_dim(levels[l], _combine(kids), lo, 0)


def _restart_level(depth: int) -> int:
    """Levels the stratified query decides before the descent restarts: half, all below 6 levels (32 leaves)."""
    return depth if depth < 6 else depth // 2


def _restart(subtree_sum: jax.Array, u2: jax.Array) -> jax.Array:
    """`u2 * subtree_sum` kept in `[0, subtree_sum)` (0 when empty): the rest of a descent's query."""
    s = subtree_sum.astype(u2.dtype)
    q = u2 * s
    zero = jnp.zeros_like(s)
    return jnp.where(q < s, q, jnp.where(s > 0, jnp.nextafter(s, zero), zero))


def _descend(levels: tuple, q: jax.Array, u2: jax.Array | None = None) -> jax.Array:
    """Leaf ids int32[Q] of clamped queries `q` [Q]: left when `q < left_sum`, else right with `q - left_sum`, never
    into an empty subtree; with `u2` ([Q] in `[0, 1)`) the query restarts at `_restart_level`."""
    depth = len(levels) - 1
    if depth == 0:
        return jnp.zeros(q.shape, jnp.int32)
    # one compiled step however deep the tree: a `lax.switch` on `l` reads depth l's children (shapes differ)
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
    r"""Sums and minima over `capacity` non-negative leaves, one array per depth (`docs/api/replay.md`, "Sum tree"):
    row `n` of `levels[l]` is the `(sum, min)` of node `n`'s subtree. Every method is pure.

    Example:
      >>> import jax.numpy as jnp
      >>> t = SumMinTree.create(4).set(jnp.array([0, 1, 2]), jnp.array([0.5, 0.0, 2.0]))
      >>> t.total().item(), t.min().item()
      (2.5, 0.5)
      >>> t.find(jnp.array([0.0, 0.5, 2.4])).tolist()
      [0, 2, 2]
    """

    levels: tuple  # levels[l]: shape=(2**l, 2), create's dtype (float32): (sum, min) rows; levels[-1] the P leaves
    capacity: int = flax.struct.field(pytree_node=False)

    @classmethod
    def create(cls, capacity: int, dtype=jnp.float32) -> "SumMinTree":
        """An empty tree: every row of every depth holds the identity `(0, +inf)`.

        Args:
          capacity: Python int in `[1, 2**30]`, the number of leaves, padded to `P`, the next power of two.
          dtype: a floating dtype the sums are rounded in (bfloat16, float16: approximate sampling).

        Raises:
          ValueError: capacity not an int in `[1, 2**30]`.
          TypeError: dtype not floating.
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
    def max_leaf(self) -> float:
        r"""The value a `+inf` leaf is written as (Python float), $2^{\,e - 1 - \text{depth}} = 2^{e - 1} / P$ with
        $2^e$ the dtype's overflow threshold (`jnp.finfo(dtype).maxexp`; $e = 128$ for float32): every sum stays
        finite (`docs/api/replay.md`, "Sum tree")."""
        return 2.0 ** (jnp.finfo(self.dtype).maxexp - 1 - self.depth)

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
        """Leaf values at `indices` (int[B]): dtype[B], indices clamped into `[0, capacity)`. TypeError / ValueError:
        `indices` not a 1-D integer array."""
        i = _validate.index_vector("indices", indices)
        return self.levels[-1][jnp.clip(i, 0, self.capacity - 1), 0]

    @_compiled.method("distinct")
    def set(self, indices, values, where=None, *, distinct: bool = False) -> "SumMinTree":
        """Write leaf values and recompute their ancestors from their children: a new tree, of duplicate indices the
        LAST active entry winning, in `O(B log P + B log B)`.

        Args:
          indices: int[B] leaf ids. Entries outside `[0, capacity)` are ignored.
          values: floating [B], in the tree's dtype: NaN ignored, a negative value as 0, `+inf` as `max_leaf`,
            finite values as given (their total below the dtype's largest finite value).
          where: optional bool[B]; entries with `False` are ignored.
          distinct: static bool; `True` promises no two active entries share an index (skips a sort).

        Raises (at trace time):
          TypeError / ValueError: indices not 1-D integer, values not floating `[B]`, `where` not bool[B] (each an
          array or a list), `distinct` not a Python bool.
        """
        distinct = _validate.static_bool("distinct", distinct)
        indices = _validate.index_vector("indices", indices)
        (b,) = indices.shape
        values = _validate.vector("values", values, b, "floating").astype(self.dtype)
        active = (indices >= 0) & (indices < self.capacity) & ~jnp.isnan(values)
        if where is not None:
            active = active & _validate.vector("where", where, b, "bool")
        keep = active if distinct else last_write_mask(indices, active, self.capacity)
        levels = list(self.levels)
        rows = _rows(values, self.max_leaf)
        levels[-1] = levels[-1].at[jnp.where(keep, indices, self.padded_capacity)].set(rows, mode="drop")
        node = jnp.where(active, indices, 0)  # inactive entries recompute leaf 0's ancestors: a no-op
        for l in reversed(range(self.depth)):
            kids = levels[l + 1].reshape(-1, 2, 2)
            if 1 << l <= b:  # recomputed whole, no gather; set over its own array (in place, sharding kept)
                levels[l] = levels[l].at[:].set(_combine(kids))
                continue
            node = node >> 1  # duplicate nodes write equal rows
            levels[l] = levels[l].at[node].set(_combine(kids[node]), mode="promise_in_bounds")
        return self.replace(levels=tuple(levels))

    @_compiled.method()
    def set_run(self, start, values) -> "SumMinTree":
        """Write a ring run of `B` leaves, `(start + r) mod capacity <- values[r]`: a new tree (in place when donated),
        bit for bit `set(_ring.write_indices(start, B, capacity), values, distinct=True)` in `O(B + log P)` (slices).

        Args:
          start: integer scalar (traced or not): the leaf of `values[0]`, taken modulo `capacity`.
          values: floating `[B]`, `1 <= B <= capacity`, converted to the tree's dtype; the value policy of `set`.

        Raises (at trace time):
          TypeError / ValueError: `start` not an integer scalar; `values` not floating `[B]`, `1 <= B <= capacity`.
        """
        start = _validate.index_array(start, "start", "an integer scalar", clip=False)
        start = _validate.integer_value("start", start, (), -(2**31), 2**31 - 1) % self.capacity
        values = _validate.vector("values", values, None, "floating").astype(self.dtype)
        (b,) = values.shape
        if not 1 <= b <= self.capacity:
            raise ValueError(f"values: expected a length B in [1, {self.capacity}] (the capacity), got {b}")
        rows, written, r = _rows(values, self.max_leaf), ~jnp.isnan(values), jnp.arange(b, dtype=jnp.int32)
        # Leaves [start, start + n) in the B rows from `lo`; the rest wraps to [0, end), in the B rows ending at `end`.
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
            # Recomputing a row with up-to-date children keeps it: slices may hold extra rows, clamped into the depth.
            levels[l] = _recompute_slice(levels, l, jnp.minimum(start >> k, (1 << l) - width), width)
            if b > 1 and width < 1 << l:
                levels[l] = _recompute_slice(levels, l, jnp.maximum(((end - 1) >> k) - width + 1, 0), width)
        return self.replace(levels=tuple(levels))

    @_compiled.method()
    def find(self, queries) -> jax.Array:
        r"""Leaf `i` whose prefix-sum interval $[S_i, S_i + v_i)$ contains each query, $S_i = \sum_{j<i} v_j$: int32[Q]
        of `queries` (floating `[Q]`, clamped into `[0, total)`, NaN to 0); POSITIVE leaves whenever `total() > 0`,
        whatever the rounding; otherwise leaf 0.

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
        r"""Stratified proportional sampling, one draw per stratum of the total: int32[batch_size] leaf indices with
        positive values (leaf 0 when `total() == 0`). Draw `k` starts from the query

        $$
        q_k = (k + u_k) \frac{\mathrm{total}}{B}, \qquad u_k \sim U[0, 1)\ \text{i.i.d.},
        $$

        for the top half of the levels, a second uniform for the rest (`docs/api/replay.md`): each leaf `v_i / total`.

        Args:
          key: a PRNG key.
          batch_size: static Python int >= 1.

        Raises:
          ValueError: `batch_size` not an int >= 1.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        qdt = self.query_dtype
        u, u2 = jax.random.uniform(_validate.key("key", key), (2, batch_size), jnp.float32).astype(qdt)
        # A product with 1/B: XLA rewrites a division by a constant under jit only (eager and jit would differ).
        width = self.total().astype(qdt) * jnp.asarray(1.0 / batch_size, qdt)
        q = (jnp.arange(batch_size, dtype=qdt) + u) * width
        return _descend(self.levels, self._clamp(q), u2)
