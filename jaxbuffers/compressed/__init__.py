"""Host-compressed buffers: device metadata + pixels compressed in host stores, reached via callbacks.

The buffers and writers in brief: `docs/api/compressed.md`; how the device and host halves talk:
`jaxbuffers.compressed._host`.
"""

from jaxbuffers.compressed._host import DEFAULT_DICTIONARY_BYTES, HostStores, ShardedHostStores, StaleBufferError
from jaxbuffers.compressed.episode import CompressedEpisodeBuffer
from jaxbuffers.compressed.rollout import CompressedRolloutBuffer
from jaxbuffers.compressed.rollout_host import RolloutHostWriter
from jaxbuffers.compressed.staging import StagingWriter
from jaxbuffers.compressed.trajectory import (
    DEFAULT_CODEC, DEFAULT_DELTA_CODEC, DEFAULT_KEYFRAME_INTERVAL, CompressedPrioritisedTrajectoryBuffer, CompressedTrajectoryBuffer,
)

__all__ = [
    "CompressedTrajectoryBuffer", "CompressedPrioritisedTrajectoryBuffer", "CompressedRolloutBuffer", "CompressedEpisodeBuffer",
    "HostStores", "ShardedHostStores", "StaleBufferError", "StagingWriter", "RolloutHostWriter", "DEFAULT_CODEC", "DEFAULT_DICTIONARY_BYTES",
    "DEFAULT_DELTA_CODEC", "DEFAULT_KEYFRAME_INTERVAL",
]
