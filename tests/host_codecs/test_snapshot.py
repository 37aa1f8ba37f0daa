"""Snapshots: an imported store holds the payload pieces it was given as its arena chunks (no second copy), its index
as given, exact accounting, and keeps working as a ring afterwards."""

from __future__ import annotations

import numpy as np
import pytest

from host_codecs import CompressedStore
from host_codecs._base import ceil_align

N, KW = 1200, dict(codec="none", chunk_bytes=1 << 15, min_chunk_bytes=1 << 12)


class _Source:
    """A payload source over an exported payload, keeping the pieces the store handed it."""

    def __init__(self, payload, fail=False):
        self.payload, self.nbytes, self.fail, self.pieces = payload, payload.nbytes, fail, None

    def read_pieces(self, pieces):
        if self.fail:
            raise OSError("unreadable")
        self.pieces, at = pieces, 0
        for p in pieces:
            p[:] = self.payload[at : at + p.size]
            at += p.size


def _put_ring(store, rng, t, n):
    """Entries of different sizes (40 to 400 bytes) into slots `t, t+1, ...` (mod N), 50 a put."""
    for a in range(t, t + n, 50):
        for s in range(a, a + 50):
            store.put(np.array([s % N]), rng.integers(0, 256, (1, int(rng.integers(40, 400))), dtype=np.uint8))
    return t + n


def _assert_exact(store):
    """The arena's counts equal what the index says, chunk by chunk, and the stats agree with both."""
    arena, rows = store._arena, store.index_rows
    chunk, padded = store._chunk[:rows], ceil_align(store._length[:rows].astype(np.int64))
    for cid, ch in arena.chunks.items():
        sel = chunk == cid
        assert (ch.live_count, ch.live_bytes) == (int(sel.sum()), int(padded[sel].sum())), cid
        assert ch.live_bytes <= ch.used <= ch.data.shape[0]
    assert arena.nbytes == sum(ch.data.shape[0] for ch in arena.chunks.values())
    assert arena.dead_nbytes == sum(ch.used - ch.live_bytes for cid, ch in arena.chunks.items())
    s = store.stats()
    assert s["arena_nbytes"] == arena.nbytes and s["payload_nbytes"] == int(store._length[:rows][chunk >= 0].sum())
    return s


def test_imported_store_holds_the_pieces_read_as_its_chunks_and_keeps_working_as_a_ring():
    rng = np.random.default_rng(0)
    store = CompressedStore(N, **KW)
    t = _put_ring(store, rng, 0, 3 * N // 2)
    meta, arrays = store.export_state()
    source = _Source(arrays["payload"])
    copy = CompressedStore(N, **KW)
    copy.import_state(meta, {**arrays, "payload": source}, adopt=True)

    held = [ch.data for ch in copy._arena.chunks.values()]
    assert len(held) == len(source.pieces) > 2 and all(a is b for a, b in zip(held, source.pieces))
    assert all(p.size <= KW["chunk_bytes"] for p in held) and sum(p.size for p in held) == source.nbytes
    assert copy._chunk is arrays["chunk"] and copy._offset is arrays["offset"]  # the index as given, not a copy
    s = _assert_exact(copy)
    assert s["arena_nbytes"] == source.nbytes and s["dead_nbytes"] == 0  # no slack but the payloads' padding
    for i in range(N):
        np.testing.assert_array_equal(copy.get(np.array([i])), store.get(np.array([i])))

    worst = {}
    for which, st in (("original", store), ("imported", copy)):  # the same puts into both: overwrites, frees, growth
        r, u = np.random.default_rng(1), t
        worst[which] = 0.0
        for _ in range(2 * N // 100):
            u = _put_ring(st, r, u, 100)
            s = _assert_exact(st)
            worst[which] = max(worst[which], s["slack_nbytes"] / s["arena_nbytes"])
    assert worst["imported"] <= 0.25, worst
    assert not set(map(id, held)) & {id(ch.data) for ch in copy._arena.chunks.values()}  # all overwritten, released
    for i in range(N):
        np.testing.assert_array_equal(copy.get(np.array([i])), store.get(np.array([i])))


def test_a_payload_array_is_held_only_when_handed_over_and_a_failed_read_changes_nothing():
    rng = np.random.default_rng(0)
    store = CompressedStore(200, **KW)
    for s in range(200):
        store.put(np.array([s]), rng.integers(0, 256, (1, 50), dtype=np.uint8))
    meta, arrays = store.export_state()
    assert arrays["payload"].size <= KW["chunk_bytes"]  # one piece
    kept = CompressedStore(200, **KW)
    kept.import_state(meta, {k: v.copy() for k, v in arrays.items()}, adopt=True)
    copied = CompressedStore(200, **KW)
    copied.import_state(meta, arrays)
    assert [ch.data.base is None for ch in kept._arena.chunks.values()] == [True]
    assert not any(np.shares_memory(ch.data, arrays["payload"]) for ch in copied._arena.chunks.values())
    assert copied._chunk is not arrays["chunk"]
    for st in (kept, copied):
        _assert_exact(st)
        np.testing.assert_array_equal(st.get(np.arange(200)), store.get(np.arange(200)))

    failed = CompressedStore(200, **KW)
    with pytest.raises(OSError, match="unreadable"):
        failed.import_state(meta, {**arrays, "payload": _Source(arrays["payload"], fail=True)}, adopt=True)
    assert failed.stats()["entries"] == 0 and not failed._arena.chunks and failed.index_rows == 0
    failed.import_state(meta, {**arrays, "payload": _Source(arrays["payload"])}, adopt=True)
    np.testing.assert_array_equal(failed.get(np.arange(200)), store.get(np.arange(200)))
    short = CompressedStore(200, **KW)
    with pytest.raises(ValueError, match="packed back to back"):
        short.import_state(meta, {**arrays, "payload": _Source(arrays["payload"][:-8])})


def test_a_later_export_is_the_state_of_its_call_whatever_is_put_and_compacted_meanwhile():
    """`export_later()` takes the store now and exports later: puts that then overwrite every slot (a ring wrapped
    twice, releasing every chunk the taken entries lie in), sparse chunks compacted and slots deleted do not reach
    it. Its payload runs are views of the arena chunks (nothing copied) joined into `export_state`'s payload, and
    calling it twice gives the same snapshot."""
    rng = np.random.default_rng(1)
    kw = {**KW, "max_dead_fraction": 0.05}
    store = CompressedStore(N, **kw)
    t = _put_ring(store, rng, 0, 3 * N // 2)
    want_meta, want = store.export_state()
    later = store.export_later()
    chunks = [ch.data for ch in store._arena.chunks.values()]
    store.delete(np.arange(0, N, 3))
    _put_ring(store, rng, t, 2 * N)
    assert not any(ch.data is c for c in chunks for ch in store._arena.chunks.values())  # every taken chunk released
    assert store.stats()["compactions"] > 0
    for _ in range(2):
        meta, arrays = later()
        runs = arrays["payload"].runs
        assert all(any(np.shares_memory(r, c) for c in chunks) for r in runs) and len(runs) < len(chunks) + 2
        assert meta == want_meta and set(arrays) == set(want)
        for k, a in want.items():
            np.testing.assert_array_equal(np.asarray(arrays[k]), a, err_msg=k)
    copy = CompressedStore(N, **kw)
    copy.import_state(meta, {**arrays, "payload": np.asarray(arrays["payload"])})
    np.testing.assert_array_equal(copy.export_state()[1]["payload"], want["payload"])


def test_empty_payloads_beside_others_export_and_import():
    """An empty entry (a 0-byte payload) at the offset where a non-empty one starts, after a rewrite left a gap:
    the export packs the empty one first and the import reads them back in that order."""
    store = CompressedStore(16, "rle")
    for slot, row in ((5, np.zeros(0, np.uint8)), (9, np.arange(100, dtype=np.uint8)), (1, np.arange(100, dtype=np.uint8) + 1),
                      (9, np.arange(100, dtype=np.uint8) + 2)):
        store.put(np.array([slot]), row[None])
    back = CompressedStore(16, "rle")
    back.import_state(*store.export_state())
    for slot in (1, 5, 9):
        np.testing.assert_array_equal(back.get(np.array([slot])), store.get(np.array([slot])))
