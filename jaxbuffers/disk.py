"""Disk-backed buffers: a compressed buffer whose host stores are files in a folder, and several folders sampled as one.

`open(directory, "w", buffer)` moves the host half of an empty compressed buffer (`CompressedTrajectoryBuffer`,
`CompressedPrioritisedTrajectoryBuffer`, `CompressedRolloutBuffer`, `CompressedEpisodeBuffer`) into a folder, one store
per compressed leaf, read and written with positioned system calls (never a memory map), so data larger than memory
stays on disk and reading it does not grow the process's resident memory:

* codec `"none"`: a `host_codecs.FileStore`, two `.npy` files of `[num_slots, *frame_shape]`, a slot the last flush
  named rewritten in its other copy;
* any other codec (`"zstd:3"`, `"rle"`, `"igzip:1"`, with the zstd dictionary and `keyframe_interval > 1` delta
  chains as in memory): a `host_codecs.chunk_arena.ChunkFileStore`, payloads appended to chunk files, its index in
  memory, each read fetching the payloads it decodes in a few batched `os.preadv` calls.

Everything else is unchanged: `add` writes through the same exactly-once host callback, samplers read through the same
versioned callback, under `jit` and eagerly, and a sample equals the in-memory buffer's.

`flush(buffer)` commits the folder as of that buffer state (the files and their commit: `jaxbuffers._disk_folder`,
format version `FORMAT_VERSION`; version 1 and 2 folders still open). Reopened with `"r"` or `"r+"`, the folder gives
the buffer as of its last completed flush, exactly, also after a crash at any point of an add or a flush.

One writer per folder: `"w"` and `"r+"` hold the folder's lock until `close()` (or until the process ends); another
writable open raises `FolderLockedError`. `"r"` takes no lock and opens the last completed flush, also while a writer
works (`jaxbuffers._disk_folder`, One writer, Read only).

`Concatenated.create(buffers)` samples several trajectory buffers (open folders, or in-memory compressed buffers of
the same configuration) as one, uniformly over the union of their valid windows; `ConcatenatedEpisodes.create`
does the same for episode buffers (episodes, sequences, steps and n-step transitions, with meta filters).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import struct

from host_codecs import dtype_from_code
from host_codecs.file_store import ReadOnlyError
from jaxbuffers import _compiled, _disk_folder, _timing, _validate, checkpoint
from jaxbuffers._checkpoint_describe import config_differences, differences_text
from jaxbuffers._disk_folder import FORMAT_VERSION, DiskStores, FolderLockedError
from jaxbuffers.compressed import _common
from jaxbuffers.compressed._host import Closing, HostStores, StaleBufferError
from jaxbuffers.compressed.episode import CompressedEpisodeBuffer
from jaxbuffers.compressed.trajectory import CompressedTrajectoryBuffer
from jaxbuffers.episode import EpisodeSample
from jaxbuffers.trajectory import SequenceSample, TransitionSample

__all__ = [
    "FORMAT_VERSION", "ReadOnlyError", "FolderLockedError", "DiskStores", "open", "flush", "Concatenated", "ConcatenatedEpisodes", "ConcatenatedSample",
]

_MODES = ("w", "r+", "r")
_READ_ATTEMPTS = 5


def flush(buffer: Any) -> Path:
    """Commit the folder of a disk-backed buffer as `buffer` (`jaxbuffers._disk_folder`, Flush): entries synced to
    disk, then new index files, slot versions and device state, then `disk.json` in one rename.

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
        _disk_folder.commit(host, buffer.replace(host=host.like))
    return host.directory


def open(directory: str | os.PathLike, mode: str = "r", buffer: Any = None) -> Any:  # noqa: A001 - the file verb
    """Open (or, with `mode="w"`, create) the folder of a disk-backed buffer.

    Args:
      directory: the folder.
      mode: `"w"`: create it from `buffer` (an existing disk folder there is replaced; any other non-empty folder is
        refused); `"r+"`: reopen it to sample and add (files of an interrupted flush are deleted); `"r"`: reopen it
        to sample only (adds and `flush` raise `ReadOnlyError`, and the files are opened read-only). `"w"` and `"r+"`
        hold the folder's lock until the buffer's `close()`: one writer per folder (module doc).
      buffer: with `"w"`, the empty compressed buffer (no add yet) whose configuration the folder takes; with `"r"` /
        `"r+"`, optionally a buffer (concrete or from `jax.eval_shape`) whose class and configuration the folder
        must have; its `chunk_bytes` (a tuning of the arena) may differ: the folder's own chunking wins.

    Returns:
      The disk-backed buffer: with `"w"` the empty buffer, else the state of the folder's last completed flush, its
      device arrays on the default device and its host stores the folder's files.

    Raises:
      TypeError: `directory` not a path; with `"r"` / `"r+"`, a `buffer` that is not a jaxbuffers buffer.
      ValueError: a bad `mode`; with `"w"`, a `buffer` that is not an empty compressed buffer, or has
        `keyframe_interval > 1` with `codec="none"`.
      FileExistsError: `"w"` on a non-empty folder that is not a disk folder (nothing is deleted).
      NotADirectoryError: `"w"` where `directory` or a path above it is a file (naming it).
      FolderLockedError: `"w"` / `"r+"` on a folder another writable handle holds, in this process or another (the
        message names the folder and the holder's pid; nothing is read or deleted).
      CheckpointError: `"r"` / `"r+"` on a folder that is missing, corrupt, of a format version this jaxbuffers does
        not read, or of another class or configuration than `buffer` (the message names the file or the field).
    """
    d = _validate.path("directory", directory).absolute()
    _validate.choice("mode", mode, _MODES)
    if mode == "w":
        return _create(d, buffer)
    if buffer is not None:
        checkpoint._entry(buffer, "buffer")  # a TypeError naming this argument (restore calls it target)
    if mode == "r":
        for attempt in range(_READ_ATTEMPTS):  # a writer may commit (and delete the files we read) meanwhile
            seen = _disk_folder.commit_id(d)
            try:
                out = _reopen(d, mode, buffer, None)
            except (checkpoint.CheckpointError, OSError):
                if attempt + 1 == _READ_ATTEMPTS or _disk_folder.commit_id(d) == seen:
                    raise
                continue
            if _disk_folder.commit_id(d) == seen:
                out.host.opened_at = seen
                return out
            out.host.close()
        raise checkpoint.CheckpointError(f"{d}: a writer committed {_READ_ATTEMPTS} flushes while this open read the folder; retry")
    lock = _disk_folder.FolderLock(d) if (d / "disk.json").is_file() else None  # else: read_meta names what is missing
    try:
        return _reopen(d, mode, buffer, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _with_folder_chunking(buffer: Any, state: Path) -> Any:
    """`buffer` with host stores of the `chunk_bytes` the folder's state (`state/buffer.json`) was written with, when
    that is all that differs: the arena chunk size is a tuning, and the folder's chunk files keep their own."""
    try:
        saved = json.loads((state / "buffer.json").read_text())["config"]["chunk_bytes"]
    except (OSError, ValueError, KeyError, TypeError):
        return buffer  # restore names what is wrong with the folder
    cls, describe = checkpoint._CLASSES.get(type(buffer).__name__, (None, None))
    if not isinstance(getattr(buffer, "host", None), HostStores) or _validate.member_axes(buffer) or type(saved) is not int:
        return buffer
    cfg = describe(buffer)
    if cfg["chunk_bytes"] == saved:
        return buffer
    example, cfg = cfg.pop("example"), {**cfg, "compress": tuple(cfg["compress"]), "chunk_bytes": saved}
    try:
        return buffer.replace(host=jax.eval_shape(lambda: cls.create(example, **cfg)).host)
    except (TypeError, ValueError):  # restore names what differs
        return buffer


def _reopen(d: Path, mode: str, buffer: Any, lock: Any) -> Any:
    """`open` with `"r"` or `"r+"` (the folder's lock held for `"r+"`)."""
    meta = _disk_folder.read_meta(d)
    state = _disk_folder.state_path(d, meta)
    if buffer is not None:
        buffer = _with_folder_chunking(buffer, state)
    try:
        restored = checkpoint.restore(state, buffer, progress=False)
    except checkpoint.CheckpointError as e:  # restore's target is this function's buffer
        if buffer is not None and "target" in str(e):
            raise checkpoint.CheckpointError(f"buffer: {e}") from None
        raise
    like = getattr(restored, "host", None)
    if not isinstance(like, HostStores):
        raise checkpoint.CheckpointError(f"{state}: holds a {type(restored).__name__}, not a compressed buffer")
    if meta["num_slots"] != like.num_slots and like.codec != "none":  # an older layout's folder (its chunk indexes grow)
        upgraded = checkpoint._upgraded(restored, meta["num_slots"])
        if upgraded is not None:
            restored, n = upgraded, like.num_slots
            meta = {**meta, "num_slots": n, "stores": [{**m, "meta": {**m["meta"], "config": {**m["meta"]["config"], "num_slots": n}}}
                                                      for m in meta["stores"]]}
    if getattr(restored, "keyframe_interval", None) == 1:  # saved before `K = 1` dropped its unused delta codec
        meta = {**meta, "stores": [{**m, "meta": {**m["meta"], "config": {**m["meta"]["config"], "delta_codec": None}}}
                                   if isinstance(m.get("meta"), dict) and "config" in m["meta"] else m for m in meta["stores"]]}
    kind = "raw" if like.codec == "none" else "chunks"
    want = [{"name": n, "shape": list(s._declared[1]), "dtype": dtype_from_code(s._declared[0]).name, "kind": kind} for n, s in zip(like.names, like.stores)]
    saved = [{k: s.get(k, "raw") for k in ("name", "shape", "dtype", "kind")} for s in meta["stores"]]  # version 1: raw stores
    stores = ([(f"stores[{i}]", a, b) for i, (a, b) in enumerate(zip(saved, want))] if len(saved) == len(want)
              else [("stores", saved, want)])  # the store that differs, by its index
    for field, on_disk, ours in (("num_slots", meta["num_slots"], like.num_slots), *stores):
        if on_disk != ours:
            raise checkpoint.CheckpointError(f"{d / 'disk.json'}: {field} is {on_disk!r:.200}, the buffer in {state.name}/ needs {ours!r:.200}")
    if mode == "r+":
        _disk_folder.sweep(d, meta)
    try:
        host = DiskStores(d, like, mode, meta, lock)
    except ValueError as e:
        raise checkpoint.CheckpointError(str(e)) from None
    except (TypeError, KeyError, AttributeError, FileNotFoundError) as e:  # a store's entry of disk.json, damaged
        raise checkpoint.CheckpointError(f"{d / 'disk.json'}: stores: an entry this jaxbuffers cannot read "
                                         f"({type(e).__name__}: {e})") from None
    try:
        sv, path = _disk_folder.slot_versions(d, meta)
        try:
            host.set_slot_versions(sv, str(path))
        except ValueError as e:
            raise checkpoint.CheckpointError(str(e)) from None
        host.version, host.num_writes, host.num_rows = (int(meta["host"][k]) for k in ("version", "num_writes", "num_rows"))
        if int(restored.version) != host.version:
            raise checkpoint.CheckpointError(
                f"{d}: {state.name}/ holds version {int(restored.version)}, disk.json version {host.version} (a flush was interrupted)")
    except BaseException:  # close the files opened (and release the lock, which `open` would release anyway)
        host.close()
        raise
    return restored.replace(host=host)


def _create(d: Path, buffer: Any) -> Any:
    like = getattr(buffer, "host", None)
    if not isinstance(like, HostStores) or isinstance(like, DiskStores):
        raise ValueError(f"buffer: expected an in-memory compressed buffer for mode='w', got {type(buffer).__name__}")
    if like.codec == "none" and getattr(buffer, "keyframe_interval", 1) != 1:
        raise ValueError(
            f"buffer: keyframe_interval={buffer.keyframe_interval} with codec='none'; a raw disk-backed store holds every "
            f"frame whole: create it with keyframe_interval=1, or with a codec such as 'zstd:3'"
        )
    if like.version or int(buffer.version):
        raise ValueError(f"buffer: expected an empty buffer (no add yet), got one at version {int(buffer.version)}")
    checkpoint._check_folder_path(d)
    if d.exists() and any(p.name != _disk_folder.LOCK_NAME for p in d.iterdir()) and not (d / "disk.json").is_file():
        raise FileExistsError(f"directory: {d} exists, is not empty and is not a jaxbuffers disk folder; refusing to replace it")
    d.mkdir(parents=True, exist_ok=True)
    lock = _disk_folder.FolderLock(d)  # before anything of a folder another handle may be writing is deleted
    out = None
    try:
        for p in d.iterdir():
            if p.name != _disk_folder.LOCK_NAME:
                _disk_folder.remove(p)
        out = buffer.replace(host=DiskStores(d, like, "w", lock=lock))
        flush(out)
    except BaseException:
        if out is not None:  # the files it created stay; their descriptors close
            out.host.close()
        lock.release()
        raise
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
      TypeError: not a list or tuple (naming its type only: a buffer's repr is its arrays), or a buffer of another
        class.
      ValueError: no buffer, a stacked (vmapped) buffer, a buffer (or a folder, its path resolved) given twice (the
        message names both positions), or a configuration field that differs from `buffers[0]`'s (the message names
        it).
    """
    if not isinstance(buffers, (list, tuple)):
        one = " (one buffer: [buffer])" if isinstance(buffers, cls) else ""
        raise TypeError(f"buffers: expected a list of {cls.__name__}s, got {type(buffers).__name__}{one}")
    if not buffers:
        raise ValueError(f"buffers: expected at least one {cls.__name__}, got an empty {type(buffers).__name__}")
    buffers = tuple(buffers)
    describe = checkpoint._CLASSES[cls.__name__][1]
    ref, seen = None, {}
    for i, b in enumerate(buffers):
        if type(b) is not cls:
            raise TypeError(f"buffers[{i}]: expected a {cls.__name__}, got {type(b).__name__}")
        key = Path(b.host.directory).resolve() if isinstance(b.host, DiskStores) else id(b.host)
        if key in seen:  # it would be sampled with double weight and closed twice
            what = f"folder {key}" if isinstance(key, Path) else "buffer"
            raise ValueError(f"buffers[{i}]: the {what} of buffers[{seen[key]}] again")
        seen[key] = i
        _validate.unstacked(f"buffers[{i}]", b, "give one member's state, jax.tree.map(lambda x: x[j], buffer)")
        like = b.host.like if isinstance(b.host, DiskStores) else b.host
        cfg = checkpoint._json_config({k: v for k, v in describe(b.replace(host=like)).items() if k not in sizes})
        if ref is None:
            ref = cfg
        differences = config_differences(cfg, ref, (f"buffers[{i}]", "buffers[0]"))
        if differences:
            raise ValueError(f"buffers[{i}]: {differences_text(differences)}")
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


class _Several(Closing):
    """`close` of `Concatenated` and `ConcatenatedEpisodes`."""

    def close(self) -> None:
        """Close every buffer (`close`: a folder's files and its lock); `with Concatenated.create(...) as both:` does
        it when the block ends."""
        for b in self.buffers:
            b.close()


@_timing.timed_methods
class Concatenated(_Several, struct.PyTreeNode):
    """Several `CompressedTrajectoryBuffer`s of one configuration (sizes may differ) sampled as one buffer.

    A draw is uniform over the union of the buffers' valid windows: each row picks buffer `i` with probability
    `w_i / sum(w)` (`w_i`: its number of valid windows for the sampler asked) and then a window of it uniformly. Use
    it eagerly or inside `jit`; folders opened with `mode="r"` are the usual inputs. Build it with `create`; `close()`
    (or a `with` block) closes every buffer.

    Attributes:
      buffers: a tuple of `CompressedTrajectoryBuffer` (the uniform class, not the prioritised one) with the same
        step spec, compressed leaves, frame stack, padding and keys.
    """

    buffers: tuple

    @classmethod
    def create(cls, buffers: Sequence[Any]) -> "Concatenated":
        """Check `buffers` (class doc) and wrap them.

        Raises:
          TypeError: not a list or tuple (naming its type), or a buffer of another class.
          ValueError: no buffer, a stacked (vmapped) buffer, a buffer or folder given twice (both positions named),
            or a configuration field that differs from `buffers[0]`'s (the message names it).
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

    @_common.reads_of(lambda self: self.buffers)
    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma) -> ConcatenatedSample:
        """`CompressedTrajectoryBuffer.sample_transitions` over the union (class doc): `ConcatenatedSample` of a
        `jaxbuffers.TransitionSample` and the source buffer of each row. Raises as that method (before any read)."""
        self._check()
        _validate.key("key", key), _validate.static_int("batch_size", batch_size), _validate.static_int("n_step", n_step)
        return self._transitions(key, batch_size, n_step=n_step, gamma=gamma)

    @_compiled.method("batch_size", "n_step", scalars={"gamma": (0.0, 1.0)})
    def _transitions(self, key, batch_size: int, *, n_step: int = 1, gamma) -> ConcatenatedSample:
        keys = jax.random.split(key, len(self.buffers) + 1)
        source = _draw(keys[0], [b.trajectory.num_valid_windows(n_step + 1) for b in self.buffers], batch_size)
        s: TransitionSample = _pick([b.buffer.sample_transitions(k, batch_size, n_step=n_step, gamma=gamma) for b, k in zip(self.buffers, keys[1:])], source)
        obs, next_obs = self._decode(source, s.obs, s.next_obs)
        item = {**s.item, self.buffers[0].trajectory.obs_key: obs}
        return ConcatenatedSample(s._replace(obs=obs, next_obs=next_obs, item=item), source)

    @_common.reads_of(lambda self: self.buffers)
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
        source = _draw(keys[0], [b.trajectory.num_valid_windows(sequence_length, period=period) for b in self.buffers], batch_size)
        s: SequenceSample = _pick(
            [b.buffer.sample_sequences(k, batch_size, sequence_length, period=period) for b, k in zip(self.buffers, keys[1:])], source)
        obs_key = self.buffers[0].trajectory.obs_key
        (obs,) = self._decode(source, s.item[obs_key])
        return ConcatenatedSample(s._replace(item={**s.item, obs_key: obs}), source)


_EPISODE_SIZES = ("max_episodes", "max_timesteps", "circular")
_GAMMA = {"gamma": (0.0, 1.0)}


@_timing.timed_methods
class ConcatenatedEpisodes(_Several, struct.PyTreeNode):
    """Several `CompressedEpisodeBuffer`s of one configuration (sizes may differ) sampled as one buffer.

    Each sampler draws uniformly over the union of what the buffers' own sampler draws from, among the episodes that
    pass `where`: episodes (`sample_episodes`), windows of `sequence_length` steps inside an episode
    (`sample_sequences`) or steps (`sample_timesteps`, `sample_transitions`). Row `b` picks buffer `i` with
    probability `u_i / sum(u)` (`u_i`: its units) and then a unit of it uniformly, so every unit of the union has
    probability `1 / sum(u)`; each row's frames are read from its own buffer only. Use it eagerly or inside `jit`;
    folders opened with `mode="r"` are the usual inputs. Build it with `create`; `close()` (or a `with` block) closes
    every buffer.

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
          TypeError: not a list or tuple (naming its type), or a buffer of another class.
          ValueError: no buffer, a stacked (vmapped) buffer, a buffer or folder given twice (both positions named);
            a configuration field other than the sizes that differs from `buffers[0]`'s (named).
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
        """bool scalar: some buffer whose `max_timesteps` is at least `sequence_length` `can_sample_sequences` with
        its filter (a shorter buffer holds no such window).

        Raises:
          ValueError: `sequence_length` above every buffer's `max_timesteps` (`sample_sequences`).
        """
        masks, long = self._masks(where), self._long_enough(sequence_length)
        return jnp.any(jnp.stack([self.buffers[i].can_sample_sequences(batch_size, sequence_length, where=masks[i]) for i in long]))

    def _long_enough(self, sequence_length) -> tuple[int, ...]:
        """The buffers whose episodes can hold a window of `sequence_length` steps (`max_timesteps` at least that)."""
        length = _validate.static_int("sequence_length", sequence_length)
        long = tuple(i for i, b in enumerate(self.buffers) if b.max_timesteps >= length)
        if not long:
            raise ValueError(f"sequence_length: expected at most the largest max_timesteps of the buffers, got {length} "
                             f"(max_timesteps: {[b.max_timesteps for b in self.buffers]})")
        return long

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

    def _merged(self, key: jax.Array, batch_size: int, units: list[jax.Array], masks: tuple, sample, finish=None,
                among: tuple[int, ...] | None = None) -> ConcatenatedSample:
        """Draw each row's buffer among the buffers `among` (default: all), sample `batch_size` rows of each of those
        buffers' inner buffer (`sample(b, key, mask)`, compressed leaves still placeholders), decode each buffer's own
        rows only (then `finish`) and merge them."""
        among = tuple(range(len(self.buffers))) if among is None else among
        keys = jax.random.split(key, len(self.buffers) + 1)
        local = _draw(keys[0], [units[i] for i in among], batch_size)
        finish = finish or (lambda s: s)
        parts = [finish(self.buffers[i].decode(sample(self.buffers[i], keys[1 + i], masks[i]), rows=local == j))
                 for j, i in enumerate(among)]
        return ConcatenatedSample(_pick(parts, local), jnp.asarray(among, jnp.int32)[local])

    @_common.reads_of(lambda self: self.buffers)
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

    @_common.reads_of(lambda self: self.buffers)
    def sample_sequences(self, key: jax.Array, batch_size: int, sequence_length: int, *, where=None) -> ConcatenatedSample:
        """`CompressedEpisodeBuffer.sample_sequences` over the union of the windows (class doc). A buffer whose
        `max_timesteps` is below `sequence_length` holds no window: its rows are never drawn.

        Raises:
          ValueError: `sequence_length` above every buffer's `max_timesteps` (naming each); the buffers' errors.
        """
        self._check()
        batch_size = _validate.static_int("batch_size", batch_size)
        self._long_enough(sequence_length)
        return self._sequences(_validate.key("key", key), batch_size, sequence_length, self._masks(where))

    @_compiled.method("batch_size", "sequence_length")
    def _sequences(self, key, batch_size: int, sequence_length: int, masks) -> ConcatenatedSample:
        units = self._units(masks, lambda n: jnp.maximum(n - sequence_length + 1, 0))
        sample = lambda b, k, m: b.buffer.sample_sequences(k, batch_size, sequence_length, where=m)  # noqa: E731
        return self._merged(key, batch_size, units, masks, sample, among=self._long_enough(sequence_length))

    @_common.reads_of(lambda self: self.buffers)
    def sample_timesteps(self, key: jax.Array, batch_size: int, *, where=None) -> ConcatenatedSample:
        """`CompressedEpisodeBuffer.sample_timesteps` over the union of the steps (class doc)."""
        self._check()
        return self._timesteps(_validate.key("key", key), _validate.static_int("batch_size", batch_size), self._masks(where))

    @_compiled.method("batch_size")
    def _timesteps(self, key, batch_size: int, masks) -> ConcatenatedSample:
        sample = lambda b, k, m: b.buffer.sample_timesteps(k, batch_size, where=m)  # noqa: E731
        return self._merged(key, batch_size, self._units(masks, lambda n: n), masks, sample)

    @_common.reads_of(lambda self: self.buffers)
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
