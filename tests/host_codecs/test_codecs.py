"""Round trips of every codec, bit-exact in dtype and shape: real Atari frames and edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from hc_helpers import assert_bit_exact
from host_codecs import CompressedStore, get_codec


def roundtrip_store(spec: str, batch: np.ndarray) -> tuple[np.ndarray, CompressedStore]:
    store = CompressedStore(len(batch) + 3, codec=spec)
    slots = np.arange(len(batch)) + 2
    store.put(slots, batch)
    return store.get(slots), store


def test_roundtrip_edge_cases(codec_spec, special):
    got, _ = roundtrip_store(codec_spec, special)
    assert_bit_exact(got, special)


def test_roundtrip_single_array_helpers(codec_spec, special):
    codec = get_codec(codec_spec)
    for item in special:
        payload = codec.encode(item)
        assert_bit_exact(codec.decode(payload, item.dtype, item.shape), item)


def test_roundtrip_real_stacks(codec_spec, atari_stacks):
    for game in ("breakout_obs", "pong_obs"):
        obs = atari_stacks[game][::10]  # 500 stacks [4, 84, 84] per game
        got, store = roundtrip_store(codec_spec, obs)
        assert_bit_exact(got, obs)
        if codec_spec != "none":
            assert store.payload_nbytes < obs.nbytes / 2, "real frames must compress"


def test_roundtrip_real_single_frames(codec_spec, atari_rollouts):
    frames = atari_rollouts["pong_frames"][:300]  # uint8 [300, 84, 84]
    got, _ = roundtrip_store(codec_spec, frames)
    assert_bit_exact(got, frames)


def test_all_zero_frame_compresses_to_a_few_bytes(codec_spec):
    frame = np.zeros((1, 210, 160, 3), np.uint8)
    got, store = roundtrip_store(codec_spec, frame)
    assert_bit_exact(got, frame)
    if codec_spec != "none":
        assert store.payload_nbytes < 2000  # 100,800 raw bytes


@pytest.mark.parametrize("spec", ["none", "rle", "igzip:1"])
def test_decode_rejects_corrupt_payload(spec):
    codec = get_codec(spec)
    frame = np.arange(200, dtype=np.uint8).reshape(10, 20) // 7
    payload = codec.encode(frame)
    with pytest.raises(ValueError, match="corrupt"):
        codec.decode(payload[:-3], frame.dtype, frame.shape)


@pytest.mark.parametrize("spec", ["none", "zstd:-1", "igzip:1", "rle"])
def test_encode_deltas_is_encoding_the_xor_of_each_row_with_its_base(spec):
    """`Codec.encode_deltas`: the payloads of `encode_batch` of each delta row XOR its base (a batch row or a row
    of `ext`), in the order of `idx`, decoding to those rows; `xor_rows` over several blocks of rows (`_XOR_BLOCK`) and over threads."""
    import host_codecs
    from host_codecs._base import _XOR_BLOCK, xor_rows

    rng = np.random.default_rng(0)
    b = 3 * _XOR_BLOCK + 5
    rows = rng.integers(0, 4, (b, 4000), dtype=np.uint8)
    ext = rng.integers(0, 4, (3, 4000), dtype=np.uint8)
    idx = np.flatnonzero(rng.random(b) < 0.8)
    src = np.where(rng.random(idx.size) < 0.1, -1 - rng.integers(0, 3, idx.size), np.maximum(idx - 1, 0))
    src[idx == 0] = -1
    want = rows[idx] ^ np.where((src >= 0)[:, None], rows[np.maximum(src, 0)], ext[np.maximum(-1 - src, 0)])
    host_codecs.set_num_threads(2)
    try:
        np.testing.assert_array_equal(xor_rows(rows, idx, src, ext), want)
        c = get_codec(spec)
        enc = c.encode_deltas(rows, np.dtype(np.uint8), idx, src, ext)
    finally:
        host_codecs.set_num_threads(None)
    out = np.zeros_like(want)
    c.decode_into(enc.buffer, enc.offsets, enc.lengths, enc.meta, out, np.arange(idx.size), np.dtype(np.uint8))
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("spec", ["none", "rle"])
@pytest.mark.parametrize(
    "idx, src, ext, err, match",
    [
        ([0, 3], [1, 0], np.zeros((1, 8), np.uint8), ValueError, "idx: a row out of range for a batch of 3 rows"),
        ([-1], [0], np.zeros((1, 8), np.uint8), ValueError, "idx: a row out of range"),
        ([2], [3], np.zeros((1, 8), np.uint8), ValueError, r"src: a base out of range \[-1, 3\)"),
        ([2], [-2], np.zeros((1, 8), np.uint8), ValueError, r"src: a base out of range \[-1, 3\)"),
        ([1, 2], [0], np.zeros((1, 8), np.uint8), ValueError, "idx, src: expected two 1-D arrays of one length"),
        ([1.0], [0], np.zeros((1, 8), np.uint8), TypeError, "idx: expected integer"),
        ([1], [0], np.zeros((1, 7), np.uint8), ValueError, r"ext: expected uint8 rows of shape \(J, 8\)"),
        ([1], [0], np.zeros((1, 8), np.int16), TypeError, "ext: expected uint8 rows"),
    ],
)
def test_encode_deltas_refuses_bad_rows_and_bases(spec, idx, src, ext, err, match):
    """Rows and bases outside the batch or `ext` are refused before anything is read (the RLE encoder has no bounds
    checks), integers are never cast from floats, and `ext` must have the batch's row size."""
    rows = np.zeros((3, 8), np.uint8)
    with pytest.raises(err, match=match):
        get_codec(spec).encode_deltas(rows, np.dtype(np.uint8), np.array(idx), np.array(src), ext)
