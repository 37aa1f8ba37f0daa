"""Move the contents of SB3 buffers into jaxbuffers buffers and back.

Layouts produced (and accepted back):

Replay (:func:`replay_to_jax` / :func:`replay_from_jax`): a :class:`jaxbuffers.ReplayBuffer` of
single transitions with items ``{"obs", "action", "reward", "next_obs", "terminated",
"truncated"}`` and capacity ``rows * n_envs``. SB3's row ``t``, env ``e`` is slot ``t * n_envs + e``
(the physical layout is kept, so ``head = pos * n_envs``), ``num_valid`` counts the transitions SB3
would sample, and ``num_added()`` is ``rows * n_envs`` once SB3 was full (``pos * n_envs`` before).
Back to SB3 the layout is kept too, unless SB3's ``pos`` / ``full`` cannot describe the valid
transitions there (see :func:`replay_from_jax`): SB3 only ever samples valid ones.
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
A ``RolloutBuffer``'s float64 actions (SB3 keeps a float64 action space's dtype there; its
``ReplayBuffer`` stores float32) are held as float32 and refused (``TypeError``) when a value is
not a float32 one (PPO / A2C store float32 policy outputs, which always are). Nothing is cast
silently the other way either: a value that does not fit SB3's dtype raises ``TypeError``.
So round trips SB3 -> jaxbuffers -> SB3 (same settings) give back every stored array bit for bit
(including rows not yet written) together with ``pos`` and ``full``, or raise.
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


def _fit(dst: Any, src: Any, lead: int, what: str, space: spaces.Space | None = None, shift: int = 0) -> Any:
    """``src`` (``[*L, *item]``, ``lead = len(L)``) reshaped to SB3's ``dst`` (``[rows, n_envs, *sb3_item]``).

    ``item`` must be SB3's ``sb3_item`` or the space's own shape (SB3 flattens actions to
    ``action_dim`` and Discrete observations to ``(1,)``), else ``ValueError``. ``shift``: rows
    rolled to the front. Dicts (Dict spaces) key by key.
    """
    if isinstance(dst, dict) or isinstance(src, dict):
        if not (isinstance(dst, dict) and isinstance(src, dict) and set(src) == set(dst)):
            want = f"a dict with keys {sorted(dst)}" if isinstance(dst, dict) else "an array"
            got = f"keys {sorted(src)}" if isinstance(src, dict) else type(src).__name__
            raise ValueError(f"{what}: expected {want} (from the observation space), got {got}")
        return {k: _fit(dst[k], src[k], lead, f"{what}[{k!r}]", space[k], shift) for k in dst}
    a = np.asarray(src)
    shapes = [tuple(dst.shape[2:])]
    if space is not None and tuple(space.shape) not in shapes:
        shapes.append(tuple(space.shape))
    if a.shape[lead:] not in shapes:
        raise ValueError(f"{what}: expected items of shape {' or '.join(map(str, shapes))}, got {a.shape[lead:]} (array {a.shape})")
    a = a.reshape(dst.shape)
    return np.roll(a, -shift, axis=0) if shift else a


def _write(dst: Any, src: Any, what: str) -> None:
    """``dst[...] = src`` (dicts key by key); ``TypeError`` where a value does not fit ``dst.dtype``."""
    if isinstance(dst, dict):
        for k in dst:
            _write(dst[k], src[k], f"{what}[{k!r}]")
    else:
        dst[...] = _common.exact_cast(src, dst.dtype, what)


def _obs_tree(obs: Any, observation_space: spaces.Space, fn) -> Any:
    if isinstance(observation_space, spaces.Dict):
        return {k: fn(np.asarray(obs[k]), sub, f"[{k!r}]") for k, sub in observation_space.spaces.items()}
    return fn(np.asarray(obs), observation_space, "")


def replay_to_jax(buffer: ReplayBuffer) -> _replay.ReplayBuffer:
    """The transitions of a (filled) SB3 ``ReplayBuffer`` / ``DictReplayBuffer`` as a :class:`jaxbuffers.ReplayBuffer`.

    Also accepts :class:`~jaxbuffers.interop.sb3.JaxReplayBuffer`, but not one made with
    ``compress=...`` (its observations are not held as arrays: ``AttributeError``; sample it
    instead). See the module docstring
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
    ``reward``, ``next_obs``, ``terminated``, ``truncated``; ``[capacity, *item]``) and
    ``capacity``, ``head`` and ``num_valid`` divisible by ``n_envs``. Item shapes: observations
    SB3's ``obs_shape`` or the space's shape (a Discrete observation may be ``()``), actions
    ``(action_dim,)`` or the action space's shape, rewards and flags ``()``.

    SB3 gets ``capacity // n_envs`` rows and samples only ``buffer``'s ``num_valid`` valid
    transitions (the newest ones, ending at ``head``). When SB3's ``pos`` / ``full`` can describe
    them in place, the layout is kept: ``pos = head // n_envs``, ``full`` when every row is valid
    (with ``optimize_memory_usage``: also when all rows but ``pos`` are and ``num_added() >=
    capacity``, as :func:`replay_to_jax` makes of a full SB3 buffer). Otherwise the valid rows are
    moved to rows ``[0, num_valid // n_envs)`` (oldest first), ``pos = num_valid // n_envs`` and
    ``full`` False. With ``optimize_memory_usage`` the next observation of the newest row is
    written to row ``pos``, as SB3 does; a buffer valid in every row then loses its oldest
    observation row (SB3's design: it never samples that row).

    Raises:
      ValueError: missing or extra item fields (or observation keys), an item of another shape
        than the spaces give (the field, both shapes named), flags other than 0/1, or sizes not
        divisible by ``n_envs``.
      TypeError: a value that SB3's dtype for the field does not hold exactly (e.g. 0.5 for a
        uint8 observation space).
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
    rows, pos, valid_rows = out.buffer_size, head // n, valid // n
    # SB3 samples rows [0, pos), or every row once full (but row pos with optimize_memory_usage).
    # Where our valid rows (the valid_rows before pos) are not laid out so, move them to the front.
    full = valid_rows == rows or (optimize_memory_usage and buffer.num_added() >= cap and valid_rows == rows - 1 > 0)
    shift = 0 if full else (pos - valid_rows) % rows
    if not full:
        pos = valid_rows

    def fit(name: str, dst: Any, space: spaces.Space | None = None) -> Any:
        return _fit(dst, storage[name], 1, f"buffer.storage[{name!r}]", space, shift)

    _write(out.observations, fit("obs", out.observations, observation_space), "buffer.storage['obs']")
    if optimize_memory_usage:
        next_obs = fit("next_obs", out.observations, observation_space)
        if valid_rows > 0:  # SB3 keeps the newest next observation in row pos
            _write(out.observations[pos], next_obs[(pos - 1) % rows], "buffer.storage['next_obs']")
    else:
        _write(out.next_observations, fit("next_obs", out.next_observations, observation_space), "buffer.storage['next_obs']")
    _write(out.actions, fit("action", out.actions, action_space), "buffer.storage['action']")
    _write(out.rewards, fit("reward", out.rewards), "buffer.storage['reward']")
    term = _flags(fit("terminated", out.dones), "buffer.storage['terminated']")
    trunc = _flags(fit("truncated", out.dones), "buffer.storage['truncated']")
    out.dones[...] = term | trunc
    if handle_timeout_termination:
        out.timeouts[...] = trunc
    out.pos = pos
    out.full = full
    return out


def _sb3_layout(buffer: RolloutBuffer, name: str, item: Any) -> Any:
    """``buffer.<name>`` as ``[T, n_envs, *item]``: SB3's ``get()`` flattens several arrays in place to
    ``[n_envs * T, *item]`` (env-major; ``[n_envs * T, 1]`` for ``[T, n_envs]`` ones), ours never do."""
    t, n = buffer.buffer_size, buffer.n_envs

    def one(a: Any, item: tuple, what: str) -> np.ndarray:
        a = np.asarray(a)
        flat = (n * t, *(item or (1,)))
        if a.shape == (t, n, *item):
            return a
        if a.shape == flat:
            return a.reshape(n, t, *item).swapaxes(0, 1)
        raise ValueError(f"buffer.{what}: expected shape {(t, n, *item)} (or {flat} after get()), got {a.shape}")

    value = getattr(buffer, name)
    if isinstance(item, dict):
        return {k: one(value[k], tuple(item[k]), f"{name}[{k!r}]") for k in item}
    return one(value, tuple(item), name)


def rollout_to_jax(buffer: RolloutBuffer, last_dones: np.ndarray | None = None) -> _rollout.RolloutBuffer:
    """The contents of an SB3 ``RolloutBuffer`` / ``DictRolloutBuffer`` as a :class:`jaxbuffers.RolloutBuffer`.

    Also accepts :class:`~jaxbuffers.interop.sb3.JaxRolloutBuffer`, and SB3 buffers already
    reordered by ``get()`` (told apart by their shapes: ``[T, n_envs, ...]`` as stored,
    ``[n_envs * T, ...]`` after SB3's ``get()``). Every field is copied (``advantages`` and
    ``returns`` as they are; ``has_advantages`` is set True; ``trainable`` all True).
    ``step_index`` is ``buffer_size`` when full, ``pos`` before.

    Args:
      buffer: the SB3 buffer.
      last_dones: ``[n_envs]`` bool, whether the last filled step ended an episode: the
        ``dones`` SB3 passed to ``compute_returns_and_advantage``. SB3 does not store it; without
        it the last step counts as not terminated (only matters if GAE is recomputed).

    Raises:
      ValueError: ``episode_starts`` other than 0/1, ``last_dones`` of the wrong size, or an array
        of neither shape above (named, with both shapes).
      TypeError: float64 observations, 64-bit integers outside int32, or float64 actions that
        float32 does not hold exactly.
    """
    t, n = buffer.buffer_size, buffer.n_envs
    get = lambda name, item=(): _sb3_layout(buffer, name, item)

    def obs_fn(a, space, key):
        return a.astype(_common.storage_dtype(a.dtype, space, f"observations{key}"), copy=False)

    obs = _obs_tree(get("observations", buffer.obs_shape), buffer.observation_space, obs_fn)
    act = get("actions", (buffer.action_dim,))
    act_dtype = _common.storage_dtype(ReplayBuffer._maybe_cast_dtype(act.dtype), buffer.action_space, "actions")
    starts = _flags(get("episode_starts"), "episode_starts")
    filled = t if buffer.full else buffer.pos
    dones = np.zeros(n, np.bool_) if last_dones is None else _common.as_row(last_dones, (n,), np.bool_, "last_dones")
    step = {
        "obs": obs,
        "action": _common.exact_cast(act, act_dtype, "actions"),
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
    ``step_index``, ``full`` is ``step_index == num_steps``. Step leaves are ``[T, N, *item]``,
    items shaped as :func:`replay_from_jax` describes (``log_prob`` and ``episode_start``: ``()``).

    SB3 has no per-step ``trainable`` mask and learns from every step, so a filled step marked
    not trainable is refused rather than silently made trainable; to convert anyway, pass
    ``buffer.replace(trainable=jnp.ones_like(buffer.trainable))``.

    Raises:
      ValueError: the step pytree lacks ``obs``, ``action`` or ``log_prob``; a filled step has
        ``trainable`` False; a step leaf of another item shape than the spaces give (the field,
        both shapes named); ``episode_start`` other than 0/1.
      TypeError: a value that SB3's dtype for the field does not hold exactly.
    """
    step = buffer.step
    if not isinstance(step, dict) or not {"obs", "action", "log_prob"} <= set(step):
        got = sorted(step) if isinstance(step, dict) else type(step).__name__
        raise ValueError(f"buffer.step: expected a dict with 'obs', 'action', 'log_prob' (the rollout_to_jax layout), got {got}")
    skipped = np.asarray(buffer.filled() & ~buffer.trainable)
    if skipped.any():
        at = tuple(int(i) for i in np.argwhere(skipped)[0])
        raise ValueError(
            f"buffer.trainable: expected every filled step trainable (SB3 has no per-step mask and would learn "
            f"from all), got {int(skipped.sum())} that are not, the first at (t, env) = {at}; to convert "
            f"anyway, pass buffer.replace(trainable=jnp.ones_like(buffer.trainable))"
        )
    t, n = buffer.num_steps, buffer.num_envs
    cls = DictRolloutBuffer if isinstance(observation_space, spaces.Dict) else RolloutBuffer
    out = cls(t, observation_space, action_space, device=device, gae_lambda=gae_lambda, gamma=gamma, n_envs=n)
    term, trunc = np.asarray(buffer.terminated), np.asarray(buffer.truncated)
    reward = np.asarray(buffer.reward, np.float32)
    fold = trunc & ~term
    if fold.any():
        reward = np.where(fold, reward + np.float32(gamma) * np.asarray(buffer.final_value, np.float32), reward)
    if "episode_start" in step:
        starts = _flags(_fit(out.episode_starts, step["episode_start"], 2, "buffer.step['episode_start']"), "buffer.step['episode_start']")
    else:
        first = np.zeros(n, np.bool_) if first_episode_start is None else _common.as_row(first_episode_start, (n,), np.bool_, "first_episode_start")
        starts = np.concatenate([first[None], (term | trunc)[:-1]], axis=0)

    def put(dst: Any, src: Any, what: str, space: spaces.Space | None = None) -> None:
        _write(dst, _fit(dst, src, 2, what, space), what)

    put(out.observations, step["obs"], "buffer.step['obs']", observation_space)
    put(out.actions, step["action"], "buffer.step['action']", action_space)
    put(out.log_probs, step["log_prob"], "buffer.step['log_prob']")
    put(out.episode_starts, starts, "episode_starts")
    put(out.rewards, reward, "buffer.reward")
    put(out.values, buffer.value, "buffer.value")
    put(out.advantages, buffer.advantages, "buffer.advantages")
    put(out.returns, buffer.returns, "buffer.returns")
    out.pos = int(buffer.step_index)
    out.full = out.pos == t
    return out
