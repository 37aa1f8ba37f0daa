"""Gather payloads scattered over arena chunks into one staging buffer (numba when installed,
else a numpy loop), so a batch is decoded by one parallel codec call, not one per chunk."""

from __future__ import annotations

import numpy as np

_KERNEL = None


def _numpy_gather(src, src_off, lengths, dst, dst_off):
    for s, n, d in zip(src_off.tolist(), lengths.tolist(), dst_off.tolist()):
        dst[d : d + n] = src[s : s + n]


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        try:
            from numba import njit
        except ImportError:
            _KERNEL = _numpy_gather
        else:

            @njit(nogil=True, cache=True)
            def gather(src, src_off, lengths, dst, dst_off):
                for i in range(src_off.shape[0]):
                    s, n, d = src_off[i], lengths[i], dst_off[i]
                    dst[d : d + n] = src[s : s + n]

            _KERNEL = gather
    return _KERNEL


def gather(src: np.ndarray, src_off: np.ndarray, lengths: np.ndarray, dst: np.ndarray, dst_off: np.ndarray) -> None:
    """``dst[dst_off[i] : dst_off[i] + lengths[i]] = src[src_off[i] : ...]`` for every i.

    src, dst: # dtype=uint8, 1-D. src_off, lengths, dst_off: # shape=(k,), dtype=int64.
    """
    _kernel()(src, src_off, lengths, dst, dst_off)


_COPY_KERNEL = None


def _numpy_copy_rows(out, src, dst, start, stop):
    out[dst[start:stop]] = out[src[start:stop]]


def _copy_kernel():
    global _COPY_KERNEL
    if _COPY_KERNEL is None:
        try:
            from numba import njit
        except ImportError:
            _COPY_KERNEL = _numpy_copy_rows
        else:

            @njit(nogil=True, cache=True)
            def copy(out, src, dst, start, stop):
                for i in range(start, stop):
                    out[dst[i], :] = out[src[i], :]

            _COPY_KERNEL = copy
    return _COPY_KERNEL


def copy_rows(out: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
    """``out[dst[i]] = out[src[i]]`` for every i, split over the codec thread pool.

    out: # shape=(B, nbytes), dtype=uint8. src, dst: # shape=(k,), dtype=int64; no ``dst`` row
    may be a ``src`` row (rows are copied from already decoded rows into the other ones).
    """
    from ._base import parallel_for

    src = np.ascontiguousarray(src, dtype=np.int64)
    dst = np.ascontiguousarray(dst, dtype=np.int64)
    kernel = _copy_kernel()
    parallel_for(src.shape[0], lambda a, b: kernel(out, src, dst, a, b), work_bytes=src.shape[0] * out.shape[1])
