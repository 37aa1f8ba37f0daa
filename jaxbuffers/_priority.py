r"""Priority maths of every prioritised buffer: the priority policy, the tree leaf $p^\alpha$, sampling
probabilities and importance weights (stated once: `docs/api/replay.md`, "Prioritised replay")."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxbuffers import _validate
from jaxbuffers.sum_tree import SumMinTree, last_write_mask

PRIORITY_MAX = 1e20
"""Largest priority kept (larger ones and `+inf` are clamped): a sum over `2**30` leaves stays finite in float32."""


def priority_leaf(p: jax.Array, alpha: float) -> jax.Array:
    """Tree leaf ``p ** alpha`` of float32 priorities ``p`` (any shape; ``alpha`` a static Python float)."""
    if alpha == 1.0:
        return p
    return jnp.power(p, jnp.float32(alpha))


def sanitise_priorities(priorities: jax.Array, max_priority: jax.Array, epsilon: float) -> jax.Array:
    """The priority policy (float32): NaN to `max_priority`, then clipped into `[epsilon, PRIORITY_MAX]`."""
    p = priorities.astype(jnp.float32)
    p = jnp.where(jnp.isnan(p), max_priority, p)
    return jnp.clip(p, jnp.float32(epsilon), jnp.float32(PRIORITY_MAX))


def raised_max(max_priority: jax.Array, p: jax.Array, where: jax.Array | None = None) -> jax.Array:
    """The running max priority (float32 scalar) after writing sanitised priorities `p` (float32 `[B]`) where
    `where` (bool `[B]`, None: all): values at the cap `PRIORITY_MAX` (`+inf`, overflow) are stored as the cap but do
    not raise it, so one diverged TD error does not give every later item the cap (and every other item a
    probability near 0) for good. Raises nothing (traced)."""
    kept = p < jnp.float32(PRIORITY_MAX)
    if where is not None:
        kept = kept & where
    return jnp.maximum(max_priority, jnp.max(jnp.where(kept, p, 0), initial=0.0))


def priorities_at(tree: SumMinTree, indices, alpha: float) -> jax.Array:
    """Priorities `leaf ** (1 / alpha)` (float32) at `indices` (any shape); empty or outside `[0, capacity)`: 0."""
    i = _validate.integer_indices("indices", indices)
    leaf = jnp.where((i >= 0) & (i < tree.capacity), tree.get(i.reshape(-1)).reshape(i.shape), 0)
    if alpha in (0.0, 1.0):
        return leaf.astype(jnp.float32)
    return jnp.power(leaf, jnp.float32(1.0 / alpha)).astype(jnp.float32)


def set_priorities(buf, indices, priorities, generations, applies):
    """Every prioritised buffer's `set_priorities`: entries where `applies(slots, generations)`, the last one wins."""
    indices = _validate.index_vector("indices", indices)
    (b,) = indices.shape
    priorities = _validate.vector("priorities", priorities, b, "floating")
    generations = _validate.vector("generations", generations, b, "integer").astype(jnp.int32)
    if b == 0:
        return buf
    cap = buf.tree.capacity
    slots = jnp.clip(indices, 0, cap - 1)
    ok = (indices >= 0) & (indices < cap) & applies(slots, generations)
    p = sanitise_priorities(priorities, buf.max_priority, buf.epsilon)
    won = last_write_mask(slots, ok, cap)
    tree = buf.tree.set(slots, priority_leaf(p, buf.priority_exponent), where=won, distinct=True)
    return buf.replace(tree=tree, max_priority=raised_max(buf.max_priority, p, won))


def draw(tree: SumMinTree, key: jax.Array, batch_size: int, beta) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`(indices, probabilities, weights)` `[batch_size]` of `tree.sample_stratified` (empty tree: 0 and 1)."""
    idx = tree.sample_stratified(key, batch_size)
    return idx, *_probabilities_and_weights(tree.get(idx), tree.total(), tree.min(), beta)


def _probabilities_and_weights(leaf: jax.Array, total: jax.Array, minimum: jax.Array, beta) -> tuple[jax.Array, jax.Array]:
    """Probabilities `leaf / total` and weights `(leaf / minimum)^-beta` of drawn leaves, float32 each."""
    _validate.scalar_parameter("beta", beta, 0.0)
    nonempty = total > 0
    probabilities = jnp.where(nonempty, leaf / jnp.where(nonempty, total, 1), 0)
    # The ratio is >= 1 in exact maths, but XLA may divide as a product with 1/min: the clamp keeps weights <= 1.
    ratio = jnp.maximum(leaf / jnp.where(nonempty, minimum, 1), 1)
    weights = jnp.where(nonempty, jnp.power(ratio, weight_exponent(beta)), 1)
    return probabilities.astype(jnp.float32), weights.astype(jnp.float32)


def weight_exponent(beta) -> jax.Array:
    """The weights' exponent `-beta` (float32 scalar); a traced negative `beta` counts as 0 (weights in `[0, 1]`)."""
    return -jnp.maximum(jnp.asarray(beta, jnp.float32), 0)


def draw_from_leaves(leaves: jax.Array, key: jax.Array, batch_size: int, beta) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`draw` for a tree of `leaves` (float32 `[C]`, 0: not drawable) in `O(C)`; no positive leaf: the last index."""
    cum = jnp.cumsum(leaves)
    total = cum[-1]
    u = (jnp.arange(batch_size) + jax.random.uniform(_validate.key("key", key), (batch_size,))) / batch_size * total
    last = leaves.shape[0] - 1 - jnp.argmax(leaves[::-1] > 0)  # rounding may put u at the total: the last positive leaf
    idx = jnp.minimum(jnp.searchsorted(cum, u, side="right"), last).astype(jnp.int32)
    minimum = jnp.min(jnp.where(leaves > 0, leaves, jnp.inf))
    return idx, *_probabilities_and_weights(leaves[idx], total, minimum, beta)
