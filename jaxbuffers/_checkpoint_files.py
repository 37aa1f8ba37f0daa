"""The files of a checkpoint folder: writing a file hashed as it is written, the manifest of sizes and xxh3-64
checksums, fsync, the atomic swap of a new folder into place, and the tqdm progress bar of saves and loads."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from jaxbuffers import _validate
from jaxbuffers._checkpoint_describe import FORMAT, FORMAT_VERSION, CheckpointError

_BLOCK = 64 << 20  # bytes hashed per read
_WRITE_BLOCK = 4 << 20  # bytes handed to one os.writev
_IOV_MAX = 1024  # views handed to one os.writev (POSIX's least IOV_MAX)
_WRITEBACK = 8 << 20  # bytes written between two syncs started while a large file is written (at most one at a time)
_SYNC_THREADS = 16  # files written, hashed and synced at once
_datasync = getattr(os, "fdatasync", os.fsync)  # a file's data to the disk (and its size), not its other metadata

def _hash_file(path: Path, progress) -> str:
    """xxh3-64 of a file's bytes, read through a memory map (no copy of the page cache)."""
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m, memoryview(m) as view:
                for a in range(0, size, _BLOCK):
                    h.update(view[a : a + _BLOCK])
                    progress.update(min(_BLOCK, size - a))
    return h.hexdigest()


def _hash_bytes(views: list[memoryview]) -> str:
    """xxh3-64 (hex str) of the bytes of `views`, one after the other."""
    h = xxhash.xxh3_64()
    for view in views:
        for a in range(0, len(view), _BLOCK):
            h.update(view[a : a + _BLOCK])  # releases the GIL
    return h.hexdigest()


def _write_file(path: Path, data: Any, progress) -> dict:
    """Create the file `path` holding the bytes of `data` (bytes, an array: its bytes in C order, or a list of 1-d
    uint8 arrays: their bytes one after the other) and fsync it; returns its manifest entry (size, xxh3-64 of the
    bytes written). Each byte is copied once, from `data`'s memory into the page cache.

    A file over `_WRITEBACK` bytes is hashed by a second thread while it is written (the same bytes, read from the
    same memory, which nothing changes meanwhile), and every `_WRITEBACK` bytes written are handed to the disk by a
    second helper (`os.fdatasync`, where the OS has it, else `os.fsync`; one sync at a time, the next started at the
    first block boundary after the last has finished) while the next ones are copied: the closing fsync then waits
    for the last few blocks only, not for the whole file. A smaller file is hashed, then written.

    Raises:
      OSError: naming the file (it exists already, the disk is full, ...).
    """
    views = [memoryview(np.ascontiguousarray(d).reshape(-1).view(np.uint8) if isinstance(d, np.ndarray) else d)
             for d in (data if isinstance(data, list) else [data])]
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            if sum(len(v) for v in views) > _WRITEBACK:
                with ThreadPoolExecutor(2) as helpers:  # one hashes, one hands written blocks to the disk
                    digest = helpers.submit(_hash_bytes, views)
                    size = _write_blocks(fd, views, progress, lambda: helpers.submit(_datasync, fd))
                    digest = digest.result()
            else:
                digest = _hash_bytes(views)
                size = _write_blocks(fd, views, progress, None)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e
    return {"bytes": size, "xxh3_64": digest}


def _write_blocks(fd: int, views: list[memoryview], progress, writeback) -> int:
    """Write `views` one after the other to `fd`, `_WRITE_BLOCK` bytes (of up to `_IOV_MAX` views) per `os.writev`;
    `writeback()` (if given) starts a sync of what is written every `_WRITEBACK` bytes, once the previous one has
    finished. Returns the bytes written."""
    written, synced, pending = 0, 0, None
    for block in _blocks(views):
        n = sum(len(v) for v in block)
        while block:
            done = os.writev(fd, block)
            while block and done >= len(block[0]):
                done -= len(block[0])
                block = block[1:]
            if block:
                block[0] = block[0][done:]
        written += n
        progress.update(n)
        if writeback is not None and written - synced >= _WRITEBACK and (pending is None or pending.done()):
            if pending is not None:
                pending.result()  # its OSError, if any
            pending, synced = writeback(), written
    if pending is not None:
        pending.result()
    return written


def _blocks(views: list[memoryview]):
    """`views` cut and grouped into lists of `_WRITE_BLOCK` bytes (the last fewer), each of at most `_IOV_MAX` views."""
    block, room = [], _WRITE_BLOCK
    for view in views:
        while len(view):
            block.append(view[:room])
            view, room = view[room:], room - len(block[-1])
            if not room or len(block) == _IOV_MAX:
                yield block
                block, room = [], _WRITE_BLOCK
    if block:
        yield block


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(root: Path, progress, written: dict | None = None) -> None:
    """Hash and fsync every file under `root` but those of `written` (their manifest entries, by path relative to
    `root`: files `_write_file` wrote, hashed and synced), fsync its folders, then write and fsync `manifest.json`.

    The files are synced by a pool of threads: one fsync waits on the disk with the GIL released, and the file
    system commits concurrent syncs together."""
    written = written or {}
    paths = [p for p in _files(root) if p.relative_to(root).as_posix() not in written]

    def one(p: Path) -> dict:
        out = {"bytes": p.stat().st_size, "xxh3_64": _hash_file(p, progress)}
        _fsync(p)
        return out

    with ThreadPoolExecutor(_SYNC_THREADS) as pool:
        entries = list(pool.map(one, paths))
        list(pool.map(_fsync, [d for d in root.rglob("*") if d.is_dir()]))
    files = dict(sorted({**written, **{p.relative_to(root).as_posix(): e for p, e in zip(paths, entries)}}.items()))
    (root / "manifest.json").write_text(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "files": files}))
    _fsync(root / "manifest.json")
    _fsync(root)


def _read_json(path: Path, what: str) -> dict:
    try:
        out = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing ({what})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a JSON {what} ({e})") from None
    if not isinstance(out, dict) or out.get("format") != FORMAT:
        raise CheckpointError(f"{path}: expected a {FORMAT!r} {what}, got format {out.get('format') if isinstance(out, dict) else out!r:.60}")
    if out.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format version {out.get('version')!r}, this jaxbuffers reads version {FORMAT_VERSION}")
    return out


def _checked_description(path: Path, meta: dict) -> dict:
    """`meta`, the buffer description `path` (buffer.json), once the fields read before the class's own checks have
    their documented types: `leaves` a list of dicts, `host` null or a compressed buffer's host metadata (a dict, or
    `shards`: a list of them) with ints `version`, `num_writes`, `num_rows`, a list `stores` of dicts with a dict
    `config` and a dict `arrays` of store -> {array: [shape, dtype]} (a list of ints >= 0, a str) with every store.

    Raises:
      CheckpointError: naming `path` and the field, what was expected and what came.
    """
    def fail(field: str, expected: str, got: Any) -> None:
        raise CheckpointError(f"{path}: {field}: expected {expected}, got {got!r:.100}")

    if not isinstance(meta.get("leaves"), list) or not all(isinstance(x, dict) for x in meta["leaves"]):
        fail("leaves", "a list of {'path', 'shape', 'dtype'}", meta.get("leaves"))
    host = meta.get("host")
    if host is not None and not isinstance(host, dict):
        fail("host", "null or a dict (the host stores of a compressed buffer)", host)
    shards = [] if host is None else host.get("shards", [host])
    if not isinstance(shards, list):
        fail("host.shards", "a list of one dict per shard", shards)
    for i, m in enumerate(shards):
        where = f"host.shards[{i}]" if "shards" in host else "host"
        if not isinstance(m, dict):
            fail(where, "a dict", m)
        for k, kind, text in (("version", int, "an int"), ("num_writes", int, "an int"), ("num_rows", int, "an int"),
                              ("stores", list, "a list"), ("arrays", dict, "a dict")):
            if type(m.get(k)) is not kind:
                fail(where, f"key {k!r}, {text}", m.get(k))
        for j, store in enumerate(m["stores"]):
            if not (isinstance(store, dict) and isinstance(store.get("config"), dict)
                    and type(store["config"].get("num_slots", 0)) is int):
                fail(f"{where}.stores[{j}]", "a dict with a dict 'config' (its 'num_slots' an int)", store)
            if str(j) not in m["arrays"]:
                fail(f"{where}.arrays", f"a key '{j}' (one per store)", m["arrays"])
        for store, arrays in m["arrays"].items():
            for name, spec in arrays.items() if isinstance(arrays, dict) else [("", arrays)]:
                if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], list) and isinstance(spec[1], str)
                        and all(type(n) is int and n >= 0 for n in spec[0])):
                    fail(f"{where}.arrays[{store!r}][{name!r}]", "[shape, dtype]", spec)
    return meta


def _verify(root: Path, progress, later=lambda listed: set()) -> tuple[dict, set]:
    """Check every file of the checkpoint against its manifest: all sizes, then the xxh3-64 of every file but those
    `later(listed)` names (their checksums are taken as they are read, `_check_hashes`). Returns the manifest's
    file list and the files left to hash."""
    manifest = _read_json(root / "manifest.json", "checkpoint manifest")
    listed = _checked_files(root / "manifest.json", manifest.get("files"))
    present = {p.relative_to(root).as_posix() for p in _files(root)}
    unlisted = sorted(p for p in present - set(listed) if "/" in p)  # markers beside the files (an orbax commit file) are not read
    if unlisted:
        raise CheckpointError(f"{root}: files not in the manifest: {unlisted[:5]}")
    for rel, info in listed.items():
        p = root / rel
        if rel not in present:
            raise CheckpointError(f"{p}: missing (listed in the manifest)")
        if p.stat().st_size != info["bytes"]:
            raise CheckpointError(f"{p}: {p.stat().st_size} bytes, the manifest says {info['bytes']} (truncated or replaced)")
    progress.reset(total=sum(int(i["bytes"]) for i in listed.values()))
    deferred = set(later(listed))
    _check_hashes(root, listed, [rel for rel in listed if rel not in deferred], progress)
    return listed, deferred


def _checked_files(path: Path, listed: Any) -> dict:
    """`listed`, the file list of the manifest `path` (manifest.json, or a disk folder's disk.json), once it is a dict
    of relative path -> {"bytes": size, "xxh3_64": checksum}, every size an int >= 0 and every checksum a str.

    Raises:
      CheckpointError: naming `path`, the file listed and the key, what was expected and what came.
    """
    if not isinstance(listed, dict):
        raise CheckpointError(f"{path}: files: expected a dict of relative path -> {{'bytes', 'xxh3_64'}}, got {listed!r:.80}")
    for rel, info in listed.items():
        where = f"{path}: files[{rel!r:.200}]"
        if not isinstance(rel, str) or not isinstance(info, dict):
            raise CheckpointError(f"{where}: expected a dict {{'bytes': size, 'xxh3_64': checksum}}, got {info!r:.100}")
        size, digest = info.get("bytes"), info.get("xxh3_64")
        if type(size) is not int or size < 0:
            raise CheckpointError(f"{where}: expected 'bytes', an int >= 0 (the file's size), got {info!r:.100}")
        if not isinstance(digest, str):
            raise CheckpointError(f"{where}: expected 'xxh3_64', a str (the file's checksum), got {info!r:.100}")
    return listed


def _check_hashes(root: Path, listed: dict, rels, progress) -> None:
    for rel in rels:
        if _hash_file(root / rel, progress) != listed[rel]["xxh3_64"]:
            raise _mismatch(root / rel)


def _mismatch(path: Path) -> CheckpointError:
    return CheckpointError(f"{path}: checksum mismatch (xxh3_64 differs from the manifest): the file is corrupt")


def _is_checkpoint(path: Path) -> bool:
    """Whether the folder `path` is a jaxbuffers checkpoint: its `manifest.json` or `buffer.json` (a fill in place
    cut short before its manifest) is a JSON object of this format. A file of that name written by anything else
    does not count."""
    for name in ("manifest.json", "buffer.json"):
        try:
            data = json.loads((path / name).read_bytes())
        except (OSError, ValueError):  # absent, unreadable, not JSON (UnicodeDecodeError is a ValueError)
            continue
        if isinstance(data, dict) and data.get("format") == FORMAT:
            return True
    return False


def _through_link(path: Path) -> Path:
    """The folder a checkpoint path names: the target of a symbolic link (followed to its end; it need not exist
    yet), else `path` itself. A save replaces that folder atomically and keeps the link (a `latest -> ckpt_N` layout
    stays a link to the new checkpoint); a restore reads it and falls back to its `.prev`."""
    return path.resolve() if path.is_symlink() else path


def _prev(path: Path) -> Path:
    return path.parent / f".{path.name}.prev"


def _sibling(path: Path, kind: str) -> Path:
    """A new folder name beside `path` owned by this process: `.<name>.<kind>-<pid>-<random>`."""
    return path.parent / f".{path.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _check_folder_path(path: Path) -> None:
    """NotADirectoryError naming `path`, or the path above it, that is a file: no folder can be made at `path`."""
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise NotADirectoryError(f"directory: {p} is a file, not a folder" + ("" if p == path else f" (no folder {path} can be made)"))


def _check_destination(path: Path) -> None:
    """Refuse a folder `path` (absolute, through links) that a save must not write: before anything is created, and
    again at the commit (`_commit`). A save writes a new folder, an existing empty folder (filled in place) or
    replaces a checkpoint.

    Raises:
      NotADirectoryError: `path` or a path above it is a file (naming it).
      ValueError: `path` is inside a checkpoint folder (naming it: its manifest would not list the new files), or is
        a checkpoint that holds the working directory (replacing it would delete the working directory).
      FileExistsError: `path` exists and is neither a checkpoint nor an empty folder (nothing is deleted).
    """
    _check_folder_path(path)
    for above in path.resolve().parents:  # where the folder is on disk: `a/../b` is beside `a`, a link into a checkpoint is in it
        if _is_checkpoint(above):
            raise ValueError(f"directory: {path} is inside the checkpoint {above}; save beside it, not into it")
    if path.exists() and not (_is_checkpoint(path) or (path.is_dir() and not any(path.iterdir()))):
        raise FileExistsError(f"directory: {path} exists and is not a jaxbuffers checkpoint or an empty folder; refusing to replace it")
    try:
        cwd = Path.cwd()
    except OSError:  # no working directory any more
        return
    if _is_checkpoint(path) and (cwd == path.resolve() or path.resolve() in cwd.parents):
        raise ValueError(f"directory: {path} holds the working directory {cwd}; replacing it would delete the working "
                         "directory: save from another folder")


_SAVING: dict[Path, list] = {}  # folder -> [lock, saves holding or awaiting it]; an entry goes with its last save
_SAVING_LOCK = threading.Lock()


@contextlib.contextmanager
def _one_at_a_time(path: Path):
    """Held while a save of this process writes and commits the folder `path`: saves to one folder from several
    threads replace it one after the other (each commit finds the folder as the last one left it). One lock per
    folder on disk (paths through links to the same folder share it), kept only while a save uses it."""
    key = path.resolve()
    with _SAVING_LOCK:
        entry = _SAVING.setdefault(key, [threading.Lock(), 0])
        entry[1] += 1
    try:
        with entry[0]:
            yield
    finally:
        with _SAVING_LOCK:
            entry[1] -= 1
            if not entry[1]:
                del _SAVING[key]


def _commit(tmp: Path, path: Path) -> None:
    """Move the complete checkpoint folder `tmp` to `path`, replacing the checkpoint there, or into the existing empty
    folder `path` (which keeps its inode: it may be the working directory), the manifest last.

    Between the two renames the old checkpoint is `.<name>.prev` (which `restore` falls back to); once the new one is
    in place and its parent folder synced, the old one is renamed aside and deleted by a background thread (deleting
    gigabytes of files takes a while and the new checkpoint no longer needs it).

    `path` is checked again first (`_check_destination`), as it is now: another save or a writer may have changed it
    since the save began. Its refusals are raised and nothing at `path` is moved or deleted.
    """
    _check_destination(path)
    if path.is_dir() and not _is_checkpoint(path) and not any(path.iterdir()):
        for entry in sorted(tmp.iterdir(), key=lambda p: p.name == "manifest.json"):
            if entry.name == "manifest.json":
                _fsync(path)  # every other file in place first: a folder with a manifest is complete
            os.rename(entry, path / entry.name)
        _fsync(path)
        tmp.rmdir()
        return
    prev = _prev(path)
    if path.exists():
        if prev.exists():  # left by a crash after the previous save completed
            shutil.rmtree(prev)
        os.rename(path, prev)
    os.rename(tmp, path)
    _fsync(path.parent)
    if prev.exists():
        old = _sibling(path, "old")
        os.rename(prev, old)
        threading.Thread(target=shutil.rmtree, args=(old,), kwargs={"ignore_errors": True}, name="jaxbuffers-remove-old").start()


def _drop_cached(path: Path) -> None:
    """Drop from the page cache the files of the checkpoint at `path` (if any), which a save is about to replace; they
    stay whole on disk. The new checkpoint's files then take the memory those pages held: writing into memory the
    page cache has just freed costs less than into memory the kernel must first evict, or that a virtual machine's
    host must first provide. A hint where the OS takes it (`posix_fadvise`), skipped elsewhere and for a file that
    cannot be opened."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None or not path.is_dir():
        return
    for p in (p for p in path.rglob("*") if p.is_file()):
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def _clean_stale(path: Path) -> None:
    """Remove folders beside `path` left by saves whose process is gone: temporary folders of a crash mid-save,
    and replaced checkpoints whose background deletion did not finish."""
    for tmp in [*path.parent.glob(f".{path.name}.tmp-*"), *path.parent.glob(f".{path.name}.old-*")]:
        pid = tmp.name.rsplit("-", 2)[-2]
        try:
            os.kill(int(pid), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:
            pass


class _Progress:
    """A tqdm bar in bytes shown after a second (`enabled=None`: only on a terminal), or nothing."""

    def __init__(self, enabled: bool | None, desc: str):
        self.bar = None
        if enabled is not None:
            _validate.static_bool("progress", enabled)
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(desc=desc, unit="B", unit_scale=True, unit_divisor=1024, delay=1.0, leave=False)

    def reset(self, total: int) -> None:
        if self.bar is not None:
            self.bar.reset(total=total)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
