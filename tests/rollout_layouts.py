"""Compressed rollouts of the layout before the empty slot, written through this version's own save paths."""

from __future__ import annotations

import jax.numpy as jnp

from jaxbuffers.compressed._common import pick_leaves, replace_leaves
from jaxbuffers.compressed._host import HostStores, ShardedHostStores


def before_empty_slot(buf):
    """A fresh `CompressedRolloutBuffer` (or stacked shards of one) as that layout created it: host stores of
    `num_steps * num_envs * k` slots (no empty last slot), every step at slot 0. Its adds, saves and flushes then
    write that layout's checkpoints and folders through this version's own save path (the checkpoint's buffer.json
    is the one that layout's own code writes for the same adds)."""
    def old(h):
        cfg = h.stores[0].config()
        return HostStores(h.num_slots - 1, h.codec, [i.frame_shape for i in buf.leaves], [i.dtype for i in buf.leaves],
                          h.names, chunk_bytes=cfg["chunk_bytes"], dictionary_bytes=cfg["dictionary_bytes"])

    host = ShardedHostStores([old(h) for h in buf.host.shards], buf.host.axis) if isinstance(buf.host, ShardedHostStores) else old(buf.host)
    step = buf.buffer.step
    zeros = [jnp.zeros_like(x) for x in pick_leaves(step, buf.leaf_index)]
    return buf.replace(buffer=buf.buffer.replace(step=replace_leaves(step, buf.leaf_index, zeros)), host=host)


def unwritten_zeroed(mb, buf):
    """`mb` (an old-layout minibatch) as this layout decodes it: steps in rows never written are zeros."""
    never = (mb.index // buf.num_envs) >= int(buf.buffer.step_index)
    obs = jnp.where(never.reshape(never.shape + (1,) * (mb.step["obs"].ndim - never.ndim)), 0, mb.step["obs"])
    return mb._replace(step={**mb.step, "obs": obs})
