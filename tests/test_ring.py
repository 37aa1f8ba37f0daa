"""Ring arithmetic, checked exhaustively for small sizes against a plain-Python model."""

import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuffers import _ring


def model_after(capacity, batch_sizes):
    """Plain-Python ring: list of (slot -> absolute item number), head, num_valid."""
    slots = [None] * capacity
    n = 0
    for b in batch_sizes:
        for _ in range(b):
            slots[n % capacity] = n
            n += 1
    return slots, n % capacity, min(n, capacity), n


def replay_state(capacity, batch_sizes):
    head, num_valid = jnp.int32(0), jnp.int32(0)
    for b in batch_sizes:
        head, num_valid = _ring.advance(head, num_valid, b, capacity)
    return head, num_valid


@functools.partial(jax.jit, static_argnums=(4, 5))
def _write_batch(storage, head, num_valid, n, b, capacity):
    """Items n .. n + b - 1 written at the head, then the head advanced: one program per (b, capacity)."""
    idx = _ring.write_indices(head, b, capacity)
    storage = _ring.write(storage, n + jnp.arange(b, dtype=jnp.int32), head)
    return idx, storage, *_ring.advance(head, num_valid, b, capacity)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _logical_round_trip(head, num_valid, m_valid, capacity):
    phys = _ring.logical_to_physical(jnp.arange(m_valid), head, num_valid, capacity)
    return phys, _ring.physical_to_logical(phys, head, num_valid, capacity)


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 8])
def test_write_indices_and_advance_exhaustive(capacity):
    for length in range(0, 4):
        for batches in itertools.product(range(1, capacity + 1), repeat=length):
            storage = jnp.full((capacity,), -1, jnp.int32)
            head, num_valid = jnp.int32(0), jnp.int32(0)
            n = 0
            for b in batches:
                idx, storage, head, num_valid = _write_batch(storage, head, num_valid, n, b, capacity)
                assert idx.dtype == jnp.int32
                assert len(set(np.asarray(idx).tolist())) == b  # unique slots
                n += b
            slots, m_head, m_valid, _ = model_after(capacity, batches)
            assert int(head) == m_head and int(num_valid) == m_valid
            got = np.asarray(storage).tolist()
            assert got == [-1 if s is None else s for s in slots]
            # logical order: oldest .. newest are the last m_valid items, in order
            phys, back = _logical_round_trip(head, num_valid, m_valid, capacity)
            assert np.asarray(storage)[np.asarray(phys)].tolist() == list(range(n - m_valid, n))
            assert np.asarray(back).tolist() == list(range(m_valid))


@pytest.mark.parametrize("capacity", [1, 4, 7, 8])
def test_windows_never_straddle_write_head(capacity):
    for n_added in range(0, 3 * capacity):
        head, num_valid = replay_state(capacity, [1] * n_added)
        storage = np.full(capacity, -1)
        for i in range(n_added):
            storage[i % capacity] = i
        for length in range(1, capacity + 1):
            for period in range(1, 4):
                count = int(_ring.num_windows(num_valid, length, period))
                valid = int(num_valid)
                expected = 0 if valid < length else (valid - length) // period + 1
                assert count == expected
                starts = _ring.window_starts(jnp.arange(count), head, num_valid, capacity, period)
                slots = np.asarray(_ring.window_slots(starts, length, capacity))
                oldest = n_added - valid
                for k, row in enumerate(slots):
                    values = storage[row].tolist()
                    first = oldest + k * period
                    assert values == list(range(first, first + length))  # contiguous, in order


def test_sample_windows_uniform_and_in_range():
    capacity, length, period = 8, 3, 2
    head, num_valid = replay_state(capacity, [1] * 11)
    starts = _ring.sample_windows(jax.random.key(0), (4000,), head, num_valid, capacity, length, period)
    # valid logical starts 0, 2, 4 -> items 3, 5, 7 -> physical slots 3, 5, 7
    values, counts = np.unique(np.asarray(starts), return_counts=True)
    assert values.tolist() == [3, 5, 7]
    assert counts.min() > 1100  # ~1333 each
    # empty ring: defined output (the oldest slot), never out of range
    s = _ring.sample_windows(jax.random.key(1), (5,), jnp.int32(0), jnp.int32(0), capacity, length)
    assert np.all(np.asarray(s) == 0)


def test_aligned_windows_start_at_multiples_of_period_of_the_items_ever_added():
    """`aligned_first` + `num_windows(first=)` + `window_starts(first=)`: exactly the windows whose first item's number
    (counting every item ever added) is a multiple of `period`, before and after wrap-around; `counter_mod` is exact
    past 2**30 (the two words) and for the largest period."""
    capacity, length = 7, 2

    @functools.partial(jax.jit, static_argnums=3)
    def windows(added, head, num_valid, period):
        first = _ring.aligned_first(_ring.counter_mod(added, period), num_valid, period)
        starts = _ring.window_starts(jnp.arange(capacity), head, num_valid, capacity, period, first)
        return _ring.num_windows(num_valid, length, period, first), starts, _ring.aligned(jnp.arange(capacity), first, period)

    for n_added in range(0, 3 * capacity):
        head, num_valid = replay_state(capacity, [1] * n_added)
        for period in (1, 2, 3, capacity):
            added = jnp.array([n_added >> 30, n_added & _ring.LOW_MASK], jnp.int32)
            count, starts, aligned = windows(added, head, num_valid, period)
            oldest, h, nv = n_added - int(num_valid), int(head), int(num_valid)
            want = [a for a in range(oldest, n_added - length + 1) if a % period == 0]
            assert [oldest + (s - (h - nv)) % capacity for s in np.asarray(starts)[: int(count)].tolist()] == want
            assert np.flatnonzero(np.asarray(aligned)).tolist()[: int(count)] == [a - oldest for a in want]
    mod = jax.jit(_ring.counter_mod, static_argnums=1)
    for value in (0, 2**30 - 1, 2**30, 3 * 2**30 + 5, 2**61 - 1):
        c = jnp.array([value >> 30, value & _ring.LOW_MASK], jnp.int32)
        for m in (1, 2, 7, 2**31 - 1):
            assert int(mod(c, m)) == value % m


def test_check_batch_fits():
    _ring.check_batch_fits(4, 4)
    with pytest.raises(ValueError, match="does not fit a ring of capacity 4"):
        _ring.check_batch_fits(5, 4)
    with pytest.raises(ValueError, match="at least one item"):
        _ring.check_batch_fits(0, 4)
    with pytest.raises(ValueError, match="length and period"):
        _ring.num_windows(jnp.int32(3), 0)


def test_write_along_lane_axis():
    storage = jnp.zeros((2, 5), jnp.int32)
    batch = jnp.array([[1, 2, 3], [4, 5, 6]], jnp.int32)
    out = _ring.write(storage, batch, jnp.int32(3), axis=1)
    assert np.asarray(out).tolist() == [[3, 0, 0, 1, 2], [6, 0, 0, 4, 5]]


@pytest.mark.parametrize("row", [(), (1,), (3,), (2, 3)])
@pytest.mark.parametrize("lead", [(1,), (3,), (2, 3)])
def test_write_along_later_axis_matches_numpy(lead, row):
    # Every lane's slots (head + i) % capacity are written, wrap included, whatever the row shape.
    capacity, axis = 5, len(lead)
    rng = np.random.default_rng(0)
    storage = rng.integers(0, 100, (*lead, capacity, *row)).astype(np.int32)
    jitted = jax.jit(_ring.write, static_argnames="axis")
    for t, head in itertools.product([1, 2, 4, 5], range(capacity)):
        batch = rng.integers(100, 200, (*lead, t, *row)).astype(np.int32)
        want = storage.copy()
        for i in range(t):
            want[(slice(None),) * axis + ((head + i) % capacity,)] = batch[(slice(None),) * axis + (i,)]
        for write in (_ring.write, jitted):
            got = write(jnp.asarray(storage), jnp.asarray(batch), jnp.int32(head), axis=axis)
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"t={t} head={head} {write}")


def test_counter_never_overflows_int32():
    c = _ring.counter_zero()
    add = jax.jit(_ring.counter_add)
    step = (1 << 30) - 1
    total = 0
    for _ in range(10):  # 10 * (2**30 - 1) > 2**33, far past int32
        c = add(c, step)
        total += step
    assert _ring.counter_value(c) == total
    assert c.dtype == jnp.int32
    stacked = jnp.stack([c, _ring.counter_add(_ring.counter_zero(), 5)])
    assert _ring.counter_value(stacked).tolist() == [total, 5]


def test_counter_add_of_several_counters_is_each_ones_add():
    """`counter_add` of counters `[k, 2]` and increments `[k]` (or one for all) adds each to its own counter, carry
    included, as one counter at a time does."""
    low = _ring.LOW_MASK
    counters = jnp.array([[0, low], [3, low - 1], [0, 0], [7, 5]], jnp.int32)
    n = jnp.array([1, 5, (1 << 30) - 1, 0], jnp.int32)
    got = jax.jit(_ring.counter_add)(counters, n)
    want = jnp.stack([_ring.counter_add(c, k) for c, k in zip(counters, n)])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert _ring.counter_value(got).tolist() == [(1 << 30), 3 * (1 << 30) + low + 4, (1 << 30) - 1, 7 * (1 << 30) + 5]
    np.testing.assert_array_equal(np.asarray(_ring.counter_add(counters, 2)),
                                  np.asarray(jnp.stack([_ring.counter_add(c, 2) for c in counters])))


@pytest.mark.parametrize("capacity", [1, 3, 8])
def test_last_item_number_matches_model(capacity):
    """The item last written to each slot, from the cursors alone, for every fill level."""
    counter = _ring.counter_zero()
    slots_model = [None] * capacity
    n = 0
    for b in [1, 2, capacity, 1, 3, 2 * capacity, 1]:
        for _ in range(b):
            slots_model[n % capacity] = n
            n += 1
        counter = _ring.counter_add(counter, b)
        head = jnp.int32(n % capacity)  # where the ring's next write goes
        got = np.asarray(_ring.last_item_number(counter, head, jnp.arange(capacity), capacity))
        for s, want in enumerate(slots_model):
            if want is not None:
                assert got[s] == want, (s, got, slots_model)


def test_last_item_number_wraps_in_int32():
    """Past 2**31 items the number wraps like int32 (equality still tells writes apart)."""
    counter = jnp.array([2, 5], jnp.int32)  # 2 * 2**30 + 5 items = 2**31 + 5
    got = int(_ring.last_item_number(counter, jnp.int32(0), jnp.array([3]), 4)[0])
    want = ((2**31 + 5 - 1 - ((0 - 1 - 3) % 4)) + 2**31) % 2**32 - 2**31
    assert got == want


def test_write_pytree_equals_leaf_by_leaf():
    # One call for a whole storage pytree (indices shared) writes what per-leaf calls write.
    rng = np.random.default_rng(1)
    storage = {"obs": jnp.asarray(rng.normal(size=(3, 7, 2, 2)), jnp.float32), "flag": jnp.zeros((3, 7), jnp.int32)}
    for t in (1, 4):
        batch = {"obs": jnp.ones((3, t, 2, 2), jnp.float32), "flag": jnp.full((3, t), 5, jnp.int32)}
        got = _ring.write(storage, batch, jnp.int32(5), axis=1)
        for k in storage:
            np.testing.assert_array_equal(got[k], _ring.write(storage[k], batch[k], jnp.int32(5), axis=1))


def test_checked_cursors_range_checks_each_member_and_names_it():
    """`head` in [0, ring), `num_valid` in [0, ring], `added` a two-word counter; leading member axes `lead`; the
    name in errors carries `prefix` (what `ReplayBuffer.with_cursors` and a checkpoint's restore run)."""
    out = _ring.checked_cursors(4, head=np.int64(3), num_valid=4, added=[1, 2**30 - 1])
    assert {k: v.tolist() for k, v in out.items()} == {"head": 3, "num_valid": 4, "added": [1, 2**30 - 1]}
    assert all(v.dtype == jnp.int32 for v in out.values())
    assert _ring.checked_cursors(4, head=None) == {}
    for kw, says in ((dict(head=4), "head: expected a value in [0, 3], got 4"),
                     (dict(num_valid=-1), "num_valid: expected a value in [0, 4], got -1"),
                     (dict(added=[-1, 0]), "added: expected [high, low] with high >= 0 and 0 <= low < 2**30, got [-1, 0]"),
                     (dict(head=[0, 1]), "head: expected shape (), got (2,)")):
        with pytest.raises(ValueError, match=f"^{re.escape(says)}$"):
            _ring.checked_cursors(4, **kw)
    with pytest.raises(TypeError, match="^head: expected an integer value, got dtype float32$"):
        _ring.checked_cursors(4, head=np.float32(1))
    stacked = _ring.checked_cursors(4, (2,), "buf.", head=[0, 3], added=[[0, 1], [0, 2]])
    assert stacked["head"].shape == (2,) and stacked["added"].shape == (2, 2)
    with pytest.raises(ValueError, match=re.escape("buf.num_valid: expected a value in [0, 4], got [4, 5]")):
        _ring.checked_cursors(4, (2,), "buf.", num_valid=[4, 5])
