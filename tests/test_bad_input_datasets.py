"""Bad input to `jaxbuffers.datasets.from_minari` / `to_minari` (objects that are not datasets, buffers or spaces,
wrong sizes, flags and ids): refused with an error naming the argument, before the dataset is read or anything is
written (no dataset folder appears); the accepted forms give exactly the documented result."""

from __future__ import annotations

import re

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


def test_to_minari_refuses_values_outside_the_spaces_bounds_naming_the_field_and_step(folder):
    """Actions and observations are checked against the bounds their space defines before anything is written (a
    Discrete(3) space took action 4 silently)."""
    from gymnasium import spaces

    path, _ = folder
    step = {"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = jb.EpisodeBuffer.create(step, max_episodes=2, max_timesteps=4)
    for actions in ([0, 1, 2, 0], [2, 1, 0, 4]):
        buf = buf.add_episode({"obs": jnp.full((4, 2), 0.5), "action": jnp.asarray(actions, jnp.int32), "reward": jnp.zeros(4)},
                              4, terminated=True, final_obs=jnp.full(2, 2.0))
    box, wide = spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.Box(-1.0, 3.0, (2,), np.float32)
    state = lambda: tree(path)  # noqa: E731
    cases = [  # (observation space, action space, the error's start)
        (wide, spaces.Discrete(3), r"episode 1: action: step 3 holds 4, outside Discrete\(3\)"),
        (wide, spaces.Discrete(4, start=1), r"episode 0: action: step 0 holds 0, outside Discrete\(4, start=1\)"),
        (wide, spaces.Box(0, 3, (), np.int32), r"episode 1: action: step 3 holds 4, outside Box\(0, 3, \(\), int32\)"),
        (box, spaces.Discrete(5), r"episode 0: obs: its final observation holds \[2.0, 2.0\], outside Box\(-1.0, 1.0, \(2,\), float32\)"),
    ]
    for obs, act, message in cases:
        err = refused(lambda: to_minari(buf, "test/bounds/out-v0", observation_space=obs, action_space=act), "action" if "action" in message else "obs",
                      state=state, exc=(ValueError,))
        assert re.match(message, str(err)), str(err)
    written = to_minari(buf, "test/bounds/in-v0", observation_space=wide, action_space=spaces.Discrete(5))
    assert written.total_episodes == 2


def test_accepted_sizes_give_the_documented_buffer(folder):
    """The table: `max_timesteps` a Python or numpy int (episodes longer than it stored in parts), `max_episodes`
    left out (every part kept) or given; numpy ints give exactly the Python ints' buffer."""
    _, ds = folder
    lengths = [len(e) for e in ds.iterate_episodes()]
    want = from_minari(ds, max_timesteps=2, cast_64bit=True)
    assert int(want.num_episodes()) == sum(-(-n // 2) for n in lengths)
    got = from_minari(ds, max_timesteps=np.int64(2), max_episodes=np.int32(sum(-(-n // 2) for n in lengths)), cast_64bit=np.bool_(True))
    assert snapshot(got) == snapshot(want)
