"""`ZstdCodec.decode_many` on batches of real frames: one corrupt frame among many, an empty batch, one frame."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from hc_helpers import assert_bit_exact
from host_codecs import available_codecs

pytestmark = pytest.mark.skipif("zstd" not in available_codecs(), reason="needs zstandard")

U8 = np.dtype(np.uint8)


@pytest.fixture(scope="module")
def coded(breakout_frames):
    """(codec, chunk table with the dictionary, encoded batch, raw rows): 64 real frames coded with a dictionary."""
    from host_codecs._base import ChunkTable
    from host_codecs.zstd import ZstdCodec, ZstdDictionary

    rows = breakout_frames[:364].reshape(364, -1)
    d = ZstdDictionary.train(rows[:300], 4096, -1)
    codec = ZstdCodec(-1)
    enc = codec.encode_batch(rows[300:], U8, d)
    chunk = np.zeros(len(enc.buffer) + 8, np.uint8)
    chunk[: len(enc.buffer)] = enc.buffer
    return codec, ChunkTable({0: chunk}, d), enc, rows[300:]


def _decode(codec, table, enc, sel, outs, out_ids, rows, bases=None, lengths=None, offsets=None):
    zeros = np.zeros(len(sel), np.int64)
    codec.decode_many(table, zeros, enc.offsets[sel] if offsets is None else offsets, enc.lengths[sel] if lengths is None else lengths,
                      enc.meta[sel], outs, out_ids, rows, U8, bases=bases)


def test_a_batch_is_decoded_exactly_into_rows_of_several_outputs(coded):
    codec, table, enc, raw = coded
    outs = [np.full((40, raw.shape[1]), 3, np.uint8), np.full((33, raw.shape[1]), 3, np.uint8)]
    out_ids = np.arange(64, dtype=np.int64) % 2
    rows = np.where(out_ids == 0, np.arange(64) // 2, 32 - np.arange(64) // 2).astype(np.int64)
    _decode(codec, table, enc, np.arange(64), outs, out_ids, rows)
    for i in range(64):
        assert_bit_exact(outs[out_ids[i]][rows[i]], raw[i])
    assert (outs[0][32:] == 3).all() and (outs[1][0] == 3).all()  # rows no entry names are untouched


def test_a_corrupt_frame_in_a_batch_raises_without_inflating_past_its_entry(coded):
    """One frame of a 64-frame batch replaced by a few-KB frame of 64 MiB of zeros: refused from its header (nothing
    of its size allocated); one with a flipped byte in its body: refused by its content checksum."""
    import zstandard

    from host_codecs._base import ChunkTable

    codec, table, enc, raw = coded
    bomb = zstandard.ZstdCompressor(level=1).compress(bytes(64 << 20))
    chunk = np.zeros(len(enc.buffer) + len(bomb) + 16, np.uint8)
    chunk[: len(enc.buffer)] = enc.buffer
    at = -(-len(enc.buffer) // 8) * 8
    chunk[at : at + len(bomb)] = np.frombuffer(bomb, np.uint8)
    offsets, lengths = enc.offsets.copy(), enc.lengths.copy()
    offsets[37], lengths[37] = at, len(bomb)
    bombed = ChunkTable({0: chunk}, table.dictionary)
    out = np.zeros((64, raw.shape[1]), np.uint8)
    ids, rows = np.zeros(64, np.int64), np.arange(64, dtype=np.int64)
    meta = enc.meta.copy()
    meta[37] = 0  # the bomb has no dictionary
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="corrupt entry: the frame declares 67108864 bytes, expected 7056"):
            codec.decode_many(bombed, ids, offsets, lengths, meta, [out], ids, rows, U8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak

    flipped = table[0].copy()
    mid = int(enc.offsets[12] + enc.lengths[12] // 2)
    flipped[mid] ^= 0xFF
    with pytest.raises(ValueError, match="corrupt entry"):
        codec.decode_many(ChunkTable({0: flipped}, table.dictionary), ids, enc.offsets, enc.lengths, enc.meta, [out], ids, rows, U8)


def test_an_empty_batch_decodes_nothing(coded):
    codec, table, enc, raw = coded
    out = np.full((4, raw.shape[1]), 9, np.uint8)
    none = np.zeros(0, np.int64)
    for bases in (None, (none, none)):
        _decode(codec, table, enc, none, [out], none, none, bases=bases)
    assert (out == 9).all()


def test_a_batch_of_one_frame_whole_or_as_a_delta(coded):
    """One frame with the dictionary, one without, and one delta (`bases`) against a row decoded before the call."""
    from host_codecs.zstd import ZstdCodec

    codec, table, enc, raw = coded
    one = np.zeros(1, np.int64)
    out = np.zeros((2, raw.shape[1]), np.uint8)
    _decode(codec, table, enc, np.array([5]), [out], one, one)
    assert_bit_exact(out[0], raw[5])
    plain = ZstdCodec(-1).encode_batch(raw[7:8], U8)
    assert plain.meta.tolist() == [0]
    chunk = np.zeros(len(plain.buffer) + 8, np.uint8)
    chunk[: len(plain.buffer)] = plain.buffer
    codec.decode_many({0: chunk}, one, plain.offsets, plain.lengths, plain.meta, [out], one, one + 1, U8)
    assert_bit_exact(out[1], raw[7])
    delta = ZstdCodec(-1).encode_batch(np.bitwise_xor(raw[8], raw[7])[None], U8)  # out[1] holds raw[7]: the base
    chunk = np.zeros(len(delta.buffer) + 8, np.uint8)
    chunk[: len(delta.buffer)] = delta.buffer
    codec.decode_many({0: chunk}, one, delta.offsets, delta.lengths, delta.meta, [out], one, one, U8, bases=(one, one + 1))
    assert_bit_exact(out[0], raw[8])
