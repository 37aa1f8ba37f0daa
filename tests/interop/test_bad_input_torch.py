"""Bad input to `jaxbuffers.interop.torch`: a leaf that is not an array, an unsupported dtype or a flag that is not
a bool is refused with a TypeError naming the leaf path (or the argument); the input tree is never changed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from bad_inputs import SETTINGS, refused, snapshot  # noqa: E402
from jaxbuffers.interop.torch import from_torch, to_torch  # noqa: E402

BAD_LEAVES = st.sampled_from([1.5, 3, True, 1 + 2j, "x", b"x", object(), np.array(["a"]), np.array([None], object), jax.ShapeDtypeStruct((2,), jnp.float32)])
PATHS = st.lists(st.sampled_from(["a", "b", 0, 1]), min_size=0, max_size=3)


def nest(path, leaf):
    """A tree holding good leaves beside `leaf` at `path` (dict keys or list positions); `leaf`'s path string."""
    tree, name = leaf, ""
    for p in reversed(path):
        tree = {p: tree, "ok": np.zeros(2, np.float32)} if isinstance(p, str) else [np.ones(1, np.int32)] * p + [tree]
    for p in path:
        name += f"[{p!r}]"
    return tree, name or "<root>"


@SETTINGS
@given(path=PATHS, leaf=BAD_LEAVES)
def test_bad_leaf_named_by_path(path, leaf):
    tree, name = nest(path, leaf)
    for fn, what in ((to_torch, "to_torch"), (from_torch, "from_torch")):
        refused(lambda: fn(tree), f"{what}: leaf {name}", exc=(TypeError,))


@SETTINGS
@given(path=PATHS, dtype=st.sampled_from([torch.int64, torch.float64, torch.uint64, torch.complex128]))
def test_64_bit_tensors_refused_with_x64_off(path, dtype):
    tree, name = nest(path, torch.zeros(2, dtype=dtype))
    refused(lambda: from_torch(tree), f"from_torch: leaf {name}", exc=(TypeError,))


@SETTINGS
@given(copy=st.sampled_from(["no", "False", 0, 1, None, np.array(True), [True]]))
def test_copy_must_be_a_bool(copy):
    refused(lambda: to_torch(jnp.ones(2), copy=copy), "copy", exc=(TypeError,))
    refused(lambda: from_torch(torch.ones(2), copy=copy), "copy", exc=(TypeError,))


@SETTINGS
@given(copy=st.booleans(), shape=st.lists(st.integers(0, 3), max_size=3))
def test_round_trip_leaves_the_source_unchanged(copy, shape):
    x = jnp.arange(int(np.prod(shape)), dtype=jnp.float32).reshape(shape)
    before = snapshot(x)
    back = from_torch(to_torch({"x": x}, copy=copy), copy=copy)
    assert snapshot(back["x"]) == before == snapshot(x)
