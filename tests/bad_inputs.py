"""What the bad-input property tests (tests/test_bad_input_*.py) share: strategies of wrong arguments, the check
that a call is refused with an error of ours naming the argument, and byte snapshots of stored contents.

The accepted inputs and the refusals these tests hold the library to are the table of docs/guide.md, section 8.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

#: Dtypes a JAX program takes as they are (x64 off): a wrong one is refused eagerly and under jit alike.
DTYPES = [np.dtype(d) for d in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.uint32, np.float16, jnp.bfloat16, np.float32)]


def snapshot(tree: Any) -> list[tuple[str, tuple, bytes]]:
    """(dtype, shape, bytes) of every leaf (arrays, and the Python numbers of an adapter's cursors): what "stored
    contents byte-identical" compares."""
    out = []
    for x in jax.tree.leaves(tree):
        x = x if hasattr(x, "dtype") else np.asarray(x)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        out.append((str(x.dtype), tuple(x.shape), np.asarray(x).tobytes()))
    return out


def names(message: str, name: str | tuple[str, ...]) -> bool:
    """Whether an error message names `name` (or one of several): as a word, e.g. `batch['obs']` or `gae: reward`."""
    return any(re.search(rf"(^|[^\w.]){re.escape(n)}", message) is not None for n in ((name,) if isinstance(name, str) else name))


def refused(call: Callable[[], Any], name: str | tuple[str, ...], *, state: Any = None, exc: tuple = (TypeError, ValueError)) -> BaseException:
    """Assert that `call()` raises one of `exc` whose message names `name` (or one of several, where the argument
    at fault is ambiguous, e.g. two vectors of different lengths), and that `state` (a pytree, or a callable
    returning one: the state of a mutable adapter) holds the same bytes afterwards."""
    read = state if callable(state) else (lambda: state)
    before = snapshot(read())
    with pytest.raises(exc) as info:
        call()
    assert names(str(info.value), name), f"{type(info.value).__name__} does not name {name!r}: {info.value}"
    assert snapshot(read()) == before, "a refused call changed the stored contents"
    return info.value


def traceable(*args: Any) -> bool:
    """Whether `jax.jit` takes these arguments without changing them: JAX or numpy arrays of dtypes JAX holds as
    they are (a float64 numpy array would be narrowed at the call, a documented cast of JAX's)."""
    for x in jax.tree.leaves(args):
        if not isinstance(x, (jax.Array, np.ndarray)):
            return False
        if not (x.dtype == np.bool_ or jnp.issubdtype(x.dtype, jnp.number)) or jax.dtypes.canonicalize_dtype(x.dtype) != x.dtype:
            return False
    return True


def refused_eager_and_jit(fn: Callable, args: tuple, name: str, *, state: Any = None, exc: tuple = (TypeError, ValueError)) -> None:
    """`refused(fn(*args))`, and the same under `jax.jit` where the arguments can be traced: the same refusal."""
    refused(lambda: fn(*args), name, state=state, exc=exc)
    if traceable(args):
        refused(lambda: jax.jit(fn)(*args), name, state=state, exc=exc)


def in_order(ops: list[str], start: Any, valid: dict[str, Callable], refusals: dict[str, tuple[Callable, str]]) -> Any:
    """Apply the calls named in `ops` in order and return the final state: `valid[op](state, n)` (the n-th call) to
    the state and to a reference that sees only the valid calls; `refusals[op] = (call(state), argument)` must be
    refused naming the argument. After every call the state holds the reference's bytes: refused calls, in any
    order, change nothing."""
    state = ref = start
    for n, op in enumerate(ops):
        if op in valid:
            state, ref = valid[op](state, n), valid[op](ref, n)
        else:
            call, name = refusals[op]
            refused(lambda: call(state), name, state=state)
        assert snapshot(state) == snapshot(ref)
    return state


# ---------------------------------------------------------------------------------------------------------------
# Strategies of wrong values.


def _torch_tensor():
    torch = pytest.importorskip("torch")
    return torch.zeros(2)


def non_arrays(host_vector: bool = False) -> st.SearchStrategy:
    """Values that are not arrays where a JAX or numpy array belongs; with `host_vector` (an index, priority or
    generation vector, which takes lists of numbers and CPU torch tensors), no lists of numbers nor tensors."""
    values = [None, "x", 1.5, 3, True, {"a": 1}, np.array([None, 1], object), np.array(["a", "b"]), jax.ShapeDtypeStruct((2,), jnp.float32)]
    if host_vector:
        return st.sampled_from(values + [["a", "b"], [1, [2]]])
    return st.sampled_from(values + [[1.0, 2.0]]) | st.builds(_torch_tensor)


def bad_keys() -> st.SearchStrategy:
    """What is not one PRNG key: no key at all, numbers, wrong dtypes or shapes of raw keys, batches of keys."""
    return st.sampled_from([
        None, 0, 1.5, "key", [0, 1], np.zeros(2, np.float32), np.zeros(3, np.uint32), np.zeros((2, 2), np.uint32),
        np.zeros(2, np.int32), np.zeros((), np.uint32), jax.random.split(jax.random.key(0), 2),
    ]) | st.builds(_torch_tensor)


def bad_static_ints(minimum: int = 1) -> st.SearchStrategy:
    """What is not a Python int >= `minimum` (a size, a batch size): small or negative ints, floats, strings,
    None, bools, JAX scalars, ints beyond int32."""
    return (
        st.integers(-(2**40), minimum - 1) | st.sampled_from([2.0, 2.5, "3", None, True, jnp.int32(2), np.float32(2), 2**31, [2]])
    )


def bad_unit_scalars() -> st.SearchStrategy:
    """What is not a scalar in [0, 1] (a discount, a lambda): out of range, NaN, inf, non-numbers, bools, vectors."""
    return (
        st.floats(1.0, 1e6, exclude_min=True) | st.floats(-1e6, 0.0, exclude_max=True)
        | st.sampled_from([float("nan"), float("inf"), "0.9", True, jnp.ones(2), np.array([0.5]), 1 + 0j])
    )


def wrong_dtype(dtype: Any) -> st.SearchStrategy:
    """A dtype other than `dtype`, JAX holds as it is."""
    return st.sampled_from([d for d in DTYPES if d != np.dtype(dtype)])


def wrong_shape(shape: tuple[int, ...]) -> st.SearchStrategy:
    """A shape other than `shape`: an axis dropped, one added, or one size changed."""
    shape = tuple(shape)
    drop = [shape[:i] + shape[i + 1 :] for i in range(len(shape))]
    add = st.tuples(st.integers(0, len(shape)), st.integers(1, 3)).map(lambda a: shape[: a[0]] + (a[1],) + shape[a[0] :])
    change = (
        st.tuples(st.integers(0, len(shape) - 1), st.integers(0, 5)).map(lambda a: shape[: a[0]] + (a[1],) + shape[a[0] + 1 :])
        if shape else st.just((1,))
    )
    return (st.sampled_from(drop) | add | change if drop else add | change).filter(lambda s: s != shape)


def corrupt(tree: dict, what: str) -> st.SearchStrategy:
    """`(bad tree, leaf name)`: `tree` (a dict of arrays with leading axes) with one leaf of the wrong dtype, the
    wrong shape, or not an array, or a field missing or extra. The name is what the refusal must name."""
    keys = sorted(tree)

    def with_leaf(k, value):
        return {**tree, k: value}, f"{what}[{k!r}]"

    def dtype_case(k):
        return wrong_dtype(tree[k].dtype).map(lambda d: with_leaf(k, np.zeros(tree[k].shape, d)))

    def shape_case(k):
        return wrong_shape(tree[k].shape).map(lambda s: with_leaf(k, np.zeros(s, tree[k].dtype)))

    def kind_case(k):
        return non_arrays().filter(lambda v: not isinstance(v, (dict, list)) and v is not None).map(lambda v: with_leaf(k, v))

    missing = st.sampled_from(keys).map(lambda k: ({j: v for j, v in tree.items() if j != k}, what))
    extra = st.just(({**tree, "zz_extra": tree[keys[0]]}, what))
    key = st.sampled_from(keys)
    return key.flatmap(dtype_case) | key.flatmap(shape_case) | key.flatmap(kind_case) | missing | extra


def huge_indices() -> st.SearchStrategy:
    """Index arrays of any integer values (beyond int64 too) in the forms the table accepts: `(value, ints)`,
    `ints` the Python ints, `value` a list, an int64 / uint64 / int32 numpy array or a JAX int32 array."""
    element = st.integers(-(2**70), 2**70) | st.integers(-3, 20)
    # two lengths: every new shape compiles each eager method once more, and clamping does not depend on the length
    ints = st.sampled_from([1, 5]).flatmap(lambda n: st.lists(element, min_size=n, max_size=n))

    def forms(xs):
        clip64 = [min(max(x, -(2**63)), 2**63 - 1) for x in xs]
        out = [st.just((xs, xs)), st.just((np.array(clip64, np.int64), clip64))]
        if all(0 <= x < 2**64 for x in xs):
            out.append(st.just((np.array(xs, np.uint64), xs)))
        if all(-(2**31) <= x < 2**31 for x in xs):
            out.append(st.just((jnp.array(xs, jnp.int32), xs)))
        return st.one_of(out)

    return ints.flatmap(forms)
