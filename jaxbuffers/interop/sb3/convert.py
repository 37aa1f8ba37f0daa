"""Move the contents of SB3 buffers into jaxbuffers buffers and back, bit for bit or raising (layouts, flags and
dtypes: `docs/api/sb3.md`, "Conversions").
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import DictReplayBuffer, DictRolloutBuffer, ReplayBuffer, RolloutBuffer

from jaxbuffers import _validate
from jaxbuffers import replay as _replay
from jaxbuffers import rollout as _rollout
from jaxbuffers.interop.sb3 import _common
from jaxbuffers.interop.sb3.rollout import sb3_terminated

__all__ = ["replay_to_jax", "replay_from_jax", "rollout_to_jax", "rollout_from_jax"]


def _stored(tree: Any, space: spaces.Space, what: str) -> Any:
    """SB3 observation arrays (a dict for Dict spaces) in the dtypes JAX holds them in."""
    def one(sp, a, name):
        a = np.asarray(a)
        return a.astype(_common.storage_dtype(a.dtype, sp, name), copy=False)

    return _common.per_key(one, space, tree, what=what)


def _decoded(buffer: Any, a: Any, what: str, key: str | None = None) -> Any:
    """``a`` (a dict of them for Dict spaces), or sb3-extra-buffers' object array of compressed entries decoded to
    ``[*a.shape, *obs_shape]`` (zeros where nothing was stored) by the buffer's decoder (``TypeError`` without one)."""
    if isinstance(a, dict):
        return {k: _decoded(buffer, v, f"{what}[{k!r}]", k) for k, v in a.items()}
    a = np.asarray(a)
    if a.dtype != object:
        return a
    decompress = getattr(buffer, "_decompress", None)
    if decompress is None:
        raise TypeError(f"{what}: an object array in a {type(buffer).__name__}, which has no decoder (_decompress)")
    config = buffer.flatten_config if key is None else buffer.flatten_configs[key]
    shape = tuple(buffer.obs_shape if key is None else buffer.obs_shape[key])
    dtype = (buffer.observation_space if key is None else buffer.observation_space[key]).dtype
    out = np.zeros((*a.shape, *shape), dtype)
    for i in np.ndindex(a.shape):
        if a[i] is not None:
            out[i] = _common.exact_cast(np.asarray(decompress(a[i], arr_configs=config)).reshape(shape), dtype, what)
    return out


def _put(dst: Any, src: Any, lead: int, what: str, space: spaces.Space | None = None, shift: int = 0) -> Any:
    """Write ``src`` ``[*L, *item]`` (``lead = len(L)``; ``item``: ``sb3_item`` or the space's shape), rows rolled
    ``shift`` to the front, into SB3's ``dst`` ``[rows, n_envs, *sb3_item]`` and return it; ``ValueError`` for
    another item shape, ``TypeError`` for a value ``dst.dtype`` does not hold."""
    if isinstance(space, spaces.Dict):
        return _common.per_key(lambda sp, d, s, w: _put(d, s, lead, w, sp, shift), space, dst, src, what=what)
    a = np.asarray(src)
    shapes = [tuple(dst.shape[2:])] + ([tuple(space.shape)] if space is not None and tuple(space.shape) != tuple(dst.shape[2:]) else [])
    if a.shape[lead:] not in shapes:
        raise ValueError(f"{what}: expected items of shape {' or '.join(map(str, shapes))}, got {a.shape[lead:]} (array {a.shape})")
    a = _common.exact_cast(np.roll(a.reshape(dst.shape), -shift, axis=0), dst.dtype, what)
    dst[...] = a
    return a


def replay_to_jax(buffer: ReplayBuffer) -> _replay.ReplayBuffer:
    """The transitions of a (filled) SB3 ``ReplayBuffer`` / ``DictReplayBuffer``, sb3-extra-buffers' compressed one
    or a `JaxReplayBuffer` without ``compress`` as a `jaxbuffers.ReplayBuffer` (layout: `docs/api/sb3.md`,
    "Conversions").

    Raises:
      ValueError: a ``timeouts`` flag set where ``dones`` is not (SB3's VecEnvs never produce it), or flags other
        than 0/1.
      TypeError: `buffer` not an SB3 replay buffer, a `JaxReplayBuffer` with ``compress`` (jaxbuffers'
        `CompressedReplayBuffer`: its observations live in a host store; SB3's ``save_replay_buffer`` keeps it),
        float64 observations, or 64-bit integers outside int32.
    """
    _common.check_type("buffer", buffer, ReplayBuffer)
    if getattr(buffer, "compress", None) is not None and hasattr(buffer, "jax_buffer"):
        raise TypeError(f"buffer: a {type(buffer).__name__} with compress=... holds its observations in a host store, "
                        "which replay_to_jax does not read; sample it, or save it with save_replay_buffer")
    rows, n = buffer.buffer_size, buffer.n_envs
    total = rows * n
    stored = lambda name: _stored(_decoded(buffer, getattr(buffer, name), name), buffer.observation_space, name)  # noqa: E731
    obs = stored("observations")
    if buffer.optimize_memory_usage:
        next_obs = jax.tree.map(lambda a: np.roll(a, -1, axis=0), obs)
    else:
        next_obs = stored("next_observations")
    act = _stored(buffer.actions, buffer.action_space, "actions")
    dones, timeouts = _common.flags(buffer.dones, "dones"), _common.flags(buffer.timeouts, "timeouts")
    if (timeouts & ~dones).any():
        raise ValueError("timeouts: set where dones is not; a timeout is an episode end (done) in SB3's VecEnvs")
    item = {"obs": obs, "action": act, "reward": np.asarray(buffer.rewards, np.float32), "next_obs": next_obs,
            "terminated": dones & ~timeouts, "truncated": dones & timeouts}
    item = jax.tree.map(lambda a: a.reshape(total, *a.shape[2:]), item)  # [rows, n_envs, ...] -> [rows * n_envs, ...]
    out = _replay.ReplayBuffer.create(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), item), capacity=total)
    if buffer.full:
        valid, added = ((rows - 1) * n if buffer.optimize_memory_usage else total), total
    else:
        valid = added = buffer.pos * n
    return _common.with_ring_state(out.replace(storage=jax.tree.map(jnp.asarray, item)), buffer.pos * n, valid, added)


def replay_from_jax(buffer: _replay.ReplayBuffer, observation_space: spaces.Space, action_space: spaces.Space, *, n_envs: int = 1,
                    device: th.device | str = "auto", optimize_memory_usage: bool = False, handle_timeout_termination: bool = True) -> ReplayBuffer:
    """An SB3 ``ReplayBuffer`` (``DictReplayBuffer`` for Dict spaces) holding ``buffer``'s transitions.

    ``buffer`` has the `replay_to_jax` layout, with ``capacity``, ``head`` and ``num_valid`` divisible by ``n_envs``;
    items may also have the spaces' own shapes (a Discrete observation or action ``()``). SB3 gets ``capacity //
    n_envs`` rows and samples only the ``num_valid`` valid transitions (``pos`` and ``full``: `docs/api/sb3.md`,
    "Conversions").

    Raises:
      ValueError: missing or extra fields or keys, an item shape the spaces do not give (both named), flags other
        than 0/1, or sizes not divisible by ``n_envs``.
      TypeError: `buffer` not a `jaxbuffers.ReplayBuffer`, or a value SB3's dtype for the field does not hold
        exactly (0.5 for uint8 pixels).
    """
    _common.check_type("buffer", buffer, _replay.ReplayBuffer)
    n_envs = _validate.static_int("n_envs", n_envs)
    storage = buffer.storage
    want = {"obs", "action", "reward", "next_obs", "terminated", "truncated"}
    if not isinstance(storage, dict) or set(storage) != want:
        got = sorted(storage) if isinstance(storage, dict) else type(storage).__name__
        raise ValueError(f"buffer: expected items with fields {sorted(want)} (the replay_to_jax layout), got {got}")
    cap, head, valid, n = buffer.capacity, int(buffer.head), int(buffer.num_valid), int(n_envs)
    for name, v in (("capacity", cap), ("head", head), ("num_valid", valid)):
        if v % n:
            raise ValueError(f"buffer.{name}: {v} is not divisible by n_envs={n}; SB3 stores whole rows of n_envs transitions")
    cls = DictReplayBuffer if isinstance(observation_space, spaces.Dict) else ReplayBuffer
    out = cls(cap, observation_space, action_space, device=device, n_envs=n,
              optimize_memory_usage=optimize_memory_usage, handle_timeout_termination=handle_timeout_termination)
    rows, pos, valid_rows = out.buffer_size, head // n, valid // n
    # SB3 samples rows [0, pos), or every row once full (but row pos with optimize_memory_usage): else ours move.
    full = valid_rows == rows or (optimize_memory_usage and buffer.num_added() >= cap and valid_rows == rows - 1 > 0)
    shift = 0 if full else (pos - valid_rows) % rows
    pos = pos if full else valid_rows

    def put(name: str, dst: Any, space: spaces.Space | None = None) -> Any:
        return _put(dst, storage[name], 1, f"buffer.storage[{name!r}]", space, shift)

    put("obs", out.observations, observation_space)
    if optimize_memory_usage:
        next_obs = put("next_obs", np.empty_like(out.observations), observation_space)
        if valid_rows > 0:  # SB3 keeps the newest next observation in row pos
            out.observations[pos] = next_obs[(pos - 1) % rows]
    else:
        put("next_obs", out.next_observations, observation_space)
    put("action", out.actions, action_space)
    put("reward", out.rewards)
    term, trunc = (_common.flags(put(k, np.empty(out.dones.shape, storage[k].dtype)), f"buffer.storage[{k!r}]") for k in ("terminated", "truncated"))
    out.dones[...] = term | trunc
    if handle_timeout_termination:
        out.timeouts[...] = trunc
    out.pos, out.full = pos, full
    return out


def _sb3_layout(buffer: RolloutBuffer, name: str, item: Any) -> Any:
    """``buffer.<name>`` as ``[T, n_envs, *item]``, also after SB3's ``get()`` flattened it in place to ``[n_envs * T,
    *item]`` (env-major; ``[n_envs * T, 1]`` for ``[T, n_envs]`` ones)."""
    t, n = buffer.buffer_size, buffer.n_envs

    def one(a: Any, item: tuple, what: str, key: str | None = None) -> np.ndarray:
        a, flat = _decoded(buffer, a, what, key), (n * t, *(item or (1,)))  # decoded: [T, n] or, after get(), [n * T, 1]
        if (n > 1 and a.shape == (n * t, 1, *item)) or (not item and a.shape == (n * t,)):  # the latter: sb3-extra-buffers' get()
            a = a.reshape(flat)
        if a.shape == (t, n, *item):
            return a
        if a.shape == flat:
            return a.reshape(n, t, *item).swapaxes(0, 1)
        raise ValueError(f"buffer.{what}: expected shape {(t, n, *item)} (or {flat} after get()), got {a.shape}")

    value = getattr(buffer, name)
    if isinstance(item, dict):
        return {k: one(value[k], tuple(item[k]), f"{name}[{k!r}]", k) for k in item}
    return one(value, tuple(item), name)


def rollout_to_jax(buffer: RolloutBuffer, last_dones: np.ndarray | None = None) -> _rollout.RolloutBuffer:
    """The contents of an SB3 ``RolloutBuffer`` / ``DictRolloutBuffer`` (a `JaxRolloutBuffer`, sb3-extra-buffers'
    compressed one; fields ``[T, n_envs, ...]`` or ``[n_envs * T, ...]`` after ``get()``) as a
    `jaxbuffers.RolloutBuffer`: every field copied (``has_advantages`` True, ``trainable`` all True), ``buffer_size``
    rows filled when full, ``pos`` before.

    Args:
      last_dones: ``[n_envs]`` bool, the ``dones`` SB3 passed to ``compute_returns_and_advantage`` (SB3 does not
        store it); without it the last step counts as not terminated.

    Raises:
      ValueError: flags other than 0/1, ``last_dones`` of the wrong size, or an array of neither shape above.
      TypeError: `buffer` not an SB3 rollout buffer, float64 observations, 64-bit integers outside int32, or float64
        actions that float32 does not hold exactly.
    """
    _common.check_type("buffer", buffer, RolloutBuffer)
    t, n = buffer.buffer_size, buffer.n_envs
    get = lambda name, item=(): _sb3_layout(buffer, name, item)  # noqa: E731
    act = get("actions", (buffer.action_dim,))
    act_dtype = _common.storage_dtype(_common.sb3_float32(act.dtype), buffer.action_space, "actions")
    starts = _common.flags(get("episode_starts"), "episode_starts")
    filled = t if buffer.full else buffer.pos
    dones = np.zeros(n, np.bool_) if last_dones is None else _common.as_row(last_dones, (n,), np.bool_, "last_dones")
    step = {"obs": _stored(get("observations", buffer.obs_shape), buffer.observation_space, "observations"),
            "action": _common.exact_cast(act, act_dtype, "actions"),
            "log_prob": np.asarray(get("log_probs"), np.float32), "episode_start": starts}
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[2:], a.dtype), step)
    out = _rollout.RolloutBuffer.create(spec, num_envs=n, num_steps=t)
    f32 = lambda name: jnp.asarray(np.asarray(get(name), np.float32))  # noqa: E731
    return out.replace(step=jax.tree.map(jnp.asarray, step), reward=f32("rewards"), value=f32("values"),
                       terminated=sb3_terminated(jnp.asarray(starts), jnp.asarray(dones), jnp.int32(filled)),
                       trainable=jnp.ones((t, n), jnp.bool_), advantages=f32("advantages"), returns=f32("returns"),
                       step_index=jnp.int32(filled), has_advantages=jnp.bool_(True))


def rollout_from_jax(buffer: _rollout.RolloutBuffer, observation_space: spaces.Space, action_space: spaces.Space, *, device: th.device | str = "auto",
                     gamma: float = 0.99, gae_lambda: float = 1.0, first_episode_start: np.ndarray | None = None) -> RolloutBuffer:
    """An SB3 ``RolloutBuffer`` (``DictRolloutBuffer`` for Dict spaces) with ``buffer``'s contents.

    The step pytree holds ``obs``, ``action``, ``log_prob`` and optionally ``episode_start`` (the `rollout_to_jax`
    layout, used as is); without it ``episode_starts[t] = terminated[t-1] or truncated[t-1]`` and
    ``episode_starts[0] = first_episode_start`` (default False). A step truncated and not terminated gets ``gamma *
    final_value`` added to its reward (SB3's timeout convention). ``advantages`` and ``returns`` are copied as they
    are; ``pos`` is the rows filled. Items are shaped as `replay_from_jax` describes. SB3 learns from every step.

    Raises:
      ValueError: the step lacks ``obs``, ``action`` or ``log_prob``; a filled step is not ``trainable``; an item
        shape the spaces do not give (both named); flags other than 0/1.
      TypeError: `buffer` not a `jaxbuffers.RolloutBuffer`, or a value SB3's dtype for the field does not hold exactly.
    """
    _common.check_type("buffer", buffer, _rollout.RolloutBuffer)
    step = buffer.step
    if not isinstance(step, dict) or not {"obs", "action", "log_prob"} <= set(step):
        got = sorted(step) if isinstance(step, dict) else type(step).__name__
        raise ValueError(f"buffer.step: expected a dict with 'obs', 'action', 'log_prob' (the rollout_to_jax layout), got {got}")
    skipped = np.asarray(buffer.filled() & ~buffer.trainable)
    if skipped.any():
        at = tuple(int(i) for i in np.argwhere(skipped)[0])
        raise ValueError(f"buffer.trainable: expected every filled step trainable (SB3 has no per-step mask and would "
                         f"learn from all), got {int(skipped.sum())} that are not, the first at (t, env) = {at}; to "
                         f"convert anyway, pass buffer.replace(trainable=jnp.ones_like(buffer.trainable))")
    t, n = buffer.num_steps, buffer.num_envs
    cls = DictRolloutBuffer if isinstance(observation_space, spaces.Dict) else RolloutBuffer
    out = cls(t, observation_space, action_space, device=device, gae_lambda=gae_lambda, gamma=gamma, n_envs=n)
    term, trunc = np.asarray(buffer.terminated), np.asarray(buffer.truncated)
    reward = np.asarray(buffer.reward, np.float32)
    fold = trunc & ~term
    if fold.any():
        reward = np.where(fold, reward + np.float32(gamma) * np.asarray(buffer.final_value, np.float32), reward)
    if "episode_start" in step:
        starts = _common.flags(step["episode_start"], "buffer.step['episode_start']")
    else:
        first = np.zeros(n, np.bool_) if first_episode_start is None else _common.as_row(first_episode_start, (n,), np.bool_, "first_episode_start")
        starts = np.concatenate([first[None], (term | trunc)[:-1]], axis=0)
    _put(out.observations, step["obs"], 2, "buffer.step['obs']", observation_space)
    _put(out.actions, step["action"], 2, "buffer.step['action']", action_space)
    _put(out.log_probs, step["log_prob"], 2, "buffer.step['log_prob']")
    _put(out.episode_starts, starts, 2, "episode_starts")
    for attr, name, src in (("rewards", "reward", reward), ("values", "value", buffer.value),
                            ("advantages", "advantages", buffer.advantages), ("returns", "returns", buffer.returns)):
        _put(getattr(out, attr), src, 2, f"buffer.{name}")
    out.pos = int(buffer.step_index)
    out.full = out.pos == t
    return out
