r"""Buffers over a `jax.sharding.Mesh`: `ShardedBuffer`, shard-local adds and samples, global sampling.

A sharded buffer is a *stacked* buffer: `S` buffers of the same type (one per shard, `S` = the size of one mesh
axis), every array leaf with a leading shard axis `[S, ...]` split along that mesh axis, so shard `s` lives on the
devices of mesh position `s`. Every operation runs the buffer's own method on each shard under `jax.shard_map`; no
storage ever leaves its device.

* **Add** (`add`; `add_episodes` for an `EpisodeBuffer`): a batch's leading axis (items of a `ReplayBuffer`, envs
  of a `TrajectoryBuffer` or `RolloutBuffer`, episodes of an `EpisodeBuffer`) is split into `S` contiguous blocks;
  block `s` goes to shard `s`. A batch already sharded along the mesh axis (born on the devices, as Anakin's is)
  moves nowhere.
* **Per-device sampling** (`sample_local`): each shard samples its own items with its own key
  (`fold_in(key, s)`), as Anakin does; leaves `[S, B, ...]` sharded along the mesh axis; probabilities and
  importance weights of prioritised buffers are the shard's own.
* **Global sampling** (`sample`): `B` items from the whole buffer, each item with its unsharded probability. The
  shards' masses $M_s$ (item counts, or the sum-tree totals of prioritised buffers) are gathered (an all-reduce of
  `S` numbers); every device draws the same shard for each of the `B` slots, i.i.d. with
  $P(s) = M_s / \sum_r M_r$; each shard draws `B` candidates from itself with the buffer's sampler and keeps those of
  its slots; one all-reduce of the `B` sampled items (the sample's size, never the storage's) combines them
  bit for bit (a sum of the candidates' bits with zeros). So item $i$ of shard $s$ is drawn with
  $P(s) P(i \mid s) = \frac{M_s}{M} \frac{v_i}{M_s} = \frac{v_i}{M}$, as in the unsharded buffer. For prioritised
  buffers the probabilities and importance weights are the whole buffer's:
  $P(i) = p_i^\alpha / \sum_{\text{all}} p^\alpha$ and $w_i = (p_i^\alpha / \min_{\text{all}} p^\alpha)^{-\beta}$
  (the global minimum is gathered with the totals). Cost: every shard draws all `B` candidates (static shapes),
  so a global sample does `S` times the gather work of one unsharded sample, spread over the `S` devices, plus
  one all-reduce of `B` items; `sample_local` does none of that extra work.

Episode buffers. The mass $M_s$ of an `EpisodeBuffer` shard is the number of units its sampler draws uniformly
among the stored episodes passing the filter `where`: episodes (`sample_episodes`), windows of `sequence_length`
steps inside an episode (`sample_sequences`), or steps (`sample_timesteps`, `sample_transitions`); so every unit of
the whole buffer is drawn with probability $1 / \sum_r M_r$, as from one unsharded buffer. A filter is a function of
the meta dict (each shard applies it to its own meta) or a bool mask `[S, max_episodes]` whose row `s` filters the
slots of shard `s`.

Rollout epochs (`minibatches`). `sample_local(key, M, method="minibatches")` shuffles each shard's own steps: every
step once per epoch, and the union of the shards' `j`-th minibatches is a global minibatch holding exactly
`T * N / M` steps of each shard (a shuffle stratified by shard, which moves no data; when every shard runs the same
environment its envs are exchangeable, so for a data-parallel learner averaging gradients over devices it is the
usual choice). `minibatches(key, M)` gives the unsharded rollout's own epoch instead: the permutation of all
`S * T * N` steps that `RolloutBuffer.minibatches` draws from `key` (computed on every device from the replicated
key: int32 indices, no communication), each global minibatch handed out in `S` blocks, block `s` to shard `s`. Each
device gathers the minibatch's steps it holds (zeros elsewhere) and one reduce-scatter per minibatch sums the bits
into the blocks; so an epoch moves the whole rollout across devices (each device sends about `S - 1` times its
shard's steps in a ring reduce-scatter), which the per-shard shuffle avoids.

Compressed buffers keep one host store per shard: `docs/api/scale.md`, "Compressed buffers over shards".

Edits (`update`): after a global sample, `update(shard, indices, fields)` sends entry `j` to shard `shard[j]`, as
`set_priorities` does; a shard-local edit of each shard's own rows is `apply(lambda b, i, f: b.update(i, f), ...)`.

Equivalence with one unsharded buffer. A `TrajectoryBuffer` or `RolloutBuffer` sharded along its envs holds, lane
for lane, exactly what the unsharded buffer of all envs holds (lanes are independent and share one ring). An item
buffer (or episode buffer) of `S` shards of capacity `c` fed batches of `S * b` items (episodes) holds what one
buffer of capacity `S * c` holds when `b` divides `c`; in logical order, item `l` of shard `s` is item
`(l // b) * S * b + s * b + l % b` of the unsharded buffer. (Otherwise each shard still evicts its own oldest first.)

Multi-host. With `jax.distributed.initialize` the mesh spans the devices of every process; each process holds the
shards of its devices (compressed: their host stores) and passes its own rows to `add` through `local_batch`. Global
sampling draws across processes (its result is replicated); `jaxbuffers.save` / `restore` run in every process.

Example:
  ```python
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  buf = jb.ShardedBuffer.create(lambda: jb.ReplayBuffer.create(item, capacity=100_000), mesh, "data")
  buf = jax.jit(jb.ShardedBuffer.add, donate_argnums=0)(buf, batch)        # batch leaves [S * b, ...]
  out = jax.jit(lambda b, k: b.sample(k, 256))(buf, key)                    # out.sample.item: [256, ...]
  mine = jax.jit(lambda b, k: b.sample_local(k, 32))(buf, key)             # leaves [S, 32, ...]

  eps = jb.ShardedBuffer.create(lambda: jb.EpisodeBuffer.create(step, max_episodes=1_000, max_timesteps=500,
                                                                meta={"task": jnp.int32(0)}), mesh, "data")
  eps = eps.add_episodes(episodes, lengths, terminated=term, final_obs=final)  # leaves [S * b, T, ...]
  out = eps.sample(key, 256, method="sample_transitions", n_step=3, gamma=0.99, where=lambda m: m["task"] == 1)
  ```

References:
  Hessel et al., "Podracer architectures for scalable Reinforcement Learning", 2021 (Anakin, Sebulba);
  Schaul et al., "Prioritized Experience Replay", ICLR 2016 (weights normalised by the largest weight).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jaxbuffers import _validate
from jaxbuffers._priority import weight_exponent
from jaxbuffers._sharded_metrics import ShardedRecorded
from jaxbuffers.compressed._host import HostBacked, ShardedHostStores
from jaxbuffers.episode import EpisodeBuffer
from jaxbuffers.prioritised_trajectory import PrioritisedTrajectoryBuffer
from jaxbuffers.replay import ReplayBuffer
from jaxbuffers.rollout import RolloutBuffer, RolloutMinibatch, advantages_required
from jaxbuffers.trajectory import TrajectoryBuffer

__all__ = ["ShardedBuffer", "ShardedSample"]


class ShardedSample(NamedTuple):
    """What `ShardedBuffer.sample` returns (`B` = batch size); replicated on every device."""

    sample: Any  # the buffer's own sample type, leaves [B, ...]; `indices` are positions inside the shard
    shard: jax.Array  # shape=[B], dtype=int32: the shard each item was drawn from


def _split_static(kwargs: dict) -> tuple[dict, tuple]:
    """Array keyword arguments (operands) and the others (static: closed over, hashable), `None` ones dropped. A
    static value is keyed with its type: `True`, `1` and `1.0` hash alike, and must not find each other's program."""
    arrays = {k: v for k, v in kwargs.items() if v is not None and jax.tree.leaves(v) and all(map(_validate.is_array, jax.tree.leaves(v)))}
    static = tuple(sorted((k, (type(v).__name__, _validate.static_value(k, v))) for k, v in kwargs.items() if v is not None and k not in arrays))
    return arrays, static


def _kwargs(static: tuple) -> dict:
    """The keyword arguments of `_split_static`'s static tuple."""
    return {k: v for k, (_, v) in static}


def _unstack(tree):
    return jax.tree.map(lambda x: x[0], tree)


def _stack(tree):
    return jax.tree.map(lambda x: x[None], tree)


def _local_rows(x: jax.Array) -> dict[int, np.ndarray]:
    """`{s: row s}` (numpy) of the rows of a stacked array `[S, ...]` that this process holds (every row in one)."""
    return {s: row for p in x.addressable_shards for s, row in zip(range(*p.index[0].indices(x.shape[0])), np.asarray(p.data))}


def _device(buf):
    """The device half of a compressed buffer (its wrapped buffer), else `buf`: what the type checks and the shard
    masses read."""
    return buf.buffer if isinstance(buf, HostBacked) else buf


def _pick(tree, mine: jax.Array, reduce: Callable):
    """Combine per-shard candidates `tree` (leaves `[B, ...]`): slot `j` takes the leaves of the shard with
    `mine[j]`. A sum over shards (`reduce`: `lax.psum`, or `lax.psum_scatter` to keep one block of slots per shard)
    of the candidates' bits where mine and zeros elsewhere: exact for every dtype."""

    def one(x):
        m = mine.reshape(mine.shape + (1,) * (x.ndim - 1))
        if x.dtype == jnp.bool_:
            return reduce(jnp.where(m, x, False).astype(jnp.uint8)).astype(jnp.bool_)
        bits = lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))
        return lax.bitcast_convert_type(reduce(jnp.where(m, bits, 0)), x.dtype)

    return jax.tree.map(one, tree)


def _gathered(x: jax.Array, axis: str, n: int) -> jax.Array:
    """Every shard's scalar `x`, `[n]` on every device (an all-reduce of `n` numbers: the result is replicated)."""
    return lax.psum(jnp.zeros((n,), x.dtype).at[lax.axis_index(axis)].set(x), axis)


def _choose_shards(key, mass: jax.Array, batch_size: int) -> jax.Array:
    """Shard of each of `batch_size` slots, int32, i.i.d. with `P(s) = mass[s] / sum(mass)` (an exact integer draw
    for integer masses). Shard 0 when every mass is 0.

    Independent of the slot on purpose: slot `j` takes the `j`-th candidate of its shard, which a stratified sampler
    draws from stratum `j` of that shard; a shard choice that also depended on `j` would reach only some strata.
    """
    cum = jnp.cumsum(mass)
    if jnp.issubdtype(mass.dtype, jnp.integer):
        r = jax.random.randint(key, (batch_size,), 0, jnp.maximum(cum[-1], 1), mass.dtype)
    else:
        r = jax.random.uniform(key, (batch_size,), mass.dtype) * cum[-1]
    s = jnp.searchsorted(cum, r, side="right").astype(jnp.int32)
    last = jnp.max(jnp.where(mass > 0, jnp.arange(mass.shape[0], dtype=jnp.int32), 0))  # rounding past the end
    return jnp.minimum(s, last)


#: The samplers of an `EpisodeBuffer` that `ShardedBuffer.sample` runs globally, with their guards.
_EPISODE_GUARDS = {"sample_episodes": "can_sample", "sample_timesteps": "can_sample", "sample_transitions": "can_sample_transitions",
                   "sample_sequences": "can_sample_sequences"}
_GUARDS = {"sample": "can_sample", "sample_sequences": "can_sample", "sample_transitions": "can_sample_transitions"}
#: The samplers `sample` and `sample_local` call, of the buffers that have them.
_GLOBAL_SAMPLERS = ("sample", "sample_sequences", "sample_transitions", "sample_episodes", "sample_timesteps")
_LOCAL_SAMPLERS = _GLOBAL_SAMPLERS + ("minibatches",)


def _episode_units(b: EpisodeBuffer, method: str, kw: dict) -> jax.Array:
    """The units `method` draws uniformly from one episode shard (int32 scalar): stored episodes passing `where`
    (`sample_episodes`), their windows of `sequence_length` steps (`sample_sequences`) or their steps."""
    where = kw.get("where")
    passing = jnp.arange(b.max_episodes) < b.num_valid
    if where is not None:
        passing = passing & (where(b.meta) if callable(where) else where)
    if method == "sample_episodes":
        units = jnp.ones_like(b.lengths)
    elif method == "sample_sequences":
        units = jnp.maximum(b.lengths - kw["sequence_length"] + 1, 0)
    else:
        units = b.lengths
    return jnp.sum(jnp.where(passing, units, 0), dtype=jnp.int32)


def _global_rule(buf, method: str, static: dict):
    """`(mass, finish)` of a global sample from `buf`'s shards: `mass(shard, kwargs)` is the shard's mass (int32 unit
    count or float32 tree total) and its minimum leaf, and `finish(sample, shard, masses, mins, beta)` turns
    shard-level probabilities into global ones (None: nothing to turn)."""
    if isinstance(buf, EpisodeBuffer):
        _validate.choice("method", method, tuple(_EPISODE_GUARDS), "for an EpisodeBuffer")
        return (lambda b, kw: (_episode_units(b, method, kw), jnp.float32(0))), None
    if isinstance(buf, (TrajectoryBuffer, PrioritisedTrajectoryBuffer)) and static.get("cross_episodes", True) is False:
        raise ValueError("cross_episodes: global sampling draws shards by stored steps (or priority totals), which "
                         "match the windows inside episodes only per shard; use sample_local, or cross_episodes=True")
    if hasattr(buf, "tree") and hasattr(buf, "set_priorities"):  # the prioritised buffers

        def finish(sample, shard, totals, mins, beta):
            total, low = jnp.sum(totals), jnp.min(mins)
            probabilities = sample.probabilities * (totals[shard] / jnp.where(total > 0, total, 1))
            # w = (v / min_all)^-beta = w_shard * (min_shard / min_all)^-beta: at most w_shard <= 1.
            scale = jnp.power(jnp.where(jnp.isfinite(low), mins[shard] / low, 1), weight_exponent(beta))
            return sample._replace(probabilities=probabilities.astype(jnp.float32),
                                   importance_weights=(sample.importance_weights * scale).astype(jnp.float32))

        return (lambda b, kw: (b.tree.total().astype(jnp.float32), b.tree.min().astype(jnp.float32))), finish
    if isinstance(buf, TrajectoryBuffer) and buf._lossy:  # shards' lanes start their windows after different steps
        return (lambda b, kw: (b._drawn_by(method, kw), jnp.float32(0))), None
    if isinstance(buf, (ReplayBuffer, TrajectoryBuffer)):
        # Every shard of a trajectory buffer has the same lanes and ring, so windows are proportional to steps.
        return (lambda b, kw: (b.size().astype(jnp.int32), jnp.float32(0))), None
    raise TypeError(
        f"sample: {type(buf).__name__} has no global sampler (replay, prioritised, trajectory and episode buffers "
        f"do); use sample_local (each shard samples its own items)"
        + (", or minibatches for a global epoch" if isinstance(buf, RolloutBuffer) else "")
    )


def _local_body(fn: Callable) -> Callable:
    """The per-shard body of `fn(shard, *args, *replicated)`: the stacked shard `[1, ...]` in, outputs `[1, ...]` out."""

    def body(stacked, args, replicated):
        return _stack(fn(_unstack(stacked), *args, *replicated))

    return body


def _local_fn(axis: str, op: str, method: str | None, batch_size: int | None, static: tuple) -> Callable:
    """The shard-local operations of `ShardedBuffer` as functions of one shard and its operands (`own`: the
    shard's rows `[1, ...]` of per-shard keyword arguments, e.g. an episode filter)."""
    kw = _kwargs(static)
    if op == "add":
        return lambda b, args, arrays: getattr(type(b), method)(b, *args, **arrays, **kw)
    if op == "local":
        return lambda b, own, key, arrays: getattr(b, method)(
            jax.random.fold_in(key, lax.axis_index(axis)), batch_size, **arrays, **_unstack(own), **kw)
    if op == "query":  # a method without a key: can_sample, size
        return lambda b, own, arrays: getattr(b, method)(*(() if batch_size is None else (batch_size,)), **arrays, **_unstack(own), **kw)

    if op == "update":  # entries of other shards get slot -1, which update ignores
        return lambda b, shard, indices, fields, steps, generations: b.update(
            jnp.where(shard == lax.axis_index(axis), indices, -1), fields, steps=steps, generations=generations)

    def set_priorities(b, shard, indices, priorities, generations):
        mine = jnp.where(shard == lax.axis_index(axis), indices, -1)  # -1: ignored by set_priorities
        new = b.set_priorities(mine, priorities, generations)
        dev = _device(new)
        dev = dev.replace(max_priority=lax.pmax(dev.max_priority, axis))
        return new.replace(buffer=dev) if isinstance(new, HostBacked) else dev

    return set_priorities


def _global_body(axis: str, n: int, method: str, batch_size: int, static: tuple) -> Callable:
    """The per-shard body of a global sample (module doc): shard masses, shard draw, candidates, one all-reduce."""
    kw = _kwargs(static)

    def body(stacked, own, key, arrays, beta):
        b, own = _unstack(stacked), _unstack(own)
        dev = _device(b)
        mass_fn, finish = _global_rule(dev, method, kw)
        s = lax.axis_index(axis)
        k_shard, k_local = jax.random.split(key)
        candidates = getattr(dev, method)(jax.random.fold_in(k_local, s), batch_size, **arrays, **own, **kw)
        mass, low = mass_fn(dev, {**kw, **arrays, **own})
        masses, mins = _gathered(mass, axis, n), _gathered(low, axis, n)
        shard = _choose_shards(k_shard, masses, batch_size)
        if dev is not b:  # a compressed buffer: decode only the rows this shard contributes
            candidates = b.decode(candidates, rows=shard == s)
        out = _pick(candidates, shard == s, functools.partial(lax.psum, axis_name=axis))
        if finish is not None:
            out = finish(out, shard, masses, mins, beta)
        return ShardedSample(sample=out, shard=shard)

    return body


def _epoch_body(axis: str, n: int, num_minibatches: int) -> Callable:
    """The per-shard body of `ShardedBuffer.minibatches`: the unsharded rollout's permutation (the same on every
    device), and for each minibatch one reduce-scatter that hands each shard its block of the minibatch."""
    scatter = functools.partial(lax.psum_scatter, axis_name=axis, scatter_dimension=0, tiled=True)

    def body(stacked, key):
        b, s = _unstack(stacked), lax.axis_index(axis)
        lanes, total = b.num_envs * n, b.num_steps * b.num_envs * n
        order = jax.random.permutation(key, total).astype(jnp.int32).reshape(num_minibatches, total // num_minibatches)

        def minibatch(flat):  # unsharded flat indices t * lanes + env
            mine = (flat % lanes) // b.num_envs == s
            local = (flat // lanes) * b.num_envs + flat % b.num_envs
            mb = _device(b).gather(jnp.where(mine, local, 0))
            mb = mb if _device(b) is b else b.decode(mb, rows=mine)  # a compressed rollout: only the steps held here
            return _pick(mb._replace(index=flat), mine, scatter)

        return _stack(lax.map(minibatch, order))

    return body


@functools.lru_cache(maxsize=512)
def _program(mesh: Mesh, axis: str, op: str, method: str | None = None, batch_size: int | None = None, static: tuple = ()) -> Callable:
    """One jitted `shard_map` program per operation, mesh and static arguments, so that an eager call compiles once
    per shape (inside a caller's `jit` it is inlined)."""
    spec = P(axis)
    if op == "global":
        body = _global_body(axis, mesh.shape[axis], method, batch_size, static)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, P(), P(), P()), out_specs=P(), check_vma=False))
    if op == "epoch":
        body = _epoch_body(axis, mesh.shape[axis], batch_size)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, P()), out_specs=spec, check_vma=False))
    body = _local_body(_local_fn(axis, op, method, batch_size, static))
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, P()), out_specs=spec, check_vma=False))


class ShardedBuffer(ShardedRecorded, struct.PyTreeNode):
    """`S` buffers of one type stacked along a leading axis split over a mesh axis (module doc).

    Build it with `create`. Every method runs the wrapped buffer's own method on each shard under `jax.shard_map`;
    it works inside `jit` (donate for in-place adds) and eagerly (`add`, `sample`, `sample_local`, `record` and
    `set_priorities` run one cached compiled program per shape; `apply` is traced on every call). `record` and
    `stats`: usage metrics of a global or per-device sample, over all shards (`jaxbuffers._sharded_metrics`).
    """

    shards: Any  # the wrapped buffer stacked: every array leaf [S, ...], split along `axis` of `mesh`
    mesh: Mesh = struct.field(pytree_node=False)
    axis: str = struct.field(pytree_node=False)

    @classmethod
    def create(cls, make: Callable[[], Any], mesh: Mesh, axis: str) -> "ShardedBuffer":
        """An empty sharded buffer: `make()` builds one shard (e.g. `lambda: jb.ReplayBuffer.create(item,
        capacity=c)`: capacity per shard), called once and stacked `S` times directly on the devices. A compressed
        buffer's `make` is also called once per shard, for that shard's host store (module doc).

        Raises:
          TypeError: `make` not a function returning a jaxbuffers buffer (or one disk-backed: `jaxbuffers.disk`),
            `mesh` not a `jax.sharding.Mesh`.
          ValueError: `axis` not a name of `mesh`; `make` returning compressed buffers that share one host store
            (it is called once per shard and must build a new buffer each time: module doc, "Compressed buffers").
        """
        _validate.instance("make", make, callable, "a function of no arguments returning one shard's buffer")
        _validate.instance("mesh", mesh, Mesh, "a jax.sharding.Mesh")
        _validate.choice("axis", axis, tuple(mesh.shape), "(the mesh's axis names)")
        n = mesh.shape[axis]
        build = lambda: jax.vmap(lambda _: make(), axis_size=n)(None)  # noqa: E731
        abstract = jax.eval_shape(build)
        if not (isinstance(abstract, struct.PyTreeNode) and any(callable(getattr(abstract, m, None)) for m in ("add", "add_episodes"))):
            raise TypeError(f"make: expected a function returning a jaxbuffers buffer, it returned {type(abstract).__name__}")
        hosts = ShardedHostStores.made(make, n) if isinstance(abstract, HostBacked) else None
        # Zero-size leaves (e.g. disabled metrics) are laid out as XLA lays out a program's zero-size outputs on an
        # `Auto` axis, replicated, so that an add returns a state of the same shardings (else the next call compiles).
        explicit = mesh.axis_types[mesh.axis_names.index(axis)] == AxisType.Explicit
        split, whole = NamedSharding(mesh, P(axis)), NamedSharding(mesh, P())
        layout = jax.tree.map(lambda x: whole if x.size == 0 and not explicit else split, abstract)
        shards = jax.jit(build, out_shardings=layout)()
        if hosts is not None:
            shards.host.close()  # the store of the traced `make()`, never written
            shards = shards.replace(host=ShardedHostStores(hosts, axis))
        return cls(shards=shards, mesh=mesh, axis=axis)

    @property
    def num_shards(self) -> int:
        """`S`, the size of the mesh axis (Python int)."""
        return self.mesh.shape[self.axis]

    def shard(self, s: int) -> Any:
        """Shard `s` as a plain buffer on the default device (through a host copy: for inspection and tests). With
        several processes, a shard of this process's devices. A compressed shard keeps its host store: read it, but
        do not add to it (the sharded state would then be older than that store, and refused).

        Raises:
          ValueError: `s` not an int in `[0, S)`, or a shard held by another process.
        """
        s = _validate.static_int("s", s, 0, self.num_shards - 1)
        rows = [_local_rows(x) for x in jax.tree.leaves(self.shards)]
        if not all(s in r for r in rows):
            raise ValueError(f"s: shard {s} is held by another process (this one holds its devices' shards)")
        out = jax.tree.unflatten(jax.tree.structure(self.shards), [jnp.asarray(r[s]) for r in rows])
        return out.replace(host=self.shards.host.shards[s]) if isinstance(out, HostBacked) else out  # shares its store

    def local_batch(self, batch: Any) -> Any:
        """A global batch sharded along the mesh axis from this process's rows (`jax.make_array_from_process_local_data`):
        each process passes the rows of its own shards, leaves `[rows of this process, ...]`."""
        spec = NamedSharding(self.mesh, P(self.axis))
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(spec, np.asarray(x)), batch)

    def _check_split(self, args: dict, own: Callable | None = None) -> None:
        """`_validate.split_leaves` of the split arguments `{name: tree}` over this buffer's shards."""
        _validate.split_leaves(args, self.num_shards, self.axis, own)

    def _placed(self, tree: Any, spec: P) -> Any:
        """`tree` laid out as `spec` says; on a mesh axis of `AxisType.Explicit` shard_map requires it
        (replicated to sharded is a local slice), on an `Auto` axis shard_map lays its inputs out itself."""
        if self.mesh.axis_types[self.mesh.axis_names.index(self.axis)] != AxisType.Explicit:
            return tree
        return jax.tree.map(lambda x: jax.reshard(x, NamedSharding(self.mesh, spec)), tree)

    def _run(self, program: Callable, args: Any, replicated: tuple, names: dict | None = None) -> Any:
        """`program(shards, args, replicated)` with `args` split and `replicated` whole; a buffer output is wrapped.
        `names`: the split arguments by name, for the errors (default: `args[i]`)."""
        self._check_split({f"args[{i}]": a for i, a in enumerate(args)} if names is None else names)
        out = program(self.shards, self._placed(args, P(self.axis)), self._placed(replicated, P()))
        return self.replace(shards=out) if type(out) is type(self.shards) else out

    def apply(self, fn: Callable, *args: Any, replicated: tuple = ()) -> Any:
        """Run `fn(shard, *local_args, *replicated)` on every shard under `shard_map`.

        Args:
          fn: a pure function of one shard's buffer; static values (sizes, flags) go in its closure.
          args: pytrees of arrays whose leading axis (a multiple of `S`) is split into one block per shard.
          replicated: pytrees of arrays passed whole to every shard (keys, traced hyperparameters).

        Returns:
          A `ShardedBuffer` when `fn` returns a buffer of the wrapped type; otherwise `fn`'s output with a
          leading shard axis, leaves `[S, ...]` split along the mesh axis. Not cached: call it inside `jit`.

        Raises:
          TypeError: `fn` not callable, a leaf of `args` not an array.
          ValueError: an argument whose leading axis is not a multiple of `S` (named by its path).
        """
        _validate.instance("fn", fn, callable, "a function of one shard")
        spec = P(self.axis)
        program = jax.shard_map(_local_body(fn), mesh=self.mesh, in_specs=(spec, spec, P()), out_specs=spec, check_vma=False)
        return self._run(program, args, replicated)

    def add(self, *args: Any, **kwargs: Any) -> "ShardedBuffer":
        """The wrapped buffer's `add` on every shard, each with its block of rows.

        Every array argument (the batch or step, and the flags, priorities, rewards... of the buffer's `add`)
        has its leading axis (items or envs, a multiple of `S`) split into `S` contiguous blocks; Python values
        are passed as they are. Cost: the buffer's add on `1 / S` of the rows per shard, no communication.

        Raises:
          TypeError: a wrapped buffer without `add` (`EpisodeBuffer`: use `add_episodes`); an array argument's leaf
            not a JAX or numpy array of a dtype JAX holds as it is (a float64 numpy array with x64 off is refused, not
            narrowed), a keyword value neither an array nor hashable, a keyword the buffer's `add` does not take.
          ValueError: an array argument whose leading axis is not a multiple of `S` (named by its path); and the
            buffer's own `add` errors for one shard's block (a shape named as the caller passed it).
        """
        return self._add("add", args, kwargs)

    def add_episodes(self, episodes: Any, lengths: Any, **kwargs: Any) -> "ShardedBuffer":
        """`EpisodeBuffer.add_episodes` on every shard, shard-locally: `B = S * b` episodes (leaves `[B, T, ...]`,
        `lengths`, flags, `final_obs` and meta `[B, ...]`), episodes `[s * b, (s + 1) * b)` to shard `s` in batch
        order (`b = 1`: one episode per shard). A fixed (`circular=False`) shard without room writes nothing and sets
        its own `overflowed` (`buf.shards.overflowed`, bool `[S]`), as inside `jit`.

        Raises:
          TypeError: the wrapped buffer is not an `EpisodeBuffer`; an array JAX would narrow (numpy float64 or int64
            with x64 off), named by its path; and its own errors.
          ValueError: `B` not a multiple of `S` (named by its path); and the buffer's own errors.
        """
        inner = _device(self.shards)
        if isinstance(inner, EpisodeBuffer) and not isinstance(lengths, jax.core.Tracer):  # concrete: checked here, as unsharded
            _validate.episode_lengths("lengths", lengths, np.shape(lengths), inner.max_timesteps)
        return self._add("add_episodes", (episodes, lengths), kwargs)

    def _add(self, method: str, args: tuple, kwargs: dict) -> "ShardedBuffer":
        if not callable(getattr(type(self.shards), method, None)):
            other = " (use add_episodes)" if isinstance(_device(self.shards), EpisodeBuffer) else ""
            raise TypeError(f"{method}: {type(self.shards).__name__} has no {method}{other}")
        params = _validate.parameters(method, getattr(type(self.shards), method), kwargs)
        arrays, static = _split_static(kwargs)
        names = {**{params[i] if i < len(params) else f"args[{i}]": a for i, a in enumerate(args)}, **arrays}
        self._check_split(names, lambda: self._own_check(method, args, arrays, static))
        self._check_hosts(add=True)
        run = lambda: self._run(_program(self.mesh, self.axis, "add", method, static=static), (tuple(args), arrays), (), names)  # noqa: E731
        return _validate.shapes_passed(run, (args, arrays), self.num_shards)  # a shard's block refused: the shapes passed shown

    def _own_check(self, method: str, args: tuple, arrays: dict, static: tuple) -> None:
        """Raise the buffer's own refusal of shard 0's block (`_validate.refusal`; numpy leaves closed over: unnarrowed)."""
        n = self.num_shards
        if all(np.ndim(x) and np.shape(x)[0] % n == 0 for x in jax.tree.leaves((args, arrays)) if _validate.is_array(x)):
            block = jax.tree.map(lambda x: x[: np.shape(x)[0] // n] if _validate.is_array(x) else x, (args, arrays))
            fn = _local_fn(self.axis, "add", method, None, static)
            _validate.refusal(lambda b: fn(b, *block), jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), self.shards))

    def _check_hosts(self, add: bool) -> None:
        """The eager checks of a compressed buffer's stores before anything is dispatched: open, and for an add of a
        concrete state held by this process, every shard's version the version of its store (`StaleBufferError`
        otherwise; waits for the adds before it). Under a transformation (or with shards in other processes) the
        write callbacks refuse a stale state store by store."""
        if isinstance(self.shards, HostBacked):
            version = self.shards.version
            concrete = add and not isinstance(version, jax.core.Tracer) and version.is_fully_addressable
            self.shards.host.check_state("add" if add else "sample", version if concrete else None)

    def _own(self, arrays: dict) -> dict:
        """Pops from `arrays` the arguments of one row per shard: an episode filter `where`, bool `[S, max_episodes]`."""
        if not isinstance(_device(self.shards), EpisodeBuffer) or "where" not in arrays:
            return {}
        return {"where": _validate.array("where", arrays.pop("where"), (self.num_shards, self.shards.max_episodes), bool)}

    def _query(self, method: str, batch_size: int | None = None, **kwargs: Any) -> jax.Array:
        """Every shard's `method(batch_size, **kwargs)` (a method without a key), stacked `[S, ...]`."""
        arrays, static = _split_static(kwargs)
        own = self._own(arrays)
        return self._run(_program(self.mesh, self.axis, "query", method, batch_size, static), (own,), (arrays,))

    def size(self) -> jax.Array:
        """The number of items (steps) stored over all shards: the sum of the shards' `size()` (int32 scalar)."""
        return jnp.sum(self._query("size"), dtype=jnp.int32)

    def can_sample(self, batch_size: int = 1, *, method: str = "sample", every_shard: bool = True, **kwargs: Any) -> jax.Array:
        """Whether sampling with these arguments returns only valid data (bool scalar), from the shards' guards of
        `method` called with the same arguments without the key: `can_sample` for `"sample"` / `"sample_sequences"`,
        `can_sample_transitions` for `"sample_transitions"`; for an `EpisodeBuffer` `can_sample` (`where=`) for
        `"sample_episodes"`, `"sample_timesteps"`, and `can_sample_sequences` (`sequence_length=`, `where=`) for
        `"sample_sequences"`.

        Args:
          every_shard: static bool. True: every shard's guard holds, what `sample_local` needs. False: some shard's
            guard holds, what the global `sample` needs (a shard with nothing to draw is never drawn), e.g. with an
            episode filter that only some shards' episodes pass.

        Raises:
          ValueError: a `method` without a guard (e.g. `"minibatches"`: a rollout is read whole), `batch_size` not
            an int >= 1.
        """
        guards = _EPISODE_GUARDS if isinstance(_device(self.shards), EpisodeBuffer) else _GUARDS
        have = tuple(m for m, g in guards.items() if callable(getattr(self.shards, g, None)))
        _validate.choice("method", method, have, f"(the samplers of {type(self.shards).__name__} with a guard)")
        every_shard = _validate.static_bool("every_shard", every_shard)
        guard = self._query(guards[method], _validate.static_int("batch_size", batch_size), **kwargs)
        return jnp.all(guard) if every_shard else jnp.any(guard)

    def sample_local(self, key: jax.Array, batch_size: int, *, method: str = "sample", **kwargs: Any) -> Any:
        """Per-device sampling: every shard calls its own `method(fold_in(key, s), batch_size, **kwargs)`.

        Args:
          key: a PRNG key (shard `s` uses `jax.random.fold_in(key, s)`).
          batch_size: static int, items per shard (the buffer's sampler's second argument; `num_minibatches`
            for `RolloutBuffer.minibatches`).
          method: the sampler's name (`"sample"`, `"sample_sequences"`, `"sample_transitions"`, `"minibatches"`,
            and an `EpisodeBuffer`'s `"sample_episodes"`, `"sample_timesteps"`).
          kwargs: the sampler's other arguments; arrays (e.g. a traced `beta`) are passed to every shard, except an
            episode filter mask `where`, bool `[S, max_episodes]`, whose row `s` goes to shard `s` (a function of the
            meta dict filters each shard by its own meta).

        Returns:
          The sampler's output with a leading shard axis: leaves `[S, batch_size, ...]`, split along the mesh
          axis. Prioritised probabilities and weights are the shard's own (for the whole buffer's: `sample`).

        Raises:
          TypeError: `key` not one PRNG key.
          ValueError: `batch_size` not an int >= 1, `method` not a sampler of the wrapped buffer; and the sampler's
            own errors.
          RuntimeError: `method="minibatches"` as in `minibatches`.
        """
        batch_size, method = self._sampler(key, batch_size, method, _LOCAL_SAMPLERS)
        if method == "minibatches":
            self._require_advantages("sample_local(method='minibatches')", key)
        arrays, static = _split_static(kwargs)
        own = self._own(arrays)
        program = _program(self.mesh, self.axis, "local", method, batch_size, static)
        return self._run(program, (own,), (key, arrays))

    def sample(self, key: jax.Array, batch_size: int, *, method: str = "sample", **kwargs: Any) -> ShardedSample:
        """Global sampling: `batch_size` items from the whole buffer, each with its unsharded probability.

        Args:
          key: a PRNG key; every device draws the shards from the same key.
          batch_size: static int >= 1.
          method: the wrapped buffer's sampler (`"sample"` for item buffers, `"sample_sequences"` or
            `"sample_transitions"` for trajectory buffers; for an `EpisodeBuffer` one of `"sample_episodes"`,
            `"sample_sequences"`, `"sample_timesteps"`, `"sample_transitions"`).
          kwargs: the sampler's other arguments (`beta`, `sequence_length`, `n_step`, `gamma`, `where`, ...); an
            episode filter is a function of the meta dict or a mask as in `sample_local`.

        Returns:
          `ShardedSample` (replicated): the sampler's output with `indices` inside shard `shard`. Prioritised
          buffers' `probabilities` and `importance_weights` are those of the whole buffer (module doc).

        Raises:
          TypeError: a buffer type without a global sampler (`RolloutBuffer`: use `sample_local` or `minibatches`),
            `key` not one PRNG key, `beta` not a number.
          ValueError: `cross_episodes=False` (windows inside episodes differ per shard: use `sample_local`), a
            `method` the buffer has no global sampler for, or the sampler's own errors.
        """
        _global_rule(_device(self.shards), method, kwargs)  # its errors before any tracing (a buffer without a global sampler)
        batch_size, method = self._sampler(key, batch_size, method, _GLOBAL_SAMPLERS)
        arrays, static = _split_static(kwargs)
        own = self._own(arrays)
        program = _program(self.mesh, self.axis, "global", method, batch_size, static)
        beta = jnp.asarray(_validate.scalar_parameter("beta", kwargs.get("beta", 1.0), 0.0), jnp.float32)
        return program(self.shards, self._placed(own, P(self.axis)), *self._placed((key, arrays, beta), P()))

    def minibatches(self, key: jax.Array, num_minibatches: int) -> RolloutMinibatch:
        """One PPO epoch over the whole sharded rollout: the unsharded rollout's `minibatches(key, M)`, each
        minibatch split over the shards for a data-parallel learner (module doc, "Rollout epochs").

        Args:
          key: a PRNG key (the same on every device).
          num_minibatches: $M$, static int dividing each shard's `num_steps * num_envs`.

        Returns:
          `RolloutMinibatch` with leaves `[S, M, T * N / M, ...]` split along the mesh axis (`N` = envs per shard):
          shard `s` holds block `s` of each of the `M` minibatches of `S * T * N / M` steps, and every step of the
          rollout is in exactly one minibatch. `index` is the unsharded flat index `t * (S * N) + env`;
          `jnp.swapaxes(x, 0, 1).reshape(M, -1)` of a leaf is the unsharded `minibatches(key, M)` leaf bit for bit.

        Raises:
          TypeError: the wrapped buffer is neither a `RolloutBuffer` nor a `CompressedRolloutBuffer`.
          ValueError: `M` not an int >= 1 or not dividing a shard's `num_steps * num_envs`.
          RuntimeError: called eagerly in one process while a shard's `has_advantages` is False (under `jit`, or
            with several processes: NaN advantages and returns, as `RolloutBuffer.minibatches`).
        """
        if not isinstance(_device(self.shards), RolloutBuffer):
            raise TypeError(f"minibatches: {type(self.shards).__name__} is not a RolloutBuffer (item buffers: sample)")
        self._check_hosts(add=False)
        steps = self.shards.num_steps * self.shards.num_envs
        m = _validate.divisor("num_minibatches", num_minibatches, steps, "a shard's num_steps * num_envs")
        self._require_advantages("minibatches", key)
        program = _program(self.mesh, self.axis, "epoch", batch_size=m)
        return program(self.shards, self._placed(_validate.key("key", key), P()))

    def _require_advantages(self, what: str, key: Any) -> None:
        """`advantages_required` of the shards' flags, the key checked first."""
        advantages_required(_device(self.shards).has_advantages, what, lambda: _validate.key("key", key),
                            "buf.apply(lambda b, v: b.compute_gae(v, gamma, lam), last_value)")

    def _sampler(self, key: Any, batch_size: Any, method: Any, methods: tuple) -> tuple[int, str]:
        """`(batch_size, method)` of a sampling call, checked with its key before any program is built or looked up
        (a cached program is keyed by them: `2.0` would find the program of `2`)."""
        _validate.key("key", key)
        batch_size = _validate.static_int("batch_size", batch_size)
        self._check_hosts(add=False)
        have = tuple(m for m in methods if callable(getattr(self.shards, m, None)))
        _validate.choice("method", method, have, f"(the samplers of {type(self.shards).__name__})")
        return batch_size, method

    def set_priorities(self, shard: jax.Array, indices: jax.Array, priorities: jax.Array, generations: jax.Array) -> "ShardedBuffer":
        """`set_priorities` of a prioritised wrapped buffer after a global `sample`: entry `j` goes to shard
        `shard[j]` (all arguments `[B]`, replicated, as `ShardedSample` gives them). The running max priority, which
        new items receive, is then the maximum over every shard, as in one unsharded buffer.

        Raises:
          TypeError: the wrapped buffer is not prioritised, `shard` not an integer vector; ValueError: `shard` of
            another length than `indices`; and the buffer's own errors.
        """
        if not hasattr(self.shards, "set_priorities"):
            raise TypeError(f"set_priorities: {type(self.shards).__name__} has no priorities")
        indices = _validate.index_vector("indices", indices)  # checked here: JAX would refuse a non-array operand first
        b = indices.shape[0]
        priorities = _validate.vector("priorities", priorities, b, "floating")
        generations = _validate.vector("generations", generations, b, "integer")
        shard = _validate.index_vector("shard", shard)
        if shard.shape != (b,):
            raise ValueError(f"shard: expected shape ({b},) (one shard per entry of indices), got {shard.shape}")
        program = _program(self.mesh, self.axis, "set_priorities")
        return self._run(program, (), (shard, indices, priorities, generations))

    def update(self, shard: jax.Array, indices: jax.Array, fields: Any, *, steps: jax.Array | None = None,
               generations: jax.Array | None = None) -> "ShardedBuffer":
        """`update` of the wrapped buffer (`EpisodeBuffer.update`: relabel step or meta fields of stored episodes) after
        a global `sample`: entry `j` goes to shard `shard[j]`, slot `indices[j]` there (step `steps[j]`), as
        `ShardedSample` gives them. Arguments are replicated; each shard writes its own entries (the others get slot -1:
        ignored), with no communication. A shard-local edit: `apply(lambda b, i, f: b.update(i, f), indices, fields)`.

        Args:
          shard: int `[B]`, the shard of each entry. indices: int `[B]`, slots inside the shard.
          fields: `{name: values}` as the wrapped buffer's `update` takes them, leading axis `B`.
          steps: optional int `[B]`, as the wrapped buffer's `update`.
          generations: optional int `[B]`, as the wrapped buffer's `update` (stale generations skipped).

        Raises:
          TypeError: a wrapped buffer without `update` (only episode buffers have one), `shard` or `indices` not
            integer vectors, `fields` not a dict; and the buffer's own errors (fields named).
          ValueError: `shard` of another length than `indices`; and the buffer's own errors.
        """
        if not callable(getattr(self.shards, "update", None)):
            raise TypeError(f"update: {type(self.shards).__name__} has no update (episode buffers have one)")
        indices, shard = _validate.index_vector("indices", indices), _validate.index_vector("shard", shard)
        if shard.shape != indices.shape:
            raise ValueError(f"shard: expected shape {indices.shape} (one shard per entry of indices), got {shard.shape}")
        _validate.instance("fields", fields, Mapping, "a dict {name: values}")
        steps = None if steps is None else _validate.index_vector("steps", steps)
        generations = None if generations is None else _validate.vector("generations", generations, shard.shape[0], "integer")
        return self._run(_program(self.mesh, self.axis, "update"), (), (shard, indices, fields, steps, generations))
