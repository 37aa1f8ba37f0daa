"""Tests of jaxbuffers.datasets: an exact Minari round trip on a local dataset recorded with Minari's DataCollector."""

from __future__ import annotations

import numpy as np
import pytest

minari = pytest.importorskip("minari")
gym = pytest.importorskip("gymnasium")
pytest.importorskip("h5py")

from jaxbuffers.datasets import from_minari, to_minari  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Minari asks for metadata a test dataset does not need


class CountInfo(gym.Wrapper):
    """Adds `info["count"]` (int64 steps since reset) and `info["extra"]["half"]` (float64)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.count = 0
        return obs, {**info, "count": np.int64(0), "extra": {"half": np.float64(0.0)}}

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        self.count += 1
        return obs, r, term, trunc, {**info, "count": np.int64(self.count), "extra": {"half": np.float64(self.count / 2)}}


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    env = minari.DataCollector(CountInfo(gym.make("CartPole-v1", max_episode_steps=15)), record_infos=True)
    env.action_space.seed(0)
    for i in range(6):
        env.reset(seed=i)
        while True:
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            if term or trunc:
                break
    return env.create_dataset("test/cartpole/recorded-v0", algorithm_name="random")


def test_round_trip_is_exact(recorded):
    original = list(recorded.iterate_episodes())
    assert any(e.truncations[-1] for e in original)  # the time limit cut some episodes
    buf = from_minari(recorded, cast_64bit=True)
    assert int(buf.num_episodes()) == len(original)
    assert int(buf.size()) == sum(len(e) for e in original)
    assert buf.step_spec["action"].dtype == np.int32 and buf.step_spec["reward"].dtype == np.float32
    out = to_minari(buf, "test/cartpole/roundtrip-v0", observation_space=recorded.observation_space,
                    action_space=recorded.action_space)
    back = list(minari.load_dataset("test/cartpole/roundtrip-v0").iterate_episodes())
    assert out.total_episodes == len(original) == len(back)
    for a, b in zip(original, back):
        for field in ("observations", "actions", "rewards", "terminations", "truncations"):
            x, y = np.asarray(getattr(a, field)), np.asarray(getattr(b, field))
            assert x.dtype == y.dtype and np.array_equal(x, y), field
        assert np.array_equal(a.infos["count"], b.infos["count"]) and a.infos["count"].dtype == b.infos["count"].dtype
        assert np.array_equal(a.infos["extra"]["half"], b.infos["extra"]["half"])


def test_buffer_reads_like_the_dataset(recorded):
    original = list(recorded.iterate_episodes())
    buf = from_minari(recorded, max_timesteps=4, cast_64bit=True)  # long episodes are stored in parts
    everything = buf.get_all()
    assert int(buf.num_episodes()) == sum(-(-len(e) // 4) for e in original)
    first, n = original[0], len(original[0])
    k = -(-n // 4)
    obs = np.concatenate([np.asarray(everything.item["obs"][j][: int(everything.lengths[j])]) for j in range(k)])
    np.testing.assert_array_equal(obs, first.observations[:n])
    np.testing.assert_array_equal(np.asarray(everything.final_obs[k - 1]), first.observations[n])
    assert bool(everything.terminated[k - 1]) == bool(first.terminations[-1])
    assert int(everything.meta["final_info/count"][k - 1]) == n


def test_into_a_trajectory_buffer(recorded):
    original = list(recorded.iterate_episodes())
    buf = from_minari(recorded, into="trajectory", cast_64bit=True)
    total = sum(len(e) for e in original)
    assert buf.num_envs == 1 and buf.length == total and int(buf.size()) == total
    np.testing.assert_array_equal(np.asarray(buf.storage["obs"][0]), np.concatenate([e.observations[:-1] for e in original]))
    np.testing.assert_array_equal(np.asarray(buf.storage["infos"]["count"][0]), np.concatenate([e.infos["count"][:-1] for e in original]))
    ends = np.cumsum([len(e) for e in original]) - 1
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(buf.terminated[0] | buf.truncated[0])), ends)
    np.testing.assert_array_equal(np.asarray(buf.terminated[0])[ends], [bool(e.terminations[-1]) for e in original])
    # an n-step transition from each episode's last step bootstraps from that episode's true final observation
    tr = buf.transitions_at(ends.astype(np.int32), n_step=2, gamma=0.5)
    np.testing.assert_array_equal(np.asarray(tr.num_steps), 1)
    np.testing.assert_array_equal(np.asarray(tr.next_obs)[[bool(e.truncations[-1]) for e in original]],
                                  [e.observations[-1] for e in original if e.truncations[-1]])
    with pytest.raises(ValueError, match="into: expected one of"):
        from_minari(recorded, into="lanes", cast_64bit=True)


def test_refusals(recorded):
    import jax.numpy as jnp

    from jaxbuffers.episode import EpisodeBuffer

    with pytest.raises(TypeError, match="buffer: expected an EpisodeBuffer"):
        to_minari(object(), "test/x-v0", observation_space=recorded.observation_space, action_space=recorded.action_space)
    empty = EpisodeBuffer.create({"obs": jnp.zeros(4), "action": jnp.int32(0), "reward": jnp.float32(0)}, max_episodes=2, max_timesteps=3)
    with pytest.raises(ValueError, match="buffer: expected at least one episode"):
        to_minari(empty, "test/x-v0", observation_space=recorded.observation_space, action_space=recorded.action_space)


def test_64bit_fields_are_refused_unless_the_cast_is_asked_for(recorded):
    import jax

    assert not jax.config.jax_enable_x64
    assert recorded[0].rewards.dtype == np.float64 and recorded[0].actions.dtype == np.int64
    for into in ("episodes", "trajectory"):
        with pytest.raises(TypeError, match=r"dataset episode 0: actions: dtype int64.*cast_64bit=True.*jax_enable_x64"):
            from_minari(recorded, into=into)
    with pytest.raises(TypeError, match="cast_64bit: expected a Python bool"):
        from_minari(recorded, cast_64bit=1)
    buf = from_minari(recorded, cast_64bit=True)
    first = recorded[0]
    np.testing.assert_array_equal(np.asarray(buf.get_all().item["reward"][0][: len(first)]), first.rewards.astype(np.float32))


def test_64bit_fields_are_kept_with_x64(recorded):
    import jax

    with jax.enable_x64(True):
        buf = from_minari(recorded)
        assert buf.step_spec["reward"].dtype == np.float64 and buf.step_spec["action"].dtype == np.int64
        assert buf.step_spec["infos"]["count"].dtype == np.int64
        first = recorded[0]
        np.testing.assert_array_equal(np.asarray(buf.get_all().item["reward"][0][: len(first)]), first.rewards)


def test_integers_that_int32_cannot_hold_are_refused_naming_the_field():
    from jaxbuffers.datasets import _narrow

    with pytest.raises(ValueError, match=r"infos\['count'\]: values in"):
        _narrow("infos['count']", np.array([0, 2**40]), True)
    assert _narrow("rewards", np.array([0.1]), True).dtype == np.float32


def test_to_minari_refuses_values_the_space_dtype_cannot_hold_naming_the_field(tmp_path, monkeypatch):
    import jax.numpy as jnp

    import jaxbuffers as jb

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    spaces = gym.spaces
    buf = jb.EpisodeBuffer.create({"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0)}, max_episodes=1, max_timesteps=2)

    def one(obs, action=(0, 1)):
        return buf.add_episode({"obs": np.asarray(obs, np.float32), "action": np.asarray(action, np.int32),
                                "reward": np.zeros(2, np.float32)}, 2, terminated=True, final_obs=np.ones(2, np.float32))

    box = spaces.Box(0, 255, (2,), np.uint8)
    with pytest.raises(ValueError, match=r"^episode 0: obs: dtype float32 with values \[300.5, -1.0\] .* uint8 cannot hold exactly"):
        to_minari(one([[300.5, -1.0], [2.0, 3.0]]), "test/cast-v0", observation_space=box, action_space=spaces.Discrete(2))
    with pytest.raises(ValueError, match=r"^episode 0: action: dtype int32 with values \[300\]"):
        to_minari(one([[1, 2], [3, 4]], (0, 300)), "test/cast-v0", observation_space=box,
                  action_space=spaces.Box(0, 255, (), np.uint8))
    assert not (tmp_path / "test").exists()  # nothing written
    ds = to_minari(one([[1, 2], [3, 255]]), "test/cast-v0", observation_space=box, action_space=spaces.Discrete(2))
    obs = next(ds.iterate_episodes()).observations  # values the dtype holds are converted, exactly
    assert obs.dtype == np.uint8 and obs.tolist() == [[1, 2], [3, 255], [1, 1]]
