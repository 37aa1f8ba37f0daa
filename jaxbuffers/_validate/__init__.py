"""Every trace-time argument and input check of the library, each in one place.

Every buffer stores an *item spec* (a pytree of `jax.ShapeDtypeStruct`, one item without a batch axis) and
`check_batch` compares a batch against it before anything is written, naming the leaf path; nothing is ever cast.
Wrong structure, kind or dtype raises `TypeError`, wrong shape or value `ValueError`, every message starting with
the argument's name (`docs/guide.md`, section 8, tabulates what each kind of argument accepts). The checks of env
steps live in `.steps`, of stacked states in `.members`, of plain-Python options in `.options`, of a sharded
buffer's samples in `.sharded`; all are re-exported here, so every check is reached as `_validate.<name>`.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def leaf_name(path) -> str:
    """Readable name of a leaf path: ``obs['pixels']``, ``[0].reward``; ``<root>`` for a bare array."""
    s = jax.tree_util.keystr(tuple(path))
    return s if s else "<root>"


def _is_array_like(x) -> bool:
    """An array of JAX (a typed key array included) or numpy: a shape and a numpy or JAX dtype (a
    torch tensor's dtype is neither)."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        return False
    try:
        np.dtype(x.dtype)
    except TypeError:
        return isinstance(x, (jax.Array, jax.ShapeDtypeStruct))
    return True


def _is_array(x) -> bool:
    """`_is_array_like` with values: not an abstract `jax.ShapeDtypeStruct` (allowed in examples only)."""
    return _is_array_like(x) and not isinstance(x, jax.ShapeDtypeStruct)


def not_array(name: str, x: Any, want: str = "an array (JAX or numpy)", dtype: Any = None) -> TypeError:
    """The TypeError for `x` given where `want` (a JAX or numpy array, of `dtype` when the place stores one) belongs,
    naming `name`; a list or a torch tensor is told how to convert (a list: to an array of that `dtype`)."""
    if isinstance(x, (list, tuple)):
        kind = None if dtype is None else "bool_" if np.dtype(dtype) == np.bool_ else np.dtype(dtype).name
        to = "dtype" if kind is None else f"{'np' if hasattr(np, kind) else 'jnp'}.{kind}"  # bfloat16: jnp's
        got, hint = f"a {type(x).__name__} of {len(x)}", f"; pass an array with an explicit dtype, e.g. np.asarray(x, {to})"
    else:
        got, hint = f"{type(x).__name__} {x!r:.60}", ""
    if type(x).__module__.startswith("torch"):
        hint = "; convert it with jaxbuffers.interop.torch.from_torch"
    return TypeError(f"{name}: expected {want}, got {got}{hint}")


def item_spec(example: Any, what: str = "example_item") -> Any:
    """The per-item spec (pytree of ``jax.ShapeDtypeStruct``) of an example item.

    Leaves may be jax/numpy arrays or ``jax.ShapeDtypeStruct``; their dtypes are kept exactly
    (a numpy float64 leaf with x64 disabled is rejected rather than narrowed). Python scalars are
    rejected: their dtype would be a guess.

    Raises:
      TypeError: a leaf is not array-like, is a typed PRNG key array, or its dtype cannot be stored by JAX as it is.
      ValueError: the example has no leaves.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(example)
    if not leaves:
        raise ValueError(f"{what}: expected a pytree with at least one array leaf, got {example!r}")
    specs = []
    for path, leaf in leaves:
        name = f"{what}{leaf_name(path) if path else ''}"
        if isinstance(leaf, (bool, int, float, complex)) and not isinstance(leaf, np.generic):
            raise TypeError(
                f"{name}: expected an array or jax.ShapeDtypeStruct (its dtype is stored exactly), "
                f"got {type(leaf).__name__} {leaf!r}; wrap it, e.g. jnp.float32({leaf!r})"
            )
        if not _is_array_like(leaf):
            raise not_array(name, leaf, "an array (JAX or numpy) or a jax.ShapeDtypeStruct")
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            raise TypeError(
                f"{name}: expected a numeric array, got a PRNG key array ({leaf.dtype}); store its raw "
                f"bits, jax.random.key_data(key), and rebuild it with jax.random.wrap_key_data"
            )
        dtype = np.dtype(leaf.dtype)
        if not (dtype == np.bool_ or jnp.issubdtype(dtype, jnp.number)):
            raise TypeError(f"{name}: expected a numeric or bool dtype, got {dtype}")
        canonical = jax.dtypes.canonicalize_dtype(dtype)
        if canonical != dtype:
            raise TypeError(
                f"{name}: dtype {dtype} cannot be stored without narrowing to {canonical} "
                f"(jax_enable_x64 is off); pass a {canonical} array or enable x64"
            )
        specs.append(jax.ShapeDtypeStruct(tuple(leaf.shape), dtype))
    return jax.tree_util.tree_unflatten(treedef, specs)


def _structure_error(spec, batch, what: str) -> TypeError:
    exp = {leaf_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(spec)[0]}
    got = {leaf_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(batch)[0]}
    missing, extra = sorted(exp - got), sorted(got - exp)
    detail = []
    if missing:
        detail.append(f"missing leaves {missing}")
    if extra:
        detail.append(f"unexpected leaves {extra}")
    if not detail:
        detail.append(
            f"same leaf names but different containers: expected {jax.tree_util.tree_structure(spec)}, "
            f"got {jax.tree_util.tree_structure(batch)}"
        )
    return TypeError(f"{what}: tree structure differs from the example item: " + "; ".join(detail))


def check_batch(spec: Any, batch: Any, batch_ndim: int = 1, what: str = "batch", lead_names: tuple[str, ...] = ("B", "T")) -> tuple[int, ...]:
    """Check ``batch`` against ``spec`` with ``batch_ndim`` leading axes; return those axes' sizes.

    Args:
      spec: per-item pytree of ``jax.ShapeDtypeStruct`` (see `item_spec`).
      batch: pytree with the same structure; each leaf has shape ``lead + spec.shape`` where
        ``lead`` (length ``batch_ndim``) is the same for every leaf, and exactly the spec's dtype.
      batch_ndim: number of leading axes (1 for ``[B, ...]``, 2 for ``[num_envs, t, ...]``).
      what: name used in error messages (``"batch"``, ``"step"``...).
      lead_names: names of the leading axes in error messages (e.g. ``("num_envs", "t")``).

    Returns:
      The leading shape ``lead`` (a tuple of Python ints).

    Raises:
      TypeError: structure differs, a leaf is not an array, or a dtype differs.
      ValueError: a per-item shape differs, or the leading axes disagree between leaves.
    """
    spec_leaves, spec_def = jax.tree_util.tree_flatten(spec)
    try:
        batch_leaves = spec_def.flatten_up_to(batch)
    except (ValueError, TypeError):
        raise _structure_error(spec, batch, what) from None
    if jax.tree_util.tree_structure(batch) != spec_def:
        raise _structure_error(spec, batch, what)
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(spec)[0]]
    lead: tuple[int, ...] | None = None
    lead_from = ""
    for path, s, leaf in zip(paths, spec_leaves, batch_leaves):
        name = f"{what}{leaf_name(path) if path else ''}"
        if not _is_array(leaf):
            raise not_array(name, leaf, dtype=s.dtype)
        shape = tuple(leaf.shape)
        expected_tail = tuple(s.shape)
        if len(shape) != batch_ndim + len(expected_tail) or shape[batch_ndim:] != expected_tail:
            if batch_ndim == 0:
                raise ValueError(f"{name}: expected shape {expected_tail}, got {shape}")
            lead_desc = ", ".join(lead_names[:batch_ndim]) if batch_ndim <= len(lead_names) else f"{batch_ndim} axes"
            raise ValueError(
                f"{name}: expected shape [{lead_desc}, *{list(expected_tail)}] "
                f"(per-item shape {expected_tail} after {batch_ndim} leading axes), got {shape}"
            )
        if leaf.dtype != s.dtype:
            raise TypeError(
                f"{name}: expected dtype {np.dtype(s.dtype)}, got {leaf.dtype} "
                f"(nothing is cast implicitly; convert it explicitly if that is what you want)"
            )
        if lead is None:
            lead, lead_from = shape[:batch_ndim], name
        elif shape[:batch_ndim] != lead:
            raise ValueError(
                f"{name}: leading axes {shape[:batch_ndim]} disagree with {lead_from}'s {lead}; "
                f"every leaf of one batch must have the same leading axes"
            )
    if lead is None:
        raise ValueError(f"{what}: expected at least one array leaf, got {batch!r}")
    return lead


def layout(tree: Any) -> tuple[list, tuple]:
    """``(leaves, signature)`` of a pytree: its flat leaves and a hashable key of its structure and each leaf's type,
    shape and dtype, all that `check_batch` and `array` read. A host writer that checked one tree skips the checks
    for the next tree of the same signature (they would pass again); values are checked every time."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return leaves, (treedef, tuple((type(x), getattr(x, "shape", None), getattr(x, "dtype", None)) for x in leaves))


def tree_nbytes(tree: Any) -> int:
    """Total bytes of the array leaves of `tree` (arrays or ShapeDtypeStructs, e.g. an item spec)."""
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def static_int(name: str, value, minimum: int = 1, maximum: int = 2**31 - 1) -> int:
    """A static size argument: a Python (or numpy) int in `[minimum, maximum]`, returned as `int`.

    The default maximum is int32's: every position, size and period is computed in int32.

    Raises:
      ValueError: a bool, a float (even `10.0`: sizes are never rounded silently), a traced or
        other non-int value, or a value outside the range; the message names the argument.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise ValueError(f"{name}: expected a Python int >= {minimum}, got {value!r}")
    if int(value) > maximum:
        limit = "2**31 - 1 (int32 arithmetic)" if maximum == 2**31 - 1 else maximum
        raise ValueError(f"{name}: expected at most {limit}, got {value!r}")
    return int(value)


def divisor(name: str, value, total: int, what: str) -> int:
    """`value` as a Python int >= 1 that divides `total` (`what` names `total` in the message).

    Raises:
      ValueError: not an int >= 1 (`static_int`), or not a divisor of `total`.
    """
    value = static_int(name, value)
    if total % value:
        divisors = [d for d in range(1, min(total, 64) + 1) if total % d == 0]
        raise ValueError(f"{name}: expected a divisor of {what} = {total} (e.g. {divisors}), got {value}")
    return value


def keyword_sizes(create: Callable) -> Callable:
    """Decorate a buffer's `create(cls, example, *, sizes...)` (below its `classmethod`): sizes given by position
    raise a TypeError that names the keyword-only sizes and shows the call, e.g.
    `TrajectoryBuffer.create(example_step, num_envs=..., length=...)`, instead of Python's "takes 2 positional
    arguments but 4 were given". The sizes are the keyword-only arguments without a default."""
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
            raise TypeError(
                f"{name}: {names} keyword-only, got {extra} positional argument{'s' if extra > 1 else ''} after "
                f"{', '.join(positional)}; call {name}({usage})"
            )
        return create(cls, *args, **kwargs)

    return call


def scalar_parameter(name: str, x: Any, lo: float, hi: float = math.inf) -> Any:
    """A scalar hyperparameter that may be traced (a discount, a lambda, an importance exponent).

    Accepted: a Python or numpy int or float, or a 0-d array of an integer or floating dtype (a
    Python `1` through `jit` is an int32 tracer). A concrete value must be finite and in
    `[lo, hi]`; a traced one cannot be range-checked. Returns `x` unchanged.

    Raises:
      TypeError: a bool (a flag passed by mistake), a complex number, a string, any other kind.
      ValueError: an array that is not 0-d, or a concrete value NaN, infinite or outside the range.
    """
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
    """A static flag: a Python (or numpy) bool, returned as ``bool``.

    Raises:
      TypeError: anything else, e.g. the string ``"False"`` (truthy) or a traced value; names the argument.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a Python bool, got {value!r}")
    return bool(value)


_INT32 = np.iinfo(np.int32)
_INT64 = np.iinfo(np.int64)


def as_array(x: Any) -> Any:
    """`x` itself if it is an array (its dtype kept); a sequence holding JAX arrays or tracers
    (`[i, 1]` inside `jit`) through `jnp.asarray`; anything else through `np.asarray` (so that
    checks see a numpy int64 before JAX narrows it)."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return x
    if any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(x)):
        return jnp.asarray(x)
    return np.asarray(x)


def index_array(x: Any, name: str = "indices", want: str = "an integer array (int32)", clip: bool = True) -> Any:
    """`as_array` for the small per-entry vectors (indices, priorities, generations): with `clip`,
    Python ints beyond 64 bits are clipped to int64, so an index out of range stays out of range
    once `int32_indices` saturates it (not for generations, compared modulo `2**32`: `vector`). Lists
    of numbers and array-likes numpy can read (a CPU torch tensor) are accepted; `want` names what
    is expected.

    Raises:
      TypeError: naming `name`, for what is not an array of numbers (`None`, a string, a dict,
        ragged or mixed lists, a `jax.ShapeDtypeStruct`, a torch tensor numpy cannot read), before a
        shape check sees a 0-d array.
    """
    def refuse(why: str = "") -> TypeError:
        return TypeError(f"{name}: expected {want}, got {type(x).__name__} {x!r:.60}{why}")

    # Array-likes of other libraries (a torch tensor, a pandas Series) are read through numpy; an
    # abstract jax.ShapeDtypeStruct becomes a 0-d object array there, refused below.
    other = hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (np.ndarray, np.generic, jax.Array))
    if clip and isinstance(x, (list, tuple)):  # numpy reads [0, 2**63] as float64: read Python ints as objects first
        try:
            obj = np.asarray(x, dtype=object)
        except Exception:  # ragged: refused below
            obj = None
        if obj is not None and obj.dtype == object and obj.size and all(_is_python_int(v) for v in obj.flat):
            x = obj
    try:
        out = np.asarray(x) if other else as_array(x)
    except Exception as e:  # dicts, ragged lists, None / str / huge ints next to JAX arrays, a CUDA or grad tensor
        raise refuse(f" ({type(e).__name__}: {str(e).splitlines()[0][:80]})") from None
    if clip and isinstance(out, np.ndarray) and out.dtype == object and out.size and all(_is_python_int(v) for v in out.flat):
        out = np.array([min(max(int(v), _INT64.min), _INT64.max) for v in out.flat], np.int64).reshape(out.shape)
    if isinstance(out, np.ndarray) and out.dtype.kind not in "biufc":
        raise refuse()
    return out


def _is_python_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def int32_indices(indices: Any) -> jax.Array:
    """Integer `indices` (any integer dtype) as int32, saturating values outside int32's range.

    A plain `astype(int32)` wraps (an int64 `2**32 + 3` becomes slot 3); saturated, an index out
    of range stays out of range (buffers hold at most `2**30` slots), so writes ignore it and
    reads clip it. numpy input is saturated before JAX converts it. (A numpy int64 argument of a
    user's own jitted function is narrowed by JAX at its boundary: pass int32 there.)
    """
    x = index_array(indices)
    xp = jnp if isinstance(x, jax.Array) else np  # numpy input is saturated before JAX sees it
    info = np.iinfo(x.dtype)
    if info.max > _INT32.max:
        x = xp.minimum(x, xp.asarray(_INT32.max, x.dtype))
    if info.min < _INT32.min:
        x = xp.maximum(x, xp.asarray(_INT32.min, x.dtype))
    return jnp.asarray(x.astype(np.int32))


def integer_indices(name: str, indices) -> jax.Array:
    """`indices` (integer, any shape) as int32 saturated (`int32_indices`). Raises TypeError
    naming `name` for a non-integer dtype or what is not numbers (`index_array`)."""
    indices = index_array(indices, name)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise TypeError(f"{name}: expected an integer dtype (int32), got {indices.dtype}")
    return int32_indices(indices)


def indices_below(name: str, indices: jax.Array, size: int, what: str) -> None:
    """Concrete `indices` (an integer array) must lie in `[0, size)` (`what` says what `size` counts); traced ones
    are not checked.

    Raises:
      ValueError: naming `name`, the range expected and the range found.
    """
    if isinstance(indices, jax.core.Tracer) or not indices.size:
        return
    lo, hi = int(jnp.min(indices)), int(jnp.max(indices))
    if lo < 0 or hi >= size:
        raise ValueError(f"{name}: expected indices in [0, {size}) ({what}), got values in [{lo}, {hi}]")


def static_float(name: str, value, lo: float, hi: float) -> float:
    """A static float hyperparameter (a Python or numpy number, not a bool) in ``[lo, hi]``, as ``float``.

    Raises:
      TypeError: not a number; ValueError: outside ``[lo, hi]`` (or NaN). Messages name the argument.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a Python float, got {type(value).__name__} {value!r}")
    value = float(value)
    if not (lo <= value <= hi):
        raise ValueError(f"{name}: expected a float in [{lo}, {hi}], got {value}")
    return value


def timeout(name: str, value) -> float | None:
    """A wait's limit in seconds: None or a Python or numpy number ``>= 0`` (not a bool), as ``float``; ``inf`` is
    no limit (None).

    Raises:
      TypeError: not a number or None; ValueError: negative or NaN. Messages name the argument.
    """
    if value is None:
        return None
    value = static_float(name, value, 0.0, float("inf"))
    return None if value == float("inf") else value


_KINDS = {"floating": jnp.floating, "integer": jnp.integer, "bool": jnp.bool_}


def vector(name: str, x, b: int | None, kind: str) -> jax.Array:
    """`x` (an array, a list, a CPU torch tensor: `index_array`) as a `[b]` array (`b` None: any
    1-D) of the given kind (`'floating'`, `'integer'` or `'bool'`), checked at trace time; its
    dtype is kept (priorities of any floating dtype become float32 leaves where they are stored).
    A list or tuple of Python ints and floats has no dtype of its own: as `'floating'` it is read as float32.

    Raises:
      TypeError: not an array of numbers, or the wrong dtype kind; ValueError: not of shape `(b,)`.
    """
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
    """A Python int or float (not a bool, not a complex), also as a compiled program receives one: a weakly typed 0-d
    integer or floating value."""
    real = isinstance(v, jax.Array) and (jnp.issubdtype(v.dtype, jnp.integer) or jnp.issubdtype(v.dtype, jnp.floating))
    return (real and v.ndim == 0 and getattr(v, "aval", v).weak_type) or type(v) in (int, float)


def index_vector(name: str, indices) -> jax.Array:
    """`indices` as a 1-D int32 array `[B]`: `integer_indices` plus a rank check.

    Raises:
      TypeError: naming `name`, what is not an integer array; ValueError: not 1-D.
    """
    x = index_array(indices, name)
    if x.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D int array [B], got shape {x.shape}")
    return integer_indices(name, x)


def integer_value(name: str, value, shape: tuple, lo, hi, expected: str = "") -> jax.Array:
    """An integer array of `shape` (a cursor, a counter) as int32; concrete values must lie in
    `[lo, hi]` (elementwise; checked before any narrowing; `expected` describes the range in the
    error), traced ones are not range-checked.

    Raises:
      TypeError: not of an integer dtype; ValueError: wrong shape, or a concrete value out of range.
    """
    v = value if isinstance(value, jax.core.Tracer) else np.asarray(value)
    if not jnp.issubdtype(v.dtype, jnp.integer):
        raise TypeError(f"{name}: expected an integer value, got dtype {v.dtype}")
    if v.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {v.shape}")
    if isinstance(v, np.ndarray) and (np.any(v < lo) or np.any(v > hi)):
        raise ValueError(f"{name}: expected {expected or f'a value in [{lo}, {hi}]'}, got {v.tolist()}")
    return jnp.asarray(v.astype(np.int32))


def array(name: str, x: Any, shape: tuple[int, ...] | None = None, dtype: Any = None) -> Any:
    """``x`` itself once checked to be an array (JAX or numpy, not converted) of exactly ``shape``
    (None: any) and ``dtype``, at trace time.

    ``dtype`` is a dtype (matched exactly), ``"floating"`` (any floating dtype) or None (any).

    Raises:
      TypeError: not an array (``None``, a Python scalar, a list), a numpy dtype that JAX would narrow (float64 with
        ``jax_enable_x64`` off), or the wrong dtype. ValueError: the wrong shape. Messages start with ``name``.
    """
    if not _is_array(x):
        known = None if dtype is None else np.float32 if isinstance(dtype, str) and dtype == "floating" else dtype
        raise not_array(name, x, "an array (JAX or numpy)" + ("" if shape is None else f" of shape {shape}"), known)
    if isinstance(x.dtype, np.dtype) and x.dtype.kind in "OUSMm":
        raise TypeError(f"{name}: expected a numeric or bool array, got dtype {x.dtype}")
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        raise TypeError(f"{name}: expected a numeric array, got a PRNG key array ({x.dtype})")
    got = np.dtype(x.dtype)
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    floating = isinstance(dtype, str) and dtype == "floating"  # (a float64 dtype compares equal to "floating")
    if floating and not jnp.issubdtype(got, jnp.floating):
        raise TypeError(f"{name}: expected a floating dtype, got {got}")
    if dtype is not None and not floating and got != np.dtype(dtype):
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {got} (nothing is cast implicitly)")
    return not_narrowed(name, x)


def parameters(where: str, fn: Callable, kwargs: dict) -> list[str]:
    """The parameter names of the method `fn` after `self`; raises `TypeError` naming `where` for a keyword of
    `kwargs` it does not take (unless it takes `**kwargs`), before any value is looked at."""
    signature = inspect.signature(fn)
    params = list(signature.parameters)[1:]
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise TypeError(f"{where}: unexpected keyword argument(s) {unknown}; {fn.__qualname__} takes {params}")
    return params


def array_leaves(what: str, tree: Any) -> None:
    """Every leaf of `tree` (a batch or an item given with values) a JAX or numpy array of numbers or bools (any
    dtype JAX stores, bfloat16 included): else TypeError naming the leaf, `what` and its path."""
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not _is_array(x) or not (x.dtype == np.bool_ or jnp.issubdtype(x.dtype, jnp.number)):
            raise not_array(f"{what}{leaf_name(path) if path else ''}", x, "a numeric or bool array (JAX or numpy)")


def keyword_dict(name: str, value: Any, fn: Callable) -> dict:
    """`value` as the keyword arguments of the method `fn` (a dict): TypeError naming `name` for a value that is not
    a dict, a key `fn` does not take or a required argument missing, before any value is looked at."""
    if not isinstance(value, dict):
        raise TypeError(f"{name}: expected a dict of {fn.__qualname__} arguments or None, got {type(value).__name__}")
    params = parameters(name, fn, value)
    required = [k for k, p in list(inspect.signature(fn).parameters.items())[1:]
                if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    missing = [k for k in required if k not in value]
    if missing:
        raise TypeError(f"{name}: missing required argument(s) {missing}; {fn.__qualname__} takes {params}")
    return value


def split_leaves(args: dict, num_shards: int, axis: str, own: Callable | None = None) -> None:
    """Every leaf of the arguments `{name: tree}` that a sharded call splits into `num_shards` blocks (mesh axis
    `axis`): an array JAX holds as it is (nothing is narrowed at the program's boundary; PRNG keys pass) with a leading
    axis a multiple of `num_shards`. Before a leaf JAX would narrow is refused, `own()` (when given) may raise the
    wrapped buffer's own refusal instead, which names the dtype that field expects.

    Raises:
      TypeError: a leaf not an array, or one JAX would narrow; ValueError: a leading axis the shards do not divide
        (both naming the argument and the leaf).
    """
    for path, x in (((arg, *p), x) for arg, tree in args.items() for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]):
        name = f"{path[0]}{leaf_name(path[1:]) if len(path) > 1 else ''}"
        if not (_is_array(x) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)):  # keys split per shard pass
            try:
                array(name, x)
            except TypeError:
                if own is not None and _is_array(x) and jax.dtypes.canonicalize_dtype(x.dtype) != np.dtype(x.dtype):
                    own()
                raise
        if np.ndim(x) == 0 or np.shape(x)[0] % num_shards:
            got = "a scalar" if np.ndim(x) == 0 else f"leading axis {np.shape(x)[0]}"
            raise ValueError(f"{name}: expected a leading axis divisible by the {num_shards} shards of mesh axis {axis!r} (one block of rows per shard), got {got}")


def refusal(fn: Callable, *abstract: Any) -> None:
    """Trace `fn(*abstract)` (`jax.ShapeDtypeStruct` leaves; nothing runs) to raise the refusal (TypeError,
    ValueError) its own checks make, as the caller's own (without the frames and notes of the trace); any other
    failure to trace is not a refusal, and returns."""
    try:
        jax.eval_shape(fn, *abstract)
    except (TypeError, ValueError) as e:
        raise type(e)(*e.args) from None
    except Exception:  # noqa: BLE001 - only refusals are raised
        return


def not_narrowed(name: str, x: Any) -> Any:
    """``x`` itself once checked that JAX keeps its dtype (a numpy float64 or int64 with ``jax_enable_x64`` off would be
    narrowed at a ``jit`` boundary). Raises TypeError naming ``name``."""
    got = np.dtype(x.dtype)
    if jax.dtypes.canonicalize_dtype(got) != got:
        raise TypeError(f"{name}: dtype {got} would be narrowed to {jax.dtypes.canonicalize_dtype(got)} (x64 is off); convert it")
    return x


def exact_cast(name: str, x: np.ndarray, dtype: Any) -> np.ndarray:
    """Numpy ``x`` converted to ``dtype`` when that keeps every value exactly (a widening, or values the narrower
    type holds: 0..255 floats to uint8); NaN stays NaN. Raises ValueError naming ``name``, both dtypes and the values
    held, when a value would change (out of range, a fraction, a rounded float)."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    with np.errstate(all="ignore"):
        out = x.astype(dtype)
        back = out.astype(x.dtype)
    same = (back == x) | (np.isnan(back) & np.isnan(x) if x.dtype.kind in "fc" else False)
    if not np.all(same):
        bad = x[~same]
        raise ValueError(
            f"{name}: dtype {x.dtype} with values {bad.ravel()[:3].tolist()} (and {bad.size - min(bad.size, 3)} more) "
            f"that {dtype} cannot hold exactly (values in [{np.nanmin(x)}, {np.nanmax(x)}]); convert them yourself or "
            f"give a space of a dtype that holds them"
        )
    return out


def sharding_fits(name: str, leaf: str, shape: tuple, sharding: Any) -> None:
    """Raise ValueError naming ``name``, the array ``leaf``, its shape and ``sharding`` when ``sharding`` cannot lay out
    an array of ``shape`` (a spec of more axes than the array has, a dimension its mesh axes do not divide)."""
    why = None
    spec = getattr(sharding, "spec", None)
    if spec is not None and len(spec) > len(shape):  # even on a mesh of one device, where the shards would fit
        why = f"its spec names {len(spec)} axes"
    else:
        try:
            sharding.shard_shape(tuple(shape))
        except Exception as e:  # noqa: BLE001 - JAX raises IndexError, ValueError or its own errors for a misfit
            why = f"{type(e).__name__}: {str(e)[:120]}"
    if why is not None:
        raise ValueError(
            f"{name}: {sharding} cannot hold array {leaf} of shape {tuple(shape)} ({why}); give a tree of shardings "
            f"like the buffer (e.g. a replicated sharding for its scalars)"
        )


@functools.lru_cache(maxsize=None)
def _raw_key_shape(impl: str) -> tuple[int, ...]:
    return tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape)


def key(name: str, k: Any) -> Any:
    """`k` itself once checked to be one PRNG key: a typed key array of shape `()`
    (`jax.random.key(seed)`) or a raw `uint32` key (`jax.random.PRNGKey(seed)`, shape `(2,)` for the
    default threefry implementation), concrete or traced.

    Raises:
      TypeError: naming `name`: not a key (`None`, an int, a float or other array, a string, a
        list), or a batch of keys (split keys are used one per call: `vmap` over them).
    """
    raw = _raw_key_shape(str(jax.config.jax_default_prng_impl))
    want = f"one PRNG key: jax.random.key(seed) (shape ()) or jax.random.PRNGKey(seed) (uint32{list(raw)})"
    if not _is_array(k):
        raise TypeError(f"{name}: expected {want}, got {type(k).__name__} {k!r:.60}")
    shape, dtype = tuple(k.shape), k.dtype
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if shape != ():
            raise TypeError(f"{name}: expected {want}, got a batch of keys of shape {shape}; use one, or vmap over them")
    elif np.dtype(dtype) != np.uint32 or shape != raw:
        batch = " (a batch of raw keys: use one, or vmap over them)" if np.dtype(dtype) == np.uint32 and shape[-1:] == raw[-1:] else ""
        raise TypeError(f"{name}: expected {want}, got {np.dtype(dtype)}{list(shape)}{batch}")
    return k


def storable_dtype(name: str, value: Any, kind: str = "floating") -> np.dtype:
    """`value` (a dtype or a name numpy reads: `jnp.float32`, `"bfloat16"`) as a numpy dtype of the
    given kind (`'floating'`) that JAX stores as it is.

    Raises:
      TypeError: naming `name`: `None`, a torch dtype or other value numpy does not read, another
        kind, or a 64-bit dtype while `jax_enable_x64` is off (JAX would store 32 bits).
    """
    try:
        d = None if value is None else np.dtype(value)
    except TypeError:
        d = None
    if d is None:
        raise TypeError(f"{name}: expected a {kind} dtype (e.g. jnp.float32), got {type(value).__name__} {value!r:.60}")
    if not jnp.issubdtype(d, _KINDS[kind]):
        raise TypeError(f"{name}: expected a {kind} dtype, got {d}")
    if jax.dtypes.canonicalize_dtype(d) != d:
        raise TypeError(f"{name}: {d} needs jax_enable_x64 (without it JAX stores {jax.dtypes.canonicalize_dtype(d)}); enable x64 or pass a 32-bit dtype")
    return d


def instance(name: str, value: Any, types: Any, want: str) -> Any:
    """``value`` if it is an instance of ``types`` (a type or a tuple; ``callable`` for any callable), else TypeError
    naming ``name``, ``want`` and what came."""
    if not (callable(value) if types is callable else isinstance(value, types)):
        raise TypeError(f"{name}: expected {want}, got {type(value).__name__} {value!r:.60}")
    return value


def static_value(name: str, value: Any, want: str = "an array or a hashable Python value (a number, a bool, a str, a tuple)") -> Any:
    """A static (closed-over) argument or a key: ``value`` if it is hashable, else TypeError naming ``name`` (a list or
    a dict given where an array or a Python value belongs: pass an array, or a tuple)."""
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"{name}: expected {want}, got {type(value).__name__} {value!r:.60}") from None
    return value


# the step checks (module doc), after every name they use is defined
from jaxbuffers._validate.steps import (  # noqa: E402
    decoded_entries, episode_lengths, final_obs_not_step, final_value_pair, host_call, frame_leaves, normalizable, trajectory_add,
    trajectory_example, unrebuilt_stack_error, unrebuilt_stacks, unrebuilt_trajectory_stack_error, unrebuilt_trajectory_stacks,
)
from jaxbuffers._validate.members import member_axes, one_member, one_member_methods, unstacked  # noqa: E402
from jaxbuffers._validate.options import choice, filled, names, one_each, path, single_process, text  # noqa: E402
from jaxbuffers._validate.sharded import keeps_metrics, shapes_passed, sharded_draws  # noqa: E402
