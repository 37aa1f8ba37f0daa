"""The folder of a disk-backed buffer (`jaxbuffers.disk`): its host stores, its files and how a flush commits them.

Folder layout, format version 3 (`FORMAT_VERSION`):

```
disk.json                 {"format": "jaxbuffers.disk", "version": 3, "generation": g, "num_slots",
                           "host": {"version", "num_writes", "num_rows"}, "state": "state-<g>",
                           "slot_version": "slot_version-<g>.npy",
                           "stores": [one per compressed leaf: {"name", "shape", "dtype", "kind", ...}],
                           "files": {relative path: {"bytes", "xxh3_64"}} of every index file and the slot versions}
disk.lock                 the one-writer lock (below): the pid of the last process that opened the folder for writing
store-<i>.npy             kind "raw" (codec "none"): the entries of leaf i in two numpy .npy files, each slot's
store-<i>.1.npy             entry in one of them (`host_codecs.FileStore`), and the index of generation g
store-<i>.index-<g>.npy     ({"file", "copy", "index"} name them)
store-<i>/                kind "chunks" (any other codec): a `host_codecs.chunk_arena.ChunkFileStore`: chunk files
                            chunk-<id>.bin and its index index-<g>.npz ({"dir", "index", "meta"} name them)
slot_version-<g>.npy      int32 [n <= num_slots]: the host write that last wrote each slot (0 past its end)
state-<g>/                a `jaxbuffers.checkpoint` of the device state (cursors, ids, small fields), host left out
```

Flush (`commit`): every store's data synced and its new index written under new names, then the slot versions and the
device state of generation `g + 1`, then `disk.json` replaced in one rename: the commit point. Only then are the files
of generation `g` deleted (old indexes, state, slot versions, and chunk files only the old index named). Adds never
change what the last flush named: chunk files are append-only, and a raw store writes a slot the last flush named to
the slot's other copy (its cost: the raw files hold up to twice the entries; a flush syncs what was added and writes
8 bytes a slot of index, as before). So a crash at any point (mid-add or mid-flush) leaves `disk.json` naming a whole
generation, and the folder reopens as of the last completed flush, exactly; the files of an interrupted flush are
deleted when the folder is next opened with `"r+"`.

One writer: a writable open (`"w"`, `"r+"`) takes an exclusive advisory lock (`fcntl.flock`, `FolderLock`) on
`disk.lock` and holds it until the buffer's `close()`, until its `DiskStores` is garbage collected (once nothing holds
it: after a jitted call JAX's compile caches do, until `jax.clear_caches()`), or until the process ends (a kill -9
included: the kernel releases it); a second writable open, in this process or another,
raises `FolderLockedError` naming the folder and the holder's pid, before anything is read or deleted. A lock is
held per open file of the lock file, so a forked child shares its parent's lock. On a system without `fcntl`
(Windows), the lock file is written but nothing is locked: the rule is then the caller's. Folders on network file
systems are locked as their file system implements `flock` (NFS on Linux: as a whole-file byte-range lock).

Read only: `"r"` takes no lock (it never writes, not even the lock file) and reads the generation `disk.json` names
when it opens; it retries when a writer committed while it read. It never sees a half-written flush (the commit is one
rename), but a writer that flushes again may then reuse the space of the entries it read: a raw store's read of such
an entry raises `StaleBufferError` (reopen the folder to read its last flush); chunk files are never rewritten, and
a deleted one stays readable through the descriptor the reader holds.

Version 1 and 2 folders (a raw store in one file, its index `store-<i>.index.npy`; version 1 also `state/`,
`slot_version.npy`, no generation) open as they are; a flush of one opened with `"r+"` writes version 3.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system: the lock file is written but not locked (module doc, One writer)
    fcntl = None

import numpy as np

from host_codecs import CorruptEntryError, dtype_from_code
from host_codecs.chunk_arena import ChunkFileStore
from host_codecs.file_store import FileStore, ReadOnlyError
from jaxbuffers import checkpoint
from jaxbuffers._checkpoint_files import _checked_files
from jaxbuffers.compressed._host import HostStores, StaleBufferError

FORMAT = "jaxbuffers.disk"
FORMAT_VERSION = 3
READ_VERSIONS = (1, 2, 3)


LOCK_NAME = "disk.lock"


class FolderLockedError(BlockingIOError):
    """A writable open (`mode="w"` or `"r+"`) of a disk folder that another writable handle holds (module doc, One
    writer)."""


class FolderLock:
    """An exclusive advisory lock (`fcntl.flock`) on `directory / "disk.lock"` (created if absent), the holder's pid
    written in it; held until `release`, until this object is collected, or until the process ends.

    Raises:
      FolderLockedError: another open file of the lock file holds it (in this process or another), naming the folder
        and the holder's pid.
    """

    def __init__(self, directory: Path):
        self.path, self.fd = directory / LOCK_NAME, -1
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                os.close(fd)
                who = f"process {pid}{' (this process)' if pid == str(os.getpid()) else ''}" if pid.isdigit() else "another handle"
                raise FolderLockedError(
                    f"directory: {directory} is open for writing (mode 'w' or 'r+') by {who}, which holds {self.path}; one "
                    f"writer per folder: close that buffer (or end its process) first, or open the folder with mode='r' to "
                    f"read its last flush") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self, _close=os.close) -> None:  # (os.close bound now: __del__ may run at interpreter exit)
        """Release the lock (closing the file releases it; the file stays)."""
        if self.fd >= 0:
            _close(self.fd)
            self.fd = -1

    __del__ = release


def commit_id(d: Path) -> tuple[int, int] | None:
    """(inode, modification time) of `d / "disk.json"`, None when absent: changes at every commit (a rename)."""
    try:
        st = os.stat(d / "disk.json")
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


class DiskStores(HostStores):
    """`jaxbuffers.compressed.HostStores` whose stores are files in `directory` (module doc): a
    `host_codecs.FileStore` per leaf for codec `"none"`, else a `host_codecs.chunk_arena.ChunkFileStore`.

    Args:
      directory: the buffer's folder.
      like: the in-memory host stores of the same buffer (slots, leaf names, frame shapes and dtypes, codec and store
        configuration; kept as the buffer's description for its checkpoint).
      mode: `"w"`, `"r+"` or `"r"` (`jaxbuffers.disk.open`).
      meta: with `"r"` / `"r+"`, the folder's `disk.json` (`read_meta`).
      lock: with `"w"` / `"r+"`, the folder's `FolderLock`, held until `close` (or until this object is collected).

    Raises:
      ValueError, FileNotFoundError: as the stores (files of another shape, dtype or configuration, missing files).
    """

    def __init__(self, directory: Path, like: HostStores, mode: str, meta: dict | None = None, lock: FolderLock | None = None):
        shapes = [s._declared[1] for s in like.stores]
        dtypes = [dtype_from_code(s._declared[0]) for s in like.stores]
        super().__init__(like.num_slots, like.codec, shapes, dtypes, like.names, chunk_bytes=like.stores[0].config()["chunk_bytes"], dictionary_bytes=0)
        self.directory, self.mode, self.like, self.folder_lock = directory, mode, like, lock
        self.opened_at = None  # with "r": the commit_id of the generation it opened (jaxbuffers.disk.open sets it)
        self.meta = meta or {}  # the disk.json of the generation this object last read or committed
        self.generation = int(self.meta.get("generation", 0))
        saved = self.meta.get("stores") or [{} for _ in like.stores]
        self.stores = []
        try:
            for i, (s, shp, dt, n, m) in enumerate(zip(like.stores, shapes, dtypes, like.names, saved)):
                self.stores.append(self._store(i, s, shp, dt, n, m))
        except BaseException:  # the stores opened before the one that failed close their files now
            for s in self.stores:
                s.close()
            raise

    def _store(self, i: int, like, shape, dtype, name: str, saved: dict):
        if self.codec == "none":
            index = None if self.mode == "w" else self.directory / raw_index(saved)
            return FileStore(self.directory / f"store-{i}", self.num_slots, shape, dtype, mode=self.mode, name=name, index=index)
        cfg = {k: v for k, v in like.config().items() if k not in ("num_slots", "codec", "declared")}
        index = None if self.mode == "w" else self.directory / saved["index"]
        return ChunkFileStore(self.directory / f"store-{i}", self.num_slots, like.codec, item_shape=shape, dtype=dtype, mode=self.mode,
                              index=index, meta=saved.get("meta"), name=name, **cfg)

    def __repr__(self) -> str:
        return f"DiskStores({str(self.directory)!r}, leaves={list(self.names)}, num_slots={self.num_slots}, mode={self.mode!r}, version={self.version})"

    @property
    def disk_nbytes(self) -> int:
        """Bytes of the stores' data files (chunk files: payloads, padding and freed space)."""
        return sum(s.disk_nbytes for s in self.stores)

    def check_state(self, what: str, version: int | None = None) -> None:
        """`HostStores.check_state`, and `ReadOnlyError` for an add to a folder opened with `mode="r"`."""
        if what == "add" and self.mode == "r":
            raise ReadOnlyError(f"add: {self.directory} was opened with mode='r' (read only); reopen it with mode='r+' to add")
        super().check_state(what, version)

    def write(self, version, slots, valid, *datas, bases=None, recent=None) -> np.ndarray:
        """`HostStores.write`; `ReadOnlyError` before anything is written in a folder opened with `mode="r"`."""
        self.check_state("add")
        if bases is not None and self.codec == "none":
            raise ValueError("bases: a raw (codec 'none') disk-backed store holds whole entries only (its buffer has keyframe_interval=1)")
        return super().write(version, slots, valid, *datas, bases=bases, recent=recent)

    def read_into(self, version, ids, outs) -> None:
        """`HostStores.read_into`. An entry whose bytes fail their checksum is reported as the `StaleBufferError` of
        an overlapping write when there was one, or of a writer's later flush (a folder opened with `"r"` while a
        writer holds it: module doc, One writer), else as `CorruptEntryError`."""
        try:
            super().read_into(version, ids, outs)
        except CorruptEntryError:
            self._stale(version, ids)
            raise

    def read(self, version, *ids, aligned: bool = False) -> tuple[np.ndarray, ...]:
        """`HostStores.read`, with `read_into`'s report of an entry rewritten while it was read."""
        try:
            return super().read(version, *ids, aligned=aligned)
        except CorruptEntryError:
            self._stale(version, ids)
            raise

    def _stale(self, version, ids) -> None:
        self._check_read(version, np.concatenate([np.asarray(x).reshape(-1) for x in ids]), count=False)
        now = commit_id(self.directory)
        if self.mode == "r" and self.opened_at is not None and now != self.opened_at:
            raise StaleBufferError(
                f"{self.directory}: opened with mode='r' at generation {self.generation}; a writer has since flushed a "
                f"later one and rewritten entries this read needed: reopen the folder to read its last flush")

    def close(self) -> None:
        """Close the files and release the folder's lock (nothing is deleted; adds since the last `flush` are not in
        the folder's index)."""
        with self._lock:
            for s in self.stores:
                s.close()
            self.closed = True
            if self.folder_lock is not None:
                self.folder_lock.release()


def _write_file(path: Path, array: np.ndarray) -> None:
    with builtins.open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def remove(path: Path) -> None:
    """Delete a file or a folder (what is gone already is no error)."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def commit(host: DiskStores, device_state) -> None:
    """Write generation `host.generation + 1` of the folder (module doc, Flush) with `device_state` (the buffer with
    its in-memory host description) as its device state; call under `host._lock`."""
    d, g, old = host.directory, host.generation + 1, host.meta
    stores, tokens, new = [], [], [d / f"slot_version-{g}.npy", d / f"state-{g}"]
    try:
        for i, (name, s) in enumerate(zip(host.names, host.stores)):
            entry = {"name": name, "shape": list(s._declared[1]), "dtype": dtype_from_code(s._declared[0]).name}
            raw = isinstance(s, FileStore)
            index = f"store-{i}.index-{g}.npy" if raw else f"store-{i}/index-{g}.npz"
            new.append(d / index)
            if raw:
                token = s.write_index(d / index)
                stores.append({**entry, "kind": "raw", "file": s.data_path.name, "copy": s.copy_path.name, "index": index})
            else:
                meta, token = s.write_index(d / index)
                stores.append({**entry, "kind": "chunks", "dir": f"store-{i}", "index": index, "meta": meta})
            tokens.append((s, token))
        _write_file(new[0], host.slot_version)
        checkpoint._save(new[1], device_state, False, host=False)
        off = checkpoint._Progress(False, "")
        hashed = [new[0].name] + [s["index"] for s in stores]
        meta = {
            "format": FORMAT, "version": FORMAT_VERSION, "generation": g, "num_slots": host.num_slots,
            "host": {"version": host.version, "num_writes": host.num_writes, "num_rows": host.num_rows},
            "state": new[1].name, "slot_version": new[0].name, "stores": stores,
            "files": {p: {"bytes": (d / p).stat().st_size, "xxh3_64": checkpoint._hash_file(d / p, off)} for p in hashed},
        }
        tmp = d / "disk.json.tmp"
        tmp.write_text(json.dumps(meta))
        checkpoint._fsync(tmp)
        os.replace(tmp, d / "disk.json")  # the commit point
        checkpoint._fsync(d)
    except BaseException:
        for s, token in tokens:
            s.commit(token, committed=False)
        for p in new:
            remove(p)
        raise
    for s, token in tokens:
        s.commit(token)
    for p in _named(old):
        if p not in _named(meta):
            remove(d / p)
    host.meta, host.generation = meta, g


def _named(meta: dict) -> set[str]:
    """The files and folders a disk.json names that a later generation replaces (index files of chunk stores, the
    slot versions and the state)."""
    if not meta:
        return set()
    kept = {s["index"] if s.get("kind") == "chunks" else raw_index(s) for s in meta["stores"]}
    return kept | {meta.get("state", "state"), meta.get("slot_version", "slot_version.npy")}


def raw_index(store: dict) -> str:
    """The index file of a raw store's entry of disk.json (version 1 names none: `store-<i>.index.npy`)."""
    return store.get("index") or store["file"][: -len(".npy")] + ".index.npy"


def sweep(d: Path, meta: dict) -> None:
    """Delete the state folders, slot version files, raw index files and `disk.json.tmp` of `d` that `meta` (its
    disk.json) does not name: leftovers of an interrupted flush (each chunk store sweeps its own folder)."""
    named = _named(meta)
    for p in d.iterdir():
        raw_index_file = p.name.startswith("store-") and ".index" in p.name
        if (raw_index_file or p.name.lstrip(".").startswith(("state", "slot_version", "disk.json."))) and p.name not in named:
            remove(p)


def read_meta(d: Path) -> dict:
    """The checked `disk.json` of folder `d`.

    Raises:
      CheckpointError: no disk.json, not JSON, another format, a version this jaxbuffers does not read, a field of
        another type (`_check_fields`), or a file it lists missing, truncated or corrupt (the message names the file).
    """
    path = d / "disk.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise checkpoint.CheckpointError(f"{path}: missing (not a jaxbuffers disk folder)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise checkpoint.CheckpointError(f"{path}: not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise checkpoint.CheckpointError(f"{path}: expected format {FORMAT!r}, got {meta.get('format') if isinstance(meta, dict) else meta!r:.60}")
    if meta.get("version") not in READ_VERSIONS:
        raise checkpoint.CheckpointError(f"{path}: format version {meta.get('version')!r}, this jaxbuffers reads versions {list(READ_VERSIONS)}")
    _check_fields(path, meta)
    off = checkpoint._Progress(False, "")
    for name, info in _checked_files(path, meta.get("files")).items():
        p = d / name
        if not p.is_file() or p.stat().st_size != info["bytes"] or checkpoint._hash_file(p, off) != info["xxh3_64"]:
            raise checkpoint.CheckpointError(f"{p}: missing, truncated or corrupt (size or xxh3_64 differs from {path.name})")
    return meta


def _check_fields(path: Path, meta: dict) -> None:
    """The fields of disk.json (`path`) that name files or counts have their documented types: `generation` an int
    >= 0, `num_slots` an int >= 1, `host` a dict of ints `version`, `num_writes`, `num_rows`, `state` and
    `slot_version` names inside the folder, `stores` a list of dicts whose `file`, `copy`, `dir` and `index` are
    names inside the folder and whose `meta` is a dict. Raises CheckpointError naming `path`, the field, what was
    expected and what came (the names are checked because a flush deletes what the previous disk.json named)."""
    def fail(field: str, expected: str, got) -> None:
        raise checkpoint.CheckpointError(f"{path}: {field}: expected {expected}, got {got!r:.100}")

    def count(field: str, v, least: int) -> None:
        if type(v) is not int or v < least:
            fail(field, f"an int >= {least}", v)

    def name(field: str, v) -> None:
        parts = v.split("/") if isinstance(v, str) else None
        if not parts or any(p in ("", ".", "..") for p in parts) or "\\" in v:
            fail(field, "a relative path inside the folder", v)

    count("generation", meta.get("generation", 0), 0)
    count("num_slots", meta.get("num_slots"), 1)
    host = meta.get("host")
    if not isinstance(host, dict):
        fail("host", "a dict {'version', 'num_writes', 'num_rows'}", host)
    for k in ("version", "num_writes", "num_rows"):
        count(f"host.{k}", host.get(k), 0)
    for k in ("state", "slot_version"):
        if k in meta:
            name(k, meta[k])
    stores = meta.get("stores")
    if not isinstance(stores, list):
        fail("stores", "a list of one dict per compressed leaf", stores)
    for i, store in enumerate(stores):
        if not isinstance(store, dict):
            fail(f"stores[{i}]", "a dict", store)
        for k in ("file", "copy", "dir", "index"):
            if k in store:
                name(f"stores[{i}].{k}", store[k])
        if "meta" in store and not isinstance(store["meta"], dict):
            fail(f"stores[{i}].meta", "a dict", store["meta"])


def state_path(d: Path, meta: dict) -> Path:
    """The device state folder a checked disk.json names (`state/` in version 1)."""
    return d / meta.get("state", "state")


def slot_versions(d: Path, meta: dict) -> tuple[np.ndarray, Path]:
    """(the slot versions a checked disk.json names, their file); `HostStores.set_slot_versions` checks them."""
    path = d / meta.get("slot_version", "slot_version.npy")
    try:
        return np.load(path, allow_pickle=False), path
    except FileNotFoundError:
        raise checkpoint.CheckpointError(f"{path}: missing (disk.json names it as the slot versions)") from None
