"""Shared test helpers: real Atari frames (generated once per test run) and a compile counter.

Helpers live here once; test modules import them through fixtures.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import atari_frames

#: XLA flags the tests compile with, each added to any XLA_FLAGS given unless they set it. Compilation is most of a
#: test's time; these flags make it cheaper. The results the tests check are the library's semantics, which hold
#: under any correct compilation; the DQN example's smoke test, the README's flagship run and the benchmarks compile
#: with XLA's defaults:
#: - backend (LLVM) optimisation level 0: LLVM without fast-math keeps every float result; only the machine code is
#:   less tuned;
#: - XLA's CPU element-wise (LLVM IR) emitters rather than its MLIR fusion emitters: about half the compile time of
#:   the suite's small programs, without fast-math either way (this also changes some of XLA's fusion decisions);
#: - the LLVM module compiled in one piece, not split for parallel compilation (the split costs more than it saves
#:   on these small programs and two cores).
#: XLA aborts on a flag it does not know: a flag this jaxlib lacks (an older or newer one) is left out (`_xla_knows`).
#: A subprocess that must compile as a user's program does takes the `user_xla_flags` fixture.
TEST_XLA_FLAGS = {
    "--xla_backend_optimization_level": "0",
    "--xla_cpu_use_fusion_emitters": "false",
    "--xla_cpu_parallel_codegen_split_count": "1",
}


def _xla_knows(flags: str) -> bool:
    """Whether this jaxlib's XLA starts with these XLA_FLAGS: one tiny program compiled in a subprocess."""
    code = "import jax; jax.jit(lambda x: x + 1)(1).block_until_ready()"
    env = {**os.environ, "XLA_FLAGS": flags}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=300).returncode == 0


_missing = [f"{flag}={value}" for flag, value in TEST_XLA_FLAGS.items() if flag not in os.environ.get("XLA_FLAGS", "")]
if _missing:  # once per run: the pytest-xdist workers and the tests' subprocesses inherit the result
    _given = os.environ.get("XLA_FLAGS", "")
    if not _xla_knows(" ".join([_given, *_missing])):
        _missing = [f for f in _missing if _xla_knows(f"{_given} {f}")]
    os.environ["XLA_FLAGS"] = " ".join([_given, *_missing]).strip()

#: Steps played per game: enough for every test (5,000 consecutive stacks, several episode ends
#: of each game).
ATARI_STEPS = 5000


def pytest_configure(config):
    """One persistent XLA compilation cache per test run, in the run's temporary directory (shared by
    the pytest-xdist workers): a program another test or worker already compiled is loaded, not
    compiled again. Nothing carries over from one run to the next."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None and config.getoption("numprocesses", None):
        return  # the pytest-xdist controller runs no test
    if workerinput is not None:
        path = Path(config.option.basetemp).parent / "xla_cache"
    else:
        path = Path(tempfile.mkdtemp(prefix="jaxbuffers-xla-"))
        config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    import jax

    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


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


@pytest.fixture
def user_xla_flags() -> str:
    """XLA_FLAGS without the tests' own compile flags (`TEST_XLA_FLAGS`): a subprocess given them compiles as a
    user's program does."""
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f.split("=")[0] not in TEST_XLA_FLAGS)


@contextlib.contextmanager
def count_compiles():
    """Count the programs built inside the block: ``with count_compiles() as n: ...; n()``.

    A program is built by an XLA backend compilation or loaded from the run's persistent
    compilation cache (see `pytest_configure`); both count."""
    from jax import monitoring

    events: list[str] = []

    def compiled(name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            events.append(name)

    def loaded(name, **kwargs):
        if name == "/jax/compilation_cache/cache_hits":
            events.append(name)

    monitoring.register_event_duration_secs_listener(compiled)
    monitoring.register_event_listener(loaded)
    try:
        yield lambda: len(events)
    finally:
        monitoring.unregister_event_duration_listener(compiled)
        monitoring.unregister_event_listener(loaded)


def rerun_on_forced_devices(path: str, n: int, runner: str, timeout: int = 900) -> str:
    """Run every test of the file `path` but `runner` (the test that calls this), slow ones included, in a subprocess
    on `n` forced host CPU devices; assert that the run passed and return pytest's summary line."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "slow or not slow",
                           "-k", f"not {runner}", path], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture
def forced_devices():
    """`rerun_on_forced_devices`, as a fixture."""
    return rerun_on_forced_devices


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
