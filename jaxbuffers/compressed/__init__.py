"""Host-compressed buffers: device metadata + pixels compressed in host stores, reached via callbacks.

* `CompressedTrajectoryBuffer` / `CompressedPrioritisedTrajectoryBuffer`: a
  `jaxbuffers.TrajectoryBuffer` (transitions, n-step, sequences) with host-compressed
  observation leaves and optional frame-stack dedup (one stored frame per step).
* `CompressedEpisodeBuffer`: a `jaxbuffers.EpisodeBuffer` (whole episodes, meta filters, every sampler) with
  host-compressed observation leaves and optional frame-stack dedup.
* `CompressedRolloutBuffer`: a `jaxbuffers.RolloutBuffer` with host-compressed step leaves, decoded per minibatch,
  optionally one stored frame per distinct frame of stacked observations; `RolloutHostWriter` fills one from numpy
  on the host (one device transfer per rollout).
* `StagingWriter`: for Python-driven loops (one env step per call), stages steps in host
  numpy arrays and adds them to a compressed trajectory buffer in chunks (flushed before sampling).

The host half is `host_codecs` (codecs and `host_codecs.CompressedStore`). How the
two halves talk (ordered exactly-once writes, versioned reads, why these buffers cannot be
vmapped, one store per shard of a `jaxbuffers.ShardedBuffer`) is documented in `jaxbuffers.compressed._host`.
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
