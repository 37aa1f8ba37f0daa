"""SB3's save_replay_buffer / load_replay_buffer path (a pickle of the adapter) carries checkpoint bytes only."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.save_util import load_from_pkl, save_to_pkl  # noqa: E402

from jaxbuffers.interop.sb3 import JaxDictReplayBuffer, JaxReplayBuffer, JaxRolloutBuffer  # noqa: E402
from test_sb3_replay import random_obs, random_step  # noqa: E402

PIX = spaces.Box(0, 255, (4, 6, 6), np.uint8)
DICT = spaces.Dict({"img": spaces.Box(0, 255, (2, 3), np.uint8), "vec": spaces.Box(-1, 1, (2,), np.float32)})
ACT = spaces.Discrete(3)


def _add_replay(buf, rng, steps, n=2):
    for _ in range(steps):
        stacked = bool(getattr(buf, "compress", None))
        obs, nxt, act, rew, done, infos = random_step(buf.observation_space, ACT, n, rng, p_done=1.0 if stacked else 0.2)
        if stacked:  # frame_stack: each step a whole episode, stacks as VecFrameStack makes them
            obs = np.concatenate([np.zeros_like(obs[:, 1:]), obs[:, -1:]], axis=1)
            nxt = np.concatenate([obs[:, 1:], nxt[:, -1:]], axis=1)
        buf.add(obs, nxt, act, rew, done, infos)


def _same(a, b):
    for x, y in zip(a, b):
        if isinstance(x, dict):
            for k in x:
                assert th.equal(x[k], y[k]), k
        elif x is not None:
            assert th.equal(x, y)


@pytest.mark.parametrize(
    "make",
    [
        lambda: JaxReplayBuffer(12, PIX, ACT, device="cpu", n_envs=2),
        lambda: JaxDictReplayBuffer(12, DICT, ACT, device="cpu", n_envs=2),
        lambda: JaxReplayBuffer(12, PIX, ACT, device="cpu", n_envs=2, compress=dict(frame_stack=4, codec="zstd:1", max_pending=3)),
    ],
    ids=["plain", "dict", "compressed"],
)
def test_replay_survives_sb3_save_and_load(make, tmp_path):
    buf = make()
    rng = np.random.default_rng(0)
    _add_replay(buf, rng, 9)  # the compressed one holds staged steps: they go into the checkpoint
    blob = pickle.dumps(buf)
    assert b"jaxlib" not in blob and b"host_codecs" not in blob and b"jaxbuffers.replay" not in blob
    save_to_pkl(tmp_path / "rb.pkl", buf)
    got = load_from_pkl(tmp_path / "rb.pkl")
    assert (got.pos, got.full) == (buf.pos, buf.full)
    for step in range(2):
        np.random.seed(step)
        want = buf.sample(5)
        np.random.seed(step)
        _same(want, got.sample(5))
        r1, r2 = np.random.default_rng(step), np.random.default_rng(step)
        _add_replay(buf, r1, 4)
        _add_replay(got, r2, 4)


def test_rollout_survives_pickling():
    obs_space = spaces.Box(-1, 1, (3,), np.float32)
    buf = JaxRolloutBuffer(4, obs_space, ACT, device="cpu", n_envs=2)
    rng = np.random.default_rng(0)
    for t in range(3):
        buf.add(random_obs(obs_space, 2, rng), rng.integers(0, 3, 2), rng.normal(size=2), np.array([t == 0, False]),
                th.tensor(rng.normal(size=2)), th.tensor(rng.normal(size=2)))
    got = pickle.loads(pickle.dumps(buf))
    assert got.pos == 3
    for b in (buf, got):
        b.add(np.ones((2, 3), np.float32), np.array([1, 2]), np.ones(2), np.zeros(2), th.ones(2), th.zeros(2))
        b.compute_returns_and_advantage(th.ones(2), np.array([0, 1]))
    np.testing.assert_array_equal(buf.advantages, got.advantages)
    np.random.seed(3)
    want = list(buf.get(4))
    np.random.seed(3)
    for a, b in zip(want, got.get(4)):
        _same(a, b)


def test_tampered_state_is_refused():
    from jaxbuffers import CheckpointError

    buf = JaxReplayBuffer(4, PIX, ACT, device="cpu")
    state = buf.__getstate__()
    state["_checkpoint"] = b"not a tar archive"
    with pytest.raises(CheckpointError, match="archive"):
        JaxReplayBuffer.__new__(JaxReplayBuffer).__setstate__(state)
