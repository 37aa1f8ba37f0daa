"""A checkpoint of a `ShardedBuffer` written and read by several processes (`jax.distributed`).

Every process calls `save` / `restore` with the same folder, on a file system they all see. The folder has the format
of one process's checkpoint (`jaxbuffers.checkpoint`), written together:

* Host stores (compressed buffers): each process exports the stores of its own shards and packs each shard's
  arrays into one byte row; the metadata (shapes, dtypes, row lengths) and any export error (a stale state) are
  gathered on every process (an all-gather of JSON bytes): an error is raised by every process, before anything is
  written.
* Process 0 checks the folder, makes the temporary sibling and sends its name to the others (a broadcast).
* One orbax save by every process: the buffer's leaves (global arrays `[S, ...]` split along the mesh axis) and the
  host rows as one global uint8 array `[S, longest row]` (zero-padded) split the same way, so each process writes the
  parts its devices hold. (orbax writes a numpy array only from process 0, and refuses an array that one process
  holds whole: hence the byte rows.)
* Process 0 then writes `buffer.json` and the manifest (checksums of every process's files) and renames the folder
  into place: one commit. The others wait for its result and raise if it failed.

`restore` reads the device arrays with the target's shardings (each process reads its parts) and each process loads
the host stores of its own shards from their rows; a checkpoint saved by one process restores in several (each
process then reads every shard's host arrays and loads its own), and the other way round.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxbuffers._checkpoint_describe import _COMPRESSED, CheckpointError, _describe, _dtype, _nbytes
from jaxbuffers._checkpoint_files import _clean_stale, _commit, _is_checkpoint, _sibling, _write_manifest
from jaxbuffers.compressed._host import StaleBufferError
from jaxbuffers.sharding import _local_rows

_NAME_BYTES = 512  # the broadcast temporary folder name, utf-8, zero-padded


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
    """Process 0's `text` on every process."""
    data = np.zeros(_NAME_BYTES, np.uint8)
    raw = text.encode()[:_NAME_BYTES]
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


def _exported(buffer: Any, snapshot) -> tuple[dict, list]:
    """This process's shards of a sharded compressed buffer exported (`snapshot(host, version)`:
    `jaxbuffers.checkpoint._store_snapshot`) as byte rows (`_pack`), `{s: row}`, and every shard's metadata, gathered
    from every process together with their errors: a process whose export fails raises its error, the others a
    RuntimeError naming it, before anything is written."""
    rows, metas, error = {}, {}, None
    try:
        for s, v in _local_rows(buffer.version).items():
            m, a = snapshot(buffer.host.shards[s], int(v))
            m["slot_version_length"] = int(a["slot_version"].shape[0])
            rows[s] = _pack(a, m)
            metas[str(s)] = {**m, "bytes": int(rows[s].size)}
    except (StaleBufferError, RuntimeError) as e:
        error = e
    parts = _allgathered({"error": None if error is None else f"{type(error).__name__}: {error}", "shards": metas})
    if error is not None:
        raise error
    for p, part in enumerate(parts):
        if part["error"]:
            raise RuntimeError(f"save: process {p} could not export its host stores ({part['error']}); nothing was written")
        metas.update(part["shards"])
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


def save(path: Path, sharded: Any, progress, snapshot) -> Path:
    """`jaxbuffers.save` of a `ShardedBuffer` by every process (module doc); returns the folder once committed.

    Raises:
      FileExistsError: `path` exists and is not a checkpoint (on every process; nothing is deleted).
      RuntimeError: another process failed to write or commit (its own error says why).
    """
    meta = _describe(sharded)
    buffer = sharded.shards
    compressed = isinstance(buffer, _COMPRESSED)
    rows, shards = _exported(buffer, snapshot) if compressed else ({}, [])
    name = ""
    if jax.process_index() == 0:
        if not (path.exists() and not (_is_checkpoint(path) or (path.is_dir() and not any(path.iterdir())))):
            path.parent.mkdir(parents=True, exist_ok=True)
            _clean_stale(path)
            tmp = _sibling(path, "tmp")
            (tmp / "arrays").mkdir(parents=True)
            name = tmp.name
    name = _broadcast_text(name)
    if not name:
        raise FileExistsError(f"directory: {path} exists and is not a jaxbuffers checkpoint; refusing to replace it")
    tmp = path.parent / name
    meta["host"] = {"axis": buffer.host.axis, "layout": "stacked", "shards": shards} if compressed else None
    host = _host_tree(buffer, NamedSharding(sharded.mesh, P(sharded.axis)), rows, shards) if compressed else {}
    leaves = jax.tree.leaves(buffer)
    tree = {"device": {str(i): x for i, x in enumerate(leaves) if x.size}, "host": host}
    progress.reset(total=2 * _nbytes(tree))
    handler = ocp.PyTreeCheckpointHandler(use_compression=False, use_ocdbt=False)
    try:
        handler.save(epath.Path(tmp / "arrays"), args=ocp.args.PyTreeSave(tree))  # every process its parts
    finally:
        handler.close()
    multihost_utils.sync_global_devices(f"jaxbuffers save {name}")
    error = ""
    if jax.process_index() == 0:  # one commit
        try:
            (tmp / "buffer.json").write_text(json.dumps(meta))
            _write_manifest(tmp, progress)
            _commit(tmp, path)
        except BaseException as e:  # noqa: BLE001 - told to the others, then raised here
            shutil.rmtree(tmp, ignore_errors=True)
            _broadcast_text(f"{type(e).__name__}: {e}" or "error")
            raise
    error = _broadcast_text(error)
    if error:
        raise RuntimeError(f"save: process 0 could not commit {path}: {error}")
    return path


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
    shardings)` after every check; `read(root, restore_args, leaves)` reads the arrays; `host_args(meta)` gives the
    one-process restore arguments of host arrays; `load_host(host, version, meta, arrays, what)` fills a fresh store;
    `upgraded(buffer, host_meta)` takes an older layout's state and host metadata to this one's."""
    meta, leaves, treedef, shardings = checked(root, target.shards)
    host_meta = meta.get("host")
    args: dict = {"device": {str(i): ocp.ArrayRestoreArgs(sharding=s, global_shape=x.shape, dtype=x.dtype)
                             for i, (x, s) in enumerate(zip(leaves, shardings)) if x.size}, "host": {}}
    if host_meta is not None and host_meta.get("layout") == "stacked":  # each process reads its shards' rows
        args["host"] = {"bytes": ocp.ArrayRestoreArgs(sharding=NamedSharding(target.mesh, P(target.axis)))}
    elif host_meta is not None:  # saved by one process: each reads every shard's entries and loads its own
        args["host"] = host_args(host_meta)
    out = read(root, args, leaves)
    arrays = [out["device"][str(i)] if x.size else zeros(x, s) for i, (x, s) in enumerate(zip(leaves, shardings))]
    for i, (a, x) in enumerate(zip(arrays, leaves)):
        if a.shape != x.shape or a.dtype != x.dtype:
            raise CheckpointError(f"{root / 'arrays'}: array {i} ({meta['leaves'][i]['path']}) came back as {a.shape} {a.dtype}, expected {x.shape} {x.dtype}")
    buffer = jax.tree.unflatten(treedef, [_copy(a) for a in arrays])  # memory XLA owns: a donation updates it in place
    buffer, host_meta = upgraded(buffer, host_meta)
    if host_meta is not None:
        host_out = {"bytes": _local_rows(out["host"]["bytes"])} if "bytes" in out["host"] else out["host"]
        for s, v in _local_rows(buffer.version).items():
            load_host(buffer.host.shards[s], int(v), host_meta["shards"][s], shard_arrays(host_out, host_meta, s), f"{root} (shard {s})")
    return target.replace(shards=buffer)


_copy = jax.jit(jnp.copy)
