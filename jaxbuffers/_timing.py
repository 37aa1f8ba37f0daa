"""Host wall-clock timing of eager buffer calls, `timing()` and its `Timing` (`docs/api/metrics.md`, "Host timing")."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterator

import jax

from jaxbuffers import _validate

__all__ = ["Timing", "timing", "span", "timed_methods"]

_ACTIVE: list["Timing"] = []  # the open timing() blocks, innermost last
_LOCAL = threading.local()  # .depth: timed calls in progress on this thread (only the outermost is counted)


class Timing:
    """Calls and seconds per name, collected by a `timing()` block (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, list[float]] = {}  # name -> [calls, total seconds, max seconds]

    def add(self, name: str, seconds: float) -> None:
        """Count one call of `name` that took `seconds` (a float >= 0).

        Raises (before anything is counted):
          TypeError: `name` not a str, `seconds` not a real number. ValueError: `seconds` negative, NaN or infinite.
        """
        _validate.text("name", name)
        seconds = float(_validate.scalar_parameter("seconds", seconds, 0.0))
        with self._lock:
            c = self._data.setdefault(name, [0, 0.0, 0.0])
            c[:] = [c[0] + 1, c[1] + seconds, max(c[2], seconds)]

    def summary(self, prefix: str | None = None) -> dict:
        """`{name: {"calls": int, "total_s": float, "mean_s": float, "max_s": float}}`, names sorted; with `prefix`
        only the names starting with it (e.g. `"ReplayBuffer."`).

        Raises:
          TypeError: `prefix` neither a str nor None.
        """
        _validate.text("prefix", prefix, optional=True)
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._data.items() if prefix is None or k.startswith(prefix))
        return {k: {"calls": int(n), "total_s": t, "mean_s": t / n, "max_s": m} for k, (n, t, m) in items}


@contextlib.contextmanager
def timing() -> Iterator[Timing]:
    """Time every eager buffer call (and every `span`) made inside the block; yields the `Timing`."""
    t = Timing()
    _ACTIVE.append(t)
    try:
        yield t
    finally:
        _ACTIVE.remove(t)


def active() -> bool:
    """Whether some `timing()` block is open."""
    return bool(_ACTIVE)


@contextlib.contextmanager
def span(name: str) -> Iterator[None]:
    """Count the block's host time under `name` in every open `timing()` block (nothing when none is open).

    Raises:
      TypeError: `name` not a str (before the block runs).
    """
    _validate.text("name", name)
    if not _ACTIVE:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        _count(name, time.perf_counter() - start)


def _count(name: str, seconds: float) -> None:
    for t in list(_ACTIVE):
        t.add(name, seconds)


def timed(name: str, fn: Callable, args: tuple, kwargs: dict):
    """`fn(*args, **kwargs)`, timed until its result is ready unless traced or inside another timed call."""
    if getattr(_LOCAL, "depth", 0) or any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
        return fn(*args, **kwargs)
    _LOCAL.depth = 1
    start = time.perf_counter()
    try:
        out = jax.block_until_ready(fn(*args, **kwargs))
    finally:
        _LOCAL.depth = 0
    _count(name, time.perf_counter() - start)
    return out


def timed_methods(cls: type) -> type:
    """Class decorator: every public method (inherited ones included; not properties, classmethods or `replace`) is
    timed under `Class.method` when called eagerly inside a `timing()` block. Returns `cls`, its methods wrapped."""
    for name in dir(cls):
        fn = inspect.getattr_static(cls, name)
        if name.startswith("_") or name == "replace" or not inspect.isfunction(fn) or getattr(fn, "timed", False):
            continue
        setattr(cls, name, _timed_method(fn, name))
    return cls


def _timed_method(fn: Callable, name: str) -> Callable:
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        if not _ACTIVE:
            return fn(self, *args, **kwargs)
        return timed(f"{type(self).__name__}.{name}", fn, (self, *args), kwargs)

    call.timed = True
    return call
