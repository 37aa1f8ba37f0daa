"""CompressedStore: a fixed number of slots, each holding one compressed array.

Index, one row per slot id below `index_rows` (grown as slots are used, `host_codecs.slot_index`):

  ```
  chunk   # shape=(rows,), dtype=int32,  arena chunk id, -1 = empty slot
  offset  # shape=(rows,), dtype=uint32, byte offset of the payload in its chunk
  length  # shape=(rows,), dtype=uint32, payload bytes (without alignment padding)
  codec   # shape=(rows,), dtype=uint8,  codec tag (host_codecs.registry)
  meta    # shape=(rows,), dtype=uint8,  the codec's byte (RLE: count width; zstd: 1 with the dictionary)
  layout  # shape=(rows,), dtype=uint16, id into the layout table: (dtype code, shape)
  check   # shape=(rows,), dtype=uint32, the entry's checksum (below)
  base    # shape=(rows,), dtype=int32,  delta base slot, -1 = none (`host_codecs.deltas`)
  child   # shape=(rows,), dtype=int32,  the delta based on the slot, -1 = none (`host_codecs.deltas`)
  ```

The payload bytes live in an arena (`host_codecs.arena`). An entry's `check` is the checksum of its payload seeded
by its slot id and length (`host_codecs._checksum`), XOR `codec | meta << 8 | layout << 16`; a delta's also covers
its base slot and the base's `check`. Every read verifies the entries it decodes and raises
`host_codecs.CorruptEntryError` naming the store and the slots that changed; chunk ids below -1 are corrupt too.

One lock guards the index and the arena: `put` encodes outside it and publishes the index rows only after the
payloads, `get` snapshots the rows under it and decodes outside it, so a reader never sees a torn entry. Deltas:
`put(..., bases=b)` (`host_codecs.deltas`); snapshots: `export_state` / `import_state` (`host_codecs.snapshot`).
Reads, space reuse and accounting: `docs/api/host_codecs.md`.

Example:
  >>> import numpy as np
  >>> from host_codecs import CompressedStore
  >>> store = CompressedStore(1000, codec="none")
  >>> store.put(np.array([3, 7]), np.zeros((2, 84, 84), np.uint8))
  >>> store.get(np.array([7, 3])).shape
  (2, 84, 84)
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
from typing import Any, Sequence

import numpy as np

from ._base import ALIGN, Codec, CorruptEntryError, EncodedBatch, as_array, ceil_align, chunk_addresses, dtype_code, dtype_from_code, int_arg, integer_ids, merged_batches, shape_arg
from . import _checksum, _plan
from ._pool import num_threads, parallel_for
from .arena import MAX_CHUNK_BYTES, Arena
from .deltas import DeltaChains
from .slot_index import IndexRows
from .snapshot import Snapshots
from .registry import CODECS, codec_for_tag, get_codec
from .zstd import ZstdDictionary

__all__ = ["CompressedStore"]

_NUM_TAGS = max(c.tag for c in CODECS.values()) + 1
_MAX_SAMPLE_BYTES = 64 << 20  # most bytes of entries (at least 8 entries) a dictionary is built from
_MAX_DICTIONARY_BYTES = 1 << 20
_READ_SHARD_BYTES = 1 << 20  # decoding is fast per byte: a smaller shard does not pay for a thread


_payload_sums = _checksum.payload_sums  # the entries' checksums (one compiled loop), looked up here on every call


def _encode(rows: np.ndarray, dtype: np.dtype, codec: Codec, dictionary, deltas: tuple = ()) -> EncodedBatch:
    """`rows`, or the deltas `(idx, src, ext)` of `Codec.encode_deltas`, encoded by `codec` (zstd: with `dictionary`)."""
    extra = () if dictionary is None else (dictionary,)
    return codec.encode_deltas(rows, dtype, *deltas, *extra) if deltas else codec.encode_batch(rows, dtype, *extra)


def _stat(key: str, doc: str) -> property:
    """A read-only property giving `stats()[key]`, documented by `doc`."""

    def get(self) -> Any:
        return self.stats()[key]

    get.__doc__ = doc
    return property(get)


def _some(slots: np.ndarray) -> str:
    """The first 10 distinct `slots` as a list, and how many more there are."""
    ids = np.unique(slots)
    return f"{ids[:10].tolist()}" + (f" and {ids.size - 10} more" if ids.size > 10 else "")


def _out_of(pos: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Output index and row of flat request positions `pos` (output `j` holds `bounds[j]:bounds[j+1]`)."""
    j = np.searchsorted(bounds, pos, side="right") - 1
    return j, pos - bounds[j]


class CompressedStore(IndexRows, DeltaChains, Snapshots):
    """Thread-safe slots of compressed arrays, payloads packed in large arenas.

    Args:
      num_slots: number of slots; slot ids are ints in `[-num_slots, num_slots)` (negative ids count from the end).
      codec: the default codec of `put`: a registry name (`"rle"`, `"igzip:1"`, `"zstd:3"`, `"none"`) or a
        `host_codecs.Codec`.
      item_shape: optional shape of every entry; given with `dtype`, `put` refuses anything else and
        `get(..., missing="zeros")` can fill a batch of only empty slots. Omitted, each entry records its own.
      dtype: optional dtype of every entry (see `item_shape`).
      chunk_bytes: largest arena chunk in bytes (at most 4 GiB - 8).
      min_chunk_bytes: first arena chunk size (`host_codecs.arena`).
      max_dead_fraction: compaction starts when freed-but-unreleased bytes exceed this fraction of the arena.
      dictionary_bytes: 0 (default), or the most bytes of a zstd dictionary (zstd default codec only; at most 1 MiB),
        built from the entries of one dtype and shape once `dictionary_samples` were put with the default codec, and
        used for its later entries; `dictionary_error` says why a build failed.
      dictionary_samples: entries to build the dictionary from (fewer for large entries: at most 64 MiB, at least 8).
      name: what error messages call this store (e.g. the field it holds).
      delta_codec: optional codec of the deltas (`put(..., bases=)`) a `put` with the default codec stores (None:
        the default codec); keyframes keep the default codec. `"rle"` suits XORs of similar frames (`host_codecs.rle`).

    Raises:
      ValueError: bad sizes, a bad codec or delta codec, or `dictionary_bytes` with a codec other than zstd.
      ImportError: the codec's optional package is missing.
    """

    def __init__(
        self, num_slots: int, codec: "str | Codec" = "rle", *, item_shape: tuple[int, ...] | None = None,
        dtype: Any = None, chunk_bytes: int = 64 << 20, min_chunk_bytes: int = 64 << 10,
        max_dead_fraction: float = 0.25, dictionary_bytes: int = 0, dictionary_samples: int = 1024, name: str = "",
        delta_codec: "str | Codec | None" = None,
    ):
        num_slots, dictionary_samples = int_arg("num_slots", num_slots), int_arg("dictionary_samples", dictionary_samples)
        dictionary_bytes = int_arg("dictionary_bytes", dictionary_bytes, 0, _MAX_DICTIONARY_BYTES)
        if not (ALIGN <= min_chunk_bytes <= chunk_bytes <= MAX_CHUNK_BYTES):
            raise ValueError(f"chunk sizes: expected {ALIGN} <= min_chunk_bytes <= chunk_bytes <= {MAX_CHUNK_BYTES}, "
                             f"got min_chunk_bytes={min_chunk_bytes}, chunk_bytes={chunk_bytes}")
        if not 0.0 < max_dead_fraction < 1.0:
            raise ValueError(f"max_dead_fraction: expected a float in (0, 1), got {max_dead_fraction}")
        if (item_shape is None) != (dtype is None):
            raise ValueError("item_shape and dtype: give both or neither")
        self.num_slots = int(num_slots)
        self.name = str(name)
        self.codec = get_codec(codec)
        #: Codec of the deltas a put with the default codec stores (None: the default codec).
        try:
            self.delta_codec = None if delta_codec is None else get_codec(delta_codec)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"delta_codec: {exc}") from None
        if dictionary_bytes and self.codec.name != "zstd":
            raise ValueError(f"dictionary_bytes: dictionaries are for the zstd codec, this store's codec is {self.codec.spec!r}")
        self._declared: tuple[int, tuple[int, ...]] | None = None  # (dtype code, shape) of every entry
        if item_shape is not None:
            shape = shape_arg(item_shape)
            self._declared = (dtype_code(np.dtype(dtype), field="dtype"), shape)
        self.max_dead_fraction = float(max_dead_fraction)
        self.dictionary_bytes = int(dictionary_bytes)
        self.dictionary_samples = int(dictionary_samples)
        self._dictionary = None  # host_codecs.ZstdDictionary once built
        self._trained = not dictionary_bytes  # True: no (more) building to do
        self._rows_seen = 0  # entries put with the default codec until then
        #: Why no dictionary was built (`dictionary_bytes` > 0 and samples seen), else None.
        self.dictionary_error: str | None = None
        self._samples_lock = threading.Lock()

        self._new_index(0)  # grown as slots are used (host_codecs.slot_index)
        self._recent: tuple[np.ndarray, np.ndarray] | None = None  # (slots, raw rows) of the last put with bases: see _put
        #: The entries' checksum (`host_codecs._checksum.CHECKSUMS`): CRC-32, or the one of the snapshot or index loaded.
        self.checksum = _checksum.CRC32
        self._layouts: list[tuple[int, tuple[int, ...]]] = []  # layout id -> (dtype code, shape)
        self._layout_ids: dict[tuple[int, tuple[int, ...]], int] = {}
        self._layout_nbytes = np.zeros(0, dtype=np.int64)  # shape=(num_layouts,), int64
        self._arena = Arena(ceil_align(int(chunk_bytes)), ceil_align(int(min_chunk_bytes)))
        self._chunks = self._arena.chunks  # chunk id -> chunk (the arena's own dict)
        self._compactions = 0
        # shape=(3, num_tags), int64: per codec tag, live entries, their decoded and payload bytes
        self._tags = np.zeros((3, _NUM_TAGS), dtype=np.int64)
        self._lock = threading.Lock()

    def config(self) -> dict[str, Any]:
        """The construction arguments as JSON-able values (`codec` as its spec, `declared` as `[dtype name, shape]`
        or None): what `import_state` requires to match."""
        declared = None if self._declared is None else [dtype_from_code(self._declared[0]).name, list(self._declared[1])]
        return {
            "num_slots": self.num_slots, "codec": self.codec.spec, "declared": declared,
            "chunk_bytes": self._arena.chunk_bytes, "min_chunk_bytes": self._arena.min_chunk_bytes,
            "max_dead_fraction": self.max_dead_fraction, "dictionary_bytes": self.dictionary_bytes,
            "dictionary_samples": self.dictionary_samples,
            "delta_codec": None if self.delta_codec is None else self.delta_codec.spec,
        }

    def _slots(self, slots: Any, field: str = "slots") -> np.ndarray:
        """Slot ids as int64, negative ones wrapped; TypeError / IndexError for bad ids."""
        s = integer_ids(slots, field)
        if s.dtype == np.uint64 and s.size and int(s.max()) > np.iinfo(np.int64).max:
            raise IndexError(f"{field}: slot {int(s.max())} out of range")  # would wrap negative as int64
        s = s.astype(np.int64, copy=False)
        if s.size:
            lo, hi = int(s.min()), int(s.max())
            if lo < -self.num_slots or hi >= self.num_slots:
                bad = lo if lo < -self.num_slots else hi
                raise IndexError(f"{field}: slot {bad} out of range for a store of {self.num_slots} slots")
            if lo < 0:
                s = np.where(s < 0, s + self.num_slots, s)
        return s

    def _layout_id(self, code: int, shape: tuple[int, ...]) -> int:
        """Id of (dtype code, shape), added to the table when new; call under the lock."""
        lid = self._layout_ids.get((code, shape))
        if lid is None:
            lid = len(self._layouts)
            if lid > np.iinfo(np.uint16).max:
                raise ValueError("CompressedStore: more than 65,536 distinct (dtype, shape) layouts")
            self._layouts.append((code, shape))
            self._layout_ids[(code, shape)] = lid
            self._layout_nbytes = np.append(self._layout_nbytes, math.prod(shape) * dtype_from_code(code).itemsize)
        return lid

    def put(self, slots: Any, arrays: Any, *, codec: "str | Codec | None" = None, bases: Any = None) -> None:
        """Store `arrays[i]` in slot `slots[i]`, replacing what was there.

        Args:
          slots: # shape=(B,), integer slot ids. Repeated ids: the last one wins (as in numpy).
          arrays: # shape=(B, *item_shape), a dtype of `host_codecs._base.DTYPES`; never cast.
          codec: codec of this call (default: the store's); entries of different codecs
            coexist, and each is decoded with its own.
          bases: optional # shape=(B,), integer slot ids: entry `i` is stored as a delta against what slot
            `bases[i]` holds after the rows before it are stored (an earlier row of this batch or a stored entry of
            the same dtype and shape), `-1`: whole (`host_codecs.deltas`).

        Raises:
          TypeError: an unsupported dtype or non-integer slots or bases.
          ValueError: a batch size, or a declared shape or dtype, that does not match; `bases` of another shape,
            naming its own row's slot, an empty slot, or given with repeated `slots`.
          IndexError: a slot out of range.
        (Every argument is checked before anything is stored.)
        """
        self._put(slots, arrays, codec, "slots", "arrays", bases)

    def _put(self, slots: Any, arrays: Any, codec, ids: str, values: str, bases: Any = None) -> None:
        """`put`, its error messages naming the arguments `ids` and `values`."""
        cdc = self.codec if codec is None else get_codec(codec)
        s = self._slots(slots, ids)
        if s.ndim != 1:
            raise ValueError(f"{ids}: expected a 1-D array of slot ids, got shape {s.shape}")
        a = as_array(arrays, values)
        if a.ndim < 1 or a.shape[0] != s.shape[0]:
            raise ValueError(f"{values}: expected a leading batch axis of {s.shape[0]} (one per slot), got shape {a.shape}")
        code = dtype_code(a.dtype, field=values)
        item_shape = tuple(int(d) for d in a.shape[1:])
        if self._declared is not None and (code, item_shape) != self._declared:
            dcode, dshape = self._declared
            raise ValueError(f"{values}: this store holds items of shape {dshape} and dtype {dtype_from_code(dcode)}, "
                             f"got shape {item_shape} and dtype {a.dtype}")
        base = None if bases is None else self._bases(bases, s)
        if s.size == 0:
            return
        if np.unique(s).size != s.size:  # keep the last occurrence of a repeated slot only
            if base is not None and (base >= 0).any():
                raise ValueError(f"bases: given with repeated {ids} (a delta against a slot written twice in one batch is ambiguous)")
            keep = np.sort(s.size - 1 - np.unique(s[::-1], return_index=True)[1])
            s, a = s[keep], a[keep]
            base = None if base is None else base[keep]
        a = np.ascontiguousarray(a)
        b = s.shape[0]
        rows = a.reshape(b, -1).view(np.uint8) if a.size else np.empty((b, 0), np.uint8)
        dictionary = None
        if cdc is self.codec:
            dictionary = self._dictionary if self._trained else self._train(rows, code, item_shape)
        delta = np.zeros(b, bool) if base is None else base >= 0
        # outside the lock: the expensive part
        dcdc = self.delta_codec if codec is None and self.delta_codec is not None and delta.any() else cdc
        tags = np.where(delta, dcdc.tag, cdc.tag).astype(np.uint8)
        parts = self._delta_parts(s, base, rows, code, item_shape) if delta.any() else ()
        enc = _encode(rows, a.dtype, cdc, dictionary) if not parts else merged_batches(  # keyframes and deltas, in row order
            [_encode(rows[~delta], a.dtype, cdc, dictionary), _encode(rows, a.dtype, dcdc, dictionary if dcdc is cdc else None, parts)], [~delta, delta])
        if int(enc.lengths.max(initial=0)) > MAX_CHUNK_BYTES:
            raise ValueError(f"arrays: one compressed entry exceeds {MAX_CHUNK_BYTES} bytes")
        sums = _payload_sums({0: enc.buffer}, np.zeros(b, np.int64), enc.offsets, enc.lengths, s, self.checksum)
        with self._lock:
            self._grow_index(max(int(s.max()), -1 if base is None else int(base.max())) + 1)
            if delta.any():  # chains stay linear (checked before anything is stored)
                self._check_linear(s, base, delta)
            lid = self._layout_id(code, item_shape)
            chunk_ids, offsets = self._arena.place(enc.buffer, enc.offsets, enc.lengths)
            self._free(np.union1d(s, self._dependents(s)))
            self._chunk[s], self._offset[s], self._length[s] = chunk_ids, offsets, enc.lengths
            self._codec[s], self._meta[s], self._layout[s] = tags, enc.meta, lid
            self._check[s] = sums ^ (tags.astype(np.uint32) | enc.meta.astype(np.uint32) << 8 | np.uint32(lid) << 16)
            self._link(s, base, rows)
            self._tally(s, 1)
            self._maybe_compact()

    def _train(self, rows: np.ndarray, code: int, item_shape: tuple[int, ...]):
        """The dictionary to encode `rows` with: None until `dictionary_samples` entries, then built once (outside the
        store lock) from stored entries of their dtype and shape and `rows`."""
        with self._samples_lock:
            if self._trained:  # by another thread meanwhile
                return self._dictionary
            self._rows_seen += rows.shape[0]
            if self._rows_seen < self.dictionary_samples:
                return None
            limit = min(self.dictionary_samples, max(8, _MAX_SAMPLE_BYTES // max(rows.shape[1], 1)))
            fresh = list(rows[:limit])
            try:
                with self._lock:
                    lid = self._layout_ids.get((code, item_shape))
                    stored = np.zeros(0, np.int64) if lid is None else np.flatnonzero(
                        (self._chunk >= 0) & (self._codec == self.codec.tag) & (self._layout == lid)
                    )[: limit - len(fresh)]
                samples = []
                if stored.size:
                    try:
                        samples = list(self.get(stored, missing="zeros").reshape(stored.size, -1).view(np.uint8))
                    except ValueError:  # a concurrent put changed a sample's dtype or shape: skip them
                        pass
                d = ZstdDictionary.train(samples + fresh, self.dictionary_bytes, self.codec.level)
            except ValueError as exc:  # the trainer refused the samples
                d, self.dictionary_error = None, str(exc)
            except Exception as exc:  # e.g. MemoryError: the dictionary is an optimisation only
                d, self.dictionary_error = None, f"{type(exc).__name__}: {exc}"
            with self._lock:
                self._dictionary = d
            self._trained = True
            return d

    @property
    def dictionary(self):
        """The built `host_codecs.ZstdDictionary`, or None (none asked for, or not built)."""
        return self._dictionary

    def _tally(self, s: np.ndarray, sign: int) -> None:
        """Add (`sign` 1) or remove (-1) the entries of slots `s` in the per-codec counts `_tags`; under the lock."""
        for row, w in enumerate((None, self._layout_nbytes[self._layout[s]], self._length[s].astype(np.float64))):
            self._tags[row] += sign * np.bincount(self._codec[s], weights=w, minlength=_NUM_TAGS).astype(np.int64)

    def _free(self, s: np.ndarray) -> None:
        """Drop the entries of slots `s` (unique ids); under the lock."""
        s = s[self._chunk[self._at(s)] >= 0]
        if not s.size:
            return
        self._tally(s, -1)
        self._arena.free(self._chunk[s], self._length[s])
        self._chunk[s], self._base[s], self._child[s] = -1, -1, -1

    def _maybe_compact(self) -> None:
        """Relocate the sparsest sealed chunks while freed bytes exceed `max_dead_fraction` of the arena; under the lock."""
        while (cid := self._arena.sparsest(self.max_dead_fraction)) is not None:
            slots = np.flatnonzero(self._chunk == cid)
            self._chunk[slots], self._offset[slots] = self._arena.relocate(cid, self._offset[slots], self._length[slots])
            self._compactions += 1

    def delete(self, slots: Any) -> None:
        """Empty the given slots and the deltas based on them (`dependents`)."""
        s = np.unique(self._slots(slots).reshape(-1))
        with self._lock:
            self._recent = None
            self._free(np.union1d(s, self._dependents(s)))
            self._maybe_compact()

    def clear(self) -> None:
        """Empty every slot and release the whole arena."""
        with self._lock:
            self._recent = None
            self._free(np.arange(self._rows))
            self._arena.clear()

    def get(self, slots: Any, *, missing: str = "raise", out: np.ndarray | None = None) -> np.ndarray:
        """Decode a batch of slots.

        Args:
          slots: integer slot ids of any shape `S` (negative ids count from the end).
          missing: what an empty (never written or deleted) slot gives: `"raise"` (default) raises KeyError;
            `"zeros"` gives zeros of the batch's dtype and shape (else the declared `item_shape` and `dtype`).
          out: optional writeable C-contiguous array of shape `S + item_shape` and the entries' dtype to decode into.

        Returns:
          # shape=S + item_shape, the dtype the entries were stored with.

        Raises:
          KeyError: an empty slot with `missing="raise"` (the message lists them).
          CorruptEntryError: (a ValueError) an entry whose bytes changed since it was written (the message names
            the store and the slots).
          ValueError: entries of different shapes or dtypes; a bad `missing` or `out`.
          IndexError, TypeError: bad slot ids.
        """
        return self._get_many([slots], missing, None if out is None else [out], "slots")[0]

    def get_many(
        self, slot_arrays: Sequence[Any], *, missing: str = "raise", outs: Sequence[np.ndarray] | None = None, chains_out: list | None = None
    ) -> list[np.ndarray]:
        """`get` for several slot arrays at once, each into its own output.

        A slot that occurs several times, in one array or across arrays, is decoded once and copied to the others
        (e.g. frame stacks and the next stacks, which share most frames).

        Args:
          slot_arrays: `m` integer arrays of slot ids, shapes `S_j`.
          missing: as in `get` (all entries of all arrays must share one dtype and shape).
          outs: optional `m` writeable C-contiguous arrays, shapes `S_j + item_shape`.
          chains_out: optional list; the read appends the slots (int64, unique) it decoded besides the requested ones
            (`chain_slots` of the request as the read found them).

        Returns:
          `m` arrays, # shape=S_j + item_shape, the stored dtype.

        Raises:
          ValueError: as `get`, or `outs` does not have one array per slot array.
        """
        return self._get_many(slot_arrays, missing, outs, "slot_arrays", chains_out)

    def _get_many(self, slot_arrays, missing, outs, field: str, chains_out: list | None = None) -> list[np.ndarray]:
        """`get_many`, its errors naming the slot ids `field` (`field[j]` for array `j` of several)."""
        if not isinstance(missing, str) or missing not in ("raise", "zeros"):
            raise ValueError(f"missing: expected 'raise' or 'zeros', got {missing!r}")
        if not isinstance(slot_arrays, (list, tuple)):
            raise TypeError(f"{field}: expected a list of slot id arrays, got {type(slot_arrays).__name__}")
        if not slot_arrays:
            raise ValueError(f"{field}: expected at least one array of slot ids, got none")
        if outs is not None and (not isinstance(outs, (list, tuple)) or len(outs) != len(slot_arrays)):
            raise ValueError(f"outs: expected a list of {len(slot_arrays)} arrays (one per slot array), got {outs!r:.80}")
        names = [field] if len(slot_arrays) == 1 else [f"{field}[{j}]" for j in range(len(slot_arrays))]
        ss = [integer_ids(x, n) for x, n in zip(slot_arrays, names)]
        flat = np.concatenate([self._slots(x.reshape(-1), n) for x, n in zip(ss, names)])
        bounds = np.array([0, *itertools.accumulate(x.size for x in ss)], np.int64)
        n = flat.size
        with self._lock:  # a snapshot: published payload bytes never change afterwards
            chains = self._chains(flat)  # the slots the requested deltas' chains add, after the request
            flat = np.concatenate([flat, chains]) if chains.size else flat
            at = self._at(flat)
            chunk, offset, length, tag, meta, layout, check, base = (a[at] for a in self._index()[:8])  # not `child`
            table, layouts = self._arena.table(self._dictionary), list(self._layouts)
        if chains_out is not None:
            chains_out.append(chains)
        present = np.flatnonzero(chunk >= 0)
        empty = np.flatnonzero(chunk[:n] == -1)
        if empty.size + present.size < flat.size:
            bad = chunk < -1
            self._corrupt(flat[bad] if bad.any() else flat[n:][chunk[n:] == -1], "an invalid chunk id" if bad.any() else "a delta's base slot is empty")
        # Each distinct slot is decoded at its first position (`pos`, in slot order); the others are copies of it.
        uniq, first, inverse = _plan.first_of(flat[present])
        pos, bs = present[first], base[present[first]]
        # the chains, walked once (`host_codecs._plan`); `base_i`: each delta's base as an index into `uniq`, -1: none
        base_i, order, root, depth, rank, target, bad = _plan.chains(uniq, bs.astype(np.int64), pos < n)
        # read hook: an arena whose chunks are files (host_codecs.chunk_arena) reads the decoded payloads here
        table, chunk, offset = self._arena.load(table, chunk, offset, length, pos)
        chunk, offset, length, meta, check = chunk[pos], offset[pos], length[pos], meta[pos], check[pos]
        self._verify(table, uniq, chunk, offset, length, tag[pos], meta, layout[pos], check, (bs, check[base_i]))  # (read for deltas only)
        if empty.size and missing == "raise":
            raise KeyError(f"slots never written (or deleted): {_some(flat[empty])}; pass missing='zeros' to get zeros instead")
        if present.size:
            lay = layout[present]
            lids = lay[:1] if lay.min() == lay.max() else np.unique(lay)
            if lids.size > 1:
                desc = [f"{dtype_from_code(layouts[i][0])}{list(layouts[i][1])}" for i in lids[:5].tolist()]
                raise ValueError(f"slots: the requested entries have different dtypes/shapes {desc}; get them in separate calls")
            code, item_shape = layouts[int(lids[0])]
        elif self._declared is not None:
            code, item_shape = self._declared
        elif flat.size == 0:
            code, item_shape = dtype_code(np.uint8), ()
        else:
            raise KeyError("slots: all requested slots are empty and the store has no declared item_shape/dtype, so the zeros' shape is unknown")
        dtype = dtype_from_code(code)
        nbytes = math.prod(item_shape) * dtype.itemsize
        results = [self._output(outs, j, s.shape + tuple(item_shape), dtype, len(ss)) for j, s in enumerate(ss)]
        views = [r.reshape(s.size, -1).view(np.uint8) if nbytes and s.size else np.empty((s.size, nbytes), np.uint8) for s, r in zip(ss, results)]
        if empty.size:  # zeros for the empty slots
            out_j, out_row = _out_of(empty, bounds)
            for j in np.unique(out_j).tolist():
                views[j][out_row[out_j == j]] = 0
        if not present.size or not nbytes:
            return results
        # one shard of whole chains per thread; one shard when a codec decodes holding the GIL (`Codec.threaded_decode`)
        k, t = pos.size, tag[pos].astype(np.int64)
        threads = num_threads() if all(codec_for_tag(c).threaded_decode for c in np.flatnonzero(np.bincount(t)).tolist()) else 1
        shards = max(1, min(threads, k, k * nbytes // _READ_SHARD_BYTES))
        cuts = np.arange(1, shards) * (k / shards)  # np.linspace(0, k, shards + 1)[1:-1]
        if bad.any():
            self._corrupt(uniq[bad], "its chain of deltas never reaches a keyframe")
        do, shard = _plan.decode_order(order, root, depth, rank, t, cuts, _NUM_TAGS)
        # in decode order: each entry's columns (a run: one slice), row and base's row; the rows each shard copies
        run_at, cols, into, bases, copies, copy_cuts = _plan.placement(
            do, shard, t, target, base_i, pos, present, inverse, bounds, shards, chunk, offset, length, meta)
        runs = [[] for _ in range(shards)]
        first = do[run_at[:-1]]
        for lo, hi, s, c in zip(run_at[:-1].tolist(), run_at[1:].tolist(), shard[first].tolist(), t[first].tolist()):
            runs[s].append((lo, hi, codec_for_tag(c)))
        deltas = bool(chains.size) or bool((bs >= 0).any())
        addresses = np.array([v.__array_interface__["data"][0] for v in views], np.int64)
        copy_cuts = copy_cuts.tolist()

        def work(s0: int, s1: int) -> None:
            for s in range(s0, s1):
                for lo, hi, codec in runs[s]:
                    codec.decode_many(table, *(c[lo:hi] for c in cols), views, *(c[lo:hi] for c in into), dtype,
                                      bases=tuple(c[lo:hi] for c in bases) if deltas else None)
                _plan.copy_rows(ctypes.memmove, addresses, copies, nbytes, copy_cuts[s], copy_cuts[s + 1])

        parallel_for(shards, work)
        return results

    def _corrupt(self, slots: np.ndarray, why: str):
        raise CorruptEntryError(f"CompressedStore{' ' + repr(self.name) if self.name else ''}: slots {_some(slots)} are corrupt "
                                f"({why}): their bytes changed after they were written")

    def _verify(self, table, slots, chunk, offset, length, tag, meta, layout, check, bases) -> None:
        """Raise CorruptEntryError naming the slots whose entries fail their checks; `bases`: (base slots, -1 for a
        keyframe, and the bases' checks) of the entries (`host_codecs._plan.entry_checks`)."""
        if not slots.size:  # nothing read: the chunks (possibly files an arena reads on demand) are not looked at
            return
        keys, _, sizes = chunk_addresses(table)  # the decoders read without bounds checks (`ChunkTable.checked`)
        sums = _payload_sums(table, chunk, offset, length, slots, self.checksum)
        bad, outside = _plan.entry_checks(sums, check, tag, meta, layout, *bases, keys, sizes, chunk, offset, length)
        if bad.any():
            self._corrupt(slots[bad], "checksum mismatch")
        if outside.any():
            self._corrupt(slots[outside], "a payload outside its chunk")

    @staticmethod
    def _output(outs, j: int, shape: tuple[int, ...], dtype: np.dtype, m: int) -> np.ndarray:
        """Output `j` of a read: a new array, or `outs[j]` once checked."""
        if outs is None:
            return np.empty(shape, dtype=dtype)
        result, name = outs[j], "out" if m == 1 else f"outs[{j}]"
        if not isinstance(result, np.ndarray):
            raise TypeError(f"{name}: expected a numpy array, got {type(result).__name__}")
        if result.shape != shape or result.dtype != dtype or not result.flags.c_contiguous or not result.flags.writeable:
            raise ValueError(
                f"{name}: expected a writeable C-contiguous array of shape {shape} and dtype "
                f"{dtype}, got shape {result.shape}, dtype {result.dtype}"
                + ("" if result.flags.c_contiguous else ", not C-contiguous")
                + ("" if result.flags.writeable else ", read-only")
            )
        return result

    def written(self, slots: Any) -> np.ndarray:
        """Boolean mask of the shape of `slots`: which slots hold an entry."""
        s = self._slots(slots)
        with self._lock:
            return self._chunk[self._at(s)] >= 0

    def _key(self, key: Any) -> tuple[np.ndarray, bool]:
        """Slot ids (int64, wrapped) of `store[key]` and whether `key` is one int."""
        if isinstance(key, slice):
            try:
                return np.arange(*key.indices(self.num_slots)), False
            except (TypeError, ValueError) as exc:
                raise (type(exc))(f"key: a slice of slot ids with int bounds and a non-zero step, got {key} ({exc})") from None
        scalar = isinstance(key, (int, np.integer)) and not isinstance(key, bool)
        return self._slots([key] if scalar else key, "key"), scalar

    def __getitem__(self, key: Any) -> np.ndarray:
        """`store[i]` -> one array; `store[ids]` / `store[a:b]` -> a batch (see `get`)."""
        s, scalar = self._key(key)
        return self.get(s)[0] if scalar else self.get(s)

    def __setitem__(self, key: Any, value: Any) -> None:
        """`store[i] = array` or `store[ids] = batch` (see `put`)."""
        s, scalar = self._key(key)
        self._put(s, as_array(value, "value")[None] if scalar else value, None, "key", "value")

    def __len__(self) -> int:
        return self.num_slots

    def __repr__(self) -> str:
        return f"CompressedStore(num_slots={self.num_slots}, codec={self.codec.spec!r}, entries={self.num_entries}, nbytes={self.nbytes})"

    num_entries = _stat("entries", "Slots currently holding an entry.")
    payload_nbytes = _stat("payload_nbytes", "Bytes of the live compressed payloads (no padding, no index).")
    raw_nbytes = _stat("raw_nbytes", "Bytes the live entries take decoded.")
    arena_nbytes = _stat("arena_nbytes", "Bytes of all arena chunks held (payload and slack).")
    index_nbytes = _stat("index_nbytes", "Bytes of the per-slot index arrays and the layout table.")
    recent_nbytes = _stat("recent_nbytes", "Bytes of the raw rows the newest put with bases keeps for the next put's deltas.")
    nbytes = _stat("nbytes", "Memory the store holds: arena + index + dictionary + recent rows (no Python object per entry).")
    compression_ratio = _stat("compression_ratio", "`raw_nbytes / nbytes`: decoded size over everything held (0 when empty).")

    @property
    def dictionary_nbytes(self) -> int:
        """Bytes of the zstd dictionary (0 without one)."""
        d = self._dictionary
        return d.nbytes if d is not None else 0

    def stats(self) -> dict[str, Any]:
        """An accounting snapshot.

        Returns:
          A dict with `entries`, `raw_nbytes`, `payload_nbytes`, `arena_nbytes`, `slack_nbytes` (arena - payload),
          `dead_nbytes` (freed, not yet reclaimed), `index_nbytes`, `dictionary_nbytes`, `recent_nbytes`, `nbytes`,
          `compression_ratio`, `num_chunks`, `compactions` and `codecs`: per codec name holding an entry,
          `{"entries", "raw_nbytes", "payload_nbytes", "payload_ratio"}` (raw / payload).
        """
        index = sum(a.nbytes for a in self._index())
        dict_nbytes = self.dictionary_nbytes
        with self._lock:
            index += self._layout_nbytes.nbytes + sum(16 + 8 * len(shp) for _, shp in self._layouts)
            tags, arena, kept = self._tags.copy(), self._arena.nbytes, self._recent
            recent = 0 if kept is None else kept[0].nbytes + kept[1].nbytes
            per = {
                c.name: {"entries": int(n), "raw_nbytes": int(raw), "payload_nbytes": int(pay), "payload_ratio": raw / pay if pay else float("inf")}
                for c in CODECS.values() for n, raw, pay in [tags[:, c.tag]] if n
            }
            (entries, raw, payload) = (int(x) for x in tags.sum(axis=1))
            total = arena + index + dict_nbytes + recent
            return {
                "entries": entries, "raw_nbytes": raw, "payload_nbytes": payload,
                "arena_nbytes": arena, "slack_nbytes": arena - payload, "dead_nbytes": self._arena.dead_nbytes,
                "index_nbytes": index, "dictionary_nbytes": dict_nbytes, "recent_nbytes": recent, "nbytes": total,
                "compression_ratio": raw / total if raw else 0.0, "num_chunks": len(self._arena.chunks),
                "compactions": self._compactions, "codecs": per,
            }
