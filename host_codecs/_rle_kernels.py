"""numba kernels of the RLE codec (imported only when an RLE codec is created).

Every kernel runs with the GIL released (``nogil=True``), so a batch is parallelised either by
the shared thread pool (one shard per thread, the default) or by the ``*_prange`` wrappers
(numba's threading layer). Values are compared as unsigned words (see ``element_view_dtype``),
so the coding is bit-exact for every dtype. Counts are ``uint8``, ``uint16`` or ``uint32``; runs
longer than the count's maximum are split into several runs of the same value.

Encoding is one pass over the input per entry: runs are found (eight bytes at a time when the
rows are 8-byte aligned, see :func:`encode_range`) and recorded as (value, length) in a per-shard
scratch of ``n`` slots (an entry never has more than ``n`` runs), while the number of runs
after splitting at each count width is tracked; the count width is then chosen and the payload
written from the scratch into the shard's output arena. The caller packs the arenas of all
shards into the result (one copy of the compressed bytes).

Specialisations are compiled lazily per (word dtype, count dtype) and cached on disk.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from numba.cpython.unsafe.numbers import trailing_zeros

MAX_COUNT_1 = 255
MAX_COUNT_2 = 65535
MAX_COUNT_4 = 4294967295

#: ``encode_range`` status: entry encoded / arena too small for the next entry.
ENC_OK = 0
ENC_FULL = 1
#: ``decode_range`` status per entry.
DEC_OK = 0
DEC_BAD_WIDTH = 1
DEC_BAD_LENGTH = 2
DEC_BAD_COUNTS = 3
DEC_OUT_OF_CHUNK = 4


@njit(nogil=True, cache=True)
def _emit(svals, slens, r, max_count, vals, vi, cnts, ci):
    """Write ``r`` scratch runs as values at ``vals[vi:]`` and counts at ``cnts[ci:]``,
    splitting runs longer than ``max_count``."""
    for q in range(r):
        v = svals[q]
        length = slens[q]
        while length > max_count:
            vals[vi] = v
            cnts[ci] = max_count
            vi += 1
            ci += 1
            length -= max_count
        vals[vi] = v
        cnts[ci] = length
        vi += 1
        ci += 1


@njit(nogil=True, cache=True)
def encode_range(x, x64, fast, rep, lo, hi, min_width, svals, slens, a1, a2, a4, aw, pos, limit, offs, lens, cws):
    """Encode entries ``[lo, hi)`` of ``x`` into the arena bytes ``[pos, limit)``.

    x: # shape=(B, n), unsigned words. x64: # shape=(B, n * vw / 8), dtype=uint64, the same
    bytes (used only when ``fast``). svals, slens: # shape=(>= n,), scratch of this shard.
    a1, a2, a4, aw: one arena viewed as uint8 / uint16 / uint32 / the word dtype.
    offs, lens: # shape=(B,), dtype=int64; cws: # shape=(B,), dtype=uint8: byte offset in the
    arena, payload bytes and count width of each entry (written for encoded entries).

    Run ends (fast path, ``fast``): ``x64`` views each row as uint64, each holding ``8 >> lg``
    words of ``8 << lg`` bits (``lg`` = log2 of the word size in bytes); ``rep`` broadcasts one
    word over a uint64 (0x0101..01 for bytes). The XOR of a uint64 with the broadcast run value
    is zero where words are equal, and its trailing zero bits count the equal words at its low
    (first, little-endian) end, so a run is scanned 8 bytes at a time with shifts only.

    Payloads start on 8 bytes; padding bytes are zeroed (the output is deterministic).
    Returns ``(status, t, pos, need)``: ``status == ENC_OK`` when all entries were written
    (``t == hi``, ``pos`` = end of the last padded payload); ``ENC_FULL`` when entry ``t`` needs
    ``need`` bytes but fewer than that are left (nothing of entry ``t`` was written).
    """
    n = x.shape[1]
    n8 = x64.shape[1]
    vw = aw.itemsize
    lg = 0 if vw == 1 else (1 if vw == 2 else (2 if vw == 4 else 3))
    for t in range(lo, hi):
        row = x[t]
        w64 = x64[t] if fast else x64[0]
        r = 0
        extra1 = 0
        extra2 = 0
        extra4 = 0
        j = 0
        while j < n:
            # End of the run of equal words starting at j (written here, not in a helper:
            # a numba call per run, even inline="always", made encoding ~5x slower).
            v = row[j]
            if fast:
                pat = np.uint64(v) * rep
                q = j >> (3 - lg)
                d = (w64[q] ^ pat) >> np.uint64((j - (q << (3 - lg))) << (3 + lg))
                if d != 0:
                    k = j + (np.int64(trailing_zeros(d)) >> (3 + lg))
                else:
                    q += 1
                    while q < n8 and w64[q] == pat:
                        q += 1
                    if q == n8:
                        k = n
                    else:
                        k = (q << (3 - lg)) + (np.int64(trailing_zeros(w64[q] ^ pat)) >> (3 + lg))
            else:
                k = j + 1
                while k < n and row[k] == v:
                    k += 1
            length = k - j
            svals[r] = v
            slens[r] = length
            r += 1
            if length > MAX_COUNT_1:
                extra1 += (length - 1) // MAX_COUNT_1
                if length > MAX_COUNT_2:
                    extra2 += (length - 1) // MAX_COUNT_2
                    if length > MAX_COUNT_4:
                        extra4 += (length - 1) // MAX_COUNT_4
            j = k
        # Smallest payload among the allowed widths; ties go to the wider count.
        cw = 4
        nruns = r + extra4
        size = nruns * (vw + 4)
        if min_width <= 2 and (r + extra2) * (vw + 2) < size:
            cw = 2
            nruns = r + extra2
            size = nruns * (vw + 2)
        if min_width <= 1 and (r + extra1) * (vw + 1) < size:
            cw = 1
            nruns = r + extra1
            size = nruns * (vw + 1)
        padded = (size + 7) // 8 * 8
        if pos + padded > limit:
            return ENC_FULL, t, pos, padded
        if vw >= cw:
            vb = pos
            cb = pos + nruns * vw
        else:
            cb = pos
            vb = pos + nruns * cw
        if cw == 1:
            _emit(svals, slens, r, MAX_COUNT_1, aw, vb // vw, a1, cb)
        elif cw == 2:
            _emit(svals, slens, r, MAX_COUNT_2, aw, vb // vw, a2, cb // 2)
        else:
            _emit(svals, slens, r, MAX_COUNT_4, aw, vb // vw, a4, cb // 4)
        for p in range(pos + size, pos + padded):
            a1[p] = 0
        offs[t] = pos
        lens[t] = size
        cws[t] = cw
        pos += padded
    return ENC_OK, hi, pos, 0


@njit(nogil=True, cache=True)
def encode_shards(x, x64, fast, rep, min_width, shard_ids, los, his, svals, slens, ncap, a1, a2, a4, aw, pos, limit, offs, lens, cws, res):
    """Run :func:`encode_range` for each shard ``s`` in ``shard_ids`` (entries
    ``[los[s], his[s])``, scratch ``[s * ncap, (s + 1) * ncap)``, arena ``[pos[s], limit[s])``);
    ``res[s] = (status, t, pos, need)``."""
    for i in range(shard_ids.shape[0]):
        s = shard_ids[i]
        sv = svals[s * ncap : (s + 1) * ncap]
        sl = slens[s * ncap : (s + 1) * ncap]
        st, t, p, need = encode_range(
            x, x64, fast, rep, los[s], his[s], min_width, sv, sl, a1, a2, a4, aw, pos[s], limit[s], offs, lens, cws
        )
        res[s, 0] = st
        res[s, 1] = t
        res[s, 2] = p
        res[s, 3] = need


@njit(nogil=True, parallel=True, cache=True)
def encode_shards_prange(x, x64, fast, rep, min_width, shard_ids, los, his, svals, slens, ncap, a1, a2, a4, aw, pos, limit, offs, lens, cws, res):
    """:func:`encode_shards` with the shards run by ``prange``."""
    for i in prange(shard_ids.shape[0]):
        encode_shards(
            x, x64, fast, rep, min_width, shard_ids[i : i + 1], los, his, svals, slens, ncap,
            a1, a2, a4, aw, pos, limit, offs, lens, cws, res,
        )


@njit(nogil=True, cache=True)
def _expand(vals, vi, cnts, ci, nruns, row, n):
    pos = np.int64(0)
    for q in range(nruns):
        end = pos + np.int64(cnts[ci + q])
        if end > n:
            return DEC_BAD_COUNTS
        row[pos:end] = vals[vi + q]
        pos = end
    return DEC_OK if pos == n else DEC_BAD_COUNTS


@njit(nogil=True, cache=True)
def decode_range(c1, c2, c4, cv, offsets, lengths, meta, out, rows, lo, hi, status):
    """For t in [lo, hi): expand the payload at ``offsets[t]`` (``lengths[t]`` bytes, count
    width ``meta[t]`` bytes) into ``out[rows[t]]``.

    c1, c2, c4, cv: one chunk viewed as uint8 / uint16 / uint32 / the word dtype.
    out: # shape=(k, n), the word dtype. status: # shape=(k,), dtype=int8, set per entry to
    ``DEC_OK`` or the reason the payload is corrupt (bad count width, length not a whole
    number of runs, counts not adding up to ``n``, payload outside the chunk).
    """
    n = out.shape[1]
    vw = cv.itemsize
    size = c1.shape[0]
    for t in range(lo, hi):
        cw = np.int64(meta[t])
        if cw != 1 and cw != 2 and cw != 4:
            status[t] = DEC_BAD_WIDTH
            continue
        length = lengths[t]
        off = offsets[t]
        nruns = length // (vw + cw)
        if length < 0 or nruns * (vw + cw) != length:
            status[t] = DEC_BAD_LENGTH
            continue
        if off < 0 or off + length > size:
            status[t] = DEC_OUT_OF_CHUNK
            continue
        if vw >= cw:
            vb = off
            cb = off + nruns * vw
        else:
            cb = off
            vb = off + nruns * cw
        row = out[rows[t]]
        if cw == 1:
            status[t] = _expand(cv, vb // vw, c1, cb, nruns, row, n)
        elif cw == 2:
            status[t] = _expand(cv, vb // vw, c2, cb // 2, nruns, row, n)
        else:
            status[t] = _expand(cv, vb // vw, c4, cb // 4, nruns, row, n)


@njit(nogil=True, parallel=True, cache=True)
def decode_range_prange(c1, c2, c4, cv, offsets, lengths, meta, out, rows, status, shards):
    b = rows.shape[0]
    for s in prange(shards):
        decode_range(c1, c2, c4, cv, offsets, lengths, meta, out, rows, s * b // shards, (s + 1) * b // shards, status)
