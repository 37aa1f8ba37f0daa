"""rollout_stats: draw counts and advantage / return statistics against a plain-Python model."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb
from jaxbuffers.compressed import CompressedRolloutBuffer

T, N = 6, 4


def _rollout(rows: int, seed: int = 0):
    """A rollout of `rows` filled rows (of T) with random rewards, values, flags and trainable marks, after GAE."""
    rng = np.random.default_rng(seed)
    buf = jb.RolloutBuffer.create({"obs": jnp.zeros((8, 8), jnp.uint8)}, num_envs=N, num_steps=T)
    for _ in range(rows):
        buf = buf.add({"obs": jnp.asarray(rng.integers(0, 256, (N, 8, 8), dtype=np.uint8))},
                      reward=jnp.asarray(rng.normal(size=N), jnp.float32), value=jnp.asarray(rng.normal(size=N), jnp.float32),
                      terminated=jnp.asarray(rng.random(N) < 0.2), trainable=jnp.asarray(rng.random(N) < 0.8))
    return buf.compute_gae(last_value=jnp.zeros(N), gamma=0.9, gae_lambda=0.8)


def _model(buf, draws):
    """The same statistics by plain Python loops over the steps, in float64."""
    inner = getattr(buf, "buffer", buf)
    mask, adv, ret, val = (np.asarray(x) for x in (inner.learn_mask(), inner.advantages, inner.returns, inner.value))
    counts = [[0] * N for _ in range(T)]
    for i in np.asarray(draws).reshape(-1).tolist():
        counts[i // N][i % N] += 1
    learnt = [(t, e) for t in range(T) for e in range(N) if mask[t, e]]
    a = [float(adv[t, e]) for t, e in learnt]
    g = [float(ret[t, e]) for t, e in learnt]
    r = [float(ret[t, e]) - float(val[t, e]) for t, e in learnt]
    mean = lambda xs: sum(xs) / len(xs) if xs else math.nan  # noqa: E731
    var = lambda xs: sum((x - mean(xs)) ** 2 for x in xs) / len(xs) if xs else math.nan  # noqa: E731
    drawn = [counts[t][e] for t, e in learnt]
    return counts, {
        "learnt_steps": len(learnt), "never_drawn": sum(c == 0 for c in drawn), "draws_min": min(drawn, default=0),
        "draws_max": max(drawn, default=0),
        "wasted_draws": sum(counts[t][e] for t in range(T) for e in range(N) if not mask[t, e]),
        "advantage_mean": mean(a), "advantage_std": math.sqrt(var(a)) if a else math.nan, "advantage_min": min(a, default=math.nan),
        "advantage_max": max(a, default=math.nan), "advantage_positive": mean([float(x > 0) for x in a]),
        "return_mean": mean(g), "return_std": math.sqrt(var(g)) if g else math.nan, "return_min": min(g, default=math.nan),
        "return_max": max(g, default=math.nan),
        "explained_variance": 1 - var(r) / var(g) if g and var(g) > 0 else math.nan,
    }


def _check(s: jb.RolloutStats, buf, draws):
    counts, want = _model(buf, draws)
    np.testing.assert_array_equal(s.draw_count, counts)
    got = s.summary()
    for k, w in want.items():
        if isinstance(w, int):
            assert got[k] == w, k
        elif math.isnan(w):
            assert got[k] is None, k
        else:
            assert got[k] == pytest.approx(w, rel=1e-5, abs=1e-5), k


def test_epochs_of_minibatches_in_jit():
    buf = _rollout(T)

    @jax.jit
    def update(buf, key):  # three epochs of four minibatches, the indices a scan over them would gather
        idx = jnp.stack([buf.minibatch_indices(k, 4) for k in jax.random.split(key, 3)])
        return idx, jb.rollout_stats(buf, idx)

    idx, s = update(buf, jax.random.key(1))
    _check(s, buf, idx)
    mask = np.asarray(buf.learn_mask())
    assert (np.asarray(s.draw_count) == 3).all() and s.never_drawn == 0 and s.wasted_draws == 3 * int((~mask).sum())


def test_partial_rollout_and_repeated_draws():
    buf = _rollout(3, seed=2)  # rows 3..5 unfilled: masked out
    draws = np.array([0, 0, 0, 5, 23, 11, 11], np.int32)
    _check(jb.rollout_stats(buf, draws), buf, draws)
    mb = buf.gather(jnp.asarray(draws[:4]))
    _check(jb.rollout_stats(buf, mb), buf, draws[:4])  # a RolloutMinibatch counts its steps
    _check(jb.rollout_stats(buf), buf, np.zeros(0, np.int32))  # no draws: every learnt step never drawn


@pytest.mark.parametrize("compressed", [False, True])
def test_nothing_learnt_gives_nan_not_garbage(compressed):
    make = CompressedRolloutBuffer.create if compressed else jb.RolloutBuffer.create
    s = jb.rollout_stats(make({"obs": jnp.zeros((8, 8), jnp.uint8)}, num_envs=N, num_steps=T), jnp.arange(5))
    d = s.summary()
    assert d["learnt_steps"] == 0 and d["draws_min"] == 0 and d["wasted_draws"] == 5
    assert all(d[k] is None for k in ("advantage_mean", "advantage_std", "return_max", "explained_variance", "advantage_positive"))


def test_before_compute_gae_advantage_statistics_are_nan_not_zeros():
    buf = _rollout(T - 1, seed=3)
    stale = buf.add({"obs": jnp.zeros((N, 8, 8), jnp.uint8)}, reward=jnp.ones(N), value=jnp.ones(N),
                    terminated=jnp.zeros(N, bool))  # an add after GAE: advantages are stale
    draws = jnp.arange(7)
    for b in (stale, buf.reset()):
        d = jb.rollout_stats(b, draws).summary()
        assert all(d[k] is None for k in d if k.startswith(("advantage_", "return_")) or k == "explained_variance"), d
    after, before = jb.rollout_stats(buf, draws).summary(), jb.rollout_stats(stale, draws).summary()
    assert after["advantage_mean"] is not None and before["learnt_steps"] > after["learnt_steps"] > 0


def test_bad_draws_are_named():
    buf = _rollout(2)
    with pytest.raises(ValueError, match=r"draws: expected indices in \[0, 24\).*\[-1, 3\]"):
        jb.rollout_stats(buf, np.array([-1, 3]))
    with pytest.raises(ValueError, match=r"draws: .*\[0, 24\).*got values in \[0, 24\]"):
        jb.rollout_stats(buf, [0, 24])
    with pytest.raises(TypeError, match="draws: expected an integer dtype"):
        jb.rollout_stats(buf, np.array([0.5]))
    with pytest.raises(TypeError, match="buf: expected a RolloutBuffer"):
        jb.rollout_stats(jb.ReplayBuffer.create({"x": jnp.zeros(1)}, capacity=4))


def test_traced_out_of_range_draws_are_not_counted():
    buf = _rollout(2)
    counts = jax.jit(lambda d: jb.rollout_stats(buf, d).draw_count)(jnp.array([-1, -24, 24, 3], jnp.int32))
    expected = np.zeros(24, np.int32)
    expected[3] = 1
    np.testing.assert_array_equal(np.asarray(counts).reshape(-1), expected)  # -1 wrapped to step 23 before


def test_a_stacked_rollout_is_refused_outside_vmap():
    buf = _rollout(2)
    stacked = jax.tree.map(lambda x: jnp.stack([x, x]), buf)
    with pytest.raises(ValueError, match=r"^buf: a RolloutBuffer with a leading member axis of 2 \(buffers stacked with jax.vmap\)"):
        jb.rollout_stats(stacked, jnp.array([1], jnp.int32))
    counts = jax.vmap(lambda b: jb.rollout_stats(b, jnp.array([1], jnp.int32)).draw_count)(stacked)
    assert counts.shape == (2, *buf.reward.shape) and int(counts.sum()) == 2
