"""Tests of jaxbuffers.episode_sampling: the samplers of EpisodeBuffer (uniform over what passes a filter, empty rows
when nothing does, bootstrapping at episode ends). The model-based test of every sampler against a plain-Python
store is in tests/test_episode.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_episode import EXAMPLE, META, assert_empty_rows, filled

from jaxbuffers.episode import EpisodeBuffer


def test_sampling_is_uniform_over_what_passes():
    """Chi-square: episodes uniform over the passing episodes; steps uniform over their steps."""
    buf = filled()
    where = buf.meta["task_id"] == 1  # a mask: slots 1, 2, 4 (lengths 2, 3, 5)
    draws = 30_000
    s = jax.jit(lambda k: buf.sample_episodes(k, draws, where=where))(jax.random.key(0))
    counts = np.bincount(np.asarray(s.indices), minlength=6)
    assert counts[[0, 3, 5]].sum() == 0
    assert stats.chisquare(counts[[1, 2, 4]]).pvalue > 1e-3
    ts = jax.jit(lambda k: buf.sample_timesteps(k, draws, where=where))(jax.random.key(1))
    cells = np.asarray(ts.indices) * 5 + np.asarray(ts.steps)
    want = [i * 5 + t for i, n in [(1, 2), (2, 3), (4, 5)] for t in range(n)]
    counts = np.bincount(cells, minlength=30)
    assert counts.sum() == counts[want].sum()
    assert stats.chisquare(counts[want]).pvalue > 1e-3
    sq = jax.jit(lambda k: buf.sample_sequences(k, draws, 3, where=where))(jax.random.key(2))
    cells = np.asarray(sq.indices) * 5 + np.asarray(sq.starts)
    want = [2 * 5 + 0, 4 * 5 + 0, 4 * 5 + 1, 4 * 5 + 2]  # windows of 3: one in slot 2, three in slot 4
    counts = np.bincount(cells, minlength=30)
    assert counts.sum() == counts[want].sum()
    assert stats.chisquare(counts[want]).pvalue > 1e-3
    # a biased sampler fails this test: episodes weighted by length are far from uniform
    biased = np.bincount(np.asarray(ts.indices), minlength=6)[[1, 2, 4]]
    assert stats.chisquare(biased).pvalue < 1e-6


@pytest.mark.parametrize("use_jit", [False, True])
def test_nothing_passes_gives_empty_rows(use_jit):
    """When `can_sample` is False every sampler returns rows marked empty (indices -1, mask all False, lengths and
    num_steps 0, zeros), never the data of a slot that did not pass; `can_sample` True gives no empty row."""
    buf = filled()  # slot 0 holds a task-0 episode: a wrong sampler would return it
    key = jax.random.key(0)

    def samples(b, where):
        return (b.sample_episodes(key, 4, where=where), b.sample_timesteps(key, 4, where=where),
                b.sample_transitions(key, 4, n_step=2, gamma=0.9, where=where), b.sample_sequences(key, 4, 2, where=where),
                b.can_sample(4, where=where), b.can_sample_sequences(4, 2, where=where))

    run = jax.jit(samples) if use_jit else samples
    where = buf.meta["task_id"] == 9  # a mask: inside jit as a traced argument
    *rows, can, can_seq = run(buf, where if use_jit else (lambda meta: meta["task_id"] == 9))
    assert not bool(can) and not bool(can_seq)
    for s in rows:
        assert_empty_rows(s)
    # passing episodes too short for the window asked: only the sequence sampler has nothing to draw
    short = buf.meta["task_id"] == 2  # slot 3, length 4
    seq = buf.sample_sequences(key, 4, 5, where=short)
    assert not bool(buf.can_sample_sequences(4, 5, where=short)) and bool(buf.can_sample(4, where=short))
    assert_empty_rows(seq)
    *rows, can, can_seq = run(buf, short if use_jit else (lambda meta: meta["task_id"] == 2))
    assert bool(can) and bool(can_seq)
    for s in rows:
        np.testing.assert_array_equal(np.asarray(s.indices), 3)
    # an empty buffer: the same empty rows, and `update` at their indices writes nothing
    empty = EpisodeBuffer.create(EXAMPLE, max_episodes=6, max_timesteps=5, meta=META)  # buf's shapes: no new program
    *rows, can, can_seq = run(empty, np.ones(6, bool) if use_jit else (lambda meta: meta["task_id"] > -9))
    assert not bool(can) and not bool(can_seq)
    for s in rows:
        assert_empty_rows(s)
    tr = rows[2]
    before = jax.tree.map(np.asarray, buf)
    after = buf.update(tr.indices, {"reward": jnp.ones(4, jnp.float32)}, steps=tr.steps)
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, after))
    stats = buf.record(tr).stats()  # empty rows were not drawn: counted neither as samples nor as stale
    assert (stats["samples"], stats["stale"], stats["record_calls"]) == (0, 0, 1)


def test_truncation_bootstraps_from_final_obs_and_termination_does_not():
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=2, max_timesteps=4)
    steps = {"obs": np.arange(6, dtype=np.float32).reshape(3, 2), "action": np.zeros(3, np.int32),
             "reward": np.array([1.0, 2.0, 4.0], np.float32)}
    buf = buf.add_episode(steps, 3, terminated=False, truncated=True, final_obs=np.array([7.0, 7.0], np.float32))
    buf = buf.add_episode(steps, 3, terminated=True, truncated=True, final_obs=np.array([8.0, 8.0], np.float32))
    assert not bool(buf.truncated[1])  # both flags: terminated
    tr = buf.transitions_at(np.array([0, 1, 0], np.int32), np.array([1, 1, 0], np.int32), n_step=3, gamma=0.5)
    np.testing.assert_allclose(np.asarray(tr.n_step_return), [2 + 0.5 * 4, 2 + 0.5 * 4, 1 + 0.5 * 2 + 0.25 * 4])
    np.testing.assert_allclose(np.asarray(tr.discount), [0.25, 0.0, 0.125])
    np.testing.assert_array_equal(np.asarray(tr.num_steps), [2, 2, 3])
    np.testing.assert_array_equal(np.asarray(tr.next_obs), [[7, 7], [8, 8], [7, 7]])
