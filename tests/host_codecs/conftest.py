"""Fixtures for host_codecs tests: codec specs (skipped when their package is missing) and the
awkward arrays every codec must round-trip. Real Atari frames come from tests/conftest.py
(`atari_stacks` / `atari_rollouts` fixtures, generated with ale-py once per test run)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from hc_helpers import special_arrays

#: Every codec setting the tests run, with the package it needs.
CODEC_SPECS = {
    "none": None,
    "rle": "numba",
    "rle:16": "numba",
    "rle:32": "numba",
    "igzip:0": "isal",
    "igzip:1": "isal",
    "igzip:3": "isal",
    "zstd:1": "zstandard",
    "zstd:3": "zstandard",
    "zstd:-1": "zstandard",
}


def _param(spec: str):
    pkg = CODEC_SPECS[spec]
    missing = pkg is not None and importlib.util.find_spec(pkg) is None
    return pytest.param(
        spec, id=spec, marks=pytest.mark.skipif(missing, reason=f"codec {spec!r} needs {pkg!r}")
    )


@pytest.fixture(params=[_param(s) for s in CODEC_SPECS])
def codec_spec(request) -> str:
    """Each codec setting in turn."""
    return request.param


@pytest.fixture(params=list(special_arrays()))
def special(request):
    """Each awkward batch in turn."""
    return special_arrays()[request.param]


@pytest.fixture(scope="module")
def breakout_frames(atari_stacks):
    """uint8 [5000, 84, 84]: the newest frame of each stacked Breakout observation."""
    return np.ascontiguousarray(atari_stacks["breakout_obs"][:, -1])
