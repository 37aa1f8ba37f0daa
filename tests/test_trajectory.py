"""Tests of jaxbuffers.trajectory: TrajectoryBuffer (the prioritised one: test_prioritised_trajectory.py).

A plain-Python reference model (`Ref`) keeps every step ever added per lane; every sampled
sequence / transition is located in it (from its flat index) and recomputed there.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbuffers._validate import tree_nbytes
from jaxbuffers.prioritised_trajectory import PrioritisedTrajectoryBuffer
from jaxbuffers.trajectory import TrajectoryBuffer, n_step_window

OBS_DIM = 2
EXAMPLE = {"obs": jnp.zeros((OBS_DIM,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}


# --------------------------------------------------------------------------------------------
# reference model


class Ref:
    """Every step ever added, per lane: obs, action, reward, flags, final obs."""

    def __init__(self, num_envs: int, length: int):
        self.e, self.n = num_envs, length
        self.steps: list[list[dict]] = [[] for _ in range(num_envs)]

    @property
    def total(self) -> int:
        return len(self.steps[0])

    @property
    def num_valid(self) -> int:
        return min(self.total, self.n)

    def add(self, obs, action, reward, term, trunc, final):
        """Arrays [E, t, ...]."""
        for e in range(self.e):
            for j in range(obs.shape[1]):
                self.steps[e].append(
                    dict(obs=obs[e, j], action=action[e, j], reward=float(reward[e, j]),
                         term=bool(term[e, j]), trunc=bool(trunc[e, j]), final=final[e, j])
                )

    def locate(self, flat_index: int) -> tuple[int, int]:
        """(lane, absolute step) of a flat index lane * length + physical slot; must be stored."""
        lane, slot = divmod(int(flat_index), self.n)
        lo = self.total - self.num_valid
        candidates = [a for a in range(lo, self.total) if a % self.n == slot]
        assert len(candidates) == 1, (flat_index, lo, self.total)
        return lane, candidates[0]

    def end(self, lane, a) -> bool:
        s = self.steps[lane][a]
        return s["term"] or s["trunc"]

    def transition(self, lane, a, n_step, gamma):
        g, k = 0.0, 0
        for i in range(n_step):
            s = self.steps[lane][a + i]
            g += gamma**i * s["reward"]
            k = i + 1
            if s["term"] or s["trunc"]:
                break
        last = self.steps[lane][a + k - 1]
        discount = 0.0 if last["term"] else gamma**k
        nxt = last["final"] if (last["trunc"] and not last["term"]) else self.steps[lane][a + k]["obs"]
        return g, discount, k, nxt


def make_chunk(rng, num_envs, t, counter, p_term=0.15, p_trunc=0.15):
    """A chunk with unique obs values (identify the step), small-int rewards, random flags."""
    base = counter + np.arange(t)[None, :] + 1000 * np.arange(num_envs)[:, None]
    obs = np.stack([base, base + 0.5], axis=-1).astype(np.float32)
    action = base.astype(np.int32)
    reward = rng.integers(-3, 4, size=(num_envs, t)).astype(np.float32)
    term = rng.random((num_envs, t)) < p_term
    trunc = rng.random((num_envs, t)) < p_trunc
    final = (-obs - 7).astype(np.float32)
    return obs, action, reward, term, trunc, final


def do_add(buf, add_fn, obs, action, reward, term, trunc, final, as_step):
    step = {"obs": obs, "action": action, "reward": reward}
    if as_step:  # one step, no time axis
        step = {k: v[:, 0] for k, v in step.items()}
        term, trunc, final = term[:, 0], trunc[:, 0], final[:, 0]
    return add_fn(buf, step, term, trunc, final)


def _add(b, s, te, tr, fo):
    return b.add(s, terminated=te, truncated=tr, final_obs=fo)


# Jitted once at module level (cached per shape).
ADD = jax.jit(_add)
SEQ = jax.jit(
    lambda b, k, bs, n, period=1, cross=True: b.sample_sequences(k, bs, n, period=period, cross_episodes=cross),
    static_argnums=(2, 3, 4, 5),
)
TRANS = jax.jit(lambda b, k, bs, n, gamma: b.sample_transitions(k, bs, n_step=n, gamma=gamma), static_argnums=(2, 3))
AT = jax.jit(lambda b, flat, n, gamma: b.transitions_at(flat, n_step=n, gamma=gamma), static_argnums=(2,))
SEQ_AT = jax.jit(lambda b, flat, n: b.sequences_at(flat, n), static_argnums=(2,))
FINAL_AT = jax.jit(lambda b, flat, n: b.final_obs_at(flat, n), static_argnums=(2,))
PSEQ = jax.jit(lambda b, k, bs, beta: b.sample_sequences(k, bs, beta=beta), static_argnums=(2,))
PTRANS = jax.jit(lambda b, k, bs, beta, gamma: b.sample_transitions(k, bs, beta=beta, gamma=gamma), static_argnums=(2,))
SETP = jax.jit(lambda b, i, p, g: b.set_priorities(i, p, g))


def host(tree):
    return jax.device_get(tree)


def payload_buffer(num_adds, length=8):
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=1, length=length)
    f = np.zeros((1,), bool)
    for i in range(num_adds):
        step = {"obs": np.full((1, OBS_DIM), i, np.float32), "action": np.array([i], np.int32),
                "reward": np.array([i], np.float32)}
        buf = ADD(buf, step, f, None, None)
    return buf


def sampled_sequences(buf, length, period=1, keys=60, batch=16):
    seen = set()
    for s in range(keys):
        out = SEQ(buf, jax.random.key(s), batch, length, period)
        for row in np.asarray(out.item["obs"][..., 0]).astype(int):
            seen.add(tuple(row.tolist()))
    return seen


# --------------------------------------------------------------------------------------------
# write head


def test_write_head_sequences_exact():
    buf = payload_buffer(11)
    assert sampled_sequences(buf, 3) == {(3, 4, 5), (4, 5, 6), (5, 6, 7), (6, 7, 8), (7, 8, 9), (8, 9, 10)}
    assert sampled_sequences(buf, 3, period=2) == {(4, 5, 6), (6, 7, 8), (8, 9, 10)}  # even steps ever added start
    assert sampled_sequences(payload_buffer(4), 3) == {(0, 1, 2), (1, 2, 3)}
    assert bool(payload_buffer(4).can_sample(1, 3))
    assert not bool(payload_buffer(2).can_sample(1, 3))
    assert bool(payload_buffer(3).can_sample(1, 3))


def test_write_head_transitions():
    buf = payload_buffer(11)
    seen = set()
    for s in range(40):
        out = host(TRANS(buf, jax.random.key(s), 16, 2, 0.5))
        for o, nxt, ret in zip(np.asarray(out.obs[:, 0]), np.asarray(out.next_obs[:, 0]), np.asarray(out.n_step_return)):
            seen.add(int(o))
            assert nxt == o + 2 and ret == o + 0.5 * (o + 1)
    assert seen == {3, 4, 5, 6, 7, 8}  # obs 9 needs step 11 for its 2-step next obs
    assert not bool(payload_buffer(2).can_sample_transitions(1, n_step=2))


# --------------------------------------------------------------------------------------------
# n-step hand cases


def _lane_buffer(rewards, term, trunc, length=8, final=None):
    """One lane; obs of step i is [i, i + 0.5]; final obs of step i is [-(i + 1), 0]."""
    t = len(rewards)
    obs = np.stack([np.arange(t), np.arange(t) + 0.5], -1).astype(np.float32)[None]
    fin = np.stack([-(np.arange(t) + 1.0), np.zeros(t)], -1).astype(np.float32)[None] if final is None else final
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=1, length=length)
    # add in two chunks to exercise both paths
    step = {"obs": obs, "action": np.arange(t, dtype=np.int32)[None], "reward": np.asarray(rewards, np.float32)[None]}
    te, tr = np.asarray(term)[None], np.asarray(trunc)[None]
    h = t // 2
    cut = lambda x, a, b: x[:, a:b]  # noqa: E731
    buf = ADD(buf, jax.tree.map(lambda x: cut(x, 0, h), step), cut(te, 0, h), cut(tr, 0, h), cut(fin, 0, h))
    buf = ADD(buf, jax.tree.map(lambda x: cut(x, h, t), step), cut(te, h, t), cut(tr, h, t), cut(fin, h, t))
    return buf


def _transition_at(buf, flat, n_step, gamma):
    return host(AT(buf, jnp.array([flat], jnp.int32), n_step, gamma))


def test_n_step_termination_inside_window():
    r = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    term = [False, True, False, False, False, False]
    buf = _lane_buffer(r, term, [False] * 6)
    out = _transition_at(buf, 0, 3, 0.5)
    assert float(out.n_step_return[0]) == 1.0 + 0.5 * 2.0  # cut after step 1
    assert float(out.discount[0]) == 0.0
    assert int(out.num_steps[0]) == 2
    np.testing.assert_array_equal(out.next_obs[0], [2.0, 2.5])  # defined: the next stored obs
    full = _transition_at(buf, 2, 3, 0.5)
    assert float(full.n_step_return[0]) == 4 + 0.5 * 8 + 0.25 * 16
    assert float(full.discount[0]) == 0.125 and int(full.num_steps[0]) == 3
    np.testing.assert_array_equal(full.next_obs[0], [5.0, 5.5])


def test_n_step_truncation_bootstraps_from_final_obs():
    r = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    trunc = [False, True, False, False, False, False]
    buf = _lane_buffer(r, [False] * 6, trunc)
    out = _transition_at(buf, 0, 3, 0.5)
    assert float(out.n_step_return[0]) == 2.0
    assert float(out.discount[0]) == 0.25  # gamma^2, bootstrap kept
    np.testing.assert_array_equal(out.next_obs[0], [-2.0, 0.0])  # final obs of step 1, not reset obs [2, 2.5]
    one = _transition_at(buf, 1, 1, 0.5)
    np.testing.assert_array_equal(one.next_obs[0], [-2.0, 0.0])
    assert float(one.discount[0]) == 0.5
    # terminated and truncated together count as terminated
    both = _lane_buffer(r, trunc, trunc)
    out = _transition_at(both, 0, 3, 0.5)
    assert float(out.discount[0]) == 0.0


def test_sequence_final_obs_at_truncations_only():
    # steps 1 (truncated) and 4 (terminated and truncated: counts as terminated) end episodes
    trunc = [False, True, False, False, True, False]
    buf = _lane_buffer([1.0] * 6, [False, False, False, False, True, False], trunc)
    seq = host(SEQ_AT(buf, jnp.array([0, 1, 2], jnp.int32), 4))
    final = np.asarray(FINAL_AT(buf, jnp.array([0, 1, 2], jnp.int32), 4))
    assert final.shape == (3, 4, OBS_DIM) and final.dtype == np.float32
    want = np.zeros((6, OBS_DIM), np.float32)
    want[1] = [-2.0, 0.0]  # step 1's final obs; the next stored obs is the reset obs [2, 2.5]
    np.testing.assert_array_equal(seq.item["obs"][0, 2], [2.0, 2.5])
    for b, start in enumerate([0, 1, 2]):
        np.testing.assert_array_equal(final[b], want[start : start + 4])
    np.testing.assert_array_equal(np.asarray(buf.final_obs_at(jnp.array([0, 1, 2]), 4)), final)  # eager == jit


def test_n_step_wrap_around():
    # 12 steps into length 8: the window [6, 7, 8, 9] wraps physical slots 6, 7, 0, 1.
    r = np.arange(12, dtype=np.float32)
    trunc = np.zeros(12, bool)
    trunc[8] = True
    buf = _lane_buffer(r, np.zeros(12, bool), trunc)
    out = _transition_at(buf, 6, 3, 0.5)  # physical slot 6 holds step 6
    np.testing.assert_array_equal(out.obs[0], [6.0, 6.5])
    assert float(out.n_step_return[0]) == 6 + 0.5 * 7 + 0.25 * 8
    np.testing.assert_array_equal(out.next_obs[0], [-9.0, 0.0])
    out = _transition_at(buf, 5, 2, 0.5)  # step 5 -> step 7, no end
    np.testing.assert_array_equal(out.next_obs[0], [7.0, 7.5])
    out = _transition_at(buf, 7, 2, 1.0)  # step 7 -> steps 8 (truncated): k = 2, final obs of step 8
    assert int(out.num_steps[0]) == 2 and float(out.discount[0]) == 1.0
    np.testing.assert_array_equal(out.next_obs[0], [-9.0, 0.0])


def test_n_step_window_function():
    r = jnp.array([[1.0, 2, 3], [1, 2, 3], [1, 2, 3]])
    te = jnp.array([[False, False, False], [False, False, True], [True, False, False]])
    tr = jnp.array([[False, False, False], [False, True, False], [False, False, False]])
    g, d, k = n_step_window(r, te, tr, 0.9)
    np.testing.assert_allclose(g, [1 + 1.8 + 0.81 * 3, 1 + 1.8, 1.0], rtol=1e-6)
    np.testing.assert_allclose(d, [0.9**3, 0.81, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(k, [3, 2, 1])


def test_episode_mask_and_within_episode_sampling():
    t = 8
    term = np.zeros(t, bool)
    term[2] = True
    trunc = np.zeros(t, bool)
    trunc[5] = True
    buf = _lane_buffer(np.zeros(t), term, trunc)
    seq = host(buf.sequences_at(jnp.array([1]), 5))
    np.testing.assert_array_equal(seq.mask[0], [True, True, False, False, False])  # step 2 ends it
    np.testing.assert_array_equal(seq.terminated[0], [False, True, False, False, False])
    np.testing.assert_array_equal(seq.truncated[0], [False, False, False, False, True])
    seen = set()
    for s in range(40):
        out = host(SEQ(buf, jax.random.key(s), 16, 3, 1, False))
        ends = np.asarray(out.terminated | out.truncated)
        assert not ends[:, :-1].any()
        assert np.asarray(out.mask).all()
        seen |= set(np.asarray(out.item["obs"][:, 0, 0]).astype(int).tolist())
    # windows of 3 wholly in one episode: starts 0 (0,1,2), 3 (3,4,5), and none crossing 2 or 5.
    assert seen == {0, 3}
    assert bool(buf.can_sample(1, 3, cross_episodes=False))
    assert not bool(buf.can_sample(1, 4, cross_episodes=False))


def test_within_episode_sampling_is_uniform():
    # 2 lanes x 10 steps; valid starts for length 2 in lane 0: all 9; lane 1: 3 (ends everywhere else).
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=10)
    term = np.zeros((2, 10), bool)
    term[1, [0, 1, 2, 4, 5, 7]] = True
    obs = np.zeros((2, 10, OBS_DIM), np.float32)
    obs[..., 0] = np.arange(10)[None] + 100 * np.arange(2)[:, None]
    buf = ADD(buf, {"obs": obs, "action": np.zeros((2, 10), np.int32), "reward": np.zeros((2, 10), np.float32)}, term, None, None)
    out = host(SEQ(buf, jax.random.key(3), 24_000, 2, 1, False))
    starts = np.asarray(out.item["obs"][:, 0, 0]).astype(int)
    expected = set(range(9)) | {103, 106, 108}
    assert set(starts.tolist()) == expected
    counts = np.array([np.sum(starts == s) for s in sorted(expected)])
    # 12 equally likely starts: each ~2000; 5 sigma of a binomial(24000, 1/12) is ~215.
    assert np.all(np.abs(counts - 2000) < 215), counts


# --------------------------------------------------------------------------------------------
# model-based test


# Shapes come from small fixed sets so jitted functions are compiled once per shape and reused
# across examples: two buffer shapes, one lane with a long ring and three lanes with a short one
# (each static sampling argument then compiles twice, not four times); the slow variant draws
# them freely.
FAST = dict(shape=st.sampled_from([(1, 7), (3, 3)]), t=lambda n: st.sampled_from(sorted({1, 2, n})),
            seq_len=lambda n: st.sampled_from([1, 3]), period=st.sampled_from([1, 2]), n_step=st.sampled_from([1, 2]))
FREE = dict(shape=st.tuples(st.integers(1, 3), st.integers(2, 7)), t=lambda n: st.integers(1, n),
            seq_len=lambda n: st.integers(1, n), period=st.integers(1, 3), n_step=None)


def _seq_reads(b, key, every, seq_len, period, cross):
    """can_sample, valid_starts at `every`, a sample of 12 sequences, and sequences_at / final_obs_at its indices."""
    out = b.sample_sequences(key, 12, seq_len, period=period, cross_episodes=cross)
    return (b.can_sample(1, seq_len, period=period, cross_episodes=cross), b.valid_starts(every, seq_len, period=period),
            out, b.sequences_at(out.indices, seq_len), b.final_obs_at(out.indices, seq_len))


def _trans_reads(b, key, n_step, gamma):
    """can_sample_transitions, a sample of 12 transitions, transitions_at and valid_starts at its indices."""
    out = b.sample_transitions(key, 12, n_step=n_step, gamma=gamma)
    return (b.can_sample_transitions(1, n_step=n_step), out, b.transitions_at(out.indices, n_step=n_step, gamma=gamma),
            b.valid_starts(out.indices, n_step + 1))


SEQ_READS = jax.jit(_seq_reads, static_argnums=(3, 4, 5))
TRANS_READS = jax.jit(_trans_reads, static_argnums=(2,))


def run_model(use_jit, data, draws):
    num_envs, length = data.draw(draws["shape"], "num_envs, length")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), "seed"))
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=num_envs, length=length)
    ref = Ref(num_envs, length)
    add_fn = ADD if use_jit else _add
    counter = 0
    num_ops = data.draw(st.integers(1, 6), "num_ops")
    for _ in range(num_ops):
        t = data.draw(draws["t"](length), "t")
        as_step = t == 1 and data.draw(st.booleans(), "as_step")
        chunk = make_chunk(rng, num_envs, t, counter)
        counter += t
        buf = do_add(buf, add_fn, *chunk, as_step)
        ref.add(*chunk)
        assert int(buf.num_valid) == ref.num_valid
        assert buf.num_added() == ref.total
        assert not bool(buf.final_obs_lost())

        seq_len = data.draw(draws["seq_len"](length), "seq_len")
        period = data.draw(draws["period"], "period")
        cross = data.draw(st.booleans(), "cross")
        key = jax.random.key(int(rng.integers(2**31)))
        every = jnp.arange(num_envs * length, dtype=jnp.int32)
        # under jit, all reads of one (shape, seq_len, period, cross) are one program
        can, valid, out, again, final = (SEQ_READS if use_jit else _seq_reads)(buf, key, every, seq_len, period, cross)
        lo = ref.total - ref.num_valid
        starts_ok = [
            (e, a) for e in range(num_envs) for a in range(lo, ref.total - seq_len + 1)
            if a % period == 0 and (cross or not any(ref.end(e, a + i) for i in range(seq_len - 1)))
        ]
        assert bool(can) == bool(starts_ok)
        flat_ok = {e * length + a % length for e, a in starts_ok} if cross else None
        if cross:
            assert set(np.flatnonzero(np.asarray(valid)).tolist()) == flat_ok
        if starts_ok:
            out, again, final = host(out), host(again), host(final)
            # the public read at the sampled positions returns exactly the sample
            jax.tree.map(np.testing.assert_array_equal, again, out)
            for b in range(12):
                lane, a = ref.locate(out.indices[b])
                assert (lane, a) in starts_ok
                alive = True
                for i in range(seq_len):
                    s = ref.steps[lane][a + i]
                    want = s["final"] if s["trunc"] and not s["term"] else np.zeros_like(s["obs"])
                    np.testing.assert_array_equal(final[b, i], want)
                    np.testing.assert_array_equal(out.item["obs"][b, i], s["obs"])
                    assert int(out.item["action"][b, i]) == s["action"]
                    assert float(out.item["reward"][b, i]) == s["reward"]
                    assert bool(out.terminated[b, i]) == s["term"] and bool(out.truncated[b, i]) == s["trunc"]
                    assert bool(out.mask[b, i]) == alive
                    alive = alive and not (s["term"] or s["trunc"])

        n_step = data.draw(st.integers(1, length - 1) if draws["n_step"] is None else draws["n_step"], "n_step")
        gamma = 0.5
        can, out, again, valid = (TRANS_READS if use_jit else _trans_reads)(buf, key, n_step, gamma)
        if ref.total >= n_step + 1:
            assert bool(can)
            out = host(out)
            jax.tree.map(np.testing.assert_array_equal, host(again), out)
            assert np.all(np.asarray(valid))
            for b in range(12):
                lane, a = ref.locate(out.indices[b])
                assert a + n_step + 1 <= ref.total
                g, d, k, nxt = ref.transition(lane, a, n_step, gamma)
                np.testing.assert_array_equal(out.obs[b], ref.steps[lane][a]["obs"])
                assert int(out.action[b]) == ref.steps[lane][a]["action"]
                assert float(out.n_step_return[b]) == pytest.approx(g, rel=1e-6, abs=1e-6)
                assert float(out.discount[b]) == pytest.approx(d)
                assert int(out.num_steps[b]) == k
                np.testing.assert_array_equal(out.next_obs[b], nxt)
        else:
            assert not bool(can)


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_model_based_jit(data):
    run_model(True, data, FAST)


@pytest.mark.slow  # the jitted twin runs in CI
@settings(max_examples=5, deadline=None)  # eager: each method one cached compiled program
@given(data=st.data())
def test_model_based_no_jit(data):
    run_model(False, data, FAST)


@pytest.mark.slow
@pytest.mark.parametrize("use_jit", [False, True])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_model_based_free_shapes(use_jit, data):
    run_model(use_jit, data, FREE)


# --------------------------------------------------------------------------------------------
# final-observation ring


def test_small_final_obs_ring_exact_until_overflow():
    # K = 2 slots per lane, length 6: fine while a lane holds <= 2 truncated steps.
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=1, length=6, final_obs_capacity=2)
    ref = Ref(1, 6)
    rng = np.random.default_rng(0)
    trunc_pattern = [0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0]  # at most 2 in any 6 consecutive steps
    for i, tr in enumerate(trunc_pattern):
        obs, action, reward, term, _, final = make_chunk(rng, 1, 1, i, p_term=0)
        trunc = np.array([[bool(tr)]])
        buf = ADD(buf, {"obs": obs, "action": action, "reward": reward}, term, trunc, final)
        ref.add(obs, action, reward, term, trunc, final)
    assert not bool(buf.final_obs_lost())
    out = host(TRANS(buf, jax.random.key(0), 64, 1, 0.9))
    for b in range(64):
        lane, a = ref.locate(out.indices[b])
        np.testing.assert_array_equal(out.next_obs[b], ref.transition(lane, a, 1, 0.9)[3])
    # three truncations within 6 steps overflow K = 2: final_obs_lost says so while the step is stored
    for i in range(3):
        obs, action, reward, term, _, final = make_chunk(rng, 1, 1, 100 + i, p_term=0)
        buf = ADD(buf, {"obs": obs, "action": action, "reward": reward}, term, np.array([[True]]), final)
    assert bool(buf.final_obs_lost())
    # ... and not once the step that lost it is overwritten (no record of the past, as documented)
    for i in range(6):
        obs, action, reward, term, _, final = make_chunk(rng, 1, 1, 200 + i, p_term=0)
        buf = ADD(buf, {"obs": obs, "action": action, "reward": reward}, term, np.array([[False]]), final)
    assert not bool(buf.final_obs_lost())


@jax.jit
def _add_lost_at(b, s, te, tr, fo, flat):
    """One add, then final_obs_lost and the next observations at `flat`: one program per shape and chunk length."""
    b = _add(b, s, te, tr, fo)
    return b, b.final_obs_lost(), b.transitions_at(flat, n_step=1, gamma=0.5).next_obs


# Lengths from a fixed set (below, at and above k = 1..3 final-obs slots) so that each shape's
# programs compile once and are reused across examples.
@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(1, 3), length=st.sampled_from([2, 3, 5, 9]), seed=st.integers(0, 2**31 - 1),
    chunks=st.lists(st.integers(1, 4), min_size=1, max_size=6),
)
def test_final_obs_lost_is_exact(k, length, seed, chunks):
    # final_obs_lost() is True iff some stored truncated step reads a final obs that is not its own.
    rng = np.random.default_rng(seed)
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=length, final_obs_capacity=k)
    ref = Ref(2, length)
    counter = 0
    for t in chunks:
        t = min(t, length)
        chunk = make_chunk(rng, 2, t, counter, p_term=0.1, p_trunc=0.5)
        counter += t
        ref.add(*chunk)
        lo = ref.total - ref.num_valid
        boots = [(e, a) for e in range(2) for a in range(lo, ref.total)
                 if ref.steps[e][a]["trunc"] and not ref.steps[e][a]["term"]]
        # read at 2 * length positions (the truncated steps, then the first one repeated; slot 0 when there is none)
        flat = [e * length + a % length for e, a in boots] or [0]
        flat = jnp.array(flat + flat[:1] * (2 * length - len(flat)), jnp.int32)
        buf, lost, got = _add_lost_at(buf, {"obs": chunk[0], "action": chunk[1], "reward": chunk[2]}, *chunk[3:], flat)
        wrong = False
        if boots:
            want = np.stack([ref.steps[e][a]["final"] for e, a in boots])
            wrong = bool(np.any(np.asarray(got)[: len(boots)] != want))
        assert bool(lost) == wrong


def test_positions_api_errors_and_clamping():
    buf = _lane_buffer([1.0] * 6, [False] * 6, [False] * 6, length=8)
    with pytest.raises(ValueError, match="indices"):
        buf.transitions_at(jnp.zeros((2, 2), jnp.int32), gamma=0.9)
    with pytest.raises(TypeError, match="indices"):
        buf.sequences_at(jnp.zeros((2,), jnp.float32), 2)
    with pytest.raises(ValueError, match="n_step"):
        buf.transitions_at(jnp.zeros((2,), jnp.int32), n_step=8, gamma=0.9)
    with pytest.raises(ValueError, match="gamma"):
        buf.transitions_at(jnp.zeros((2,), jnp.int32), gamma=1.5)
    with pytest.raises(ValueError, match="sequence_length"):
        buf.sequences_at(jnp.zeros((2,), jnp.int32), 9)
    with pytest.raises(ValueError, match="sequence_length"):
        buf.final_obs_at(jnp.zeros((2,), jnp.int32), 9)
    with pytest.raises(ValueError, match="indices"):
        buf.final_obs_at(jnp.zeros((2, 2), jnp.int32), 2)
    # what is not numbers is named as such, not reported as a 0-d array
    for bad in (None, "3", object()):
        for read in (lambda i: buf.final_obs_at(i, 2), lambda i: buf.sequences_at(i, 2), lambda i: buf.valid_starts(i, 2)):
            with pytest.raises(TypeError, match=rf"indices: expected an integer array \(int32\), got {type(bad).__name__}"):
                read(bad)
    # 6 steps stored in slots 0..5: windows of 3 start at 0..3 only; out-of-range is not valid
    np.testing.assert_array_equal(
        np.asarray(buf.valid_starts(jnp.array([-1, 0, 3, 4, 7, 8]), 3)), [False, True, True, False, False, False]
    )
    np.testing.assert_array_equal(np.asarray(buf.valid_starts(jnp.arange(4), 1, period=2)), [True, False, True, False])
    # indices outside [0, num_envs * length) are clamped: -5 reads slot 0, 99 reads slot 7
    out = host(buf.sequences_at(jnp.array([-5, 99], jnp.int64 if jax.config.x64_enabled else jnp.int32), 1))
    np.testing.assert_array_equal(out.item["action"][:, 0], [0, 0])  # slot 7 never written: zeros
    np.testing.assert_array_equal(out.indices, [0, 7])


def test_memory_bytes_and_ring_size():
    big = TrajectoryBuffer.create(EXAMPLE, num_envs=4, length=100)
    small = TrajectoryBuffer.create(EXAMPLE, num_envs=4, length=100, final_obs_capacity=5)
    ring_slot = 4 * OBS_DIM * 4  # 4 lanes x one float32 obs
    owners = 4 * 5 * 4  # K < length: an int32 owner per ring slot (`final_owner`)
    assert big.memory_bytes - small.memory_bytes == (100 - 5) * ring_slot - owners
    assert big.memory_bytes == tree_nbytes(big)
    steps = 4 * 100 * (OBS_DIM * 4 + 4 + 4)
    assert steps < big.memory_bytes < 3 * steps


# --------------------------------------------------------------------------------------------
# errors, jit, scan, vmap, compile count, donation


def test_errors():
    with pytest.raises(ValueError, match="missing field 'reward'"):
        TrajectoryBuffer.create({"obs": jnp.zeros(2), "action": jnp.int32(0)}, num_envs=1, length=4)
    with pytest.raises(TypeError, match="expected a dict"):
        TrajectoryBuffer.create(jnp.zeros(3), num_envs=1, length=4)
    with pytest.raises(ValueError, match=r"floating scalar per step, got shape \(2,\)"):
        TrajectoryBuffer.create({"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.zeros(2)}, num_envs=1, length=4)
    # positions lane * length + slot are int32: refused before anything is allocated
    with pytest.raises(ValueError, match=r"num_envs \* length: expected at most 2\*\*31 - 1 .* = 2147549184"):
        TrajectoryBuffer.create(EXAMPLE, num_envs=2**16, length=2**15 + 1)
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=4)
    step = {"obs": np.zeros((2, OBS_DIM), np.float32), "action": np.zeros(2, np.int32), "reward": np.zeros(2, np.float32)}
    f = np.zeros(2, bool)
    with pytest.raises(TypeError, match="terminated: expected dtype bool"):
        buf.add(step, terminated=np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="terminated: expected shape"):
        buf.add(step, terminated=np.zeros(3, bool))
    with pytest.raises(TypeError, match="final_obs: required"):
        buf.add(step, terminated=f, truncated=f)
    with pytest.raises(TypeError, match=r"step\['reward'\]: expected dtype float32, got float16"):
        buf.add({**step, "reward": jnp.zeros(2, jnp.float16)}, terminated=f)
    with pytest.raises(ValueError, match="num_envs=2"):
        buf.add(jax.tree.map(lambda x: x[:1], step), terminated=f[:1])
    chunk = jax.tree.map(lambda x: np.repeat(x[:, None], 5, axis=1), step)
    with pytest.raises(ValueError, match="does not fit"):
        buf.add(chunk, terminated=np.zeros((2, 5), bool))
    with pytest.raises(ValueError, match="sequence_length"):
        buf.sample_sequences(jax.random.key(0), 4, 5)
    with pytest.raises(ValueError, match="gamma"):
        buf.sample_transitions(jax.random.key(0), 4, n_step=1, gamma=1.5)
    with pytest.raises(TypeError, match="gamma"):
        buf.sample_transitions(jax.random.key(0), 4, n_step=1)


def test_final_obs_given_the_whole_step_says_it_is_the_observation():
    """A whole step dict as final_obs was reported as a tree structure difference; the error says
    final_obs is shaped like the observation (the obs field). Both buffers, jit or not."""
    e = 2
    step = {"obs": jnp.ones((e, OBS_DIM)), "action": jnp.zeros(e, jnp.int32), "reward": jnp.zeros(e)}
    flags = jnp.ones(e, bool)
    msg = (r"^final_obs: expected the observation only, shaped like the step's 'obs' field, not the whole step "
           r"\(got a dict with the fields \['action', 'obs', 'reward'\]\); pass its 'obs' field alone")
    for buf in (TrajectoryBuffer.create(EXAMPLE, num_envs=e, length=4),
                PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=e, length=4, window_length=2)):
        def f(b, fo):
            return b.add(step, terminated=~flags, truncated=flags, final_obs=fo)

        with pytest.raises(TypeError, match=msg):
            f(buf, step)
        with pytest.raises(TypeError, match=msg):
            jax.jit(f)(buf, step)
        f(buf, step["obs"])  # the observation alone is what it takes
    # An observation that is itself a dict keeps the structure error for other mistakes.
    nested = TrajectoryBuffer.create({**EXAMPLE, "obs": {"pos": jnp.zeros(2)}}, num_envs=e, length=4)
    with pytest.raises(TypeError, match="final_obs: tree structure differs"):
        nested.add({**step, "obs": {"pos": step["obs"]}}, terminated=~flags, truncated=flags, final_obs={"vel": step["obs"]})


def test_final_obs_must_match_the_steps_leading_axes():
    """A final_obs with other leading axes than the step was broadcast: [1, ...] gave every lane
    the same final observation, [E, 1, ...] every step of a chunk; others failed with JAX's
    unnamed broadcasting error. Both buffers, jit or not."""
    e = 3
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=e, length=4)
    pbuf = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=e, length=4, window_length=2)
    step = {"obs": jnp.ones((e, OBS_DIM)), "action": jnp.zeros(e, jnp.int32), "reward": jnp.zeros(e)}
    chunk = jax.tree.map(lambda x: jnp.stack([x] * 3, 1), step)
    one, three = jnp.ones(e, bool), jnp.ones((e, 3), bool)
    cases = [
        (step, one, jnp.zeros((1, OBS_DIM)), r"\[3\].*got \[1\]"),
        (step, one, jnp.zeros((e + 1, OBS_DIM)), r"\[3\].*got \[4\]"),
        (chunk, three, jnp.zeros((e, 1, OBS_DIM)), r"\[3, 3\].*got \[3, 1\]"),
        (chunk, three, jnp.zeros((e, 2, OBS_DIM)), r"\[3, 3\].*got \[3, 2\]"),
    ]
    for b in (buf, pbuf):
        for s, flags, final, msg in cases:
            def f(b, fo, s=s, flags=flags):
                return b.add(s, terminated=~flags, truncated=flags, final_obs=fo)

            with pytest.raises(ValueError, match="final_obs: expected leading axes " + msg):
                f(b, final)
            with pytest.raises(ValueError, match="final_obs: expected leading axes " + msg):
                jax.jit(f)(b, final)
    good = buf.add(chunk, terminated=~three, truncated=three, final_obs=jnp.arange(e * 3 * OBS_DIM, dtype=jnp.float32).reshape(e, 3, OBS_DIM))
    assert len({tuple(np.asarray(good.final_obs[i, j]).tolist()) for i in range(e) for j in range(3)}) == 9


def test_static_flag_and_gamma_types():
    """cross_episodes must be a bool (the string "False" is truthy and sampled across episodes);
    gamma must not be a bool (integers are discounts too); final_obs_capacity above length is length."""
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=1, length=4)
    for bad in ("False", 0, None, jnp.bool_(False)):
        with pytest.raises(TypeError, match="cross_episodes: expected a Python bool"):
            buf.can_sample(1, 2, cross_episodes=bad)
        with pytest.raises(TypeError, match="cross_episodes: expected a Python bool"):
            buf.sample_sequences(jax.random.key(0), 4, 2, cross_episodes=bad)
    assert not bool(buf.can_sample(1, 2, cross_episodes=np.bool_(False)))
    for bad in (True, np.bool_(False), np.array(True), jnp.array([True])[0], complex(0.5, 0), np.complex64(1), jnp.complex64(1), "0.9"):
        with pytest.raises(TypeError, match="gamma: expected a float"):
            buf.sample_transitions(jax.random.key(0), 4, n_step=1, gamma=bad)
    # sizes past int32 are named (they failed inside JAX with "argument path is x2")
    with pytest.raises(ValueError, match=r"period: expected at most 2\*\*31 - 1"):
        buf.sample_sequences(jax.random.key(0), 4, 2, period=2**31)
    with pytest.raises(ValueError, match=r"period: expected at most 2\*\*31 - 1"):
        PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=8, window_length=2, period=2**40)
    for ok in (1, 0, np.float32(0.5), jnp.float32(0.9), np.int64(1), jnp.int32(1), np.array(1)):
        buf.sample_transitions(jax.random.key(0), 4, n_step=1, gamma=ok)
    # a Python int traced by jit is an int32 tracer: still a discount
    jax.jit(lambda b, g: b.sample_transitions(jax.random.key(0), 4, n_step=1, gamma=g))(buf, 1)
    big = TrajectoryBuffer.create(EXAMPLE, num_envs=1, length=4, final_obs_capacity=100)  # never more than length slots used
    assert big.final_obs_capacity == 4 and big.final_obs.shape == (1, 4, OBS_DIM)
    with pytest.raises(ValueError, match=r"step chunk \(time axis\): expected at least one item, got 0"):
        buf.add({"obs": jnp.zeros((1, 0, OBS_DIM)), "action": jnp.zeros((1, 0), jnp.int32), "reward": jnp.zeros((1, 0))},
                terminated=jnp.zeros((1, 0), bool))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_n_step_powers_of_gamma_are_not_rounded_first(dtype):
    """bfloat16 rounds 0.99 to 0.98828; raising the rounded gamma to k = 100 gave 0.309 where
    0.99**100 = 0.366 (16% off). The powers and the sum are float32, rounded once at the end."""
    n = 100
    r = jnp.ones((1, n), dtype)
    f = jnp.zeros((1, n), bool)
    g, d, k = n_step_window(r, f, f, 0.99)
    assert g.dtype == dtype and d.dtype == dtype and int(k[0]) == n
    want_d = np.float32(0.99) ** np.arange(n + 1, dtype=np.float32)
    assert float(d[0]) == float(jnp.asarray(want_d[n], dtype))  # one rounding of the float32 value
    assert abs(float(g[0]) - want_d[:n].sum()) <= 0.01 * want_d[:n].sum()
    f32 = n_step_window(r.astype(jnp.float32), f, f, 0.99)
    assert float(f32[1][0]) == pytest.approx(float(want_d[n]), rel=1e-6)


def test_scan_matches_sequential_adds_and_vmap():
    rng = np.random.default_rng(1)
    chunks = [make_chunk(rng, 2, 1, i) for i in range(9)]
    seq = TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=5)
    for c in chunks:
        seq = do_add(seq, ADD, *c, as_step=True)
    stacked = [np.stack([c[i][:, 0] for c in chunks]) for i in range(6)]

    def body(b, xs):
        obs, action, reward, term, trunc, final = xs
        return b.add({"obs": obs, "action": action, "reward": reward}, terminated=term, truncated=trunc, final_obs=final), None

    scanned, _ = jax.jit(lambda b, xs: jax.lax.scan(body, b, xs))(TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=5), stacked)
    jax.tree.map(np.testing.assert_array_equal, scanned, seq)

    # vmap over 3 stacked buffers: each behaves like its own buffer.
    many = jax.tree.map(lambda x: jnp.stack([x] * 3), TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=5))
    vadd = jax.jit(jax.vmap(lambda b, s, te, tr, fo: b.add(s, terminated=te, truncated=tr, final_obs=fo)))
    for c in chunks:
        obs, action, reward, term, trunc, final = (np.stack([x[:, 0]] * 3) for x in c)
        many = vadd(many, {"obs": obs, "action": action, "reward": reward}, term, trunc, final)
    keys = jax.random.split(jax.random.key(0), 3)
    out = jax.jit(jax.vmap(lambda b, k: b.sample_transitions(k, 8, n_step=2, gamma=0.9)))(many, keys)
    single = jax.tree.map(lambda x: x[1], many)
    ref = AT(single, out.indices[1], 2, 0.9)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(lambda x: x[1], out), ref)


def test_compiles_once_per_shape_and_donation(compile_counter):
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=6)
    add = jax.jit(_add, donate_argnums=0)
    samp = jax.jit(lambda b, k: b.sample_sequences(k, 4, 3))
    rng = np.random.default_rng(0)
    buf = do_add(buf, add, *make_chunk(rng, 2, 1, 0), as_step=True)
    samp(buf, jax.random.key(0))
    with compile_counter() as n:
        for i in range(1, 8):
            buf = do_add(buf, add, *make_chunk(rng, 2, 1, i), as_step=True)
            samp(buf, jax.random.key(i))
    assert n() == 0
    old = buf
    do_add(buf, add, *make_chunk(rng, 2, 1, 9), as_step=True)
    assert old.storage["obs"].is_deleted()  # donated: updated in place


@pytest.mark.parametrize("t", [1, 3])
def test_donated_adds_write_every_array_in_place(t):
    """A donated add, of one step or of chunks that wrap around the ring's end, keeps the buffer of every array of
    the state it writes per step (steps, flags, final-observation slots and ring, sample counts)."""
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=5, final_obs_capacity=2)
    add = jax.jit(_add, donate_argnums=0)
    rng = np.random.default_rng(0)
    buf = do_add(buf, add, *make_chunk(rng, 2, t, 0), as_step=t == 1)  # the first call may allocate its outputs
    arrays = lambda b: [b.storage["obs"], b.storage["reward"], b.terminated, b.truncated, b.final_slot,  # noqa: E731
                        b.final_obs, b.metrics.sample_count]
    for i in range(1, 7):  # heads 1..6 * t modulo 5: every chunk of 3 after the first wraps at some point
        ptrs = [x.unsafe_buffer_pointer() for x in arrays(buf)]
        buf = do_add(buf, add, *make_chunk(rng, 2, t, i), as_step=t == 1)
        assert [x.unsafe_buffer_pointer() for x in arrays(buf)] == ptrs
    assert buf.num_added() == 7 * t


def test_odd_configurations_are_refused_with_the_reason():
    """An observation with no array leaves is refused at create (an add with truncation used to
    fail on a bare assert); transitions of a window of one step name
    window_length, not the default n_step; a one-step shape error names the num_envs axis."""
    with pytest.raises(ValueError, match=r"example_step\['obs'\]: expected at least one array leaf"):
        TrajectoryBuffer.create({"obs": {}, "action": jnp.int32(0), "reward": jnp.float32(0)}, num_envs=2, length=4)
    one = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=4, window_length=1)
    with pytest.raises(ValueError, match="needs window_length >= 2.*window_length=1"):
        one.sample_transitions(jax.random.key(0), 2, beta=0.4, gamma=0.9)
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=4)
    bad = {"obs": jnp.zeros((2, OBS_DIM + 1)), "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2)}
    with pytest.raises(ValueError, match=r"step\['obs'\]: expected shape \[num_envs, \*\[" + str(OBS_DIM) + r"\]\]"):
        buf.add(bad, terminated=jnp.zeros(2, bool))


def test_eager_calls_compile_once_per_shape_and_equal_jit(compile_counter):
    """An eager add / sample / can_sample is one cached compiled program: after the first call of
    a shape no call compiles again, and each returns what the jitted call returns."""
    rng = np.random.default_rng(3)
    chunks = [make_chunk(rng, 2, 1, i) for i in range(9)]
    calls = lambda b, k: (  # noqa: E731
        b.sample_sequences(k, 4, 2), b.sample_transitions(k, 4, n_step=1, gamma=0.9),
        b.can_sample(4, 2), b.can_sample_transitions(4, n_step=1), b.size(),
    )
    jitted_calls = jax.jit(calls)
    eager = jitted = TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=6)
    for i, c in enumerate(chunks):
        if i == 2:
            counter = compile_counter()
            n = counter.__enter__()
        eager = do_add(eager, _add, *c, as_step=True)
        jitted = do_add(jitted, ADD, *c, as_step=True)
        got, want = calls(eager, jax.random.key(i)), jitted_calls(jitted, jax.random.key(i))
        jax.tree.map(np.testing.assert_array_equal, host(got), host(want))
    counter.__exit__(None, None, None)
    assert n() == 0
    jax.tree.map(np.testing.assert_array_equal, eager, jitted)
    # gamma stays a traced argument: another value compiles nothing new; a bad one is named
    with compile_counter() as n:
        eager.sample_transitions(jax.random.key(0), 4, n_step=1, gamma=0.5)
    assert n() == 0
    with pytest.raises(ValueError, match="gamma"):
        eager.sample_transitions(jax.random.key(0), 4, n_step=1, gamma=7.0)


def test_truncate_last_equals_adding_the_step_truncated():
    """`truncate_last` after three adds gives the buffer whose third step was added `truncated` with that final
    observation (lane 1's third step already terminated: left as it is); on an empty buffer it changes nothing."""
    step = lambda v: {"obs": jnp.full((2, OBS_DIM), v, jnp.float32), "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2, jnp.float32)}  # noqa: E731
    empty = TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=4)
    no, final = jnp.zeros(2, bool), jnp.full((2, OBS_DIM), 9.0)
    ended = jnp.array([False, True])
    a, b = empty, empty
    for v in (1.0, 2.0):
        a, b = a.add(step(v), terminated=no), b.add(step(v), terminated=no)
    a = a.add(step(3.0), terminated=ended).truncate_last(jnp.array([True, True]), final)
    b = b.add(step(3.0), terminated=ended, truncated=jnp.array([True, False]), final_obs=final)
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a, b))
    same = empty.truncate_last(jnp.array([True, True]), final)
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), same, empty))
    with pytest.raises(ValueError, match="final_obs"):
        empty.truncate_last(jnp.array([True, True]), jnp.zeros((3, OBS_DIM)))


def test_can_sample_transitions_takes_the_samplers_gamma():
    """gamma= is taken (it raised TypeError) and checked as sample_transitions checks it; it never changes the answer."""
    buf = TrajectoryBuffer.create(EXAMPLE, num_envs=1, length=4)
    assert not bool(buf.can_sample_transitions(2, n_step=1, gamma=0.9))
    buf = do_add(buf, ADD, *make_chunk(np.random.default_rng(0), 1, 2, 0, 0.0, 0.0), as_step=False)
    assert bool(buf.can_sample_transitions(2, n_step=1, gamma=0.9)) and bool(buf.can_sample_transitions(2, n_step=1))
    with pytest.raises(ValueError, match="gamma"):
        buf.can_sample_transitions(2, n_step=1, gamma=7.0)
    with pytest.raises(ValueError, match="gamma"):
        buf.sample_transitions(jax.random.key(0), 2, n_step=1, gamma=7.0)


@pytest.mark.parametrize("reward", [jnp.int32(0), jnp.bool_(False), {"r": jnp.float32(0)}], ids=["int32", "bool", "tree"])
def test_a_reward_of_another_dtype_or_kind_is_a_type_error(reward):
    """A wrong dtype is a TypeError (guide, section 8), as for the data; an int32 reward was refused with ValueError."""
    import jaxbuffers as jb

    for create in (lambda ex: TrajectoryBuffer.create(ex, num_envs=1, length=4),
                   lambda ex: PrioritisedTrajectoryBuffer.create(ex, num_envs=1, length=4, window_length=2),
                   lambda ex: jb.EpisodeBuffer.create(ex, max_episodes=2, max_timesteps=4)):
        with pytest.raises(TypeError, match=r"example_step\['reward'\]: expected a floating scalar"):
            create({"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": reward})
