"""Eager calls at jit speed: every public buffer method runs as one cached compiled program.

A method decorated with `method` is `jax.jit` of itself, compiled once per argument structure, shapes, dtypes and
static values; inside `jit`, `lax.scan`, `vmap` or `grad` it is traced into the caller's program. What a bare
`jax.jit` would lose (range checks of concrete hyperparameters, errors naming arguments it would not take as they
are) and when trace-time checks run: `docs/guide.md`, "Eager calls".
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping

import jax
import numpy as np

from jaxbuffers import _timing, _validate

_INT32 = np.iinfo(np.int32)
_ARRAY_TYPES: set[type] = set()  # concrete classes of the JAX arrays seen: a set lookup is cheaper than isinstance


def passable(leaf) -> bool:
    """Whether a compiled program takes ``leaf`` as an argument without changing its value or dtype."""
    if type(leaf) in _ARRAY_TYPES:  # the common case first
        return True
    if isinstance(leaf, jax.Array):  # tracers included
        _ARRAY_TYPES.add(type(leaf))
        return True
    if isinstance(leaf, (np.ndarray, np.generic)):
        return leaf.dtype.kind in "biufc" and _validate.jax_holds(leaf.dtype)
    if isinstance(leaf, int):  # bool included
        return _INT32.min <= leaf <= _INT32.max
    return isinstance(leaf, (float, complex))


def _retrace_with_python_values(fn: Callable, args: tuple, kwargs: dict) -> None:
    """After a compiled call refused its arguments: trace `fn` again (`jax.eval_shape`) with the Python scalars kept as
    given, and raise the error that names the value given (`key: ... got int 0`), not the int32 tracer the program
    made of it. Returns when that trace passes (the caller raises the first error)."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    kept = [not isinstance(x, (jax.Array, np.ndarray, np.generic)) for x in leaves]
    if not any(isinstance(x, (int, float, complex)) for x in leaves):
        return

    def traced(*arrays):
        given = iter(arrays)
        a, kw = jax.tree_util.tree_unflatten(tree, [x if k else next(given) for x, k in zip(leaves, kept)])
        return fn(*a, **kw)

    try:
        jax.eval_shape(traced, *[x for x, k in zip(leaves, kept) if not k])
    except (TypeError, ValueError) as e:
        raise e.with_traceback(None) from None


def method(*static: str, scalars: Mapping[str, tuple[float, float]] | None = None) -> Callable:
    """Decorate a pure buffer method (or function) so that it runs as one cached compiled program.

    Args:
      *static: names of the arguments that are static Python values (batch sizes, lengths, flags); each distinct
        value compiles a program of its own.
      scalars: `{name: (lo, hi)}` of traced scalar hyperparameters whose concrete values are range-checked before the
        call (`docs/guide.md`, "Eager calls").

    Returns:
      The decorated function, with the original's name, signature and docstring; the plain function is its
      `uncompiled` attribute.

    Example:
      `@_compiled.method("batch_size", scalars={"beta": (0.0, math.inf)})` above
      `def sample(self, key, batch_size, *, beta=1.0)`.
    """
    scalars = dict(scalars or {})

    def wrap(fn: Callable) -> Callable:
        jitted = jax.jit(fn, static_argnames=static)
        names = list(inspect.signature(fn).parameters)
        checked = [(names.index(n), n, lo, hi) for n, (lo, hi) in scalars.items()]
        fixed = [(names.index(n), n) for n in static]
        fixed_at = {i for i, _ in fixed}

        is_method = bool(names) and names[0] == "self"
        public = not fn.__name__.startswith("_")  # a private method is timed inside its public caller

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if public and _timing.active():  # a host timing block is open (jaxbuffers.timing): "SumMinTree.get"
                name = f"{type(args[0]).__name__}.{fn.__name__}" if is_method and args else fn.__qualname__
                return _timing.timed(name, dispatch, args, kwargs)
            return dispatch(*args, **kwargs)

        def dispatch(*args, **kwargs):
            # Arguments by position or keyword, without inspect's binding (this runs every call).
            for i, name, lo, hi in checked:
                x = kwargs[name] if name in kwargs else args[i] if i < len(args) else None
                if x is not None:
                    _validate.scalar_parameter(name, x, lo, hi)
            try:
                for i, name in fixed:
                    hash(kwargs[name] if name in kwargs else args[i] if i < len(args) else None)
            except TypeError:
                return fn(*args, **kwargs)  # an unhashable static value: its own check names it
            traced = [a for i, a in enumerate(args) if i not in fixed_at] + [v for k, v in kwargs.items() if k not in static]
            if all(passable(leaf) for leaf in jax.tree_util.tree_leaves(traced)):
                try:
                    return jitted(*args, **kwargs)
                except (TypeError, ValueError):
                    _retrace_with_python_values(fn, args, kwargs)
                    raise
            return fn(*args, **kwargs)  # its own checks name what is wrong

        call.uncompiled = fn
        return call

    return wrap
