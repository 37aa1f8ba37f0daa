"""Shared benchmark helpers: timing with medians, JSON lines, machine and version info."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from importlib import metadata
from typing import Callable

import jax


def machine_info() -> dict:
    """CPU model, core count, platform and JAX backend, for the docs table header."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "backend": jax.default_backend()}


def versions(*packages: str) -> dict:
    """Installed versions of ``packages`` (``None`` where not installed)."""
    out = {}
    for p in packages:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def median_seconds(fn: Callable[[], object], *, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs; ``fn`` must block on its result."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def emit(record: dict) -> None:
    """Print one JSON line (the benchmark protocol)."""
    print(json.dumps(record), flush=True)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="short run (fewer repetitions and sizes)")
    p.add_argument("--repeats", type=int, default=None, help="timed repetitions per case (median reported)")
    return p
