"""Tests of jaxbuffers.episode_writer: EpisodeWriter against a plain-Python episode splitter, with halves arriving in
either order and from concurrent threads."""

from __future__ import annotations

import random
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuffers.episode import EpisodeBuffer
from jaxbuffers.episode_writer import EpisodeWriter

EXAMPLE = {"obs": jnp.zeros((2,), jnp.float32), "action": jnp.int32(0), "log_prob": jnp.float32(0),
           "reward": jnp.float32(0)}
M = 4


def step_values(env: int, sid: int):
    """Distinct values per (env, step id): action = 1000 * env + sid."""
    code = 1000 * env + sid
    env_half = {"obs": np.array([code, 0.5], np.float32), "reward": np.float32(code % 7)}
    policy = {"action": np.int32(code), "log_prob": np.float32(-code)}
    return env_half, policy, np.array([code, 0.25], np.float32)  # next_obs


def flags(rng, n):
    """Per step: 0 continue, 1 terminated, 2 truncated."""
    return [rng.choice([0, 0, 0, 1, 2]) for _ in range(n)]


def expected_episodes(env: int, fl: list[int], upto: int) -> list[dict]:
    """The episodes a writer must commit for steps [0, upto) of an env: cut at an end or at M steps."""
    out, cur = [], []
    for sid in range(upto):
        cur.append(sid)
        f = fl[sid]
        if f or len(cur) == M:
            out.append(dict(actions=[1000 * env + s for s in cur], term=f == 1, trunc=f != 1,
                            final=step_values(env, sid)[2]))
            cur = []
    return out


def committed(buf: EpisodeBuffer) -> list[dict]:
    everything = buf.get_all()
    out = []
    for i in range(int(buf.num_episodes())):
        n = int(everything.lengths[i])
        out.append(dict(actions=[int(a) for a in np.asarray(everything.item["action"][i][:n])],
                        term=bool(everything.terminated[i]), trunc=bool(everything.truncated[i]),
                        final=np.asarray(everything.final_obs[i]),
                        obs=np.asarray(everything.item["obs"][i][:n]), logp=np.asarray(everything.item["log_prob"][i][:n])))
    return out


def check_against(buf, expected_by_env: dict[int, list[dict]]):
    got = committed(buf)
    by_env: dict[int, list[dict]] = {}
    for ep in got:
        by_env.setdefault(ep["actions"][0] // 1000, []).append(ep)  # commits of one env keep their order
        np.testing.assert_array_equal(ep["obs"][:, 0], ep["actions"])
        np.testing.assert_array_equal(ep["logp"], -np.array(ep["actions"], np.float32))
    assert sorted(by_env) == sorted(k for k, v in expected_by_env.items() if v)
    for env, eps in expected_by_env.items():
        assert len(by_env.get(env, [])) == len(eps), env
        for g, w in zip(by_env.get(env, []), eps):
            assert g["actions"] == w["actions"]
            assert (g["term"], g["trunc"]) == (w["term"], w["trunc"] and not w["term"])
            np.testing.assert_array_equal(g["final"], w["final"])


def test_halves_in_either_order_and_auto_truncation():
    rng = random.Random(0)
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=64, max_timesteps=M)
    n = 23
    w = EpisodeWriter(buf, policy_lead=n)  # any order: a policy half may come up to n steps ahead
    assert w.policy_keys == ("action", "log_prob")
    fls = {e: flags(rng, n) for e in range(3)}
    events = []
    for e in range(3):
        for sid in range(n):
            events += [("env", e, sid), ("policy", e, sid)]
    rng.shuffle(events)
    env_next = dict.fromkeys(range(3), 0)
    for i, (kind, e, sid) in enumerate(events):  # an env's env halves come in step order, its policy halves in any
        if kind == "env":
            events[i], env_next[e] = (kind, e, env_next[e]), env_next[e] + 1
    for kind, e, sid in events:
        env_half, policy, next_obs = step_values(e, sid)
        if kind == "env":
            f = fls[e][sid]
            w.add_env(e, sid, env_half, next_obs=next_obs, terminated=f == 1, truncated=f == 2)
        else:
            w.add_policy(e, sid, policy)
    check_against(w.buffer, {e: expected_episodes(e, fls[e], n) for e in range(3)})


def test_a_step_missing_a_half_is_never_committed():
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=16, max_timesteps=M)
    w = EpisodeWriter(buf)
    fl = [0, 1, 0, 1, 0, 0, 1]
    for sid in range(len(fl)):
        env_half, policy, next_obs = step_values(5, sid)
        w.add_env(5, sid, env_half, next_obs=next_obs, terminated=fl[sid] == 1)
        if sid != 2:  # step 2's policy half never arrives
            w.add_policy(5, sid, policy)
    check_against(w.buffer, {5: expected_episodes(5, fl, 2)})
    assert w.pending(5) == ([2], [])
    assert w.in_progress(5) == 0
    # once it arrives, everything behind it joins, in order
    w.add_policy(5, 2, step_values(5, 2)[1])
    check_against(w.buffer, {5: expected_episodes(5, fl, len(fl))})


def test_envs_appearing_late_and_add_step():
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=32, max_timesteps=M)
    w = EpisodeWriter(buf)
    rng = random.Random(1)
    fls = {e: flags(rng, 10) for e in range(4)}
    for t in range(10):
        for e in range(4):
            if t < 2 * e:  # env e appears at time 2e
                continue
            sid = t - 2 * e
            env_half, policy, next_obs = step_values(e, sid)
            f = fls[e][sid]
            w.add_step(e, {**env_half, **policy}, next_obs=next_obs, terminated=f == 1, truncated=f == 2)
    check_against(w.buffer, {e: expected_episodes(e, fls[e], 10 - 2 * e) for e in range(4)})


def test_concurrent_writers_match_the_model():
    """8 env threads send env halves, 4 policy threads send policy halves, each in its own order."""
    n_envs, n = 8, 40
    rng = random.Random(2)
    fls = {e: flags(rng, n) for e in range(n_envs)}
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=n_envs * n, max_timesteps=M, meta={"env": jnp.int32(-1)})
    w = EpisodeWriter(buf, policy_lead=n)  # each policy thread shuffles all of an env's steps
    errors: list[BaseException] = []

    def env_actor(e):
        try:
            for sid in range(n):
                env_half, _, next_obs = step_values(e, sid)
                f = fls[e][sid]
                w.add_env(e, sid, env_half, next_obs=next_obs, terminated=f == 1, truncated=f == 2,
                          meta={"env": np.int32(e)})
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    def policy_actor(envs, seed):
        try:
            order = [(e, sid) for e in envs for sid in range(n)]
            random.Random(seed).shuffle(order)
            for e, sid in order:
                w.add_policy(e, sid, step_values(e, sid)[1])
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=env_actor, args=(e,)) for e in range(n_envs)]
    threads += [threading.Thread(target=policy_actor, args=(list(range(i, n_envs, 4)), i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    out = w.buffer
    check_against(out, {e: expected_episodes(e, fls[e], n) for e in range(n_envs)})
    everything = out.get_all()
    k = int(out.num_episodes())
    np.testing.assert_array_equal(np.asarray(everything.meta["env"][:k]), np.asarray(everything.item["action"][:k, 0]) // 1000)


def test_errors_name_the_half_and_change_nothing():
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=4, max_timesteps=M, meta={"task": jnp.int32(0)})
    w = EpisodeWriter(buf)
    env_half, policy, next_obs = step_values(0, 0)
    with pytest.raises(TypeError, match=r"fields\['reward'\]: expected dtype float32, got float64"):
        w.add_env(0, 0, {**env_half, "reward": np.float64(1)}, next_obs=next_obs, terminated=False)
    with pytest.raises(TypeError, match="missing leaves"):
        w.add_policy(0, 0, {"action": policy["action"]})
    with pytest.raises(ValueError, match=r"next_obs: expected shape"):
        w.add_env(0, 0, env_half, next_obs=np.zeros(3, np.float32), terminated=False)
    with pytest.raises(TypeError, match="terminated: expected a bool"):
        w.add_env(0, 0, env_half, next_obs=next_obs, terminated=1)
    with pytest.raises(TypeError, match=r"meta: unknown fields \['tsk'\]"):
        w.add_env(0, 0, env_half, next_obs=next_obs, terminated=False, meta={"tsk": 1})
    with pytest.raises(ValueError, match="step_id: expected an int >= 0"):
        w.add_policy(0, -1, policy)
    assert w.pending(0) == ([], [])
    w.add_policy(0, 0, policy)
    with pytest.raises(ValueError, match="policy half of step 0 of env 0 was already given"):
        w.add_policy(0, 0, policy)
    with pytest.raises(ValueError, match="policy_keys: 'reward'"):
        EpisodeWriter(buf, policy_keys=["action", "reward"])
    with pytest.raises(ValueError, match="policy_keys: 'act'"):
        EpisodeWriter(buf, policy_keys=["act"])
    with pytest.raises(TypeError, match=r"policy_keys: expected a list of field names \(strs\), got str 'action'"):
        EpisodeWriter(buf, policy_keys="action")  # not its letters
    with pytest.raises(ValueError, match="policy_keys: expected at least 1 distinct names, got \\[\\]"):
        EpisodeWriter(buf, policy_keys=[])  # a writer that could never commit
    assert int(w.buffer.num_episodes()) == 0


def test_a_full_fixed_buffer_refuses_the_commit_and_the_writer_goes_on():
    from jaxbuffers.episode import BufferFullError

    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=1, max_timesteps=M, circular=False)
    w = EpisodeWriter(buf)
    for sid, end in enumerate([True, True, False]):
        env_half, policy, next_obs = step_values(3, sid)
        w.add_policy(3, sid, policy)
        if sid == 1:
            with pytest.raises(BufferFullError, match="max_episodes=1"):
                w.add_env(3, sid, env_half, next_obs=next_obs, terminated=end)
        else:
            w.add_env(3, sid, env_half, next_obs=next_obs, terminated=end)
    check_against(w.buffer, {3: expected_episodes(3, [1], 1)})  # the first episode only
    assert w.in_progress(3) == 1  # step 2 joined a new episode after the refused one


def test_env_halves_out_of_step_order_are_refused_naming_the_env_and_ids():
    """An env's first env half must be step 0 and each next one the step after (an env that appears late with a
    global step count included): refused with a message naming step_id, the env, the id expected and the id given;
    nothing of the refused half is kept, and the env goes on from the id expected."""
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=8, max_timesteps=M)
    w = EpisodeWriter(buf)
    env_half, policy, next_obs = step_values(7, 5)
    with pytest.raises(ValueError, match=r"step_id: env 7 expects the env half of step 0 next \(its first env half is step 0.*got 5"):
        w.add_env(7, 5, env_half, next_obs=next_obs, terminated=False)
    with pytest.raises(ValueError, match=r"step_id: env 7 expects the env half of step 0 next.*got 5"):
        w.add_step(7, {**env_half, **policy}, next_obs=next_obs, terminated=False, step_id=5)
    assert w.pending(7) == ([], []) and w.in_progress(7) == 0  # the refused halves left no trace
    w.add_policy(7, 2, step_values(7, 2)[1])  # a policy half may come ahead of its env half
    for sid in range(2):
        env_half, policy, next_obs = step_values(7, sid)
        w.add_step(7, {**env_half, **policy}, next_obs=next_obs, terminated=False)  # ids 0 and 1 by default
    env_half, _, next_obs = step_values(7, 3)
    with pytest.raises(ValueError, match=r"env 7 expects the env half of step 2 next \(the env half after step 1.*got 3"):
        w.add_env(7, 3, env_half, next_obs=next_obs, terminated=False)
    with pytest.raises(ValueError, match="env half of step 1 of env 7 was already given"):
        w.add_env(7, 1, env_half, next_obs=next_obs, terminated=False)
    env_half, _, next_obs = step_values(7, 2)
    assert w.add_env(7, 2, env_half, next_obs=next_obs, terminated=True) == 1
    check_against(w.buffer, {7: expected_episodes(7, [0, 0, 1], 3)})
    w.discard(7)  # starts the env again at 0
    with pytest.raises(ValueError, match="expects the env half of step 0 next"):
        w.add_env(7, 3, env_half, next_obs=next_obs, terminated=False)


def test_concurrent_writers_with_a_misnumbered_env():
    """Env threads run at once; one env counts from a global step (its first id is 40): its thread gets the error
    at its first half (a policy half 40 steps past the env's next env half: beyond `policy_lead`), the policy halves
    another thread sends for it are refused too (none waits), and every other env commits as the model says."""
    n_envs, n, late = 4, 24, 3
    rng = random.Random(3)
    fls = {e: flags(rng, n) for e in range(n_envs)}
    w = EpisodeWriter(EpisodeBuffer.create(EXAMPLE, max_episodes=n_envs * n, max_timesteps=M))
    errors: dict[int, BaseException] = {}
    start = threading.Barrier(n_envs + 1)

    def env_actor(e):
        first = 40 if e == late else 0
        start.wait()
        try:
            for sid in range(first, first + n):
                env_half, policy, next_obs = step_values(e, sid - first)
                w.add_policy(e, sid, policy)
                f = fls[e][sid - first]
                w.add_env(e, sid, env_half, next_obs=next_obs, terminated=f == 1, truncated=f == 2)
        except ValueError as err:
            errors[e] = err

    ahead: list[BaseException] = []

    def policy_ahead():  # policy halves of the late env's next steps, from another thread
        start.wait()
        for sid in range(41, 44):
            try:
                w.add_policy(late, sid, step_values(late, sid - 40)[1])
            except ValueError as err:
                ahead.append(err)

    threads = [threading.Thread(target=env_actor, args=(e,)) for e in range(n_envs)]
    threads.append(threading.Thread(target=policy_ahead))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert list(errors) == [late] and len(ahead) == 3
    for err, sid in zip([errors[late], *ahead], range(40, 44)):
        assert str(err).startswith(f"step_id: env {late} takes policy halves of the steps in [0, {M - 1}] not given yet")
        assert str(err).endswith(f"(at most policy_lead={M} steps from step 0, whose env half comes next), got {sid}")
    assert w.pending(late) == ([], []) and w.in_progress(late) == 0
    check_against(w.buffer, {e: expected_episodes(e, fls[e], n) if e != late else [] for e in range(n_envs)})
