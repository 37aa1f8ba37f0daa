"""Bad input to `ReplayBuffer` and `PrioritisedReplayBuffer`: refused with an error naming the argument, eagerly and
under jit, the stored contents unchanged; the accepted values of the guide's table give exactly their result."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import (
    SETTINGS, bad_keys, bad_static_ints, bad_unit_scalars, corrupt, huge_indices, in_order, non_arrays, refused,
    refused_eager_and_jit, snapshot, wrong_shape,
)
from jaxbuffers._priority import PRIORITY_MAX

CAP = 8
ITEM = {"obs": jnp.zeros((3,), jnp.float32), "a": jnp.int32(0)}


def batch(b: int, start: int = 0) -> dict:
    i = np.arange(start, start + b)
    return {"obs": np.stack([i, -i, 2 * i], 1).astype(np.float32), "a": i.astype(np.int32)}


FILLED = {
    "replay": jb.ReplayBuffer.create(ITEM, CAP).add(batch(6, 1)),
    "prioritised": jb.PrioritisedReplayBuffer.create(ITEM, CAP, epsilon=1e-3).add(batch(6, 1), jnp.arange(1.0, 7.0)),
}
KIND = st.sampled_from(sorted(FILLED))


@SETTINGS
@given(kind=KIND, bad=corrupt(batch(3), "batch"))
def test_add_wrong_batch(kind, bad):
    buf = FILLED[kind]
    refused_eager_and_jit(lambda b, x: b.add(x), (buf, bad[0]), bad[1], state=buf)


@SETTINGS
@given(kind=KIND, b=st.integers(CAP + 1, 3 * CAP) | st.just(0))
def test_add_batch_size_out_of_range(kind, b):
    buf = FILLED[kind]
    refused_eager_and_jit(lambda s, x: s.add(x), (buf, batch(b)), "batch", state=buf)


@SETTINGS
@given(kind=KIND, key=bad_keys(), batch_size=st.integers(1, 4))
def test_sample_bad_key(kind, key, batch_size):
    buf = FILLED[kind]
    refused(lambda: buf.sample(key, batch_size), "key", state=buf)


@SETTINGS
@given(kind=KIND, batch_size=bad_static_ints())
def test_sample_and_can_sample_bad_batch_size(kind, batch_size):
    buf = FILLED[kind]
    refused(lambda: buf.sample(jax.random.key(0), batch_size), "batch_size", state=buf)
    refused(lambda: buf.can_sample(batch_size), "batch_size", state=buf)


@SETTINGS
@given(bad=non_arrays(host_vector=True).filter(lambda v: type(v) is not int) | st.sampled_from([np.zeros(2, np.float32), np.zeros(2, np.bool_), jnp.ones(3)]))
def test_get_refuses_what_is_not_integers(bad):
    buf = FILLED["replay"]
    refused(lambda: buf.get(bad), "indices", state=buf)


@SETTINGS
@given(kind=KIND, idx=huge_indices())
def test_out_of_range_indices_are_clamped(kind, idx):
    """The table: reads clamp any integer index into [0, capacity); priorities read 0 outside it."""
    value, ints = idx
    buf = FILLED[kind]
    clamped = np.clip(np.array([min(max(i, -1), CAP) for i in ints]), 0, CAP - 1).astype(np.int32)
    get = buf.get if kind == "replay" else buf.replay.get
    want = jax.tree.map(np.asarray, get(clamped))
    for got in (get(value), jax.jit(get)(value) if isinstance(value, jax.Array) else get(value)):
        assert snapshot(got) == snapshot(want)
    if kind == "prioritised":
        inside = np.array([0 <= i < CAP for i in ints])
        np.testing.assert_array_equal(buf.priorities(value), np.where(inside, buf.priorities(clamped), 0))
        np.testing.assert_array_equal(buf.generations_at(value), buf.generations_at(clamped))


@SETTINGS
@given(bad=wrong_shape((3,)) | st.just((3, 1)), dtype=st.sampled_from([np.float32, np.int32]))
def test_prioritised_add_wrong_priorities_shape(bad, dtype):
    buf = FILLED["prioritised"]
    p = np.ones(bad, np.float32)
    refused_eager_and_jit(lambda s, x, q: s.add(x, q), (buf, batch(3), p), "priorities", state=buf)


@SETTINGS
@given(dtype=st.sampled_from([np.bool_, np.uint8, np.int32, np.uint32]) | st.just(None), bad=non_arrays(host_vector=True).filter(lambda v: v is not None))
def test_prioritised_add_wrong_priorities_kind(dtype, bad):
    buf = FILLED["prioritised"]
    p = bad if dtype is None else np.ones(3, dtype)
    refused(lambda: buf.add(batch(3), p), "priorities", state=buf)


@SETTINGS
@given(
    which=st.sampled_from(["indices", "priorities", "generations"]),
    bad=non_arrays(host_vector=True) | st.sampled_from([np.ones((3, 1), np.int32), np.ones(2, np.int32), np.ones(3, np.bool_)]),
)
def test_set_priorities_bad_argument(which, bad):
    buf = FILLED["prioritised"]
    args = {"indices": np.array([0, 1, 2], np.int32), "priorities": np.ones(3, np.float32), "generations": np.zeros(3, np.int32)}
    args[which] = bad
    if which == "priorities" and getattr(bad, "dtype", None) == np.int32 and bad.shape == (3,):
        args[which] = np.ones(3, np.uint8)
    refused(lambda: buf.set_priorities(**args), (which, "priorities", "generations") if which == "indices" else which, state=buf)


@SETTINGS
@given(beta=bad_unit_scalars().filter(lambda b: not (isinstance(b, float) and b > 1)) | st.floats(-1e9, -1e-9))
def test_sample_bad_beta(beta):
    buf = FILLED["prioritised"]
    refused(lambda: buf.sample(jax.random.key(0), 2, beta=beta), "beta", state=buf)


@SETTINGS
@given(p=st.lists(st.sampled_from([np.nan, -np.inf, np.inf, -1.0, 0.0, 1e-9, 1e30, 2.5]), min_size=3, max_size=3))
def test_priority_policy(p):
    """The table: NaN -> the running max before the call, below epsilon -> epsilon, above 1e20 -> 1e20; never NaN
    or inf in the tree."""
    buf = FILLED["prioritised"]
    p = np.array(p, np.float32)
    out = buf.add(batch(3, 20), p)
    want = np.where(np.isnan(p), float(buf.max_priority), np.clip(p, buf.epsilon, PRIORITY_MAX)).astype(np.float32)
    slots = (np.asarray(buf.replay.head) + np.arange(3)) % CAP
    np.testing.assert_allclose(out.priorities(slots), want, rtol=1e-5)
    assert np.isfinite(float(out.tree.total()))
    written = out.set_priorities(slots, p, out.generations_at(slots))
    np.testing.assert_allclose(written.priorities(slots), np.where(np.isnan(p), float(out.max_priority), want), rtol=1e-5)


@SETTINGS
@given(form=st.sampled_from(["list", "numpy64", "torch"]))
def test_lists_and_host_arrays_accepted_for_vectors(form):
    """The table: index, priority and generation vectors may be lists, numpy arrays of any width or CPU torch
    tensors, with the result of the same values as JAX arrays."""
    buf = FILLED["prioritised"]
    idx, p, g = [0, 3], [2.0, 0.5], buf.generations_at(jnp.array([0, 3]))
    conv = {"list": lambda x, d: list(np.asarray(x).tolist()), "numpy64": lambda x, d: np.asarray(x, d)}
    if form == "torch":
        torch = pytest.importorskip("torch")
        conv["torch"] = lambda x, d: torch.tensor(np.asarray(x, d))
    c = conv[form]
    want = buf.set_priorities(jnp.array(idx), jnp.array(p, jnp.float32), g)
    got = buf.set_priorities(c(idx, np.int64), c(p, np.float64), c(g, np.int64))
    assert snapshot(got) == snapshot(want)


@SETTINGS
@given(
    capacity=bad_static_ints(), min_size=st.integers(9, 20) | st.just(0), example=non_arrays(host_vector=True),
    alpha=bad_unit_scalars(), epsilon=st.sampled_from([0.0, -1.0, 2.0, float("nan"), "x"]),
)
def test_create_bad_arguments(capacity, min_size, example, alpha, epsilon):
    refused(lambda: jb.ReplayBuffer.create(ITEM, capacity), "capacity")
    refused(lambda: jb.ReplayBuffer.create(ITEM, CAP, min_size=min_size), "min_size")
    if not isinstance(example, (dict, jax.ShapeDtypeStruct)):
        refused(lambda: jb.ReplayBuffer.create({"x": example}, CAP), "example_item")
    if not (isinstance(alpha, jax.Array) or isinstance(alpha, np.ndarray)):
        refused(lambda: jb.PrioritisedReplayBuffer.create(ITEM, CAP, priority_exponent=alpha), "priority_exponent")
    refused(lambda: jb.PrioritisedReplayBuffer.create(ITEM, CAP, epsilon=epsilon), "epsilon")


@SETTINGS
@given(ops=st.lists(st.sampled_from(["add", "bad_add", "bad_sample", "bad_set", "set"]), min_size=1, max_size=8))
def test_refused_calls_in_any_order_change_nothing(ops):
    """Any order of valid and refused calls gives the buffer the valid calls alone give."""
    def set_one(b, n):
        idx = jnp.array([n % CAP], jnp.int32)
        return b.set_priorities(idx, jnp.array([n + 0.5], jnp.float32), b.generations_at(idx))

    buf = in_order(ops, FILLED["prioritised"], {"add": lambda b, n: b.add(batch(2, 10 * n)), "set": set_one}, {
        "bad_add": (lambda b: b.add({**batch(2), "a": np.zeros(2, np.float32)}), "batch['a']"),
        "bad_sample": (lambda b: b.sample(None, 2), "key"),
        "bad_set": (lambda b: b.set_priorities(jnp.array([0]), jnp.array([1.0]), jnp.array([0.5])), "generations"),
    })
    buf.sample(jax.random.key(1), 4)  # still usable


def test_donation_rule_of_the_guide():
    """The guide's donation rule: methods return arrays of their own, so donating an older state leaves a state
    derived by a method whole; a state derived with `with_cursors` and an array read off a state share the donated
    arrays and lose them (on CPU, where donation is honoured)."""
    add = jax.jit(jb.ReplayBuffer.add, donate_argnums=0)
    b0 = jax.tree.map(jnp.copy, FILLED["replay"])
    b1, n = b0.add(batch(1, 40)), b0.size()
    view, obs = b0.with_cursors(num_valid=2), b0.storage["obs"]
    add(b0, batch(2, 50))
    assert snapshot(b1.sample(jax.random.key(0), 2)) and int(n) == 6  # derived by methods: whole
    if jax.default_backend() == "cpu":
        assert view.storage["obs"].is_deleted() and obs.is_deleted()
