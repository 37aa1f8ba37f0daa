"""Encode/decode throughput of every host codec on real Atari frames, against numpy memcpy.

Prints ``_common`` rows, ``impl="ours"``, ``variant`` = the codec, ``anchor="memcpy"`` (``ratio``
= throughput / numpy memcpy bandwidth in the same process), one per case:

* ``mode="item"``: one entry per call (the serial, per-observation pattern of sb3-extra-buffers),
  one thread: MB/s per core.
* ``mode="batch256_1thread"``: batches of 256 entries, one thread (``host_codecs.set_num_threads(1)``).
* ``mode="batch256"``: batches of 256 entries, all threads (numba/isal release the GIL).
* ``mode="store_get256"``: ``CompressedStore.get`` of 256 random slots out of the whole data set
  (index snapshot, grouping by arena chunk, decode), all threads.

* ``mode="checksum"`` (also alone with ``--checksums``): what the store's per-entry checksums cost,
  ``CompressedStore.put`` of 256 single frames and ``get`` of 256 random ones (a compressed buffer's host
  add and sample), timed interleaved in one process with the checksums on (``impl="ours"``: CRC-32) and replaced
  by zeros (``impl="no-checksum"``, the anchor; ``ratio`` < 1: the checksums' cost, ``overhead_pct``), a store
  keeping the XXH3 sums stores wrote before CRC-32 (``impl="xxh3"``), the checksums alone
  (``impl="checksums-only"`` and ``"xxh3-only"``: the seconds spent computing them inside each ``ours`` / ``xxh3``
  op, ``overhead_pct`` = that over the op's time without checksums: the cost with less of the machine's noise than
  the difference of two timings), and
  ``impl="per-entry"``: the store with the checksums computed one ``zlib.crc32`` call per entry
  (``host_codecs._checksum``'s fallback) instead of its compiled loop over the batch, timed in a round of its own
  with the anchor (its ratio is against that round's anchor).
  Before them, ``checksum_function/<size>B`` rows: one Python call of each candidate checksum (``impl``: xxhash's
  ``xxh3_64`` (the anchor), ``xxh32``, ``zlib.crc32``, isal's ``crc32``) on a payload of a
  compressed frame's size (100, 1,000 B) and of a raw frame (7,056 B); and ``checksum_loop/256x<size>B`` rows:
  each candidate's C function called from one compiled loop over 256 payloads, as the store calls its own
  (``impl``: ``xxh3_64`` (the anchor), ``crc32`` (isa-l's, the store's), ``crc32c`` (isa-l's iSCSI
  polynomial), ``crc64`` (isa-l's ECMA, reflected)), on payloads in cache (``hot``) and 256 random ones of 29 MB
  (``cold``, a sample's reads).

``zstd:-1/dict``: zstd level -1 with a dictionary (``ZstdDictionary.train``, at most 32 KiB, the
compressed buffers' default) built from other frames of the same game (frames 2048-3071; in the
store case the store builds its own from its first 1,024 entries).

MB/s are of raw (decoded) bytes, 1 MB = 1e6 bytes; ``compression_ratio`` = raw bytes / payload
bytes; the memcpy bandwidth is ``np.copyto`` of 256 MiB (64 MiB with ``--quick``). Medians of
several repetitions.

Usage: ``python benchmarks/bench_codecs.py [--quick] [--checksums] [--codecs rle,igzip:1]``
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _common import accumulating, data_file, emit, header, interleaved, row  # noqa: E402

import host_codecs  # noqa: E402
import host_codecs.store  # noqa: E402
from host_codecs import CompressedStore, get_codec  # noqa: E402
from host_codecs._base import ChunkTable  # noqa: E402

DATA = data_file("atari_stacked_5k.npz")
BENCH = "codecs"
DEFAULT_CODECS = [
    "none", "rle", "rle:16", "igzip:0", "igzip:1", "igzip:3", "zstd:-1", "zstd:-1/dict", "zstd:1", "zstd:3",
]


class WithDictionary:
    """A zstd codec with a dictionary built from other frames of the same game (frames 2048-3071,
    never benchmarked), as a store with ``dictionary_bytes`` does."""

    def __init__(self, codec, dictionary):
        self.codec, self.dictionary = codec, dictionary

    def encode_batch(self, rows, dtype):
        return self.codec.encode_batch(rows, dtype, self.dictionary)

    def decode_into(self, chunk, offsets, lengths, meta, out, rows, dtype):
        zeros = np.zeros(len(rows), np.int64)
        table = ChunkTable({0: chunk}, self.dictionary)
        self.codec.decode_many(table, zeros, offsets, lengths, meta, [out], zeros, rows, dtype)


def make_codec(spec: str, train_items: np.ndarray | None = None):
    if spec.endswith("/dict"):
        from host_codecs.zstd import ZstdDictionary

        codec = get_codec(spec.split("/")[0])
        d = ZstdDictionary.train(train_items.reshape(len(train_items), -1), 32768, codec.level)
        return WithDictionary(codec, d)
    return get_codec(spec)


def median_time(fn, reps: int) -> float:
    fn()  # warm up (numba compile, pool start)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def memcpy_mbps(nbytes: int, reps: int) -> float:
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    return nbytes / 1e6 / median_time(lambda: np.copyto(dst, src), reps)


def set_threads(n: int | None) -> None:
    host_codecs.set_num_threads(n)


def bench_batches(codec, items: np.ndarray, batch: int, reps: int):
    """Encode/decode ``items`` in batches; returns (enc s, dec s, payload bytes)."""
    rows = items.reshape(len(items), -1)
    starts = range(0, len(rows), batch)
    encs = [codec.encode_batch(rows[s : s + batch], items.dtype) for s in starts]
    out = np.empty_like(rows)

    def enc():
        for s in starts:
            codec.encode_batch(rows[s : s + batch], items.dtype)

    def dec():
        for s, e in zip(starts, encs):
            k = e.offsets.shape[0]
            codec.decode_into(e.buffer, e.offsets, e.lengths, e.meta, out, np.arange(s, s + k), items.dtype)

    t_enc, t_dec = median_time(enc, reps), median_time(dec, reps)
    assert np.array_equal(out, rows), f"{codec} round trip failed"
    return t_enc, t_dec, int(sum(int(e.lengths.sum()) for e in encs))


def _per_entry_checksums(fn):
    """`fn` run with the checksums computed one Python call per entry (`host_codecs._checksum`'s fallback)."""
    from host_codecs import _checksum

    def run():
        kernels = _checksum._kernels
        _checksum._kernels = dict.fromkeys(_checksum.CHECKSUMS, False)
        try:
            fn()
        finally:
            _checksum._kernels = kernels

    return run


def _no_checksums(fn):
    """`fn` run with every entry checksum replaced by 0 (puts store 0, gets compare against 0)."""
    real = host_codecs.store._payload_sums

    def run():
        host_codecs.store._payload_sums = lambda chunks, chunk_ids, *_: np.zeros(len(chunk_ids), np.uint32)
        try:
            fn()
        finally:
            host_codecs.store._payload_sums = real

    return run


def bench_checksum_functions(reps: int) -> None:
    """Rows of one call of each candidate checksum per payload size (see the module doc)."""
    import zlib

    import xxhash

    fns = {"xxh3_64": xxhash.xxh3_64_intdigest, "xxh32": xxhash.xxh32_intdigest, "zlib.crc32": zlib.crc32}
    if "igzip" in host_codecs.available_codecs():
        from isal import isal_zlib

        fns["isal.crc32"] = isal_zlib.crc32
    view = memoryview(np.random.default_rng(0).integers(0, 256, 4 << 20, dtype=np.uint8))
    for size in (100, 1000, 7056):
        starts = range(0, 2000 * 7064, 7064)
        runs = {name: (lambda f=f: [f(view[o : o + size]) for o in starts]) for name, f in fns.items()}
        times = interleaved(runs, reps, per=len(starts))
        for name, t in times.items():
            anchor = None if name == "xxh3_64" else "xxh3_64"
            row(BENCH, f"checksum_function/{size}B", name, t, n=len(starts), repeats=reps, items=size / 1e6, unit="MB/s",
                anchor=anchor, anchor_seconds=times["xxh3_64"] if anchor else None)


def bench_checksum_loops(reps: int) -> None:
    """Rows of each candidate checksum's C function over 256 payloads in one compiled loop (see the module doc)."""
    import ctypes

    from numba import njit
    from isal import isal_zlib
    from xxhash import _xxhash

    lib, xx = ctypes.CDLL(isal_zlib.__file__), ctypes.CDLL(_xxhash.__file__)
    c, u32, u64 = ctypes, ctypes.c_uint32, ctypes.c_uint64
    fns = {"xxh3_64": (xx.XXH3_64bits_withSeed_dispatch, [c.c_size_t, c.c_size_t, u64], u64),
           "crc32": (lib.crc32_gzip_refl, [u32, c.c_size_t, u64], u32), "crc32c": (lib.crc32_iscsi, [c.c_size_t, c.c_int, u32], u32),
           "crc64": (lib.crc64_ecma_refl, [u64, c.c_size_t, u64], u64)}
    for fn, args, res in fns.values():
        fn.argtypes, fn.restype = args, res

    @njit(nogil=True)
    def ptr_first(fn, ptrs, n, out):  # (pointer, length, seed): XXH3
        for i in range(ptrs.size):
            out[i] = fn(ptrs[i], n, np.uint64(i))

    @njit(nogil=True)
    def init_first(fn, ptrs, n, out):  # (init, pointer, length): isa-l's gzip CRC-32 and CRC-64
        for i in range(ptrs.size):
            out[i] = fn(i, ptrs[i], n)

    @njit(nogil=True)
    def iscsi(fn, ptrs, n, out):  # (pointer, int length, init): isa-l's CRC-32C
        for i in range(ptrs.size):
            out[i] = fn(ptrs[i], np.int32(n), np.uint32(i))

    loops = {"xxh3_64": ptr_first, "crc32": init_first, "crc32c": iscsi, "crc64": init_first}
    pool = np.random.default_rng(1).integers(0, 256, 29 << 20, dtype=np.uint8)
    out = np.zeros(256, np.uint64)
    for size in (1000, 7056):
        for where in ("hot", "cold"):
            rng = np.random.default_rng(2)
            draw = (lambda: np.arange(256) * size) if where == "hot" else (lambda: rng.integers(0, pool.size // size, 256) * size)
            picks = [pool.ctypes.data + draw().astype(np.uint64) for _ in range(reps * 8 + 8)]
            runs = {}
            for name, loop in loops.items():
                it = iter(picks)
                runs[name] = lambda loop=loop, fn=fns[name][0], it=it: loop(fn, next(it) if where == "cold" else picks[0], size, out)
            times = interleaved(runs, reps * 8)
            for name, t in times.items():
                anchor = None if name == "xxh3_64" else "xxh3_64"
                row(BENCH, f"checksum_loop/256x{size}B/{where}", name, t, n=256, repeats=reps * 8, items=256 * size / 1e6, unit="MB/s",
                    anchor=anchor, anchor_seconds=times["xxh3_64"] if anchor else None)


SHARE = "% of the op without checksums"  # the unit of a checksums-only row's value


def bench_checksums(game: str, frames: np.ndarray, spec: str, reps: int) -> None:
    """Rows of the checksums' cost on put and get of 256 frames (see the module doc)."""
    from host_codecs._checksum import XXH3

    n = len(frames)
    codec, dictionary = (spec.split("/")[0], 32768) if spec.endswith("/dict") else (spec, 0)
    impls = ("ours", "xxh3", "no-checksum", "per-entry")
    stores = {k: CompressedStore(n, codec=codec, dictionary_bytes=dictionary, dictionary_samples=256) for k in impls}
    stores["xxh3"].checksum = XXH3  # as stores wrote before CRC-32
    for k, store in stores.items():
        for s in range(0, n, 256):
            fill = lambda: store.put(np.arange(s, s + 256), frames[s : s + 256])  # noqa: E731
            (_no_checksums(fill) if k == "no-checksum" else fill)()
    rng = np.random.default_rng(0)
    ids = iter([rng.integers(0, n, 256) for _ in range(10_000)])
    heads = dict.fromkeys(stores, 0)

    def put(k):  # overwrites the oldest 256 frames, as a replay buffer does
        s = heads[k] = (heads[k] + 256) % n
        stores[k].put(np.arange(s, s + 256), frames[s : s + 256])

    real, spent = host_codecs.store._payload_sums, {}

    def summing(k, fn):  # `fn`, recording the seconds spent in the checksums during each call (the warm-up's dropped)
        def run():
            total = [0.0]
            host_codecs.store._payload_sums = accumulating(real, total)
            try:
                fn()
            finally:
                host_codecs.store._payload_sums = real
            spent.setdefault(k, []).append(total[0])

        return run

    ops = {"put256": put, "get256": lambda k: stores[k].get(next(ids))}
    mb = 256 * frames[0].nbytes / 1e6
    for op, make in ops.items():
        spent.clear()
        # Each op in the round follows the same kind of op (the cycle's order is fixed): the slow per-entry store runs in
        # a round of its own with the anchor, so that it precedes neither checksum.
        no_sums = _no_checksums(lambda: make("no-checksum"))
        times = interleaved({"ours": summing("checksums-only", lambda: make("ours")), "xxh3": summing("xxh3-only", lambda: make("xxh3")),
                             "no-checksum": no_sums}, reps)
        times.update({k: float(np.median(v[1:])) for k, v in spent.items()})
        alone = interleaved({"per-entry": _per_entry_checksums(lambda: make("per-entry")), "no-checksum": no_sums}, reps)
        t0 = times["no-checksum"]
        for impl, t in [*times.items(), ("per-entry", alone["per-entry"])]:
            only = impl.endswith("-only")
            anchor = "no-checksum" if impl in ("ours", "xxh3", "per-entry") else None
            base = alone["no-checksum"] if impl == "per-entry" else t0
            share = {"value": round(100 * t / t0, 2), "unit": SHARE} if only else {"unit": "MB/s"}
            row(BENCH, f"{game}/frame84/checksum/{op}", impl, t, n=256, repeats=reps, items=mb, anchor=anchor,
                anchor_seconds=base if anchor else None, variant=spec,
                overhead_pct=round(100 * (t / t0 if only else t / base - 1), 2), **share)
    for k in ("ours", "xxh3", "per-entry"):
        np.testing.assert_array_equal(stores[k].get(np.arange(n)), frames)  # checks written one by one pass the loop's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer items and repetitions")
    ap.add_argument("--codecs", default=",".join(DEFAULT_CODECS))
    ap.add_argument("--checksums", action="store_true", help="only the checksum-cost rows")
    args = ap.parse_args()
    header(BENCH, args.quick)
    if DATA is None:
        emit({"bench": BENCH, "case": "all", "impl": "ours", "skipped": "shared/data/atari_stacked_5k.npz not found"})
        return
    reps = 3 if args.quick else 7
    n_items = 256 if args.quick else 1024
    with np.load(DATA) as f:
        data = {g: f[f"{g}_obs"] for g in ("breakout", "pong")}
    avail = set(host_codecs.available_codecs())
    specs = [s for s in args.codecs.split(",") if s.split(":")[0].split("/")[0] in avail]

    memcpy = memcpy_mbps((64 if args.quick else 256) << 20, reps)
    import isal
    import numba

    print(json.dumps({
        "bench": BENCH, "case": "environment", "memcpy_MBps": round(memcpy), "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "numpy": np.__version__, "numba": numba.__version__,
        "numba_threading_layer_default": numba.config.THREADING_LAYER, "isal": isal.__version__,
        "python": platform.python_version(),
    }), flush=True)

    bench_checksum_functions(reps)
    if "igzip" in avail:
        bench_checksum_loops(reps)
    for game, obs in data.items():
        for spec in ("none", "rle", "igzip:1", "zstd:-1", "zstd:-1/dict"):
            if spec.split(":")[0] in avail:
                bench_checksums(game, np.ascontiguousarray(obs[: (1024 if args.quick else 4096), -1]), spec, 5 * reps)
        if args.checksums:
            continue
        shapes = {"frame84": (obs[:n_items, -1], obs[2048:3072, -1]), "stack4x84": (obs[:n_items], obs[2048:3072])}
        for shape_name, (items, train_items) in shapes.items():
            raw = items.nbytes
            for spec in specs:
                codec = make_codec(spec, train_items)
                for mode, batch, threads in (("item", 1, 1), ("batch256_1thread", 256, 1), ("batch256", 256, None)):
                    set_threads(threads)
                    t_enc, t_dec, payload = bench_batches(codec, items, batch, reps)
                    enc, dec = raw / 1e6 / t_enc, raw / 1e6 / t_dec
                    for op, t in (("encode", t_enc), ("decode", t_dec)):
                        row(BENCH, f"{game}/{shape_name}/{mode}/{op}", "ours", t, n=len(items), repeats=reps, items=raw / 1e6,
                            unit="MB/s", anchor="memcpy", anchor_seconds=raw / 1e6 / memcpy, variant=spec,
                            threads=host_codecs.num_threads(), compression_ratio=round(raw / payload, 2))
                set_threads(None)
                # Store path: sample 256 random stacks from a store holding all 5,000 stacks.
                if shape_name == "stack4x84":
                    full = obs if not args.quick else obs[:2000]
                    if spec.endswith("/dict"):  # the store builds its own from its first 1,024 entries
                        store = CompressedStore(len(full), codec=codec.codec, dictionary_bytes=32768)
                    else:
                        store = CompressedStore(len(full), codec=codec)
                    for s in range(0, len(full), 256):
                        store.put(np.arange(s, min(s + 256, len(full))), full[s : s + 256])
                    rng = np.random.default_rng(0)
                    idx = [rng.integers(0, len(full), 256) for _ in range(reps + 1)]
                    it = iter(idx)
                    t = median_time(lambda: store.get(next(it)), reps)
                    assert np.array_equal(store.get(idx[0]), full[idx[0]])
                    mb = 256 * full[0].nbytes / 1e6
                    st = store.stats()
                    row(BENCH, f"{game}/{shape_name}/store_get256", "ours", t, n=256, repeats=reps, items=mb, unit="MB/s",
                        anchor="memcpy", anchor_seconds=mb / memcpy, variant=spec, bytes_per_stack=round(st["nbytes"] / len(full), 1),
                        store_ratio=round(st["compression_ratio"], 2))


if __name__ == "__main__":
    main()
