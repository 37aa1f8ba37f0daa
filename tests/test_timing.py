"""Host timing of eager calls (`jaxbuffers._timing`): every public method of every buffer class, called eagerly in a
`jaxbuffers.timing()` block, is counted once under `Class.method` of the method called, never under the names of
the private methods it runs (`_write`, `_any`, ...)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import jaxbuffers as jb
from buffer_calls import BUFFERS, E, FINAL, KEY

IDX = jnp.array([0, 1], jnp.int32)


def _record(sample):
    """A call of `record` of `sample(state)` drawn before it is timed (drawing it inside would add a row): returns
    the timed call."""
    def prepared(c):
        s = sample(c)
        return lambda: c.record(s)

    prepared.prepared = True
    return prepared


_TRAJECTORY = {  # calls of the public methods the shared calls leave out
    "record": _record(lambda c: c.sample_transitions(KEY, 2, gamma=0.9)),
    "final_obs_lost": lambda c: c.final_obs_lost(),
    "truncate_last": lambda c: c.truncate_last(jnp.ones(2, bool), FINAL[None].repeat(E, 0)),
}
_EPISODE = {
    "record": _record(lambda c: c.sample_timesteps(KEY, 2)),
    "is_full": lambda c: c.is_full(),
    "transitions_at": lambda c: c.transitions_at(jnp.array([0, 0]), jnp.array([0, 1]), gamma=0.9),
}
_COMPRESSED = {"decode_obs": lambda c: c.decode_obs(c.trajectory.storage["obs"][:, :1]), "close": lambda c: c.close()}
MORE = {
    "ReplayBuffer": {"with_cursors": lambda c: c.with_cursors(head=1)},
    "TrajectoryBuffer": {**_TRAJECTORY, "num_valid_windows": lambda c: c.num_valid_windows(2)},
    "PrioritisedTrajectoryBuffer": {"record": _TRAJECTORY["record"], "generations_at": lambda c: c.generations_at(IDX)},
    "EpisodeBuffer": _EPISODE,
    "CompressedTrajectoryBuffer": {"record": _TRAJECTORY["record"], "final_obs_lost": _TRAJECTORY["final_obs_lost"], **_COMPRESSED},
    "CompressedPrioritisedTrajectoryBuffer": {"record": _TRAJECTORY["record"], **_COMPRESSED},
    "CompressedRolloutBuffer": {"close": _COMPRESSED["close"]},
    "CompressedEpisodeBuffer": {**_EPISODE, "close": _COMPRESSED["close"]},
}


@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_every_public_method_is_timed_under_its_own_name(name):
    """One row per call, `Class.method` of the method called (before, `EpisodeBuffer.add_episode` was counted as
    `EpisodeBuffer.write`, `can_sample` as `EpisodeBuffer.any`, and some methods not at all)."""
    calls = {**BUFFERS[name](True)[1], **MORE.get(name, {})}
    wrong = {}
    for method, call in calls.items():
        timed = call if getattr(call, "prepared", False) else (lambda c, f=call: lambda: f(c))
        timed(BUFFERS[name](True)[0])()  # compiled outside the block
        run = timed(BUFFERS[name](True)[0])  # fresh: a compressed add leaves the state it was given stale
        with jb.timing() as t:
            run()
        rows = {k: v["calls"] for k, v in t.summary().items()}
        if rows != {f"{name}.{method}": 1}:
            wrong[method] = rows
    assert wrong == {}


def test_a_concatenation_of_folders_is_timed_under_its_own_names():
    from jaxbuffers import disk

    c = disk.Concatenated.create([BUFFERS["CompressedTrajectoryBuffer"](True)[0] for _ in range(2)])
    c.sample_transitions(KEY, 2, gamma=0.9)
    with jb.timing() as t:
        c.sample_transitions(KEY, 2, gamma=0.9)
        c.size()
    assert {k: v["calls"] for k, v in t.summary().items()} == {"Concatenated.sample_transitions": 1, "Concatenated.size": 1}
