"""Gather payloads scattered over arena chunks into one staging buffer (numba when installed,
else a numpy loop), so a batch is decoded by one parallel codec call, not one per chunk."""

from __future__ import annotations

import numpy as np

from ._base import parallel_for


def _numpy_gather(src, src_off, lengths, dst, dst_off):
    for s, n, d in zip(src_off.tolist(), lengths.tolist(), dst_off.tolist()):
        dst[d : d + n] = src[s : s + n]


def _numba_gather(src, src_off, lengths, dst, dst_off):
    for i in range(src_off.shape[0]):
        s, n, d = src_off[i], lengths[i], dst_off[i]
        dst[d : d + n] = src[s : s + n]


def _numpy_copy_rows(outs, src_out, src, dst_out, dst, start, stop):
    for i in range(start, stop):
        outs[dst_out[i]][dst[i]] = outs[src_out[i]][src[i]]


def _numba_copy_rows(outs, src_out, src, dst_out, dst, start, stop):
    # An element loop, not ``b[d, :] = a[s, :]``: numba cannot prove the two rows disjoint (they
    # may be rows of one array), so the slice form copies every row through a temporary (15x
    # slower, measured).
    for i in range(start, stop):
        a, b = outs[src_out[i]], outs[dst_out[i]]
        s, d = src[i], dst[i]
        for j in range(a.shape[1]):
            b[d, j] = a[s, j]


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


def copy_rows(outs: tuple, src_out: np.ndarray, src: np.ndarray, dst_out: np.ndarray, dst: np.ndarray) -> None:
    """``outs[dst_out[i]][dst[i]] = outs[src_out[i]][src[i]]`` for every i, split over the codec
    thread pool.

    outs: tuple of 2-D uint8 arrays with one row size, # shape=(B_j, nbytes). src_out, src,
    dst_out, dst: # shape=(k,), dtype=int64, in range (not checked here). No destination row may
    be a source row (rows are copied from already decoded rows into the other ones).
    """
    args = [np.ascontiguousarray(x, dtype=np.int64) for x in (src_out, src, dst_out, dst)]
    kernel = _kernel(_numba_copy_rows, _numpy_copy_rows)
    outs = tuple(outs)
    parallel_for(args[0].shape[0], lambda a, b: kernel(outs, *args, a, b), work_bytes=args[0].shape[0] * outs[0].shape[1])
