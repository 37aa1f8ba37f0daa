"""Run-length encoding with numba kernels, parallel over a batch, GIL released.

Kernels (``host_codecs._rle_kernels``) are ``nogil`` numba functions over a range of entries;
a batch is split into one shard per thread either by the shared thread pool (engine
``"threads"``, default) or by a numba ``prange`` over shards (engine ``"prange"``).

Payload format of one entry with ``R`` runs, element word width ``vw`` bytes (the unsigned view
of the dtype, see :func:`host_codecs._base.element_view_dtype`) and count width ``cw`` bytes
(1, 2 or 4; recorded per entry in the store's ``meta`` byte)::

    vw >= cw:  values[R] (vw bytes each) | counts[R] (cw bytes each)
    vw <  cw:  counts[R] | values[R]

The wider section comes first so both sections stay aligned (payloads start on 8 bytes).
``R = len(payload) / (vw + cw)``; ``sum(counts) == number of words``. Little-endian (native).

Exactness: values are compared and stored as raw unsigned words, so every dtype (uint8, bool,
int16, float32 NaN payloads, -0.0, complex...) round-trips bit-exactly; nothing is cast to a
narrower type. Runs longer than the count's maximum (255, 65,535, 4,294,967,295) are split into
several runs, so counts never overflow.

Count width choice (per entry, from the data): the width that gives the smallest payload among
those allowed by the codec's level (the minimum count width in bits, ``rle:8`` = any width,
``rle:16`` = 16 or 32-bit counts, which decode about twice as fast on Atari frames but are
larger); ties go to the wider count (fewer runs to expand).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from ._base import ALIGN, Codec, EncodedBatch, element_view_dtype, missing_extra, parallel_for

__all__ = ["RLECodec"]

_K = None
_K_LOCK = threading.Lock()
_SERIAL: threading.Lock | None = None  # set when numba's threading layer is not thread-safe


def _kernels():
    """Import (and on first call compile) the numba kernels; clear ImportError without numba."""
    global _K
    if _K is None:
        with _K_LOCK:
            if _K is None:
                try:
                    from . import _rle_kernels
                except ImportError as exc:
                    raise missing_extra("rle", "numba", exc) from exc
                _K = _rle_kernels
    return _K


def _call_prange(fn, *args):
    """Call a prange kernel; serialise calls if numba's 'workqueue' layer is in use (it aborts
    on concurrent use from several threads; 'omp' and 'tbb' are thread-safe)."""
    global _SERIAL
    if _SERIAL is not None:
        with _SERIAL:
            return fn(*args)
    result = fn(*args)
    if _SERIAL is None:
        import numba

        if numba.threading_layer() == "workqueue":
            _SERIAL = threading.Lock()
    return result


def _shards(n: int) -> int:
    import numba

    return max(1, min(numba.get_num_threads(), n))


_WIDTHS = np.array([1, 2, 4], dtype=np.int64)
_COUNT_DTYPES = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32)}
_MAX_COUNT = {1: 255, 2: 65535, 4: 4294967295}
ENGINES = ("threads", "prange")


class RLECodec(Codec):
    """Run-length codec (tag 1). Level = minimum count width in bits: 8 (default), 16 or 32.

    Args:
      level: 8, 16 or 32 (see the module docstring).
      engine: how a batch is parallelised: ``"threads"`` (default; the shared thread pool runs
        one shard of the batch per thread through ``nogil`` kernels) or ``"prange"`` (numba's
        threading layer). Default from ``HOST_CODECS_RLE_ENGINE``. Measured on a shared 2-core
        machine, numba's default OpenMP layer spin-waits and was ~10x slower than one thread
        when other processes kept the cores busy (see docs/benchmarks.md); the thread pool
        never does worse than one thread, is safe under concurrent calls, and does not depend
        on which threading layer numba picked.

    Raises:
      ImportError: naming the ``codecs`` extra when numba is not installed.
      ValueError: bad level or engine.
    """

    name = "rle"
    tag = 1
    levels = (8, 16, 32)
    default_level = 8

    def __init__(self, level: int | None = None, engine: str | None = None):
        super().__init__(level)
        if engine is None:
            engine = os.environ.get("HOST_CODECS_RLE_ENGINE", "threads")
        if engine not in ENGINES:
            raise ValueError(f"codec 'rle': engine must be one of {list(ENGINES)}, got {engine!r}")
        self.engine = engine
        self._k = _kernels()
        self._min_width = self.level // 8

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other) and self.engine == other.engine  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.level, self.engine))

    def encode_batch(self, rows: np.ndarray, dtype: np.dtype) -> EncodedBatch:
        k = self._k
        word = element_view_dtype(dtype)
        vw = word.itemsize
        b = rows.shape[0]
        x = rows.view(word)  # [B, n_words]
        runs = np.empty((b, 3), dtype=np.int64)
        if self.engine == "prange":
            _call_prange(k.count_runs_prange, x, runs, _shards(b))
        else:
            parallel_for(b, lambda lo, hi: k.count_runs(x, lo, hi, runs), work_bytes=rows.nbytes)
        sizes = runs * (vw + _WIDTHS)
        sizes = np.where(_WIDTHS >= self._min_width, sizes, np.iinfo(np.int64).max)
        # argmin over reversed columns so that ties pick the wider count.
        col = 2 - np.argmin(sizes[:, ::-1], axis=1)
        ar = np.arange(b)
        cw = _WIDTHS[col]
        nruns = runs[ar, col]
        lengths = sizes[ar, col]
        padded = (lengths + ALIGN - 1) // ALIGN * ALIGN
        offsets = np.zeros(b, dtype=np.int64)
        if b > 1:
            np.cumsum(padded[:-1], out=offsets[1:])
        buf = np.zeros(int(padded.sum()), dtype=np.uint8)
        values_first = vw >= cw
        val_idx = np.where(values_first, offsets, offsets + nruns * cw) // vw
        cnt_byte = np.where(values_first, offsets + nruns * vw, offsets)
        vals = buf.view(word)
        single = b == 0 or cw.min() == cw.max()
        for w in ([int(cw[0])] if single and b else np.unique(cw).tolist()):
            sel = ar if single else np.flatnonzero(cw == w)
            cnts = buf.view(_COUNT_DTYPES[w])
            vi, ci, mc = val_idx[sel], cnt_byte[sel] // w, _MAX_COUNT[w]
            if self.engine == "prange":
                _call_prange(k.encode_runs_prange, x, vals, cnts, mc, vi, ci, sel, _shards(sel.size))
            else:
                parallel_for(
                    sel.size,
                    lambda lo, hi: k.encode_runs(x, vals, cnts, mc, vi, ci, sel, lo, hi),
                    work_bytes=sel.size * rows.shape[1],
                )
        return EncodedBatch(buf, offsets, lengths, cw.astype(np.uint8))

    def decode_into(self, chunk, offsets, lengths, meta, out, rows, dtype) -> None:
        k = self._k
        word = element_view_dtype(dtype)
        vw = word.itemsize
        cw = meta.astype(np.int64)
        if cw.size and not ((cw == 1) | (cw == 2) | (cw == 4)).all():
            raise ValueError(f"codec 'rle': corrupt entry, count width {sorted(set(cw.tolist()))}")
        nruns, rem = np.divmod(lengths, vw + cw)
        if rem.any():
            raise ValueError("codec 'rle': corrupt entry, payload length is not a whole number of runs")
        values_first = vw >= cw
        val_idx = np.where(values_first, offsets, offsets + nruns * cw) // vw
        cnt_byte = np.where(values_first, offsets + nruns * vw, offsets)
        vals = chunk.view(word)
        out_w = out.view(word)
        ok = np.ones(rows.shape[0], dtype=np.bool_)
        single = cw.size == 0 or cw.min() == cw.max()
        for w in [int(cw[0])] if single and cw.size else np.unique(cw).tolist():
            if single:  # common case: one count width, no gathers
                vi, ci, nr, rw = val_idx, cnt_byte // w, nruns, rows
            else:
                sel = np.flatnonzero(cw == w)
                vi, ci, nr, rw = val_idx[sel], cnt_byte[sel] // w, nruns[sel], rows[sel]
            cnts = chunk.view(_COUNT_DTYPES[w])
            okw = np.ones(rw.shape[0], dtype=np.bool_)
            if self.engine == "prange":
                _call_prange(k.decode_runs_prange, vals, cnts, vi, ci, nr, out_w, rw, okw, _shards(rw.shape[0]))
            else:
                parallel_for(
                    rw.shape[0],
                    lambda lo, hi: k.decode_runs(vals, cnts, vi, ci, nr, out_w, rw, lo, hi, okw),
                    work_bytes=rw.shape[0] * out.shape[1],
                )
            if not okw.all():
                raise ValueError(
                    f"codec 'rle': corrupt entry, run counts do not add up to {out.shape[1] // vw} words"
                )
