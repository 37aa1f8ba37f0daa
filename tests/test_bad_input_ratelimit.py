"""Bad input to `RateLimiter` (eagerly and under `jit`) and `BlockingRateLimiter`, in any order: refused with an error
naming the argument; the limiter's counts byte-identical; the accepted forms of a count (Python or numpy ints, 0-d
integer arrays of any width, traced int32) record exactly what a Python int records. (The constructors' and the
blocking waits' arguments: tests/test_bad_input_feeding.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

import jaxbuffers as jb
from hypothesis import settings

from bad_inputs import SETTINGS, refused, snapshot

FEW = settings(SETTINGS, max_examples=10)  # eager limiter ops, several per example
LIM = jb.RateLimiter.create(2.0, min_size=2, error_buffer=(6.0, 9.0)).insert(3).sample(2)
BAD_COUNTS = st.sampled_from([-1, 2**30, 1.5, "1", None, True, [1], np.zeros(2, np.int32), np.float32(1), jnp.float32(1), jnp.bool_(True),
                              np.array(-1), jnp.int32(-1), np.int64(-(2**40)), np.uint32(2**31), jnp.zeros((1,), jnp.int32)])
OPS = ("insert", "sample", "can_insert", "can_sample")
INSERT, SAMPLE = jax.jit(jb.RateLimiter.insert), jax.jit(jb.RateLimiter.sample)


@SETTINGS
@given(n=BAD_COUNTS, op=st.sampled_from(OPS))
@example(n=jnp.int32(-1), op="insert")  # a concrete negative JAX count was recorded, moving the counts back
@example(n=np.array(-1), op="sample")
def test_bad_counts(n, op):
    refused(lambda: getattr(LIM, op)(n), "n", state=LIM)
    if isinstance(n, (jax.Array, np.ndarray)) and np.ndim(n) and np.dtype(n.dtype).kind in "biuf":  # traceable and refused by its kind
        refused(lambda: jax.jit(lambda lim, x: getattr(lim, op)(x))(LIM, n), "n", state=LIM)


@SETTINGS
@given(batch_size=st.sampled_from([0, -1, 1.5, "2", None, True, jnp.int32(2), np.float32(2), [2], 2**31]))
def test_bad_batch_size(batch_size):
    refused(lambda: LIM.num_updates(batch_size), "batch_size", state=LIM)


@SETTINGS
@given(n=st.integers(0, 40), form=st.sampled_from(["int", "np.int8", "np.uint16", "np.int64", "jnp.int16", "0-d numpy", "traced"]))
def test_accepted_counts_record_exactly_a_python_int(n, form):
    """The table: a count as a Python or numpy int, a 0-d integer array of any width, or a traced int32 (jit): the
    same limiter as the Python int."""
    conv = {"int": int, "np.int8": lambda v: np.int8(min(v, 127)), "np.uint16": np.uint16, "np.int64": np.int64, "jnp.int16": jnp.int16,
            "0-d numpy": lambda v: np.array(v, np.int32), "traced": jnp.int32}[form]
    x = conv(n)
    m = int(x)
    for op, jitted in (("insert", INSERT), ("sample", SAMPLE)):
        want = getattr(LIM, op)(m)
        got = jitted(LIM, x) if form == "traced" else getattr(LIM, op)(x)
        assert snapshot(got) == snapshot(want)
        assert bool(LIM.can_insert(x)) == bool(LIM.can_insert(m)) and bool(LIM.can_sample(x)) == bool(LIM.can_sample(m))


@FEW
@given(ops=st.lists(st.tuples(st.sampled_from(["insert", "sample"]), st.integers(-3, 6)), min_size=1, max_size=10))
def test_refusals_in_any_order_change_nothing(ops):
    """Valid records interleaved with refused ones (negative counts) give the limiter of the valid ones alone, and
    the counts match a plain-Python model of the rule."""
    lim, inserted, sampled = jb.RateLimiter.create(2.0, min_size=2, error_buffer=(6.0, 9.0)), 0, 0
    for op, n in ops:
        if n < 0:
            refused(lambda: getattr(lim, op)(np.int32(n)), "n", state=lim)
            continue
        lim = getattr(lim, op)(n)
        inserted, sampled = inserted + n * (op == "insert"), sampled + n * (op == "sample")
    assert (int(lim.num_inserted()), int(lim.num_sampled())) == (inserted, sampled)


@SETTINGS
@given(n=BAD_COUNTS.filter(lambda v: not isinstance(v, (jax.Array, np.ndarray)) or np.ndim(v) == 0))
def test_blocking_limiter_counts(n):
    """`BlockingRateLimiter`'s waits take Python ints only (a count is a size): every bad count refused naming `n`,
    the counts as they were."""
    lim = jb.BlockingRateLimiter(2.0, min_size=2, error_buffer=(6.0, 9.0))
    lim.await_insert(3)
    counts = lambda: (lim.num_inserted, lim.num_sampled)  # noqa: E731
    if isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 0 <= n < 2**30:
        return  # a valid count (np.uint32(2**31) is above the band: refused, as no balance admits it)
    refused(lambda: lim.await_insert(n, timeout=0), "n", state=counts)
    refused(lambda: lim.await_sample(n, timeout=0), "n", state=counts)
