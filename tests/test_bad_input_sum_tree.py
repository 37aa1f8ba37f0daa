"""Bad input to `SumMinTree`: refused with an error naming the argument, the tree unchanged; the accepted values of
the guide's table (NaN, negative and infinite leaf values, out-of-range indices) give exactly their result."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS, bad_keys, bad_static_ints, huge_indices, non_arrays, refused, refused_eager_and_jit, snapshot

CAP = 6
TREE = jb.SumMinTree.create(CAP).set(jnp.arange(CAP), jnp.arange(1.0, CAP + 1.0))


@SETTINGS
@given(
    which=st.sampled_from(["indices", "values", "where"]),
    bad=non_arrays(host_vector=True).filter(lambda v: not isinstance(v, (int, float))) | st.sampled_from([
        np.ones((2, 1), np.int32), np.ones(3, np.int32), np.ones(2, np.float32), np.ones(2, np.int32), np.ones(2, np.bool_),
    ]),
)
def test_set_bad_argument(which, bad):
    args = {"indices": np.array([0, 1], np.int32), "values": np.array([2.0, 3.0], np.float32), "where": np.ones(2, np.bool_)}
    valid = {"indices": "biu", "values": "f", "where": "b"}[which]
    if isinstance(bad, np.ndarray) and bad.shape == (2,) and bad.dtype.kind in valid or bad is None and which == "where":
        return  # a valid argument (where=None: every entry)
    args[which] = bad
    names = (which, "values", "where") if which == "indices" else which  # lengths differ: either may be named
    refused_eager_and_jit(lambda t, a: t.set(**a), (TREE, args), names, state=TREE)


@SETTINGS
@given(values=st.lists(st.sampled_from([np.nan, -np.inf, np.inf, -2.0, 0.0, 0.5, 3e38]), min_size=CAP, max_size=CAP))  # one shape: one compile
def test_leaf_value_policy(values):
    """The table: NaN is not written, negative values become 0, +inf `max_leaf`, finite values as given (3e38)."""
    v = np.array(values, np.float32)
    idx = np.arange(len(v))
    out = TREE.set(idx, v)
    want = np.asarray(TREE.leaves()).copy()
    want[idx] = np.where(np.isnan(v), want[idx], np.where(v == np.inf, TREE.max_leaf, np.maximum(v, 0)))
    np.testing.assert_array_equal(out.leaves(), want)
    assert not np.isnan(np.asarray(out.leaves())).any() and (np.asarray(out.leaves()) >= 0).all()


@SETTINGS
@given(idx=huge_indices())
def test_reads_clamp_and_writes_ignore_out_of_range(idx):
    value, ints = idx
    clamped = np.clip(np.array([min(max(i, -1), CAP) for i in ints]), 0, CAP - 1).astype(np.int32)
    np.testing.assert_array_equal(TREE.get(value), TREE.get(clamped))
    inside = np.array([0 <= i < CAP for i in ints])
    out = TREE.set(value, np.full(len(ints), 9.0, np.float32))
    want = np.asarray(TREE.leaves()).copy()
    want[clamped[inside]] = 9.0
    np.testing.assert_array_equal(out.leaves(), want)


@SETTINGS
@given(bad=non_arrays(host_vector=True).filter(lambda v: not isinstance(v, (int, float))) | st.sampled_from([np.ones(2, np.int32), np.ones((2, 2), np.float32)]))
def test_find_bad_queries(bad):
    refused(lambda: TREE.find(bad), "queries", state=TREE)


@SETTINGS
@given(key=bad_keys(), batch_size=bad_static_ints())
def test_sample_stratified_bad_arguments(key, batch_size):
    refused(lambda: TREE.sample_stratified(key, 2), "key", state=TREE)
    refused(lambda: TREE.sample_stratified(jax.random.key(0), batch_size), "batch_size", state=TREE)


@SETTINGS
@given(
    which=st.sampled_from(["start", "values"]),
    bad=non_arrays(host_vector=True).filter(lambda v: not isinstance(v, int) or isinstance(v, bool)) | st.sampled_from([
        np.ones(2, np.int32), np.ones(2, np.float32), np.float32(1), 2**40, np.ones(0, np.float32), np.ones(CAP + 1, np.float32),
    ]),
)
def test_set_run_bad_argument(which, bad):
    """`start` an integer scalar, `values` a floating vector of 1 to capacity entries; else refused naming it."""
    args = {"start": 2, "values": np.array([2.0, 3.0], np.float32)}
    if which == "values" and (isinstance(bad, np.ndarray) and bad.dtype.kind == "f" and 1 <= bad.shape[0] <= CAP):
        return  # a valid run
    args[which] = bad
    refused_eager_and_jit(lambda t, a: t.set_run(**a), (TREE, args), which, state=TREE)


@SETTINGS
@given(bad=st.sampled_from(["True", 1, 0, None, 1.0, np.int32(1), np.ones(1, np.bool_)]))
def test_set_bad_distinct(bad):
    """`distinct` is a static Python bool: a string (truthy), a number or an array is refused naming it."""
    refused(lambda: TREE.set(np.array([0, 1], np.int32), np.array([2.0, 3.0], np.float32), distinct=bad), "distinct", state=TREE)


@SETTINGS
@given(capacity=bad_static_ints() | st.just(2**30 + 1), dtype=st.sampled_from([None, "nope", np.int32, np.bool_, np.float64, "float64", object]))
def test_create_bad_arguments(capacity, dtype):
    refused(lambda: jb.SumMinTree.create(capacity), "capacity")
    refused(lambda: jb.SumMinTree.create(CAP, dtype), "dtype")


def test_lists_and_torch_accepted():
    torch = __import__("pytest").importorskip("torch")
    want = TREE.set(jnp.array([0, 2]), jnp.array([5.0, 0.25]), where=jnp.array([True, False]))
    for got in (TREE.set([0, 2], [5.0, 0.25], where=[True, False]),
                TREE.set(torch.tensor([0, 2]), torch.tensor([5.0, 0.25], dtype=torch.float64), where=torch.tensor([True, False]))):
        assert snapshot(got) == snapshot(want)
