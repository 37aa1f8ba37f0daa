"""numba loops of the entries' checksums (imported by `host_codecs._checksum` on first use).

How the loops run and find the C functions: `docs/api/host_codecs.md`, "Checksums".
"""

from __future__ import annotations

import numpy as np
from numba import njit

_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: the CRC's start value is the high half of `(slot ^ length << 32) * _MIX`


@njit(nogil=True, cache=True, inline="always")
def _where(keys, bases, sizes, chunk, start, length):
    """`(address, bytes)` of a payload: as far as it lies inside its chunk; `(0, 0)` in a chunk not in `keys`."""
    j = np.searchsorted(keys, chunk)
    if j >= keys.size or keys[j] != chunk:
        return np.uint64(0), np.uint64(0)
    lo = min(max(start, 0), sizes[j])
    hi = min(max(start + length, 0), sizes[j])
    return bases[j] + np.uint64(lo), np.uint64(max(hi - lo, 0))


@njit(nogil=True, cache=True)
def crc_range(fn, keys, bases, sizes, chunks, starts, lengths, slots, out, lo, hi):
    """`out[i]`: CRC-32 (`fn`) of entry `i` (in chunk `chunks[i]` from `starts[i]`, `lengths[i]` bytes), started from
    its slot's and length's seed, for the entries `i` in `[lo, hi)`."""
    for i in range(lo, hi):
        ptr, n = _where(keys, bases, sizes, chunks[i], starts[i], lengths[i])
        seed = ((np.uint64(slots[i]) ^ (np.uint64(lengths[i]) << np.uint64(32))) * _MIX) >> np.uint64(32)
        out[i] = fn(np.uint32(seed), ptr, n)


@njit(nogil=True, cache=True)
def hash_range(fn, keys, bases, sizes, chunks, starts, lengths, slots, out, lo, hi):
    """`crc_range` with XXH3-64 (`fn`) seeded `slot ^ length << 32`."""
    for i in range(lo, hi):
        ptr, n = _where(keys, bases, sizes, chunks[i], starts[i], lengths[i])
        out[i] = fn(ptr, n, np.uint64(slots[i]) ^ (np.uint64(lengths[i]) << np.uint64(32)))
