"""Uniform item replay, `ReplayBuffer` and `ReplaySample`: a ring sampled with replacement (`docs/api/replay.md`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuffers import _compiled, _ring, _validate
from jaxbuffers._metrics import Metrics, Recorded


class ReplaySample(NamedTuple):
    """What `ReplayBuffer.sample` returns."""

    item: Any  # pytree like the example item, leaves [batch_size, ...] with the stored dtypes
    indices: jax.Array  # shape=[batch_size], dtype=int32: physical slots the items were read from


@_validate.one_member_methods
class ReplayBuffer(Recorded, struct.PyTreeNode):
    """Fixed-capacity ring of items with uniform sampling (with replacement), pure methods; ring conventions:
    `jaxbuffers._ring`. Under `jax.vmap` a stacked buffer behaves as independent buffers, e.g. one per seed."""

    _cursor = "head"  # the leaf that is a scalar in one buffer (stacked with jax.vmap: `jaxbuffers._validate.members`)

    storage: Any  # pytree like the example item, leaves [capacity, *item_shape], the example's dtypes
    head: jax.Array  # shape=(), int32: slot the next item goes to, in [0, capacity)
    num_valid: jax.Array  # shape=(), int32: slots holding items, in [0, capacity]
    added: jax.Array  # shape=(2,), int32: items ever added, two-word counter [high, low] (_ring.counter_*)
    metrics: Metrics  # usage counters; sample_count [capacity] by slot (jaxbuffers._metrics)
    capacity: int = struct.field(pytree_node=False)
    min_size: int = struct.field(pytree_node=False)

    @classmethod
    def create(cls, example_item: Any, capacity: int, *, min_size: int = 1, metrics: bool = True) -> "ReplayBuffer":
        """An empty buffer for items shaped like `example_item`.

        Args:
          example_item: one item, no batch axis: a pytree of arrays or `jax.ShapeDtypeStruct` (dtypes kept exactly).
          capacity: number of items kept (Python int >= 1); older items are overwritten first.
          min_size: `can_sample` is False until this many items are stored (>= 1).
          metrics: static bool: keep per-slot sample counts (int32 `[capacity]`, `jaxbuffers._metrics`).

        Raises:
          ValueError: `capacity < 1`, `min_size` outside `[1, capacity]`, empty example.
          TypeError: a leaf of the example is not an array (see `_validate.item_spec`), `metrics` not a bool.
        """
        capacity, min_size = _validate.static_int("capacity", capacity), _validate.static_int("min_size", min_size)
        if min_size > capacity:
            raise ValueError(f"min_size: expected an int in [1, capacity={capacity}], got {min_size}")
        spec = _validate.item_spec(example_item)
        return cls(storage=jax.tree.map(lambda s: jnp.zeros((capacity, *s.shape), s.dtype), spec), head=jnp.int32(0),
                   num_valid=jnp.int32(0), added=_ring.counter_zero(), metrics=Metrics.create((capacity,), metrics),
                   capacity=capacity, min_size=min_size)

    def _metrics_ring(self):
        return self.metrics, self.added, self.head, self.num_valid, self.capacity, 1

    def with_cursors(self, *, head=None, num_valid=None, added=None) -> "ReplayBuffer":
        """A copy with the given ring fields replaced after a range check (`replace` has none): `head` in
        `[0, capacity)`, `num_valid` in `[0, capacity]`, `added` an int[2] `[high, low]` with `0 <= low < 2**30`.

        Raises:
          TypeError: not an integer value.
          ValueError: wrong shape, or a concrete value out of range (traced values are not range-checked).
        """
        return self.replace(**_ring.checked_cursors(self.capacity, head=head, num_valid=num_valid, added=added))

    @property
    def item_spec(self) -> Any:
        """Pytree of `jax.ShapeDtypeStruct`: one item's shapes and dtypes (from the storage)."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), self.storage)

    @property
    def memory_bytes(self) -> int:
        """Bytes of the item storage (capacity x item bytes, summed over leaves), a Python int."""
        return _validate.tree_nbytes(self.storage)

    @_compiled.method()
    def size(self) -> jax.Array:
        """The number of items stored (int32 scalar, at most `capacity`)."""
        return self.num_valid

    @_compiled.method()
    def is_full(self) -> jax.Array:
        """Whether every slot holds an item (bool scalar)."""
        return self.num_valid >= self.capacity

    def num_added(self) -> int:
        """Exact number of items ever added: a host-side Python int (a stacked state: one member at a time)."""
        return _ring.counter_value(self.added)

    @_compiled.method("batch_size")
    def can_sample(self, batch_size: int = 1) -> jax.Array:
        """Whether `sample(key, batch_size)` returns only stored items (bool scalar): at least `min_size` are stored.
        `sample` draws with replacement, so `batch_size` does not change the answer (it is checked only).

        Raises:
          ValueError: `batch_size` not an int >= 1.
        """
        _validate.static_int("batch_size", batch_size)
        return self.num_valid >= self.min_size

    @_compiled.method()
    def add(self, batch: Any) -> "ReplayBuffer":
        """Append a batch of items, overwriting the oldest ones once full (O(B), in place when donated).

        Args:
          batch: pytree like the example item, a leading axis `1 <= B <= capacity` on every leaf, the stored dtypes.

        Raises (at trace time):
          TypeError: wrong tree structure or dtype (the message names the leaf).
          ValueError: wrong per-item shape, inconsistent leading axes, or `B > capacity`.
        """
        (b,) = _validate.check_batch(self.item_spec, batch, 1, "batch")
        _ring.check_batch_fits(b, self.capacity, "batch")
        head, num_valid = _ring.advance(self.head, self.num_valid, b, self.capacity)
        storage, metrics = self.metrics.write(self.storage, batch, self.head)
        return self.replace(storage=storage, head=head, num_valid=num_valid, added=_ring.counter_add(self.added, b),
                            metrics=metrics)

    @_compiled.method("batch_size")
    def sample(self, key: jax.Array, batch_size: int) -> ReplaySample:
        """Draw `batch_size` items uniformly with replacement from the stored items.

        Args:
          key: a JAX PRNG key.
          batch_size: static Python int >= 1.

        Returns:
          `ReplaySample` (leaves `[batch_size, ...]`); on an empty buffer slot 0, which holds zeros.

        Raises:
          ValueError: `batch_size` not an int >= 1.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        indices = _ring.sample_windows(_validate.key("key", key), (batch_size,), self.head, self.num_valid, self.capacity)
        return ReplaySample(item=self.get(indices), indices=indices)

    @_compiled.method()
    def get(self, indices: jax.Array) -> Any:
        """Items at physical slots `indices` (int32[...]); leaves `[*indices.shape, ...]`. Indices outside
        `[0, capacity)` are clamped into it (`-1` reads slot 0); slots never written read as zeros.

        Raises:
          TypeError: `indices` not an integer array.
        """
        indices = _validate.integer_indices("indices", indices)
        return jax.tree.map(lambda s: jnp.take(s, indices, axis=0, mode="clip"), self.storage)
