"""Tests of jaxbuffers.mixing: exact batch composition from several buffers, inside jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuffers.episode import EpisodeBuffer
from jaxbuffers.mixing import mixed_counts, sample_mixed
from jaxbuffers.replay import ReplayBuffer

EXAMPLE = {"obs": jnp.zeros((2,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}


def test_mixed_counts_largest_remainder():
    assert mixed_counts(256, (0.5, 0.5)) == (128, 128)
    assert mixed_counts(10, (1, 2)) == (3, 7)  # 3.33, 6.67: the larger remainder gets the extra row
    assert mixed_counts(3, (1, 1, 1, 1)) == (1, 1, 1, 0)  # ties: the earlier source
    assert mixed_counts(7, (0, 3)) == (0, 7)
    assert mixed_counts(5, (0.2, 0.2, 0.6)) == (1, 1, 3)
    for b in range(1, 40):
        for p in [(0.1, 0.9), (1, 1, 1), (0.25, 0.25, 0.5), (3, 0, 1)]:
            c = mixed_counts(b, p)
            assert sum(c) == b
            assert all(abs(ci - b * pi / sum(p)) < 1 for ci, pi in zip(c, p))
    with pytest.raises(ValueError, match="proportions: expected finite non-negative numbers with a positive sum"):
        mixed_counts(4, (0, 0))
    with pytest.raises(ValueError, match=r"proportions\[1\]: expected a float in"):
        mixed_counts(4, (1, -1))
    with pytest.raises(TypeError, match=r"proportions\[0\]"):
        mixed_counts(4, ("a", 1))
    with pytest.raises(ValueError, match="batch_size"):
        mixed_counts(0, (1,))


def test_mixed_counts_takes_a_numpy_array_of_proportions():
    for p in (np.array([0.2, 0.2, 0.6]), np.array([0.2, 0.2, 0.6], np.float32), np.array([1, 1, 3])):
        assert mixed_counts(5, p) == mixed_counts(5, p.tolist())
    assert mixed_counts(10, np.array([1.0, 2.0])) == (3, 7)
    with pytest.raises(ValueError, match=r"proportions\[1\]: expected a float in"):
        mixed_counts(4, np.array([1.0, -1.0]))
    with pytest.raises(TypeError, match=r"proportions: expected a sequence \(or a 1-d numpy array\) .* shape \(1, 2\)"):
        mixed_counts(4, np.ones((1, 2)))


def filled_buffers():
    """An offline EpisodeBuffer whose steps have action 1xx and an online ReplayBuffer with action 2xx."""
    off = EpisodeBuffer.create(EXAMPLE, max_episodes=4, max_timesteps=5)
    for i in range(3):
        steps = {"obs": np.zeros((5, 2), np.float32), "action": np.arange(100 + 5 * i, 105 + 5 * i, dtype=np.int32),
                 "reward": np.ones(5, np.float32)}
        off = off.add_episode(steps, 5, terminated=True, final_obs=np.zeros(2, np.float32))
    on = ReplayBuffer.create(EXAMPLE, capacity=32)
    on = on.add({"obs": np.ones((20, 2), np.float32), "action": np.arange(200, 220, dtype=np.int32),
                 "reward": np.zeros(20, np.float32)})
    return off, on


@pytest.mark.parametrize("shuffle", [False, True])
def test_exact_composition_inside_jit(shuffle):
    off, on = filled_buffers()

    @jax.jit
    def draw(off, on, key):
        sources = [lambda k, n: off.sample_timesteps(k, n).item, lambda k, n: on.sample(k, n).item]
        return sample_mixed(key, sources, 50, (0.3, 0.7), shuffle=shuffle)

    seen_positions = set()
    for s in range(5):
        out = draw(off, on, jax.random.key(s))
        action, source = np.asarray(out.item["action"]), np.asarray(out.source)
        assert out.item["obs"].shape == (50, 2)
        assert (source == 0).sum() == 15 and (source == 1).sum() == 35
        np.testing.assert_array_equal(action // 100, source + 1)  # every row from the source it names
        np.testing.assert_array_equal(np.asarray(out.item["obs"][:, 0]), source.astype(np.float32))
        seen_positions.add(tuple(np.flatnonzero(source == 0)[:3]))
    assert (len(seen_positions) > 1) == shuffle  # shuffled rows move, unshuffled stay in source order


def test_sources_differ_and_zero_counts():
    off, on = filled_buffers()
    calls = []

    def never(k, n):
        calls.append(n)
        return on.sample(k, n).item

    out = sample_mixed(jax.random.key(0), [lambda k, n: off.sample_timesteps(k, n).item, never], 8, (1, 0))
    assert calls == [] and np.all(np.asarray(out.source) == 0)
    with pytest.raises(TypeError, match=r"samplers\[1\]\(key, 4\): tree structure differs"):
        sample_mixed(jax.random.key(0), [lambda k, n: off.sample_timesteps(k, n).item, lambda k, n: on.sample(k, n)], 8, (1, 1))
    with pytest.raises(TypeError, match=r"samplers\[1\]\(key, 4\)\['action'\]: expected dtype int32, got float32"):
        sample_mixed(jax.random.key(0), [lambda k, n: off.sample_timesteps(k, n).item,
                                         lambda k, n: {**on.sample(k, n).item, "action": jnp.zeros(n)}], 8, (1, 1))
    with pytest.raises(ValueError, match=r"samplers\[1\]\(key, 4\): expected 4 rows"):
        sample_mixed(jax.random.key(0), [lambda k, n: off.sample_timesteps(k, n).item, lambda k, n: on.sample(k, n + 1).item], 8, (1, 1))
    with pytest.raises(ValueError, match="proportions: expected one per sampler"):
        sample_mixed(jax.random.key(0), [never], 8, (1, 1))
    with pytest.raises(TypeError, match=r"samplers\[0\]: expected a function"):
        sample_mixed(jax.random.key(0), [on], 8, (1,))
