"""RLE codec: payload format, count width choice, run splitting, property tests."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="the rle codec needs numba (codecs extra)")

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hc_helpers import assert_bit_exact
from host_codecs import RLECodec
from host_codecs._base import element_view_dtype


def parse_payload(payload: bytes, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Independent pure-numpy reader of the documented format -> (values words, counts)."""
    cw = payload[0]  # Codec.encode prefixes the meta byte (the count width)
    body = payload[1:]
    vw = element_view_dtype(np.dtype(dtype)).itemsize
    r, rem = divmod(len(body), vw + cw)
    assert rem == 0
    if vw >= cw:
        vals, cnts = body[: r * vw], body[r * vw :]
    else:
        cnts, vals = body[: r * cw], body[r * cw :]
    return np.frombuffer(vals, f"u{vw}"), np.frombuffer(cnts, f"u{cw}")


@pytest.mark.parametrize("run", [1, 254, 255, 256, 510, 511, 65_535, 65_536, 200_001])
def test_run_boundaries_split_exactly(run):
    a = np.concatenate([np.full(run, 7, np.uint8), [1, 2], np.full(run, 9, np.uint8)])
    for level in (8, 16, 32):
        codec = RLECodec(level)
        payload = codec.encode(a)
        vals, cnts = parse_payload(payload, a.dtype)
        assert cnts.sum() == a.size
        assert (cnts > 0).all()
        # the reader's expansion equals the input: splitting kept every element in order
        np.testing.assert_array_equal(np.repeat(vals, cnts.astype(np.int64)), a)
        assert_bit_exact(codec.decode(payload, a.dtype, a.shape), a)


def test_count_width_is_chosen_from_the_data():
    codec = RLECodec()  # level 8: smallest payload wins
    short_runs = np.repeat(np.arange(100, dtype=np.uint8), 3)
    assert codec.encode(short_runs)[0] == 1  # uint8 counts
    medium = np.repeat(np.arange(4, dtype=np.uint8), 10_000)
    assert codec.encode(medium)[0] == 2  # 4 runs of 10,000: uint16 beats 160 uint8 runs
    zeros = np.zeros(210 * 160 * 3, np.uint8)  # one run of 100,800 > 65,535
    payload = codec.encode(zeros)
    assert payload[0] == 4 and len(payload) == 1 + 1 + 4  # one value + one uint32 count
    # level 16 never uses 8-bit counts
    assert RLECodec(16).encode(short_runs)[0] == 2


def test_float_runs_are_bitwise_not_numeric():
    # -0.0 == 0.0 and NaN != NaN numerically; RLE must compare bits.
    a = np.array([0.0, -0.0, -0.0, np.nan, np.nan, 1.0], np.float32)
    vals, cnts = parse_payload(RLECodec().encode(a), a.dtype)
    np.testing.assert_array_equal(cnts, [1, 2, 2, 1])
    assert vals.dtype == np.uint32  # never narrowed to uint8


def test_each_entry_of_a_batch_gets_its_own_count_width():
    from host_codecs import CompressedStore

    store = CompressedStore(4, codec="rle")
    batch = np.stack([np.zeros(100_000, np.uint8), np.arange(100_000, dtype=np.int64).astype(np.uint8)])
    store.put([0, 1], batch)
    assert store._meta[:2].tolist() == [4, 1]  # uint32 counts for the long run, uint8 for noise
    assert_bit_exact(store.get([0, 1]), batch)


def test_real_stacks_match_the_reference_encoder(atari_stacks):
    obs = atari_stacks["breakout_obs"][:64]
    check_against_reference(RLECodec(), obs.reshape(64, -1), obs.dtype)


def test_bad_level():
    with pytest.raises(ValueError, match="level must be one of"):
        RLECodec(12)


_dtypes = st.sampled_from(["uint8", "bool", "int16", "uint16", "int32", "float32", "float64", "complex64"])


@st.composite
def runny_arrays(draw):
    """Arrays with long runs (a few distinct values), any supported dtype, batch axis first."""
    dtype = np.dtype(draw(_dtypes))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=40))
    palette = draw(hnp.arrays(dtype, draw(st.integers(1, 4)), elements=None))
    idx = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, len(palette) - 1)))
    return palette[idx]


@settings(max_examples=40, deadline=None)
@given(a=runny_arrays(), level=st.sampled_from([8, 16, 32]))
def test_roundtrip_property(a, level):
    codec = RLECodec(level)
    payload = codec.encode(a)
    assert_bit_exact(codec.decode(payload, a.dtype, a.shape), a)
    vals, cnts = parse_payload(payload, a.dtype)
    assert cnts.sum() * vals.dtype.itemsize == a.nbytes


# -- batch encoder against an independent reference ------------------------------------------
import host_codecs  # noqa: E402


def reference_encode_batch(rows: np.ndarray, dtype, min_width: int):
    """Pure-numpy encoder of the documented format: (buffer, offsets, lengths, meta) with every
    payload 8-byte aligned and zero padding, independent of the numba kernels."""
    word = element_view_dtype(np.dtype(dtype))
    vw = word.itemsize
    payloads, widths, lengths = [], [], []
    for row in rows:
        w = row.view(word)
        if w.size:
            starts = np.r_[0, np.flatnonzero(w[1:] != w[:-1]) + 1]
            lens = np.diff(np.r_[starts, w.size])
            vals = w[starts]
        else:
            lens, vals = np.zeros(0, np.int64), w[:0]
        best = None
        for cw in (4, 2, 1):  # widest first: ties keep the wider count
            if cw * 8 < min_width:
                continue
            maxc = (1 << (8 * cw)) - 1
            pieces = -(-lens // maxc)
            size = int(pieces.sum()) * (vw + cw)
            if best is None or size < best[0]:
                best = (size, cw, maxc, pieces)
        size, cw, maxc, pieces = best
        cnts = np.full(int(pieces.sum()), maxc, np.int64)
        cnts[np.cumsum(pieces) - 1] = lens - (pieces - 1) * maxc
        v = np.repeat(vals, pieces).tobytes()
        c = cnts.astype(f"u{cw}").tobytes()
        body = v + c if vw >= cw else c + v
        assert len(body) == size
        payloads.append(body + bytes(-len(body) % 8))
        widths.append(cw)
        lengths.append(size)
    lengths = np.array(lengths, np.int64)
    sizes = np.array([len(p) for p in payloads], np.int64)
    offsets = np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64) if len(payloads) else np.zeros(0, np.int64)
    return b"".join(payloads), offsets, lengths, np.array(widths, np.uint8)


def check_against_reference(codec: RLECodec, rows: np.ndarray, dtype) -> None:
    enc = codec.encode_batch(rows, dtype)
    buf, offsets, lengths, meta = reference_encode_batch(rows, dtype, codec.level)
    assert enc.buffer.tobytes() == buf
    np.testing.assert_array_equal(enc.offsets, offsets)
    np.testing.assert_array_equal(enc.lengths, lengths)
    np.testing.assert_array_equal(enc.meta, meta)
    out = np.empty_like(rows)
    codec.decode_into(enc.buffer, enc.offsets, enc.lengths, enc.meta, out, np.arange(rows.shape[0]), dtype)
    assert out.tobytes() == rows.tobytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_batch_split_over_threads_matches_reference(threads, atari_stacks):
    # 2 x 256 KiB+ of rows -> the thread pool runs 2 shards; noise entries (payload 2x raw)
    # between Atari stacks (which compress 8x).
    rng = np.random.default_rng(1)
    stacks = atari_stacks["breakout_obs"][:40].reshape(40, -1)
    noise = rng.integers(0, 256, (6, stacks.shape[1]), dtype=np.uint8)
    rows = np.concatenate([stacks[:15], noise[:3], stacks[15:], noise[3:]])
    host_codecs.set_num_threads(threads)
    try:
        for level in (8, 16):
            check_against_reference(RLECodec(level), rows, np.uint8)
    finally:
        host_codecs.set_num_threads(None)


def test_small_large_small_batches():
    codec = RLECodec()
    small = np.zeros((4, 64), np.uint8)
    check_against_reference(codec, small, np.uint8)
    big = np.random.default_rng(2).integers(0, 256, (2, 300_000), dtype=np.uint8)
    check_against_reference(codec, big, np.uint8)  # worst case: payload 2x raw
    check_against_reference(codec, small, np.uint8)


def test_empty_batches_and_empty_entries():
    codec = RLECodec()
    enc = codec.encode_batch(np.empty((0, 16), np.uint8), np.uint8)
    assert enc.buffer.size == 0 and enc.offsets.size == enc.lengths.size == enc.meta.size == 0
    check_against_reference(codec, np.empty((3, 0), np.uint8), np.uint8)
    codec.decode_into(np.zeros(0, np.uint8), *(np.zeros(0, np.int64),) * 2, np.zeros(0, np.uint8),
                      np.empty((0, 4), np.uint8), np.zeros(0, np.int64), np.uint8)


def test_unaligned_rows_take_the_bytewise_path():
    # Rows of 13 bytes (not a multiple of 8) and a batch starting 1 byte past an aligned
    # address: both encode without the 8-byte scan and must give the same bytes.
    rng = np.random.default_rng(3)
    a = np.repeat(rng.integers(0, 3, (5, 13)), 3, axis=1).astype(np.uint8)  # [5, 39]
    check_against_reference(RLECodec(), a, np.uint8)
    raw = np.zeros(5 * 40 + 1, np.uint8)
    shifted = raw[1:].reshape(5, 40)
    shifted[:] = np.repeat(rng.integers(0, 3, (5, 10)), 4, axis=1)
    assert shifted.ctypes.data % 8 != 0
    check_against_reference(RLECodec(), shifted, np.uint8)


@settings(max_examples=40, deadline=None)
@given(
    dtype=_dtypes,
    b=st.integers(0, 5),
    n=st.integers(0, 70),
    long_run=st.sampled_from([0, 255, 256, 65_535, 65_536, 70_001]),
    level=st.sampled_from([8, 16, 32]),
    seed=st.integers(0, 2**32 - 1),
)
def test_batch_encoding_equals_numpy_reference(dtype, b, n, long_run, level, seed):
    # Any dtype (1/2/4/8-byte words, multi-word complex), rows of any length (fast 8-byte scan
    # or bytewise), runs straddling the 8/16-bit count maxima and word boundaries:
    # byte-identical to the reference and round-tripping.
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    palette = rng.integers(0, 256, (3, dt.itemsize), dtype=np.uint8)
    idx = np.repeat(rng.integers(0, 3, (b, n)), rng.integers(1, 9), axis=1)
    if long_run and b:
        idx = np.concatenate([idx, np.zeros((b, long_run), idx.dtype)], axis=1)
        idx[:, -1] = 1
    rows = np.ascontiguousarray(palette[idx].reshape(b, idx.shape[1] * dt.itemsize))
    check_against_reference(RLECodec(level), rows, dt)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("meta", 3, r"count width \[3\]"),
        ("lengths", 5, "not a whole number of runs"),
        ("offsets", 1 << 20, "outside its chunk"),
        ("counts", None, "do not add up to 64 words"),
    ],
)
def test_decode_reports_each_kind_of_corruption(field, value, match):
    codec = RLECodec()
    rows = np.repeat(np.arange(8, dtype=np.uint8), 8).reshape(1, 64)
    enc = codec.encode_batch(np.concatenate([rows, rows]), np.uint8)
    buf, offsets, lengths, meta = enc.buffer.copy(), enc.offsets.copy(), enc.lengths.copy(), enc.meta.copy()
    if field == "meta":
        meta[1] = value
    elif field == "lengths":
        lengths[1] = value
    elif field == "offsets":
        offsets[1] = value
    else:
        buf[int(offsets[1]) + int(lengths[1]) - 1] += 1  # last count one too many
    out = np.empty((2, 64), np.uint8)
    with pytest.raises(ValueError, match=match):
        codec.decode_into(buf, offsets, lengths, meta, out, np.arange(2), np.uint8)


def _xor_reference(rows, idx, src, ext):
    """Row `j`: `rows[idx[j]]` XOR its base (`rows[src[j]]`, or `ext[-1 - src[j]]` for `src[j] < 0`), in numpy."""
    bases = np.stack([rows[s] if s >= 0 else ext[-1 - s] for s in src]) if len(src) else rows[:0]
    return rows[idx] ^ bases


@settings(max_examples=40, deadline=None)
@given(
    dtype=_dtypes,
    b=st.integers(1, 6),
    n=st.integers(0, 40),
    noise=st.booleans(),
    shift=st.sampled_from([0, 1]),
    level=st.sampled_from([8, 16, 32]),
    seed=st.integers(0, 2**32 - 1),
)
def test_encode_deltas_equals_encoding_the_xor(dtype, b, n, noise, shift, level, seed):
    # The XOR taken inside the encoder's scan gives the bytes of encoding the XORed rows: bases inside the batch
    # and from outside it, rows of any length (8-byte scan or bytewise), rows 1 byte past an aligned address, and
    # the worst case (noise: every word its own run, a payload larger than the entry), round-tripping.
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    words = np.repeat(rng.integers(0, 3, (b + 2, n)), rng.integers(1, 9), axis=1)
    if noise:
        words = rng.integers(0, 256, words.shape)
    raw = np.zeros((b + 2) * words.shape[1] * dt.itemsize + shift, np.uint8)
    flat = raw[shift:].reshape(b + 2, -1)
    flat[:] = np.repeat(words, dt.itemsize, axis=1).astype(np.uint8) ^ rng.integers(0, 2, flat.shape, dtype=np.uint8) * (not noise)
    rows, ext = flat[:b], np.ascontiguousarray(flat[b:])
    idx = np.flatnonzero(rng.random(b) < 0.7)
    src = np.array([rng.integers(-ext.shape[0], i) for i in idx], np.int64)  # an earlier row or a row of ext
    c = RLECodec(level)
    enc = c.encode_deltas(rows, dt, idx, src, ext)
    want = c.encode_batch(_xor_reference(rows, idx, src, ext), dt)
    assert enc.buffer.tobytes() == want.buffer.tobytes()
    for field in ("offsets", "lengths", "meta"):
        np.testing.assert_array_equal(getattr(enc, field), getattr(want, field))
    check_against_reference(c, np.ascontiguousarray(_xor_reference(rows, idx, src, ext)), dt)
