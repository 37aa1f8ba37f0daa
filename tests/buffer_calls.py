"""One call of every public method of every buffer class, on a small buffer of each (`BUFFERS`): the tests of the
stacked-state refusal and of host timing go through the same calls."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxbuffers as jb

KEY = jax.random.key(0)
ITEM = {"x": jnp.zeros(2, jnp.float32)}
STEP = {"obs": jnp.zeros((4, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
E, L = 2, 6


def _steps(n: int, lead: tuple) -> dict:
    return {"obs": jnp.ones((*lead, 4, 4), jnp.uint8), "action": jnp.zeros(lead, jnp.int32), "reward": jnp.ones(lead)}




EPISODE = _steps(5, (5,))
FINAL = jnp.ones((4, 4), jnp.uint8)


IDX = jnp.array([0, 1], jnp.int32)


def _replay(b, fill: bool):
    b = b.add({"x": jnp.ones((3, 2))}) if fill else b
    idx = IDX
    drawn = b.sample(KEY, 2) if fill else jb.ReplaySample(ITEM, IDX)
    calls = {"add": lambda c: c.add({"x": jnp.ones((2, 2))}), "sample": lambda c: c.sample(KEY, 2),
             "can_sample": lambda c: c.can_sample(2), "size": lambda c: c.size(), "is_full": lambda c: c.is_full(),
             "num_added": lambda c: c.num_added(), "record": lambda c: c.record(drawn), "stats": lambda c: c.stats()}
    calls["get"] = lambda c: c.get(idx)
    if not isinstance(b, jb.ReplayBuffer):
        g = b.generations_at(idx) if fill else IDX
        calls.update(priorities=lambda c: c.priorities(idx), generations_at=lambda c: c.generations_at(idx),
                     set_priorities=lambda c: c.set_priorities(idx, jnp.ones(2), g))
    return b, calls


def _trajectory(b, fill: bool):
    for _ in range(4 if fill else 0):
        b = b.add(_steps(E, (E,)), terminated=jnp.zeros(E, bool))
    prioritised = isinstance(getattr(b, "buffer", b), jb.PrioritisedTrajectoryBuffer) or isinstance(b, jb.PrioritisedTrajectoryBuffer)
    seq = (lambda c: c.sample_sequences(KEY, 2)) if prioritised else (lambda c: c.sample_sequences(KEY, 2, 2))
    calls = {"add": lambda c: c.add(_steps(E, (E,)), terminated=jnp.zeros(E, bool)), "sample_sequences": seq,
             "sample_transitions": lambda c: c.sample_transitions(KEY, 2, gamma=0.9),
             "can_sample": (lambda c: c.can_sample(2)) if prioritised else (lambda c: c.can_sample(2, 2)),
             "can_sample_transitions": lambda c: c.can_sample_transitions(2), "size": lambda c: c.size(),
             "is_full": lambda c: c.is_full(), "num_added": lambda c: c.num_added(), "stats": lambda c: c.stats(),
             "final_obs_at": lambda c: c.final_obs_at(jnp.array([0, 1]), 2)}
    if prioritised:
        s = b.sample_sequences(KEY, 2) if fill else None
        i, g = (s.indices, s.generations) if fill else (IDX, IDX)
        calls.update(set_priorities=lambda c: c.set_priorities(i, jnp.ones(2), g), priorities=lambda c: c.priorities(i), num_valid_windows=lambda c: c.num_valid_windows())
    calls.update(valid_starts=lambda c: c.valid_starts(jnp.array([0, 1]), 2),
                 sequences_at=lambda c: c.sequences_at(jnp.array([0, 1]), 2),
                 transitions_at=lambda c: c.transitions_at(jnp.array([0, 1]), gamma=0.9),
                 final_obs_lost=lambda c: c.final_obs_lost())
    return b, calls


def _rollout(b, fill: bool):
    kw = dict(reward=jnp.ones(E), value=jnp.ones(E), terminated=jnp.zeros(E, bool))
    b = b.add(_steps(E, (E,)), **kw).compute_gae(jnp.ones(E), 0.9, 0.9) if fill else b  # minibatches needs advantages
    calls = {"add": lambda c: c.add(_steps(E, (E,)), **kw), "compute_gae": lambda c: c.compute_gae(jnp.ones(E), 0.9, 0.9),
             "minibatches": lambda c: c.minibatches(KEY, 1), "minibatch_indices": lambda c: c.minibatch_indices(KEY, 1),
             "gather": lambda c: c.gather(jnp.array([[0, 1]])), "reset": lambda c: c.reset(), "size": lambda c: c.size(),
             "is_full": lambda c: c.is_full(), "filled": lambda c: c.filled(), "learn_mask": lambda c: c.learn_mask(),
             "trainable_size": lambda c: c.trainable_size()}
    return b, calls


def _episode(b, fill: bool):
    b = b.add_episode(EPISODE, 5, terminated=True, final_obs=FINAL) if fill else b
    calls = {"add_episode": lambda c: c.add_episode(EPISODE, 5, terminated=True, final_obs=FINAL),
             "add_episodes": lambda c: c.add_episodes(jax.tree.map(lambda x: x[None], EPISODE), jnp.array([5]),
                                                      terminated=jnp.array([True]), final_obs=FINAL[None]),
             "sample_episodes": lambda c: c.sample_episodes(KEY, 2), "sample_sequences": lambda c: c.sample_sequences(KEY, 2, 2),
             "sample_timesteps": lambda c: c.sample_timesteps(KEY, 2),
             "sample_transitions": lambda c: c.sample_transitions(KEY, 2, gamma=0.9),
             "can_sample": lambda c: c.can_sample(2), "can_sample_sequences": lambda c: c.can_sample_sequences(2, 2),
             "size": lambda c: c.size(), "num_episodes": lambda c: c.num_episodes(), "get_all": lambda c: c.get_all(),
             "num_added": lambda c: c.num_added(), "stats": lambda c: c.stats(),
             "update": lambda c: c.update(jnp.array([0]), {"reward": jnp.zeros((1, 5))})}
    return b, calls


BUFFERS = {
    "ReplayBuffer": lambda fill: _replay(jb.ReplayBuffer.create(ITEM, 4), fill),
    "PrioritisedReplayBuffer": lambda fill: _replay(jb.PrioritisedReplayBuffer.create(ITEM, 4), fill),
    "TrajectoryBuffer": lambda fill: _trajectory(jb.TrajectoryBuffer.create(STEP, num_envs=E, length=L), fill),
    "PrioritisedTrajectoryBuffer": lambda fill: _trajectory(jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=2), fill),
    "RolloutBuffer": lambda fill: _rollout(jb.RolloutBuffer.create(STEP, num_envs=E, num_steps=4), fill),
    "EpisodeBuffer": lambda fill: _episode(jb.EpisodeBuffer.create(STEP, max_episodes=3, max_timesteps=5), fill),
    "CompressedTrajectoryBuffer": lambda fill: _trajectory(jb.CompressedTrajectoryBuffer.create(STEP, num_envs=E, length=L), fill),
    "CompressedPrioritisedTrajectoryBuffer": lambda fill: _trajectory(jb.CompressedPrioritisedTrajectoryBuffer.create(
        STEP, num_envs=E, length=L, window_length=2), fill),
    "CompressedRolloutBuffer": lambda fill: _rollout(jb.CompressedRolloutBuffer.create(STEP, num_envs=E, num_steps=4), fill),
    "CompressedEpisodeBuffer": lambda fill: _episode(jb.CompressedEpisodeBuffer.create(STEP, max_episodes=3, max_timesteps=5), fill),
}
