"""Save and restore every buffer exactly: `save`, `restore`, and the orbax `BufferSave` / `BufferRestore` arguments.

A restored buffer is the saved one bit for bit: the same key samples the same batch, and adding continues from the
same head. It is rebuilt from its class's own `create` with the saved arguments (never unpickled), its arrays come
back as JAX arrays on the requested sharding, and donating it updates it in place.

Checkpoint format (a folder, format version `FORMAT_VERSION`):

```
buffer.json      {"format": "jaxbuffers.checkpoint", "version": 1, "class": "ReplayBuffer",
                  "config": create's arguments ("example": the example's tree of [shape, dtype]; a node other
                  than a dict, list or tuple by its layout: {"node": [type name, child keys, children]}),
                  "stack_shape": leading axes of a stacked (vmapped) buffer,
                  "sharded": {"axis", "num_shards"} of a saved ShardedBuffer (its shards, stacked [S]); absent else,
                  "leaves": [{"path", "shape", "dtype"}, ...] every array of the buffer, in pytree order,
                  "host": host-store metadata of a compressed buffer, else null, "tree_order": a prioritised
                  trajectory tree's leaf order (`_checkpoint_describe.TREE_ORDER`; absent: `lane * length + slot`)}
arrays/          an orbax-checkpoint PyTree checkpoint (tensorstore) of
                  {"device": {"0": leaf 0, ...}, "host": {"stores": {"0": {"chunk", "offset", ..., "payload"}, ...},
                   "slot_version": ...}}: the buffer's arrays, and for a compressed buffer its host stores
                  (`host_codecs.CompressedStore.export_later`: index columns, packed payloads, zstd dictionary);
                  a sharded one's per shard ({"shards": {"s": ...}}), or, saved by several processes
                  ("layout": "stacked"), as one uint8 array [S, n] of a byte row per shard. An array of a dtype
                  other than numpy's and bfloat16 (float8, float4, int4, uint4, int2, uint2) is stored as its bytes,
                  unsigned integers of its item size (`_checkpoint_zarr.stored`). One process writes the
                  files itself, in the layout orbax writes for numpy arrays (`jaxbuffers._checkpoint_zarr`: one
                  zarr chunk per array, straight from its memory); several processes' parts are written by orbax
manifest.json    {"format", "version", "files": {relative path: {"bytes", "xxh3_64"}}}, written last
```

Safety:

* No pickle: metadata is JSON, arrays are raw zarr chunks (read directly, or by orbax); the class comes from a fixed
  table of jaxbuffers classes and dtypes from a fixed list of numeric and bool dtypes. A crafted checkpoint cannot run
  code.
* Every file is checked against the manifest: all sizes first, then the xxh3-64 of every file before anything read
  from it is used. An array stored as one uncompressed chunk (what a one-process save writes) is read straight into
  the memory it ends in and hashed on the bytes read (`jaxbuffers._checkpoint_zarr`); every other file, and any other
  layout of an array (read by orbax), is hashed before it is read. A mismatch raises `CheckpointError` naming the
  file.
* `save` writes into a temporary sibling folder and renames it into place; a crash at any point leaves the previous
  checkpoint whole (between the two renames it is the sibling `.<name>.prev`, which `restore` falls back to). Every
  file (hashed as it is written) and folder is fsynced before the rename.
* `save(..., blocking=False)` copies the buffer's arrays to host memory (on CPU: holds them, so that a later donation
  copies instead of writing over them) and takes the host stores (a copy of their index; their payloads, which adds
  never overwrite, written later from the arena: `jaxbuffers._checkpoint_snapshot`) before it returns, and writes in a
  background thread: the checkpoint holds the buffer as of the call, whatever the training loop does with it
  afterwards.
* Several processes (`jax.distributed`): every process calls `save(directory, buffer)` with the same folder (on a
  file system they all see), blocking or not, and process 0 commits once every process has written its parts
  (`jaxbuffers._checkpoint_processes`). A `ShardedBuffer`: each process writes and reads the parts of its devices and
  the host stores of its shards (`restore(directory, target)` with a `ShardedBuffer` target, every process). Any other
  buffer is one replicated buffer, the same on every process (checked: a buffer that differs is refused, naming the
  array), written by process 0 and read whole by each process. `BufferCheckpointHandler` items do the same inside an
  orbax manager's step. `to_bytes` and `jaxbuffers.disk` folders are one process's: refused there.
* A checkpoint of another class, configuration, shape, dtype or format version raises `CheckpointError` before any
  array is allocated; the target buffer (if given) is never modified.

With an `orbax.checkpoint.CheckpointManager`, `BufferSave(buffer)` / `BufferRestore(target)` save the buffer as one
item of a step (`ocp.args.Composite(state=ocp.args.StandardSave(state), buffer=BufferSave(buffer))`), written by
`BufferCheckpointHandler` in the same format (the manager provides the atomic rename; with an asynchronous manager
the buffer is snapshotted as `save(..., blocking=False)` does and written in the background).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from host_codecs import num_threads
from jaxbuffers import _background, _compiled, _checkpoint_processes as _processes, _checkpoint_zarr as _zarr, _validate
from jaxbuffers._checkpoint_describe import (  # noqa: F401 - _CLASSES, _json_config: used by jaxbuffers.disk
    _CLASSES, _COMPRESSED, FORMAT, FORMAT_VERSION, CheckpointError, _describe, _dtype, _entry, _json_config, _leaves,
    TREE_ORDER, _check_meta_defaults, _checked_cursors, _nbytes, _sharded, _template, _upgraded, _upgraded_state,
)
from jaxbuffers._checkpoint_upgrades import saved_without_lost
from jaxbuffers._checkpoint_snapshot import Snapshot as _Snapshot, snapshot as _snapshot, store_snapshot as _store_snapshot
from jaxbuffers._checkpoint_files import (  # noqa: F401 - _check_folder_path, _fsync, _hash_file: used by jaxbuffers.disk
    _check_destination, _check_folder_path, _check_hashes, _checked_description, _clean_stale, _commit, _drop_cached,
    _fsync, _hash_file, _is_checkpoint, _one_at_a_time, _prev, _Progress, _read_json, _sibling, _through_link, _verify,
    _write_file, _write_manifest,
)
from jaxbuffers.sharding import ShardedBuffer

__all__ = [
    "FORMAT_VERSION", "CheckpointError", "PendingSave", "save", "restore", "to_bytes", "from_bytes", "BufferSave",
    "BufferRestore", "BufferCheckpointHandler",
]


_ONE_PROCESS = ("with several processes, every process calls save and restore with the same folder (a ShardedBuffer: "
                "each process its shards; any other buffer: one replicated buffer written by process 0); to_bytes "
                "archives and disk folders are one process's")


# --- writing one checkpoint folder ---

def _write(root: Path, snapshot: _Snapshot, progress: _Progress) -> None:
    """Write `snapshot` into the existing empty folder `root` (not atomic: `save` and the orbax manager make it so):
    the host stores exported (`_checkpoint_snapshot`), every file hashed as it is written and synced once
    (`_checkpoint_zarr.write`), the manifest last."""
    meta, tree = snapshot.done()
    progress.reset(total=_nbytes(tree))
    written = _zarr.write(root, tree, progress)
    written["buffer.json"] = _write_file(root / "buffer.json", json.dumps(meta).encode(), _Progress(False, ""))
    _write_manifest(root, progress, written)


# --- reading one checkpoint folder ---

def _shardings(abstract: Any, sharding: Any, target: Any) -> list:
    n, default = len(jax.tree.leaves(abstract)), jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    if sharding is None and target is not None:
        sharding = jax.tree.map(lambda x: getattr(x, "sharding", None) or default, target)
    if isinstance(sharding, jax.Device):
        sharding = jax.sharding.SingleDeviceSharding(sharding)
    if sharding is None or isinstance(sharding, jax.sharding.Sharding):
        flat = [sharding or default] * n
    else:
        flat = jax.tree.leaves(sharding, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
        if not all(isinstance(x, jax.sharding.Sharding) for x in flat):  # a wrong kind of argument ("cpu", 0, ...)
            raise TypeError(f"sharding: expected a Sharding, a Device or a tree of {n} Shardings like the buffer, got {sharding!r:.200}")
        if len(flat) != n:
            raise ValueError(f"sharding: expected a Sharding, a Device or a tree of {n} Shardings like the buffer, got {sharding!r:.200}")
    for (path, x), s in zip(jax.tree_util.tree_flatten_with_path(abstract)[0], flat):  # before any array is read
        _validate.sharding_fits("sharding", _validate.leaf_name(path), np.shape(x), s)
    return flat


def _host_restore_args(meta: dict | None, root: Path) -> dict:
    """orbax's restore arguments of the host arrays `meta` (`_checkpoint_snapshot`'s host metadata, of the checkpoint `root`)."""
    if meta is not None and meta.get("layout") == "stacked":  # written by several processes: a byte row per shard
        return {"bytes": ocp.RestoreArgs(restore_type=np.ndarray)}
    if meta is not None and "shards" in meta:
        return {"shards": {str(i): _host_restore_args(m, root) for i, m in enumerate(meta["shards"])}}
    shapes = {} if meta is None else meta["arrays"]
    args = {"stores": {i: {k: ocp.RestoreArgs(restore_type=np.ndarray, dtype=_dtype(d, f"{root / 'buffer.json'}: host store {i} array {k!r}"))
                           for k, (shp, d) in s.items() if np.prod(shp)}
                       for i, s in shapes.items()}}
    if meta is not None:
        args["slot_version"] = ocp.RestoreArgs(restore_type=np.ndarray)
    return args


def _read(root: Path, target: Any, sharding: Any, progress: _Progress) -> Any:
    if isinstance(target, ShardedBuffer) and _processes.several():  # every process reads its parts
        return _processes.restore(root, target, functools.partial(_checked, sharding=sharding, progress=progress),
                                  functools.partial(_read_arrays, progress=progress), _host_restore_args, _load_host, _upgraded_state)
    if isinstance(target, ShardedBuffer):  # its stacked buffer, on the target's mesh, wrapped again
        return target.replace(shards=_read(root, target.shards, sharding, progress))
    listed, later = _verify(root, progress, _zarr.deferred)
    meta, leaves, treedef, shardings = _described(root, target, sharding)
    host_meta = meta.get("host")
    restore_args = {"device": {str(i): ocp.RestoreArgs(restore_type=np.ndarray) for i, x in enumerate(leaves) if x.size},
                    "host": _host_restore_args(host_meta, root)}
    direct = _read_direct(root, listed, later, restore_args, leaves, shardings, progress)
    if direct is None:  # a layout orbax reads (several chunks, ...): every file verified first
        _check_hashes(root, listed, sorted(later), progress)
        arrays, host_out = _read_orbax(root, meta, restore_args, leaves, shardings, progress)
    else:
        arrays, host_out = direct
    if target is not None:
        _check_meta_defaults(target, arrays, root, stacked="sharded" in meta)
    buffer, host_meta = _upgraded_state(_checked_cursors(jax.tree.unflatten(treedef, arrays), root), meta)
    if host_meta is not None and "shards" in host_meta:
        versions = np.asarray(buffer.version).tolist()
        for i, (h, m) in enumerate(zip(buffer.host.shards, host_meta["shards"])):
            _load_host(h, versions[i], m, _processes.shard_arrays(host_out, host_meta, i), f"{root} (shard {i})")
    elif host_meta is not None:
        _load_host(buffer.host, int(buffer.version), host_meta, host_out, root)
    return buffer


def _read_direct(root: Path, listed: dict, later: set, restore_args: dict, leaves: list, shardings: list,
                 progress: _Progress) -> tuple[list, dict] | None:
    """The buffer's arrays on `shardings` and the host arrays, each read straight from its single-chunk file and
    hashed on the bytes read (`jaxbuffers._checkpoint_zarr`); None if any array is stored otherwise."""
    is_args = lambda a: isinstance(a, ocp.RestoreArgs)  # noqa: E731
    flat, host_tree = jax.tree_util.tree_flatten_with_path(restore_args["host"], is_leaf=is_args)
    host_names = ["host." + ".".join(str(k.key) for k in path) for path, _ in flat]
    wanted = {f"device.{i}": (x.shape, x.dtype) for i, x in enumerate(leaves) if x.size}
    wanted.update({n: (None, a.dtype) for n, (_, a) in zip(host_names, flat)})
    chunks = _zarr.plan(root, wanted, listed)
    if chunks is None:
        return None
    _check_hashes(root, listed, sorted(later - {c.rel for c in chunks.values()}), progress)
    hashed = lambda name: listed[chunks[name].rel]["xxh3_64"]  # noqa: E731

    def device(i: int, x: Any, s: Any) -> jax.Array:
        if not x.size:
            return _zarr.on_devices([np.zeros(x.shape, x.dtype)], [s])[0]
        return _zarr.to_device(root, chunks[f"device.{i}"], hashed(f"device.{i}"), s, progress)

    def host(n: str) -> Any:  # a payload is read when its store asks for it, into the chunks it keeps
        return (_zarr.HostSource if n.endswith(".payload") else _zarr.to_host)(root, chunks[n], hashed(n), progress)

    with concurrent.futures.ThreadPoolExecutor(num_threads()) as pool:  # files read at once (the first error raised)
        arrays = list(pool.map(device, range(len(leaves)), leaves, shardings))
        host_arrays = list(pool.map(host, host_names))
    return arrays, jax.tree_util.tree_unflatten(host_tree, host_arrays)


def _read_orbax(root: Path, meta: dict, restore_args: dict, leaves: list, shardings: list, progress: _Progress) -> tuple[list, dict]:
    """The buffer's arrays on `shardings` and the host arrays, read by orbax to host memory (every file verified)."""
    out = _read_arrays(root, restore_args, leaves, progress)
    host = []
    for i, x in enumerate(leaves):
        a = _zarr.loaded(out["device"].get(str(i)), x.dtype) if x.size else np.zeros(x.shape, x.dtype)
        if not isinstance(a, np.ndarray) or a.shape != x.shape or a.dtype != x.dtype:
            got = f"{a.shape} {a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__
            raise CheckpointError(f"{root / 'arrays'}: array {i} ({meta['leaves'][i]['path']}) came back as {got}, expected {x.shape} {x.dtype}")
        host.append(a)
    return _zarr.on_devices(host, shardings), out["host"]


def _read_arrays(root: Path, restore_args: dict, leaves: list, progress: _Progress) -> dict:
    """orbax's restore of `root / "arrays"` with `restore_args` (`leaves`: the buffer's, for the progress bar)."""
    progress.reset(total=_nbytes(leaves))
    handler = ocp.PyTreeCheckpointHandler(use_compression=False, use_ocdbt=False)
    try:
        out = handler.restore(epath.Path(root / "arrays"), args=ocp.args.PyTreeRestore(restore_args=restore_args))
    except Exception as e:  # noqa: BLE001 - tensorstore/orbax raise many kinds; name the folder
        raise CheckpointError(f"{root / 'arrays'}: orbax could not read the arrays ({type(e).__name__}: {e})") from e
    finally:
        handler.close()
    progress.update(_nbytes(leaves))
    return out


def _checked(root: Path, target: Any, sharding: Any, progress: _Progress) -> tuple[dict, list, Any, list]:
    """(buffer.json, abstract leaves, treedef, shardings) of the checkpoint at `root`, after every check that comes
    before reading an array: the manifest's checksums of every file, then `_described`'s."""
    _verify(root, progress)
    return _described(root, target, sharding)


def _described(root: Path, target: Any, sharding: Any) -> tuple[dict, list, Any, list]:
    """(buffer.json, abstract leaves, treedef, shardings) of the checkpoint at `root` (its buffer.json verified), after
    the checks of the description and of the target's class and configuration."""
    meta = _checked_description(root / "buffer.json", _read_json(root / "buffer.json", "buffer description"))
    if target is not None:
        _entry(target, "target")  # TypeError for a target that is not a buffer
    if meta.get("tree_order", TREE_ORDER) != TREE_ORDER:  # absent: the earlier order, rebuilt by `_upgraded_state`
        raise CheckpointError(f"{root / 'buffer.json'}: tree_order {meta['tree_order']!r} is not a leaf order this "
                              f"version reads ({TREE_ORDER!r}, or absent for the earlier lane order)")
    try:
        abstract, concrete = (saved_without_lost(meta, x) for x in _template(meta, target, root))  # read as saved
    except CheckpointError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a field missing or of the wrong JSON type
        raise CheckpointError(f"{root / 'buffer.json'}: malformed buffer description ({type(e).__name__}: {e})") from None
    leaves, treedef = jax.tree.flatten(abstract)
    _, described = _leaves(abstract)
    if described != meta["leaves"]:
        diff = next((a, b) for a, b in zip(described + [None] * len(meta["leaves"]), meta["leaves"] + [None] * len(described)) if a != b)
        earlier = (".metrics.sampled", ".metrics.record_calls", ".metrics.stale", ".metrics.age_sum", ".metrics.age_max",
                   ".metrics.age_hist")  # the metrics arrays before `totals`
        old_metrics = isinstance(diff[1], dict) and str(diff[1].get("path", "")).endswith(earlier)
        hint = ("; the usage metrics' arrays changed layout before their first release (one `totals` array): "
                "checkpoints written with the earlier layout are not read, save the buffer again") if old_metrics else ""
        raise CheckpointError(f"{root / 'buffer.json'}: array {diff[1]} in the checkpoint, {diff[0]} in the buffer to restore{hint}")
    return meta, leaves, treedef, _shardings(abstract, sharding, concrete)


def _load_host(host: Any, version: int, meta: dict, arrays: dict, root: Any) -> None:
    """Fill the fresh `HostStores` `host` of a restored state of version `version` from its saved `meta` / `arrays`."""
    shapes = meta["arrays"]
    if len(meta["stores"]) != len(host.stores):
        raise CheckpointError(f"{root}: {len(meta['stores'])} host stores in the checkpoint, the buffer has {len(host.stores)}")
    sv = np.asarray(arrays["slot_version"])
    if sv.dtype != np.int32 or sv.ndim != 1 or sv.shape[0] > host.num_slots:
        raise CheckpointError(f"{root}: host slot_version of shape {sv.shape} {sv.dtype}, expected int32 (n,) with n <= {host.num_slots}")
    for i, (store, m) in enumerate(zip(host.stores, meta["stores"])):
        got = arrays["stores"].get(str(i), {})
        full = {k: (got[k] if isinstance(got[k], _zarr.HostSource) else np.asarray(got[k])) if k in got
                else np.zeros(shp, _dtype(d, f"{root}: host store {i} array {k!r}")) for k, (shp, d) in shapes[str(i)].items()}
        try:
            store.import_state(m, full, adopt=True)  # the arrays read are the store's from now on
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{root}: host store {i} ({host.names[i]}): {e}") from None
    host.set_slot_versions(sv, f"{root}: host slot_version")
    host.version, host.num_writes, host.num_rows = int(meta["version"]), int(meta["num_writes"]), int(meta["num_rows"])
    if version != host.version:
        raise CheckpointError(f"{root}: buffer version {version} but host store version {host.version}")


# --- public API ---

class PendingSave:
    """A save running in a background thread, returned by `save(..., blocking=False)`.

    The checkpoint holds the buffer as it was when `save` was called. Its folder is replaced only once the new
    checkpoint is complete (the same atomic rename as a blocking save); a later `save` to the same folder waits for
    this one first. At a normal interpreter exit every pending save is finished before the interpreter shuts its
    thread pools down; one that fails there, and whose error no `wait()` raised, is printed on stderr and the
    process exits with status 1 (`jaxbuffers._background`).
    """

    def __init__(self, path: Path, future: concurrent.futures.Future):
        self.path = path
        self._future = future

    def done(self) -> bool:
        """Whether the save has finished (written and renamed into place, or failed)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> Path:
        """Block until the checkpoint is in place and return its folder; re-raise the save's error, if any.

        Args:
          timeout: None (no limit) or a number of seconds `>= 0` (`inf`: no limit).

        Raises:
          TimeoutError: not finished within `timeout` seconds (the save goes on).
          TypeError, ValueError: `timeout` not a number or None / negative or NaN (checked before waiting, whether
            or not the save has finished).
        """
        timeout = _validate.timeout("timeout", timeout)
        try:
            out = self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"save to {self.path}: not finished within {timeout} s") from None
        except BaseException:
            _background.taken(self._future)  # raised to the caller: not reported again at exit
            raise
        return out


_PENDING: dict[Path, PendingSave] = {}
_PENDING_LOCK = threading.Lock()


def save(directory: str | os.PathLike, buffer: Any, *, progress: bool | None = None, blocking: bool = True) -> Path | PendingSave:
    """Save `buffer` to the folder `directory` (created or replaced as a whole; see the module doc for the format).

    Args:
      directory: the checkpoint folder. An existing checkpoint there is replaced only once the new one is complete
        (saves to one folder from several threads: one after the other). A symbolic link is written through: the
        folder it points to is replaced and the link kept.
      buffer: any jaxbuffers buffer (`ReplayBuffer`, `PrioritisedReplayBuffer`, `TrajectoryBuffer`,
        `PrioritisedTrajectoryBuffer`, `RolloutBuffer`, `EpisodeBuffer`, the compressed buffers), stacked (vmapped) or not,
        or a `ShardedBuffer` (saved as its shards: a buffer stacked `[S]`, one host store per shard for compressed
        buffers, the mesh axis in buffer.json). A compressed buffer must be the state returned by its last `add`.
      progress: a tqdm bar (sizes, throughput) for saves over a second; None: only on a terminal.
      blocking: False: take the buffer's arrays to host memory (a `ShardedBuffer` with several processes: copies on
        its devices), start writing in a background thread and return a `PendingSave` at once. The buffer may then be
        donated and updated (the checkpoint keeps the state of the call); call `PendingSave.wait()` before relying on
        the files (with several processes, on every process: the folder is committed once every process has written
        its parts). The errors below are raised by the call itself, before anything is written; an error while
        writing is raised by `wait()`.

    Returns:
      The checkpoint folder as a `pathlib.Path` (blocking), or a `PendingSave` whose `wait()` returns it.

    Raises:
      TypeError: `directory` not a path, `buffer` not a jaxbuffers buffer or a stacked compressed buffer or traced
        (inside `jax.jit`), a field of dtype `jnp.int1` / `jnp.uint1` (JAX takes them to host memory as bool and cannot
        put them back; naming it), `progress` not a bool or None, `blocking` not a bool (checked before any write).
      RuntimeError: `buffer`'s arrays were donated to a jitted call (`donate_argnums`) or deleted, naming its class
        (save the state that call returned), before anything is written.
      FileExistsError: `directory` exists and is neither a checkpoint nor an empty folder (nothing is deleted), now or
        at the commit. An empty folder is filled in place (it keeps its inode: it may be the working directory).
      NotADirectoryError: `directory` or a path above it is a file (naming it).
      ValueError: `directory` inside a checkpoint folder (naming it), or a checkpoint holding the working directory.
      StaleBufferError: a compressed buffer state older than its host store.
      ValueError: with several processes, a buffer other than a `ShardedBuffer` that is not the same on every process
        (one replicated buffer is saved: module doc), naming the array; raised by every process.
      RuntimeError: with several processes, another process could not take its part of the buffer (before anything
        is written), or a process could not write its parts or process 0 commit (nothing is committed; the message
        names each process and its error).
    """
    return _save(directory, buffer, progress, blocking=blocking)


def _save(directory: str | os.PathLike, buffer: Any, progress: bool | None, host: bool = True, blocking: bool = True) -> Path | PendingSave:
    """`save`, with `_snapshot`'s `host`."""
    path = _through_link(_validate.path("directory", directory).absolute())
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(buffer)):
        raise TypeError("buffer: expected concrete arrays, got traced values: save runs outside jax.jit and lax.scan")
    _describe(buffer)  # its TypeErrors before anything is created
    _compiled.check_not_deleted("save", [buffer])
    if progress is not None:
        _validate.static_bool("progress", progress)
    blocking = _validate.static_bool("blocking", blocking)
    if not host:
        _validate.single_process("save", _ONE_PROCESS)  # a disk folder is one process's
    with _PENDING_LOCK:
        pending = _PENDING.get(path)
    if pending is not None:
        concurrent.futures.wait([pending._future])
    if _processes.several():  # every process, together; commits once every process has written
        finish = _processes.save(path, buffer, _store_snapshot, _snapshot, copy=not blocking)
    else:
        _check_destination(path)
        snapshot = _snapshot(buffer, host)
        path.parent.mkdir(parents=True, exist_ok=True)
        _clean_stale(path)
        tmp = _sibling(path, "tmp")
        tmp.mkdir()

        def finish(bar: _Progress) -> Path:
            try:
                _drop_cached(path)
                _write(tmp, snapshot, bar)
                _commit(tmp, path)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return path

    def write() -> Path:
        bar = _Progress(progress, f"save {path.name}")
        try:
            with _one_at_a_time(path):
                return finish(bar)
        finally:
            bar.close()

    if blocking:
        return write()
    pending = PendingSave(path, _background.start(write, what=f"save to {path}"))
    with _PENDING_LOCK:
        _PENDING[path] = pending
    pending._future.add_done_callback(lambda _: _forget(path, pending))
    return pending


def _forget(path: Path, pending: PendingSave) -> None:
    with _PENDING_LOCK:
        if _PENDING.get(path) is pending:
            del _PENDING[path]


def restore(directory: str | os.PathLike, target: Any = None, *, sharding: Any = None, progress: bool | None = None) -> Any:
    """Restore the buffer saved in `directory`, bit for bit.

    Args:
      directory: a folder written by `save` (or a `BufferCheckpointHandler` item folder). If a save crashed
        between its two renames, the previous checkpoint (`.<name>.prev`) is restored.
      target: optional buffer (concrete, or abstract from `jax.eval_shape`) of the same class and configuration:
        checked against the checkpoint, its arrays' shardings used; never modified. A `ShardedBuffer` target (e.g. a
        new one from `ShardedBuffer.create` on this run's mesh) takes a checkpoint of `S` stacked shards back onto
        its mesh.
      sharding: where the arrays go: a `jax.sharding.Sharding` or `jax.Device` for every array, or a tree of
        shardings like the buffer. Default: the target's shardings, else the default device. One sharding is
        applied to every array as it is, scalars included: a sharding that splits an axis fits no scalar, so give
        a tree of shardings for a buffer with arrays of several ranks (each is checked before anything is read).
      progress: a tqdm bar for loads over a second; None: only on a terminal.

    Returns:
      The buffer, its leaves JAX arrays (a compressed buffer gets new host stores holding the saved entries). A saved
      `ShardedBuffer` comes back as its stacked shards (leaves `[S, ...]`), or as a `ShardedBuffer` like `target`.

    Raises:
      TypeError: `directory` not a path, `target` not a jaxbuffers buffer, `progress` not a bool or None, `sharding`
        not a Sharding, a Device or a tree of Shardings.
      ValueError: `sharding` a tree of another number of Shardings than the buffer's arrays, or a sharding that
        cannot lay out its array (more axes in its spec than the array has, a dimension not divisible), naming the
        array, its shape and the sharding.
      CheckpointError: missing or corrupt files (the message names the file), another format version, or a
        class, configuration, shape or dtype other than the target's, or episode meta defaults other than a concrete
        target's (naming the field), or a cursor outside its documented range (`head`, `num_valid`, `added`,
        `final_head`, `phase`, `frame_head`, `next_ep_pos`, `next_key_pos`, `step_index`: naming the leaf, the range
        and the value).

    With several processes a `ShardedBuffer` target is restored by every process together (each its shards; a
    checkpoint saved by one process or by several restores either way), and an error is raised on every process; any
    other buffer is read whole by each process, onto its own devices by default.
    """
    path = _through_link(_validate.path("directory", directory).absolute())
    if target is not None:
        _entry(_sharded(target)[0], "target")
    if progress is not None:
        _validate.static_bool("progress", progress)
    if not _is_checkpoint(path) and _is_checkpoint(_prev(path)):
        path = _prev(path)
    if not path.is_dir():
        raise CheckpointError(f"directory: no checkpoint at {path}")
    bar = _Progress(progress, f"restore {path.name}")
    try:
        return _read(path, target, sharding, bar)
    finally:
        bar.close()


def to_bytes(buffers: dict[str, Any]) -> bytes:
    """Checkpoints of several buffers as one uncompressed tar archive in memory: folder `name/` holds the `save` of
    `buffers[name]` (names: letters, digits, `_` and `-`). For objects that must carry their buffers through a
    byte-oriented channel (e.g. `__getstate__`) without pickling them.

    Raises:
      TypeError: `buffers` not a dict (e.g. one buffer: pass `{"name": buffer}`), a name not a str, or a value not a
        jaxbuffers buffer (naming it), before anything is written.
      ValueError: a name that is not a plain folder name. Otherwise as `save`.
      NotImplementedError: `jax.process_count() > 1` (an archive is one process's).
    """
    _validate.single_process("to_bytes", _ONE_PROCESS)
    for name, buf in _named_buffers("buffers", buffers, "buffer").items():
        _entry(_sharded(buf)[0], f"buffers[{name!r}]")
    out = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(fileobj=out, mode="w") as tar:
        for name, buf in buffers.items():
            save(Path(tmp) / name, buf, progress=False)
            tar.add(Path(tmp) / name, arcname=name)
    return out.getvalue()


def _named_buffers(name: str, value: Any, what: str) -> dict:
    """`value` if it is a dict whose keys are plain folder names (letters, digits, `_` and `-`), else TypeError (not a
    dict, a key not a str) or ValueError (another str) naming `name`, what was expected and what came."""
    if not isinstance(value, dict):  # its type only: a buffer's repr is its arrays
        raise TypeError(f'{name}: expected a dict of name -> {what} (one buffer: {{"name": buffer}}), got {type(value).__name__}')
    for k in value:
        _validate.instance(f"{name} key {k!r:.40}", k, str, "a str (a folder name in the archive)")
        if not k or not all(c.isalnum() or c in "_-" for c in k):
            raise ValueError(f"{name}: expected plain folder names (letters, digits, _ and -), got {k!r}")
    return value


def from_bytes(data: bytes, targets: dict[str, Any]) -> dict[str, Any]:
    """The buffers of a `to_bytes` archive, each restored with `restore(folder, targets[name])`.

    Only plain files and folders inside the archive are extracted (no links, no absolute or `..` paths).

    Raises:
      TypeError: `data` not bytes, `targets` not a dict of name -> target buffer or None (e.g. one buffer: pass
        `{"name": buffer}`), or a target not a jaxbuffers buffer (naming it).
      ValueError: a name that is not a plain folder name.
      CheckpointError: not such an archive, a member that is not a plain file or folder, a missing name, or
        `restore`'s errors (the message names the file).
    """
    _validate.instance("data", data, (bytes, bytearray, memoryview), "the bytes of a jaxbuffers.checkpoint.to_bytes archive")
    for name, target in _named_buffers("targets", targets, "target buffer or None").items():
        if target is not None:
            _entry(_sharded(target)[0], f"targets[{name!r}]")
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    except tarfile.TarError as e:
        raise CheckpointError(f"data: not a jaxbuffers checkpoint archive ({e})") from None
    with tempfile.TemporaryDirectory() as tmp, tar:
        for m in tar.getmembers():
            if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in Path(m.name).parts:
                raise CheckpointError(f"data: archive member {m.name!r} is not a plain file or folder inside the archive")
        tar.extractall(tmp, filter="data")
        missing = [n for n in targets if not (Path(tmp) / n).is_dir()]
        if missing:
            raise CheckpointError(f"data: the archive holds no checkpoint named {missing}")
        return {n: restore(Path(tmp) / n, t, progress=False) for n, t in targets.items()}


class BufferCheckpointHandler(ocp.AsyncCheckpointHandler):
    """Orbax `AsyncCheckpointHandler` of a jaxbuffers buffer: the `save` / `restore` format in the folder the orbax
    `Checkpointer` or `CheckpointManager` gives it (which provides the atomic commit). Used through `BufferSave` /
    `BufferRestore`. An asynchronous manager gets the snapshot of `save(..., blocking=False)`: the buffer may be
    donated once `CheckpointManager.save` has returned. With several processes every process saves and restores the
    item as `save` / `restore` do (a `ShardedBuffer`: each process its parts; any other buffer: one replicated buffer,
    checked the same on every process), and `finalize` on process 0 writes buffer.json and the manifest."""

    def __init__(self, progress: bool | None = None):
        self.progress = progress
        self._described: dict[str, dict] = {}  # several processes: buffer.json of each folder, until `finalize`

    def _write(self, directory, snapshot: _Snapshot) -> None:
        bar = _Progress(self.progress, "save buffer")
        try:
            _write(Path(directory), snapshot, bar)
        finally:
            bar.close()

    def _taken(self, directory, buffer: Any, copy: bool):
        """Take `buffer` now (with several processes: this process's parts, after the checks every process makes
        together); returns the write into `directory`."""
        _compiled.check_not_deleted("BufferSave", [buffer])
        if not _processes.several():
            return functools.partial(self._write, directory, _snapshot(buffer))
        meta, tree = _processes.parts(buffer, _store_snapshot, _snapshot, copy)
        if jax.process_index() == 0:  # orbax finalizes on process 0 alone, once every process has written
            self._described[str(directory)] = meta
        return functools.partial(_processes.write_parts, Path(directory), tree, not isinstance(buffer, ShardedBuffer))

    def save(self, directory, args: "BufferSave") -> None:
        """Write `args.buffer` into `directory` (several processes: each its parts; module doc)."""
        self._taken(directory, args.buffer, copy=False)()

    async def async_save(self, directory, args: "BufferSave") -> list:
        """Snapshot `args.buffer` now; the returned orbax future writes it into `directory` in a background thread
        once orbax has created that folder."""
        write_now = self._taken(directory, args.buffer, copy=True)

        async def write():
            await asyncio.to_thread(write_now)

        return [ocp.future.CommitFutureAwaitingContractedSignals(write(), name="jaxbuffers_buffer_save")]

    def restore(self, directory, args: "BufferRestore | None" = None) -> Any:
        """The buffer in `directory` (`restore`'s arguments from `args`)."""
        args = args or BufferRestore()
        if args.target is not None:
            _entry(_sharded(args.target)[0], "target")
        bar = _Progress(self.progress, "restore buffer")
        try:
            return _read(Path(directory), args.target, args.sharding, bar)
        finally:
            bar.close()

    def metadata(self, directory) -> dict:
        """The parsed buffer.json: class, configuration, stack shape, leaves."""
        return _read_json(Path(directory) / "buffer.json", "buffer description")

    def finalize(self, directory) -> None:
        """One process: nothing to do (the write ends with every file synced and the manifest last). Several
        processes: orbax calls it on process 0 once every process has written its parts; it writes buffer.json and
        the manifest of every process's files."""
        meta = self._described.pop(str(directory), None)
        if meta is not None:
            (Path(directory) / "buffer.json").write_text(json.dumps(meta))
            bar = _Progress(self.progress, "save buffer")
            try:
                _write_manifest(Path(directory), bar)
            finally:
                bar.close()

    def close(self) -> None:
        """Nothing to release."""


@ocp.args.register_with_handler(BufferCheckpointHandler, for_save=True)
@dataclasses.dataclass
class BufferSave(ocp.args.CheckpointArgs):
    """Orbax save arguments of a buffer item: `ocp.args.Composite(..., buffer=BufferSave(buffer))`."""

    buffer: Any


@ocp.args.register_with_handler(BufferCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class BufferRestore(ocp.args.CheckpointArgs):
    """Orbax restore arguments of a buffer item (`restore`'s `target` and `sharding`)."""

    target: Any = None
    sharding: Any = None