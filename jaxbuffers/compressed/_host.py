"""Host half of the compressed buffers: the stores, the host side of the write/read callbacks, and their versions.

The rules (exactly-once ordered writes, versioned reads, stale states refused, no vmap, one store per shard):
`docs/api/compressed.md`, "Device and host".
"""

from __future__ import annotations

import threading
from typing import Sequence

import jax
import numpy as np
from flax import struct

from host_codecs import CompressedStore, dtype_from_code, get_codec
from host_codecs.slot_index import grown_rows
from jaxbuffers import _validate
from jaxbuffers._wrapper import Wrapper

__all__ = ["DEFAULT_DELTA_CODEC", "DEFAULT_DICTIONARY_BYTES", "DEFAULT_KEYFRAME_INTERVAL", "HostStores", "ShardedHostStores", "StaleBufferError"]

#: Most bytes of the zstd dictionary a store builds from its first 1,024 frames with a zstd codec (84x84 Atari frames
#: at level -1: smaller than with 16 KiB, Breakout about 97 against 99 B, Pong 92 against 96 B, and than with 64 KiB).
DEFAULT_DICTIONARY_BYTES = 32768

DEFAULT_DELTA_CODEC = "rle"
"""Codec of the delta frames of the temporal coding unless `delta_codec=` is given: the XOR of two consecutive frames
of a lane is mostly zeros, which run-length coding stores compactly and decodes in one compiled loop straight into
the base frame's copy (`host_codecs.rle`); keyframes keep `codec` (and its zstd dictionary)."""

DEFAULT_KEYFRAME_INTERVAL = 8
"""Frames per chain of the temporal coding unless `keyframe_interval=` is given (a keyframe every 8 frames; with
`codec="none"` every frame is whole, K = 1)."""


def keyframe_interval_of(keyframe_interval: int | None, codec: str, delta_codec: str | None) -> tuple[int, str | None]:
    """`(K, delta codec)` of a `create`: `keyframe_interval` checked (None: `DEFAULT_KEYFRAME_INTERVAL`, 1 with
    `codec="none"`), and `delta_codec`, None when `K = 1` (never built). ValueError: not a positive int; a bad codec."""
    if keyframe_interval is None:
        keyframe_interval = 1 if get_codec(codec).name == "none" else DEFAULT_KEYFRAME_INTERVAL
    key = _validate.static_int("keyframe_interval", keyframe_interval)
    return key, (delta_codec if key > 1 else None)


def _aligned_empty(shape: tuple[int, ...], dtype, align: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an `align`-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start : start + nbytes].view(dtype).reshape(shape)


class StaleBufferError(RuntimeError):
    """A read or write used a buffer state older than the host store's contents."""


class HostStores:
    """One `host_codecs.CompressedStore` per compressed leaf, sharing slot numbering.

    Args:
      num_slots: slots per store (every compressed leaf uses the same slot ids).
      codec: codec name of the stores (`"zstd:3"`, `"igzip:1"`, `"rle"`, `"none"`...).
      item_shapes: per compressed leaf, the shape of one entry (a frame).
      dtypes: per compressed leaf, its dtype.
      names: per compressed leaf, its name in error messages.
      chunk_bytes: largest arena chunk of each store.
      dictionary_bytes: most bytes of each store's zstd dictionary (`None`: `DEFAULT_DICTIONARY_BYTES` for a zstd
        codec, else 0; 0: none). ValueError: > 0 with another codec.
      delta_codec: codec of the stores' delta frames (None: `codec`).
    """

    def __init__(
        self, num_slots: int, codec: str, item_shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype],
        names: Sequence[str], chunk_bytes: int = 64 << 20, dictionary_bytes: int | None = None,
        delta_codec: str | None = None,
    ):
        zstd = get_codec(codec).name == "zstd"
        if dictionary_bytes is None:
            dictionary_bytes = DEFAULT_DICTIONARY_BYTES if zstd else 0
        elif dictionary_bytes and not zstd:
            raise ValueError(f"dictionary_bytes: dictionaries are for zstd codecs, got codec={codec!r} (pass 0 or None)")
        self.names = tuple(str(n) for n in names)
        self.stores = [
            CompressedStore(
                num_slots, codec, item_shape=tuple(s), dtype=d, chunk_bytes=chunk_bytes,
                min_chunk_bytes=min(64 << 10, chunk_bytes),  # buffers expose only chunk_bytes
                dictionary_bytes=dictionary_bytes, name=n, delta_codec=delta_codec,
            )
            for s, d, n in zip(item_shapes, dtypes, self.names)
        ]
        self.num_slots = int(num_slots)
        self.codec = codec
        self.version = 0  # writes so far; the version a buffer state carries
        # shape=(rows,), int32: version that last wrote each slot below rows <= num_slots (0 past it: never written)
        self.slot_version = np.zeros(grown_rows(0, 1, self.num_slots), np.int32)  # never empty: a checkpoint writes it
        self.num_writes = 0  # write callbacks executed (tests count these)
        self.num_rows = 0  # entries put, summed over writes (one row = one slot in every store)
        self.num_reads = 0  # read callbacks executed
        self._lock = threading.Lock()  # one writer at a time (held for a whole write)
        self._versions_lock = threading.Lock()  # slot_version and num_reads (held briefly)
        self.closed = False
        self._items = [(tuple(s), np.dtype(d)) for s, d in zip(item_shapes, dtypes)]
        # (version, {slot: one frame per store}): the frames the newest writes kept (`write(recent=)`) for
        # `read_recent`; replaced (never mutated) by each write, so a reader's snapshot stays whole
        self._recent: tuple[int, dict] = (0, {})

    # Identity semantics on purpose (one compiled program per buffer): do not define __eq__/__hash__.

    num_operands = 0  # len(operands()), known on the host too (a callback cannot call operands())

    def operands(self) -> tuple:
        """The leading operands of every callback to these stores: none (`ShardedHostStores` passes its shard)."""
        return ()

    def __repr__(self) -> str:
        return f"HostStores(leaves={list(self.names)}, num_slots={self.num_slots}, codec={self.codec!r}, version={self.version})"

    @property
    def nbytes(self) -> int:
        """Host bytes held: every store's `nbytes` (arena + index + dictionary + recent rows), `slot_version`, and the
        frames the newest writes kept for `read_recent` (`recent_nbytes`)."""
        return sum(s.nbytes for s in self.stores) + self.slot_version.nbytes + self.recent_nbytes

    @property
    def recent_nbytes(self) -> int:
        """Bytes of the frames the newest writes kept (`write(recent=)`, at most its cap of frames per store)."""
        return sum(f.nbytes for frames in self._recent[1].values() for f in frames)

    @property
    def arena_nbytes(self) -> int:
        """Bytes of the stores' arena chunks: the payload capacity held (live payloads and slack)."""
        return sum(s.arena_nbytes for s in self.stores)

    @property
    def live_nbytes(self) -> int:
        """`nbytes` with only the live payloads counted of the arenas (no padding, freed or unused space)."""
        return self.nbytes - self.arena_nbytes + sum(s.payload_nbytes for s in self.stores)

    def close(self) -> None:
        """Release the payload memory now (a non-blocking save in flight keeps the chunks it writes until written);
        later reads and writes raise."""
        with self._lock:
            for s in self.stores:
                s.clear()
            self._recent = (-1, {})
            self.closed = True

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise RuntimeError(f"compressed buffer: {what} after close(); create a new buffer")

    def check_state(self, what: str, version: int | None = None) -> None:
        """Checks made before an eager call is dispatched (nothing has run yet).

        Raises:
          RuntimeError: the store was closed.
          StaleBufferError: `version` (an add's) is not the store's: this state, or one derived from it, was added to.
        """
        self._check_open(what)
        if version is not None and version != self.version:
            raise StaleBufferError(
                f"compressed buffer {what}: this buffer state has version {version} but its host store is at version "
                f"{self.version}; only the state returned by the last add can be added to (refused before anything "
                f"ran: the newer state and the store are unchanged)"
            )

    def write(self, version, slots, valid, *datas, bases=None, recent=None) -> np.ndarray:
        """Host side of an add: put `datas[i][valid]` into store `i` at `slots[valid]`; returns the new version.

        Args (numpy):
          version: int32 scalar, the version of the state added to. slots: int32 `[M]`. valid: bool `[M]`.
          datas: one `[M, *item_shape]` array per store.
          bases: int32 `[M]` or None: row `r` is a delta against slot `bases[r]` (-1: whole).
          recent: `(rows, cap)` or None: bool `[M]`, the rows `read_recent` serves from memory (copies) until a
            later write replaces them, and the most frames kept over successive writes (oldest dropped first).

        Raises (before anything is written):
          StaleBufferError: `version` is not the store's (the state was already added to: a fork).
          ValueError: `datas` do not match the stores (count, rows, item shape or dtype).
        """
        self._check_open("add")
        version = int(np.asarray(version))
        valid = np.asarray(valid).reshape(-1)
        sel = np.flatnonzero(valid)
        slots_all = np.asarray(slots).reshape(-1)
        slots = slots_all[sel]
        datas = [np.asarray(d) for d in datas]
        self._check_datas(datas, valid.shape[0])
        with self._lock:
            if version != self.version:
                raise StaleBufferError(
                    f"compressed buffer add: this buffer state has version {version} but its host "
                    f"store is at version {self.version}; the store is shared by every state of the "
                    f"buffer, so only the state returned by the last add can be added to"
                )
            new = self.version + 1
            if sel.size:
                lost = self.stores[0].dependents(slots)  # deltas the put deletes with their bases: changed too
                with self._versions_lock:  # before any byte is put: a read that sees one sees this
                    self._grow_versions(max(int(slots.max()), int(lost.max(initial=-1))) + 1)
                    self.slot_version[slots] = new
                    self.slot_version[lost] = new
                base = None if bases is None else np.asarray(bases).reshape(-1)[sel]
                every = sel.size == valid.shape[0]  # no row to leave out: the rows as given (a put copies what it keeps)
                for store, data in zip(self.stores, datas):
                    store.put(slots, data if every else data[sel], bases=base)
            kept = self._kept(version, slots, lost if sel.size else slots, np.asarray(slots_all), valid, datas, recent)
            self.version = new
            self._recent = (new, kept)
            self.num_writes += 1
            self.num_rows += int(sel.size)
            return np.int32(new)

    def _kept(self, version: int, written, lost, slots, valid, datas, recent) -> dict:
        """The frames `_recent` holds after a write from `version` (under `_lock`): those kept before, less the slots
        the write changed (`written`, and `lost`: deltas deleted with their bases), plus copies of the rows `recent`
        asks for, the oldest dropped past its cap."""
        if recent is None:
            return {}
        rows, cap = recent
        tag, before = self._recent
        kept = dict(before) if tag == version else {}
        if kept:
            changed = set(np.concatenate([written, lost]).tolist())
            kept = {s: f for s, f in kept.items() if s not in changed}
        for r in np.flatnonzero(np.asarray(rows).reshape(-1) & valid).tolist():
            kept.pop(int(slots[r]), None)  # re-inserted last: the newest
            kept[int(slots[r])] = tuple(d[r].copy() for d in datas)
        for s in list(kept)[: max(len(kept) - int(cap), 0)]:
            del kept[s]
        return kept

    def read_recent(self, version, ids) -> tuple[np.ndarray, ...]:
        """`read(version, ids)`: one `[*ids.shape, *item_shape]` array per store, from the frames the newest write kept
        (`write(recent=)`) when it made `version` and kept every slot of `ids` (the never-written last slot: zeros),
        else decoded by `read`, with its checks. Equal either way."""
        ids = np.asarray(ids)
        tag, kept = self._recent  # one snapshot: each write publishes a new pair
        flat, empty = ids.reshape(-1).tolist(), self.num_slots - 1
        if self.closed or tag != int(np.asarray(version)) or not all(s in kept or s == empty for s in flat):
            return self.read(version, ids)
        outs = []
        for i, (shape, dtype) in enumerate(self._items):
            out = np.zeros((len(flat), *shape), dtype)
            for r, s in enumerate(flat):
                if s != empty:
                    out[r] = kept[s][i]
            outs.append(out.reshape(*ids.shape, *shape))
        return tuple(outs)

    def _grow_versions(self, need: int) -> None:
        """Grow `slot_version` over slots below `need`, under `_versions_lock` (a new array: readers keep the old)."""
        rows = grown_rows(self.slot_version.size, need, self.num_slots)
        if rows > self.slot_version.size:
            grown = np.zeros(rows, np.int32)
            grown[: self.slot_version.size] = self.slot_version
            self.slot_version = grown

    def set_slot_versions(self, versions: np.ndarray, what: str) -> None:
        """Restore `slot_version` from a saved copy: int32 `[n]`, `n <= num_slots`.

        Raises:
          ValueError: another dtype, rank or a longer array (the message names `what`).
        """
        v = np.asarray(versions)
        if v.dtype != np.int32 or v.ndim != 1 or v.shape[0] > self.num_slots:
            raise ValueError(f"{what}: expected int32 of shape (n,) with n <= {self.num_slots}, got shape {v.shape} {v.dtype}")
        with self._versions_lock:
            self.slot_version = v.copy()
            self._recent = (-1, {})

    def _check_datas(self, datas: Sequence[np.ndarray], rows: int) -> None:
        """ValueError unless `datas` holds one `[rows, *item_shape]` array of its store's dtype per store."""
        if len(datas) != len(self.stores):
            raise ValueError(f"compressed buffer add: expected {len(self.stores)} arrays (one per leaf {list(self.names)}), got {len(datas)}")
        for name, store, d in zip(self.names, self.stores, datas):
            code, shape = store._declared
            want = (rows, *shape)
            if d.shape != want or d.dtype != dtype_from_code(code):
                raise ValueError(
                    f"compressed buffer add: {name}: expected shape {want} and dtype {dtype_from_code(code)}, "
                    f"got shape {d.shape} and dtype {d.dtype}"
                )

    def _read_slots(self, slots: np.ndarray) -> np.ndarray:
        """`slots` and the slots their delta chains decode (the same in every store): what a read checks."""
        chains = self.stores[0].chain_slots(slots.reshape(-1))
        return np.concatenate([slots.reshape(-1), chains]) if chains.size else slots

    def _check_read(self, version, slots: np.ndarray, *, count: bool = True) -> None:
        """StaleBufferError when a slot of `slots` was rewritten after `version` (a read checks before and after it
        decodes, so a write overlapping it is seen too)."""
        self._check_open("sample")
        v = int(np.max(np.asarray(version)))
        with self._versions_lock:
            sv, flat = self.slot_version, slots.reshape(-1)
            newest = int(sv[flat[flat < sv.size]].max(initial=0))
            self.num_reads += count
        if newest > v:
            raise StaleBufferError(
                f"compressed buffer sample: the buffer state has version {v} but some sampled slots "
                f"were rewritten by version {newest}; sample from the state returned by the last add "
                f"(inside one jitted program XLA may run an add before a sample written above it: "
                f"add first and sample the state the add returned, or sample and add in separate "
                f"jitted calls)"
            )

    def read_into(self, version, ids: Sequence[np.ndarray], outs: Sequence[Sequence[np.ndarray]]) -> None:
        """Host side of an in-place sample: decode slots `ids[j]` (any shapes `S_j`) of store `i` into XLA's output
        buffers `outs[i][j]` (`[*S_j, *item_shape]`), a shared slot once. Checks as `read` (after the decode with the
        chain slots it walked); a decode that raises is checked first, so a stale state raises `StaleBufferError`."""
        ids = [np.asarray(x) for x in ids]
        flat = ids[0] if len(ids) == 1 else np.concatenate([x.reshape(-1) for x in ids])
        self._check_read(version, flat)
        chains: list = []
        try:
            for i, (store, out) in enumerate(zip(self.stores, outs)):
                store.get_many(ids, missing="zeros", outs=out, chains_out=chains if i == 0 else None)
        except Exception:
            self._check_read(version, self._read_slots(flat), count=False)
            raise
        self._check_read(version, np.concatenate([flat.reshape(-1), *chains]), count=False)

    def read(self, version, *ids, aligned: bool = False) -> tuple[np.ndarray, ...]:
        """Host side of a sample: decode slots `ids[j]` (any shapes `S_j`) from every store, each distinct slot once.

        Args:
          aligned: decode into 64-byte aligned memory, which JAX's CPU backend adopts without a copy.

        Returns:
          For store `i` and id array `j`, output `i * len(ids) + j`: `[*S_j, *item_shape]`, the store's dtype.

        Raises:
          StaleBufferError: a slot was rewritten after `version`, or while it was read.
        """
        ids = [np.asarray(x) for x in ids]
        flat = np.concatenate([x.reshape(-1) for x in ids]) if ids else np.zeros(0, np.int32)
        checked = self._read_slots(flat)
        self._check_read(version, checked)
        bounds = np.cumsum([0] + [x.size for x in ids]).tolist()
        outs = []
        for store in self.stores:
            # one output for all id arrays, each distinct slot decoded once into its first row; outputs are slices
            out = None
            if aligned and store._declared is not None:
                out = _aligned_empty((flat.size, *store._declared[1]), dtype_from_code(store._declared[0]))
            dec = store.get(flat, missing="zeros", out=out)
            for x, a, b in zip(ids, bounds[:-1], bounds[1:]):
                outs.append(dec[a:b].reshape(*x.shape, *dec.shape[1:]))
        self._check_read(version, checked, count=False)
        return tuple(outs)


def _on_shard(name: str):
    """A `ShardedHostStores` method: `HostStores.<name>` on the store of the shard given first."""

    def method(self, shard, *args, **kwargs):
        return getattr(self.shards[int(np.asarray(shard))], name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"`HostStores.{name}` on the store of shard `shard`."
    return method


def _summed(name: str) -> property:
    """A `ShardedHostStores` property: `HostStores.<name>` summed over the shards' stores."""
    doc = f"`HostStores.{name}` over every shard's store."
    return property(lambda self: sum(getattr(h, name) for h in self.shards), doc=doc)


class ShardedHostStores:
    """The host stores of a `jaxbuffers.ShardedBuffer` of compressed buffers: one `HostStores` per shard.

    Every callback traced inside the sharded program's `shard_map` passes its shard index first (`operands`) and
    reaches that shard's store, which holds its own lanes' or episodes' frames at shard-local slot ids and keeps its
    own version (a stale state is refused store by store). `write`, `read`, `read_into` and `read_recent` are
    `HostStores`' on the store of the shard given first; `nbytes`, `arena_nbytes` and `live_nbytes` sum the shards'.

    Args:
      stores: the shards' `HostStores`, shard `s` first-to-last (distinct objects of one configuration).
      axis: the mesh axis the shards are split along.
    """

    def __init__(self, stores: Sequence[HostStores], axis: str):
        self.shards = tuple(stores)
        self.axis = axis
        first = self.shards[0]
        self.num_slots, self.codec, self.names = first.num_slots, first.codec, first.names

    @staticmethod
    def made(make, n: int) -> list[HostStores]:
        """One store per shard: `make()` (a compressed buffer's `create`) called `n` times, each call building its own.

        Raises:
          TypeError: `make` builds a disk-backed buffer (`jaxbuffers.disk`: its store is a folder).
          ValueError: the buffers share one store (`make` returns one buffer it closed over).
        """
        hosts = [make().host for _ in range(n)]
        if any(getattr(h, "directory", None) is not None for h in hosts):  # jaxbuffers.disk.DiskStores
            raise TypeError("make: builds a disk-backed buffer (its host store is a folder); shard an in-memory compressed buffer")
        if len({id(h) for h in hosts}) < n:
            raise ValueError(
                "make: returned buffers sharing one host store; each shard needs its own, so make must build a new "
                "buffer on every call (e.g. lambda: jb.CompressedTrajectoryBuffer.create(step, num_envs=e, length=n))"
            )
        return hosts

    # Identity semantics, as HostStores.

    def __repr__(self) -> str:
        return f"ShardedHostStores({len(self.shards)} shards along {self.axis!r}, versions={[h.version for h in self.shards]})"

    num_operands = 1

    def operands(self) -> tuple:
        """The leading operands of every callback: the shard index (int32 scalar; inside `shard_map` only)."""
        return (jax.lax.axis_index(self.axis),)

    write = _on_shard("write")
    read_recent = _on_shard("read_recent")
    read = _on_shard("read")
    read_into = _on_shard("read_into")
    nbytes = _summed("nbytes")
    arena_nbytes = _summed("arena_nbytes")
    live_nbytes = _summed("live_nbytes")

    def close(self) -> None:
        """Close every shard's store."""
        for h in self.shards:
            h.close()

    def check_state(self, what: str, versions=None) -> None:
        """`HostStores.check_state` of every shard's store; `versions`: int `[S]`, shard `s`'s version of the state
        (None: only whether the stores are open)."""
        for s, h in enumerate(self.shards):
            h.check_state(f"{what} (shard {s})", None if versions is None else int(np.asarray(versions)[s]))


class Closing:
    """`with x as y:` calls `x.close()` when the block ends (a compressed buffer, `jaxbuffers.disk.Concatenated`):
    JAX's compile caches keep a buffer a jitted function compiled against (until `jax.clear_caches()`), so dropping
    it frees neither its host memory nor a disk folder's open files."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HostBacked(Closing, Wrapper, struct.PyTreeNode):
    """Base of the compressed buffers: the static fields every one declares (its `HostStores` and which leaves
    live there; static, so a buffer's pytree leaves, in the order its checkpoints keep, are its own), byte counts,
    `close`, and `size` / `is_full` of its wrapped device buffer."""

    _cursor = "version"  # the leaf that is a scalar in one buffer (stacked with jax.vmap: `jaxbuffers._validate.members`)

    host: HostStores = struct.field(pytree_node=False)  # the stores (identity hash: one compiled program per buffer)
    leaves: tuple = struct.field(pytree_node=False)  # LeafInfo per compressed leaf
    leaf_index: tuple = struct.field(pytree_node=False)  # flat index of each compressed leaf within obs (the step for rollouts)
    normalize_images: bool = struct.field(pytree_node=False)  # sampled compressed leaves come back float32 x / 255

    @property
    def device_nbytes(self) -> int:
        """Bytes of every device array (uncompressed fields, ids, cursors)."""
        return _validate.tree_nbytes(self)

    @property
    def host_nbytes(self) -> int:
        """Host bytes held: arenas (their whole capacity), store indexes, dictionaries, slot versions, and the frames
        kept decoded (the rows a delta's next put reads, the frames the next add's stack check reads)."""
        return self.host.nbytes

    @property
    def host_live_nbytes(self) -> int:
        """`host_nbytes` counting only the live compressed payloads of the arenas (no slack)."""
        return self.host.live_nbytes

    @property
    def host_arena_nbytes(self) -> int:
        """Bytes of the host arenas' chunks (live payloads and slack: `host_nbytes - host_arena_nbytes` is the rest)."""
        return self.host.arena_nbytes

    @property
    def nbytes(self) -> int:
        """`device_nbytes + host_nbytes`."""
        return self.device_nbytes + self.host_nbytes

    def close(self) -> None:
        """Free the host memory now (the buffer cannot be used afterwards); a disk-backed buffer closes its files and
        releases its folder's lock. Every state of the buffer shares its host stores: closing one closes them all."""
        self.host.close()


class FrameStacked(HostBacked):
    """Base of the compressed buffers with frame-stack dedup (`jaxbuffers.compressed._common.stack_slots`)."""

    frame_stack: int = struct.field(pytree_node=False)  # k (1: no dedup)
    padding: str = struct.field(pytree_node=False)  # frames before an episode's start: "reset" (its first) or "zero"
