"""Prioritised item replay: :class:`PrioritisedReplayBuffer` and :class:`PrioritisedSample`.

Proportional prioritised experience replay (Schaul et al., "Prioritized Experience Replay",
ICLR 2016). The buffer is a :class:`jaxbuffers.ReplayBuffer` (the same ring, validation and
storage) plus, per slot, a priority leaf in a :class:`~jaxbuffers.sum_tree.SumMinTree` (one heap
holding the sums, for sampling, and the minima, for the importance-weight normaliser). A slot's
*generation* (what :meth:`PrioritisedReplayBuffer.set_priorities` compares to tell a fresh item from
an overwritten one) is the number, modulo ``2**32``, of the item last written there; the ring
writes items in order, so it follows from the ring's head and item count and needs no per-slot
array (a stale update goes undetected only if a multiple of ``2**32`` items were added between
the sample and the update).

Sampling probability and importance weight of slot ``i`` (``p_i``: its priority, ``alpha``: the
priority exponent fixed at create time, ``N``: the number of valid items):

.. math::

    P(i) = \\frac{p_i^\\alpha}{\\sum_k p_k^\\alpha}, \\qquad
    w_i = \\frac{(N P(i))^{-\\beta}}{\\max_j (N P(j))^{-\\beta}}
        = \\left(\\frac{p_i^\\alpha}{\\min_j p_j^\\alpha}\\right)^{-\\beta},

with ``j`` ranging over the VALID slots only (empty slots are excluded; ``N`` cancels).

Priority policy (applied by :meth:`PrioritisedReplayBuffer.add` and
:meth:`PrioritisedReplayBuffer.set_priorities`; values cannot be checked at trace time):

* ``NaN``                  -> the running max priority (before this call): the item is revisited soon.
* ``< epsilon`` (zero, negative, ``-inf``) -> ``epsilon``: a valid item is never unreachable.
* ``> PRIORITY_MAX`` (incl. ``+inf``)      -> ``PRIORITY_MAX`` (1e20): the sum over 2**30 leaves
  stays finite in float32.

So every valid slot holds a leaf ``p**alpha`` in ``[epsilon**alpha, PRIORITY_MAX**alpha]``, the sum tree
never holds NaN or inf, and sampling never returns an empty slot once one item was added.

Precision: only the float32 leaf ``p**alpha`` is stored, so a priority read back
(``priorities``) is ``p`` to about ``6e-8 / alpha`` relative (the leaf's rounding raised to the
power ``1 / alpha``: ~1e-7 at alpha 0.6, ~6e-5 at alpha 1e-3). The running max priority has the
same resolution: within one ``set_priorities`` call, a losing duplicate entry whose ``p**alpha``
rounds to the winner's leaf is not told apart from it (exact for ``alpha = 0``, where every leaf is
1 and the winners are found by position).

Example::

    import jax, jax.numpy as jnp
    import jaxbuffers as jb

    item = {"obs": jnp.zeros(4), "reward": jnp.float32(0)}
    buf = jb.PrioritisedReplayBuffer.create(item, capacity=10_000, priority_exponent=0.6)
    batch = jax.tree.map(lambda x: jnp.stack([x] * 8), item)       # leading axis B = 8
    buf = jax.jit(jb.PrioritisedReplayBuffer.add, donate_argnums=0)(buf, batch)
    out = buf.sample(jax.random.key(0), 32, beta=0.4)
    td_error = jnp.ones(32)                                         # from the learner
    buf = buf.set_priorities(out.indices, jnp.abs(td_error), out.generations)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuffers import _ring, _validate
from jaxbuffers._priority import (
    PRIORITY_MAX,
    RENAMED_KEYWORDS,
    float_bits as _float_bits,
    priorities_at,
    priority_leaf,
    probabilities_and_weights,
    sanitise_priorities,
    unexpected_keywords,
    write_priorities,
)
from jaxbuffers.replay import ReplayBuffer
from jaxbuffers.sum_tree import SumMinTree

__all__ = ["PrioritisedReplayBuffer", "PrioritisedSample", "PRIORITY_MAX"]

class PrioritisedSample(NamedTuple):
    """What :meth:`PrioritisedReplayBuffer.sample` returns (``B`` = batch size)."""

    item: Any  # pytree like the example item, leaves [B, ...] with the stored dtypes
    indices: jax.Array  # shape=[B], dtype=int32: physical slots the items were read from
    probabilities: jax.Array  # shape=[B], dtype=float32: P(i) = p_i^alpha / sum_k p_k^alpha
    importance_weights: jax.Array  # shape=[B], dtype=float32: (N P(i))^-beta / max_j (N P(j))^-beta, in [0, 1] (0 only when p_i^alpha / min_j p_j^alpha overflows float32, e.g. epsilon 1e-30 next to 1e20)
    generations: jax.Array  # shape=[B], dtype=int32: slot generation at sampling; pass to set_priorities


class PrioritisedReplayBuffer(struct.PyTreeNode):
    """Fixed-capacity ring of items with proportional prioritised, stratified sampling.

    Build it with :meth:`create`; every method is pure and returns a new buffer. Works under
    ``jit`` (donate the buffer for in-place adds), ``lax.scan`` and ``vmap`` over stacked buffers.
    See the module docstring for the equations and the priority policy.
    """

    replay: ReplayBuffer  # the items, ring position and counts (see jaxbuffers.replay); its counters end with the running max priority's bits
    tree: SumMinTree  # leaves p_i^alpha at valid slots, 0 elsewhere: sums and minima, one float32 heap [2P, 2]
    priority_exponent: float = struct.field(pytree_node=False)  # alpha, in [0, 1]
    epsilon: float = struct.field(pytree_node=False)  # smallest priority kept, > 0

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(
        cls,
        example_item: Any,
        capacity: int,
        *,
        priority_exponent: float = 0.6,
        min_size: int = 1,
        epsilon: float = 1e-6,
        **unknown,
    ) -> "PrioritisedReplayBuffer":
        """An empty buffer for items shaped like ``example_item``.

        Args:
          example_item: one item, no batch axis (see :meth:`jaxbuffers.ReplayBuffer.create`).
          capacity: number of items kept (Python int in ``[1, 2**30]``); oldest overwritten first.
          priority_exponent: ``alpha`` in ``[0, 1]`` (0: uniform; 1: fully proportional).
          min_size: ``can_sample`` is False until this many items are stored.
          epsilon: smallest priority kept, in ``[1e-30, 1]``; zero/negative priorities become it.

        Raises:
          ValueError / TypeError: as :meth:`jaxbuffers.ReplayBuffer.create`, or ``alpha`` /
          ``epsilon`` outside their ranges.
          TypeError: a keyword this method does not take (named, with the one to use where it is
            another library's name, e.g. ``alpha``: ``priority_exponent``).
        """
        if unknown:
            renamed = {**RENAMED_KEYWORDS, "max_length": "capacity", "min_length": "min_size"}  # flashbax's names
            raise unexpected_keywords("PrioritisedReplayBuffer.create", unknown, "priority_exponent, min_size and epsilon", renamed)
        alpha = _validate.static_float("priority_exponent", priority_exponent, 0.0, 1.0)
        epsilon = _validate.static_float("epsilon", epsilon, 1e-30, 1.0)
        replay = ReplayBuffer.create(example_item, capacity, min_size=min_size)
        return cls(
            replay=replay.replace(counters=jnp.concatenate([replay.counters, _float_bits(jnp.float32(1.0))[None]])),
            tree=SumMinTree.create(replay.capacity),
            priority_exponent=alpha,
            epsilon=epsilon,
        )

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> int:
        """Number of item slots (static Python int)."""
        return self.replay.capacity

    @property
    def min_size(self) -> int:
        """Items needed before ``can_sample`` is True (static Python int)."""
        return self.replay.min_size

    @property
    def item_spec(self) -> Any:
        """Pytree of ``jax.ShapeDtypeStruct``: one item's shapes and dtypes."""
        return self.replay.item_spec

    @property
    def memory_bytes(self) -> int:
        """Bytes held: item storage + the tree + scalars (Python int)."""
        return (
            self.replay.memory_bytes
            + _validate.tree_nbytes(self.tree.nodes)
            + _validate.tree_nbytes(self.replay.counters)
        )

    @property
    def max_priority(self) -> jax.Array:
        """float32 scalar: the running max priority (before alpha), 1.0 initially; what new items get.

        Kept as its bit pattern in the last word of ``replay.counters`` (one int32 array with the
        ring cursors): every array of a jitted call's arguments and results costs host dispatch
        time (~0.8 us per donated array per call on the 2-core CPU)."""
        return jax.lax.bitcast_convert_type(self.replay.counters[..., _ring.CURSORS], jnp.float32)

    def _with_max_priority(self, max_priority: jax.Array) -> "PrioritisedReplayBuffer":
        counters = self.replay.counters.at[_ring.CURSORS].set(_float_bits(max_priority))
        return self.replace(replay=self.replay.replace(counters=counters))

    def size(self) -> jax.Array:
        """Number of valid items (int32 scalar)."""
        return self.replay.size()

    def is_full(self) -> jax.Array:
        """Whether every slot holds an item (bool scalar)."""
        return self.replay.is_full()

    def num_added(self) -> int:
        """Exact number of items ever added (host-side Python int; a numpy int64 array for a stacked, vmapped buffer)."""
        return self.replay.num_added()

    def can_sample(self, batch_size: int = 1) -> jax.Array:
        """Whether at least ``min_size`` items are stored (bool scalar); sampling is with replacement."""
        return self.replay.can_sample(batch_size)

    # ------------------------------------------------------------------ generations
    def generations_at(self, indices: jax.Array) -> jax.Array:
        """Generation of slots ``indices`` (int, any shape, in ``[0, capacity)``): int32, same shape.

        The number, modulo ``2**32`` (int32 wrap-around), of the item last written to each slot:
        ``added - 1 - ((head - 1 - i) mod capacity)``, since the ring writes items ``0, 1, 2, ...``
        to slots ``0, 1, 2, ... mod capacity``. Only meaningful for slots in ``[0, size())``;
        compare by equality (see :meth:`set_priorities`). A slot never written reads
        ``slot - capacity`` (negative), e.g. in the sample of an empty buffer; updates for it are
        ignored since it is outside ``[0, size())``.

        Raises:
          TypeError: ``indices`` of a non-integer dtype.
        """
        return _ring.last_item_number(self.replay.added, self.replay.head, _validate.integer_indices("indices", indices), self.capacity)

    @property
    def generations(self) -> jax.Array:
        """Generations of every slot, int32 ``[capacity]`` (an ``O(capacity)`` array: for tests
        and debugging; see :meth:`generations_at`)."""
        return self.generations_at(jnp.arange(self.capacity, dtype=jnp.int32))

    # ------------------------------------------------------------------ priorities
    def _sanitise(self, priorities: jax.Array) -> jax.Array:
        """Apply the priority policy of the module docstring; float32 in ``[epsilon, PRIORITY_MAX]``."""
        return sanitise_priorities(priorities, self.max_priority, self.epsilon)

    def _leaf(self, p: jax.Array) -> jax.Array:
        """Tree leaf ``p ** alpha`` (:func:`priority_leaf`)."""
        return priority_leaf(p, self.priority_exponent)

    def priorities(self, indices: jax.Array) -> jax.Array:
        """Priorities ``p_i`` at slots ``indices`` (int, any shape): float32, same shape.

        Recovered as ``leaf ** (1/alpha)`` (:func:`priorities_at`: float32 rounding; for alpha = 0
        every valid slot reads 1). Empty slots and indices outside ``[0, capacity)`` read 0.

        Raises:
          TypeError: ``indices`` of a non-integer dtype.
        """
        return priorities_at(self.tree, indices, self.priority_exponent)

    # ------------------------------------------------------------------ add / sample / update
    def add(self, batch: Any, priorities: jax.Array | None = None) -> "PrioritisedReplayBuffer":
        """Append a batch of items, overwriting the oldest ones once full.

        Args:
          batch: pytree like the example item with a leading axis ``B`` on every leaf,
            ``1 <= B <= capacity``, exactly the stored dtypes.
          priorities: optional floating ``[B]``; default: every new item gets the running max
            priority. Given values follow the priority policy and update the running max.

        Returns:
          The new buffer; each written slot's generation becomes its new item's number. Cost ``O(B log C)``;
          storage is updated in place when the buffer is donated.

        Raises (at trace time):
          TypeError / ValueError: as :meth:`jaxbuffers.ReplayBuffer.add`; ``priorities`` not a
          floating ``[B]`` array.
        """
        (b,) = _validate.check_batch(self.item_spec, batch, 1, "batch")
        _ring.check_batch_fits(b, self.capacity, "batch")
        if priorities is not None:
            priorities = _validate.vector("priorities", priorities, b, "floating")
        return self._add(b, priorities, batch)

    def _add(self, b: int, priorities: jax.Array | None, batch: Any = None) -> "PrioritisedReplayBuffer":
        """The update of :meth:`add` for ``b`` checked items: the items (``batch``; ``None`` when
        they are already written at the head), their leaves, the max priority and the cursors."""
        replay = self.replay if batch is None else self.replay._write(batch)
        slots = _ring.write_indices(self.replay.head, b, self.capacity)  # distinct: B <= capacity
        if priorities is None:
            p = jnp.full((b,), self.max_priority, jnp.float32)
            max_priority = self.max_priority
        else:
            p = self._sanitise(priorities)
            max_priority = jnp.maximum(self.max_priority, jnp.max(p))
        return self.replace(replay=replay._advance(b), tree=self.tree.set_unique(slots, self._leaf(p)))._with_max_priority(max_priority)

    def sample(self, key: jax.Array, batch_size: int, beta) -> PrioritisedSample:
        """Draw ``batch_size`` items by stratified proportional sampling (with replacement).

        Stratum ``k`` of ``[0, total)`` contributes one draw (Schaul et al. 2016, appendix B.2.1),
        resolved to the leaf as :meth:`jaxbuffers.sum_tree.SumTree.sample_stratified` describes.

        Args:
          key: a JAX PRNG key.
          batch_size: static Python int >= 1.
          beta: importance-sampling exponent, a number or a 0-d array (may be traced, e.g.
            annealed inside a jitted step); ``0`` gives weights of 1. Required, as in every
            prioritised sampler here: Schaul et al. anneal it from ~0.4 to 1 over training, so no
            default would suit every step.

        Returns:
          :class:`PrioritisedSample`. Every index is a valid slot with positive priority once an
          item was added. On an empty buffer (``can_sample`` False) it returns slot 0 (zeros),
          probability 0 and weight 1: defined, never garbage, but check ``can_sample`` first.

        Raises:
          ValueError / TypeError: ``batch_size`` not an int >= 1, ``beta`` not a scalar, or a
          Python ``beta`` that is negative or not finite.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size: expected a Python int >= 1, got {batch_size!r}")
        indices = self.tree.sample_stratified(key, int(batch_size))
        probabilities, weights = probabilities_and_weights(self.tree, self.tree.get(indices), beta)
        return PrioritisedSample(
            item=self.replay.get(indices),
            indices=indices,
            probabilities=probabilities,
            importance_weights=weights,
            generations=self.generations_at(indices),
        )

    def set_priorities(
        self, indices: jax.Array, priorities: jax.Array, generations: jax.Array
    ) -> "PrioritisedReplayBuffer":
        """Set the priorities of sampled slots, ignoring slots overwritten since they were sampled.

        Args:
          indices: int ``[B]`` slots (``PrioritisedSample.indices``).
          priorities: floating ``[B]`` new priorities (typically ``|TD error|``); the priority
            policy of the module docstring applies.
          generations: int ``[B]``, ``PrioritisedSample.generations`` from the same sample.

        An entry is applied only if its slot is in ``[0, size())`` and the slot's generation still
        equals ``generations``; others are ignored (stale or invalid). Among applied entries for
        the same slot, the last one in the batch wins. The running max priority is raised to the
        largest priority actually written (after that resolution).

        Returns:
          The new buffer. Cost ``O(B log C)`` (see :meth:`jaxbuffers.sum_tree.SumMinTree.set`).

        Raises (at trace time):
          ValueError / TypeError: an argument not 1-D, lengths differ, wrong dtype kind.
        """
        indices = _validate.index_array(indices)
        priorities, generations = _validate.as_array(priorities), _validate.as_array(generations)
        if len(indices.shape) != 1:
            raise ValueError(f"indices: expected a 1-D int array [B], got shape {indices.shape}")
        (b,) = indices.shape
        _validate.vector("indices", indices, b, "integer")
        indices = _validate.int32_indices(indices)
        priorities = _validate.vector("priorities", priorities, b, "floating")
        generations = _validate.vector("generations", generations, b, "integer").astype(jnp.int32)
        valid = self.replay.num_valid
        tree, max_priority = write_priorities(
            self.tree, indices, priorities, generations,
            lambda slot, gen: (slot < valid) & (self.generations_at(slot) == gen),
            self.max_priority, self.epsilon, self.priority_exponent,
        )
        return self.replace(tree=tree)._with_max_priority(max_priority)

