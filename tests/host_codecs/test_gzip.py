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


def test_zstd_native_and_python_engines_agree(atari_stacks):
    """The native engine (numba calling libzstd) writes the same frames as zstandard and both
    engines decode each other's payloads bit-exactly; corrupt payloads raise in both."""
    pytest.importorskip("zstandard")
    from host_codecs.zstd import ZstdCodec, _native

    if _native() is None:
        pytest.skip("no native zstd engine here (numba or an exported libzstd missing)")
    frames = atari_stacks["breakout_obs"][:64, -1]  # [64, 84, 84] single frames
    rows = frames.reshape(64, -1)
    for level in (-1, 3):
        nat, py = ZstdCodec(level, engine="native"), ZstdCodec(level, engine="python")
        assert (nat.engine, py.engine) == ("native", "python")
        a, b = nat.encode_batch(rows, np.uint8), py.encode_batch(rows, np.uint8)
        np.testing.assert_array_equal(a.lengths, b.lengths)
        for o, p, n in zip(a.offsets, b.offsets, a.lengths):
            assert a.buffer[o : o + n].tobytes() == b.buffer[p : p + n].tobytes()
        for enc in (a, b):
            for dec in (nat, py):
                out = np.zeros_like(rows)
                order = np.arange(64)[::-1].copy()  # rows written out of order
                dec.decode_into(enc.buffer, enc.offsets, enc.lengths, enc.meta, out, order, np.uint8)
                np.testing.assert_array_equal(out[order], rows)
        bad = a.buffer.copy()
        bad[a.offsets[3] + 6] ^= 0xFF  # inside the first block of entry 3
        for dec in (nat, py):
            with pytest.raises(ValueError, match="codec 'zstd': corrupt entry"):
                dec.decode_into(bad, a.offsets, a.lengths, a.meta, np.zeros_like(rows), np.arange(64), np.uint8)
        short = np.zeros((64, rows.shape[1] - 1), np.uint8)  # declared size larger than the output rows
        with pytest.raises(ValueError, match="codec 'zstd': corrupt entry"):
            nat.decode_into(a.buffer, a.offsets, a.lengths, a.meta, short, np.arange(64), np.uint8)
    with pytest.raises(ValueError, match="engine"):
        ZstdCodec(3, engine="fast")
    with pytest.raises(ValueError, match="out of range"):
        nat.decode_into(a.buffer, a.offsets + len(a.buffer), a.lengths, a.meta, np.zeros_like(rows), np.arange(64), np.uint8)


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
