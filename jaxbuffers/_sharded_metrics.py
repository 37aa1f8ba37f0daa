"""Usage metrics of a sharded buffer: `ShardedRecorded`, the `record` and `stats` of `jaxbuffers.ShardedBuffer`.

Each shard keeps its own `jaxbuffers._metrics.Metrics` (a leaf of the stacked shards, `[S, ...]`), so recording moves
no storage and reads no other shard:

* **Global sample** (`ShardedBuffer.sample`, a `ShardedSample`, replicated): every shard counts the entries `j` with
  `shard[j] == s`, at its own positions `sample.indices[j]` (with `generations[j]` for prioritised samples); the
  other entries are counted nowhere on that shard (neither drawn nor stale).
* **Per-device sample** (`ShardedBuffer.sample_local`, leaves `[S, B, ...]`): shard `s` counts its own row `s`.

Either is one `shard_map` program of the buffer's own `record` per shard: `O(B)` per shard, no communication (the
sample is replicated, or already split along the mesh axis).

`stats()` reads every shard's metrics and combines them into the keys and meanings of `Recorded.stats`: `samples`,
`stale`, the age sum, the age histogram and the per-position counts add up over the shards (the position summary is
that of all positions held, every shard's together), `age_max` is the largest; `record_calls` is the most any shard
counted (every `ShardedBuffer.record` counts one call on every shard); `inserts` is the items (episodes) added to all
shards, or for the trajectory buffers the steps per lane (every shard's lanes advance together, as the unsharded
buffer's). Ages are counted on the drawn item's own shard, as in the unsharded buffer that shard is: for a trajectory
buffer sharded over its envs they are the unsharded buffer's (steps per lane); for an item or episode buffer they are
the items (episodes) added to that shard after the drawn one (an add of `S * b` items gives each shard `b`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, PartitionSpec as P

from jaxbuffers import _metrics, _ring, _validate
from jaxbuffers.trajectory import TrajectoryBuffer

__all__ = ["ShardedRecorded"]


def _unstack(tree):
    return jax.tree.map(lambda x: x[0], tree)


@functools.lru_cache(maxsize=64)
def _record_program(mesh: Mesh, axis: str, whole: bool):
    """The jitted `shard_map` program of `ShardedRecorded.record`: `program(shards, split, replicated)`; a global
    sample (`whole`) comes replicated as `(indices, generations, shard)`, a per-device one split as
    `(indices, generations)` with leaves `[S, B]`."""
    spec = P(axis)

    def body(stacked, split, replicated):
        b = _unstack(stacked)
        if whole:
            indices, generations, shard = replicated
            new = b._record(indices, generations, shard == lax.axis_index(axis))
        else:
            indices, generations = _unstack(split)  # this shard's row
            new = b._record(indices, generations)
        return jax.tree.map(lambda x: x[None], new)

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, P()), out_specs=spec, check_vma=False))


def _host(x) -> np.ndarray:
    """A leaf of the stacked shards, whole, on the host (from every process when the mesh spans several)."""
    return np.asarray(x if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True))


class ShardedRecorded:
    """Mixin of `jaxbuffers.ShardedBuffer` (module doc): `record` and `stats` over its shards.

    It uses the sharded buffer's `shards`, `mesh`, `axis`, `num_shards` and `_run`.
    """

    def record(self, sample: Any) -> Any:
        """The sharded buffer with the draws of `sample` counted in the shards they came from (module doc): pure,
        `O(B)` per shard, no communication; under `jit` too (donate the buffer for an in-place update).

        Args:
          sample: a global sample (`ShardedSample` of this buffer's `sample`: `sample.sample.indices` int `[B]`,
            `sample.shard` int `[B]`, and `sample.sample.generations` int `[B]` for prioritised buffers), or a
            per-device sample (this buffer's `sample_local` output: `indices` int `[S, B]`, `generations` `[S, B]`).

        Returns:
          The new `ShardedBuffer` (only its shards' metrics differ).

        Raises:
          TypeError: a wrapped buffer without metrics (the rollout buffers), `sample` neither kind of sample,
            non-integer `indices` / `shard` / `generations`.
          ValueError: a sample of one unsharded buffer (`indices` `[B]` without `shard`), `indices` whose leading axis
            is not `S`, `shard` or `generations` of another shape than `indices`, a concrete `shard` outside `[0, S)`.
        """
        _validate.keeps_metrics("record", self.shards)
        whole, indices, generations, shard = _validate.sharded_draws("sample", sample, self.num_shards, self.axis)
        program = _record_program(self.mesh, self.axis, whole)
        if whole:
            return self._run(program, (), (indices, generations, shard))
        return self._run(program, (indices, generations), (), {"sample.indices": indices, "sample.generations": generations})

    def stats(self) -> dict:
        """Usage metrics of the whole sharded buffer as a host-side dict, with the keys and meanings of the wrapped
        buffer's `stats()` (module doc: how the shards' counts combine). Reads every shard's metrics (a device
        transfer, `O(positions)` with per-position counts; with several processes, from all of them).

        Raises:
          TypeError: a wrapped buffer without metrics (the rollout buffers: `jaxbuffers.rollout_stats`), a traced
            state (under `jit`: read on the host).
        """
        _validate.members.on_host("stats", self, "read the counters in buf.shards.metrics (one row per shard)")
        _validate.keeps_metrics("stats", self.shards)
        owner = self.shards._metrics_owner()
        m, added, head, num_valid, ring, _ = owner._metrics_ring()
        inserts = _ring.counter_value(_host(added))
        heads, valid = _host(head), _host(num_valid)
        counts = None
        if m.per_slot:
            per_shard = _host(m.sample_count).reshape(self.num_shards, -1, ring)
            counts = np.concatenate([_metrics.held_counts(c, int(h), int(v), ring) for c, h, v in zip(per_shard, heads, valid)])
        return _metrics.summary(
            int(inserts.max() if isinstance(owner, TrajectoryBuffer) else inserts.sum()),
            int(_ring.counter_value(_host(m.sampled)).sum()), int(_ring.counter_value(_host(m.record_calls)).max()),
            int(_ring.counter_value(_host(m.stale)).sum()), _metrics.age_sum(_host(m.age_sum_parts)),
            int(_host(m.age_max).max()), _host(m.age_hist).astype(np.int64).sum(axis=0), counts)
