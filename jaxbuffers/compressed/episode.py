"""Host-compressed whole episodes: `CompressedEpisodeBuffer`.

A `jaxbuffers.EpisodeBuffer` (slots, lengths, flags, meta fields, filters, every sampler: all of it reused) whose
chosen observation leaves (`compress=("pixels",)`) live compressed in host `host_codecs.CompressedStore`s, reached
from jitted code through the callbacks of `jaxbuffers.compressed._host` (exactly-once ordered writes, versioned
reads, stale states refused, checksummed entries; not vmappable). Called eagerly, each method runs as one cached
compiled program, callbacks included.

Store layout. One entry per step: step `t` of the episode in slot `e` is store slot `e * max_timesteps + t`, and
the episode's final observation is slot `max_episodes * max_timesteps + e`; the last slot is never written (it
decodes as zeros). An episode slot is thus a ring of `max_timesteps` frames, and a stored position needs no id on
device: the slot, the step and the episode's length give it. The device buffer keeps an empty placeholder
(`uint8[0]`) per step for each compressed leaf.

Frame-stack dedup (`frame_stack=k`), as in `jaxbuffers.compressed.CompressedTrajectoryBuffer`: when a compressed
leaf is a stack of the last `k` frames (`stack_axis` is its `k` axis), only the newest frame of each step is stored,
and stacks are rebuilt at sample time from the frames of the same episode (`jaxbuffers.compressed._common.stack_slots`):
frames before the episode's first step are padding, `"reset"` repeating its first frame (Gymnasium's
`FrameStackObservation`), `"zero"` giving zeros. The final observation stores its newest frame too, stacked on the
episode's last frames. This is exact when the observations given are what such a frame stacker produced from the
episode's start, and any other stack is refused (`jaxbuffers._validate.unrebuilt_stacks`: a stack that is not the
previous step's shifted by one frame, e.g. after a reset mid-episode, one padded otherwise at the episode's start, a
final observation not stacked on the last steps), so what is stored always comes back as given; store such
observations with `frame_stack=None`. `split_long=True` is refused with `frame_stack` (a later part's first stacks
reach into the part before it).

Temporal coding (`keyframe_interval=K`, default and meaning as `jaxbuffers.compressed.CompressedTrajectoryBuffer`'s):
step `t` of an episode is stored as the bytewise XOR with step `t - 1` of the same episode (a delta, through
`host_codecs.CompressedStore.put`'s `bases`), except keyframes, stored whole: steps `t` with `t % K == 0`, so every
episode (and every part of a `split_long` episode) starts with one. Final observations are keyframes. An episode's
frames are written in one put, so a chain never crosses an episode: when a slot is given a new, shorter episode,
the old episode's deltas past the new length whose chains reach a rewritten step are deleted with it (the store keeps
no delta without its base; no stored step reads them). Decoding step `t` decodes at most `K - 1` frames before it. `K = 1` stores every frame whole.

With the same adds and keys, every sampler returns exactly what an `EpisodeBuffer` holding the uncompressed
observations returns (float32 `x / 255` for compressed leaves with `normalize_images`).

Example:

```python
import jax, jax.numpy as jnp
from jaxbuffers.compressed import CompressedEpisodeBuffer

step = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
buf = CompressedEpisodeBuffer.create(step, max_episodes=100, max_timesteps=1000, frame_stack=4)
episode = jax.tree.map(lambda x: jnp.stack([x] * 50), step)                # 50 steps, leaves [50, ...]
buf = buf.add_episode(episode, 50, terminated=True, final_obs=step["obs"])
tr = buf.sample_transitions(jax.random.key(0), 32, n_step=3, gamma=0.99)   # tr.obs: uint8[32, 4, 84, 84]
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuffers import _compiled, _validate
from jaxbuffers._metrics import Recorded
from jaxbuffers.compressed import _common
from jaxbuffers.compressed._host import DEFAULT_DELTA_CODEC, FrameStacked, HostStores, keyframe_interval_of
from jaxbuffers.compressed.trajectory import DEFAULT_CODEC
from jaxbuffers.episode import EpisodeBuffer, _is_traced
from jaxbuffers.episode_sampling import (
    GAMMA, EpisodeSample, EpisodeSequenceSample, EpisodeStepSample, EpisodeTransitionSample, positions,
)

__all__ = ["CompressedEpisodeBuffer"]

_PLACEHOLDER = jax.ShapeDtypeStruct((0,), jnp.uint8)


@_common.delegates("max_timesteps", "obs_key", "action_key", "reward_key", "meta_spec", "overflowed", "lengths", "meta",
                   "meta_defaults", "circular", "num_valid", "head", "added", "terminated", "truncated", "metrics")
@_validate.one_member_methods(mapped=False)
class CompressedEpisodeBuffer(FrameStacked, Recorded):
    """A `jaxbuffers.EpisodeBuffer` whose chosen observation leaves live compressed on the host.

    Same methods, arguments, sample types and errors as `EpisodeBuffer` (module doc: store layout, frame dedup);
    `update` refuses the observation field. Jittable, `lax.scan`-able, donatable; not vmappable (one host store).
    """

    _metrics_in = "buffer"  # record / stats: the metrics of the wrapped buffer

    buffer: EpisodeBuffer  # compressed leaves hold uint8[0] placeholders
    version: jax.Array  # shape=(), dtype=int32: host-store writes included in this state
    # static: host, leaves, leaf_index, normalize_images, frame_stack, padding (FrameStacked), and
    keyframe_interval: int = struct.field(pytree_node=False)  # K: a keyframe at step 0 of every episode and every K steps

    @classmethod
    @_validate.keyword_sizes
    def create(
        cls, example_step: Mapping, *, max_episodes: int, max_timesteps: int, meta: Mapping | None = None,
        circular: bool = True, compress: Sequence[str] | None = None, frame_stack: int | None = None,
        stack_axis: int = 0, padding: str = "reset", codec: str = DEFAULT_CODEC, normalize_images: bool = False,
        obs_key: str = "obs", action_key: str = "action", reward_key: str = "reward", chunk_bytes: int = 64 << 20,
        dictionary_bytes: int | None = None, keyframe_interval: int | None = None,
        delta_codec: str | None = DEFAULT_DELTA_CODEC, metrics: bool = True,
    ) -> "CompressedEpisodeBuffer":
        """An empty compressed buffer of `max_episodes` episodes of up to `max_timesteps` steps.

        Args:
          example_step: as `jaxbuffers.EpisodeBuffer.create`, like `max_episodes`, `max_timesteps`, `meta`,
            `circular`, `obs_key`, `action_key`, `reward_key` and `metrics` (per-episode sample counts, kept in the
            device buffer).
          compress: the leaves inside the observation to store on the host, and their dtypes, as
            `jaxbuffers.compressed.CompressedTrajectoryBuffer.create` (e.g. `("pixels",)`); `None`: all of it.
          frame_stack: `k` when the compressed leaves are stacks of the last `k` frames (module doc); `None`: store
            each observation whole.
          stack_axis: axis of the `k` frames within one observation.
          padding: `"reset"` (repeat the episode's first frame) or `"zero"`.
          codec: host codec, as `jaxbuffers.compressed.CompressedTrajectoryBuffer.create`.
          normalize_images: sampled compressed leaves come back float32 `x / 255` (uint8 only).
          chunk_bytes: largest host arena chunk.
          dictionary_bytes: as `jaxbuffers.compressed.CompressedTrajectoryBuffer.create`.
          keyframe_interval: `K` of the temporal coding (module doc): a positive int, 1 for none. Default:
            `jaxbuffers.compressed.DEFAULT_KEYFRAME_INTERVAL`, or 1 with `codec="none"` (as
            `jaxbuffers.compressed.CompressedTrajectoryBuffer.create`).
          delta_codec: codec of the delta frames, as `jaxbuffers.compressed.CompressedTrajectoryBuffer.create`.

        Raises:
          TypeError / ValueError: as `jaxbuffers.EpisodeBuffer.create` and
            `jaxbuffers.compressed.CompressedTrajectoryBuffer.create` (compressed leaves, frames, codec,
            `keyframe_interval`).
        """
        spec, idx, infos, k = _common.obs_leaves(example_step, obs_key, compress, frame_stack, stack_axis, padding, normalize_images)
        key, delta_codec = keyframe_interval_of(keyframe_interval, codec, delta_codec)
        inner_step = {**spec, obs_key: _common.replace_leaves(spec[obs_key], idx, [_PLACEHOLDER] * len(idx))}
        inner = EpisodeBuffer.create(
            inner_step, max_episodes=max_episodes, max_timesteps=max_timesteps, meta=meta, circular=circular,
            obs_key=obs_key, action_key=action_key, reward_key=reward_key, metrics=metrics,
        )
        e, m = inner.max_episodes, inner.max_timesteps
        host = HostStores(
            e * m + e + 1, codec, [i.frame_shape for i in infos], [i.dtype for i in infos], [i.name for i in infos],
            chunk_bytes=chunk_bytes, dictionary_bytes=dictionary_bytes, delta_codec=delta_codec,
        )
        return cls(buffer=inner, version=jnp.int32(0), host=host, leaves=tuple(infos), leaf_index=tuple(idx),
                   frame_stack=k, padding=padding, normalize_images=bool(normalize_images), keyframe_interval=key)

    # ------------------------------------------------------------------------------------------
    # the EpisodeBuffer's configuration and state

    @property
    def max_episodes(self) -> int:
        """Episode slots (static int): the inner buffer's."""
        return self.buffer.max_episodes

    @property
    def step_spec(self) -> dict:
        """Dict of `jax.ShapeDtypeStruct`: one step as the user sees it."""
        spec = dict(self.buffer.step_spec)
        specs = [jax.ShapeDtypeStruct(i.shape, i.dtype) for i in self.leaves]
        spec[self.obs_key] = _common.replace_leaves(spec[self.obs_key], self.leaf_index, specs)
        return spec

    def uncompressed_nbytes(self) -> int:
        """Bytes an `EpisodeBuffer` with the same configuration would hold (shapes only)."""
        b = self.buffer
        create = lambda: EpisodeBuffer.create(  # noqa: E731
            self.step_spec, max_episodes=b.max_episodes, max_timesteps=b.max_timesteps, meta=b.meta_spec,
            circular=b.circular, obs_key=b.obs_key, action_key=b.action_key, reward_key=b.reward_key,
        )
        return _validate.tree_nbytes(jax.eval_shape(create))

    def num_episodes(self) -> jax.Array:
        """`jaxbuffers.EpisodeBuffer.num_episodes`."""
        return self.buffer.num_episodes()

    def num_added(self) -> int:
        """`jaxbuffers.EpisodeBuffer.num_added`."""
        return self.buffer.num_added()

    def can_sample(self, batch_size: int, *, where=None) -> jax.Array:
        """`jaxbuffers.EpisodeBuffer.can_sample`."""
        return self.buffer.can_sample(batch_size, where=where)

    def can_sample_sequences(self, batch_size: int, sequence_length: int, *, where=None) -> jax.Array:
        """`jaxbuffers.EpisodeBuffer.can_sample_sequences`."""
        return self.buffer.can_sample_sequences(batch_size, sequence_length, where=where)

    def can_sample_transitions(self, batch_size: int, *, n_step: int = 1, gamma=None, where=None) -> jax.Array:
        """`jaxbuffers.EpisodeBuffer.can_sample_transitions`."""
        return self.buffer.can_sample_transitions(batch_size, n_step=n_step, gamma=gamma, where=where)

    # ------------------------------------------------------------------------------------------
    # adding

    @_common.checked_before_dispatch(add=True)
    def add_episode(
        self, episode: Mapping, length, *, terminated, truncated=False, final_obs, meta: Mapping | None = None,
        split_long: bool = False,
    ) -> "CompressedEpisodeBuffer":
        """`jaxbuffers.EpisodeBuffer.add_episode` (same arguments and errors); the newest frame of every step and of
        the final observation go to the host in one ordered callback.

        Raises:
          ValueError: also `split_long=True` with `frame_stack` (module doc); with `frame_stack`, a stack the store
            cannot rebuild from each step's newest frame (module doc), naming the leaf, the episode and the step, before
            anything runs (under `jit` the write callback refuses it before writing: `jax.errors.JaxRuntimeError`).
          BufferFullError: an eager add to a full fixed buffer, refused before anything runs (host included).
          StaleBufferError: called eagerly on a state that is not the newest, before anything runs (under `jit`
            the write callback refuses it: `jax.errors.JaxRuntimeError`).
        """
        args = self.buffer._checked_add(self.step_spec, False, episode, length, terminated, truncated, final_obs, meta)
        return self._add_checked(args, split_long, False)

    @_common.checked_before_dispatch(add=True)
    def add_episodes(
        self, episodes: Mapping, lengths, *, terminated, truncated=None, final_obs, meta: Mapping | None = None,
        split_long: bool = False,
    ) -> "CompressedEpisodeBuffer":
        """`jaxbuffers.EpisodeBuffer.add_episodes` (same arguments and errors, and those of `add_episode`)."""
        args = self.buffer._checked_add(self.step_spec, True, episodes, lengths, terminated, truncated, final_obs, meta)
        return self._add_checked(args, split_long, True)

    def _add_checked(self, args: tuple, split_long, batched: bool) -> "CompressedEpisodeBuffer":
        split_long = self.buffer._check_time(args[0], split_long, batched)
        if split_long and self.frame_stack > 1:
            raise ValueError(
                f"split_long: not with frame_stack={self.frame_stack} (a later part's first stacks would reach into the "
                f"part before it); create the buffer with max_timesteps >= the episode's length"
            )
        inner, traced = self.buffer, _is_traced((self, args))
        if not inner.circular and not traced:  # refused before the host write runs
            m = inner.max_timesteps
            parts = int(np.sum(-(-np.asarray(args[1]) // m)))
            if int(inner.num_valid) + parts > inner.max_episodes:
                raise inner._full_error(batched)
        if self._stacked and not traced:  # stacks the store cannot rebuild: refused before anything runs
            error = self._stack_error(np.asarray(self._unrebuilt(args[0], args[1], args[4], batched)), batched)
            if error is not None:
                raise error
        return self._write(*args, batched, not traced)

    @property
    def _stacked(self) -> bool:
        """Whether the compressed leaves are frame stacks (the store keeps each step's newest frame only)."""
        return self.leaves[0].stack_axis is not None

    @_compiled.method("batched")
    def _unrebuilt(self, episodes, lengths, final_obs, batched: bool) -> jax.Array:
        """bool `[leaves, B, T + 1]`: `jaxbuffers._validate.unrebuilt_stacks` of every compressed leaf."""
        lift = (lambda x: x) if batched else (lambda x: x[None])  # noqa: E731
        stacks, finals = _common.pick_leaves(episodes[self.obs_key], self.leaf_index), _common.pick_leaves(final_obs, self.leaf_index)
        lengths = lift(jnp.asarray(lengths, jnp.int32))
        return jnp.stack([_validate.unrebuilt_stacks(lift(jnp.asarray(x)), lift(jnp.asarray(f)), lengths, stack_axis=i.stack_axis, padding=self.padding)
                          for x, f, i in zip(stacks, finals, self.leaves)])

    def _stack_error(self, bad: np.ndarray, batched: bool) -> ValueError | None:
        """`jaxbuffers._validate.unrebuilt_stack_error` of `_unrebuilt`'s result, naming the leaves as the add's arguments."""
        obs = f"[{self.obs_key!r}]"
        names = [(f"{'episodes' if batched else 'episode'}{obs}{i.name[len('example_step' + obs):]}", f"final_obs{i.name[len('example_step' + obs):]}")
                 for i in self.leaves]
        return _validate.unrebuilt_stack_error(bad, names, batched)

    @_compiled.method("batched", "checked")
    def _write(self, episodes, lengths, terminated, truncated, final_obs, meta, batched: bool, checked: bool) -> "CompressedEpisodeBuffer":
        """The inner buffer's rows of the episodes with their compressed leaves' newest frames, the frames taken
        out (placeholders stored instead) and written to the host at the slots the rows went to (steps off a
        keyframe as deltas against the step before them, module doc). Unless `checked` (eagerly, before the call),
        the write callback refuses stacks the store cannot rebuild before it writes anything."""
        refuse = None
        if self._stacked and not checked:
            refuse = (self._unrebuilt(episodes, lengths, final_obs, batched), lambda bad: self._stack_error(bad, batched))
        inner, idx, key = self.buffer, self.leaf_index, self.obs_key
        lead = 2 if batched else 1
        frames = lambda obs, n: _common.replace_leaves(  # noqa: E731
            obs, idx, [_common.newest_frame(jnp.asarray(x), i, n) for x, i in zip(_common.pick_leaves(obs, idx), self.leaves)])
        episodes = {**episodes, key: frames(episodes[key], lead)}
        rows = inner._rows(episodes, lengths, terminated, truncated, frames(final_obs, lead - 1), meta, batched)
        steps, finals = _common.pick_leaves(rows["storage"][key], idx), _common.pick_leaves(rows["final_obs"], idx)
        r, m, e = rows["lengths"].shape[0], inner.max_timesteps, inner.max_episodes
        rows["storage"] = {**rows["storage"], key: _common.replace_leaves(rows["storage"][key], idx, [jnp.zeros((r, m, 0), jnp.uint8)] * len(idx))}
        rows["final_obs"] = _common.replace_leaves(rows["final_obs"], idx, [jnp.zeros((r, 0), jnp.uint8)] * len(idx))
        new, _, slot = inner._put(rows)
        kept = slot < e
        t = jnp.arange(m, dtype=jnp.int32)
        slots = jnp.concatenate([(slot[:, None] * m + t).reshape(-1), e * m + slot])
        valid = jnp.concatenate([(kept[:, None] & (t < rows["lengths"][:, None])).reshape(-1), kept])
        datas = [jnp.concatenate([s.reshape(r * m, *i.frame_shape), f]) for s, f, i in zip(steps, finals, self.leaves)]
        bases = None
        if self.keyframe_interval > 1:  # step t's base: step t - 1 of its slot; keyframes (and finals) -1
            delta = jnp.broadcast_to(t % self.keyframe_interval != 0, (r, m))
            bases = jnp.concatenate([jnp.where(delta, slot[:, None] * m + t - 1, -1).reshape(-1), jnp.full((r,), -1, jnp.int32)])
        return self.replace(buffer=new, version=_common.write(self.host, self.version, slots, valid, datas, bases, refuse))

    # ------------------------------------------------------------------------------------------
    # in-place edits

    @_compiled.method()
    def update(self, indices, fields: Mapping, *, steps=None, generations=None) -> "CompressedEpisodeBuffer":
        """`jaxbuffers.EpisodeBuffer.update` of fields other than the observation (device only, no host work).

        Raises:
          TypeError: as `EpisodeBuffer.update`; the observation field given (its pixels are on the host; keep
            fields to relabel, such as goals, in a step field of their own or a meta field).
        """
        if isinstance(fields, Mapping) and self.obs_key in fields:
            raise TypeError(
                f"fields: {self.obs_key!r} holds host-compressed leaves and cannot be updated; keep the fields to relabel "
                f"(e.g. goals) in a step field of their own or a meta field"
            )
        return self.replace(buffer=self.buffer.update(indices, fields, steps=steps, generations=generations))

    # ------------------------------------------------------------------------------------------
    # reads: the inner sample, then every observation decoded in one host callback

    def _decode(self, *reads, rows=None) -> list:
        """Decode observations at positions: each read is `(obs, ep, t, final)` with `obs` a stored observation pytree
        (placeholder leaves, leading axes `S`), `ep` / `t` int `[*S]` its episode slot and step. Step `t` of a
        stored episode of length `n` is its stored frame for `t < n`; the final observation when `final` and
        `t >= n` (as `EpisodeBuffer`'s next observations); zeros otherwise (as the zeros past a length), and zeros
        at every position of an empty row (`ep` -1, the samplers' rows when nothing passes). `rows`: bool `[B]` (B the
        first axis of every `S`) or None; rows where it is False read nothing and decode as zeros."""
        inner, m, e = self.buffer, self.buffer.max_timesteps, self.buffer.max_episodes
        fids, pads = [], []
        for _, ep, t, final in reads:
            ep, t = jnp.broadcast_arrays(jnp.asarray(ep, jnp.int32), jnp.asarray(t, jnp.int32))
            row = ep >= 0
            ep = jnp.maximum(ep, 0)
            n = inner.lengths[ep]
            newest = jnp.where(t < n, ep * m + jnp.minimum(t, m - 1), e * m + ep if final else -1)
            newest = jnp.where(row & ((t < n) | final), newest, -1)  # -1: the never-written slot, zeros
            if rows is not None:
                newest = jnp.where(rows.reshape(rows.shape + (1,) * (newest.ndim - 1)), newest, -1)
            ids = jnp.stack([newest, ep * m + jnp.clip(jnp.minimum(t, n) - 1, 0, m - 1), jnp.minimum(jnp.minimum(t, n), self.frame_stack - 1)], axis=-1)
            f, p = _common.stack_slots(ids, frame_stack=self.frame_stack, ring=m, num_lanes=e, empty=self.host.num_slots - 1,
                                       stacked=self.leaves[0].stack_axis is not None, padding=self.padding)
            fids.append(f)
            pads.append(p)
        decoded = _common.read(self.host, self.leaves, self.version, *fids)
        return [
            _common.replace_leaves(obs, self.leaf_index, [
                _common.finish(decoded[i][j], info, jnp.ndim(t), pads[j], self.normalize_images) for i, info in enumerate(self.leaves)])
            for j, (obs, _, t, _) in enumerate(reads)
        ]

    def _episodes(self, s: EpisodeSample, rows=None) -> EpisodeSample:
        t = jnp.arange(self.max_timesteps, dtype=jnp.int32)[None, :]
        held = jnp.where(s.mask, t, self.max_timesteps)  # steps past a length (or of a slot not held) read zeros
        obs, final = self._decode((s.item[self.obs_key], s.indices[:, None], held, False), (s.final_obs, s.indices, s.lengths, True), rows=rows)
        return s._replace(item={**s.item, self.obs_key: obs}, final_obs=final)

    @_common.checked_before_dispatch()
    def sample_episodes(self, key: jax.Array, batch_size: int, *, where=None) -> EpisodeSample:
        """`jaxbuffers.EpisodeBuffer.sample_episodes`, observations decoded."""
        return self._sample_episodes(_validate.key("key", key), _validate.static_int("batch_size", batch_size), self.buffer._filter(where))

    @_compiled.method("batch_size")
    def _sample_episodes(self, key, batch_size: int, mask) -> EpisodeSample:
        return self._episodes(self.buffer._sample_episodes(key, batch_size, mask))

    @_common.checked_before_dispatch()
    @_compiled.method()
    def get_all(self) -> EpisodeSample:
        """`jaxbuffers.EpisodeBuffer.get_all`, observations decoded (zeros in the slots not holding an episode)."""
        return self._episodes(self.buffer.get_all())  # a slot not held has length 0 and an all-False mask

    @_common.checked_before_dispatch()
    def sample_sequences(self, key: jax.Array, batch_size: int, sequence_length: int, *, where=None) -> EpisodeSequenceSample:
        """`jaxbuffers.EpisodeBuffer.sample_sequences`, observations decoded."""
        batch_size = _validate.static_int("batch_size", batch_size)
        return self._sample_sequences(_validate.key("key", key), batch_size, self.buffer._sequence_length(sequence_length), self.buffer._filter(where))

    @_compiled.method("batch_size", "sequence_length")
    def _sample_sequences(self, key, batch_size: int, sequence_length: int, mask) -> EpisodeSequenceSample:
        return self._sequences(self.buffer._sample_sequences(key, batch_size, sequence_length, mask))

    def _sequences(self, s: EpisodeSequenceSample, rows=None) -> EpisodeSequenceSample:
        length = s.terminated.shape[1]
        t = s.starts[:, None] + jnp.arange(length, dtype=jnp.int32)
        obs, nxt = self._decode((s.item[self.obs_key], s.indices[:, None], t, False), (s.next_obs, s.indices, s.starts + length, True), rows=rows)
        return s._replace(item={**s.item, self.obs_key: obs}, next_obs=nxt)

    @_common.checked_before_dispatch()
    def sample_timesteps(self, key: jax.Array, batch_size: int, *, where=None) -> EpisodeStepSample:
        """`jaxbuffers.EpisodeBuffer.sample_timesteps`, observations decoded."""
        return self._sample_timesteps(_validate.key("key", key), _validate.static_int("batch_size", batch_size), self.buffer._filter(where))

    @_compiled.method("batch_size")
    def _sample_timesteps(self, key, batch_size: int, mask) -> EpisodeStepSample:
        return self._steps(self.buffer._sample_timesteps(key, batch_size, mask))

    def _steps(self, s: EpisodeStepSample, rows=None) -> EpisodeStepSample:
        obs, nxt = self._decode((s.item[self.obs_key], s.indices, s.steps, False), (s.next_obs, s.indices, s.steps + 1, True), rows=rows)
        return s._replace(item={**s.item, self.obs_key: obs}, next_obs=nxt)

    @_common.checked_before_dispatch()
    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma, where=None) -> EpisodeTransitionSample:
        """`jaxbuffers.EpisodeBuffer.sample_transitions`, observations (`obs`, `next_obs`, the window's) decoded in
        one host callback."""
        batch_size = _validate.static_int("batch_size", batch_size)
        n_step = self.buffer._transition_args(n_step, gamma)
        return self._sample_transitions(_validate.key("key", key), batch_size, n_step, gamma, self.buffer._filter(where))

    @_compiled.method("batch_size", "n_step", scalars=GAMMA)
    def _sample_transitions(self, key, batch_size: int, n_step: int, gamma, mask) -> EpisodeTransitionSample:
        return self._decode_transitions(self.buffer._sample_transitions(key, batch_size, n_step, gamma, mask))

    @_common.checked_before_dispatch()
    def transitions_at(self, indices, steps, *, n_step: int = 1, gamma) -> EpisodeTransitionSample:
        """`jaxbuffers.EpisodeBuffer.transitions_at`, observations decoded."""
        n_step = self.buffer._transition_args(n_step, gamma)
        return self._transitions_at(*positions(indices, steps), n_step, gamma)

    @_compiled.method("n_step", scalars=GAMMA)
    def _transitions_at(self, ep, t, n_step: int, gamma) -> EpisodeTransitionSample:
        return self._decode_transitions(self.buffer._transitions_at(ep, t, n_step, gamma))

    def _decode_transitions(self, s: EpisodeTransitionSample, rows=None) -> EpisodeTransitionSample:
        n = s.window_mask.shape[1]
        tw = s.steps[:, None] + jnp.arange(n, dtype=jnp.int32)
        key = self.obs_key
        obs, nxt, win = self._decode(
            (s.obs, s.indices, s.steps, False), (s.next_obs, s.indices, s.steps + s.num_steps, True),
            (s.window[key], s.indices[:, None], tw, False), rows=rows,
        )
        return s._replace(obs=obs, next_obs=nxt, item={**s.item, key: obs}, window={**s.window, key: win})

    @_common.checked_before_dispatch()
    @_compiled.method()
    def decode(self, sample, *, rows=None):
        """The observations of a sample of the inner buffer (`buf.buffer`, whose compressed leaves are placeholders)
        decoded as this buffer's sampler of that kind returns them: `buf.decode(buf.buffer.sample_timesteps(key, B))`
        equals `buf.sample_timesteps(key, B)`, and likewise for episodes (`get_all` too), sequences and transitions.

        Args:
          sample: an `EpisodeSample`, `EpisodeSequenceSample`, `EpisodeStepSample` or `EpisodeTransitionSample` of
            `self.buffer` (leading axis `B`).
          rows: bool `[B]` or None (every row). Rows where it is False read nothing from the host and their
            compressed leaves decode as zeros: samples of several buffers merged row by row
            (`jaxbuffers.disk.ConcatenatedEpisodes`) read each row once.

        Returns:
          `sample` with its compressed observation leaves (`obs`, `next_obs`, `final_obs`, the window's) decoded.

        Raises:
          TypeError: another sample type; `rows` not a bool array. ValueError: `rows` not of shape `[B]`.
        """
        decoders = {EpisodeSample: self._episodes, EpisodeSequenceSample: self._sequences, EpisodeStepSample: self._steps,
                    EpisodeTransitionSample: self._decode_transitions}
        return _common.decode_sample(decoders, sample, rows, "EpisodeBuffer")
