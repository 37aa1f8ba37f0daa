"""Tests of jaxbuffers._compiled.method: eager calls as one cached compiled program."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuffers import PrioritisedReplayBuffer, ReplayBuffer, RolloutBuffer, TrajectoryBuffer, _compiled, _validate
from jaxbuffers.episode import BufferFullError

ITEM = {"obs": jnp.zeros((2,), jnp.float32)}


@_compiled.method("n", scalars={"beta": (0.0, math.inf)})
def scaled(x, n, *, beta=1.0):
    """A toy method: `x * beta` repeated `n` times, with the library's own checks."""
    x = _validate.vector("x", x, None, "floating")
    return jnp.tile(x * beta, n)


def test_eager_equals_jitted_and_compiles_once_per_shape(compile_counter):
    x = jnp.arange(3.0)
    reference = jax.jit(scaled.uncompiled, static_argnums=1)
    want = [reference(x, 2, beta=beta) for beta in (0.1, 0.2, 0.3)]
    with compile_counter() as n:
        for beta, w in zip((0.1, 0.2, 0.3), want):  # a traced scalar: no recompile
            np.testing.assert_array_equal(scaled(x, 2, beta=beta), w)
    assert n() == 0
    x4 = jnp.arange(4.0)
    with compile_counter() as n:
        scaled(x, 3, beta=0.5), scaled(x4, 2, beta=0.5)  # a new static value, a new shape
        scaled(x, 3, beta=0.7), scaled(x4, 2, beta=0.7)
    assert n() == 2


def test_concrete_bad_scalar_raises_naming_it():
    for bad, err in ((-1.0, ValueError), (math.nan, ValueError), ("0.4", TypeError), (True, TypeError)):
        with pytest.raises(err, match="beta"):
            scaled(jnp.arange(3.0), 1, beta=bad)
    # a traced beta is not range-checked (its value is unknown)
    assert jax.jit(lambda b: scaled(jnp.ones(2), 1, beta=b))(-1.0).tolist() == [-1.0, -1.0]


def test_what_a_program_cannot_take_gets_the_library_error():
    with pytest.raises(TypeError, match="x: expected a floating array of shape"):
        scaled("abc", 1)
    with pytest.raises(ValueError, match="batch_size"):
        PrioritisedReplayBuffer.create(ITEM, 8).sample(jax.random.key(0), [4])  # unhashable static
    for bad in (np.float64(4.0), np.float32(2.5)):  # a numpy float for a static size is named as given, not as a tracer
        with pytest.raises(ValueError, match=rf"batch_size: expected a Python int >= 1, got {re.escape(repr(bad))}"):
            PrioritisedReplayBuffer.create(ITEM, 8).sample(jax.random.key(0), bad)
    buf = PrioritisedReplayBuffer.create(ITEM, 8).add({"obs": jnp.ones((3, 2))})
    with pytest.raises(TypeError, match=r"batch\['obs'\]: expected dtype float32, got float64"):
        buf.add({"obs": np.ones((1, 2))})  # narrowed at a jit boundary, the dtype check would pass
    before = np.concatenate(buf.tree.levels)
    out = buf.set_priorities(np.array([2**32 + 1]), jnp.ones(1), jnp.zeros(1, jnp.int32))  # not wrapped to slot 1
    np.testing.assert_array_equal(np.concatenate(out.tree.levels), before)


def test_works_inside_jit_scan_and_vmap():
    buf = PrioritisedReplayBuffer.create(ITEM, 16)

    def step(b, k):
        b = b.add({"obs": jnp.ones((2, 2))})
        return b, b.sample(k, 4, beta=0.5).indices

    keys = jax.random.split(jax.random.key(0), 5)
    out, idx = jax.jit(lambda b: jax.lax.scan(step, b, keys))(buf)
    assert int(out.size()) == 10 and idx.shape == (5, 4)
    bufs = jax.vmap(lambda _: buf)(jnp.arange(3))
    bufs = jax.vmap(lambda b: b.add({"obs": jnp.ones((1, 2))}))(bufs)
    np.testing.assert_array_equal(jax.vmap(lambda b: b.can_sample(1))(bufs), [True] * 3)
    eager = buf.add({"obs": jnp.ones((2, 2))}).sample(keys[0], 4, beta=0.5)
    jitted = jax.jit(lambda b: b.add({"obs": jnp.ones((2, 2))}).sample(keys[0], 4, beta=0.5))(buf)
    jax.tree.map(np.testing.assert_array_equal, eager, jitted)


def test_eager_calls_compile_once_however_their_arguments_are_spelt(compile_counter):
    """By position or keyword, an optional argument left out or given as its default, a static one as a numpy
    scalar: one cached program each."""
    traj = TrajectoryBuffer.create({"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0)}, num_envs=2, length=4)
    step = {"obs": jnp.ones((2, 2)), "action": jnp.zeros(2, jnp.int32), "reward": jnp.zeros(2)}
    term = jnp.zeros(2, bool)
    replay = ReplayBuffer.create(ITEM, 8).add({"obs": jnp.ones((3, 2))})
    key = jax.random.key(0)
    roll = RolloutBuffer.create({"obs": jnp.zeros(2)}, num_envs=2, num_steps=2)
    zeros = jnp.zeros(2)
    roll = roll.add({"obs": jnp.ones((2, 2))}, reward=zeros, value=zeros, terminated=term)
    roll = roll.add({"obs": jnp.ones((2, 2))}, reward=zeros, value=zeros, terminated=term)
    done = roll.compute_gae(zeros, 0.9, 0.8)
    spellings = {
        "TrajectoryBuffer.add": [lambda: traj.add(step, terminated=term), lambda: traj.add(step, terminated=term, truncated=None),
         lambda: traj.add(step, final_obs=None, terminated=term, truncated=None), lambda: traj.add(step=step, terminated=term)],
        "TrajectoryBuffer.can_sample": [lambda: traj.can_sample(2, 2), lambda: traj.can_sample(2, sequence_length=2, period=1),
         lambda: traj.can_sample(cross_episodes=True, batch_size=2, sequence_length=2)],
        "ReplayBuffer.sample": [lambda: replay.sample(key, 4), lambda: replay.sample(key, batch_size=4), lambda: replay.sample(key=key, batch_size=4)],
        "ReplayBuffer.can_sample": [lambda: replay.can_sample(), lambda: replay.can_sample(1), lambda: replay.can_sample(batch_size=1)],
        "RolloutBuffer.compute_gae": [lambda: roll.compute_gae(zeros, 0.9, 0.8), lambda: roll.compute_gae(zeros, gamma=0.9, gae_lambda=0.8),
         lambda: roll.compute_gae(last_value=zeros, gae_lambda=0.8, gamma=0.9, method="scan")],
        "RolloutBuffer.minibatches": [lambda: done.minibatches(key, 2), lambda: done.minibatches(key, num_minibatches=2), lambda: done.minibatches(key=key, num_minibatches=2)],
    }
    # a static size or flag given as a numpy scalar is the program of the equal Python value
    spellings["ReplayBuffer.sample"] += [lambda: replay.sample(key, np.int64(4)), lambda: replay.sample(key, batch_size=np.uint8(4))]
    spellings["TrajectoryBuffer.can_sample"] += [lambda: traj.can_sample(np.int32(2), np.int64(2), cross_episodes=np.bool_(True))]
    spellings["TrajectoryBuffer.can_sample_transitions"] = [lambda: traj.can_sample_transitions(2, n_step=3),
                                                            lambda: traj.can_sample_transitions(np.int64(2), n_step=np.int64(3))]
    spellings["RolloutBuffer.minibatches"] += [lambda: done.minibatches(key, np.int16(2))]
    recompiles = {}
    for name, (first, *others) in spellings.items():
        jax.block_until_ready(first())  # compiles the program
        with compile_counter() as n:
            jax.block_until_ready([call() for call in others])
        recompiles[name] = n()
    assert recompiles == dict.fromkeys(spellings, 0)


def test_arguments_it_does_not_take_get_pythons_error_naming_the_method():
    buf = ReplayBuffer.create(ITEM, 8)
    with pytest.raises(TypeError, match=r"sample\(\) got an unexpected keyword argument 'size'"):
        buf.sample(jax.random.key(0), size=4)
    with pytest.raises(TypeError, match=r"sample\(\) missing 1 required positional argument: 'batch_size'"):
        buf.sample(jax.random.key(0))
    with pytest.raises(TypeError, match=r"can_sample\(\) got multiple values for argument 'batch_size'"):
        buf.can_sample(1, batch_size=1)


def test_host_int_reads_a_remembered_value_only_for_that_array():
    x, other = jnp.int32(4), jnp.int32(4)
    _compiled.remember_int(x, 7)  # not its value: shows which one is read
    assert _compiled.host_int(x) == 7
    assert _compiled.host_int(other) == 4  # an equal array it was not told about: read from the device
    key = id(x)
    del x
    assert key not in _compiled._HOST_INTS  # forgotten with the array


def test_eager_rollout_adds_track_the_cursor_on_the_host_and_still_refuse_a_full_buffer():
    buf = RolloutBuffer.create(ITEM, num_steps=3, num_envs=2)
    zeros, no = jnp.zeros(2), jnp.zeros(2, bool)
    for t in range(1, 4):
        buf = buf.add({"obs": jnp.zeros((2, 2))}, reward=zeros, value=zeros, terminated=no)
        assert _compiled.host_int(buf.step_index) == int(np.asarray(buf.step_index)) == t
    with pytest.raises(BufferFullError, match=r"step_index=3 of num_steps=3"):
        buf.add({"obs": jnp.zeros((2, 2))}, reward=zeros, value=zeros, terminated=no)


@pytest.mark.parametrize("cached", [True, False])
def test_a_donated_buffer_gets_one_runtime_error_naming_it(cached, capfd):
    """Reading a buffer whose arrays were donated raises the same RuntimeError naming its class, whether the method's
    program is already compiled or not (XLA's own errors differ between the two and log to stderr)."""
    if cached:  # a buffer of the same shapes compiles the programs first
        other = ReplayBuffer.create(ITEM, capacity=5)
        other.size(), other.can_sample(1), other.sample(jax.random.key(0), 2)
    b0 = ReplayBuffer.create(ITEM, capacity=5)
    b1 = jax.jit(ReplayBuffer.add, donate_argnums=0)(b0, {"obs": jnp.ones((2, 2))})
    capfd.readouterr()
    for read in (b0.size, lambda: b0.can_sample(1), lambda: b0.sample(jax.random.key(0), 2)):
        with pytest.raises(RuntimeError, match=r"ReplayBuffer\.\w+: the ReplayBuffer given holds arrays that were donated"):
            read()
    assert "INVALID_ARGUMENT" not in capfd.readouterr().err
    assert int(b1.size()) == 2  # the state the donating call returned reads as before
    x = jnp.arange(3.0)
    x.delete()
    with pytest.raises(RuntimeError, match="scaled: an array given was donated"):
        scaled(x, 2)
