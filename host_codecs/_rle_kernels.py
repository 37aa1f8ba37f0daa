"""numba kernels of the RLE codec, imported when an RLE codec is created (`docs/api/host_codecs.md`, "RLE payloads").
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.core.extending import intrinsic
from numba.cpython.unsafe.numbers import trailing_zeros

MAX_COUNT_1, MAX_COUNT_2, MAX_COUNT_4 = 255, 65535, 4294967295

#: `decode_at` status per entry.
DEC_OK = 0
DEC_BAD_WIDTH = 1
DEC_BAD_LENGTH = 2
DEC_BAD_COUNTS = 3


@njit(nogil=True, cache=True)
def encode_range(x, x64, fast, rep, min_width, lo, hi, write, sizes, cws, offs, a1, a2, a4, aw, based, idx, src, ext, ext64):
    """One pass of the encoder over entries `[lo, hi)` of `x` (# shape=(B, n), unsigned words).

    The first pass (`write` False) sets each entry's count width `cws[t]` (the smallest payload among the widths of
    at least `min_width` bytes; ties go to the wider) and payload bytes `sizes[t]`. The second (`write` True) writes
    each payload at byte `offs[t]` of the zeroed output, viewed as `a1, a2, a4, aw` (uint8, uint16, uint32, words).

    When `fast`, runs are scanned 8 bytes at a time in `x64` (# shape=(B, n * vw / 8), dtype=uint64, the same bytes),
    `rep` broadcasting a word (`docs/api/host_codecs.md`, "RLE payloads"). With `based`, entry `t` is row `idx[t]`
    XOR its base, row `src[t]` of `x` (`src[t] >= 0`) or row `-1 - src[t]` of `ext` (`ext64` its uint64 view).
    """
    n, n8, vw = x.shape[1], x64.shape[1], aw.itemsize
    lg = 0 if vw == 1 else (1 if vw == 2 else (2 if vw == 4 else 3))
    scratch64 = np.empty((n * vw + 7) // 8, np.uint64)  # the delta being scanned, when `based`
    scratch = scratch64.view(x.dtype)  # its first `n` words
    for t in range(lo, hi):
        row = x[t] if not based else scratch
        w64 = (x64[t] if not based else scratch64) if fast else x64[0]
        if based:
            i, s = idx[t], src[t]
            if fast:
                a64, b64 = x64[i], (x64[s] if s >= 0 else ext64[-1 - s])
                for q in range(n8):
                    scratch64[q] = a64[q] ^ b64[q]
            else:
                arow, brow = x[i], (x[s] if s >= 0 else ext[-1 - s])
                for q in range(n):
                    scratch[q] = arow[q] ^ brow[q]
        cw = np.int64(cws[t]) if write else np.int64(4)
        maxc = MAX_COUNT_1 if cw == 1 else (MAX_COUNT_2 if cw == 2 else MAX_COUNT_4)
        nruns = sizes[t] // (vw + cw) if write else 0
        vi = (offs[t] if vw >= cw else offs[t] + nruns * cw) // vw
        ci = (offs[t] + nruns * vw if vw >= cw else offs[t]) // cw
        r = extra1 = extra2 = extra4 = j = 0
        while j < n:
            # The end k of the run starting at j, written here: a helper call per run is slow.
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
                    k = n if q == n8 else (q << (3 - lg)) + (np.int64(trailing_zeros(w64[q] ^ pat)) >> (3 + lg))
            else:
                k = j + 1
                while k < n and row[k] == v:
                    k += 1
            length = k - j
            if write:
                while length > 0:
                    c = min(length, maxc)
                    aw[vi] = v
                    if cw == 1:
                        a1[ci] = c
                    elif cw == 2:
                        a2[ci] = c
                    else:
                        a4[ci] = c
                    vi += 1
                    ci += 1
                    length -= c
            else:
                r += 1
                extra1 += (length - 1) // MAX_COUNT_1
                extra2 += (length - 1) // MAX_COUNT_2
                extra4 += (length - 1) // MAX_COUNT_4
            j = k
        if not write:
            size = (r + extra4) * (vw + 4)
            if min_width <= 2 and (r + extra2) * (vw + 2) < size:
                cw, size = 2, (r + extra2) * (vw + 2)
            if min_width <= 1 and (r + extra1) * (vw + 1) < size:
                cw, size = 1, (r + extra1) * (vw + 1)
            sizes[t] = size
            cws[t] = cw


@intrinsic
def _pointer(typingctx, address):
    """The uint64 `address` as a `void *` (for `carray`)."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))

    return types.voidptr(types.uint64), codegen


@njit(nogil=True, cache=True, inline="always")
def _bytes_at(address, n):
    return carray(_pointer(address), (n,), np.uint8)


@njit(nogil=True, cache=True, inline="always")
def _copy(dst, src, n):
    """Copy `n` bytes from address `src` to address `dst` (distinct rows), 8 bytes at a time."""
    n8 = n // 8
    d8, s8 = carray(_pointer(dst), (n8,), np.uint64), carray(_pointer(src), (n8,), np.uint64)
    for i in range(n8):
        d8[i] = s8[i]
    d1, s1 = _bytes_at(dst, n), _bytes_at(src, n)
    for i in range(n8 * 8, n):
        d1[i] = s1[i]


@njit(nogil=True, cache=True)
def decode_at(src, lengths, meta, dst, base, nbytes, vw, lo, hi, status):
    """For t in `[lo, hi)`, in order: expand the payload of `lengths[t]` bytes at address `src[t]` (count width
    `meta[t]` bytes, words of `vw` bytes) into the `nbytes` bytes at address `dst[t]`; a delta (`base[t]` not 0) is
    the row at `base[t]` (copied unless it is `dst[t]` itself) with its non-zero runs XORed in.

    Unchecked: the caller has checked the payloads, rows and bases. status: # shape=(k,), dtype=int8: per entry
    `DEC_OK` or why the payload is corrupt.
    """
    for t in range(lo, hi):
        cw = np.int64(meta[t])
        if cw != 1 and cw != 2 and cw != 4:
            status[t] = DEC_BAD_WIDTH
            continue
        length = np.int64(lengths[t])
        nruns = length // (vw + cw)
        if length < 0 or nruns * (vw + cw) != length:
            status[t] = DEC_BAD_LENGTH
            continue
        p = _bytes_at(src[t], length)
        out = _bytes_at(dst[t], nbytes)
        delta = base[t] != 0
        if delta and base[t] != dst[t]:  # a base in the row itself: the delta is XORed in place
            _copy(dst[t], base[t], nbytes)
        vb = 0 if vw >= cw else nruns * cw
        cb = nruns * vw if vw >= cw else 0
        if vw == 1:  # bytes (frames): one value byte per run, the count read as one word of its width
            pos = _expand_bytes(p, src[t] + np.uint64(cb), out, nruns, cw, vb, nbytes, delta)
        else:
            pos = _expand_words(p, out, nruns, cw, vw, vb, cb, nbytes, delta)
        status[t] = DEC_BAD_COUNTS if pos != nbytes else DEC_OK


@njit(nogil=True, cache=True, inline="always")
def _expand_bytes(p, counts, out, nruns, cw, vb, nbytes, delta):
    """The runs of one entry of byte values (`decode_at`), counts `cw` bytes wide at address `counts`: the bytes
    filled (`nbytes` when the counts add up; -1 when they run past it)."""
    c1 = carray(_pointer(counts), (nruns,), np.uint8)
    c2 = carray(_pointer(counts), (nruns if cw == 2 else 0,), np.uint16)
    c4 = carray(_pointer(counts), (nruns if cw == 4 else 0,), np.uint32)
    pos = np.int64(0)
    for q in range(nruns):
        c = np.int64(c1[q]) if cw == 1 else (np.int64(c2[q]) if cw == 2 else np.int64(c4[q]))
        end = pos + c
        if end > nbytes:
            return -1
        x = p[vb + q]
        if not delta:
            for i in range(pos, end):
                out[i] = x
        elif x != 0:
            for i in range(pos, end):
                out[i] ^= x
        pos = end
    return pos


@njit(nogil=True, cache=True, inline="always")
def _expand_words(p, out, nruns, cw, vw, vb, cb, nbytes, delta):
    """`_expand_bytes` for values of `vw` > 1 bytes (counts read byte by byte, little-endian)."""
    pos = np.int64(0)
    for q in range(nruns):
        c = np.int64(0)
        for k in range(cw):  # little-endian count
            c |= np.int64(p[cb + q * cw + k]) << (8 * k)
        end = pos + c * vw
        if end > nbytes:
            return -1
        v = vb + q * vw
        zero = True
        for k in range(vw):
            zero = zero and p[v + k] == 0
        if not (delta and zero):
            for i in range(pos, end, vw):
                for k in range(vw):
                    out[i + k] = (out[i + k] ^ p[v + k]) if delta else p[v + k]
        pos = end
    return pos
