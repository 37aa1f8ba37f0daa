"""Bad input to `RolloutBuffer`: refused with an error naming the argument, eagerly and under jit, the stored
contents unchanged; the accepted values of the guide's table (out-of-range indices) give exactly their result."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import (
    SETTINGS, bad_keys, bad_static_ints, bad_unit_scalars, corrupt, huge_indices, in_order, non_arrays, refused,
    refused_eager_and_jit, snapshot, wrong_dtype, wrong_shape,
)

N, T = 2, 4
EXAMPLE = {"obs": jnp.zeros((3,), jnp.float32), "action": jnp.int32(0)}


def step(start: int = 0) -> dict:
    i = start + np.arange(N)
    return {"obs": np.stack([i, -i, 2 * i], 1).astype(np.float32), "action": i.astype(np.int32)}


def fields(start: int = 0) -> dict:
    r = (start + np.arange(N)).astype(np.float32)
    return {"reward": r, "value": -r, "terminated": np.array([False, True]), "truncated": np.array([True, False]), "final_value": r + 1,
            "trainable": np.array([True, False])}


BUF = jb.RolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=T)
for _t in range(3):
    BUF = BUF.add(step(_t), **fields(_t))
BUF = BUF.compute_gae(np.ones(N, np.float32), 0.9, 0.8)
FIELD = st.sampled_from(sorted(fields()))


@SETTINGS
@given(bad=corrupt(step(), "step"))
def test_add_wrong_step(bad):
    refused_eager_and_jit(lambda b, s, f: b.add(s, **f), (BUF, bad[0], fields()), bad[1], state=BUF)


@SETTINGS
@given(
    name=FIELD,
    bad=non_arrays() | wrong_shape((N,)).map(lambda s: np.zeros(s, np.float32)) | st.sampled_from([np.uint8, np.int32, np.float16, np.bool_, np.float32]),
)
def test_add_wrong_field(name, bad):
    f = fields()
    if isinstance(bad, type):  # a dtype: wrong for this field unless it is the field's own
        if np.dtype(bad) == f[name].dtype:
            return
        bad = np.zeros(N, bad)
    if bad is None and name in ("truncated", "final_value", "trainable"):
        return  # optional: None is the default (truncated and final_value only together, tested below)
    refused_eager_and_jit(lambda b, s, a: b.add(s, **a), (BUF, step(), {**f, name: bad}), name, state=BUF)


@SETTINGS
@given(which=st.sampled_from(["truncated", "final_value"]))
def test_add_truncated_without_final_value(which):
    f = fields()
    del f[which]
    refused(lambda: BUF.add(step(), **f), which, state=BUF)


@SETTINGS
@given(last=non_arrays() | wrong_shape((N,)).map(lambda s: np.zeros(s, np.float32)) | wrong_dtype(np.float32).map(lambda d: np.zeros(N, d)),
       gamma=bad_unit_scalars(), method=st.sampled_from([None, "Scan", 1, ["scan"], b"scan"]))
def test_compute_gae_bad_arguments(last, gamma, method):
    ok = np.zeros(N, np.float32)
    refused(lambda: BUF.compute_gae(last, 0.9, 0.9), "last_value", state=BUF)
    refused(lambda: BUF.compute_gae(ok, gamma, 0.9), "gamma", state=BUF)
    refused(lambda: BUF.compute_gae(ok, 0.9, gamma), "gae_lambda", state=BUF)
    refused(lambda: BUF.compute_gae(ok, 0.9, 0.9, method=method), "method", state=BUF)


@SETTINGS
@given(key=bad_keys(), m=bad_static_ints() | st.sampled_from([3, 5, 7]))
def test_minibatches_bad_arguments(key, m):
    refused(lambda: BUF.minibatches(key, 2), "key", state=BUF)
    refused(lambda: BUF.minibatch_indices(key, 2), "key", state=BUF)
    refused(lambda: BUF.minibatches(jax.random.key(0), m), "num_minibatches", state=BUF)
    refused(lambda: BUF.estimate_memory_pressure(m), "num_minibatches", state=BUF)


@SETTINGS
@given(bad=non_arrays(host_vector=True).filter(lambda v: type(v) is not int) | st.sampled_from([np.ones(2, np.float32), np.ones(2, np.bool_)]))
def test_gather_bad_indices(bad):
    refused(lambda: BUF.gather(bad), "indices", state=BUF)


@SETTINGS
@given(idx=huge_indices())
@example(idx=([0, 2**63], [0, 2**63]))  # numpy alone reads this list as float64
def test_gather_clamps_out_of_range_indices(idx):
    value, ints = idx
    clamped = np.clip(np.array([min(max(i, -1), N * T) for i in ints]), 0, N * T - 1).astype(np.int32)
    assert snapshot(BUF.gather(value)) == snapshot(BUF.gather(clamped))


@SETTINGS
@given(
    size=bad_static_ints(), example=non_arrays().filter(lambda v: not isinstance(v, (dict, jax.ShapeDtypeStruct))),
    dtype=st.sampled_from([None, "nope", np.int32, np.bool_, np.float64, "float64", object, jnp.uint8]),
)
def test_create_bad_arguments(size, example, dtype):
    refused(lambda: jb.RolloutBuffer.create(EXAMPLE, num_envs=size, num_steps=T), "num_envs")
    refused(lambda: jb.RolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=size), "num_steps")
    refused(lambda: jb.RolloutBuffer.create({"x": example}, num_envs=N, num_steps=T), "example_step")
    refused(lambda: jb.RolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=T, float_dtype=dtype), "float_dtype")


def test_float64_honoured_with_x64():
    """float64 is refused with x64 off (above) and stored as float64 with it on: never narrowed silently."""
    with jax.enable_x64(True):
        buf = jb.RolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=T, float_dtype=jnp.float64)
        f = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in fields().items()}
        buf = buf.add(step(), **f).compute_gae(np.ones(N), 0.9, 0.9)
        assert buf.reward.dtype == buf.advantages.dtype == np.float64
        with pytest.raises(TypeError, match="reward: expected dtype float64, got float32"):
            buf.add(step(), **fields())


@SETTINGS
@given(ops=st.lists(st.sampled_from(["add", "bad_add", "bad_gae", "gae", "reset"]), min_size=1, max_size=8))
@example(ops=["add"] * 5 + ["bad_add", "add"])  # past full: the bad argument named first, then BufferFullError
def test_refused_calls_in_any_order_change_nothing(ops):
    def add(b, n):  # an eager add on a full buffer raises BufferFullError and changes nothing
        if int(b.step_index) < T:
            return b.add(step(n), **fields(n))
        with pytest.raises(jb.BufferFullError):
            b.add(step(n), **fields(n))
        return b

    valid = {
        "add": add, "gae": lambda b, n: b.compute_gae(np.ones(N, np.float32), 0.9, 0.9),
        "reset": lambda b, n: b.reset(),
    }
    buf = in_order(ops, jb.RolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=T), valid, {
        "bad_add": (lambda b: b.add(step(), **{**fields(), "reward": np.zeros(N, np.float64)}), "reward"),
        "bad_gae": (lambda b: b.compute_gae(np.ones(N, np.float32), 0.9, 2.0), "gae_lambda"),
    })
    buf.compute_gae(np.ones(N, np.float32), 0.9, 0.9).minibatches(jax.random.key(0), 2)
