"""Checks of the calls on SB3's own ``RolloutBuffer`` / ``DictRolloutBuffer``, changing nothing, so that a facade over
several buffers refuses a call before any changes (SB3's ``add`` fails at the first field that does not fit).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np

from jaxbuffers import _validate


def assignable(name: str, x: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``x`` as numpy when numpy can assign it into a float / bool array of ``shape`` (``dst[...] = x``)."""
    try:
        a = np.asarray(x)
    except Exception as e:  # a tensor on an accelerator, a ragged list, ...
        raise TypeError(f"{name}: expected a numeric array of shape {shape}, got a {type(x).__name__} ({e})") from None
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{name}: expected a numeric array of shape {shape}, got dtype {a.dtype}")
    s = a.shape
    while len(s) > len(shape) and s[0] == 1:
        s = s[1:]
    try:
        ok = np.broadcast_shapes(s, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name}: expected an array that broadcasts to shape {tuple(shape)}, got shape {a.shape}")
    return a


def _sized(name: str, x: Any, size: int, what: str, tensor: bool = False) -> None:
    """``x`` has ``reshape`` (a torch tensor with ``clone`` where SB3 clones it) and ``size`` numeric values."""
    need = ("clone", "cpu") if tensor else ("reshape",)
    if not all(callable(getattr(x, m, None)) for m in need):
        kind = "a torch tensor" if tensor else "an array"
        raise TypeError(f"{name}: expected {kind} of {size} values ({what}), got a {type(x).__name__}")
    if tensor:
        _no_grad(name, x)
    if math.prod(tuple(x.shape)) != size:
        raise ValueError(f"{name}: expected {size} values ({what}), got shape {tuple(x.shape)}")
    assignable(name, x.detach().cpu() if tensor else x, tuple(x.shape))


def _no_grad(name: str, x: Any) -> None:
    if getattr(x, "requires_grad", False):
        raise TypeError(f"{name}: a torch tensor that requires grad; SB3 calls .numpy() on it (pass it computed under "
                        f"torch.no_grad(), or .detach() it)")


def _observation(buf: Any, obs: Any) -> None:
    shapes, discrete = buf.obs_shape, type(buf.observation_space).__name__ == "Discrete"
    if isinstance(shapes, dict):
        if not isinstance(obs, dict):
            raise TypeError(f"obs: expected a dict with keys {sorted(shapes)}, got a {type(obs).__name__}")
        missing = sorted(set(shapes) - set(obs))
        if missing:
            raise ValueError(f"obs: keys {missing} missing; expected the keys {sorted(shapes)}")
        for k, shape in shapes.items():
            sub = type(buf.observation_space[k]).__name__ == "Discrete"
            _obs_leaf(f"obs[{k!r}]", obs[k], (buf.n_envs, *shape), sub)
    else:
        _obs_leaf("obs", obs, (buf.n_envs, *shapes), discrete)


def _obs_leaf(name: str, x: Any, shape: tuple[int, ...], discrete: bool) -> None:
    if not discrete:
        assignable(name, x, shape)
        return
    a = assignable(name, x, np.shape(x))  # SB3 reshapes a Discrete observation to `shape` first
    if a.size != math.prod(shape):
        raise ValueError(f"{name}: expected {math.prod(shape)} values (reshaped to {shape}), got shape {a.shape}")


def filled_for_get(buf: Any) -> None:
    """RuntimeError unless an SB3 rollout buffer holds every step of the rollout, as its ``get`` needs."""
    filled = buf.buffer_size if buf.full else buf.pos
    if filled != buf.buffer_size:
        raise RuntimeError(f"get: the buffer holds {filled} of buffer_size={buf.buffer_size} steps per env; add the rest "
                           f"of the rollout (and call compute_returns_and_advantage) before get()")


def check(buf: Any, name: str, *args: Any, **kwargs: Any) -> None:
    """The argument checks of ``getattr(buf, name)(*args, **kwargs)`` on SB3's rollout buffer ``buf``: ``add`` (a free
    row, else IndexError as SB3's numpy indexing), ``compute_returns_and_advantage``, ``get`` (a full buffer, else
    RuntimeError; ``batch_size`` >= 1: SB3 loops forever on 0) and ``sample``; other methods only their signature."""
    a = inspect.signature(getattr(buf, name)).bind(*args, **kwargs).arguments
    n = buf.n_envs
    if name == "add":
        if buf.full or buf.pos >= buf.buffer_size:
            raise IndexError(f"add: the rollout buffer is full ({buf.buffer_size} steps); call reset() first")
        _observation(buf, a["obs"])
        _sized("action", a["action"], n * buf.action_dim, f"n_envs={n} x action_dim={buf.action_dim}")
        assignable("reward", a["reward"], (n,))
        assignable("episode_start", a["episode_start"], (n,))
        _sized("value", a["value"], n, f"n_envs={n}", tensor=True)
        log_prob = a["log_prob"]
        if not all(callable(getattr(log_prob, m, None)) for m in ("clone", "cpu", "reshape")):
            raise TypeError(f"log_prob: expected a torch tensor of {n} values, got a {type(log_prob).__name__}")
        _no_grad("log_prob", log_prob)
        assignable("log_prob", log_prob.detach().cpu().reshape(-1, 1) if len(log_prob.shape) == 0 else log_prob.detach().cpu(), (n,))
    elif name == "compute_returns_and_advantage":
        _sized("last_values", a["last_values"], n, f"n_envs={n}", tensor=True)
        if not callable(getattr(a["dones"], "astype", None)):
            raise TypeError(f"dones: expected a numpy array of {n} flags, got a {type(a['dones']).__name__}")
        assignable("dones", a["dones"], (n,))
    elif name == "get":
        if a.get("batch_size") is not None:
            _validate.static_int("batch_size", a["batch_size"])
        filled_for_get(buf)
    elif name == "sample":
        _validate.static_int("batch_size", a["batch_size"])
