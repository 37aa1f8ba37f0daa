"""JaxRolloutBuffer / JaxDictRolloutBuffer against SB3's own RolloutBuffer / DictRolloutBuffer."""

from __future__ import annotations

import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer  # noqa: E402

from jaxbuffers.interop.sb3 import JaxDictRolloutBuffer, JaxRolloutBuffer  # noqa: E402

BOX = spaces.Box(-1e6, 1e6, (3,), np.float32)
DICT = spaces.Dict({"id": spaces.Box(-1e6, 1e6, (1,), np.float32), "img": spaces.Box(0, 255, (2, 2), np.uint8)})
DISC_A = spaces.Discrete(3)
BOX_A = spaces.Box(-1, 1, (2,), np.float32)


def make_pair(obs_space, act_space, t, n, gamma, lam):
    dict_obs = isinstance(obs_space, spaces.Dict)
    cls_sb3, cls_jax = (DictRolloutBuffer, JaxDictRolloutBuffer) if dict_obs else (RolloutBuffer, JaxRolloutBuffer)
    kw = dict(device="cpu", gamma=gamma, gae_lambda=lam, n_envs=n)
    return cls_sb3(t, obs_space, act_space, **kw), cls_jax(t, obs_space, act_space, **kw)


def fill(bufs, obs_space, act_space, t, n, rng, p_end=0.15, p_timeout=0.5, gamma=0.99):
    """SB3's collect_rollouts, simulated: ids in the observations, timeouts folded into rewards."""
    starts = np.ones(n, bool)
    for step in range(t):
        ids = (step * n + np.arange(n)).astype(np.float32)  # unique id per stored step
        if isinstance(obs_space, spaces.Dict):
            obs = {"id": ids[:, None], "img": rng.integers(0, 256, (n, 2, 2), dtype=np.uint8)}
        else:
            obs = np.stack([ids, rng.normal(size=n), rng.normal(size=n)], 1).astype(np.float32)
        if isinstance(act_space, spaces.Discrete):
            action = rng.integers(0, act_space.n, (n, 1))
        else:
            action = rng.uniform(-1, 1, (n, 2)).astype(np.float32)
        rewards = rng.normal(size=n).astype(np.float32)
        dones = rng.random(n) < p_end
        timeout = dones & (rng.random(n) < p_timeout)
        rewards[timeout] += gamma * rng.normal(size=timeout.sum()).astype(np.float32)  # + gamma * V(terminal_obs)
        values = th.as_tensor(rng.normal(size=(n, 1)).astype(np.float32))
        log_probs = th.as_tensor(rng.normal(size=n).astype(np.float32))
        for b in bufs:
            b.add(obs, action, rewards.copy(), starts.copy(), values, log_probs)
        starts = dones
    return th.as_tensor(rng.normal(size=(n, 1)).astype(np.float32)), rng.random(n) < p_end


@pytest.mark.parametrize("obs_space, act_space", [(BOX, DISC_A), (DICT, BOX_A)], ids=["box", "dict"])
@settings(max_examples=15, deadline=None)
@given(
    n=st.sampled_from([1, 4]),
    t=st.sampled_from([5, 32]),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_advantages_and_returns_equal_sb3(obs_space, act_space, n, t, gamma, lam, seed):
    sb3, jb = make_pair(obs_space, act_space, t, n, gamma, lam)
    rng = np.random.default_rng(seed)
    last_values, dones = fill([sb3, jb], obs_space, act_space, t, n, rng, gamma=gamma)
    assert (jb.pos, jb.full) == (sb3.pos, sb3.full)
    sb3.compute_returns_and_advantage(last_values=last_values, dones=dones)
    jb.compute_returns_and_advantage(last_values=last_values, dones=dones)
    # SB3's loop, operation for operation: bit for bit (a jitted recursion differed in the last bits)
    np.testing.assert_array_equal(jb.advantages, sb3.advantages)
    np.testing.assert_array_equal(jb.returns, sb3.returns)
    for name in ("values", "log_probs", "rewards", "episode_starts", "actions"):
        np.testing.assert_array_equal(getattr(jb, name), getattr(sb3, name).astype(getattr(jb, name).dtype), err_msg=name)


def _ids(samples):
    obs = samples.observations
    x = obs["id"][:, 0] if isinstance(obs, dict) else obs[:, 0]
    return x.numpy().astype(np.int64)


@pytest.mark.parametrize("obs_space, act_space", [(BOX, DISC_A), (DICT, BOX_A)], ids=["box", "dict"])
@pytest.mark.parametrize("batch_size", [None, 8, 12])
def test_get_matches_sb3_and_covers_each_step_once(obs_space, act_space, batch_size):
    t, n = 16, 3
    sb3, jb = make_pair(obs_space, act_space, t, n, 0.9, 0.8)
    rng = np.random.default_rng(7)
    last_values, dones = fill([sb3, jb], obs_space, act_space, t, n, rng)
    sb3.compute_returns_and_advantage(last_values, dones)
    jb.compute_returns_and_advantage(last_values, dones)
    for epoch in range(2):
        np.random.seed(100 + epoch)
        ours = list(jb.get(batch_size))
        np.random.seed(100 + epoch)
        theirs = list(sb3.get(batch_size))
        assert len(ours) == len(theirs) == -(-t * n // (batch_size or t * n))
        ids = np.concatenate([_ids(s) for s in ours])
        assert sorted(ids.tolist()) == list(range(t * n)), "every step exactly once per epoch"
        for a, b in zip(ours, theirs):
            assert type(a) is type(b)
            for name in a._fields:
                x, y = getattr(a, name), getattr(b, name)
                pairs = [(k, x[k], y[k]) for k in x] if isinstance(x, dict) else [(name, x, y)]
                for nm, u, v in pairs:
                    assert u.dtype == v.dtype and u.shape == v.shape, nm
                    th.testing.assert_close(u, v, rtol=1e-6, atol=1e-6, msg=nm)


def test_full_buffer_add_raises_and_reset():
    _, jb = make_pair(BOX, DISC_A, 2, 1, 0.99, 0.95)
    rng = np.random.default_rng(0)
    fill([jb], BOX, DISC_A, 2, 1, rng)
    assert jb.full
    with pytest.raises(IndexError, match="full"):
        fill([jb], BOX, DISC_A, 1, 1, rng)
    jb.reset()
    assert (jb.pos, jb.full, int(jb.jax_buffer.step_index)) == (0, False, 0)
    with pytest.raises(RuntimeError, match="holds 0 of buffer_size=2"):  # SB3: a bare assert
        jb.get(1)
    with pytest.raises(TypeError, match="JaxDictRolloutBuffer"):
        JaxRolloutBuffer(4, DICT, DISC_A)


def test_get_before_compute_returns_and_advantage_is_refused():
    """SB3 would hand out zero advantages and returns (or the last rollout's); the adapter refuses."""
    _, jb = make_pair(BOX, DISC_A, 2, 1, 0.99, 0.95)
    rng = np.random.default_rng(0)
    for _ in range(2):
        last_values, dones = fill([jb], BOX, DISC_A, 2, 1, rng)
        with pytest.raises(RuntimeError, match=r"^get: .*\(has_advantages is False\); call compute_returns_and_advantage\("):
            jb.get(1)
        assert np.isnan(jb._get_samples(np.arange(2)).advantages.numpy()).all()
        jb.compute_returns_and_advantage(last_values, dones)
        assert len(list(jb.get(1))) == 2
        jb.reset()


def test_partial_rollout_bootstraps_last_filled_step():
    """Documented difference: a partial fill bootstraps step pos-1 from last_values."""
    _, jb = make_pair(BOX, DISC_A, 4, 1, 0.5, 1.0)
    rng = np.random.default_rng(0)
    fill([jb], BOX, DISC_A, 2, 1, rng, p_end=0.0)
    r, v = jb.rewards[:2, 0], jb.values[:2, 0]
    jb.compute_returns_and_advantage(th.tensor([[10.0]]), np.array([False]))
    expect1 = r[1] + 0.5 * 10.0
    np.testing.assert_allclose(jb.returns[:2, 0], [r[0] + 0.5 * expect1, expect1], rtol=1e-6)
    np.testing.assert_array_equal(jb.advantages[2:], 0.0)
    del v


def test_add_takes_sb3_layouts_and_refuses_others():
    sb3, jb = (cls(4, BOX, BOX_A, "cpu", n_envs=2) for cls in (RolloutBuffer, JaxRolloutBuffer))
    obs = np.arange(6, dtype=np.float32).reshape(2, 3)
    args = (np.zeros(4, np.float32), np.ones(2, np.float32), np.zeros(2, bool), th.zeros(2, 1), th.zeros(2))
    for b in (sb3, jb):  # actions flat and values [n_envs, 1] are reshaped by SB3 too
        b.add(obs, *args)
    np.testing.assert_array_equal(np.asarray(jb.observations)[0], sb3.observations[0])
    with pytest.raises(ValueError):
        sb3.add(obs.T, *args)
    with pytest.raises(ValueError, match=r"obs: expected shape \(2, 3\), got shape \(3, 2\)"):
        jb.add(obs.T, *args)
    with pytest.raises(ValueError, match="episode_start: expected booleans"):
        jb.add(obs, args[0], args[1], np.array([2, 0]), *args[3:])


def test_float64_actions_are_held_exactly_or_refused():
    space = spaces.Box(-1, 1, (2,), np.float64)
    jb = JaxRolloutBuffer(4, BOX, space, "cpu", n_envs=1)
    args = (np.ones(1, np.float32), np.zeros(1, bool), th.zeros(1, 1), th.zeros(1))
    jb.add(np.zeros((1, 3), np.float32), np.array([[0.5, -0.25]]), *args)  # float32 values: kept exactly
    with pytest.raises(TypeError, match="action: values of dtype float64"):
        jb.add(np.zeros((1, 3), np.float32), np.array([[0.1, 0.0]]), *args)


def test_staged_adds_equal_sb3_across_stages_and_reads():
    """Adds are staged in numpy (`STAGED_STEPS` at a time): a rollout longer than two stages, read mid-stage (the
    staged steps are added first) and after a reset, equals SB3's."""
    from jaxbuffers.interop.sb3.rollout import STAGED_STEPS

    t, n = 2 * STAGED_STEPS + 11, 2
    sb3, jb = make_pair(BOX, DISC_A, t, n, 0.95, 0.9)
    rng = np.random.default_rng(3)
    for r in range(2):
        fill([sb3, jb], BOX, DISC_A, STAGED_STEPS + 5, n, rng)
        np.testing.assert_array_equal(jb.values[: STAGED_STEPS + 5], sb3.values[: STAGED_STEPS + 5])  # mid-stage read
        last_values, dones = fill([sb3, jb], BOX, DISC_A, t - STAGED_STEPS - 5, n, rng)
        sb3.compute_returns_and_advantage(last_values, dones)
        jb.compute_returns_and_advantage(last_values, dones)
        np.testing.assert_array_equal(jb.returns, sb3.returns)
        np.testing.assert_array_equal(jb.observations, sb3.observations)
        sb3.reset()
        jb.reset()


def test_reset_and_gae_update_the_rollout_in_place():
    """The adapter alone holds its state, so reset and GAE donate it: the observation storage stays where it is (an
    eager call without donation returned a copy of the whole rollout), and the results still equal SB3's."""
    t, n = 8, 2
    sb3, jb = make_pair(BOX, DISC_A, t, n, 0.95, 0.9)
    where = lambda: jb.jax_buffer.step["obs"].unsafe_buffer_pointer()  # noqa: E731
    rng = np.random.default_rng(5)
    for _ in range(2):
        for b in (sb3, jb):
            b.reset()
        last_values, dones = fill([sb3, jb], BOX, DISC_A, t, n, rng)
        before = where()
        for b in (sb3, jb):
            b.compute_returns_and_advantage(last_values, dones)
        assert where() == before
        np.testing.assert_array_equal(jb.advantages, sb3.advantages)
        jb.reset()
        assert where() == before


def test_host_copies_refuse_writes_they_would_drop():
    # the converted copies (int64 actions and Discrete observations, float32 episode_starts) were writable: a write
    # went to the copy and was lost
    jb = JaxRolloutBuffer(2, spaces.Discrete(5), DISC_A, device="cpu")
    for _ in range(2):
        jb.add(np.array([1]), np.array([2]), np.ones(1), np.zeros(1), th.zeros(1, 1), th.zeros(1))
    for name in ("observations", "actions", "episode_starts", "rewards", "values", "log_probs", "advantages", "returns"):
        with pytest.raises(ValueError, match="read-only"):
            getattr(jb, name)[0] = 1
    assert (jb.observations.ravel().tolist(), jb.actions.ravel().tolist(), jb.episode_starts.ravel().tolist()) == ([1, 1], [2, 2], [0.0, 0.0])
    d = JaxDictRolloutBuffer(2, DICT, DISC_A, device="cpu")
    with pytest.raises(ValueError, match="read-only"):
        d.observations["img"][0] = 1
