"""`zstd`: Zstandard frames through the optional `zstandard` package.

Every frame records its content size and a content checksum, so a corrupt payload, or one decoded with the wrong
dictionary, raises instead of reading back wrong bytes; any zstd decoder reads the frames. Levels 1-22 (default 3)
and zstd's fast levels -7..-1, which store literals without Huffman coding: a frame is a little larger and decodes
faster. Decoding is the same for every level.

A batch is split over the thread pool (`host_codecs.parallel_for`), every thread with its own compressor and
decompressor objects (they are not safe to share between threads); zstandard releases the GIL while it works.

Dictionaries (`ZstdDictionary`): a `host_codecs.CompressedStore` created with `dictionary_bytes` builds one from its
first entries and encodes its default codec's later entries with it (meta byte 1). Small similar entries such as
84x84 Atari frames then skip most of their per-frame cost and decode faster (`docs/benchmarks.md` has the numbers).
"""

from __future__ import annotations

import threading

import numpy as np

from ._base import ChunkTable, Codec, EncodedBatch, check_decode, import_extra, pack_payloads
from ._pool import parallel_for

__all__ = ["ZstdCodec", "ZstdDictionary"]


def _zstandard():
    return import_extra("zstd", "zstandard", "zstandard")


def _coders(local: threading.local, level: int, data: bytes | None):
    """This thread's `(ZstdCompressor, ZstdDecompressor)` kept in `local`, with the raw-content
    dictionary `data` when given (created on first use, reused afterwards)."""
    coders = getattr(local, "coders", None)
    if coders is None:
        z = _zstandard()
        d = None if data is None else z.ZstdCompressionDict(data, dict_type=z.DICT_TYPE_RAWCONTENT)
        coders = local.coders = (
            z.ZstdCompressor(level=level, dict_data=d, write_checksum=True, write_content_size=True),
            z.ZstdDecompressor(dict_data=d),
        )
    return coders


class ZstdDictionary:
    """A raw-content zstd dictionary built from a store's first entries.

    A zstd frame of one small entry (an 84x84 frame, 7 KB) finds no earlier data to match; with
    a dictionary made of what similar entries share, most of the entry is one long match. The
    dictionary has no id in the frame header: a frame decoded with another dictionary (or none)
    fails its content checksum and raises. Thread-safe.

    Args:
      data: the dictionary content (from `train`, or saved earlier).
      level: compression level of the frames encoded with it.
    """

    def __init__(self, data: bytes, level: int):
        self.data = bytes(data)
        self.level = int(level)
        self._local = threading.local()

    @classmethod
    def train(cls, samples, size: int, level: int) -> "ZstdDictionary | None":
        """Build a dictionary of at most `size` bytes for entries like `samples`.

        The content is the bytewise mode of the samples: at each byte position the most frequent
        value (the static part of a frame: background, walls), at most the first `size` bytes. An entry then matches
        the content at one constant offset for most of its length, which decodes almost as a copy.

        Args:
          samples: 1-D uint8 arrays of one length, or a 2-D uint8 array (one entry per row).
          size: most bytes of content.
          level: compression level of the frames encoded with it.

        Returns:
          The dictionary, or None when the samples are empty, of length 0 or of mixed lengths.
        """
        rows = [np.ascontiguousarray(r, dtype=np.uint8).reshape(-1) for r in samples]
        if not rows or len({r.shape[0] for r in rows}) != 1 or not rows[0].shape[0] or size < 1:
            return None
        head = np.stack(rows)[:, : int(size)]
        mode = np.empty(head.shape[1], np.uint8)
        block = 1 << 14  # columns per pass: the counts stay at 16 MiB whatever `size` is
        for a in range(0, head.shape[1], block):
            cols = head[:, a : a + block]
            counts = np.zeros((256, cols.shape[1]), np.int32)
            idx = np.arange(cols.shape[1])
            for r in cols:  # columns are distinct within a row: a fancy-index increment is exact
                counts[r, idx] += 1
            mode[a : a + cols.shape[1]] = counts.argmax(axis=0)
        return cls(mode.tobytes(), level)

    @property
    def nbytes(self) -> int:
        """Bytes of the dictionary content (the copies zstandard digests per thread are not
        visible from Python and not counted)."""
        return len(self.data)

    def coders(self):
        """This thread's `(ZstdCompressor, ZstdDecompressor)` with this dictionary."""
        return _coders(self._local, self.level, self.data)


class ZstdCodec(Codec):
    """Zstandard codec (tag 3). Levels 1-22 and the fast levels -7..-1 (`"zstd:-1"`), default 3.

    Args:
      level: compression level (1-22, or -7..-1: larger frames, faster decode).

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
        """`Codec.encode_batch`; with `dictionary`, every entry is encoded with it (at the
        dictionary's level) and gets meta byte 1, which tells decoders to use it."""
        payloads: list[bytes] = [b""] * rows.shape[0]

        def work(start: int, stop: int) -> None:
            comp = (_coders(self._local, self.level, None) if dictionary is None else dictionary.coders())[0]
            for i in range(start, stop):
                payloads[i] = comp.compress(rows[i])

        parallel_for(rows.shape[0], work, work_bytes=rows.nbytes)
        return pack_payloads(payloads, np.full(rows.shape[0], dictionary is not None, np.uint8))

    def decode_many(self, chunks, chunk_ids, offsets, lengths, meta, outs, out_ids, rows, dtype) -> None:
        """`Codec.decode_many`, every payload read where it lies. Entries with meta byte 1 were
        encoded with a dictionary: `chunks` must then be a `ChunkTable` carrying it (a store
        passes its own).

        Raises:
          ValueError: an unknown meta byte, a dictionary entry without a dictionary, a corrupt
            payload (bad frame, wrong content size or checksum), or as `check_decode`.
        """
        meta = np.asarray(meta)
        top = int(meta.max(initial=0))
        if top > 1:
            raise ValueError(f"codec 'zstd': unknown entry format (meta byte {top}; expected 0, or 1 for a dictionary)")
        dictionary = chunks.dictionary if isinstance(chunks, ChunkTable) else None
        if top and dictionary is None:
            raise ValueError("codec 'zstd': an entry was encoded with a dictionary, and none was given to decode it")
        check_decode(self.name, chunks, chunk_ids, offsets, lengths, outs, out_ids, rows)
        nbytes = outs[0].shape[1]
        cids, offs, lens = (np.asarray(x).tolist() for x in (chunk_ids, offsets, lengths))
        mts, oids, rws = meta.tolist(), np.asarray(out_ids).tolist(), np.asarray(rows).tolist()
        errors: list[str] = []

        def work(start: int, stop: int) -> None:
            plain = _coders(self._local, self.level, None)[1]
            with_dict = dictionary.coders()[1] if dictionary is not None else None
            for t in range(start, stop):
                src = chunks[cids[t]][offs[t] : offs[t] + lens[t]]
                try:
                    size = self._z.frame_content_size(src)
                    if size != nbytes:  # checked first: a corrupt header must not size an allocation
                        errors.append(f"the frame declares {size} bytes, expected {nbytes}")
                        return
                    data = (with_dict if mts[t] else plain).decompress(src)
                except self._z.ZstdError as exc:
                    errors.append(str(exc))
                    return
                outs[oids[t]][rws[t]] = np.frombuffer(data, dtype=np.uint8)

        parallel_for(len(rws), work, work_bytes=len(rws) * nbytes)
        if errors:
            raise ValueError(f"codec 'zstd': corrupt entry: {errors[0]}")
