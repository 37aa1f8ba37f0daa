"""Bad input to the return functions (`gae`, `lambda_returns`, `discounted_returns`, `n_step_returns`): refused with
an error naming the function and the argument, eagerly and under jit; the inputs are never written to."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS, bad_static_ints, bad_unit_scalars, non_arrays, refused, refused_eager_and_jit, wrong_dtype, wrong_shape

T, N = 5, 3
RNG = np.random.default_rng(0)
ARGS = {
    "reward": RNG.normal(size=(T, N)).astype(np.float32), "value": RNG.normal(size=(T, N)).astype(np.float32),
    "terminated": RNG.random((T, N)) < 0.2, "truncated": RNG.random((T, N)) < 0.2,
    "final_value": RNG.normal(size=(T, N)).astype(np.float32), "last_value": RNG.normal(size=(N,)).astype(np.float32),
}
FNS = {
    "gae": (jb.gae, {"gamma": 0.9, "gae_lambda": 0.8}),
    "lambda_returns": (jb.lambda_returns, {"gamma": 0.9, "lambda_": 0.8}),
    "discounted_returns": (jb.discounted_returns, {"gamma": 0.9}),
    "n_step_returns": (jb.n_step_returns, {"gamma": 0.9, "n": 2}),
}
FN = st.sampled_from(sorted(FNS))


def arrays(fn: str) -> dict:
    return {k: v for k, v in ARGS.items() if not (fn == "discounted_returns" and k == "value")}


def call(fn: str, **over):
    f, scalars = FNS[fn]
    kw = {**arrays(fn), **scalars, **over}
    return lambda: f(**kw)


def wrong_array(name: str):
    shape, dtype = ARGS[name].shape, ARGS[name].dtype
    return (
        wrong_shape(shape).map(lambda s: np.zeros(s, dtype)) | wrong_dtype(dtype).map(lambda d: np.zeros(shape, d))
        | non_arrays().filter(lambda v: v is not None and not (name == "last_value" and isinstance(v, float)))
    )


@SETTINGS
@given(fn=FN, name=st.sampled_from(sorted(ARGS)), data=st.data())
def test_wrong_array_argument(fn, name, data):
    if name not in arrays(fn):
        return
    bad = data.draw(wrong_array(name))
    if name == "reward" and isinstance(bad, np.ndarray) and jnp.issubdtype(bad.dtype, jnp.floating) and bad.ndim >= 1 and bad.shape[0] >= 1:
        # another floating reward sets the dtype (or shape) every other argument is checked against
        names = (name, "value", "terminated", "truncated", "final_value", "last_value")
    else:
        names = name
    kw = {**arrays(fn), name: bad}
    f, scalars = FNS[fn]
    before = {k: np.array(v) for k, v in ARGS.items()}
    refused_eager_and_jit(lambda a: f(**a, **scalars), (kw,), names)
    for k, v in ARGS.items():
        np.testing.assert_array_equal(v, before[k])
    if "truncated" in kw and name in ("truncated", "final_value"):  # one without the other
        refused(call(fn, **{name: None}), ("truncated", "final_value"))


@SETTINGS
@given(fn=FN, bad=bad_unit_scalars())
def test_bad_hyperparameters(fn, bad):
    for name in FNS[fn][1]:
        if name != "n":
            refused(call(fn, **{name: bad}), f"{fn}: {name}")
            refused(call(fn, **{name: None}), f"{fn}: {name}")


@SETTINGS
@given(n=bad_static_ints(), method=st.sampled_from([None, "Scan", 1, ["scan"], b"scan"]))
def test_bad_static_arguments(n, method):
    refused(call("n_step_returns", n=n), "n_step_returns: n")
    for fn in ("gae", "lambda_returns", "discounted_returns"):
        refused(call(fn, method=method), f"{fn}: method")


@SETTINGS
@given(fn=FN, t=st.sampled_from([(), (0,), (0, N)]))
def test_empty_or_scalar_rollouts(fn, t):
    empty = {k: np.zeros(t, v.dtype) for k, v in arrays(fn).items() if k != "last_value"}
    refused(call(fn, **empty), f"{fn}: reward")


def test_float64_needs_x64_and_is_kept_with_it():
    f64 = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in ARGS.items()}
    refused(lambda: jb.gae(**f64, gamma=0.9, gae_lambda=0.9), "gae: reward")
    with jax.enable_x64(True):
        adv, _ = jb.gae(**f64, gamma=0.9, gae_lambda=0.9)
        assert adv.dtype == np.float64
        refused(lambda: jb.gae(**{**f64, "value": ARGS["value"]}, gamma=0.9, gae_lambda=0.9), "gae: value")


def test_numpy_float64_last_value_is_refused_like_a_float64_array():
    one = {k: v[:, 0] if v.ndim == 2 else v[0] for k, v in ARGS.items()}  # *B = (): last_value a scalar
    refused(lambda: jb.gae(**{**one, "last_value": np.float64(0.5)}, gamma=0.9, gae_lambda=0.9), "gae: last_value")
    with_float, with_f32 = (jb.gae(**{**one, "last_value": lv}, gamma=0.9, gae_lambda=0.9)[0] for lv in (0.5, np.float32(0.5)))
    np.testing.assert_array_equal(with_float, with_f32)  # a Python float takes the rollout's dtype
