"""JaxReplayBuffer(compress=...) on real Atari frames (SB3's AtariWrapper + VecFrameStack) against SB3's buffer."""

from __future__ import annotations

import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")
ale_py = pytest.importorskip("ale_py")

import gymnasium as gym  # noqa: E402

from stable_baselines3.common.buffers import ReplayBuffer  # noqa: E402
from stable_baselines3.common.env_util import make_atari_env  # noqa: E402
from stable_baselines3.common.vec_env import VecFrameStack  # noqa: E402

from jaxbuffers.interop.sb3 import JaxReplayBuffer, sb3_replay_nbytes  # noqa: E402

gym.register_envs(ale_py)


def _collect(bufs, n_envs, steps, seed):
    """SB3's off-policy storing loop (terminal observation put into next_obs), random actions."""
    env = VecFrameStack(make_atari_env("BreakoutNoFrameskip-v4", n_envs=n_envs, seed=seed), n_stack=4)
    rng = np.random.default_rng(seed)
    obs = env.reset()
    n_done = 0
    for _ in range(steps):
        action = rng.integers(0, env.action_space.n, n_envs)
        new_obs, reward, done, infos = env.step(action)
        nxt = new_obs.copy()
        for i, d in enumerate(done):
            if d and infos[i].get("terminal_observation") is not None:
                nxt[i] = infos[i]["terminal_observation"]
        for b in bufs:
            b.add(obs, nxt, action, reward, done, infos)
        n_done += int(done.sum())
        obs = new_obs
    space, act = env.observation_space, env.action_space
    env.close()
    return space, act, n_done


@pytest.mark.parametrize("compress", [dict(frame_stack=4, stack_axis=-1), dict(codec="igzip:1")], ids=["dedup-zstd", "whole-igzip"])
def test_compressed_samples_equal_sb3_on_breakout(compress):
    n_envs, size, steps = 2, 300, 260  # 150 rows per env: the ring wraps
    env = VecFrameStack(make_atari_env("BreakoutNoFrameskip-v4", n_envs=n_envs, seed=0), n_stack=4)
    space, act = env.observation_space, env.action_space
    env.close()
    sb3 = ReplayBuffer(size, space, act, device="cpu", n_envs=n_envs)
    jb = JaxReplayBuffer(size, space, act, device="cpu", n_envs=n_envs, compress=compress)
    _, _, n_done = _collect([sb3, jb], n_envs, steps, seed=0)
    assert n_done >= 2, "need episode ends (life losses) in the window"
    assert (jb.pos, jb.full) == (sb3.pos, sb3.full) and sb3.full
    rows = np.repeat(np.arange(sb3.buffer_size), n_envs)
    envs = np.tile(np.arange(n_envs), sb3.buffer_size)
    ours = jb.samples_at(rows, envs)
    state = np.random.get_state()
    orig = np.random.randint
    np.random.randint = lambda *a, **k: envs
    try:
        theirs = sb3._get_samples(rows)
    finally:
        np.random.randint = orig
        np.random.set_state(state)
    for name in theirs._fields:
        a, b = getattr(theirs, name), getattr(ours, name)
        if a is None:
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, name
        bad = (a != b).reshape(a.shape[0], -1).any(1).nonzero().flatten().tolist()
        assert not bad, f"{name}: {len(bad)} of {a.shape[0]} differ, e.g. rows/envs {[(rows[i], envs[i]) for i in bad[:5]]}"
    # far smaller than SB3's buffer
    assert jb.nbytes * 5 < sb3_replay_nbytes(size, space, act, n_envs=n_envs)
