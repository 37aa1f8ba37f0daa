"""The store index grows as slots are used (`host_codecs.slot_index`): rows held, reads past them, snapshots."""

import numpy as np
import pytest

from host_codecs import CompressedStore
from host_codecs.slot_index import GROWTH, MIN_ROWS, grown_rows


def test_grown_rows_bounds():
    """Enough rows, at most the slots, at least GROWTH times the old count: so growing one slot at a time up to n
    grows O(log n) times."""
    assert grown_rows(10, 5, 100) == 10 and grown_rows(0, 1, 100) == 100 and grown_rows(0, 1, 10_000) == MIN_ROWS
    assert grown_rows(1000, 1001, 10_000) == int(np.ceil(GROWTH * 1000)) and grown_rows(1000, 5000, 10_000) == 5000
    rows, growths = 0, 0
    for need in range(1, 100_001):
        new = grown_rows(rows, need, 100_000)
        growths += new != rows
        rows = new
        assert need <= rows <= max(MIN_ROWS, GROWTH * need + 1)
    assert growths < 40


def test_index_holds_the_slots_used_and_reads_past_them_are_empty():
    rng = np.random.default_rng(0)
    store = CompressedStore(100_000, codec="none", item_shape=(6,), dtype=np.int16)
    full = 28 * 100_000
    data = rng.integers(0, 4, (3000, 6)).astype(np.int16)
    for a in range(0, 3000, 100):  # slots used from 0 up, as a rollout writer numbers its frames
        store.put(np.arange(a, a + 100), data[a : a + 100])
    assert 3000 <= store.index_rows <= GROWTH * 3000 and store.index_nbytes < full / 25
    np.testing.assert_array_equal(store.get(np.arange(3000)), data)
    rows = store.index_rows
    far = np.array([3000, 99_999, -1])
    assert not store.written(far).any()
    np.testing.assert_array_equal(store.get(far, missing="zeros"), 0)
    with pytest.raises(KeyError, match="99999"):
        store.get(far)
    store.delete(far)
    assert store.dependents(far).size == 0 and store.chain_slots(far).size == 0
    assert store.index_rows == rows  # reads and deletes past the rows grow nothing
    store.put(np.array([99_999]), data[:1])  # the last slot: every row
    assert store.index_rows == 100_000 and store.index_nbytes >= full
    np.testing.assert_array_equal(store.get(np.array([99_999, 5])), data[[0, 5]])


def test_deltas_across_a_growth():
    """A delta whose base was written before the index grew decodes after it."""
    store = CompressedStore(5000, codec="none", item_shape=(4,), dtype=np.uint8)
    a = np.arange(4, dtype=np.uint8)
    store.put(np.array([10]), a[None])
    store.put(np.array([4000]), (a + 1)[None], bases=np.array([10]))
    np.testing.assert_array_equal(store.get(np.array([4000, 10])), np.stack([a + 1, a]))
    store.put(np.array([10]), a[None] * 0)  # rewriting the base deletes its delta
    assert not store.written(np.array([4000]))[0]


def test_snapshot_carries_the_grown_rows_and_full_length_ones_import():
    store = CompressedStore(20_000, codec="none", item_shape=(3,), dtype=np.int32)
    vals = np.arange(600, dtype=np.int32).reshape(200, 3)
    store.put(np.arange(200), vals)
    meta, arrays = store.export_state()
    assert arrays["chunk"].shape == (store.index_rows,) and store.index_rows < 20_000
    copy = CompressedStore(20_000, codec="none", item_shape=(3,), dtype=np.int32)
    copy.import_state(meta, arrays)
    assert copy.index_rows == store.index_rows
    np.testing.assert_array_equal(copy.get(np.arange(200)), vals)
    # a snapshot of a store whose index had every row (as saved before the index grew): same entries
    empty = {"chunk": -1, "base": -1, "child": -1}
    old = {k: np.concatenate([a, np.full(20_000 - a.size, empty.get(k, 0), a.dtype)]) if a.shape == arrays["chunk"].shape else a
           for k, a in arrays.items()}
    again = CompressedStore(20_000, codec="none", item_shape=(3,), dtype=np.int32)
    again.import_state(meta, old)
    assert again.index_rows == 20_000
    np.testing.assert_array_equal(again.get(np.arange(200)), vals)
    again.put(np.array([19_999]), vals[:1])
    with pytest.raises(ValueError, match="'chunk'"):
        CompressedStore(20_000, codec="none", item_shape=(3,), dtype=np.int32).import_state(
            meta, {**arrays, "chunk": np.full(20_001, -1, np.int32)})
