"""jaxbuffers._random: the samplers' draws equal jax.random's bit for bit (fast path and fallbacks)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuffers import _random

KEYS = [jax.random.key(0), jax.random.key(123), jax.random.PRNGKey(7), jax.random.key(2**31 - 1)]
MAXVALS = [1, 2, 7, 255, 65536, 65537, 100_003, 2**24 + 3, 2**31 - 1, 0, -5]


@pytest.mark.parametrize("key", KEYS, ids=lambda k: str(np.asarray(jax.random.key_data(k)).tolist()))
@pytest.mark.parametrize("shape", [(1,), (7,), (256,), (3, 5)])
def test_randint_equals_jax(key, shape):
    jitted = jax.jit(lambda k, v: _random.randint(k, shape, v))  # traced maxval, one compile per shape
    for m in MAXVALS:
        want = np.asarray(jax.random.randint(key, shape, 0, m, dtype=jnp.int32))
        np.testing.assert_array_equal(np.asarray(_random.randint(key, shape, m)), want, err_msg=f"maxval={m}")
        got = jitted(key, jnp.int32(m))
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"jit maxval={m}")


@pytest.mark.parametrize("key", KEYS, ids=lambda k: str(np.asarray(jax.random.key_data(k)).tolist()))
@pytest.mark.parametrize("shape", [(1,), (9,), (256,), (4, 6)])
def test_uniform_equals_jax(key, shape):
    want = np.asarray(jax.random.uniform(key, shape, jnp.float32))
    np.testing.assert_array_equal(np.asarray(_random.uniform(key, shape)), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda k: _random.uniform(k, shape))(key)), want)
    assert want.min() >= 0 and want.max() < 1


def test_vmap_over_keys():
    ks = jax.random.split(jax.random.key(5), 6)
    np.testing.assert_array_equal(
        jax.vmap(lambda k: _random.randint(k, (11,), 1000))(ks), jax.vmap(lambda k: jax.random.randint(k, (11,), 0, 1000))(ks)
    )
    np.testing.assert_array_equal(jax.vmap(lambda k: _random.uniform(k, (11,)))(ks), jax.vmap(lambda k: jax.random.uniform(k, (11,)))(ks))


def test_fast_path_is_one_fused_kernel():
    """The point of the module: no while loop (JAX's rolled CPU lowering) in the compiled draw."""
    hlo = jax.jit(lambda k: _random.uniform(k, (256,))).lower(jax.random.key(0)).compile().as_text()
    assert " while(" not in hlo
    # (JAX 0.10's own CPU lowering of the same draw is a rolled while loop; if a later JAX unrolls
    # it on CPU too, this module can go.)


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_other_key_impls_fall_back_to_jax(impl):
    key = jax.random.key(3, impl=impl)
    np.testing.assert_array_equal(_random.randint(key, (20,), 97), jax.random.randint(key, (20,), 0, 97, dtype=jnp.int32))
    np.testing.assert_array_equal(_random.uniform(key, (20,)), jax.random.uniform(key, (20,)))
    assert _random._threefry_words(key) is None


def test_non_partitionable_setting_falls_back_to_jax():
    key = jax.random.key(4)
    with jax.threefry_partitionable(False):
        assert _random._threefry_words(key) is None
        np.testing.assert_array_equal(_random.uniform(key, (16,)), jax.random.uniform(key, (16,)))
        np.testing.assert_array_equal(_random.randint(key, (16,), 50), jax.random.randint(key, (16,), 0, 50, dtype=jnp.int32))


def test_float64_uniform_falls_back_to_jax():
    key = jax.random.key(8)
    np.testing.assert_array_equal(_random.uniform(key, (5,), jnp.bfloat16), jax.random.uniform(key, (5,), jnp.bfloat16))


def test_threefry_known_answer():
    """Random123's known-answer vector for Threefry-2x32-20 (key and counter all ones)."""
    ones = jnp.uint32(0xFFFFFFFF)
    x1, x2 = _random.threefry2x32(ones, ones, jnp.full((1,), ones), jnp.full((1,), ones))
    assert (int(x1[0]), int(x2[0])) == (0x1CB996FC, 0xBB002BE7)


@pytest.mark.parametrize("key", KEYS[:2], ids=lambda k: str(np.asarray(jax.random.key_data(k)).tolist()))
def test_uniform_pair_is_the_two_threefry_words(key):
    """``uniform_pair``: one Threefry evaluation per element, its first word for the first array and
    its second for the second (``uniform`` XORs them: ``a ^ b`` of the same bits), in [0, 1), the
    same under jit and vmap; and the two are not the same draw."""
    u, v = _random.uniform_pair(key, (4096,))
    words = _random._threefry_words(key)
    lo = jnp.arange(4096, dtype=jnp.uint32)
    b1, b2 = _random.threefry2x32(words[0], words[1], jnp.zeros_like(lo), lo)
    np.testing.assert_array_equal(np.asarray(u), np.asarray(_random._to_unit(b1)))
    np.testing.assert_array_equal(np.asarray(v), np.asarray(_random._to_unit(b2)))
    np.testing.assert_array_equal(np.asarray(_random._to_unit(b1 ^ b2)), np.asarray(jax.random.uniform(key, (4096,))))
    ju, jv = jax.jit(lambda k: _random.uniform_pair(k, (4096,)))(key)
    np.testing.assert_array_equal(np.asarray(ju), np.asarray(u))
    np.testing.assert_array_equal(np.asarray(jv), np.asarray(v))
    for x in (u, v):
        assert float(x.min()) >= 0 and float(x.max()) < 1 and abs(float(x.mean()) - 0.5) < 0.02
    assert abs(np.corrcoef(np.asarray(u), np.asarray(v))[0, 1]) < 0.05
    vu, vv = jax.vmap(lambda k: _random.uniform_pair(k, (7,)))(jax.random.split(key, 3))
    np.testing.assert_array_equal(np.asarray(vu[1]), np.asarray(_random.uniform_pair(jax.random.split(key, 3)[1], (7,))[0]))
    np.testing.assert_array_equal(np.asarray(vv[2]), np.asarray(_random.uniform_pair(jax.random.split(key, 3)[2], (7,))[1]))


def test_uniform_pair_other_keys_fall_back_to_jax():
    key = jax.random.key(3, impl="rbg")
    u, v = _random.uniform_pair(key, (5,))
    want = jax.random.uniform(key, (2, 5))
    np.testing.assert_array_equal(np.asarray(u), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(v), np.asarray(want[1]))
