"""`igzip`: raw DEFLATE streams (RFC 1951) by Intel ISA-L (why raw streams, the levels: `docs/api/host_codecs.md`)."""

from __future__ import annotations

import numpy as np

from ._base import Codec, EncodedBatch, decode_each, import_extra, pack_payloads
from ._pool import parallel_for

__all__ = ["IgzipCodec"]


class IgzipCodec(Codec):
    """Raw-deflate codec backed by ISA-L (tag 2). Levels 0-3, default 1.

    Raises:
      ImportError: naming the `codecs` extra when `isal` is not installed.
    """

    name = "igzip"
    tag = 2
    levels = (0, 1, 2, 3)
    default_level = 1

    def __init__(self, level: int | None = None):
        super().__init__(level)
        self._lib = import_extra("igzip", "isal", "isal.igzip_lib")

    def encode_batch(self, rows: np.ndarray, dtype: np.dtype) -> EncodedBatch:
        payloads: list[bytes] = [b""] * rows.shape[0]

        def work(start: int, stop: int) -> None:
            for i in range(start, stop):
                payloads[i] = self._lib.compress(rows[i], self.level, self._lib.COMP_DEFLATE)

        parallel_for(rows.shape[0], work, work_bytes=rows.nbytes)
        return pack_payloads(payloads)

    def decode_many(self, chunks, chunk_ids, offsets, lengths, meta, outs, out_ids, rows, dtype, bases=None) -> None:
        """`Codec.decode_many`, every payload read where it lies (a delta XORed with its base as it is decoded).

        Raises:
          ValueError: a corrupt stream (one that fails to inflate, or gives other than the entry's size), or as
            `check_decode`.
        """
        lib = self._lib
        nbytes = outs[0].shape[1] if len(outs) else 0

        def inflate(src, t: int) -> bytes:
            dec = lib.IgzipDecompressor(lib.DECOMP_DEFLATE)
            try:  # at most one byte more than the entry's size: a corrupt stream cannot inflate further
                data = dec.decompress(src, nbytes + 1)
            except lib.error as exc:
                raise ValueError(str(exc)) from exc
            if len(data) > nbytes:
                raise ValueError(f"the stream inflates past the entry's {nbytes} bytes")
            if len(data) < nbytes or not dec.eof or dec.unused_data:
                ends = "ends" if dec.eof else "does not end"
                raise ValueError(f"the stream gives {len(data)} bytes (expected {nbytes}), {ends} there, and has "
                                 f"{len(dec.unused_data)} bytes after its end")
            return data

        decode_each(self.name, chunks, chunk_ids, offsets, lengths, outs, out_ids, rows, bases, lambda: inflate)
