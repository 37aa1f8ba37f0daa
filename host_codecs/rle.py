"""Run-length coding of raw words (bit-exact for every dtype) with numba kernels (`host_codecs._rle_kernels`), split
over the thread pool. Payload format and encoding passes: `docs/api/host_codecs.md`, "RLE payloads".
"""

from __future__ import annotations

import numpy as np

from ._base import Codec, EncodedBatch, ceil_align, check_decode, check_deltas, chunk_addresses, element_view_dtype, import_extra
from ._pool import parallel_for

__all__ = ["RLECodec"]

_REP = {1: np.uint64(0x0101010101010101), 2: np.uint64(0x0001000100010001), 4: np.uint64(0x0000000100000001), 8: np.uint64(1)}
_NO_WORDS = np.zeros((1, 0), np.uint64)  # stands in for the uint64 view of unaligned rows
_ENCODE_SHARD_BYTES = 1 << 21  # smallest encode shard worth a pool thread's wake-up (RLE is fast per byte)
_NO_IDS = np.zeros(0, np.int64)  # stands in for the delta rows and bases of a batch of whole entries


class RLECodec(Codec):
    """Run-length codec (tag 1). Level: the minimum count width in bits, 8 (default), 16 or 32
    (`docs/api/host_codecs.md`, "RLE payloads").

    Raises:
      ImportError: naming the `codecs` extra when numba is not installed.
      ValueError: a bad level.
    """

    name = "rle"
    tag = 1
    levels = (8, 16, 32)
    default_level = 8
    threaded_decode = True

    def __init__(self, level: int | None = None):
        super().__init__(level)
        self._k = import_extra("rle", "numba", "host_codecs._rle_kernels")

    def encode_batch(self, rows: np.ndarray, dtype: np.dtype) -> EncodedBatch:
        return self._encode(rows, dtype, None)

    def encode_deltas(self, rows: np.ndarray, dtype: np.dtype, idx: np.ndarray, src: np.ndarray, ext: np.ndarray) -> EncodedBatch:
        """`Codec.encode_deltas` with the XOR taken inside the encoder (`host_codecs._rle_kernels.encode_range`)."""
        return self._encode(rows, dtype, check_deltas(self.name, rows, idx, src, ext))

    def _encode(self, rows: np.ndarray, dtype: np.dtype, based) -> EncodedBatch:
        """`encode_batch` (`based` None) or `encode_deltas` (`based` = `(idx, src, ext)`)."""
        word, rows = element_view_dtype(dtype), np.ascontiguousarray(rows)
        nbytes = rows.shape[1]
        idx, src, ext = based if based is not None else (_NO_IDS, _NO_IDS, np.zeros((0, nbytes), np.uint8))
        b = rows.shape[0] if based is None else idx.shape[0]
        x = rows.view(word)  # [B, n]
        fast = nbytes > 0 and nbytes % 8 == 0 and rows.ctypes.data % 8 == 0 and ext.ctypes.data % 8 == 0
        words = (lambda a: a.view(np.uint64)) if fast else (lambda a: _NO_WORDS)
        args = (x, words(rows), fast, _REP[word.itemsize], self.level // 8)
        deltas = (based is not None, idx, src, ext.view(word), words(ext))
        sizes, cws, offs = np.zeros(b, np.int64), np.zeros(b, np.uint8), np.zeros(b, np.int64)

        def run(write: bool, out: np.ndarray) -> None:  # `out` (uint8, 8-byte multiple) viewed as u8, u16, u32, words
            views = out, out.view(np.uint16), out.view(np.uint32), out.view(word)
            parallel_for(b, lambda i, j: self._k.encode_range(*args, i, j, write, sizes, cws, offs, *views, *deltas),
                         work_bytes=b * nbytes * (1 if based is None else 2), min_shard_bytes=_ENCODE_SHARD_BYTES)

        run(False, np.zeros(0, np.uint8))
        padded = ceil_align(sizes)
        np.cumsum(padded[:-1], out=offs[1:])
        buf = np.zeros(int(padded.sum()), np.uint8)
        run(True, buf)
        return EncodedBatch(buf, offs, sizes, cws)

    def decode_many(self, chunks, chunk_ids, offsets, lengths, meta, outs, out_ids, rows, dtype, bases=None) -> None:
        """`Codec.decode_many` in one compiled loop per thread (`host_codecs._rle_kernels.decode_at`); outputs that
        are not C-contiguous are decoded into contiguous copies, then copied back."""
        flat = [o if o.flags.c_contiguous else np.ascontiguousarray(o) for o in outs]
        check_decode(self.name, chunks, chunk_ids, offsets, lengths, outs, out_ids, rows, bases)
        k, n, nbytes = self._k, len(rows), outs[0].shape[1] if len(outs) else 0
        if n and nbytes:
            vw = element_view_dtype(dtype).itemsize
            ids, starts, _ = chunk_addresses(chunks)
            src = starts[np.searchsorted(ids, np.asarray(chunk_ids, np.int64))] + np.asarray(offsets, np.uint64)
            rows_at = np.array([o.__array_interface__["data"][0] for o in flat], np.uint64)
            dst = rows_at[np.asarray(out_ids, np.int64)] + np.asarray(rows, np.uint64) * np.uint64(nbytes)
            base = np.zeros(n, np.uint64)
            if bases is not None:
                b_out, b_row = (np.asarray(x, np.int64) for x in bases)
                d = b_out >= 0
                base[d] = rows_at[b_out[d]] + b_row[d].astype(np.uint64) * np.uint64(nbytes)
            lengths, meta = np.ascontiguousarray(lengths, np.int64), np.ascontiguousarray(meta, np.uint8)
            status = np.zeros(n, np.int8)

            def body(lo: int, hi: int) -> None:
                k.decode_at(src, lengths, meta, dst, base, nbytes, vw, lo, hi, status)

            if bases is None:
                parallel_for(n, body, work_bytes=n * nbytes)
            else:  # in order: a base that is an earlier entry is whole before its delta reads it
                body(0, n)
            self._raise_status(status, meta, nbytes // vw)
        for o, f in zip(outs, flat):
            if f is not o:
                o[...] = f

    def _raise_status(self, status: np.ndarray, meta: np.ndarray, words: int) -> None:
        """ValueError for the first corrupt entry a kernel reported in `status` (none: returns)."""
        k = self._k
        code = int(status[status != 0][0]) if status.any() else k.DEC_OK
        if code == k.DEC_BAD_WIDTH:
            raise ValueError(f"codec 'rle': corrupt entry, count width {sorted(set(meta[status == code].tolist()))}")
        if code == k.DEC_BAD_LENGTH:
            raise ValueError("codec 'rle': corrupt entry, payload length is not a whole number of runs")
        if code != k.DEC_OK:
            raise ValueError(f"codec 'rle': corrupt entry, run counts do not add up to {words} words")
