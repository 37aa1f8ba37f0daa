"""Uniform item replay: :class:`ReplayBuffer` and its sample type :class:`ReplaySample`.

A fixed-capacity ring of items (any pytree of arrays). ``add`` overwrites the oldest items first;
``sample`` draws uniformly with replacement over the valid items. Everything is pure and
jittable; with ``jax.jit(..., donate_argnums=...)`` on a state holding the buffer, ``add`` updates
the storage in place (cost O(batch), never O(capacity)).

Example::

    import jax, jax.numpy as jnp
    import jaxbuffers as jb

    item = {"obs": jnp.zeros(4), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = jb.ReplayBuffer.create(item, capacity=10_000)
    batch = jax.tree.map(lambda x: jnp.stack([x] * 8), item)     # leading axis B = 8
    buf = jax.jit(jb.ReplayBuffer.add, donate_argnums=0)(buf, batch)
    out = buf.sample(jax.random.key(0), 32)                       # out.item["obs"]: [32, 4]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuffers import _ring, _validate


class ReplaySample(NamedTuple):
    """What :meth:`ReplayBuffer.sample` returns."""

    item: Any  # pytree like the example item, leaves [batch_size, ...] with the stored dtypes
    indices: jax.Array  # shape=[batch_size], dtype=int32: physical slots the items were read from


class ReplayBuffer(struct.PyTreeNode):
    """Fixed-capacity ring of items with uniform sampling (with replacement).

    Build it with :meth:`create`; every method is pure and returns a new buffer.
    Under ``jax.vmap`` a stacked buffer (every leaf with a leading axis) behaves as independent
    buffers, e.g. one per seed.
    """

    storage: Any  # pytree like the example item, leaves [capacity, *item_shape], example's dtypes
    counters: jax.Array  # shape=(4 + k,), int32: head, num_valid, added (two words), then k words of a wrapping buffer (add keeps them); see the properties
    capacity: int = struct.field(pytree_node=False)
    min_size: int = struct.field(pytree_node=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, example_item: Any, capacity: int, *, min_size: int = 1) -> "ReplayBuffer":
        """An empty buffer for items shaped like ``example_item``.

        Args:
          example_item: one item, no batch axis: a pytree of arrays or ``jax.ShapeDtypeStruct``.
            Storage keeps exactly these dtypes (uint8 pixels stay uint8).
          capacity: number of items kept (Python int >= 1); older items are overwritten first.
          min_size: ``can_sample`` is False until this many items are stored (>= 1).

        Raises:
          ValueError: ``capacity < 1``, ``min_size`` outside ``[1, capacity]``, empty example.
          TypeError: a leaf of the example is not an array (see ``_validate.item_spec``).
        """
        capacity = _validate.static_int("capacity", capacity)
        min_size = _validate.static_int("min_size", min_size)
        if not 1 <= min_size <= capacity:
            raise ValueError(f"min_size: expected an int in [1, capacity={capacity}], got {min_size}")
        spec = _validate.item_spec(example_item)
        storage = jax.tree.map(lambda s: jnp.zeros((capacity, *s.shape), s.dtype), spec)
        return cls(
            storage=storage,
            counters=jnp.zeros((_ring.CURSORS,), jnp.int32),
            capacity=capacity,
            min_size=min_size,
        )

    # ------------------------------------------------------------------ properties
    # The ring cursors share one int32 array (``counters``, see :data:`jaxbuffers._ring.CURSORS`).
    @property
    def head(self) -> jax.Array:
        """int32 scalar: slot the next item is written to, in ``[0, capacity)``."""
        return self.counters[..., 0]

    @property
    def num_valid(self) -> jax.Array:
        """int32 scalar: slots holding data, in ``[0, capacity]``."""
        return self.counters[..., 1]

    @property
    def added(self) -> jax.Array:
        """int32[2]: items ever added, a two-word counter (see :mod:`jaxbuffers._ring`)."""
        return self.counters[..., 2:_ring.CURSORS]

    def with_cursors(self, *, head=None, num_valid=None, added=None) -> "ReplayBuffer":
        """A copy with the given ring cursors replaced, the others kept: for adapters that rebuild a
        ring (e.g. from SB3's buffers). Only the ring changes: a wrapping buffer's other state (a
        prioritised buffer's sum tree) is not updated.

        Args:
          head: int scalar in ``[0, capacity)``, the slot the next item goes to.
          num_valid: int scalar in ``[0, capacity]``, slots holding data (``[0, num_valid)`` until
            the ring wraps).
          added: int32[2] two-word count of items ever added, ``[high, low]`` with
            ``0 <= low < 2**30`` (value ``high * 2**30 + low``; build one with
            ``jaxbuffers._ring.counter_add(jaxbuffers._ring.counter_zero(), n)``).

        Raises:
          TypeError: a value that is not an integer array or int; ValueError: ``added`` not of
          shape (2,), or a concrete value out of its range. One buffer at a time (under ``vmap``
          for stacked buffers).
        """
        def checked(name, value, current, shape, lo, hi, expected):
            if value is None:
                return current
            traced = isinstance(value, jax.core.Tracer)
            v = value if traced else np.asarray(value)  # concrete values checked before any narrowing
            if not jnp.issubdtype(v.dtype, jnp.integer):
                raise TypeError(f"{name}: expected an integer value, got dtype {v.dtype}")
            if v.shape != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {v.shape}")
            if not traced and (np.any(v < lo) or np.any(v > hi)):
                raise ValueError(f"{name}: expected {expected}, got {v.tolist()}")
            return v.astype(jnp.int32) if traced else jnp.asarray(v.astype(np.int32))

        return self.replace(counters=_ring.pack_cursors(
            checked("head", head, self.head, (), 0, self.capacity - 1, f"a value in [0, {self.capacity - 1}]"),
            checked("num_valid", num_valid, self.num_valid, (), 0, self.capacity, f"a value in [0, {self.capacity}]"),
            checked("added", added, self.added, (2,), [0, 0], [2**31 - 1, _ring.LOW_MASK], "[high, low] with high >= 0 and 0 <= low < 2**30"),
            self.counters[_ring.CURSORS:],
        ))

    @property
    def item_spec(self) -> Any:
        """Pytree of ``jax.ShapeDtypeStruct``: one item's shapes and dtypes (derived from storage)."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), self.storage)

    @property
    def memory_bytes(self) -> int:
        """Bytes of the item storage (capacity x item bytes, summed over leaves), a Python int."""
        return _validate.tree_nbytes(self.storage)

    def size(self) -> jax.Array:
        """Number of valid items (int32 scalar, at most ``capacity``)."""
        return self.num_valid

    def is_full(self) -> jax.Array:
        """Whether every slot holds an item (bool scalar)."""
        return self.num_valid >= self.capacity

    def num_added(self) -> int:
        """Exact number of items ever added (host-side Python int; a numpy int64 array for a stacked, vmapped buffer). Never overflows int32."""
        return _ring.counter_value(self.added)

    def can_sample(self, batch_size: int = 1) -> jax.Array:
        """Whether at least ``max(min_size, 1)`` items are stored (bool scalar).

        Sampling is with replacement, so ``batch_size`` may exceed the number stored; it is
        accepted for API symmetry with the other buffers.
        """
        del batch_size
        return self.num_valid >= self.min_size

    # ------------------------------------------------------------------ add / sample
    def add(self, batch: Any) -> "ReplayBuffer":
        """Append a batch of items, overwriting the oldest ones once full.

        Args:
          batch: pytree like the example item with a leading axis ``B`` on every leaf,
            ``1 <= B <= capacity``, exactly the stored dtypes.

        Returns:
          The new buffer. Cost O(B); in place when the buffer is donated.

        Raises (at trace time):
          TypeError: wrong tree structure or dtype (the message names the leaf).
          ValueError: wrong per-item shape, inconsistent leading axes, or ``B > capacity``.
        """
        (b,) = _validate.check_batch(self.item_spec, batch, 1, "batch")
        _ring.check_batch_fits(b, self.capacity, "batch")
        return self._write(batch)._advance(b)

    def _write(self, batch: Any) -> "ReplayBuffer":
        """The items of a checked ``batch`` written to slots ``head, head + 1, ...``; cursors unchanged."""
        return self.replace(storage=_ring.write(self.storage, batch, self.head))

    def _advance(self, b: int) -> "ReplayBuffer":
        """The cursors moved past ``b`` newly written items (trailing words of ``counters`` kept)."""
        head, num_valid = _ring.advance(self.head, self.num_valid, b, self.capacity)
        return self.replace(counters=_ring.pack_cursors(head, num_valid, _ring.counter_add(self.added, b), self.counters[_ring.CURSORS:]))

    def sample(self, key: jax.Array, batch_size: int) -> ReplaySample:
        """Draw ``batch_size`` items uniformly with replacement from the valid items.

        Args:
          key: a JAX PRNG key.
          batch_size: static Python int >= 1.

        Returns:
          :class:`ReplaySample` with ``item`` (leaves ``[batch_size, ...]``) and ``indices``.
          On an empty buffer (``can_sample`` False) it returns slot 0, which holds zeros: defined,
          never garbage, but check ``can_sample`` first.
        """
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size: expected a Python int >= 1 (static), got {batch_size!r}")
        indices = _ring.sample_windows(key, (int(batch_size),), self.head, self.num_valid, self.capacity)
        return ReplaySample(item=self.get(indices), indices=indices)

    def get(self, indices: jax.Array) -> Any:
        """Items at physical slots ``indices`` (int32[...]); leaves ``[*indices.shape, ...]``.

        Indices outside ``[0, capacity)`` are clamped into it (``-1`` reads slot 0, not the last
        slot: no Python-style negative indexing), and slots never written read as zeros; check
        against :meth:`size` when indices do not come from :meth:`sample`.
        """
        return jax.tree.map(lambda s: jnp.take(s, indices, axis=0, mode="clip"), self.storage)
