"""Ring-buffer index arithmetic shared by every buffer: the ONE place wrap-around lives.

Conventions (all buffers):

* A ring has a static ``capacity`` (Python int) and two int32 scalars: ``head``, the physical
  slot the next item is written to (in ``[0, capacity)``), and ``num_valid``, how many slots hold
  data (in ``[0, capacity]``). Writes start at slot 0, so until the ring is full the valid slots are
  exactly ``[0, num_valid)``; once full, ``head`` is also the oldest slot.
* A *logical* index counts valid items from the oldest (0) to the newest (``num_valid - 1``);
  :func:`logical_to_physical` maps it to a slot.
* A *window* of ``length`` consecutive items starting at logical index ``k`` is valid when
  ``k + length <= num_valid``: it then never straddles the write head (it never mixes the oldest
  data with data written after wrap-around). Window starts are counted from the oldest valid item,
  so a ``period`` keeps its meaning after wrap-around: the starts are ``0, period, 2*period, ...``.
* The number of items ever added is kept in a two-word int32 counter (``[high, low]``, ``low`` in
  ``[0, 2**30)``) so it never overflows silently (exact up to 2**61 items).

Every function here is pure and jittable; ``capacity``, ``batch_size``, ``length`` and ``period``
are static Python ints, the rest may be traced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


_LOW_BITS = 30
_LOW_MASK = (1 << _LOW_BITS) - 1
LOW_MASK = _LOW_MASK  # largest low word of a two-word counter

CURSORS = 4
"""Length of the packed cursor array that starts every ring buffer's ``counters``: ``head``,
``num_valid``, ``added`` (two words). One array instead of three: every array of a jitted call's
arguments and results costs host dispatch time (~0.8 us per donated array per call, measured on
the 2-core CPU), and the cursors are always read and written together."""


def pack_cursors(head, num_valid, added, *more) -> jax.Array:
    """int32 ``[CURSORS + ...]``: ``head``, ``num_valid``, the two words of ``added``, then ``more``
    (1-D int arrays appended in order; e.g. the trajectory buffer's per-lane final-observation heads)."""
    parts = [jnp.stack([jnp.asarray(head, jnp.int32), jnp.asarray(num_valid, jnp.int32)]), jnp.asarray(added, jnp.int32)]
    return jnp.concatenate(parts + [jnp.asarray(m, jnp.int32) for m in more])


def check_batch_fits(batch_size: int, capacity: int, what: str = "batch") -> None:
    """Raise ``ValueError`` unless ``0 < batch_size <= capacity`` (trace time: shapes are static)."""
    if batch_size > capacity:
        raise ValueError(
            f"{what}: a batch of {batch_size} items does not fit a ring of capacity {capacity}; "
            f"split it or create the buffer with capacity >= {batch_size}"
        )
    if batch_size < 1:
        raise ValueError(f"{what}: expected at least one item, got {batch_size}")


def write_indices(head: jax.Array, batch_size: int, capacity: int) -> jax.Array:
    """Physical slots written by a batch of ``batch_size`` items starting at ``head``.

    Returns:
      int32[batch_size]: ``(head + arange(batch_size)) % capacity``; item ``i`` of the batch goes to
      slot ``out[i]``. The oldest slots are overwritten first.
    """
    return (jnp.asarray(head, jnp.int32) + jnp.arange(batch_size, dtype=jnp.int32)) % capacity


def advance(head: jax.Array, num_valid: jax.Array, batch_size: int, capacity: int):
    """Ring state after writing ``batch_size`` items.

    Returns:
      ``(new_head, new_num_valid)``, int32 scalars: ``(head + B) % capacity`` and
      ``min(num_valid + B, capacity)``.
    """
    new_head = (head + batch_size) % capacity
    new_num_valid = jnp.minimum(num_valid + batch_size, capacity)
    return new_head.astype(jnp.int32), new_num_valid.astype(jnp.int32)


# Largest [lead * capacity] row count whose flat row ids fit int32 (see write).
_FLAT_ROWS_MAX = 2**31 - 1


def write(storage, batch, head: jax.Array, axis: int = 0):
    """Write ``batch`` into ``storage`` along ``axis`` at slots ``head, head+1, ...`` with wrap-around.

    Args:
      storage: an array ``[..., capacity, ...]`` with the ring along ``axis``, or a pytree of them
        (all with the same leading axes up to ``axis``).
      batch: the same structure; each leaf has its storage leaf's shape except ``batch_size <=
        capacity`` along ``axis``, and its dtype.
      head: int32 scalar, first slot to write.
      axis: the ring axis (0 for item buffers, 1 for per-lane ``[num_envs, length, ...]`` storage).

    Returns:
      The written storage, same structure.

    Cost is O(batch): one scatter with unique in-bounds indices, which XLA performs in place when
    the storage is donated. With ``axis > 0`` and rows with axes of their own (per-lane
    ``[E, length, ...]`` storage) the leading axes are flattened first and the ``E * batch_size``
    rows scattered into the ``[E * length, ...]`` view (a free reshape), so each row is one
    contiguous copy; storages of more than ``2**31 - 1`` rows keep the scatter along ``axis``
    (their flat int32 row ids would overflow).
    """
    leaves, treedef = jax.tree.flatten(storage)
    rows_in = treedef.flatten_up_to(batch)
    capacity, b = leaves[0].shape[axis], rows_in[0].shape[axis]
    head = jnp.asarray(head, jnp.int32)
    idx = write_indices(head, b, capacity)
    lead = int(np.prod(leaves[0].shape[:axis]))
    flat = (jnp.arange(lead, dtype=jnp.int32)[:, None] * capacity + idx[None, :]).reshape(-1)
    put = dict(unique_indices=True, mode="promise_in_bounds")

    def one(s, x):
        if axis > 0 and s.ndim > axis + 1 and lead * capacity <= _FLAT_ROWS_MAX:
            rows = s.reshape((lead * capacity,) + s.shape[axis + 1 :])
            return rows.at[flat].set(x.reshape((flat.shape[0],) + x.shape[axis + 1 :]), **put).reshape(s.shape)
        return s.at[(slice(None),) * axis + (idx,)].set(x, **put)

    return jax.tree.unflatten(treedef, [one(s, x) for s, x in zip(leaves, rows_in)])


def oldest(head: jax.Array, num_valid: jax.Array, capacity: int) -> jax.Array:
    """Physical slot of the oldest valid item (int32 scalar; ``head`` once the ring is full)."""
    return ((head - num_valid) % capacity).astype(jnp.int32)


def logical_to_physical(logical: jax.Array, head: jax.Array, num_valid: jax.Array, capacity: int):
    """Map logical indices (0 = oldest valid item) to physical slots, int32, same shape."""
    return ((oldest(head, num_valid, capacity) + logical) % capacity).astype(jnp.int32)


def physical_to_logical(physical: jax.Array, head: jax.Array, num_valid: jax.Array, capacity: int):
    """Inverse of :func:`logical_to_physical`; invalid slots map to values ``>= num_valid``."""
    return ((physical - oldest(head, num_valid, capacity)) % capacity).astype(jnp.int32)


def num_windows(num_valid: jax.Array, length: int, period: int = 1) -> jax.Array:
    """How many windows of ``length`` items, starting every ``period`` items from the oldest,
    lie wholly inside the valid range (never straddling the write head). int32 scalar, >= 0."""
    if length < 1 or period < 1:
        raise ValueError(f"window length and period must be >= 1, got length={length}, period={period}")
    room = num_valid - length
    return jnp.where(room >= 0, room // period + 1, 0).astype(jnp.int32)


def window_starts(
    window_ids: jax.Array, head: jax.Array, num_valid: jax.Array, capacity: int, period: int = 1
) -> jax.Array:
    """Physical start slot of window number ``window_ids`` (0-based, counted from the oldest valid item).

    Window ``k`` covers logical items ``[k * period, k * period + length)``; callers draw ``k`` in
    ``[0, num_windows(...))``. Returns int32 with the shape of ``window_ids``.
    """
    return logical_to_physical(window_ids * period, head, num_valid, capacity)


def window_slots(starts: jax.Array, length: int, capacity: int) -> jax.Array:
    """Physical slots of windows: ``starts[..., None] + arange(length)`` modulo ``capacity`` (int32)."""
    return ((starts[..., None] + jnp.arange(length, dtype=jnp.int32)) % capacity).astype(jnp.int32)


def sample_windows(
    key: jax.Array,
    shape: tuple[int, ...],
    head: jax.Array,
    num_valid: jax.Array,
    capacity: int,
    length: int = 1,
    period: int = 1,
) -> jax.Array:
    """Uniformly sample physical start slots of valid windows (with replacement).

    When no window is valid the draw is slot ``oldest`` (defined, never out of range); callers
    expose ``can_sample`` so users can tell.
    """
    n = jnp.maximum(num_windows(num_valid, length, period), 1)
    k = jax.random.randint(key, shape, 0, n, jnp.int32)
    return window_starts(k, head, num_valid, capacity, period)


# ---------------------------------------------------------------------------------------------
# Overflow-safe count of items ever added.


def counter_zero() -> jax.Array:
    """A zero count: int32[2] ``[high, low]``."""
    return jnp.zeros((2,), jnp.int32)


def counter_add(counter: jax.Array, n) -> jax.Array:
    """Add ``n`` (``0 <= n < 2**30``) to a two-word counter; exact, never wraps below 2**61."""
    low = counter[1] + jnp.asarray(n, jnp.int32)
    carry = low >> _LOW_BITS
    return jnp.stack([counter[0] + carry, low & _LOW_MASK]).astype(jnp.int32)


def counter_value(counter) -> int:
    """Host-side exact value of a two-word counter (a Python int; forces a device transfer).

    A stacked counter (``[..., 2]``, e.g. under ``vmap``) gives a numpy int64 array instead.
    """
    c = np.asarray(counter).astype(np.int64)
    value = (c[..., 0] << _LOW_BITS) + c[..., 1]
    return int(value) if value.ndim == 0 else value


def last_item_number(counter: jax.Array, head: jax.Array, slots: jax.Array, capacity: int) -> jax.Array:
    """Number (0-based, modulo ``2**32``: int32 wrap-around) of the item last written to ``slots``.

    A ring writes items ``0, 1, 2, ...`` to slots ``0, 1, 2, ... mod capacity``, so slot ``s`` last
    received item ``added - 1 - ((head - 1 - s) mod capacity)`` (``added`` from the two-word
    ``counter``). Only meaningful for slots holding data. Prioritised buffers use it as the slot's
    *generation*: it changes exactly when the slot is overwritten, with no per-slot state.

    Args:
      counter: int32[2] items ever added. head: int32 scalar. slots: int[...] physical slots.
      capacity: static ring capacity.

    Returns:
      int32 with the shape of ``slots``.
    """
    added32 = jnp.left_shift(counter[..., 0], _LOW_BITS) + counter[..., 1]  # wraps in int32
    back = jnp.mod(head - 1 - jnp.asarray(slots, jnp.int32), capacity)
    return (added32 - 1 - back).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
# Final-observation ring of the trajectory buffers: per lane, K slots handed out in order, one per
# step that bootstraps from its final observation (truncated and not terminated).


def final_slots(final_head: jax.Array, boot: jax.Array, capacity: int):
    """Ring slots of a chunk's final observations, per lane.

    Args:
      final_head: int32[E], each lane's next final-observation slot, in ``[0, capacity)``.
      boot: bool[E, t], the chunk's steps that keep a final observation.
      capacity: static ring size ``K`` per lane.

    Returns:
      ``(slot, keep, new_head)``: int32[E, t] the slot of each step (meaningful where ``boot``);
      bool[E, t] where ``boot`` and not overwritten within this chunk (a lane with more than
      ``K`` such steps in one chunk keeps its last ``K``); int32[E] the heads after the chunk.
    """
    cum = jnp.cumsum(boot.astype(jnp.int32), axis=1)
    n_new = cum[:, -1]
    slot = ((final_head[:, None] + cum - 1) % capacity).astype(jnp.int32)
    keep = boot & (n_new[:, None] - cum < capacity)
    return slot, keep, ((final_head + n_new) % capacity).astype(jnp.int32)


def write_lanes(storage, rows, slots: jax.Array, keep: jax.Array):
    """Scatter ``rows`` (leaves ``[E, t, ...]``) into ``storage`` (leaves ``[E, K, ...]``) at
    ``storage[e, slots[e, j]]`` where ``keep[e, j]``; the other rows are dropped.

    The ``(lane, slot)`` pairs written must be distinct where ``keep`` (what :func:`final_slots`
    gives): dropped rows point past the end, each to its own column, so every pair is unique and
    the scatter may run in parallel.
    """
    e, t = slots.shape
    k = jax.tree.leaves(storage)[0].shape[1]
    lanes = jnp.broadcast_to(jnp.arange(e, dtype=jnp.int32)[:, None], (e, t))
    cols = jnp.where(keep, slots, k + jnp.arange(t, dtype=jnp.int32)[None, :])
    return jax.tree.map(lambda s, x: s.at[lanes, cols].set(x, mode="drop", unique_indices=True), storage, rows)
