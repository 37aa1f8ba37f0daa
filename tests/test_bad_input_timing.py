"""Bad input to `Timing` and `span` (the host timing of eager calls): a name that is not a str, seconds that are
not a real number >= 0 (NaN, infinities, negatives, bools, strings, arrays of several values) and a prefix that is
neither a str nor None are refused with an error naming the argument, and the counts collected so far are exactly
as they were; the accepted forms of `seconds` (Python and numpy ints and floats, 0-d arrays) count as that float."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS
from jaxbuffers._timing import span

NOT_STR = st.sampled_from([None, 3, 1.5, b"x", ["a"], {"a": 1}, np.str_, np.zeros(2)])
BAD_SECONDS = st.sampled_from([None, "1", True, np.bool_(False), 1j, [1.0], np.ones(2), math.nan, math.inf, -math.inf]) | st.floats(max_value=-1e-300)


def _timing() -> jb.Timing:
    t = jb.Timing()
    t.add("ReplayBuffer.add", 0.5)
    t.add("ReplayBuffer.sample", 0.25)
    return t


@SETTINGS
@given(data=st.data(), arg=st.sampled_from(["name", "seconds", "prefix"]))
def test_each_wrong_argument_is_refused_and_counts_nothing(data, arg):
    t = _timing()
    before = t.summary()
    if arg == "prefix":
        call = lambda: t.summary(data.draw(NOT_STR.filter(lambda v: v is not None), arg))  # noqa: E731
    else:
        name, seconds = "x", 1.0
        name = data.draw(NOT_STR, arg) if arg == "name" else name
        seconds = data.draw(BAD_SECONDS, arg) if arg == "seconds" else seconds
        call = lambda: t.add(name, seconds)  # noqa: E731
    with pytest.raises((TypeError, ValueError), match=rf"^{arg}: expected"):
        call()
    assert t.summary() == before


@SETTINGS
@given(name=NOT_STR)
def test_span_refuses_a_name_that_is_not_a_str_before_the_block_runs(name):
    ran = []
    with jb.timing() as t:
        with pytest.raises(TypeError, match="^name: expected a str"):
            with span(name):
                ran.append(1)
    assert not ran and t.summary() == {}


@SETTINGS
@given(value=st.floats(0, 1e6) | st.integers(0, 10**6), form=st.sampled_from([float, int, np.float32, np.int64, jnp.asarray, np.asarray]))
def test_accepted_forms_of_seconds_count_as_that_float(value, form):
    x = form(int(value) if form in (int, np.int64) else value)
    t = _timing()
    t.add("x", x)
    got = t.summary("x")["x"]
    assert got["calls"] == 1 and got["total_s"] == got["max_s"] == float(x) and type(got["total_s"]) is float
