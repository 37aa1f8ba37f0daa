"""igzip (raw deflate via ISA-L) and zstd: format checked against independent decoders."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from hc_helpers import assert_bit_exact
from host_codecs import CompressedStore, get_codec

pytest.importorskip("isal", reason="the igzip codec needs isal (codecs extra)")


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_igzip_is_raw_deflate_readable_by_zlib(level, atari_stacks):
    obs = atari_stacks["pong_obs"][:8]
    codec = get_codec(f"igzip:{level}")
    for item in obs:
        body = codec.encode(item)[1:]  # strip the meta byte of Codec.encode
        assert body[:2] != b"\x1f\x8b", "no gzip header: raw deflate only"
        assert zlib.decompress(body, wbits=-15) == item.tobytes()  # stdlib zlib, raw stream


def test_igzip_levels_trade_size(atari_stacks):
    obs = atari_stacks["breakout_obs"][:64]
    sizes = []
    for level in (0, 1, 3):
        store = CompressedStore(64, codec=f"igzip:{level}")
        store.put(np.arange(64), obs)
        assert_bit_exact(store.get(np.arange(64)), obs)
        sizes.append(store.payload_nbytes)
    assert sizes[0] > max(sizes[1:])  # level 0 is the largest (ISA-L level 3 is not always smaller than 1)


def test_zstd_frames_readable_by_stdlib_style_decoder(atari_stacks):
    zstandard = pytest.importorskip("zstandard")
    obs = atari_stacks["breakout_obs"][:4]
    codec = get_codec("zstd:3")
    for item in obs:
        body = codec.encode(item)[1:]
        assert body[:4] == b"\x28\xb5\x2f\xfd"  # zstd frame magic
        assert zstandard.ZstdDecompressor().decompress(body) == item.tobytes()


def test_batch_larger_than_thread_shards_keeps_order(atari_stacks):
    # parallel_for splits the batch across threads; every row must land in its own slot.
    obs = atari_stacks["pong_obs"][:300]
    for spec in ("igzip:1", "zstd:1"):
        store = CompressedStore(300, codec=spec)
        perm = np.random.default_rng(1).permutation(300)
        store.put(perm, obs)
        assert_bit_exact(store.get(perm), obs)


def test_zstd_frames_carry_size_and_checksum_and_corruption_raises(atari_stacks):
    """Every frame records its content size and checksum; a flipped byte anywhere in a payload
    raises (or, where zstd ignores that bit, still decodes exactly), never gives wrong bytes."""
    zstandard = pytest.importorskip("zstandard")
    rows = atari_stacks["breakout_obs"][:16, -1].reshape(16, -1)
    codec = get_codec("zstd:-1")
    enc = codec.encode_batch(rows, np.uint8)
    for o, n in zip(enc.offsets.tolist(), enc.lengths.tolist()):
        params = zstandard.get_frame_parameters(enc.buffer[o : o + n].tobytes())
        assert params.has_checksum and params.content_size == rows.shape[1]
    o, n = int(enc.offsets[3]), int(enc.lengths[3])
    raised = 0
    for i in range(o, o + n):
        bad = enc.buffer.copy()
        bad[i] ^= 0x10
        out = np.zeros_like(rows)
        try:
            codec.decode_into(bad, enc.offsets, enc.lengths, enc.meta, out, np.arange(16), np.uint8)
        except ValueError as exc:
            assert "codec 'zstd': corrupt entry" in str(exc)
            raised += 1
        else:
            np.testing.assert_array_equal(out, rows)
    assert raised > 0.9 * n
    short = np.zeros((16, rows.shape[1] - 1), np.uint8)  # the frame declares more bytes than a row holds
    with pytest.raises(ValueError, match="codec 'zstd': corrupt entry: the frame declares 7056 bytes, expected 7055"):
        codec.decode_into(enc.buffer, enc.offsets, enc.lengths, enc.meta, short, np.arange(16), np.uint8)
    with pytest.raises(ValueError, match="out of range"):
        codec.decode_into(enc.buffer, enc.offsets + len(enc.buffer), enc.lengths, enc.meta, np.zeros_like(rows), np.arange(16), np.uint8)


def test_zstd_fast_levels_round_trip_and_are_larger(atari_stacks):
    obs = atari_stacks["breakout_obs"][:64, -1]
    sizes = {}
    for spec in ("zstd:-7", "zstd:-1", "zstd:1"):
        store = CompressedStore(64, codec=spec)
        store.put(np.arange(64), obs)
        assert_bit_exact(store.get(np.arange(64)), obs)
        sizes[spec] = store.payload_nbytes
    assert sizes["zstd:-7"] > sizes["zstd:-1"] > sizes["zstd:1"]
    with pytest.raises(ValueError, match="level must be one of"):
        get_codec("zstd:-8")
