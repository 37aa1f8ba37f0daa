"""Shared test helpers: real Atari data loading and a compile counter.

Helpers live here once; test modules import them through fixtures.
"""

from __future__ import annotations

import contextlib
import os
import pathlib

import numpy as np
import pytest

# The real frames sit in ../shared/data beside the checkout; JAXBUFFERS_DATA points elsewhere.
DATA_DIR = pathlib.Path(os.environ.get("JAXBUFFERS_DATA") or pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data")


def load_atari(name: str) -> dict:
    """Load ``../shared/data/<name>.npz`` as a dict of numpy arrays, or skip with a reason."""
    path = DATA_DIR / f"{name}.npz"
    if not path.exists():
        pytest.skip(f"real Atari frames not found at {path} (the shared/ folder sits beside the repo; or set JAXBUFFERS_DATA)")
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="session")
def atari_rollouts() -> dict:
    """Breakout and Pong: frames stored once plus stacked indices (see shared/data/README.md)."""
    return load_atari("atari_rollouts")


@pytest.fixture(scope="session")
def atari_stacks() -> dict:
    """``breakout_obs`` / ``pong_obs``: uint8 [5000, 4, 84, 84] consecutive stacked observations."""
    return load_atari("atari_stacked_5k")


@contextlib.contextmanager
def count_compiles():
    """Count XLA backend compilations inside the block: ``with count_compiles() as n: ...; n()``."""
    from jax import monitoring

    events: list[str] = []

    def listener(name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            events.append(name)

    monitoring.register_event_duration_secs_listener(listener)
    try:
        yield lambda: len(events)
    finally:
        monitoring.unregister_event_duration_listener(listener)


@pytest.fixture
def compile_counter():
    """The :func:`count_compiles` context manager, as a fixture."""
    return count_compiles
