"""The ``none`` codec: payload = the raw bytes of the entry (numpy only).

Useful as a baseline, for incompressible data, and when the optional packages are missing.
"""

from __future__ import annotations

import numpy as np

from ._base import Codec, EncodedBatch, ceil_align, check_decode_args

__all__ = ["NoneCodec"]


class NoneCodec(Codec):
    """Identity codec (tag 0): stores the entry's bytes unchanged. Needs numpy only."""

    name = "none"
    tag = 0

    def encode_batch(self, rows: np.ndarray, dtype: np.dtype) -> EncodedBatch:
        b, nbytes = rows.shape
        stride = ceil_align(nbytes)
        buf = np.empty((b, stride), dtype=np.uint8)
        buf[:, :nbytes] = rows
        buf[:, nbytes:] = 0  # deterministic padding bytes
        return EncodedBatch(
            buffer=buf.reshape(-1),
            offsets=np.arange(b, dtype=np.int64) * stride,
            lengths=np.full(b, nbytes, dtype=np.int64),
            meta=np.zeros(b, dtype=np.uint8),
        )

    def decode_into(self, chunk, offsets, lengths, meta, out, rows, dtype) -> None:
        check_decode_args(self.name, chunk.shape[0], offsets, lengths, out, rows)
        nbytes = out.shape[1]
        bad = lengths != nbytes
        if bad.any():
            raise ValueError(
                f"codec 'none': corrupt entry, payload has {int(lengths[bad][0])} bytes, "
                f"expected {nbytes}"
            )
        for o, r in zip(offsets.tolist(), rows.tolist()):
            out[r] = chunk[o : o + nbytes]
