"""jaxbuffers: JAX-native reinforcement-learning experience buffers (immutable pytrees with pure ``create`` / ``add`` /
``sample`` / ``can_sample`` / ``size`` methods) and pure, time-major return functions; import from this namespace.
Optional submodules: ``jaxbuffers.interop.torch`` (needs torch), ``jaxbuffers.interop.sb3`` (needs stable-baselines3);
the host-compressed buffers need the ``codecs`` extra only for the ``rle`` / ``igzip`` / ``zstd`` codecs they use."""

from jaxbuffers.compressed import (
    CompressedEpisodeBuffer, CompressedPrioritisedTrajectoryBuffer, CompressedRolloutBuffer, CompressedTrajectoryBuffer,
    StaleBufferError, StagingWriter,
)
from jaxbuffers.checkpoint import BufferRestore, BufferSave, CheckpointError, PendingSave, restore, save
from jaxbuffers.episode import (
    BufferFullError, EpisodeBuffer, EpisodeSample, EpisodeSequenceSample, EpisodeStepSample, EpisodeTransitionSample,
)
from jaxbuffers.episode_writer import EpisodeWriter
from jaxbuffers.mixing import MixedSample, mixed_counts, sample_mixed
from jaxbuffers.feeding import BufferClosed, BufferServer, Writer, ray_server
from jaxbuffers.prioritised import PrioritisedReplayBuffer, PrioritisedSample
from jaxbuffers.ratelimit import BlockingRateLimiter, RateLimiter, RateLimiterClosed, RateLimiterTimeout
from jaxbuffers.replay import ReplayBuffer, ReplaySample
from jaxbuffers.returns import NStepReturns, discounted_returns, gae, lambda_returns, n_step_returns
from jaxbuffers.sharding import ShardedBuffer, ShardedSample
from jaxbuffers.rollout import RolloutBuffer, RolloutMemoryPressure, RolloutMinibatch
from jaxbuffers.rollout_diagnostics import (RolloutMemoryEstimate, TrainableDiagnostics, get_minibatches, memory_estimate,
                                            total_size, trainable_diagnostics)
from jaxbuffers.rollout_metrics import RolloutStats, rollout_stats
from jaxbuffers.sum_tree import SumMinTree
from jaxbuffers._timing import Timing, timing
from jaxbuffers.prioritised_trajectory import PrioritisedSequenceSample, PrioritisedTrajectoryBuffer, PrioritisedTransitionSample
from jaxbuffers.trajectory import SequenceSample, TrajectoryBuffer, TransitionSample

__version__ = "0.1.0"

__all__ = [
    "ReplayBuffer", "ReplaySample", "PrioritisedReplayBuffer", "PrioritisedSample", "SumMinTree",  # item replay
    "TrajectoryBuffer", "SequenceSample", "TransitionSample",  # trajectories
    "PrioritisedTrajectoryBuffer", "PrioritisedSequenceSample", "PrioritisedTransitionSample",
    "EpisodeBuffer", "EpisodeSample", "EpisodeSequenceSample", "EpisodeStepSample", "EpisodeTransitionSample",  # episodes
    "BufferFullError", "EpisodeWriter",
    "sample_mixed", "mixed_counts", "MixedSample",  # mixing
    "RolloutBuffer", "RolloutMinibatch", "RolloutMemoryPressure",  # on-policy
    "trainable_diagnostics", "TrainableDiagnostics", "memory_estimate", "RolloutMemoryEstimate", "total_size", "get_minibatches",
    "rollout_stats", "RolloutStats",
    "gae", "lambda_returns", "discounted_returns", "n_step_returns", "NStepReturns",  # returns
    "CompressedTrajectoryBuffer", "CompressedPrioritisedTrajectoryBuffer", "CompressedRolloutBuffer",  # host-compressed
    "CompressedEpisodeBuffer", "StaleBufferError", "StagingWriter",
    "save", "restore", "PendingSave", "BufferSave", "BufferRestore", "CheckpointError",  # checkpoints
    "RateLimiter", "BlockingRateLimiter", "RateLimiterTimeout", "RateLimiterClosed",  # rate limiting
    "BufferServer", "Writer", "BufferClosed", "ray_server",  # actors and learners
    "ShardedBuffer", "ShardedSample",  # devices and hosts
    "timing", "Timing",  # host timing of eager calls
]
