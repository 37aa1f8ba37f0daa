"""Shared test helpers: real Atari frames (generated once per test run) and a compile counter.

Helpers live here once; test modules import them through fixtures.
"""

from __future__ import annotations

import contextlib
import os

import pytest

import atari_frames

#: Steps played per game: enough for every test (5,000 consecutive stacks, several episode ends
#: of each game).
ATARI_STEPS = 5000


@pytest.fixture(scope="session")
def atari_rollouts(tmp_path_factory) -> dict:
    """Breakout and Pong, `ATARI_STEPS` random steps each: frames stored once plus stacked
    indices (keys, shapes and dtypes in tests/atari_frames.py).

    Generated once per test run: pytest-xdist workers share one file in the run's temporary
    directory (the first worker writes it, the others wait and read it).
    """
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "atari_frames" / f"rollouts_{ATARI_STEPS}.npz"
    return atari_frames.cached(path, lambda: atari_frames.rollouts(ATARI_STEPS))


@pytest.fixture(scope="session")
def atari_stacks(atari_rollouts) -> dict:
    """`breakout_obs` / `pong_obs`: uint8 [5000, 4, 84, 84] consecutive stacked observations."""
    return atari_frames.stacks(atari_rollouts)


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


def pytest_collection_modifyitems(config, items):
    """Deselect the tests marked `devices(n)` / `fewer_devices(n)` that this process's device count cannot run."""
    marked = [(it, m) for it in items for m in it.iter_markers() if m.name in ("devices", "fewer_devices")]
    if not marked:
        return
    import jax

    count = jax.device_count()
    drop = {id(it) for it, m in marked if (count >= m.args[0]) != (m.name == "devices")}
    if drop:
        config.hook.pytest_deselected(items=[it for it in items if id(it) in drop])
        items[:] = [it for it in items if id(it) not in drop]
