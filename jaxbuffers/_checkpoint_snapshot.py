"""What a save writes, taken from the buffer at the call: `snapshot(buffer)` describes it and takes its arrays to host
memory, and the host stores of a compressed buffer as they are now, exported when written (`Snapshot.done`).

Taking is what `save(..., blocking=False)` makes its caller wait for, so it does only what the state of the call
needs: the device arrays are held (on CPU) or copied to host memory, and each host store's index columns and tags are
copied under its lock beside references to its arena chunks, whose published bytes never change
(`host_codecs.CompressedStore.export_later`). Sorting the entries and packing their offsets runs in `done()`, in the
thread that writes, and the payload is written from the arena chunks themselves (`host_codecs.snapshot.PayloadRuns`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from jaxbuffers._checkpoint_describe import _COMPRESSED, _describe, _sharded
from jaxbuffers._validate import processes as _replicas
from jaxbuffers.compressed._host import ShardedHostStores, StaleBufferError


def _host_taken(buffer: Any, host: bool) -> Callable[[], tuple[dict | None, dict]]:
    """The host stores of `buffer` taken now (`_store_taken`); the returned function gives their metadata and arrays
    (None, {} for a buffer without host stores, or `host=False`), a sharded one's as `{"axis", "shards": [metadata of
    shard s]}` and `{"shards": {"s": arrays of shard s}}`."""
    if not host or not isinstance(buffer, _COMPRESSED):
        return lambda: (None, {})
    if not isinstance(buffer.host, ShardedHostStores):
        return _store_taken(buffer.host, int(buffer.version))
    taken = [_store_taken(h, v) for h, v in zip(buffer.host.shards, np.asarray(buffer.version).tolist())]

    def done() -> tuple[dict, dict]:
        parts = [t() for t in taken]
        return {"axis": buffer.host.axis, "shards": [m for m, _ in parts]}, {"shards": {str(i): a for i, (_, a) in enumerate(parts)}}

    return done


def _store_taken(host: Any, version: int) -> Callable[[], tuple[dict, dict]]:
    """One `HostStores` holding the entries of a state of version `version`, taken now (module doc); the returned
    function gives its metadata and arrays, each store's payload a `PayloadRuns`.

    Raises:
      StaleBufferError: the host store is past `version` (a state older than the last add).
    """
    host._check_open("save")
    with host._lock:  # the version is read before: the write that produces it takes the lock
        if version != host.version:
            raise StaleBufferError(
                f"save: this buffer state has version {version} but its host store is at version "
                f"{host.version}; save the state returned by the last add"
            )
        stores = [s.export_later() for s in host.stores]
        counters = {"version": host.version, "num_writes": host.num_writes, "num_rows": host.num_rows}
        slot_version = host.slot_version.copy()

    def done() -> tuple[dict, dict]:
        exported = [export() for export in stores]
        meta = {**counters, "stores": [m for m, _ in exported]}
        arrays = {"stores": {str(i): a for i, (_, a) in enumerate(exported)}, "slot_version": slot_version}
        meta["arrays"] = {i: {k: [list(a.shape), a.dtype.name] for k, a in s.items()} for i, s in arrays["stores"].items()}
        return meta, arrays

    return done


def store_snapshot(host: Any, version: int) -> tuple[dict, dict]:
    """`_store_taken(host, version)()` with every payload packed into one numpy array (several processes' saves)."""
    meta, arrays = _store_taken(host, version)()
    for s in arrays["stores"].values():
        s["payload"] = s["payload"].packed()
    return meta, arrays


def _host_tree(host_arrays: dict) -> dict:
    """The host arrays written: non-empty ones only (an empty array's shape and dtype are in buffer.json)."""
    if "shards" in host_arrays:
        return {"shards": {i: _host_tree(a) for i, a in host_arrays["shards"].items()}}
    stores = {i: {k: a for k, a in s.items() if a.size} for i, s in host_arrays.get("stores", {}).items()}
    return {"stores": stores} | {k: v for k, v in host_arrays.items() if k == "slot_version"}


class Snapshot(NamedTuple):
    """A buffer taken by `snapshot`, written by `jaxbuffers.checkpoint._write` (`done`, then the files)."""

    meta: dict  # buffer.json but its "host" (`done` adds it)
    leaves: list  # the buffer's arrays on host memory (CPU arrays), in pytree order
    host: Callable[[], tuple[dict | None, dict]]  # the host stores' metadata and arrays (`_host_taken`)

    def done(self) -> tuple[dict, dict]:
        """(buffer.json, what `arrays/` holds): the non-empty arrays only (an empty array's shape and dtype are in
        buffer.json), `{"device": {"i": leaf i}, "host": host arrays}`."""
        host_meta, host_arrays = self.host()
        tree = {"device": {str(i): x for i, x in enumerate(self.leaves) if np.size(x)}, "host": _host_tree(host_arrays)}
        return {**self.meta, "host": host_meta}, tree


def snapshot(buffer: Any, host: bool = True) -> Snapshot:
    """Describe `buffer` and take its arrays to host memory, so that writing them can run while the buffer changes.

    Device arrays are copied to host memory together (`copy_to_host_async`); on CPU `np.asarray` is a view that XLA
    knows of, so a later donation of the buffer copies instead of updating in place. Either is wrapped as a CPU
    array (without a copy where its alignment allows). Host stores are taken as the module doc says. `host=False`
    leaves a compressed buffer's host stores out (`jaxbuffers.disk` keeps them in files of their own). A leaf
    replicated over several processes is taken from this process's copy.

    Raises:
      StaleBufferError: a compressed buffer state older than its host store.
    """
    meta = _describe(buffer)
    buffer = _sharded(buffer)[0]
    taken = _host_taken(buffer, host)
    leaves = jax.tree.leaves(buffer)
    for x in leaves:
        if isinstance(x, jax.Array) and x.is_fully_addressable:
            x.copy_to_host_async()
    # host memory as CPU arrays: written from their memory (several processes: by orbax, which writes jax arrays from
    # their memory, several times faster than numpy arrays)
    cpu = jax.local_devices(backend="cpu")[0]
    return Snapshot(meta, [jax.device_put(_replicas.whole_leaf(x), cpu) for x in leaves], taken)
