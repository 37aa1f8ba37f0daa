"""Checkpoints written before the trajectory buffers kept lost final observations (`LOST_FIELDS`): read without
those fields, then given them as the adds would have kept them (`jaxbuffers.TrajectoryBuffer._with_lost_rebuilt`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxbuffers import _validate
from jaxbuffers.compressed import CompressedTrajectoryBuffer
from jaxbuffers.prioritised_trajectory import PrioritisedTrajectoryBuffer
from jaxbuffers.trajectory import TrajectoryBuffer

__all__ = ["LOST_FIELDS", "saved_without_lost", "trajectory_in", "with_lost_dropped", "with_lost_rebuilt"]


#: the trajectory buffers' fields that keep lost final observations; checkpoints written before them lack them
LOST_FIELDS = ("final_owner", "lost_prefix")


def trajectory_in(buffer: Any, fn: Callable[[TrajectoryBuffer], TrajectoryBuffer]) -> Any:
    """`buffer` with `fn` applied to the `TrajectoryBuffer` it is or wraps (uniform, prioritised or compressed);
    None when it holds none."""
    if isinstance(buffer, TrajectoryBuffer):
        return fn(buffer)
    if isinstance(buffer, (PrioritisedTrajectoryBuffer, CompressedTrajectoryBuffer)):
        inner = trajectory_in(buffer.buffer, fn)
        return None if inner is None else buffer.replace(buffer=inner)
    return None


def saved_without_lost(meta: dict, abstract: Any) -> Any:
    """`abstract` (a buffer to restore into, or its target) without `LOST_FIELDS` (None there) when the checkpoint
    `meta` describes a trajectory buffer saved before them, to be read as saved and rebuilt by `with_lost_rebuilt`;
    else `abstract`."""
    if any(str(leaf.get("path", "")).endswith("." + LOST_FIELDS[-1]) for leaf in meta.get("leaves", ())):
        return abstract
    bare = trajectory_in(abstract, lambda t: t.replace(**{f: None for f in LOST_FIELDS}))
    return abstract if bare is None else bare


def with_lost_rebuilt(traj: TrajectoryBuffer) -> TrajectoryBuffer:
    """A restored trajectory buffer with `LOST_FIELDS` computed from its flags (on every member of a stacked one),
    placed like its `final_head`: read without them (`saved_without_lost`), or with them as saved, which a
    checkpoint of an earlier development layout may hold with owners this version reads differently (an owner
    whose step was overwritten was kept, where this version keeps -1). The rebuilt fields equal what the adds keep.
    A stacked (sharded) buffer saved with the fields keeps them as saved."""
    lead, e = _validate.member_axes(traj), traj.num_envs
    if lead and traj.lost_prefix is not None:
        return traj
    k = traj.final_obs_capacity if traj.final_obs_capacity < traj.length else 0
    full = traj if traj.lost_prefix is not None else traj.replace(  # read as saved: placed like the rest
        final_owner=jnp.zeros((*lead, e, k), jnp.int32), lost_prefix=jnp.zeros((*lead, e), jnp.int32))
    rebuild = lambda t: (lambda r: (r.final_owner, r.lost_prefix))(t._with_lost_rebuilt())  # noqa: E731 (no copy of the rest)
    for _ in lead:
        rebuild = jax.vmap(rebuild)
    owner, lost = (jax.device_put(x, traj.final_head.sharding) for x in jax.jit(rebuild)(full))
    return traj.replace(final_owner=owner, lost_prefix=lost)


def with_lost_dropped(prio: PrioritisedTrajectoryBuffer) -> PrioritisedTrajectoryBuffer:
    """A prioritised trajectory buffer whose `lost_prefix` `with_lost_rebuilt` just computed, its tree (in this
    version's leaf order) with priority 0 at the windows starting in that prefix, as the adds keep it: the adds of the
    version that saved it gave them priorities (on every member of a stacked one)."""
    traj = prio.buffer
    if not traj._lossy:
        return prio
    zeroed = lambda p: p.replace(buffer=p.buffer.replace(lost_prefix=jnp.zeros_like(p.buffer.lost_prefix)))._drop_lost(p.tree, p.buffer, 0)  # noqa: E731
    for _ in _validate.member_axes(traj):
        zeroed = jax.vmap(zeroed)
    tree = jax.tree.map(lambda x, like: jax.device_put(x, like.sharding), jax.jit(zeroed)(prio), prio.tree)
    return prio.replace(tree=tree)
