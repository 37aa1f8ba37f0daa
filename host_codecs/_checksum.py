"""The entries' checksum: XXH3-64 of each payload, seeded, all of a batch in one compiled loop.

`payload_sums` hashes the `k` payloads of a put or a read. It calls the XXH3-64 that the `xxhash` package carries
(its C function `XXH3_64bits_withSeed_dispatch`: the SIMD variant the CPU has) from a numba loop over the entries with
the GIL released, split over the threads of `host_codecs.parallel_for` for large batches: one Python call per batch
instead of one per entry (which cost about as much as the hashing itself for frame-sized entries). Where that C
function cannot be found (another build of `xxhash`, no numba), or gives another value than
`xxhash.xxh3_64_intdigest` on a test input, the same sums are computed with `xxhash.xxh3_64_intdigest`, one call per
entry. Both give exactly the same checks.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ._base import chunk_addresses
from ._pool import parallel_for

_SHARD_BYTES = 1 << 20  # payload bytes per thread of the pool (hashing runs at tens of GB/s: a smaller shard does not pay)
_kernels: Any = None  # (XXH3 C function, compiled loop), or False: the per-entry fallback


def _load() -> Any:
    """`(fn, loop)`: the C function `XXH3_64bits_withSeed_dispatch` of the installed `xxhash` and the compiled loop
    over it (cached on disk), checked against `xxhash.xxh3_64_intdigest`; False where they cannot be built."""
    try:
        import xxhash
        from xxhash import _xxhash

        from ._checksum_kernels import hash_range

        fn = getattr(ctypes.CDLL(_xxhash.__file__), "XXH3_64bits_withSeed_dispatch")
        fn.argtypes, fn.restype = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64], ctypes.c_uint64  # (pointer, length, seed)
        probe = np.random.default_rng(0).integers(0, 256, 4099, dtype=np.uint8)
        cuts = [(0, 0), (0, 3), (5, 100), (7, 300), (1, 4099)]
        want = [xxhash.xxh3_64_intdigest(probe[a:b], (a * 977) ^ (b << 32)) for a, b in cuts]
        out = np.zeros(len(cuts), np.uint64)
        hash_range(fn, np.array([probe.ctypes.data + a for a, _ in cuts], np.uint64), np.array([b - a for a, b in cuts], np.uint64),
                   np.array([(a * 977) ^ (b << 32) for a, b in cuts], np.uint64), out, 0, len(cuts))
        return (fn, hash_range) if out.tolist() == want else False
    except Exception:  # noqa: BLE001 - no such symbol, no numba, a build that differs: the per-entry fallback
        return False


def _per_entry(views: list, starts: list, ends: list, seeds: list) -> list[int]:
    import xxhash

    h = xxhash.xxh3_64_intdigest
    return [h(v[o:e], s) for v, o, e, s in zip(views, starts, ends, seeds)]


def payload_sums(chunks, chunk_ids, offsets, lengths, slots) -> np.ndarray:
    """# shape=(k,), dtype=uint32: the low 32 bits of XXH3-64 of each payload seeded with its slot id and its length,
    `slot ^ length << 32` (`chunks`: chunk id -> uint8 array or bytes; `chunk_ids`, `offsets`, `lengths`, `slots`:
    # shape=(k,), integer arrays). A payload past its chunk's end is hashed as far as it goes and one in a chunk not
    in `chunks` as empty (its seed keeps its stored length), so their sums differ from the stored ones."""
    global _kernels
    k = len(chunk_ids)
    if not k:  # nothing to hash: the chunks (possibly files an arena reads on demand) are not looked at
        return np.zeros(0, np.uint32)
    starts, n = np.asarray(offsets, np.int64), np.asarray(lengths, np.int64)
    seeds = np.asarray(slots, np.uint64) ^ n.astype(np.uint64) << np.uint64(32)
    ids = np.asarray(chunk_ids, np.int64)
    if _kernels is None:
        _kernels = _load()
    if _kernels is False:
        view = {c: memoryview(np.frombuffer(chunks[c], np.uint8) if c in chunks else b"") for c in set(ids.tolist())}
        sums = np.array(_per_entry([view[c] for c in ids.tolist()], starts.tolist(), (starts + n).tolist(), seeds.tolist()), np.uint64).reshape(k)
    else:
        keys, bases, sizes = chunk_addresses(chunks)
        at = np.minimum(np.searchsorted(keys, ids), max(keys.size - 1, 0))
        known = keys[at] == ids if keys.size else np.zeros(k, bool)
        size = np.where(known, sizes[at] if keys.size else 0, 0)
        lo = np.minimum(starts, size)
        ptrs = np.where(known, bases[at] if keys.size else 0, 0).astype(np.uint64) + lo.astype(np.uint64)
        length = np.maximum(np.minimum(starts + n, size) - lo, 0).astype(np.uint64)
        sums = np.empty(k, np.uint64)
        fn, loop = _kernels
        parallel_for(k, lambda a, b: loop(fn, ptrs, length, seeds, sums, a, b), work_bytes=int(length.sum()), min_shard_bytes=_SHARD_BYTES)
    return (sums & np.uint64(0xFFFFFFFF)).astype(np.uint32)
