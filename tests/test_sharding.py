"""Sharded buffers on 8 forced host devices: content equal to the unsharded buffer, sampling frequencies, collectives.

The suite runs with one device; `test_on_eight_forced_devices` reruns this file in a subprocess with
`--xla_force_host_platform_device_count=8`, where the other tests run (they are deselected with fewer devices).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp

import numpy as np
import pytest
from scipy.stats import chi2

import jaxbuffers as jb
import jaxbuffers.disk
from jaxbuffers.sharding import _choose_shards

S = 8
eight = pytest.mark.devices(S)  # deselected with fewer devices: test_on_eight_forced_devices runs them


@pytest.mark.slow  # a subprocess of its own on 8 forced devices: python -m pytest -m slow tests/test_sharding.py
@pytest.mark.fewer_devices(S)
def test_on_eight_forced_devices():
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={S}",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "slow or not slow", __file__],
                          env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    ran = sum(1 for name, f in globals().items() if name.startswith("test_") and f is not test_on_eight_forced_devices)
    assert f"{ran} passed, 1 deselected" in last, proc.stdout[-2000:]  # every test ran there; only this one left out


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((S,), ("data",))


def _bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(f"u{x.dtype.itemsize}") if x.dtype != bool else x


def _p_value(counts: np.ndarray, expected: np.ndarray) -> float:
    keep = expected > 0
    assert counts[~keep].sum() == 0, "an item of probability 0 was drawn"
    stat = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return float(chi2.sf(stat, keep.sum() - 1))


ITEM = {"obs": jnp.zeros((3,), jnp.float32), "id": jnp.int32(0), "flag": jnp.bool_(False)}


def _items(rng, ids) -> dict:
    """Items with random float bits (negative zeros and NaNs included), their id and a flag."""
    obs = rng.standard_normal((len(ids), 3)).astype(np.float32)
    obs[::5, 0], obs[::7, 1] = -0.0, np.nan
    return {"obs": obs, "id": np.asarray(ids, np.int32), "flag": np.asarray(ids) % 3 == 0}


def _logical(buf, tree):
    """Leaves of an item buffer's storage in logical order (oldest first)."""
    nv, head, cap = int(buf.num_valid), int(buf.head), buf.capacity
    order = (head - nv + np.arange(nv)) % cap
    return jax.tree.map(lambda x: np.asarray(x)[order], tree)


def _assert_items_merge(sharded, whole, fields, c: int, b: int, replay=lambda buf: buf) -> None:
    """The item buffer's `fields(buf)` (leaves `[c]` per shard, `[S * c]` unsharded) in logical order, bit for bit:
    item l of shard s is item (l // b) * S * b + s * b + l % b of the unsharded buffer (`replay`: the item ring)."""
    per_shard = [_logical(replay(sh), fields(sh)) for sh in (sharded.shard(s) for s in range(S))]  # leaves [c, ...]
    expected = _logical(replay(whole), fields(whole))
    for name in expected:
        blocks = np.stack([p[name].reshape(c // b, b, *p[name].shape[1:]) for p in per_shard], axis=1)
        got = blocks.reshape(S * c, *blocks.shape[3:])
        np.testing.assert_array_equal(_bits(got), _bits(expected[name]), err_msg=name)


def _fill_item_buffers(mesh, make_shard, make_whole, adds, b, seed=0, priorities=False):
    """The same adds of `S * b` items to a sharded buffer and to one unsharded buffer (jitted, donated)."""
    rng = np.random.default_rng(seed)
    sharded = jb.ShardedBuffer.create(make_shard, mesh, "data")
    whole = make_whole()
    add_s = jax.jit(jb.ShardedBuffer.add, donate_argnums=0)
    add_w = jax.jit(type(whole).add, donate_argnums=0)
    for a in range(adds):
        batch = _items(rng, range(a * S * b, (a + 1) * S * b))
        extra = (rng.uniform(0.05, 3.0, S * b).astype(np.float32),) if priorities else ()
        sharded = add_s(sharded, batch, *extra)
        whole = add_w(whole, batch, *extra)
    return sharded, whole


@eight
def test_replay_content_is_the_unsharded_buffer_bit_for_bit(mesh):
    c, b = 12, 3  # b divides c; 7 adds of 24 items wrap the 96-item ring
    sharded, whole = _fill_item_buffers(
        mesh, lambda: jb.ReplayBuffer.create(ITEM, capacity=c), lambda: jb.ReplayBuffer.create(ITEM, capacity=S * c), 7, b
    )
    assert sharded.shards.storage["obs"].sharding.spec[0] == "data"
    _assert_items_merge(sharded, whole, lambda buf: buf.storage, c, b)
    assert int(sharded.size()) == int(whole.size()) == S * c
    assert bool(sharded.can_sample(4)) and not bool(jb.ShardedBuffer.create(lambda: jb.ReplayBuffer.create(ITEM, capacity=c), mesh, "data").can_sample(4))


@eight
def test_global_uniform_sampling_matches_the_unsharded_distribution(mesh):
    sharded, whole = _fill_item_buffers(
        mesh, lambda: jb.ReplayBuffer.create(ITEM, capacity=12), lambda: jb.ReplayBuffer.create(ITEM, capacity=96), 5, 3
    )
    ids_stored = np.asarray(whole.storage["id"])  # 96 items, each with probability 1/96 unsharded
    draw = jax.jit(lambda buf, keys: jax.lax.map(lambda k: buf.sample(k, 1024).sample.item, keys))
    out = draw(sharded, jax.random.split(jax.random.key(0), 100))  # 102,400 draws, one compile
    _check_rows(out, whole)
    counts = np.bincount(np.asarray(out["id"]).ravel(), minlength=ids_stored.max() + 1)[ids_stored]
    assert counts.sum() == 102_400
    assert _p_value(counts, np.full(96, 102_400 / 96)) > 1e-3


def _check_rows(items, whole):
    """Every sampled row is a stored item, whole (its id selects it in the unsharded storage)."""
    ids = np.asarray(items["id"]).reshape(-1)
    slot_of = {int(i): k for k, i in enumerate(np.asarray(whole.storage["id"]))}
    slots = np.array([slot_of[int(i)] for i in ids])
    for name in ITEM:
        got = np.asarray(items[name]).reshape(len(ids), *np.shape(whole.storage[name])[1:])
        np.testing.assert_array_equal(_bits(got), _bits(np.asarray(whole.storage[name])[slots]), err_msg=name)


def test_shard_choice_is_proportional_to_the_masses():
    key = jax.random.key(1)
    mass = jnp.array([0, 5, 1, 0, 10, 2, 0, 3], jnp.int32)
    got = np.bincount(np.asarray(jax.jit(_choose_shards, static_argnums=2)(key, mass, 200_000)), minlength=8)
    assert _p_value(got, np.asarray(mass) / 21 * 200_000) > 1e-3
    fmass = jnp.array([0.0, 0.5, 1e-3, 0.0, 2.0, 0.25, 0.0, 0.0], jnp.float32)
    got = np.bincount(np.asarray(_choose_shards(key, fmass, 100_000)), minlength=8)
    assert got[[0, 3, 6, 7]].sum() == 0
    assert _p_value(got, np.asarray(fmass) / float(fmass.sum()) * 100_000) > 1e-3


@eight
def test_global_prioritised_sampling_probabilities_and_weights_are_the_whole_buffers(mesh):
    alpha, beta = 0.7, 0.5
    sharded, whole = _fill_item_buffers(
        mesh, lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=16, priority_exponent=alpha),
        lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=128, priority_exponent=alpha), 6, 4, priorities=True,
    )
    # the items and their sum-tree leaves (priority ** alpha) in logical order: the unsharded buffer's, bit for bit
    _assert_items_merge(sharded, whole, lambda buf: {**buf.replay.storage, "leaf": buf.tree.leaves()}, 16, 4, lambda buf: buf.replay)
    leaves = np.asarray(whole.tree.leaves(), np.float64)
    p_whole = leaves / leaves.sum()
    totals = np.asarray(jax.vmap(lambda t: t.total())(sharded.shards.tree))
    assert totals.std() / totals.mean() > 0.02  # the shards' masses differ: the shard draw matters

    draw = jax.jit(lambda buf, keys: jax.lax.map(lambda k: buf.sample(k, 1024, beta=beta), keys))
    out = draw(sharded, jax.random.split(jax.random.key(2), 100))  # 102,400 draws
    _check_rows(out.sample.item, whole.replay)
    slot_of = {int(i): k for k, i in enumerate(np.asarray(whole.replay.storage["id"]))}
    slots = np.array([slot_of[int(i)] for i in np.asarray(out.sample.item["id"]).ravel()])
    counts = np.bincount(slots, minlength=128)
    assert _p_value(counts, p_whole * 102_400) > 1e-3
    # The whole buffer's probability and weight of every drawn item.
    np.testing.assert_allclose(np.asarray(out.sample.probabilities).ravel(), p_whole[slots], rtol=2e-5)
    w_whole = (leaves[slots] / leaves.min()) ** -beta
    np.testing.assert_allclose(np.asarray(out.sample.importance_weights).ravel(), w_whole, rtol=2e-5)
    assert np.asarray(out.sample.importance_weights).max() <= 1.0
    # A traced negative beta counts as 0, as in every prioritised buffer: every weight is 1.
    mins = np.asarray(jax.vmap(lambda t: t.min())(sharded.shards.tree))
    assert mins.max() > mins.min()  # the shards' minima differ: the rescaling of a shard's weights matters
    weights = jax.jit(lambda buf, b: buf.sample(jax.random.key(3), 1024, beta=b).sample.importance_weights)(sharded, -1.0)
    np.testing.assert_array_equal(np.asarray(weights), 1.0)


@eight
def test_global_priority_updates_reach_the_right_shard(mesh):
    sharded, whole = _fill_item_buffers(
        mesh, lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=8, priority_exponent=1.0),
        lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=64, priority_exponent=1.0), 2, 4,
    )
    out = jax.jit(lambda b, k: b.sample(k, 64))(sharded, jax.random.key(3))
    new = jnp.arange(1, 65, dtype=jnp.float32) * 10.0
    sharded = jax.jit(jb.ShardedBuffer.set_priorities)(sharded, out.shard, out.sample.indices, new, out.sample.generations)
    for j in range(64):
        s, i = int(out.shard[j]), int(out.sample.indices[j])
        last = max(k for k in range(64) if int(out.shard[k]) == s and int(out.sample.indices[k]) == i)  # last wins
        assert float(sharded.shard(s).priorities(jnp.array([i]))[0]) == pytest.approx(float(new[last]), rel=1e-6)
    assert np.all(np.asarray(sharded.shards.max_priority) == 640.0)  # the max over all shards, everywhere


@eight
def test_per_device_sampling_draws_each_shard_from_its_own_items(mesh):
    sharded, _ = _fill_item_buffers(
        mesh, lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=8),
        lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=64), 3, 4, priorities=True,
    )
    out = jax.jit(lambda b, k: b.sample_local(k, 32, beta=0.4))(sharded, jax.random.key(4))
    assert out.item["id"].shape == (S, 32) and out.item["id"].sharding.spec[0] == "data"
    ids = np.asarray(out.item["id"])
    for s in range(S):
        assert set(ids[s].tolist()) <= set(np.asarray(sharded.shard(s).replay.storage["id"]).tolist())
    assert np.all(np.asarray(out.importance_weights).max(axis=1) == 1.0)  # each shard normalises by its own max


STEP = {"obs": jnp.zeros((2,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}


def _steps(rng, e, t0):
    obs = rng.standard_normal((e, 2)).astype(np.float32)
    return {"obs": obs, "action": np.full(e, t0, np.int32), "reward": rng.standard_normal(e).astype(np.float32)}


@eight
def test_trajectory_lanes_sharded_equal_the_unsharded_lanes_and_samples_read_them(mesh):
    e, length = 16, 10
    rng = np.random.default_rng(5)
    sharded = jb.ShardedBuffer.create(lambda: jb.TrajectoryBuffer.create(STEP, num_envs=e // S, length=length, final_obs_capacity=4), mesh, "data")
    whole = jb.TrajectoryBuffer.create(STEP, num_envs=e, length=length, final_obs_capacity=4)
    add_s, add_w = jax.jit(jb.ShardedBuffer.add, donate_argnums=0), jax.jit(jb.TrajectoryBuffer.add, donate_argnums=0)
    for t in range(23):
        step = _steps(rng, e, t)
        term, trunc = rng.random(e) < 0.1, rng.random(e) < 0.15
        fin = rng.standard_normal((e, 2)).astype(np.float32)
        sharded = add_s(sharded, step, terminated=term, truncated=trunc, final_obs=fin)
        whole = add_w(whole, step, terminated=term, truncated=trunc, final_obs=fin)
    sh = sharded.shards
    merge = lambda x: np.asarray(x).reshape(e, *np.shape(x)[2:])  # noqa: E731 - [S, e/S, ...] -> [e, ...]
    for got, want in [(sh.storage, whole.storage), (sh.terminated, whole.terminated), (sh.truncated, whole.truncated),
                      (sh.final_obs, whole.final_obs), (sh.final_slot, whole.final_slot), (sh.final_head, whole.final_head)]:
        jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(merge(g)), _bits(w)), got, want)
    assert np.all(np.asarray(sh.head) == int(whole.head)) and np.all(np.asarray(sh.num_valid) == int(whole.num_valid))
    assert int(sharded.size()) == int(whole.size())
    for n in (3, 8, 9):
        assert bool(sharded.can_sample(8, method="sample_transitions", n_step=n)) == bool(whole.can_sample_transitions(8, n_step=n))
        inside = [bool(sharded.shard(s).can_sample(8, n, cross_episodes=False)) for s in range(S)]  # sample_local's guard
        assert bool(sharded.can_sample(8, method="sample_sequences", sequence_length=n, cross_episodes=False)) == all(inside)

    lanes = e // S
    to_global = lambda out: (out.shard * lanes + out.sample.indices // length) * length + out.sample.indices % length  # noqa: E731
    seq = jax.jit(lambda b, k: b.sample(k, 256, method="sample_sequences", sequence_length=4))(sharded, jax.random.key(6))
    ref = whole.sequences_at(to_global(seq), 4)
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(g), _bits(w)), (seq.sample.item, seq.sample.terminated), (ref.item, ref.terminated))
    tr = jax.jit(lambda b, k: b.sample(k, 256, method="sample_transitions", n_step=3, gamma=0.9))(sharded, jax.random.key(7))
    ref = whole.transitions_at(to_global(tr), n_step=3, gamma=0.9)
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(g), _bits(w)), tr.sample, ref._replace(indices=tr.sample.indices))
    assert len(np.unique(np.asarray(tr.shard))) == S
    with pytest.raises(ValueError, match="cross_episodes"):
        sharded.sample(jax.random.key(0), 8, method="sample_sequences", sequence_length=4, cross_episodes=False)


@eight
def test_global_uniform_samples_skip_shards_whose_final_observations_were_lost(mesh):
    _global_sample_after_lost_final_obs(mesh, prioritised=False)


@eight
def test_global_prioritised_samples_skip_shards_whose_final_observations_were_lost(mesh):
    _global_sample_after_lost_final_obs(mesh, prioritised=True)


def _global_sample_after_lost_final_obs(mesh, prioritised):
    """Shard 0's lanes truncate every step with one final-observation slot: each lane's windows start at its newest
    step, so shard 0 has no window of 3 steps and a global sample never draws it; the rows drawn read the true ones."""
    e, length = 16, 6
    make = (lambda n: jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=n, length=length, window_length=3, final_obs_capacity=1)) if prioritised \
        else (lambda n: jb.TrajectoryBuffer.create(STEP, num_envs=n, length=length, final_obs_capacity=1))  # noqa: E731
    sharded, whole = jb.ShardedBuffer.create(lambda: make(e // S), mesh, "data"), make(e)
    rng = np.random.default_rng(9)
    trunc = np.arange(e) < e // S  # the lanes of shard 0
    for t in range(9):
        step, fin = _steps(rng, e, t), rng.standard_normal((e, 2)).astype(np.float32)
        sharded = sharded.add(step, terminated=np.zeros(e, bool), truncated=trunc, final_obs=fin)
        whole = whole.add(step, terminated=np.zeros(e, bool), truncated=trunc, final_obs=fin)
    kw = {"beta": 1.0} if prioritised else {}
    tr = jax.jit(lambda b, k: b.sample(k, 256, method="sample_transitions", n_step=2, gamma=0.9, **kw))(sharded, jax.random.key(3))
    assert not np.any(np.asarray(tr.shard) == 0) and len(np.unique(np.asarray(tr.shard))) == S - 1
    lanes = e // S
    flat = (tr.shard * lanes + tr.sample.indices // length) * length + tr.sample.indices % length
    np.testing.assert_array_equal(np.asarray(tr.sample.next_obs), np.asarray(whole.transitions_at(flat, n_step=2, gamma=0.9).next_obs))
    if prioritised:  # (S - 1) shards of 2 lanes, 4 windows of 3 steps each, all of the initial priority
        np.testing.assert_allclose(np.asarray(tr.sample.probabilities), 1 / ((S - 1) * lanes * 4), rtol=1e-5)
    else:  # sequences aligned to a period: shard 0 still holds none, the others theirs (steps 4 and 6 of 3..8)
        sq = jax.jit(lambda b, k: b.sample(k, 256, method="sample_sequences", sequence_length=3, period=2))(sharded, jax.random.key(4))
        assert not np.any(np.asarray(sq.shard) == 0) and len(np.unique(np.asarray(sq.shard))) == S - 1
        flat = (sq.shard * lanes + sq.sample.indices // length) * length + sq.sample.indices % length
        assert np.asarray(whole.valid_starts(flat, 3, period=2)).all()
        np.testing.assert_array_equal(np.asarray(sq.sample.item["action"]), np.asarray(whole.sequences_at(flat, 3).item["action"]))


@eight
def test_rollout_sharded_over_envs_equals_the_unsharded_rollout(mesh):
    e, t_len = 16, 8
    rng = np.random.default_rng(8)
    sharded = jb.ShardedBuffer.create(lambda: jb.RolloutBuffer.create(STEP, num_envs=e // S, num_steps=t_len), mesh, "data")
    whole = jb.RolloutBuffer.create(STEP, num_envs=e, num_steps=t_len)
    for t in range(t_len):
        kw = dict(reward=rng.standard_normal(e).astype(np.float32), value=rng.standard_normal(e).astype(np.float32),
                  terminated=rng.random(e) < 0.2)
        step = _steps(rng, e, t)
        sharded, whole = sharded.add(step, **kw), whole.add(step, **kw)
    last = rng.standard_normal(e).astype(np.float32)
    sharded = sharded.apply(lambda b, v: b.compute_gae(v, 0.99, 0.95), last)
    whole = whole.compute_gae(last, 0.99, 0.95)
    merge = lambda x: np.moveaxis(np.asarray(x), 0, 1).reshape(t_len, e, *np.shape(x)[3:])  # noqa: E731 - [S, T, e/S] -> [T, e]
    for name in ("reward", "value", "terminated", "advantages", "returns"):
        np.testing.assert_array_equal(_bits(merge(getattr(sharded.shards, name))), _bits(getattr(whole, name)), err_msg=name)
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(merge(g)), _bits(w)), sharded.shards.step, whole.step)
    mb = sharded.sample_local(jax.random.key(9), 2, method="minibatches")
    assert mb.advantages.shape == (S, 2, t_len * e // S // 2)
    with pytest.raises(TypeError, match="sample_local"):
        sharded.sample(jax.random.key(0), 8)
    with pytest.raises(ValueError, match=r"step\['action'\]: expected a leading axis divisible by the 8 shards"):
        sharded.add(_steps(rng, 12, 0), **{k: v[:12] for k, v in kw.items()})


def _collectives(hlo: str) -> list[tuple[str, int]]:
    """(op, elements of its largest result) of every collective in compiled HLO text (tuple results included): an
    all-reduce's result is as large as its operand, a reduce-scatter's is one shard's block of it."""
    out = []
    ops = "all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter"
    for m in re.finditer(rf"^\s*\S+ = (.*?) ({ops})(?:-start)?\(", hlo, re.M):
        sizes = [int(np.prod([int(d) for d in dims.split(",") if d])) for dims in re.findall(r"\w+\[([\d,]*)\]", m.group(1))]
        out.append((m.group(2), max(sizes, default=1)))
    return out


@eight
def test_collectives_never_touch_storage(mesh):
    item = {"obs": jnp.zeros((64,), jnp.float32), "id": jnp.int32(0)}
    cap, batch = 8192, 256
    assert batch * 64 * 32 == cap * 64  # a shard's storage leaf is 32 times the largest collective allowed
    for make in (lambda: jb.ReplayBuffer.create(item, capacity=cap), lambda: jb.PrioritisedReplayBuffer.create(item, capacity=cap)):
        sharded = jb.ShardedBuffer.create(make, mesh, "data")
        add = jax.jit(jb.ShardedBuffer.add, donate_argnums=0).lower(sharded, jax.tree.map(lambda x: jnp.zeros((S * 16, *x.shape), x.dtype), item))
        assert _collectives(add.compile().as_text()) == []  # adds are purely local
        for fn, whole in ((lambda b, k: b.sample(k, batch), True), (lambda b, k: b.sample_local(k, batch), False)):
            lowered = jax.jit(fn).lower(sharded, jax.random.key(0))
            assert "all_gather" not in lowered.as_text()
            ops = _collectives(lowered.compile().as_text())
            assert all(op != "all-gather" for op, _ in ops), ops
            if whole:  # global sampling: the shard masses and the sampled items, nothing bigger
                assert ("all-reduce", batch * 64) in ops, ops
            assert all(n <= batch * 64 for _, n in ops), ops
    step = {"obs": jnp.zeros((64,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}
    for make, method, kw in (  # lanes: a shard's obs leaf [4, 2048, 64] is 32 times the sample's
        (lambda: jb.TrajectoryBuffer.create(step, num_envs=4, length=2048), "sample_transitions", {"n_step": 3, "gamma": 0.9}),
        (lambda: jb.PrioritisedTrajectoryBuffer.create(step, num_envs=4, length=2048, window_length=4), "sample_sequences", {"sequence_length": 4}),
    ):
        sharded = jb.ShardedBuffer.create(make, mesh, "data")
        n = batch // 4 if method == "sample_sequences" else batch  # sequences of 4 steps: as many steps as transitions
        for fn in (lambda b, k: b.sample(k, n, method=method, **kw), lambda b, k: b.sample_local(k, n // S, method=method, **kw)):
            lowered = jax.jit(fn).lower(sharded, jax.random.key(0))
            ops = _collectives(lowered.compile().as_text())
            assert "all_gather" not in lowered.as_text() and all(op != "all-gather" for op, _ in ops), (method, ops)
            assert all(m <= batch * 64 for _, m in ops), (method, ops)


@eight
def test_eager_calls_compile_once_per_shape(mesh, compile_counter):
    sharded = jb.ShardedBuffer.create(lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=8), mesh, "data")
    rng = np.random.default_rng(10)

    def step(sharded, i):
        sharded = sharded.add(_items(rng, range(16 * i, 16 * i + 16)))
        out = sharded.sample(jax.random.key(i), 8, beta=0.5)
        sharded = sharded.set_priorities(out.shard, out.sample.indices, out.sample.probabilities + 1, out.sample.generations)
        return sharded, sharded.sample_local(jax.random.key(i), 4, beta=0.5)

    sharded, _ = step(sharded, 0)
    with compile_counter() as compiles:
        for i in range(1, 4):
            sharded, local = step(sharded, i)
    assert compiles() == 0 and local.item["id"].shape == (S, 4)


@eight
def test_prioritised_trajectory_global_sampling_is_the_whole_buffers(mesh):
    e, length, window, beta = 16, 12, 3, 0.6
    lanes = e // S
    rng = np.random.default_rng(11)
    make = lambda n: jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=n, length=length, window_length=window, priority_exponent=0.8)  # noqa: E731
    sharded, whole = jb.ShardedBuffer.create(lambda: make(lanes), mesh, "data"), make(e)
    for t in range(15):
        step, term = _steps(rng, e, t), rng.random(e) < 0.1
        sharded, whole = sharded.add(step, terminated=term), whole.add(step, terminated=term)
    to_global = lambda shard, idx: (shard * lanes + idx // length) * length + idx % length  # noqa: E731
    # Shards drawn by their tree totals would not match windows drawn inside episodes only: refused, as unprioritised.
    with pytest.raises(ValueError, match="cross_episodes: global sampling draws shards by stored steps"):
        sharded.sample(jax.random.key(14), 8, method="sample_sequences", sequence_length=window, cross_episodes=False)
    draw = jax.jit(lambda b, k: b.sample(k, 64, method="sample_sequences", sequence_length=window, beta=beta))
    out = draw(sharded, jax.random.key(12))
    new = jnp.asarray(rng.uniform(0.1, 5.0, 64), jnp.float32)  # the same updates to both: unequal shard totals
    sharded = sharded.set_priorities(out.shard, out.sample.indices, new, out.sample.generations)
    whole = whole.set_priorities(to_global(out.shard, out.sample.indices), new, out.sample.generations)
    in_positions = lambda b, n: b.tree.leaves()[b._leaf(jnp.arange(n * length, dtype=jnp.int32))]  # noqa: E731
    merged = np.asarray(jax.vmap(lambda b: in_positions(b, lanes))(sharded.shards)).reshape(-1)
    np.testing.assert_array_equal(merged, np.asarray(in_positions(whole, e)))

    out = draw(sharded, jax.random.key(13))
    g = to_global(out.shard, out.sample.indices)
    leaf = np.asarray(whole.tree.get(whole._leaf(jnp.asarray(g))), np.float64)
    total, low = float(whole.tree.total()), float(whole.tree.min())
    np.testing.assert_allclose(np.asarray(out.sample.probabilities), leaf / total, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(out.sample.importance_weights), (leaf / low) ** -beta, rtol=2e-5)
    ref = whole.buffer.sequences_at(g, window)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(_bits(a), _bits(b)), (out.sample.item, out.sample.terminated), (ref.item, ref.terminated))


@eight
def test_donated_add_writes_every_shard_in_place(mesh):
    item = {"obs": jnp.zeros((64,), jnp.float32), "id": jnp.int32(0)}
    sharded = jb.ShardedBuffer.create(lambda: jb.PrioritisedReplayBuffer.create(item, capacity=4096), mesh, "data")
    add = jax.jit(jb.ShardedBuffer.add, donate_argnums=0)
    batch = {"obs": np.ones((64, 64), np.float32), "id": np.arange(64, dtype=np.int32)}
    pointers = lambda b: [s.data.unsafe_buffer_pointer() for s in b.shards.replay.storage["obs"].addressable_shards]  # noqa: E731
    sharded = add(sharded, batch)
    before = pointers(sharded)
    sharded = add(sharded, batch)
    assert pointers(sharded) == before and len(before) == S


EP_STEP = {"obs": jnp.zeros((2,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}
EP_META = {"task": jnp.int32(0), "id": jnp.int32(-1)}


def _episode_buffers(mesh, c=6, b=2, adds=5, t_max=7, seed=20):
    """The same `add_episodes` of `S * b` episodes (random lengths, flags, tasks; meta `id` = episode number) to a
    sharded buffer of `c` slots per shard and to one unsharded buffer of `S * c` slots; 5 adds of 16 wrap 48 slots."""
    rng = np.random.default_rng(seed)
    make = lambda e: jb.EpisodeBuffer.create(EP_STEP, max_episodes=e, max_timesteps=t_max, meta=EP_META)  # noqa: E731
    sharded, whole = jb.ShardedBuffer.create(lambda: make(c), mesh, "data"), make(S * c)
    add_s, add_w = jax.jit(jb.ShardedBuffer.add_episodes, donate_argnums=0), jax.jit(jb.EpisodeBuffer.add_episodes, donate_argnums=0)
    for a in range(adds):
        n = S * b
        obs = rng.standard_normal((n, t_max, 2)).astype(np.float32)
        obs[::3, 0, 0] = -0.0
        eps = {"obs": obs, "action": rng.integers(0, 9, (n, t_max)).astype(np.int32),
               "reward": rng.standard_normal((n, t_max)).astype(np.float32)}
        kw = dict(terminated=rng.random(n) < 0.5, truncated=rng.random(n) < 0.3, final_obs=rng.standard_normal((n, 2)).astype(np.float32),
                  meta={"task": rng.integers(0, 3, n).astype(np.int32), "id": np.arange(a * n, (a + 1) * n, dtype=np.int32)})
        lengths = rng.integers(1, t_max + 1, n).astype(np.int32)
        sharded, whole = add_s(sharded, eps, lengths, **kw), add_w(whole, eps, lengths, **kw)
    return sharded, whole


def _check_episodes(every, expected, c: int, b: int) -> None:
    """`every`, the shards' `get_all` stacked `[S, c, ...]` (logical order, oldest first), holds `expected`, the
    unsharded buffer's, bit for bit: episode l of shard s is episode (l // b) * S * b + s * b + l % b of it."""
    def merge(x):
        blocks = np.asarray(x).reshape(S, c // b, b, *np.shape(x)[2:]).swapaxes(0, 1)
        return blocks.reshape(S * c, *blocks.shape[3:])
    for field in ("item", "mask", "lengths", "terminated", "truncated", "final_obs", "meta"):
        got = jax.tree.map(merge, getattr(every, field))
        jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=field), got, getattr(expected, field))


@eight
def test_update_after_a_global_sample_edits_the_unsharded_buffers_episodes(mesh):
    c, b = 6, 2
    sharded, whole = _episode_buffers(mesh, c, b)
    slot_of = {int(i): k for k, i in enumerate(np.asarray(whole.meta["id"]))}
    out = sharded.sample(jax.random.key(24), 16, method="sample_timesteps")  # relabel single steps
    slots = np.array([slot_of[int(i)] for i in np.asarray(out.sample.meta["id"])])
    reward = (slots * 100 + np.asarray(out.sample.steps)).astype(np.float32)  # a step drawn twice gets one value
    sharded = sharded.update(out.shard, out.sample.indices, {"reward": reward}, steps=out.sample.steps)
    whole = whole.update(slots, {"reward": reward}, steps=out.sample.steps)
    stale = sharded.update(out.shard, out.sample.indices, {"reward": -reward}, steps=out.sample.steps,
                           generations=out.sample.generations + 1)  # the generations of other episodes: nothing written
    np.testing.assert_array_equal(np.asarray(stale.shards.storage["reward"]), np.asarray(sharded.shards.storage["reward"]))
    eps = sharded.sample(jax.random.key(25), 8, method="sample_episodes")  # relabel whole episodes and their meta
    slots = np.array([slot_of[int(i)] for i in np.asarray(eps.sample.meta["id"])])
    fields = {"reward": -(slots[:, None] * 10.0 + np.arange(whole.max_timesteps)).astype(np.float32), "task": (slots % 4 + 5).astype(np.int32)}
    sharded, whole = sharded.update(eps.shard, eps.sample.indices, fields), whole.update(slots, fields)
    _check_episodes(sharded.apply(lambda buf: buf.get_all()), whole.get_all(), c, b)
    with pytest.raises(TypeError, match="update: ReplayBuffer has no update"):
        jb.ShardedBuffer.create(lambda: jb.ReplayBuffer.create(ITEM, capacity=8), mesh, "data").update(out.shard, out.sample.indices, {})
    with pytest.raises(ValueError, match=r"shard: expected shape \(16,\)"):
        sharded.update(out.shard[:4], out.sample.indices, {"reward": reward}, steps=out.sample.steps)
    with pytest.raises(TypeError, match=r"fields\['rewards'\]|unknown names \['rewards'\]"):
        sharded.update(out.shard, out.sample.indices, {"rewards": reward}, steps=out.sample.steps)


@eight
def test_episode_content_is_the_unsharded_buffer_bit_for_bit(mesh):
    c, b = 6, 2
    sharded, whole = _episode_buffers(mesh, c, b)
    assert sharded.shards.storage["obs"].sharding.spec[0] == "data"
    _check_episodes(sharded.apply(lambda buf: buf.get_all()), whole.get_all(), c, b)
    assert int(sharded.size()) == int(whole.size())
    mask = np.asarray(sharded.shards.meta["task"]) == 2  # [S, c]: row s filters shard s
    local = jax.jit(lambda b, k, m: b.sample_local(k, 16, method="sample_episodes", where=m))(sharded, jax.random.key(27), mask)
    ids = np.asarray(sharded.shards.meta["id"])
    assert mask.any(axis=1).sum() >= S // 2
    for s in range(S):  # each shard draws only its own episodes that pass its row of the mask
        assert set(np.asarray(local.meta["id"])[s].tolist()) <= set(ids[s][mask[s]].tolist()) or not mask[s].any()
    assert bool(sharded.can_sample(4, method="sample_episodes")) and bool(sharded.can_sample(4, method="sample_sequences", sequence_length=7, every_shard=False))
    for n in (1, 3, 7):  # the guard of sample_transitions takes its arguments
        inside = [bool(sharded.shard(s).can_sample_transitions(2, n_step=n, gamma=0.9)) for s in range(S)]
        assert bool(sharded.can_sample(2, method="sample_transitions", n_step=n, gamma=0.9)) == all(inside)
    with pytest.raises(ValueError, match="n_step"):
        sharded.can_sample(2, method="sample_transitions", n_step=8)


def _episode_frequencies(sharded, whole, draws: int):
    """Global timesteps and sequences under a meta filter, and episodes under a mask, against the unsharded
    distributions (chi-square, alpha 0.001), each drawn row read back from the unsharded buffer bit for bit."""
    slot_of = {int(i): k for k, i in enumerate(np.asarray(whole.meta["id"]))}
    task = np.asarray(whole.meta["task"])
    lengths = np.asarray(whole.lengths)
    keep = lambda m: m["task"] != 0  # noqa: E731 - one function object: one compile
    e, t_max = whole.max_episodes, whole.max_timesteps
    batches = draws // 1024
    keys = jax.random.split(jax.random.key(21), batches)

    steps = jax.jit(lambda buf, ks: jax.lax.map(lambda k: buf.sample(k, 1024, method="sample_timesteps", where=keep).sample, ks))(sharded, keys)
    slots = np.array([slot_of[int(i)] for i in np.asarray(steps.meta["id"]).ravel()])
    t = np.asarray(steps.steps).ravel()
    np.testing.assert_array_equal(_bits(np.asarray(steps.item["obs"]).reshape(-1, 2)), _bits(np.asarray(whole.storage["obs"])[slots, t]))
    cells = np.zeros((e, t_max))
    np.add.at(cells, (slots, t), 1)
    expected = (np.arange(t_max)[None, :] < lengths[:, None]) & (task[:, None] != 0)
    assert _p_value(cells.ravel(), expected.ravel() / expected.sum() * batches * 1024) > 1e-3

    seq = jax.jit(lambda buf, ks: jax.lax.map(lambda k: buf.sample(k, 1024, method="sample_sequences", sequence_length=3, where=keep).sample, ks))(sharded, keys)
    slots = np.array([slot_of[int(i)] for i in np.asarray(seq.meta["id"]).ravel()])
    starts = np.asarray(seq.starts).ravel()
    windows = np.asarray(whole.storage["reward"])[slots[:, None], starts[:, None] + np.arange(3)]
    np.testing.assert_array_equal(_bits(np.asarray(seq.item["reward"]).reshape(-1, 3)), _bits(windows))
    cells = np.zeros((e, t_max))
    np.add.at(cells, (slots, starts), 1)
    expected = (np.arange(t_max)[None, :] <= lengths[:, None] - 3) & (task[:, None] != 0)
    assert _p_value(cells.ravel(), expected.ravel() / expected.sum() * batches * 1024) > 1e-3

    mask = np.asarray(sharded.shards.meta["task"]) == 2  # [S, c]: row s filters shard s
    eps = jax.jit(lambda buf, ks, m: jax.lax.map(lambda k: buf.sample(k, 256, method="sample_episodes", where=m).sample, ks))(sharded, keys, mask)
    slots = np.array([slot_of[int(i)] for i in np.asarray(eps.meta["id"]).ravel()])
    np.testing.assert_array_equal(_bits(np.asarray(eps.item["obs"]).reshape(len(slots), t_max, 2)), _bits(np.asarray(whole.storage["obs"])[slots]))
    counts = np.bincount(slots, minlength=e)
    assert _p_value(counts, (task == 2) / (task == 2).sum() * batches * 256) > 1e-3


@eight
def test_episode_global_sampling_matches_the_unsharded_distribution(mesh):
    sharded, whole = _episode_buffers(mesh)
    _episode_frequencies(sharded, whole, 102_400)  # 102,400 steps and windows, 25,600 episodes
    tr = jax.jit(lambda b, k: b.sample(k, 256, method="sample_transitions", n_step=3, gamma=0.9))(sharded, jax.random.key(22))
    slot_of = {int(i): k for k, i in enumerate(np.asarray(whole.meta["id"]))}
    slots = np.array([slot_of[int(i)] for i in np.asarray(tr.sample.meta["id"])])
    ref = whole.transitions_at(slots, tr.sample.steps, n_step=3, gamma=0.9)
    got = tr.sample._replace(indices=ref.indices, generations=ref.generations)  # both shard-local
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(g), _bits(w)), got, ref)
    assert len(np.unique(np.asarray(tr.shard))) == S


@eight
def test_eager_episode_calls_compile_once_on_an_auto_mesh(compile_counter):
    auto = jax.sharding.Mesh(np.array(jax.devices()), ("data",))  # AxisType.Auto: XLA picks the output layouts
    sharded = jb.ShardedBuffer.create(lambda: jb.EpisodeBuffer.create(EP_STEP, max_episodes=4, max_timesteps=3), auto, "data")
    eps = {"obs": np.ones((S, 3, 2), np.float32), "action": np.ones((S, 3), np.int32), "reward": np.ones((S, 3), np.float32)}

    def step(sharded, i):
        sharded = sharded.add_episodes(eps, np.full(S, 1 + i % 3, np.int32), terminated=np.ones(S, bool), final_obs=np.ones((S, 2), np.float32))
        return sharded, sharded.sample(jax.random.key(i), 8, method="sample_timesteps")

    sharded, _ = step(sharded, 0)
    with compile_counter() as compiles:
        for i in range(1, 3):
            sharded, out = step(sharded, i)
    assert compiles() == 0 and int(sharded.size()) == S * (1 + 2 + 3)


@eight
def test_rollout_epoch_is_the_unsharded_epoch_split_over_shards(mesh):
    e, t_len, m = 16, 8, 4
    rng = np.random.default_rng(24)
    sharded = jb.ShardedBuffer.create(lambda: jb.RolloutBuffer.create(STEP, num_envs=e // S, num_steps=t_len), mesh, "data")
    whole = jb.RolloutBuffer.create(STEP, num_envs=e, num_steps=t_len)
    for t in range(t_len - 1):  # one step short: unfilled steps are in the epoch, masked
        kw = dict(reward=rng.standard_normal(e).astype(np.float32), value=rng.standard_normal(e).astype(np.float32),
                  terminated=rng.random(e) < 0.2, trainable=rng.random(e) < 0.9)
        step = _steps(rng, e, t)
        sharded, whole = sharded.add(step, **kw), whole.add(step, **kw)
    key = jax.random.key(25)
    with pytest.raises(RuntimeError, match=r"^minibatches: .*has_advantages is False\); call buf\.apply\(lambda b, v: b\.compute_gae"):
        sharded.minibatches(key, m)  # compute_gae forgotten: refused eagerly, NaN advantages and returns under jit
    with pytest.raises(RuntimeError, match=r"^sample_local\(method='minibatches'\): .*has_advantages is False"):
        sharded.sample_local(key, m, method="minibatches")
    early = jax.jit(lambda b, k: b.minibatches(k, m))(sharded, key)
    assert np.isnan(np.asarray(early.advantages)).all() and np.isnan(np.asarray(early.returns)).all()
    last = rng.standard_normal(e).astype(np.float32)
    sharded = sharded.apply(lambda b, v: b.compute_gae(v, 0.99, 0.95), last)
    whole = whole.compute_gae(last, 0.99, 0.95)
    out = jax.jit(lambda b, k: b.minibatches(k, m))(sharded, key)
    assert out.advantages.shape == (S, m, t_len * e // S // m) and out.advantages.sharding.spec[0] == "data"
    index = np.asarray(out.index)
    assert np.array_equal(np.sort(index.ravel()), np.arange(t_len * e))  # every step exactly once per epoch
    ref = whole.minibatches(key, m)
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(np.swapaxes(np.asarray(g), 0, 1).reshape(w.shape)), _bits(w)), out, ref)
    assert not np.asarray(out.mask).all() and np.asarray(out.mask).any()
    assert not np.array_equal(index, np.asarray(jax.jit(lambda b, k: b.minibatches(k, m))(sharded, jax.random.key(26)).index))
    with pytest.raises(ValueError, match=r"num_minibatches: expected a divisor of a shard's num_steps \* num_envs = 16"):
        sharded.minibatches(key, 3)
    with pytest.raises(TypeError, match="RolloutBuffer"):
        jb.ShardedBuffer.create(lambda: jb.ReplayBuffer.create(ITEM, capacity=8), mesh, "data").minibatches(key, 2)


@eight
def test_compressed_rollout_epoch_is_the_unsharded_epoch_decoded_where_each_step_lives(mesh):
    _compressed_epoch(mesh, e=16, t_len=6, m=4, adds=6)  # full: the epoch reads no row on a shard that lacks it


@eight
def test_episode_samples_and_epochs_move_no_storage(mesh):
    t_max, feat = 64, 64
    step = {"obs": jnp.zeros((feat,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}
    sharded = jb.ShardedBuffer.create(lambda: jb.EpisodeBuffer.create(step, max_episodes=128, max_timesteps=t_max), mesh, "data")
    episodes = jax.tree.map(lambda x: jnp.zeros((S, t_max, *x.shape), x.dtype), step)
    add = jax.jit(jb.ShardedBuffer.add_episodes, donate_argnums=0).lower(
        sharded, episodes, jnp.ones(S, jnp.int32), terminated=jnp.ones(S, bool), final_obs=jnp.zeros((S, feat)))
    assert _collectives(add.compile().as_text()) == []
    storage = 128 * t_max * feat  # one shard's obs leaf
    for method, kw, size in (("sample_timesteps", {}, 64 * feat), ("sample_episodes", {}, 8 * t_max * feat),
                             ("sample_sequences", {"sequence_length": 4}, 64 * 4 * feat)):
        batch = 8 if method == "sample_episodes" else 64
        lowered = jax.jit(lambda b, k: b.sample(k, batch, method=method, **kw)).lower(sharded, jax.random.key(0))
        assert "all_gather" not in lowered.as_text()
        ops = _collectives(lowered.compile().as_text())
        assert all(op != "all-gather" for op, _ in ops) and ("all-reduce", size) in ops, (method, ops)
        assert max(n for _, n in ops) == size < storage, (method, ops)

    rollout = jb.ShardedBuffer.create(lambda: jb.RolloutBuffer.create(step, num_envs=4, num_steps=256), mesh, "data")
    lowered = jax.jit(lambda b, k: b.minibatches(k, 32)).lower(rollout, jax.random.key(0))
    assert "all_gather" not in lowered.as_text()
    ops = _collectives(lowered.compile().as_text())
    block = 4 * 256 // 32 * feat  # a shard's block of one minibatch of obs (the result; its operand is S times that)
    assert {op for op, _ in ops} == {"reduce-scatter"} and max(n for _, n in ops) == block, ops


def test_compressed_buffers_need_one_store_per_shard(tmp_path):
    one = jax.make_mesh((1,), ("data",))
    step = {"obs": jnp.zeros((8, 8), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    for make in (lambda: jb.CompressedTrajectoryBuffer.create(step, num_envs=1, length=8),
                 lambda: jb.CompressedEpisodeBuffer.create(step, max_episodes=2, max_timesteps=4),
                 lambda: jb.CompressedRolloutBuffer.create(step, num_envs=1, num_steps=4)):
        sharded = jb.ShardedBuffer.create(make, one, "data")
        assert isinstance(sharded.shards.host, jb.compressed.ShardedHostStores) and sharded.shards.version.shape == (1,)
        made = make()  # one buffer closed over: two shards would share its store
        with pytest.raises(ValueError, match="make: returned buffers sharing one host store; each shard needs its own"):
            jb.compressed.ShardedHostStores.made(lambda: made, 2)
    opened = jaxbuffers.disk.open(tmp_path / "disk", "w", jb.CompressedTrajectoryBuffer.create(step, num_envs=1, length=8, codec="none"))
    with pytest.raises(TypeError, match=r"make: builds a disk-backed buffer \(its host store is a folder\)"):
        jb.ShardedBuffer.create(lambda: opened, one, "data")
    _compressed_epoch(one, e=2, t_len=4, m=2, adds=3)  # the global epoch of a compressed rollout on one shard


def _compressed_epoch(mesh, e: int, t_len: int, m: int, adds: int) -> None:
    """The global epoch (`minibatches`) of a sharded compressed rollout (frame stacks of 4, normalised) after `adds`
    steps is the unsharded compressed rollout's epoch bit for bit, GAE fields included: every step exactly once; each
    shard's store decodes only its own steps, once per epoch, in one read per minibatch; steps not added are zeros."""
    s = mesh.shape["data"]
    make = lambda n: jb.CompressedRolloutBuffer.create(PIX, num_envs=n, num_steps=t_len, frame_stack=4, normalize_images=True)  # noqa: E731
    sharded, whole = jb.ShardedBuffer.create(lambda: make(e // s), mesh, "data"), make(e)
    rng = np.random.default_rng(27)
    for (step, kw), _ in zip(_pixel_steps(rng, e, adds), range(adds)):
        kw = dict(value=rng.standard_normal(e).astype(np.float32), terminated=kw["terminated"], truncated=kw["truncated"],
                  final_value=rng.standard_normal(e).astype(np.float32))
        sharded, whole = sharded.add(step, reward=step["reward"], **kw), whole.add(step, reward=step["reward"], **kw)
    last = rng.standard_normal(e).astype(np.float32)
    sharded = sharded.apply(lambda b, v: b.compute_gae(v, 0.99, 0.95), last)
    whole = whole.compute_gae(last, 0.99, 0.95)
    decoded = [[] for _ in range(s)]  # per shard and read: the rows holding a written slot (what the store decodes)
    for h, rows in zip(sharded.shards.host.shards, decoded):
        def spy(v, ids, outs, read=h.read_into, rows=rows, h=h):
            slots, sv = np.asarray(ids[0]).reshape(len(ids[0]), -1) % h.num_slots, h.slot_version  # -1: the last slot
            rows.append(int((sv[np.minimum(slots, sv.size - 1)] * (slots < sv.size) > 0).any(1).sum()))
            return read(v, ids, outs)
        h.read_into = spy
    key = jax.random.key(28)
    out = jax.block_until_ready(jax.jit(lambda b, k: b.minibatches(k, m))(sharded, key))
    assert [len(r) for r in decoded] == [m] * s and [sum(r) for r in decoded] == [adds * e // s] * s, decoded
    assert np.array_equal(np.sort(np.asarray(out.index).ravel()), np.arange(t_len * e))  # every step exactly once
    ref = whole.minibatches(key, m)
    assert ref.step["obs"].dtype == jnp.float32 and np.asarray(ref.step["obs"]).any()
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(np.swapaxes(np.asarray(g), 0, 1).reshape(w.shape)), _bits(w)), out, ref)
    assert np.asarray(out.advantages).any() and np.asarray(out.mask).all() == (adds == t_len)
    assert not np.asarray(ref.step["obs"])[np.asarray(ref.index) >= adds * e].any()  # steps not added: zeros


def test_episode_calls_are_checked_before_tracing():
    one = jax.make_mesh((1,), ("data",))
    sharded = jb.ShardedBuffer.create(lambda: jb.EpisodeBuffer.create(EP_STEP, max_episodes=4, max_timesteps=3, meta=EP_META), one, "data")
    with pytest.raises(TypeError, match=r"add: EpisodeBuffer has no add \(use add_episodes\)"):
        sharded.add({"obs": np.zeros((1, 3, 2), np.float32)})
    with pytest.raises(ValueError, match=r"method: expected one of \('sample_episodes'.*for an EpisodeBuffer, got 'sample'"):
        sharded.sample(jax.random.key(0), 4)
    with pytest.raises(ValueError, match=r"method: expected one of \('sample_sequences'.*\(the samplers of EpisodeBuffer\), got 'sample'"):
        sharded.sample_local(jax.random.key(0), 4)
    with pytest.raises(ValueError, match=r"where: expected shape \(1, 4\), got \(4,\)"):
        sharded.sample(jax.random.key(0), 4, method="sample_episodes", where=np.ones(4, bool))
    with pytest.raises(TypeError, match="where: expected dtype bool, got int32"):
        sharded.can_sample(4, method="sample_episodes", where=np.ones((1, 4), np.int32))
    with pytest.raises(TypeError, match=r"minibatches: EpisodeBuffer is not a RolloutBuffer"):
        sharded.minibatches(jax.random.key(0), 2)
    eps = {"obs": np.ones((1, 3, 2), np.float32), "action": np.ones((1, 3), np.int32), "reward": np.ones((1, 3), np.float32)}
    sharded = sharded.add_episodes(eps, np.array([2], np.int32), terminated=np.array([True]), final_obs=np.ones((1, 2), np.float32),
                                   meta={"task": np.array([1], np.int32)})
    assert int(sharded.size()) == 2 and bool(sharded.can_sample(1, method="sample_sequences", sequence_length=2))
    assert not bool(sharded.can_sample(1, method="sample_timesteps", where=lambda m: m["task"] == 0))


def test_arrays_jit_would_narrow_are_refused_not_cast():
    one = jax.make_mesh((1,), ("data",))
    sharded = jb.ShardedBuffer.create(lambda: jb.EpisodeBuffer.create(EP_STEP, max_episodes=4, max_timesteps=3, meta=EP_META), one, "data")
    eps = {"obs": np.ones((1, 3, 2), np.float64), "action": np.ones((1, 3), np.int32), "reward": np.ones((1, 3), np.float32)}
    with pytest.raises(TypeError, match=r"episodes\['obs'\]: expected dtype float32, got float64 \(nothing is cast"):  # as unsharded
        sharded.add_episodes(eps, np.array([2], np.int32), terminated=np.array([True]), final_obs=np.ones((1, 2), np.float32))
    eps["obs"] = eps["obs"].astype(np.float32)
    with pytest.raises(TypeError, match=r"lengths: dtype int64 would be narrowed to int32"):
        sharded.add_episodes(eps, np.array([2], np.int64), terminated=np.array([True]), final_obs=np.ones((1, 2), np.float32))
    assert int(sharded.size()) == 0
    replay = jb.ShardedBuffer.create(lambda: jb.ReplayBuffer.create(ITEM, capacity=4), one, "data")
    with pytest.raises(TypeError, match=r"batch\['obs'\]: expected dtype float32, got float64"):
        replay.add({"obs": np.ones((2, 3)), "id": np.zeros(2, np.int32), "flag": np.zeros(2, bool)})


# --- compressed buffers: one host store per shard ---

PIX = {"obs": jnp.zeros((4, 6, 6), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
E, LENGTH, KCAP = 16, 10, 4


def _pixel_steps(rng, e, adds):
    """`adds` steps of `e` lanes as a frame stacker gives them (4 frames, reset at an episode end), with flags and
    final observations; low-valued frames, so the codec and the frame deltas have something to do."""
    stack = np.repeat(rng.integers(0, 4, (e, 1, 6, 6), np.uint8), 4, axis=1)
    for t in range(adds):
        term, trunc = rng.random(e) < 0.1, rng.random(e) < 0.15
        fin = np.concatenate([stack[:, 1:], rng.integers(0, 4, (e, 1, 6, 6), np.uint8)], axis=1)
        yield ({"obs": stack.copy(), "action": np.full(e, t, np.int32), "reward": rng.standard_normal(e).astype(np.float32)},
               dict(terminated=term, truncated=trunc, final_obs=fin))
        new = rng.integers(0, 4, (e, 6, 6), np.uint8)
        stack = np.concatenate([stack[:, 1:], new[:, None]], axis=1)
        ends = term | trunc
        stack[ends] = new[ends][:, None]


def _pixel_buffers(mesh, adds=23, seed=30, prioritised=False, more=0):
    """The same adds to a sharded compressed trajectory buffer (E / S lanes per shard, frame_stack 4, keyframes every
    8 frames) and to one unsharded buffer of E lanes; with `more`, also the list of the `more` steps that follow."""
    cls = jb.CompressedPrioritisedTrajectoryBuffer if prioritised else jb.CompressedTrajectoryBuffer
    extra = dict(window_length=2) if prioritised else {}
    make = lambda e: cls.create(PIX, num_envs=e, length=LENGTH, frame_stack=4, final_obs_capacity=KCAP, **extra)  # noqa: E731
    sharded, whole = jb.ShardedBuffer.create(lambda: make(E // S), mesh, "data"), make(E)
    add_s, add_w = jax.jit(jb.ShardedBuffer.add, donate_argnums=0), jax.jit(cls.add, donate_argnums=0)
    steps = _pixel_steps(np.random.default_rng(seed), E, adds + more)
    for step, kw in itertools.islice(steps, adds):
        sharded, whole = add_s(sharded, step, **kw), add_w(whole, step, **kw)
    return (sharded, whole, list(steps)) if more else (sharded, whole)


def _global_positions(out, n=E // S):
    """Unsharded flat positions (lane * length + slot) of a global sample's rows."""
    return np.asarray((out.shard * n + out.sample.indices // LENGTH) * LENGTH + out.sample.indices % LENGTH)


@eight
def test_compressed_trajectory_shards_hold_the_unsharded_content_bit_for_bit(mesh):
    sharded, whole = _pixel_buffers(mesh)
    sh, t, n = sharded.shards, whole.trajectory, E // S
    merge = lambda x: np.asarray(x).reshape(E, *np.shape(x)[2:])  # noqa: E731 - [S, n, ...] -> [E, ...]
    for got, want in [(sh.trajectory.storage["action"], t.storage["action"]), (sh.trajectory.storage["reward"], t.storage["reward"]),
                      (sh.trajectory.terminated, t.terminated), (sh.trajectory.truncated, t.truncated),
                      (sh.next_ep_pos, whole.next_ep_pos), (sh.next_key_pos, whole.next_key_pos), (sh.final_head, whole.final_head)]:
        np.testing.assert_array_equal(_bits(merge(got)), _bits(want))
    assert np.all(np.asarray(sh.frame_head) == int(whole.frame_head)) and np.all(np.asarray(sh.version) == int(whole.version))
    # every stored observation, lane by lane in logical order (oldest first), decoded from its shard's store
    nv, head = int(t.num_valid), int(t.head)
    order = (head - nv + np.arange(nv)) % LENGTH
    want = np.asarray(whole.decode_obs(t.storage["obs"][:, order]))
    for s in range(S):
        one = sharded.shard(s)
        np.testing.assert_array_equal(np.asarray(one.decode_obs(one.trajectory.storage["obs"][:, order])), want[s * n:(s + 1) * n])
    # each shard's store holds exactly its own lanes' entries (frame rings, then final frames) at shard-local ids
    ring = whole.frame_ring
    for s, h in enumerate(sh.host.shards):
        frames, finals = np.arange(n * ring), np.arange(n * KCAP)
        got = h.read(np.int32(h.version), frames, n * ring + finals)
        ref = whole.host.read(np.int32(whole.host.version), s * n * ring + frames, E * ring + s * n * KCAP + finals)
        for g, w in zip(got, ref):
            np.testing.assert_array_equal(g, w)
        assert h.num_writes == h.version == 23  # one write per add, on every shard
    assert sum(h.num_rows for h in sh.host.shards) == whole.host.num_rows
    assert sharded.shards.host_nbytes == sum(h.nbytes for h in sh.host.shards)


def _spy_rows(sharded) -> dict:
    """Per shard, the rows of each read whose slots are not all the never-written one (what the store decodes)."""
    rows = {}
    for s, h in enumerate(sharded.shards.host.shards):
        def spy(version, ids, outs, s=s, read=h.read_into, empty=h.num_slots - 1):
            rows.setdefault(s, set()).update(np.flatnonzero(np.any([(np.asarray(x) != empty).reshape(len(x), -1).any(1) for x in ids], 0)).tolist())
            return read(version, ids, outs)
        h.read_into = spy
    return rows


@eight
def test_compressed_trajectory_shards_refuse_stacks_they_cannot_rebuild_in_their_write(mesh):
    """Each shard's write callback checks its own lanes' stacks against its store's last frames (the shard index is
    the callback's first operand): stacks whose oldest frame was changed are refused by the program, naming the leaf,
    env and step, and no shard's store or state changes; the step as a frame stacker gives it is then added."""
    from compressed_bad_input import host_record

    sharded, _, steps = _pixel_buffers(mesh, adds=3, more=1)
    step, kw = steps[0]
    bad = {**step, "obs": np.array(step["obs"])}
    bad["obs"][:, 0] = 255  # frames hold values below 4: no lane's stack continues or starts an episode this way
    before = ([np.asarray(x).tobytes() for x in jax.tree.leaves(sharded)], [host_record(h) for h in sharded.shards.host.shards])
    add = jax.jit(jb.ShardedBuffer.add)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"step\['obs'\]: env \d+, step 0 of the add is not the stack"):
        jax.block_until_ready(add(sharded, bad, **kw))
    assert ([np.asarray(x).tobytes() for x in jax.tree.leaves(sharded)], [host_record(h) for h in sharded.shards.host.shards]) == before
    jax.block_until_ready(add(sharded, step, **kw))


@eight
def test_compressed_global_samples_are_the_unsharded_rows_and_decode_only_their_own(mesh):
    sharded, whole = _pixel_buffers(mesh)
    rows = _spy_rows(sharded)
    tr = jax.jit(lambda b, k: b.sample(k, 64, method="sample_transitions", n_step=3, gamma=0.9))(sharded, jax.random.key(31))
    ref = whole.decode(whole.buffer.transitions_at(_global_positions(tr), n_step=3, gamma=0.9))
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(g), _bits(w)), tr.sample._replace(indices=ref.indices), ref)
    shard = np.asarray(tr.shard)
    assert len(np.unique(shard)) == S and all(rows[s] == set(np.flatnonzero(shard == s).tolist()) for s in range(S)), rows
    seq = jax.jit(lambda b, k: b.sample(k, 32, method="sample_sequences", sequence_length=4))(sharded, jax.random.key(32))
    ref = whole.decode(whole.buffer.sequences_at(_global_positions(seq), 4))
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(g), _bits(w)), (seq.sample.item, seq.sample.terminated), (ref.item, ref.terminated))
    local = sharded.sample_local(jax.random.key(33), 4, method="sample_transitions", n_step=1, gamma=0.9)
    for s in (0, S - 1):  # each shard decodes its own draws from its own store
        mine = sharded.shard(s).sample_transitions(jax.random.fold_in(jax.random.key(33), s), 4, n_step=1, gamma=0.9)
        jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(np.asarray(g)[s]), _bits(w)), local, mine)


def _compressed_frequencies(mesh, draws: int) -> None:
    """Global n-step transitions of a sharded compressed buffer: uniform over the unsharded buffer's windows
    (chi-square, alpha 0.001), every drawn observation the unsharded buffer's."""
    sharded, whole = _pixel_buffers(mesh, seed=34)
    t, n_step = whole.trajectory, 2
    keys = jax.random.split(jax.random.key(35), draws // 1024)
    out = jax.jit(lambda b, ks: jax.lax.map(lambda k: b.sample(k, 1024, method="sample_transitions", n_step=n_step, gamma=0.9), ks))(sharded, keys)
    flat = jax.tree.map(lambda x: np.asarray(x).reshape(-1, *np.shape(x)[2:]), out)
    pos = _global_positions(flat)
    counts = np.bincount(pos, minlength=E * LENGTH)
    nv, head = int(t.num_valid), int(t.head)
    starts = (head - nv + np.arange(nv - n_step)) % LENGTH  # the windows of n_step + 1 steps, per lane
    expected = np.zeros((E, LENGTH))
    expected[:, starts] = 1
    assert _p_value(counts, expected.ravel() / expected.sum() * len(pos)) > 1e-3
    first = slice(0, 256)  # the observations of some rows, against the unsharded buffer's
    ref = whole.decode(whole.buffer.transitions_at(pos[first], n_step=n_step, gamma=0.9))
    np.testing.assert_array_equal(flat.sample.obs[first], np.asarray(ref.obs))
    np.testing.assert_array_equal(flat.sample.next_obs[first], np.asarray(ref.next_obs))


@eight
def test_compressed_global_sampling_matches_the_unsharded_distribution(mesh):
    _compressed_frequencies(mesh, 4096)


@pytest.mark.slow
@eight
def test_compressed_global_sampling_matches_the_unsharded_distribution_over_100k_draws(mesh):
    _compressed_frequencies(mesh, 102_400)


@eight
def test_compressed_prioritised_sampling_and_collectives(mesh):
    sharded, whole = _pixel_buffers(mesh, adds=12, prioritised=True)
    out = jax.jit(lambda b, k: b.sample(k, 64, method="sample_transitions", n_step=1, gamma=0.9, beta=0.5))(sharded, jax.random.key(36))
    pr = np.random.default_rng(37).uniform(0.1, 3.0, 64).astype(np.float32)
    sharded = sharded.set_priorities(out.shard, out.sample.indices, pr, out.sample.generations)
    whole = whole.set_priorities(_global_positions(out), pr, out.sample.generations)
    out = jax.jit(lambda b, k: b.sample(k, 64, method="sample_transitions", n_step=1, gamma=0.9, beta=0.5))(sharded, jax.random.key(38))
    g = _global_positions(out)
    tree = whole.buffer.tree
    leaf, total, low = np.asarray(tree.get(whole.buffer._leaf(jnp.asarray(g))), np.float64), float(tree.total()), float(tree.min())
    np.testing.assert_allclose(np.asarray(out.sample.probabilities), leaf / total, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(out.sample.importance_weights), (leaf / low) ** -0.5, rtol=2e-5)
    ref = whole.decode(whole.trajectory.transitions_at(g, n_step=1, gamma=0.9))
    np.testing.assert_array_equal(np.asarray(out.sample.obs), np.asarray(ref.obs))
    np.testing.assert_array_equal(np.asarray(out.sample.next_obs), np.asarray(ref.next_obs))
    # the programs: adds local, samples gather nothing; no collective larger than the sample (64 stacks of 4 x 6 x 6)
    batch = jax.tree.map(lambda x: jnp.zeros((E, *x.shape), x.dtype), PIX)
    add = jax.jit(lambda b, x: b.add(x, terminated=jnp.zeros(E, bool))).lower(sharded, batch)
    assert _collectives(add.compile().as_text()) == []
    for fn in (lambda b, k: b.sample(k, 64, method="sample_transitions", n_step=1, gamma=0.9),
               lambda b, k: b.sample_local(k, 8, method="sample_sequences", sequence_length=2)):
        lowered = jax.jit(fn).lower(sharded, jax.random.key(0))
        ops = _collectives(lowered.compile().as_text())
        assert "all_gather" not in lowered.as_text() and all(op != "all-gather" for op, _ in ops), ops
        assert all(n <= 64 * 4 * 6 * 6 for _, n in ops), ops


@eight
def test_compressed_sharded_checkpoint_round_trip_and_stale_states(mesh, tmp_path):
    sharded, _, [(step, kw)] = _pixel_buffers(mesh, adds=12, more=1)
    path = jb.save(tmp_path / "ck", sharded)
    target = jb.ShardedBuffer.create(lambda: jb.CompressedTrajectoryBuffer.create(
        PIX, num_envs=E // S, length=LENGTH, frame_stack=4, final_obs_capacity=KCAP), mesh, "data")
    restored = jb.restore(path, target)
    assert isinstance(restored, jb.ShardedBuffer) and restored.shards.trajectory.storage["reward"].sharding.spec[0] == "data"
    for h, r in zip(sharded.shards.host.shards, restored.shards.host.shards):  # every entry of every shard's store
        assert r is not h and r.version == h.version == 12
        for g, w in zip(r.read(np.int32(12), np.arange(h.num_slots)), h.read(np.int32(12), np.arange(h.num_slots))):
            np.testing.assert_array_equal(g, w)
    draw = jax.jit(lambda b, k: b.sample(k, 32, method="sample_transitions", n_step=2, gamma=0.9))
    for before, after in ((sharded, restored), (sharded.add(step, **kw), restored.add(step, **kw))):  # then adds continue alike
        jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(g), _bits(w)), draw(before, jax.random.key(40)), draw(after, jax.random.key(40)))
    # `sharded` is now older than its stores: refused eagerly, under jit (by every shard's write callback) and by save
    with pytest.raises(jb.StaleBufferError, match=r"add \(shard 0\): this buffer state has version 12 but its host store is at version 13"):
        sharded.add(step, **kw)
    with pytest.raises(jax.errors.JaxRuntimeError, match="version 12 but its host store is at version 13"):
        jax.block_until_ready(jax.jit(jb.ShardedBuffer.add)(sharded, step, **kw))
    with pytest.raises(jb.StaleBufferError, match="save: this buffer state has version 12"):
        jb.save(tmp_path / "stale", sharded)
    assert [h.version for h in sharded.shards.host.shards] == [13] * S


@eight
def test_compressed_callbacks_inside_shard_map_run_once_per_shard_with_io_callbacks(mesh):
    """The ordered `io_callback` writes and `pure_callback` reads (forced; the other tests use `buffer_callback`):
    one write per add on every shard, inside `lax.scan` too, and the samples read the unsharded rows."""
    from jaxbuffers.compressed._common import forced_callbacks

    with forced_callbacks(False):
        sharded, whole, chunk = _pixel_buffers(mesh, adds=4, seed=41, more=5)
        xs = jax.tree.map(lambda *x: np.stack(x), *chunk)
        scan = lambda buf, xs: jax.lax.scan(lambda b, x: (b.add(x[0], **x[1]), None), buf, xs)[0]  # noqa: E731
        sharded, whole = jax.jit(scan, donate_argnums=0)(sharded, xs), jax.jit(scan, donate_argnums=0)(whole, xs)
        assert [(h.version, h.num_writes) for h in sharded.shards.host.shards] == [(9, 9)] * S
        tr = jax.jit(lambda b, k: b.sample(k, 64, method="sample_transitions", n_step=1, gamma=0.9))(sharded, jax.random.key(43))
        ref = whole.decode(whole.buffer.transitions_at(_global_positions(tr), n_step=1, gamma=0.9))
        np.testing.assert_array_equal(np.asarray(tr.sample.obs), np.asarray(ref.obs))
        np.testing.assert_array_equal(np.asarray(tr.sample.next_obs), np.asarray(ref.next_obs))


@eight
def test_compressed_episode_shards_sample_and_update_as_the_unsharded_buffer(mesh):
    c, b, t_max = 4, 1, 5
    step = {"obs": jnp.zeros((6, 6), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    make = lambda e: jb.CompressedEpisodeBuffer.create(step, max_episodes=e, max_timesteps=t_max, meta=EP_META)  # noqa: E731
    sharded, whole = jb.ShardedBuffer.create(lambda: make(c), mesh, "data"), make(S * c)
    rng = np.random.default_rng(44)
    for a in range(6):  # 48 episodes into 32 slots: the rings wrap
        n = S * b
        eps = {"obs": rng.integers(0, 4, (n, t_max, 6, 6)).astype(np.uint8), "action": rng.integers(0, 9, (n, t_max)).astype(np.int32),
               "reward": rng.standard_normal((n, t_max)).astype(np.float32)}
        kw = dict(terminated=rng.random(n) < 0.5, truncated=rng.random(n) < 0.3, final_obs=rng.integers(0, 4, (n, 6, 6)).astype(np.uint8),
                  meta={"task": rng.integers(0, 3, n).astype(np.int32), "id": np.arange(a * n, (a + 1) * n, dtype=np.int32)})
        lengths = rng.integers(1, t_max + 1, n).astype(np.int32)
        sharded, whole = sharded.add_episodes(eps, lengths, **kw), whole.add_episodes(eps, lengths, **kw)
    _check_episodes(sharded.apply(lambda buf: buf.get_all()), whole.get_all(), c, b)
    slot_of = {int(i): k for k, i in enumerate(np.asarray(whole.buffer.meta["id"]))}
    keep = lambda m: m["task"] != 0  # noqa: E731
    tr = sharded.sample(jax.random.key(45), 32, method="sample_transitions", n_step=2, gamma=0.9, where=keep)
    slots = np.array([slot_of[int(i)] for i in np.asarray(tr.sample.meta["id"])])
    ref = whole.transitions_at(slots, tr.sample.steps, n_step=2, gamma=0.9)
    got = tr.sample._replace(indices=ref.indices, generations=ref.generations)  # both shard-local
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(_bits(g), _bits(w)), got, ref)
    fields = {"reward": (slots[:, None] * 10.0 + np.arange(t_max)).astype(np.float32), "task": (slots % 3).astype(np.int32)}
    sharded, whole = sharded.update(tr.shard, tr.sample.indices, fields), whole.update(slots, fields)
    _check_episodes(sharded.apply(lambda buf: buf.get_all()), whole.get_all(), c, b)
