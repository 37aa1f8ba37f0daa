"""SB3-compatible rollout buffers backed by `jaxbuffers.RolloutBuffer` (flag mapping, GAE equation and the
differences from SB3: `docs/api/sb3.md`, "Rollout buffers").
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Generator
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from jaxbuffers import _validate, checkpoint
from jaxbuffers import rollout as _rollout
from jaxbuffers._validate import sb3_rollout
from jaxbuffers.interop.sb3 import _common

__all__ = ["JaxRolloutBuffer", "JaxDictRolloutBuffer"]


#: SB3 steps staged on the host before one device call adds them (a call per step costs more than a numpy copy).
STAGED_STEPS = 64


# The adapter owns its state, so the add donates it (in place; else a copy of the rollout per call).
@functools.partial(jax.jit, donate_argnums=0)
def _add_steps(state: _rollout.RolloutBuffer, steps: Any, reward: jax.Array, value: jax.Array, count: jax.Array) -> _rollout.RolloutBuffer:
    """Add the first `count` of the staged steps (leaves `[STAGED_STEPS, n_envs, ...]`), in order."""
    def one(i, s):
        # terminated is known one step later (the next step's episode_start): set before GAE.
        return s.add(jax.tree.map(lambda x: x[i], steps), reward=reward[i], value=value[i],
                     terminated=jnp.zeros(reward.shape[1:], jnp.bool_))

    return jax.lax.fori_loop(0, count, one, state)


@jax.jit  # one compiled program: op by op it cost more than the GAE it precedes
def sb3_terminated(episode_starts: jax.Array, dones: jax.Array, num_filled: jax.Array) -> jax.Array:
    """``terminated[t] = episode_starts[t + 1]``, and ``dones`` at the last filled step ``num_filled - 1``."""
    nxt = jnp.concatenate([episode_starts[1:], jnp.zeros_like(episode_starts[:1])], axis=0)
    t = jnp.arange(episode_starts.shape[0], dtype=jnp.int32)[:, None]
    return jnp.where(t == num_filled - 1, dones[None, :], nxt)


def sb3_advantages(reward: np.ndarray, value: np.ndarray, episode_start: np.ndarray, dones: np.ndarray, last_values: np.ndarray,
                   num_filled: int, gamma: Any, gae_lambda: Any) -> tuple[np.ndarray, np.ndarray]:
    r"""GAE advantages and returns ``[T, n_envs]`` over the first ``num_filled`` rows (the last bootstraps from
    ``last_values`` unless ``dones``; zeros after them), $s$ the episode starts, in numpy operation for operation as
    SB3's loop (its roundings: jit may fuse a multiply-add); ``gamma``, ``gae_lambda`` as SB3 holds them:

    $$
    \delta_t = r_t + \gamma V_{t+1} (1 - s_{t+1}) - V_t, \qquad
    A_t = \delta_t + \gamma \lambda (1 - s_{t+1}) A_{t+1}, \qquad R_t = A_t + V_t
    $$
    """
    adv, last = np.zeros_like(reward), 0
    for t in reversed(range(num_filled)):
        if t == num_filled - 1:
            not_ended, next_values = 1.0 - dones.astype(np.float32), last_values
        else:
            not_ended, next_values = 1.0 - episode_start[t + 1].astype(np.float32), value[t + 1]
        delta = reward[t] + gamma * next_values * not_ended - value[t]
        last = delta + gamma * gae_lambda * not_ended * last
        adv[t] = last
    ret = adv + value
    ret[num_filled:] = 0
    return adv, ret


def _sb3_gae(rollout: _rollout.RolloutBuffer, dones: jax.Array, advantages: jax.Array, returns: jax.Array) -> _rollout.RolloutBuffer:
    """SB3's flags mapped (`sb3_terminated`), with the advantages and returns of `sb3_advantages`."""
    terminated = sb3_terminated(rollout.step["episode_start"], dones, rollout.step_index)
    return rollout.replace(terminated=terminated, advantages=advantages, returns=returns, has_advantages=jnp.bool_(True))


# Donated where the adapter alone holds its state: without, each reset and GAE copies the whole rollout.
_RESET = {True: jax.jit(lambda s: s.reset(), donate_argnums=0), False: lambda s: s.reset()}
_GAE = {True: jax.jit(_sb3_gae, donate_argnums=0), False: jax.jit(_sb3_gae)}


def _host(get: Any, doc: str, dtype: Any = None) -> property:
    """A read-only host copy of ``get(backing buffer)``."""
    return property(lambda self: _common.read_only(np.asarray(get(self._rollout), dtype)), doc=doc)


class _JaxRolloutImpl:
    """Shared implementation of the two rollout classes (mixed in before SB3's class)."""

    _samples_type: type = RolloutBufferSamples
    #: Whether this object alone holds its backing state, so that reset and GAE may donate it.
    _owns_state: bool = True

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space, device: th.device | str = "auto",
                 gae_lambda: float = 1, gamma: float = 0.99, n_envs: int = 1):
        buffer_size, n_envs = _validate.static_int("buffer_size", buffer_size), _validate.static_int("n_envs", n_envs)
        gamma, gae_lambda = _validate.static_float("gamma", gamma, 0.0, 1.0), _validate.static_float("gae_lambda", gae_lambda, 0.0, 1.0)
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        _common.check_space_kind(self, DictRolloutBuffer, observation_space)
        self.gae_lambda, self.gamma, self.generator_ready = gae_lambda, gamma, False
        self._rows = _common.Rows(observation_space, action_space, self.n_envs, action_space.dtype)
        per_env = lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype)  # noqa: E731
        scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype)  # noqa: E731
        example = {"obs": jax.tree.map(per_env, self._rows.obs), "action": per_env(self._rows.action),
                   "log_prob": scalar(np.float32), "episode_start": scalar(np.bool_)}
        self._state = self._new_state(example)
        BaseBuffer.reset(self)

    def _new_state(self, example: Any) -> Any:
        """The backing buffer for steps shaped like ``example`` (one env's step pytree)."""
        return _rollout.RolloutBuffer.create(example, num_envs=self.n_envs, num_steps=self.buffer_size)

    # Adds are staged in numpy (`_put`) and added in one device call when the stage is full or the state is read.
    @property
    def _state(self) -> Any:
        if getattr(self, "_num_staged", 0):
            staged, self._staged, n = self._staged, None, self._num_staged
            self._num_staged = 0
            self._stored = _add_steps(self._stored, *staged, jnp.int32(n))
        return self._stored

    @_state.setter
    def _state(self, state: Any) -> None:
        self._stored, self._staged, self._num_staged = state, None, 0

    @property
    def _rollout(self) -> _rollout.RolloutBuffer:
        """The `jaxbuffers.RolloutBuffer` holding the GAE fields (the backing buffer itself here)."""
        return self._state

    def _with_rollout(self, inner: _rollout.RolloutBuffer) -> Any:
        """The backing buffer with its `jaxbuffers.RolloutBuffer` replaced by ``inner``."""
        return inner

    @property
    def _sample_obs_dtypes(self) -> Any:
        """Dtypes of sampled observations (a dict for Dict spaces): the space's."""
        return self._rows.obs_dtypes

    @property
    def jax_buffer(self) -> _rollout.RolloutBuffer:
        """The backing `jaxbuffers.RolloutBuffer` (steps ``obs``, ``action``, ``log_prob``, ``episode_start``: the
        `rollout_to_jax` layout). The next ``add``, ``reset`` or GAE donates its arrays: read it right away, or keep
        ``jax.tree.map(jnp.copy, buf.jax_buffer)``."""
        return self._state

    @property
    def nbytes(self) -> int:
        """Bytes of the stored arrays, a Python int."""
        return self._state.memory_bytes

    observations = property(lambda self: _common.read_only(self._rows.to_sb3_obs(self._state.step["obs"])),
                            doc="``[T, n_envs, *obs_shape]`` read-only host copy in the space's dtypes (a dict for Dict spaces).")

    @property
    def actions(self) -> np.ndarray:
        """``[T, n_envs, action_dim]`` read-only host copy (float32 for float64 spaces)."""
        a = np.asarray(self._rollout.step["action"])
        return _common.read_only(a if np.issubdtype(a.dtype, np.floating) else a.astype(self._rows.action_dtype))

    rewards = _host(lambda s: s.reward, "``[T, n_envs]`` float32 host copy (SB3's timeout bootstrap folded in).")
    episode_starts = _host(lambda s: s.step["episode_start"], "``[T, n_envs]`` float32 0/1 read-only host copy.", np.float32)
    values = _host(lambda s: s.value, "``[T, n_envs]`` float32 host copy of ``V(obs_t)``.")
    log_probs = _host(lambda s: s.step["log_prob"], "``[T, n_envs]`` float32 host copy.")
    advantages = _host(lambda s: s.advantages, "``[T, n_envs]`` float32 host copy (zeros before ``compute_returns_and_advantage``).")
    returns = _host(lambda s: s.returns, "``[T, n_envs]`` float32 host copy, ``advantages + values``.")

    def __getstate__(self) -> dict:
        """SB3's attributes plus the rollout as checkpoint bytes (`jaxbuffers.checkpoint.to_bytes`)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("_stored", "_staged", "_num_staged", "_rows")}
        state["_checkpoint"] = checkpoint.to_bytes({"rollout": self._state})
        return state

    def __setstate__(self, state: dict) -> None:
        """Rebuild the rollout with ``__init__``'s arguments and restore its contents from the checkpoint bytes.

        Raises:
          jaxbuffers.CheckpointError: the bytes are not a checkpoint of a rollout with this configuration.
        """
        state = dict(state)
        data = state.pop("_checkpoint")
        _JaxRolloutImpl.__init__(self, state["buffer_size"], state["observation_space"], state["action_space"], state["device"],
                                 gae_lambda=state["gae_lambda"], gamma=state["gamma"], n_envs=state["n_envs"])
        self._state = checkpoint.from_bytes(data, {"rollout": self._state})["rollout"]
        self.__dict__.update(state)

    def reset(self) -> None:
        """Start a new rollout: ``pos`` 0, not full, advantages and returns zeroed (the rest of the storage kept)."""
        if hasattr(self, "_state"):
            self._state = _RESET[self._owns_state](self._state)
        self.generator_ready = False
        BaseBuffer.reset(self)

    def add(self, obs: Any, action: np.ndarray, reward: np.ndarray, episode_start: np.ndarray, value: th.Tensor, log_prob: th.Tensor) -> None:
        """Store one step of every env (SB3's signature and flags).

        Args:
          obs: ``[n_envs, *obs_shape]`` (a dict for Dict spaces), ``obs_t``.
          action: ``[n_envs, action_dim]`` or reshapeable to it.
          reward: ``[n_envs]``, ``r_t`` (SB3 has added ``gamma * V(terminal_obs)`` at timeouts).
          episode_start: ``[n_envs]``, ``obs_t`` starts an episode.
          value: torch ``[n_envs, 1]`` or ``[n_envs]``, ``V(obs_t)``.
          log_prob: torch ``[n_envs]``.

        Raises:
          IndexError: the buffer is full (``buffer_size`` steps since ``reset``), as in SB3.
          ValueError: a wrong number of values, a layout SB3's assignment would refuse, or an ``episode_start`` other
            than 0 / 1 (the message names the argument).
          TypeError: a value the stored dtype cannot hold where it is narrower than SB3's.
        """
        self._commit_add(*self._add_rows(obs, action, reward, episode_start, value, log_prob))

    def _commit_add(self, step: dict, reward: np.ndarray, value: np.ndarray) -> None:
        """Store one step that `_add_rows` returned (its rows may be views of the caller's arrays: copied here)."""
        if self.full:  # checked again: a facade may hold this buffer twice
            raise IndexError(f"add: the rollout buffer is full ({self.buffer_size} steps); call reset() first")
        self._put(step, reward, value)
        self.pos += 1
        self.full = self.pos == self.buffer_size

    def _add_rows(self, obs: Any, action: Any, reward: Any, episode_start: Any, value: Any, log_prob: Any) -> tuple[dict, np.ndarray, np.ndarray]:
        """`add`'s checks, changing nothing: the step's rows in the stored shapes and dtypes, ``(step, reward, value)``."""
        if self.full:
            raise IndexError(f"add: the rollout buffer is full ({self.buffer_size} steps); call reset() first")
        n, f32 = self.n_envs, _common.F32
        step = {"obs": self._rows.observation(obs, "obs"), "action": self._rows.action_row(action),
                "log_prob": _common.as_row(log_prob, (n,), f32, "log_prob"),
                "episode_start": _common.as_row(episode_start, (n,), _common.BOOL, "episode_start")}
        return step, _common.as_row(reward, (n,), f32, "reward"), _common.as_row(value, (n,), f32, "value", reshape=True)

    def _returns_rows(self, last_values: Any, dones: Any) -> tuple[np.ndarray, np.ndarray]:
        """`compute_returns_and_advantage`'s checks, changing nothing: ``(last_values, dones)`` as ``[n_envs]`` rows."""
        n = self.n_envs
        return _common.as_row(last_values, (n,), np.float32, "last_values", reshape=True), _common.as_row(dones, (n,), np.bool_, "dones")

    def _get_batch_size(self, batch_size: Any) -> int:
        """`get`'s checks, changing nothing: the minibatch size."""
        total = self.buffer_size * self.n_envs
        batch_size = total if batch_size is None else _validate.static_int("batch_size", batch_size)
        sb3_rollout.filled_for_get(self)
        if not self._rollout.has_advantages:  # the minibatches would carry NaN advantages and returns
            raise _validate.advantages_missing("get", "compute_returns_and_advantage(last_values, dones)")
        return batch_size

    def check_call(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Make the argument checks of ``getattr(self, name)(*args, **kwargs)``, changing nothing.

        Raises:
          TypeError: arguments the method does not take; else what the call raises for its arguments (``add``,
            ``compute_returns_and_advantage``, ``get``, ``_get_samples``; other methods check only their signature).
        """
        self.prepare_call(name, *args, **kwargs)

    def prepare_call(self, name: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        """`check_call`, returning the call as a function of no arguments (``add``'s arguments already converted);
        nothing changes until it is called. Raises as `check_call`."""
        bound = inspect.signature(getattr(self, name)).bind(*args, **kwargs).arguments
        if name == "add":
            rows = self._add_rows(**bound)
            return lambda: self._commit_add(*rows)
        if name == "compute_returns_and_advantage":
            self._returns_rows(**bound)
        elif name == "get":
            self._get_batch_size(bound.get("batch_size"))
        elif name == "_get_samples":
            _common.indices(bound["batch_inds"], "batch_inds", self.buffer_size * self.n_envs)
        return lambda: getattr(self, name)(*args, **kwargs)

    def _put(self, step: dict, reward: np.ndarray, value: np.ndarray) -> None:
        """Stage one checked step, added when the stage is full (into new arrays: the add may still read these)."""
        if self._staged is None:
            new = lambda x: np.empty((STAGED_STEPS, *np.shape(x)), np.asarray(x).dtype)  # noqa: E731
            self._staged = jax.tree.map(new, (step, reward, value))
        k = self._num_staged
        for dst, x in zip(jax.tree.leaves(self._staged), jax.tree.leaves((step, reward, value))):
            dst[k] = x
        self._num_staged = k + 1
        if self._num_staged == STAGED_STEPS:
            self._state  # noqa: B018 - adds the stage

    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: np.ndarray) -> None:
        """GAE advantages and returns, SB3's bit for bit (`sb3_advantages`).

        Args:
          last_values: torch ``[n_envs, 1]`` or ``[n_envs]``, ``V`` of the observation after the last step.
          dones: ``[n_envs]``, the last step ended an episode.
        """
        last_values, dones = self._returns_rows(last_values, dones)
        s = self._rollout
        reward, value, starts, filled = jax.device_get((s.reward, s.value, s.step["episode_start"], s.step_index))
        adv, ret = sb3_advantages(reward, value, starts, dones, last_values, int(filled), self.gamma, self.gae_lambda)
        self._state = self._with_rollout(_GAE[self._owns_state](s, jnp.asarray(dones), adv, ret))

    def get(self, batch_size: int | None = None) -> Generator[Any, None, None]:
        """Every stored step once, shuffled as SB3 shuffles them, in minibatches of ``batch_size`` (all if None).

        Raises (at the call, before anything is drawn):
          ValueError: ``batch_size`` neither None nor a Python int >= 1.
          RuntimeError: the buffer is not full (``pos`` of ``buffer_size`` steps added since ``reset``; SB3 fails on
            a bare ``assert`` there), or ``compute_returns_and_advantage`` has not run since the last ``add`` or
            ``reset`` (SB3 would train on zero advantages and returns).
        """
        return self._minibatches(self._get_batch_size(batch_size))

    def _minibatches(self, batch_size: int) -> Generator[Any, None, None]:
        gather = self._epoch_gather()  # what one pass gathers each minibatch with (flat backing indices)
        total = self.buffer_size * self.n_envs
        indices, self.generator_ready = np.random.permutation(total), True
        for start in range(0, total, batch_size):
            yield self._samples_from(gather(self._flat_steps(indices[start : start + batch_size])))

    def _epoch_gather(self) -> Callable[[np.ndarray], Any]:
        return lambda idx: self._state.gather(idx)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None):
        """Samples at SB3's flat indices (env-major: ``index = env * T + t``), as SB3's ``_get_samples``."""
        return self._samples_from(self._state.gather(self._flat_steps(batch_inds)))

    def _flat_steps(self, batch_inds: np.ndarray) -> np.ndarray:
        """SB3's flat indices (env-major: ``env * T + t``) as the backing buffer's (``t * n_envs + env``), int32."""
        inds = _common.indices(batch_inds, "batch_inds", self.buffer_size * self.n_envs)
        t, e = inds % self.buffer_size, inds // self.buffer_size
        return (t * self.n_envs + e).astype(np.int32)

    def _samples_from(self, mb: Any):
        """A backing minibatch as SB3's samples (torch tensors on ``device``)."""
        fields = {"observations": mb.step["obs"], "actions": mb.step["action"], "old_values": mb.value,
                  "old_log_prob": mb.step["log_prob"], "advantages": mb.advantages, "returns": mb.returns}
        return self._samples_type(**_common.to_sb3(fields, self.device, {"observations": self._sample_obs_dtypes, "actions": np.float32}))


class JaxRolloutBuffer(_JaxRolloutImpl, RolloutBuffer):
    """Drop-in replacement for SB3's ``RolloutBuffer`` (SB3's arguments, `buffer_size` steps per env) with jaxbuffers
    storage and GAE.

    Raises:
      TypeError: a Dict observation space (use `JaxDictRolloutBuffer`) or a float64 one.

    Example:
        ```python
        from stable_baselines3 import PPO
        from jaxbuffers.interop.sb3 import JaxRolloutBuffer

        PPO("MlpPolicy", "CartPole-v1", rollout_buffer_class=JaxRolloutBuffer).learn(10_000)
        ```
    """


class JaxDictRolloutBuffer(_JaxRolloutImpl, DictRolloutBuffer):
    """Drop-in replacement for SB3's ``DictRolloutBuffer`` (``spaces.Dict`` observations);
    samples are ``DictRolloutBufferSamples``. Same arguments and semantics as `JaxRolloutBuffer`."""

    _samples_type = DictRolloutBufferSamples
