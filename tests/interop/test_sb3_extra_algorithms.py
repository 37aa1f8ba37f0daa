"""SB3's PPO, A2C, DQN, SAC and TD3 train on the compressed SB3 classes as on SB3's own buffers (tiny runs)."""

from __future__ import annotations

import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

from stable_baselines3 import A2C, DQN, PPO, SAC, TD3  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer, RolloutBuffer  # noqa: E402

from jaxbuffers.interop.sb3 import CompressedReplayBuffer, CompressedRolloutBuffer  # noqa: E402


def _weights_agree(ours, theirs, init):
    """Same samples in the same order: the weights match up to float rounding, far below how far training moved them."""
    a, b, c = ours.policy.state_dict(), theirs.policy.state_dict(), init.policy.state_dict()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    moved = max(float((a[k] - c[k]).abs().max()) for k in a)
    assert moved > 0 and worst < 1e-3 * moved, (worst, moved)


@pytest.mark.parametrize("algo, kwargs", [
    (PPO, dict(n_steps=64, batch_size=32, n_epochs=2)), pytest.param(A2C, dict(n_steps=16), marks=pytest.mark.slow),
], ids=["PPO", "A2C"])
def test_on_policy_algorithms_train_as_with_sb3_buffer(algo, kwargs):
    th.set_num_threads(1)

    def make(cls, steps):
        kw = {} if cls is None else dict(rollout_buffer_class=cls, rollout_buffer_kwargs=dict(compression_method="zstd-1"))
        model = algo("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[16]), device="cpu", seed=0, **kwargs, **kw)
        return model.learn(steps) if steps else model

    ours, theirs = make(CompressedRolloutBuffer, 256), make(None, 256)
    assert isinstance(ours.rollout_buffer, CompressedRolloutBuffer) and type(theirs.rollout_buffer) is RolloutBuffer
    _weights_agree(ours, theirs, make(None, 0))


@pytest.mark.parametrize("algo, env", [
    (DQN, "CartPole-v1"), (SAC, "Pendulum-v1"), pytest.param(TD3, "Pendulum-v1", marks=pytest.mark.slow),
], ids=["DQN", "SAC", "TD3"])
def test_off_policy_algorithms_train_as_with_sb3_buffer_and_save_the_buffer(algo, env, tmp_path):
    th.set_num_threads(1)

    def make(cls, steps):
        kw = {} if cls is None else dict(replay_buffer_class=cls, replay_buffer_kwargs=dict(compression_method="rle"))
        model = algo("MlpPolicy", env, buffer_size=250, learning_starts=100, train_freq=4, gradient_steps=1,
                     policy_kwargs=dict(net_arch=[16]), device="cpu", seed=0, **kw)
        return model.learn(steps) if steps else model

    ours, theirs = make(CompressedReplayBuffer, 300), make(None, 300)  # 300 steps > 250: the ring wraps
    assert isinstance(ours.replay_buffer, CompressedReplayBuffer) and type(theirs.replay_buffer) is ReplayBuffer
    _weights_agree(ours, theirs, make(None, 0))
    ours.save_replay_buffer(tmp_path / "buf.pkl")
    back = make(CompressedReplayBuffer, 0)
    back.load_replay_buffer(tmp_path / "buf.pkl")
    assert isinstance(back.replay_buffer, CompressedReplayBuffer) and back.replay_buffer.pos == ours.replay_buffer.pos
    for buf in (ours.replay_buffer, back.replay_buffer, theirs.replay_buffer):
        np.random.seed(3)
        got = buf.sample(32)
        if buf is ours.replay_buffer:
            want = got
        for f in want._fields:
            th.testing.assert_close(getattr(got, f), getattr(want, f), msg=f)
