"""Eager calls at jit speed: every public buffer method runs as one cached compiled program.

A method decorated with :func:`method` is ``jax.jit`` of itself. Called eagerly (a notebook, an
SB3-style host loop) it compiles once per argument structure, shapes, dtypes and static values,
then runs one program per call instead of dispatching its operations one by one. Called inside
``jit``, ``lax.scan``, ``vmap`` or ``grad`` it is traced into the caller's program as usual (a
nested ``jit`` is inlined), so the same code serves both.

Two things a bare ``jax.jit`` would lose are kept:

* Concrete hyperparameters (``beta``, ``gamma``, ...) become tracers inside the program, where
  their range cannot be checked; the ones a method declares in ``scalars`` are checked first
  (:func:`jaxbuffers._validate.scalar_parameter`), so ``gamma=7`` still raises a ``ValueError``
  naming ``gamma``.
* Arguments JAX cannot pass to a program (a string, ``None`` where an array belongs, an
  unhashable static value) make the method run uncompiled, so that its own checks raise their
  error naming the argument, instead of JAX's generic one.

Trace-time checks (tree structure, shapes, dtypes, static sizes) run while the program is traced,
on the first call with a new structure, and raise the same errors eagerly and under ``jit``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping

import jax
import numpy as np

from jaxbuffers import _validate

_PROGRAM_LEAVES = (jax.Array, np.ndarray, np.generic, int, float, bool, complex)


def _passable(tree) -> bool:
    """Whether every leaf of ``tree`` is something a compiled program takes as an argument, as it
    is: a numpy float64 leaf with x64 off would be narrowed at the call, before any check ran."""
    return all(
        isinstance(leaf, _PROGRAM_LEAVES)
        and not (isinstance(leaf, (np.ndarray, np.generic)) and jax.dtypes.canonicalize_dtype(leaf.dtype) != leaf.dtype)
        for leaf in jax.tree_util.tree_leaves(tree)
    )


def method(*static: str, scalars: Mapping[str, tuple[float, float]] | None = None) -> Callable:
    """Decorate a pure buffer method (or function) so that it runs as one cached compiled program.

    Args:
      *static: names of the arguments that are static Python values (batch sizes, lengths,
        flags); each distinct value compiles a program of its own.
      scalars: ``{name: (lo, hi)}`` of traced scalar hyperparameters whose concrete values are
        range-checked before the call (see the module doc).

    Returns:
      The decorated function, with the original's name, signature and docstring.
    """
    scalars = dict(scalars or {})

    def wrap(fn: Callable) -> Callable:
        jitted = jax.jit(fn, static_argnames=static)
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs).arguments
            for name, (lo, hi) in scalars.items():
                if bound.get(name) is not None:
                    _validate.scalar_parameter(name, bound[name], lo, hi)
            traced = {k: v for k, v in bound.items() if k not in static}
            try:
                statics_ok = all(hash(bound[k]) is not None for k in static if k in bound)
            except TypeError:
                statics_ok = False
            if not statics_ok or not _passable(traced):
                return fn(*args, **kwargs)  # its own checks name what is wrong
            return jitted(*args, **kwargs)

        call.uncompiled = fn  # the plain function, e.g. for tests that compare both
        return call

    return wrap
