"""Stable-Baselines3 interop: SB3-compatible buffer classes and conversions of buffer contents.

Requires the optional ``sb3`` extra (torch and stable-baselines3); ``import jaxbuffers`` never
imports this package, import it explicitly::

    from stable_baselines3 import DQN, PPO
    from jaxbuffers.interop.sb3 import JaxReplayBuffer, JaxRolloutBuffer

    DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=JaxReplayBuffer).learn(10_000)
    PPO("MlpPolicy", "CartPole-v1", rollout_buffer_class=JaxRolloutBuffer).learn(10_000)

Contents:

* :class:`JaxReplayBuffer`, :class:`JaxDictReplayBuffer` (:mod:`.replay`): subclasses of SB3's
  ``ReplayBuffer`` / ``DictReplayBuffer`` stored in a :class:`jaxbuffers.ReplayBuffer`.
* :class:`JaxRolloutBuffer`, :class:`JaxDictRolloutBuffer` (:mod:`.rollout`): subclasses of SB3's
  ``RolloutBuffer`` / ``DictRolloutBuffer`` stored in a :class:`jaxbuffers.RolloutBuffer`, GAE by
  :func:`jaxbuffers.returns.gae`.
* :func:`replay_to_jax`, :func:`replay_from_jax`, :func:`rollout_to_jax`,
  :func:`rollout_from_jax` (:mod:`.convert`): move the contents of a filled SB3 buffer into a
  jaxbuffers buffer and back, translating the episode-flag conventions.
* :func:`sb3_replay_nbytes`: what SB3's own replay buffer would allocate.
"""

from jaxbuffers.interop.sb3.convert import replay_from_jax, replay_to_jax, rollout_from_jax, rollout_to_jax
from jaxbuffers.interop.sb3.replay import FieldView, JaxDictReplayBuffer, JaxReplayBuffer, sb3_replay_nbytes
from jaxbuffers.interop.sb3.rollout import JaxDictRolloutBuffer, JaxRolloutBuffer

__all__ = [
    "JaxReplayBuffer",
    "JaxDictReplayBuffer",
    "JaxRolloutBuffer",
    "JaxDictRolloutBuffer",
    "FieldView",
    "replay_to_jax",
    "replay_from_jax",
    "rollout_to_jax",
    "rollout_from_jax",
    "sb3_replay_nbytes",
]
