"""Disk-backed buffers: a compressed buffer whose host stores are files in a folder, and several folders sampled as one.

`open(directory, "w", buffer)` moves the host half of an empty compressed buffer (`CompressedTrajectoryBuffer`,
`CompressedPrioritisedTrajectoryBuffer`, `CompressedRolloutBuffer`, `CompressedEpisodeBuffer`, created with
`codec="none"`) into a folder: every
compressed leaf becomes a `host_codecs.FileStore` (one `.npy` file of `[num_slots, *frame_shape]`, read and written
with positioned system calls, so data larger than memory stays on disk and reading it does not grow the process's
resident memory). Everything else is unchanged: `add` writes through the same exactly-once host callback, samplers
read through the same versioned callback, under `jit` and eagerly, and a sample equals the in-memory buffer's.

Folder layout (format version `FORMAT_VERSION`):

```
disk.json                 {"format": "jaxbuffers.disk", "version": 1,
                           "stores": [{"name", "file", "shape", "dtype"}, ...] one per compressed leaf,
                           "num_slots", "host": {"version", "num_writes", "num_rows"},
                           "files": {relative path: {"bytes", "xxh3_64"}} of the index files and slot_version.npy}
store-<i>.npy             the entries of compressed leaf i (`host_codecs.FileStore`; a numpy .npy file)
store-<i>.index.npy       its index: which slots hold an entry, and each entry's checksum
slot_version.npy          int32 [n <= num_slots]: the host write that last wrote each slot (0 past its end)
state/                    a `jaxbuffers.checkpoint` of the device state (cursors, ids, small fields), host left out
```

`flush(buffer)` writes the index files, `slot_version.npy`, `disk.json` and `state/` as of that buffer state; the
entries themselves are written by every `add`. Reopened with `"r"` or `"r+"`, the folder gives the buffer as of its
last flush. Entries rewritten by adds after the last flush fail their checksum when read from the reopened folder
(`host_codecs.CorruptEntryError` naming the file and slots) rather than returning frames the saved state never held.

`Concatenated.create(buffers)` samples several trajectory buffers (open folders, or in-memory compressed buffers of
the same configuration) as one, uniformly over the union of their valid windows; `ConcatenatedEpisodes.create`
does the same for episode buffers (episodes, sequences, steps and n-step transitions, with meta filters).
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from host_codecs import CorruptEntryError, dtype_from_code
from host_codecs.file_store import FileStore, ReadOnlyError
from jaxbuffers import _compiled, _ring, _validate, checkpoint
from jaxbuffers.compressed import _common
from jaxbuffers.compressed._host import HostStores, StaleBufferError
from jaxbuffers.compressed.episode import CompressedEpisodeBuffer
from jaxbuffers.compressed.trajectory import CompressedTrajectoryBuffer
from jaxbuffers.episode import EpisodeSample
from jaxbuffers.trajectory import SequenceSample, TransitionSample

__all__ = [
    "FORMAT_VERSION", "ReadOnlyError", "DiskStores", "open", "flush", "Concatenated", "ConcatenatedEpisodes", "ConcatenatedSample",
]

FORMAT = "jaxbuffers.disk"
FORMAT_VERSION = 1
_MODES = ("w", "r+", "r")


class DiskStores(HostStores):
    """`jaxbuffers.compressed.HostStores` whose stores are `host_codecs.FileStore`s in `directory`.

    Args:
      directory: the buffer's folder.
      like: the in-memory host stores of the same buffer (slots, leaf names, frame shapes and dtypes; kept as the
        buffer's description for its checkpoint).
      mode: `"w"`, `"r+"` or `"r"` (module doc).

    Raises:
      ValueError, FileNotFoundError: as `host_codecs.FileStore` (files of another shape or dtype, missing files).
    """

    def __init__(self, directory: Path, like: HostStores, mode: str):
        shapes = [s._declared[1] for s in like.stores]
        dtypes = [dtype_from_code(s._declared[0]) for s in like.stores]
        super().__init__(like.num_slots, like.codec, shapes, dtypes, like.names, chunk_bytes=like.stores[0].config()["chunk_bytes"], dictionary_bytes=0)
        self.directory, self.mode, self.like = directory, mode, like
        self.stores = [
            FileStore(directory / f"store-{i}", like.num_slots, shp, dt, mode=mode, name=n)
            for i, (shp, dt, n) in enumerate(zip(shapes, dtypes, like.names))
        ]

    def __repr__(self) -> str:
        return f"DiskStores({str(self.directory)!r}, leaves={list(self.names)}, num_slots={self.num_slots}, mode={self.mode!r}, version={self.version})"

    def check_state(self, what: str, version: int | None = None) -> None:
        """`HostStores.check_state`, and `ReadOnlyError` for an add to a folder opened with `mode="r"`."""
        if what == "add" and self.mode == "r":
            raise ReadOnlyError(f"add: {self.directory} was opened with mode='r' (read only); reopen it with mode='r+' to add")
        super().check_state(what, version)

    def write(self, version, slots, valid, *datas, bases=None) -> np.ndarray:
        """`HostStores.write` of whole entries (`bases` None); `ReadOnlyError` before anything is written in a folder
        opened with `mode="r"`."""
        self.check_state("add")
        if bases is not None:
            raise ValueError("bases: a disk-backed store holds whole entries only (its buffer has keyframe_interval=1)")
        return super().write(version, slots, valid, *datas)

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


def _host_meta(host: DiskStores) -> dict:
    return {"version": host.version, "num_writes": host.num_writes, "num_rows": host.num_rows}


def _write_disk_json(host: DiskStores) -> None:
    d = host.directory
    sv = d / "slot_version.npy"
    with builtins.open(sv.with_name("slot_version.npy.tmp"), "wb") as f:
        np.save(f, host.slot_version, allow_pickle=False)
    os.replace(sv.with_name("slot_version.npy.tmp"), sv)
    files = [sv] + [s.index_path for s in host.stores]
    off = checkpoint._Progress(False, "")
    meta = {
        "format": FORMAT, "version": FORMAT_VERSION, "num_slots": host.num_slots, "host": _host_meta(host),
        "stores": [{"name": n, "file": s.data_path.name, "shape": list(s.item_shape), "dtype": s.dtype.name} for n, s in zip(host.names, host.stores)],
        "files": {p.name: {"bytes": p.stat().st_size, "xxh3_64": checkpoint._hash_file(p, off)} for p in files},
    }
    tmp = d / "disk.json.tmp"
    tmp.write_text(json.dumps(meta))
    checkpoint._fsync(tmp)
    os.replace(tmp, d / "disk.json")


def _read_disk_json(d: Path) -> dict:
    path = d / "disk.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise checkpoint.CheckpointError(f"{path}: missing (not a jaxbuffers disk folder)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise checkpoint.CheckpointError(f"{path}: not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise checkpoint.CheckpointError(f"{path}: expected format {FORMAT!r}, got {meta.get('format') if isinstance(meta, dict) else meta!r:.60}")
    if meta.get("version") != FORMAT_VERSION:
        raise checkpoint.CheckpointError(f"{path}: format version {meta.get('version')!r}, this jaxbuffers reads version {FORMAT_VERSION}")
    off = checkpoint._Progress(False, "")
    for name, info in meta["files"].items():
        p = d / name
        if not p.is_file() or p.stat().st_size != info["bytes"] or checkpoint._hash_file(p, off) != info["xxh3_64"]:
            raise checkpoint.CheckpointError(f"{p}: missing, truncated or corrupt (size or xxh3_64 differs from {path.name})")
    return meta


def flush(buffer: Any) -> Path:
    """Make the folder of a disk-backed buffer describe `buffer`: entries synced to disk, then the index files,
    `slot_version.npy`, `disk.json` and the device state (`state/`, written atomically).

    Args:
      buffer: a buffer from `open` (or a later state of it), the state returned by its last `add`.

    Returns:
      The folder.

    Raises:
      TypeError: `buffer` is not disk-backed.
      ReadOnlyError: the folder was opened with `mode="r"`.
      StaleBufferError: `buffer` is not the newest state (a later add was made).
    """
    host = getattr(buffer, "host", None)
    if not isinstance(host, DiskStores):
        raise TypeError(f"buffer: expected a disk-backed buffer from jaxbuffers.disk.open, got {type(buffer).__name__} with host {type(host).__name__}")
    if host.mode == "r":
        raise ReadOnlyError(f"flush: {host.directory} was opened with mode='r' (read only)")
    host._check_open("flush")
    version = int(buffer.version)  # waits for the add that produced it, before taking the lock its write takes
    with host._lock:
        if version != host.version:
            raise StaleBufferError(f"flush: this buffer state has version {version} but its host store is at version {host.version}; flush the state returned by the last add")
        for s in host.stores:
            s.flush()
        _write_disk_json(host)
    checkpoint._save(host.directory / "state", buffer.replace(host=host.like), False, host=False)
    return host.directory


def open(directory: str | os.PathLike, mode: str = "r", buffer: Any = None) -> Any:  # noqa: A001 - the file verb
    """Open (or, with `mode="w"`, create) the folder of a disk-backed buffer.

    Args:
      directory: the folder.
      mode: `"w"`: create it from `buffer` (an existing disk folder there is replaced; any other non-empty folder is
        refused); `"r+"`: reopen it to sample and add; `"r"`: reopen it to sample only (adds and `flush` raise
        `ReadOnlyError`, and the files are opened read-only).
      buffer: with `"w"`, the empty compressed buffer (`codec="none"`, no add yet) whose configuration the folder
        takes; with `"r"` / `"r+"`, optionally a buffer (concrete or from `jax.eval_shape`) whose class and
        configuration the folder must have.

    Returns:
      The disk-backed buffer: with `"w"` the empty buffer, else the state of the folder's last `flush`, its device
      arrays on the default device and its host stores the folder's files.

    Raises:
      TypeError: `directory` not a path; with `"r"` / `"r+"`, a `buffer` that is not a jaxbuffers buffer.
      ValueError: a bad `mode`; with `"w"`, a `buffer` that is not an empty compressed buffer with `codec="none"`.
      FileExistsError: `"w"` on a non-empty folder that is not a disk folder (nothing is deleted).
      CheckpointError: `"r"` / `"r+"` on a folder that is missing, corrupt, of another format version, or of another
        class or configuration than `buffer` (the message names the file or the field).
    """
    d = _validate.path("directory", directory).absolute()
    if not isinstance(mode, str) or mode not in _MODES:
        raise ValueError(f"mode: expected one of {_MODES}, got {mode!r}")
    if mode == "w":
        return _create(d, buffer)
    if buffer is not None:
        checkpoint._entry(buffer, "buffer")  # a TypeError naming this argument (restore calls it target)
    meta = _read_disk_json(d)
    try:
        restored = checkpoint.restore(d / "state", buffer, progress=False)
    except checkpoint.CheckpointError as e:  # restore's target is this function's buffer
        if buffer is not None and "target" in str(e):
            raise checkpoint.CheckpointError(f"buffer: {e}") from None
        raise
    like = getattr(restored, "host", None)
    if not isinstance(like, HostStores):
        raise checkpoint.CheckpointError(f"{d / 'state'}: holds a {type(restored).__name__}, not a compressed buffer")
    want = [{"name": n, "file": f"store-{i}.npy", "shape": list(s._declared[1]), "dtype": dtype_from_code(s._declared[0]).name}
            for i, (n, s) in enumerate(zip(like.names, like.stores))]
    for field, saved, ours in (("num_slots", meta["num_slots"], like.num_slots), ("stores", meta["stores"], want)):
        if saved != ours:
            raise checkpoint.CheckpointError(f"{d / 'disk.json'}: {field} is {saved!r:.200}, the buffer in state/ needs {ours!r:.200}")
    host = DiskStores(d, like, mode)
    sv = np.load(d / "slot_version.npy", allow_pickle=False)
    if sv.dtype != np.int32 or sv.ndim != 1 or sv.shape[0] > host.num_slots:
        raise checkpoint.CheckpointError(f"{d / 'slot_version.npy'}: shape {sv.shape} {sv.dtype}, expected int32 (n,) with n <= {host.num_slots}")
    host.set_slot_versions(sv, str(d / "slot_version.npy"))
    host.version, host.num_writes, host.num_rows = (int(meta["host"][k]) for k in ("version", "num_writes", "num_rows"))
    if int(restored.version) != host.version:
        raise checkpoint.CheckpointError(
            f"{d}: state/ holds version {int(restored.version)}, disk.json version {host.version} (a flush was interrupted)")
    return restored.replace(host=host)


def _create(d: Path, buffer: Any) -> Any:
    like = getattr(buffer, "host", None)
    if not isinstance(like, HostStores) or isinstance(like, DiskStores):
        raise ValueError(f"buffer: expected an in-memory compressed buffer for mode='w', got {type(buffer).__name__}")
    if like.codec != "none":
        raise ValueError(f"buffer: codec {like.codec!r}; a disk-backed buffer stores raw entries: create it with codec='none'")
    if getattr(buffer, "keyframe_interval", 1) != 1:
        raise ValueError(
            f"buffer: keyframe_interval={buffer.keyframe_interval}; a disk-backed buffer stores every frame whole: "
            f"create it with keyframe_interval=1"
        )
    if like.version or int(buffer.version):
        raise ValueError(f"buffer: expected an empty buffer (no add yet), got one at version {int(buffer.version)}")
    if d.exists() and any(d.iterdir()):
        if not (d / "disk.json").is_file():
            raise FileExistsError(f"directory: {d} exists, is not empty and is not a jaxbuffers disk folder; refusing to replace it")
        shutil.rmtree(d)
    d.mkdir(parents=True, exist_ok=True)
    out = buffer.replace(host=DiskStores(d, like, "w"))
    flush(out)
    return out


# --- several buffers sampled as one ---

class ConcatenatedSample(NamedTuple):
    """A sample of `Concatenated` or `ConcatenatedEpisodes`: `sample` as the buffers' sampler returns it (`indices`
    local to its buffer), and `source` # shape=[B], dtype=int32: the buffer each row comes from."""

    sample: Any
    source: jax.Array


def _same_configuration(buffers: Sequence[Any], cls: type, sizes: tuple[str, ...]) -> tuple:
    """`buffers` as a tuple once checked: at least one, each exactly of class `cls`, and every configuration field of
    its checkpoint description (`jaxbuffers.checkpoint`) but `sizes` equal to `buffers[0]`'s.

    Raises:
      TypeError: not a list or tuple, no buffer, or a buffer of another class.
      ValueError: a stacked (vmapped) buffer, or a configuration field that differs from `buffers[0]`'s (the message
        names it).
    """
    buffers = tuple(_validate.instance("buffers", buffers, (list, tuple), f"a list of {cls.__name__}s"))
    if not buffers:
        raise TypeError("buffers: expected at least one buffer")
    describe = checkpoint._CLASSES[cls.__name__][1]
    ref = None
    for i, b in enumerate(buffers):
        if type(b) is not cls:
            raise TypeError(f"buffers[{i}]: expected a {cls.__name__}, got {type(b).__name__}")
        _validate.unstacked(f"buffers[{i}]", b, b.version, "give one member's state, jax.tree.map(lambda x: x[j], buffer)")
        like = b.host.like if isinstance(b.host, DiskStores) else b.host
        cfg = checkpoint._json_config({k: v for k, v in describe(b.replace(host=like)).items() if k not in sizes})
        if ref is None:
            ref = cfg
        for k in sorted(set(cfg) | set(ref)):
            if cfg.get(k) != ref.get(k):
                raise ValueError(f"buffers[{i}]: config {k!r} is {cfg.get(k)!r:.200}, buffers[0] has {ref.get(k)!r:.200}")
    return buffers


def _draw(key: jax.Array, counts: Sequence[jax.Array], batch_size: int) -> jax.Array:
    """int32 `[batch_size]`: buffer `i` drawn with probability `counts[i] / sum(counts)` (any buffer when all are 0)."""
    w = jnp.stack(counts).astype(jnp.float32)
    logits = jnp.where(w.sum() > 0, jnp.log(w), 0.0)  # nothing valid anywhere: any buffer (its zeros)
    return jax.random.categorical(key, logits, shape=(batch_size,)).astype(jnp.int32)


def _pick(parts: list, source: jax.Array) -> Any:
    """Row `b` of `parts[source[b]]`, for pytrees `parts` of one structure and shapes, leaves `[B, ...]`."""
    rows = jnp.arange(source.shape[0])
    return jax.tree.map(lambda *xs: jnp.stack(xs)[source, rows], *parts)


_FIXED_SIZES = ("num_envs", "length", "final_obs_capacity")


class Concatenated(struct.PyTreeNode):
    """Several `CompressedTrajectoryBuffer`s of one configuration (sizes may differ) sampled as one buffer.

    A draw is uniform over the union of the buffers' valid windows: each row picks buffer `i` with probability
    `w_i / sum(w)` (`w_i`: its number of valid windows for the sampler asked) and then a window of it uniformly. Use
    it eagerly or inside `jit`; folders opened with `mode="r"` are the usual inputs. Build it with `create`.

    Attributes:
      buffers: a tuple of `CompressedTrajectoryBuffer` (the uniform class, not the prioritised one) with the same
        step spec, compressed leaves, frame stack, padding and keys.
    """

    buffers: tuple

    @classmethod
    def create(cls, buffers: Sequence[Any]) -> "Concatenated":
        """Check `buffers` (class doc) and wrap them.

        Raises:
          TypeError: not a list or tuple, no buffer, or a buffer of another class.
          ValueError: a stacked (vmapped) buffer, or a configuration field that differs from `buffers[0]`'s (the
            message names it).
        """
        return cls(buffers=_same_configuration(buffers, CompressedTrajectoryBuffer, _FIXED_SIZES))

    def size(self) -> jax.Array:
        """int32 scalar: steps stored in all buffers."""
        return sum(b.size() for b in self.buffers)

    def _check(self) -> None:
        for b in self.buffers:
            _common.check_before_dispatch(b, False)

    def _decode(self, source: jax.Array, *obs: Any) -> tuple:
        """Decode observation pytrees whose rows come from the buffers `source` names: each buffer reads its rows
        (the other rows' ids set to -1, read as zeros) and the rows are merged."""
        ref = self.buffers[0]
        out = None
        for i, b in enumerate(self.buffers):
            mine = source == i
            masked = [
                _common.replace_leaves(o, ref.leaf_index, [jnp.where(mine.reshape(mine.shape + (1,) * (x.ndim - 1)), x, -1) for x in _common.pick_leaves(o, ref.leaf_index)])
                for o in obs
            ]
            dec = b.decode_obs(*masked)
            dec = (dec,) if len(obs) == 1 else dec
            if out is None:
                out = list(dec)
                continue
            for j, d in enumerate(dec):
                leaves = [jnp.where(mine.reshape(mine.shape + (1,) * (x.ndim - 1)), x, y)
                          for x, y in zip(_common.pick_leaves(d, ref.leaf_index), _common.pick_leaves(out[j], ref.leaf_index))]
                out[j] = _common.replace_leaves(out[j], ref.leaf_index, leaves)
        return tuple(out)

    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma) -> ConcatenatedSample:
        """`CompressedTrajectoryBuffer.sample_transitions` over the union (class doc): `ConcatenatedSample` of a
        `jaxbuffers.TransitionSample` and the source buffer of each row. Raises as that method (before any read)."""
        self._check()
        _validate.key("key", key), _validate.static_int("batch_size", batch_size), _validate.static_int("n_step", n_step)
        return self._transitions(key, batch_size, n_step=n_step, gamma=gamma)

    @_compiled.method("batch_size", "n_step", scalars={"gamma": (0.0, 1.0)})
    def _transitions(self, key, batch_size: int, *, n_step: int = 1, gamma) -> ConcatenatedSample:
        keys = jax.random.split(key, len(self.buffers) + 1)
        source = _draw(keys[0], [b.trajectory.num_envs * _ring.num_windows(b.trajectory.num_valid, n_step + 1) for b in self.buffers], batch_size)
        s: TransitionSample = _pick([b.buffer.sample_transitions(k, batch_size, n_step=n_step, gamma=gamma) for b, k in zip(self.buffers, keys[1:])], source)
        obs, next_obs = self._decode(source, s.obs, s.next_obs)
        item = {**s.item, self.buffers[0].trajectory.obs_key: obs}
        return ConcatenatedSample(s._replace(obs=obs, next_obs=next_obs, item=item), source)

    def sample_sequences(self, key: jax.Array, batch_size: int, sequence_length: int, *, period: int = 1) -> ConcatenatedSample:
        """`CompressedTrajectoryBuffer.sample_sequences` (crossing episodes) over the union (class doc):
        `ConcatenatedSample` of a `jaxbuffers.SequenceSample` and the source buffer of each row. Raises as that method
        (before any read)."""
        self._check()
        _validate.key("key", key), _validate.static_int("batch_size", batch_size)
        _validate.static_int("sequence_length", sequence_length), _validate.static_int("period", period)
        return self._sequences(key, batch_size, sequence_length, period=period)

    @_compiled.method("batch_size", "sequence_length", "period")
    def _sequences(self, key, batch_size: int, sequence_length: int, *, period: int = 1) -> ConcatenatedSample:
        keys = jax.random.split(key, len(self.buffers) + 1)
        windows = [_ring.num_windows(b.trajectory.num_valid, sequence_length, period) for b in self.buffers]
        source = _draw(keys[0], [b.trajectory.num_envs * n for b, n in zip(self.buffers, windows)], batch_size)
        s: SequenceSample = _pick(
            [b.buffer.sample_sequences(k, batch_size, sequence_length, period=period) for b, k in zip(self.buffers, keys[1:])], source)
        obs_key = self.buffers[0].trajectory.obs_key
        (obs,) = self._decode(source, s.item[obs_key])
        return ConcatenatedSample(s._replace(item={**s.item, obs_key: obs}), source)


_EPISODE_SIZES = ("max_episodes", "max_timesteps", "circular")
_GAMMA = {"gamma": (0.0, 1.0)}


class ConcatenatedEpisodes(struct.PyTreeNode):
    """Several `CompressedEpisodeBuffer`s of one configuration (sizes may differ) sampled as one buffer.

    Each sampler draws uniformly over the union of what the buffers' own sampler draws from, among the episodes that
    pass `where`: episodes (`sample_episodes`), windows of `sequence_length` steps inside an episode
    (`sample_sequences`) or steps (`sample_timesteps`, `sample_transitions`). Row `b` picks buffer `i` with
    probability `u_i / sum(u)` (`u_i`: its units) and then a unit of it uniformly, so every unit of the union has
    probability `1 / sum(u)`; each row's frames are read from its own buffer only. Use it eagerly or inside `jit`;
    folders opened with `mode="r"` are the usual inputs. Build it with `create`.

    Filters (`where`): None (every stored episode), a function of one buffer's meta dict (leaves
    `[max_episodes_i, ...]`) returning a bool `[max_episodes_i]` mask, applied to each buffer, or a list or tuple
    with one such mask per buffer.

    Attributes:
      buffers: a tuple of `CompressedEpisodeBuffer` with the same step spec, meta fields, compressed leaves, frame
        stack, padding, codec and keys (`max_episodes`, `max_timesteps` and `circular` may differ).
    """

    buffers: tuple

    @classmethod
    def create(cls, buffers: Sequence[Any]) -> "ConcatenatedEpisodes":
        """Check `buffers` (class doc) and wrap them.

        Raises:
          TypeError: no buffer, or a buffer of another class.
          ValueError: a stacked (vmapped) buffer; a configuration field other than the sizes that differs from
            `buffers[0]`'s (named).
        """
        return cls(buffers=_same_configuration(buffers, CompressedEpisodeBuffer, _EPISODE_SIZES))

    def size(self) -> jax.Array:
        """int32 scalar: steps stored in all buffers."""
        return sum(b.buffer.size() for b in self.buffers)

    def num_episodes(self) -> jax.Array:
        """int32 scalar: episodes stored in all buffers."""
        return sum(b.num_episodes() for b in self.buffers)

    def _masks(self, where) -> tuple:
        """One filter per buffer (None, or its bool `[max_episodes_i]` mask, checked by the buffer's sampler)."""
        n = len(self.buffers)
        if where is None:
            return (None,) * n
        if callable(where):
            masks, names = [where(b.buffer.meta) for b in self.buffers], [f"where(buffers[{i}].meta)" for i in range(n)]
        else:
            masks, names = _validate.one_each("where", where, n, "buffer; or None, or a function of the meta dict"), [f"where[{i}]" for i in range(n)]
        return tuple(_validate.array(name, m, (b.max_episodes,), bool) for name, m, b in zip(names, masks, self.buffers))

    def can_sample(self, batch_size: int, *, where=None) -> jax.Array:
        """bool scalar: some buffer `can_sample` with its filter (`sample_episodes`, `sample_timesteps` and
        `sample_transitions` return only valid data)."""
        return jnp.any(jnp.stack([b.can_sample(batch_size, where=m) for b, m in zip(self.buffers, self._masks(where))]))

    def can_sample_sequences(self, batch_size: int, sequence_length: int, *, where=None) -> jax.Array:
        """bool scalar: some buffer `can_sample_sequences` with its filter."""
        return jnp.any(jnp.stack([
            b.can_sample_sequences(batch_size, sequence_length, where=m) for b, m in zip(self.buffers, self._masks(where))]))

    def _check(self) -> None:
        for b in self.buffers:
            _common.check_before_dispatch(b, False)

    def _units(self, masks: tuple, per_episode) -> list[jax.Array]:
        """Per buffer, the sum over its stored episodes passing its mask of `per_episode(lengths)` (int32 `[E_i]`)."""
        out = []
        for b, m in zip(self.buffers, masks):
            inner = b.buffer
            passing = jnp.arange(inner.max_episodes) < inner.num_valid  # stored slots (jaxbuffers.episode module doc)
            passing = passing if m is None else passing & m
            out.append(jnp.sum(jnp.where(passing, per_episode(inner.lengths), 0)))
        return out

    def _merged(self, key: jax.Array, batch_size: int, units: list[jax.Array], masks: tuple, sample, finish=None) -> ConcatenatedSample:
        """Draw each row's buffer, sample `batch_size` rows of every buffer's inner buffer (`sample(b, key, mask)`,
        compressed leaves still placeholders), decode each buffer's own rows only (then `finish`) and merge them."""
        keys = jax.random.split(key, len(self.buffers) + 1)
        source = _draw(keys[0], units, batch_size)
        finish = finish or (lambda s: s)
        parts = [finish(b.decode(sample(b, k, m), rows=source == i)) for i, (b, k, m) in enumerate(zip(self.buffers, keys[1:], masks))]
        return ConcatenatedSample(_pick(parts, source), source)

    def sample_episodes(self, key: jax.Array, batch_size: int, *, where=None) -> ConcatenatedSample:
        """`CompressedEpisodeBuffer.sample_episodes` over the union (class doc): a `ConcatenatedSample` of a
        `jaxbuffers.EpisodeSample` whose steps are padded (zeros, `mask` False) to the largest `max_timesteps`."""
        self._check()
        return self._episodes(_validate.key("key", key), _validate.static_int("batch_size", batch_size), self._masks(where))

    @_compiled.method("batch_size")
    def _episodes(self, key, batch_size: int, masks) -> ConcatenatedSample:
        t = max(b.max_timesteps for b in self.buffers)

        def padded(s: EpisodeSample) -> EpisodeSample:
            pad = lambda x: jnp.pad(x, [(0, 0), (0, t - x.shape[1])] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
            return s._replace(item=jax.tree.map(pad, s.item), mask=pad(s.mask))

        sample = lambda b, k, m: b.buffer.sample_episodes(k, batch_size, where=m)  # noqa: E731
        return self._merged(key, batch_size, self._units(masks, jnp.ones_like), masks, sample, padded)

    def sample_sequences(self, key: jax.Array, batch_size: int, sequence_length: int, *, where=None) -> ConcatenatedSample:
        """`CompressedEpisodeBuffer.sample_sequences` over the union of the windows (class doc); `sequence_length` at
        most every buffer's `max_timesteps`."""
        self._check()
        batch_size, length = _validate.static_int("batch_size", batch_size), _validate.static_int("sequence_length", sequence_length)
        return self._sequences(_validate.key("key", key), batch_size, length, self._masks(where))

    @_compiled.method("batch_size", "sequence_length")
    def _sequences(self, key, batch_size: int, sequence_length: int, masks) -> ConcatenatedSample:
        units = self._units(masks, lambda n: jnp.maximum(n - sequence_length + 1, 0))
        sample = lambda b, k, m: b.buffer.sample_sequences(k, batch_size, sequence_length, where=m)  # noqa: E731
        return self._merged(key, batch_size, units, masks, sample)

    def sample_timesteps(self, key: jax.Array, batch_size: int, *, where=None) -> ConcatenatedSample:
        """`CompressedEpisodeBuffer.sample_timesteps` over the union of the steps (class doc)."""
        self._check()
        return self._timesteps(_validate.key("key", key), _validate.static_int("batch_size", batch_size), self._masks(where))

    @_compiled.method("batch_size")
    def _timesteps(self, key, batch_size: int, masks) -> ConcatenatedSample:
        sample = lambda b, k, m: b.buffer.sample_timesteps(k, batch_size, where=m)  # noqa: E731
        return self._merged(key, batch_size, self._units(masks, lambda n: n), masks, sample)

    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma, where=None) -> ConcatenatedSample:
        """`CompressedEpisodeBuffer.sample_transitions` over the union of the steps (class doc); `n_step` at most
        every buffer's `max_timesteps`."""
        self._check()
        batch_size, n_step = _validate.static_int("batch_size", batch_size), _validate.static_int("n_step", n_step)
        return self._transitions(_validate.key("key", key), batch_size, n_step, gamma, self._masks(where))

    @_compiled.method("batch_size", "n_step", scalars=_GAMMA)
    def _transitions(self, key, batch_size: int, n_step: int, gamma, masks) -> ConcatenatedSample:
        sample = lambda b, k, m: b.buffer.sample_transitions(k, batch_size, n_step=n_step, gamma=gamma, where=m)  # noqa: E731
        return self._merged(key, batch_size, self._units(masks, lambda n: n), masks, sample)
