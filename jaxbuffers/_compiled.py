"""Eager calls at jit speed: every public buffer method runs as one cached compiled program, however the call is
spelt, and traces into a caller's program (`docs/guide.md`, "Eager calls").
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Mapping

import jax
import numpy as np

from jaxbuffers import _timing, _validate

_INT32 = np.iinfo(np.int32)
_NUMPY_STATIC = (np.integer, np.bool_)  # static values keyed as the equal Python int/bool (the checks accept both)
_ARRAY_TYPES: set[type] = set()  # concrete classes of the JAX arrays seen: a set lookup is cheaper than isinstance
_HELD_TYPES: set[type] = set()  # those of them holding device buffers (not tracers): they can be donated or deleted
_HOST_INTS: dict[int, tuple[weakref.ref, int]] = {}  # id(array) -> (weak reference to it, its value)


def host_int(x) -> int:
    """`int(x)` of a concrete scalar array, without waiting for its program when `remember_int` was told its value."""
    known = _HOST_INTS.get(id(x))
    if known is not None and known[0]() is x:
        return known[1]
    return int(x)


def remember_int(x: jax.Array, value: int) -> None:
    """Record that the concrete scalar array `x` holds `value` (read back by `host_int` while `x` lives)."""
    key = id(x)

    def forget(ref: weakref.ref) -> None:
        if _HOST_INTS.get(key, (None,))[0] is ref:
            del _HOST_INTS[key]

    _HOST_INTS[key] = (weakref.ref(x, forget), int(value))


def all_passable(leaves: list) -> bool:
    """`passable` of every leaf: one set test when all are JAX arrays of a class seen before (a buffer's state)."""
    unseen = set(map(type, leaves)).difference(_ARRAY_TYPES)
    return not unseen or all(passable(x) for x in leaves if type(x) in unseen)


def passable(leaf) -> bool:
    """Whether a compiled program takes ``leaf`` as an argument without changing its value or dtype."""
    if type(leaf) in _ARRAY_TYPES:  # the common case first
        return True
    if isinstance(leaf, jax.Array):  # tracers included
        _ARRAY_TYPES.add(type(leaf))
        if not isinstance(leaf, jax.core.Tracer):
            _HELD_TYPES.add(type(leaf))
        return True
    if isinstance(leaf, (np.ndarray, np.generic)):
        return leaf.dtype.kind in "biufc" and _validate.jax_holds(leaf.dtype)
    if isinstance(leaf, int):  # bool included
        return _INT32.min <= leaf <= _INT32.max
    return isinstance(leaf, (float, complex))


def check_not_deleted(what: str, values: list) -> None:
    """RuntimeError naming `what` and the argument whose arrays were donated or deleted (`Array.is_deleted`, a host
    flag: no wait for the device), instead of XLA's error (which depends on whether the program was compiled). Any
    concrete JAX array is checked, of a class seen before or not (`jaxbuffers.save` calls it first)."""
    for v in values:
        if any(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and x.is_deleted()
               for x in jax.tree_util.tree_leaves(v)):
            given = "an array given was" if isinstance(v, jax.Array) else f"the {type(v).__name__} given holds arrays that were"
            raise RuntimeError(f"{what}: {given} donated to a jitted call (donate_argnums) or deleted; use what "
                               f"that call returned")


def _retrace_with_python_values(fn: Callable, args: tuple, kwargs: dict) -> None:
    """Trace `fn` again with the Python and numpy scalars as given, so that its error names them, not their tracers
    (a numpy float given for a static size is named as given)."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    kept = [not isinstance(x, (jax.Array, np.ndarray)) for x in leaves]
    if not any(isinstance(x, (int, float, complex, np.generic)) for x in leaves):
        return

    def traced(*arrays):
        given = iter(arrays)
        a, kw = jax.tree_util.tree_unflatten(tree, [x if k else next(given) for x, k in zip(leaves, kept)])
        return fn(*a, **kw)

    try:
        jax.eval_shape(traced, *[x for x, k in zip(leaves, kept) if not k])
    except (TypeError, ValueError) as e:
        raise e.with_traceback(None) from None


class _Given(int):
    """Stands, in `_layout`'s trial binding, for the call's given value at this index."""


def _layout(signature: inspect.Signature, n_args: int, keys: tuple[str, ...], static: tuple, scalars: dict) -> tuple:
    """How a call of `n_args` positional arguments and keywords `keys` binds to `signature` (or `bind`'s TypeError):
    `(defaults, positions, {keyword: i}, checks, static, traced, as_given)`, i into `(*args, *kwargs, *defaults)`."""
    bound = signature.bind(*map(_Given, range(n_args)), **{k: _Given(n_args + i) for i, k in enumerate(keys)})
    bound.apply_defaults()
    defaults: list = []

    def index(v) -> int:
        if type(v) is _Given:
            return int(v)
        defaults.append(v)
        return n_args + len(keys) + len(defaults) - 1

    positions, keywords, named = [], {}, {}  # indices: positional, {keyword: i}, {parameter: i}
    for name, v in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            positions += map(index, v)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            keywords.update({k: index(x) for k, x in v.items()})
        else:
            named[name] = i = index(v)
            if kind is inspect.Parameter.KEYWORD_ONLY:
                keywords[name] = i
            else:
                positions.append(i)
    static_at = tuple(named[n] for n in static)
    traced = tuple(i for i in (*positions, *keywords.values()) if i not in static_at)
    checks = tuple((name, named[name], lo, hi) for name, (lo, hi) in scalars.items())
    as_given = not defaults and positions == list(range(n_args)) and list(keywords.items()) == [
        (k, n_args + i) for i, k in enumerate(keys)]
    return tuple(defaults), tuple(positions), keywords, checks, static_at, traced, as_given


def method(*static: str, scalars: Mapping[str, tuple[float, float]] | None = None) -> Callable:
    """Decorate a pure buffer method (or function) to run as one cached compiled program (`functools.wraps`; the plain
    function is its `uncompiled` attribute). `static`: the names of the static arguments (batch sizes, lengths, flags;
    each value compiles its own program, a numpy int or bool the program of the equal Python one); `scalars`:
    `{name: (lo, hi)}` of traced scalar hyperparameters whose concrete values are range-checked first (the
    decorated function's `static` and `scalars` attributes, for callers that jit it themselves)."""
    scalars = dict(scalars or {})

    def wrap(fn: Callable) -> Callable:
        jitted = jax.jit(fn, static_argnames=static)
        signature = inspect.signature(fn)
        names = list(signature.parameters)
        unknown = [n for n in (*static, *scalars) if n not in names]
        if unknown:
            raise ValueError(f"method: {fn.__qualname__} has no argument(s) {unknown}; its arguments are {names}")

        is_method = bool(names) and names[0] == "self"
        public = not fn.__name__.startswith("_")  # a private method is timed inside its public caller

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if public and _timing.active():  # a host timing block is open (jaxbuffers.timing): "SumMinTree.get"
                name = f"{type(args[0]).__name__}.{fn.__name__}" if is_method and args else fn.__qualname__
                return _timing.timed(name, dispatch, args, kwargs)
            return dispatch(*args, **kwargs)

        layouts: dict[tuple, tuple] = {}  # one per way a call is spelt: (len(args), *kwargs) -> its _layout

        def dispatch(*args, **kwargs):
            spelt = (len(args), *kwargs) if kwargs else len(args)
            layout = layouts.get(spelt)
            if layout is None:
                try:
                    layout = layouts[spelt] = _layout(signature, len(args), tuple(kwargs), static, scalars)
                except TypeError:
                    return fn(*args, **kwargs)  # Python's own error, naming the method
            defaults, positions, keywords, checks, static_at, traced_at, as_given = layout
            given = (*args, *kwargs.values(), *defaults) if kwargs or defaults else args
            for name, i, lo, hi in checks:
                if given[i] is not None:
                    _validate.scalar_parameter(name, given[i], lo, hi)
            try:
                for i in static_at:
                    hash(given[i])
            except TypeError:
                return fn(*args, **kwargs)  # an unhashable static value: its own check names it
            if any(isinstance(given[i], _NUMPY_STATIC) for i in static_at):  # np.int64(4) is the program of 4
                given = tuple(v.item() if i in static_at and isinstance(v, _NUMPY_STATIC) else v
                              for i, v in enumerate(given))
                as_given = False
            if not as_given:
                args, kwargs = [given[i] for i in positions], {k: given[i] for k, i in keywords.items()}
            leaves = jax.tree_util.tree_leaves([given[i] for i in traced_at])
            if all_passable(leaves):
                for x in leaves:
                    if type(x) in _HELD_TYPES and x.is_deleted():
                        name = f"{type(given[0]).__name__}.{fn.__name__}" if is_method and given else fn.__qualname__
                        check_not_deleted(name, [given[i] for i in traced_at])
                try:
                    return jitted(*args, **kwargs)
                except (TypeError, ValueError):
                    _retrace_with_python_values(fn, args, kwargs)
                    raise
            return fn(*args, **kwargs)  # its own checks name what is wrong

        call.uncompiled = fn
        call.static, call.scalars = static, scalars
        return call

    return wrap
