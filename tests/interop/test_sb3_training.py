"""SB3 algorithms train with the jaxbuffers classes (short CartPole runs, CI-sized)."""

from __future__ import annotations

import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

from stable_baselines3 import DQN, PPO  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer, RolloutBuffer  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402

from jaxbuffers.interop.sb3 import JaxReplayBuffer, JaxRolloutBuffer  # noqa: E402


def _dqn(cls, steps):
    model = DQN(
        "MlpPolicy", "CartPole-v1", replay_buffer_class=cls, buffer_size=1_500, learning_starts=300,
        train_freq=4, target_update_interval=250, exploration_fraction=0.3, learning_rate=1e-3,
        policy_kwargs=dict(net_arch=[64, 64]), device="cpu", seed=0,
    )
    model.learn(steps)
    return model


def test_dqn_cartpole_with_jax_replay_buffer_equals_sb3():
    """Same seed: our sample() draws SB3's indices and returns SB3's batch, so the trained
    Q-network is the one SB3's own buffer gives (the buffer wraps around: 2,000 steps > 1,500)."""
    th.set_num_threads(1)
    ours = _dqn(JaxReplayBuffer, 2_000)
    assert isinstance(ours.replay_buffer, JaxReplayBuffer) and isinstance(ours.replay_buffer, ReplayBuffer)
    assert ours.replay_buffer.full and ours._n_updates >= 400
    theirs = _dqn(None, 2_000)
    assert type(theirs.replay_buffer) is ReplayBuffer
    a, b = ours.policy.state_dict(), theirs.policy.state_dict()
    for k in a:
        th.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    mean, _ = evaluate_policy(ours, ours.get_env(), n_eval_episodes=3)
    assert np.isfinite(mean)


def _ppo(cls, steps):
    model = PPO(
        "MlpPolicy", "CartPole-v1", rollout_buffer_class=cls, n_steps=256, batch_size=64, n_epochs=4,
        learning_rate=1e-3, device="cpu", seed=0,
    )
    model.learn(steps)
    return model


def test_ppo_cartpole_with_jax_rollout_buffer_tracks_sb3():
    """Same seed: SB3's buffer and ours give the same minibatches and (to float rounding) the same
    advantages, so the trained weights agree closely; a wrong sign or mask would not."""
    th.set_num_threads(1)
    ours = _ppo(JaxRolloutBuffer, 1_024)
    assert isinstance(ours.rollout_buffer, JaxRolloutBuffer) and isinstance(ours.rollout_buffer, RolloutBuffer)
    theirs = _ppo(None, 1_024)
    assert type(theirs.rollout_buffer) is RolloutBuffer
    a, b = ours.policy.state_dict(), theirs.policy.state_dict()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    moved = max(float((a[k] - _ppo_init()[k]).abs().max()) for k in a)
    assert worst < 1e-3 * moved, (worst, moved)


def _ppo_init():
    return PPO("MlpPolicy", "CartPole-v1", n_steps=256, device="cpu", seed=0).policy.state_dict()
