"""`zstd`: checksummed Zstandard frames through the optional `zstandard` package, optionally with a store-built
`ZstdDictionary` (`docs/api/host_codecs.md`, "zstd frames and dictionaries").
"""

from __future__ import annotations

import threading

import numpy as np

from ._base import ChunkTable, Codec, EncodedBatch, decode_each, import_extra, pack_payloads
from ._pool import parallel_for

__all__ = ["ZstdCodec", "ZstdDictionary"]


def _zstandard():
    return import_extra("zstd", "zstandard", "zstandard")


def _coders(local: threading.local, level: int, dictionary: "ZstdDictionary | None" = None):
    """This thread's `(ZstdCompressor, ZstdDecompressor)`, with `dictionary` when given, made once per `local`."""
    coders = getattr(local, "coders", None)
    if coders is None:
        z = _zstandard()
        d = None if dictionary is None else z.ZstdCompressionDict(dictionary.data, dict_type=z.DICT_TYPE_FULLDICT)
        comp = z.ZstdCompressor(level=level, dict_data=d, write_checksum=True, write_content_size=True,
                                write_dict_id=False)
        coders = local.coders = (comp, z.ZstdDecompressor(dict_data=d))
    return coders


class ZstdDictionary:
    """A zstd dictionary trained on a store's first entries by zstd's own trainer (`docs/api/host_codecs.md`, "zstd
    frames and dictionaries"). Thread-safe. Frames encoded with it carry no dictionary id (meta byte 1).

    Args:
      data: the dictionary bytes (from `train`, or saved earlier).
      level: compression level of the frames encoded with it.
    """

    #: Meta byte of the entries encoded with a dictionary.
    meta = 1

    def __init__(self, data: bytes, level: int):
        self.data = bytes(data)
        self.level = int(level)
        self._local = threading.local()

    @classmethod
    def train(cls, samples, size: int, level: int) -> "ZstdDictionary | None":
        """Build a dictionary of at most `size` bytes for entries like `samples`: `zstandard.train_dictionary`
        (fastCover) with segments as long as the longest sample (at most `size`), both dmer sizes (6 and 8) tried
        on all the samples, entropy tables for `level`.

        Args:
          samples: 1-D uint8 arrays, or a 2-D uint8 array (one entry per row).
          size: most bytes of the dictionary.
          level: compression level of the frames encoded with it.

        Returns:
          The dictionary, or None for no samples or `size` < 1.

        Raises:
          ValueError: the trainer refused the samples (fewer than 5, too few bytes, `size` under
            256); the message gives their count, their bytes and the trainer's reason.
        """
        rows = [np.ascontiguousarray(r, dtype=np.uint8).reshape(-1) for r in samples]
        size = int(size)
        if not rows or size < 1:
            return None
        z = _zstandard()
        longest = max(r.shape[0] for r in rows)
        try:
            d = z.train_dictionary(
                size, [r.tobytes() for r in rows], k=max(8, min(longest, size)), split_point=1.0,
                level=int(level), threads=1,  # a trainer thread's malloc arena kept ~11 MB of the process's memory
            )
        except z.ZstdError as exc:
            raise ValueError(f"zstd's trainer refused {len(rows)} samples of {sum(r.shape[0] for r in rows)} bytes "
                             f"for a dictionary of at most {size} bytes ({exc})") from exc
        return cls(d.as_bytes(), level)

    @property
    def nbytes(self) -> int:
        """Bytes of the dictionary (not the copies zstandard digests per thread, which Python cannot see)."""
        return len(self.data)

    def coders(self):
        """This thread's `(ZstdCompressor, ZstdDecompressor)` with this dictionary."""
        return _coders(self._local, self.level, self)


class ZstdCodec(Codec):
    """Zstandard codec (tag 3).

    Args:
      level: 1-22, or zstd's fast levels -7..-1 (`"zstd:-1"`: larger frames, faster decode); default 3.

    Raises:
      ImportError: naming the `codecs` extra when `zstandard` is not installed.
      ValueError: a bad level.
    """

    name = "zstd"
    tag = 3
    levels = tuple(range(-7, 0)) + tuple(range(1, 23))
    default_level = 3

    def __init__(self, level: int | None = None):
        super().__init__(level)
        self._z = _zstandard()
        self._local = threading.local()

    def encode_batch(self, rows: np.ndarray, dtype: np.dtype, dictionary: ZstdDictionary | None = None) -> EncodedBatch:
        """`Codec.encode_batch`; with `dictionary`, every entry is encoded with it (at its level), meta byte 1."""
        payloads: list[bytes] = [b""] * rows.shape[0]

        def work(start: int, stop: int) -> None:
            comp = (_coders(self._local, self.level) if dictionary is None else dictionary.coders())[0]
            for i in range(start, stop):
                payloads[i] = comp.compress(rows[i])

        parallel_for(rows.shape[0], work, work_bytes=rows.nbytes)
        return pack_payloads(payloads, np.full(rows.shape[0], 0 if dictionary is None else dictionary.meta, np.uint8))

    def decode_many(self, chunks, chunk_ids, offsets, lengths, meta, outs, out_ids, rows, dtype, bases=None) -> None:
        """`Codec.decode_many`, every payload read where it lies (a delta XORed with its base as it is decoded).
        Entries with meta byte 1 were encoded with a dictionary: `chunks` must be a `ChunkTable` carrying it.

        Raises:
          ValueError: an unknown meta byte, a dictionary entry without a dictionary, a corrupt payload (bad frame,
            wrong content size or checksum, another dictionary), or as `check_decode`.
        """
        meta = np.asarray(meta)
        top = int(meta.max(initial=0))
        if top > 1:
            raise ValueError(f"codec 'zstd': unknown entry format (meta byte {top}; expected 0 or 1)")
        dictionary = chunks.dictionary if isinstance(chunks, ChunkTable) else None
        if top and dictionary is None:
            raise ValueError("codec 'zstd': an entry was encoded with a dictionary, and none was given to decode it")
        nbytes = outs[0].shape[1] if len(outs) else 0
        mts = meta.tolist()

        def inflater():
            plain = _coders(self._local, self.level)[1]
            with_dict = dictionary.coders()[1] if dictionary is not None else None
            size_of, error = self._z.frame_content_size, self._z.ZstdError

            def inflate(src, t: int) -> bytes:
                try:
                    size = size_of(src)
                    if size != nbytes:  # checked first: a corrupt header must not size an allocation
                        raise ValueError(f"the frame declares {size} bytes, expected {nbytes}")
                    return (with_dict if mts[t] else plain).decompress(src)
                except error as exc:
                    raise ValueError(str(exc)) from exc

            return inflate

        decode_each(self.name, chunks, chunk_ids, offsets, lengths, outs, out_ids, rows, bases, inflater)
