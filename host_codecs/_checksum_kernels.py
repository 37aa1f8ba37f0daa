"""numba loops of the entries' checksum (imported by `host_codecs._checksum` on first use).

`fn` is the C function `XXH3_64bits_withSeed_dispatch(pointer, length, seed)` of the installed `xxhash`, passed as an
argument (a ctypes function), so the compiled loops cached on disk hold no address of this process.
"""

from __future__ import annotations

from numba import njit, prange


@njit(nogil=True, cache=True)
def hash_serial(fn, ptrs, lengths, seeds, out):
    """`out[i] = fn(ptrs[i], lengths[i], seeds[i])` for every entry, on the calling thread (GIL released)."""
    for i in range(ptrs.size):
        out[i] = fn(ptrs[i], lengths[i], seeds[i])


@njit(nogil=True, cache=True, parallel=True)
def hash_parallel(fn, ptrs, lengths, seeds, out):
    """`hash_serial` with the entries split over numba's threads."""
    for i in prange(ptrs.size):
        out[i] = fn(ptrs[i], lengths[i], seeds[i])
