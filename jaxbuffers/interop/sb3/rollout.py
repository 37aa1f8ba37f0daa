"""SB3-compatible rollout buffers backed by :class:`jaxbuffers.RolloutBuffer`.

:class:`JaxRolloutBuffer` and :class:`JaxDictRolloutBuffer` subclass SB3's ``RolloutBuffer`` and
``DictRolloutBuffer``, so on-policy SB3 algorithms (PPO, A2C) accept them as
``rollout_buffer_class``. Storage, GAE and minibatch gathering are done by jaxbuffers.

Episode-flag convention mapping
-------------------------------
SB3's on-policy loop calls ``add(obs_t, action_t, reward_t, episode_start_t, V(obs_t), log_prob_t)``
where ``episode_start_t`` says that ``obs_t`` is the first observation of an episode (i.e. the
*previous* step ended one), and at a time-limit end it has already folded the bootstrap into the
reward: ``reward_t += gamma * V(terminal_obs)``. Its GAE then cuts the trace after every episode
end. In the conventions of :mod:`jaxbuffers.returns` (step ``t`` is ``obs_t -> obs_{t+1}``) that is:

* ``terminated[t] = episode_start[t + 1]`` for ``t < T - 1`` and ``terminated[T - 1] = dones``
  (the argument of ``compute_returns_and_advantage``): every SB3 episode end is a *terminated*
  step, because for time-limit ends the bootstrap ``gamma * V(terminal_obs)`` is already in the
  stored reward;
* ``truncated`` is False and ``final_value`` unused.

So ``compute_returns_and_advantage`` fills ``terminated`` from the stored ``episode_starts`` and
runs :meth:`jaxbuffers.RolloutBuffer.compute_gae`, which equals SB3's recursion
``delta_t = r_t + gamma V_{t+1} (1 - start_{t+1}) - V_t``,
``A_t = delta_t + gamma lambda (1 - start_{t+1}) A_{t+1}``, ``returns = A + V`` (Schulman et al.
2016, GAE). :func:`jaxbuffers.interop.sb3.rollout_to_jax` documents the same mapping for
conversions; a native jaxbuffers rollout with ``truncated``/``final_value`` converts to SB3 by
folding ``gamma * final_value`` back into the reward.

Semantics kept from SB3: ``add`` on a full buffer raises (SB3 raises ``IndexError`` too); ``get``
asserts ``full``, shuffles ``T * n_envs`` flat indices with ``np.random.permutation`` in SB3's
env-major order (``index = env * T + t``) and yields minibatches of ``batch_size`` (the last one
smaller when it does not divide), so with the same numpy seed the minibatches are exactly SB3's.
Samples: observations in their space's dtype, actions float32, ``old_values``, ``old_log_prob``,
``advantages``, ``returns`` float32 ``[B]``, torch tensors on ``device``.

Differences, all lossless for what SB3 stores: ``episode_starts`` is bool (SB3: float32 0/1);
actions are stored in float32 when the space is float64 (the policy produces float32 and samples
are float32 anyway) and int64 as int32 when the space bounds fit. The numpy fields SB3 exposes
(``values``, ``returns``, ``advantages``, ...) are read-only host copies ``[T, n_envs, ...]``; SB3
reorders its own arrays to ``[n_envs * T]`` inside ``get``, ours keep their layout (PPO and A2C
only read ``values`` and ``returns`` in pairs, for the explained variance).
A partially filled buffer is handled exactly (the last filled step bootstraps from
``last_values`` unless ``dones``), where SB3 would read its zero-filled rows.
"""

from __future__ import annotations

import functools
from collections.abc import Generator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, DictRolloutBuffer, ReplayBuffer, RolloutBuffer
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from jaxbuffers import rollout as _rollout
from jaxbuffers.interop.sb3 import _common

__all__ = ["JaxRolloutBuffer", "JaxDictRolloutBuffer"]


@functools.partial(jax.jit, donate_argnums=0)
def _add_step(state: _rollout.RolloutBuffer, step: Any, reward: jax.Array, value: jax.Array) -> _rollout.RolloutBuffer:
    # terminated is only known one step later (episode_start of the next step): filled in by _compute.
    return state.add(step, reward=reward, value=value, terminated=jnp.zeros(reward.shape, jnp.bool_))


def sb3_terminated(episode_starts: jax.Array, dones: jax.Array, num_filled: jax.Array) -> jax.Array:
    """``terminated[t] = episode_starts[t + 1]`` and ``dones`` at the last filled step ``num_filled - 1``."""
    nxt = jnp.concatenate([episode_starts[1:], jnp.zeros_like(episode_starts[:1])], axis=0)
    t = jnp.arange(episode_starts.shape[0], dtype=jnp.int32)[:, None]
    return jnp.where(t == num_filled - 1, dones[None, :], nxt)


@functools.partial(jax.jit, donate_argnums=0)
def _compute(state: _rollout.RolloutBuffer, last_values: jax.Array, dones: jax.Array, gamma, gae_lambda):
    terminated = sb3_terminated(state.step["episode_start"], dones, state.step_index)
    return state.replace(terminated=terminated).compute_gae(last_values, gamma, gae_lambda)


@jax.jit
def _gather(state: _rollout.RolloutBuffer, indices: jax.Array):
    mb = state.gather(indices)
    return (
        mb.step["obs"],
        mb.step["action"].astype(jnp.float32),
        mb.value,
        mb.step["log_prob"],
        mb.advantages,
        mb.returns,
    )


class _JaxRolloutImpl:
    """Shared implementation of the two rollout classes (mixed in before SB3's class)."""

    _samples_type: type = RolloutBufferSamples

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        gae_lambda: float = 1,
        gamma: float = 0.99,
        n_envs: int = 1,
    ):
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        is_dict = isinstance(observation_space, spaces.Dict)
        if is_dict != isinstance(self, DictRolloutBuffer):
            want = "JaxDictRolloutBuffer" if is_dict else "JaxRolloutBuffer"
            raise TypeError(
                f"observation_space: {type(self).__name__} got a {type(observation_space).__name__} space; use {want} for it"
            )
        self.gae_lambda = gae_lambda
        self.gamma = gamma
        self.generator_ready = False
        self._obs_dtypes = _common.obs_dtypes(observation_space)
        self._action_dtype = np.dtype(action_space.dtype)
        act_store = _common.storage_dtype(ReplayBuffer._maybe_cast_dtype(self._action_dtype), action_space, "action_space")
        example = {
            "obs": _common.obs_spec(observation_space, self.obs_shape, (), "observation_space"),
            "action": jax.ShapeDtypeStruct((self.action_dim,), act_store),
            "log_prob": jax.ShapeDtypeStruct((), np.float32),
            "episode_start": jax.ShapeDtypeStruct((), np.bool_),
        }
        self._spec = example
        self._state = _rollout.RolloutBuffer.create(example, num_steps=self.buffer_size, num_envs=self.n_envs)
        BaseBuffer.reset(self)

    # ------------------------------------------------------------------ state access
    @property
    def jax_buffer(self) -> _rollout.RolloutBuffer:
        """The backing :class:`jaxbuffers.RolloutBuffer` (step pytree: ``obs``, ``action``,
        ``log_prob``, ``episode_start``; the layout :func:`rollout_to_jax` produces).

        The adapter's next ``add`` or ``compute_returns_and_advantage`` donates these arrays,
        after which the object returned here raises "Array has been deleted" when read: read it
        right away, or keep a copy (``jax.tree.map(jnp.copy, buf.jax_buffer)``)."""
        return self._state

    @property
    def nbytes(self) -> int:
        """Bytes of the stored arrays, a Python int."""
        return self._state.memory_bytes

    @property
    def observations(self) -> Any:
        """``[T, n_envs, *obs_shape]`` host copy in the space's dtype (dict for Dict spaces)."""
        return jax.tree.map(lambda x, d: np.asarray(x).astype(d, copy=False), self._state.step["obs"], self._obs_dtypes)

    @property
    def actions(self) -> np.ndarray:
        """``[T, n_envs, action_dim]`` host copy (float32 for float64 spaces, see module docstring)."""
        a = np.asarray(self._state.step["action"])
        return a if np.issubdtype(a.dtype, np.floating) else a.astype(self._action_dtype)

    @property
    def rewards(self) -> np.ndarray:
        """``[T, n_envs]`` float32 host copy (with SB3's timeout bootstrap folded in)."""
        return np.asarray(self._state.reward)

    @property
    def episode_starts(self) -> np.ndarray:
        """``[T, n_envs]`` float32 0/1 host copy."""
        return np.asarray(self._state.step["episode_start"]).astype(np.float32)

    @property
    def values(self) -> np.ndarray:
        """``[T, n_envs]`` float32 host copy of ``V(obs_t)``."""
        return np.asarray(self._state.value)

    @property
    def log_probs(self) -> np.ndarray:
        """``[T, n_envs]`` float32 host copy."""
        return np.asarray(self._state.step["log_prob"])

    @property
    def advantages(self) -> np.ndarray:
        """``[T, n_envs]`` float32 host copy (zeros before ``compute_returns_and_advantage``)."""
        return np.asarray(self._state.advantages)

    @property
    def returns(self) -> np.ndarray:
        """``[T, n_envs]`` float32 host copy, ``advantages + values``."""
        return np.asarray(self._state.returns)

    # ------------------------------------------------------------------ SB3 interface
    def reset(self) -> None:
        """Start a new rollout: ``pos`` 0, not full (storage kept, no zeroing)."""
        if hasattr(self, "_state"):
            self._state = self._state.reset()
        self.generator_ready = False
        BaseBuffer.reset(self)

    def _obs_row(self, obs: Any) -> Any:
        return _common.obs_row(obs, self._spec["obs"], (self.n_envs,), self.observation_space, self._obs_dtypes, "obs")

    def add(
        self,
        obs: Any,
        action: np.ndarray,
        reward: np.ndarray,
        episode_start: np.ndarray,
        value: th.Tensor,
        log_prob: th.Tensor,
    ) -> None:
        """Store one step of every env (SB3's signature; see the module docstring for flags).

        Args:
          obs: ``[n_envs, *obs_shape]`` (dict for Dict spaces), ``obs_t``.
          action: ``[n_envs, action_dim]`` or reshapeable to it.
          reward: ``[n_envs]``, ``r_t`` (SB3 has already added ``gamma * V(terminal_obs)`` at timeouts).
          episode_start: ``[n_envs]``, ``obs_t`` starts an episode.
          value: torch ``[n_envs, 1]`` or ``[n_envs]``, ``V(obs_t)``. log_prob: torch ``[n_envs]``.

        Raises:
          IndexError: the buffer is full (``buffer_size`` steps since ``reset``), as in SB3.
          ValueError: a wrong number of values, a layout SB3's assignment would refuse, or an
            ``episode_start`` other than 0 / 1 (message names the argument).
          TypeError: a value the stored dtype cannot hold where it is narrower than SB3's (a
            float64 action space's actions are held as float32, int64 data as int32).
        """
        if self.full:
            raise IndexError(f"add: the rollout buffer is full ({self.buffer_size} steps); call reset() first")
        n = self.n_envs
        if isinstance(log_prob, th.Tensor) and len(log_prob.shape) == 0:
            log_prob = log_prob.reshape(-1, 1)
        step = {
            "obs": self._obs_row(obs),
            "action": _common.as_row(
                action, (n, self.action_dim), self._spec["action"].dtype, "action", reshape=True,
                exact=self._spec["action"].dtype != self._action_dtype,  # e.g. a float64 space held as float32
            ),
            "log_prob": _common.as_row(log_prob, (n,), np.float32, "log_prob"),
            "episode_start": _common.as_row(episode_start, (n,), np.bool_, "episode_start"),
        }
        reward = _common.as_row(reward, (n,), np.float32, "reward")
        value = _common.as_row(value, (n,), np.float32, "value", reshape=True)
        self._state = _add_step(self._state, step, reward, value)
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True

    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: np.ndarray) -> None:
        """GAE advantages and returns, equal to SB3's (see the module docstring for the mapping).

        Args:
          last_values: torch ``[n_envs, 1]`` or ``[n_envs]``: ``V`` of the observation after the last step.
          dones: ``[n_envs]``: the last step ended an episode.
        """
        n = self.n_envs
        last_values = _common.as_row(last_values, (n,), np.float32, "last_values", reshape=True)
        dones = _common.as_row(dones, (n,), np.bool_, "dones")
        self._state = _compute(self._state, last_values, dones, jnp.float32(self.gamma), jnp.float32(self.gae_lambda))

    def get(self, batch_size: int | None = None) -> Generator[Any, None, None]:
        """Every stored step exactly once, shuffled, in minibatches of ``batch_size`` (all if None).

        Same order as SB3 for the same ``np.random`` state. Asserts ``full`` as SB3 does.
        """
        assert self.full, ""
        total = self.buffer_size * self.n_envs
        indices = np.random.permutation(total)
        self.generator_ready = True
        if batch_size is None:
            batch_size = total
        start = 0
        while start < total:
            yield self._get_samples(indices[start : start + batch_size])
            start += batch_size

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None):
        """Samples at SB3's flat indices (env-major: ``index = env * T + t``), as SB3's ``_get_samples``."""
        inds = np.asarray(batch_inds)
        total = self.buffer_size * self.n_envs
        if inds.size and (inds.min() < 0 or inds.max() >= total):
            raise IndexError(f"batch_inds: values must lie in [0, {total}), got range [{inds.min()}, {inds.max()}]")
        t, e = inds % self.buffer_size, inds // self.buffer_size
        obs, act, val, logp, adv, ret = _gather(self._state, jnp.asarray(t * self.n_envs + e, jnp.int32))
        dev = self.device
        return self._samples_type(
            observations=jax.tree.map(lambda x, d: _common.to_torch_tensor(x, dev, d), obs, self._obs_dtypes),
            actions=_common.to_torch_tensor(act, dev),
            old_values=_common.to_torch_tensor(val, dev),
            old_log_prob=_common.to_torch_tensor(logp, dev),
            advantages=_common.to_torch_tensor(adv, dev),
            returns=_common.to_torch_tensor(ret, dev),
        )


class JaxRolloutBuffer(_JaxRolloutImpl, RolloutBuffer):
    """Drop-in replacement for SB3's ``RolloutBuffer`` with jaxbuffers storage and GAE.

    Example::

        from stable_baselines3 import PPO
        from jaxbuffers.interop.sb3 import JaxRolloutBuffer

        PPO("MlpPolicy", "CartPole-v1", rollout_buffer_class=JaxRolloutBuffer).learn(10_000)

    Args (SB3's, same meaning): ``buffer_size`` (steps per env), ``observation_space``,
    ``action_space``, ``device``, ``gae_lambda``, ``gamma``, ``n_envs``. See the module docstring
    for the episode-flag mapping and the (lossless) differences.

    Raises:
      TypeError: a Dict observation space (use :class:`JaxDictRolloutBuffer`) or a float64 one.
    """


class JaxDictRolloutBuffer(_JaxRolloutImpl, DictRolloutBuffer):
    """Drop-in replacement for SB3's ``DictRolloutBuffer`` (``spaces.Dict`` observations);
    samples are ``DictRolloutBufferSamples``. Same arguments and semantics as :class:`JaxRolloutBuffer`."""

    _samples_type = DictRolloutBufferSamples
