"""Host-compressed trajectory buffers: `CompressedTrajectoryBuffer` and its prioritised variant.

A `CompressedTrajectoryBuffer` is a `jaxbuffers.TrajectoryBuffer` (all of its logic reused) whose chosen observation
leaves (`compress=("pixels",)`) are replaced by int32 ids, while the pixels live compressed in host
`host_codecs.CompressedStore`s. Sampling gathers the ids of the sampled steps and decodes them in one host callback
(`jaxbuffers.compressed._host`: exactly-once ordered writes, versioned reads, not vmappable). Called eagerly, each
method runs as one cached compiled program, callbacks included.

Frame-stack dedup (`frame_stack=k`). When an observation leaf is a stack of the last `k` frames (Gymnasium's
`FrameStackObservation`; `stack_axis` is the `k` axis: `0` for `[4, 84, 84]`, `-1` for `[84, 84, 4]`), only the
newest frame of each step is stored and stacks are rebuilt at sample time:

* Each lane has a ring of `F = length + k - 1 + K - 1` frames (every stored step's frame plus the `k - 1`
  before the oldest, which its stack needs, plus the `K - 1` temporal coding keeps, below).
* Each step records `ep_pos = min(steps since its episode started, k - 1)`; a step starts an episode when the
  previous step of its lane ended one (terminated *or truncated*). A stack reads the frames `k-1, ..., 0` steps
  back; those from before the episode start are padding: `padding="reset"` repeats the episode's first frame
  (Gymnasium's default), `"zero"` gives zeros. So a stack never mixes two episodes.
* A truncated step's final observation keeps its newest frame in a per-lane ring of
  `final_obs_capacity` frames (`jaxbuffers._ring.final_slots`), stacked on the step's frames.

Temporal coding (`keyframe_interval=K`, default `DEFAULT_KEYFRAME_INTERVAL`). Each frame of a lane's ring is stored as
the bytewise XOR with the previous frame of the same lane (a delta, `host_codecs.CompressedStore.put`'s `bases`),
except keyframes, stored whole: the frame of every episode start and every `K`-th frame after it. So a chain (a
keyframe and the deltas after it) never crosses an episode start, and decoding a frame decodes at most `K - 1`
frames before it, which the frame stacks around it mostly need anyway. The frame ring keeps `K - 1` more frames
(`F = length + k - 1 + K - 1`), so overwriting the oldest frames never drops a keyframe whose deltas a stored step
still reads; the deltas of an older chain whose keyframe is overwritten (frames no stored step reads) are deleted with
it, so every stored frame decodes. Final frames are keyframes. `K = 1` stores every frame whole.

Which stacks. This is exact when the observations given to `add` are what such a frame stacker produced from each
episode's start, and any other stack is refused (`check_stacks`; the rule of `jaxbuffers._validate.unrebuilt_stacks`,
shared with `jaxbuffers.compressed.CompressedEpisodeBuffer`): a step that starts an episode (the first after
`create`, and each lane's step after one that terminated or truncated) holds the padding, every other step the
previous step's stack shifted by one frame (the previous step's stack is read from the store as a sample reads it
when it came in an earlier add), and a final observation its step's stack shifted by one frame. A buffer created
mid-episode must be fed from an episode start or with padded stacks. Without `frame_stack` every compressed leaf is
stored whole.

Ids on device, per compressed leaf and step: int32 `[3]` = `(newest, prev, ep_pos)`, the store
slots of the step's frame and of the frame one step back. Lane `e`'s frame ring is store slots
`[e * F, (e + 1) * F)`; final frames follow at `num_envs * F + e * K + j`.

Example:

```python
import jax, jax.numpy as jnp
from jaxbuffers.compressed import CompressedTrajectoryBuffer

step = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
buf = CompressedTrajectoryBuffer.create(step, num_envs=8, length=100_000, frame_stack=4)
batch = jax.tree.map(lambda x: jnp.stack([x] * 8), step)
add = jax.jit(CompressedTrajectoryBuffer.add, donate_argnums=0)
for _ in range(2):
    buf = add(buf, batch, terminated=jnp.zeros(8, bool))
tr = buf.sample_transitions(jax.random.key(0), 32, n_step=1, gamma=0.99)   # tr.obs: uint8[32, 4, 84, 84]
```
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuffers import _compiled, _ring, _validate
from jaxbuffers._metrics import Recorded
from jaxbuffers.compressed import _common
from jaxbuffers.compressed._host import DEFAULT_DELTA_CODEC, DEFAULT_KEYFRAME_INTERVAL, FrameStacked, HostStores, keyframe_interval_of
from jaxbuffers.compressed.trajectory_slots import ChunkFrames, chunk_frames
from jaxbuffers.compressed.trajectory_stacks import StackChecked
from jaxbuffers.prioritised_trajectory import PrioritisedSequenceSample, PrioritisedTrajectoryBuffer, PrioritisedTransitionSample
from jaxbuffers.trajectory import SequenceSample, TrajectoryBuffer, TransitionSample

__all__ = ["CompressedTrajectoryBuffer", "CompressedPrioritisedTrajectoryBuffer", "DEFAULT_CODEC", "DEFAULT_DELTA_CODEC", "DEFAULT_KEYFRAME_INTERVAL"]

DEFAULT_CODEC = "zstd:-1"
"""Codec of the host stores unless `codec=` is given (zstd's fast level -1)."""

_ID = jax.ShapeDtypeStruct((3,), jnp.int32)
_GAMMA = {"gamma": (0.0, 1.0)}
_BETA = {"beta": (0.0, float("inf"))}
_GAMMA_BETA = {**_GAMMA, **_BETA}


def _steps(inner) -> TrajectoryBuffer:
    """The `TrajectoryBuffer` of a uniform or prioritised inner buffer."""
    return inner.buffer if isinstance(inner, PrioritisedTrajectoryBuffer) else inner


def _build(
    example_step: Mapping, num_envs: int, length: int, final_obs_capacity, obs_key: str, *,
    compress: Sequence[str] | None = None, frame_stack: int | None = None, stack_axis: int = 0, padding: str = "reset",
    codec: str = DEFAULT_CODEC, normalize_images: bool = False, chunk_bytes: int = 64 << 20,
    dictionary_bytes: int | None = None, keyframe_interval: int | None = None, delta_codec: str | None = DEFAULT_DELTA_CODEC,
):
    """Shared part of both `create`s: returns (inner example step, final-obs ring size, config)."""
    num_envs, length = _validate.static_int("num_envs", num_envs), _validate.static_int("length", length)
    spec, idx, infos, k = _common.obs_leaves(example_step, obs_key, compress, frame_stack, stack_axis, padding, normalize_images)
    key, delta_codec = keyframe_interval_of(keyframe_interval, codec, delta_codec)
    kcap = length if final_obs_capacity is None else min(_validate.static_int("final_obs_capacity", final_obs_capacity), length)
    obs_spec = spec[obs_key]
    ring = length + k - 1 + key - 1
    host = HostStores(
        num_envs * ring + num_envs * kcap + 1,  # the last slot is never written: the empty slot
        codec,
        [i.frame_shape for i in infos],
        [i.dtype for i in infos],
        [i.name for i in infos],
        chunk_bytes=chunk_bytes,
        dictionary_bytes=dictionary_bytes,
        delta_codec=delta_codec,
    )
    inner_obs = _common.replace_leaves(obs_spec, idx, [_ID] * len(idx))
    inner_step = dict(spec)
    inner_step[obs_key] = inner_obs
    config = dict(
        host=host, leaves=tuple(infos), leaf_index=tuple(idx), frame_stack=k, padding=padding,
        normalize_images=bool(normalize_images), frame_ring=ring, keyframe_interval=key,
    )
    return inner_step, kcap, config


@_common.delegates("obs_key", "action_key", "reward_key", "num_valid", "head", "added", "terminated", "truncated",
                   "final_slot", "metrics", via="trajectory")
@_validate.one_member_methods(mapped=False)
class CompressedTrajectoryBuffer(StackChecked, FrameStacked, Recorded):
    """A `jaxbuffers.TrajectoryBuffer` whose chosen observation leaves live compressed on the host.

    Same methods and sample types as `jaxbuffers.TrajectoryBuffer`; sampled observations are decoded (and frame
    stacks rebuilt) on the host. With the same adds and keys it returns exactly what a `TrajectoryBuffer` returns
    (float32 `x / 255` for compressed leaves when `normalize_images`). Module doc: frame dedup and the id layout.
    Not vmappable (one host store); jittable, `lax.scan`-able, donatable.
    """

    _metrics_in = "buffer"  # record / stats: the metrics of the wrapped buffer

    buffer: Any  # TrajectoryBuffer (PrioritisedTrajectoryBuffer for the subclass); compressed leaves hold int32[3] ids
    frame_head: jax.Array  # shape=(), dtype=int32: position of the next step in every lane's frame ring, in [0, frame_ring)
    next_ep_pos: jax.Array  # shape=[num_envs], dtype=int32: ep_pos of each lane's next step (0 = starts an episode)
    final_head: jax.Array  # shape=[num_envs], dtype=int32: next final-frame slot per lane, in [0, final_obs_capacity)
    next_key_pos: jax.Array  # shape=[num_envs], dtype=int32: frames since its keyframe of each lane's next frame, in [0, keyframe_interval) (0: a keyframe)
    version: jax.Array  # shape=(), dtype=int32: host-store writes included in this state
    # static: host, leaves, leaf_index, normalize_images, frame_stack, padding (FrameStacked), and
    frame_ring: int = struct.field(pytree_node=False)  # F = length + k - 1 + K - 1 frames per lane
    keyframe_interval: int = struct.field(pytree_node=False)  # K: a keyframe at every episode start and every K frames

    @classmethod
    @_validate.keyword_sizes
    def create(
        cls, example_step: Mapping, *, num_envs: int, length: int, compress: Sequence[str] | None = None,
        frame_stack: int | None = None, stack_axis: int = 0, padding: str = "reset",
        codec: str = DEFAULT_CODEC, normalize_images: bool = False, final_obs_capacity: int | None = None,
        obs_key: str = "obs", action_key: str = "action", reward_key: str = "reward",
        chunk_bytes: int = 64 << 20, dictionary_bytes: int | None = None,
        keyframe_interval: int | None = None, delta_codec: str | None = DEFAULT_DELTA_CODEC, metrics: bool = True,
    ) -> "CompressedTrajectoryBuffer":
        """An empty compressed buffer of `num_envs` lanes of `length` steps.

        Args:
          example_step: as `jaxbuffers.TrajectoryBuffer.create`, like `num_envs`, `length`, `final_obs_capacity` (it
            also sizes the host's final-frame ring), `obs_key`, `action_key`, `reward_key` and `metrics` (per-position
            sample counts, kept in the device buffer) (not repeated here).
          compress: the leaves inside the observation `example_step[obs_key]` to store on the host, by a dict key
            (or attribute name) on the leaf's path below `obs_key`, or its full name; `None`: every leaf of the
            observation. E.g. `obs = {"pixels": uint8 [84, 84], "pos": float32 [3]}` with `compress=("pixels",)`
            keeps `pos` on the device. A bare-array observation has no names inside it: leave `compress` out.
            Compressed leaves take the dtypes of `host_codecs.DTYPES`: bool, int8 to int64, uint8 to uint64,
            float16, float32, float64, complex64, complex128 (not bfloat16, float8 or int4: keep those on device).
          frame_stack: `k` when the compressed leaves are stacks of the last `k` frames (module
            doc); `None`: store each observation whole.
          stack_axis: axis of the `k` frames within one observation.
          padding: `"reset"` (repeat the episode's first frame) or `"zero"`.
          codec: host codec (`"zstd:-1".."zstd:22"`, `"igzip:0".."igzip:3"`, `"rle"`, `"none"`).
          normalize_images: sampled compressed leaves come back float32 `x / 255` (uint8 only).
          chunk_bytes: largest host arena chunk.
          dictionary_bytes: most bytes of each store's zstd dictionary (`None`:
            `DEFAULT_DICTIONARY_BYTES`, 32 KiB, for a zstd codec, else 0; 0: none).
          keyframe_interval: `K` of the temporal coding (module doc): a positive int, 1 for none. Default:
            `DEFAULT_KEYFRAME_INTERVAL`, or 1 with `codec="none"` (a delta of raw bytes is no smaller).
          delta_codec: codec of the delta frames (module doc; keyframes keep `codec`): `DEFAULT_DELTA_CODEC`
            (`"rle"`), any name `codec` takes, or None (`codec` codes the deltas too). Unused with
            `keyframe_interval=1` (no deltas): not built, so `codec="none"` needs numpy alone.

        Raises:
          TypeError: as `jaxbuffers.TrajectoryBuffer.create`; `compress` a bare string; a compressed leaf of another
            dtype than those above (naming the leaf).
          ValueError: as `jaxbuffers.TrajectoryBuffer.create` and `jaxbuffers._validate.frame_leaves`;
            `compress` naming no leaf; a bad `padding`, codec or delta codec; `dictionary_bytes` without zstd.
        """
        args = dict(locals())
        del args["cls"]
        return cls._create(TrajectoryBuffer.create, **args)

    @classmethod
    def _create(
        cls, inner_create, example_step, *, num_envs, length, final_obs_capacity=None, obs_key="obs", action_key="action",
        reward_key="reward", metrics=True, **compressed,
    ):
        """Both `create`s: `_build`, then `inner_create` (a buffer's `create`) of the id-holding step.
        Unwritten steps hold id -1 (decoded as zeros, like an unwritten plain buffer's zeros)."""
        unknown = sorted(set(compressed) - set(inspect.signature(_build).parameters))
        if unknown:  # named as `create`'s, not the shared helper's
            raise TypeError(f"{cls.__name__}.create: unexpected keyword argument(s) {unknown}")
        inner_step, kcap, config = _build(example_step, num_envs, length, final_obs_capacity, obs_key, **compressed)
        inner = inner_create(
            inner_step, num_envs=num_envs, length=length, final_obs_capacity=kcap, obs_key=obs_key,
            action_key=action_key, reward_key=reward_key, metrics=metrics,
        )
        traj = _steps(inner)
        idx = config["leaf_index"]
        empty = lambda tree: _common.replace_leaves(  # noqa: E731
            tree, idx, [jnp.full_like(x, -1) for x in _common.pick_leaves(tree, idx)]
        )
        storage = dict(traj.storage)
        storage[traj.obs_key] = empty(storage[traj.obs_key])
        traj = traj.replace(storage=storage, final_obs=empty(traj.final_obs))
        inner = inner.replace(buffer=traj) if isinstance(inner, PrioritisedTrajectoryBuffer) else traj
        e = traj.num_envs
        return cls(
            buffer=inner, frame_head=jnp.int32(0), next_ep_pos=jnp.zeros((e,), jnp.int32),
            final_head=jnp.zeros((e,), jnp.int32), next_key_pos=jnp.zeros((e,), jnp.int32), version=jnp.int32(0), **config,
        )

    @property
    def trajectory(self) -> TrajectoryBuffer:
        """The device-side `jaxbuffers.TrajectoryBuffer` (compressed leaves hold ids)."""
        return _steps(self.buffer)

    @property
    def length(self):
        """Steps kept per lane (static int)."""
        return self.trajectory.length

    @property
    def final_obs_capacity(self):
        """Final observations kept per lane (static int)."""
        return self.trajectory.final_obs_capacity

    @property
    def step_spec(self) -> Any:
        """Dict of `jax.ShapeDtypeStruct`: one step of one env as the user sees it."""
        traj = self.trajectory
        spec = dict(traj.step_spec)
        spec[traj.obs_key] = _common.replace_leaves(
            spec[traj.obs_key], self.leaf_index, [jax.ShapeDtypeStruct(i.shape, i.dtype) for i in self.leaves]
        )
        return spec

    def uncompressed_nbytes(self) -> int:
        """Bytes a plain `TrajectoryBuffer` with the same configuration would hold (shapes only)."""
        t = self.trajectory
        keys = dict(obs_key=t.obs_key, action_key=t.action_key, reward_key=t.reward_key)
        create = lambda: TrajectoryBuffer.create(self.step_spec, num_envs=t.num_envs, length=t.length, final_obs_capacity=t.final_obs_capacity, **keys)  # noqa: E731
        return _validate.tree_nbytes(jax.eval_shape(create))

    def num_added(self) -> int:
        """Exact number of steps ever added per lane (host-side Python int)."""
        return self.trajectory.num_added()

    @_compiled.method("batch_size", "sequence_length", "period", "cross_episodes")
    def can_sample(self, batch_size: int, sequence_length: int, *, period: int = 1, cross_episodes: bool = True) -> jax.Array:
        """`jaxbuffers.TrajectoryBuffer.can_sample`: whether `sample_sequences` returns only valid data."""
        return self.buffer.can_sample(batch_size, sequence_length, period=period, cross_episodes=cross_episodes)

    @_compiled.method("batch_size", "n_step", scalars=_GAMMA)
    def can_sample_transitions(self, batch_size: int, *, n_step: int = 1, gamma=None) -> jax.Array:
        """`jaxbuffers.TrajectoryBuffer.can_sample_transitions`: whether `sample_transitions` returns only valid data."""
        return self.buffer.can_sample_transitions(batch_size, n_step=n_step, gamma=gamma)

    @_common.checked_before_dispatch(add=True)
    def add(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> "CompressedTrajectoryBuffer":
        """`jaxbuffers.TrajectoryBuffer.add` (same arguments and errors), checked once here.

        The newest frame of each compressed observation and, where `truncated & ~terminated`, of
        its `final_obs` go to the host in one ordered callback; the device buffer gets their ids.
        The previous state must not be added to again (that would fork the host store).
        With `frame_stack`, the stacks given must be those the buffer rebuilds (module doc, "Which stacks").

        Raises:
          ValueError: with `frame_stack`, a stack that is not the one the buffer rebuilds (named by leaf, env and
            step), before anything is written (under `jit` the write callback refuses it:
            `jax.errors.JaxRuntimeError`).
          StaleBufferError: called eagerly on a state that is not the newest, before anything runs
            (under `jit` the write callback refuses it: `jax.errors.JaxRuntimeError`).
          RuntimeError: the buffer was closed.
        """
        return self._add(step, terminated, truncated, final_obs)

    @_compiled.method()
    def _add(self, step, terminated, truncated, final_obs) -> "CompressedTrajectoryBuffer":
        """`add` once its eager checks ran; with frame stacks the write callback refuses stacks the store cannot
        rebuild before it writes anything (`_stack_refusal`)."""
        new, (slots, valid, bases, datas), checks = self._add_device(step, terminated, truncated, final_obs)
        refuse = (checks, self._stack_refusal) if checks else None
        version = _common.write(self.host, self.version, slots, valid, datas, bases, refuse, self._recent_rows(valid.shape[0], truncated is not None))
        return new.replace(version=version)

    def add_from_host(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> "CompressedTrajectoryBuffer":
        """`add` with the host write as a direct Python call instead of a callback; not traceable.

        Same arguments, results and errors as `add` (the returned buffer is identical).

        Raises:
          TypeError: called under a JAX transformation (use `add` there).
          StaleBufferError: this state was already added to (raised directly, not wrapped).
        """
        if isinstance(self.version, jax.core.Tracer):
            raise TypeError("add_from_host cannot be traced (jit/scan/vmap); call add() inside traced code")
        _common.check_add_before_dispatch(self, lambda b: b._add_device(step, terminated, truncated, final_obs))
        new, parts, checks = self._add_device(step, terminated, truncated, final_obs)
        (slots, valid, bases, datas), checks = jax.device_get((parts, checks))
        error = self._stack_refusal(*checks) if checks else None
        if error is not None:
            raise error
        recent = self._recent_rows(np.shape(valid)[0], truncated is not None)
        return new.replace(version=jnp.asarray(self.host.write(np.asarray(self.version), slots, valid, *datas, bases=bases, recent=recent), jnp.int32))

    @_compiled.method()
    def _add_device(self, step, terminated, truncated, final_obs):
        """Everything `add` does on device, its arguments checked once; returns (state without the version bump,
        write parts, the operands of the host stack check: `_checked_stack_operands`, or `()` without frame
        stacks)."""
        step, terminated, truncated, final_obs = _validate.trajectory_add(
            self.step_spec, self.trajectory.obs_key, self.num_envs, self.length, step, terminated, truncated, final_obs
        )
        e, t = terminated.shape
        frames = lambda o: [  # noqa: E731
            _common.newest_frame(x, i, 2).reshape(e * t, *i.frame_shape) for x, i in zip(_common.pick_leaves(o, self.leaf_index), self.leaves)
        ]
        datas = frames(step[self.trajectory.obs_key])
        if truncated is not None:
            datas = [jnp.concatenate([d, f]) for d, f in zip(datas, frames(final_obs))]
        checks = self._checked_stack_operands(step, terminated, truncated, final_obs) if self._stacked else ()
        new, (slots, valid, bases) = self._add_ids(step, terminated, truncated, final_obs)
        return new, (slots, valid, bases, datas), checks

    @_compiled.method()
    def _add_ids(self, step, terminated, truncated, final_obs):
        """The device half of an add of checked `[E, t]` inputs: ids, episode positions, the inner
        buffer's add. The compressed leaves of `step[obs]` / `final_obs` are not read (any array
        stands in for them). Returns (state without the version bump, (store slots `[M]`, rows to
        write `[M]`, delta bases `[M]` or None for `K = 1`)): rows `[0, E*t)` are the newest frames of the steps,
        lane-major, then (with `truncated`) `E*t` final frames (keyframes, base -1)."""
        traj = self.trajectory
        c = self._chunk_frames(jnp, terminated, truncated, (self.frame_head, self.next_ep_pos, self.next_key_pos, self.final_head))
        inner_final = None if truncated is None else _common.replace_leaves(final_obs, self.leaf_index, [c.final_ids] * len(self.leaves))
        inner_step = dict(step)
        inner_step[traj.obs_key] = _common.replace_leaves(step[traj.obs_key], self.leaf_index, [c.ids] * len(self.leaves))
        inner = self.buffer.add_prepared(inner_step, terminated, truncated, inner_final)
        new = self.replace(buffer=inner, frame_head=c.frame_head, next_ep_pos=c.next_ep_pos, final_head=c.final_head,
                           next_key_pos=c.next_key_pos)
        return new, (c.slots, c.valid, c.bases)

    def _chunk_frames(self, xp, terminated, truncated, cursors) -> ChunkFrames:
        """`chunk_frames` with this buffer's sizes; ``cursors``: (frame_head, next_ep_pos, next_key_pos, final_head)."""
        return chunk_frames(xp, terminated, truncated, *cursors, ring=self.frame_ring, frame_stack=self.frame_stack,
                            keyframe_interval=self.keyframe_interval, final_capacity=self.trajectory.final_obs_capacity)

    def add_frames_from_host(self, step, frames, terminated, truncated=None, final_obs=None, final_frames=None, *, donate: bool = False):
        """`add_from_host` of a chunk whose compressed leaves come as host frames (for
        `jaxbuffers.compressed.StagingWriter`): `step` / `final_obs` `[E, t, ...]` with int32 `[E, t, 3]`
        placeholders for the compressed leaves (not read), `frames` / `final_frames` per compressed leaf
        `[E, t, *frame_shape]` of its dtype (the newest frames), written to the host store directly. Same
        state as `add_from_host`; the same errors (`frames` and `final_frames` named), raised before anything runs.
        With `donate` the caller gives this state up: the new state reuses its device arrays (O(t) work, where a
        program that keeps this state copies every field, O(length)), and this state must not be used again."""
        traj = self.trajectory
        step, terminated, truncated, final_obs = _validate.trajectory_add(
            traj.step_spec, traj.obs_key, self.num_envs, self.length, step, terminated, truncated, final_obs
        )
        e, t = terminated.shape
        for name, given in {"frames": frames, **({} if truncated is None else {"final_frames": final_frames})}.items():
            if not isinstance(given, (list, tuple)) or len(given) != len(self.leaves):
                raise TypeError(f"{name}: expected a list of {len(self.leaves)} arrays (one per compressed leaf), got {type(given).__name__}")
            for f, i in zip(given, self.leaves):
                _validate.array(f"{name} of {i.name}", f, (e, t, *i.frame_shape), i.dtype)
        host = lambda x: None if x is None else np.asarray(x)  # noqa: E731
        terminated, truncated = host(terminated), host(truncated)
        rows = None if truncated is None else [np.asarray(f)[truncated & ~terminated] for f in final_frames]
        return self._add_checked_frames(step, frames, terminated, truncated, final_obs, rows, donate)[0]

    def _add_checked_frames(self, step, frames, terminated, truncated, final_obs, final_rows, donate: bool, cursors: tuple | None = None):
        """`add_frames_from_host` of checked arguments (chunk leaves `[E, t, ...]` of the step spec, numpy flags; the
        final frames only where read, ``final_rows``: per compressed leaf ``[n, *frame]``, the rows of
        ``truncated & ~terminated`` lane-major): a `StagingWriter` stages them in arrays made from that spec, so they
        are checked once, as each step is staged. The rows written are computed on the host (`chunk_frames` of the
        state's cursors: ``cursors``, this state's ``(version, frame_head, next_ep_pos, next_key_pos, final_head)`` on
        the host as the last call returned them, or None: read from the device), so the frames are compressed while
        the device program runs and nothing waits for it; that program gets copies of the host arrays (a CPU program
        may read an aligned numpy argument in place, after this returns) and the version the write makes. Returns
        (the new state, its cursors)."""
        made = _common.check_before_dispatch(self, add=True)
        if cursors is None or cursors[0] + 1 != made:
            cursors = tuple(jax.device_get((self.version, self.frame_head, self.next_ep_pos, self.next_key_pos, self.final_head)))
        version = int(cursors[0])
        c = self._chunk_frames(np, terminated, truncated, cursors[1:])  # read before a donation
        own = lambda x: np.array(x) if isinstance(x, np.ndarray) else x  # noqa: E731
        new = (_add_at_donated if donate else _add_at)(self, np.int32(version + 1), *jax.tree.map(own, (step, terminated, truncated, final_obs)))
        e, t = terminated.shape
        datas = [np.reshape(f, (e * t, *i.frame_shape)) for f, i in zip(frames, self.leaves)]
        slots, bases = c.slots, c.bases
        if truncated is not None:  # the final frames read: the rows the store writes
            slots, bases = slots[c.valid], None if bases is None else bases[c.valid]
            datas = datas if len(slots) == e * t else [np.concatenate([d, r]) for d, r in zip(datas, final_rows)]
        self.host.write(version, slots, np.ones(len(slots), bool), *datas, bases=bases)
        _common.remember_add(new, version + 1)
        return new, (version + 1, c.frame_head, c.next_ep_pos, c.next_key_pos, c.final_head)

    def truncate_last_from_host(self, truncated, final_obs, *, donate: bool = False) -> "CompressedTrajectoryBuffer":
        """`jaxbuffers.TrajectoryBuffer.truncate_last` (same arguments), the final frames written to the host store
        directly; not traceable. Afterwards the buffer equals the one where each lane's newest step was added with
        `truncated=True` and this `final_obs` (its next step starts an episode). With `donate`, as
        `add_frames_from_host`.

        Raises (before anything is written):
          TypeError / ValueError: as `jaxbuffers.TrajectoryBuffer.truncate_last`; a call under a JAX transformation;
            with `frame_stack`, a final observation that is not its step's stack shifted by one frame.
          StaleBufferError: this state was already added to. RuntimeError: the buffer was closed.
        """
        if isinstance(self.version, jax.core.Tracer):
            raise TypeError("truncate_last_from_host cannot be traced (jit/scan/vmap)")
        e, spec = self.num_envs, self.step_spec[self.trajectory.obs_key]
        _validate.array("truncated", truncated, (e,), np.bool_)
        lead = _validate.check_batch(spec, final_obs, 1, "final_obs")
        if lead[0] != e:
            raise ValueError(f"final_obs: expected leading axis num_envs={e}, got {lead[0]}")
        _common.check_before_dispatch(self, add=True)
        frames = [np.asarray(_common.newest_frame(np.asarray(x), i, 1)) for x, i in zip(_common.pick_leaves(final_obs, self.leaf_index), self.leaves)]
        if self._stacked:
            befores, starts = self.lane_tails()
            error = self.final_error(befores, [np.asarray(x) for x in _common.pick_leaves(final_obs, self.leaf_index)], np.asarray(truncated) & ~starts)
            if error is not None:
                raise error
        placeholder = _common.replace_leaves(final_obs, self.leaf_index, [np.zeros((e, 3), np.int32)] * len(self.leaves))
        truncate, version = _truncate_ids_donated if donate else type(self)._truncate_ids, np.int32(self.version)  # read before a donation
        new, (slots, valid) = truncate(self, truncated, placeholder)
        slots, valid = jax.device_get((slots, valid))
        bases = None if self.keyframe_interval == 1 else np.full((e,), -1, np.int32)  # final frames are keyframes
        return new.replace(version=jnp.asarray(self.host.write(version, slots, valid, *frames, bases=bases), jnp.int32))

    @_compiled.method()
    def _truncate_ids(self, truncated, final_obs):
        """The device half of `truncate_last_from_host` (`final_obs`' compressed leaves are not read): the new state
        without the version bump, (store slots `[E]` of the final frames, which of them to write `[E]`)."""
        traj = self.trajectory
        e, ring = self.num_envs, self.frame_ring
        lanes, slot = jnp.arange(e, dtype=jnp.int32), (traj.head - 1) % traj.length
        boot = truncated & ~(traj.terminated[lanes, slot] | traj.truncated[lanes, slot]) & (traj.num_valid > 0)
        fslot, _, final_head = _ring.final_slots(self.final_head, boot[:, None], traj.final_obs_capacity)
        fstore = e * ring + lanes * traj.final_obs_capacity + fslot[:, 0]
        ep = _common.pick_leaves(traj.storage[traj.obs_key], self.leaf_index)[0][lanes, slot, 2]
        fids = jnp.stack([fstore, lanes * ring + (self.frame_head - 1) % ring, jnp.minimum(ep + 1, self.frame_stack - 1)], axis=-1).astype(jnp.int32)
        new = traj.truncate_last(truncated, _common.replace_leaves(final_obs, self.leaf_index, [fids] * len(self.leaves)))
        inner = self.buffer.replace(buffer=new) if isinstance(self.buffer, PrioritisedTrajectoryBuffer) else new
        zero = lambda x: jnp.where(boot, 0, x).astype(jnp.int32)  # noqa: E731 (the next step starts an episode, a keyframe)
        new = self.replace(buffer=inner, final_head=final_head, next_ep_pos=zero(self.next_ep_pos), next_key_pos=zero(self.next_key_pos))
        return new, (fstore, boot)

    def _frame_ids(self, ids: jax.Array):
        """ids `[*S, 3]` -> (store slots `[*S, k]` oldest to newest, zero-pad mask or None): `_common.stack_slots`."""
        return _common.stack_slots(
            ids, frame_stack=self.frame_stack, ring=self.frame_ring, num_lanes=self.num_envs, empty=self.host.num_slots - 1,
            stacked=self.leaves[0].stack_axis is not None, padding=self.padding,
        )

    @_common.checked_before_dispatch()
    def decode_obs(self, *obs: Any, rows: jax.Array | None = None) -> Any:
        """Replace the id leaves of stored observation pytrees by the decoded observations.

        Args:
          *obs: pytrees like the stored observation (a sample's `obs` before decoding, or a slice of
            `trajectory.storage[obs_key]`): each compressed leaf int32 `[*S, 3]` holding the same ids, the other
            leaves `[*S, ...]` of their stored dtypes. Several pytrees are decoded in one host callback (frames
            they share are decoded once).
          rows: bool `[S0]` (the first axis of `S`) or None (every row); rows where it is False read nothing from
            the host and their compressed leaves decode as zeros.

        Returns:
          Each pytree with its compressed leaves `[*S, *shape]` (float32 with `normalize_images`); one pytree in,
          one out; several in, a tuple. Ids outside the store (not made by this buffer) decode as zeros, like a
          step never written.

        Raises:
          TypeError: no pytree, a structure other than the stored observation's, or another dtype (float ids
            included: nothing is cast).
          ValueError: shapes other than `[*S, *stored shape]` with one `S`; concrete compressed leaves holding
            different ids.
        """
        if not obs:
            raise TypeError("obs: expected at least one observation pytree (compressed leaves int32 [*S, 3])")
        spec = self.trajectory.step_spec[self.trajectory.obs_key]
        fids, pads, leads = [], [], []
        for j, o in enumerate(obs):
            ids = self._checked_ids(spec, o, "obs" if len(obs) == 1 else f"obs[{j}]")
            if rows is not None:  # -1: the never-written slot, read as zeros without decoding
                ids = jnp.where(rows.reshape(rows.shape + (1,) * (ids.ndim - 1)), ids, -1)
            f, p = self._frame_ids(ids)
            fids.append(f)
            pads.append(p)
            leads.append(ids.ndim - 1)
        decoded = _common.read(self.host, self.leaves, self.version, *fids)
        outs = []
        for j, o in enumerate(obs):
            leaves = [_common.finish(decoded[i][j], info, leads[j], pads[j], self.normalize_images) for i, info in enumerate(self.leaves)]
            outs.append(_common.replace_leaves(o, self.leaf_index, leaves))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _checked_ids(self, spec, obs, what: str) -> jax.Array:
        """The ids `[*S, 3]` of one observation pytree, checked against the stored observation `spec`."""
        leaves = jax.tree.leaves(obs)
        first = leaves[self.leaf_index[0]] if len(leaves) > self.leaf_index[0] else None
        nd = max(getattr(first, "ndim", 1) - 1, 0)
        _validate.check_batch(spec, obs, nd, what, tuple(f"S{i}" for i in range(nd)))
        ids = _common.pick_leaves(obs, self.leaf_index)
        if not any(isinstance(x, jax.core.Tracer) for x in ids):
            for x, info in zip(ids[1:], self.leaves[1:]):
                if not np.array_equal(np.asarray(x), np.asarray(ids[0])):
                    raise ValueError(
                        f"{what}: the ids of {info.name} differ from those of {self.leaves[0].name}; every compressed "
                        f"leaf of a stored observation holds the same ids"
                    )
        return jnp.asarray(ids[0])

    def _decode_transitions(self, s, rows=None):
        """A transition sample (uniform or prioritised) with `obs` / `next_obs` decoded in one callback."""
        obs, next_obs = self.decode_obs(s.obs, s.next_obs, rows=rows)
        return s._replace(obs=obs, next_obs=next_obs, item={**s.item, self.trajectory.obs_key: obs})

    def _decode_sequences(self, s, rows=None):
        """A sequence sample (uniform or prioritised) with its observations decoded."""
        key = self.trajectory.obs_key
        return s._replace(item={**s.item, key: self.decode_obs(s.item[key], rows=rows)})

    @_common.checked_before_dispatch()
    @_compiled.method()
    def decode(self, sample, *, rows=None):
        """The observations of a sample of the inner buffer (`buf.buffer`, whose compressed leaves hold ids) decoded
        as this buffer's sampler of that kind returns them: `buf.decode(buf.buffer.sample_transitions(key, B, ...))`
        equals `buf.sample_transitions(key, B, ...)`, and likewise for sequences.

        Args:
          sample: a `TransitionSample` or `SequenceSample` (their prioritised variants for the prioritised buffer)
            of `self.buffer`, leading axis `B`.
          rows: bool `[B]` or None (every row). Rows where it is False read nothing from the host and their
            compressed leaves decode as zeros (a sharded buffer's global sample decodes on each shard only the rows
            that shard contributes).

        Raises:
          TypeError: another sample type; `rows` not a bool array. ValueError: `rows` not of shape `[B]`.
        """
        decoders = {TransitionSample: self._decode_transitions, PrioritisedTransitionSample: self._decode_transitions,
                    SequenceSample: self._decode_sequences, PrioritisedSequenceSample: self._decode_sequences}
        return _common.decode_sample(decoders, sample, rows, "buffer")

    @_common.checked_before_dispatch()
    @_compiled.method("sequence_length")
    def final_obs_at(self, indices, sequence_length: int) -> Any:
        """`jaxbuffers.TrajectoryBuffer.final_obs_at`, observations decoded (`[B, L, ...]`): at
        every truncated (and not terminated) step of the sequences starting at `indices`, the true
        final observation; zeros elsewhere (those steps read the store's never-written slot)."""
        traj = self.trajectory
        final = traj.final_obs_at(indices, sequence_length)
        seq = traj.sequences_at(indices, sequence_length)
        real = seq.truncated & ~seq.terminated
        ids = [jnp.where(real[..., None], x, -1) for x in _common.pick_leaves(final, self.leaf_index)]  # -1: zeros
        return self.decode_obs(_common.replace_leaves(final, self.leaf_index, ids))

    final_obs_lost = _common.delegated("final_obs_lost", "trajectory")
    valid_starts = _common.delegated("valid_starts", "trajectory")
    num_valid_windows = _common.delegated("num_valid_windows")

    @_common.checked_before_dispatch()
    @_compiled.method("sequence_length")
    def sequences_at(self, indices, sequence_length: int) -> SequenceSample:
        """`jaxbuffers.TrajectoryBuffer.sequences_at`, observations decoded as `sample_sequences` decodes them."""
        return self._decode_sequences(self.trajectory.sequences_at(indices, sequence_length))

    @_common.checked_before_dispatch()
    @_compiled.method("n_step", scalars=_GAMMA)
    def transitions_at(self, indices, *, n_step: int = 1, gamma) -> TransitionSample:
        """`jaxbuffers.TrajectoryBuffer.transitions_at`, `obs` / `next_obs` decoded as `sample_transitions` decodes them."""
        return self._decode_transitions(self.trajectory.transitions_at(indices, n_step=n_step, gamma=gamma))

    @_common.checked_before_dispatch()
    @_compiled.method("batch_size", "sequence_length", "period", "cross_episodes")
    def sample_sequences(
        self, key: jax.Array, batch_size: int, sequence_length: int, *, period: int = 1, cross_episodes: bool = True
    ) -> SequenceSample:
        """`jaxbuffers.TrajectoryBuffer.sample_sequences`, observations decoded (`[B, L, ...]`)."""
        return self._decode_sequences(self.buffer.sample_sequences(key, batch_size, sequence_length, period=period, cross_episodes=cross_episodes))

    @_common.checked_before_dispatch()
    @_compiled.method("batch_size", "n_step", scalars=_GAMMA)
    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma) -> TransitionSample:
        """`jaxbuffers.TrajectoryBuffer.sample_transitions`, `obs` / `next_obs` decoded.

        `next_obs` after a truncation is the true final observation (its stack rebuilt from the
        step's frames and the stored final frame). A state older than the host store raises
        `StaleBufferError` inside the read callback (raised as it is eagerly; under `jit`, a
        `jax.errors.JaxRuntimeError` carrying it).
        """
        return self._decode_transitions(self.buffer.sample_transitions(key, batch_size, n_step=n_step, gamma=gamma))


# `add_frames_from_host(donate=True)`: the state's arrays are reused for the new state (a `StagingWriter` that owns it).
def _add_ids_at(buf, version, step, terminated, truncated, final_obs):
    """`_add_ids`' new state carrying `version` (the version its host write makes, known before the write runs)."""
    return CompressedTrajectoryBuffer._add_ids.uncompiled(buf, step, terminated, truncated, final_obs)[0].replace(version=version)


_add_at, _add_at_donated = jax.jit(_add_ids_at), jax.jit(_add_ids_at, donate_argnums=0)
_truncate_ids_donated = jax.jit(CompressedTrajectoryBuffer._truncate_ids.uncompiled, donate_argnums=0)


@_common.delegates("window_length", "period", "priority_exponent", "epsilon", "max_priority", "phase", "tree")
@_validate.one_member_methods(mapped=False)
class CompressedPrioritisedTrajectoryBuffer(CompressedTrajectoryBuffer):
    """A `jaxbuffers.PrioritisedTrajectoryBuffer` with host-compressed observations.

    `create` takes the arguments of both `CompressedTrajectoryBuffer.create` and
    `jaxbuffers.PrioritisedTrajectoryBuffer.create`; sampling returns the prioritised samples, observations decoded.
    """

    @classmethod
    @_validate.keyword_sizes
    def create(  # type: ignore[override]
        cls, example_step: Mapping, *, num_envs: int, length: int, window_length: int, period: int = 1,
        priority_exponent: float = 0.6, epsilon: float = 1e-6, **options,
    ) -> "CompressedPrioritisedTrajectoryBuffer":
        """An empty prioritised compressed buffer.

        Args:
          example_step: as `CompressedTrajectoryBuffer.create`, like `num_envs` and `length`.
          window_length: as `jaxbuffers.PrioritisedTrajectoryBuffer.create`, like `period`,
            `priority_exponent` and `epsilon` (not repeated here).
          **options: the other keywords of `CompressedTrajectoryBuffer.create`.
        """
        prioritised = functools.partial(
            PrioritisedTrajectoryBuffer.create, window_length=window_length, period=period,
            priority_exponent=priority_exponent, epsilon=epsilon,
        )
        return cls._create(prioritised, example_step, num_envs=num_envs, length=length, **options)

    @_compiled.method("batch_size", "sequence_length", "period", "cross_episodes", scalars=_BETA)
    def can_sample(self, batch_size: int, sequence_length: int | None = None, *, period: int | None = None, cross_episodes: bool = True, beta=1.0) -> jax.Array:  # type: ignore[override]
        """`jaxbuffers.PrioritisedTrajectoryBuffer.can_sample`."""
        return self.buffer.can_sample(batch_size, sequence_length, period=period, cross_episodes=cross_episodes, beta=beta)

    @_compiled.method("batch_size", "n_step", scalars=_GAMMA_BETA)
    def can_sample_transitions(self, batch_size: int, *, n_step: int | None = None, gamma=None, beta=1.0) -> jax.Array:  # type: ignore[override]
        """`jaxbuffers.PrioritisedTrajectoryBuffer.can_sample_transitions`."""
        return self.buffer.can_sample_transitions(batch_size, n_step=n_step, gamma=gamma, beta=beta)

    @_common.checked_before_dispatch()
    @_compiled.method("batch_size", "sequence_length", "period", "cross_episodes", scalars=_BETA)
    def sample_sequences(  # type: ignore[override]
        self, key: jax.Array, batch_size: int, sequence_length: int | None = None, *, period: int | None = None,
        cross_episodes: bool = True, beta=1.0,
    ) -> PrioritisedSequenceSample:
        """`jaxbuffers.PrioritisedTrajectoryBuffer.sample_sequences`, observations decoded."""
        return self._decode_sequences(self.buffer.sample_sequences(key, batch_size, sequence_length, period=period, cross_episodes=cross_episodes, beta=beta))

    @_common.checked_before_dispatch()
    @_compiled.method("batch_size", "n_step", scalars=_GAMMA_BETA)
    def sample_transitions(  # type: ignore[override]
        self, key: jax.Array, batch_size: int, *, n_step: int | None = None, gamma, beta=1.0
    ) -> PrioritisedTransitionSample:
        """`jaxbuffers.PrioritisedTrajectoryBuffer.sample_transitions`, `obs` / `next_obs` decoded."""
        return self._decode_transitions(self.buffer.sample_transitions(key, batch_size, n_step=n_step, gamma=gamma, beta=beta))

    priorities = _common.delegated("priorities")
    generations_at = _common.delegated("generations_at")

    @_compiled.method()
    def set_priorities(self, indices: jax.Array, priorities: jax.Array, generations: jax.Array) -> "CompressedPrioritisedTrajectoryBuffer":
        """`jaxbuffers.PrioritisedTrajectoryBuffer.set_priorities` (device only, no host work)."""
        return self.replace(buffer=self.buffer.set_priorities(indices, priorities, generations))
