"""Tests of jaxbuffers._compiled.method: eager calls as one cached compiled program."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuffers import PrioritisedReplayBuffer, _compiled, _validate

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
