"""The codec interface, the dtype table and the argument checks every codec shares.

A codec encodes a batch of equally shaped arrays into one `uint8` buffer (one 8-byte aligned payload per entry) and
decodes payloads straight into rows of preallocated outputs. Imports with numpy alone; a codec module imports its
optional package (numba, isal, zstandard) when a codec object is created.
"""

from __future__ import annotations

import importlib
import operator
from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

import numpy as np

from ._pool import parallel_for

__all__ = ["ALIGN", "DTYPES", "as_array", "ChunkTable", "Codec", "CorruptEntryError", "EncodedBatch", "dtype_code", "dtype_from_code"]

#: Every payload starts on a multiple of this many bytes, so codecs may view it as aligned uint16/32/64 words.
ALIGN = 8
_PADDING = [bytes(n) for n in range(ALIGN)]  # the zeros after a payload of each length % ALIGN

#: Supported element dtypes (native byte order), stored by position: part of the stored format, append only.
DTYPES: tuple[np.dtype, ...] = tuple(map(np.dtype, (
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "complex64", "complex128")))
_DTYPE_TO_CODE = {d: i for i, d in enumerate(DTYPES)}


class CorruptEntryError(ValueError):
    """A stored entry's bytes (its payload or its index row) differ from what was written."""


def ceil_align(n):
    """`n` (an int or an int array) rounded up to a multiple of `ALIGN`."""
    return (n + (ALIGN - 1)) // ALIGN * ALIGN


def as_array(x, field: str) -> np.ndarray:
    """`np.asarray(x)`, or a TypeError naming `field` for what numpy cannot convert (ragged lists, some tensors)."""
    try:
        return np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{field}: expected an array, got {type(x).__name__} that numpy cannot convert ({exc})") from None


def shape_arg(value, field: str = "item_shape") -> tuple[int, ...]:
    """A list or tuple of ints >= 0 (not bools or floats, never rounded) as a tuple; else TypeError naming `field`."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and d >= 0 for d in value):
        raise TypeError(f"{field}: expected a tuple of ints >= 0, got {type(value).__name__} {value!r:.60}")
    return tuple(int(d) for d in value)


def integer_ids(slots, field: str) -> np.ndarray:
    """`slots` as an integer array of any integer dtype; TypeError naming `field` for anything else."""
    s = as_array(slots, field)
    if s.size == 0 and s.dtype == np.float64:  # np.asarray([]) is float64: an empty id list
        s = s.astype(np.int64)
    if s.dtype == np.bool_ or not np.issubdtype(s.dtype, np.integer):
        raise TypeError(f"{field}: expected integer slot ids, got dtype {s.dtype}")
    return s


def dtype_code(dtype, *, field: str = "arrays") -> int:
    """The stored code of a supported `dtype` (its position in `DTYPES`); errors name the argument `field`.

    Raises:
      TypeError: `dtype` is not in `DTYPES` in native byte order (object, string, structured and
        byte-swapped dtypes are refused, never converted).
    """
    try:
        if dtype is None:  # np.dtype(None) is float64: a dtype left out is refused, not guessed
            raise TypeError
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{field}: expected a numeric dtype, one of {[d.name for d in DTYPES]}, got {dtype!r}") from None
    code = _DTYPE_TO_CODE.get(dt)
    if code is None:
        if dt.byteorder not in ("=", "|") and dt.newbyteorder("=") in _DTYPE_TO_CODE:
            raise TypeError(f"{field}: dtype {dt.str} is not in native byte order; convert it explicitly "
                            f"with .astype({dt.newbyteorder('=').name!r})")
        raise TypeError(f"{field}: expected a numeric dtype, one of {[d.name for d in DTYPES]}, got {dt}")
    return code


def dtype_from_code(code: int) -> np.dtype:
    """The dtype stored as `code` (inverse of `dtype_code`)."""
    return DTYPES[int(code)]


def element_view_dtype(dtype) -> np.dtype:
    """The unsigned word dtype viewing the raw bits of `dtype`: the widest of uint64/32/16/8 dividing its item size
    (float32 -> uint32, complex128 -> uint64, bool -> uint8); comparing words is bit-exact (NaN payloads, -0.0)."""
    size = np.dtype(dtype).itemsize
    return np.dtype(f"u{next(w for w in (8, 4, 2, 1) if size % w == 0)}")


def import_extra(codec: str, package: str, module: str):
    """Import `module` of the optional `package` a codec needs, or raise an ImportError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        err = ImportError(f"the {codec!r} codec needs the optional package {package!r}, which could not be imported "
                          f"({exc}). Install the 'codecs' extra: pip install 'jaxbuffers[codecs]' "
                          f"(or pip install {package}).")
        err.name = package
        raise err from exc


_XOR_BLOCK = 64  # rows per block of `xor_rows`: its gathered bases stay in cache while they are XORed in


def xor_rows(rows: np.ndarray, idx: np.ndarray, src: np.ndarray, ext: np.ndarray) -> np.ndarray:
    """# shape=(D, nbytes), dtype=uint8: row `j` is `rows[idx[j]] XOR rows[src[j]]` for `src[j] >= 0`, else
    `rows[idx[j]] XOR ext[-1 - src[j]]` (`rows`: uint8 `[B, nbytes]`, `ext`: uint8 `[J, nbytes]`, `idx`, `src`:
    int64 `[D]`). Computed in blocks over the thread pool, with no temporary the size of the batch."""
    d, nbytes = idx.size, rows.shape[1]
    out = np.empty((d, nbytes), np.uint8)

    def body(lo: int, hi: int) -> None:
        tmp = np.empty((min(_XOR_BLOCK, hi - lo), nbytes), np.uint8)
        for a in range(lo, hi, _XOR_BLOCK):
            b = min(a + _XOR_BLOCK, hi)
            o, t, sb = out[a:b], tmp[: b - a], src[a:b]
            np.take(rows, idx[a:b], axis=0, out=o)
            if (sb >= 0).all():
                np.take(rows, sb, axis=0, out=t)
            else:
                t[sb >= 0] = rows[sb[sb >= 0]]
                t[sb < 0] = ext[-1 - sb[sb < 0]]
            np.bitwise_xor(o, t, out=o)

    blocks = -(-d // _XOR_BLOCK)
    parallel_for(blocks, lambda lo, hi: body(lo * _XOR_BLOCK, min(hi * _XOR_BLOCK, d)), work_bytes=2 * d * nbytes)
    return out


def check_deltas(codec: str, rows: np.ndarray, idx, src, ext) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`idx, src, ext` of `Codec.encode_deltas` for the batch `rows`, checked before anything is read (the RLE
    encoder has no bounds checks): `idx`, `src` as int64 (from any integer dtype), `ext` C-contiguous.

    Raises:
      TypeError: `idx` or `src` not integers, or `ext` not uint8.
      ValueError: `idx` and `src` not 1-D of one length, `ext` not `[J, nbytes]` for rows of `nbytes` bytes, a row
        of `idx` outside the batch, or a base of `src` outside `[-J, B)`.
    """
    idx, src = (integer_ids(x, f"codec {codec!r}: {name}").astype(np.int64) for x, name in ((idx, "idx"), (src, "src")))
    ext = as_array(ext, "ext")
    if idx.ndim != 1 or src.shape != idx.shape:
        raise ValueError(f"codec {codec!r}: idx, src: expected two 1-D arrays of one length, got shapes {idx.shape} and {src.shape}")
    if ext.dtype != np.uint8 or ext.ndim != 2 or ext.shape[1] != rows.shape[1]:
        err = TypeError if ext.dtype != np.uint8 else ValueError
        raise err(f"codec {codec!r}: ext: expected uint8 rows of shape (J, {rows.shape[1]}), got {ext.dtype} of shape {ext.shape}")
    b, j = rows.shape[0], ext.shape[0]
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= b):
        raise ValueError(f"codec {codec!r}: idx: a row out of range for a batch of {b} rows, got {int(idx.min())}..{int(idx.max())}")
    if src.size and (int(src.min()) < -j or int(src.max()) >= b):
        raise ValueError(f"codec {codec!r}: src: a base out of range [-{j}, {b}) ({j} rows of ext, {b} of the batch), got {int(src.min())}..{int(src.max())}")
    return idx, src, np.ascontiguousarray(ext)


@dataclass(frozen=True)
class EncodedBatch:
    """The payloads of one encoded batch, packed in one buffer.

    Attributes:
      buffer: # shape=(total_bytes,), dtype=uint8: payload `i` is `buffer[offsets[i] : offsets[i] + lengths[i]]`.
      offsets: # shape=(B,), dtype=int64: byte offset of each payload, a multiple of `ALIGN`.
      lengths: # shape=(B,), dtype=int64: payload bytes of each entry (without padding).
      meta: # shape=(B,), dtype=uint8: the codec's byte per entry, stored in the index (RLE: the
        count width in bytes; zstd: 1 when encoded with the store's dictionary; others: 0).
    """

    buffer: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    meta: np.ndarray


def pack_payloads(payloads: Sequence[bytes], meta: np.ndarray | None = None) -> EncodedBatch:
    """Pack one `bytes` payload per entry into one aligned `EncodedBatch` (zero padding)."""
    lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    padded = ceil_align(lengths)
    offsets = np.zeros(len(payloads), dtype=np.int64)
    np.cumsum(padded[:-1], out=offsets[1:])
    pads = [_PADDING[n] for n in (padded - lengths).tolist()]
    buffer = np.frombuffer(bytearray(b"".join([x for pair in zip(payloads, pads) for x in pair])), np.uint8)  # one copy
    return EncodedBatch(buffer, offsets, lengths, np.zeros(len(payloads), np.uint8) if meta is None else meta)


def merged_batches(parts: list[EncodedBatch], masks: list[np.ndarray]) -> EncodedBatch:
    """One batch of the rows of `parts[i]` at the rows `masks[i]` (boolean masks that partition the batch), its
    payloads in row order (ascending offsets, as `Arena.place` takes them), gathered as `ALIGN`-byte words."""
    n = masks[0].size
    src, lengths, meta = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.uint8)
    shift, buffers = 0, []
    for enc, m in zip(parts, masks):
        src[m], lengths[m], meta[m] = enc.offsets + shift, enc.lengths, enc.meta
        buffers += [enc.buffer, np.zeros(ceil_align(enc.buffer.size) - enc.buffer.size, np.uint8)]
        shift += ceil_align(enc.buffer.size)
    words = ceil_align(lengths) // ALIGN
    offsets = np.concatenate([[0], np.cumsum(words[:-1] * ALIGN)]).astype(np.int64)
    gather = np.repeat((src - offsets) // ALIGN, words) + np.arange(int(words.sum()))  # word j of row i: src[i] / ALIGN + (j - offsets[i] / ALIGN)
    return EncodedBatch(np.concatenate(buffers).view(np.dtype((np.void, ALIGN)))[gather].view(np.uint8), offsets, lengths, meta)


class ChunkTable(dict):
    """Arena chunk id -> chunk bytes (# shape=(chunk_bytes,), dtype=uint8), plus the store's zstd dictionary
    (`host_codecs.ZstdDictionary` or None); `checked`: the store checked the read itself, so `check_decode` skips it."""

    __slots__ = ("dictionary", "addresses", "checked")

    def __init__(self, chunks: Mapping[int, np.ndarray], dictionary=None, checked: bool = False):
        super().__init__(chunks)
        self.dictionary, self.checked = dictionary, checked
        self.addresses = None  # (ids, base addresses, sizes) of the chunks, built by chunk_addresses on first use


def chunk_addresses(chunks) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(ids, base addresses, sizes)` of the chunks (int64, uint64, int64; ids ascending) for compiled loops, cached
    on a `ChunkTable` (which keeps its chunks alive)."""
    cached = getattr(chunks, "addresses", None)
    if cached is not None:
        return cached
    arrays = {c: np.frombuffer(v, np.uint8) for c, v in chunks.items()}
    keys = np.array(sorted(arrays), np.int64)
    bases = np.array([arrays[c].__array_interface__["data"][0] for c in keys.tolist()], np.uint64)  # (.ctypes is slow)
    out = keys, bases, np.array([arrays[c].size for c in keys.tolist()], np.int64)
    if isinstance(chunks, ChunkTable):
        chunks.addresses = out
    return out


def check_decode(codec: str, chunks, chunk_ids, offsets, lengths, outs, out_ids, rows, bases=None) -> None:
    """Check a decode request (arguments as in `Codec.decode_many`) before anything is read or written.

    Raises:
      ValueError: a payload outside its chunk (or its chunk absent), an output index or a row out of range, a
        read-only output, outputs of different row sizes, or a delta's base (`bases`) out of range or a row a later
        entry of the call decodes (a delta's own row is its base in place).
    """
    if getattr(chunks, "checked", False):  # a store's read: checked by the store (`ChunkTable`)
        return
    if len(chunk_ids):
        keys, _, chunk_sizes = chunk_addresses(chunks)  # kept on a ChunkTable: one lookup per read, not per chunk
        ids = np.asarray(chunk_ids, np.int64)
        at = np.minimum(np.searchsorted(keys, ids), max(keys.size - 1, 0))
        sizes = np.where(keys[at] == ids, chunk_sizes[at], -1) if keys.size else np.full(ids.shape, -1, np.int64)
        if int(np.min(offsets)) < 0 or int(np.min(lengths)) < 0 or bool(np.any(np.add(offsets, lengths) > sizes)):
            raise ValueError(f"codec {codec!r}: payload index out of range (a payload lies outside its chunk)")
    _check_rows(codec, outs, out_ids, rows, "output")
    for out in outs:
        if not out.flags.writeable:
            raise ValueError(f"codec {codec!r}: the output array is read-only")
        if out.shape[1] != outs[0].shape[1]:
            raise ValueError(f"codec {codec!r}: outputs with different row sizes")
    if bases is not None:
        b_out, b_row = (np.asarray(x, np.int64).reshape(-1) for x in bases)
        if b_out.shape != (len(rows),) or b_row.shape != (len(rows),):
            raise ValueError(f"codec {codec!r}: bases: expected (outputs, rows) of one base per entry")
        d = np.flatnonzero(b_out >= 0)
        _check_rows(codec, outs, b_out[d], b_row[d], "bases: base")
        d = d[(b_out[d] != np.asarray(out_ids, np.int64)[d]) | (b_row[d] != np.asarray(rows, np.int64)[d])]  # not in place
        stride = max((o.shape[0] for o in outs), default=0) + 1
        key = np.asarray(out_ids, np.int64) * stride + np.asarray(rows, np.int64)
        order = np.argsort(key, kind="stable")
        at = order[np.minimum(np.searchsorted(key, b_out[d] * stride + b_row[d], sorter=order), max(len(rows) - 1, 0))]
        if len(rows) and bool(np.any((key[at] == b_out[d] * stride + b_row[d]) & (at >= d))):
            raise ValueError(f"codec {codec!r}: bases: a delta's base must be decoded before it (an earlier entry of the call, or a row decoded before it)")


def decode_each(codec: str, chunks, chunk_ids, offsets, lengths, outs, out_ids, rows, bases, inflater) -> None:
    """`Codec.decode_many` for a codec whose package decompresses one payload to a new `bytes` object, copied once
    into its row (XORed with its base row where `bases` names one); over the thread pool, or in order with `bases`.
    `inflater()`, called once per thread, returns `inflate(payload, t) -> bytes`, the decoded entry `t` (a
    `memoryview` payload), raising `ValueError` for a corrupt one.

    Raises:
      ValueError: as `check_decode`, or `codec 'name': corrupt entry: ...` for the first corrupt payload found.
    """
    check_decode(codec, chunks, chunk_ids, offsets, lengths, outs, out_ids, rows, bases)
    if not len(rows):
        return
    nbytes = outs[0].shape[1]
    cids, offs, lens, oids, rws = (np.asarray(x).tolist() for x in (chunk_ids, offsets, lengths, out_ids, rows))
    # flat byte views: a row is filled by one slice assignment (no numpy array per entry)
    flat = [memoryview(o).cast("B") if o.flags.c_contiguous and o.size else None for o in outs]
    srcs = {c: memoryview(chunks[c]) for c in set(cids)}
    b_out, b_row = (None, None) if bases is None else (np.asarray(x).tolist() for x in bases)
    errors: list[str] = []

    def work(start: int, stop: int) -> None:
        inflate = inflater()
        for t in range(start, stop):
            try:
                data = inflate(srcs[cids[t]][offs[t] : offs[t] + lens[t]], t)
            except ValueError as exc:
                errors.append(str(exc))
                return
            dst, r = flat[oids[t]], rws[t]
            if b_out is not None and b_out[t] >= 0:  # a delta: its base is whole by now
                np.bitwise_xor(np.frombuffer(data, dtype=np.uint8), outs[b_out[t]][b_row[t]], out=outs[oids[t]][r])
            elif dst is None:
                outs[oids[t]][r] = np.frombuffer(data, dtype=np.uint8)
            else:
                dst[r * nbytes : (r + 1) * nbytes] = data

    if bases is None:
        parallel_for(len(rws), work, work_bytes=len(rws) * nbytes)
    else:  # in order: every base before its deltas
        work(0, len(rws))
    if errors:
        raise ValueError(f"codec {codec!r}: corrupt entry: {errors[0]}")


def _check_rows(codec: str, outs, out_ids, rows, what: str) -> None:
    """ValueError unless every `(out_ids[i], rows[i])` names a row of `outs` (one pass over the entries)."""
    out_ids, rows = np.asarray(out_ids, np.int64).reshape(-1), np.asarray(rows, np.int64).reshape(-1)
    if not len(out_ids):
        return
    if int(np.min(out_ids)) < 0 or int(np.max(out_ids)) >= len(outs):
        raise ValueError(f"codec {codec!r}: {what} index out of range for {len(outs)} outputs")
    bad = np.flatnonzero((rows < 0) | (rows >= np.array([o.shape[0] for o in outs], np.int64)[out_ids]))
    if bad.size:
        n = outs[int(out_ids[bad].min())].shape[0]  # the first output with a bad row
        raise ValueError(f"codec {codec!r}: {'row' if what == 'output' else what + ' row'} index out of range for an output of {n} rows")


class Codec:
    """Base class of all codecs: subclasses set `name`, `tag`, `levels`, `default_level` and define `encode_batch`,
    `decode_into` (or `decode_many`).

    Args:
      level: compression level, one of `levels` (None: `default_level`).

    Attributes:
      name: registry name, e.g. `"igzip"`.
      tag: integer tag stored per entry; decoding dispatches on it, never on a guess.
      level: compression level (None for codecs without levels).
      threaded_decode: whether `decode_many` spends its time outside the interpreter lock (one compiled loop per
        call), so that threads decoding parts of one read run side by side.

    Raises:
      ValueError: a level not in `levels`, or any level for a codec without levels.
    """

    name: ClassVar[str] = ""
    tag: ClassVar[int] = -1
    levels: ClassVar[tuple[int, ...]] = ()
    default_level: ClassVar[int | None] = None
    threaded_decode: ClassVar[bool] = False

    def __init__(self, level: int | None = None):
        level = self.default_level if level is None else level
        if self.levels:
            if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or int(level) not in self.levels:
                raise ValueError(f"codec {self.name!r}: level must be one of {list(self.levels)}, got {level!r}")
            level = int(level)
        elif level is not None:
            raise ValueError(f"codec {self.name!r} takes no level, got {level!r}")
        self.level = level

    @property
    def spec(self) -> str:
        """The registry string that recreates this codec, e.g. `"igzip:1"`."""
        return self.name if self.level is None else f"{self.name}:{self.level}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.level == other.level  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.level))

    def encode_batch(self, rows: np.ndarray, dtype: np.dtype) -> EncodedBatch:
        """Encode a batch into an `EncodedBatch` with one payload per row.

        Args:
          rows: # shape=(B, nbytes), dtype=uint8, C-contiguous: the raw bytes of each entry.
          dtype: the entries' element dtype (codecs that work on elements view `rows` through `element_view_dtype`).
        """
        raise NotImplementedError

    def encode_deltas(self, rows: np.ndarray, dtype: np.dtype, idx: np.ndarray, src: np.ndarray, ext: np.ndarray, *args) -> EncodedBatch:
        """Encode the deltas `xor_rows(rows, idx, src, ext)` as `encode_batch(deltas, dtype, *args)` would: an
        `EncodedBatch` of `D` payloads in the order of `idx`.

        Args:
          rows: # shape=(B, nbytes), dtype=uint8, C-contiguous: the batch.
          dtype: the entries' element dtype.
          idx: # shape=(D,), integer dtype: the batch row of each delta.
          src: # shape=(D,), integer dtype: the base of each delta (a batch row, or `-1 - j` for row `j` of `ext`).
          ext: # shape=(J, nbytes), dtype=uint8: the bases from outside the batch.
          *args: what `encode_batch` takes beyond `rows, dtype` (zstd: its dictionary).

        Raises:
          TypeError, ValueError: `idx`, `src` or `ext` refused by `check_deltas`.
        """
        idx, src, ext = check_deltas(self.name, rows, idx, src, ext)
        return self.encode_batch(xor_rows(rows, idx, src, ext), dtype, *args)

    def decode_into(self, chunk, offsets, lengths, meta, out, rows, dtype) -> None:
        """Decode payload `i`, `chunk[offsets[i] : offsets[i] + lengths[i]]`, into row `rows[i]` of `out`.

        Args:
          chunk: # shape=(chunk_bytes,), dtype=uint8, length a multiple of `ALIGN`.
          offsets: # shape=(k,), dtype=int64 (as `lengths` and `rows`).
          meta: # shape=(k,), dtype=uint8: the per-entry bytes the encoder returned.
          out: # shape=(B, nbytes), dtype=uint8: decoded bytes of the whole request.
          dtype: the entries' element dtype.

        Raises:
          ValueError: a corrupt payload, or a request `check_decode` refuses (checked before anything is written).
        """
        zeros = np.zeros(len(rows), np.int64)
        self.decode_many({0: chunk}, zeros, offsets, lengths, meta, [out], zeros, rows, dtype)

    def decode_many(self, chunks, chunk_ids, offsets, lengths, meta, outs, out_ids, rows, dtype, bases=None) -> None:
        """Decode entry `i`, at `chunks[chunk_ids[i]][offsets[i] : offsets[i] + lengths[i]]`, into row `rows[i]` of
        `outs[out_ids[i]]` (`offsets`, `lengths`, `meta`, `dtype` as in `decode_into`). The default makes one
        `decode_into` call per (output, chunk) group, then XORs the deltas (`bases`) in order.

        Args:
          chunks: arena chunk id -> bytes, or a `ChunkTable` (which also carries the dictionary).
          chunk_ids: # shape=(k,), dtype=int64: the chunk each payload lies in.
          outs: 2-D uint8 arrays with one row size, # shape=(B_j, nbytes).
          out_ids: # shape=(k,), dtype=int64: the output each entry goes to.
          rows: # shape=(k,), dtype=int64: the row of its output each entry fills.
          bases: None or `(base_outs, base_rows)`, # shape=(k,) each, int64: entry `i` is a delta (`host_codecs.deltas`)
            XORed, once decoded, with row `base_rows[i]` of `outs[base_outs[i]]` (-1: none), which holds its base by
            then: a row decoded before the call, an earlier entry's row, or its own row (in place).

        Raises:
          ValueError: as `decode_into`, or a base row that is out of range or that a later entry decodes.
        """
        check_decode(self.name, chunks, chunk_ids, offsets, lengths, outs, out_ids, rows, bases)
        # with bases, every entry is decoded into a scratch row first: a delta's row may hold its base (in place)
        into = outs if bases is None else [np.empty((len(rows), outs[0].shape[1]), np.uint8)] if len(rows) else []
        out_at, row_at = (out_ids, rows) if bases is None else (np.zeros(len(rows), np.int64), np.arange(len(rows)))
        key = np.asarray(out_at, np.int64) * (int(np.max(chunk_ids, initial=0)) + 1) + chunk_ids
        for k in np.unique(key).tolist():
            sel = np.flatnonzero(key == k)
            c = int(chunk_ids[sel[0]])
            self.decode_into(chunks[c], offsets[sel], lengths[sel], meta[sel], into[int(out_at[sel[0]])], row_at[sel], dtype)
        if bases is not None:  # in order: a base that is an earlier entry is whole before its delta reads it
            oids, rws = np.asarray(out_ids).tolist(), np.asarray(rows).tolist()
            for i, (bo, br) in enumerate(zip(*(np.asarray(x).tolist() for x in bases))):
                dst = outs[oids[i]][rws[i]]
                if bo >= 0:
                    np.bitwise_xor(into[0][i], outs[bo][br], out=dst)
                else:
                    dst[...] = into[0][i]

    def encode(self, array: np.ndarray) -> bytes:
        """One array encoded to `bytes`: its meta byte, then its payload (not its dtype or shape)."""
        a = np.ascontiguousarray(as_array(array, "array"))
        dtype_code(a.dtype, field="array")
        enc = self.encode_batch(a.reshape(1, -1).view(np.uint8), a.dtype)
        o, n = int(enc.offsets[0]), int(enc.lengths[0])
        return bytes([int(enc.meta[0])]) + enc.buffer[o : o + n].tobytes()

    def decode(self, payload: bytes, dtype, shape) -> np.ndarray:
        """Inverse of `encode`, given the dtype and shape the caller recorded.

        Raises:
          TypeError: `payload` is not bytes, `dtype` not a supported dtype, `shape` not a sequence of ints.
          ValueError: an empty `payload` (no meta byte), a negative size in `shape`, a corrupt payload.
        """
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"payload: expected the bytes `encode` returned, got {type(payload).__name__}")
        if len(payload) < 1:
            raise ValueError("payload: expected the bytes `encode` returned (a meta byte, then the codec's payload), got none")
        dtype = dtype_from_code(dtype_code(dtype, field="dtype"))
        try:
            shape = tuple(operator.index(s) for s in shape)
        except TypeError:
            raise TypeError(f"shape: expected a sequence of ints, got {shape!r}") from None
        if any(s < 0 for s in shape):
            raise ValueError(f"shape: expected non-negative sizes, got {shape}")
        body = np.frombuffer(payload, dtype=np.uint8)
        chunk = np.zeros(ceil_align(len(body) - 1), dtype=np.uint8)
        chunk[: len(body) - 1] = body[1:]
        out = np.empty((1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize), dtype=np.uint8)
        zero = np.zeros(1, np.int64)
        self.decode_into(chunk, zero, np.array([len(body) - 1], np.int64), body[:1].copy(), out, zero, dtype)
        return out.view(dtype).reshape(shape)


def int_arg(field: str, value, lo: int = 1, hi: int | None = None) -> int:
    """An int argument (Python or numpy, not a bool or float) in `[lo, hi]` (`hi` None: no bound), as `int`; else
    ValueError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo or (hi is not None and value > hi):
        raise ValueError(f"{field}: expected an int in [{lo}, {'inf' if hi is None else hi}], got {value!r}")
    return int(value)


def path_arg(field: str, value):
    """`value` if it is a file path (a non-empty str, or a type with `__fspath__`); else TypeError naming `field`."""
    if not (hasattr(type(value), "__fspath__") or (isinstance(value, str) and value)):
        raise TypeError(f"{field}: expected a file path (a non-empty str or os.PathLike), got {type(value).__name__} {value!r:.60}")
    return value


def mode_arg(value) -> str:
    """`value` if it is a file store's mode, `"w"`, `"r+"` or `"r"`; else ValueError naming `mode` and what came."""
    if not (isinstance(value, str) and value in ("w", "r+", "r")):
        raise ValueError(f"mode: expected 'w', 'r+' or 'r', got {value!r}")
    return value
