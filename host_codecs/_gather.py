"""Gather payloads scattered over arena chunks into one staging buffer (numba when installed,
else a numpy loop), so a batch is decoded by one parallel codec call, not one per chunk."""

from __future__ import annotations

import numpy as np


def _numpy_gather(src, src_off, lengths, dst, dst_off):
    for s, n, d in zip(src_off.tolist(), lengths.tolist(), dst_off.tolist()):
        dst[d : d + n] = src[s : s + n]


def _numba_gather(src, src_off, lengths, dst, dst_off):
    for i in range(src_off.shape[0]):
        s, n, d = src_off[i], lengths[i], dst_off[i]
        dst[d : d + n] = src[s : s + n]


def _numpy_copy_rows(out, src, dst, start, stop):
    out[dst[start:stop]] = out[src[start:stop]]


def _numba_copy_rows(out, src, dst, start, stop):
    # An element loop, not ``out[d, :] = out[s, :]``: numba cannot prove two rows of one array
    # disjoint, so the slice form copies every row through a temporary (15x slower, measured).
    n = out.shape[1]
    for i in range(start, stop):
        s, d = src[i], dst[i]
        for j in range(n):
            out[d, j] = out[s, j]


_KERNELS: dict = {}


def _kernel(python_fn, numpy_fallback):
    """``python_fn`` compiled by numba (``nogil``, cached on disk) on first use, or
    ``numpy_fallback`` when numba is not installed; one compile per process."""
    k = _KERNELS.get(python_fn)
    if k is None:
        try:
            from numba import njit
        except ImportError:
            k = numpy_fallback
        else:
            k = njit(nogil=True, cache=True)(python_fn)
        _KERNELS[python_fn] = k
    return k


def gather(src: np.ndarray, src_off: np.ndarray, lengths: np.ndarray, dst: np.ndarray, dst_off: np.ndarray) -> None:
    """``dst[dst_off[i] : dst_off[i] + lengths[i]] = src[src_off[i] : ...]`` for every i.

    src, dst: # dtype=uint8, 1-D. src_off, lengths, dst_off: # shape=(k,), dtype=int64.
    """
    _kernel(_numba_gather, _numpy_gather)(src, src_off, lengths, dst, dst_off)


def copy_rows(out: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
    """``out[dst[i]] = out[src[i]]`` for every i, split over the codec thread pool.

    out: # shape=(B, nbytes), dtype=uint8. src, dst: # shape=(k,), dtype=int64; no ``dst`` row
    may be a ``src`` row (rows are copied from already decoded rows into the other ones).
    """
    from ._base import parallel_for

    src = np.ascontiguousarray(src, dtype=np.int64)
    dst = np.ascontiguousarray(dst, dtype=np.int64)
    kernel = _kernel(_numba_copy_rows, _numpy_copy_rows)
    parallel_for(src.shape[0], lambda a, b: kernel(out, src, dst, a, b), work_bytes=src.shape[0] * out.shape[1])
