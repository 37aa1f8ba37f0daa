"""Bad input to `jaxbuffers.datasets.from_minari` / `to_minari` (objects that are not datasets, buffers or spaces,
wrong sizes, flags and ids): refused with an error naming the argument, before the dataset is read or anything is
written (no dataset folder appears); the accepted forms give exactly the documented result."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

minari = pytest.importorskip("minari")
gym = pytest.importorskip("gymnasium")
pytest.importorskip("h5py")

import jax.numpy as jnp  # noqa: E402

import jaxbuffers as jb  # noqa: E402
from bad_inputs import SETTINGS, bad_static_ints, refused, snapshot  # noqa: E402
from jaxbuffers.datasets import from_minari, to_minari  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Minari asks for metadata a test dataset does not need
FEW = settings(SETTINGS, max_examples=10)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Minari datasets folder holding one recorded CartPole dataset of 3 short episodes; `MINARI_DATASETS_PATH`
    points there for the module."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("minari")
    mp.setenv("MINARI_DATASETS_PATH", str(path))
    env = minari.DataCollector(gym.make("CartPole-v1", max_episode_steps=6))
    env.action_space.seed(0)
    for i in range(3):
        env.reset(seed=i)
        while not any(env.step(env.action_space.sample())[2:4]):
            pass
    dataset = env.create_dataset("test/cartpole/bad-v0", algorithm_name="random")
    yield path, dataset
    mp.undo()


@pytest.fixture(scope="module")
def filled(folder):
    return from_minari(folder[1], cast_64bit=True)


def tree(path) -> list:
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*"))


@FEW
@given(dataset=st.sampled_from([None, 1, "test/cartpole/bad-v0", [1], {"episodes": []}]),
       into=st.sampled_from([None, 1, "episode", "Trajectory", ["episodes"]]), size=bad_static_ints().filter(lambda v: v is not None),
       flag=st.sampled_from([1, 0, "True", None, np.array([True])]))
@example(dataset=None, into="x", size=0, flag="no")  # dataset=None was AttributeError; sizes were checked after the read
def test_from_minari_bad_arguments(folder, dataset, into, size, flag):
    path, ds = folder
    state = lambda: tree(path)  # noqa: E731
    refused(lambda: from_minari(dataset), "dataset", state=state)
    refused(lambda: from_minari(ds, into=into), "into", state=state)
    refused(lambda: from_minari(ds, max_episodes=size), "max_episodes", state=state)
    refused(lambda: from_minari(ds, max_timesteps=size), "max_timesteps", state=state)
    refused(lambda: from_minari(ds, circular=flag), "circular", state=state)
    refused(lambda: from_minari(ds, cast_64bit=flag), "cast_64bit", state=state)
    refused(lambda: from_minari(ds, into="trajectory", max_episodes=2), "max_episodes", state=state)  # a size of episodes only


@FEW
@given(buffer=st.sampled_from([None, 1, "buf", "replay", "empty"]), dataset_id=st.sampled_from([None, 1, b"x-v0", ["a-v0"]]),
       space=st.sampled_from([None, 2, "Discrete(2)", (4,), np.zeros(4)]), jpeg=st.sampled_from([1, "yes", None]))
@example(buffer=None, dataset_id=None, space=None, jpeg="yes")  # the id, spaces and jpeg_encoding were checked after the work
def test_to_minari_bad_arguments(folder, filled, buffer, dataset_id, space, jpeg):
    path, ds = folder
    buf = filled
    before = snapshot(buf)
    obs, act = ds.observation_space, ds.action_space
    state = lambda: tree(path)  # noqa: E731
    bad = {"replay": jb.ReplayBuffer.create({"x": jnp.zeros(2)}, 4), "empty": jb.EpisodeBuffer.create(
        {"obs": jnp.zeros(4), "action": jnp.int32(0), "reward": jnp.float32(0)}, max_episodes=2, max_timesteps=3)}.get(buffer, buffer)
    refused(lambda: to_minari(bad, "test/cartpole/out-v0", observation_space=obs, action_space=act), "buffer", state=state)
    refused(lambda: to_minari(buf, dataset_id, observation_space=obs, action_space=act), "dataset_id", state=state)
    refused(lambda: to_minari(buf, "test/cartpole/out-v0", observation_space=space, action_space=act), "observation_space", state=state)
    refused(lambda: to_minari(buf, "test/cartpole/out-v0", observation_space=obs, action_space=space), "action_space", state=state)
    refused(lambda: to_minari(buf, "test/cartpole/out-v0", observation_space=obs, action_space=act, jpeg_encoding=jpeg),
            "jpeg_encoding", state=state)
    assert snapshot(buf) == before


def test_accepted_sizes_give_the_documented_buffer(folder):
    """The table: `max_timesteps` a Python or numpy int (episodes longer than it stored in parts), `max_episodes`
    left out (every part kept) or given; numpy ints give exactly the Python ints' buffer."""
    _, ds = folder
    lengths = [len(e) for e in ds.iterate_episodes()]
    want = from_minari(ds, max_timesteps=2, cast_64bit=True)
    assert int(want.num_episodes()) == sum(-(-n // 2) for n in lengths)
    got = from_minari(ds, max_timesteps=np.int64(2), max_episodes=np.int32(sum(-(-n // 2) for n in lengths)), cast_64bit=np.bool_(True))
    assert snapshot(got) == snapshot(want)
