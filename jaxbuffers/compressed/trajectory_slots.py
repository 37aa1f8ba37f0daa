"""Where a chunk added to a `jaxbuffers.compressed.CompressedTrajectoryBuffer` puts its frames: `chunk_frames`, over
`jax.numpy` in the add's program or `numpy` on the host (a `StagingWriter` flush), the same int32 integers either way
(`docs/api/compressed.md`, "Frame stacks and temporal coding").
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _ring

__all__ = ["ChunkFrames", "chunk_frames"]


class ChunkFrames(NamedTuple):
    """A chunk's frame placement (``E`` lanes, ``t`` steps; arrays of the namespace computed with)."""

    ids: Any  # shape=[E, t, 3], dtype=int32: (newest, prev, ep_pos) per step
    final_ids: Any  # shape=[E, t, 3], dtype=int32, or None without truncated: ids of the final observations
    slots: Any  # shape=[M], dtype=int32: store slots of the rows to write (E*t frames, then E*t final frames)
    valid: Any  # shape=[M], dtype=bool: rows written (final frames only where truncated, not terminated and kept)
    bases: Any  # shape=[M], dtype=int32, or None for keyframe_interval 1: delta base slot per row, -1 whole
    frame_head: Any  # shape=(), dtype=int32: the cursors after the chunk
    next_ep_pos: Any  # shape=[E], dtype=int32
    next_key_pos: Any  # shape=[E], dtype=int32
    final_head: Any  # shape=[E], dtype=int32


def chunk_frames(xp, terminated, truncated, frame_head, next_ep_pos, next_key_pos, final_head, *, ring: int,
                 frame_stack: int, keyframe_interval: int, final_capacity: int) -> ChunkFrames:
    """Frame placement of a checked chunk: `terminated` / `truncated` (None: not given) bool `[E, t]`, the state's
    cursors before it, its static sizes. Lane `e`'s frames go to store slots `e * ring + pos` in order, each a
    keyframe (base -1) at an episode start and every `keyframe_interval` frames after it, else a delta against the
    frame one step back; final frames (keyframes) follow at `E * ring + e * final_capacity + j`.
    """
    e, t = terminated.shape
    k, kk, i32 = frame_stack, keyframe_interval, xp.int32
    j = xp.arange(t, dtype=i32)
    lane = xp.arange(e, dtype=i32)[:, None]
    pos = (frame_head + j) % ring  # [t]
    newest = lane * ring + pos[None, :]  # [E, t] store slots of this chunk's frames
    prev = lane * ring + ((pos - 1) % ring)[None, :]
    ends = terminated if truncated is None else terminated | truncated
    # step j starts an episode iff step j - 1 ended one (j = 0: the previous chunk's, carried in next_ep_pos)
    marks = xp.where(ends, j[None, :], -1)
    last_end = jax.lax.cummax(marks, axis=1) if xp is jnp else np.maximum.accumulate(marks, axis=1)
    before = xp.concatenate([xp.full((e, 1), -1, i32), last_end[:, :-1]], axis=1)
    since = j[None, :] - before - 1
    ep = xp.minimum(xp.where(before >= 0, since, next_ep_pos[:, None] + j[None, :]), k - 1).astype(i32)
    next_ep = xp.where(ends[:, -1], 0, xp.minimum(ep[:, -1] + 1, k - 1)).astype(i32)
    kpos = xp.where(before >= 0, since % kk, (next_key_pos[:, None] + j[None, :]) % kk)
    next_key = xp.where(ends[:, -1], 0, (kpos[:, -1] + 1) % kk).astype(i32)
    bases = xp.where(kpos == 0, -1, prev).reshape(-1).astype(i32)
    ids = xp.stack([newest, prev, ep], axis=-1).astype(i32)
    slots, valid, final_ids = newest.reshape(-1), xp.ones((e * t,), bool), None
    if truncated is not None:
        boot = truncated & ~terminated
        fslot, keep, final_head = _ring.final_slots(final_head, boot, final_capacity, xp)
        fstore = e * ring + lane * final_capacity + fslot  # [E, t]
        final_ids = xp.stack([fstore, newest, xp.minimum(ep + 1, k - 1)], axis=-1).astype(i32)
        slots = xp.concatenate([slots, fstore.reshape(-1)])
        valid = xp.concatenate([valid, keep.reshape(-1)])  # a final frame overwritten within the chunk is not written
        bases = xp.concatenate([bases, xp.full((e * t,), -1, i32)])
    return ChunkFrames(ids, final_ids, slots.astype(i32), valid, None if kk == 1 else bases,
                       ((frame_head + t) % ring).astype(i32), next_ep, next_key, final_head)
