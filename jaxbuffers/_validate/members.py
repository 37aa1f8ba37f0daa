"""The check that a buffer's state is one buffer, not several stacked with `jax.vmap`: a leading axis on the leaf
named by the class attribute `_cursor` (a dotted path to the write cursor, a scalar in one buffer).
"""

from __future__ import annotations

import functools
import inspect
import operator
from typing import Any

import jax
import numpy as np

from jaxbuffers import _timing


def member_axes(buffer: Any) -> tuple[int, ...]:
    """The leading member axes of `buffer`'s state: its cursor's shape (`()` for one buffer or no `_cursor`)."""
    get = _cursor_getter(type(buffer))
    if get is None:
        return ()
    cursor = get(buffer)
    shape = getattr(cursor, "shape", None)  # a JAX or NumPy array, a tracer: read directly
    return tuple(np.shape(cursor) if shape is None else shape)


@functools.lru_cache(maxsize=None)
def _cursor_getter(cls: type):
    """`operator.attrgetter` of `cls._cursor`, None for a class without one."""
    path = getattr(cls, "_cursor", None)
    return None if path is None else operator.attrgetter(path)


def _axes(stack: tuple[int, ...]) -> str:
    return f"a leading member axis of {stack[0]}" if len(stack) == 1 else f"leading member axes of shape {stack}"


def one_member(method: str, buffer: Any, *, mapped: bool = True) -> None:
    """ValueError for a stacked state given to `type(buffer).method` outside `jax.vmap` (`mapped`: works under it)."""
    stack = member_axes(buffer)
    if not stack:
        return
    name = f"{type(buffer).__name__}.{method}"
    one = f"take one member with jax.tree.map(lambda x: x[i], buf).{method}(...)"
    how = f"call {method} under jax.vmap (jax.vmap(lambda b, ...: b.{method}(...))(buf, ...)), or {one}" if mapped else one
    raise ValueError(f"{name}: the state has {_axes(stack)} (buffers stacked with jax.vmap, one per member); {how}")


def unstacked(name: str, buffer: Any, hint: str) -> None:
    """ValueError naming `name`, the member axes and `hint` (how to reach one member) for a stacked `buffer`."""
    stack = member_axes(buffer)
    if stack:
        raise ValueError(f"{name}: a {type(buffer).__name__} with {_axes(stack)} (buffers stacked with jax.vmap); {hint}")


# no member's values read: a stacked state's store can be closed, its bytes counted (every member's)
_UNCHECKED = frozenset({"replace", "close", "estimate_memory_pressure", "uncompressed_nbytes"})
# read values on the host, never under jit or jax.vmap: what to read inside instead
_HOST = {
    "num_added": "read the two-word counter buf.added ([high, low]: high * 2**30 + low items)",
    "stats": "read the counters in buf.metrics (jaxbuffers._metrics.Metrics)",
}


def on_host(method: str, buffer: Any, inside: str | None = None) -> None:
    """TypeError naming `type(buffer).method`, a method reading values on the host, and what to read inside instead
    (`inside`, by default `_HOST[method]`) when a leaf of `buffer` is traced (under `jit` or `jax.vmap`)."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(buffer)):
        inside = _HOST[method] if inside is None else inside
        name = f"{type(buffer).__name__}.{method}"
        raise TypeError(f"{name} is read on the host: call it outside jit/vmap; inside, {inside}")


def one_member_methods(cls: type | None = None, *, mapped: bool = True) -> Any:
    """Class decorator: every public method of `cls` (inherited ones too; not properties, classmethods, `_UNCHECKED`)
    calls `one_member` first (and `on_host`, for the `_HOST` methods), then is timed
    (`jaxbuffers._timing.timed_methods`)."""
    if cls is None:
        return functools.partial(one_member_methods, mapped=mapped)
    for name in dir(cls):
        fn = inspect.getattr_static(cls, name)
        if name.startswith("_") or name in _UNCHECKED or not inspect.isfunction(fn) or getattr(fn, "one_member", False):
            continue
        setattr(cls, name, _checked(fn, name, mapped and name not in _HOST))
    return _timing.timed_methods(cls)


def _checked(fn, name: str, mapped: bool):
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        one_member(name, self, mapped=mapped)
        if name in _HOST:
            on_host(name, self)
        return fn(self, *args, **kwargs)

    call.one_member = True
    return call
