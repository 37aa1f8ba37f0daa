"""Codec interface, dtype table and the thread pool shared by every codec.

A codec turns a batch of equally shaped arrays into one contiguous ``uint8`` payload buffer
(one 8-byte aligned payload per entry) and decodes payloads straight into a preallocated output.
Codecs never see Python objects per entry in their public interface: the store hands them
arena chunks, offsets and lengths, and they write into rows of an output array.

Everything here imports with numpy alone; codec modules import their optional packages
(numba, isal, zstandard) only when a codec object is created.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from dataclasses import dataclass
from typing import Callable, ClassVar, Mapping, Sequence

import numpy as np

__all__ = [
    "ALIGN",
    "ceil_align",
    "Codec",
    "EncodedBatch",
    "DTYPES",
    "dtype_code",
    "dtype_from_code",
    "element_view_dtype",
    "missing_extra",
]

#: Every payload starts on a multiple of this many bytes (in encoded batches and in the arena),
#: so codecs may view their payload as uint16/32/64 arrays without unaligned access.
ALIGN = 8


def ceil_align(n):
    """``n`` (int or int array) rounded up to a multiple of :data:`ALIGN`."""
    return (n + (ALIGN - 1)) // ALIGN * ALIGN

#: Supported element dtypes and their on-disk codes (stored per entry, never reordered:
#: append new codes only). Native byte order only.
DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(d)
    for d in (
        "bool",
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
)
_DTYPE_TO_CODE = {d: i for i, d in enumerate(DTYPES)}


def dtype_code(dtype: np.dtype, *, field: str = "arrays") -> int:
    """Small integer code of a supported numeric dtype.

    Raises:
      TypeError: if ``dtype`` is not one of :data:`DTYPES` in native byte order (object, string,
        structured and byte-swapped dtypes are refused rather than converted).
    """
    dt = np.dtype(dtype)
    code = _DTYPE_TO_CODE.get(dt)
    if code is None:
        if dt.byteorder not in ("=", "|") and dt.newbyteorder("=") in _DTYPE_TO_CODE:
            raise TypeError(
                f"{field}: dtype {dt.str} is not in native byte order; convert it explicitly "
                f"with .astype({dt.newbyteorder('=').name!r})"
            )
        raise TypeError(
            f"{field}: expected a numeric dtype, one of {[d.name for d in DTYPES]}, got {dt}"
        )
    return code


def dtype_from_code(code: int) -> np.dtype:
    """Inverse of :func:`dtype_code`."""
    return DTYPES[int(code)]


def element_view_dtype(dtype: np.dtype) -> np.dtype:
    """Unsigned integer dtype used to view the raw bits of ``dtype`` for run-length coding.

    The widest of uint64/32/16/8 whose size divides ``dtype.itemsize``: float32 -> uint32,
    complex128 -> uint64 (two words per element), bool -> uint8. Comparing these words is a
    bit-exact comparison (NaN payloads and -0.0 are distinct from other patterns); nothing is
    ever cast to a narrower type.
    """
    size = np.dtype(dtype).itemsize
    for width in (8, 4, 2, 1):
        if size % width == 0:
            return np.dtype(f"u{width}")
    raise AssertionError(size)  # unreachable: every itemsize is divisible by 1


def missing_extra(codec: str, package: str, exc: BaseException) -> ImportError:
    """ImportError raised when a codec's optional package is not installed."""
    err = ImportError(
        f"the {codec!r} codec needs the optional package {package!r}, which could not be "
        f"imported ({exc}). Install the 'codecs' extra: pip install 'jaxbuffers[codecs]' "
        f"(or pip install {package})."
    )
    err.name = package
    return err


@dataclass(frozen=True)
class EncodedBatch:
    """The payloads of one encoded batch, packed in one buffer.

    Attributes:
      buffer: all payloads, entry ``i`` at ``buffer[offsets[i] : offsets[i] + lengths[i]]``.
        # shape=(total_bytes,), dtype=uint8; ``offsets`` are multiples of :data:`ALIGN`.
      offsets: # shape=(B,), dtype=int64, byte offset of each payload in ``buffer``.
      lengths: # shape=(B,), dtype=int64, payload bytes of each entry (no padding).
      meta: # shape=(B,), dtype=uint8, codec-specific per-entry byte stored in the index
        (RLE: the count width in bytes; others: 0).
    """

    buffer: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    meta: np.ndarray


def pack_payloads(payloads: Sequence[bytes], meta: np.ndarray | None = None) -> EncodedBatch:
    """Pack per-entry ``bytes`` into one aligned buffer (used by the library-backed codecs)."""
    lengths = np.fromiter((len(p) for p in payloads), dtype=np.int64, count=len(payloads))
    padded = ceil_align(lengths)
    offsets = np.zeros(len(payloads), dtype=np.int64)
    if len(payloads) > 1:
        np.cumsum(padded[:-1], out=offsets[1:])
    buffer = np.empty(int(padded.sum()), dtype=np.uint8)
    for p, o, n in zip(payloads, offsets.tolist(), lengths.tolist()):
        buffer[o : o + n] = np.frombuffer(p, dtype=np.uint8)
    if meta is None:
        meta = np.zeros(len(payloads), dtype=np.uint8)
    return EncodedBatch(buffer, offsets, lengths, meta)


def check_decode_args(codec: str, chunk_nbytes, offsets: np.ndarray, lengths: np.ndarray, out: np.ndarray, rows: np.ndarray) -> None:
    """:func:`check_ranges` and :func:`check_rows` for one output. Codecs call it before decoding:
    their kernels read and write without bounds checks (numba, raw addresses), and numpy
    indexing would wrap a negative row silently."""
    check_ranges(codec, chunk_nbytes, offsets, lengths)
    check_rows(codec, out, rows)


def check_ranges(codec: str, chunk_nbytes, offsets: np.ndarray, lengths: np.ndarray) -> None:
    """Raise ValueError unless every payload range ``[offsets[i], offsets[i] + lengths[i])`` lies
    in its chunk; ``chunk_nbytes``: one chunk size (int) or each entry's chunk size (int64[k])."""
    if len(offsets) and (
        int(np.min(offsets)) < 0 or int(np.min(lengths)) < 0 or bool(np.any(np.add(offsets, lengths) > chunk_nbytes))
    ):
        raise ValueError(f"codec {codec!r}: payload index out of range (a payload lies outside its chunk)")


def check_rows(codec: str, out: np.ndarray, rows: np.ndarray) -> None:
    """Raise ValueError unless ``out`` is writeable and every row is in ``[0, out.shape[0])``."""
    if not out.flags.writeable:
        raise ValueError(f"codec {codec!r}: the output array is read-only")
    if len(rows) and (int(np.min(rows)) < 0 or int(np.max(rows)) >= out.shape[0]):
        raise ValueError(f"codec {codec!r}: row index out of range for an output of {out.shape[0]} rows")


def check_out_ids(codec: str, out_ids: np.ndarray, num_outs: int) -> None:
    """Raise ValueError unless every output index is in ``[0, num_outs)``."""
    if len(out_ids) and (int(np.min(out_ids)) < 0 or int(np.max(out_ids)) >= num_outs):
        raise ValueError(f"codec {codec!r}: output index out of range for {num_outs} outputs")


class ChunkTable(dict):
    """What a codec needs from a store to decode its entries: arena chunk id -> bytes (a
    ``dict``), each chunk's address and size for codecs that decode through raw addresses, and
    the store's trained dictionary if it has one (one table per state of a store's arena,
    built once, not per read).

    Attributes:
      base: # shape=(max id + 1,), dtype=int64, address of chunk ``c``'s first byte (0 if absent).
      size: # shape=(max id + 1,), dtype=int64, its length in bytes, -1 if ``c`` is absent (so
        every payload range in an absent chunk fails the range check).
      dictionary: the store's :class:`host_codecs.zstd.ZstdDictionary`, or None.
    """

    __slots__ = ("base", "size", "dictionary")

    def __init__(self, chunks: Mapping[int, np.ndarray], dictionary=None):
        super().__init__(chunks)
        self.dictionary = dictionary
        self.base = np.zeros(max(self, default=-1) + 1, dtype=np.int64)
        self.size = np.full(self.base.shape, -1, dtype=np.int64)
        for c, data in self.items():
            self.base[c], self.size[c] = data.ctypes.data, data.shape[0]


class Codec:
    """Base class of all codecs.

    Subclasses set ``name`` (registry name), ``tag`` (small integer stored with every entry;
    never reused for another format) and implement :meth:`encode_batch` and :meth:`decode_into`.

    Attributes:
      name: registry name, e.g. ``"igzip"``.
      tag: integer tag stored per entry; decoding dispatches on it, never on a guess.
      level: compression level (``None`` for codecs without levels).
    """

    name: ClassVar[str] = ""
    tag: ClassVar[int] = -1
    levels: ClassVar[tuple[int, ...]] = ()
    default_level: ClassVar[int | None] = None

    def __init__(self, level: int | None = None):
        if level is None:
            level = self.default_level
        if self.levels:
            if isinstance(level, bool) or not isinstance(level, (int, np.integer)):
                raise ValueError(
                    f"codec {self.name!r}: level must be an int in {list(self.levels)}, "
                    f"got {level!r}"
                )
            if int(level) not in self.levels:
                raise ValueError(
                    f"codec {self.name!r}: level must be one of {list(self.levels)}, got {level}"
                )
            level = int(level)
        elif level is not None:
            raise ValueError(f"codec {self.name!r} takes no level, got {level!r}")
        self.level = level

    @property
    def spec(self) -> str:
        """Registry string that recreates this codec, e.g. ``"igzip:1"``."""
        return self.name if self.level is None else f"{self.name}:{self.level}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.level == other.level  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.level))

    # -- interface -------------------------------------------------------------------------------
    def encode_batch(self, rows: np.ndarray, dtype: np.dtype) -> EncodedBatch:
        """Encode a batch.

        Args:
          rows: the raw bytes of each entry, # shape=(B, nbytes), dtype=uint8, C-contiguous.
          dtype: element dtype of the entries (codecs that work on elements view ``rows``
            through :func:`element_view_dtype`).

        Returns:
          An :class:`EncodedBatch` with one payload per row.
        """
        raise NotImplementedError

    def decode_into(
        self,
        chunk: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        meta: np.ndarray,
        out: np.ndarray,
        rows: np.ndarray,
        dtype: np.dtype,
    ) -> None:
        """Decode payloads that live in one arena chunk into rows of ``out``.

        Args:
          chunk: arena bytes, # shape=(chunk_bytes,), dtype=uint8, length a multiple of 8.
          offsets, lengths: # shape=(k,), dtype=int64, payload positions in ``chunk``.
          meta: # shape=(k,), dtype=uint8, the per-entry bytes returned by the encoder.
          out: decoded bytes of the whole request, # shape=(B, nbytes), dtype=uint8.
          rows: # shape=(k,), dtype=int64, which rows of ``out`` to fill.
          dtype: element dtype of the entries.

        Raises:
          ValueError: a payload is corrupt (wrong decoded size), a payload range lies outside
            ``chunk``, a row is outside ``[0, B)``, or ``out`` is read-only (all checked before
            anything is written: :func:`check_decode_args`).
        """
        raise NotImplementedError

    def decode_scattered(
        self,
        chunks: Mapping[int, np.ndarray],
        chunk_ids: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        meta: np.ndarray,
        out: np.ndarray,
        rows: np.ndarray,
        dtype: np.dtype,
    ) -> None:
        """:meth:`decode_into` for payloads spread over several arena chunks: entry ``i`` lives at
        ``chunks[chunk_ids[i]][offsets[i] : offsets[i] + lengths[i]]``.

        The default gathers the payloads (compressed bytes: cheap) into one staging buffer and
        makes one :meth:`decode_into` call, so the batch is decoded by one parallel call instead
        of one per chunk. Codecs that can read each payload where it lies override it.

        Args:
          chunks: arena chunk id -> bytes, # shape=(chunk_bytes,), dtype=uint8.
          chunk_ids, offsets, lengths: # shape=(k,), dtype=int64, where each payload lives.
          meta, out, rows, dtype: as in :meth:`decode_into`.

        Raises:
          ValueError: as :meth:`decode_into`; a payload lies outside its chunk.
        """
        from ._gather import gather

        padded = ceil_align(lengths)
        dst_off = np.zeros(rows.size, dtype=np.int64)
        np.cumsum(padded[:-1], out=dst_off[1:])
        src = np.empty(int(padded.sum()), dtype=np.uint8)
        ids, inv = np.unique(chunk_ids, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        bounds = np.r_[0, np.cumsum(np.bincount(inv, minlength=ids.size))]
        for g, cid in enumerate(ids.tolist()):
            sel = order[bounds[g] : bounds[g + 1]]
            gather(chunks[cid], offsets[sel], lengths[sel], src, dst_off[sel])
        self.decode_into(src, dst_off, lengths, meta, out, rows, dtype)

    def decode_many(
        self,
        chunks: Mapping[int, np.ndarray],
        chunk_ids: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        meta: np.ndarray,
        outs: Sequence[np.ndarray],
        out_ids: np.ndarray,
        rows: np.ndarray,
        dtype: np.dtype,
    ) -> None:
        """:meth:`decode_scattered` into several outputs: entry ``i`` is decoded into row
        ``rows[i]`` of ``outs[out_ids[i]]`` (e.g. a batch of observations and of next
        observations, decoded straight into their two outputs).

        The default makes one :meth:`decode_into` (payloads in one chunk) or
        :meth:`decode_scattered` call per output; codecs that can address any output row in one
        call override it.

        Args:
          chunks, chunk_ids, offsets, lengths, meta, dtype: as in :meth:`decode_scattered`.
          outs: 2-D uint8 arrays with the same row size, # shape=(B_j, nbytes).
          out_ids, rows: # shape=(k,), dtype=int64, where each entry goes.

        Raises:
          ValueError: as :meth:`decode_scattered`; an output index outside ``[0, len(outs))``.
        """
        out_ids = np.asarray(out_ids)
        check_out_ids(self.name, out_ids, len(outs))
        groups = [int(out_ids[0])] if out_ids.size and out_ids.min() == out_ids.max() else np.unique(out_ids).tolist()
        for j in groups:
            sel = slice(None) if len(groups) == 1 else np.flatnonzero(out_ids == j)
            c = chunk_ids[sel]
            if c.min() == c.max():
                self.decode_into(chunks[int(c[0])], offsets[sel], lengths[sel], meta[sel], outs[j], rows[sel], dtype)
            else:
                self.decode_scattered(chunks, c, offsets[sel], lengths[sel], meta[sel], outs[j], rows[sel], dtype)

    # Convenience single-array helpers (tests, users): not used by the store.
    def encode(self, array: np.ndarray) -> bytes:
        """Encode one array to ``bytes`` (dtype and shape are NOT stored: see CompressedStore)."""
        a = np.ascontiguousarray(array)
        dtype_code(a.dtype, field="array")
        enc = self.encode_batch(a.reshape(1, -1).view(np.uint8), a.dtype)
        o, n = int(enc.offsets[0]), int(enc.lengths[0])
        return bytes([int(enc.meta[0])]) + enc.buffer[o : o + n].tobytes()

    def decode(self, payload: bytes, dtype, shape) -> np.ndarray:
        """Inverse of :meth:`encode` given the dtype and shape the caller recorded."""
        dtype = np.dtype(dtype)
        dtype_code(dtype, field="dtype")
        shape = tuple(int(s) for s in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        body = np.frombuffer(payload, dtype=np.uint8)
        meta = body[:1].copy()
        chunk = np.zeros(ceil_align(len(body) - 1), dtype=np.uint8)
        chunk[: len(body) - 1] = body[1:]
        out = np.empty((1, nbytes), dtype=np.uint8)
        self.decode_into(
            chunk,
            np.zeros(1, np.int64),
            np.array([len(body) - 1], np.int64),
            meta,
            out,
            np.zeros(1, np.int64),
            dtype,
        )
        return out.view(dtype).reshape(shape)


# -- thread pool -------------------------------------------------------------------------------
_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


_NUM_THREADS: int | None = None


def num_threads() -> int:
    """Worker threads of library-backed codecs and RLE shards (cached): the value given to
    :func:`set_num_threads`, else ``HOST_CODECS_THREADS``, else the CPUs this process may use."""
    global _NUM_THREADS
    if _NUM_THREADS is None:
        env = os.environ.get("HOST_CODECS_THREADS")
        if env:
            _NUM_THREADS = max(1, int(env))
        elif hasattr(os, "sched_getaffinity"):
            _NUM_THREADS = max(1, len(os.sched_getaffinity(0)))
        else:
            _NUM_THREADS = max(1, os.cpu_count() or 1)
    return _NUM_THREADS


def set_num_threads(n: int | None) -> None:
    """Set how many threads a batch is split over (``None``: back to the default). The pool
    grows if needed; it never runs more shards than this number."""
    global _NUM_THREADS, _POOL
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"set_num_threads: expected a positive int or None, got {n!r}")
    with _POOL_LOCK:
        _NUM_THREADS = n
        if _POOL is not None and n is not None and n > _POOL._max_workers:
            _POOL = None  # recreated bigger on next use; the old one finishes its tasks


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(num_threads(), 1), thread_name_prefix="host_codecs"
            )
        return _POOL


_SHARD = threading.local()  # .active: this thread is running a parallel_for shard


def parallel_for(
    n: int, body: Callable[[int, int], None], *, work_bytes: int | None = None, min_shard_bytes: int = 1 << 18
) -> None:
    """Run ``body(start, stop)`` over ``range(n)`` split into one contiguous shard per thread.

    One task per thread (not per entry) keeps the pool's per-task overhead (tens of
    microseconds) out of the per-entry cost; with ``work_bytes`` (bytes the whole batch
    touches), shards smaller than ``min_shard_bytes`` are merged, so small batches run inline on
    the calling thread. ``body`` must release the GIL (isal, zstandard and our numba kernels do)
    for this to scale.

    A batch too small to split runs inline as one shard, and a ``parallel_for`` called from
    inside a shard runs inline (``body(0, n)`` on that thread). So a caller that shards a larger
    job itself (e.g. :meth:`host_codecs.CompressedStore.get`: the decode of a batch and the copies
    that depend on it, one pool round trip for both) can call the codecs, which shard on their
    own when called directly, and its decision (split or not) holds for everything inside.
    """
    if getattr(_SHARD, "active", False):
        body(0, n)
        return
    if work_bytes is not None and work_bytes < 2 * min_shard_bytes:
        _run_shard(body, 0, n)  # inline, as one shard: the calls it makes stay inline too
        return
    shards = min(num_threads(), n)
    if work_bytes is not None:
        shards = min(shards, work_bytes // min_shard_bytes)
    if shards <= 1:
        _run_shard(body, 0, n)
        return
    bounds = np.linspace(0, n, shards + 1).astype(np.int64).tolist()
    futures = [_pool().submit(_run_shard, body, bounds[i], bounds[i + 1]) for i in range(1, shards)]
    try:
        _run_shard(body, bounds[0], bounds[1])  # the calling thread takes the first shard
    finally:
        for f in futures:
            f.result()


def _run_shard(body: Callable[[int, int], None], start: int, stop: int) -> None:
    prev = getattr(_SHARD, "active", False)
    _SHARD.active = True
    try:
        body(start, stop)
    finally:
        _SHARD.active = prev
