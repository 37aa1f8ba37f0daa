"""Stable-Baselines3 interop: SB3-compatible buffer classes and conversions of buffer contents.

Requires the optional `sb3` extra (torch and stable-baselines3); `import jaxbuffers` never
imports this package, import it explicitly:

```python
from stable_baselines3 import DQN, PPO
from jaxbuffers.interop.sb3 import JaxReplayBuffer, JaxRolloutBuffer

DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=JaxReplayBuffer).learn(10_000)
PPO("MlpPolicy", "CartPole-v1", rollout_buffer_class=JaxRolloutBuffer).learn(10_000)
```

Contents:

* `JaxReplayBuffer`, `JaxDictReplayBuffer` (`.replay`): subclasses of SB3's `ReplayBuffer` /
  `DictReplayBuffer` stored in a `jaxbuffers.ReplayBuffer`, optionally compressed.
* `JaxRolloutBuffer`, `JaxDictRolloutBuffer` (`.rollout`): subclasses of SB3's `RolloutBuffer` /
  `DictRolloutBuffer` stored in a `jaxbuffers.RolloutBuffer`, GAE by `jaxbuffers.returns.gae`.
* `CompressedRolloutBuffer`, `CompressedDictRolloutBuffer`, `CompressedReplayBuffer`, `CompressedDictReplayBuffer`
  (`.compressed`): the sb3-extra-buffers classes of those names, with their constructor options.
* `DummyVecRolloutBuffer` (`.vec`): one rollout buffer object over a list of buffers of any types (the smallest
  bounds the rollout).
* `replay_to_jax`, `replay_from_jax`, `rollout_to_jax`, `rollout_from_jax` (`.convert`): move the
  contents of a filled SB3 buffer into a jaxbuffers buffer and back, translating the flags.
* `sb3_replay_nbytes`: what SB3's own replay buffer would allocate.
"""

from jaxbuffers.interop.sb3.compressed import (CompressedDictReplayBuffer, CompressedDictRolloutBuffer, CompressedReplayBuffer,
                                               CompressedRolloutBuffer, codec_for)
from jaxbuffers.interop.sb3.convert import replay_from_jax, replay_to_jax, rollout_from_jax, rollout_to_jax
from jaxbuffers.interop.sb3.replay import FieldView, JaxDictReplayBuffer, JaxReplayBuffer, sb3_replay_nbytes
from jaxbuffers.interop.sb3.rollout import JaxDictRolloutBuffer, JaxRolloutBuffer
from jaxbuffers.interop.sb3.vec import DummyVecRolloutBuffer

__all__ = ["JaxReplayBuffer", "JaxDictReplayBuffer", "JaxRolloutBuffer", "JaxDictRolloutBuffer", "FieldView",
           "replay_to_jax", "replay_from_jax", "rollout_to_jax", "rollout_from_jax", "sb3_replay_nbytes",
           "CompressedRolloutBuffer", "CompressedDictRolloutBuffer", "CompressedReplayBuffer", "CompressedDictReplayBuffer", "codec_for",
           "DummyVecRolloutBuffer"]
