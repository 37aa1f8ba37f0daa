"""Plumbing shared by the SB3 adapters: storable dtypes, per-env specs from gym spaces, torch hand-off.

Nothing here is public; :mod:`jaxbuffers.interop.sb3` re-exports what users need.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch as th
from gymnasium import spaces


def _space_int_bounds(space: spaces.Space) -> tuple[int, int] | None:
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
    """The dtype JAX stores ``dtype`` in, losslessly, or a ``TypeError``.

    With ``jax_enable_x64`` off, JAX cannot hold 64-bit values. Integer data is narrowed to
    32 bits only when the space's bounds prove it fits (Discrete actions are int64 in gymnasium,
    their values are small); samples are cast back to ``dtype``. float64 data is refused: the
    narrowing would change values.
    """
    dtype = np.dtype(dtype)
    canonical = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if canonical == dtype:
        return dtype
    if np.issubdtype(dtype, np.integer):
        bounds = _space_int_bounds(space) if space is not None else None
        info = np.iinfo(canonical)
        if bounds is not None and info.min <= bounds[0] and bounds[1] <= info.max:
            return canonical
        raise TypeError(
            f"{what}: dtype {dtype} with bounds {bounds} cannot be stored in {canonical} without loss "
            f"(jax_enable_x64 is off); use a space with 32-bit bounds or enable x64"
        )
    raise TypeError(
        f"{what}: dtype {dtype} cannot be stored losslessly by JAX with jax_enable_x64 off "
        f"(it would be narrowed to {canonical}); use a {canonical} space (e.g. wrap the env with "
        f"gymnasium.wrappers.DtypeObservation) or enable x64"
    )


def obs_spec(observation_space: spaces.Space, obs_shape: Any, lead: tuple[int, ...], what: str) -> Any:
    """Spec ``[*lead, *obs_shape]`` of an observation in storable dtypes (a dict for Dict spaces)."""
    if isinstance(observation_space, spaces.Dict):
        return {
            key: jax.ShapeDtypeStruct((*lead, *obs_shape[key]), storage_dtype(sub.dtype, sub, f"{what}[{key!r}]"))
            for key, sub in observation_space.spaces.items()
        }
    return jax.ShapeDtypeStruct((*lead, *obs_shape), storage_dtype(observation_space.dtype, observation_space, what))


def obs_dtypes(observation_space: spaces.Space) -> Any:
    """SB3's dtypes of the observations (a dict for Dict spaces)."""
    if isinstance(observation_space, spaces.Dict):
        return {k: np.dtype(s.dtype) for k, s in observation_space.spaces.items()}
    return np.dtype(observation_space.dtype)


def exact_cast(a: np.ndarray, dtype: Any, what: str) -> np.ndarray:
    """``a`` in ``dtype``, or ``TypeError`` when a value does not survive the cast."""
    out = a.astype(dtype, copy=False)
    if out is not a and not np.array_equal(out.astype(a.dtype), a, equal_nan=np.issubdtype(a.dtype, np.inexact)):
        raise TypeError(f"{what}: values of dtype {a.dtype} that {np.dtype(dtype)} does not hold exactly")
    return out


def as_row(x: Any, shape: tuple[int, ...], dtype: Any, what: str, *, reshape: bool = False, exact: bool = False) -> np.ndarray:
    """``x`` as a numpy array of ``shape`` and ``dtype``, accepted as SB3's own buffers accept it.

    ``x`` must have ``shape``'s number of values. SB3 writes a step into its preallocated arrays by
    numpy assignment, so ``x``'s shape must also be one that assignment accepts (``shape`` itself,
    up to leading unit axes: a scalar for an ``[n_envs]`` field when ``n_envs`` is 1, for
    instance); values are never repeated to fill the field, where numpy would broadcast them. With
    ``reshape`` (SB3 reshapes actions to ``[n_envs, action_dim]`` and Discrete observations before
    writing them) any ``x`` with the right number of values is reshaped instead. The cast
    follows numpy assignment too (SB3 passes float64 rewards and bool dones, for instance),
    except that a bool field refuses values other than 0 and 1 (SB3 keeps a done of 0.5 in its
    float32 array; a bool cannot hold it). With ``exact`` (where we store a narrower dtype than
    SB3 keeps: int64 data held as int32, a rollout's float64 actions held as float32) a value the
    stored dtype does not hold exactly raises ``TypeError`` instead of being rounded or wrapped.

    Raises:
      ValueError: the wrong number of values, a shape assignment would refuse (without
        ``reshape``), a bool field given other values, or values numpy cannot convert; each names
        the field. TypeError: with ``exact``, a value the stored dtype does not hold.
    """
    if isinstance(x, th.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.shape == shape:  # the common case, checked first: this runs on every env step
        pass
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
    dtype = np.dtype(dtype)
    if dtype == np.bool_ and arr.dtype != np.bool_ and arr.size and not np.all((arr == 0) | (arr == 1)):
        bad = arr[(arr != 0) & (arr != 1)].flat[0]
        raise ValueError(f"{what}: expected booleans (0 or 1), got the value {bad!r}")
    if exact and np.issubdtype(arr.dtype, np.number):
        arr = exact_cast(arr, dtype, what)
    try:
        return arr.astype(dtype, copy=False)  # the adapters copy the rows they store
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: cannot convert values of dtype {arr.dtype} to the stored {dtype}: {e}") from None


def obs_row(obs: Any, spec: Any, lead: tuple[int, ...], observation_space: spaces.Space, sb3_dtypes: Any, what: str) -> Any:
    """One step's observation (a dict for Dict spaces) as :func:`as_row` s of ``[*lead, *spec.shape]``
    in the spec's dtypes: Discrete observations reshaped and narrowed dtypes checked, as SB3's
    ``add`` treats them (``sb3_dtypes``: SB3's dtypes, :func:`obs_dtypes`).

    Raises:
      ValueError: a dict without exactly the space's keys (Dict spaces), or :func:`as_row`'s errors.
    """
    def one(x, s, space, sb3, name):
        return as_row(x, (*lead, *s.shape), s.dtype, name, reshape=isinstance(space, spaces.Discrete), exact=s.dtype != sb3)

    if isinstance(spec, dict):
        if not isinstance(obs, dict) or set(obs) != set(spec):
            got = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
            raise ValueError(f"{what}: expected a dict with keys {sorted(spec)}, got {got}")
        return {k: one(obs[k], s, observation_space[k], sb3_dtypes[k], f"{what}[{k!r}]") for k, s in spec.items()}
    return one(obs, spec, observation_space, sb3_dtypes, what)


def to_torch_tensor(x: jax.Array, device: th.device, dtype: Any = None) -> th.Tensor:
    """A jax array as a torch tensor on ``device`` (DLPack: no copy for CPU -> CPU).

    ``dtype`` (numpy) casts the result afterwards, used to give back SB3's 64-bit dtypes.
    """
    t = _hand_off(x, device)
    if dtype is not None:
        tdt = _TORCH_DTYPES[np.dtype(dtype)]
        if t.dtype != tdt:
            t = t.to(tdt)
    return t


def _hand_off(x: jax.Array, device: th.device) -> th.Tensor:
    try:  # the library's own DLPack bridge, once present
        from jaxbuffers.interop.torch import to_torch
    except ImportError:  # pragma: no cover - depends on what has landed
        t = th.from_dlpack(x)
        return t if t.device == device else t.to(device)
    return to_torch(x, device=device)


_TORCH_DTYPES = {
    np.dtype(np.bool_): th.bool,
    np.dtype(np.uint8): th.uint8,
    np.dtype(np.uint16): th.uint16,
    np.dtype(np.uint32): th.uint32,
    np.dtype(np.uint64): th.uint64,
    np.dtype(np.int8): th.int8,
    np.dtype(np.int16): th.int16,
    np.dtype(np.int32): th.int32,
    np.dtype(np.int64): th.int64,
    np.dtype(np.float16): th.float16,
    np.dtype(np.float32): th.float32,
    np.dtype(np.float64): th.float64,
}


def tree_to_numpy(tree: Any) -> Any:
    """Every leaf as a numpy array (host copy if needed)."""
    return jax.tree.map(np.asarray, tree)


def jnp_tree(tree: Any) -> Any:
    return jax.tree.map(jnp.asarray, tree)
