"""Conversions SB3 buffer <-> jaxbuffers buffer: round trips and the flag translation."""

from __future__ import annotations

import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.buffers import DictReplayBuffer, DictRolloutBuffer, ReplayBuffer, RolloutBuffer  # noqa: E402

import jaxbuffers as jb  # noqa: E402
from jaxbuffers.interop.sb3 import _common  # noqa: E402
from jaxbuffers.interop.sb3 import (  # noqa: E402
    JaxReplayBuffer,
    JaxRolloutBuffer,
    replay_from_jax,
    replay_to_jax,
    rollout_from_jax,
    rollout_to_jax,
)

PIX = spaces.Box(0, 255, (2, 3, 3), np.uint8)
DICT = spaces.Dict({"img": spaces.Box(0, 255, (2, 3), np.uint8), "vec": spaces.Box(-1, 1, (2,), np.float32)})
DISC_A = spaces.Discrete(4)


def _obs(space, n, rng):
    if isinstance(space, spaces.Dict):
        return {k: _obs(s, n, rng) for k, s in space.spaces.items()}
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (n, *space.shape), dtype=np.uint8)
    return rng.uniform(-1, 1, (n, *space.shape)).astype(np.float32)


def filled_replay(cls, space, size, n, adds, omu=False, seed=0):
    rng = np.random.default_rng(seed)
    buf = cls(size, space, DISC_A, device="cpu", n_envs=n, optimize_memory_usage=omu, handle_timeout_termination=not omu)
    for _ in range(adds):
        done = rng.random(n) < 0.3
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
        buf.add(_obs(space, n, rng), _obs(space, n, rng), rng.integers(0, 4, n), rng.normal(size=n), done, infos)
    return buf


def fields_equal(a, b, names):
    for name in names:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, dict):
            for k in x:
                np.testing.assert_array_equal(np.asarray(y[k]), x[k], err_msg=f"{name}[{k}]")
        else:
            y = np.asarray(y)
            assert y.dtype == x.dtype, name
            np.testing.assert_array_equal(y, x, err_msg=name)


REPLAY_FIELDS = ["observations", "actions", "rewards", "dones", "timeouts"]


@pytest.mark.parametrize("space, cls", [(PIX, ReplayBuffer), (DICT, DictReplayBuffer)], ids=["box", "dict"])
@pytest.mark.parametrize("adds", [0, 3, 5, 13])  # empty, partial, exactly full, wrapped
def test_replay_round_trip(space, cls, adds):
    src = filled_replay(cls, space, 10, 2, adds, seed=adds)
    mid = replay_to_jax(src)
    assert isinstance(mid, jb.ReplayBuffer) and mid.capacity == 10
    assert int(mid.num_valid) == src.size() * 2 and int(mid.head) == src.pos * 2
    back = replay_from_jax(mid, space, DISC_A, n_envs=2, device="cpu")
    assert type(back) is cls and (back.pos, back.full) == (src.pos, src.full)
    fields_equal(src, back, REPLAY_FIELDS + ["next_observations"])


@pytest.mark.parametrize("adds", [2, 5, 7])
def test_replay_round_trip_optimize_memory(adds):
    src = filled_replay(ReplayBuffer, PIX, 5, 1, adds, omu=True, seed=adds)
    mid = replay_to_jax(src)
    # next_obs materialised: row t's next observation is SB3's observations[t + 1]
    t = (src.pos - 1) % src.buffer_size
    np.testing.assert_array_equal(np.asarray(mid.storage["next_obs"][t]), src.observations[src.pos, 0])
    assert int(mid.num_valid) == (4 if src.full else src.pos)  # SB3 never samples row pos once full
    back = replay_from_jax(mid, PIX, DISC_A, device="cpu", optimize_memory_usage=True, handle_timeout_termination=False)
    assert (back.pos, back.full) == (src.pos, src.full)
    fields_equal(src, back, REPLAY_FIELDS)


def test_replay_flag_translation():
    src = ReplayBuffer(4, PIX, DISC_A, device="cpu")
    rng = np.random.default_rng(0)
    for done, trunc in [(False, False), (True, False), (True, True)]:
        src.add(_obs(PIX, 1, rng), _obs(PIX, 1, rng), np.array([1]), np.array([0.5]), np.array([done]), [{"TimeLimit.truncated": trunc}])
    mid = replay_to_jax(src)
    assert np.asarray(mid.storage["terminated"][:3]).tolist() == [False, True, False]
    assert np.asarray(mid.storage["truncated"][:3]).tolist() == [False, False, True]
    assert mid.storage["action"].dtype == jnp.int32
    # Without timeout handling SB3 learns time limits as terminal: the export says so too.
    no_to = replay_from_jax(mid, PIX, DISC_A, device="cpu", handle_timeout_termination=False)
    assert no_to.dones[:3, 0].tolist() == [0, 1, 1] and not no_to.timeouts.any()
    src.timeouts[0, 0] = 1.0  # a timeout without done has no meaning
    with pytest.raises(ValueError, match="timeouts"):
        replay_to_jax(src)


def test_replay_from_our_sb3_class_and_bad_layout():
    ours = filled_replay(JaxReplayBuffer, PIX, 8, 2, 6)
    theirs = filled_replay(ReplayBuffer, PIX, 8, 2, 6)
    a, b = replay_to_jax(ours), replay_to_jax(theirs)
    for k in a.storage:
        np.testing.assert_array_equal(np.asarray(a.storage[k]), np.asarray(b.storage[k]), err_msg=k)
    bad = jb.ReplayBuffer.create({"obs": jnp.zeros(3)}, capacity=4)
    with pytest.raises(ValueError, match="replay_to_jax layout"):
        replay_from_jax(bad, PIX, DISC_A)
    with pytest.raises(ValueError, match="n_envs"):
        replay_from_jax(a, PIX, DISC_A, n_envs=3)


def filled_rollout(cls, space, t, n, steps, seed=0, gamma=0.9):
    rng = np.random.default_rng(seed)
    buf = cls(t, space, DISC_A, device="cpu", gamma=gamma, gae_lambda=0.8, n_envs=n)
    starts = np.ones(n, bool)
    for _ in range(steps):
        buf.add(_obs(space, n, rng), rng.integers(0, 4, (n, 1)), rng.normal(size=n).astype(np.float32), starts,
                th.as_tensor(rng.normal(size=(n, 1)), dtype=th.float32), th.as_tensor(rng.normal(size=n), dtype=th.float32))
        starts = rng.random(n) < 0.25
    return buf, starts


ROLLOUT_FIELDS = ["observations", "actions", "rewards", "returns", "episode_starts", "values", "log_probs", "advantages"]


@pytest.mark.parametrize("space, cls", [(PIX, RolloutBuffer), (DICT, DictRolloutBuffer)], ids=["box", "dict"])
@pytest.mark.parametrize("steps, after_get", [(3, False), (6, False), (6, True)])
def test_rollout_round_trip_and_gae(space, cls, steps, after_get):
    src, last_dones = filled_rollout(cls, space, 6, 2, steps, seed=steps)
    last_values = th.as_tensor(np.linspace(-1, 1, 2)[:, None], dtype=th.float32)
    if src.full:
        src.compute_returns_and_advantage(last_values, last_dones)
    snapshot = {k: (dict(getattr(src, k)) if isinstance(getattr(src, k), dict) else getattr(src, k).copy()) for k in ROLLOUT_FIELDS}
    if after_get:
        list(src.get(4))  # SB3 reorders its arrays in place
    mid = rollout_to_jax(src, last_dones=last_dones)
    assert isinstance(mid, jb.RolloutBuffer) and int(mid.step_index) == (6 if src.full else src.pos)
    if src.full:  # recomputing GAE on the converted buffer reproduces SB3's numbers
        again = mid.compute_gae(jnp.asarray(last_values.numpy()[:, 0]), 0.9, 0.8)
        np.testing.assert_allclose(np.asarray(again.advantages), snapshot["advantages"], rtol=1e-6, atol=1e-6)
    back = rollout_from_jax(mid, space, DISC_A, device="cpu", gamma=0.9, gae_lambda=0.8)
    assert type(back) is cls and (back.pos, back.full) == ((src.pos, src.full))

    class Snap:  # compare against the pre-get layout
        pass

    snap = Snap()
    for k, v in snapshot.items():
        setattr(snap, k, v)
    fields_equal(snap, back, ROLLOUT_FIELDS)


def test_rollout_from_native_folds_truncation_into_reward():
    buf = jb.RolloutBuffer.create({"obs": jnp.zeros(2), "action": jnp.zeros(1, jnp.int32), "log_prob": jnp.float32(0)}, num_steps=3, num_envs=1)
    for t in range(3):
        buf = buf.add(
            {"obs": jnp.full((1, 2), t, jnp.float32), "action": jnp.zeros((1, 1), jnp.int32), "log_prob": jnp.zeros(1)},
            reward=jnp.ones(1), value=jnp.full(1, 0.5), terminated=jnp.array([t == 2]),
            truncated=jnp.array([t == 0]), final_value=jnp.full(1, 4.0),
        )
    buf = buf.compute_gae(jnp.zeros(1), 0.5, 0.7)
    sb3 = rollout_from_jax(buf, spaces.Box(-9, 9, (2,), np.float32), DISC_A, device="cpu", gamma=0.5, gae_lambda=0.7)
    assert sb3.rewards[:, 0].tolist() == [1 + 0.5 * 4.0, 1, 1]
    assert sb3.episode_starts[:, 0].tolist() == [0, 1, 0]
    sb3.compute_returns_and_advantage(th.zeros(1, 1), np.array([True]))
    np.testing.assert_allclose(sb3.advantages, np.asarray(buf.advantages), rtol=1e-6)


@pytest.mark.parametrize("n", [1, 2])
def test_rollout_to_jax_of_our_buffer_after_get(n):
    # Our get() sets generator_ready like SB3's but keeps the [T, n_envs, ...] layout.
    space = spaces.Box(-9, 9, (1, 3), np.float32)  # a leading 1 in the item: shapes must not be guessed from ndim alone
    src, last_dones = filled_rollout(JaxRolloutBuffer, space, 4, n, 4, seed=n)
    src.compute_returns_and_advantage(th.zeros(n, 1), last_dones)
    before = rollout_to_jax(src, last_dones=last_dones)
    list(src.get(3))
    after = rollout_to_jax(src, last_dones=last_dones)
    assert after.step["obs"].shape == (4, n, 1, 3)
    for path, x in jax.tree_util.tree_leaves_with_path(before):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(_at(after, path)), err_msg=jax.tree_util.keystr(path))


def _at(tree, path):
    for leaf_path, x in jax.tree_util.tree_leaves_with_path(tree):
        if leaf_path == path:
            return x
    raise KeyError(path)


def test_rollout_to_jax_names_a_badly_shaped_array():
    src, _ = filled_rollout(RolloutBuffer, PIX, 4, 2, 4)
    src.values = src.values[:3]
    with pytest.raises(ValueError, match=r"buffer\.values: expected shape \(4, 2\).*got \(3, 2\)"):
        rollout_to_jax(src)


def _counting_replay(size, n, adds, omu):
    """Transition k of env e: obs = action = 10 * k + e, next obs = obs + 10 (the next transition's obs)."""
    box = spaces.Box(-1e4, 1e4, (1,), np.float32)
    buf = ReplayBuffer(size, box, box, device="cpu", n_envs=n, optimize_memory_usage=omu, handle_timeout_termination=False)
    for k in range(adds):
        o = (10 * k + np.arange(n, dtype=np.float32))[:, None]
        buf.add(o, o + 10, o, np.zeros(n), np.zeros(n), [{}] * n)
    return buf, box


def _sb3_samplable(buf):
    """Every (row, env) SB3's sample() can draw, as ReplayBufferSamples."""
    if not buf.full:
        rows = np.arange(buf.pos)
    else:
        rows = np.arange(buf.buffer_size)
        if buf.optimize_memory_usage:
            rows = rows[rows != buf.pos]
    rows, envs = np.repeat(rows, buf.n_envs), np.tile(np.arange(buf.n_envs), len(rows))
    obs = buf._normalize_obs(buf.observations[rows, envs])
    nxt = buf.observations[(rows + 1) % buf.buffer_size, envs] if buf.optimize_memory_usage else buf.next_observations[rows, envs]
    return obs[:, 0], buf.actions[rows, envs][:, 0], nxt[:, 0]


@pytest.mark.parametrize("omu_out", [False, True])
@pytest.mark.parametrize("n", [1, 2])
def test_replay_from_jax_samples_only_valid_transitions(n, omu_out):
    # A full SB3 buffer with optimize_memory_usage: one row (pos) is not valid in jaxbuffers.
    src, box = _counting_replay(4 * n, n, 6, omu=True)
    mid = replay_to_jax(src)
    assert int(mid.num_valid) < mid.capacity <= mid.num_added()
    # ... and a native one whose valid range wraps and ends short of the capacity.
    short = _common.with_ring_state(mid, int(mid.head), 2 * n, mid.num_added())
    for buf in (mid, short):
        slots = (int(buf.head) - int(buf.num_valid) + np.arange(int(buf.num_valid))) % buf.capacity  # the valid ones
        valid = np.asarray(buf.storage["obs"])[slots, 0]
        back = replay_from_jax(buf, box, box, n_envs=n, device="cpu", optimize_memory_usage=omu_out, handle_timeout_termination=False)
        obs, act, nxt = _sb3_samplable(back)
        np.testing.assert_array_equal(act, obs)
        np.testing.assert_array_equal(nxt, obs + 10)
        np.testing.assert_array_equal(np.sort(obs), np.sort(valid))  # each valid transition once, nothing else


def test_replay_from_jax_checks_item_shapes_and_values():
    src = ReplayBuffer(4, spaces.Box(-1, 1, (1,), np.float32), spaces.Box(-1, 1, (1,), np.float32), device="cpu")
    src.add(np.array([[0.25]]), np.array([[0.5]]), np.array([[0.75]]), np.ones(1), np.zeros(1), [{}])
    mid = replay_to_jax(src)
    box1, box2, box3 = (spaces.Box(-1, 1, (k,), np.float32) for k in (1, 2, 3))
    with pytest.raises(ValueError, match=r"storage\['obs'\]: expected items of shape \(3,\), got \(1,\)"):
        replay_from_jax(mid, box3, box1)
    with pytest.raises(ValueError, match=r"storage\['action'\]: expected items of shape \(2,\), got \(1,\)"):
        replay_from_jax(mid, box1, box2)
    with pytest.raises(TypeError, match=r"storage\['obs'\].*float32.*uint8"):
        replay_from_jax(mid, spaces.Box(0, 255, (1,), np.uint8), box1)
    # The spaces' own shapes are accepted where SB3 flattens: a Discrete action stored as ().
    spec = {"obs": jnp.zeros(1), "action": jnp.int32(0), "reward": jnp.float32(0), "next_obs": jnp.zeros(1),
            "terminated": jnp.bool_(False), "truncated": jnp.bool_(False)}
    batch = {k: jnp.broadcast_to(v, (2, *v.shape)) for k, v in spec.items()}
    native = jb.ReplayBuffer.create(spec, capacity=4).add(dict(batch, action=jnp.arange(2, dtype=jnp.int32)))
    assert replay_from_jax(native, box1, DISC_A, device="cpu").actions[:2, 0, 0].tolist() == [0, 1]


def test_rollout_from_jax_checks_shapes_and_trainable():
    buf = jb.RolloutBuffer.create({"obs": jnp.zeros(2), "action": jnp.zeros(1, jnp.int32), "log_prob": jnp.float32(0)}, num_steps=3, num_envs=1)
    for t in range(3):
        buf = buf.add({"obs": jnp.full((1, 2), t, jnp.float32), "action": jnp.zeros((1, 1), jnp.int32), "log_prob": jnp.zeros(1)},
                      reward=jnp.ones(1), value=jnp.zeros(1), terminated=jnp.array([False]), trainable=jnp.array([t != 1]))
    box2 = spaces.Box(-9, 9, (2,), np.float32)
    with pytest.raises(ValueError, match=r"buffer\.trainable: .*1 that are not.*\(1, 0\)"):
        rollout_from_jax(buf, box2, DISC_A, device="cpu")
    buf = buf.replace(trainable=jnp.ones_like(buf.trainable))
    assert rollout_from_jax(buf, box2, DISC_A, device="cpu").observations[:, 0, 0].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match=r"step\['obs'\]: expected items of shape \(3,\), got \(2,\)"):
        rollout_from_jax(buf, spaces.Box(-9, 9, (3,), np.float32), DISC_A, device="cpu")
    with pytest.raises(ValueError, match=r"step\['action'\]: expected items of shape \(2,\), got \(1,\)"):
        rollout_from_jax(buf, box2, spaces.Box(-1, 1, (2,), np.float32), device="cpu")


def test_rollout_float64_actions_round_trip_or_raise():
    f64 = spaces.Box(-1, 1, (2,), np.float64)
    src = RolloutBuffer(2, PIX, f64, device="cpu", n_envs=1)
    rng = np.random.default_rng(0)
    for _ in range(2):  # what PPO stores: float32 policy outputs
        src.add(_obs(PIX, 1, rng), rng.uniform(-1, 1, (1, 2)).astype(np.float32), np.ones(1), np.zeros(1), th.zeros(1, 1), th.zeros(1))
    back = rollout_from_jax(rollout_to_jax(src), PIX, f64, device="cpu")
    assert back.actions.dtype == np.float64
    np.testing.assert_array_equal(back.actions, src.actions)
    src.actions[0, 0, 0] = 0.1  # not a float32 value
    with pytest.raises(TypeError, match="actions"):
        rollout_to_jax(src)
