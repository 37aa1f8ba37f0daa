"""``zstd``: Zstandard frames via the optional ``zstandard`` package.

Compressor/decompressor objects are not thread-safe, so each worker thread keeps its own
(``threading.local``). The ``bytes`` objects zstandard returns keep much more memory allocated
than their length (NOTES.md: ~28 KB each); the store copies every payload into its arena and
drops them, so none survives an encode.

Levels 1-22 (default 3) and zstd's "fast" levels -7..-1: a negative level stores literals
without Huffman coding, so a frame is a little larger but decodes ~1.7x faster (84x84 Breakout
frames: level -1 344 B / 1.8 us per frame, level 1 306 B / 3.0 us, level 3 296 B / 3.2 us on the
2-core CPU of docs/benchmarks.md). Decoding is the same for every level.
"""

from __future__ import annotations

import threading

import numpy as np

from ._base import Codec, EncodedBatch, missing_extra, pack_payloads, parallel_for

__all__ = ["ZstdCodec"]


def _zstandard():
    try:
        import zstandard
    except ImportError as exc:
        raise missing_extra("zstd", "zstandard", exc) from exc
    return zstandard


class ZstdCodec(Codec):
    """Zstandard codec (tag 3). Levels 1-22 and the fast levels -7..-1 (``"zstd:-1"``), default 3.

    Raises:
      ImportError: naming the ``codecs`` extra when ``zstandard`` is not installed.
    """

    name = "zstd"
    tag = 3
    levels = tuple(range(-7, 0)) + tuple(range(1, 23))
    default_level = 3

    def __init__(self, level: int | None = None):
        super().__init__(level)
        self._zstd = _zstandard()
        self._local = threading.local()

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

    def encode_batch(self, rows: np.ndarray, dtype: np.dtype) -> EncodedBatch:
        payloads: list[bytes] = [b""] * rows.shape[0]

        def work(start: int, stop: int) -> None:
            c = self._compressor()
            for i in range(start, stop):
                payloads[i] = c.compress(rows[i])

        parallel_for(rows.shape[0], work, work_bytes=rows.nbytes)
        return pack_payloads(payloads)

    def decode_into(self, chunk, offsets, lengths, meta, out, rows, dtype) -> None:
        nbytes = out.shape[1]
        offs, lens, rws = offsets.tolist(), lengths.tolist(), rows.tolist()
        errors: list[str] = []
        zerr = self._zstd.ZstdError

        def work(start: int, stop: int) -> None:
            d = self._decompressor()
            for t in range(start, stop):
                o = offs[t]
                try:
                    data = d.decompress(chunk[o : o + lens[t]], max_output_size=nbytes)
                except zerr as exc:
                    errors.append(str(exc))
                    return
                if len(data) != nbytes:
                    errors.append(f"decoded {len(data)} bytes, expected {nbytes}")
                    return
                out[rws[t]] = np.frombuffer(data, dtype=np.uint8)

        parallel_for(len(rws), work, work_bytes=len(rws) * nbytes)
        if errors:
            raise ValueError(f"codec 'zstd': corrupt entry: {errors[0]}")
