"""A buffer state stacked with `jax.vmap` (one buffer per member) called without `vmap`: every public method of every
buffer class refuses it, eagerly and under `jit`, naming the method and the member axis; under `jax.vmap` the same
methods work per member (`jaxbuffers._validate.members`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb

S = 3  # members
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
    calls = {"add": lambda c: c.add({"x": jnp.ones((2, 2))}), "sample": lambda c: c.sample(KEY, 2),
             "can_sample": lambda c: c.can_sample(2), "size": lambda c: c.size(), "is_full": lambda c: c.is_full(),
             "num_added": lambda c: c.num_added(), "record": lambda c: c.record(b.sample(KEY, 2) if fill else jb.ReplaySample(ITEM, IDX)), "stats": lambda c: c.stats()}
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
    b = b.add(_steps(E, (E,)), **kw) if fill else b
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


def _stacked(b):
    return jax.tree.map(lambda x: jnp.stack([x] * S), b)


def _refusals(name: str, sanity: bool) -> dict:
    """{method: what went wrong} over the calls of `BUFFERS[name]` on a stacked state (`sanity`: each call is made
    on one member's state first, which takes it)."""
    one, calls = BUFFERS[name](sanity)
    stacked = _stacked(one)
    wrong = {}
    for method, call in calls.items():
        if sanity and not (name.startswith("Compressed") and method.startswith("add")):  # an add would leave `one` stale
            call(one)
        try:
            call(stacked)
            wrong[method] = "accepted"
        except Exception as e:  # noqa: BLE001 - every refusal is compared below
            if not (type(e) is ValueError and str(e).startswith(f"{name}.{method}: the state has a leading member axis of {S} ")):
                wrong[method] = f"{type(e).__name__}: {str(e)[:120]}"
    return wrong


@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_every_method_refuses_a_stacked_state_outside_vmap(name):
    """A stacked state is refused before anything runs, naming the method and the member axis (before, some methods
    read the member axis as data, others failed inside JAX)."""
    assert _refusals(name, sanity=False) == {}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_every_refused_call_is_taken_by_one_member(name):
    """The calls refused above are ones that one member's state takes."""
    assert _refusals(name, sanity=True) == {}


def test_refused_under_jit_and_taken_under_vmap():
    """Under `jit` the refusal is raised while tracing; under `vmap` each member is one buffer (member `s` holds
    `100 * s + {0, 1, 2}`: every sampled item is its own member's)."""
    stacked = jax.vmap(lambda s: jb.ReplayBuffer.create({"x": jnp.int32(0)}, 4).add({"x": 100 * s + jnp.arange(3, dtype=jnp.int32)}))(
        jnp.arange(S, dtype=jnp.int32))
    with pytest.raises(ValueError, match=rf"^ReplayBuffer\.sample: the state has a leading member axis of {S} .*jax\.vmap"):
        jax.jit(lambda b: b.sample(KEY, S))(stacked)
    with pytest.raises(ValueError, match=r"^ReplayBuffer\.add: the state has a leading member axis"):
        jax.jit(lambda b: b.add({"x": jnp.full((1, 4), 7, jnp.int32)}))(stacked)
    out = jax.jit(jax.vmap(lambda b, k: b.sample(k, 5)))(stacked, jax.random.split(KEY, S))
    assert ((np.asarray(out.item["x"]) // 100) == np.arange(S)[:, None]).all()
    assert np.asarray(jax.vmap(jb.ReplayBuffer.size)(stacked)).tolist() == [3] * S
    with pytest.raises(ValueError, match=r"^ReplayBuffer\.num_added: .*take one member"):
        stacked.num_added()


@pytest.mark.parametrize("name", sorted(n for n in BUFFERS if "Rollout" not in n))  # a rollout has no sampler
def test_every_can_sample_takes_exactly_its_samplers_arguments(name):
    """`can_sample*` answers for the sampler called with the same arguments, so it takes them, key apart: the same
    names, kinds, order and defaults (a sampler's required argument may have one there: `gamma`, `batch_size`). `PrioritisedReplayBuffer.can_sample`
    refused `beta=`, `TrajectoryBuffer.can_sample_transitions` refused `gamma=`."""
    import inspect

    cls = type(BUFFERS[name](False)[0])
    samplers = [m for m in dir(cls) if m.startswith("sample") and callable(getattr(cls, m))]
    assert samplers
    for sampler in samplers:
        checker = f"can_{sampler}" if hasattr(cls, f"can_{sampler}") else "can_sample"
        want = [p for p in inspect.signature(getattr(cls, sampler)).parameters.values() if p.name != "key"]
        got = list(inspect.signature(getattr(cls, checker)).parameters.values())
        assert [(p.name, p.kind) for p in got] == [(p.name, p.kind) for p in want], (checker, sampler)
        for p, q in zip(want, got):
            assert p.default is p.empty or q.default == p.default, (checker, sampler, p.name)
