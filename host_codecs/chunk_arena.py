"""ChunkFileStore: a `host_codecs.CompressedStore` whose arena is a folder of append-only chunk files.

The compressed store for data larger than memory. Everything but the payload bytes is the in-memory store's (codecs,
zstd dictionary, delta chains, checksums, space reuse): the index stays in memory and is written by `write_index`; the
payloads are appended to chunk files with positioned writes (`os.pwrite`) and read back with positioned reads
(`os.preadv`, never a memory map), so the pages read stay in the operating system's page cache and are not counted in
the process's resident memory.

Files, in the store's folder:

```
chunk-<id>.bin     # the payloads of arena chunk <id>, each at an ALIGN-byte offset, appended behind a bump pointer
index-<g>.npz      # what `write_index` wrote: every index column (host_codecs.store), `tags` and `dictionary`
```

Reads: a read takes its usual snapshot of the index, then (`ChunkFileArena.load`, the store's read hook) sorts the
payloads it decodes by chunk and offset, merges those less than `_GAP` bytes apart into one range, and reads each range
with one `os.preadv` into one buffer (ranges in parallel, `host_codecs.parallel_for`); checksums and decoding then run
on that buffer exactly as in memory. A payload cut short by a truncated file reads as zeros past the end and fails its
checksum (`CorruptEntryError` naming the store, the slots, the chunk files and the folder).

Append only: a payload's bytes are never changed once written. A chunk file with no live entry left is deleted, and
`max_dead_fraction` moves the live entries of sparse chunks into fresh space (`host_codecs.arena`), so a ring that
overwrites its oldest entries keeps its folder about the size of its live payloads, however often it wraps. A chunk
the last written index may still name is kept until the next `write_index` is committed (`commit`): a crash at any
point leaves every file that index names whole, so the folder reopens as of that index. Between two indexes the folder
holds at most the chunks of the last index plus those written since.

Modes: `"w"` (a new, empty store in an empty folder), `"r+"` (reopen an index, delete the files it does not name:
leftovers of an interrupted write, then read and write), `"r"` (read only: `put` raises
`host_codecs.file_store.ReadOnlyError`, files are opened read-only).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ._base import ALIGN, ChunkTable, CorruptEntryError, ceil_align, dtype_code, dtype_from_code, mode_arg, path_arg
from ._pool import parallel_for
from .arena import Arena, _Chunk
from .file_store import ReadOnlyError
from .registry import CODECS
from .snapshot import saved_checksum
from .store import CompressedStore
from .zstd import ZstdDictionary

__all__ = ["ChunkFileArena", "ChunkFileStore"]

_GAP = 4096  # payloads closer than this in one chunk file are read with one call (a syscall costs more than a page)
_READ_SHARD_BYTES = 1 << 20


def chunk_name(cid: int) -> str:
    """File name of arena chunk `cid`."""
    return f"chunk-{cid:06d}.bin"


class _ChunkFile:
    """One chunk file: a uint8 array of `shape[0]` bytes whose slices are read with `os.preadv` and written with
    `os.pwrite`. The descriptor closes when the last holder (the arena, or a reader's chunk table) drops it."""

    __slots__ = ("path", "fd", "shape", "dirty")

    def __init__(self, path: Path, size: int, flags: int):
        self.path, self.shape, self.dirty = path, (int(size),), False
        self.fd = os.open(path, flags, 0o644)

    def __getitem__(self, key: slice) -> np.ndarray:
        out = np.empty(key.stop - key.start, np.uint8)
        got = os.preadv(self.fd, [out], key.start) if out.size else 0
        out[got:] = 0  # past the end of a truncated file: zeros, which fail the entries' checksums
        return out

    def __setitem__(self, key: slice, value: np.ndarray) -> None:
        view, at = memoryview(np.ascontiguousarray(value)).cast("B"), key.start
        while view.nbytes:
            n = os.pwrite(self.fd, view, at)
            view, at = view[n:], at + n
        self.dirty = True

    def close(self, _close=os.close) -> None:  # (os.close bound now: __del__ may run at interpreter exit)
        if self.fd >= 0:
            _close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


class ChunkFileArena(Arena):
    """`host_codecs.arena.Arena` whose chunks are files `chunk-<id>.bin` in `directory` (module doc).

    Args:
      directory: the folder (it exists).
      chunk_bytes, min_chunk_bytes: as `Arena`.
      writable: False: no chunk is created (the store refuses writes first).
    """

    def __init__(self, directory: Path, chunk_bytes: int, min_chunk_bytes: int, writable: bool):
        super().__init__(chunk_bytes, min_chunk_bytes)
        self.directory, self.writable = directory, writable
        self.flushed: set[int] = set()  # chunks the last written index (or the one being committed) may name
        self.retired: list[Path] = []  # chunk files of `flushed` no entry uses any more: deleted after the next commit

    def _allocate(self, cid: int, size: int) -> _ChunkFile:
        if not self.writable:
            raise ReadOnlyError(f"{self.directory}: a chunk file cannot be created, the store was opened with mode='r'")
        return _ChunkFile(self.directory / chunk_name(cid), size, os.O_RDWR | os.O_CREAT | os.O_TRUNC)

    def _contents(self, ch: _Chunk) -> np.ndarray:
        return ch.data[0 : ch.used]

    def _hold(self, piece: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.place(piece, offsets, lengths)  # memory cannot become a chunk file: written into one

    def _drop(self, cid: int) -> None:
        path = self.chunks[cid].data.path
        super()._drop(cid)
        if cid in self.flushed:
            self.retired.append(path)
        else:  # no index names it: gone now (a reader holding its descriptor still reads it)
            path.unlink(missing_ok=True)

    def adopt(self, sizes: dict[int, int], next_id: int) -> None:
        """Take the existing chunk files `sizes` (chunk id -> bytes used) as sealed chunks; new chunks get ids from
        `next_id`. ValueError naming the file when one is missing or shorter."""
        flags = os.O_RDWR if self.writable else os.O_RDONLY
        for cid, used in sorted(sizes.items()):
            path = self.directory / chunk_name(cid)
            size = path.stat().st_size if path.is_file() else None
            if size is None or size < used:
                raise ValueError(f"{path}: {'missing' if size is None else f'{size} bytes'}; the store's index needs {used} bytes of it")
            ch = _Chunk(_ChunkFile(path, used, flags))
            ch.used = used
            self.chunks[cid] = ch
            self.nbytes += used
        self._next_id, self._open, self._table = next_id, None, None
        self.flushed = set(sizes)

    def sync(self) -> None:
        """fsync every chunk file written since the last `sync`."""
        for ch in self.chunks.values():
            if ch.data.dirty:
                os.fsync(ch.data.fd)
                ch.data.dirty = False

    def load(self, table: ChunkTable, chunk: np.ndarray, offset: np.ndarray, length: np.ndarray, pos: np.ndarray):
        """Read the payloads at positions `pos` of a read into one buffer (module doc, Reads): `(table, chunk,
        offset)` with `table` that buffer as chunk 0 and `chunk`, `offset` (copies) pointing into it at `pos`."""
        if not pos.size:
            return table, chunk, offset
        c, o = chunk[pos].astype(np.int64), offset[pos].astype(np.int64)
        order = np.lexsort((o, c))
        c, o = c[order], o[order]
        end = o + ceil_align(length[pos].astype(np.int64))[order]
        reach = np.maximum.accumulate((c << 33) + end)  # furthest byte read so far in this chunk (chunk in the high bits)
        starts = np.flatnonzero(np.concatenate([[True], (c[1:] != c[:-1]) | ((c[1:] << 33) + o[1:] > reach[:-1] + _GAP)]))
        rc, rs, re = c[starts], o[starts], np.maximum.reduceat(end, starts)
        dst = np.zeros(starts.size + 1, np.int64)
        np.cumsum(re - rs, out=dst[1:])
        buf = np.empty(int(dst[-1]) + ALIGN, np.uint8)
        files = [table.get(x) for x in rc.tolist()]

        def read(a: int, b: int) -> None:
            for i in range(a, b):
                part, f = buf[dst[i] : dst[i + 1]], files[i]
                got = os.preadv(f.fd, [part], int(rs[i])) if f is not None and f.fd >= 0 else 0
                part[got:] = 0  # a truncated (or absent) file: zeros, which fail the checksums

        parallel_for(starts.size, read, work_bytes=int(dst[-1]), min_shard_bytes=_READ_SHARD_BYTES)
        group = np.searchsorted(starts, np.arange(c.size), side="right") - 1
        placed = np.empty(pos.size, np.int64)
        placed[order] = dst[group] + (o - rs[group])
        chunk, offset = chunk.copy(), offset.astype(np.int64)
        chunk[pos], offset[pos] = 0, placed
        return ChunkTable({0: buf}, table.dictionary), chunk, offset


class ChunkFileStore(CompressedStore):
    """A `CompressedStore` whose payloads live in chunk files in `directory` (module doc: files, reads, space, modes).

    Args:
      directory: the store's folder (created by `"w"`, which requires it empty or absent).
      num_slots: as `CompressedStore`.
      codec: as `CompressedStore`.
      item_shape: as `CompressedStore` (required).
      dtype: as `CompressedStore` (required).
      mode: `"w"`, `"r+"` or `"r"`.
      index: with `"r"` / `"r+"`, the index file to open (`write_index` wrote it).
      meta: with `"r"` / `"r+"`, what `write_index` returned with that file.
      **kwargs: the other keywords of `CompressedStore` (`chunk_bytes`, `min_chunk_bytes`, `max_dead_fraction`,
        `dictionary_bytes`, `dictionary_samples`, `name`).

    Raises:
      TypeError: `directory` or `index` not a path (a non-empty str or `os.PathLike`), or `meta` not a dict.
      ValueError: as `CompressedStore`; another mode; with `"w"`, a non-empty folder; with `"r"` / `"r+"`, an index of another
        configuration or inconsistent with itself, or a chunk file it names missing or short (the message names the
        file and the field).
      FileNotFoundError: the index file is missing.
    """

    def __init__(self, directory: str | os.PathLike, num_slots: int, codec: Any, *, item_shape, dtype, mode: str,
                 index: str | os.PathLike | None = None, meta: dict | None = None, **kwargs: Any):
        directory, mode = Path(path_arg("directory", directory)), mode_arg(mode)
        index = None if index is None else Path(path_arg("index", index))
        if meta is not None and not isinstance(meta, dict):
            raise TypeError(f"meta: expected the dict write_index returned with the index file, got {type(meta).__name__} {meta!r:.60}")
        if mode != "w" and (index is None or meta is None):
            raise ValueError(f"index, meta: mode={mode!r} opens an index file and its metadata, got {index!r}, {meta is not None}")
        super().__init__(num_slots, codec, item_shape=item_shape, dtype=dtype, **kwargs)
        self.directory, self.mode = directory, mode
        if mode == "w":
            self.directory.mkdir(parents=True, exist_ok=True)
            if any(self.directory.iterdir()):
                raise ValueError(f"directory: {self.directory} is not empty (a new chunk file store needs an empty folder)")
        self._arena = ChunkFileArena(self.directory, self._arena.chunk_bytes, self._arena.min_chunk_bytes, mode != "r")
        self._chunks = self._arena.chunks
        if mode != "w":
            self._load(index, meta)

    @property
    def nbytes(self) -> int:
        """Memory the store holds: its index, dictionary and recent rows (the payloads are on disk: `disk_nbytes`)."""
        return self.index_nbytes + self.dictionary_nbytes + self.recent_nbytes

    @property
    def disk_nbytes(self) -> int:
        """Bytes of the chunk files (payloads, padding and freed space; files kept for the last index included)."""
        with self._lock:
            live = sum(ch.used for ch in self._arena.chunks.values())
            return live + sum(p.stat().st_size for p in self._arena.retired if p.exists())

    def _check_writable(self, what: str) -> None:
        if self.mode == "r":
            raise ReadOnlyError(f"{self.directory}: {what} refused, the store was opened with mode='r'; reopen it with mode='r+'")

    def _put(self, slots, arrays, codec, ids, values, bases=None) -> None:
        self._check_writable("put")
        super()._put(slots, arrays, codec, ids, values, bases)

    def delete(self, slots: Any) -> None:
        """`CompressedStore.delete`; ReadOnlyError in mode `"r"`."""
        self._check_writable("delete")
        super().delete(slots)

    def clear(self) -> None:
        """`CompressedStore.clear`; ReadOnlyError in mode `"r"`."""
        self._check_writable("clear")
        super().clear()

    def _corrupt(self, slots: np.ndarray, why: str):
        try:
            super()._corrupt(slots, why)
        except CorruptEntryError as e:
            files = sorted({chunk_name(c) for c in self._chunk[np.unique(slots)].tolist() if c >= 0})
            raise CorruptEntryError(f"{e} (chunk files {files[:5]} in {self.directory})") from None

    def write_index(self, path: str | os.PathLike) -> tuple[dict, Any]:
        """Sync the chunk files and write the index to `path` (a new file, fsynced).

        Returns:
          `(meta, token)`: the JSON-able metadata `__init__` needs with the file, and what `commit` takes once the
          caller has recorded the new index as the one to open (until then the previous one stays whole).
        """
        self._check_writable("write_index")
        with self._lock:
            self._arena.sync()
            cols = {k: v[: self._rows].copy() for k, v in self._index_columns().items()}  # the rows grown so far
            d = self._dictionary
            meta = {
                "config": self.config(), "layouts": [[dtype_from_code(c).name, list(s)] for c, s in self._layouts],
                "dictionary_level": None if d is None else d.level, "rows_seen": self._rows_seen, "trained": self._trained,
                "dictionary_error": self.dictionary_error, "compactions": self._compactions,
                "chunks": {str(cid): ch.used for cid, ch in self._arena.chunks.items()}, "next_chunk": self._arena._next_id,
                "checksum": self.checksum,
            }
            arrays = {**cols, "tags": self._tags.copy(),
                      "dictionary": np.frombuffer(d.data, np.uint8).copy() if d is not None else np.zeros(0, np.uint8)}
            token = (set(self._arena.chunks), self._arena.retired)
            self._arena.flushed |= token[0]
            self._arena.retired = []
        with open(path, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        return meta, token

    def commit(self, token: Any, committed: bool = True) -> None:
        """After `write_index`: the new index is the one to open (`committed`): delete the chunk files only the
        previous index named. Not committed (the caller failed to record it): keep them for a later commit."""
        named, retired = token
        with self._lock:
            if not committed:
                self._arena.retired = retired + self._arena.retired
                return
            self._arena.flushed = named
        for p in retired:
            p.unlink(missing_ok=True)

    def _load(self, index: Path, meta: dict) -> None:
        """Open the index file `index` with its metadata `meta` (checked, then adopted; class doc)."""
        for k, v in self.config().items():
            if meta["config"].get(k) != v:
                raise ValueError(f"{index}: config {k} is {meta['config'].get(k)!r}, this store has {v!r}")
        checksum = saved_checksum(meta, str(index))
        with np.load(index, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        cols = self._index_columns()
        chunk = arrays.get("chunk")  # the index rows grown when it was written (host_codecs.slot_index)
        rows = chunk.shape[0] if isinstance(chunk, np.ndarray) and chunk.ndim == 1 and chunk.shape[0] <= self.num_slots else self.num_slots
        for k, (shape, dtype) in {**{k: ((rows,), c.dtype) for k, c in cols.items()}, "tags": (self._tags.shape, self._tags.dtype)}.items():
            a = arrays.get(k)
            if a is None or a.shape != shape or a.dtype != dtype:
                raise ValueError(f"{index}: array {k!r}: expected shape {shape}, dtype {dtype}, got "
                                 f"{'nothing' if a is None else f'shape {a.shape}, dtype {a.dtype}'}")
        sizes = {int(c): int(n) for c, n in meta["chunks"].items()}
        layouts = [(dtype_code(np.dtype(dt), field="layouts"), tuple(int(x) for x in shp)) for dt, shp in meta["layouts"]]
        live = np.flatnonzero(arrays["chunk"] >= 0)
        ch, end = arrays["chunk"][live], arrays["offset"][live].astype(np.int64) + ceil_align(arrays["length"][live].astype(np.int64))
        used = np.array([sizes.get(c, -1) for c in ch.tolist()], np.int64)
        bad = (end > used) | ~np.isin(arrays["codec"][live], [c.tag for c in CODECS.values()]) | (arrays["layout"][live] >= len(layouts))
        if bad.any() or (arrays["chunk"] < -1).any():
            raise ValueError(f"{index}: entries of slots {live[bad][:10].tolist()} name a chunk, range, codec or layout that does not exist")
        if self.mode == "r+":  # leftovers of an interrupted write: files this index does not name
            keep = {index.name, *(chunk_name(c) for c in sizes)}
            for p in self.directory.iterdir():
                if p.name not in keep and p.is_file():
                    p.unlink()
        with self._lock:
            for code, shape in layouts:
                self._layout_id(code, shape)
            self._new_index(rows)
            for k, c in self._index_columns().items():
                c[:rows] = arrays[k]
            self._tags[...] = arrays["tags"]
            self._arena.adopt(sizes, int(meta["next_chunk"]))
            counts = np.bincount(ch, minlength=max(sizes, default=-1) + 1)
            padded = np.bincount(ch, weights=ceil_align(arrays["length"][live].astype(np.int64)).astype(np.float64), minlength=counts.size)
            for cid, c in self._arena.chunks.items():
                c.live_count, c.live_bytes = int(counts[cid]), int(padded[cid])
                self._arena.dead_nbytes += c.used - c.live_bytes
            for cid in [cid for cid, c in self._arena.chunks.items() if c.live_count == 0]:
                self._arena._drop(cid)
            level, dictionary = meta["dictionary_level"], arrays["dictionary"]
            self._dictionary = None if level is None else ZstdDictionary(dictionary.tobytes(), level)
            self._rows_seen, self._trained = int(meta["rows_seen"]), bool(meta["trained"])
            self.dictionary_error, self._compactions = meta["dictionary_error"], int(meta["compactions"])
            self.checksum = checksum

    def close(self) -> None:
        """Close the chunk files (nothing is deleted; puts since the last committed `write_index` are not in it).
        Later reads fail."""
        with self._lock:
            for ch in self._arena.chunks.values():
                ch.data.close()
            self._arena._table = None

    def __repr__(self) -> str:
        return f"ChunkFileStore({str(self.directory)!r}, num_slots={self.num_slots}, codec={self.codec.spec!r}, mode={self.mode!r})"
