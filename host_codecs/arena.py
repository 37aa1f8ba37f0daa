"""The arena a `host_codecs.CompressedStore` packs its payloads in: growing `uint8` chunks, payloads at `ALIGN`-byte
offsets behind each chunk's bump pointer, published bytes never modified (`docs/api/host_codecs.md`, "Arena").
Not thread-safe: the store calls it under its lock.
"""

from __future__ import annotations

import numpy as np

from ._base import ALIGN, ChunkTable, ceil_align

__all__ = ["MAX_CHUNK_BYTES", "Arena"]

_GROWTH = 10  # a new chunk is at most 1/_GROWTH of the arena so far

#: Largest chunk: offsets and lengths are stored as uint32.
MAX_CHUNK_BYTES = (1 << 32) - ALIGN


class _Chunk:
    """One chunk: its bytes, its bump pointer and what is still live in it."""

    __slots__ = ("data", "used", "live_bytes", "live_count")

    def __init__(self, data):
        self.data = data  # shape=(size,), dtype=uint8, or a chunk file's handle (`Arena._allocate`)
        self.used = 0  # bytes handed out (the bump pointer), a multiple of ALIGN
        self.live_bytes = 0  # padded bytes of payloads still in use
        self.live_count = 0  # payloads still in use (zero-length ones included)


class Arena:
    """Aligned payload space in growing chunks, the first of `min_chunk_bytes`, the largest of `chunk_bytes` (multiples
    of `ALIGN`, at most `MAX_CHUNK_BYTES`). `chunks`: chunk id -> `_Chunk`, the chunks held; `nbytes`: bytes of all
    chunks held (payload and slack); `dead_nbytes`: freed bytes in chunks still held."""

    def __init__(self, chunk_bytes: int, min_chunk_bytes: int):
        self.chunk_bytes, self.min_chunk_bytes = chunk_bytes, min_chunk_bytes
        self.chunks: dict[int, _Chunk] = {}
        self.nbytes = self.dead_nbytes = self._next_id = 0
        self._open: int | None = None  # the chunk receiving new payloads
        self._table: ChunkTable | None = None  # snapshot for readers, rebuilt when chunks change

    def table(self, dictionary=None) -> ChunkTable:
        """The chunks' bytes for readers (immutable once built: it keeps its chunks alive)."""
        if self._table is None or self._table.dictionary is not dictionary:
            self._table = ChunkTable({c: ch.data for c, ch in self.chunks.items()}, dictionary, checked=True)
        return self._table

    def place(self, buffer: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Copy payloads into never-used space, one copy per run of payloads that fit a chunk: `buffer` (uint8) holds
        them at ascending `offsets`, each padded to `ALIGN`; `offsets`, `lengths`: int64 `[B]`. Returns where each
        payload now is, `(chunk_ids, offsets)`: int32 and int64 `[B]`."""
        b = offsets.shape[0]
        ends = offsets + ceil_align(lengths)  # padded end of each payload
        chunk_ids, placed = np.empty(b, dtype=np.int32), np.empty(b, dtype=np.int64)
        start = 0
        while start < b:
            base = int(offsets[start])
            ch = self.chunks[self._open] if self._open is not None else None
            room = ch.data.shape[0] - ch.used if ch is not None else -1
            stop = start + int(np.searchsorted(ends[start:] - base, room, side="right"))  # [start, stop) fit
            if stop == start:
                rest = int(ends[-1]) - base
                self._new_chunk(max(rest if rest <= self.chunk_bytes else int(ends[start]) - base, ALIGN))
                continue
            span = int(ends[stop - 1]) - base
            ch.data[ch.used : ch.used + span] = buffer[base : base + span]
            chunk_ids[start:stop] = self._open
            placed[start:stop] = offsets[start:stop] - base + ch.used
            ch.used += span
            ch.live_bytes += span
            ch.live_count += stop - start
            start = stop
        return chunk_ids, placed

    def cuts(self, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The end of each piece (# shape=(P,), dtype=int64) that `take` holds as a chunk, of payloads packed back to
        back from byte 0 (`offsets`, `lengths` as `place` takes them): the most that fit `chunk_bytes` (a larger one
        alone)."""
        ends = offsets + ceil_align(lengths)
        out, start = [], 0
        while start < ends.size:
            base = int(offsets[start])
            stop = max(start + int(np.searchsorted(ends[start:] - base, self.chunk_bytes, side="right")), start + 1)
            out.append(int(ends[stop - 1]))
            start = stop
        return np.asarray(out, np.int64)

    def take(self, pieces: list[np.ndarray], offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Hold payloads packed back to back in `pieces` (cut as `cuts` says) as sealed chunks, not copied. `offsets`
        (over the pieces joined), `lengths` and the result are as `place`'s."""
        ends = offsets + ceil_align(lengths)
        chunk_ids, placed = np.empty(offsets.shape[0], dtype=np.int32), np.empty(offsets.shape[0], dtype=np.int64)
        start = base = 0
        for piece in pieces:
            stop = int(np.searchsorted(ends, base + piece.shape[0], side="right"))  # the payloads ending in this piece
            chunk_ids[start:stop], placed[start:stop] = self._hold(piece, offsets[start:stop] - base, lengths[start:stop])
            start, base = stop, base + piece.shape[0]
        return chunk_ids, placed

    def _hold(self, piece: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`take` of one piece: it becomes a sealed chunk (`host_codecs.chunk_arena` copies it into its files)."""
        cid = self._add(piece)
        ch = self.chunks[cid]
        ch.used = ch.live_bytes = piece.shape[0]
        ch.live_count = offsets.shape[0]
        return np.full(offsets.shape[0], cid, np.int32), offsets

    def free(self, chunk_ids: np.ndarray, lengths: np.ndarray) -> None:
        """Mark payloads as no longer used (`lengths` without padding); release emptied chunks."""
        ids, inv = np.unique(chunk_ids, return_inverse=True)
        freed = np.bincount(inv.reshape(-1), weights=ceil_align(lengths.astype(np.int64))).astype(np.int64)
        for cid, nb, cnt in zip(ids.tolist(), freed.tolist(), np.bincount(inv.reshape(-1)).tolist()):
            ch = self.chunks[cid]
            ch.live_bytes -= nb
            ch.live_count -= cnt
            self.dead_nbytes += nb
            self._release_if_empty(cid)

    def sparsest(self, max_dead_fraction: float) -> int | None:
        """The sealed chunk most freed if freed bytes exceed `max_dead_fraction` of the arena (else None)."""
        sealed = [(ch.used - ch.live_bytes, cid) for cid, ch in self.chunks.items() if cid != self._open]
        if not sealed or sum(d for d, _ in sealed) <= max_dead_fraction * self.nbytes:
            return None
        return max(sealed)[1]

    def relocate(self, cid: int, offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Move the live payloads of chunk `cid` into fresh space and drop the chunk; returns their new
        `(chunk_ids, offsets)` as `place` does."""
        padded = ceil_align(lengths.astype(np.int64))
        packed = np.zeros(len(padded), np.int64)
        np.cumsum(padded[:-1], out=packed[1:])
        buf = np.empty(int(padded.sum()), np.uint8)
        data = self._contents(self.chunks[cid])
        for o, n, d in zip(offsets.tolist(), padded.tolist(), packed.tolist()):
            buf[d : d + n] = data[o : o + n]
        placed = self.place(buf, packed, lengths.astype(np.int64))
        self._drop(cid)  # the moved payloads are still counted live in it: drop it whole
        return placed

    def clear(self) -> None:
        """Release every chunk."""
        for cid in list(self.chunks):
            self._drop(cid)
        self._open = None

    def load(self, table: ChunkTable, chunk: np.ndarray, offset: np.ndarray, length: np.ndarray, pos: np.ndarray):
        """`(table, chunk, offset)` of the payloads at positions `pos` of a read, readable from memory (here: as they
        are; `host_codecs.chunk_arena` reads its files)."""
        return table, chunk, offset

    def _allocate(self, cid: int, size: int):
        """The bytes of a new chunk `cid` of `size` bytes (`host_codecs.chunk_arena` makes a file)."""
        return np.empty(size, dtype=np.uint8)

    def _contents(self, ch: _Chunk) -> np.ndarray:
        """A chunk's bytes as an array (`relocate` copies from it)."""
        return ch.data

    def _add(self, data) -> int:
        """A new chunk holding `data`: its id."""
        cid = self._next_id
        self.chunks[cid] = _Chunk(data)
        self._next_id += 1
        self._table = None
        self.nbytes += data.shape[0]
        return cid

    def _new_chunk(self, need: int) -> None:
        size = ceil_align(max(min(self.chunk_bytes, max(self.min_chunk_bytes, self.nbytes // _GROWTH)), need))
        old, self._open = self._open, self._add(self._allocate(self._next_id, size))
        if old is not None:
            self._release_if_empty(old)

    def _release_if_empty(self, cid: int) -> None:
        if cid != self._open and self.chunks[cid].live_count == 0:
            self._drop(cid)

    def _drop(self, cid: int) -> None:
        ch = self.chunks.pop(cid)
        self._table = None
        self.nbytes -= ch.data.shape[0]
        self.dead_nbytes -= ch.used - ch.live_bytes
