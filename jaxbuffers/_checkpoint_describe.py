"""What a checkpoint says about its buffer (`buffer.json`): the class, its `create` arguments, the stack shape and
every leaf's path, shape and dtype, and how a buffer to restore into is rebuilt from them and checked.

Only JSON and a fixed table of jaxbuffers classes and numeric dtypes are read, so a crafted description cannot run code.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _ring, _validate
from jaxbuffers._checkpoint_upgrades import trajectory_in, with_lost_dropped, with_lost_rebuilt
from jaxbuffers.compressed._host import ShardedHostStores
from jaxbuffers.compressed import (
    CompressedEpisodeBuffer, CompressedPrioritisedTrajectoryBuffer, CompressedRolloutBuffer, CompressedTrajectoryBuffer,
)
from jaxbuffers.episode import EpisodeBuffer
from jaxbuffers.prioritised import PrioritisedReplayBuffer
from jaxbuffers.prioritised_trajectory import PrioritisedTrajectoryBuffer
from jaxbuffers.replay import ReplayBuffer
from jaxbuffers.rollout import RolloutBuffer
from jaxbuffers.sharding import ShardedBuffer
from jaxbuffers.trajectory import TrajectoryBuffer

FORMAT = "jaxbuffers.checkpoint"
FORMAT_VERSION = 1
#: the dtypes a buffer's arrays may have: numpy's numeric dtypes and bfloat16, stored under their zarr names ...
_NAMED_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16",
                 "float32", "float64", "complex64", "complex128")
#: ... and the other ml_dtypes JAX holds (those of this JAX version), stored as their bytes (`_checkpoint_zarr.stored`)
_BYTE_DTYPES = ("float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2", "uint2")
#: dtypes a buffer may hold that `save` refuses before writing anything, and why
_REFUSED_DTYPES = {d: "JAX takes its arrays to host memory as bool and cannot put them back; store the field as bool"
                   for d in ("int1", "uint1")}
_DTYPES = {jnp.dtype(d).name: jnp.dtype(d) for d in _NAMED_DTYPES + _BYTE_DTYPES if d in _NAMED_DTYPES or hasattr(jnp, d)}


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored here: missing, corrupt, of another format version, or of another
    buffer class, configuration, shape or dtype than asked for. The message names the file or field."""


# --- what each buffer class saves: its create arguments ---

def _names(spec: Any, indices) -> list[str]:
    """Full leaf names (`_validate.leaf_name`) of the leaves number `indices` of `spec`: what `compress=` selects."""
    flat = jax.tree_util.tree_flatten_with_path(spec)[0]
    return [_validate.leaf_name(flat[i][0]) for i in indices]


def _metrics(b) -> dict:
    """`metrics`: whether the buffer keeps per-position sample counts (always saved; a checkpoint without it was
    written when they were off by default and holds none: `_ADDED`)."""
    return {"metrics": b.metrics.per_slot}


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
    store = getattr(b.host, "shards", [b.host])[0].stores[0].config()  # a sharded buffer's stores share one configuration
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
           "keyframe_interval": b.keyframe_interval, "delta_codec": _delta_codec(b)}
    return {**out, **_priorities(b.buffer)} if isinstance(b.buffer, PrioritisedTrajectoryBuffer) else out


def _compressed_episode(b) -> dict:
    return {**_episode(b.buffer), "example": b.step_spec, **_host(b, b.step_spec[b.obs_key]), **_frames(b),
            "keyframe_interval": b.keyframe_interval, "delta_codec": _delta_codec(b)}


def _delta_codec(b) -> str | None:
    """The `delta_codec` argument of a compressed buffer's `create`, from its stores."""
    return getattr(b.host, "shards", [b.host])[0].stores[0].config()["delta_codec"]


def _compressed_rollout(b) -> dict:
    return {**_rollout(b.buffer), "example": b.step_spec, **_host(b, b.step_spec), **_frames(b, rollout=True)}


#: class name -> (class, create arguments of a buffer); its stack shape is `_validate.member_axes`
_CLASSES = {
    c.__name__: (c, config)
    for c, config in (
        (ReplayBuffer, _replay), (PrioritisedReplayBuffer, _prioritised), (TrajectoryBuffer, _trajectory),
        (PrioritisedTrajectoryBuffer, _prioritised_trajectory), (RolloutBuffer, _rollout), (EpisodeBuffer, _episode),
        (CompressedTrajectoryBuffer, _compressed_trajectory), (CompressedPrioritisedTrajectoryBuffer, _compressed_trajectory),
        (CompressedRolloutBuffer, _compressed_rollout), (CompressedEpisodeBuffer, _compressed_episode),
    )
}
_COMPRESSED = (CompressedTrajectoryBuffer, CompressedRolloutBuffer, CompressedEpisodeBuffer)
#: class name -> {create argument: the value a checkpoint written before the argument was saved means}
_ADDED = {
    **{name: {"metrics": False} for name in ("ReplayBuffer", "PrioritisedReplayBuffer", "TrajectoryBuffer",
                                             "PrioritisedTrajectoryBuffer", "EpisodeBuffer")},
    "CompressedEpisodeBuffer": {"keyframe_interval": 1, "delta_codec": None, "metrics": False},
    "CompressedTrajectoryBuffer": {"delta_codec": None, "metrics": False},
    "CompressedPrioritisedTrajectoryBuffer": {"delta_codec": None, "metrics": False},
}
#: class name -> `_upgraded_from(restored, saved_num_slots)`: the restored state in this layout, or None (refused)
_SLOT_LAYOUTS = {"CompressedRolloutBuffer": CompressedRolloutBuffer._upgraded_from}


def _upgraded(buffer: Any, saved_num_slots: int) -> Any | None:
    """`buffer` (restored, host stores fresh) in this layout when its stores were saved with `saved_num_slots` slots:
    itself for the same count, a class's upgrade of an older layout (`_SLOT_LAYOUTS`), else None (the caller refuses
    it, naming `num_slots`)."""
    if saved_num_slots == buffer.host.num_slots:
        return buffer
    upgrade = _SLOT_LAYOUTS.get(type(buffer).__name__)
    return None if upgrade is None else upgrade(buffer, saved_num_slots)


#: what buffer.json says of a prioritised trajectory tree's leaf order (`jaxbuffers.PrioritisedTrajectoryBuffer.tree`);
#: checkpoints written before it have the leaves in the order `lane * length + slot`
TREE_ORDER = "slot * num_envs + lane"


def _prioritised_trajectory_of(buffer: Any) -> PrioritisedTrajectoryBuffer | None:
    """The `PrioritisedTrajectoryBuffer` a buffer is, or a compressed one wraps; else None."""
    inner = getattr(buffer, "buffer", None) if isinstance(buffer, CompressedPrioritisedTrajectoryBuffer) else buffer
    return inner if isinstance(inner, PrioritisedTrajectoryBuffer) else None


def _upgraded_state(buffer: Any, meta: dict) -> tuple[Any, dict | None]:
    """(buffer, host metadata) of a restored checkpoint described by `meta` (buffer.json) in this layout: a
    trajectory buffer's lost-final-observation fields rebuilt from its flags (`with_lost_rebuilt`); a prioritised
    trajectory tree saved in the earlier leaf order (no `tree_order`) rebuilt in `TREE_ORDER` (the same leaf values;
    every sum recomputed from its children, as an add does), then its windows in the rebuilt lost prefixes given
    priority 0 (`with_lost_dropped`), then `_upgraded_host`."""
    inner = _prioritised_trajectory_of(buffer)
    rebuilt = inner is not None and (inner.buffer.lost_prefix is None or not _validate.member_axes(inner.buffer))
    buffer = trajectory_in(buffer, with_lost_rebuilt) or buffer
    inner = _prioritised_trajectory_of(buffer)
    if inner is not None and meta.get("tree_order") != TREE_ORDER:
        rebuild = PrioritisedTrajectoryBuffer._from_lane_order
        for _ in _validate.member_axes(inner):  # a stacked buffer: each member
            rebuild = jax.vmap(rebuild)
        inner = jax.tree.map(lambda x, like: jax.device_put(x, like.sharding), jax.jit(rebuild)(inner), inner)
    if rebuilt:
        inner = with_lost_dropped(inner)
    if inner is not None:
        buffer = inner if isinstance(buffer, PrioritisedTrajectoryBuffer) else buffer.replace(buffer=inner)
    return _upgraded_host(buffer, meta.get("host"))


def _upgraded_host(buffer: Any, host_meta: dict | None) -> tuple[Any, dict | None]:
    """(buffer, host metadata) of a checkpoint's restored compressed buffer in this layout (`_upgraded`): its stores'
    saved `num_slots` taken as this layout's. Unchanged when no upgrade applies (`import_state` then refuses the
    count, naming `num_slots`)."""
    if host_meta is not None and getattr(buffer, "keyframe_interval", None) == 1:  # `K = 1`: stores without a delta codec
        host_meta = stores_config(host_meta, delta_codec=None)
    shards = None if host_meta is None else host_meta.get("shards", [host_meta])
    saved = {m["config"].get("num_slots") for s in shards or () for m in s["stores"] if isinstance(m.get("config"), dict)}
    if len(saved) != 1 or not isinstance(next(iter(saved)), int):
        return buffer, host_meta
    new = _upgraded(buffer, saved.pop())
    if new is None or new is buffer:
        return buffer, host_meta
    return new, stores_config(host_meta, num_slots=buffer.host.num_slots)


def stores_config(host_meta: dict, **values) -> dict:
    """A checkpoint's host metadata `host_meta` (of one `HostStores`, or of each shard's) with `values` in the
    configuration of every store (checkpoints written before a store configuration changed)."""
    def one(m: dict) -> dict:
        return {**m, "stores": [{**st, "config": {**st["config"], **values}} if isinstance(st.get("config"), dict) else st
                                for st in m["stores"]]}

    return {**host_meta, "shards": [one(m) for m in host_meta["shards"]]} if "shards" in host_meta else one(host_meta)


# --- JSON encoding of the example's tree: dicts (str or int keys), lists, tuples, None and arrays; any other pytree
# node (a NamedTuple, a dataclass) as its layout only: its type's name and its children's keys (`SavedNode`) ---

#: a child's key of a `node` in buffer.json, `[kind, name or index]`: kind -> (pytree key class, its attribute)
_KEYS = {"attr": (jax.tree_util.GetAttrKey, "name"), "key": (jax.tree_util.DictKey, "key"),
         "index": (jax.tree_util.SequenceKey, "idx"), "flat": (jax.tree_util.FlattenedIndexKey, "key")}


class SavedNode:
    """A pytree node of a saved example that buffer.json describes by its layout only (a NamedTuple, a dataclass, any
    node type but dict, list and tuple): `type_name` (``module.qualname``, never imported) and its children under
    the same keys, so a buffer read with it (`layout_target`: the command-line tools) has the saved leaf paths."""

    __slots__ = ("type_name", "keys", "children")

    def __init__(self, type_name: str, keys: tuple, children: tuple):
        self.type_name, self.keys, self.children = type_name, keys, children

    def __getitem__(self, name: Any) -> Any:
        for (_, k), child in zip(self.keys, self.children):
            if k == name:
                return child
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"{self.type_name}({', '.join(f'{k}={c!r}' for (_, k), c in zip(self.keys, self.children))})"


jax.tree_util.register_pytree_with_keys(
    SavedNode,
    lambda n: ([(_key(kind, k), c) for (kind, k), c in zip(n.keys, n.children)], (n.type_name, n.keys)),
    lambda aux, children: SavedNode(*aux, tuple(children)),
    lambda n: (n.children, (n.type_name, n.keys)),
)


def _key(kind: str, k: Any) -> Any:
    """The pytree key of a `node`'s child key `[kind, k]`."""
    return _KEYS[kind][0](k)


def _key_entry(key: Any) -> list | None:
    """`[kind, name or index]` of a pytree key, or None for a key buffer.json does not hold."""
    for kind, (cls, attr) in _KEYS.items():
        if type(key) is cls and type(getattr(key, attr)) in (str, int):
            return [kind, getattr(key, attr)]
    return None


def _encode(tree: Any) -> Any:
    if isinstance(tree, dict) and all(isinstance(k, (str, int)) for k in tree):
        return {"dict": [[k, _encode(v)] for k, v in tree.items()]}
    if type(tree) in (list, tuple):
        return {type(tree).__name__: [_encode(v) for v in tree]}
    if tree is None:
        return {"none": None}
    if hasattr(tree, "shape") and hasattr(tree, "dtype"):
        return {"array": [list(tree.shape), jnp.dtype(tree.dtype).name]}
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)[0]
    keys = [_key_entry(p[0]) if len(p) == 1 else None for p, _ in flat]  # a leaf other than an array: no key
    if None in keys:
        raise TypeError(f"{type(tree).__name__} nodes are not stored in buffer.json")
    name = tree.type_name if isinstance(tree, SavedNode) else f"{type(tree).__module__}.{type(tree).__qualname__}"
    return {"node": [name, keys, [_encode(x) for _, x in flat]]}


def _dtype(name: Any, what: str) -> np.dtype:
    """The dtype named `name` in a checkpoint, or CheckpointError naming `what` (prefix it with the file)."""
    if name not in _DTYPES:
        raise CheckpointError(f"{what}: expected the name of a numeric or bool dtype, got {name!r:.60}")
    return _DTYPES[name]


def _decode(obj: Any, what: str = "config.example", layout: bool = False) -> Any:
    """The tree `_encode` wrote; a `node` as a `SavedNode` where `layout`, else CheckpointError naming its type."""
    if not isinstance(obj, dict) or len(obj) != 1:
        raise CheckpointError(f"{what}: malformed tree node {obj!r:.80}")
    (kind, v), = obj.items()
    if kind == "dict":
        return {k: _decode(x, f"{what}[{k!r}]", layout) for k, x in v}
    if kind in ("list", "tuple"):
        items = [_decode(x, f"{what}[{i}]", layout) for i, x in enumerate(v)]
        return items if kind == "list" else tuple(items)
    if kind == "node":
        name, keys, children = _node(v, what)
        if not layout:
            raise CheckpointError(
                f"{what}: a {name} node cannot be rebuilt from buffer.json, which records its layout, not its Python "
                f"type (restore imports nothing); pass target=, a buffer created like the saved one (the same "
                f"create call with an example of the same types); the command-line tools read it without")
        return SavedNode(name, keys, tuple(_decode(x, f"{what}{_key(*k)}", layout) for k, x in zip(keys, children)))
    if kind == "none":
        return None
    if kind == "array":
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], list) and all(type(s) is int and s >= 0 for s in v[0])):
            raise CheckpointError(f"{what}: expected an array entry [shape, dtype], got {v!r:.80}")
        return jax.ShapeDtypeStruct(tuple(v[0]), _dtype(v[1], what))
    raise CheckpointError(f"{what}: unknown tree node kind {kind!r}")


def _node(v: Any, what: str) -> tuple[str, tuple, list]:
    """(type name, keys, encoded children) of a `node` entry, or CheckpointError naming `what`."""
    try:
        name, keys, children = v
        keys = tuple((kind, k) for kind, k in keys)
    except (TypeError, ValueError):
        keys = None
    if (keys is None or not isinstance(name, str) or not isinstance(children, list) or len(children) != len(keys)
            or any(kind not in _KEYS or type(k) not in (str, int) for kind, k in keys)):
        raise CheckpointError(f"{what}: malformed node {v!r:.80}")
    return name, keys, children


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

def _sharded(buffer: Any) -> tuple[Any, dict | None]:
    """(what is saved of `buffer`, buffer.json's `sharded` entry): a `ShardedBuffer` is saved as its shards, a buffer
    stacked `[S]` (`sharded`: `{"axis", "num_shards"}`, the mesh axis it was split over); any other buffer as itself."""
    if isinstance(buffer, ShardedBuffer):
        return buffer.shards, {"axis": buffer.axis, "num_shards": buffer.num_shards}
    return buffer, None


def _entry(buffer: Any, what: str = "buffer") -> tuple[str, type, Any, tuple[int, ...]]:
    """(class name, class, config function, stack shape) of a buffer, or TypeError naming the argument `what`."""
    entry = _CLASSES.get(type(buffer).__name__)
    if entry is None or entry[0] is not type(buffer):
        value = f" {buffer!r:.60}" if isinstance(buffer, (bool, int, float, complex, str, bytes)) else ""  # not a tree's repr
        raise TypeError(f"{what}: expected one of the jaxbuffers buffers {sorted(_CLASSES)} or a ShardedBuffer of one, "
                        f"got {type(buffer).__name__}{value}")
    cls, config = entry
    return type(buffer).__name__, cls, config, _validate.member_axes(buffer)


def _unstacked(buffer: Any, stack: tuple[int, ...]) -> Any:
    k = len(stack)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[k:], x.dtype), buffer)


def _leaves(tree: Any) -> tuple[list, list[dict]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [x for _, x in flat], [
        {"path": _validate.leaf_name(p), "shape": list(np.shape(x)), "dtype": jnp.dtype(x.dtype).name} for p, x in flat
    ]


def _describe(buffer: Any) -> dict:
    buffer, sharded = _sharded(buffer)
    name, _, config, stack = _entry(buffer)
    if getattr(getattr(buffer, "host", None), "directory", None) is not None:  # jaxbuffers.disk.DiskStores
        raise TypeError(f"buffer: a disk-backed {name} is its folder {buffer.host.directory}; jaxbuffers.disk.flush it and copy the folder")
    if stack and isinstance(buffer, _COMPRESSED) and not (isinstance(buffer.host, ShardedHostStores) and stack == (len(buffer.host.shards),)):
        raise TypeError(f"buffer: a {name} cannot be stacked (one host store); a jaxbuffers.ShardedBuffer has one per shard")
    leaves = _leaves(buffer)[1]
    for leaf in leaves:
        if leaf["dtype"] not in _DTYPES:
            why = _REFUSED_DTYPES.get(leaf["dtype"], "not a dtype a checkpoint stores")
            raise TypeError(f"buffer{leaf['path']}: dtype {leaf['dtype']} cannot be saved ({why})")
    cfg = config(_unstacked(buffer, stack))
    out = {"format": FORMAT, "version": FORMAT_VERSION, "class": name, "config": _json_config(cfg),
           "stack_shape": list(stack), "leaves": leaves}
    if _prioritised_trajectory_of(buffer) is not None:
        out["tree_order"] = TREE_ORDER
    return out if sharded is None else {**out, "sharded": sharded}


def _nbytes(tree: Any) -> int:
    return sum(int(np.prod(np.shape(x))) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


_TREE_KINDS = ("dict", "list", "tuple", "none", "array", "node")
_MAX_REPORTED = 5  # differences a message lists before "and N more"


def _tree_kind(node: Any) -> str | None:
    """The kind of an encoded tree node (`_encode`), or None for any other value."""
    if isinstance(node, dict) and len(node) == 1 and next(iter(node)) in _TREE_KINDS:
        return next(iter(node))
    return None


def _tree_differences(a: Any, b: Any, where: str, names: tuple[str, str]) -> list[str]:
    """Where the encoded trees `a` and `b` (`_encode`) differ, one line per differing node: `where` (its path, e.g.
    `example['obs']['a']`) and what differs, the shape, dtype, keys, length or kind, `a` then `b` (`names`)."""
    na, nb = names
    ka, kb = _tree_kind(a), _tree_kind(b)
    if ka is None or kb is None or ka != kb:
        return [f"{where}: {_node_text(a, ka)} in {na}, {_node_text(b, kb)} in {nb}"]
    va, vb = a[ka], b[kb]
    if ka == "array":
        (sa, da), (sb, db) = va, vb
        out = [f"{where}: shape {tuple(sa)} in {na}, {tuple(sb)} in {nb}"] if list(sa) != list(sb) else []
        return out + ([f"{where}: dtype {da} in {na}, {db} in {nb}"] if da != db else [])
    if ka == "none":
        return []
    if ka == "node":  # compared by layout: the type's name is not (a class moved to another module is the same)
        (_, keys_a, xa), (_, keys_b, xb) = _node(va, where), _node(vb, where)
        if keys_a != keys_b:
            return [f"{where}: children {[k for _, k in keys_a]} in {na}, {[k for _, k in keys_b]} in {nb}"]
        return [d for k, x, y in zip(keys_a, xa, xb) for d in _tree_differences(x, y, f"{where}{_key(*k)}", names)]
    if ka in ("list", "tuple"):
        if len(va) != len(vb):
            return [f"{where}: {len(va)} items in {na}, {len(vb)} in {nb}"]
        return [d for i, (x, y) in enumerate(zip(va, vb)) for d in _tree_differences(x, y, f"{where}[{i}]", names)]
    da, db = dict(va), dict(vb)
    out = []
    for name, keys in ((na, [k for k in da if k not in db]), (nb, [k for k in db if k not in da])):
        if keys:
            out.append(f"{where}: key{'s' if len(keys) > 1 else ''} {', '.join(map(repr, keys))} only in {name}")
    out += [d for k in da if k in db for d in _tree_differences(da[k], db[k], f"{where}[{k!r}]", names)]
    if not out and list(da) != list(db):
        out = [f"{where}: keys in the order {list(da)} in {na}, {list(db)} in {nb}"]
    return out


def _node_text(node: Any, kind: str | None) -> str:
    """An encoded tree node (`_encode`) of kind `kind` in words, for a message."""
    if kind == "array":
        return f"an array of shape {tuple(node['array'][0])} and dtype {node['array'][1]}"
    if kind == "node":
        return f"a {node['node'][0] if isinstance(node['node'], list) and node['node'] else 'node'!s:.100}"
    return {None: f"{node!r:.100}", "none": "None"}.get(kind, f"a {kind}")


def config_differences(a: dict, b: dict, names: tuple[str, str]) -> list[str]:
    """Every difference between two described configurations (`_json_config`, so the example and the meta fields are
    encoded trees), one line each, naming the field and, inside a tree, the leaf's path and what differs:
    `config 'example' differs at example['reward']: dtype float32 in the checkpoint, float16 in the target`.
    `names`: what `a` and `b` are, for the message. Plain fields compare by equality."""
    na, nb = names
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if x == y:
            continue
        if _tree_kind(x) is not None and _tree_kind(y) is not None:
            out += [f"config {k!r} differs at {d}" for d in _tree_differences(x, y, k, names)]
        else:
            out.append(f"config {k!r} differs: {x!r:.200} in {na}, {y!r:.200} in {nb}")
    return out


def differences_text(differences: list[str]) -> str:
    """`config_differences` as one message: the first `_MAX_REPORTED` of them, and how many more."""
    more = len(differences) - _MAX_REPORTED
    return "; ".join(differences[:_MAX_REPORTED]) + (f"; and {more} more" if more > 0 else "")


def _check_config(name: str, saved: dict, cfg: dict, what: str) -> None:
    if saved["class"] != name:
        raise CheckpointError(f"{what}: the checkpoint holds a {saved['class']}, the target is a {name}")
    ours = _json_config(cfg)
    theirs = dict(saved["config"])
    if theirs.get("example") is None:  # not described in buffer.json: the target's example is taken
        theirs["example"] = ours.get("example")
    differences = config_differences(theirs, ours, ("the checkpoint", "the target"))
    if differences:
        a = theirs.get("metrics")
        hint = (f" (create the target with metrics={a}, or restore without a target)"
                if a != ours.get("metrics") else "")
        raise CheckpointError(f"{what}: {differences_text(differences)}{hint}")


def _check_meta_defaults(target: Any, loaded: list, root: Path, stacked: bool = False, values=np.asarray) -> None:
    """The meta defaults (`EpisodeBuffer.meta_defaults`, array leaves, so not in the JSON config) read from a
    checkpoint must equal a concrete target's, byte for byte: restoring would otherwise replace them silently.
    Checkpoints written before defaults were compared hold them too. An abstract target has no values to compare.

    `stacked`: the buffer of a `ShardedBuffer` (leaves `[S, ...]`): a default equal on every shard is given once.
    `values`: a leaf's values to compare (with several processes: the rows this process holds).

    Raises:
      CheckpointError: naming the meta field, both defaults, and the target.
    """
    flat = jax.tree_util.tree_flatten_with_path(target)[0]
    for (path, x), a in zip(flat, loaded):
        attrs = [k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey)]
        if not attrs or attrs[-1] != "meta_defaults" or isinstance(x, jax.ShapeDtypeStruct):
            continue
        a, b = values(a), values(x)
        if a.tobytes() != b.tobytes():
            field = path[-1].key if isinstance(path[-1], jax.tree_util.DictKey) else _validate.leaf_name(path)
            a, b = ((v[0] if stacked and v.ndim and (v == v[:1]).all() else v) for v in (np.asarray(a), b))
            raise CheckpointError(
                f"{root}: config 'meta' field {field!r}: the checkpoint's default is {a.tolist()!r:.100}, the target's is "
                f"{b.tolist()!r:.100} (create the target with the checkpoint's meta defaults, or restore without a target)"
            )


def _checked_cursors(buffer: Any, root: Path, values: Callable[[Any], Any] = np.asarray) -> Any:
    """`buffer`, read from the checkpoint in `root`, once its cursors are in their documented ranges, on every member
    of a stacked buffer: those of the ring that holds its items (the one its metrics count: `_metrics_in` followed
    down) by the checks of `jaxbuffers.ReplayBuffer.with_cursors` (`jaxbuffers._ring.checked_cursors`), and every
    other cursor field a buffer class declares with its inclusive range (`_cursor_ranges`: a trajectory's
    `final_head`, a prioritised trajectory's `phase`, the frame ring's cursors, a rollout's `step_index`), in the
    buffer and in every buffer it holds (`_ranged`). `values` reads a cursor array (with several processes: the rows
    this process holds).

    Raises:
      CheckpointError: a cursor out of range, naming its leaf, the range and the value.
    """
    owner, prefix = buffer, ""
    while getattr(owner, "_metrics_in", None) is not None:
        owner, prefix = getattr(owner, owner._metrics_in), f"{prefix}{owner._metrics_in}."
    try:
        if hasattr(owner, "_metrics_ring"):
            _, added, head, num_valid, ring, _ = owner._metrics_ring()
            added, head, num_valid = values(added), values(head), values(num_valid)
            _ring.checked_cursors(ring, np.shape(head), prefix, head=head, num_valid=num_valid, added=added)
        for name, value, (lo, hi) in _ranged(buffer):
            at = values(value)
            _validate.integer_value(name, at, np.shape(at), lo, hi)
    except ValueError as e:
        raise CheckpointError(f"{root}: array {e}") from None
    return buffer


def _ranged(node: Any, prefix: str = ""):
    """`(leaf name, array, (lo, hi))` of every cursor field declared by `_cursor_ranges` in `node` and in the buffers
    among its pytree fields, depth first (`buffer.final_head` in a prioritised trajectory buffer); a field an older
    checkpoint lacks (None until `_upgraded_state` computes it) is skipped."""
    declared = getattr(node, "_cursor_ranges", None)
    for name, bounds in (declared() if declared is not None else {}).items():
        if getattr(node, name) is not None:
            yield prefix + name, getattr(node, name), bounds
    for f in dataclasses.fields(node) if dataclasses.is_dataclass(node) else ():
        child = getattr(node, f.name)
        if f.metadata.get("pytree_node", True) and dataclasses.is_dataclass(child):
            yield from _ranged(child, f"{prefix}{f.name}.")


def layout_target(meta: dict, root: Path) -> Any | None:
    """An abstract buffer to restore the checkpoint described by `meta` (buffer.json, in `root`) into, its example's
    node types that buffer.json records by layout only (`_encode`) standing as `SavedNode`s (the command-line tools
    read such a checkpoint with it; nothing is imported); None when it holds none (restore needs no target). A
    checkpoint written before layouts were recorded (no example) gets its layout from its leaves (`_leaf_layout`)."""
    config = meta.get("config") if isinstance(meta, dict) else None
    if not isinstance(config, dict) or meta.get("class") not in _CLASSES:
        return None  # restore names what is wrong
    example = config.get("example")
    if example is None:
        meta = {**meta, "config": {**config, "example": _leaf_layout(meta, root)}}
    elif '"node"' not in json.dumps(example):
        return None
    return _template(meta, None, root, layout=True)[0]


_PROBE = "__layout_probe__"
_PATH_KEY = re.compile(r"\.(\w+)|\[(-?\d+)\]|\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\]")  # .name, [0], ['key']


def _leaf_layout(meta: dict, root: Path) -> dict:
    """The encoded example of a checkpoint whose buffer.json has none, from its recorded leaves: a probe example's
    leaf in a buffer of the saved class and configuration tells where the example's leaves are and their leading
    axes; their paths give the nodes' keys (types not recorded). CheckpointError where they do not tell."""
    refused = _undescribed(root, meta["class"])
    probe = {_PROBE: jax.ShapeDtypeStruct((3, 5, 7), jnp.float32)}
    try:
        abstract, _ = _template({**meta, "config": {**meta["config"], "example": _encode(probe)}}, None, root)
    except (CheckpointError, TypeError, ValueError, KeyError):
        raise refused from None
    at = [(p, x.shape) for p, x in jax.tree_util.tree_flatten_with_path(abstract)[0] if _PROBE in _validate.leaf_name(p)]
    if not at:
        raise refused
    prefix = _validate.leaf_name(at[0][0]).split(f"[{_PROBE!r}]")[0]
    lead = list(at[0][1][:-3])
    items = []
    for leaf in meta.get("leaves") or ():
        path, shape = str(leaf.get("path")), leaf.get("shape")
        if path.startswith(prefix) and path[len(prefix): len(prefix) + 1] in (".", "["):
            keys = _path_keys(path[len(prefix):])
            if keys is None or not isinstance(shape, list) or shape[: len(lead)] != lead:
                raise refused
            items.append((keys, {"array": [shape[len(lead):], leaf.get("dtype")]}))
    if not items:
        raise refused
    return _nested(items)


def _path_keys(path: str) -> list | None:
    """`[kind, name or index]` of each key of a leaf path (`.name`, `[0]`, `['key']`), or None for another path."""
    keys, at = [], 0
    while at < len(path):
        m = _PATH_KEY.match(path, at)
        if m is None:
            return None
        attr, index, quoted = m.groups()
        keys.append(["attr", attr] if attr is not None else ["index", int(index)] if index is not None
                    else ["key", ast.literal_eval(quoted)])  # a quoted string literal only
        at = m.end()
    return keys


def _nested(items: list) -> dict:
    """The encoded tree of `(keys, encoded leaf)` pairs in leaf order: a `node` per level (type not recorded)."""
    if len(items) == 1 and not items[0][0]:
        return items[0][1]
    children: dict[tuple, list] = {}
    for keys, leaf in items:
        if not keys:
            raise CheckpointError(f"leaves: a leaf and a node at one path {items[0][0]!r:.80}")
        children.setdefault(tuple(keys[0]), []).append((keys[1:], leaf))
    return {"node": ["(type not recorded)", [list(k) for k in children], [_nested(v) for v in children.values()]]}


def _undescribed(root: Path, name: str) -> CheckpointError:
    return CheckpointError(f"{root}: the example of this {name} is not described in buffer.json (written before pytree "
                           f"node layouts were recorded, or a node whose keys JSON does not hold); pass target=, a "
                           f"{name} created like the saved one (the same create call)")


def _template(meta: dict, target: Any, root: Path, layout: bool = False) -> tuple[Any, Any]:
    """(abstract buffer to restore into, concrete target shardings or None), after checking the target. A sharded
    compressed buffer (`jaxbuffers.ShardedBuffer`) gets one fresh host store per shard, on the target's mesh axis.
    `layout`: the saved example's `node`s as `SavedNode`s (`layout_target`)."""
    name = meta["class"]
    if isinstance(meta.get("config"), dict) and name in _ADDED:  # an older checkpoint: the arguments it predates
        meta = {**meta, "config": {**_ADDED[name], **meta["config"]}}
    if isinstance(meta.get("config"), dict) and meta["config"].get("keyframe_interval") == 1:  # saved before `K = 1`
        meta = {**meta, "config": {**meta["config"], "delta_codec": None}}  # dropped its unused delta codec
    if name not in _CLASSES:
        raise CheckpointError(f"{root / 'buffer.json'}: class {name!r} is not a jaxbuffers buffer ({sorted(_CLASSES)})")
    cls, config = _CLASSES[name]
    stack = tuple(int(s) for s in meta["stack_shape"])
    given = None  # the target's create arguments
    if target is not None:
        tname, _, tconfig, tstack = _entry(target)
        given = tconfig(_unstacked(target, tstack))
        _check_config(tname, meta, given, f"{root}")
        if tstack != stack:
            raise CheckpointError(f"{root}: stack shape {stack} in the checkpoint, {tstack} in the target")
        if not isinstance(target, _COMPRESSED):  # a compressed buffer gets fresh host stores below
            return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), target), target
    cfg = dict(meta["config"])
    if given is not None:  # its example has the checkpoint's layout (checked), and its own node types
        cfg["example"], example = None, given["example"]
    elif cfg.get("example") is None:
        raise _undescribed(root, name)
    else:
        example = _decode(cfg["example"], f"{root / 'buffer.json'}: config.example", layout)
    cfg.pop("example")
    for k in _SPECS:
        if k in cfg:
            cfg[k] = _decode(cfg[k], f"{root / 'buffer.json'}: config.{k}")
    if isinstance(cfg.get("compress"), list):
        cfg["compress"] = tuple(cfg["compress"])
    try:
        abstract = jax.eval_shape(lambda: cls.create(example, **cfg))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{root / 'buffer.json'}: {name}.create refused the saved config: {e}") from None
    _check_config(name, meta, config(abstract), f"{root}")  # the saved arguments rebuild the same configuration
    if stack:
        abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(stack + s.shape, s.dtype), abstract)
    sharded = (meta.get("host") or {}).get("shards")
    if sharded is not None:  # one fresh store per shard, as `ShardedBuffer.create` makes them
        if stack != (len(sharded),):
            raise CheckpointError(f"{root / 'buffer.json'}: {len(sharded)} sharded host stores for a stack of shape {stack}")
        axis = target.host.axis if target is not None and isinstance(target.host, ShardedHostStores) else meta["host"]["axis"]
        hosts = ShardedHostStores.made(lambda: jax.eval_shape(lambda: cls.create(example, **cfg)), stack[0])
        abstract = abstract.replace(host=ShardedHostStores(hosts, axis))
        return abstract, target  # the target's shardings: its mesh
    return abstract, None
