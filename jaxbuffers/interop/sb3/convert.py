"""Move the contents of SB3 buffers into jaxbuffers buffers and back.

Layouts produced (and accepted back):

Replay (:func:`replay_to_jax` / :func:`replay_from_jax`): a :class:`jaxbuffers.ReplayBuffer` of
single transitions with items ``{"obs", "action", "reward", "next_obs", "terminated",
"truncated"}`` and capacity ``rows * n_envs``. SB3's row ``t``, env ``e`` is slot ``t * n_envs + e``
(the physical layout is kept, so ``head = pos * n_envs``), ``num_valid`` counts the transitions SB3
would sample, and ``num_added()`` is ``rows * n_envs`` once SB3 was full (``pos * n_envs`` before).
Flags (our conventions, docs/guide.md section 2): ``terminated = done and not timeout``, ``truncated = done and
timeout``; back: ``dones = terminated or truncated``, ``timeouts = truncated`` (all 0 when exported
with ``handle_timeout_termination=False``: SB3 then treats time limits as terminal, as it does
itself).

Rollout (:func:`rollout_to_jax` / :func:`rollout_from_jax`): a :class:`jaxbuffers.RolloutBuffer`
whose step pytree is ``{"obs", "action", "log_prob", "episode_start"}`` (the layout
:class:`~jaxbuffers.interop.sb3.JaxRolloutBuffer` uses), with SB3's episode flags translated as
explained in :mod:`jaxbuffers.interop.sb3.rollout`: ``terminated[t] = episode_start[t + 1]``,
``terminated[T - 1] = last_dones``, no truncation (SB3 has folded ``gamma * V(terminal_obs)`` into
the reward at time limits). Back to SB3, a truncated step of a native rollout has
``gamma * final_value`` folded into its reward and the next step marked as an episode start.

Dtypes: 64-bit integers are held as int32 when the space's bounds fit and given back in the
space's dtype; float64 observations are refused (see :mod:`jaxbuffers.interop.sb3.replay`).
Round trips SB3 -> jaxbuffers -> SB3 give back every stored array bit for bit (including rows not
yet written) together with ``pos`` and ``full``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import DictReplayBuffer, DictRolloutBuffer, ReplayBuffer, RolloutBuffer

from jaxbuffers import _ring
from jaxbuffers import replay as _replay
from jaxbuffers import rollout as _rollout
from jaxbuffers.interop.sb3 import _common
from jaxbuffers.interop.sb3.rollout import sb3_terminated

__all__ = ["replay_to_jax", "replay_from_jax", "rollout_to_jax", "rollout_from_jax"]


def _flags(x: Any, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.bool_:
        bad = (a != 0) & (a != 1)
        if bad.any():
            raise ValueError(f"{what}: expected 0/1 flags, found {a[bad].ravel()[:3].tolist()} ...")
    return a.astype(np.bool_)


def _obs_tree(obs: Any, observation_space: spaces.Space, fn) -> Any:
    if isinstance(observation_space, spaces.Dict):
        return {k: fn(np.asarray(obs[k]), sub, f"[{k!r}]") for k, sub in observation_space.spaces.items()}
    return fn(np.asarray(obs), observation_space, "")


def replay_to_jax(buffer: ReplayBuffer) -> _replay.ReplayBuffer:
    """The transitions of a (filled) SB3 ``ReplayBuffer`` / ``DictReplayBuffer`` as a :class:`jaxbuffers.ReplayBuffer`.

    Also accepts :class:`~jaxbuffers.interop.sb3.JaxReplayBuffer`. See the module docstring
    for the layout. With ``optimize_memory_usage`` the next observations are materialised
    (``next_obs`` of row ``t`` is SB3's ``observations[(t + 1) % rows]``) and, once full, the
    row at ``pos`` (whose observation SB3 has overwritten) is outside the valid range.

    Raises:
      ValueError: a ``timeouts`` flag set where ``dones`` is not (SB3's VecEnvs never produce it;
        it has no meaning in our conventions), or flags other than 0/1.
      TypeError: float64 observations, or 64-bit integers outside int32 (see module docstring).
    """
    rows, n = buffer.buffer_size, buffer.n_envs
    total = rows * n
    flat = lambda a: a.reshape(total, *a.shape[2:])

    def obs_fn(a, space, key):
        return flat(a.astype(_common.storage_dtype(a.dtype, space, f"observations{key}"), copy=False))

    obs = _obs_tree(buffer.observations, buffer.observation_space, obs_fn)
    if buffer.optimize_memory_usage:
        next_obs = jax.tree.map(lambda a: flat(np.roll(a.reshape(rows, n, *a.shape[1:]), -1, axis=0)), obs)
    else:
        next_obs = _obs_tree(buffer.next_observations, buffer.observation_space, obs_fn)
    act = np.asarray(buffer.actions)
    act = flat(act.astype(_common.storage_dtype(act.dtype, buffer.action_space, "actions"), copy=False))
    dones = _flags(buffer.dones, "dones")
    timeouts = _flags(buffer.timeouts, "timeouts")
    if (timeouts & ~dones).any():
        raise ValueError("timeouts: set where dones is not; a timeout is an episode end (done) in SB3's VecEnvs")
    item = {
        "obs": obs,
        "action": act,
        "reward": flat(np.asarray(buffer.rewards, np.float32)),
        "next_obs": next_obs,
        "terminated": flat(dones & ~timeouts),
        "truncated": flat(dones & timeouts),
    }
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), item)
    out = _replay.ReplayBuffer.create(spec, capacity=total)
    if buffer.full:
        valid = (rows - 1) * n if buffer.optimize_memory_usage else total
        added = total
    else:
        valid = added = buffer.pos * n
    return out.replace(storage=jax.tree.map(jnp.asarray, item)).with_cursors(
        head=buffer.pos * n, num_valid=valid, added=_ring.counter_add(_ring.counter_zero(), added)
    )


def replay_from_jax(
    buffer: _replay.ReplayBuffer,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    *,
    n_envs: int = 1,
    device: th.device | str = "auto",
    optimize_memory_usage: bool = False,
    handle_timeout_termination: bool = True,
) -> ReplayBuffer:
    """An SB3 ``ReplayBuffer`` (``DictReplayBuffer`` for Dict spaces) holding ``buffer``'s transitions.

    ``buffer`` must have the layout of :func:`replay_to_jax` (items ``obs``, ``action``,
    ``reward``, ``next_obs``, ``terminated``, ``truncated``) and ``capacity``, ``head`` and
    ``num_valid`` divisible by ``n_envs``. SB3 gets ``capacity // n_envs`` rows, ``pos = head //
    n_envs`` and ``full = num_added() >= capacity``. With ``optimize_memory_usage`` the next
    observation of the newest row is written to row ``pos``, as SB3 does; a buffer that is full
    in every row then loses its oldest observation row (SB3's design: it never samples that row).

    Raises:
      ValueError: missing or extra item fields, or sizes not divisible by ``n_envs``.
    """
    storage = buffer.storage
    want = {"obs", "action", "reward", "next_obs", "terminated", "truncated"}
    if not isinstance(storage, dict) or set(storage) != want:
        got = sorted(storage) if isinstance(storage, dict) else type(storage).__name__
        raise ValueError(f"buffer: expected items with fields {sorted(want)} (the replay_to_jax layout), got {got}")
    cap, head, valid = buffer.capacity, int(buffer.head), int(buffer.num_valid)
    n = int(n_envs)
    for name, v in (("capacity", cap), ("head", head), ("num_valid", valid)):
        if v % n:
            raise ValueError(f"buffer.{name}: {v} is not divisible by n_envs={n}; SB3 stores whole rows of n_envs transitions")
    cls = DictReplayBuffer if isinstance(observation_space, spaces.Dict) else ReplayBuffer
    out = cls(
        cap,
        observation_space,
        action_space,
        device=device,
        n_envs=n,
        optimize_memory_usage=optimize_memory_usage,
        handle_timeout_termination=handle_timeout_termination,
    )
    rows = out.buffer_size
    unflat = lambda a: np.asarray(a).reshape(rows, n, *a.shape[1:])
    pos = head // n

    def put(dst: np.ndarray, src: Any) -> None:
        dst[...] = unflat(src).astype(dst.dtype, copy=False)

    def put_obs(dst: Any, src: Any) -> None:
        if isinstance(dst, dict):
            for k in dst:
                put(dst[k], src[k])
        else:
            put(dst, src)

    put_obs(out.observations, storage["obs"])
    if optimize_memory_usage:
        if valid > 0:
            last = (pos - 1) % rows
            out.observations[pos] = unflat(storage["next_obs"])[last].astype(out.observations.dtype)
    else:
        put_obs(out.next_observations, storage["next_obs"])
    put(out.actions, storage["action"])
    put(out.rewards, storage["reward"])
    term, trunc = np.asarray(storage["terminated"]), np.asarray(storage["truncated"])
    put(out.dones, term | trunc)
    if handle_timeout_termination:
        put(out.timeouts, trunc)
    out.pos = pos
    out.full = buffer.num_added() >= cap
    return out


def _unflatten_if_ready(buffer: RolloutBuffer, name: str, value: Any) -> Any:
    # SB3's get() reorders these arrays in place to [n_envs * T, ...] (env-major); undo it.
    if not getattr(buffer, "generator_ready", False) or name not in ("observations", "actions", "values", "log_probs", "advantages", "returns"):
        return value
    t, n = buffer.buffer_size, buffer.n_envs
    if name in ("values", "log_probs", "advantages", "returns"):  # [T, N] became [N * T, 1]
        return np.asarray(value).reshape(n, t).T
    return jax.tree.map(lambda a: np.asarray(a).reshape(n, t, *a.shape[1:]).swapaxes(0, 1), value)


def rollout_to_jax(buffer: RolloutBuffer, last_dones: np.ndarray | None = None) -> _rollout.RolloutBuffer:
    """The contents of an SB3 ``RolloutBuffer`` / ``DictRolloutBuffer`` as a :class:`jaxbuffers.RolloutBuffer`.

    Also accepts :class:`~jaxbuffers.interop.sb3.JaxRolloutBuffer`, and SB3 buffers already
    reordered by ``get()``. Every field is copied (``advantages`` and ``returns`` as they are;
    ``has_advantages`` is set True). ``step_index`` is ``buffer_size`` when full, ``pos`` before.

    Args:
      buffer: the SB3 buffer.
      last_dones: ``[n_envs]`` bool, whether the last filled step ended an episode: the
        ``dones`` SB3 passed to ``compute_returns_and_advantage``. SB3 does not store it; without
        it the last step counts as not terminated (only matters if GAE is recomputed).

    Raises:
      ValueError: ``episode_starts`` other than 0/1, or ``last_dones`` of the wrong size.
      TypeError: float64 observations, or 64-bit integers outside int32.
    """
    t, n = buffer.buffer_size, buffer.n_envs
    get = lambda name: _unflatten_if_ready(buffer, name, getattr(buffer, name))

    def obs_fn(a, space, key):
        return a.astype(_common.storage_dtype(a.dtype, space, f"observations{key}"), copy=False)

    obs = _obs_tree(get("observations"), buffer.observation_space, obs_fn)
    act = np.asarray(get("actions"))
    act_dtype = _common.storage_dtype(ReplayBuffer._maybe_cast_dtype(act.dtype), buffer.action_space, "actions")
    starts = _flags(buffer.episode_starts, "episode_starts")
    filled = t if buffer.full else buffer.pos
    dones = np.zeros(n, np.bool_) if last_dones is None else _common.as_row(last_dones, (n,), np.bool_, "last_dones")
    step = {
        "obs": obs,
        "action": act.astype(act_dtype, copy=False),
        "log_prob": np.asarray(get("log_probs"), np.float32),
        "episode_start": starts,
    }
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[2:], a.dtype), step)
    out = _rollout.RolloutBuffer.create(spec, num_steps=t, num_envs=n)
    f32 = lambda name: jnp.asarray(np.asarray(get(name), np.float32))
    return out.replace(
        step=jax.tree.map(jnp.asarray, step),
        reward=f32("rewards"),
        value=f32("values"),
        terminated=sb3_terminated(jnp.asarray(starts), jnp.asarray(dones), jnp.int32(filled)),
        truncated=jnp.zeros((t, n), jnp.bool_),
        final_value=jnp.zeros((t, n), jnp.float32),
        trainable=jnp.ones((t, n), jnp.bool_),
        advantages=f32("advantages"),
        returns=f32("returns"),
        step_index=jnp.int32(filled),
        overflowed=jnp.bool_(False),
        has_advantages=jnp.bool_(True),
    )


def rollout_from_jax(
    buffer: _rollout.RolloutBuffer,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    *,
    device: th.device | str = "auto",
    gamma: float = 0.99,
    gae_lambda: float = 1.0,
    first_episode_start: np.ndarray | None = None,
) -> RolloutBuffer:
    """An SB3 ``RolloutBuffer`` (``DictRolloutBuffer`` for Dict spaces) with ``buffer``'s contents.

    ``buffer``'s step pytree must hold ``obs``, ``action`` and ``log_prob`` (``episode_start``
    optional). Flags: if the step holds ``episode_start`` it is used as is (the SB3 layout of
    :func:`rollout_to_jax`); otherwise ``episode_starts[t] = terminated[t-1] or truncated[t-1]``
    and ``episode_starts[0] = first_episode_start`` (default all False). Rewards: where a step is
    truncated and not terminated, ``gamma * final_value`` is added, SB3's timeout convention.
    ``advantages`` and ``returns`` are copied as they are (zeros if GAE never ran); ``pos`` is
    ``step_index``, ``full`` is ``step_index == num_steps``.

    Raises:
      ValueError: the step pytree lacks ``obs``, ``action`` or ``log_prob``.
    """
    step = buffer.step
    if not isinstance(step, dict) or not {"obs", "action", "log_prob"} <= set(step):
        got = sorted(step) if isinstance(step, dict) else type(step).__name__
        raise ValueError(f"buffer.step: expected a dict with 'obs', 'action', 'log_prob' (the rollout_to_jax layout), got {got}")
    t, n = buffer.num_steps, buffer.num_envs
    cls = DictRolloutBuffer if isinstance(observation_space, spaces.Dict) else RolloutBuffer
    out = cls(t, observation_space, action_space, device=device, gae_lambda=gae_lambda, gamma=gamma, n_envs=n)
    term, trunc = np.asarray(buffer.terminated), np.asarray(buffer.truncated)
    reward = np.asarray(buffer.reward, np.float32)
    fold = trunc & ~term
    if fold.any():
        reward = np.where(fold, reward + np.float32(gamma) * np.asarray(buffer.final_value, np.float32), reward)
    if "episode_start" in step:
        starts = np.asarray(step["episode_start"])
    else:
        first = np.zeros(n, np.bool_) if first_episode_start is None else _common.as_row(first_episode_start, (n,), np.bool_, "first_episode_start")
        starts = np.concatenate([first[None], (term | trunc)[:-1]], axis=0)

    def put(dst: np.ndarray, src: Any) -> None:
        dst[...] = np.asarray(src).reshape(dst.shape).astype(dst.dtype, copy=False)

    if isinstance(out.observations, dict):
        for k in out.observations:
            put(out.observations[k], step["obs"][k])
    else:
        put(out.observations, step["obs"])
    put(out.actions, step["action"])
    put(out.log_probs, step["log_prob"])
    put(out.rewards, reward)
    put(out.episode_starts, starts)
    put(out.values, buffer.value)
    put(out.advantages, buffer.advantages)
    put(out.returns, buffer.returns)
    out.pos = int(buffer.step_index)
    out.full = out.pos == t
    return out
