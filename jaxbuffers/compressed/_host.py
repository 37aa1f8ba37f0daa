"""Host half of the compressed buffers: the stores, the write/read callbacks and their versions.

Everything that crosses from jitted code to the host goes through one `HostStores` object, which a
buffer keeps in a *static* field (not a pytree leaf):

* Identity hash and equality (Python's default): a jitted function compiles once per buffer and
  reuses the program for every later state of it, and two buffers never share a cache entry.
* **Writes** run exactly once per executed `add`, in program order, also inside `lax.scan` and
  with donation (a `pure_callback` whose result is unused is removed by XLA, so writes never use
  one). Each returns the new *version* (writes so far, int32), which the buffer carries as a
  leaf; every later write and read of the store takes it as an argument, which orders them.
* **Reads** take that version too: the data dependency makes a read run after the write that
  produced the state it samples from. The callback carrying writes and reads is chosen in one
  place, `jaxbuffers.compressed._common.in_place_callbacks` (which says why).
* **Stale reads are refused, not served.** Every slot remembers the version that last wrote it; a read with version
  `v` raises if one of its slots was written later (an old state kept after later adds, or a sample XLA scheduled
  after a later add of the same program). A write from a state whose version is not the store's current one (adding
  twice to one state: a fork) is refused before anything is written. Errors raised inside callbacks surface as
  `jax.errors.JaxRuntimeError` when the result is used under `jit`; a buffer method called eagerly raises the
  exception itself (`jaxbuffers.compressed._common.run_eager`). A read of a slot includes every slot its delta chain
  decodes (`host_codecs.CompressedStore` deltas): a delta whose keyframe was rewritten after `v` is refused too.
* **Reads are linearisable under threads.** A write marks its slots with its version *before* it puts a byte, and a
  read checks its slots' versions before and again after it decodes (a sequence lock per slot): a read that
  overlaps a write of one of its slots raises `StaleBufferError`, so a read returns exactly the entries of the
  version it asked for or raises, never a later write's frames. Writers are serialised; readers take no lock while
  they decode, so concurrent reads decode in parallel.
* Writes cannot be `vmap`-ed (`ValueError: ... cannot be vmapped`): a compressed buffer is one
  host store, so buffers cannot be stacked; `vmap` over sampling keys of one buffer works. A
  `jaxbuffers.ShardedBuffer` stacks them under `shard_map` instead, with one store per shard
  (`ShardedHostStores`: each callback passes its shard index and reaches its shard's store).

The store layout is the `host_codecs.CompressedStore` layout (numpy arrays) plus one int32
`slot_version` array for the stores, grown as slots are written as the stores' indexes grow (`host_codecs.slot_index`):
a slot past its end was never written (version 0).
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

#: Most bytes of the zstd dictionary a compressed buffer's store builds from its first 1,024
#: frames when the codec is zstd. On 84x84 Atari frames at level -1, 32 KiB gave smaller frames
#: than 16 KiB (Breakout about 97 against 99 B, Pong 92 against 96 B) and than 64 KiB.
DEFAULT_DICTIONARY_BYTES = 32768

DEFAULT_DELTA_CODEC = "rle"
"""Codec of the delta frames of the temporal coding unless `delta_codec=` is given: the XOR of two consecutive frames
of a lane is mostly zeros, which run-length coding stores compactly and decodes in one compiled loop straight into
the base frame's copy (`host_codecs.rle`); keyframes keep `codec` (and its zstd dictionary)."""

DEFAULT_KEYFRAME_INTERVAL = 8
"""Frames per chain of the temporal coding unless `keyframe_interval=` is given (a keyframe every 8 frames; with
`codec="none"` every frame is whole, K = 1)."""


def keyframe_interval_of(keyframe_interval: int | None, codec: str, delta_codec: str | None) -> tuple[int, str | None]:
    """The checked `keyframe_interval` argument of a compressed buffer's `create` (`None` gives
    `DEFAULT_KEYFRAME_INTERVAL`, or 1 with `codec="none"`: deltas of raw entries save nothing), and the delta codec
    of its stores: `delta_codec`, or None when `K = 1` (no delta is ever stored, so none is built or imported).

    Raises:
      ValueError: not a positive int (`jaxbuffers._validate.static_int`); an unknown codec.
    """
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
      item_shapes: per compressed leaf, the shape of one stored entry (a frame).
      dtypes: per compressed leaf, its dtype.
      names: per compressed leaf, a readable name for error messages.
      chunk_bytes: largest arena chunk of each store.
      dictionary_bytes: most bytes of the zstd dictionary each store builds from its
        first 1,024 frames (`None`: `DEFAULT_DICTIONARY_BYTES` for a zstd codec, else 0;
        0: none; see `host_codecs.CompressedStore`). ValueError: > 0 with another codec.
      delta_codec: codec of the stores' delta frames (`host_codecs.CompressedStore`'s `delta_codec`; None: `codec`).
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
        # (version, {slot: one frame per store}): frames the newest writes asked to keep (`write(recent=)`), as they
        # were written, exact for a state of that version; replaced (never mutated) by each write, so a reader's
        # snapshot stays whole. What `read_recent` serves.
        self._recent: tuple[int, dict] = (0, {})

    # Identity semantics on purpose (see module doc): do not define __eq__/__hash__.

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
        """Release the payload memory now (a non-blocking save in flight keeps the chunks it writes until it is
        written). Later reads/writes raise. (A jitted function that compiled against the buffer keeps this object
        alive; closing frees its arenas anyway.)"""
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
          StaleBufferError: `version` (given for an add) is not the store's current version: a later
            add was made from this state or from one derived from it.
        """
        self._check_open(what)
        if version is not None and version != self.version:
            raise StaleBufferError(
                f"compressed buffer {what}: this buffer state has version {version} but its host store is at version "
                f"{self.version}; only the state returned by the last add can be added to (refused before anything "
                f"ran: the newer state and the store are unchanged)"
            )

    def write(self, version, slots, valid, *datas, bases=None, recent=None) -> np.ndarray:
        """Host side of an add: put `datas[i][valid]` into store `i` at `slots[valid]`.

        Args (numpy, from the write callback):
          version: int32 scalar, the version of the buffer state being added to.
          slots: int32[M] store slot ids. valid: bool[M], rows to write.
          datas: one [M, *item_shape] array per store.
          bases: optional int32[M]: row `r` is stored as a delta against slot `bases[r]` (`-1`: whole; see
            `host_codecs.CompressedStore.put`).

        Returns:
          recent: `(rows, cap)`: bool `[M]`, the rows `read_recent` serves from memory until a later write replaces
            them (copies of the frames as written), and the most frames kept over successive writes (the oldest go
            first). None: keep none (`read_recent` then decodes).

        Returns:
          int32 scalar: the new version.

        Raises:
          StaleBufferError: `version` is not the store's current version (the state was
            already added to: writing again would fork the shared store).
          ValueError: `datas` do not match the stores (count, rows, item shape or dtype);
            checked, like the version, before anything is written.
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
        """`read(version, ids)`, served from the frames the newest write kept (`write(recent=)`) when `version` is
        the version that write made and every slot of `ids` is kept (or is the never-written last slot, zeros);
        otherwise decoded by `read`, with its checks. Equal either way: a kept frame is the slot's entry at that
        version.

        Returns:
          One `[*ids.shape, *item_shape]` array per store.
        """
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
        """Grow `slot_version` so that slots below `need` have an entry (`host_codecs.slot_index.grown_rows`); under
        `_versions_lock`. A new array: a reader holding the old one keeps it."""
        rows = grown_rows(self.slot_version.size, need, self.num_slots)
        if rows > self.slot_version.size:
            grown = np.zeros(rows, np.int32)
            grown[: self.slot_version.size] = self.slot_version
            self.slot_version = grown

    def set_slot_versions(self, versions: np.ndarray, what: str) -> None:
        """Restore `slot_version` from a saved copy: int32 of any length up to `num_slots` (a save made before the
        versions grew as slots are written has `num_slots`).

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
        """`slots` and the slots their delta chains decode (`host_codecs.CompressedStore`: every store holds the
        same chains): what a read checks."""
        chains = self.stores[0].chain_slots(slots.reshape(-1))
        return np.concatenate([slots.reshape(-1), chains]) if chains.size else slots

    def _check_read(self, version, slots: np.ndarray, *, count: bool = True) -> None:
        """Raise StaleBufferError when a slot in `slots` (chains included: `_read_slots`) was rewritten after
        `version`, or is being rewritten now (a read checks before and after it decodes: see the module doc)."""
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
        """Host side of an in-place jitted sample: decode slot arrays `ids[j]` (any shapes `S_j`)
        of store `i` into `outs[i][j]` (`S_j + item_shape`, C-contiguous: XLA's own output
        buffers, so the result is not copied again). A slot shared between the id arrays is
        decoded once (`host_codecs.CompressedStore.get_many`). Same checks as `read`: the requested slots before
        the decode, and with the chain slots the decode read (`get_many`'s `chains_out`: the chains walked once)
        after it; a decode that raises is checked first, so a stale state raises `StaleBufferError`, not the error of
        decoding entries rewritten since."""
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
        """Host side of a sample: decode slots `ids[j]` (any shapes `S_j`) from every store.

        Each distinct slot (over all `ids`) is decoded once, in parallel, directly into the
        output (`host_codecs.CompressedStore.get`); its other occurrences are row copies.

        Args:
          aligned: decode into 64-byte aligned memory (each output starts on a 64-byte boundary
            when its byte size allows), which JAX's CPU backend adopts without a copy.

        Returns:
          For store `i` and id array `j`, output `i * len(ids) + j`: shape `S_j + item_shape`, the store's dtype.

        Raises:
          StaleBufferError: a slot was rewritten after `version`, or while it was read (see module doc).
        """
        ids = [np.asarray(x) for x in ids]
        flat = np.concatenate([x.reshape(-1) for x in ids]) if ids else np.zeros(0, np.int32)
        checked = self._read_slots(flat)
        self._check_read(version, checked)
        bounds = np.cumsum([0] + [x.size for x in ids]).tolist()
        outs = []
        for store in self.stores:
            # One output for all id arrays; the store decodes each distinct slot once, straight
            # into its first row, and copies the repeats. The outputs are contiguous slices.
            out = None
            if aligned and store._declared is not None:
                out = _aligned_empty((flat.size, *store._declared[1]), dtype_from_code(store._declared[0]))
            dec = store.get(flat, missing="zeros", out=out)
            for x, a, b in zip(ids, bounds[:-1], bounds[1:]):
                outs.append(dec[a:b].reshape(*x.shape, *dec.shape[1:]))
        self._check_read(version, checked, count=False)
        return tuple(outs)


class ShardedHostStores:
    """The host stores of a `jaxbuffers.ShardedBuffer` of compressed buffers: one `HostStores` per shard.

    The stacked buffer keeps this object in its static `host` field; every callback traced inside the sharded
    program's `shard_map` passes its shard index (`jax.lax.axis_index(axis)`, `operands`) first, and the call goes
    to that shard's store, with that shard's version. So each shard's store holds only the frames of its own lanes
    or episodes, at the slot ids of one unsharded buffer of the shard's size (shard-local ids), and keeps its own
    version: a stale state is refused store by store, as for one buffer.

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

    def write(self, shard, version, slots, valid, *datas, bases=None, recent=None) -> np.ndarray:
        """`HostStores.write` on the store of shard `shard`."""
        return self.shards[int(np.asarray(shard))].write(version, slots, valid, *datas, bases=bases, recent=recent)

    def read_recent(self, shard, version, ids) -> tuple[np.ndarray, ...]:
        """`HostStores.read_recent` on the store of shard `shard`."""
        return self.shards[int(np.asarray(shard))].read_recent(version, ids)

    def read(self, shard, version, *ids, aligned: bool = False) -> tuple[np.ndarray, ...]:
        """`HostStores.read` on the store of shard `shard`."""
        return self.shards[int(np.asarray(shard))].read(version, *ids, aligned=aligned)

    def read_into(self, shard, version, ids, outs) -> None:
        """`HostStores.read_into` on the store of shard `shard`."""
        self.shards[int(np.asarray(shard))].read_into(version, ids, outs)

    @property
    def nbytes(self) -> int:
        """Host bytes held over every shard's store."""
        return sum(h.nbytes for h in self.shards)

    @property
    def arena_nbytes(self) -> int:
        """`HostStores.arena_nbytes` over every shard's store."""
        return sum(h.arena_nbytes for h in self.shards)

    @property
    def live_nbytes(self) -> int:
        """`HostStores.live_nbytes` over every shard's store."""
        return sum(h.live_nbytes for h in self.shards)

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
    """`with x as y:` calls `x.close()` when the block ends (a compressed buffer, `jaxbuffers.disk.Concatenated`).

    A buffer that a jitted function (an eager call included) compiled against stays referenced by JAX's compile caches
    until `jax.clear_caches()`, so dropping it frees neither its host memory nor a disk folder's open files: `close()`
    or a `with` block does."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HostBacked(Closing, Wrapper, struct.PyTreeNode):
    """Base of the compressed buffers: the static fields every one declares (its `HostStores` and which leaves
    live there), byte counts, `close`, and `size` / `is_full` of its wrapped device buffer.

    A buffer declares its own leaves (the wrapped `buffer`, `version`, cursors) in the order its checkpoints keep;
    the fields here are static, so they change neither its pytree leaves nor their order.
    """

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
