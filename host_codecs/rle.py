"""Run-length encoding with numba kernels, parallel over a batch, GIL released.

Kernels (``host_codecs._rle_kernels``) are ``nogil`` numba functions over a range of entries;
a batch is split into one shard per thread either by the shared thread pool (engine
``"threads"``, default) or by a numba ``prange`` over shards (engine ``"prange"``).

Encoding is one numba call per shard and one pass over the input: each shard records the runs
of an entry in its scratch (``n`` slots: an entry never has more runs than words), picks the
count width, and writes the payload into its own output arena; the arenas are then packed into
the result with one copy of the compressed bytes. Arena and scratch are kept per calling thread
between calls (up to :data:`KEEP_BYTES`); an arena starts at :data:`ARENA_FRACTION` of the raw
bytes and doubles (keeping what was written) when an entry does not fit, e.g. noise, whose
payload is up to ``1 + cw / vw`` times the raw size. Rows whose byte size is a multiple of 8
and that start 8-byte aligned are scanned 8 bytes at a time; others one word at a time (same
output). Decoding is one numba call per shard over entries of any count width.

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

from ._base import Codec, EncodedBatch, check_decode_args, element_view_dtype, missing_extra, num_threads, parallel_for

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


ENGINES = ("threads", "prange")

_REP = {
    1: np.uint64(0x0101010101010101),
    2: np.uint64(0x0001000100010001),
    4: np.uint64(0x0000000100000001),
    8: np.uint64(1),
}
_U2, _U4, _U8 = np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.uint64)
_NO_WORDS = np.zeros((1, 0), np.uint64)  # x64 stand-in when rows are not 8-byte aligned
#: First arena size per shard = this fraction of the shard's raw bytes (grown by doubling when
#: an entry does not fit; Atari stacks compress 8-18x, so one pass almost always fits).
ARENA_FRACTION = 0.25
#: Scratch and arena kept between calls (per calling thread) only up to this many bytes.
KEEP_BYTES = 32 << 20
_MIN_SHARD_BYTES = 1 << 18  # same rule as parallel_for: small batches run on one thread


def _round8(v: int) -> int:
    return (int(v) + 7) // 8 * 8


def _pool_shards(b: int, nbytes: int) -> int:
    if nbytes < 2 * _MIN_SHARD_BYTES:
        return 1
    return max(1, min(num_threads(), b, nbytes // _MIN_SHARD_BYTES))


class _Scratch:
    """Per calling thread: run scratch (``ncap`` slots per shard) and output arena (``acap``
    bytes per shard), reused across calls to avoid re-allocating and page-faulting them."""

    def __init__(self):
        self.svals = self.slens = self.arena = None
        self.ncap = self.acap = 0

    def prepare(self, word: np.dtype, shards: int, n: int, b: int, raw_bytes: int) -> None:
        if self.svals is None or self.svals.dtype != word or self.ncap < n or self.svals.size < shards * self.ncap:
            self.ncap = n
            self.svals = np.empty(shards * n, word)
            self.slens = np.empty(shards * n, np.int64)
        want = _round8(raw_bytes * ARENA_FRACTION / shards + 8 * (b // shards + 1))
        have = 0 if self.arena is None else self.arena.size // shards // 8 * 8
        if have < want:
            self.arena = np.empty(shards * want, np.uint8)
            have = want
        self.acap = have

    def grow(self, shards: int, acap: int, new_cap: int, used: np.ndarray) -> None:
        new = np.empty(shards * new_cap, np.uint8)
        for s in range(shards):
            new[s * new_cap : s * new_cap + used[s]] = self.arena[s * acap : s * acap + used[s]]
        self.arena = new

    def release_if_large(self) -> None:
        if self.arena is not None and self.arena.nbytes > KEEP_BYTES:
            self.arena = None
        if self.svals is not None and self.svals.nbytes + self.slens.nbytes > KEEP_BYTES:
            self.svals = self.slens = None
            self.ncap = 0


_LOCAL = threading.local()


def _scratch(word: np.dtype, shards: int, n: int, b: int, raw_bytes: int) -> _Scratch:
    st = getattr(_LOCAL, "scratch", None)
    if st is None:
        st = _LOCAL.scratch = _Scratch()
    st.prepare(word, shards, n, b, raw_bytes)
    return st



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
        rows = np.ascontiguousarray(rows)
        b, nbytes = rows.shape
        n = nbytes // vw
        if b == 0:
            z = np.zeros(0, np.int64)
            return EncodedBatch(np.zeros(0, np.uint8), z, z.copy(), np.zeros(0, np.uint8))
        x = rows.view(word)  # [B, n]
        fast = nbytes > 0 and nbytes % 8 == 0 and rows.ctypes.data % 8 == 0
        x64 = rows.view(_U8) if fast else _NO_WORDS
        prange_engine = self.engine == "prange"
        shards = _shards(b) if prange_engine else _pool_shards(b, rows.nbytes)
        st = _scratch(word, shards, n, b, rows.nbytes)
        bounds = np.arange(shards + 1, dtype=np.int64) * b // shards
        los, his = bounds[:-1].copy(), bounds[1:].copy()
        acap = st.acap
        pos = np.arange(shards, dtype=np.int64) * acap
        offs = np.empty(b, np.int64)
        lens = np.empty(b, np.int64)
        cws = np.empty(b, np.uint8)
        res = np.zeros((shards, 4), np.int64)
        todo = np.arange(shards, dtype=np.int64)
        rep = _REP[vw]
        while True:
            arena = st.arena
            views = (arena, arena.view(_U2), arena.view(_U4), arena.view(word))
            limit = (np.arange(shards, dtype=np.int64) + 1) * acap
            args = (x, x64, fast, rep, self._min_width)
            tail = (los, his, st.svals, st.slens, st.ncap, *views, pos, limit, offs, lens, cws, res)
            if prange_engine:
                _call_prange(k.encode_shards_prange, *args, todo, *tail)
            elif todo.size == 1:
                k.encode_shards(*args, todo, *tail)
            else:
                parallel_for(todo.size, lambda lo, hi: k.encode_shards(*args, todo[lo:hi], *tail))
            full = res[:, 0] != k.ENC_OK
            if not full.any():
                break
            # Some shard ran out of arena: grow it (keeping what is written) and resume there.
            used = res[:, 2] - np.arange(shards, dtype=np.int64) * acap
            new_cap = _round8(max(2 * acap, int((used + res[:, 3]).max())))
            st.grow(shards, acap, new_cap, used)
            shift = np.arange(shards, dtype=np.int64) * (new_cap - acap)
            for s in range(shards):  # entries done so far move with their shard
                offs[bounds[s] : res[s, 1]] += shift[s]
            res[:, 2] += shift
            acap = st.acap = new_cap
            todo = np.flatnonzero(full).astype(np.int64)
            los[todo] = res[todo, 1]
            pos = res[:, 2].copy()
        ends = res[:, 2]
        starts = np.arange(shards, dtype=np.int64) * acap
        used = ends - starts
        if shards == 1:
            buf = st.arena[: int(used[0])].copy()
        else:
            dest = np.zeros(shards, np.int64)
            np.cumsum(used[:-1], out=dest[1:])
            buf = np.empty(int(used.sum()), np.uint8)
            for s in range(shards):
                buf[dest[s] : dest[s] + used[s]] = st.arena[starts[s] : ends[s]]
                offs[bounds[s] : bounds[s + 1]] += dest[s] - starts[s]
        st.release_if_large()
        return EncodedBatch(buf, offs, lens, cws)

    def decode_into(self, chunk, offsets, lengths, meta, out, rows, dtype) -> None:
        k = self._k
        word = element_view_dtype(dtype)
        b = rows.shape[0]
        if b == 0:
            return
        if chunk.shape[0] % 8:
            raise ValueError(f"codec 'rle': chunk length must be a multiple of 8, got {chunk.shape[0]}")
        check_decode_args("rle", chunk.shape[0], offsets, lengths, out, rows)
        views = (chunk, chunk.view(_U2), chunk.view(_U4), chunk.view(word))
        offsets = np.ascontiguousarray(offsets, np.int64)
        lengths = np.ascontiguousarray(lengths, np.int64)
        rows = np.ascontiguousarray(rows, np.int64)
        meta = np.ascontiguousarray(meta)
        out_w = out.view(word)
        status = np.zeros(b, np.int8)
        args = (*views, offsets, lengths, meta, out_w, rows)
        if self.engine == "prange":
            _call_prange(k.decode_range_prange, *args, status, _shards(b))
        else:
            parallel_for(b, lambda lo, hi: k.decode_range(*args, lo, hi, status), work_bytes=b * out.shape[1])
        if status.any():
            bad = status[status != 0]
            code = int(bad[0])
            if code == k.DEC_BAD_WIDTH:
                widths = sorted(set(meta[status == code].tolist()))
                raise ValueError(f"codec 'rle': corrupt entry, count width {widths}")
            if code == k.DEC_BAD_LENGTH:
                raise ValueError("codec 'rle': corrupt entry, payload length is not a whole number of runs")
            if code == k.DEC_OUT_OF_CHUNK:
                raise ValueError("codec 'rle': corrupt entry, payload lies outside its chunk")
            raise ValueError(
                f"codec 'rle': corrupt entry, run counts do not add up to {out.shape[1] // word.itemsize} words"
            )
