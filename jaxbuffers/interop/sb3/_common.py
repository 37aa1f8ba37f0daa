"""What the SB3 adapters and conversions share (not public): ring cursors, storable dtypes (`docs/api/sb3.md`,
"Dtypes"), SB3 rows, the torch hand-off.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape

from jaxbuffers import _ring, _validate
from jaxbuffers.interop.torch import SUPPORTED_DTYPES, to_torch

F32, BOOL = np.dtype(np.float32), np.dtype(np.bool_)  # the stored dtypes of rewards and flags (`as_row` compares dtypes)


def with_ring_state(buf: Any, head: int, num_valid: int, added: int) -> Any:
    """``buf`` with its ring cursors set (``added``: the number of items ever added, a Python int)."""
    return buf.with_cursors(head=head, num_valid=num_valid, added=_ring.counter_add(_ring.counter_zero(), added))


def sb3_float32(dtype: Any) -> np.dtype:
    """SB3's replay buffers keep float64 actions as float32 (the rule of SB3's `ReplayBuffer._maybe_cast_dtype`)."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float64 else np.dtype(dtype)


def _int_bounds(space: spaces.Space | None) -> tuple[int, int] | None:
    """Smallest and largest integer a space can hold, or None when unknown."""
    if isinstance(space, spaces.Discrete):
        return int(space.start), int(space.start + space.n - 1)
    if isinstance(space, spaces.MultiDiscrete):
        return int(np.min(space.start)), int(np.max(space.start + space.nvec - 1))
    if isinstance(space, spaces.MultiBinary):
        return 0, 1
    if isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.integer):
        return int(np.min(space.low)), int(np.max(space.high))
    return None


def storage_dtype(dtype: Any, space: spaces.Space | None, what: str) -> np.dtype:
    """The dtype JAX holds ``dtype`` in without loss (32 bits where the space's bounds fit), else TypeError."""
    dtype = np.dtype(dtype)
    if _validate.jax_holds(dtype):
        return dtype
    canonical = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if np.issubdtype(dtype, np.integer):
        bounds, info = _int_bounds(space), np.iinfo(canonical)
        if bounds is not None and info.min <= bounds[0] and bounds[1] <= info.max:
            return canonical
        raise TypeError(f"{what}: dtype {dtype} with bounds {bounds} cannot be stored in {canonical} without loss "
                        f"(jax_enable_x64 is off); use a space with 32-bit bounds or enable x64")
    raise TypeError(f"{what}: dtype {dtype} cannot be stored losslessly by JAX with jax_enable_x64 off (it would be "
                    f"narrowed to {canonical}); use a {canonical} space (e.g. wrap the env with "
                    f"gymnasium.wrappers.DtypeObservation) or enable x64")


def exact_cast(a: np.ndarray, dtype: Any, what: str) -> np.ndarray:
    """``a`` in ``dtype``, or ``TypeError`` when a value does not survive the cast."""
    out = a.astype(dtype, copy=False)
    if out is a:
        return out
    back = out.astype(a.dtype)
    if a.dtype.kind in "fc":  # NaN is held exactly when it comes back as NaN
        same = (back == a) | (np.isnan(a) & np.isnan(back))
        held = np.count_nonzero(same) == same.size  # not `same.all()`: cheaper on the few values of an add
    else:  # integers and bools: equal values are equal bytes (cheaper than a comparison and a count)
        held = back.tobytes() == a.tobytes()
    if not held:
        raise TypeError(f"{what}: values of dtype {a.dtype} that {np.dtype(dtype)} does not hold exactly")
    return out


def cast(a: np.ndarray, dtype: Any, what: str) -> np.ndarray:
    """``a`` in ``dtype`` by numpy's cast; ValueError for a finite value overflowing a float ``dtype``, or no cast."""
    dtype = np.dtype(dtype)
    try:
        narrowing = a.dtype.kind in "iu" or (a.dtype.kind == "f" and a.dtype.itemsize > dtype.itemsize)
        if not (dtype.kind == "f" and narrowing):  # only a float dtype narrower than the values can overflow to inf
            return a.astype(dtype, copy=False)
        with np.errstate(over="raise"):  # flags a cast overflowing to inf (an inf given casts unflagged)
            return a.astype(dtype, copy=False)
    except FloatingPointError:
        with np.errstate(over="ignore"):
            over = np.isinf(a.astype(dtype)) & ~np.isinf(a.astype(np.float64))
        raise ValueError(f"{what}: the value {a[over].flat[0]} overflows the stored {dtype} (largest finite {np.finfo(dtype).max})") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: cannot convert values of dtype {a.dtype} to the stored {dtype}: {e}") from None


def flags(x: Any, what: str) -> np.ndarray:
    """``x`` as bool, or ``ValueError`` for a value other than 0 and 1 (SB3 keeps flags as float32)."""
    a = x if type(x) is np.ndarray else np.asarray(x)
    if a.dtype.kind == "b":
        return a
    b = a.astype(np.bool_)
    if np.count_nonzero(b == a) != a.size:  # 0 and 1 are the values equal to their bool
        raise ValueError(f"{what}: expected booleans (0 or 1), got the value {a[(a != 0) & (a != 1)].flat[0]!r}")
    return b


def _freeze(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def read_only(tree: Any) -> Any:
    """``tree`` (numpy arrays) made read-only: a host copy refuses writes, which it would drop."""
    return jax.tree.map(_freeze, tree)


@functools.cache
def zeros(n: int, dtype: Any) -> np.ndarray:
    """A read-only ``np.zeros(n, dtype)``, one per ``(n, dtype)`` (not allocated per add)."""
    return _freeze(np.zeros(n, dtype))


def frozen_obs(obs: Any) -> tuple[Any, list[bytes]]:
    """A read-only copy of an observation row (a dict for Dict spaces) and its leaves' bytes, the copy's memory."""
    leaves, tree = ([obs], None) if type(obs) is np.ndarray else jax.tree.flatten(obs)  # one array: no tree to walk
    raw = [x.tobytes() for x in leaves]
    copies = [np.frombuffer(b, x.dtype).reshape(x.shape) for b, x in zip(raw, leaves)]
    return (copies[0] if tree is None else jax.tree.unflatten(tree, copies)), raw


def per_key(fn: Callable, space: spaces.Space, *trees: Any, what: str = "") -> Any:
    """``fn(space, *leaves, what)``, or a dict of it per key of a Dict space (ValueError for another tree)."""
    if not isinstance(space, spaces.Dict):
        return fn(space, *trees, what)
    keys = sorted(space.spaces)
    for tree in trees:
        if not isinstance(tree, dict) or sorted(tree) != keys:
            got = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
            raise ValueError(f"{what}: expected a dict with keys {keys} (from the observation space), got {got}")
    return {k: fn(sub, *(t[k] for t in trees), f"{what}[{k!r}]") for k, sub in space.spaces.items()}


def numbers(x: Any, what: str) -> np.ndarray:
    """``x`` (an array, a list, a torch tensor) as numpy bools or numbers, else TypeError (not ``None`` as NaN)."""
    if hasattr(x, "detach"):  # a torch tensor
        try:
            x = x.numpy()  # on the CPU without a grad (SB3's values): no copy
        except (RuntimeError, TypeError):  # with a grad, or on another device
            x = x.numpy(force=True)
    try:
        arr = x if type(x) is np.ndarray else np.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what}: expected an array of numbers, got {type(x).__name__} ({e})") from None
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{what}: expected an array of numbers, got {type(x).__name__} of dtype {arr.dtype}")
    return arr


def indices(x: Any, what: str, hi: int) -> np.ndarray:
    """``x`` as a 1-d numpy array of integer indices in ``[0, hi)`` (SB3's flat or row indices); TypeError for not
    numbers, IndexError for not integers or outside ``[0, hi)``, ValueError for not 1-d."""
    idx = numbers(x, what)
    if idx.ndim != 1:
        raise ValueError(f"{what}: expected a 1-d array of indices, got shape {idx.shape}")
    if not np.issubdtype(idx.dtype, np.integer):
        raise IndexError(f"{what}: expected integer indices (as numpy indexing), got dtype {idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= hi):
        raise IndexError(f"{what}: values must lie in [0, {hi}), got range [{idx.min()}, {idx.max()}]")
    return idx


def as_row(x: Any, shape: tuple[int, ...], dtype: Any, what: str, *, reshape: bool = False, exact: bool = False) -> np.ndarray:
    """``x`` in ``shape`` (up to leading unit axes; any shape of its size with ``reshape``, as SB3 reshapes actions)
    and ``dtype`` (`stored`'s checks); ValueError for a size or layout assignment refuses; `numbers`' TypeError."""
    arr = x if type(x) is np.ndarray and x.dtype.kind in "biuf" else numbers(x, what)  # numbers' check, inline
    if arr.shape == shape:
        if arr.dtype == dtype:  # nothing to cast, nothing to check
            return arr
    elif arr.size != math.prod(shape):
        raise ValueError(f"{what}: expected {math.prod(shape)} values shaped {shape}, got shape {arr.shape}")
    elif reshape:
        arr = arr.reshape(shape)
    else:
        got = arr.shape
        while arr.ndim > len(shape) and arr.shape[0] == 1:  # numpy assignment drops leading unit axes
            arr = arr[0]
        try:
            arr = np.broadcast_to(arr, shape)  # same size: only unit axes are added
        except ValueError:
            raise ValueError(f"{what}: expected shape {shape}, got shape {got} (same size, another layout)") from None
    return arr if arr.dtype == dtype else stored(arr, dtype, what, exact)  # the stored dtype: nothing to cast or check


def stored(arr: np.ndarray, dtype: Any, what: str, exact: bool) -> np.ndarray:
    """Numbers ``arr`` in the stored ``dtype``: `flags` for bool, `exact_cast` with ``exact`` (narrower than SB3's) or
    an integer ``dtype`` (numpy would wrap 300 to 44 in uint8), else `cast`."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return flags(arr, what)
    if (exact or dtype.kind in "iu") and arr.dtype.kind in "iufc":  # numbers, not bools
        return exact_cast(arr, dtype, what)
    return cast(arr, dtype, what)


def _obs_leaf(sp: spaces.Space, s: jax.ShapeDtypeStruct, sb3: np.dtype, x: Any, what: str) -> np.ndarray:
    """One observation leaf as `as_row` stores it (reshaped for Discrete; exact where narrower than SB3's ``sb3``)."""
    return as_row(x, s.shape, s.dtype, what, reshape=isinstance(sp, spaces.Discrete), exact=s.dtype != sb3)


class Rows:
    """One ``add``'s observation and action as stored rows: specs ``obs`` ``[n_envs, *obs_shape]`` (a dict for Dict
    spaces) and ``action`` ``[n_envs, action_dim]``; ``obs_dtypes`` and ``action_dtype`` are SB3's dtypes."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space, n_envs: int, action_dtype: Any):
        self.space = observation_space
        spec = lambda sp, shape, what: jax.ShapeDtypeStruct((n_envs, *shape), storage_dtype(sp.dtype, sp, what))  # noqa: E731
        self.obs = per_key(spec, observation_space, get_obs_shape(observation_space), what="observation_space")
        self.obs_dtypes = per_key(lambda sp, what: np.dtype(sp.dtype), observation_space)
        self._kind: tuple | None = None  # (obs spec, Dict space, Discrete space): `observation`'s, found once per spec
        self.action_dtype = np.dtype(action_dtype)
        stored = storage_dtype(sb3_float32(action_dtype), action_space, "action_space")
        self.action = jax.ShapeDtypeStruct((n_envs, get_action_dim(action_space)), stored)

    def observation(self, obs: Any, what: str) -> Any:
        """One step's observation in the stored shapes and dtypes (`as_row`'s errors)."""
        kind = self._kind
        if kind is None or kind[0] is not self.obs:  # (an isinstance of a space is an ABC check: made once)
            kind = self._kind = (self.obs, isinstance(self.space, spaces.Dict), isinstance(self.space, spaces.Discrete))
        spec, is_dict, discrete = kind
        if is_dict:
            return per_key(_obs_leaf, self.space, self.obs, self.obs_dtypes, obs, what=what)
        return as_row(obs, spec.shape, spec.dtype, what, reshape=discrete, exact=spec.dtype != self.obs_dtypes)

    def action_row(self, action: Any) -> np.ndarray:
        """One step's actions (anything reshapeable to ``[n_envs, action_dim]``) in the stored dtype."""
        a = self.action
        return as_row(action, a.shape, a.dtype, "action", reshape=True, exact=a.dtype != self.action_dtype)

    def to_sb3_obs(self, obs: Any) -> Any:
        """Host copies of stored observations in SB3's dtypes."""
        return jax.tree.map(lambda x, d: np.asarray(x).astype(d, copy=False), obs, self.obs_dtypes)


def differs(a: Any, b: Any, b_bytes: list[bytes]) -> np.ndarray | None:
    """bool ``[n]``: which rows of two pytrees of numpy arrays ``[n, ...]`` differ bit for bit; None where none does
    (one comparison per leaf against ``b_bytes``, the bytes of ``b``'s leaves from `frozen_obs`)."""
    if type(a) is np.ndarray:  # one array: no tree to walk
        if _validate.same_bytes(b_bytes[0], a):  # ``a`` read in place where contiguous
            return None
        pairs = [(a, b)]
    else:
        pairs = list(zip(jax.tree.leaves(a), jax.tree.leaves(b)))
        if all(_validate.same_bytes(y, x) for (x, _), y in zip(pairs, b_bytes)):
            return None
    # each row's bytes compared whole: faster here than an elementwise comparison and a reduction
    return np.array([any(x[i].tobytes() != y[i].tobytes() for x, y in pairs) for i in range(len(pairs[0][0]))], bool)


def check_type(name: str, x: Any, cls: type) -> None:
    """``TypeError`` naming ``name`` unless ``x`` is a ``cls``."""
    if not isinstance(x, cls):
        raise TypeError(f"{name}: expected a {cls.__module__.split('.')[0]} {cls.__name__}, got {type(x).__name__}")


def check_space_kind(adapter: Any, dict_class: type, observation_space: spaces.Space) -> None:
    """``TypeError`` unless a Dict space goes to the Dict adapter and any other space to the plain one."""
    is_dict = isinstance(observation_space, spaces.Dict)
    if is_dict != isinstance(adapter, dict_class):
        want = dict_class.__name__ if is_dict else dict_class.__name__.replace("Dict", "")
        raise TypeError(f"observation_space: {type(adapter).__name__} got a {type(observation_space).__name__} space; use Jax{want} for it")


def to_sb3(fields: dict, device: Any, dtypes: dict) -> dict:
    """``fields`` (name -> pytree) as torch tensors on ``device``, ``fields[name]`` cast to ``dtypes[name]`` if set."""
    out = to_torch(fields, device=device)
    for name, d in dtypes.items():
        if d is not None:
            out[name] = jax.tree.map(lambda t, d: t.to(SUPPORTED_DTYPES[np.dtype(d)]), out[name], d)
    return out
