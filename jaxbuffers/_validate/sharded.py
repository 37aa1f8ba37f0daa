"""Checks of a sharded buffer's calls: the samples `ShardedBuffer.record` is given, a shard's refusal of an add."""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers._validate import index_array, index_vector, indices_below, integer_indices, vector


def shapes_passed(run: Callable[[], Any], whole: Any, n: int) -> Any:
    """``run()``, its refusal of one shard's block of ``whole`` (split ``n`` ways) naming the shape passed instead."""
    try:
        return run()
    except (TypeError, ValueError) as e:
        msg = str(e)
        for full in jax.tree.leaves(whole) if type(e) in (TypeError, ValueError) else ():  # subclasses may take other arguments
            shape = np.shape(full)
            part = str((shape[0] // n, *shape[1:])) if len(shape) and shape[0] % n == 0 else None
            got = part and re.search(rf"got (shape )?{re.escape(part)}", msg)
            if got:
                said = f"{got[0][: -len(part)]}{shape} (each of the {n} shards checks its block of {shape[0] // n} rows)"
                raise type(e)(msg.replace(got[0], said, 1)) from None
        raise


def sharded_draws(name: str, sample: Any, num_shards: int, axis: str) -> tuple[bool, jax.Array, Any, Any]:
    """`(whole, indices, generations, shard or None)` of a sample to record into a sharded buffer of `num_shards`
    shards: a global sample (a `ShardedSample`): True, int32 `indices` and `shard` `[B]`, `generations` `[B]` or
    None; a per-device one (`sample_local`'s): False, int32 `indices` and `generations` (or None) `[num_shards, B]`."""
    inner = sample.sample if hasattr(sample, "shard") and hasattr(sample, "sample") else None
    if inner is not None:
        if not hasattr(inner, "indices"):
            raise TypeError(f"{name}.sample: expected the wrapped buffer's sample (with indices), got {type(inner).__name__}")
        indices = index_vector(f"{name}.sample.indices", inner.indices)
        b = indices.shape[0]
        shard = integer_indices(f"{name}.shard", sample.shard)
        if shard.shape != (b,):
            raise ValueError(f"{name}.shard: expected shape ({b},) (one shard per entry of {name}.sample.indices), got {shard.shape}")
        indices_below(f"{name}.shard", shard, num_shards, f"the shards of mesh axis {axis!r}")
        generations = getattr(inner, "generations", None)
        if generations is not None:
            generations = vector(f"{name}.sample.generations", generations, b, "integer")
        return True, indices, generations, shard
    if not hasattr(sample, "indices"):
        raise TypeError(f"{name}: expected a sample of this sharded buffer, a ShardedSample (from sample) or a "
                        f"sample_local output (indices [S, B]), got {type(sample).__name__}")
    indices = integer_indices(f"{name}.indices", sample.indices)
    if indices.ndim != 2 or indices.shape[0] != num_shards:
        hint = (" (one unsharded buffer's sample, or the .sample of a ShardedSample: record the ShardedSample itself)"
                if indices.ndim == 1 else "")
        raise ValueError(f"{name}.indices: expected shape ({num_shards}, B), a sample_local output with one row per "
                         f"shard of mesh axis {axis!r}, got {tuple(indices.shape)}{hint}")
    generations = getattr(sample, "generations", None)
    if generations is not None:
        generations = index_array(generations, f"{name}.generations", "an integer array [S, B]", clip=False)
        if not jnp.issubdtype(generations.dtype, jnp.integer) or generations.dtype == bool:
            raise TypeError(f"{name}.generations: expected an integer dtype, got {generations.dtype}")
        if generations.shape != indices.shape:
            raise ValueError(f"{name}.generations: expected shape {tuple(indices.shape)} (as {name}.indices), got {tuple(generations.shape)}")
        generations = jnp.asarray(generations)
    return False, indices, generations, None


def keeps_metrics(method: str, shards: Any) -> None:
    """TypeError naming `method` unless the wrapped buffer of a sharded buffer keeps usage metrics."""
    if not callable(getattr(shards, "_metrics_owner", None)):
        raise TypeError(f"{method}: {type(shards).__name__} keeps no usage metrics (a rollout's come from "
                        f"jaxbuffers.rollout_stats of its shards: apply(jaxbuffers.rollout_stats, ...))")
