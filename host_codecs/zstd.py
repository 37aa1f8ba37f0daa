"""``zstd``: Zstandard frames via the optional ``zstandard`` package.

Two engines, same frame format (standard zstd frames with the content size; any zstd decoder
reads them):

* **native** (default when numba is available): numba kernels (``nogil``) call libzstd's
  ``ZSTD_compressCCtx`` / ``ZSTD_decompressDCtx`` for every entry of a shard, reading and writing
  numpy memory directly, with one compression and one decompression context per worker thread,
  reused. libzstd is the copy bundled in the ``zstandard`` package (its cffi extension exports
  the C API); if that cannot be loaded, the system ``libzstd``; if neither, the python engine.
  Why: with the python engine every entry is a Python call that drops and retakes the GIL, so
  two worker threads mostly wait for each other (measured on 84x84 frames under load: a batch
  decode of 1,223 frames took 1.7x longer than with the native kernels). The kernels are
  compiled on first use in each process (not cached on disk: libzstd's address differs between
  processes), about a second.
* **python**: ``zstandard.ZstdCompressor.compress`` / ``ZstdDecompressor.decompress`` per entry.

``HOST_CODECS_ZSTD_ENGINE=python`` (or ``ZstdCodec(level, engine="python")``) selects the python
engine. The ``bytes`` objects zstandard returns keep much more memory allocated than their
length (measured: ~28 KB each); the store copies every payload into its arena and drops them,
so none survives an encode.

Dictionaries (:class:`ZstdDictionary`): a :class:`~host_codecs.CompressedStore` created with
``dictionary_bytes`` builds one from its first entries (their bytewise mode, see
:meth:`ZstdDictionary.train`) and encodes its default codec's later entries with it (meta byte 1;
the frame header names the dictionary, so a wrong one fails loudly). Small similar entries such as
84x84 Atari frames then skip most of their per-frame cost: at level -1, Breakout 333 -> 112 B and
Pong 181 -> 97 B per frame, a random 160-frame read 298 -> 111 us and 188 -> ~120 us (native
engine, docs/benchmarks.md).

Levels 1-22 (default 3) and zstd's "fast" levels -7..-1: a negative level stores literals
without Huffman coding, so a frame is a little larger but decodes ~1.7x faster (84x84 Breakout
frames: level -1 344 B / 1.8 us per frame, level 1 306 B / 3.0 us, level 3 296 B / 3.2 us on the
2-core CPU of docs/benchmarks.md). Decoding is the same for every level.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import secrets
import threading

import numpy as np

from ._base import (
    ChunkTable, Codec, EncodedBatch, ceil_align, check_out_ids, check_ranges, check_rows, missing_extra, pack_payloads,
    parallel_for,
)
from ._gather import _kernel

__all__ = ["ZstdCodec", "ZstdDictionary"]


def _zstandard():
    try:
        import zstandard
    except ImportError as exc:
        raise missing_extra("zstd", "zstandard", exc) from exc
    return zstandard


# -- native engine: libzstd called from numba ------------------------------------------------------
_NATIVE = None  # None: not tried yet; False: unavailable; else _Native
_NATIVE_LOCK = threading.Lock()


class _Native:
    """libzstd entry points and the numba decode kernel (built once per process)."""

    def __init__(self, lib: ctypes.CDLL, where: str):
        from numba import njit

        self.where = where
        sz = ctypes.c_size_t
        dec = lib.ZSTD_decompressDCtx  # (dctx, dst, dstCapacity, src, srcSize) -> size_t
        dec.restype, dec.argtypes = sz, [sz, sz, sz, sz, sz]  # pointers passed as addresses
        self.create = lib.ZSTD_createDCtx
        self.create.restype, self.create.argtypes = sz, []
        self.free = lib.ZSTD_freeDCtx
        self.free.restype, self.free.argtypes = sz, [sz]
        self.is_error = lib.ZSTD_isError
        self.is_error.restype, self.is_error.argtypes = ctypes.c_uint, [sz]
        self.error_name = lib.ZSTD_getErrorName
        self.error_name.restype, self.error_name.argtypes = ctypes.c_char_p, [sz]
        comp = lib.ZSTD_compressCCtx  # (cctx, dst, dstCapacity, src, srcSize, level) -> size_t
        comp.restype, comp.argtypes = sz, [sz, sz, sz, sz, sz, ctypes.c_int]
        self.create_c = lib.ZSTD_createCCtx
        self.create_c.restype, self.create_c.argtypes = sz, []
        self.free_c = lib.ZSTD_freeCCtx
        self.free_c.restype, self.free_c.argtypes = sz, [sz]
        self.bound = lib.ZSTD_compressBound
        self.bound.restype, self.bound.argtypes = sz, [sz]
        dec_dict = lib.ZSTD_decompress_usingDDict  # (dctx, dst, dstCapacity, src, srcSize, ddict)
        dec_dict.restype, dec_dict.argtypes = sz, [sz, sz, sz, sz, sz, sz]
        comp_dict = lib.ZSTD_compress_usingCDict  # (cctx, dst, dstCapacity, src, srcSize, cdict)
        comp_dict.restype, comp_dict.argtypes = sz, [sz, sz, sz, sz, sz, sz]
        self.create_ddict = lib.ZSTD_createDDict  # (dict, dictSize) -> ZSTD_DDict*, copies the bytes
        self.create_ddict.restype, self.create_ddict.argtypes = sz, [ctypes.c_char_p, sz]
        self.free_ddict = lib.ZSTD_freeDDict
        self.free_ddict.restype, self.free_ddict.argtypes = sz, [sz]
        self.create_cdict = lib.ZSTD_createCDict  # (dict, dictSize, level) -> ZSTD_CDict*, copies
        self.create_cdict.restype, self.create_cdict.argtypes = sz, [ctypes.c_char_p, sz, ctypes.c_int]
        self.free_cdict = lib.ZSTD_freeCDict
        self.free_cdict.restype, self.free_cdict.argtypes = sz, [sz]
        self.sizeof_ddict = lib.ZSTD_sizeof_DDict
        self.sizeof_ddict.restype, self.sizeof_ddict.argtypes = sz, [sz]
        self.sizeof_cdict = lib.ZSTD_sizeof_CDict
        self.sizeof_cdict.restype, self.sizeof_cdict.argtypes = sz, [sz]

        # Not cached on disk: the libzstd function address differs from process to process.
        @njit(nogil=True)
        def decode_at(dctx, addresses, lengths, destinations, meta, ddict, cap, start, stop, status):
            # Payload t at the absolute address addresses[t] (its arena chunk's address + offset),
            # decoded to the absolute address destinations[t] (an output row of cap bytes); with
            # the digested dictionary ddict when meta[t] is 1.
            for t in range(start, stop):
                if meta[t] == 0:
                    status[t] = dec(dctx, destinations[t], cap, addresses[t], lengths[t])
                else:
                    status[t] = dec_dict(dctx, destinations[t], cap, addresses[t], lengths[t], ddict)

        @njit(nogil=True)
        def encode(cctx, rows, dst, offsets, capacity, level, cdict, start, stop, status):
            # cdict: a digested dictionary (its level fixed when it was built) or 0 for none.
            src = rows.ctypes.data
            out = dst.ctypes.data
            stride = rows.strides[0]
            n = rows.shape[1]
            for i in range(start, stop):
                if cdict == 0:
                    status[i] = comp(cctx, out + offsets[i], capacity, src + i * stride, n, level)
                else:
                    status[i] = comp_dict(cctx, out + offsets[i], capacity, src + i * stride, n, cdict)

        @njit(nogil=True)
        def pack(src, src_offsets, lengths, dst, dst_offsets):
            for i in range(src_offsets.shape[0]):
                dst[dst_offsets[i] : dst_offsets[i] + lengths[i]] = src[src_offsets[i] : src_offsets[i] + lengths[i]]

        self.decode_at, self.encode, self.pack = decode_at, encode, pack
        self._local = threading.local()

    def _context(self, slot: str, create, free, what: str) -> int:
        """This thread's context in ``self._local.<slot>`` (created on first use, reused afterwards)."""
        h = getattr(self._local, slot, None)
        if h is None:
            ptr = create()
            if not ptr:
                raise MemoryError(f"{what} failed")
            h = _Handle(ptr, free)
            setattr(self._local, slot, h)
        return h.ptr

    def dctx(self) -> int:
        """This thread's decompression context (created on first use, reused afterwards)."""
        return self._context("d", self.create, self.free, "ZSTD_createDCtx")

    def cctx(self) -> int:
        """This thread's compression context (created on first use, reused afterwards)."""
        return self._context("c", self.create_c, self.free_c, "ZSTD_createCCtx")


_ADDRESS_ERRORS = {
    1: "payload index out of range (a payload lies outside its chunk; entry {t})",
    2: "output index out of range for {n} outputs (entry {t})",
    3: "row index out of range for its output (entry {t})",
}


def _addresses(chunk_base, chunk_size, chunk_ids, offsets, lengths, outs, nbytes, out_ids, rows,
               addresses, destinations, err):
    """Check entry ``t``'s payload range, output and row, and compute where it is read from and
    decoded to; stop at the first bad entry (``err = [kind, t]``, kinds of ``_ADDRESS_ERRORS``)."""
    for t in range(chunk_ids.shape[0]):
        c, o, n = chunk_ids[t], offsets[t], lengths[t]
        if c < 0 or c >= chunk_base.shape[0] or o < 0 or n < 0 or o + n > chunk_size[c]:
            err[0], err[1] = 1, t
            return
        j, r = out_ids[t], rows[t]
        if j < 0 or j >= len(outs):
            err[0], err[1] = 2, t
            return
        if r < 0 or r >= outs[j].shape[0]:
            err[0], err[1] = 3, t
            return
        addresses[t] = chunk_base[c] + o
        destinations[t] = outs[j].ctypes.data + r * nbytes


class _Handle:
    """Owns one ``ZSTD_DCtx``; freed with the thread-local that holds it."""

    __slots__ = ("ptr", "_free")

    def __init__(self, ptr: int, free):
        self.ptr, self._free = ptr, free

    def __del__(self):
        try:
            self._free(self.ptr)
        except Exception:  # interpreter shutdown
            pass


class ZstdDictionary:
    """A zstd dictionary built from a store's first entries, and its digested forms.

    Why: a zstd frame of one small entry (an 84x84 Atari frame, 7 KB) pays for its own entropy
    tables and finds no earlier data to match; with a dictionary made for similar entries it
    does neither (numbers in :meth:`train`). Frames written with a dictionary carry its (random) id
    (zstd's frame header), so decoding with another dictionary fails instead of returning wrong
    bytes. Thread-safe; the digested forms (``ZSTD_CDict`` for ``level``, ``ZSTD_DDict``) are
    built on first use and freed with it.

    Args:
      data: the dictionary bytes (from :meth:`train` or saved earlier).
      level: compression level of the frames encoded with it.
    """

    def __init__(self, data: bytes, level: int):
        self.data = bytes(data)
        self.level = int(level)
        self._lock = threading.Lock()
        self._cdict = self._ddict = None  # native handles (_Handle), built on first use
        self._local = threading.local()  # python engine: this thread's (de)compressor

    @classmethod
    def train(cls, samples, size: int, level: int) -> "ZstdDictionary | None":
        """A dictionary of at most ``size`` content bytes for entries like ``samples`` (a sequence
        of 1-D uint8 arrays, or a 2-D array: one entry per row); ``None`` if zstd refuses them
        (e.g. entries of mixed sizes that are too few or too small for its trainer).

        Entries of one size (a store's entries of one dtype and shape, e.g. frames): the content
        is their **bytewise mode** (at each byte position the most frequent value over the
        samples: the static part of a frame, background and walls), at most its first ``size``
        bytes, and libzstd's ``ZDICT_finalizeDictionary`` adds entropy tables fitted to the
        samples and a random 31-bit dictionary id (so two dictionaries almost never share one). An entry then matches the content at one constant offset
        for most of its length, which decodes almost as a copy. Measured on 84x84 Atari frames
        (level -1, python engine, 1,024 training frames): Breakout 111 B and 0.53 us per frame
        (zstd's own trainer, 16 KiB: 126 B, 0.71 us; no dictionary: 332 B, 1.6 us), Pong 97 B,
        0.60 us (trainer 138 B, 0.99 us; none 180 B, 1.0 us). Entries of mixed sizes, or no
        libzstd to call: zstd's trainer (``zstandard.train_dictionary``).
        """
        zstandard = _zstandard()
        rows = [np.ascontiguousarray(r, dtype=np.uint8).reshape(-1) for r in samples]
        if rows and len({r.shape[0] for r in rows}) == 1 and rows[0].shape[0]:
            data = _finalize(np.stack(rows), int(size), level)
            if data is not None:
                return cls(data, level)
        try:
            d = zstandard.train_dictionary(int(size), [r.tobytes() for r in rows])
        except zstandard.ZstdError:
            return None
        return cls(d.as_bytes(), level)

    @property
    def nbytes(self) -> int:
        """The dictionary bytes plus its digested forms built so far (native engine)."""
        nat = _native()
        n = len(self.data)
        if nat is not None:
            n += sum(int(f(h.ptr)) for h, f in ((self._cdict, nat.sizeof_cdict), (self._ddict, nat.sizeof_ddict)) if h)
        return n

    def _digested(self, slot: str, build, free) -> int:
        h = getattr(self, slot)
        if h is None:
            with self._lock:
                h = getattr(self, slot)
                if h is None:
                    ptr = build()
                    if not ptr:
                        raise MemoryError("building a zstd dictionary failed")
                    h = _Handle(ptr, free)
                    setattr(self, slot, h)
        return h.ptr

    def digest(self) -> None:
        """Build both digested forms now (native engine; the python engine builds its own per
        thread), so their memory is counted in :attr:`nbytes` from the start."""
        nat = _native()
        if nat is not None:
            self.cdict(nat)
            self.ddict(nat)

    def cdict(self, nat: "_Native") -> int:
        """Address of the ``ZSTD_CDict`` (native engine)."""
        return self._digested("_cdict", lambda: nat.create_cdict(self.data, len(self.data), self.level), nat.free_cdict)

    def ddict(self, nat: "_Native") -> int:
        """Address of the ``ZSTD_DDict`` (native engine)."""
        return self._digested("_ddict", lambda: nat.create_ddict(self.data, len(self.data)), nat.free_ddict)

    def compressor(self):
        """This thread's ``zstandard.ZstdCompressor`` with the dictionary (python engine)."""
        c = getattr(self._local, "c", None)
        if c is None:
            zstandard = _zstandard()
            d = zstandard.ZstdCompressionDict(self.data)
            c = self._local.c = zstandard.ZstdCompressor(level=self.level, dict_data=d, write_content_size=True)
        return c

    def decompressor(self):
        """This thread's ``zstandard.ZstdDecompressor`` with the dictionary (python engine)."""
        d = getattr(self._local, "d", None)
        if d is None:
            zstandard = _zstandard()
            d = self._local.d = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(self.data))
        return d


class _ZdictParams(ctypes.Structure):
    _fields_ = [("compressionLevel", ctypes.c_int), ("notificationLevel", ctypes.c_uint), ("dictID", ctypes.c_uint)]


def _finalize(rows: np.ndarray, size: int, level: int) -> bytes | None:
    """``ZDICT_finalizeDictionary`` over the bytewise mode of ``rows`` (uint8 [n, L]) with a random
    dictionary id: the dictionary bytes, or None when libzstd is not loadable or refuses."""
    found = _load_libzstd()
    if found is None:
        return None
    lib = found[0]
    if not hasattr(lib, "ZDICT_finalizeDictionary") or not hasattr(lib, "ZDICT_isError"):
        return None
    n, width = rows.shape
    head = rows[:, :size]  # the content is the mode of the first ``size`` bytes
    mode = np.empty(head.shape[1], np.uint8)
    block = 1 << 14  # columns per pass: the counts stay at 16 MiB whatever ``size`` is
    for a in range(0, head.shape[1], block):
        cols = head[:, a : a + block]
        counts = np.zeros((256, cols.shape[1]), np.int32)
        idx = np.arange(cols.shape[1])
        for r in cols:  # columns are distinct within a row: a plain fancy-index increment is exact
            counts[r, idx] += 1
        mode[a : a + cols.shape[1]] = counts.argmax(axis=0)
    content = mode.tobytes()
    fn = lib.ZDICT_finalizeDictionary
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_uint, _ZdictParams]
    lib.ZDICT_isError.restype, lib.ZDICT_isError.argtypes = ctypes.c_uint, [ctypes.c_size_t]
    samples = np.ascontiguousarray(rows)
    sizes = np.full(n, width, np.uint64)  # size_t[n]
    dst = ctypes.create_string_buffer(len(content) + (1 << 14))
    # The level only shapes the entropy statistics; ZDICT wants a regular (positive) one.
    # A random id (4 bytes in each frame header, above zstd's reserved range), not the default
    # hash of the content: two dictionaries with the same mode but other tables must differ.
    dict_id = 65536 + secrets.randbelow((1 << 31) - 65536)
    got = fn(dst, len(dst), content, len(content), samples.ctypes.data, sizes.ctypes.data, n,
             _ZdictParams(max(int(level), 1), 0, dict_id))
    if lib.ZDICT_isError(got):
        return None
    return dst.raw[:got]


def _load_libzstd():
    """(CDLL, description) of a libzstd exporting the C API, or None."""
    try:
        import zstandard
    except ImportError:
        return None
    candidates = sorted(glob.glob(os.path.join(os.path.dirname(zstandard.__file__), "_cffi*.so")))
    sys_lib = ctypes.util.find_library("zstd")
    if sys_lib:
        candidates.append(sys_lib)
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
            lib.ZSTD_decompressDCtx, lib.ZSTD_createDCtx, lib.ZSTD_freeDCtx  # noqa: B018
            lib.ZSTD_isError, lib.ZSTD_getErrorName  # noqa: B018
            lib.ZSTD_compressCCtx, lib.ZSTD_createCCtx, lib.ZSTD_freeCCtx, lib.ZSTD_compressBound  # noqa: B018
            lib.ZSTD_decompress_usingDDict, lib.ZSTD_compress_usingCDict  # noqa: B018
            lib.ZSTD_createDDict, lib.ZSTD_freeDDict, lib.ZSTD_createCDict, lib.ZSTD_freeCDict  # noqa: B018
            lib.ZSTD_sizeof_DDict, lib.ZSTD_sizeof_CDict  # noqa: B018
        except (OSError, AttributeError):
            continue
        return lib, path
    return None


def _native():
    """The native engine, or None when numba or an exported libzstd is missing (or disabled)."""
    global _NATIVE
    if _NATIVE is None:
        with _NATIVE_LOCK:
            if _NATIVE is None:
                engine = os.environ.get("HOST_CODECS_ZSTD_ENGINE", "native")
                found = _load_libzstd() if engine != "python" else None
                if found is None:
                    _NATIVE = False
                else:
                    try:
                        _NATIVE = _Native(*found)
                    except ImportError:  # numba missing
                        _NATIVE = False
    return _NATIVE or None


class ZstdCodec(Codec):
    """Zstandard codec (tag 3). Levels 1-22 and the fast levels -7..-1 (``"zstd:-1"``), default 3.

    Args:
      level: compression level (1-22, or -7..-1: larger frames, faster decode).
      engine: ``"auto"`` (native when available, see the module docstring), ``"native"`` (raise
        ImportError when unavailable) or ``"python"``. Both engines write standard zstd frames
        and decode any zstd frame to the same bytes.

    Raises:
      ImportError: naming the ``codecs`` extra when ``zstandard`` is not installed; ``engine=
        "native"`` without numba or an exported libzstd.
      ValueError: a bad level or engine.
    """

    name = "zstd"
    tag = 3
    levels = tuple(range(-7, 0)) + tuple(range(1, 23))
    default_level = 3

    def __init__(self, level: int | None = None, engine: str = "auto"):
        super().__init__(level)
        if engine not in ("auto", "native", "python"):
            raise ValueError(f"engine: expected 'auto', 'native' or 'python', got {engine!r}")
        self._zstd = _zstandard()
        self._local = threading.local()
        self._native = None if engine == "python" else _native()
        if engine == "native" and self._native is None:
            raise ImportError(
                "ZstdCodec(engine='native') needs numba and a libzstd exporting its C API "
                "(the zstandard package's cffi extension or a system libzstd); none was found"
            )
        self.engine = "native" if self._native is not None else "python"

    def _compressor(self):
        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = self._zstd.ZstdCompressor(level=self.level, write_content_size=True)
        return c

    def _decompressor(self):
        d = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = self._zstd.ZstdDecompressor()
        return d

    def encode_batch(self, rows: np.ndarray, dtype: np.dtype, dictionary: ZstdDictionary | None = None) -> EncodedBatch:
        """:meth:`Codec.encode_batch`; with ``dictionary``, every entry is encoded with it (at the
        dictionary's level) and gets meta byte 1, which tells decoders to use the dictionary
        (:class:`ZstdDictionary`; a :class:`~host_codecs.CompressedStore` builds and passes its
        own)."""
        if self._native is not None and rows.shape[0] and rows.shape[1] and rows.flags.c_contiguous:
            enc = self._encode_native(rows, dictionary)
        else:
            enc = self._encode_python(rows, dictionary)
        if dictionary is not None:
            enc.meta[:] = 1
        return enc

    def _encode_native(self, rows: np.ndarray, dictionary: ZstdDictionary | None) -> EncodedBatch:
        nat = self._native
        b, n = rows.shape
        cap = ceil_align(int(nat.bound(n)))
        scratch = np.empty(b * cap, np.uint8)  # entry i compressed at i * cap, then packed
        offsets = np.arange(b, dtype=np.int64) * cap
        status = np.zeros(b, np.uint64)
        level = int(self.level)
        cdict = 0 if dictionary is None else dictionary.cdict(nat)

        def work(start: int, stop: int) -> None:
            nat.encode(nat.cctx(), rows, scratch, offsets, cap, level, cdict, start, stop, status)

        parallel_for(b, work, work_bytes=rows.nbytes)
        lengths = status.astype(np.int64)
        bad = np.flatnonzero(lengths > cap)  # error codes are huge size_t values
        if bad.size:
            raise ValueError(f"codec 'zstd': compression failed: {nat.error_name(int(status[bad[0]])).decode()}")
        padded = ceil_align(lengths)
        packed = np.zeros(b, np.int64)
        if b > 1:
            np.cumsum(padded[:-1], out=packed[1:])
        buffer = np.empty(int(padded.sum()), np.uint8)
        nat.pack(scratch, offsets, lengths, buffer, packed)
        return EncodedBatch(buffer, packed, lengths, np.zeros(b, np.uint8))

    def _encode_python(self, rows: np.ndarray, dictionary: ZstdDictionary | None) -> EncodedBatch:
        payloads: list[bytes] = [b""] * rows.shape[0]

        def work(start: int, stop: int) -> None:
            c = self._compressor() if dictionary is None else dictionary.compressor()
            for i in range(start, stop):
                payloads[i] = c.compress(rows[i])

        parallel_for(rows.shape[0], work, work_bytes=rows.nbytes)
        return pack_payloads(payloads)

    def decode_into(self, chunk, offsets, lengths, meta, out, rows, dtype) -> None:
        zeros = np.zeros(len(rows), np.int64)
        self.decode_many(ChunkTable({0: chunk}), zeros, offsets, lengths, meta, [out], zeros, rows, dtype)

    def decode_scattered(self, chunks, chunk_ids, offsets, lengths, meta, out, rows, dtype) -> None:
        """Native engine: every payload is decoded where it lies (no staging copy of the
        compressed bytes, which cost ~12% of a batch-256 read of 84x84 frames)."""
        self.decode_many(chunks, chunk_ids, offsets, lengths, meta, [out], np.zeros(len(rows), np.int64), rows, dtype)

    def decode_many(self, chunks, chunk_ids, offsets, lengths, meta, outs, out_ids, rows, dtype) -> None:
        """Native engine: one kernel call for every payload, each read where it lies and decoded
        straight into its output row, whichever output that is. Entries with meta byte 1 were
        encoded with a dictionary: ``chunks`` must then be a :class:`~host_codecs._base.ChunkTable`
        carrying it (a store passes its own); ValueError otherwise."""
        table = chunks if isinstance(chunks, ChunkTable) else ChunkTable(chunks)
        meta = np.asarray(meta)
        top = int(meta.max()) if meta.size else 0
        if top > 1:
            raise ValueError(f"codec 'zstd': unknown entry format (meta byte {top}; expected 0, or 1 for a dictionary)")
        dictionary = table.dictionary if top else None
        if top and dictionary is None:
            raise ValueError("codec 'zstd': an entry was encoded with a dictionary, and none was given to decode it")
        if self._native is None or not all(o.shape[1] and o.flags.c_contiguous for o in outs):
            return self._decode_python(table, chunk_ids, offsets, lengths, meta, outs, out_ids, rows, dictionary)
        ddict = 0 if dictionary is None else dictionary.ddict(self._native)
        self._decode_native_at(table.base, table.size, chunk_ids, offsets, lengths, outs, out_ids, rows, meta, ddict)

    def _decode_native_at(self, chunk_base, chunk_size, chunk_ids, offsets, lengths, outs, out_ids, rows, meta, ddict) -> None:
        """Decode payload ``t`` (``lengths[t]`` bytes at ``offsets[t]`` in chunk ``chunk_ids[t]``,
        which starts at address ``chunk_base[c]`` and holds ``chunk_size[c]`` bytes) into row
        ``rows[t]`` of ``outs[out_ids[t]]`` (2-D uint8, C-contiguous, one row size), with the
        digested dictionary ``ddict`` where ``meta[t]`` is 1 (meta checked by the caller), on the
        thread pool; then check every entry's decoded size. The kernel reads and writes through raw addresses, so every payload range,
        output index and row is checked first, in one compiled pass that also computes the
        addresses (the numpy checks it replaces cost ~45 us of a 160-frame read)."""
        nat = self._native
        nbytes = outs[0].shape[1]
        if any(o.shape[1] != nbytes for o in outs):
            raise ValueError("codec 'zstd': outputs with different row sizes")
        for o in outs:
            if not o.flags.writeable:
                raise ValueError(f"codec {self.name!r}: the output array is read-only")
        k = len(rows)
        addresses = np.empty(k, dtype=np.int64)
        destinations = np.empty(k, dtype=np.int64)
        err = np.zeros(2, dtype=np.int64)
        _kernel(_addresses, _addresses)(
            chunk_base, chunk_size, np.ascontiguousarray(chunk_ids, dtype=np.int64),
            np.ascontiguousarray(offsets, dtype=np.int64), np.ascontiguousarray(lengths, dtype=np.int64),
            tuple(outs), nbytes, np.ascontiguousarray(out_ids, dtype=np.int64), np.ascontiguousarray(rows, dtype=np.int64),
            addresses, destinations, err,
        )
        if err[0]:
            raise ValueError(f"codec {self.name!r}: " + _ADDRESS_ERRORS[int(err[0])].format(n=len(outs), t=int(err[1])))
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        meta = np.ascontiguousarray(meta, dtype=np.uint8)
        status = np.zeros(k, dtype=np.uint64)
        parallel_for(
            k,
            lambda a, b: nat.decode_at(nat.dctx(), addresses, lengths, destinations, meta, ddict, nbytes, a, b, status),
            work_bytes=k * nbytes,
        )
        bad = np.flatnonzero(status != nbytes)
        if bad.size:
            code = int(status[bad[0]])
            why = nat.error_name(code).decode() if nat.is_error(code) else f"decoded {code} bytes, expected {nbytes}"
            raise ValueError(f"codec 'zstd': corrupt entry: {why}")

    def _decode_python(self, table, chunk_ids, offsets, lengths, meta, outs, out_ids, rows, dictionary) -> None:
        ids = np.asarray(chunk_ids, dtype=np.int64)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= table.size.shape[0]):
            raise ValueError(f"codec {self.name!r}: payload index out of range (no such chunk)")
        check_ranges(self.name, table.size[ids], offsets, lengths)
        out_ids = np.asarray(out_ids, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.int64)
        check_out_ids(self.name, out_ids, len(outs))
        for j, o in enumerate(outs):
            check_rows(self.name, o, rows[out_ids == j])
        nbytes = outs[0].shape[1]
        if any(o.shape[1] != nbytes for o in outs):
            raise ValueError("codec 'zstd': outputs with different row sizes")
        cids, offs, lens = ids.tolist(), np.asarray(offsets).tolist(), np.asarray(lengths).tolist()
        mts, oids, rws = meta.tolist(), out_ids.tolist(), rows.tolist()
        errors: list[str] = []
        zerr = self._zstd.ZstdError

        def work(start: int, stop: int) -> None:
            plain = self._decompressor()
            with_dict = dictionary.decompressor() if dictionary is not None else None
            for t in range(start, stop):
                o = offs[t]
                try:
                    d = with_dict if mts[t] else plain
                    data = d.decompress(table[cids[t]][o : o + lens[t]], max_output_size=nbytes)
                except zerr as exc:
                    errors.append(str(exc))
                    return
                if len(data) != nbytes:
                    errors.append(f"decoded {len(data)} bytes, expected {nbytes}")
                    return
                outs[oids[t]][rws[t]] = np.frombuffer(data, dtype=np.uint8)

        parallel_for(len(rws), work, work_bytes=len(rws) * nbytes)
        if errors:
            raise ValueError(f"codec 'zstd': corrupt entry: {errors[0]}")
