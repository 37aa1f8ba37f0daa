"""The entries' checksum: seeded CRC-32 of each payload, a batch in one compiled loop (`docs/api/host_codecs.md`,
"Checksums": its guarantees, its fallback and the older `XXH3`).
"""

from __future__ import annotations

import ctypes
import zlib
from typing import Any

import numpy as np

from ._base import chunk_addresses
from ._pool import parallel_for

CRC32, XXH3 = "crc32", "xxh3"  # the names a snapshot or index records (`checksum`); XXH3 where it records none
CHECKSUMS = (CRC32, XXH3)
_SHARD_BYTES = 1 << 20  # payload bytes per thread of the pool (checksums run at tens of GB/s: a smaller shard does not pay)
_kernels: dict[str, Any] = {}  # checksum -> (C function, compiled loop), or False: the per-entry fallback


def _probe(name: str, loop, fn) -> bool:
    """Whether `loop` over `fn` gives the per-entry checksums on payloads of several lengths and offsets."""
    data = np.random.default_rng(0).integers(0, 256, 4099, dtype=np.uint8)
    cuts = [(0, 0), (0, 3), (5, 100), (7, 300), (1, 4099)]
    starts, ends = [a for a, _ in cuts], [b for _, b in cuts]
    n, slots = np.array([b - a for a, b in cuts], np.int64), np.array([a * 977 for a in starts], np.int64)
    out = np.zeros(len(cuts), np.uint64)
    loop(fn, *chunk_addresses({0: data}), np.zeros(len(cuts), np.int64), np.array(starts, np.int64), n, slots, out, 0, len(cuts))
    return out.tolist() == _per_entry(name, [memoryview(data)] * len(cuts), starts, ends, _seeds(name, slots, n).tolist())


def _load(name: str) -> Any:
    """`(fn, loop)` of checksum `name`: the C function and the compiled loop over it (cached on disk), checked
    against the per-entry function; False where they cannot be built."""
    try:
        from ._checksum_kernels import crc_range, hash_range

        if name == CRC32:
            from isal import isal_zlib

            fn, loop = getattr(ctypes.CDLL(isal_zlib.__file__), "crc32_gzip_refl"), crc_range
            fn.argtypes, fn.restype = [ctypes.c_uint32, ctypes.c_size_t, ctypes.c_uint64], ctypes.c_uint32  # (init, pointer, length)
        else:
            from xxhash import _xxhash

            fn, loop = getattr(ctypes.CDLL(_xxhash.__file__), "XXH3_64bits_withSeed_dispatch"), hash_range
            fn.argtypes, fn.restype = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64], ctypes.c_uint64  # (pointer, length, seed)
        return (fn, loop) if _probe(name, loop, fn) else False
    except Exception:  # noqa: BLE001 - no such symbol, no isal or numba, a build that differs: the per-entry fallback
        return False


def _seeds(name: str, slots: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """uint64 `[k]`: the seed of each entry: XXH3's `slot ^ length << 32`; the CRC's start value, its high 32 bits
    times a 64-bit odd constant (the 32-bit value is taken in the loop)."""
    s = np.asarray(slots, np.int64).astype(np.uint64) ^ np.asarray(lengths, np.int64).astype(np.uint64) << np.uint64(32)
    return s if name == XXH3 else (s * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)


def _per_entry(name: str, views: list, starts: list, ends: list, seeds: list) -> list[int]:
    if name == CRC32:
        return [zlib.crc32(v[o:e], s & 0xFFFFFFFF) for v, o, e, s in zip(views, starts, ends, seeds)]
    from xxhash import xxh3_64_intdigest as h

    return [h(v[o:e], s) for v, o, e, s in zip(views, starts, ends, seeds)]


def payload_sums(chunks, chunk_ids, offsets, lengths, slots, checksum: str = CRC32) -> np.ndarray:
    """# shape=(k,), dtype=uint32: `checksum` (`docs/api/host_codecs.md`, "Checksums") of each payload, seeded with its slot id and its length
    (`chunks`: chunk id -> uint8 array or bytes; `chunk_ids`, `offsets`, `lengths`, `slots`: # shape=(k,), integer
    arrays). A payload past its chunk's end is checksummed as far as it goes and one in a chunk not in `chunks` as
    empty (its seed keeps its stored length), so their sums differ from the stored ones."""
    k = len(chunk_ids)
    if not k:  # nothing to hash: the chunks (possibly files an arena reads on demand) are not looked at
        return np.zeros(0, np.uint32)
    starts, n = np.asarray(offsets, np.int64).reshape(k), np.asarray(lengths, np.int64).reshape(k)
    ids, slots = np.asarray(chunk_ids, np.int64).reshape(k), np.asarray(slots, np.int64).reshape(k)
    kernels = _kernels.get(checksum)
    if kernels is None:
        kernels = _kernels[checksum] = _load(checksum)
    sums = np.empty(k, np.uint64)
    if kernels is False:
        view = {c: memoryview(np.frombuffer(chunks[c], np.uint8) if c in chunks else b"") for c in set(ids.tolist())}
        sums[:] = _per_entry(checksum, [view[c] for c in ids.tolist()], starts.tolist(), (starts + n).tolist(), _seeds(checksum, slots, n).tolist())
    else:
        fn, loop = kernels
        where = chunk_addresses(chunks)
        parallel_for(k, lambda a, b: loop(fn, *where, ids, starts, n, slots, sums, a, b), work_bytes=int(n.sum()), min_shard_bytes=_SHARD_BYTES)
    return (sums & np.uint64(0xFFFFFFFF)).astype(np.uint32)
