"""numba loops of the entries' checksum (imported by `host_codecs._checksum` on first use).

One loop over a range of entries with the GIL released (`nogil=True`): `host_codecs.parallel_for` runs one shard of
a large batch per thread, as it does the codecs' kernels (numba's own parallel loops would bring a second pool of
threads). `fn` is the C function `XXH3_64bits_withSeed_dispatch(pointer, length, seed)` of the installed `xxhash`, passed as an
argument (a ctypes function), so the compiled loops cached on disk hold no address of this process.
"""

from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True)
def hash_range(fn, ptrs, lengths, seeds, out, lo, hi):
    """`out[i] = fn(ptrs[i], lengths[i], seeds[i])` for the entries `i` in `[lo, hi)`."""
    for i in range(lo, hi):
        out[i] = fn(ptrs[i], lengths[i], seeds[i])
