"""CompressedStore: a fixed number of slots, each holding one compressed array.

Layout (all plain numpy arrays, simple to persist):

* index, one row per slot (16 bytes per slot)::

    chunk   # shape=(num_slots,), dtype=int32,  arena chunk id, -1 = empty slot
    offset  # shape=(num_slots,), dtype=uint32, byte offset of the payload in its chunk
    length  # shape=(num_slots,), dtype=uint32, payload bytes (without alignment padding)
    codec   # shape=(num_slots,), dtype=uint8,  codec tag (host_codecs.registry)
    meta    # shape=(num_slots,), dtype=uint8,  codec byte (RLE: count width in bytes)
    layout  # shape=(num_slots,), dtype=uint16, id into the layout table

* layout table: ``layout id -> (dtype code, shape)``, shared by all entries with that dtype and
  shape, so every entry records its dtype and shape at 2 bytes per entry; decode never guesses.
* arena: a few large ``np.uint8`` chunks (``min_chunk_bytes``, then each new chunk half the
  arena so far, up to ``chunk_bytes``; unused tail <= 1/3 of the arena while it grows),
  payloads packed at 8-byte aligned offsets. No Python object per entry.

Concurrency: one lock guards the index and the allocator. ``put`` encodes outside the lock,
then under the lock copies the payloads into never-used arena space (past the chunk's bump
pointer), and only then publishes the index rows. ``get`` snapshots the index rows and
references to the chunks under the lock and decodes outside it. Published payload bytes are
never modified: freed space is reclaimed only by dropping a chunk whose entries are all gone or
by compaction, which copies live entries into fresh space and drops the old chunk object (a
reader still holding it keeps it alive). So a concurrent reader sees each entry either entirely
before or entirely after a put, never torn.

Reads: ``get`` (one slot array) and ``get_many`` (several, each into its own output) decode every
distinct slot of the request once, into its first row, and copy it to its other rows. The
decode and those copies run in one shard per thread (``host_codecs.parallel_for``).

Space reuse: a chunk with no live entry left is released; when freed-but-unreleased bytes exceed
``max_dead_fraction`` of the arena, the sparsest chunks are compacted. FIFO overwrite (a replay
buffer) empties chunks in order and never needs compaction.

Accounting (bytes, honest, no Python object overhead hidden):
``nbytes = arena_nbytes + index_nbytes`` where ``arena_nbytes = payload_nbytes + slack``
(alignment padding, freed space not yet reclaimed, unused tail of chunks);
``compression_ratio = raw_nbytes / nbytes``.

Example:
  >>> import numpy as np
  >>> from host_codecs import CompressedStore
  >>> store = CompressedStore(1000, codec="none")
  >>> store.put(np.array([3, 7]), np.zeros((2, 84, 84), np.uint8))
  >>> store.get(np.array([7, 3])).shape
  (2, 84, 84)
"""

from __future__ import annotations

import math
import threading
from typing import Any, Sequence

import numpy as np

from ._base import ALIGN, ChunkTable, Codec, ceil_align, dtype_code, dtype_from_code, parallel_for
from ._gather import copy_rows
from ._plan import CHUNK, DST_OUT, DST_ROW, LENGTH, META, OFFSET, OUT, ROW, SRC_OUT, SRC_ROW, TAG, read_plan
from .registry import CODECS, codec_for_tag, get_codec

__all__ = ["CompressedStore"]

_MAX_CHUNK = (1 << 32) - ALIGN  # uint32 offsets/lengths
_NUM_TAGS = max(c.tag for c in CODECS.values()) + 1
_MAX_SAMPLE_BYTES = 64 << 20  # entries decoded (at least 8) to build a dictionary from
_MAX_DICTIONARY_BYTES = 1 << 20
_READ_SHARD_BYTES = 1 << 20  # a read (decode + copies) is split over threads in shards of >= 1 MiB


class _Chunk:
    """Arena chunk bookkeeping: the bytes, the bump pointer and what is still live."""

    __slots__ = ("data", "used", "live_bytes", "live_count")

    def __init__(self, size: int):
        self.data = np.empty(size, dtype=np.uint8)  # shape=(size,), dtype=uint8
        self.used = 0  # bytes handed out (bump pointer), multiple of ALIGN
        self.live_bytes = 0  # padded bytes of entries still referenced by the index
        self.live_count = 0  # entries still referenced (zero-length ones included)


def _integer_ids(slots: Any, field: str) -> np.ndarray:
    """``slots`` as an integer array (any integer dtype); TypeError for anything else."""
    if type(slots) is np.ndarray and slots.dtype.kind in "iu":
        return slots
    s = np.asarray(slots)
    if s.size == 0 and s.dtype == np.float64:  # np.asarray([]) is float64: an empty id list
        s = s.astype(np.int64)
    if s.dtype == np.bool_ or not np.issubdtype(s.dtype, np.integer):
        raise TypeError(f"{field}: expected integer slot ids, got dtype {s.dtype}")
    return s


def _as_int64(s: np.ndarray, field: str) -> np.ndarray:
    """Integer ids as int64; IndexError for unsigned ids past int64 (which would wrap negative)."""
    if s.dtype == np.uint64 and s.size and int(s.max()) > np.iinfo(np.int64).max:
        raise IndexError(f"{field}: slot {int(s.max())} out of range")
    return s.astype(np.int64, copy=False)


class CompressedStore:
    """Thread-safe slots of compressed arrays, payloads packed in large arenas.

    Args:
      num_slots: number of slots; slot ids are ints in ``[-num_slots, num_slots)``
        (negative ids count from the end, as in numpy).
      codec: default codec for :meth:`put`: a registry name such as ``"rle"``, ``"igzip:1"``,
        ``"zstd:3"``, ``"none"``, or a :class:`~host_codecs.Codec`.
      item_shape, dtype: optional declared shape/dtype of one entry. When given, :meth:`put`
        refuses anything else and ``get(..., missing="zeros")`` can fill a batch of only empty
        slots. When omitted, each entry records its own dtype and shape.
      chunk_bytes: largest arena chunk in bytes (default 64 MiB, at most 4 GiB - 8).
      min_chunk_bytes: first chunk size; each later chunk is half the arena so far (at least this,
        at most ``chunk_bytes``).
      max_dead_fraction: compaction starts when freed-but-unreleased bytes exceed this fraction
        of the arena.
      dictionary_bytes: 0 (default) or the most content bytes of a zstd dictionary (a zstd
        default codec only, e.g. 16384; at most 1 MiB): the :meth:`put` that brings the entries put with the
        default codec to ``dictionary_samples`` builds a dictionary from its batch and stored
        entries of the same dtype and shape (once, ~60 ms for 1,024 Atari frames; see
        :meth:`host_codecs.zstd.ZstdDictionary.train`), and encodes that batch and every later
        entry of the default codec with it. 84x84 Atari frames then take 2-3x less space and
        decode ~2x faster; entries written before keep their format. If the build fails (zstd
        refuses the samples, memory runs out), the store goes on without a dictionary and
        ``dictionary_error`` says why.
      dictionary_samples: entries to build the dictionary from (fewer for large entries: at
        most 64 MiB of them, at least 8).

    Raises:
      ValueError / ImportError: from :func:`host_codecs.get_codec` for a bad or unavailable codec;
      ValueError for non-positive sizes, or ``dictionary_bytes`` with a codec other than zstd.
    """

    def __init__(
        self,
        num_slots: int,
        codec: "str | Codec" = "rle",
        *,
        item_shape: tuple[int, ...] | None = None,
        dtype: Any = None,
        chunk_bytes: int = 64 << 20,
        min_chunk_bytes: int = 64 << 10,
        max_dead_fraction: float = 0.25,
        dictionary_bytes: int = 0,
        dictionary_samples: int = 1024,
    ):
        if isinstance(num_slots, bool) or not isinstance(num_slots, (int, np.integer)) or num_slots < 1:
            raise ValueError(f"num_slots: expected a positive int, got {num_slots!r}")
        if not (ALIGN <= min_chunk_bytes <= chunk_bytes <= _MAX_CHUNK):
            raise ValueError(
                f"chunk sizes: expected {ALIGN} <= min_chunk_bytes <= chunk_bytes <= {_MAX_CHUNK}, "
                f"got min_chunk_bytes={min_chunk_bytes}, chunk_bytes={chunk_bytes}"
            )
        if not 0.0 < max_dead_fraction < 1.0:
            raise ValueError(f"max_dead_fraction: expected a float in (0, 1), got {max_dead_fraction}")
        self.num_slots = int(num_slots)
        self.codec = get_codec(codec)
        self._declared: tuple[int, tuple[int, ...]] | None = None
        if (item_shape is None) != (dtype is None):
            raise ValueError("item_shape and dtype: give both or neither")
        if item_shape is not None:
            shape = tuple(int(s) for s in item_shape)
            if any(s < 0 for s in shape):
                raise ValueError(f"item_shape: expected non-negative sizes, got {item_shape}")
            self._declared = (dtype_code(np.dtype(dtype), field="dtype"), shape)
        self.chunk_bytes = ceil_align(int(chunk_bytes))
        self.min_chunk_bytes = ceil_align(int(min_chunk_bytes))
        self.max_dead_fraction = float(max_dead_fraction)
        for name, v, lo, hi in (
            ("dictionary_bytes", dictionary_bytes, 0, _MAX_DICTIONARY_BYTES), ("dictionary_samples", dictionary_samples, 1, None)
        ):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo or (hi is not None and v > hi):
                raise ValueError(f"{name}: expected an int in [{lo}, {hi or 'inf'}], got {v!r}")
        if dictionary_bytes and self.codec.name != "zstd":
            raise ValueError(
                f"dictionary_bytes: dictionaries are for the zstd codec, this store's codec is {self.codec.spec!r}"
            )
        self.dictionary_bytes = int(dictionary_bytes)
        self.dictionary_samples = int(dictionary_samples)
        self._dictionary = None  # host_codecs.zstd.ZstdDictionary once trained
        self._trained = not dictionary_bytes  # True: no (more) training to do
        self._rows_seen = 0  # entries put with the default codec until then
        #: Why no dictionary was built (``dictionary_bytes`` > 0 and samples seen), else None.
        self.dictionary_error: str | None = None
        self._samples_lock = threading.Lock()

        n = self.num_slots
        self._chunk = np.full(n, -1, dtype=np.int32)  # shape=(num_slots,), dtype=int32
        self._offset = np.zeros(n, dtype=np.uint32)  # shape=(num_slots,), dtype=uint32
        self._length = np.zeros(n, dtype=np.uint32)  # shape=(num_slots,), dtype=uint32
        self._codec = np.zeros(n, dtype=np.uint8)  # shape=(num_slots,), dtype=uint8
        self._meta = np.zeros(n, dtype=np.uint8)  # shape=(num_slots,), dtype=uint8
        self._layout = np.zeros(n, dtype=np.uint16)  # shape=(num_slots,), dtype=uint16

        self._layouts: list[tuple[int, tuple[int, ...]]] = []  # id -> (dtype code, shape)
        self._layout_ids: dict[tuple[int, tuple[int, ...]], int] = {}
        self._layout_nbytes = np.zeros(0, dtype=np.int64)  # shape=(num_layouts,), dtype=int64

        self._chunks: dict[int, _Chunk] = {}
        self._table: ChunkTable | None = None  # the chunks' bytes and addresses for reads (lazy)
        self._next_chunk_id = 0
        self._open: int | None = None  # chunk receiving new payloads
        self._arena_nbytes = 0
        self._dead_nbytes = 0  # freed bytes in chunks that are still held
        self._compactions = 0

        # Per codec tag: live entries, their decoded bytes and payload bytes.
        self._tag_entries = np.zeros(_NUM_TAGS, dtype=np.int64)
        self._tag_raw = np.zeros(_NUM_TAGS, dtype=np.int64)
        self._tag_payload = np.zeros(_NUM_TAGS, dtype=np.int64)

        self._lock = threading.Lock()

    # -- slots and layouts ----------------------------------------------------------------------
    def _slots(self, slots: Any, field: str = "slots") -> np.ndarray:
        """Slot ids as int64, negative ones wrapped; TypeError / IndexError for bad ids."""
        return self._in_range(_integer_ids(slots, field), field)

    def _in_range(self, s: np.ndarray, field: str) -> np.ndarray:
        s = _as_int64(s, field)
        if s.size:
            lo, hi = int(s.min()), int(s.max())
            if lo < -self.num_slots or hi >= self.num_slots:
                bad = lo if lo < -self.num_slots else hi
                raise IndexError(
                    f"{field}: slot {bad} out of range for a store of {self.num_slots} slots"
                )
            if lo < 0:
                s = np.where(s < 0, s + self.num_slots, s)
        return s

    def _layout_id(self, code: int, shape: tuple[int, ...]) -> int:
        """Id of (dtype code, shape); call under the lock."""
        key = (code, shape)
        lid = self._layout_ids.get(key)
        if lid is None:
            lid = len(self._layouts)
            if lid > np.iinfo(np.uint16).max:
                raise ValueError("CompressedStore: more than 65,536 distinct (dtype, shape) layouts")
            self._layouts.append(key)
            self._layout_ids[key] = lid
            nb = int(np.prod(shape, dtype=np.int64)) * dtype_from_code(code).itemsize
            self._layout_nbytes = np.append(self._layout_nbytes, nb)
        return lid

    # -- write path ---------------------------------------------------------------------------
    def put(self, slots: Any, arrays: Any, *, codec: "str | Codec | None" = None) -> None:
        """Store ``arrays[i]`` in slot ``slots[i]``, replacing what was there.

        Args:
          slots: # shape=(B,), integer slot ids. Repeated ids: the last one wins (as numpy).
          arrays: # shape=(B, *item_shape), any dtype of ``host_codecs._base.DTYPES``; not cast.
          codec: codec for this call (default: the store's); entries of different codecs
            coexist and each is decoded with its own.

        Raises:
          TypeError: unsupported dtype or non-integer slots; ValueError: batch size or declared
          shape/dtype mismatch; IndexError: slot out of range.
        """
        cdc = self.codec if codec is None else get_codec(codec)
        s = self._slots(slots)
        if s.ndim != 1:
            raise ValueError(f"slots: expected a 1-D array of slot ids, got shape {s.shape}")
        a = np.asarray(arrays)
        if a.ndim < 1 or a.shape[0] != s.shape[0]:
            raise ValueError(
                f"arrays: expected a leading batch axis of {s.shape[0]} (one per slot), got shape {a.shape}"
            )
        code = dtype_code(a.dtype)
        item_shape = tuple(int(d) for d in a.shape[1:])
        if self._declared is not None and (code, item_shape) != self._declared:
            dcode, dshape = self._declared
            raise ValueError(
                f"arrays: this store holds items of shape {dshape} and dtype "
                f"{dtype_from_code(dcode)}, got shape {item_shape} and dtype {a.dtype}"
            )
        if s.size == 0:
            return
        # Repeated slots: keep the last occurrence only (numpy assignment semantics).
        if np.unique(s).size != s.size:
            rev_last = np.unique(s[::-1], return_index=True)[1]
            keep = np.sort(s.size - 1 - rev_last)
            s, a = s[keep], a[keep]
        a = np.ascontiguousarray(a)
        b = s.shape[0]
        nbytes = a.dtype.itemsize * (a.size // b if b else 0)
        rows = a.reshape(b, nbytes // a.dtype.itemsize).view(np.uint8) if nbytes else np.empty((b, 0), np.uint8)
        dictionary = None
        if cdc is self.codec:
            dictionary = self._dictionary if self._trained else self._train(rows, code, item_shape)
        # outside the lock: the expensive part
        enc = cdc.encode_batch(rows, a.dtype) if dictionary is None else cdc.encode_batch(rows, a.dtype, dictionary)
        if int(enc.lengths.max(initial=0)) > _MAX_CHUNK:
            raise ValueError(f"arrays: one compressed entry exceeds {_MAX_CHUNK} bytes")

        with self._lock:
            lid = self._layout_id(code, item_shape)
            chunk_ids, offsets = self._place(enc)
            self._free(s)
            self._chunk[s] = chunk_ids
            self._offset[s] = offsets
            self._length[s] = enc.lengths
            self._codec[s] = cdc.tag
            self._meta[s] = enc.meta
            self._layout[s] = lid
            self._tag_entries[cdc.tag] += b
            self._tag_raw[cdc.tag] += b * int(self._layout_nbytes[lid])
            self._tag_payload[cdc.tag] += int(enc.lengths.sum())
            self._maybe_compact()

    def _train(self, rows: np.ndarray, code: int, item_shape: tuple[int, ...]):
        """The dictionary to encode ``rows`` with: built here (once, outside the store lock)
        when the entries put with the default codec, ``rows`` included, reach
        ``dictionary_samples``; None before. Samples: stored entries of the same dtype and shape
        (decoded again, so nothing is kept around until then; fewer when the store has fewer
        slots) and ``rows``, at most ``_MAX_SAMPLE_BYTES`` of them. A build that fails for any
        reason leaves the store without a dictionary (``dictionary_error`` says why); the put
        goes on."""
        with self._samples_lock:
            if self._trained:  # by another thread meanwhile
                return self._dictionary
            tag = self.codec.tag
            self._rows_seen += rows.shape[0]
            if self._rows_seen < self.dictionary_samples:
                return None
            limit = min(self.dictionary_samples, max(8, _MAX_SAMPLE_BYTES // max(rows.shape[1], 1)))
            fresh = list(rows[:limit])
            d = None
            try:
                with self._lock:
                    lid = self._layout_ids.get((code, item_shape))
                    stored = np.zeros(0, np.int64) if lid is None else np.flatnonzero(
                        (self._chunk >= 0) & (self._codec == tag) & (self._layout == lid)
                    )[: limit - len(fresh)]
                # Stored entries first, then the new ones (zstd's trainer depends on the order).
                samples = []
                if stored.size:
                    try:
                        samples = list(self.get(stored, missing="zeros").reshape(stored.size, -1).view(np.uint8))
                    except ValueError:  # a concurrent put changed a sample's dtype or shape: skip them
                        pass
                samples += fresh
                from .zstd import ZstdDictionary

                d = ZstdDictionary.train(samples, self.dictionary_bytes, self.codec.level)
                if d is None:
                    self.dictionary_error = "zstd refused the samples"
                elif getattr(self.codec, "engine", None) == "native":
                    d.digest()  # built now, so nbytes counts them from the start
            except Exception as exc:  # e.g. MemoryError: the dictionary is an optimisation only
                d, self.dictionary_error = None, f"{type(exc).__name__}: {exc}"
            with self._lock:
                self._dictionary = d
                self._table = None  # readers' next table carries the dictionary
            self._trained = True
            return d

    @property
    def dictionary(self):
        """The trained :class:`host_codecs.zstd.ZstdDictionary`, or None (none asked for, not
        trained yet, or the trainer refused the samples)."""
        return self._dictionary

    def _new_chunk(self, need: int) -> int:
        """Open a chunk of at least ``need`` bytes (geometric growth); call under the lock."""
        size = min(self.chunk_bytes, max(self.min_chunk_bytes, self._arena_nbytes // 2, need))
        size = ceil_align(max(size, need))  # multiple of ALIGN: codecs view chunks as u16/u32/u64
        old = self._open
        cid = self._next_chunk_id
        self._next_chunk_id += 1
        self._chunks[cid] = _Chunk(size)
        self._table = None
        self._arena_nbytes += size
        self._open = cid
        if old is not None:
            self._release_if_empty(old)
        return cid

    def _place(self, enc) -> tuple[np.ndarray, np.ndarray]:
        """Copy an encoded batch into never-used arena space; returns (chunk id, offset) per
        entry. Contiguous runs of entries are copied with one memcpy each."""
        b = enc.offsets.shape[0]
        ends = enc.offsets + ceil_align(enc.lengths)  # padded end of each payload
        chunk_ids = np.empty(b, dtype=np.int32)
        offsets = np.empty(b, dtype=np.int64)
        start = 0
        while start < b:
            base = int(enc.offsets[start])
            ch = self._chunks[self._open] if self._open is not None else None
            room = ch.data.shape[0] - ch.used if ch is not None else -1
            # entries [start, stop) fit in the open chunk
            stop = start + int(np.searchsorted(ends[start:] - base, room, side="right"))
            if stop == start:
                rest = int(ends[-1]) - base
                self._new_chunk(max(rest if rest <= self.chunk_bytes else int(ends[start]) - base, ALIGN))
                continue
            span = int(ends[stop - 1]) - base
            ch.data[ch.used : ch.used + span] = enc.buffer[base : base + span]
            chunk_ids[start:stop] = self._open
            offsets[start:stop] = enc.offsets[start:stop] - base + ch.used
            ch.used += span
            ch.live_bytes += span
            ch.live_count += stop - start
            start = stop
        return chunk_ids, offsets

    def _free(self, s: np.ndarray) -> None:
        """Drop the current entries of slots ``s`` (unique ids) from the accounting; under lock."""
        old = self._chunk[s]
        live = old >= 0
        if not live.any():
            return
        s = s[live]
        old = old[live]
        padded = ceil_align(self._length[s].astype(np.int64))
        tags = self._codec[s]
        self._tag_entries -= np.bincount(tags, minlength=_NUM_TAGS)
        self._tag_raw -= np.bincount(
            tags, weights=self._layout_nbytes[self._layout[s]], minlength=_NUM_TAGS
        ).astype(np.int64)
        self._tag_payload -= np.bincount(
            tags, weights=self._length[s].astype(np.float64), minlength=_NUM_TAGS
        ).astype(np.int64)
        ids, inv = np.unique(old, return_inverse=True)
        freed = np.bincount(inv, weights=padded).astype(np.int64)
        counts = np.bincount(inv)
        for cid, nb, cnt in zip(ids.tolist(), freed.tolist(), counts.tolist()):
            ch = self._chunks[cid]
            ch.live_bytes -= nb
            ch.live_count -= cnt
            self._dead_nbytes += nb
            self._release_if_empty(cid)
        self._chunk[s] = -1

    def _release_if_empty(self, cid: int) -> None:
        ch = self._chunks[cid]
        if cid != self._open and ch.live_count == 0:
            del self._chunks[cid]
            self._table = None
            self._arena_nbytes -= ch.data.shape[0]
            self._dead_nbytes -= ch.used - ch.live_bytes

    def _maybe_compact(self) -> None:
        """Move the live entries of the sparsest sealed chunks into fresh space while freed
        bytes exceed ``max_dead_fraction`` of the arena; under the lock."""
        while True:
            sealed = [(ch.used - ch.live_bytes, cid) for cid, ch in self._chunks.items() if cid != self._open]
            if not sealed or sum(d for d, _ in sealed) <= self.max_dead_fraction * self._arena_nbytes:
                return
            self._relocate(max(sealed)[1])
            self._compactions += 1

    def _relocate(self, cid: int) -> None:
        src = self._chunks[cid]
        slots = np.flatnonzero(self._chunk == cid)
        slots = slots[np.argsort(self._offset[slots], kind="stable")]
        offs = self._offset[slots].astype(np.int64)
        lens = self._length[slots].astype(np.int64)
        padded = ceil_align(lens)
        # Pack the live payloads back to back in a temporary buffer (one copy per span of
        # adjacent entries), then place them like a freshly encoded batch.
        new_offs = np.zeros(slots.size, dtype=np.int64)
        if slots.size > 1:
            np.cumsum(padded[:-1], out=new_offs[1:])
        buf = np.empty(int(padded.sum()), dtype=np.uint8)
        breaks = np.flatnonzero(offs[1:] != offs[:-1] + padded[:-1]) + 1
        for a, z in zip(np.r_[0, breaks].tolist(), np.r_[breaks, slots.size].tolist()):
            n = int(offs[z - 1] + padded[z - 1] - offs[a])
            buf[new_offs[a] : new_offs[a] + n] = src.data[offs[a] : offs[a] + n]

        class _Enc:  # the fields _place reads
            buffer, offsets, lengths = buf, new_offs, lens

        chunk_ids, offsets = self._place(_Enc)
        # The moved entries' bytes are still counted live in ``src``; drop the chunk whole.
        del self._chunks[cid]
        self._table = None
        self._arena_nbytes -= src.data.shape[0]
        self._dead_nbytes -= src.used - src.live_bytes
        self._chunk[slots] = chunk_ids
        self._offset[slots] = offsets

    def delete(self, slots: Any) -> None:
        """Empty the given slots (their space is reclaimed as described in the module doc)."""
        s = np.unique(self._slots(slots).reshape(-1))
        with self._lock:
            self._free(s)
            self._maybe_compact()

    def clear(self) -> None:
        """Empty every slot and release the whole arena."""
        with self._lock:
            self._free(np.arange(self.num_slots))
            if self._open is not None:
                ch = self._chunks.pop(self._open)
                self._table = None
                self._arena_nbytes -= ch.data.shape[0]
                self._dead_nbytes -= ch.used - ch.live_bytes
                self._open = None

    # -- read path ----------------------------------------------------------------------------
    def get(self, slots: Any, *, missing: str = "raise", out: np.ndarray | None = None) -> np.ndarray:
        """Decode a batch of slots.

        Args:
          slots: integer slot ids of any shape ``S`` (negative ids count from the end).
          missing: what an empty (never written or deleted) slot gives: ``"raise"`` (default)
            raises KeyError; ``"zeros"`` returns zeros of the batch's dtype and shape (taken
            from the other entries of the batch, else the declared ``item_shape``/``dtype``).
          out: optional writeable C-contiguous array of shape ``S + item_shape`` and the entries'
            dtype to decode into (e.g. a reused or pinned buffer).

        Returns:
          # shape=S + item_shape, dtype: the dtype the entries were stored with.

        Raises:
          KeyError: an empty slot with ``missing="raise"`` (the message lists them).
          ValueError: entries of the batch have different shapes/dtypes; bad ``missing``/``out``;
            a corrupt payload.
          IndexError / TypeError: bad slot ids.
        """
        return self.get_many([slots], missing=missing, outs=None if out is None else [out])[0]

    def get_many(
        self, slot_arrays: Sequence[Any], *, missing: str = "raise", outs: Sequence[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """:meth:`get` for several slot arrays at once, each into its own output.

        A slot that occurs several times, in one array or across arrays, is decoded once (into
        its first occurrence) and copied to the others: e.g. a sampled batch of frame stacks and
        the next stacks, which share most frames, decoded straight into two separate outputs
        (a jitted sample's output buffers), with no concatenated intermediate to split.

        Args:
          slot_arrays: ``m`` integer arrays of slot ids, shapes ``S_j``.
          missing: as in :meth:`get` (all entries of all arrays must share one dtype and shape).
          outs: optional ``m`` writeable C-contiguous arrays, shapes ``S_j + item_shape``, to decode
            into.

        Returns:
          ``m`` arrays, # shape=S_j + item_shape, dtype: the stored dtype.

        Raises:
          As :meth:`get`; ValueError when ``outs`` does not have one array per slot array.
        """
        if missing not in ("raise", "zeros"):
            raise ValueError(f"missing: expected 'raise' or 'zeros', got {missing!r}")
        ss = [_integer_ids(x, "slots") for x in slot_arrays]
        if not ss:
            raise ValueError("slot_arrays: expected at least one array of slot ids, got none")
        if outs is not None and len(outs) != len(ss):
            raise ValueError(f"outs: expected {len(ss)} arrays (one per slot array), got {len(outs)}")
        flat = _as_int64(ss[0].reshape(-1), "slots") if len(ss) == 1 else np.concatenate(
            [_as_int64(x.reshape(-1), "slots") for x in ss]
        )
        ends = [0]
        for x in ss:
            ends.append(ends[-1] + x.size)
        bounds = np.array(ends, dtype=np.int64)  # output j holds positions bounds[j]:bounds[j+1]
        with self._lock:  # snapshot; published payload bytes never change afterwards
            index = (self._chunk, self._offset, self._length, self._codec, self._meta, self._layout)
            entries, starts, copies, stats = read_plan(flat, bounds, *index)
            if stats[0] < 0:  # ids outside [0, num_slots): wrap negative ones (or raise), plan again
                flat = self._in_range(flat, "slots")
                entries, starts, copies, stats = read_plan(flat, bounds, *index)
            if self._table is None:
                self._table = ChunkTable({c: ch.data for c, ch in self._chunks.items()}, self._dictionary)
            table = self._table  # immutable once built: keeps the chunks it names alive
            layouts = self._layouts[: int(stats[2]) + 1]
            missing_pos = np.flatnonzero(self._chunk[flat] < 0) if stats[0] else None
            if stats[1] != stats[2] and stats[2] >= 0:  # mixed layouts: name them (error path)
                mixed = np.unique(self._layout[flat][self._chunk[flat] >= 0])[:5].tolist()
        if missing_pos is not None and missing == "raise":
            empty = np.unique(flat[missing_pos])
            raise KeyError(
                f"slots never written (or deleted): {empty[:10].tolist()}"
                + (f" and {empty.size - 10} more" if empty.size > 10 else "")
                + "; pass missing='zeros' to get zeros instead"
            )
        if stats[2] >= 0:  # some entry is written
            if stats[1] != stats[2]:
                desc = [f"{dtype_from_code(layouts[i][0])}{list(layouts[i][1])}" for i in mixed]
                raise ValueError(
                    f"slots: the requested entries have different dtypes/shapes {desc}; "
                    "get them in separate calls"
                )
            code, item_shape = layouts[int(stats[1])]
        elif self._declared is not None:
            code, item_shape = self._declared
        elif flat.size == 0:
            code, item_shape = (self._declared or (dtype_code(np.dtype(np.uint8)), ()))
        else:
            raise KeyError(
                "slots: all requested slots are empty and the store has no declared "
                "item_shape/dtype, so the zeros' shape is unknown"
            )
        dtype = dtype_from_code(code)
        nbytes = math.prod(item_shape) * dtype.itemsize
        results = []
        for j, s in enumerate(ss):  # every output is checked before any is written
            full_shape = s.shape + tuple(item_shape)
            if outs is None:
                results.append(np.empty(full_shape, dtype=dtype))
                continue
            result, name = outs[j], "out" if len(ss) == 1 else f"outs[{j}]"
            if not isinstance(result, np.ndarray):
                raise TypeError(f"{name}: expected a numpy array, got {type(result).__name__}")
            ok = result.shape == full_shape and result.dtype == dtype and result.flags.c_contiguous
            if not ok or not result.flags.writeable:
                raise ValueError(
                    f"{name}: expected a writeable C-contiguous array of shape {full_shape} and dtype "
                    f"{dtype}, got shape {result.shape}, dtype {result.dtype}"
                    + ("" if result.flags.c_contiguous else ", not C-contiguous")
                    + ("" if result.flags.writeable else ", read-only")
                )
            results.append(result)
        views = [
            r.reshape(s.size, -1).view(np.uint8) if nbytes and s.size else np.empty((s.size, nbytes), np.uint8)
            for s, r in zip(ss, results)
        ]
        if missing_pos is not None:  # zeros for the empty slots
            j_of = np.searchsorted(bounds, missing_pos, side="right") - 1
            for j in np.unique(j_of).tolist():
                views[j][missing_pos[j_of == j] - bounds[j]] = 0
        k = entries.shape[1]
        if k == 0 or nbytes == 0:
            return results
        one_tag = stats[3] == stats[4]
        meta = entries[META].astype(np.uint8)

        def shard(a: int, b: int) -> None:
            """Decode entries ``a:b``, then copy their repeats (codec calls made here run inline:
            see ``parallel_for``)."""
            e = entries[:, a:b]
            for tag in [int(stats[3])] if one_tag else np.unique(e[TAG]).tolist():
                sel = slice(None) if one_tag else np.flatnonzero(e[TAG] == tag)
                # The store's own codec for its tag (e.g. a python-engine zstd), else the registry's.
                (self.codec if tag == self.codec.tag else codec_for_tag(tag)).decode_many(
                    table, e[CHUNK, sel], e[OFFSET, sel], e[LENGTH, sel], meta[a:b][sel], views, e[OUT, sel], e[ROW, sel], dtype
                )
            lo, hi = int(starts[a]), int(starts[b])
            if hi > lo:
                c = copies[:, lo:hi]
                copy_rows(views, c[SRC_OUT], c[SRC_ROW], c[DST_OUT], c[DST_ROW])

        # Decoding is fast per byte (zstd -1: ~5 GB/s per core), so a shard must be large for a
        # second thread to pay for its wake-up (tens of microseconds on a VM). Measured on the
        # 2-core test machine, Breakout frames, jitted sample (decode + copies of repeats): batch
        # 32 (1.8 MB) 437 us on one thread vs 524 us on two; batch 64 (3.6 MB) 861 vs 774 us.
        parallel_for(k, shard, work_bytes=(k + copies.shape[1]) * nbytes, min_shard_bytes=_READ_SHARD_BYTES)
        return results

    def written(self, slots: Any) -> np.ndarray:
        """Boolean mask (same shape as ``slots``): which slots hold an entry."""
        s = self._slots(slots)
        with self._lock:
            return self._chunk[s] >= 0

    # -- numpy-style access -------------------------------------------------------------------
    def _key(self, key: Any) -> tuple[np.ndarray, bool]:
        if isinstance(key, slice):
            return np.arange(self.num_slots)[key], False
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return np.asarray([key]), True
        return np.asarray(key), False

    def __getitem__(self, key: Any) -> np.ndarray:
        """``store[i]`` -> one array; ``store[ids]`` / ``store[a:b]`` -> batch (see :meth:`get`)."""
        s, scalar = self._key(key)
        out = self.get(s)
        return out[0] if scalar else out

    def __setitem__(self, key: Any, value: Any) -> None:
        """``store[i] = array`` or ``store[ids] = batch`` (see :meth:`put`)."""
        s, scalar = self._key(key)
        v = np.asarray(value)
        self.put(s, v[None] if scalar else v)

    def __len__(self) -> int:
        return self.num_slots

    def __repr__(self) -> str:
        return (
            f"CompressedStore(num_slots={self.num_slots}, codec={self.codec.spec!r}, "
            f"entries={self.num_entries}, nbytes={self.nbytes})"
        )

    # -- accounting ---------------------------------------------------------------------------
    @property
    def num_entries(self) -> int:
        """Slots currently holding an entry."""
        with self._lock:
            return int(self._tag_entries.sum())

    @property
    def payload_nbytes(self) -> int:
        """Bytes of the live compressed payloads (no padding, no index)."""
        with self._lock:
            return int(self._tag_payload.sum())

    @property
    def raw_nbytes(self) -> int:
        """Bytes the live entries occupy decoded."""
        with self._lock:
            return int(self._tag_raw.sum())

    @property
    def arena_nbytes(self) -> int:
        """Bytes of all arena chunks held (payload + slack)."""
        with self._lock:
            return self._arena_nbytes

    @property
    def index_nbytes(self) -> int:
        """Bytes of the per-slot index arrays and the layout table."""
        idx = sum(
            a.nbytes for a in (self._chunk, self._offset, self._length, self._codec, self._meta, self._layout)
        )
        with self._lock:
            table = self._layout_nbytes.nbytes + sum(16 + 8 * len(shp) for _, shp in self._layouts)
        return idx + table

    @property
    def nbytes(self) -> int:
        """Memory held by the store: arena (payload + slack) + index + dictionary (its bytes
        and digested forms). Python object headers of the handful of containers are not
        counted; there is none per entry."""
        return self.arena_nbytes + self.index_nbytes + self.dictionary_nbytes

    @property
    def dictionary_nbytes(self) -> int:
        """Bytes of the dictionary and its digested forms (0 without one)."""
        d = self._dictionary
        return d.nbytes if d is not None else 0

    @property
    def compression_ratio(self) -> float:
        """``raw_nbytes / nbytes``: decoded size over everything the store holds (0 if empty)."""
        nb = self.nbytes
        raw = self.raw_nbytes
        return raw / nb if raw else 0.0

    def stats(self) -> dict[str, Any]:
        """Accounting snapshot.

        Returns a dict with ``entries``, ``raw_nbytes``, ``payload_nbytes``, ``arena_nbytes``,
        ``slack_nbytes`` (arena - payload), ``dead_nbytes`` (freed, not yet reclaimed),
        ``index_nbytes``, ``dictionary_nbytes``, ``nbytes``, ``compression_ratio``, ``num_chunks``,
        ``compactions`` and ``codecs``: per codec name, ``{"entries", "raw_nbytes", "payload_nbytes",
        "payload_ratio"}`` (raw / payload) for codecs holding at least one entry.
        """
        index = self.index_nbytes
        dict_nbytes = self.dictionary_nbytes
        with self._lock:
            per = {}
            for cls in CODECS.values():
                t = cls.tag
                if self._tag_entries[t]:
                    raw, pay = int(self._tag_raw[t]), int(self._tag_payload[t])
                    per[cls.name] = {
                        "entries": int(self._tag_entries[t]),
                        "raw_nbytes": raw,
                        "payload_nbytes": pay,
                        "payload_ratio": raw / pay if pay else float("inf"),
                    }
            raw = int(self._tag_raw.sum())
            payload = int(self._tag_payload.sum())
            arena = self._arena_nbytes
            return {
                "entries": int(self._tag_entries.sum()),
                "raw_nbytes": raw,
                "payload_nbytes": payload,
                "arena_nbytes": arena,
                "slack_nbytes": arena - payload,
                "dead_nbytes": self._dead_nbytes,
                "index_nbytes": index,
                "dictionary_nbytes": dict_nbytes,
                "nbytes": arena + index + dict_nbytes,
                "compression_ratio": raw / (arena + index + dict_nbytes) if raw else 0.0,
                "num_chunks": len(self._chunks),
                "compactions": self._compactions,
                "codecs": per,
            }
