"""RLE codec: payload format, count width choice, run splitting, engines, property tests."""

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

ENGINES = ["threads", "prange"]


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


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("run", [1, 254, 255, 256, 510, 511, 65_535, 65_536, 200_001])
def test_run_boundaries_split_exactly(engine, run):
    a = np.concatenate([np.full(run, 7, np.uint8), [1, 2], np.full(run, 9, np.uint8)])
    for level in (8, 16, 32):
        codec = RLECodec(level, engine=engine)
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


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_agree_on_real_stacks(engine, atari_stacks):
    obs = atari_stacks["breakout_obs"][:64]
    rows = obs.reshape(64, -1)
    ref = RLECodec(engine="threads").encode_batch(rows, obs.dtype)
    enc = RLECodec(engine=engine).encode_batch(rows, obs.dtype)
    np.testing.assert_array_equal(enc.buffer, ref.buffer)
    out = np.empty_like(rows)
    RLECodec(engine=engine).decode_into(
        enc.buffer, enc.offsets, enc.lengths, enc.meta, out, np.arange(64), obs.dtype
    )
    assert_bit_exact(out, rows)


def test_bad_level_and_engine():
    with pytest.raises(ValueError, match="level must be one of"):
        RLECodec(12)
    with pytest.raises(ValueError, match="engine"):
        RLECodec(engine="gpu")


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
@given(a=runny_arrays(), level=st.sampled_from([8, 16, 32]), engine=st.sampled_from(ENGINES))
def test_roundtrip_property(a, level, engine):
    codec = RLECodec(level, engine=engine)
    payload = codec.encode(a)
    assert_bit_exact(codec.decode(payload, a.dtype, a.shape), a)
    vals, cnts = parse_payload(payload, a.dtype)
    assert cnts.sum() * vals.dtype.itemsize == a.nbytes
