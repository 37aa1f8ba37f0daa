"""The `none` codec: the payload is the entry's raw bytes (numpy only)."""

from __future__ import annotations

import numpy as np

from ._base import Codec, EncodedBatch, ceil_align, check_decode

__all__ = ["NoneCodec"]


class NoneCodec(Codec):
    """Identity codec (tag 0): stores the entry's bytes unchanged. Needs numpy only."""

    name = "none"
    tag = 0

    def encode_batch(self, rows: np.ndarray, dtype: np.dtype) -> EncodedBatch:
        b, nbytes = rows.shape
        stride = ceil_align(nbytes)
        buf = np.zeros((b, stride), dtype=np.uint8)  # zero padding: the output is deterministic
        buf[:, :nbytes] = rows
        offsets = np.arange(b, dtype=np.int64) * stride
        return EncodedBatch(buf.reshape(-1), offsets, np.full(b, nbytes, dtype=np.int64), np.zeros(b, dtype=np.uint8))

    def decode_into(self, chunk, offsets, lengths, meta, out, rows, dtype) -> None:
        zeros = np.zeros(len(rows), np.int64)
        check_decode(self.name, {0: chunk}, zeros, offsets, lengths, [out], zeros, rows)
        nbytes = out.shape[1]
        bad = lengths != nbytes
        if bad.any():
            raise ValueError(f"codec 'none': corrupt entry, payload has {int(lengths[bad][0])} bytes, expected {nbytes}")
        for o, r in zip(offsets.tolist(), rows.tolist()):
            out[r] = chunk[o : o + nbytes]
