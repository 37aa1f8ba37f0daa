"""Prioritised item replay (Schaul et al., "Prioritized Experience Replay", ICLR 2016), `PrioritisedReplayBuffer` and
`PrioritisedSample`; priority policy, generations, an example: `docs/api/replay.md`, "Prioritised replay"."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuffers import _compiled, _priority, _ring, _validate
from jaxbuffers._metrics import Recorded
from jaxbuffers._priority import PRIORITY_MAX
from jaxbuffers._wrapper import forward_fields
from jaxbuffers.replay import ReplayBuffer
from jaxbuffers.sum_tree import SumMinTree

__all__ = ["PrioritisedReplayBuffer", "PrioritisedSample", "PRIORITY_MAX"]


class PrioritisedSample(NamedTuple):
    """What `PrioritisedReplayBuffer.sample` returns (`B` = batch size)."""

    item: Any  # pytree like the example item, leaves [B, ...] with the stored dtypes
    indices: jax.Array  # shape=[B], dtype=int32: physical slots the items were read from
    probabilities: jax.Array  # shape=[B], dtype=float32: P(i) (class doc)
    importance_weights: jax.Array  # shape=[B], dtype=float32: w_i (class doc), in [0, 1] (0 only on float32 underflow)
    generations: jax.Array  # shape=[B], dtype=int32: slot generation at sampling; pass to set_priorities


@_validate.one_member_methods
@forward_fields("replay", ReplayBuffer)  # storage, head, num_valid, added, metrics
class PrioritisedReplayBuffer(Recorded, struct.PyTreeNode):
    r"""Fixed-capacity ring of items with proportional prioritised, stratified sampling.

    A drop-in for `jaxbuffers.ReplayBuffer`: the same `create` sizes and `add` call; `sample` returns the same fields
    plus `probabilities`, `importance_weights` and `generations`. Each stored slot `i` of priority $p_i$ holds the
    leaf $p_i^\alpha$ in a `jaxbuffers.SumMinTree`; with $N$ stored items and $j$ over the stored slots,

    $$
    P(i) = \frac{p_i^\alpha}{\sum_k p_k^\alpha}, \qquad
    w_i = \frac{(N P(i))^{-\beta}}{\max_j (N P(j))^{-\beta}}
        = \left(\frac{p_i^\alpha}{\min_j p_j^\alpha}\right)^{-\beta}.
    $$

    Priority policy, generations and precision: `docs/api/replay.md`, "Prioritised replay".
    """

    _cursor = "replay.head"  # the leaf that is a scalar in one buffer (stacked with jax.vmap: `jaxbuffers._validate.members`)

    replay: ReplayBuffer  # the items, ring position and counts
    tree: SumMinTree  # leaves p_i^alpha at stored slots, 0 elsewhere: float32 (sum, min) rows, one array per depth
    max_priority: jax.Array  # shape=(), float32: running max priority (before alpha), 1 initially; what new items get
    priority_exponent: float = struct.field(pytree_node=False)  # alpha, in [0, 1]
    epsilon: float = struct.field(pytree_node=False)  # smallest priority kept, > 0
    _metrics_in = "replay"  # record / stats: the metrics of the wrapped ReplayBuffer

    @classmethod
    def create(cls, example_item: Any, capacity: int, *, priority_exponent: float = 0.6, min_size: int = 1,
               epsilon: float = 1e-6, metrics: bool = True) -> "PrioritisedReplayBuffer":
        """An empty buffer for items shaped like `example_item`.

        Args:
          example_item: as `jaxbuffers.ReplayBuffer.create`, like `min_size` and `metrics`.
          capacity: number of items kept (Python int in `[1, 2**30]`); oldest overwritten first.
          priority_exponent: `alpha` in `[0, 1]` (0: uniform; 1: fully proportional).
          epsilon: smallest priority kept, in `[1e-30, 1]`; zero or negative priorities become it.

        Raises:
          ValueError: as `jaxbuffers.ReplayBuffer.create`, or `priority_exponent` / `epsilon` outside their ranges.
        """
        alpha = _validate.static_float("priority_exponent", priority_exponent, 0.0, 1.0)
        epsilon = _validate.static_float("epsilon", epsilon, 1e-30, 1.0)
        capacity = _validate.static_int("capacity", capacity, maximum=2**30)
        replay = ReplayBuffer.create(example_item, capacity, min_size=min_size, metrics=metrics)
        return cls(replay=replay, tree=SumMinTree.create(capacity), max_priority=jnp.float32(1.0),
                   priority_exponent=alpha, epsilon=epsilon)

    # The wrapped buffer's readers, run on the forwarded fields.
    item_spec = ReplayBuffer.item_spec
    size = ReplayBuffer.size
    is_full = ReplayBuffer.is_full
    num_added = ReplayBuffer.num_added
    get = ReplayBuffer.get

    @property
    def memory_bytes(self) -> int:
        """Bytes held: item storage, the tree and the scalars (Python int)."""
        return _validate.tree_nbytes(self)

    @_compiled.method("batch_size", scalars={"beta": (0.0, math.inf)})
    def can_sample(self, batch_size: int = 1, *, beta=1.0) -> jax.Array:
        """Whether `sample(key, batch_size, beta=beta)` returns only stored items (bool scalar), as
        `jaxbuffers.ReplayBuffer.can_sample`. `sample`'s arguments without the key; same errors."""
        _validate.scalar_parameter("beta", beta, 0.0)
        return self.replay.can_sample(batch_size)

    def with_cursors(self, *, head=None, num_valid=None, added=None) -> "PrioritisedReplayBuffer":
        """`jaxbuffers.ReplayBuffer.with_cursors` (same arguments and errors); a slot stored afterwards keeps its
        priority (the running max if it had none), every other slot's leaf is 0. Cost `O(capacity log capacity)`."""
        return self._stored_leaves(self.replay.with_cursors(head=head, num_valid=num_valid, added=added))

    @_compiled.method()
    def _stored_leaves(self, replay: ReplayBuffer) -> "PrioritisedReplayBuffer":
        slots = jnp.arange(self.capacity, dtype=jnp.int32)
        stored = _ring.physical_to_logical(slots, replay.head, replay.num_valid, self.capacity) < replay.num_valid
        leaf, fresh = self.tree.get(slots), _priority.priority_leaf(self.max_priority, self.priority_exponent)
        values = jnp.where(stored, jnp.where(leaf > 0, leaf, fresh), 0).astype(jnp.float32)
        return self.replace(replay=replay, tree=self.tree.set(slots, values, distinct=True))

    @_compiled.method()
    def generations_at(self, indices) -> jax.Array:
        """Generation of slots `indices` (int, any shape): int32, same shape (`_ring.last_item_number`); a slot never
        written reads `slot - capacity` (negative). Indices outside `[0, capacity)` are clamped into it.

        Raises:
          TypeError: `indices` of a non-integer dtype.
        """
        indices = jnp.clip(_validate.integer_indices("indices", indices), 0, self.capacity - 1)
        return _ring.last_item_number(self.replay.added, self.replay.head, indices, self.capacity)

    @property
    def generations(self) -> jax.Array:
        """Generations of every slot, int32 `[capacity]` (`O(capacity)`: for tests)."""
        return self.generations_at(jnp.arange(self.capacity, dtype=jnp.int32))

    @_compiled.method()
    def priorities(self, indices) -> jax.Array:
        """Priorities `p_i` at slots `indices` (int, any shape): float32, same shape, as `leaf ** (1 / alpha)` (1 for
        alpha = 0); empty slots and indices outside `[0, capacity)` read 0.

        Raises:
          TypeError: `indices` of a non-integer dtype.
        """
        return _priority.priorities_at(self.tree, indices, self.priority_exponent)

    @_compiled.method()
    def add(self, batch: Any, priorities: jax.Array | None = None) -> "PrioritisedReplayBuffer":
        """Append a batch of items, overwriting the oldest ones once full (`O(B + log C)`, in place when donated).

        Args:
          batch: as `jaxbuffers.ReplayBuffer.add`.
          priorities: optional floating `[B]` (default: the running max), under the priority policy; raise the max.

        Raises (at trace time):
          TypeError / ValueError: as `jaxbuffers.ReplayBuffer.add`; `priorities` not a floating `[B]` array.
        """
        replay = self.replay.add(batch)
        b = jax.tree.leaves(batch)[0].shape[0]  # checked by replay.add
        if priorities is None:
            p = jnp.full((b,), self.max_priority, jnp.float32)
        else:
            priorities = _validate.vector("priorities", priorities, b, "floating")
            p = _priority.sanitise_priorities(priorities, self.max_priority, self.epsilon)
        tree = self.tree.set_run(self.replay.head, _priority.priority_leaf(p, self.priority_exponent))
        return self.replace(replay=replay, tree=tree, max_priority=_priority.raised_max(self.max_priority, p))

    @_compiled.method("batch_size", scalars={"beta": (0.0, math.inf)})
    def sample(self, key: jax.Array, batch_size: int, *, beta=1.0) -> PrioritisedSample:
        """Draw `batch_size` items, one per stratum of the total (`jaxbuffers.SumMinTree.sample_stratified`).

        Args:
          key: a JAX PRNG key.
          batch_size: static Python int >= 1.
          beta: importance-sampling exponent, a number >= 0 or a 0-d array (traced: a negative one counts as 0).

        Returns:
          `PrioritisedSample`; every index is a stored slot once an item was added. On an empty buffer: slot 0
          (zeros), probability 0 and weight 1.

        Raises:
          ValueError: `batch_size` not an int >= 1, `beta` not a scalar, or concretely negative or not finite.
        """
        indices, probabilities, weights = _priority.draw(self.tree, key, batch_size, beta)
        return PrioritisedSample(item=self.replay.get(indices), indices=indices, probabilities=probabilities,
                                 importance_weights=weights, generations=self.generations_at(indices))

    @_compiled.method()
    def set_priorities(self, indices, priorities, generations) -> "PrioritisedReplayBuffer":
        """Set the priorities of sampled slots (`O(B log C)`): an entry applies only if its slot holds a stored item
        of `generations`; of applied entries for one slot the last wins and raises the running max.

        Args:
          indices: int `[B]` slots (`PrioritisedSample.indices`).
          priorities: floating `[B]` new priorities (typically `|TD error|`), following the priority policy.
          generations: int `[B]`, `PrioritisedSample.generations` from the same sample.

        Raises (at trace time):
          ValueError / TypeError: an argument not 1-D, lengths differ, wrong dtype kind.
        """
        r = self.replay
        return _priority.set_priorities(
            self, indices, priorities, generations,
            lambda slot, gen: (_ring.physical_to_logical(slot, r.head, r.num_valid, self.capacity) < r.num_valid)
            & (self.generations_at(slot) == gen),
        )
