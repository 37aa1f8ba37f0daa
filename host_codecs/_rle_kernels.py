"""numba kernels of the RLE codec (imported only when an RLE codec is created).

Every kernel processes the entries ``[lo, hi)`` of a batch with the GIL released
(``nogil=True``), so a batch is parallelised either by the shared thread pool (one shard per
thread, the default) or by the ``*_prange`` wrappers (numba's threading layer). Values are
compared as unsigned words (see ``element_view_dtype``), so the coding is bit-exact for every
dtype. Counts are ``uint8``, ``uint16`` or ``uint32``; runs longer than the count's maximum are
split into several runs of the same value.

Specialisations are compiled lazily per (word dtype, count dtype) and cached on disk.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

MAX_COUNT_1 = 255
MAX_COUNT_2 = 65535
MAX_COUNT_4 = 4294967295


@njit(nogil=True, cache=True)
def count_runs(x, lo, hi, out):
    """``out[i] = runs of x[i]`` after splitting at 8/16/32-bit counts, for i in [lo, hi).

    x: # shape=(B, n), unsigned words. out: # shape=(B, 3), dtype=int64.
    """
    n = x.shape[1]
    for i in range(lo, hi):
        row = x[i]
        r1 = 0
        r2 = 0
        r4 = 0
        j = 0
        while j < n:
            v = row[j]
            k = j + 1
            while k < n and row[k] == v:
                k += 1
            length = k - j
            if length <= MAX_COUNT_1:
                r1 += 1
            else:
                r1 += (length + MAX_COUNT_1 - 1) // MAX_COUNT_1
            if length <= MAX_COUNT_2:
                r2 += 1
            else:
                r2 += (length + MAX_COUNT_2 - 1) // MAX_COUNT_2
            if length <= MAX_COUNT_4:
                r4 += 1
            else:
                r4 += (length + MAX_COUNT_4 - 1) // MAX_COUNT_4
            j = k
        out[i, 0] = r1
        out[i, 1] = r2
        out[i, 2] = r4


@njit(nogil=True, cache=True)
def encode_runs(x, vals, cnts, max_count, val_idx, cnt_idx, rows, lo, hi):
    """For t in [lo, hi): write the runs of ``x[rows[t]]``, values at ``vals[val_idx[t]:]`` and
    counts at ``cnts[cnt_idx[t]:]`` (``vals`` and ``cnts`` alias one output buffer)."""
    n = x.shape[1]
    for t in range(lo, hi):
        row = x[rows[t]]
        vp = val_idx[t]
        cp = cnt_idx[t]
        j = 0
        while j < n:
            v = row[j]
            k = j + 1
            while k < n and row[k] == v and k - j < max_count:
                k += 1
            vals[vp] = v
            cnts[cp] = k - j
            vp += 1
            cp += 1
            j = k


@njit(nogil=True, cache=True)
def decode_runs(vals, cnts, val_idx, cnt_idx, nruns, out, rows, lo, hi, ok):
    """For t in [lo, hi): expand the runs into ``out[rows[t]]``; ``ok[t]`` is False where the
    counts do not add up to the row length exactly (corrupt payload)."""
    n = out.shape[1]
    for t in range(lo, hi):
        row = out[rows[t]]
        vp = val_idx[t]
        cp = cnt_idx[t]
        pos = np.int64(0)
        good = True
        for q in range(nruns[t]):
            end = pos + np.int64(cnts[cp + q])
            if end > n:
                good = False
                break
            row[pos:end] = vals[vp + q]
            pos = end
        ok[t] = good and pos == n


@njit(nogil=True, parallel=True, cache=True)
def count_runs_prange(x, out, shards):
    b = x.shape[0]
    for s in prange(shards):
        count_runs(x, s * b // shards, (s + 1) * b // shards, out)


@njit(nogil=True, parallel=True, cache=True)
def encode_runs_prange(x, vals, cnts, max_count, val_idx, cnt_idx, rows, shards):
    b = rows.shape[0]
    for s in prange(shards):
        encode_runs(x, vals, cnts, max_count, val_idx, cnt_idx, rows, s * b // shards, (s + 1) * b // shards)


@njit(nogil=True, parallel=True, cache=True)
def decode_runs_prange(vals, cnts, val_idx, cnt_idx, nruns, out, rows, ok, shards):
    b = rows.shape[0]
    for s in prange(shards):
        decode_runs(vals, cnts, val_idx, cnt_idx, nruns, out, rows, s * b // shards, (s + 1) * b // shards, ok)
