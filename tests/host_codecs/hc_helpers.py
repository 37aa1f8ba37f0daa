"""Shared helpers of the host_codecs tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import numpy as np


def special_arrays() -> dict[str, np.ndarray]:
    """Batches ``[B, ...]`` of awkward inputs, each a worst or edge case for some codec."""
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 17, 5)).astype(np.float32)
    bits = f32.view(np.uint32)
    bits[0, 0, :3] = [0x7FC00001, 0xFFC12345, 0x80000000]  # NaN payloads, -0.0
    bits[1, 4:9, :] = 0x7F800001  # a run of one signalling-NaN pattern
    f64 = rng.standard_normal((2, 40)).astype(np.float64)
    f64[0, :10] = -0.0
    f64[1, 5:20] = np.nan
    i16 = rng.integers(-32768, 32767, (4, 30, 7), dtype=np.int16)
    i16[2] = -1
    return {
        "zeros_210x160x3": np.zeros((1, 210, 160, 3), np.uint8),  # one run of 100,800 bytes
        "noise_u8": rng.integers(0, 256, (3, 84, 84), dtype=np.uint8),
        "empty_0x84": np.zeros((2, 0, 84), np.uint8),
        "float32_nan_negzero": f32,
        "float64": f64,
        "int16": i16,
        "bool": rng.random((3, 50)) < 0.1,
        "uint16_long_runs": np.repeat(np.arange(3, dtype=np.uint16), 70_000).reshape(1, -1),
        "complex64": (rng.standard_normal((2, 9)) + 1j * rng.standard_normal((2, 9))).astype(np.complex64),
        "int64_scalar_items": np.array([5, -5, 2**62], dtype=np.int64),
    }


def assert_bit_exact(got: np.ndarray, want: np.ndarray) -> None:
    """Same dtype, shape and bytes (so NaN payloads and -0.0 count)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.tobytes() == want.tobytes()
