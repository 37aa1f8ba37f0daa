"""Every argument and input check of the library, each in one place, reached as `_validate.<name>` (those of
`.steps`, `.members` and `.sharded` re-exported). Wrong structure, kind or dtype raises `TypeError`, wrong
shape or value `ValueError`, each message starting with the argument's name; nothing is cast (`docs/guide.md`, 8).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_INT32 = np.iinfo(np.int32)
_KINDS = {"floating": jnp.floating, "integer": jnp.integer, "bool": jnp.bool_}


def leaf_name(path) -> str:
    """Readable name of a leaf path: ``obs['pixels']``, ``[0].reward``; ``<root>`` for a bare array."""
    return jax.tree_util.keystr(tuple(path)) or "<root>"


def leaf_path(what: str, path) -> str:
    """The name of the leaf at `path` of the argument `what`: ``batch['obs']``, or ``batch`` for the root."""
    return what + jax.tree_util.keystr(tuple(path))


def unexpected(name: str, want: str, x: Any, why: str = "") -> TypeError:
    """The TypeError ``name: expected <want>, got <type> <repr>`` (the repr cut at 60 characters), then ``why``."""
    return TypeError(f"{name}: expected {want}, got {type(x).__name__} {x!r:.60}{why}")


def _is_key(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _is_int(v: Any) -> bool:
    """A Python or numpy int, not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_array_like(x) -> bool:
    """An array of JAX (typed keys included) or numpy: a shape and a numpy or JAX dtype (not a torch tensor)."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        return False
    try:
        np.dtype(x.dtype)
    except TypeError:
        return isinstance(x, (jax.Array, jax.ShapeDtypeStruct))
    return True


def is_array(x) -> bool:
    """`_is_array_like` with values: not an abstract `jax.ShapeDtypeStruct` (allowed in examples only)."""
    return _is_array_like(x) and not isinstance(x, jax.ShapeDtypeStruct)


def jax_holds(dtype) -> bool:
    """Whether JAX holds arrays of `dtype` as they are (not a 64-bit dtype it narrows while x64 is off)."""
    return jax.dtypes.canonicalize_dtype(dtype) == np.dtype(dtype)


def not_array(name: str, x: Any, want: str = "an array (JAX or numpy)", dtype: Any = None) -> TypeError:
    """The TypeError for `x` given where `want` (an array, of `dtype` if known) belongs; hints for lists, tensors."""
    got, hint = f"{type(x).__name__} {x!r:.60}", ""
    if isinstance(x, (list, tuple)):
        kind = None if dtype is None else "bool_" if np.dtype(dtype) == np.bool_ else np.dtype(dtype).name
        to = "dtype" if kind is None else f"{'np' if hasattr(np, kind) else 'jnp'}.{kind}"  # bfloat16: jnp's
        got, hint = f"a {type(x).__name__} of {len(x)}", f"; pass an array with an explicit dtype, e.g. np.asarray(x, {to})"
    if type(x).__module__.startswith("torch"):
        hint = "; convert it with jaxbuffers.interop.torch.from_torch"
    return TypeError(f"{name}: expected {want}, got {got}{hint}")


def item_spec(example: Any, what: str = "example_item") -> Any:
    """The per-item spec (pytree of ``jax.ShapeDtypeStruct``) of an example of array leaves, dtypes kept exactly."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(example)
    if not leaves:
        raise ValueError(f"{what}: expected a pytree with at least one array leaf, got {example!r}")
    specs = []
    for path, leaf in leaves:
        name = leaf_path(what, path)
        if isinstance(leaf, (bool, int, float, complex)) and not isinstance(leaf, np.generic):
            raise TypeError(f"{name}: expected an array or jax.ShapeDtypeStruct (its dtype is stored exactly), "
                            f"got {type(leaf).__name__} {leaf!r}; wrap it, e.g. jnp.float32({leaf!r})")
        if not _is_array_like(leaf):
            raise not_array(name, leaf, "an array (JAX or numpy) or a jax.ShapeDtypeStruct")
        if _is_key(leaf.dtype):
            raise TypeError(f"{name}: expected a numeric array, got a PRNG key array ({leaf.dtype}); store its raw "
                            f"bits, jax.random.key_data(key), and rebuild it with jax.random.wrap_key_data")
        dtype = np.dtype(leaf.dtype)
        if not (dtype == np.bool_ or jnp.issubdtype(dtype, jnp.number)):
            raise TypeError(f"{name}: expected a numeric or bool dtype, got {dtype}")
        canonical = jax.dtypes.canonicalize_dtype(dtype)
        if canonical != dtype:
            raise TypeError(f"{name}: dtype {dtype} cannot be stored without narrowing to {canonical} "
                            f"(jax_enable_x64 is off); pass a {canonical} array or enable x64")
        specs.append(jax.ShapeDtypeStruct(tuple(leaf.shape), dtype))
    return jax.tree_util.tree_unflatten(treedef, specs)


def _structure_error(spec, batch, what: str) -> TypeError:
    exp = {leaf_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(spec)[0]}
    got = {leaf_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(batch)[0]}
    missing, extra = sorted(exp - got), sorted(got - exp)
    detail = [f"{kind} leaves {v}" for kind, v in (("missing", missing), ("unexpected", extra)) if v]
    if not detail:
        detail.append(f"same leaf names but different containers: expected {jax.tree_util.tree_structure(spec)}, "
                      f"got {jax.tree_util.tree_structure(batch)}")
    return TypeError(f"{what}: tree structure differs from the example item: " + "; ".join(detail))


def check_batch(spec: Any, batch: Any, batch_ndim: int = 1, what: str = "batch", lead_names: tuple[str, ...] = ("B", "T")) -> tuple[int, ...]:
    """Check ``batch`` against the item ``spec``: the same structure, each leaf of the spec's dtype and of shape
    ``lead + spec.shape``, ``lead`` (``batch_ndim`` axes, named ``lead_names``) the same for all; returns ``lead``."""
    if jax.tree_util.tree_structure(batch) != jax.tree_util.tree_structure(spec):
        raise _structure_error(spec, batch, what)
    lead, lead_from = None, ""  # the leading axes of the first leaf, its name
    for (path, s), leaf in zip(jax.tree_util.tree_flatten_with_path(spec)[0], jax.tree_util.tree_leaves(batch)):
        name = leaf_path(what, path)
        if not is_array(leaf):
            raise not_array(name, leaf, dtype=s.dtype)
        shape, tail = tuple(leaf.shape), tuple(s.shape)
        if len(shape) != batch_ndim + len(tail) or shape[batch_ndim:] != tail:
            if batch_ndim == 0:
                raise ValueError(f"{name}: expected shape {tail}, got {shape}")
            axes = ", ".join(lead_names[:batch_ndim]) if batch_ndim <= len(lead_names) else f"{batch_ndim} axes"
            raise ValueError(f"{name}: expected shape [{axes}, *{list(tail)}] (per-item shape {tail} after "
                             f"{batch_ndim} leading axes), got {shape}")
        if leaf.dtype != s.dtype:
            raise TypeError(f"{name}: expected dtype {np.dtype(s.dtype)}, got {leaf.dtype} "
                            f"(nothing is cast implicitly; convert it explicitly if that is what you want)")
        if lead is None:
            lead, lead_from = shape[:batch_ndim], name
        elif shape[:batch_ndim] != lead:
            raise ValueError(f"{name}: leading axes {shape[:batch_ndim]} disagree with {lead_from}'s {lead}; "
                             f"every leaf of one batch must have the same leading axes")
    if lead is None:
        raise ValueError(f"{what}: expected at least one array leaf, got {batch!r}")
    return lead


def layout(tree: Any) -> tuple[list, tuple]:
    """``(leaves, signature)``: a hashable key of the structure and each leaf's type, shape and dtype of a pytree."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return leaves, (treedef, tuple((type(x), getattr(x, "shape", None), getattr(x, "dtype", None)) for x in leaves))


def tree_nbytes(tree: Any) -> int:
    """Total bytes of the array leaves of `tree` (arrays or ShapeDtypeStructs, e.g. an item spec)."""
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def static_int(name: str, value, minimum: int = 1, maximum: int = _INT32.max) -> int:
    """A static size: a Python (or numpy) int, not a bool or float, in `[minimum, maximum]` (default int32's)."""
    if not _is_int(value) or int(value) < minimum:
        raise ValueError(f"{name}: expected a Python int >= {minimum}, got {value!r}")
    if int(value) > maximum:
        limit = "2**31 - 1 (int32 arithmetic)" if maximum == _INT32.max else maximum
        raise ValueError(f"{name}: expected at most {limit}, got {value!r}")
    return int(value)


def integer(name: str, value, minimum: int | None = None) -> int:
    """An int option that is not a size (an id): a Python or numpy int, not a bool or float, >= `minimum` if given."""
    want = "an int" if minimum is None else f"an int >= {minimum}"
    if not _is_int(value):
        raise unexpected(name, want, value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected {want}, got {value!r}")
    return int(value)


def divisor(name: str, value, total: int, what: str) -> int:
    """`value` as a Python int >= 1 (`static_int`) that divides `total` (`what` names it); else ValueError."""
    value = static_int(name, value)
    if total % value:
        divisors = [d for d in range(1, min(total, 64) + 1) if total % d == 0]
        raise ValueError(f"{name}: expected a divisor of {what} = {total} (e.g. {divisors}), got {value}")
    return value


def keyword_sizes(create: Callable) -> Callable:
    """Decorate a buffer's `create` (below `classmethod`): sizes given by position raise a TypeError with the call."""
    params = list(inspect.signature(create).parameters.values())[1:]  # after cls
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    sizes = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]

    @functools.wraps(create)
    def call(cls, *args, **kwargs):
        if len(args) > len(positional):
            name = f"{cls.__name__}.create"
            names = f"{', '.join(sizes[:-1])} and {sizes[-1]} are" if len(sizes) > 1 else f"{sizes[0]} is"
            usage = ", ".join([*positional, *(f"{s}=..." for s in sizes)])
            extra = len(args) - len(positional)
            raise TypeError(f"{name}: {names} keyword-only, got {extra} positional argument{'s' if extra > 1 else ''} "
                            f"after {', '.join(positional)}; call {name}({usage})")
        return create(cls, *args, **kwargs)

    return call


def scalar_parameter(name: str, x: Any, lo: float, hi: float = math.inf) -> Any:
    """A scalar hyperparameter that may be traced (a discount), returned unchanged: a Python or numpy int or float, or
    a 0-d integer or floating array; a concrete one finite and in `[lo, hi]`."""
    want = "a float" + (f" in [{lo:g}, {hi:g}]" if math.isfinite(hi) else f" >= {lo:g}") + " or a 0-d float array"
    if x is None or isinstance(x, (bool, np.bool_, complex, np.complexfloating)):
        raise TypeError(f"{name}: expected {want}, got {x!r}")
    if not isinstance(x, (int, float, np.integer, np.floating)):
        dtype = getattr(x, "dtype", None)
        if dtype is None or not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
            raise TypeError(f"{name}: expected {want}, got {type(x).__name__} {getattr(x, 'dtype', '')}".rstrip())
        if jnp.ndim(x) != 0:
            raise ValueError(f"{name}: expected a scalar (shape ()), got shape {jnp.shape(x)}")
        if isinstance(x, jax.core.Tracer):
            return x  # value unknown at trace time: the range cannot be checked
    value = float(x)
    if not (math.isfinite(value) and lo <= value <= hi):  # also rejects NaN
        raise ValueError(f"{name}: expected {want}, got {value}")
    return x


def static_bool(name: str, value) -> bool:
    """A static flag: a Python (or numpy) bool, as ``bool``; else TypeError (the string ``"False"``, a traced value)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a Python bool, got {value!r}")
    return bool(value)


def flag(name: str, x: Any, shape: tuple = (), fill: bool = True) -> Any:
    """A bool array of exactly `shape` or, with `fill`, a Python or numpy bool (filled to `shape`, as numpy)."""
    if fill and isinstance(x, (bool, np.bool_)):
        x = np.full(shape, bool(x))
    if not is_array(x):
        raise not_array(name, x, f"a bool{' or a bool' if fill else ''} array of shape {tuple(shape)}", np.bool_)
    return array(name, x, shape, np.bool_)


def as_array(x: Any) -> Any:
    """`x` itself if an array; a sequence holding JAX arrays through `jnp.asarray`; else `np.asarray` (not narrowed)."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return x
    if any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(x)):
        return jnp.asarray(x)
    return np.asarray(x)


def _python_ints(a: np.ndarray) -> bool:
    return a.dtype == object and a.size > 0 and all(map(_is_int, a.flat))


def index_array(x: Any, name: str = "indices", want: str = "an integer array (int32)", clip: bool = True) -> Any:
    """`as_array` for small per-entry vectors (indices, priorities), lists and array-likes numpy reads included; with
    `clip`, Python ints beyond 64 bits are clipped to int64 (an index out of range stays so)."""
    # other libraries' array-likes are read through numpy (a jax.ShapeDtypeStruct becomes a 0-d object array: refused)
    other = hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (np.ndarray, np.generic, jax.Array))
    if clip and isinstance(x, (list, tuple)):  # numpy reads [0, 2**63] as float64: read Python ints as objects first
        with contextlib.suppress(Exception):  # ragged: refused below
            obj = np.asarray(x, dtype=object)
            x = obj if _python_ints(obj) else x
    try:
        out = np.asarray(x) if other else as_array(x)
    except Exception as e:  # dicts, ragged lists, None / str / huge ints next to JAX arrays, a CUDA or grad tensor
        raise unexpected(name, want, x, f" ({type(e).__name__}: {str(e).splitlines()[0][:80]})") from None
    if clip and isinstance(out, np.ndarray) and _python_ints(out):
        info = np.iinfo(np.int64)
        out = np.array([min(max(int(v), info.min), info.max) for v in out.flat], np.int64).reshape(out.shape)
    if isinstance(out, np.ndarray) and out.dtype.kind not in "biufc":
        raise unexpected(name, want, x)
    return out


def int32_indices(indices: Any) -> jax.Array:
    """Integer `indices` as int32, saturating values outside int32's range, so an index out of range stays so."""
    x = index_array(indices)
    xp = jnp if isinstance(x, jax.Array) else np
    info = np.iinfo(x.dtype)
    if info.max > _INT32.max:
        x = xp.minimum(x, xp.asarray(_INT32.max, x.dtype))
    if info.min < _INT32.min:
        x = xp.maximum(x, xp.asarray(_INT32.min, x.dtype))
    return jnp.asarray(x.astype(np.int32))


def integer_indices(name: str, indices) -> jax.Array:
    """`indices` (integer, any shape) as `int32_indices`; TypeError naming `name` for what is not integers."""
    indices = index_array(indices, name)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"{name}: expected an integer dtype (int32), got {indices.dtype}")
    return int32_indices(indices)


def indices_below(name: str, indices: jax.Array, size: int, what: str) -> None:
    """ValueError naming `name` unless concrete `indices` lie in `[0, size)` (`what` says what `size` counts)."""
    if isinstance(indices, jax.core.Tracer) or not indices.size:
        return
    lo, hi = int(jnp.min(indices)), int(jnp.max(indices))
    if lo < 0 or hi >= size:
        raise ValueError(f"{name}: expected indices in [0, {size}) ({what}), got values in [{lo}, {hi}]")


def static_float(name: str, value, lo: float, hi: float) -> float:
    """A static float (a Python or numpy number, not a bool) in ``[lo, hi]`` as ``float``; else TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a Python float, got {type(value).__name__} {value!r}")
    value = float(value)
    if not (lo <= value <= hi):
        raise ValueError(f"{name}: expected a float in [{lo}, {hi}], got {value}")
    return value


def timeout(name: str, value) -> float | None:
    """A wait's limit in seconds: None or a number ``>= 0`` (`static_float`), as ``float``; ``inf`` is None."""
    value = None if value is None else static_float(name, value, 0.0, float("inf"))
    return None if value == float("inf") else value


def vector(name: str, x, b: int | None, kind: str) -> jax.Array:
    """`x` as a `[b]` array (`b` None: any 1-D) of the kind `'floating'`, `'integer'` or `'bool'`, its dtype kept (a
    list of Python numbers is float32)."""
    if kind == "floating" and isinstance(x, (list, tuple)) and x and all(map(_weak_number, x)):
        x = jnp.stack([jnp.asarray(v, jnp.float32) for v in x])
    article = "an" if kind == "integer" else "a"
    x = index_array(x, name, f"{article} {kind} array of shape [{'B' if b is None else b}]", clip=False)
    if x.ndim != 1 or (b is not None and x.shape[0] != b):
        raise ValueError(f"{name}: expected shape ({'B' if b is None else b},), got {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, _KINDS[kind]) or (kind == "integer" and x.dtype == np.bool_):
        raise TypeError(f"{name}: expected {article} {kind} dtype, got {x.dtype}")
    return jnp.asarray(x)


def _weak_number(v: Any) -> bool:
    """A Python int or float (not a bool or complex), also as a compiled program receives one (weakly typed, 0-d)."""
    real = isinstance(v, jax.Array) and (jnp.issubdtype(v.dtype, jnp.integer) or jnp.issubdtype(v.dtype, jnp.floating))
    return (real and v.ndim == 0 and getattr(v, "aval", v).weak_type) or type(v) in (int, float)


def index_vector(name: str, indices) -> jax.Array:
    """`integer_indices` of a 1-D `[B]`: TypeError naming `name` for what is not integers, ValueError if not 1-D."""
    x = index_array(indices, name)
    if x.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D int array [B], got shape {x.shape}")
    return integer_indices(name, x)


def integer_value(name: str, value, shape: tuple, lo, hi, expected: str = "") -> jax.Array:
    """An integer array of `shape` (a cursor, a counter) as int32, concrete values in `[lo, hi]` (`expected`). The
    error shows the values of an array of up to 16; of a larger one its first value out of range, where, and how many."""
    v = value if isinstance(value, jax.core.Tracer) else np.asarray(value)
    if not jnp.issubdtype(v.dtype, jnp.integer):
        raise TypeError(f"{name}: expected an integer value, got dtype {v.dtype}")
    if v.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {v.shape}")
    if isinstance(v, np.ndarray) and (np.any(v < lo) or np.any(v > hi)):
        bad = np.flatnonzero((v < lo) | (v > hi))
        got = v.tolist() if v.size <= 16 else (
            f"{v.flat[bad[0]]} at {[int(i) for i in np.unravel_index(bad[0], v.shape)]} ({bad.size} of {v.size} values out of range)")
        raise ValueError(f"{name}: expected {expected or f'a value in [{lo}, {hi}]'}, got {got}")
    return jnp.asarray(v.astype(np.int32))


def array(name: str, x: Any, shape: tuple[int, ...] | None = None, dtype: Any = None) -> Any:
    """``x`` itself, an array (JAX or numpy) of exactly ``shape`` and ``dtype`` (``"floating"``: any floating; None:
    any), of a dtype JAX keeps."""
    floating = isinstance(dtype, str) and dtype == "floating"  # (a float64 dtype compares equal to "floating")
    if not is_array(x):
        known = np.float32 if floating else dtype
        raise not_array(name, x, "an array (JAX or numpy)" + ("" if shape is None else f" of shape {shape}"), known)
    if isinstance(x.dtype, np.dtype) and x.dtype.kind in "OUSMm":
        raise TypeError(f"{name}: expected a numeric or bool array, got dtype {x.dtype}")
    if _is_key(x.dtype):
        raise TypeError(f"{name}: expected a numeric array, got a PRNG key array ({x.dtype})")
    got = np.dtype(x.dtype)
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if floating and not jnp.issubdtype(got, jnp.floating):
        raise TypeError(f"{name}: expected a floating dtype, got {got}")
    if dtype is not None and not floating and got != np.dtype(dtype):
        hint = ": convert with .astype(bool)" if np.dtype(dtype) == np.bool_ and got.kind in "iuf" else ""
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {got} (nothing is cast implicitly{hint})")
    return not_narrowed(name, x)


def parameters(where: str, fn: Callable, kwargs: dict) -> list[str]:
    """The parameter names of the method `fn` after `self`; TypeError naming `where` for a keyword it does not take."""
    signature = inspect.signature(fn)
    params = list(signature.parameters)[1:]
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise TypeError(f"{where}: unexpected keyword argument(s) {unknown}; {fn.__qualname__} takes {params}")
    return params


def array_leaves(what: str, tree: Any) -> None:
    """Every leaf of `tree` a JAX or numpy array of numbers or bools (bfloat16 included): else TypeError naming it."""
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not is_array(x) or not (x.dtype == np.bool_ or jnp.issubdtype(x.dtype, jnp.number)):
            raise not_array(leaf_path(what, path), x, "a numeric or bool array (JAX or numpy)")


def keyword_dict(name: str, value: Any, fn: Callable) -> dict:
    """`value`, a dict of keyword arguments of the method `fn`: else TypeError naming `name` (a key or one missing)."""
    if not isinstance(value, dict):
        raise TypeError(f"{name}: expected a dict of {fn.__qualname__} arguments or None, got {type(value).__name__}")
    params = parameters(name, fn, value)
    missing = [k for k, p in list(inspect.signature(fn).parameters.items())[1:]
               if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and k not in value]
    if missing:
        raise TypeError(f"{name}: missing required argument(s) {missing}; {fn.__qualname__} takes {params}")
    return value


def split_leaves(args: dict, num_shards: int, axis: str, own: Callable | None = None) -> None:
    """Every leaf of the arguments `{name: tree}` a sharded call splits into `num_shards` blocks: an array JAX holds as
    it is (else `own()` may refuse first), its leading axis a multiple of `num_shards`."""
    for arg, tree in args.items():
        for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
            name = leaf_path(arg, path)
            if not (is_array(x) and _is_key(x.dtype)):  # keys split per shard pass
                try:
                    array(name, x)
                except TypeError:
                    if own is not None and is_array(x) and not jax_holds(x.dtype):
                        own()
                    raise
            if np.ndim(x) == 0 or np.shape(x)[0] % num_shards:
                got = "a scalar" if np.ndim(x) == 0 else f"leading axis {np.shape(x)[0]}"
                raise ValueError(f"{name}: expected a leading axis divisible by the {num_shards} shards of mesh axis "
                                 f"{axis!r} (one block of rows per shard), got {got}")


def refusal(fn: Callable, *abstract: Any) -> None:
    """Trace `fn(*abstract)` (nothing runs) to raise its refusal (TypeError, ValueError) without the trace's frames."""
    try:
        jax.eval_shape(fn, *abstract)
    except (TypeError, ValueError) as e:
        raise type(e)(*e.args) from None
    except Exception:  # noqa: BLE001 - only refusals are raised
        return


def not_narrowed(name: str, x: Any, how: str = "convert it") -> Any:
    """``x`` itself if JAX keeps its dtype (`jax_holds`); else TypeError naming `name`, the dtypes and `how`."""
    if not jax_holds(x.dtype):
        got = np.dtype(x.dtype)
        raise TypeError(f"{name}: dtype {got} would be narrowed to {jax.dtypes.canonicalize_dtype(got)} (x64 is off); {how}")
    return x


def exact_cast(name: str, x: np.ndarray, dtype: Any) -> np.ndarray:
    """Numpy ``x`` converted to ``dtype`` if every value stays exact (NaN stays NaN); else ValueError naming it."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    with np.errstate(all="ignore"):
        out = x.astype(dtype)
        back = out.astype(x.dtype)
    same = (back == x) | (np.isnan(back) & np.isnan(x) if x.dtype.kind in "fc" else False)
    if not np.all(same):
        bad = x[~same]
        raise ValueError(f"{name}: dtype {x.dtype} with values {bad.ravel()[:3].tolist()} (and "
                         f"{bad.size - min(bad.size, 3)} more) that {dtype} cannot hold exactly (values in "
                         f"[{np.nanmin(x)}, {np.nanmax(x)}]); convert them yourself or give a space of a dtype that "
                         f"holds them")
    return out


def sharding_fits(name: str, leaf: str, shape: tuple, sharding: Any) -> None:
    """ValueError naming ``name``, the array ``leaf``, its shape and ``sharding`` if ``sharding`` cannot lay it out."""
    spec = getattr(sharding, "spec", None)  # more axes than the array's: refused even where the shards would fit
    why = f"its spec names {len(spec)} axes" if spec is not None and len(spec) > len(shape) else None
    if why is None:
        try:
            sharding.shard_shape(tuple(shape))
        except Exception as e:  # noqa: BLE001 - JAX raises IndexError, ValueError or its own errors for a misfit
            why = f"{type(e).__name__}: {str(e)[:120]}"
    if why is not None:
        raise ValueError(f"{name}: {sharding} cannot hold array {leaf} of shape {tuple(shape)} ({why}); give a tree of "
                         f"shardings like the buffer (e.g. a replicated sharding for its scalars)")


@functools.lru_cache(maxsize=None)
def _raw_key_shape(impl: str) -> tuple[int, ...]:
    return tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape)


def key(name: str, k: Any) -> Any:
    """`k` itself, one PRNG key: `jax.random.key(seed)` (shape `()`) or a raw `jax.random.PRNGKey(seed)` (`uint32`)."""
    raw = _raw_key_shape(str(jax.config.jax_default_prng_impl))
    want = f"one PRNG key: jax.random.key(seed) (shape ()) or jax.random.PRNGKey(seed) (uint32{list(raw)})"
    if not is_array(k):
        raise unexpected(name, want, k)
    shape, dtype = tuple(k.shape), k.dtype
    if _is_key(dtype):
        if shape != ():
            raise TypeError(f"{name}: expected {want}, got a batch of keys of shape {shape}; use one, or vmap over them")
    elif np.dtype(dtype) != np.uint32 or shape != raw:
        batch = " (a batch of raw keys: use one, or vmap over them)" if np.dtype(dtype) == np.uint32 and shape[-1:] == raw[-1:] else ""
        raise TypeError(f"{name}: expected {want}, got {np.dtype(dtype)}{list(shape)}{batch}")
    return k


def storable_dtype(name: str, value: Any) -> np.dtype:
    """`value` (a dtype or a name numpy reads) as a floating numpy dtype JAX stores as it is; else TypeError."""
    try:
        d = None if value is None else np.dtype(value)
    except TypeError:
        d = None
    if d is None:
        raise unexpected(name, "a floating dtype (e.g. jnp.float32)", value)
    if not jnp.issubdtype(d, jnp.floating):
        raise TypeError(f"{name}: expected a floating dtype, got {d}")
    if not jax_holds(d):
        raise TypeError(f"{name}: {d} needs jax_enable_x64 (without it JAX stores {jax.dtypes.canonicalize_dtype(d)}); enable x64 or pass a 32-bit dtype")
    return d


def instance(name: str, value: Any, types: Any, want: str) -> Any:
    """``value`` if it is an instance of ``types`` (``callable``: any callable), else TypeError naming ``name``."""
    if not (callable(value) if types is callable else isinstance(value, types)):
        raise unexpected(name, want, value)
    return value


def static_value(name: str, value: Any, want: str = "an array or a hashable Python value (a number, a bool, a str, a tuple)") -> Any:
    """A static (closed-over) argument or a key: ``value`` if it is hashable, else TypeError naming ``name``."""
    try:
        hash(value)
    except TypeError:
        raise unexpected(name, want, value) from None
    return value


def names(name: str, value: Any, minimum: int = 0) -> list[str]:
    """A list or tuple of at least ``minimum`` distinct strs (field names), as a list; TypeError for another type (a
    lone str too: it would be read letter by letter) or item, ValueError for too few names or one given twice."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise unexpected(name, "a list of field names (strs)", value)
    if len(value) < minimum or len(set(value)) != len(value):
        raise ValueError(f"{name}: expected at least {minimum} distinct names, got {list(value)!r:.80}")
    return list(value)


def path(name: str, value: Any) -> pathlib.Path:
    """A file-system path: a non-empty ``str`` or an ``os.PathLike``, as ``pathlib.Path``; else TypeError."""
    if not (isinstance(value, os.PathLike) or (isinstance(value, str) and value)):
        raise unexpected(name, "a folder path (a non-empty str or os.PathLike)", value)
    return pathlib.Path(value)


def text(name: str, value: Any, optional: bool = False) -> Any:
    """A str argument (a name, a prefix), or None where ``optional``; else TypeError naming ``name``."""
    return instance(name, value, (str, type(None)) if optional else str, f"a str{' or None' if optional else ''}")


def choice(name: str, value: Any, options: tuple, what: str = "") -> Any:
    """A static option: ``value`` if it is one of ``options``, else ValueError naming ``name``, the options (then
    ``what`` they are, e.g. ``"(the mesh's axis names)"``) and the value."""
    if not any(isinstance(value, type(o)) and value == o for o in options):
        raise ValueError(f"{name}: expected one of {tuple(options)}{what and ' ' + what}, got {value!r}")
    return value


def one_each(name: str, value: Any, n: int, what: str) -> tuple:
    """``value`` (a list or tuple of exactly ``n`` entries, one per ``what``) as a tuple, else TypeError."""
    if not isinstance(value, (list, tuple)) or len(value) != n:
        got = f"{type(value).__name__} of {len(value)}" if isinstance(value, (list, tuple)) else type(value).__name__
        raise TypeError(f"{name}: expected a list or tuple of {n} entries (one per {what}), got {got}")
    return tuple(value)


def advantages_missing(what: str, compute: str) -> RuntimeError:
    """The RuntimeError of `what`, a read of a rollout's advantages (eager: its `has_advantages` concrete) while they
    were not computed since its last add or reset; `compute` names the call that computes them."""
    return RuntimeError(f"{what}: the rollout's advantages and returns were not computed since its last add or reset "
                        f"(has_advantages is False); call {compute} first")


def single_process(what: str, why: str) -> None:
    """NotImplementedError naming `what` when JAX runs in several processes (`jax.process_count() > 1`)."""
    if jax.process_count() > 1:
        raise NotImplementedError(f"{what}: jax.process_count() is {jax.process_count()}; {why}")


# the re-exported checks (module doc), after every name they use is defined
from jaxbuffers._validate.steps import (  # noqa: E402
    decoded_entries, episode_lengths, final_obs_not_step, final_value_pair, host_call, host_stack_breaks, frame_leaves, normalizable,
    same_bytes, trajectory_add, trajectory_example, unrebuilt_stack_error, unrebuilt_stacks, unrebuilt_trajectory_stack_error, unrebuilt_trajectory_stacks,
)
from jaxbuffers._validate.members import member_axes, one_member, one_member_methods, unstacked  # noqa: E402
from jaxbuffers._validate.sharded import keeps_metrics, shapes_passed, sharded_draws  # noqa: E402
