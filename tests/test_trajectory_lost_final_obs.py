"""Lost final observations (`final_obs_capacity` K below `length`): no sampler of a trajectory buffer (uniform,
prioritised, compressed with frame stacks) ever draws a window that reads a final observation the ring overwrote.

A plain-Python model keeps every step ever added per lane and says which stored steps still hold their final
observation (fewer than K truncated, not terminated steps came after them in the lane); every sampled transition's
`next_obs` is checked against the true final observation, and the drawn starts against the model's valid ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb
from frame_stacks import stacked_chunk

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
        """A stored step whose final observation was overwritten: K or more bootstrapping steps came after it."""
        return self.boot(e, a) and sum(self.boot(e, b) for b in range(a + 1, self.total)) >= self.k

    def flat(self, e, a) -> int:
        return e * self.n + a % self.n

    def locate(self, flat) -> tuple[int, int]:
        e, slot = divmod(int(flat), self.n)
        (a,) = [a for a in range(self.lo, self.total) if a % self.n == slot]
        return e, a

    def bootstrap_step(self, e, a, n_step) -> int:
        """Step t + k - 1 of the transition from `a`: its first episode end among n_step steps, else the last."""
        return next((a + i for i in range(n_step) if self.end(e, a + i)), a + n_step - 1)

    def transition_starts(self, n_step) -> set:
        return {(e, a) for e in range(self.e) for a in range(self.lo, self.total - n_step)
                if not self.lost(e, self.bootstrap_step(e, a, n_step))}

    def sequence_starts(self, length, cross=True) -> set:
        return {(e, a) for e in range(self.e) for a in range(self.lo, self.total - length + 1)
                if not any(self.lost(e, b) for b in range(a, a + length))
                and (cross or not any(self.end(e, b) for b in range(a, a + length - 1)))}

    def next_obs(self, e, a, n_step):
        b = self.bootstrap_step(e, a, n_step)
        return self.steps[e][b]["final"] if self.boot(e, b) else self.steps[e][b + 1]["obs"]


def _fill(buf, model, rng, chunks, p_trunc):
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
    return buf


def _check_transitions(buf, model, n_step, batch=2048, prioritised=False):
    want = model.transition_starts(n_step)
    assert bool(buf.can_sample_transitions(1, n_step=n_step)) == bool(want)
    if not want:
        return
    kw = {"beta": 1.0} if prioritised else {}
    s = jax.device_get(buf.sample_transitions(jax.random.key(model.total), batch, n_step=n_step, gamma=GAMMA, **kw))
    drawn = [model.locate(i) for i in s.indices]
    assert set(drawn) == want  # never a lost bootstrap step; every other start drawn (2048 draws of <= 27)
    np.testing.assert_array_equal(s.next_obs, np.stack([model.next_obs(e, a, n_step) for e, a in drawn]))
    if prioritised:  # every window has the initial priority: uniform over the drawable ones
        np.testing.assert_allclose(s.probabilities, 1 / len(want), rtol=1e-5)


def _check_sequences(buf, model, length, cross, batch=2048, prioritised=False):
    want = model.sequence_starts(length, cross)
    assert bool(buf.can_sample(1, length, cross_episodes=cross)) == bool(want)
    if cross:
        every = jnp.arange(model.e * model.n, dtype=jnp.int32)
        got = {model.locate(i) for i in np.flatnonzero(np.asarray(buf.valid_starts(every, length)))}
        assert got == want and int(buf.num_valid_windows(length)) == len(want)
    if not want:
        return
    kw = {"beta": 1.0} if prioritised else {}
    s = jax.device_get(buf.sample_sequences(jax.random.key(model.total), batch, length, cross_episodes=cross, **kw))
    drawn = [model.locate(i) for i in s.indices]
    assert set(drawn) == want
    final = np.asarray(buf.final_obs_at(s.indices[:64], length))
    for row, (e, a) in zip(final, drawn[:64]):  # exact at every truncated step of a drawn sequence
        for j in range(length):
            if model.boot(e, a + j):
                np.testing.assert_array_equal(row[j], model.steps[e][a + j]["final"])


@pytest.mark.parametrize("seed", range(6))
def test_uniform_samplers_never_read_a_lost_final_obs(seed):
    rng = np.random.default_rng(seed)
    num_envs, length, k = [(1, 8, 1), (2, 8, 2), (3, 5, 1), (2, 9, 3), (3, 8, 2), (2, 5, 2)][seed]
    buf = jb.TrajectoryBuffer.create(EXAMPLE, num_envs=num_envs, length=length, final_obs_capacity=k)
    model = Model(num_envs, length, k)
    for chunks in ([3], [2, 4], [length], [1, 1, 3]):  # wraps the ring several times
        buf = _fill(buf, model, rng, chunks, p_trunc=0.45)
        assert bool(buf.final_obs_lost()) == any(model.lost(e, a) for e in range(num_envs) for a in range(model.lo, model.total))
        for n_step in (1, 2, 3):
            _check_transitions(buf, model, n_step)
        for seq, cross in ((1, True), (3, True), (3, False)):
            _check_sequences(buf, model, seq, cross)


@pytest.mark.parametrize("seed", range(3))
def test_prioritised_samplers_give_lost_windows_probability_zero(seed):
    rng = np.random.default_rng(100 + seed)
    num_envs, length, k = [(2, 8, 1), (3, 6, 2), (1, 9, 2)][seed]
    buf = jb.PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=num_envs, length=length, window_length=4, final_obs_capacity=k)
    model = Model(num_envs, length, k)
    for chunks in ([4], [2, 3], [length]):
        buf = _fill(buf, model, rng, chunks, p_trunc=0.45)
        for n_step in (1, 3):  # the tree holds windows of 4 steps: transitions start where 4 steps are stored
            want = {(e, a) for e, a in model.transition_starts(n_step) if a + 4 <= model.total}
            assert bool(buf.can_sample_transitions(1, n_step=n_step)) == bool(want)
            if want:
                s = jax.device_get(buf.sample_transitions(jax.random.key(model.total), 2048, n_step=n_step, gamma=GAMMA))
                drawn = [model.locate(i) for i in s.indices]
                assert set(drawn) == want
                np.testing.assert_array_equal(s.next_obs, np.stack([model.next_obs(e, a, n_step) for e, a in drawn]))
                np.testing.assert_allclose(s.probabilities, 1 / len(want), rtol=1e-5)
        _check_sequences(buf, model, 4, True, prioritised=True)
        _check_sequences(buf, model, 4, False, prioritised=True)


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


def test_compressed_frame_stacks_next_obs_after_lost_final_obs():
    """A compressed buffer of frame stacks samples through its inner buffer: the same rule, decoded stacks exact."""
    e, length, k, steps, stack = 2, 8, 1, 30, 3
    rng = np.random.default_rng(7)
    newest = rng.integers(0, 255, (e, steps, 4, 4)).astype(np.uint8)
    term = rng.random((e, steps)) < 0.05
    trunc = (rng.random((e, steps)) < 0.4) & ~term
    stacks, finals = stacked_chunk(newest, term | trunc, stack)
    ex = {"obs": jnp.zeros((stack, 4, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = jb.CompressedTrajectoryBuffer.create(ex, num_envs=e, length=length, frame_stack=stack, codec="rle", final_obs_capacity=k)
    model = Model(e, length, k)
    for j in range(steps):
        s = {"obs": stacks[:, j], "action": np.zeros(e, np.int32), "reward": np.zeros(e, np.float32)}
        buf = buf.add(s, terminated=term[:, j], truncated=trunc[:, j], final_obs=finals[:, j])
        model.add(stacks[:, j : j + 1], term[:, j : j + 1], trunc[:, j : j + 1], finals[:, j : j + 1])
    assert bool(buf.final_obs_lost())
    for n_step in (1, 2):
        want = model.transition_starts(n_step)
        assert want and bool(buf.can_sample_transitions(1, n_step=n_step))
        out = jax.device_get(buf.sample_transitions(jax.random.key(n_step), 512, n_step=n_step, gamma=GAMMA))
        drawn = [model.locate(i) for i in out.indices]
        assert set(drawn) == want
        np.testing.assert_array_equal(out.next_obs, np.stack([model.next_obs(a, b, n_step) for a, b in drawn]))
