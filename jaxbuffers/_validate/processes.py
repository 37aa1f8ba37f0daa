"""Checks of a buffer saved by several processes (`jax.distributed`) that is not a `ShardedBuffer`: one replicated
buffer, whole on every process and the same everywhere (`jaxbuffers._validate`'s conventions: the argument's name
first, TypeError for kind, ValueError for value)."""

from __future__ import annotations

import jax
import numpy as np


def whole_leaf(x) -> np.ndarray:
    """A leaf on host memory: a global array replicated over processes gives this process's copy; TypeError for an
    array split across processes (not one buffer each process holds whole)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if not x.is_fully_replicated:
            raise TypeError(f"buffer: an array {x.shape} split across processes ({x.sharding}); save a ShardedBuffer "
                            f"(every process its shards)")
        x = x.addressable_data(0)
    return np.asarray(x)


def same_on_every_process(own: dict[str, str], every: list[dict[str, str]], me: int) -> None:
    """`own` (this process's hash of every array, by name) equals every process's (`every`, in process order); else
    ValueError naming the first array that differs and the two processes."""
    for p, theirs in enumerate(every):
        diff = next((k for k in sorted(set(own) | set(theirs)) if own.get(k) != theirs.get(k)), None)
        if diff is not None:
            raise ValueError(
                f"buffer: with several processes a buffer other than a ShardedBuffer is one replicated buffer, written "
                f"by process 0, and must be the same on every process; array {diff} differs between process {me} and "
                f"process {p} (for each process's own data, use a ShardedBuffer: its shards are each process's rows)"
            )
