"""The random draws of every sampler: ``jax.random.randint`` / ``uniform``, bit for bit, cheaper on CPU.

JAX lowers its Threefry-2x32 hash on the CPU backend as a rolled 5-iteration ``while`` loop (a
compile-time saving). XLA:CPU runs every iteration of that loop as separate executor steps, so
each ``jax.random`` call inside a jitted sample costs ~15-20 us on this machine whatever the batch
size, and ``randint`` makes three of them (a key split and two draws): ~30-50 us of a ~60-100 us
uniform sample. Here the same hash is written out unrolled (the form JAX itself emits on GPU and
TPU), which XLA fuses into one elementwise kernel.

The results are **identical** to ``jax.random.randint(key, shape, 0, maxval, jnp.int32)`` and
``jax.random.uniform(key, shape, jnp.float32)`` (tested bit for bit, under ``jit`` and ``vmap``).
The fast path is taken only for what it reproduces exactly: Threefry-2x32 keys (typed keys of that
implementation, or raw ``uint32[2]`` keys while it is JAX's default) with JAX's default
``jax_threefry_partitionable=True``. Any other key or setting is passed to ``jax.random``
unchanged. ``uniform_pair`` (the sum tree's two-stage draw) is the one exception: two uniforms
from the two output words of one evaluation, which ``jax.random`` does not offer.

Threefry-2x32 with 20 rounds: J. K. Salmon, M. A. Moraes, R. O. Dror, D. E. Shaw, "Parallel random
numbers: as easy as 1, 2, 3", SC 2011 (Random123). Counters and key derivation follow JAX's
partitionable layout (64-bit counter = flat index, high word first; split = draw of 2 counters).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)  # Threefish key-schedule constant


def _rotl(x: jax.Array, r: int) -> jax.Array:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k1: jax.Array, k2: jax.Array, x1: jax.Array, x2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32-20 of counter pairs ``(x1, x2)`` (uint32, same shape) under key ``(k1, k2)`` (uint32 scalars)."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x1 = x1 + ks[0]
    x2 = x2 + ks[1]
    for i in range(5):  # 5 groups of 4 rounds, key injection after each group
        for r in _ROTATIONS[i % 2]:
            x1 = x1 + x2
            x2 = _rotl(x2, r) ^ x1
        x1 = x1 + ks[(i + 1) % 3]
        x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


def _threefry_words(key) -> tuple[jax.Array, jax.Array] | None:
    """``(k1, k2)`` when ``key`` is a Threefry-2x32 key this module reproduces exactly, else None."""
    if not jax.config.jax_threefry_partitionable:
        return None
    key = jnp.asarray(key) if not hasattr(key, "dtype") else key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if str(jax.random.key_impl(key)) != "threefry2x32" or key.shape != ():
            return None
        data = jax.random.key_data(key)
    elif key.dtype == jnp.uint32 and key.shape == (2,) and jax.config.jax_default_prng_impl == "threefry2x32":
        data = key
    else:
        return None
    return data[0], data[1]


def _bits(words, shape: tuple[int, ...]) -> jax.Array:
    """uint32 ``shape``: ``jax.random.bits(key, shape, jnp.uint32)`` for a Threefry key's words."""
    n = math.prod(shape)
    lo = jnp.arange(n, dtype=jnp.uint32).reshape(shape)
    b1, b2 = threefry2x32(words[0], words[1], jnp.zeros_like(lo), lo)
    return b1 ^ b2


def _split2(words):
    """The two child keys' words of ``jax.random.split(key)`` (partitionable layout)."""
    lo = jnp.arange(2, dtype=jnp.uint32)
    b1, b2 = threefry2x32(words[0], words[1], jnp.zeros_like(lo), lo)
    return (b1[0], b2[0]), (b1[1], b2[1])


def randint(key, shape: tuple[int, ...], maxval) -> jax.Array:
    """int32 ``shape`` in ``[0, maxval)``: ``jax.random.randint(key, shape, 0, maxval, jnp.int32)``.

    ``maxval`` is an int32 scalar (may be traced) ``<= 2**31 - 1``; ``maxval <= 0`` gives 0, as in JAX.
    As in JAX, two 32-bit draws per value are reduced modulo ``maxval`` (bias ~ maxval / 2**64).
    """
    words = _threefry_words(key)
    if words is None:
        return jax.random.randint(key, shape, 0, maxval, dtype=jnp.int32)
    maxval = jnp.asarray(maxval, jnp.int32)
    k1, k2 = _split2(words)
    high, low = _bits(k1, shape), _bits(k2, shape)
    span = jnp.where(maxval <= 0, jnp.uint32(1), maxval.astype(jnp.uint32))
    mult = jnp.uint32(65536) % span  # 2**32 mod span, from (2**16 mod span)**2
    mult = (mult * mult) % span
    offset = ((high % span) * mult + low % span) % span
    return offset.astype(jnp.int32)


def uniform_pair(key, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """Two independent float32 ``shape`` arrays in ``[0, 1)`` from one Threefry evaluation per
    element: the first from its first output word, the second from its second (``uniform`` XORs
    the two words into one value, as ``jax.random.bits`` does). Not ``jax.random``'s stream; keys
    other than Threefry ones fall back to ``jax.random.uniform(key, (2, *shape))``."""
    words = _threefry_words(key)
    if words is None:
        u = jax.random.uniform(key, (2, *shape), dtype=jnp.float32)
        return u[0], u[1]
    n = math.prod(shape)
    lo = jnp.arange(n, dtype=jnp.uint32).reshape(shape)
    return tuple(_to_unit(b) for b in threefry2x32(words[0], words[1], jnp.zeros_like(lo), lo))


def _to_unit(bits: jax.Array) -> jax.Array:
    """float32 in ``[0, 1)`` from uint32 bits (their top 23 bits as the mantissa, as JAX does)."""
    bits = (bits >> np.uint32(9)) | np.uint32(0x3F800000)
    return jnp.maximum(jnp.float32(0), jax.lax.bitcast_convert_type(bits, jnp.float32) - jnp.float32(1))


def uniform(key, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    """``dtype`` ``shape`` in ``[0, 1)``: ``jax.random.uniform(key, shape, dtype)``."""
    words = _threefry_words(key) if jnp.dtype(dtype) == jnp.float32 else None
    if words is None:
        return jax.random.uniform(key, shape, dtype=dtype)
    return _to_unit(_bits(words, shape))
