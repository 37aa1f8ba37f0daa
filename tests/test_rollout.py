"""RolloutBuffer: writes, overflow, reset, GAE against returns.gae, minibatch permutations, masks,
vmap == separate buffers, errors naming the field, and hand-checked memory-pressure numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxbuffers as jb
from jaxbuffers import returns
from jaxbuffers.rollout import RolloutBuffer, RolloutMemoryPressure, RolloutMinibatch

EXAMPLE = {"obs": jnp.zeros((4,), jnp.float32), "action": jnp.int32(0), "log_prob": jnp.float32(0)}
JIT = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


def maybe_jit(f, jit, **kw):
    return jax.jit(f, **kw) if jit else f


def make_step(t: int, n: int):
    """Step of row t: every leaf derived from the flat index t * n + env (so it can be traced back)."""
    idx = t * n + np.arange(n)
    return {
        "obs": jnp.asarray(np.stack([idx, -idx, idx * 0.5, idx + 0.25], axis=1), jnp.float32),
        "action": jnp.asarray(idx, jnp.int32),
        "log_prob": jnp.asarray(-0.01 * idx, jnp.float32),
    }


def random_rollout(rng: np.random.Generator, t: int, n: int, trainable_p: float = 1.0):
    """GAE fields for t rows of n envs, with terminations, truncations and NaN in unread final_value."""
    terminated = rng.random((t, n)) < 0.15
    truncated = rng.random((t, n)) < 0.1
    final_value = np.where(truncated, rng.normal(size=(t, n)), np.nan)
    return {
        "reward": rng.normal(size=(t, n)).astype(np.float32),
        "value": rng.normal(size=(t, n)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "final_value": final_value.astype(np.float32),
        "trainable": rng.random((t, n)) < trainable_p,
    }


def fill(buf: RolloutBuffer, data: dict, rows: int, jit: bool, start: int = 0) -> RolloutBuffer:
    add = maybe_jit(RolloutBuffer.add, jit)
    n = buf.num_envs
    for t in range(rows):
        buf = add(
            buf,
            make_step(start + t, n),
            reward=jnp.asarray(data["reward"][t]),
            value=jnp.asarray(data["value"][t]),
            terminated=jnp.asarray(data["terminated"][t]),
            truncated=jnp.asarray(data["truncated"][t]),
            final_value=jnp.asarray(data["final_value"][t]),
            trainable=jnp.asarray(data["trainable"][t]),
        )
    return buf


# ----------------------------------------------------------------------------------- create / add
def test_create_shapes_and_dtypes():
    buf = RolloutBuffer.create(EXAMPLE, num_steps=5, num_envs=3)
    assert buf.step["obs"].shape == (5, 3, 4) and buf.step["obs"].dtype == jnp.float32
    assert buf.step["action"].dtype == jnp.int32
    for name in ("reward", "value", "final_value", "advantages", "returns"):
        assert getattr(buf, name).shape == (5, 3) and getattr(buf, name).dtype == jnp.float32
    for name in ("terminated", "truncated", "trainable"):
        assert getattr(buf, name).dtype == jnp.bool_
    assert int(buf.size()) == 0 and not bool(buf.is_full())
    b16 = RolloutBuffer.create(EXAMPLE, num_steps=5, num_envs=3, float_dtype=jnp.bfloat16)
    assert b16.advantages.dtype == jnp.bfloat16


def test_create_takes_sizes_as_keywords_and_refuses_float64_without_x64():
    with pytest.raises(TypeError):
        RolloutBuffer.create(EXAMPLE, 5, 3)  # positional sizes could be swapped silently
    if not jax.config.jax_enable_x64:
        with pytest.raises(TypeError, match="float_dtype.*float64"):
            RolloutBuffer.create(EXAMPLE, num_steps=5, num_envs=3, float_dtype=jnp.float64)


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        ({"num_steps": 0, "num_envs": 2}, ValueError, "num_steps"),
        ({"num_steps": 2, "num_envs": 0}, ValueError, "num_envs"),
        ({"num_steps": 2, "num_envs": 2, "float_dtype": jnp.int32}, TypeError, "float_dtype"),
    ],
)
def test_create_errors(kw, exc, match):
    with pytest.raises(exc, match=match):
        RolloutBuffer.create(EXAMPLE, **kw)
    with pytest.raises(TypeError, match=r"example_step\['x'\]"):
        RolloutBuffer.create({"x": 1.0}, num_steps=2, num_envs=2)


@JIT
def test_add_writes_rows_in_order_and_full_is_noop(jit):
    t, n = 3, 2
    rng = np.random.default_rng(0)
    data = random_rollout(rng, t + 2, n, trainable_p=0.5)
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), data, t, jit)
    assert int(buf.size()) == t * n and int(buf.step_index) == t and bool(buf.is_full()) and not bool(buf.overflowed)
    np.testing.assert_array_equal(np.asarray(buf.step["action"]), np.arange(t * n).reshape(t, n))
    for name in ("reward", "value", "terminated", "truncated", "trainable"):
        np.testing.assert_array_equal(np.asarray(getattr(buf, name)), data[name][:t])
    # final_value is stored as given (NaN where not truncated is fine: never read there)
    np.testing.assert_array_equal(np.asarray(buf.final_value), data["final_value"][:t])
    before = jax.tree.map(np.asarray, buf)
    if not jit:  # eagerly a full buffer refuses the step (as a fixed EpisodeBuffer does) and stays as it was
        with pytest.raises(jb.BufferFullError, match=r"add: the rollout buffer is full \(step_index=3 of num_steps=3\)"):
            fill(buf, {k: v[t:] for k, v in data.items()}, 1, jit, start=t)
        jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, buf))
        assert not bool(buf.overflowed)
        return
    # Under jit two more adds to a full buffer: nothing changes but the overflow flag.
    buf = fill(buf, {k: v[t:] for k, v in data.items()}, 2, jit, start=t)
    assert bool(buf.overflowed) and int(buf.size()) == t * n
    after = jax.tree.map(np.asarray, buf)
    for name in ("step", "reward", "value", "terminated", "truncated", "final_value", "trainable"):
        jax.tree.map(np.testing.assert_array_equal, getattr(before, name), getattr(after, name))


@JIT
def test_add_defaults(jit):
    n = 3
    buf = RolloutBuffer.create(EXAMPLE, num_steps=2, num_envs=n)
    add = maybe_jit(RolloutBuffer.add, jit)
    buf = add(buf, make_step(0, n), reward=jnp.ones(n), value=jnp.zeros(n), terminated=jnp.zeros(n, bool))
    assert not np.asarray(buf.truncated[0]).any()
    assert np.asarray(buf.trainable[0]).all() and not np.asarray(buf.trainable[1]).any()
    assert int(buf.trainable_size()) == n


@JIT
def test_reset_keeps_storage_and_restarts_at_row_zero(jit):
    t, n = 4, 2
    data = random_rollout(np.random.default_rng(1), t, n)
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), data, t, jit)
    buf = buf.compute_gae(jnp.zeros(n), 0.9, 0.8)
    buf = fill(buf, data, 1, True)  # overflow (under jit: eagerly BufferFullError)
    old_obs = np.asarray(buf.step["obs"])
    buf = maybe_jit(RolloutBuffer.reset, jit)(buf)
    assert int(buf.size()) == 0 and not bool(buf.overflowed) and not bool(buf.has_advantages)
    assert buf.step["obs"].shape == (t, n, 4)
    np.testing.assert_array_equal(np.asarray(buf.step["obs"]), old_obs)  # not zeroed: O(1) reset
    assert int(buf.trainable_size()) == 0  # stale rows count as unfilled
    assert not np.asarray(buf.filled()).any()
    buf = fill(buf, data, 1, jit, start=100)
    np.testing.assert_array_equal(np.asarray(buf.step["action"][0]), 100 * n + np.arange(n))
    np.testing.assert_array_equal(np.asarray(buf.step["obs"][1:]), old_obs[1:])
    assert int(buf.size()) == n and int(buf.trainable_size()) == n


@JIT
def test_reset_zeroes_advantages_and_returns(jit):
    """After reset the stored advantages and returns are zeros (the previous rollout's are gone)."""
    t, n = 2, 2
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), random_rollout(np.random.default_rng(2), t, n), t, jit)
    buf = buf.compute_gae(jnp.ones(n), 0.9, 0.8)
    assert np.asarray(buf.advantages).any() and np.asarray(buf.returns).any()
    buf = maybe_jit(RolloutBuffer.reset, jit)(buf)
    buf = fill(buf, random_rollout(np.random.default_rng(3), t, n), 1, jit)
    np.testing.assert_array_equal(np.asarray(buf.advantages), 0)
    np.testing.assert_array_equal(np.asarray(buf.returns), 0)
    assert jb.rollout_stats(buf).summary()["advantage_mean"] is None  # before compute_gae: NaN, not statistics of zeros


@pytest.mark.parametrize("since", ["create", "add after compute_gae", "reset"])
def test_a_forgotten_compute_gae_is_refused_eagerly_and_reads_nan_under_jit(since):
    """Advantages read before compute_gae are not the rollout's (zeros, or the last rollout's after an add): an eager
    minibatches names compute_gae, and every read under jit (minibatches, gather) gives NaN advantages and returns,
    the other fields as stored. After compute_gae the same reads give the stored values."""
    t, n = 3, 2
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), random_rollout(np.random.default_rng(7), t, n), t - 1, False)
    if since != "create":
        buf = buf.compute_gae(jnp.ones(n), 0.9, 0.8)
        buf = buf.add(make_step(t - 1, n), reward=jnp.ones(n), value=jnp.ones(n), terminated=jnp.zeros(n, bool))
        if since == "reset":
            buf = buf.reset()
    key, idx = jax.random.key(0), jnp.arange(t * n, dtype=jnp.int32)
    with pytest.raises(RuntimeError, match=r"^minibatches: the rollout's advantages and returns were not computed since "
                                           r"its last add or reset \(has_advantages is False\); call compute_gae\("):
        buf.minibatches(key, 2)
    with pytest.raises(ValueError, match="num_minibatches"):  # a bad argument is named first
        buf.minibatches(key, 4)
    mbs = jax.jit(RolloutBuffer.minibatches, static_argnums=2)(buf, key, 2)
    for mb in (mbs, buf.gather(idx), jax.jit(RolloutBuffer.gather)(buf, idx)):
        assert np.isnan(np.asarray(mb.advantages)).all() and np.isnan(np.asarray(mb.returns)).all()
        assert np.isfinite(np.asarray(mb.reward)).all()
    done = buf.compute_gae(jnp.ones(n), 0.9, 0.8)
    mb = done.minibatches(key, 2)
    flat = np.asarray(mb.index).ravel()
    np.testing.assert_array_equal(np.asarray(mb.advantages).ravel(), np.asarray(done.advantages).ravel()[flat])
    np.testing.assert_array_equal(np.asarray(mb.returns).ravel(), np.asarray(done.returns).ravel()[flat])


def test_reset_zeroes_advantages_in_place_when_donated():
    t, n = 4, 2
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), random_rollout(np.random.default_rng(4), t, n), t, True)
    buf = buf.compute_gae(jnp.ones(n), 0.9, 0.8)
    where = (buf.advantages.unsafe_buffer_pointer(), buf.returns.unsafe_buffer_pointer())
    buf = jax.jit(RolloutBuffer.reset, donate_argnums=0)(buf)
    assert (buf.advantages.unsafe_buffer_pointer(), buf.returns.unsafe_buffer_pointer()) == where
    np.testing.assert_array_equal(np.asarray(buf.advantages), 0)


@settings(max_examples=25, deadline=None)
@given(
    ops=st.lists(st.sampled_from(["add", "add", "add", "reset"]), max_size=20),
    t=st.integers(1, 4),
)
def test_model_based_fill_level(ops, t):
    """Random add/reset sequences against a Python model of the fill level and overflow flag."""
    n = 2
    buf = RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n)
    add = jax.jit(RolloutBuffer.add)
    rows, overflowed, written = 0, False, {}
    for i, op in enumerate(ops):
        if op == "reset":
            buf, rows, overflowed = buf.reset(), 0, False
        else:
            buf = add(buf, make_step(i, n), reward=jnp.ones(n), value=jnp.ones(n), terminated=jnp.zeros(n, bool))
            if rows < t:
                written[rows], rows = i, rows + 1
            else:
                overflowed = True
        assert int(buf.size()) == rows * n and int(buf.step_index) == rows and bool(buf.overflowed) == overflowed
        assert bool(buf.is_full()) == (rows == t)
    for row, i in written.items():
        np.testing.assert_array_equal(np.asarray(buf.step["action"][row]), i * n + np.arange(n))


# ----------------------------------------------------------------------------------- errors
def _good(n=3):
    return dict(reward=jnp.ones(n), value=jnp.ones(n), terminated=jnp.zeros(n, bool))


@JIT
@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda s, k: ({**s, "obs": s["obs"].astype(jnp.float16)}, k), TypeError, r"step\['obs'\].*float32.*float16"),
        (lambda s, k: ({**s, "obs": s["obs"][:, :3]}, k), ValueError, r"step\['obs'\].*\(4,\)"),
        (lambda s, k: ({"obs": s["obs"], "action": s["action"]}, k), TypeError, r"missing leaves.*log_prob"),
        (lambda s, k: (jax.tree.map(lambda x: x[:2], s), k), ValueError, "num_envs=3"),
        (lambda s, k: (s, {**k, "reward": jnp.ones(3, jnp.float16)}), TypeError, "reward.*float32.*float16"),
        (lambda s, k: (s, {**k, "reward": 1.0}), (TypeError, ValueError), "reward"),  # jit: a traced ()
        (lambda s, k: (s, {**k, "value": jnp.ones(2)}), ValueError, r"value.*\(3,\)"),
        (lambda s, k: (s, {**k, "value": jnp.ones((3, 1))}), ValueError, "value"),
        (lambda s, k: (s, {**k, "terminated": jnp.zeros(3, jnp.int32)}), TypeError, "terminated.*bool.*int32"),
        (lambda s, k: (s, {**k, "truncated": jnp.zeros(3, bool)}), ValueError, "truncated: given without final_value"),
        (lambda s, k: (s, {**k, "final_value": jnp.zeros(3)}), ValueError, "final_value: given without truncated"),
        (lambda s, k: (s, {**k, "truncated": jnp.zeros(3), "final_value": jnp.zeros(3)}), TypeError, "truncated.*bool"),
        (lambda s, k: (s, {**k, "trainable": jnp.ones(3, jnp.float32)}), TypeError, "trainable.*bool"),
    ],
)
def test_add_errors_name_the_field(jit, mutate, exc, match):
    buf = RolloutBuffer.create(EXAMPLE, num_steps=2, num_envs=3)
    step, kw = mutate(make_step(0, 3), _good())
    with pytest.raises(exc, match=match):
        maybe_jit(RolloutBuffer.add, jit)(buf, step, **kw)


def test_add_rejects_float64_numpy_eagerly():
    """Eagerly nothing is cast (under jit, JAX itself canonicalises float64 arguments first)."""
    buf = RolloutBuffer.create(EXAMPLE, num_steps=2, num_envs=3)
    with pytest.raises(TypeError, match="reward.*float32.*float64"):
        buf.add(make_step(0, 3), **{**_good(), "reward": np.ones(3, np.float64)})


@JIT
def test_compute_gae_errors(jit):
    buf = RolloutBuffer.create(EXAMPLE, num_steps=2, num_envs=3)
    f = maybe_jit(RolloutBuffer.compute_gae, jit, static_argnames="method")
    with pytest.raises(ValueError, match=r"last_value.*\(3,\)"):
        f(buf, jnp.zeros(2), 0.9, 0.9)
    with pytest.raises(TypeError, match="last_value.*float32.*int32"):
        f(buf, jnp.zeros(3, jnp.int32), 0.9, 0.9)
    with pytest.raises(ValueError, match="method"):
        f(buf, jnp.zeros(3), 0.9, 0.9, method="bogus")


@pytest.mark.parametrize("m", [0, -2, 5, 7])
def test_num_minibatches_errors(m):
    buf = RolloutBuffer.create(EXAMPLE, num_steps=4, num_envs=3)  # 12 steps
    match = "expected a divisor of num_steps \\* num_envs = 4 \\* 3 = 12" if m > 0 else ">= 1"
    with pytest.raises(ValueError, match=match):
        buf.minibatches(jax.random.key(0), m)
    with pytest.raises(ValueError, match=match):
        jax.jit(RolloutBuffer.minibatches, static_argnums=2)(buf, jax.random.key(0), m)
    with pytest.raises(ValueError, match=match):
        buf.estimate_memory_pressure(m)
    with pytest.raises(ValueError, match="Python int"):
        buf.minibatches(jax.random.key(0), 2.0)


# ----------------------------------------------------------------------------------- GAE
@JIT
@pytest.mark.parametrize("method", ["scan", "associative"])
def test_compute_gae_equals_returns_gae_on_stored_arrays(jit, method):
    t, n = 16, 3
    data = random_rollout(np.random.default_rng(2), t, n, trainable_p=0.6)
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), data, t, jit)
    last_value = jnp.asarray(np.random.default_rng(3).normal(size=n), jnp.float32)
    f = maybe_jit(RolloutBuffer.compute_gae, jit, static_argnames="method")
    out = f(buf, last_value, 0.97, 0.9, method=method)
    adv, ret = returns.gae(
        buf.reward, buf.value, buf.terminated, buf.truncated, buf.final_value, last_value,
        gamma=0.97, gae_lambda=0.9, method=method,
    )
    np.testing.assert_allclose(np.asarray(out.advantages), np.asarray(adv), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.returns), np.asarray(ret), rtol=1e-6, atol=1e-6)
    assert np.isfinite(np.asarray(out.advantages)).all()  # NaN in unread final_value never leaks
    assert bool(out.has_advantages) and not bool(buf.has_advantages)
    # trainable does not enter GAE: non-trainable steps still carry real rewards and values
    all_trainable = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), {**data, "trainable": np.ones((t, n), bool)}, t, jit)
    np.testing.assert_array_equal(
        np.asarray(f(all_trainable, last_value, 0.97, 0.9, method=method).advantages), np.asarray(out.advantages)
    )
    # a later add invalidates the advantages flag
    assert not bool(fill(out.reset(), data, 1, jit).has_advantages)


def test_compute_gae_hand_checked():
    """The issue's hand-computed case (one env), through the buffer."""
    buf = RolloutBuffer.create(EXAMPLE, num_steps=5, num_envs=1)
    reward = [1.0] * 5
    value = [0.5, 0.6, 0.7, 0.8, 0.9]
    terminated = [0, 0, 0, 1, 0]
    truncated = [0, 1, 0, 0, 0]
    for t in range(5):
        buf = buf.add(
            make_step(t, 1),
            reward=jnp.full(1, reward[t], jnp.float32),
            value=jnp.full(1, value[t], jnp.float32),
            terminated=jnp.full(1, bool(terminated[t])),
            truncated=jnp.full(1, bool(truncated[t])),
            final_value=jnp.full(1, 2.0 if t == 1 else 123.0, jnp.float32),
        )
    buf = buf.compute_gae(jnp.ones(1, jnp.float32), gamma=0.9, gae_lambda=0.95)
    np.testing.assert_allclose(np.asarray(buf.advantages[:, 0]), [2.921, 2.2, 1.191, 0.2, 1.0], atol=1e-5)
    np.testing.assert_allclose(np.asarray(buf.returns[:, 0]), [3.421, 2.8, 1.891, 1.0, 1.9], atol=1e-5)


@JIT
@pytest.mark.parametrize("k", [0, 1, 5, 9])
def test_compute_gae_on_partial_buffer(jit, k):
    """k of T rows filled: equals gae on the first k rows (bootstrapping from last_value), zeros after."""
    t, n = 9, 2
    data = random_rollout(np.random.default_rng(4 + k), t, n, trainable_p=0.7)
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), data, k, jit)
    last_value = jnp.asarray([0.3, -1.2], jnp.float32)
    out = maybe_jit(RolloutBuffer.compute_gae, jit)(buf, last_value, 0.95, 0.7)
    adv, ret = np.asarray(out.advantages), np.asarray(out.returns)
    if k:
        ref_adv, ref_ret = returns.gae(
            *(jnp.asarray(data[f][:k]) for f in ("reward", "value", "terminated", "truncated", "final_value")),
            last_value, gamma=0.95, gae_lambda=0.7,
        )
        np.testing.assert_allclose(adv[:k], np.asarray(ref_adv), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ret[:k], np.asarray(ref_ret), rtol=1e-6, atol=1e-6)
    assert (adv[k:] == 0).all() and (ret[k:] == 0).all()
    mask = np.asarray(out.learn_mask())
    np.testing.assert_array_equal(mask[:k], data["trainable"][:k])
    assert not mask[k:].any()
    assert int(out.trainable_size()) == int(data["trainable"][:k].sum())


# ----------------------------------------------------------------------------------- minibatches
@JIT
@settings(max_examples=15, deadline=None)
@given(
    shape=st.sampled_from([(1, 1, 1), (4, 3, 2), (4, 3, 12), (5, 2, 5), (8, 4, 4), (6, 1, 3)]),
    seed=st.integers(0, 2**31 - 1),
)
def test_minibatches_is_a_permutation(jit, shape, seed):
    t, n, m = shape
    data = random_rollout(np.random.default_rng(seed), t, n, trainable_p=0.5)
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), data, t, jit=True)
    buf = jax.jit(RolloutBuffer.compute_gae)(buf, jnp.zeros(n), 0.99, 0.95)
    mb = maybe_jit(RolloutBuffer.minibatches, jit, static_argnums=2)(buf, jax.random.key(seed), m)
    assert isinstance(mb, RolloutMinibatch)
    assert mb.index.shape == (m, t * n // m) and mb.step["obs"].shape == (m, t * n // m, 4)
    index = np.asarray(mb.index).ravel()
    assert sorted(index.tolist()) == list(range(t * n))  # every (t, env) exactly once
    # every field is the stored value at that (t, env)
    tt, ee = index // n, index % n
    np.testing.assert_array_equal(np.asarray(mb.step["action"]).ravel(), index)
    np.testing.assert_array_equal(np.asarray(mb.step["obs"]).reshape(-1, 4)[:, 1], -index.astype(np.float32))
    for name in ("reward", "value", "terminated", "truncated", "advantages", "returns"):
        np.testing.assert_array_equal(np.asarray(getattr(mb, name)).ravel(), np.asarray(getattr(buf, name))[tt, ee])
    np.testing.assert_array_equal(np.asarray(mb.mask).ravel(), data["trainable"][tt, ee])
    assert int(np.asarray(mb.mask).sum()) == int(buf.trainable_size())


def test_minibatches_shuffle_differs_by_key_and_matches_gather():
    t, n = 8, 4
    data = random_rollout(np.random.default_rng(5), t, n)
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), data, t, jit=False).compute_gae(jnp.zeros(n), 0.9, 0.9)
    a = np.asarray(buf.minibatches(jax.random.key(0), 4).index)
    b = np.asarray(buf.minibatches(jax.random.key(1), 4).index)
    assert not np.array_equal(a, b)
    assert not np.array_equal(a.ravel(), np.arange(t * n))  # actually shuffled
    idx = buf.minibatch_indices(jax.random.key(0), 4)
    np.testing.assert_array_equal(np.asarray(idx), a)
    via_gather = buf.gather(idx[2])
    via_mb = jax.tree.map(lambda x: x[2], buf.minibatches(jax.random.key(0), 4))
    jax.tree.map(np.testing.assert_array_equal, via_gather, via_mb)


def test_minibatches_mask_excludes_unfilled_rows():
    t, n = 4, 2
    data = random_rollout(np.random.default_rng(6), t, n)
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), data, 2, jit=False).compute_gae(jnp.zeros(n), 0.9, 0.9)
    mb = buf.minibatches(jax.random.key(0), 2)
    index, mask = np.asarray(mb.index).ravel(), np.asarray(mb.mask).ravel()
    np.testing.assert_array_equal(mask, (index // n < 2) & data["trainable"][index // n, index % n])


def test_minibatches_scan_loss_drops_masked_steps():
    """A masked loss under lax.scan over minibatches sees exactly the trainable steps."""
    t, n = 6, 4
    data = random_rollout(np.random.default_rng(7), t, n, trainable_p=0.5)
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), data, t, jit=False)

    @jax.jit
    def masked_sum(buf, key):
        def body(acc, mb):
            return acc + jnp.sum(jnp.where(mb.mask, mb.reward, 0.0)), None

        return jax.lax.scan(body, jnp.float32(0), buf.minibatches(key, 3))[0]

    expected = data["reward"][data["trainable"]].sum()
    np.testing.assert_allclose(float(masked_sum(buf, jax.random.key(3))), expected, rtol=1e-5)


# ----------------------------------------------------------------------------------- vmap
@JIT
def test_vmap_equals_separate_buffers(jit):
    k, t, n = (3 if jit else 2), 3, 2
    datas = [random_rollout(np.random.default_rng(10 + i), t, n, trainable_p=0.7) for i in range(k)]
    last_values = jnp.asarray(np.random.default_rng(20).normal(size=(k, n)), jnp.float32)
    keys = jax.random.split(jax.random.key(9), k)

    def run(buf, data, last_value, key):
        for row in range(t):
            buf = buf.add(
                jax.tree.map(lambda x: x[row], data["step"]),
                **{f: data[f][row] for f in ("reward", "value", "terminated", "truncated", "final_value", "trainable")},
            )
        buf = buf.compute_gae(last_value, 0.99, 0.9)
        return buf, buf.minibatches(key, 3)

    def as_jnp(i):
        d = {f: jnp.asarray(v) for f, v in datas[i].items()}
        d["step"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[make_step(100 * i + r, n) for r in range(t)])
        return d

    stacked_data = jax.tree.map(lambda *xs: jnp.stack(xs), *[as_jnp(i) for i in range(k)])
    stacked = jax.vmap(lambda: RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), axis_size=k)()
    assert stacked.reward.shape == (k, t, n) and stacked.step_index.shape == (k,)
    v_buf, v_mb = maybe_jit(jax.vmap(run), jit)(stacked, stacked_data, last_values, keys)
    for i in range(k):
        s_buf, s_mb = maybe_jit(run, jit)(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), as_jnp(i), last_values[i], keys[i])
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a)[i], np.asarray(b)), v_buf, s_buf)
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a)[i], np.asarray(b)), v_mb, s_mb)
    # the buffers really differ (the test would pass trivially otherwise)
    assert not np.array_equal(np.asarray(v_buf.advantages[0]), np.asarray(v_buf.advantages[1]))
    # memory of a stacked buffer counts all k copies
    single = RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n)
    assert stacked.memory_bytes == k * single.memory_bytes
    assert stacked.estimate_memory_pressure(3).peak_bytes == k * single.estimate_memory_pressure(3).peak_bytes


# ----------------------------------------------------------------------------------- compile / scan
def test_add_compiles_once_and_runs_in_scan(compile_counter):
    t, n = 6, 2
    buf = RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n)
    add = jax.jit(RolloutBuffer.add, donate_argnums=0)
    kw = _good(n)
    buf = add(buf, make_step(0, n), **kw)
    with compile_counter() as count:
        for r in range(1, t + 1):
            buf = add(buf, make_step(r, n), **kw)
    assert count() == 0
    assert bool(buf.overflowed)

    @jax.jit
    def collect(buf):
        def body(buf, r):
            step = jax.tree.map(lambda x: x + r.astype(x.dtype), make_step(0, n))
            return buf.add(step, **kw), None

        return jax.lax.scan(body, buf.reset(), jnp.arange(t))[0]

    out = collect(buf)
    np.testing.assert_array_equal(np.asarray(out.step["action"]), np.arange(t)[:, None] + np.arange(n))
    assert bool(out.is_full()) and not bool(out.overflowed)


def test_eager_methods_compile_once_per_shape_and_equal_jitted(compile_counter):
    """Eager calls run one cached program each: after a first call per shape, more adds, a new
    gamma and new keys compile nothing; the results equal the same calls under jax.jit."""
    t, n = 4, 2
    data = random_rollout(np.random.default_rng(9), t, n)
    kw = lambda r: {k: jnp.asarray(v[r]) for k, v in data.items()}  # noqa: E731

    def run(buf, gamma, key, add, gae, mbs, idx, gather):
        for r in range(t):
            buf = add(buf, make_step(r, n), **kw(r))
        buf = gae(buf, jnp.ones(n), gamma, 0.9)
        return buf, buf.size(), mbs(buf, key, 2), gather(buf, idx(buf, key, 4)[1])

    eager = (RolloutBuffer.add, RolloutBuffer.compute_gae, RolloutBuffer.minibatches,
             RolloutBuffer.minibatch_indices, RolloutBuffer.gather)
    empty = RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n)
    run(empty, 0.9, jax.random.key(0), *eager)
    with compile_counter() as count:
        got = run(empty, 0.97, jax.random.key(1), *eager)
    assert count() == 0
    jitted = [jax.jit(RolloutBuffer.add), jax.jit(RolloutBuffer.compute_gae)]
    jitted += [jax.jit(f, static_argnums=2) for f in (RolloutBuffer.minibatches, RolloutBuffer.minibatch_indices)]
    want = run(empty, 0.97, jax.random.key(1), *jitted, jax.jit(RolloutBuffer.gather))
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert int(got[1]) == t * n  # size(): steps over all envs


# ----------------------------------------------------------------------------------- memory
def test_memory_pressure_hand_checked():
    t, n, m = 8, 4, 4
    buf = RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n)
    mp = buf.estimate_memory_pressure(m)
    assert isinstance(mp, RolloutMemoryPressure)
    # storage, by hand: obs 32 steps * 4 * 4 B = 512; action 128; log_prob 128;
    # float [T, N] fields 128 each (reward, value, final_value, advantages, returns);
    # bool fields 32 each (terminated, truncated, trainable); counters 4 + 1 + 1.
    fields = dict(mp.field_bytes)
    assert fields["step['obs']"] == 512 and fields["step['action']"] == 128 and fields["step['log_prob']"] == 128
    assert fields["reward"] == fields["advantages"] == fields["final_value"] == 128
    assert fields["terminated"] == fields["trainable"] == 32
    assert fields["counters (step_index, flags)"] == 6
    assert mp.storage_bytes == 512 + 128 + 128 + 5 * 128 + 3 * 32 + 6 == 1510 == buf.memory_bytes
    # one step in a minibatch: obs 16 + action 4 + log_prob 4 + 5 floats * 4 + terminated, truncated,
    # mask 1 each + index 4 = 51 B; a minibatch has 32 / 4 = 8 steps.
    assert mp.minibatch_size == 8
    assert mp.minibatch_bytes == 8 * 51 == 408
    assert mp.shuffled_bytes == 4 * 408
    assert mp.peak_bytes == 1510 + 1632 + 408
    assert mp.peak_bytes_gathered == 1510 + 32 * 4 + 408
    # the minibatch estimate matches what minibatches() actually returns
    mb = buf.compute_gae(jnp.zeros(n), 0.9, 0.9).minibatches(jax.random.key(0), m)
    from jaxbuffers._validate import tree_nbytes

    assert tree_nbytes(mb) == mp.shuffled_bytes
    text = str(mp)
    assert "step['obs']" in text and "1,510" in text and "3,550" in text and "peak" in text
    with pytest.raises(dataclasses_frozen_error()):
        mp.storage_bytes = 0  # type: ignore[misc]


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_memory_pressure_atari_scale_and_abstract():
    """Works on an abstract buffer (no allocation): 128 x 8 Atari stacks, uint8 obs."""
    example = {"obs": jax.ShapeDtypeStruct((84, 84, 4), jnp.uint8), "action": jax.ShapeDtypeStruct((), jnp.int32)}
    abstract = jax.eval_shape(lambda: RolloutBuffer.create(example, num_steps=128, num_envs=8))
    mp = abstract.estimate_memory_pressure(4)
    obs_bytes = 128 * 8 * 84 * 84 * 4
    assert dict(mp.field_bytes)["step['obs']"] == obs_bytes
    per_step = 84 * 84 * 4 + 4 + 5 * 4 + 3 + 4
    assert mp.minibatch_bytes == 256 * per_step
    assert mp.peak_bytes == mp.storage_bytes + 4 * 256 * per_step + 256 * per_step


def test_gather_saturates_wide_indices_and_rejects_floats():
    """gather clips out-of-range indices (documented); a numpy int64 2**32 + 3 used to wrap to 3
    and read step 3, and float indices were truncated silently."""
    t, n = 4, 2
    data = random_rollout(np.random.default_rng(6), t, n)
    buf = fill(RolloutBuffer.create(EXAMPLE, num_steps=t, num_envs=n), data, t, jit=False)
    out = buf.gather(np.array([2**32 + 3, -(2**31) - 1, 5]))
    np.testing.assert_array_equal(np.asarray(out.index), [t * n - 1, 0, 5])
    with pytest.raises(TypeError, match="indices: expected an integer dtype"):
        buf.gather(jnp.array([1.0, 2.0]))


def test_memory_pressure_minibatch_bytes_are_the_gathered_minibatchs_stacked_and_abstract():
    """minibatch_bytes comes from gather's own output, for one buffer, a stacked one and an abstract one."""
    example = {"obs": jnp.zeros(3, jnp.bfloat16), "flag": jnp.bool_(False)}
    buf = RolloutBuffer.create(example, num_steps=4, num_envs=2, float_dtype=jnp.bfloat16)
    mb = buf.gather(jnp.arange(4, dtype=jnp.int32))
    assert buf.estimate_memory_pressure(2).minibatch_bytes == sum(x.nbytes for x in jax.tree.leaves(mb))
    stack = jax.vmap(lambda _: RolloutBuffer.create(example, num_steps=4, num_envs=2, float_dtype=jnp.bfloat16), axis_size=3)(None)
    assert stack.estimate_memory_pressure(2).minibatch_bytes == 3 * buf.estimate_memory_pressure(2).minibatch_bytes
    abstract = jax.eval_shape(lambda: stack)
    assert abstract.estimate_memory_pressure(2) == stack.estimate_memory_pressure(2)
