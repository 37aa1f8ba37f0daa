"""FileStore: a fixed number of slots, each holding one array of a fixed shape and dtype, in files on disk.

The slot-level interface of `host_codecs.CompressedStore` (`put`, `get`, `get_many`, `written`) for data larger than
memory: entries are stored raw, one row per slot, and read and written with positioned system calls (`os.preadv` /
`os.pwrite`), never through a memory map, so the pages read stay in the operating system's page cache and are not
counted in the process's resident memory.

Files, for a store at `path` (a path without suffix):

```
path.npy         # shape=(num_slots, *item_shape), the entries' dtype: a standard .npy file, row `i` = slot `i`
path.1.npy       # the same: the second copy of each slot (both files are sparse: rows never written take no space)
path.index.npy   # shape=(2, num_slots), dtype=uint32: row 0 bit 0 is 1 where the slot holds an entry, bit 1 the
                 # file holding it (0: path.npy, 1: path.1.npy); row 1 its checksum (an index written before there
                 # were two files, bit 1 always 0, opens as it is)
```

Commits: the index is kept in memory and written by `write_index` (or `flush`: `write_index` to the default index
path through a rename). A `put` never overwrites an entry the last committed index names: a slot that index names
is written to its other copy (repeated puts before the next commit rewrite that other copy), a slot it does not name
to the copy it names. So the index on disk, and every entry it names, stay whole until the next index is committed
(`commit`), whatever is put meanwhile and wherever the process stops: a folder reopened with that index reads the
entries as of its commit, exactly. A commit costs a sync of the rows put since the last one and the index
(8 bytes a slot); a slot rewritten in every commit alternates between its two copies, so the files
hold at most twice the entries.

Checksums: an entry's check is the low 32 bits of XXH3-64 of its bytes, seeded with its slot id and length (as
`CompressedStore`'s were before they became CRC-32: the index file has no field to tell them apart); every read verifies the entries it returns and raises `host_codecs.CorruptEntryError` naming
the file and the slots whose bytes differ from what the index says (a changed byte, a truncated file, or a copy
rewritten after a later commit than the index a reader opened).

Modes: `"w"` creates the files (replacing existing ones), `"r+"` opens them for reading and writing, `"r"` for reading
only (`put` raises `ReadOnlyError`, and the files are opened read-only).

Concurrency: `put` holds a lock while it writes and publishes its index rows; reads snapshot the index rows under it
and read outside it (threads may read in parallel; a read concurrent with a `put` of the same slot may see either
entry, and its checksum then fails: the caller orders them, as `jaxbuffers.compressed` does with its versions).
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ._base import CorruptEntryError, as_array, dtype_code, dtype_from_code, int_arg, integer_ids, mode_arg, path_arg, shape_arg
from . import _checksum
from ._pool import parallel_for
from .store import _out_of

__all__ = ["FileStore", "ReadOnlyError"]

_IOV_MAX = 1024  # buffers per preadv call (Linux IOV_MAX)
_READ_SHARD_BYTES = 1 << 20


class ReadOnlyError(PermissionError):
    """A write to a store or buffer opened with `mode="r"`."""


def _header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of a .npy file; ValueError naming the file for anything else."""
    try:
        with open(path, "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            offset = f.tell()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing (a FileStore data file)") from None
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: not a .npy file ({e})") from None
    if fortran:
        raise ValueError(f"{path}: a Fortran-ordered .npy file; expected C order")
    return tuple(shape), np.dtype(dtype), offset


class FileStore:
    """Slots of equally shaped arrays in a .npy file (module doc: files, checksums, modes).

    Args:
      path: the store's path without suffix (`path.npy`, `path.index.npy`); its folder must exist.
      num_slots: number of slots (slot ids in `[-num_slots, num_slots)`, negative ones counted from the end).
      item_shape: shape of every entry.
      dtype: dtype of every entry (a dtype of `host_codecs.DTYPES`).
      mode: `"w"` (create), `"r+"` (read and write existing files) or `"r"` (read only).
      name: what error messages call this store.
      index: the index file to open (`"r"` / `"r+"`) and that `flush` writes; default `path.index.npy`.

    Raises:
      ValueError: a bad mode or size; with `"r"` / `"r+"`, files whose shape or dtype differ from the arguments, or a
        data file shorter than its header says (the message names the file and the field).
      FileNotFoundError: `"r"` / `"r+"` and a file is missing.
      TypeError: a `path` or `index` that is not a path, an `item_shape` that is not a tuple of ints >= 0, an unsupported (or
        no) dtype. (All checked before any file is created.)
    """

    def __init__(self, path: str | os.PathLike, num_slots: int, item_shape: Sequence[int], dtype: Any, *,
                 mode: str = "r", name: str = "", index: str | os.PathLike | None = None):
        mode = mode_arg(mode)
        self.num_slots, self.path = int_arg("num_slots", num_slots), Path(path_arg("path", path))
        self.mode, self.name, self.item_shape = mode, str(name), shape_arg(item_shape)
        self.dtype = dtype_from_code(dtype_code(dtype, field="dtype"))
        self._declared = (dtype_code(self.dtype), self.item_shape)  # what CompressedStore calls it
        self.row_nbytes = math.prod(self.item_shape) * self.dtype.itemsize
        self.data_path, self.copy_path = self.path.with_name(self.path.name + ".npy"), self.path.with_name(self.path.name + ".1.npy")
        self.index_path = Path(path_arg("index", index)) if index is not None else self.path.with_name(self.path.name + ".index.npy")
        shape = (self.num_slots, *self.item_shape)
        if mode == "w":
            self._index = np.zeros((3, self.num_slots), np.uint32)  # shape=(3, num_slots), uint32: written, check, copy
        else:
            index = np.load(self.index_path, allow_pickle=False)
            if index.shape != (2, self.num_slots) or index.dtype != np.uint32 or (index[0] > 3).any():
                raise ValueError(f"{self.index_path}: expected shape (2, {self.num_slots}) uint32 (row 0 in [0, 3]), got shape {index.shape} {index.dtype}")
            self._index = np.stack([index[0] & 1, index[1], index[0] >> 1])
        self._committed = self._index[[0, 2]].copy()  # written and copy of each slot as the last committed index says
        self._fds, self._offsets, self._dirty = [-1, -1], [0, 0], [False, False]
        # The descriptors close with `close`, when the store is collected, or when this constructor fails.
        self._closer = weakref.finalize(self, _close_fds, self._fds)
        try:
            self._open_files(mode, shape)
        except BaseException:
            self._closer()
            raise
        self._lock = threading.RLock()
        if mode == "w":
            self.flush()

    def _open_files(self, mode: str, shape: tuple[int, ...]) -> None:
        """Open the two data files (created with `"w"`, or the copy file of a store of one file with `"r+"`), each
        checked against its header, into `self._fds`."""
        for c, path in enumerate((self.data_path, self.copy_path)):
            if c == 1 and mode != "w" and not path.exists():  # a store of one file (or no entry in this one yet)
                if self._index[2].any():
                    raise FileNotFoundError(f"{path}: missing (a FileStore data file its index {self.index_path.name} names)")
                if mode == "r":
                    continue
            if mode == "w" or (c == 1 and not path.exists()):
                np.lib.format.open_memmap(path, mode="w+", dtype=self.dtype, shape=shape)._mmap.close()  # header + sparse file
                self._dirty[c] = True  # its header: synced by the next commit
            got_shape, got_dtype, self._offsets[c] = _header(path)
            for field, want, got in (("shape", shape, got_shape), ("dtype", self.dtype, got_dtype)):
                if want != got:
                    raise ValueError(f"{path}: {field} {got} on disk, expected {want} ({self.name or 'this store'})")
            need = self._offsets[c] + self.num_slots * self.row_nbytes
            if path.stat().st_size < need:
                raise ValueError(f"{path}: {path.stat().st_size} bytes, its header needs {need} (truncated)")
            self._fds[c] = os.open(path, os.O_RDONLY if mode == "r" else os.O_RDWR)

    # --- the CompressedStore interface a host store uses ---

    @property
    def nbytes(self) -> int:
        """Memory the store holds: its index (the entries are on disk)."""
        return self._index.nbytes

    @property
    def disk_nbytes(self) -> int:
        """Bytes the entries' two files take on disk (blocks allocated: rows never written take none)."""
        return sum(os.stat(p).st_blocks * 512 for p in (self.data_path, self.copy_path) if p.exists())

    def config(self) -> dict[str, Any]:
        """`num_slots` and `declared` (`[dtype name, shape]`), as `CompressedStore.config` names them."""
        return {"num_slots": self.num_slots, "declared": [self.dtype.name, list(self.item_shape)]}

    def _slots(self, slots: Any, field: str) -> np.ndarray:
        s = integer_ids(slots, field).astype(np.int64)
        if s.size and (int(s.min()) < -self.num_slots or int(s.max()) >= self.num_slots):
            bad = int(s.min()) if int(s.min()) < -self.num_slots else int(s.max())
            raise IndexError(f"{field}: slot {bad} out of range for a store of {self.num_slots} slots")
        return np.where(s < 0, s + self.num_slots, s)

    def _check_writable(self, what: str) -> None:
        if self.mode == "r":
            raise ReadOnlyError(f"{self.data_path}: {what} refused, the store was opened with mode='r'; reopen it with mode='r+'")
        if self._fds[0] < 0:
            raise RuntimeError(f"{self.data_path}: {what} after close()")

    def put(self, slots: Any, arrays: Any, *, bases: Any = None) -> None:
        """Store `arrays[i]` in slot `slots[i]` (repeated ids: the last one wins), written at once to the file the slot's
        copy is in (module doc, Commits).

        Args:
          slots: # shape=(B,), integer slot ids.
          arrays: # shape=(B, *item_shape), the store's dtype; never cast.
          bases: None: every entry is whole (a file store holds no deltas; `CompressedStore.put` takes them).

        Raises:
          ReadOnlyError: the store was opened with `mode="r"` (nothing written).
          ValueError: a shape or dtype other than the store's. IndexError, TypeError: bad slot ids.
        """
        self._check_writable("put")
        if bases is not None:
            raise ValueError("bases: a FileStore holds whole entries only, got delta bases (use keyframe_interval=1)")
        s = self._slots(slots, "slots")
        a = as_array(arrays, "arrays")
        if s.ndim != 1 or a.shape != (s.size, *self.item_shape) or a.dtype != self.dtype:
            raise ValueError(f"arrays: expected shape {(s.size, *self.item_shape)} and dtype {self.dtype} for slots of shape {s.shape}, "
                             f"got shape {a.shape} and dtype {a.dtype}")
        if not s.size:
            return
        if s.size > 1 and not np.all(np.diff(s) > 0):  # keep the last occurrence of each slot, ordered by slot
            last = s.size - 1 - np.unique(s[::-1], return_index=True)[1]
            s, a = s[last], a[last]
        rows = np.ascontiguousarray(a).reshape(s.size, -1).view(np.uint8)
        sums = self._sums({0: rows}, np.zeros(s.size, np.int64), np.arange(s.size), s)
        with self._lock:
            written, copy = self._committed[:, s]
            copy = np.where(written == 1, 1 - copy, copy)  # never over an entry the last committed index names
            for c in (0, 1):
                at = np.flatnonzero(copy == c)
                for a0, b0 in _runs(s[at]):
                    os.pwrite(self._fds[c], np.ascontiguousarray(rows[at[a0:b0]]), self._offsets[c] + int(s[at[a0]]) * self.row_nbytes)
                    self._dirty[c] = True
            self._index[0, s], self._index[1, s], self._index[2, s] = 1, sums, copy

    def _sums(self, arrays: dict, which: np.ndarray, rows: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """# shape=(k,), dtype=uint32: the checks of the entries of `slots` that lie in row `rows[i]` of the uint8
        array `arrays[which[i]]` (`[n, row_nbytes]`): `host_codecs._checksum.payload_sums`'s XXH3 (seeded with the
        slot id, and the length in the high 32 bits), the one this store's index format has always held."""
        flat = {j: a.reshape(-1) for j, a in arrays.items()}
        n = np.asarray(rows, np.int64)
        return _checksum.payload_sums(flat, np.asarray(which, np.int64), n * self.row_nbytes, np.full(n.size, self.row_nbytes, np.int64), slots,
                                      _checksum.XXH3)

    def dependents(self, slots: Any) -> np.ndarray:
        """`CompressedStore.dependents`: always empty (int64 `[0]`), a file store holds no deltas."""
        self._slots(slots, "slots")
        return np.zeros(0, np.int64)

    chain_slots = dependents  # `CompressedStore.chain_slots`: no chains either

    def written(self, slots: Any) -> np.ndarray:
        """Boolean mask of the shape of `slots`: which slots hold an entry."""
        return self._index[0, self._slots(slots, "slots")] == 1

    def get(self, slots: Any, *, missing: str = "raise", out: np.ndarray | None = None) -> np.ndarray:
        """Read a batch of slots: # shape=S + item_shape for slot ids of shape `S` (as `CompressedStore.get`)."""
        return self.get_many([slots], missing=missing, outs=None if out is None else [out])[0]

    def get_many(self, slot_arrays: Sequence[Any], *, missing: str = "raise", outs: Sequence[np.ndarray] | None = None,
                 chains_out: list | None = None) -> list[np.ndarray]:
        """Read several slot arrays, each into its own output (as `CompressedStore.get_many`): each distinct slot is
        read once, one system call per run of consecutive slots, and copied to its other rows; `chains_out` gets an
        empty array appended (a file store holds no deltas).

        Args:
          slot_arrays: `m` integer arrays of slot ids, shapes `S_j`.
          missing: `"raise"`: an empty slot raises KeyError; `"zeros"`: it reads as zeros.
          outs: optional `m` writeable C-contiguous arrays of shapes `S_j + item_shape` and the store's dtype.

        Returns:
          `m` arrays, # shape=S_j + item_shape.

        Raises:
          CorruptEntryError: entries whose bytes fail their checksum (the message names the file and the slots).
          KeyError: an empty slot with `missing="raise"`. ValueError: a bad `missing` or `outs`.
          OSError: the data file ends early.
        """
        if not isinstance(missing, str) or missing not in ("raise", "zeros"):
            raise ValueError(f"missing: expected 'raise' or 'zeros', got {missing!r}")
        if not isinstance(slot_arrays, (list, tuple)):
            raise TypeError(f"slot_arrays: expected a list of slot id arrays, got {type(slot_arrays).__name__}")
        if outs is not None and not isinstance(outs, (list, tuple)):
            raise TypeError(f"outs: expected a list of arrays (one per slot array), got {type(outs).__name__}")
        if self._fds[0] < 0:
            raise RuntimeError(f"{self.data_path}: read after close()")
        if chains_out is not None:
            chains_out.append(np.zeros(0, np.int64))
        ids = [self._slots(x, "slot_arrays") for x in slot_arrays]
        if outs is not None and len(outs) != len(ids):
            raise ValueError(f"outs: expected {len(ids)} arrays (one per slot array), got {len(outs)}")
        results = []
        for j, x in enumerate(ids):
            want = x.shape + self.item_shape
            o = np.empty(want, self.dtype) if outs is None else outs[j]
            if not (isinstance(o, np.ndarray) and o.shape == want and o.dtype == self.dtype and o.flags.c_contiguous and o.flags.writeable):
                raise ValueError(f"outs[{j}]: expected a writeable C-contiguous array of shape {want} and dtype {self.dtype}, "
                                 f"got {getattr(o, 'shape', type(o).__name__)} {getattr(o, 'dtype', '')}")
            results.append(o)
        rows = [r.reshape(x.size, -1).view(np.uint8) if self.row_nbytes and x.size else None for r, x in zip(results, ids)]
        flat = np.concatenate([x.reshape(-1) for x in ids]) if ids else np.zeros(0, np.int64)
        if not flat.size or not self.row_nbytes:
            return results
        bounds = np.cumsum([0] + [x.size for x in ids])
        with self._lock:
            written, check, copy = self._index[:, flat]
        empty = written == 0
        if empty.any() and missing == "raise":
            raise KeyError(f"{self.name or self.data_path}: slots never written: {np.unique(flat[empty])[:10].tolist()}")
        uniq, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
        fj, fr = (v.tolist() for v in _out_of(first, bounds))  # output and row each distinct slot is read into
        live = np.flatnonzero(~empty[first])
        for i in np.flatnonzero(empty[first]).tolist():
            rows[fj[i]][fr[i]] = 0
        where = copy[first].astype(np.int64)  # the file each distinct slot is read from
        live = live[np.argsort(where[live], kind="stable")]  # by file, then slot
        runs = _runs(where[live] * (self.num_slots + 1) + uniq[live])  # no run crosses from one file to the other

        def read(a: int, b: int) -> None:
            for r0, r1 in runs[a:b]:
                c = int(where[live[r0]])
                for c0 in range(r0, r1, _IOV_MAX):
                    part = live[c0 : min(c0 + _IOV_MAX, r1)].tolist()
                    views = [rows[fj[i]][fr[i]] for i in part]
                    start = self._offsets[c] + int(uniq[part[0]]) * self.row_nbytes
                    got = os.preadv(self._fds[c], views, start)
                    if got != len(views) * self.row_nbytes:
                        path = (self.data_path, self.copy_path)[c]
                        raise OSError(f"{path}: read {got} bytes at offset {start}, expected {len(views) * self.row_nbytes} (file truncated)")

        parallel_for(len(runs), read, work_bytes=live.size * self.row_nbytes, min_shard_bytes=_READ_SHARD_BYTES)
        arrays = {j: r for j, r in enumerate(rows) if r is not None}
        bad = self._sums(arrays, np.asarray(fj, np.int64)[live], np.asarray(fr, np.int64)[live], uniq[live]) != check[first[live]]
        if bad.any():
            ids_bad = uniq[live][bad]
            files = ", ".join(str((self.data_path, self.copy_path)[c]) for c in sorted(set(where[live][bad].tolist())))
            raise CorruptEntryError(f"{files}: slots {ids_bad[:10].tolist()}{' and more' if ids_bad.size > 10 else ''} are corrupt "
                                    f"(checksum mismatch): their bytes differ from the index written by the last flush")
        dup = np.flatnonzero(np.arange(flat.size) != first[inverse.reshape(-1)])
        (dj, dr), src = _out_of(dup, bounds), inverse.reshape(-1)[dup]
        for j, r, i in zip(dj.tolist(), dr.tolist(), src.tolist()):
            rows[j][r] = rows[fj[i]][fr[i]]
        return results

    def write_index(self, path: str | os.PathLike) -> np.ndarray:
        """Make both data files durable (fsync) and write the index to `path` (a new file, fsynced); the entries it
        names stay as they are until it is committed (`commit`), so no `put` may come between the two.

        Returns:
          The token `commit` takes.
        """
        self._check_writable("write_index")
        with self._lock:
            for c, fd in enumerate(self._fds):
                if self._dirty[c]:
                    os.fsync(fd)
                    self._dirty[c] = False
            token = self._index[[0, 2]]  # (a copy)
            packed = np.stack([token[0] | (token[1] << 1), self._index[1]])
        with open(path, "wb") as f:
            np.save(f, packed, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        return token

    def commit(self, token: np.ndarray, committed: bool = True) -> None:
        """After `write_index`: the index it wrote is the one to open (`committed`), so the entries it replaced may be
        overwritten from now on. Not committed (the caller failed to record it): the previous index stays the one
        whose entries are kept."""
        if committed:
            with self._lock:
                self._committed = token

    def flush(self) -> None:
        """`write_index` to `index_path` (through a temporary file and a rename: the commit point) and `commit`."""
        if self.mode == "r" or self._fds[0] < 0:
            return
        tmp = self.index_path.with_name(self.index_path.name + ".tmp")
        with self._lock:
            token = self.write_index(tmp)
            os.replace(tmp, self.index_path)
            self.commit(token)

    def close(self) -> None:
        """Close the data files (unflushed index rows are dropped: `flush` first to keep them). Later calls raise.
        A store that is garbage collected unclosed closes them then."""
        self._closer()

    def __repr__(self) -> str:
        return f"FileStore({str(self.path)!r}, num_slots={self.num_slots}, item_shape={self.item_shape}, dtype={self.dtype}, mode={self.mode!r})"


def _close_fds(fds: list[int]) -> None:
    """Close the descriptors of `fds` that are open (>= 0) and mark them closed (-1)."""
    for c, fd in enumerate(fds):
        if fd >= 0:
            fds[c] = -1
            os.close(fd)


def _runs(sorted_slots: np.ndarray) -> list[tuple[int, int]]:
    """`[start, stop)` positions of the runs of consecutive ids in a sorted id array."""
    if not sorted_slots.size:
        return []
    breaks = (np.flatnonzero(np.diff(sorted_slots) != 1) + 1).tolist()
    return list(zip([0, *breaks], [*breaks, sorted_slots.size]))
