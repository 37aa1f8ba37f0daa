"""Host-compressed trajectory buffers: `CompressedTrajectoryBuffer` and its prioritised variant.

A `jaxbuffers.TrajectoryBuffer` whose chosen observation leaves hold int32 ids `[3]` = `(newest, prev, ep_pos)` per
step, the pixels compressed in host stores (`docs/api/compressed.md`, "Frame stacks and temporal coding").
"""

from __future__ import annotations

import functools
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


def _with_steps(inner, traj: TrajectoryBuffer):
    """`inner` (uniform or prioritised) holding `traj` as its `TrajectoryBuffer`."""
    return inner.replace(buffer=traj) if isinstance(inner, PrioritisedTrajectoryBuffer) else traj


@_common.delegates("obs_key", "action_key", "reward_key", "num_valid", "head", "added", "terminated", "truncated",
                   "final_slot", "final_owner", "lost_prefix", "metrics", "length", "final_obs_capacity", via="trajectory")
@_validate.one_member_methods(mapped=False)
class CompressedTrajectoryBuffer(StackChecked, FrameStacked, Recorded):
    """A `jaxbuffers.TrajectoryBuffer` whose chosen observation leaves live compressed on the host.

    Same methods and sample types; with the same adds and keys it returns exactly what a `TrajectoryBuffer` returns
    (float32 `x / 255` for compressed leaves when `normalize_images`). Not vmappable (one host store); jittable,
    `lax.scan`-able, donatable.
    """

    _metrics_in = "buffer"  # record / stats: the metrics of the wrapped buffer

    buffer: Any  # TrajectoryBuffer (PrioritisedTrajectoryBuffer for the subclass); compressed leaves hold int32[3] ids
    frame_head: jax.Array  # shape=(), dtype=int32: position of the next step in every lane's frame ring, in [0, frame_ring)
    next_ep_pos: jax.Array  # shape=[num_envs], dtype=int32: ep_pos of each lane's next step (0 = starts an episode), in [0, frame_stack)
    final_head: jax.Array  # shape=[num_envs], dtype=int32: next final-frame slot per lane, in [0, final_obs_capacity)
    next_key_pos: jax.Array  # shape=[num_envs], dtype=int32: frames since its keyframe of each lane's next frame, in [0, keyframe_interval) (0: a keyframe)
    version: jax.Array  # shape=(), dtype=int32: host-store writes included in this state
    # static: host, leaves, leaf_index, normalize_images, frame_stack, padding (FrameStacked), and
    frame_ring: int = struct.field(pytree_node=False)  # F = length + k - 1 + K - 1 frames per lane
    keyframe_interval: int = struct.field(pytree_node=False)  # K: a keyframe at every episode start and every K frames

    def _cursor_ranges(self) -> dict:
        """`(lo, hi)`, inclusive, of the cursor fields' documented ranges (`_checkpoint_describe._checked_cursors`)."""
        return {"frame_head": (0, self.frame_ring - 1), "next_ep_pos": (0, self.frame_stack - 1),
                "final_head": (0, self.trajectory.final_obs_capacity - 1), "next_key_pos": (0, self.keyframe_interval - 1)}

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
            also sizes the host's final-frame ring), `obs_key`, `action_key`, `reward_key` and `metrics`.
          compress: the leaves of the observation `example_step[obs_key]` to store on the host, by a dict key (or
            attribute name) on the leaf's path below `obs_key`, or its full name; `None`: every leaf of it. E.g.
            `compress=("pixels",)` with `obs = {"pixels": uint8 [84, 84], "pos": float32 [3]}` keeps `pos` on device.
            Compressed leaves take the dtypes of `host_codecs.DTYPES`: bool, int8 to int64, uint8 to uint64, float16
            to float64, complex64, complex128 (not bfloat16, float8 or int4: keep those on device).
          frame_stack: `k` when the compressed leaves are stacks of the last `k` frames (`docs/api/compressed.md`);
            `None`: store each observation whole.
          stack_axis: axis of the `k` frames within one observation.
          padding: `"reset"` (repeat the episode's first frame) or `"zero"`.
          codec: host codec (`"zstd:-7".."zstd:22"`, `"igzip:0".."igzip:3"`, `"rle"`, `"none"`).
          normalize_images: sampled compressed leaves come back float32 `x / 255` (uint8 only).
          chunk_bytes: largest host arena chunk.
          dictionary_bytes: most bytes of each store's zstd dictionary (`None`: `DEFAULT_DICTIONARY_BYTES` for a zstd
            codec, else 0; 0: none).
          keyframe_interval: `K` of the temporal coding: a positive int, 1 for none. Default:
            `DEFAULT_KEYFRAME_INTERVAL`, or 1 with `codec="none"`.
          delta_codec: codec of the delta frames (any name `codec` takes; keyframes keep `codec`), or None (`codec`);
            not built with `K = 1`.

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
        cls, inner_create, example_step, *, num_envs, length, compress=None, frame_stack=None, stack_axis=0,
        padding="reset", codec=DEFAULT_CODEC, normalize_images=False, final_obs_capacity=None, obs_key="obs",
        action_key="action", reward_key="reward", chunk_bytes=64 << 20, dictionary_bytes=None, keyframe_interval=None,
        delta_codec=DEFAULT_DELTA_CODEC, metrics=True, **unknown,
    ):
        """Both `create`s: `inner_create` of the id-holding step; unwritten steps hold id -1 (decoded as zeros)."""
        if unknown:  # named as `create`'s
            raise TypeError(f"{cls.__name__}.create: unexpected keyword argument(s) {sorted(unknown)}")
        num_envs, length = _validate.static_int("num_envs", num_envs), _validate.static_int("length", length)
        spec, idx, infos, k = _common.obs_leaves(example_step, obs_key, compress, frame_stack, stack_axis, padding,
                                                 normalize_images)
        key, delta_codec = keyframe_interval_of(keyframe_interval, codec, delta_codec)
        kcap = length if final_obs_capacity is None else min(
            _validate.static_int("final_obs_capacity", final_obs_capacity), length
        )
        ring = length + k - 1 + key - 1
        host = HostStores(  # the last slot is never written: the empty slot
            num_envs * ring + num_envs * kcap + 1, codec, [i.frame_shape for i in infos], [i.dtype for i in infos],
            [i.name for i in infos], chunk_bytes=chunk_bytes, dictionary_bytes=dictionary_bytes,
            delta_codec=delta_codec,
        )
        inner = inner_create(
            {**spec, obs_key: _common.replace_leaves(spec[obs_key], idx, [_ID] * len(idx))}, num_envs=num_envs,
            length=length, final_obs_capacity=kcap, obs_key=obs_key, action_key=action_key, reward_key=reward_key,
            metrics=metrics,
        )
        traj = _steps(inner)
        empty = lambda tree: _common.replace_leaves(  # noqa: E731
            tree, idx, [jnp.full_like(x, -1) for x in _common.pick_leaves(tree, idx)]
        )
        storage = {**traj.storage, obs_key: empty(traj.storage[obs_key])}
        traj = traj.replace(storage=storage, final_obs=empty(traj.final_obs))
        zeros = lambda: jnp.zeros((num_envs,), jnp.int32)  # noqa: E731 (three arrays: a state may be donated)
        return cls(
            buffer=_with_steps(inner, traj), frame_head=jnp.int32(0), next_ep_pos=zeros(), final_head=zeros(),
            next_key_pos=zeros(), version=jnp.int32(0), host=host, leaves=tuple(infos), leaf_index=tuple(idx),
            frame_stack=k, padding=padding, normalize_images=bool(normalize_images), frame_ring=ring,
            keyframe_interval=key,
        )

    @property
    def trajectory(self) -> TrajectoryBuffer:
        """The device-side `jaxbuffers.TrajectoryBuffer` (compressed leaves hold ids)."""
        return _steps(self.buffer)

    @property
    def step_spec(self) -> Any:
        """Dict of `jax.ShapeDtypeStruct`: one step of one env as the user sees it."""
        traj, specs = self.trajectory, [jax.ShapeDtypeStruct(i.shape, i.dtype) for i in self.leaves]
        obs = _common.replace_leaves(traj.step_spec[traj.obs_key], self.leaf_index, specs)
        return {**traj.step_spec, traj.obs_key: obs}

    def uncompressed_nbytes(self) -> int:
        """Bytes a plain `TrajectoryBuffer` with the same configuration would hold (shapes only)."""
        t = self.trajectory
        create = functools.partial(TrajectoryBuffer.create, self.step_spec, num_envs=t.num_envs, length=t.length,
                                   final_obs_capacity=t.final_obs_capacity, obs_key=t.obs_key,
                                   action_key=t.action_key, reward_key=t.reward_key)
        return _validate.tree_nbytes(jax.eval_shape(create))

    num_added = _common.delegated("num_added", "trajectory")

    @_compiled.method("batch_size", "sequence_length", "period", "cross_episodes")
    def can_sample(self, batch_size: int, sequence_length: int, *, period: int = 1, cross_episodes: bool = True) -> jax.Array:
        """`jaxbuffers.TrajectoryBuffer.can_sample`: whether `sample_sequences` returns only valid data."""
        return self.buffer.can_sample(batch_size, sequence_length, period=period, cross_episodes=cross_episodes)

    @_compiled.method("batch_size", "n_step", scalars=_GAMMA)
    def can_sample_transitions(self, batch_size: int, *, n_step: int = 1, gamma=None) -> jax.Array:
        """`jaxbuffers.TrajectoryBuffer.can_sample_transitions`: whether `sample_transitions` returns only valid data."""
        return self.buffer.can_sample_transitions(batch_size, n_step=n_step, gamma=gamma)

    @_common.checked_before_dispatch(add=True)
    @_compiled.method()
    def add(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> "CompressedTrajectoryBuffer":
        """`jaxbuffers.TrajectoryBuffer.add` (same arguments and errors): the newest frame of each compressed
        observation and, where `truncated & ~terminated`, of its `final_obs` go to the host in one ordered callback;
        with `frame_stack`, the stacks must be those the buffer rebuilds (`docs/api/compressed.md`, "Which stacks").
        Under `jit` the errors below come as the write callback's `jax.errors.JaxRuntimeError`.

        Raises:
          ValueError: with `frame_stack`, a stack that is not the one the buffer rebuilds (named by leaf, env and
            step), before anything is written.
          StaleBufferError: called eagerly on a state that is not the newest, before anything runs.
          RuntimeError: the buffer was closed.
        """
        new, (slots, valid, bases, datas), checks = self._add_device(step, terminated, truncated, final_obs)
        refuse = (checks, self._stack_refusal) if checks else None
        recent = self._recent_rows(valid.shape[0], truncated is not None)
        return new.replace(version=_common.write(self.host, self.version, slots, valid, datas, bases, refuse, recent))

    def add_from_host(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> "CompressedTrajectoryBuffer":
        """`add` with the host write as a direct Python call instead of a callback (same arguments, result and errors).

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
        version = self.host.write(np.asarray(self.version), slots, valid, *datas, bases=bases, recent=recent)
        return new.replace(version=jnp.asarray(version, jnp.int32))

    @_compiled.method()
    def _add_device(self, step, terminated, truncated, final_obs):
        """`add`'s device work: (state without the version bump, write parts, `_checked_stack_operands` or `()`)."""
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
        """The ids of an add of checked `[E, t]` inputs: (state without the version bump, (slots, valid, bases))."""
        key, n = self.trajectory.obs_key, len(self.leaves)
        c = self._chunk_frames(jnp, terminated, truncated, (self.frame_head, self.next_ep_pos, self.next_key_pos, self.final_head))
        finals = None if truncated is None else _common.replace_leaves(final_obs, self.leaf_index, [c.final_ids] * n)
        inner_step = {**step, key: _common.replace_leaves(step[key], self.leaf_index, [c.ids] * n)}
        inner = self.buffer.add_prepared(inner_step, terminated, truncated, finals)
        new = self.replace(buffer=inner, frame_head=c.frame_head, next_ep_pos=c.next_ep_pos, final_head=c.final_head,
                           next_key_pos=c.next_key_pos)
        return new, (c.slots, c.valid, c.bases)

    def _chunk_frames(self, xp, terminated, truncated, cursors) -> ChunkFrames:
        """`chunk_frames` with this buffer's sizes; `cursors`: (frame_head, next_ep_pos, next_key_pos, final_head)."""
        return chunk_frames(xp, terminated, truncated, *cursors, ring=self.frame_ring, frame_stack=self.frame_stack,
                            keyframe_interval=self.keyframe_interval, final_capacity=self.trajectory.final_obs_capacity)

    def add_frames_from_host(self, step, frames, terminated, truncated=None, final_obs=None, final_frames=None, *, donate: bool = False):
        """`add_from_host` of a chunk whose compressed leaves come as host frames (for `StagingWriter`): `step` /
        `final_obs` `[E, t, ...]` with int32 `[E, t, 3]` placeholders for the compressed leaves, `frames` /
        `final_frames` per compressed leaf `[E, t, *frame_shape]` (the newest frames); errors as `add_from_host` (and
        of `frames` / `final_frames`), before anything runs. With `donate` the new state reuses this state's device
        arrays (O(t) work instead of O(length)): it must not be used again."""
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
        terminated = np.asarray(terminated)
        truncated = None if truncated is None else np.asarray(truncated)
        rows = None if truncated is None else [np.asarray(f)[truncated & ~terminated] for f in final_frames]
        return self._add_checked_frames(step, frames, terminated, truncated, final_obs, rows, donate)[0]

    def _add_checked_frames(self, step, frames, terminated, truncated, final_obs, final_rows, donate: bool, cursors: tuple | None = None):
        """`add_frames_from_host` of checked arguments (numpy flags; `final_rows`: per leaf the frames where
        `truncated & ~terminated`), placed from `cursors` (`(version, frame_head, next_ep_pos, next_key_pos,
        final_head)` as the last call returned them, or None: read from the device). Returns (new state, cursors)."""
        made = _common.check_before_dispatch(self, add=True)
        if cursors is None or cursors[0] + 1 != made:
            cursors = tuple(jax.device_get((self.version, self.frame_head, self.next_ep_pos, self.next_key_pos, self.final_head)))
        version = int(cursors[0])
        c = self._chunk_frames(np, terminated, truncated, cursors[1:])  # read before a donation
        # the program gets copies: a CPU program may read a numpy argument in place after this returns
        own = lambda x: np.array(x) if isinstance(x, np.ndarray) else x  # noqa: E731
        new = (_add_at_donated if donate else _add_at)(self, np.int32(version + 1), *jax.tree.map(own, (step, terminated, truncated, final_obs)))
        e, t = terminated.shape
        datas = [np.reshape(f, (e * t, *i.frame_shape)) for f, i in zip(frames, self.leaves)]
        slots, bases = c.slots, c.bases
        if truncated is not None:  # the final frames read: the rows the store writes
            kept = c.valid[e * t:][(truncated & ~terminated).reshape(-1)]  # of final_rows: not overwritten in the chunk
            slots, bases = slots[c.valid], None if bases is None else bases[c.valid]
            datas = datas if len(slots) == e * t else [np.concatenate([d, np.asarray(r)[kept]]) for d, r in zip(datas, final_rows)]
        self.host.write(version, slots, np.ones(len(slots), bool), *datas, bases=bases)
        _common.remember_add(new, version + 1)
        return new, (version + 1, c.frame_head, c.next_ep_pos, c.next_key_pos, c.final_head)

    def truncate_last_from_host(self, truncated, final_obs, *, donate: bool = False) -> "CompressedTrajectoryBuffer":
        """`jaxbuffers.TrajectoryBuffer.truncate_last` (same arguments), the final frames written to the host store
        directly: as if each lane's newest step was added with `truncated=True` and this `final_obs`. With `donate`, as
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
        finals = [np.asarray(x) for x in _common.pick_leaves(final_obs, self.leaf_index)]
        frames = [np.asarray(_common.newest_frame(x, i, 1)) for x, i in zip(finals, self.leaves)]
        if self._stacked:
            befores, starts = self.lane_tails()
            error = self.final_error(befores, finals, np.asarray(truncated) & ~starts)
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
        """The device half of `truncate_last_from_host`: (state without the version bump, (store slots `[E]` of the
        final frames, which of them to write `[E]`))."""
        traj = self.trajectory
        e, ring = self.num_envs, self.frame_ring
        lanes, slot = jnp.arange(e, dtype=jnp.int32), (traj.head - 1) % traj.length
        boot = truncated & ~(traj.terminated[lanes, slot] | traj.truncated[lanes, slot]) & (traj.num_valid > 0)
        fslot, _, final_head = _ring.final_slots(self.final_head, boot[:, None], traj.final_obs_capacity)
        fstore = e * ring + lanes * traj.final_obs_capacity + fslot[:, 0]
        ep = _common.pick_leaves(traj.storage[traj.obs_key], self.leaf_index)[0][lanes, slot, 2]
        fids = jnp.stack([fstore, lanes * ring + (self.frame_head - 1) % ring, jnp.minimum(ep + 1, self.frame_stack - 1)], axis=-1).astype(jnp.int32)
        new = self.buffer.truncate_last(truncated, _common.replace_leaves(final_obs, self.leaf_index, [fids] * len(self.leaves)))
        zero = lambda x: jnp.where(boot, 0, x).astype(jnp.int32)  # noqa: E731 (the next step starts an episode, a keyframe)
        new = self.replace(buffer=new, final_head=final_head,
                           next_ep_pos=zero(self.next_ep_pos), next_key_pos=zero(self.next_key_pos))
        return new, (fstore, boot)

    def _frame_ids(self, ids: jax.Array):
        """ids `[*S, 3]` -> (store slots `[*S, k]` oldest to newest, zero-pad mask or None): `_common.stack_slots`."""
        return _common.stack_slots(ids, frame_stack=self.frame_stack, ring=self.frame_ring, num_lanes=self.num_envs,
                                   empty=self.host.num_slots - 1, stacked=self._stacked, padding=self.padding)

    @_common.checked_before_dispatch()
    def decode_obs(self, *obs: Any, rows: jax.Array | None = None) -> Any:
        """Replace the id leaves of stored observation pytrees by the decoded observations.

        Args:
          *obs: pytrees like the stored observation (a sample's `obs` before decoding, or a slice of
            `trajectory.storage[obs_key]`): each compressed leaf int32 `[*S, 3]` holding the same ids, the other
            leaves `[*S, ...]` of their stored dtypes; decoded in one host callback.
          rows: bool `[S0]` or None (every row); rows where it is False read nothing and decode as zeros.

        Returns:
          Each pytree with its compressed leaves `[*S, *shape]` (float32 with `normalize_images`); a tuple for
          several. Ids not made by this buffer decode as zeros, like a step never written.

        Raises:
          TypeError: no pytree, a structure other than the stored observation's, or another dtype (nothing is cast).
          ValueError: shapes other than `[*S, *stored shape]` with one `S`; concrete compressed leaves, different ids.
        """
        if not obs:
            raise TypeError("obs: expected at least one observation pytree (compressed leaves int32 [*S, 3])")
        spec = self.trajectory.step_spec[self.trajectory.obs_key]
        ids = [_common.only_rows(self._checked_ids(spec, o, "obs" if len(obs) == 1 else f"obs[{j}]"), rows)
               for j, o in enumerate(obs)]
        slots = [self._frame_ids(x) for x in ids]  # (store slots, zero-pad mask or None) per pytree
        decoded = _common.read(self.host, self.leaves, self.version, *(f for f, _ in slots))
        outs = []
        for j, (o, x, (_, pad)) in enumerate(zip(obs, ids, slots)):
            leaves = [_common.finish(d[j], i, x.ndim - 1, pad, self.normalize_images)
                      for d, i in zip(decoded, self.leaves)]
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
        """A sample of the inner buffer (`buf.buffer`, compressed leaves holding ids) with its observations decoded:
        `buf.decode(buf.buffer.sample_transitions(key, B, ...))` equals `buf.sample_transitions(key, B, ...)`.

        Args:
          sample: a `TransitionSample` or `SequenceSample` (prioritised variants for the prioritised buffer) of
            `self.buffer`, leading axis `B`.
          rows: bool `[B]` or None (every row); rows where it is False read nothing and decode as zeros.

        Raises:
          TypeError: another sample type; `rows` not a bool array. ValueError: `rows` not of shape `[B]`.
        """
        decoders = {TransitionSample: self._decode_transitions, PrioritisedTransitionSample: self._decode_transitions,
                    SequenceSample: self._decode_sequences, PrioritisedSequenceSample: self._decode_sequences}
        return _common.decode_sample(decoders, sample, rows, "buffer")

    @_common.checked_before_dispatch()
    @_compiled.method("sequence_length")
    def final_obs_at(self, indices, sequence_length: int) -> Any:
        """`jaxbuffers.TrajectoryBuffer.final_obs_at`, observations decoded (`[B, L, ...]`): the true final observation
        at every truncated (and not terminated) step of the sequences starting at `indices`, zeros elsewhere."""
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
    def sample_sequences(self, key: jax.Array, batch_size: int, sequence_length: int, *, period: int = 1,
                         cross_episodes: bool = True) -> SequenceSample:
        """`jaxbuffers.TrajectoryBuffer.sample_sequences`, observations decoded (`[B, L, ...]`)."""
        return self._decode_sequences(self.buffer.sample_sequences(key, batch_size, sequence_length, period=period, cross_episodes=cross_episodes))

    @_common.checked_before_dispatch()
    @_compiled.method("batch_size", "n_step", scalars=_GAMMA)
    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma) -> TransitionSample:
        """`jaxbuffers.TrajectoryBuffer.sample_transitions`, `obs` / `next_obs` decoded (`next_obs` after a truncation
        is the true final observation). A state older than the host store raises `StaleBufferError` (under `jit`, a
        `jax.errors.JaxRuntimeError` carrying it)."""
        return self._decode_transitions(self.buffer.sample_transitions(key, batch_size, n_step=n_step, gamma=gamma))


def _add_ids_at(buf, version, step, terminated, truncated, final_obs):
    """`_add_ids`' new state carrying `version`, the version its host write makes."""
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
        cls, example_step: Mapping, *, num_envs: int, length: int, window_length: int = 2, period: int = 1,
        priority_exponent: float = 0.6, epsilon: float = 1e-6, **options,
    ) -> "CompressedPrioritisedTrajectoryBuffer":
        """An empty prioritised compressed buffer.

        Args:
          example_step: as `CompressedTrajectoryBuffer.create`, like `num_envs` and `length`.
          window_length: as `jaxbuffers.PrioritisedTrajectoryBuffer.create`, like `period`, `priority_exponent` and
            `epsilon`.
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
    def can_sample_transitions(self, batch_size: int, *, n_step: int = 1, gamma=None, beta=1.0) -> jax.Array:  # type: ignore[override]
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
        self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma, beta=1.0
    ) -> PrioritisedTransitionSample:
        """`jaxbuffers.PrioritisedTrajectoryBuffer.sample_transitions`, `obs` / `next_obs` decoded."""
        return self._decode_transitions(self.buffer.sample_transitions(key, batch_size, n_step=n_step, gamma=gamma, beta=beta))

    priorities = _common.delegated("priorities")
    generations_at = _common.delegated("generations_at")

    @_compiled.method()
    def set_priorities(self, indices: jax.Array, priorities: jax.Array, generations: jax.Array) -> "CompressedPrioritisedTrajectoryBuffer":
        """`jaxbuffers.PrioritisedTrajectoryBuffer.set_priorities` (device only, no host work)."""
        return self.replace(buffer=self.buffer.set_priorities(indices, priorities, generations))
