"""The folder of a disk-backed buffer (`jaxbuffers.disk`): its host stores, its files and how a flush commits them.

Folder layout, format version 2 (`FORMAT_VERSION`):

```
disk.json                 {"format": "jaxbuffers.disk", "version": 2, "generation": g, "num_slots",
                           "host": {"version", "num_writes", "num_rows"}, "state": "state-<g>",
                           "slot_version": "slot_version-<g>.npy",
                           "stores": [one per compressed leaf: {"name", "shape", "dtype", "kind", ...}],
                           "files": {relative path: {"bytes", "xxh3_64"}} of every index file and the slot versions}
store-<i>.npy             kind "raw" (codec "none"): the entries of leaf i, a numpy .npy file (`host_codecs.FileStore`),
store-<i>.index.npy         and its index ({"file", "index"} name them)
store-<i>/                kind "chunks" (any other codec): a `host_codecs.chunk_arena.ChunkFileStore`: chunk files
                            chunk-<id>.bin and its index index-<g>.npz ({"dir", "index", "meta"} name them)
slot_version-<g>.npy      int32 [n <= num_slots]: the host write that last wrote each slot (0 past its end)
state-<g>/                a `jaxbuffers.checkpoint` of the device state (cursors, ids, small fields), host left out
```

Flush (`commit`): every store's data synced and its new index written under new names, then the slot versions and the
device state of generation `g + 1`, then `disk.json` replaced in one rename: the commit point. Only then are the files
of generation `g` deleted (old indexes, state, slot versions, and chunk files only the old index named). A crash at
any point leaves `disk.json` naming a whole generation, so the folder reopens as of the last completed flush; the
files of an interrupted one are deleted when the folder is next opened with `"r+"`. Chunk files are append-only, so
adds after the last flush never change what it named. A raw store rewrites its entries in place: an entry rewritten
after the last flush fails its checksum when read from the reopened folder (`host_codecs.CorruptEntryError` naming
the file and the slots), and its index file has a fixed name, so a crash between writing it and the rename of
`disk.json` is reported as that index file being corrupt (`CheckpointError` naming it).

Version 1 folders (raw stores only; `state/`, `slot_version.npy`, no generation) open as they are; a flush of one
opened with `"r+"` writes version 2.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
from pathlib import Path

import numpy as np

from host_codecs import CorruptEntryError, dtype_from_code
from host_codecs.chunk_arena import ChunkFileStore
from host_codecs.file_store import FileStore, ReadOnlyError
from jaxbuffers import checkpoint
from jaxbuffers.compressed._host import HostStores

FORMAT = "jaxbuffers.disk"
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)


class DiskStores(HostStores):
    """`jaxbuffers.compressed.HostStores` whose stores are files in `directory` (module doc): a
    `host_codecs.FileStore` per leaf for codec `"none"`, else a `host_codecs.chunk_arena.ChunkFileStore`.

    Args:
      directory: the buffer's folder.
      like: the in-memory host stores of the same buffer (slots, leaf names, frame shapes and dtypes, codec and store
        configuration; kept as the buffer's description for its checkpoint).
      mode: `"w"`, `"r+"` or `"r"` (`jaxbuffers.disk.open`).
      meta: with `"r"` / `"r+"`, the folder's `disk.json` (`read_meta`).

    Raises:
      ValueError, FileNotFoundError: as the stores (files of another shape, dtype or configuration, missing files).
    """

    def __init__(self, directory: Path, like: HostStores, mode: str, meta: dict | None = None):
        shapes = [s._declared[1] for s in like.stores]
        dtypes = [dtype_from_code(s._declared[0]) for s in like.stores]
        super().__init__(like.num_slots, like.codec, shapes, dtypes, like.names, chunk_bytes=like.stores[0].config()["chunk_bytes"], dictionary_bytes=0)
        self.directory, self.mode, self.like = directory, mode, like
        self.meta = meta or {}  # the disk.json of the generation this object last read or committed
        self.generation = int(self.meta.get("generation", 0))
        saved = self.meta.get("stores") or [{} for _ in like.stores]
        self.stores = [self._store(i, s, shp, dt, n, m) for i, (s, shp, dt, n, m) in enumerate(zip(like.stores, shapes, dtypes, like.names, saved))]

    def _store(self, i: int, like, shape, dtype, name: str, saved: dict):
        if self.codec == "none":
            return FileStore(self.directory / f"store-{i}", self.num_slots, shape, dtype, mode=self.mode, name=name)
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

    def write(self, version, slots, valid, *datas, bases=None) -> np.ndarray:
        """`HostStores.write`; `ReadOnlyError` before anything is written in a folder opened with `mode="r"`."""
        self.check_state("add")
        if bases is not None and self.codec == "none":
            raise ValueError("bases: a raw (codec 'none') disk-backed store holds whole entries only (its buffer has keyframe_interval=1)")
        return super().write(version, slots, valid, *datas, bases=bases)

    def read_into(self, version, ids, outs) -> None:
        """`HostStores.read_into`. An entry rewritten in place while it was read fails its checksum; that is reported
        as the `StaleBufferError` of the overlapping write when there was one, else as `CorruptEntryError`."""
        try:
            super().read_into(version, ids, outs)
        except CorruptEntryError:
            self._check_read(version, np.concatenate([np.asarray(x).reshape(-1) for x in ids]), count=False)
            raise

    def read(self, version, *ids, aligned: bool = False) -> tuple[np.ndarray, ...]:
        """`HostStores.read`, with `read_into`'s report of an entry rewritten while it was read."""
        try:
            return super().read(version, *ids, aligned=aligned)
        except CorruptEntryError:
            self._check_read(version, np.concatenate([np.asarray(x).reshape(-1) for x in ids]), count=False)
            raise

    def close(self) -> None:
        """Close the files (nothing is deleted; adds since the last `flush` are not in the folder's index)."""
        with self._lock:
            for s in self.stores:
                s.close()
            self.closed = True


def _write_file(path: Path, array: np.ndarray) -> None:
    with builtins.open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _remove(path: Path) -> None:
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
            if isinstance(s, FileStore):
                s.flush()
                stores.append({**entry, "kind": "raw", "file": s.data_path.name, "index": s.index_path.name})
                continue
            index = f"store-{i}/index-{g}.npz"
            new.append(d / index)
            meta, token = s.write_index(d / index)
            tokens.append((s, token))
            stores.append({**entry, "kind": "chunks", "dir": f"store-{i}", "index": index, "meta": meta})
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
            _remove(p)
        raise
    for s, token in tokens:
        s.commit(token)
    for p in _named(old):
        if p not in _named(meta):
            _remove(d / p)
    host.meta, host.generation = meta, g


def _named(meta: dict) -> set[str]:
    """The files and folders a disk.json names that a later generation replaces (index files of chunk stores, the
    slot versions and the state)."""
    if not meta:
        return set()
    kept = {s["index"] for s in meta["stores"] if s.get("kind") == "chunks"}
    return kept | {meta.get("state", "state"), meta.get("slot_version", "slot_version.npy")}


def sweep(d: Path, meta: dict) -> None:
    """Delete the state folders, slot version files and `disk.json.tmp` of `d` that `meta` (its disk.json) does not
    name: leftovers of an interrupted flush (each chunk store sweeps its own folder)."""
    named = _named(meta)
    for p in d.iterdir():
        if p.name.lstrip(".").startswith(("state", "slot_version", "disk.json.")) and p.name not in named:
            _remove(p)


def read_meta(d: Path) -> dict:
    """The checked `disk.json` of folder `d`.

    Raises:
      CheckpointError: no disk.json, not JSON, another format, a version this jaxbuffers does not read, or a file it
        lists missing, truncated or corrupt (the message names the file).
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
    off = checkpoint._Progress(False, "")
    for name, info in meta["files"].items():
        p = d / name
        if not p.is_file() or p.stat().st_size != info["bytes"] or checkpoint._hash_file(p, off) != info["xxh3_64"]:
            raise checkpoint.CheckpointError(f"{p}: missing, truncated or corrupt (size or xxh3_64 differs from {path.name})")
    return meta


def state_path(d: Path, meta: dict) -> Path:
    """The device state folder a checked disk.json names (`state/` in version 1)."""
    return d / meta.get("state", "state")


def slot_versions(d: Path, meta: dict) -> tuple[np.ndarray, Path]:
    """(the slot versions a checked disk.json names, their file); `HostStores.set_slot_versions` checks them."""
    path = d / meta.get("slot_version", "slot_version.npy")
    return np.load(path, allow_pickle=False), path
