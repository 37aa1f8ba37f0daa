"""Bad input to `TrajectoryBuffer` and `PrioritisedTrajectoryBuffer`: refused with an error naming the argument,
eagerly and under jit, the stored contents unchanged; the accepted values of the guide's table (out-of-range
positions) give exactly their result."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import (
    SETTINGS, bad_keys, bad_static_ints, bad_unit_scalars, corrupt, huge_indices, in_order, non_arrays, refused,
    refused_eager_and_jit, snapshot, wrong_dtype, wrong_shape,
)

E, L = 2, 6
STEP = {"obs": jnp.zeros((3,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}


def step(start: int = 0, t: int | None = None) -> dict:
    lead = (E,) if t is None else (E, t)
    i = start + np.arange(np.prod(lead)).reshape(lead)
    return {"obs": np.stack([i, -i, 2 * i], -1).astype(np.float32), "action": i.astype(np.int32), "reward": (i / 2).astype(np.float32)}


def fill(buf):
    done = np.array([[False, False, True, False], [False, True, False, False]])
    return buf.add(step(1, 4), terminated=done, truncated=~done & (np.arange(4) == 3), final_obs=step(100, 4)["obs"])


FILLED = {
    "uniform": fill(jb.TrajectoryBuffer.create(STEP, num_envs=E, length=L)),
    "prioritised": fill(jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=2)),
}
KIND = st.sampled_from(sorted(FILLED))
FLAGS = np.zeros(E, np.bool_)


@SETTINGS
@given(kind=KIND, bad=corrupt(step(), "step"))
def test_add_wrong_step(kind, bad):
    buf = FILLED[kind]
    refused_eager_and_jit(lambda b, s, f: b.add(s, terminated=f), (buf, bad[0], FLAGS), bad[1], state=buf)


@SETTINGS
@given(
    kind=KIND, which=st.sampled_from(["terminated", "truncated"]),
    bad=non_arrays() | wrong_shape((E,)).map(lambda s: np.zeros(s, np.bool_)) | wrong_dtype(np.bool_).map(lambda d: np.zeros(E, d)),
)
def test_add_wrong_flags(kind, which, bad):
    buf = FILLED[kind]
    if bad is None and which == "truncated":
        return  # truncated=None is the documented default
    args = {"terminated": FLAGS, "truncated": FLAGS, "final_obs": step()["obs"], which: bad}
    refused(lambda: buf.add(step(), **args), which, state=buf)
    if isinstance(bad, np.ndarray) and bad.dtype != object and bad.dtype.kind != "U":
        refused(lambda: jax.jit(lambda b, a: b.add(step(), **a))(buf, args), which, state=buf)


def test_a_list_is_told_the_dtype_of_its_field():
    """A Python list where an array belongs is told to become an array of that field's dtype (a flag: bool), not
    float32 whatever the field."""
    buf = FILLED["uniform"]
    err = refused(lambda: buf.add(step(), terminated=[False, False]), "terminated", state=buf, exc=(TypeError,))
    assert str(err).endswith("np.asarray(x, np.bool_)"), err


def test_a_number_flag_is_told_to_convert_itself():
    """Integer or float flags of the right shape are refused with the conversion that makes them flags."""
    buf = FILLED["uniform"]
    for bad in (np.zeros(E, np.int32), np.zeros(E, np.float32)):
        err = refused(lambda: buf.add(step(), terminated=bad), "terminated", state=buf, exc=(TypeError,))
        assert str(err).endswith("convert with .astype(bool))"), err


@SETTINGS
@given(
    kind=KIND,
    bad=non_arrays().filter(lambda v: v is not None) | wrong_shape((E, 3)).map(lambda s: np.zeros(s, np.float32))
    | wrong_dtype(np.float32).map(lambda d: np.zeros((E, 3), d)) | st.just(step()),
)
def test_add_wrong_final_obs(kind, bad):
    buf = FILLED[kind]
    refused(lambda: buf.add(step(), terminated=FLAGS, truncated=FLAGS, final_obs=bad), "final_obs", state=buf)


@SETTINGS
@given(kind=KIND, t=st.integers(L + 1, 3 * L))
def test_add_chunk_longer_than_length(kind, t):
    buf = FILLED[kind]
    refused(lambda: buf.add(step(0, t), terminated=np.zeros((E, t), bool)), "step", state=buf)


@SETTINGS
@given(kind=KIND, key=bad_keys(), gamma=bad_unit_scalars(), size=bad_static_ints())
def test_samplers_bad_arguments(kind, key, gamma, size):
    buf = FILLED[kind]
    k = jax.random.key(0)
    refused(lambda: buf.sample_sequences(key, 2, 2), "key", state=buf)
    refused(lambda: buf.sample_transitions(key, 2, n_step=1, gamma=0.9), "key", state=buf)
    refused(lambda: buf.sample_transitions(k, 2, n_step=1, gamma=gamma), "gamma", state=buf)
    refused(lambda: buf.sample_transitions(k, 2, n_step=1, gamma=None), "gamma", state=buf)
    refused(lambda: buf.sample_sequences(k, size, 2), "batch_size", state=buf)
    refused(lambda: buf.can_sample(size, 2), "batch_size", state=buf)
    if not (size is None and kind == "prioritised"):  # None: the default, window_length (- 1)
        refused(lambda: buf.sample_sequences(k, 2, size), "sequence_length", state=buf)
        refused(lambda: buf.sample_transitions(k, 2, n_step=size, gamma=0.9), "n_step", state=buf)
    too_long = L + 1 if kind == "uniform" else 3
    refused(lambda: buf.sample_sequences(k, 2, too_long), "sequence_length", state=buf)


@SETTINGS
@given(kind=KIND, bad=non_arrays(host_vector=True) | st.sampled_from([np.ones(2, np.float32), np.ones((2, 2), np.int32), np.int32(1), np.ones(2, np.bool_)]))
def test_position_reads_bad_indices(kind, bad):
    buf = FILLED[kind]
    calls = [lambda: buf.final_obs_at(bad, 2)]
    if kind == "uniform":
        calls += [lambda: buf.sequences_at(bad, 2), lambda: buf.transitions_at(bad, n_step=1, gamma=0.5), lambda: buf.valid_starts(bad, 2)]
    elif not (type(bad) is int or isinstance(bad, (np.ndarray, np.generic)) and bad.dtype.kind == "i"):  # any shape of ints is valid there
        calls += [lambda: buf.priorities(bad), lambda: buf.generations_at(bad)]
    for call in calls:
        refused(call, "indices", state=buf)


@SETTINGS
@given(kind=KIND, idx=huge_indices())
def test_out_of_range_positions_are_clamped(kind, idx):
    """The table: reads clamp positions into [0, num_envs * length); validity and priority queries say invalid."""
    value, ints = idx
    buf = FILLED[kind]
    n = E * L
    clamped = np.clip(np.array([min(max(i, -1), n) for i in ints]), 0, n - 1).astype(np.int32)
    inside = np.array([0 <= i < n for i in ints])
    assert snapshot(buf.final_obs_at(value, 2)) == snapshot(buf.final_obs_at(clamped, 2))
    if kind == "uniform":
        assert snapshot(buf.sequences_at(value, 2)) == snapshot(buf.sequences_at(clamped, 2))
        assert snapshot(buf.transitions_at(value, n_step=1, gamma=0.5)) == snapshot(buf.transitions_at(clamped, n_step=1, gamma=0.5))
        np.testing.assert_array_equal(buf.valid_starts(value, 2), np.asarray(buf.valid_starts(clamped, 2)) & inside)
    else:
        np.testing.assert_array_equal(buf.priorities(value), np.where(inside, buf.priorities(clamped), 0))
        np.testing.assert_array_equal(buf.generations_at(value), buf.generations_at(clamped))


@SETTINGS
@given(which=st.sampled_from(["indices", "priorities", "generations"]), bad=non_arrays(host_vector=True) | st.sampled_from([np.ones(3, np.int32), np.ones(2, np.bool_)]))
def test_set_priorities_bad_argument(which, bad):
    buf = FILLED["prioritised"]
    args = {"indices": np.array([0, 1], np.int32), "priorities": np.ones(2, np.float32), "generations": np.zeros(2, np.int32)}
    args[which] = bad
    refused(lambda: buf.set_priorities(**args), (which, "priorities", "generations") if which == "indices" else which, state=buf)


@SETTINGS
@given(
    size=bad_static_ints(), example=non_arrays().filter(lambda v: not isinstance(v, (dict, jax.ShapeDtypeStruct))),
    key=st.sampled_from([None, 1, ("obs",), b"obs"]), alpha=bad_unit_scalars().filter(lambda a: not hasattr(a, "shape")),
)
def test_create_bad_arguments(size, example, key, alpha):
    for cls, extra in ((jb.TrajectoryBuffer, {}), (jb.PrioritisedTrajectoryBuffer, {"window_length": 2})):
        refused(lambda: cls.create(STEP, num_envs=size, length=L, **extra), "num_envs")
        refused(lambda: cls.create(STEP, num_envs=E, length=size, **extra), "length")
        refused(lambda: cls.create({**STEP, "obs": example}, num_envs=E, length=L, **extra), "example_step")
        refused(lambda: cls.create(STEP, num_envs=E, length=L, obs_key=key, **extra), "obs_key")
        if size is not None:  # None: the default, length
            refused(lambda: cls.create(STEP, num_envs=E, length=L, final_obs_capacity=size, **extra), "final_obs_capacity")
    refused(lambda: jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=size), "window_length")
    refused(lambda: jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=2, priority_exponent=alpha), "priority_exponent")


@SETTINGS
@given(ops=st.lists(st.sampled_from(["add", "bad_step", "bad_flags", "bad_final", "bad_set"]), min_size=1, max_size=8))
def test_refused_calls_in_any_order_change_nothing(ops):
    buf = in_order(ops, FILLED["prioritised"], {"add": lambda b, n: b.add(step(10 * n), terminated=FLAGS)}, {
        "bad_step": (lambda b: b.add({**step(), "reward": np.zeros(E, np.int32)}, terminated=FLAGS), "step['reward']"),
        "bad_flags": (lambda b: b.add(step(), terminated=np.zeros(E, np.int32)), "terminated"),
        "bad_final": (lambda b: b.add(step(), terminated=FLAGS, truncated=FLAGS), "final_obs"),
        "bad_set": (lambda b: b.set_priorities(jnp.array([0]), jnp.array([1], jnp.int32), jnp.array([0])), "priorities"),
    })
    buf.sample_sequences(jax.random.key(0), 3)
