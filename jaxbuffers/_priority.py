r"""Priority maths shared by every prioritised buffer (`jaxbuffers.PrioritisedReplayBuffer`,
`jaxbuffers.PrioritisedTrajectoryBuffer` and the compressed one): the priority policy, the tree
leaf $p^\alpha$, sampling probabilities and importance weights. The equations and the policy are
stated once, in the module doc of `jaxbuffers.prioritised`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxbuffers import _validate
from jaxbuffers.sum_tree import SumMinTree, last_write_mask

PRIORITY_MAX = 1e20
"""Largest priority kept (larger values and `+inf` are clamped to it): the sum over `2**30`
leaves stays finite in float32."""


def priority_leaf(p: jax.Array, alpha: float) -> jax.Array:
    """Tree leaf ``p ** alpha`` for float32 priorities ``p`` (any shape); ``p`` itself when
    ``alpha == 1`` and exactly 1 when ``alpha == 0`` (``alpha`` is a static Python float)."""
    if alpha == 1.0:
        return p
    return jnp.power(p, jnp.float32(alpha))


def sanitise_priorities(priorities: jax.Array, max_priority: jax.Array, epsilon: float) -> jax.Array:
    """The priority policy (module doc of `jaxbuffers.prioritised`), float32 of the same shape:
    `NaN -> max_priority`, below `epsilon` -> `epsilon`, above `PRIORITY_MAX` -> `PRIORITY_MAX`."""
    p = priorities.astype(jnp.float32)
    p = jnp.where(jnp.isnan(p), max_priority, p)
    return jnp.clip(p, jnp.float32(epsilon), jnp.float32(PRIORITY_MAX))


def priorities_at(tree: SumMinTree, indices, alpha: float) -> jax.Array:
    """Priorities `leaf ** (1 / alpha)` at `indices` (int, any shape): float32, same shape.

    Exact up to the leaf's float32 rounding raised to `1 / alpha` (about `6e-8 / alpha`
    relative); 1 for every written leaf when `alpha = 0`. Empty leaves and indices outside
    `[0, capacity)` read 0. Raises TypeError for `indices` of a non-integer dtype.
    """
    i = _validate.integer_indices("indices", indices)
    leaf = jnp.where((i >= 0) & (i < tree.capacity), tree.get(i.reshape(-1)).reshape(i.shape), 0)
    if alpha in (0.0, 1.0):
        return leaf.astype(jnp.float32)
    return jnp.power(leaf, jnp.float32(1.0 / alpha)).astype(jnp.float32)


def write_priorities(tree: SumMinTree, indices, priorities, generations, applies, max_priority, epsilon: float, alpha: float):
    """The update of every prioritised buffer's `set_priorities`: the policy, the leaf
    `p**alpha`, the tree write and the running max, for the entries that apply.

    Args:
      tree: the buffer's `jaxbuffers.SumMinTree`. indices: int32[B]; outside `[0, capacity)`
        ignored. priorities: floating[B], raw. generations: int32[B], as sampled.
      applies: `(slots, generations) -> bool[B]` (slots clipped into `[0, capacity)`): whether an
        entry may be written (its slot still holds what was sampled).
      max_priority: float32 scalar, the running max before this call. epsilon, alpha: the buffer's.

    Returns:
      `(tree, max_priority)`: of duplicates the last applied entry wins, and only winners raise the max.
    """
    if indices.shape[0] == 0:
        return tree, max_priority
    cap = tree.capacity
    slots = jnp.clip(indices, 0, cap - 1)
    ok = (indices >= 0) & (indices < cap) & applies(slots, generations)
    p = sanitise_priorities(priorities, max_priority, epsilon)
    # One sort finds the winners; they are distinct slots, so the tree write needs no sort of its own.
    won = last_write_mask(slots, ok, cap)
    new = tree.set(slots, priority_leaf(p, alpha), where=won, distinct=True)
    return new, jnp.maximum(max_priority, jnp.max(jnp.where(won, p, 0)))


def probabilities_and_weights(tree: SumMinTree, leaf: jax.Array, beta) -> tuple[jax.Array, jax.Array]:
    """Sampling probabilities `leaf / total` and importance weights `(leaf / min_leaf)^-beta`
    of sampled leaves `leaf` (float32[B]; module doc of `jaxbuffers.prioritised`), float32[B]
    each; probability 0 and weight 1 on an empty tree.

    Raises (trace time):
      ValueError / TypeError: `beta` rejected by `_validate.scalar_parameter` (`>= 0`).
    """
    return _probabilities_and_weights(leaf, tree.total(), tree.min(), beta)


def _probabilities_and_weights(leaf: jax.Array, total: jax.Array, minimum: jax.Array, beta) -> tuple[jax.Array, jax.Array]:
    """`probabilities_and_weights` given the sum and the smallest positive value of the leaves drawn from."""
    _validate.scalar_parameter("beta", beta, 0.0)
    nonempty = total > 0
    probabilities = jnp.where(nonempty, leaf / jnp.where(nonempty, total, 1), 0)
    # Every sampled leaf is >= the minimum, so the ratio is >= 1 and the weight <= 1; XLA may turn
    # the division into a product with 1/min, which gave 0.99999994 (a weight of 1.0000001) for a
    # leaf equal to the minimum: the clamp keeps the documented range. A traced beta < 0 (not
    # checkable at trace time) counts as 0, so the weights stay in [0, 1].
    ratio = jnp.maximum(leaf / jnp.where(nonempty, minimum, 1), 1)
    weights = jnp.where(nonempty, jnp.power(ratio, weight_exponent(beta)), 1)
    return probabilities.astype(jnp.float32), weights.astype(jnp.float32)


def weight_exponent(beta) -> jax.Array:
    """The exponent `-beta` of the importance weights `(leaf / min_leaf)^-beta` (float32 scalar), `beta` clamped at
    0: a traced negative `beta` (not checkable at trace time) counts as 0, so every weight stays in `[0, 1]`."""
    return -jnp.maximum(jnp.asarray(beta, jnp.float32), 0)


def draw_from_leaves(leaves: jax.Array, key: jax.Array, batch_size: int, beta) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A stratified proportional draw over explicit leaves (float32 `[C]`, 0 where not drawable): what
    `SumMinTree.sample_stratified` and `probabilities_and_weights` give for a tree holding `leaves`, in `O(C)` (float32
    running sums: a leaf narrower than their spacing is drawn less often than its due).

    Returns:
      `(indices, probabilities, weights)`, int32 / float32 / float32 `[batch_size]`; with no positive leaf the last
      index, probability 0 and weight 1 (defined; `can_sample` is False then).

    Raises (trace time):
      TypeError / ValueError: `key` not a PRNG key; `beta` rejected as in `probabilities_and_weights`.
    """
    cum = jnp.cumsum(leaves)
    total = cum[-1]
    u = (jnp.arange(batch_size) + jax.random.uniform(_validate.key("key", key), (batch_size,))) / batch_size * total
    last = leaves.shape[0] - 1 - jnp.argmax(leaves[::-1] > 0)  # rounding may put u at the total: the last positive leaf
    idx = jnp.minimum(jnp.searchsorted(cum, u, side="right"), last).astype(jnp.int32)
    minimum = jnp.min(jnp.where(leaves > 0, leaves, jnp.inf))
    return idx, *_probabilities_and_weights(leaves[idx], total, minimum, beta)
