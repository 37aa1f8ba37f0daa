"""Stable-Baselines3 interop: SB3-compatible buffer classes and conversions of buffer contents.

Requires the optional `sb3` extra (torch and stable-baselines3); `import jaxbuffers` never imports this package,
import it explicitly. The contents, with an example: `docs/api/sb3.md`.
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
