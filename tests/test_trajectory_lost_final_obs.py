"""Lost final observations (`final_obs_capacity` K below `length`): no sampler of a trajectory buffer (uniform,
prioritised, compressed) ever draws a window that starts at or before a lane's newest step whose final observation the
ring overwrote, and every window after it is drawn, uniformly (prioritised: by priority).

A plain-Python model keeps every step ever added per lane; a stored truncated (not terminated) step has lost its final
observation when K or more such steps came after it in its lane. Every sampled transition's `next_obs` and every
sampled sequence's `final_obs_at` are checked against the true final observations.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxbuffers as jb

OBS_DIM = 2
EXAMPLE = {"obs": jnp.zeros((OBS_DIM,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}
GAMMA = 0.9


class Model:
    """Every step ever added per lane (flags, obs, true final obs) and the final-obs ring rule of K slots."""

    def __init__(self, num_envs: int, length: int, k: int):
        self.e, self.n, self.k = num_envs, length, k
        self.steps: list[list[dict]] = [[] for _ in range(num_envs)]

    def add(self, obs, term, trunc, final):
        for e in range(self.e):
            for j in range(term.shape[1]):
                self.steps[e].append(dict(obs=obs[e, j], term=bool(term[e, j]), trunc=bool(trunc[e, j]), final=final[e, j]))

    def truncate_last(self, truncated, final):
        for e in range(self.e):
            last = self.steps[e][-1] if self.steps[e] else None
            if truncated[e] and last is not None and not (last["term"] or last["trunc"]):
                last.update(trunc=True, final=final[e])

    @property
    def total(self) -> int:
        return len(self.steps[0])

    @property
    def lo(self) -> int:
        return self.total - min(self.total, self.n)

    def boot(self, e, a) -> bool:
        return self.steps[e][a]["trunc"] and not self.steps[e][a]["term"]

    def end(self, e, a) -> bool:
        return self.steps[e][a]["trunc"] or self.steps[e][a]["term"]

    def lost(self, e, a) -> bool:
        return self.boot(e, a) and sum(self.boot(e, b) for b in range(a + 1, self.total)) >= self.k

    def first_start(self, e) -> int:
        """The oldest step a window may start at: after the lane's newest stored step with a lost final obs."""
        return max([a + 1 for a in range(self.lo, self.total) if self.lost(e, a)], default=self.lo)

    def flat(self, e, a) -> int:
        return e * self.n + a % self.n

    def locate(self, flat) -> tuple[int, int]:
        e, slot = divmod(int(flat), self.n)
        (a,) = [a for a in range(self.lo, self.total) if a % self.n == slot]
        return e, a

    def starts(self, window, period=1, cross=True) -> set:
        return {(e, a) for e in range(self.e) for a in range(self.first_start(e), self.total - window + 1)
                if a % period == 0 and (cross or not any(self.end(e, b) for b in range(a, a + window - 1)))}

    def next_obs(self, e, a, n_step):
        b = next((a + i for i in range(n_step) if self.end(e, a + i)), a + n_step - 1)
        assert not self.lost(e, b)
        return self.steps[e][b]["final"] if self.boot(e, b) else self.steps[e][b + 1]["obs"]


def _fill(buf, model, rng, chunks, p_trunc, truncate_last=False):
    """Random chunks (unique obs per step, true final obs -obs - 7) added to `buf` and `model`."""
    for t in chunks:
        base = model.total + np.arange(t)[None, :] + 1000 * np.arange(model.e)[:, None]
        obs = np.stack([base, base + 0.5], axis=-1).astype(np.float32)
        term = rng.random((model.e, t)) < 0.1
        trunc = rng.random((model.e, t)) < p_trunc
        final = (-obs - 7).astype(np.float32)
        step = {"obs": obs, "action": base.astype(np.int32), "reward": rng.integers(-3, 4, (model.e, t)).astype(np.float32)}
        buf = buf.add(step, terminated=term, truncated=trunc, final_obs=final)
        model.add(obs, term, trunc, final)
        if truncate_last:
            cut, final = rng.random(model.e) < 0.5, (-obs[:, -1] - 11).astype(np.float32)
            buf = buf.truncate_last(cut, final)
            model.truncate_last(cut, final)
    return buf


def _check_state(buf, model):
    """The tracked boundary: `final_obs_lost`, and the state equal to the one rebuilt from the flags."""
    traj = getattr(buf, "trajectory", getattr(buf, "buffer", buf))
    traj = getattr(traj, "buffer", traj)
    want = [model.first_start(e) - model.lo for e in range(model.e)]
    np.testing.assert_array_equal(traj.lost_prefix, want)
    assert bool(buf.final_obs_lost()) == any(want)
    rebuilt = traj._with_lost_rebuilt()
    np.testing.assert_array_equal(rebuilt.lost_prefix, want)
    np.testing.assert_array_equal(rebuilt.final_owner, traj.final_owner)  # the stored owners, -1 where none


def _check_transitions(buf, model, n_step, batch=2048, prioritised_window=None):
    want = model.starts(n_step + 1 if prioritised_window is None else prioritised_window)
    assert bool(buf.can_sample_transitions(1, n_step=n_step)) == bool(want)
    if not want:
        return
    s = jax.device_get(buf.sample_transitions(jax.random.key(model.total), batch, n_step=n_step, gamma=GAMMA))
    drawn = [model.locate(i) for i in s.indices]
    assert set(drawn) == want  # never at or before a lost step; every other start drawn (2048 draws of <= 40)
    np.testing.assert_array_equal(s.next_obs, np.stack([model.next_obs(e, a, n_step) for e, a in drawn]))
    if prioritised_window is not None:  # every window has the initial priority: uniform over the drawable ones
        np.testing.assert_allclose(s.probabilities, 1 / len(want), rtol=1e-5)


def _check_sequences(buf, model, length, cross, period=1, batch=2048, prioritised=False):
    want = model.starts(length, period, cross)
    kw = {} if prioritised else {"period": period}
    assert bool(buf.can_sample(1, length, cross_episodes=cross, **kw)) == bool(want)
    every = jnp.arange(model.e * model.n, dtype=jnp.int32)
    got = {model.locate(i) for i in np.flatnonzero(np.asarray(buf.valid_starts(every, length, cross_episodes=cross, **kw)))}
    assert got == want
    if cross:
        assert int(buf.num_valid_windows(length, **kw)) == len(want)
    if prioritised and cross:
        got = {model.locate(i) for i in np.flatnonzero(np.asarray(buf.priorities(every)) > 0)}
        assert got == want  # the tree holds exactly the drawable windows
    if not want:
        return
    s = jax.device_get(buf.sample_sequences(jax.random.key(model.total), batch, length, cross_episodes=cross, **kw))
    drawn = [model.locate(i) for i in s.indices]
    assert set(drawn) == want
    final = np.asarray(buf.final_obs_at(s.indices[:64], length))
    for row, (e, a) in zip(final, drawn[:64]):  # exact at every truncated step of a drawn sequence
        for j in range(length):
            if model.boot(e, a + j):
                np.testing.assert_array_equal(row[j], model.steps[e][a + j]["final"])


CASES = [(1, 8, 1), (2, 8, 2), (3, 5, 1), (2, 9, 3), (3, 8, 2), (2, 5, 2)]


@pytest.mark.parametrize("seed", range(len(CASES)))
def test_uniform_samplers_start_after_the_newest_lost_final_obs(seed):
    rng = np.random.default_rng(seed)
    num_envs, length, k = CASES[seed]
    buf = jb.TrajectoryBuffer.create(EXAMPLE, num_envs=num_envs, length=length, final_obs_capacity=k)
    model = Model(num_envs, length, k)
    for chunks in ([3], [2, 4], [length], [1, 1, 3], [length - 1]):  # wraps the ring several times
        buf = _fill(buf, model, rng, chunks, p_trunc=0.3 + 0.1 * (seed % 3), truncate_last=seed % 2 == 1)
        _check_state(buf, model)
        for n_step in (1, 2, 3):
            _check_transitions(buf, model, n_step)
        for seq, cross, period in ((1, True, 1), (3, True, 1), (3, True, 2), (3, False, 1), (2, False, 3)):
            _check_sequences(buf, model, seq, cross, period)


@pytest.mark.parametrize("seed", range(3))
def test_prioritised_samplers_give_lost_windows_probability_zero(seed):
    rng = np.random.default_rng(100 + seed)
    num_envs, length, k = [(2, 8, 1), (3, 6, 2), (1, 9, 2)][seed]
    buf = jb.PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=num_envs, length=length, window_length=4, final_obs_capacity=k)
    model = Model(num_envs, length, k)
    for chunks in ([4], [2, 3], [length], [1, 1, 1, 2]):
        buf = _fill(buf, model, rng, chunks, p_trunc=0.4, truncate_last=seed != 1)
        _check_state(buf, model)
        for n_step in (1, 3):  # the tree holds windows of 4 steps: transitions start where 4 steps are stored
            _check_transitions(buf, model, n_step, prioritised_window=4)
        _check_sequences(buf, model, 4, True, prioritised=True)
        _check_sequences(buf, model, 4, False, prioritised=True)


def test_a_lost_prefix_longer_than_an_add_is_zeroed_in_the_tree():
    """K = 1, one truncation every 7 steps, single-step adds: each truncation moves the boundary 7 steps at once."""
    e, length, k, w = 2, 16, 1, 3
    buf = jb.PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=e, length=length, window_length=w, final_obs_capacity=k)
    model = Model(e, length, k)
    jumps = []
    for j in range(40):
        obs = np.full((e, 1, OBS_DIM), j, np.float32)
        trunc = (j % 7 == 6 - np.arange(e))[:, None]  # lane 0 at steps 6, 13, ..., lane 1 at 5, 12, ...
        before = np.asarray(buf.buffer.lost_prefix)
        step = {"obs": obs, "action": np.zeros((e, 1), np.int32), "reward": np.zeros((e, 1), np.float32)}
        buf = buf.add(step, terminated=np.zeros((e, 1), bool), truncated=trunc, final_obs=-obs)
        model.add(obs, np.zeros((e, 1), bool), trunc, -obs)
        every = jnp.arange(e * length, dtype=jnp.int32)
        got = {model.locate(i) for i in np.flatnonzero(np.asarray(buf.priorities(every)) > 0)}
        assert got == model.starts(w)
        np.testing.assert_allclose(float(buf.tree.total()), len(got), rtol=1e-6)
        jumps.append(int(np.max(np.asarray(buf.buffer.lost_prefix) - before)))
    assert bool(buf.final_obs_lost()) and max(jumps) == 7 > w


def test_uniform_draws_are_uniform_over_the_windows_after_the_boundary():
    """Chi-square test (fixed seed) of 40,000 draws over the valid windows, lanes of unequal counts."""
    e, length, k = 3, 12, 1
    buf = jb.TrajectoryBuffer.create(EXAMPLE, num_envs=e, length=length, final_obs_capacity=k)
    model = Model(e, length, k)
    obs = np.arange(e * 20 * OBS_DIM, dtype=np.float32).reshape(e, 20, OBS_DIM)
    trunc = np.zeros((e, 20), bool)
    trunc[0, [10, 14]] = True  # lane 0: step 10 lost, windows start at 11..
    trunc[1, [3, 16]] = True  # lane 1: step 3 lost (evicted: 8 steps stored before it), the whole lane
    trunc[2, [12, 13, 15]] = True  # lane 2: steps 12, 13 lost, starts at 14..
    step = {"obs": obs, "action": np.zeros((e, 20), np.int32), "reward": np.zeros((e, 20), np.float32)}
    for lo, hi in ((0, 12), (12, 20)):
        s = jax.tree.map(lambda x: x[:, lo:hi], step)
        buf = buf.add(s, terminated=np.zeros((e, hi - lo), bool), truncated=trunc[:, lo:hi], final_obs=-obs[:, lo:hi])
        model.add(obs[:, lo:hi], np.zeros((e, hi - lo), bool), trunc[:, lo:hi], -obs[:, lo:hi])
    assert [model.first_start(i) for i in range(e)] == [11, 8, 14]
    want = sorted(model.starts(3))
    assert len(want) == 7 + 10 + 4
    draws = 40_000
    s = jax.device_get(buf.sample_sequences(jax.random.key(3), draws, 3))
    drawn = [model.locate(i) for i in s.indices]
    counts = np.array([drawn.count(w) for w in want])
    assert counts.sum() == draws  # no draw outside the valid windows
    expected = draws / len(want)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 45.31  # chi-square 99.9% point for 20 degrees of freedom (21 windows)


@pytest.mark.parametrize("cls", [jb.TrajectoryBuffer, jb.PrioritisedTrajectoryBuffer])
def test_nothing_to_sample_when_every_start_is_lost(cls):
    """K = 1 and every step truncated: only the newest step holds its final obs, and it starts no whole window."""
    extra = {"window_length": 2} if cls is jb.PrioritisedTrajectoryBuffer else {}
    buf = cls.create(EXAMPLE, num_envs=2, length=6, final_obs_capacity=1, **extra)
    obs = np.arange(2 * 9 * OBS_DIM, dtype=np.float32).reshape(2, 9, OBS_DIM)
    buf = buf.add({"obs": obs[:, :3], "action": np.zeros((2, 3), np.int32), "reward": np.zeros((2, 3), np.float32)},
                  terminated=np.zeros((2, 3), bool), truncated=np.zeros((2, 3), bool), final_obs=obs[:, :3])
    assert bool(buf.can_sample_transitions(1, n_step=1)) and bool(buf.can_sample(1, 2))
    buf = buf.add({"obs": obs[:, 3:], "action": np.zeros((2, 6), np.int32), "reward": np.zeros((2, 6), np.float32)},
                  terminated=np.zeros((2, 6), bool), truncated=np.ones((2, 6), bool), final_obs=-obs[:, 3:])
    assert bool(buf.final_obs_lost())
    assert not bool(buf.can_sample_transitions(1, n_step=1)) and not bool(buf.can_sample(1, 2))
    assert not bool(buf.can_sample(1, 2, cross_episodes=False)) and int(buf.num_valid_windows(2)) == 0
    if cls is jb.TrajectoryBuffer:
        assert bool(buf.can_sample(1, 1)) and int(buf.num_valid_windows(1)) == 2  # the newest steps, held


def test_full_capacity_keeps_no_lost_state():
    """K = length: nothing can be lost, the state holds no owner table and the boundary stays 0."""
    buf = jb.TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=5)
    model = Model(2, 5, 5)
    buf = _fill(buf, model, np.random.default_rng(0), [3, 5, 4], p_trunc=0.9)
    assert buf.final_owner.shape == (2, 0) and not bool(buf.final_obs_lost())
    np.testing.assert_array_equal(buf.lost_prefix, [0, 0])
    assert int(buf.num_valid_windows(2)) == len(model.starts(2)) == 8


def test_compressed_buffers_follow_the_same_rule():
    """A compressed buffer samples through its inner buffer; `truncate_last_from_host` moves the boundary too."""
    e, length, k = 2, 8, 1
    ex = {"obs": jnp.zeros((4, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    rng = np.random.default_rng(7)
    for cls, extra in ((jb.CompressedTrajectoryBuffer, {}), (jb.CompressedPrioritisedTrajectoryBuffer, {"window_length": 3})):
        buf = cls.create(ex, num_envs=e, length=length, codec="rle", final_obs_capacity=k, **extra)
        model = Model(e, length, k)
        for j in range(30):
            obs = rng.integers(0, 255, (e, 1, 4, 4)).astype(np.uint8)
            term = rng.random((e, 1)) < 0.05
            trunc = rng.random((e, 1)) < 0.3
            final = rng.integers(0, 255, (e, 1, 4, 4)).astype(np.uint8)
            step = {"obs": obs, "action": np.zeros((e, 1), np.int32), "reward": np.zeros((e, 1), np.float32)}
            buf = buf.add(step, terminated=term, truncated=trunc, final_obs=final)
            model.add(obs, term, trunc, final)
            if j % 5 == 4:
                cut, fin = rng.random(e) < 0.7, rng.integers(0, 255, (e, 4, 4)).astype(np.uint8)
                buf = buf.truncate_last_from_host(cut, fin)
                model.truncate_last(cut, fin)
            _check_state(buf, model)
            if extra:  # the tree holds exactly the drawable windows, also after `truncate_last_from_host`
                every = jnp.arange(e * length, dtype=jnp.int32)
                assert {model.locate(i) for i in np.flatnonzero(np.asarray(buf.priorities(every)) > 0)} == model.starts(3)
        window = 3 if extra else 2
        want = model.starts(window)
        assert want and bool(buf.can_sample_transitions(1, n_step=1))
        out = jax.device_get(buf.sample_transitions(jax.random.key(1), 512, n_step=1, gamma=GAMMA))
        drawn = [model.locate(i) for i in out.indices]
        assert set(drawn) == want
        np.testing.assert_array_equal(out.next_obs, np.stack([model.next_obs(a, b, 1) for a, b in drawn]))
        buf.close()


@pytest.mark.parametrize("how", ["add", "add_frames_from_host"])
def test_compressed_chunks_with_more_truncations_than_the_ring(how):
    """Chunks holding more truncated steps per lane than K (delta-coded frames): only the final frames the ring keeps
    are written, through the add's callback or from host frames, and the samples read the true ones."""
    e, length, k, t = 2, 8, 1, 4
    ex = {"obs": jnp.zeros((4, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = jb.CompressedTrajectoryBuffer.create(ex, num_envs=e, length=length, final_obs_capacity=k)
    assert buf.keyframe_interval > 1
    model, rng = Model(e, length, k), np.random.default_rng(11)
    for _ in range(6):
        obs = rng.integers(0, 255, (e, t, 4, 4)).astype(np.uint8)
        term = np.zeros((e, t), bool)
        trunc = rng.random((e, t)) < 0.6
        trunc[0, :2] = True  # two truncated steps of lane 0 in every chunk: the first one's frame is never kept
        final = rng.integers(0, 255, (e, t, 4, 4)).astype(np.uint8)
        rest = {"action": np.zeros((e, t), np.int32), "reward": np.zeros((e, t), np.float32)}
        if how == "add":
            buf = buf.add({"obs": obs, **rest}, terminated=term, truncated=trunc, final_obs=final)
        else:
            ids = np.zeros((e, t, 3), np.int32)
            buf = buf.add_frames_from_host({"obs": ids, **rest}, [obs], term, trunc, ids, [final])
        model.add(obs, term, trunc, final)
        _check_state(buf, model)
        want = model.starts(2)
        assert bool(buf.can_sample_transitions(1, n_step=1)) == bool(want)
        if want:
            out = jax.device_get(buf.sample_transitions(jax.random.key(model.total), 256, n_step=1, gamma=GAMMA))
            drawn = [model.locate(i) for i in out.indices]
            assert set(drawn) == want
            np.testing.assert_array_equal(out.next_obs, np.stack([model.next_obs(a, b, 1) for a, b in drawn]))
    buf.close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_adds_keep_the_boundary_of_the_reference_model(data):
    """Model-based: random lanes, ring sizes, chunks of 1..length steps (wrapping the data ring and the final ring),
    `truncate_last`, terminations; after each operation the tracked boundary equals the model's and the rebuilt one,
    the uniform windows (period 1 and 2, crossing episodes or not) are the model's, the prioritised tree's positive
    leaves are exactly the model's windows, drawn transitions read true final observations, and a state rebuilt from
    the flags (an older checkpoint's) moves its boundary as the tracked one does."""
    e = data.draw(st.integers(1, 3), label="num_envs")
    n = data.draw(st.integers(2, 7), label="length")
    k = data.draw(st.integers(1, n - 1), label="K")
    w = data.draw(st.integers(1, n), label="window_length")
    period = data.draw(st.sampled_from([1, 2]), label="period")
    p_trunc = data.draw(st.sampled_from([0.3, 0.7, 1.0]), label="p_trunc")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = np.random.default_rng(seed)
    ops = [(data.draw(st.integers(1, n)), data.draw(st.booleans())) for _ in range(data.draw(st.integers(3, 7)))]
    buf = jb.TrajectoryBuffer.create(EXAMPLE, num_envs=e, length=n, final_obs_capacity=k)
    pri = jb.PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=e, length=n, window_length=w, period=period, final_obs_capacity=k)
    model, every = Model(e, n, k), jnp.arange(e * n, dtype=jnp.int32)
    for t, cut in ops:
        base = model.total + np.arange(t)[None, :] + 1000 * np.arange(e)[:, None]
        obs = np.stack([base, base + 0.5], axis=-1).astype(np.float32)
        term = rng.random((e, t)) < 0.15
        trunc = rng.random((e, t)) < p_trunc
        final = (-obs - 7).astype(np.float32)
        step = {"obs": obs, "action": base.astype(np.int32), "reward": np.zeros((e, t), np.float32)}
        restored = buf._with_lost_rebuilt()  # an older checkpoint's state, given the fields, then added to
        buf, restored = (b.add(step, terminated=term, truncated=trunc, final_obs=final) for b in (buf, restored))
        pri = pri.add(step, terminated=term, truncated=trunc, final_obs=final)
        model.add(obs, term, trunc, final)
        if cut:
            which, fin = rng.random(e) < 0.7, (-obs[:, -1] - 11).astype(np.float32)
            buf, pri, restored = buf.truncate_last(which, fin), pri.truncate_last(which, fin), restored.truncate_last(which, fin)
            model.truncate_last(which, fin)
        np.testing.assert_array_equal(restored.lost_prefix, buf.lost_prefix)
        np.testing.assert_array_equal(restored.final_owner, buf.final_owner)
        _check_state(buf, model)
        _check_state(pri, model)
        rebuilt = buf._with_lost_rebuilt()
        for window, per, cross in ((1, 1, True), (2, 1, True), (min(3, n), 2, True), (2, 1, False)):
            want = model.starts(window, per, cross)
            got = {model.locate(i) for i in np.flatnonzero(np.asarray(buf.valid_starts(every, window, period=per, cross_episodes=cross)))}
            assert got == want
            assert bool(buf.can_sample(1, window, period=per, cross_episodes=cross)) == bool(want)
            if cross:
                assert int(buf.num_valid_windows(window, period=per)) == int(rebuilt.num_valid_windows(window, period=per)) == len(want)
        want = model.starts(w, period)
        assert {model.locate(i) for i in np.flatnonzero(np.asarray(pri.priorities(every)) > 0)} == want
        np.testing.assert_allclose(float(pri.tree.total()), len(want), rtol=1e-5)
        assert bool(pri.can_sample(1)) == bool(want)
        want = model.starts(2)
        if want:
            s = jax.device_get(buf.sample_transitions(jax.random.key(model.total), 128, n_step=1, gamma=GAMMA))
            drawn = [model.locate(i) for i in s.indices]
            assert set(drawn) <= want
            np.testing.assert_array_equal(s.next_obs, np.stack([model.next_obs(a, b, 1) for a, b in drawn]))


def test_set_priorities_never_revives_a_window_that_entered_the_lost_prefix():
    """Windows sampled (generations kept), then lost by a later truncation, then given a priority: still 0, and the
    tree's total is the drawable mass; the windows still drawable do take the new priority."""
    e, n, k, w = 2, 8, 1, 2
    buf = jb.PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=e, length=n, window_length=w, final_obs_capacity=k)
    model = Model(e, n, k)
    buf = _fill(buf, model, np.random.default_rng(0), [5], p_trunc=0.0)
    s = jax.device_get(buf.sample_sequences(jax.random.key(0), 64, 2))
    obs = np.full((e, 2, OBS_DIM), 50, np.float32)
    trunc = np.ones((e, 2), bool)  # two truncations, K = 1: the first is lost, every window up to it too
    step = {"obs": obs, "action": np.zeros((e, 2), np.int32), "reward": np.zeros((e, 2), np.float32)}
    buf = buf.add(step, terminated=np.zeros((e, 2), bool), truncated=trunc, final_obs=-obs)
    model.add(obs, np.zeros((e, 2), bool), trunc, -obs)
    _check_state(buf, model)
    every = jnp.arange(e * n, dtype=jnp.int32)
    before = {model.locate(i) for i in np.flatnonzero(np.asarray(buf.priorities(every)) > 0)}
    assert before == model.starts(w) and len(before) < len({model.locate(i) for i in s.indices})
    buf = buf.set_priorities(s.indices, np.full(64, 5.0, np.float32), s.generations)
    p = np.asarray(buf.priorities(every))
    assert {model.locate(i) for i in np.flatnonzero(p > 0)} == model.starts(w)
    np.testing.assert_allclose(float(buf.tree.total()), float(p.sum()), rtol=1e-5)


@pytest.mark.parametrize("cls", [jb.TrajectoryBuffer, jb.PrioritisedTrajectoryBuffer])
def test_adds_under_scan_vmap_and_donation_keep_the_eager_boundary(cls):
    """The same chunks added eagerly, inside `lax.scan` under `jit` with donation, and to a stack of two members under
    `vmap`: the same `lost_prefix`, `final_owner` and tree."""
    e, n, k, t = 2, 6, 2, 3
    extra = {"window_length": 2} if cls is jb.PrioritisedTrajectoryBuffer else {}
    empty = cls.create(EXAMPLE, num_envs=e, length=n, final_obs_capacity=k, **extra)
    rng = np.random.default_rng(4)
    chunks = 7
    obs = rng.standard_normal((chunks, e, t, OBS_DIM)).astype(np.float32)
    term = rng.random((chunks, e, t)) < 0.1
    trunc = rng.random((chunks, e, t)) < 0.6
    xs = ({"obs": obs, "action": np.zeros((chunks, e, t), np.int32), "reward": np.zeros((chunks, e, t), np.float32)}, term, trunc, -obs)
    eager = empty
    for i in range(chunks):
        s, a, b, f = jax.tree.map(lambda x: x[i], xs)
        eager = eager.add(s, terminated=a, truncated=b, final_obs=f)
    scan = jax.jit(lambda buf, xs: jax.lax.scan(lambda b, x: (b.add(x[0], terminated=x[1], truncated=x[2], final_obs=x[3]), None), buf, xs)[0],
                   donate_argnums=0)
    stacked = jax.tree.map(lambda x: jnp.stack([x, x]), empty)
    scanned = scan(empty, xs)
    vadd = jax.vmap(lambda b, s, a, c, f: b.add(s, terminated=a, truncated=c, final_obs=f))
    for i in range(chunks):
        stacked = vadd(stacked, *jax.tree.map(lambda x: jnp.stack([x[i]] * 2), xs))
    inner = lambda b: getattr(b, "buffer", b)  # noqa: E731
    assert np.asarray(inner(eager).lost_prefix).any()
    for other in (scanned, jax.tree.map(lambda x: x[1], stacked)):
        np.testing.assert_array_equal(inner(other).lost_prefix, inner(eager).lost_prefix)
        np.testing.assert_array_equal(inner(other).final_owner, inner(eager).final_owner)
        if extra:
            every = jnp.arange(e * n, dtype=jnp.int32)
            np.testing.assert_array_equal(other.priorities(every), eager.priorities(every))


@pytest.mark.parametrize("k", [2, 6])
def test_a_checkpoint_of_the_tracked_state_restores_it(tmp_path, k):
    """Save and restore (with and without a target) of a buffer with lost final observations ($K$ < `length`) and of
    one with `final_obs_capacity = length` (an empty owner table `[num_envs, 0]`): the same state, the same samples."""
    e, n = 2, 6
    buf = jb.PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=e, length=n, window_length=2, final_obs_capacity=k)
    model = Model(e, n, k)
    buf = _fill(buf, model, np.random.default_rng(2), [4, 5, 3], p_trunc=0.6)
    assert buf.buffer.final_owner.shape == (e, k if k < n else 0)
    assert bool(buf.final_obs_lost()) == (k < n)
    jb.save(tmp_path / "c", buf)
    target = jb.PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=e, length=n, window_length=2, final_obs_capacity=k)
    for back in (jb.restore(tmp_path / "c"), jb.restore(tmp_path / "c", target)):
        for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(buf), strict=True):
            np.testing.assert_array_equal(a, b)
        key = jax.random.key(1)
        for a, b in zip(jax.tree.leaves(back.sample_transitions(key, 8, n_step=1, gamma=GAMMA)),
                        jax.tree.leaves(buf.sample_transitions(key, 8, n_step=1, gamma=GAMMA)), strict=True):
            np.testing.assert_array_equal(a, b)
