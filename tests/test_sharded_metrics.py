"""Usage metrics of a `ShardedBuffer` (`record`, `stats`): counts and ages of global and per-device samples against a
plain-Python model of every shard's ring and against the unsharded buffer fed the same data, eagerly and under `jit`.

The suite runs with one device (a mesh of one shard); `test_on_four_forced_devices` reruns this file on four forced
host devices under `-m slow`, where each shard counts only its own part of a global sample.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb
from metrics_model import RingModel, assert_stats, metrics_of

S = min(jax.device_count(), 4)
MESH = jax.make_mesh((S,), ("data",), devices=jax.devices()[:S])
ITEM = {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}
STEP = {"obs": jax.ShapeDtypeStruct((2,), jnp.float32), "action": jax.ShapeDtypeStruct((), jnp.int32),
        "reward": jax.ShapeDtypeStruct((), jnp.float32)}
CAP, E, L = 5, 2, 6  # item capacity per shard; envs per shard and steps per lane of the trajectory buffers
# (items added per shard before the draw, global or per-device draw, items added between the draw and its record):
# the rings wrap, and uniform draws of slots overwritten before their record count at their new items' ages while
# prioritised ones (with generations) count as stale
OPS = [(2, "global", 0), (1, "local", 0), (2, "global", 2), (0, "local", 1), (1, "global", 0), (2, "local", 2)]
RECORD = jax.jit(jb.ShardedBuffer.record, donate_argnums=0)


def _zeros(spec, lead):
    return jax.tree.map(lambda s: jnp.zeros((*lead, *s.shape), s.dtype), spec)


def _record(buf, out, step: int):
    """`buf.record(out)`, every other step through a jitted, donated call."""
    return RECORD(buf, out) if step % 2 else buf.record(out)


def _rows(out, mode: str):
    """Per shard, the `(indices, generations or None)` of its draws in a global or per-device sample."""
    if mode == "local":
        idx, gens = np.asarray(out.indices), getattr(out, "generations", None)
        return [(idx[s], None if gens is None else np.asarray(gens)[s]) for s in range(S)]
    shard, gens = np.asarray(out.shard), getattr(out.sample, "generations", None)
    idx = np.asarray(out.sample.indices)
    return [(idx[shard == s], None if gens is None else np.asarray(gens)[shard == s]) for s in range(S)]


@pytest.mark.parametrize("cls", [pytest.param(jb.ReplayBuffer, marks=pytest.mark.slow), jb.PrioritisedReplayBuffer])
def test_item_buffers_count_each_draw_in_its_shard_as_a_model_of_every_shard(cls):
    buf = jb.ShardedBuffer.create(lambda: cls.create(ITEM, CAP), MESH, "data")
    models = [RingModel(CAP) for _ in range(S)]
    key = jax.random.key(3)
    for step, (before, mode, between) in enumerate(OPS):
        if before:
            buf = buf.add(_zeros(ITEM, (S * before,)))
            [m.add(before) for m in models]
        key, k = jax.random.split(key)
        out = buf.sample(k, 6) if mode == "global" else buf.sample_local(k, 3)
        if between:
            buf = buf.add(_zeros(ITEM, (S * between,)))
            [m.add(between) for m in models]
        buf = _record(buf, out, step)
        for m, (idx, gens) in zip(models, _rows(out, mode)):
            m.record(idx, gens)
        assert_stats(buf.stats(), models)
        counts = np.asarray(metrics_of(buf.shards).sample_count)
        np.testing.assert_array_equal(counts, np.stack([m.count.ravel() for m in models]))
    assert buf.stats()["stale"] > 0 if cls is jb.PrioritisedReplayBuffer else buf.stats()["stale"] == 0


@pytest.mark.parametrize("prioritised", [pytest.param(False, marks=pytest.mark.slow), True])
def test_trajectory_stats_are_the_unsharded_buffers_fed_the_same_data(prioritised):
    """Sharded over its envs, a trajectory buffer's lanes are the unsharded buffer's, so recording the same draws
    (positions mapped to the unsharded lanes) gives the same stats, key for key, and the same per-position counts."""
    if prioritised:
        make = lambda envs: jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=envs, length=L, window_length=2)  # noqa: E731
        draw = {"method": "sample_sequences"}
    else:
        make = lambda envs: jb.TrajectoryBuffer.create(STEP, num_envs=envs, length=L)  # noqa: E731
        draw = {"method": "sample_transitions", "n_step": 1, "gamma": 0.9}
    sharded, whole = jb.ShardedBuffer.create(lambda: make(E), MESH, "data"), make(S * E)
    key = jax.random.key(5)

    def add(sharded, whole, n: int, step: int):
        steps, term = _zeros(STEP, (S * E, n)), jnp.zeros((S * E, n), bool).at[:, -1].set(step == 2)  # an episode end
        return sharded.add(steps, terminated=term), whole.add(steps, terminated=term)

    for step, (before, mode, between) in enumerate(OPS):
        if before:
            sharded, whole = add(sharded, whole, before, step)
        key, k = jax.random.split(key)
        out = sharded.sample(k, 5, **draw) if mode == "global" else sharded.sample_local(k, 3, **draw)
        if between:
            sharded, whole = add(sharded, whole, between, step)
        sharded = _record(sharded, out, step)
        rows = _rows(out, mode)
        # shard s's position lane * L + slot is lane s * E + lane of the unsharded buffer
        idx = np.concatenate([s * E * L + i for s, (i, _) in enumerate(rows)])
        gens = None if rows[0][1] is None else np.concatenate([g for _, g in rows])
        inner = out.sample if mode == "global" else out
        fields = {"indices": jnp.asarray(idx, jnp.int32)} | ({} if gens is None else {"generations": jnp.asarray(gens)})
        whole = whole.record(type(inner)(**{f: fields.get(f) for f in inner._fields}))
        assert sharded.stats() == whole.stats()
        np.testing.assert_array_equal(np.asarray(metrics_of(sharded.shards).sample_count).reshape(S * E, L),
                                      np.asarray(metrics_of(whole).sample_count).reshape(S * E, L))
    assert whole.stats()["samples"] > 0


def test_stats_without_per_position_counts():
    buf = jb.ShardedBuffer.create(lambda: jb.ReplayBuffer.create(ITEM, CAP, metrics=False), MESH, "data")
    buf = buf.add(_zeros(ITEM, (S * 2,)))
    buf = buf.record(buf.sample(jax.random.key(0), 4)).record(buf.sample_local(jax.random.key(1), 3))
    s = buf.stats()
    assert "sample_count" not in s
    assert (s["inserts"], s["samples"], s["record_calls"], s["stale"]) == (2 * S, 4 + 3 * S, 2, 0)


@pytest.mark.slow  # a subprocess of its own on 4 forced devices: python -m pytest -m slow tests/test_sharded_metrics.py
@pytest.mark.fewer_devices(4)
def test_on_four_forced_devices(forced_devices):
    assert "6 passed, 1 deselected" in forced_devices(__file__, 4, "test_on_four_forced_devices")  # every other test ran


def test_stats_under_jit_names_the_host_read():
    """`stats` reads the shards' counters on the host: under `jit` a TypeError says so and what to read inside (it
    was JAX's TracerArrayConversionError)."""
    buf = jb.ShardedBuffer.create(lambda: jb.ReplayBuffer.create(ITEM, CAP), MESH, "data").add(_zeros(ITEM, (S,)))
    assert buf.stats()["inserts"] == S
    with pytest.raises(TypeError, match=r"^ShardedBuffer\.stats is read on the host: call it outside jit/vmap; "
                                        r"inside, read the counters in buf\.shards\.metrics"):
        jax.jit(lambda b: b.stats())(buf)
    assert buf.shards.metrics.totals.shape[0] == S
