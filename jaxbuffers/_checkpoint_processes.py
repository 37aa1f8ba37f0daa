"""A checkpoint written and read by several processes (`jax.distributed`).

Every process calls `save` / `restore` with the same folder, on a file system they all see. The folder has the format
of one process's checkpoint (`jaxbuffers.checkpoint`), written together. What each process gives:

* A `ShardedBuffer`: the parts its devices hold. Host stores (compressed buffers): each process exports the stores of
  its own shards and packs each shard's arrays into one byte row; the buffer's leaves (global arrays `[S, ...]` split
  along the mesh axis) and the host rows as one global uint8 array `[S, longest row]` (zero-padded) split the same
  way are written by orbax, each process its parts. (orbax writes a numpy array only from process 0, and refuses an
  array that one process holds whole: hence the byte rows.)
* Any other buffer: one buffer that every process holds whole (replicated: each process ran the same adds). Each
  process takes it to host memory and hashes every array; the hashes are compared across processes and a buffer
  that differs is refused by every process, naming the array (its data would otherwise be lost: process 0 alone
  writes it). A buffer of each process's own data is a `ShardedBuffer` whose shards are each process's rows.

Errors met while taking the buffer (a stale compressed state, a closed store, a differing replica) are gathered on
every process (an all-gather of JSON bytes) and raised by every process before anything is written. Process 0 then
checks the folder, makes the temporary sibling and sends its name to the others (a broadcast).

The write and the commit go through the key-value store and barriers of the `jax.distributed` client (no device
collective, so they may run in a background thread: `save(..., blocking=False)`): each process writes its parts and
posts its status, all meet at a barrier, and process 0 writes `buffer.json` and the manifest (checksums of every
process's files) and renames the folder into place only if every process wrote its parts; it posts the result, which
every process raises if the save failed. Nothing is committed unless every process finished (a process that has
not written its parts within an hour of the others, e.g. one that died, makes them raise).

`restore` of a `ShardedBuffer` reads the device arrays with the target's shardings (each process reads its parts) and
each process loads the host stores of its own shards from their rows; a checkpoint saved by one process restores in
several (each process then reads every shard's host arrays and loads its own), and the other way round. Any other
buffer is read whole by each process, independently, onto its own devices.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import xxhash
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxbuffers import _checkpoint_zarr as _zarr
from jaxbuffers._checkpoint_describe import (
    _COMPRESSED, CheckpointError, _check_meta_defaults, _checked_cursors, _describe, _dtype, _nbytes,
)
from jaxbuffers._checkpoint_files import _check_destination, _clean_stale, _commit, _sibling, _write_manifest
from jaxbuffers._validate import processes as _replicas
from jaxbuffers.sharding import ShardedBuffer, _local_rows

_NAME_BYTES = 512  # the broadcast temporary folder name (or process 0's refusal), utf-8, zero-padded
_REFUSALS = {e.__name__: e for e in (FileExistsError, NotADirectoryError, ValueError)}  # `_check_destination`'s
_WAIT_MS = 3_600_000  # how long a process waits for the others' writes and for process 0's commit


def several() -> bool:
    """Whether JAX runs in several processes."""
    return jax.process_count() > 1


def _allgathered(obj: Any) -> list:
    """`obj` (JSON) of every process, in process order."""
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int32(data.size))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [json.loads(rows[p, : sizes[p]].tobytes()) for p in range(len(sizes))]


def _broadcast_text(text: str) -> str:
    """Process 0's `text` on every process, its utf-8 cut to `_NAME_BYTES` at a character boundary."""
    data = np.zeros(_NAME_BYTES, np.uint8)
    raw = text.encode()[:_NAME_BYTES].decode(errors="ignore").encode()  # "ignore": only a character cut in two
    data[: len(raw)] = np.frombuffer(raw, np.uint8)
    return np.asarray(multihost_utils.broadcast_one_to_all(data)).tobytes().rstrip(b"\0").decode()


def _pack(arrays: dict, meta: dict) -> np.ndarray:
    """A shard's exported host arrays as one byte row: every store's arrays in the order of its metadata, then
    `slot_version` (their shapes and dtypes are in the metadata: no dtype is narrowed on the way)."""
    parts = [np.ascontiguousarray(arrays["stores"][i][k]) for i, keys in meta["arrays"].items() for k in keys]
    return np.concatenate([p.reshape(-1).view(np.uint8) for p in [*parts, np.ascontiguousarray(arrays["slot_version"])]])


def unpack(row: np.ndarray, meta: dict) -> dict:
    """The exported host arrays of a byte row (`_pack`), as `jaxbuffers.checkpoint._load_host` takes them.

    Raises:
      CheckpointError: a row shorter than the arrays its metadata describes.
    """
    out: dict = {"stores": {}}
    at = 0
    specs = [(i, k, shp, _dtype(d, k)) for i, keys in meta["arrays"].items() for k, (shp, d) in keys.items()]
    for i, k, shp, dtype in [*specs, (None, "slot_version", [meta["slot_version_length"]], np.dtype(np.int32))]:
        n = int(np.prod(shp)) * dtype.itemsize
        if at + n > row.size:
            raise CheckpointError(f"host store bytes: a row of {row.size} bytes, its metadata describes more ({k} at {at} + {n})")
        a = row[at : at + n].view(dtype).reshape(shp)
        at += n
        if i is None:
            out["slot_version"] = a
        else:
            out["stores"].setdefault(i, {})[k] = a
    return out


def _collected(error: BaseException | None, mine: Any, what: str) -> list:
    """Every process's `mine` (JSON), in process order, once no process met an error: a process whose `error` is set
    raises it, the others a RuntimeError naming that process and `what` it could not do (an all-gather: every process
    calls this at the same point)."""
    parts = _allgathered({"error": None if error is None else f"{type(error).__name__}: {error}", "value": mine})
    if error is not None:
        raise error
    for p, part in enumerate(parts):
        if part["error"]:
            raise RuntimeError(f"save: process {p} could not {what} ({part['error']}); nothing was written")
    return [part["value"] for part in parts]


def _exported(buffer: Any, snapshot) -> tuple[dict, list]:
    """This process's shards of a sharded compressed buffer exported (`snapshot(host, version)`:
    `jaxbuffers._checkpoint_snapshot.store_snapshot`) as byte rows (`_pack`), `{s: row}`, and every shard's metadata, gathered
    from every process together with their errors (`_collected`), before anything is written."""
    rows, metas, error = {}, {}, None
    try:
        for s, v in _local_rows(buffer.version).items():
            m, a = snapshot(buffer.host.shards[s], int(v))
            m["slot_version_length"] = int(a["slot_version"].shape[0])
            rows[s] = _pack(a, m)
            metas[str(s)] = {**m, "bytes": int(rows[s].size)}
    except Exception as e:  # noqa: BLE001 - raised below by every process
        error = e
    for part in _collected(error, metas, "export its host stores"):
        metas.update(part)
    return rows, [metas[str(s)] for s in range(len(buffer.host.shards))]  # every shard is on some process's devices


def _host_tree(buffer: Any, sharding, rows: dict, shards: list) -> dict:
    """The host array of a sharded compressed buffer: the shards' byte rows (`_exported`) as one global uint8 array
    `[S, longest row]` (zero-padded) split as `sharding`, each process giving its own rows."""
    shape = (len(shards), max(m["bytes"] for m in shards))

    def part(index):  # this process's rows, zero-padded
        picked = range(*index[0].indices(shape[0]))
        out = np.zeros((len(picked), shape[1]), np.uint8)
        for j, s in enumerate(picked):
            out[j, : rows[s].size] = rows[s]
        return out[:, index[1]]

    return {"bytes": jax.make_array_from_callback(shape, sharding, part)}


def _hashes(tree: dict) -> dict[str, str]:
    """xxh3-64 of every array of a snapshot's tree, by its path."""
    return {jax.tree_util.keystr(k): xxhash.xxh3_64(np.ascontiguousarray(x).view(np.uint8)).hexdigest()
            for k, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _replicated(buffer: Any, snapshot) -> tuple[dict, dict]:
    """(buffer.json, arrays as numpy) of a buffer every process holds whole (`snapshot`: `jaxbuffers._checkpoint_snapshot`'s),
    after checking that every process holds the same (module doc).

    Raises:
      ValueError: an array (or the description) that differs between processes, naming it (on every process).
    """
    error, meta, tree, hashes = None, None, None, None
    try:
        meta, tree = snapshot(buffer).done()
        tree = jax.tree.map(lambda x: _zarr.stored(np.asarray(x)), tree)
        hashes = {"buffer.json": xxhash.xxh3_64(json.dumps(meta, sort_keys=True).encode()).hexdigest(), **_hashes(tree)}
    except Exception as e:  # noqa: BLE001 - raised below by every process
        error = e
    every = _collected(error, hashes, "take its buffer to host memory")
    _replicas.same_on_every_process(hashes, every, jax.process_index())
    return meta, tree


def parts(buffer: Any, store_snapshot, snapshot, copy: bool) -> tuple[dict, dict]:
    """(buffer.json, what this process gives orbax) of `buffer` (module doc), after every check and gathered error.
    `copy`: copy the device arrays of a `ShardedBuffer` (on their devices), so that the buffer may be donated while
    they are written."""
    if not isinstance(buffer, ShardedBuffer):
        return _replicated(buffer, snapshot)
    meta = _describe(buffer)
    shards = buffer.shards
    compressed = isinstance(shards, _COMPRESSED)
    rows, exported = _exported(shards, store_snapshot) if compressed else ({}, [])
    meta["host"] = {"axis": shards.host.axis, "layout": "stacked", "shards": exported} if compressed else None
    host = _host_tree(shards, NamedSharding(buffer.mesh, P(buffer.axis)), rows, exported) if compressed else {}
    leaves = [x for x in jax.tree.leaves(shards) if x.size]
    leaves = [_zarr.stored(x) for x in (_copy_all(leaves) if copy else leaves)]
    device, it = {}, iter(leaves)
    for i, x in enumerate(jax.tree.leaves(shards)):
        if x.size:
            device[str(i)] = next(it)
    return meta, {"device": device, "host": host}


def write_parts(root: Path, tree: dict, replicated: bool) -> None:
    """This process's parts of `tree` into `root / "arrays"` (orbax; a replicated buffer's numpy arrays by process 0)."""
    if replicated and jax.process_index() != 0:
        return
    (root / "arrays").mkdir(parents=True, exist_ok=True)
    handler = ocp.PyTreeCheckpointHandler(use_compression=False, use_ocdbt=False)
    try:
        handler.save(epath.Path(root / "arrays"), args=ocp.args.PyTreeSave(tree))
    finally:
        handler.close()


def save(path: Path, buffer: Any, store_snapshot, snapshot, copy: bool) -> Callable[[Any], Path]:
    """`jaxbuffers.save` by every process (module doc): every check, gathered error and the temporary folder now, on
    every process; returns `finish(progress)`, which writes this process's parts and commits with the others (no
    device collective: it may run in a background thread) and returns the folder once committed.

    Raises:
      FileExistsError, NotADirectoryError, ValueError: `_checkpoint_files._check_destination`'s refusals of `path` (on
        every process; nothing is created or deleted).
      ValueError: a non-sharded buffer that differs between processes. Errors of taking the buffer (on the process
        that met them; a RuntimeError naming that process on the others). `finish` raises RuntimeError when any
        process failed to write its parts or process 0 to commit: nothing is committed then.
    """
    meta, tree = parts(buffer, store_snapshot, snapshot, copy)
    name, error = "", None
    if jax.process_index() == 0:
        try:
            _check_destination(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            _clean_stale(path)
            tmp = _sibling(path, "tmp")
            (tmp / "arrays").mkdir(parents=True)
            name = tmp.name
        except (OSError, ValueError) as e:
            error, name = e, f"{type(e).__name__}: {e}"  # not a folder name (those start with '.'): the others raise it
    name = _broadcast_text(name)
    if error is not None:
        raise error
    if not name.startswith("."):  # process 0's refusal, "Kind: message"
        kind, _, message = name.partition(": ")
        if kind in _REFUSALS:
            raise _REFUSALS[kind](message)
        raise RuntimeError(f"save: process 0 could not start the save ({name})")
    tmp, replicated = path.parent / name, not isinstance(buffer, ShardedBuffer)

    def finish(progress) -> Path:
        progress.reset(total=2 * _nbytes(tree))

        def commit() -> None:
            (tmp / "buffer.json").write_text(json.dumps(meta))
            _write_manifest(tmp, progress)
            _commit(tmp, path)

        _together(f"jaxbuffers-save/{name}", lambda: write_parts(tmp, tree, replicated), commit, tmp, f"save of {path}")
        return path

    return finish


def _together(key: str, write: Callable[[], None], commit: Callable[[], None], tmp: Path, what: str) -> None:
    """Every process runs `write`, posts its status under `key` and meets the others at a barrier; process 0 runs
    `commit` only if every process wrote, removes `tmp` otherwise, and posts the result, which every process raises.

    Raises:
      RuntimeError: naming each process that failed and its error (chained to this process's own error, if any).
    """
    client, pid, n, timeout = ocp.multihost.get_jax_distributed_client(), jax.process_index(), jax.process_count(), _WAIT_MS
    own = None
    try:
        write()
    except Exception as e:  # noqa: BLE001 - posted, then raised by every process
        own = e
    client.key_value_set(f"{key}/{pid}", "ok" if own is None else f"{type(own).__name__}: {own}")
    client.wait_at_barrier(f"{key}/written", timeout)
    if pid == 0:
        statuses = [client.blocking_key_value_get(f"{key}/{p}", timeout) for p in range(n)]
        result = "; ".join(f"process {p} could not write its parts ({v})" for p, v in enumerate(statuses) if v != "ok")
        if not result:
            try:
                commit()
            except Exception as e:  # noqa: BLE001 - posted, then raised by every process
                own, result = e, f"process 0 could not commit ({type(e).__name__}: {e})"
        if result:
            shutil.rmtree(tmp, ignore_errors=True)
        client.key_value_set(f"{key}/result", result or "ok")
    else:
        result = client.blocking_key_value_get(f"{key}/result", timeout)
    client.key_value_delete(f"{key}/{pid}")  # read by process 0 before it posted the result
    if result and result != "ok":
        raise RuntimeError(f"{what}: {result}; nothing was committed") from own


def zeros(x: jax.ShapeDtypeStruct, sharding) -> jax.Array:
    """An array of zeros of `x`'s shape and dtype on `sharding` (a global array: the empty leaves orbax does not keep)."""
    return jax.jit(lambda: jnp.zeros(x.shape, x.dtype), out_shardings=sharding)()


def shard_arrays(host_out: dict, host_meta: dict, s: int) -> dict:
    """Shard `s`'s exported host arrays from what orbax read: its byte row of the several-process layout (`bytes`:
    a numpy `[S, n]` array, or `{s: row}` of this process's rows), or its entry of the one-process layout."""
    if host_meta.get("layout") == "stacked":
        return unpack(np.asarray(host_out["bytes"][s]), host_meta["shards"][s])
    return host_out["shards"][str(s)]


def restore(root: Path, target: Any, checked, read, host_args, load_host, upgraded) -> Any:
    """`jaxbuffers.restore` into a `ShardedBuffer` `target` by every process (module doc), with the one-process
    restore's pieces (`jaxbuffers.checkpoint`): `checked(root, target)` gives `(meta, abstract leaves, treedef,
    shardings)` after every check; `read(root, restore_args, leaves)` reads the arrays; `host_args(meta, root)` gives the
    one-process restore arguments of host arrays; `load_host(host, version, meta, arrays, what)` fills a fresh store;
    `upgraded(buffer, meta)` takes an older layout's state (and its host metadata) to this one's."""
    meta, leaves, treedef, shardings = checked(root, target.shards)
    host_meta = meta.get("host")
    args: dict = {"device": {str(i): ocp.ArrayRestoreArgs(sharding=s, global_shape=x.shape, dtype=_zarr.stored_dtype(x.dtype))
                             for i, (x, s) in enumerate(zip(leaves, shardings)) if x.size}, "host": {}}
    if host_meta is not None and host_meta.get("layout") == "stacked":  # each process reads its shards' rows
        args["host"] = {"bytes": ocp.ArrayRestoreArgs(sharding=NamedSharding(target.mesh, P(target.axis)))}
    elif host_meta is not None:  # saved by one process: each reads every shard's entries and loads its own
        args["host"] = host_args(host_meta, root)
    out = read(root, args, leaves)
    arrays = [_zarr.loaded(out["device"][str(i)], x.dtype) if x.size else zeros(x, s) for i, (x, s) in enumerate(zip(leaves, shardings))]
    for i, (a, x) in enumerate(zip(arrays, leaves)):
        if a.shape != x.shape or a.dtype != x.dtype:
            raise CheckpointError(f"{root / 'arrays'}: array {i} ({meta['leaves'][i]['path']}) came back as {a.shape} {a.dtype}, expected {x.shape} {x.dtype}")
    _everywhere(lambda: _check_meta_defaults(target.shards, arrays, root, stacked=True, values=_local))
    buffer = jax.tree.unflatten(treedef, [_copy(a) for a in arrays])  # memory XLA owns: a donation updates it in place
    _everywhere(lambda: _checked_cursors(buffer, root, values=_local))  # cursors in range, on this process's rows
    buffer, host_meta = upgraded(buffer, meta)
    if host_meta is not None:
        host_out = {"bytes": _local_rows(out["host"]["bytes"])} if "bytes" in out["host"] else out["host"]
        for s, v in _local_rows(buffer.version).items():
            load_host(buffer.host.shards[s], int(v), host_meta["shards"][s], shard_arrays(host_out, host_meta, s), f"{root} (shard {s})")
    return target.replace(shards=buffer)


def _local(x: Any) -> np.ndarray:
    """The rows of a stacked leaf this process holds, stacked in shard order (a host value as it is)."""
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    rows = [r for _, r in sorted(_local_rows(x).items())]
    return np.stack(rows) if rows else np.zeros((0, *x.shape[1:]), x.dtype)  # a process holding no rows


def _everywhere(check: Callable[[], Any]) -> None:
    """Run `check` (a check of the rows this process holds) on every process; every process raises the
    CheckpointError any process met (an all-gather)."""
    error = None
    try:
        check()
    except CheckpointError as e:
        error = e
    messages = _allgathered(None if error is None else str(error))
    if error is not None:
        raise error
    if any(messages):
        raise CheckpointError(next(m for m in messages if m))


_copy = jax.jit(jnp.copy)
_copy_all = jax.jit(lambda xs: [jnp.copy(x) for x in xs])  # keeps each array's sharding
