"""Ring-buffer index arithmetic shared by every buffer: the one place wrap-around lives.

Conventions (`head`, `num_valid`, logical indices, valid windows, `period`, the two-word counter): `docs/guide.md`,
"Ring state". Every function is pure and jittable; ``capacity``, ``batch_size``, ``length`` and ``period`` are static
Python ints, the rest may be traced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _validate


LOW_BITS = 30
LOW_MASK = (1 << LOW_BITS) - 1  # largest low word of a two-word counter


def check_batch_fits(batch_size: int, capacity: int, what: str = "batch", size_name: str = "capacity") -> None:
    """``ValueError`` unless ``0 < batch_size <= capacity`` (static shapes); ``size_name`` names the ring's size."""
    if batch_size > capacity:
        raise ValueError(f"{what}: a batch of {batch_size} items does not fit a ring of {size_name} {capacity}; "
                         f"split it or create the buffer with {size_name} >= {batch_size}")
    if batch_size < 1:
        raise ValueError(f"{what}: expected at least one item, got {batch_size}")


def write_indices(head: jax.Array, batch_size: int, capacity: int) -> jax.Array:
    """Physical slots int32[batch_size] written by a batch starting at `head`:
    `(head + arange(batch_size)) % capacity` (the oldest slots are overwritten first)."""
    return (jnp.asarray(head, jnp.int32) + jnp.arange(batch_size, dtype=jnp.int32)) % capacity


def advance(head: jax.Array, num_valid: jax.Array, batch_size: int, capacity: int):
    """Ring state `(head, num_valid)` after writing `batch_size` items, int32 scalars:
    `(head + B) % capacity` and `min(num_valid + B, capacity)`."""
    new_head = (head + batch_size) % capacity
    new_num_valid = jnp.minimum(num_valid + batch_size, capacity)
    return new_head.astype(jnp.int32), new_num_valid.astype(jnp.int32)


def write(storage, batch, head: jax.Array, axis: int = 0):
    """`storage` (an array `[..., capacity, ...]` with the ring along `axis`, or a pytree of them) with `batch` (the
    same structure, `t = batch_size <= capacity` along `axis`) written at slots `head, head+1, ...` (`head` an int32
    scalar in `[0, capacity)`) with wrap-around, in place when `storage` is donated. `axis`: 0 for item buffers, 1 for
    per-lane `[num_envs, length, ...]` storage (every lane writes the same slots).

    Along axis 0 (a batch of items, each a contiguous row): one scatter of distinct in-bounds slots. Along a later
    axis each lane's slots are one or two contiguous blocks, written as dynamic-update-slices (a scatter there writes
    each slot's rows across the lanes). One step (`t = 1`) never wraps (`head < capacity`): one update at `head`.
    Else, with `w = max(head + t - capacity, 0)` steps wrapping to the front and the batch rotated by `w` (`y[i] =
    batch[(i - w) mod t]`): the `t` slots from `head - w` take `y[i]` where `i >= w` (the steps up to the end of the
    ring), then the `t - 1` slots from slot 0 (when the batch wraps; else from `head - w`, rewriting what the first
    update left) take `y[i]` where `i < w`; each update keeps the other slots of its block as they were."""
    leaves, treedef = jax.tree.flatten(storage)
    rows = treedef.flatten_up_to(batch)
    t, capacity = rows[0].shape[axis], leaves[0].shape[axis]
    head = jnp.asarray(head, jnp.int32)
    if axis == 0:
        idx = write_indices(head, t, capacity)
        out = [s.at[idx].set(x, unique_indices=True, mode="promise_in_bounds") for s, x in zip(leaves, rows)]
        return jax.tree.unflatten(treedef, out)
    if t == 1:
        out = [jax.lax.dynamic_update_slice_in_dim(s, x.astype(s.dtype), head, axis) for s, x in zip(leaves, rows)]
        return jax.tree.unflatten(treedef, out)
    wrap = jnp.maximum(head + t - capacity, 0)  # in [0, t - 1]
    start = head - wrap  # min(head, capacity - t)
    front = jnp.where(wrap > 0, 0, start)  # the second block's slots: reading and writing the same ones keeps it in place
    pos = jnp.arange(t, dtype=jnp.int32)
    rotated = (pos - wrap) % t  # y[i] = batch[rotated[i]]

    def put(s, x):
        along = lambda m: m.reshape((1,) * axis + m.shape + (1,) * (s.ndim - axis - 1))  # noqa: E731
        block = lambda n: jnp.take(x, rotated[:n], axis=axis, mode="clip").astype(s.dtype)  # noqa: E731
        old = jax.lax.dynamic_slice_in_dim(s, start, t, axis)
        s = jax.lax.dynamic_update_slice_in_dim(s, jnp.where(along(pos >= wrap), block(t), old), start, axis)
        old = jax.lax.dynamic_slice_in_dim(s, front, t - 1, axis)
        return jax.lax.dynamic_update_slice_in_dim(s, jnp.where(along(pos[:t - 1] < wrap), block(t - 1), old), front, axis)

    return jax.tree.unflatten(treedef, [put(s, x) for s, x in zip(leaves, rows)])


def checked_cursors(ring: int, lead: tuple = (), prefix: str = "", *, head=None, num_valid=None, added=None) -> dict:
    """The cursors given of a ring of `ring` slots as int32 arrays by name, each with the leading (member) axes `lead`:
    `head` in `[0, ring)`, `num_valid` in `[0, ring]`, `added` a two-word counter `[high, low]` with `high >= 0` and
    `0 <= low < 2**30`. `jaxbuffers._validate.integer_value` raises, naming `prefix + name`: TypeError for a
    non-integer, ValueError for another shape or a concrete value out of range (traced ones are not range-checked)."""
    checks = {"head": (head, lead, 0, ring - 1), "num_valid": (num_valid, lead, 0, ring),
              "added": (added, (*lead, 2), 0, [2**31 - 1, LOW_MASK], "[high, low] with high >= 0 and 0 <= low < 2**30")}
    return {k: _validate.integer_value(prefix + k, *v) for k, v in checks.items() if v[0] is not None}


def oldest(head: jax.Array, num_valid: jax.Array, capacity: int) -> jax.Array:
    """Physical slot of the oldest valid item (int32 scalar; ``head`` once the ring is full)."""
    return ((head - num_valid) % capacity).astype(jnp.int32)


def logical_to_physical(logical: jax.Array, head: jax.Array, num_valid: jax.Array, capacity: int):
    """Map logical indices (0 = oldest valid item) to physical slots, int32, same shape."""
    return ((oldest(head, num_valid, capacity) + logical) % capacity).astype(jnp.int32)


def physical_to_logical(physical: jax.Array, head: jax.Array, num_valid: jax.Array, capacity: int):
    """Inverse of `logical_to_physical`; invalid slots map to values ``>= num_valid``."""
    return ((physical - oldest(head, num_valid, capacity)) % capacity).astype(jnp.int32)


def aligned_first(added_mod: jax.Array, num_valid: jax.Array, period: int) -> jax.Array:
    """Logical index (int32, in ``[0, period)``) of the oldest stored item whose number, counting every item ever
    added from 0, is a multiple of ``period``: the first window start. ``added_mod`` is the count of
    items ever added modulo ``period`` (`counter_mod`); item ``l`` (logical) is item number ``added - num_valid + l``."""
    return ((num_valid - added_mod) % period).astype(jnp.int32)


def num_windows(num_valid: jax.Array, length: int, period: int = 1, first: jax.Array | int = 0) -> jax.Array:
    """How many windows of ``length`` items, starting at logical ``first`` and every ``period`` items after it
    (`aligned_first`), lie wholly inside the valid range (never straddling the write head). int32 scalar, >= 0."""
    if length < 1 or period < 1:
        raise ValueError(f"window length and period must be >= 1, got length={length}, period={period}")
    room = num_valid - length - first
    return jnp.where(room >= 0, room // period + 1, 0).astype(jnp.int32)


def window_starts(window_ids: jax.Array, head: jax.Array, num_valid: jax.Array, capacity: int, period: int = 1,
                  first: jax.Array | int = 0) -> jax.Array:
    """Physical start slots (int32, shape of `window_ids`) of windows `k` (0-based), each covering logical items
    `[first + k * period, first + k * period + length)`."""
    return logical_to_physical(first + window_ids * period, head, num_valid, capacity)


def aligned(logical: jax.Array, first: jax.Array, period: int) -> jax.Array:
    """Whether logical indices ``logical`` (>= 0) are window starts: ``(logical - first) % period == 0`` (bool)."""
    return (logical - first) % period == 0


def window_slots(starts: jax.Array, length: int, capacity: int) -> jax.Array:
    """Physical slots of windows: ``starts[..., None] + arange(length)`` modulo ``capacity`` (int32)."""
    return ((starts[..., None] + jnp.arange(length, dtype=jnp.int32)) % capacity).astype(jnp.int32)


def sample_windows(key, shape: tuple[int, ...], head, num_valid, capacity: int, length: int = 1, period: int = 1) -> jax.Array:
    """Uniformly sample physical start slots of valid windows (with replacement). When no window
    is valid the draw is slot `oldest` (defined, never out of range); see `can_sample`."""
    n = jnp.maximum(num_windows(num_valid, length, period), 1)
    k = jax.random.randint(key, shape, 0, n, jnp.int32)
    return window_starts(k, head, num_valid, capacity, period)


def counter_zero() -> jax.Array:
    """A zero overflow-safe count of items ever added, a two-word counter: int32[2] ``[high, low]``."""
    return jnp.zeros((2,), jnp.int32)


def counter_add(counter: jax.Array, n) -> jax.Array:
    """Add ``n`` (``0 <= n < 2**30``) to a two-word counter; exact, never wraps below 2**61. Several counters at once:
    ``counter`` ``[..., 2]`` and ``n`` of shape ``[...]`` (or a scalar for all)."""
    low = counter[..., 1] + jnp.asarray(n, jnp.int32)
    carry = low >> LOW_BITS
    return jnp.stack([counter[..., 0] + carry, low & LOW_MASK], axis=-1).astype(jnp.int32)


def counter_mod(counter: jax.Array, m: int) -> jax.Array:
    """The value of a two-word counter modulo a static ``m`` in ``[1, 2**31)``: int32 scalar, exact (uint32
    arithmetic: ``high * 2**30 mod m`` by 30 doublings, each below ``2 * m <= 2**32``)."""
    if m == 1:
        return jnp.zeros((), jnp.int32)
    m32 = np.uint32(m)
    r = counter[..., 0].astype(jnp.uint32) % m32
    for _ in range(LOW_BITS):
        r = (r * np.uint32(2)) % m32
    return ((r + counter[..., 1].astype(jnp.uint32) % m32) % m32).astype(jnp.int32)


def counter_value(counter) -> int:
    """Host-side exact value of a two-word counter: a Python int (a numpy int64 array for a stacked counter
    `[..., 2]`); forces a device transfer."""
    c = np.asarray(counter).astype(np.int64)
    value = (c[..., 0] << LOW_BITS) + c[..., 1]
    return int(value) if value.ndim == 0 else value


def last_item_number(counter: jax.Array, head: jax.Array, slots: jax.Array, capacity: int) -> jax.Array:
    """Number (0-based, int32 modulo ``2**32``) of the item last written to each of ``slots`` holding data,
    ``added - 1 - ((head - 1 - s) mod capacity)`` (``added`` of the two-word ``counter``): prioritised buffers' slot
    *generation*, changing exactly when the slot is overwritten, with no per-slot state."""
    added32 = jnp.left_shift(counter[..., 0], LOW_BITS) + counter[..., 1]  # wraps in int32
    back = jnp.mod(head - 1 - jnp.asarray(slots, jnp.int32), capacity)
    return (added32 - 1 - back).astype(jnp.int32)


def final_slots(final_head: jax.Array, boot: jax.Array, capacity: int, xp=jnp):
    """Slots of a chunk's final observations (the trajectory buffers keep ``capacity`` per lane, handed out in order,
    one per step that bootstraps: truncated, not terminated) from each lane's next slot ``final_head`` int32[E] for
    the steps ``boot`` bool[E, t]: ``(slot, keep, new_head)``, int32[E, t] each step's slot (where ``boot``),
    bool[E, t] where ``boot`` and not overwritten within the chunk (a lane keeps its last ``capacity``), int32[E] the
    heads after. ``xp``: `jax.numpy`, or `numpy` on the host."""
    cum = xp.cumsum(boot.astype(xp.int32), axis=1)
    n_new = cum[:, -1]
    slot = ((final_head[:, None] + cum - 1) % capacity).astype(xp.int32)
    keep = boot & (n_new[:, None] - cum < capacity)
    return slot, keep, ((final_head + n_new) % capacity).astype(xp.int32)


def write_lanes(storage, rows, slots: jax.Array, keep: jax.Array):
    """Scatter ``rows`` (leaves ``[E, t, ...]``) into ``storage`` (leaves ``[E, K, ...]``) at
    ``storage[e, slots[e, j]]`` where ``keep[e, j]``, dropping the other rows. The pairs written where ``keep`` must
    be distinct (as `final_slots` gives). One scatter into the lanes flattened to ``[E * K, ...]``, its updates a
    reshape of ``rows`` (no copy of them); dropped rows get distinct negative indices, out of range."""
    e, t = slots.shape
    k = jax.tree.leaves(storage)[0].shape[1]
    lanes = jnp.arange(e, dtype=jnp.int32)[:, None]
    flat = jnp.where(keep, lanes * k + slots, -1 - (lanes * t + jnp.arange(t, dtype=jnp.int32))).reshape(-1, 1)

    def put(s, x):
        dims = jax.lax.ScatterDimensionNumbers(tuple(range(1, s.ndim)), (), (0,))  # one row per index
        out = jax.lax.scatter(s.reshape(e * k, *s.shape[2:]), flat, x.reshape(e * t, 1, *x.shape[2:]), dims,
                              unique_indices=True, mode=jax.lax.GatherScatterMode.FILL_OR_DROP)
        return out.reshape(s.shape)

    return jax.tree.map(put, storage, rows)
