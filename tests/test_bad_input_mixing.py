"""Bad input to `sample_mixed` / `mixed_counts`, eagerly and under `jit`: the sources' outputs of another structure,
dtype or row count, and proportions out of float64's range, refused with an error naming the argument (or the source
call, `samplers[i](key, n)`); the buffers sampled unchanged; the accepted forms give exactly the documented batch.
(Wrong keys, sizes, proportions and shuffle flags: tests/test_bad_input_feeding.py.)"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS, corrupt, refused, snapshot

FEW = settings(SETTINGS, max_examples=6)  # each example may trace or compile a mixed sample
ITEM = {"obs": jnp.zeros((2,), jnp.float32), "a": jnp.int32(0)}
REPLAY = jb.ReplayBuffer.create(ITEM, capacity=8).add({"obs": np.ones((4, 2), np.float32), "a": np.arange(4, dtype=np.int32)})
OTHER = jb.ReplayBuffer.create(ITEM, capacity=8).add({"obs": -np.ones((3, 2), np.float32), "a": -np.arange(3, dtype=np.int32)})
KEY = jax.random.key(0)
SOURCES = [lambda k, n: REPLAY.sample(k, n).item, lambda k, n: OTHER.sample(k, n).item]


@FEW
@given(data=st.data(), which=st.integers(0, 1), jit=st.booleans())
def test_a_source_of_another_structure_dtype_or_shape(data, which, jit):
    """A source returning rows unlike the first source's: refused naming that source's call, eagerly and under `jit`
    (where it is found while tracing); the buffers unchanged."""
    bad, _ = data.draw(corrupt({"obs": np.zeros((3, 2), np.float32), "a": np.zeros(3, np.int32)}, "x").filter(
        lambda b: all(isinstance(v, np.ndarray) and v.dtype.kind in "biuf" and v.dtype != np.float64 for v in b[0].values()) if jit else True))
    sources = list(SOURCES)
    sources[which] = lambda k, n: jax.tree.map(jnp.asarray, bad) if jit else bad
    call = (lambda: jax.jit(lambda k: jb.sample_mixed(k, sources, 6, [1.0, 1.0]))(KEY)) if jit else (lambda: jb.sample_mixed(KEY, sources, 6, [1.0, 1.0]))
    refused(call, (f"samplers[{which}]", "samplers[0]", "samplers[1]", "samplers", "proportions"), state=lambda: (REPLAY, OTHER))


@SETTINGS
@given(leaf=st.sampled_from(["torch", [[0.0, 0.0]] * 3, np.zeros((3, 2)), "x", np.zeros((3, 2), object)]))
@example(leaf="torch")  # a torch tensor from the first source was numpy's "Cannot interpret 'torch.float32' as a data type"
def test_a_first_source_of_non_arrays(leaf):
    """The first source's rows set the structure the others are checked against: its leaves must be arrays JAX holds
    as they are (a float64 numpy leaf would be narrowed by the concatenation)."""
    if isinstance(leaf, str) and leaf == "torch":
        torch = pytest.importorskip("torch")
        leaf = torch.zeros(3, 2)
    sources = [lambda k, n: {"obs": leaf, "a": np.zeros(n, np.int32)}, SOURCES[1]]
    refused(lambda: jb.sample_mixed(KEY, sources, 6, [1.0, 1.0]), "samplers[0](key, 3)['obs']", state=lambda: (REPLAY, OTHER))


def test_a_first_source_of_a_bare_array_is_named_by_its_call():
    """A source returning one array (not a tree of them): the error names the call itself, `samplers[0](key, 3)`."""
    sources = [lambda k, n: np.zeros(n), lambda k, n: jnp.zeros(n, jnp.float32)]
    with pytest.raises(TypeError, match=r"^samplers\[0\]\(key, 3\): dtype float64 would be narrowed"):
        jb.sample_mixed(KEY, sources, 6, [1.0, 1.0])


def test_proportions_whose_sum_is_beyond_float64_are_apportioned():
    """Finite proportions summing past float64's largest number (their sum overflowed: refused before)."""
    for props, counts in (([1e308, 1e308], (2, 2)), ([np.float64(1e308)] * 3, (2, 1, 1)),
                          ([1.7e308, 1.7e308, 0.0], (2, 2, 0)), ([5e-324, 5e-324], (2, 2))):
        assert jb.mixed_counts(4, props) == counts
    assert jb.mixed_counts(3, (1e308, 1e308)) == (2, 1)
    out = jb.sample_mixed(KEY, SOURCES, 4, [1e308, 1e308])
    assert np.asarray(out.source).tolist() == [0, 0, 1, 1]



@pytest.mark.parametrize("props", [[1.0, math.inf], [math.inf, math.inf], [0.0, math.nan]])
def test_infinite_or_nan_proportions_are_refused_naming_them(props):
    with pytest.raises(ValueError, match=r"^proportions(\[1\])?: expected"):
        jb.mixed_counts(3, props)

@FEW
@given(form=st.sampled_from(["list", "tuple", "numpy_scalars", "ints", "scaled"]), key=st.sampled_from(["typed", "raw"]))
def test_accepted_forms_give_the_same_batch(form, key):
    """The table: samplers a list or tuple, proportions a list or tuple of Python or numpy numbers (ints too), scaled
    by any positive factor; a typed or raw key of the same seed. Each gives exactly the batch of `[0.5, 0.5]`."""
    props = {"list": [0.5, 0.5], "tuple": (0.5, 0.5), "numpy_scalars": [np.float32(2), np.float64(2)], "ints": [3, 3], "scaled": [1e-300, 1e-300]}[form]
    k = KEY if key == "typed" else jax.random.key_data(KEY)
    samplers = tuple(SOURCES) if form == "tuple" else SOURCES
    want = jb.sample_mixed(KEY, SOURCES, 5, [0.5, 0.5])
    assert snapshot(jb.sample_mixed(k, samplers, 5, props)) == snapshot(want)
    assert np.asarray(want.source).tolist() == [0] * 3 + [1] * 2  # the largest remainder goes to the first source


def test_a_zero_proportion_source_is_not_called():
    """The table: a source with proportion 0 contributes no row and is never called."""

    def never(k, n):
        raise AssertionError("a source of proportion 0 was called")

    out = jb.sample_mixed(KEY, [SOURCES[0], never], 4, [1.0, 0.0])
    assert np.asarray(out.source).tolist() == [0] * 4
