"""Save and restore every buffer exactly: `save`, `restore`, and the orbax `BufferSave` / `BufferRestore` arguments.

A restored buffer is the saved one bit for bit: the same key samples the same batch, and adding continues from the
same head. It is rebuilt from its class's own `create` with the saved arguments (never unpickled), its arrays come
back as JAX arrays on the requested sharding, and donating it updates it in place.

Checkpoint format (a folder, format version `FORMAT_VERSION`):

```
buffer.json      {"format": "jaxbuffers.checkpoint", "version": 1, "class": "ReplayBuffer",
                  "config": create's arguments ("example": the example's tree of [shape, dtype]),
                  "stack_shape": leading axes of a stacked (vmapped) buffer,
                  "leaves": [{"path", "shape", "dtype"}, ...] every array of the buffer, in pytree order,
                  "host": host-store metadata of a compressed buffer, else null}
arrays/          an orbax-checkpoint PyTree checkpoint (tensorstore) of
                  {"device": {"0": leaf 0, ...}, "host": {"stores": {"0": {"chunk", "offset", ..., "payload"}, ...},
                   "slot_version": ...}}: the buffer's arrays, and for a compressed buffer its host stores
                  (`host_codecs.CompressedStore.export_state`: index columns, packed payloads, zstd dictionary)
manifest.json    {"format", "version", "files": {relative path: {"bytes", "xxh3_64"}}}, written last
```

Safety:

* No pickle: metadata is JSON, arrays are tensorstore files read by orbax; the class comes from a fixed table of
  jaxbuffers classes and dtypes from a fixed list of numeric dtypes. A crafted checkpoint cannot run code.
* Every file is checked against the manifest (size and xxh3-64) before anything is read from it; a mismatch raises
  `CheckpointError` naming the file.
* `save` writes into a temporary sibling folder and renames it into place; a crash at any point leaves the previous
  checkpoint whole (between the two renames it is the sibling `.<name>.prev`, which `restore` falls back to).
* A checkpoint of another class, configuration, shape, dtype or format version raises `CheckpointError` before any
  array is allocated; the target buffer (if given) is never modified.

With an `orbax.checkpoint.CheckpointManager`, `BufferSave(buffer)` / `BufferRestore(target)` save the buffer as one
item of a step (`ocp.args.Composite(state=ocp.args.StandardSave(state), buffer=BufferSave(buffer))`), written by
`BufferCheckpointHandler` in the same format (the manager provides the atomic rename).
"""

from __future__ import annotations

import dataclasses
import io
import json
import mmap
import os
import shutil
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import xxhash
from etils import epath

from jaxbuffers import _validate
from jaxbuffers.compressed import (
    CompressedEpisodeBuffer, CompressedPrioritisedTrajectoryBuffer, CompressedRolloutBuffer, CompressedTrajectoryBuffer,
)
from jaxbuffers.compressed._host import StaleBufferError
from jaxbuffers.episode import EpisodeBuffer
from jaxbuffers.prioritised import PrioritisedReplayBuffer
from jaxbuffers.prioritised_trajectory import PrioritisedTrajectoryBuffer
from jaxbuffers.replay import ReplayBuffer
from jaxbuffers.rollout import RolloutBuffer
from jaxbuffers.trajectory import TrajectoryBuffer

__all__ = [
    "FORMAT_VERSION", "CheckpointError", "save", "restore", "to_bytes", "from_bytes", "BufferSave", "BufferRestore", "BufferCheckpointHandler",
]

FORMAT = "jaxbuffers.checkpoint"
FORMAT_VERSION = 1
_BLOCK = 64 << 20  # bytes hashed per read
_DTYPES = {
    jnp.dtype(d).name: jnp.dtype(d)
    for d in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "bfloat16", "float32", "float64", "complex64", "complex128")
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored here: missing, corrupt, of another format version, or of another
    buffer class, configuration, shape or dtype than asked for. The message names the file or field."""


# --- what each buffer class saves: its create arguments, and the leaf that is a scalar when not stacked ---

def _names(spec: Any, indices) -> list[str]:
    """Full leaf names (`_validate.leaf_name`) of the leaves number `indices` of `spec`: what `compress=` selects."""
    flat = jax.tree_util.tree_flatten_with_path(spec)[0]
    return [_validate.leaf_name(flat[i][0]) for i in indices]


def _metrics(b) -> dict:
    """`metrics=True` when the buffer keeps per-position sample counts (the default, False, is left out)."""
    return {"metrics": True} if b.metrics.per_slot else {}


def _replay(b) -> dict:
    return {"example": b.item_spec, "capacity": b.capacity, "min_size": b.min_size, **_metrics(b)}


def _prioritised(b) -> dict:
    return {**_replay(b.replay), "priority_exponent": b.priority_exponent, "epsilon": b.epsilon}


def _trajectory(b) -> dict:
    return {"example": b.step_spec, "num_envs": b.num_envs, "length": b.length, "final_obs_capacity": b.final_obs_capacity,
            "obs_key": b.obs_key, "action_key": b.action_key, "reward_key": b.reward_key, **_metrics(b)}


def _priorities(b) -> dict:
    return {"window_length": b.window_length, "period": b.period, "priority_exponent": b.priority_exponent, "epsilon": b.epsilon}


def _prioritised_trajectory(b) -> dict:
    return {**_trajectory(b.buffer), **_priorities(b)}


def _episode(b) -> dict:
    return {"example": b.step_spec, "max_episodes": b.max_episodes, "max_timesteps": b.max_timesteps, "meta": b.meta_spec,
            "circular": b.circular, "obs_key": b.obs_key, "action_key": b.action_key, "reward_key": b.reward_key,
            **_metrics(b)}


def _rollout(b) -> dict:
    return {"example": b.step_spec, "num_envs": b.num_envs, "num_steps": b.num_steps, "float_dtype": b.float_dtype.name}


def _host(b, spec) -> dict:
    store = b.host.stores[0].config()
    return {"compress": _names(spec, b.leaf_index), "codec": b.host.codec, "normalize_images": b.normalize_images,
            "chunk_bytes": store["chunk_bytes"], "dictionary_bytes": store["dictionary_bytes"]}


def _frames(b, rollout: bool = False) -> dict:
    """The frame-dedup arguments of a compressed buffer's `create` (a rollout takes no `padding`)."""
    stacked = b.leaves[0].stack_axis is not None
    out = {"frame_stack": b.frame_stack if stacked else None, "stack_axis": b.leaves[0].stack_axis if stacked else 0}
    return out if rollout else {**out, "padding": b.padding}


def _compressed_trajectory(b) -> dict:
    t = b.trajectory
    out = {**_trajectory(t), "example": b.step_spec, **_host(b, b.step_spec[t.obs_key]), **_frames(b),
           "keyframe_interval": b.keyframe_interval}
    return {**out, **_priorities(b.buffer)} if isinstance(b.buffer, PrioritisedTrajectoryBuffer) else out


def _compressed_episode(b) -> dict:
    return {**_episode(b.buffer), "example": b.step_spec, **_host(b, b.step_spec[b.obs_key]), **_frames(b)}


def _compressed_rollout(b) -> dict:
    return {**_rollout(b.buffer), "example": b.step_spec, **_host(b, b.step_spec), **_frames(b, rollout=True)}


#: class name -> (class, create arguments of a buffer, its leaf that is a scalar in an unstacked buffer)
_CLASSES = {
    c.__name__: (c, config, scalar)
    for c, config, scalar in (
        (ReplayBuffer, _replay, lambda b: b.head),
        (PrioritisedReplayBuffer, _prioritised, lambda b: b.replay.head),
        (TrajectoryBuffer, _trajectory, lambda b: b.head),
        (PrioritisedTrajectoryBuffer, _prioritised_trajectory, lambda b: b.buffer.head),
        (RolloutBuffer, _rollout, lambda b: b.step_index),
        (EpisodeBuffer, _episode, lambda b: b.head),
        (CompressedTrajectoryBuffer, _compressed_trajectory, lambda b: b.version),
        (CompressedPrioritisedTrajectoryBuffer, _compressed_trajectory, lambda b: b.version),
        (CompressedRolloutBuffer, _compressed_rollout, lambda b: b.version),
        (CompressedEpisodeBuffer, _compressed_episode, lambda b: b.version),
    )
}
_COMPRESSED = (CompressedTrajectoryBuffer, CompressedRolloutBuffer, CompressedEpisodeBuffer)


# --- JSON encoding of the example's tree (dicts, lists, tuples, None and arrays only) ---

def _encode(tree: Any) -> Any:
    if isinstance(tree, dict) and all(isinstance(k, str) for k in tree):
        return {"dict": [[k, _encode(v)] for k, v in tree.items()]}
    if type(tree) in (list, tuple):
        return {type(tree).__name__: [_encode(v) for v in tree]}
    if tree is None:
        return {"none": None}
    if hasattr(tree, "shape") and hasattr(tree, "dtype"):
        return {"array": [list(tree.shape), jnp.dtype(tree.dtype).name]}
    raise TypeError(f"{type(tree).__name__} nodes are not stored in buffer.json")


def _dtype(name: Any, what: str) -> np.dtype:
    if name not in _DTYPES:
        raise CheckpointError(f"{what}: expected a numeric dtype name, got {name!r}")
    return _DTYPES[name]


def _decode(obj: Any, what: str = "config.example") -> Any:
    if not isinstance(obj, dict) or len(obj) != 1:
        raise CheckpointError(f"{what}: malformed tree node {obj!r:.80}")
    (kind, v), = obj.items()
    if kind == "dict":
        return {k: _decode(x, f"{what}[{k!r}]") for k, x in v}
    if kind in ("list", "tuple"):
        items = [_decode(x, f"{what}[{i}]") for i, x in enumerate(v)]
        return items if kind == "list" else tuple(items)
    if kind == "none":
        return None
    if kind == "array":
        return jax.ShapeDtypeStruct(tuple(int(s) for s in v[0]), _dtype(v[1], what))
    raise CheckpointError(f"{what}: unknown tree node kind {kind!r}")


_SPECS = ("meta",)  # config fields besides the example that are trees of array specs (`EpisodeBuffer`'s meta fields)


def _json_config(config: dict) -> dict:
    """`config` with its example encoded (None when it has nodes JSON cannot describe: restore then needs a target)
    and its other spec trees (`_SPECS`) encoded."""
    try:
        example = _encode(config["example"])
    except TypeError:
        example = None
    return {**config, **{k: _encode(config[k]) for k in _SPECS if k in config}, "example": example}


# --- describing a buffer ---

def _entry(buffer: Any, what: str = "buffer") -> tuple[str, type, Any, tuple[int, ...]]:
    """(class name, class, config function, stack shape) of a buffer, or TypeError naming the argument `what`."""
    entry = _CLASSES.get(type(buffer).__name__)
    if entry is None or entry[0] is not type(buffer):
        raise TypeError(f"{what}: expected one of the jaxbuffers buffers {sorted(_CLASSES)}, got {type(buffer).__name__}")
    cls, config, scalar = entry
    return type(buffer).__name__, cls, config, tuple(np.shape(scalar(buffer)))


def _unstacked(buffer: Any, stack: tuple[int, ...]) -> Any:
    k = len(stack)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[k:], x.dtype), buffer)


def _leaves(tree: Any) -> tuple[list, list[dict]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [x for _, x in flat], [
        {"path": _validate.leaf_name(p), "shape": list(np.shape(x)), "dtype": jnp.dtype(x.dtype).name} for p, x in flat
    ]


def _describe(buffer: Any) -> dict:
    name, _, config, stack = _entry(buffer)
    if getattr(getattr(buffer, "host", None), "directory", None) is not None:  # jaxbuffers.disk.DiskStores
        raise TypeError(f"buffer: a disk-backed {name} is its folder {buffer.host.directory}; jaxbuffers.disk.flush it and copy the folder")
    if stack and isinstance(buffer, _COMPRESSED):
        raise TypeError(f"buffer: a {name} cannot be stacked (one host store)")
    cfg = config(_unstacked(buffer, stack))
    return {"format": FORMAT, "version": FORMAT_VERSION, "class": name, "config": _json_config(cfg),
            "stack_shape": list(stack), "leaves": _leaves(buffer)[1]}


def _host_snapshot(buffer: Any) -> tuple[dict | None, dict]:
    """Host metadata and arrays of a compressed buffer (None, {} otherwise)."""
    if not isinstance(buffer, _COMPRESSED):
        return None, {}
    host = buffer.host
    host._check_open("save")
    version = int(buffer.version)  # before the lock: the write that produces it takes the lock
    with host._lock:
        if version != host.version:
            raise StaleBufferError(
                f"save: this buffer state has version {version} but its host store is at version "
                f"{host.version}; save the state returned by the last add"
            )
        exported = [s.export_state() for s in host.stores]
        meta = {"version": host.version, "num_writes": host.num_writes, "num_rows": host.num_rows,
                "stores": [m for m, _ in exported]}
        arrays = {"stores": {str(i): a for i, (_, a) in enumerate(exported)}, "slot_version": host.slot_version.copy()}
    return meta, arrays


# --- files: checksums, the manifest, the atomic folder swap ---

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


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(root: Path, progress) -> None:
    files = {}
    for p in _files(root):
        files[p.relative_to(root).as_posix()] = {"bytes": p.stat().st_size, "xxh3_64": _hash_file(p, progress)}
        _fsync(p)
    (root / "manifest.json").write_text(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "files": files}))
    _fsync(root / "manifest.json")


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


def _verify(root: Path, progress) -> None:
    """Check every file of the checkpoint against its manifest (sizes first, then xxh3-64)."""
    manifest = _read_json(root / "manifest.json", "checkpoint manifest")
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise CheckpointError(f"{root / 'manifest.json'}: no file list")
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
    for rel, info in listed.items():
        if _hash_file(root / rel, progress) != info["xxh3_64"]:
            raise CheckpointError(f"{root / rel}: checksum mismatch (xxh3_64 differs from the manifest): the file is corrupt")


def _is_checkpoint(path: Path) -> bool:
    return (path / "manifest.json").is_file() or (path / "buffer.json").is_file()


def _prev(path: Path) -> Path:
    return path.parent / f".{path.name}.prev"


def _clean_stale(path: Path) -> None:
    """Remove temporary folders of saves to `path` whose process is gone (a crash mid-save)."""
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        pid = tmp.name.rsplit(".tmp-", 1)[1].split("-")[0]
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


# --- writing and reading one checkpoint folder ---

def _nbytes(tree: Any) -> int:
    return sum(int(np.prod(np.shape(x))) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _array_tree(leaves: list, host_arrays: dict) -> dict:
    """What orbax writes: non-empty arrays only (an empty array's shape and dtype are in buffer.json)."""
    device = {str(i): x for i, x in enumerate(leaves) if np.size(x)}
    host = {"stores": {i: {k: a for k, a in s.items() if a.size} for i, s in host_arrays.get("stores", {}).items()}}
    if "slot_version" in host_arrays:
        host["slot_version"] = host_arrays["slot_version"]
    return {"device": device, "host": host}


def _write(root: Path, buffer: Any, progress: _Progress, host: bool = True) -> None:
    """Write `buffer` into the existing empty folder `root` (not atomic: `save` and the orbax manager make it so);
    `host=False` leaves a compressed buffer's host stores out (`jaxbuffers.disk` keeps them in files of their own)."""
    meta = _describe(buffer)
    host_meta, host_arrays = _host_snapshot(buffer) if host else (None, {})
    if host_meta is not None:
        host_meta["arrays"] = {i: {k: [list(a.shape), a.dtype.name] for k, a in s.items()} for i, s in host_arrays["stores"].items()}
    meta["host"] = host_meta
    leaves = jax.tree.leaves(buffer)
    tree = _array_tree(leaves, host_arrays)
    progress.reset(total=2 * _nbytes(tree))
    handler = ocp.PyTreeCheckpointHandler(use_compression=False, use_ocdbt=False)
    arrays = epath.Path(root / "arrays")
    arrays.mkdir()
    handler.save(arrays, args=ocp.args.PyTreeSave(tree))  # one chunk per array: chunked arrays restored ~3x slower
    if jax.process_count() > 1:  # cross-host metadata checks; one process has nothing to finalize
        handler.finalize(arrays)
    handler.close()
    progress.update(_nbytes(tree))
    (root / "buffer.json").write_text(json.dumps(meta))
    _write_manifest(root, progress)


def _check_config(name: str, saved: dict, cfg: dict, what: str) -> None:
    if saved["class"] != name:
        raise CheckpointError(f"{what}: the checkpoint holds a {saved['class']}, the target is a {name}")
    ours = _json_config(cfg)
    for k in sorted(set(ours) | set(saved["config"])):
        a, b = saved["config"].get(k), ours.get(k)
        if a != b and not (k == "example" and a is None):
            raise CheckpointError(f"{what}: config {k!r} of the checkpoint is {a!r:.200}, the target's is {b!r:.200}")


def _template(meta: dict, target: Any, root: Path) -> tuple[Any, Any]:
    """(abstract buffer to restore into, concrete target shardings or None), after checking the target."""
    name = meta["class"]
    if name not in _CLASSES:
        raise CheckpointError(f"{root / 'buffer.json'}: class {name!r} is not a jaxbuffers buffer ({sorted(_CLASSES)})")
    cls, config, _ = _CLASSES[name]
    stack = tuple(int(s) for s in meta["stack_shape"])
    if target is not None:
        tname, _, tconfig, tstack = _entry(target)
        _check_config(tname, meta, tconfig(_unstacked(target, tstack)), f"{root}")
        if tstack != stack:
            raise CheckpointError(f"{root}: stack shape {stack} in the checkpoint, {tstack} in the target")
        if not isinstance(target, _COMPRESSED):  # a compressed buffer gets fresh host stores below
            return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), target), target
    cfg = dict(meta["config"])
    if cfg.get("example") is None:
        raise CheckpointError(f"{root}: the example of this {name} is not described in buffer.json; pass target=")
    example = _decode(cfg.pop("example"))
    for k in _SPECS:
        if k in cfg:
            cfg[k] = _decode(cfg[k], f"config.{k}")
    if isinstance(cfg.get("compress"), list):
        cfg["compress"] = tuple(cfg["compress"])
    try:
        abstract = jax.eval_shape(lambda: cls.create(example, **cfg))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{root / 'buffer.json'}: {name}.create refused the saved config: {e}") from None
    _check_config(name, meta, config(abstract), f"{root}")  # the saved arguments rebuild the same configuration
    if stack:
        abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(stack + s.shape, s.dtype), abstract)
    return abstract, None


def _shardings(abstract: Any, sharding: Any, target: Any) -> list:
    n, default = len(jax.tree.leaves(abstract)), jax.sharding.SingleDeviceSharding(jax.devices()[0])
    if sharding is None and target is not None:
        sharding = jax.tree.map(lambda x: getattr(x, "sharding", None) or default, target)
    if isinstance(sharding, jax.Device):
        sharding = jax.sharding.SingleDeviceSharding(sharding)
    if sharding is None or isinstance(sharding, jax.sharding.Sharding):
        return [sharding or default] * n
    flat = jax.tree.leaves(sharding, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    if len(flat) != n or not all(isinstance(x, jax.sharding.Sharding) for x in flat):
        raise ValueError(f"sharding: expected a Sharding, a Device or a tree of {n} Shardings like the buffer, got {sharding!r:.200}")
    return flat


# On CPU an array read from disk can wrap host memory that XLA does not own (depending on its alignment), and
# donating it then copies it: one copy here, array by array, makes every restored array donatable in place.
_owned = jax.jit(jnp.copy)


def _read(root: Path, target: Any, sharding: Any, progress: _Progress) -> Any:
    _verify(root, progress)
    meta = _read_json(root / "buffer.json", "buffer description")
    if target is not None:
        _entry(target, "target")  # TypeError for a target that is not a buffer
    try:
        abstract, concrete = _template(meta, target, root)
    except CheckpointError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a field missing or of the wrong JSON type
        raise CheckpointError(f"{root / 'buffer.json'}: malformed buffer description ({type(e).__name__}: {e})") from None
    leaves, treedef = jax.tree.flatten(abstract)
    _, described = _leaves(abstract)
    if described != meta["leaves"]:
        diff = next((a, b) for a, b in zip(described + [None] * len(meta["leaves"]), meta["leaves"] + [None] * len(described)) if a != b)
        raise CheckpointError(f"{root / 'buffer.json'}: array {diff[1]} in the checkpoint, {diff[0]} in the buffer to restore")
    shardings = _shardings(abstract, sharding, concrete)
    host_meta = meta.get("host")
    host_shapes = {} if host_meta is None else host_meta["arrays"]
    restore_args = {
        "device": {str(i): ocp.ArrayRestoreArgs(sharding=s, global_shape=x.shape, dtype=x.dtype)
                   for i, (x, s) in enumerate(zip(leaves, shardings)) if x.size},
        "host": {"stores": {i: {k: ocp.RestoreArgs(restore_type=np.ndarray, dtype=_dtype(d, k)) for k, (shp, d) in s.items() if np.prod(shp)}
                            for i, s in host_shapes.items()}},
    }
    if host_meta is not None:
        restore_args["host"]["slot_version"] = ocp.RestoreArgs(restore_type=np.ndarray)
    progress.reset(total=_nbytes(leaves))
    handler = ocp.PyTreeCheckpointHandler(use_compression=False, use_ocdbt=False)
    try:
        out = handler.restore(epath.Path(root / "arrays"), args=ocp.args.PyTreeRestore(restore_args=restore_args))
    except Exception as e:  # noqa: BLE001 - tensorstore/orbax raise many kinds; name the folder
        raise CheckpointError(f"{root / 'arrays'}: orbax could not read the arrays ({type(e).__name__}: {e})") from e
    finally:
        handler.close()
    progress.update(_nbytes(leaves))
    arrays = []
    for i, (x, s) in enumerate(zip(leaves, shardings)):
        a = out["device"].get(str(i)) if x.size else jax.device_put(np.zeros(x.shape, x.dtype), s)
        if a is None or a.shape != x.shape or a.dtype != x.dtype:
            raise CheckpointError(f"{root / 'arrays'}: array {i} ({meta['leaves'][i]['path']}) came back as {getattr(a, 'shape', None)}, expected {x.shape} {x.dtype}")
        arrays.append(_owned(a) if next(iter(a.sharding.device_set)).platform == "cpu" else a)
    buffer = jax.tree.unflatten(treedef, arrays)
    if host_meta is not None:
        _load_host(buffer, host_meta, out["host"], host_shapes, root)
    return buffer


def _load_host(buffer: Any, meta: dict, arrays: dict, shapes: dict, root: Path) -> None:
    host = buffer.host
    if len(meta["stores"]) != len(host.stores):
        raise CheckpointError(f"{root}: {len(meta['stores'])} host stores in the checkpoint, the buffer has {len(host.stores)}")
    sv = np.asarray(arrays["slot_version"])
    if sv.shape != host.slot_version.shape or sv.dtype != host.slot_version.dtype:
        raise CheckpointError(f"{root}: host slot_version of shape {sv.shape} {sv.dtype}, expected {host.slot_version.shape} int32")
    for i, (store, m) in enumerate(zip(host.stores, meta["stores"])):
        got = arrays["stores"].get(str(i), {})
        full = {k: np.asarray(got[k]) if k in got else np.zeros(shp, _dtype(d, k)) for k, (shp, d) in shapes[str(i)].items()}
        try:
            store.import_state(m, full)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{root}: host store {i} ({host.names[i]}): {e}") from None
    host.slot_version[...] = sv
    host.version, host.num_writes, host.num_rows = int(meta["version"]), int(meta["num_writes"]), int(meta["num_rows"])
    if int(buffer.version) != host.version:
        raise CheckpointError(f"{root}: buffer version {int(buffer.version)} but host store version {host.version}")


# --- public API ---

def save(directory: str | os.PathLike, buffer: Any, *, progress: bool | None = None) -> Path:
    """Save `buffer` to the folder `directory` (created or replaced as a whole; see the module doc for the format).

    Args:
      directory: the checkpoint folder. An existing checkpoint there is replaced only once the new one is complete.
      buffer: any jaxbuffers buffer (`ReplayBuffer`, `PrioritisedReplayBuffer`, `TrajectoryBuffer`,
        `PrioritisedTrajectoryBuffer`, `RolloutBuffer`, `EpisodeBuffer`, the compressed buffers), stacked (vmapped) or not. A
        compressed buffer must be the state returned by its last `add`.
      progress: a tqdm bar (sizes, throughput) for saves over a second; None: only on a terminal.

    Returns:
      The checkpoint folder as a `pathlib.Path`.

    Raises:
      TypeError: `directory` not a path, `buffer` not a jaxbuffers buffer or a stacked compressed buffer,
        `progress` not a bool or None (all checked before anything is created).
      FileExistsError: `directory` exists and is not a checkpoint (nothing is deleted).
      StaleBufferError: a compressed buffer state older than its host store.
    """
    return _save(directory, buffer, progress)


def _save(directory: str | os.PathLike, buffer: Any, progress: bool | None, host: bool = True) -> Path:
    """`save`, with `_write`'s `host`."""
    path = _validate.path("directory", directory).absolute()
    _describe(buffer)  # its TypeErrors before anything is created
    if progress is not None:
        _validate.static_bool("progress", progress)
    if path.exists() and not (_is_checkpoint(path) or (path.is_dir() and not any(path.iterdir()))):
        raise FileExistsError(f"directory: {path} exists and is not a jaxbuffers checkpoint; refusing to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    bar = _Progress(progress, f"save {path.name}")
    try:
        _write(tmp, buffer, bar, host)
        prev = _prev(path)
        if path.exists():
            if prev.exists():  # left by a crash after the previous save completed
                shutil.rmtree(prev)
            os.rename(path, prev)
        os.rename(tmp, path)
        _fsync(path.parent)
        shutil.rmtree(prev, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        bar.close()
    return path


def restore(directory: str | os.PathLike, target: Any = None, *, sharding: Any = None, progress: bool | None = None) -> Any:
    """Restore the buffer saved in `directory`, bit for bit.

    Args:
      directory: a folder written by `save` (or a `BufferCheckpointHandler` item folder). If a save crashed
        between its two renames, the previous checkpoint (`.<name>.prev`) is restored.
      target: optional buffer (concrete, or abstract from `jax.eval_shape`) of the same class and configuration:
        checked against the checkpoint, its arrays' shardings used; never modified.
      sharding: where the arrays go: a `jax.sharding.Sharding` or `jax.Device` for every array, or a tree of
        shardings like the buffer. Default: the target's shardings, else the default device.
      progress: a tqdm bar for loads over a second; None: only on a terminal.

    Returns:
      The buffer, its leaves JAX arrays (a compressed buffer gets new host stores holding the saved entries).

    Raises:
      TypeError: `directory` not a path, `target` not a jaxbuffers buffer, `progress` not a bool or None.
      CheckpointError: missing or corrupt files (the message names the file), another format version, or a
        class, configuration, shape or dtype other than the target's.
    """
    path = _validate.path("directory", directory).absolute()
    if target is not None:
        _entry(target, "target")
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
      ValueError: a name that is not a plain folder name. Otherwise as `save`.
    """
    out = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(fileobj=out, mode="w") as tar:
        for name, buf in buffers.items():
            if not name or not all(c.isalnum() or c in "_-" for c in name):
                raise ValueError(f"buffers: expected plain folder names, got {name!r}")
            save(Path(tmp) / name, buf, progress=False)
            tar.add(Path(tmp) / name, arcname=name)
    return out.getvalue()


def from_bytes(data: bytes, targets: dict[str, Any]) -> dict[str, Any]:
    """The buffers of a `to_bytes` archive, each restored with `restore(folder, targets[name])`.

    Only plain files and folders inside the archive are extracted (no links, no absolute or `..` paths).

    Raises:
      CheckpointError: not such an archive, a member that is not a plain file or folder, a missing name, or
        `restore`'s errors (the message names the file).
    """
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


class BufferCheckpointHandler(ocp.CheckpointHandler):
    """Orbax `CheckpointHandler` of a jaxbuffers buffer: the `save` / `restore` format in the folder the orbax
    `Checkpointer` or `CheckpointManager` gives it (which provides the atomic commit). Used through `BufferSave` /
    `BufferRestore`."""

    def __init__(self, progress: bool | None = None):
        self.progress = progress

    def save(self, directory, args: "BufferSave") -> None:
        """Write `args.buffer` into `directory`."""
        bar = _Progress(self.progress, "save buffer")
        try:
            _write(Path(directory), args.buffer, bar)
        finally:
            bar.close()

    def restore(self, directory, args: "BufferRestore | None" = None) -> Any:
        """The buffer in `directory` (`restore`'s arguments from `args`)."""
        args = args or BufferRestore()
        bar = _Progress(self.progress, "restore buffer")
        try:
            return _read(Path(directory), args.target, args.sharding, bar)
        finally:
            bar.close()

    def metadata(self, directory) -> dict:
        """The parsed buffer.json: class, configuration, stack shape, leaves."""
        return _read_json(Path(directory) / "buffer.json", "buffer description")

    def finalize(self, directory) -> None:
        """Nothing to do: `save` writes every file, the manifest last."""

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
