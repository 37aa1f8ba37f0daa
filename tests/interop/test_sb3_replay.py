"""JaxReplayBuffer / JaxDictReplayBuffer against SB3's own ReplayBuffer / DictReplayBuffer."""

from __future__ import annotations

import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer  # noqa: E402

from jaxbuffers.interop.sb3 import FieldView, JaxDictReplayBuffer, JaxReplayBuffer, sb3_replay_nbytes  # noqa: E402

BOX = spaces.Box(-5, 5, (3,), np.float32)
PIX = spaces.Box(0, 255, (2, 4, 4), np.uint8)
DICT = spaces.Dict({"img": spaces.Box(0, 255, (2, 3), np.uint8), "vec": spaces.Box(-1, 1, (2,), np.float32), "k": spaces.Discrete(5)})
DISC_A = spaces.Discrete(4)
BOX_A = spaces.Box(-1, 1, (2,), np.float32)


def random_obs(space, n, rng):
    if isinstance(space, spaces.Dict):
        return {k: random_obs(s, n, rng) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Discrete):
        return rng.integers(0, space.n, size=(n,))
    if space.dtype == np.uint8:
        return rng.integers(0, 256, size=(n, *space.shape), dtype=np.uint8)
    return rng.uniform(-5, 5, size=(n, *space.shape)).astype(space.dtype)


def random_step(obs_space, act_space, n, rng, p_done=0.2, p_timeout=0.5):
    obs, nxt = random_obs(obs_space, n, rng), random_obs(obs_space, n, rng)
    if isinstance(act_space, spaces.Discrete):
        act = rng.integers(0, act_space.n, size=(n,))
    else:
        act = rng.uniform(-1, 1, size=(n, *act_space.shape)).astype(np.float32)
    rew = rng.normal(size=n)  # float64, as SB3 may pass it
    done = rng.random(n) < p_done
    infos = [{"TimeLimit.truncated": bool(d and rng.random() < p_timeout)} for d in done]
    return obs, nxt, act, rew, done, infos


def make_pair(obs_space, act_space, size, n_envs, omu=False, hto=True):
    cls_sb3, cls_jax = (DictReplayBuffer, JaxDictReplayBuffer) if isinstance(obs_space, spaces.Dict) else (ReplayBuffer, JaxReplayBuffer)
    kw = dict(device="cpu", n_envs=n_envs, optimize_memory_usage=omu, handle_timeout_termination=hto)
    return cls_sb3(size, obs_space, act_space, **kw), cls_jax(size, obs_space, act_space, **kw)


def assert_samples_equal(a, b):
    assert type(a) is type(b)
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        if x is None:
            assert y is None, name
            continue
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            pairs = [(f"{name}[{k}]", x[k], y[k]) for k in x]
        else:
            pairs = [(name, x, y)]
        for nm, u, v in pairs:
            assert u.dtype == v.dtype, (nm, u.dtype, v.dtype)
            assert u.shape == v.shape, (nm, u.shape, v.shape)
            assert u.device == v.device, nm
            assert th.equal(u, v), nm


CASES = [
    (BOX, DISC_A, False, True),
    (PIX, BOX_A, False, True),
    (PIX, DISC_A, True, False),
    (BOX, BOX_A, False, False),
    (DICT, DISC_A, False, True),
]


@pytest.mark.parametrize("obs_space, act_space, omu, hto", CASES, ids=["box-disc", "pix-box", "pix-omu", "box-nohto", "dict"])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_same_adds_same_samples(obs_space, act_space, omu, hto, data):
    n_envs = data.draw(st.sampled_from([1, 3]), "n_envs")
    # few distinct shapes: every new shape is a new XLA compilation
    size = data.draw(st.sampled_from([3, 7]), "rows") * n_envs + data.draw(st.sampled_from([0, n_envs - 1]), "remainder")
    n_adds = data.draw(st.integers(1, 25), "n_adds")
    seed = data.draw(st.integers(0, 2**31 - 1), "seed")
    rng = np.random.default_rng(seed)
    sb3, jb = make_pair(obs_space, act_space, size, n_envs, omu, hto)
    assert jb.buffer_size == sb3.buffer_size  # n_envs split, max(size // n_envs, 1)
    for _ in range(n_adds):
        step = random_step(obs_space, act_space, n_envs, rng)
        sb3.add(*step)
        jb.add(*step)
        assert (jb.pos, jb.full, jb.size()) == (sb3.pos, sb3.full, sb3.size())
    assert int(jb.jax_buffer.head) == jb.pos
    # Explicit indices, every valid row (and every env) at least once.
    rows = np.arange(sb3.size())
    if omu and sb3.full:
        rows = rows[rows != sb3.pos]
    rows = np.resize(np.concatenate([rows, rng.integers(0, sb3.buffer_size, 40)]), 40)  # fixed length
    np.random.seed(seed % 1000)
    a = sb3._get_samples(rows)
    np.random.seed(seed % 1000)
    b = jb._get_samples(rows)
    assert_samples_equal(a, b)
    b2 = jb.samples_at(rows, np.random.RandomState(seed % 1000).randint(0, n_envs, rows.shape[0]))
    assert_samples_equal(a, b2)
    # The public sample(): same numpy seed, same batch as SB3.
    np.random.seed(seed % 997)
    a = sb3.sample(16)
    np.random.seed(seed % 997)
    b = jb.sample(16)
    assert_samples_equal(a, b)
    # SB3's numpy fields through the views.
    fields = ["actions", "rewards", "dones", "timeouts"] + ([] if omu else ["next_observations"]) + ["observations"]
    for name in fields:
        x, y = getattr(sb3, name), getattr(jb, name)
        if isinstance(x, dict):
            for k in x:
                np.testing.assert_array_equal(np.asarray(y[k]), x[k], err_msg=f"{name}[{k}]")
        else:
            got = np.asarray(y)
            assert got.dtype == x.dtype, name
            np.testing.assert_array_equal(got, x, err_msg=name)


def test_timeouts_are_not_dones_in_samples():
    sb3, jb = make_pair(BOX, DISC_A, 4, 1)
    rng = np.random.default_rng(0)
    for done, trunc in [(True, True), (True, False), (False, False), (True, True)]:
        obs, nxt, act, rew, _, _ = random_step(BOX, DISC_A, 1, rng)
        for buf in (sb3, jb):
            buf.add(obs, nxt, act, rew, np.array([done]), [{"TimeLimit.truncated": trunc}])
    got = jb.samples_at(np.arange(4), np.zeros(4, int))
    assert got.dones[:, 0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert got.dones.shape == (4, 1) and got.rewards.shape == (4, 1)
    assert got.actions.dtype == th.int64  # gymnasium's Discrete dtype, stored as int32 inside


def test_terminal_observation_is_next_observation_in_dqn_loop():
    """SB3's off-policy loop puts infos['terminal_observation'] into next_obs before add()."""
    import gymnasium as gym
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=10**9, buffer_size=500, replay_buffer_class=JaxReplayBuffer, device="cpu", seed=0)
    model.learn(300)
    buf = model.replay_buffer
    assert isinstance(buf, ReplayBuffer) and isinstance(buf, JaxReplayBuffer)
    obs = np.asarray(buf.observations)[: buf.pos, 0]
    nxt = np.asarray(buf.next_observations)[: buf.pos, 0]
    dones = np.asarray(buf.dones)[: buf.pos, 0].astype(bool)
    assert dones.any()
    # continuing steps chain; at an episode end next_obs is the terminal one (not the reset obs)
    np.testing.assert_array_equal(nxt[:-1][~dones[:-1]], obs[1:][~dones[:-1]])
    ends = np.flatnonzero(dones[:-1])
    assert all(not np.array_equal(nxt[i], obs[i + 1]) for i in ends)
    assert all(abs(nxt[i][2]) > 0.2 or abs(nxt[i][0]) > 2.3 for i in ends)  # CartPole terminal: pole or cart out
    del gym


def test_views_write_through_like_sb3_truncation():
    sb3, jb = make_pair(PIX, DISC_A, 6, 2, omu=True, hto=False)
    rng = np.random.default_rng(1)
    for _ in range(4):
        step = random_step(PIX, DISC_A, 2, rng, p_done=0.0)
        sb3.add(*step)
        jb.add(*step)
    for buf in (sb3, jb):  # what SB3's _setup_learn does with optimize_memory_usage
        buf.dones[(buf.pos - 1) % buf.buffer_size] = True
    assert isinstance(jb.dones, FieldView)
    np.testing.assert_array_equal(np.asarray(jb.dones), sb3.dones)
    assert_samples_equal(sb3.samples_at(np.arange(3), np.ones(3, int)) if hasattr(sb3, "samples_at") else _sb3_at(sb3, np.arange(3), np.ones(3, int)),
                         jb.samples_at(np.arange(3), np.ones(3, int)))


def _sb3_at(buf, rows, envs):
    state = np.random.get_state()
    orig = np.random.randint
    np.random.randint = lambda *a, **k: envs  # SB3 draws env indices inside _get_samples
    try:
        return buf._get_samples(rows)
    finally:
        np.random.randint = orig
        np.random.set_state(state)


def test_reset_and_memory():
    sb3, jb = make_pair(PIX, DISC_A, 10, 2)
    rng = np.random.default_rng(2)
    for _ in range(3):
        jb.add(*random_step(PIX, DISC_A, 2, rng))
    jb.reset()
    assert (jb.pos, jb.full, jb.size(), int(jb.jax_buffer.size())) == (0, False, 0, 0)
    per = 2 * 32 + 8 + 3 * 4  # SB3: obs + next obs (uint8) + int64 action + float32 reward/done/timeout
    assert sb3_replay_nbytes(10, PIX, DISC_A, n_envs=2) == 10 * per
    exact = sum(a.nbytes for a in (sb3.observations, sb3.next_observations, sb3.actions, sb3.rewards, sb3.dones, sb3.timeouts))
    assert sb3_replay_nbytes(10, PIX, DISC_A, n_envs=2) == exact
    assert jb.nbytes < exact


def test_errors_are_clear():
    with pytest.raises(ValueError, match="handle_timeout_termination"):
        JaxReplayBuffer(10, BOX, DISC_A, optimize_memory_usage=True, handle_timeout_termination=True)
    with pytest.raises(TypeError, match="JaxDictReplayBuffer"):
        JaxReplayBuffer(10, DICT, DISC_A)
    with pytest.raises(TypeError, match="float64"):
        JaxReplayBuffer(10, spaces.Box(-1, 1, (2,), np.float64), DISC_A)
    jb = JaxReplayBuffer(10, BOX, DISC_A, device="cpu", n_envs=2)
    obs, nxt, act, rew, done, infos = random_step(BOX, DISC_A, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="reward"):
        jb.add(obs, nxt, act, rew[:1], done, infos)
    jb.add(obs, nxt, act, rew, done, infos)
    with pytest.raises(IndexError, match="batch_inds"):
        jb.samples_at(np.array([7]), np.array([0]))


def test_importing_jaxbuffers_does_not_import_sb3_or_torch():
    import subprocess
    import sys

    code = (
        "import sys, jaxbuffers, jaxbuffers.interop; bad = [m for m in ('torch', 'stable_baselines3') if m in sys.modules]; "
        "assert not bad, bad; import jaxbuffers.interop.sb3; assert 'stable_baselines3' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_unsigned_observation_spaces_sample_like_sb3(dtype):
    # depth images are often uint16; the torch hand-off had no entry for the wider unsigned types
    space = spaces.Box(0, 1000, (2,), dtype)
    sb3, jb = make_pair(space, BOX_A, 6, 2)
    rng = np.random.default_rng(3)
    for _ in range(4):
        obs, nxt = (rng.integers(0, 1000, (2, 2)).astype(dtype) for _ in range(2))
        step = (obs, nxt, rng.uniform(-1, 1, (2, 2)).astype(np.float32), rng.normal(size=2), rng.random(2) < 0.3, [{}, {}])
        sb3.add(*step)
        jb.add(*step)
    np.random.seed(4)
    a = sb3.sample(8)
    np.random.seed(4)
    b = jb.sample(8)
    assert b.observations.dtype == a.observations.dtype == getattr(th, np.dtype(dtype).name)
    assert_samples_equal(a, b)


def test_vecnormalize_keeps_sb3_integer_dtypes():
    # normalising a Discrete observation (left as is) used to hand back the int32 it is stored in
    gym = pytest.importorskip("gymnasium")
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    env = VecNormalize(DummyVecEnv([lambda: gym.make("FrozenLake-v1")]), norm_obs=False, norm_reward=True)
    env.reset()
    sb3, jb = make_pair(env.observation_space, env.action_space, 10, 1)
    for b in (sb3, jb):
        b.add(np.array([3]), np.array([4]), np.array([1]), np.ones(1), np.zeros(1), [{}])
    np.random.seed(0)
    a = sb3.sample(2, env)
    np.random.seed(0)
    b = jb.sample(2, env)
    assert a.observations.dtype == b.observations.dtype == th.int64
    assert_samples_equal(a, b)


def test_add_refuses_what_sb3_refuses_and_silent_casts():
    jb = JaxReplayBuffer(4, BOX, BOX_A, device="cpu", n_envs=2)
    obs, nxt, act, rew, done, infos = random_step(BOX, BOX_A, 2, np.random.default_rng(1))
    with pytest.raises(ValueError, match=r"obs: expected shape \(2, 3\), got shape \(3, 2\)"):
        jb.add(obs.T, nxt, act, rew, done, infos)  # the right size in another layout (SB3: cannot broadcast)
    with pytest.raises(ValueError, match="done: expected booleans"):
        jb.add(obs, nxt, act, rew, np.array([0.5, 0.0]), infos)
    with pytest.raises(TypeError, match="obs: expected an array of numbers"):
        jb.add(np.full((2, 3), "a"), nxt, act, rew, done, infos)
    jb.add(obs, nxt, act.reshape(-1), rew, done, infos)  # actions are reshaped, as SB3 does
    jb.add(obs[None], nxt, act, rew, done, infos)  # a leading unit axis, as numpy assignment drops it
    with pytest.raises(IndexError, match="batch_inds: expected integer"):
        jb.samples_at(np.array([0.7]), np.array([0]))


def test_narrowed_integers_are_refused_when_they_do_not_fit():
    # Discrete data is int64 in gymnasium and held as int32 (its bounds fit); a value beyond int32
    # is refused instead of wrapping
    jb = JaxReplayBuffer(4, spaces.Discrete(5), DISC_A, device="cpu")
    ok = (np.array([1.0]), np.zeros(1, bool), [{}])
    jb.add(np.array([3]), np.array([4]), np.array([1]), *ok)
    with pytest.raises(TypeError, match="obs: values of dtype int64"):
        jb.add(np.array([2**40]), np.array([4]), np.array([1]), *ok)
    with pytest.raises(TypeError, match="action: values of dtype int64"):
        jb.add(np.array([3]), np.array([4]), np.array([2**33]), *ok)


def test_compressed_rows_staged_on_the_host_survive_reused_caller_arrays():
    """With ``compress`` the SB3 rows wait on the host for one device add; a caller that refills the same
    action / reward / done arrays every step (as vectorised envs may) still gets SB3's samples, also for rows
    read back while some are staged and after (observations follow episodes: the
    compressed store keeps a next observation as the next row's observation)."""
    n_envs, size = 2, 200  # 100 rows per env
    sb3 = ReplayBuffer(size, PIX, BOX_A, device="cpu", n_envs=n_envs)
    jb = JaxReplayBuffer(size, PIX, BOX_A, device="cpu", n_envs=n_envs, compress=dict(codec="rle"))
    rng = np.random.default_rng(3)
    act, rew, done = np.zeros((n_envs, 2), np.float32), np.zeros(n_envs, np.float32), np.zeros(n_envs, bool)
    obs = random_obs(PIX, n_envs, rng)
    for i in range(32):
        _, nxt, a, r, d, infos = random_step(PIX, BOX_A, n_envs, rng)
        act[...], rew[...], done[...] = a, r, d
        sb3.add(obs, nxt, act, rew, done, infos)
        jb.add(obs, nxt, act, rew, done, infos)
        obs = np.where(d[:, None, None, None], random_obs(PIX, n_envs, rng), nxt)  # a reset where an episode ended
        if i == 15:  # 16 rows staged, none added yet
            rows = np.arange(16)
            assert_samples_equal(_sb3_at(sb3, rows, rows % n_envs), jb.samples_at(rows, rows % n_envs))
    rows = np.arange(32)
    assert_samples_equal(_sb3_at(sb3, rows, rows % n_envs), jb.samples_at(rows, rows % n_envs))


@pytest.mark.parametrize(("size", "steps", "read_every"), [(12, 600, 0), (12, 300, 7), (700, 700, 300)],
                         ids=["more-staged-than-rows", "small-reads", "queue-fills"])
def test_compressed_staged_rows_of_any_number_land_as_sb3_rows(size, steps, read_every):
    """The staged rows go to the device in one add whatever their number: more rows than the buffer holds (only the
    newest count, the ring wrapping many times), a few between reads, a full queue: every read equals SB3's."""
    n_envs = 2
    sb3 = ReplayBuffer(size, PIX, DISC_A, device="cpu", n_envs=n_envs)
    jb = JaxReplayBuffer(size, PIX, DISC_A, device="cpu", n_envs=n_envs, compress=dict(codec="zstd:-1"))
    rng = np.random.default_rng(5)
    obs = random_obs(PIX, n_envs, rng)
    for i in range(steps):
        _, nxt, a, r, d, infos = random_step(PIX, DISC_A, n_envs, rng)
        sb3.add(obs, nxt, a, r, d, infos)
        jb.add(obs, nxt, a, r, d, infos)
        obs = nxt
        if (read_every and i % read_every == read_every - 1) or i == steps - 1:
            rows = np.arange(sb3.buffer_size if sb3.full else sb3.pos)
            assert_samples_equal(_sb3_at(sb3, rows, rows % n_envs), jb.samples_at(rows, rows % n_envs))
    assert (jb.pos, jb.full, int(jb.jax_buffer.head)) == (sb3.pos, sb3.full, sb3.pos)


@pytest.mark.parametrize("read_every_add", [False, True], ids=["staged", "flushed"])
def test_compressed_keeps_a_next_obs_that_is_not_the_next_rows_obs(read_every_add):
    """Independent transitions (each ``next_obs`` unrelated to the next ``obs``, ``done`` mostly False): every sample
    equals SB3's, whether the previous row is still staged on the host or already in the compressed store when the
    next add shows that its next observation is not the next row's one; the ring wraps twice."""
    n_envs, size = 2, 12  # 6 rows per env
    sb3 = ReplayBuffer(size, PIX, BOX_A, device="cpu", n_envs=n_envs)
    jb = JaxReplayBuffer(size, PIX, BOX_A, device="cpu", n_envs=n_envs, compress=dict(codec="rle", max_pending=4))
    rng = np.random.default_rng(7)
    rows = np.repeat(np.arange(6), n_envs)
    envs = np.tile(np.arange(n_envs), 6)
    for i in range(14):
        step = random_step(PIX, BOX_A, n_envs, rng, p_done=0.1)
        sb3.add(*step)
        jb.add(*step)
        if read_every_add or i == 13:
            filled = rows < (i + 1 if i < 6 else 6)
            assert_samples_equal(_sb3_at(sb3, rows[filled], envs[filled]), jb.samples_at(rows[filled], envs[filled]))


def _stack(frames, k=4):
    """The frame stack ``[k, *frame]`` of an episode's frames so far, zeros before its start (SB3's VecFrameStack)."""
    pad = [np.zeros_like(frames[0])] * max(k - len(frames), 0)
    return np.stack(pad + frames[-k:])


def test_compressed_frame_stacks_where_one_env_restarts_without_done():
    """frame_stack=4: env 1 starts a new episode although its previous row was not done (a second ``learn`` resets
    the envs), env 0 goes on: the previous row of env 1 keeps its own next observation (SB3's samples), env 0's
    stacks are still stored once per frame. A next observation that is not its row's stack shifted by one frame
    cannot be held by the frame store: the next add refuses it (ValueError) rather than store something else."""
    space = spaces.Box(0, 255, (4, 3, 3), np.uint8)
    sb3 = ReplayBuffer(32, space, DISC_A, device="cpu", n_envs=2)
    jb = JaxReplayBuffer(32, space, DISC_A, device="cpu", n_envs=2, compress=dict(frame_stack=4, stack_axis=0, codec="rle", max_pending=2))
    rng = np.random.default_rng(0)
    frame = lambda: rng.integers(0, 256, (3, 3), dtype=np.uint8)  # noqa: E731
    episodes = [[frame()], [frame()]]
    for i in range(10):
        obs = np.stack([_stack(ep) for ep in episodes])
        for ep in episodes:
            ep.append(frame())
        nxt = np.stack([_stack(ep) for ep in episodes])
        step = (obs, nxt, np.array([[1], [2]]), np.ones(2, np.float32), np.zeros(2, bool), [{}, {}])
        sb3.add(*step)
        jb.add(*step)
        if i in (3, 7):
            episodes[1] = [frame()]  # env 1 restarts: its next obs is a fresh stack, not `nxt[1]`
        if i % 3 == 0:
            jb.samples_at(np.array([0]), np.array([0]))  # the restart after step 3 meets a flushed row, after 7 a staged one
    rows, envs = np.repeat(np.arange(10), 2), np.tile(np.arange(2), 10)
    assert_samples_equal(_sb3_at(sb3, rows, envs), jb.samples_at(rows, envs))
    assert jb._writer.buffer.next_ep_pos.tolist() == [3, 2]  # env 0 in one episode throughout, env 1 two steps into one
    obs = np.stack([_stack(ep) for ep in episodes])
    wrong = obs.copy()
    wrong[1] = rng.integers(0, 256, wrong[1].shape, dtype=np.uint8)  # not obs[1] shifted by one frame
    jb.add(obs, wrong, np.array([[1], [2]]), np.ones(2, np.float32), np.zeros(2, bool), [{}, {}])
    with pytest.raises(ValueError, match="final_obs"):
        jb.add(np.stack([_stack(ep) for ep in [episodes[0] + [frame()], [frame()]]]), obs, np.array([[1], [2]]),
               np.ones(2, np.float32), np.zeros(2, bool), [{}, {}])


def test_view_writes_are_checked_as_adds_are():
    # a uint8 field is stored as uint8 (SB3's dtype): numpy's assignment would wrap 300 to 44 and -1 to 255
    jb = JaxReplayBuffer(4, spaces.Box(0, 255, (4,), np.uint8), DISC_A, device="cpu")
    o = np.zeros((1, 4), np.uint8)
    jb.add(o, o, np.zeros(1), np.zeros(1), np.zeros(1), [{}])
    for name, value in [("observations", 300), ("next_observations", -1), ("observations", 3.5)]:
        with pytest.raises(TypeError, match=f"{name}: values of dtype .* that uint8 does not hold exactly"):
            getattr(jb, name)[0] = value
    np.testing.assert_array_equal(np.asarray(jb.observations)[0], o)
    np.testing.assert_array_equal(np.asarray(jb.next_observations)[0], o)
    jb.observations[0, 0, 1] = 255  # a value the field holds is written
    assert np.asarray(jb.observations)[0, 0, 1] == 255


@pytest.mark.parametrize(("value", "error"), [("False", TypeError), (2, ValueError), (0.5, ValueError), (np.nan, ValueError), (None, TypeError)])
def test_timeouts_are_checked_as_dones_are(value, error):
    jb = JaxReplayBuffer(4, BOX, DISC_A, device="cpu", n_envs=2)
    obs, nxt, act, rew, done, _ = random_step(BOX, DISC_A, 2, np.random.default_rng(0))
    with pytest.raises(error, match=r"infos\[1\]\['TimeLimit.truncated'\]"):
        jb.add(obs, nxt, act, rew, done, [{}, {"TimeLimit.truncated": value}])
    assert jb.pos == 0
    jb.add(obs, nxt, act, rew, done, [{"TimeLimit.truncated": np.True_}, {"TimeLimit.truncated": 0}])
    np.testing.assert_array_equal(np.asarray(jb.timeouts)[0], [1.0, 0.0])
