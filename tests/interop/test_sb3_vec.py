"""DummyVecRolloutBuffer: one rollout buffer object over buffers of different sizes and types."""

from __future__ import annotations

import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.buffers import RolloutBuffer  # noqa: E402

from jaxbuffers.interop.sb3 import CompressedRolloutBuffer, DummyVecRolloutBuffer, JaxRolloutBuffer  # noqa: E402

OBS, ACT, N = spaces.Box(0, 255, (2, 4, 4), np.uint8), spaces.Discrete(3), 2


def _buffers():
    return [RolloutBuffer(3, OBS, ACT, "cpu", n_envs=N), JaxRolloutBuffer(4, OBS, ACT, "cpu", n_envs=N),
            CompressedRolloutBuffer(5, OBS, ACT, "cpu", n_envs=N, compression_method="zstd-1")]


def _step(rng):
    return (rng.integers(0, 4, (N, *OBS.shape)).astype(np.uint8), rng.integers(0, 3, (N, 1)), rng.normal(size=N).astype(np.float32),
            np.zeros(N, np.float32), th.from_numpy(rng.normal(size=(N, 1)).astype(np.float32)), th.from_numpy(rng.normal(size=N).astype(np.float32)))


@pytest.mark.parametrize("use_threads", [False, True])
def test_delegates_to_every_buffer_and_is_full_when_all_are(use_threads):
    bufs = _buffers()
    vec = DummyVecRolloutBuffer(5, OBS, ACT, "cpu", n_envs=N, use_threads=use_threads, buffers=bufs)
    assert isinstance(vec, RolloutBuffer) and vec.buffers == tuple(bufs) and not vec.full
    rng, fulls = np.random.default_rng(0), []
    for t in range(5):
        step = _step(rng)
        vec.call("add", *step) if t < 3 else [b.add(*step) for b in bufs[1 + (t == 4):]]
        fulls.append(vec.full)
    assert fulls == [False, False, False, False, True]
    assert vec.pos == 0 and [b.pos for b in bufs] == [3, 4, 5]
    assert vec.size() == vec.call("size") == [3, 4, 5]
    last = th.zeros(N, 1)
    vec.compute_returns_and_advantage(last, np.zeros(N))
    np.testing.assert_allclose(vec.advantages[0], bufs[0].advantages)  # an attribute read from every buffer
    np.random.seed(1)
    batches = [list(g) for g in vec.get(4)]
    assert [len(b) for b in batches] == [2, 2, 3]  # 6, 8 and 10 steps in minibatches of 4
    vec.reset()
    assert not vec.full and [b.pos for b in bufs] == [0, 0, 0]
    vec.close()


def test_errors_name_the_buffer():
    with pytest.raises(TypeError, match=r"buffers\[1\]"):
        DummyVecRolloutBuffer(4, OBS, ACT, buffers=[_buffers()[0], object()])
    with pytest.raises(TypeError, match="use_threads"):
        DummyVecRolloutBuffer(4, OBS, ACT, use_threads=1)
    with pytest.raises(ValueError, match="gae"):
        DummyVecRolloutBuffer(4, OBS, ACT, gae=0.9)
    bufs = _buffers()
    vec = DummyVecRolloutBuffer(4, OBS, ACT, "cpu", n_envs=N, buffers=bufs, use_threads=True)
    rng = np.random.default_rng(0)
    for _ in range(3):
        vec.add(*_step(rng))
    with pytest.raises(IndexError) as e:  # SB3's buffer of 3 steps is full: numpy's IndexError
        vec.add(*_step(rng))
    assert "in buffers[0] (RolloutBuffer.add)" in e.value.__notes__[0]
    with pytest.raises(AttributeError, match=r"buffers \[0\]"):
        vec.jax_buffer  # noqa: B018  SB3's buffer has none
