"""Tests of jaxbuffers.returns against hand-computed numbers, rlax, and a plain-numpy reference.

The numpy reference (`ref_*`) is written from the closed-form sums (windows up to the first episode
end), not from the backward recursions the library uses, so agreement is a real check.
"""

from __future__ import annotations

import functools

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings

from jaxbuffers.returns import NStepReturns, discounted_returns, gae, lambda_returns, n_step_returns

rlax = pytest.importorskip("rlax")

METHODS = ["scan", "associative"]
WRAPS = {"eager": lambda f: f, "jit": jax.jit}
HYP = settings(max_examples=20, deadline=None)

# Jitted once at import, with gamma / lambda passed as (traced) float32 scalars, so hypothesis
# examples of the same shape reuse one compilation: keeps the file fast on 2 cores.
JIT = {f.__name__: jax.jit(f, static_argnames="method") for f in (gae, lambda_returns, discounted_returns)}
JIT["n_step_returns"] = jax.jit(n_step_returns, static_argnames="n")
f32 = np.float32


@pytest.fixture(params=list(WRAPS), ids=list(WRAPS))
def wrap(request):
    return WRAPS[request.param]


# ------------------------------------------------------------------------------------------
# plain numpy reference (float64, explicit windows)
# ------------------------------------------------------------------------------------------


def ref_next_value(value, term, trunc, final_value, last_value):
    T = len(term)
    out = np.zeros(T)
    for t in range(T):
        if term[t]:
            out[t] = 0.0
        elif trunc[t]:
            out[t] = final_value[t]
        elif t + 1 < T:
            out[t] = value[t + 1]
        else:
            out[t] = last_value
    return out


def ref_window(term, trunc, t, n=None):
    """Number of steps k of the window starting at t: up to the first end, the rollout end, or n."""
    T = len(term)
    k = 0
    for j in range(t, T):
        k += 1
        if term[j] or trunc[j] or (n is not None and k == n):
            break
    return k


def ref_gae(r, v, term, trunc, fv, lv, gamma, lam):
    nv = ref_next_value(v, term, trunc, fv, lv)
    delta = r + gamma * nv - v
    adv = np.zeros(len(r))
    for t in range(len(r)):
        k = ref_window(term, trunc, t)
        adv[t] = sum((gamma * lam) ** i * delta[t + i] for i in range(k))
    return adv, adv + v


def ref_n_step(r, v, term, trunc, fv, lv, gamma, n):
    nv = ref_next_value(v, term, trunc, fv, lv)
    T = len(r)
    target, ks, disc = np.zeros(T), np.zeros(T, int), np.zeros(T)
    for t in range(T):
        k = ref_window(term, trunc, t, n)
        d = 0.0 if term[t + k - 1] else gamma**k
        target[t] = sum(gamma**i * r[t + i] for i in range(k)) + d * nv[t + k - 1]
        ks[t], disc[t] = k, d
    return target, ks, disc


def ref_lambda_returns(r, v, term, trunc, fv, lv, gamma, lam):
    """Sutton & Barto eq. 12.3 (episodic lambda-return), the horizon being the first end."""
    T = len(r)
    out = np.zeros(T)
    for t in range(T):
        K = ref_window(term, trunc, t)
        # the n-step return from t reads steps t .. t + n only: the same sums over that slice
        g = [ref_n_step(*(a[t:t + n + 1] for a in (r, v, term, trunc, fv)), lv, gamma, n)[0][0] for n in range(1, K + 1)]
        out[t] = (1 - lam) * sum(lam ** (n - 1) * g[n - 1] for n in range(1, K)) + lam ** (K - 1) * g[K - 1]
    return out


def ref_batched(fn, *arrays, **kw):
    """Applies a 1-D reference to every column of [T, *B] arrays (last_value is arrays[5])."""
    r = arrays[0]
    batch = r.shape[1:]
    outs = None
    for idx in np.ndindex(*batch):
        cols = [a[(slice(None),) + idx] for a in arrays[:5]] + [arrays[5][idx]]
        res = fn(*cols, **kw)
        res = res if isinstance(res, tuple) else (res,)
        if outs is None:
            outs = [np.zeros(r.shape, np.asarray(x).dtype) for x in res]
        for o, x in zip(outs, res):
            o[(slice(None),) + idx] = x
    return outs


def make_rollout(seed, T, batch=(), p_term=0.1, p_trunc=0.1, dtype=np.float32, nan_final=True):
    """Random rollout; final_value is NaN wherever it must not be read."""
    rng = np.random.default_rng(seed)
    shape = (T,) + tuple(batch)
    reward = rng.normal(size=shape).astype(dtype)
    value = rng.normal(size=shape).astype(dtype)
    term = rng.random(shape) < p_term
    trunc = rng.random(shape) < p_trunc
    final_value = rng.normal(size=shape).astype(dtype)
    if nan_final:
        final_value = np.where(trunc, final_value, np.nan).astype(dtype)
    last_value = rng.normal(size=tuple(batch)).astype(dtype)
    return reward, value, term, trunc, final_value, last_value


rollouts = st.builds(
    dict,
    seed=st.integers(0, 2**31 - 1),
    T=st.sampled_from([1, 6, 23]),
    batch=st.sampled_from([(), (3,), (2, 3)]),
    p_term=st.sampled_from([0.0, 0.05, 0.3]),
    p_trunc=st.sampled_from([0.0, 0.05, 0.3]),
)
gammas = st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0])
lambdas = st.sampled_from([0.0, 0.5, 0.95, 1.0])


# ------------------------------------------------------------------------------------------
# a hand-checked case
# ------------------------------------------------------------------------------------------
# gamma 0.9, lambda 0.95; steps 3 (terminated) and 1 (truncated, final_value 2.0) end episodes.
#   t=4: delta = 1 + 0.9 * last_value(1.0) - 0.9 = 1.0                  A = 1.0
#   t=3: terminated, delta = 1 - 0.8 = 0.2                              A = 0.2
#   t=2: delta = 1 + 0.9 * 0.8 - 0.7 = 1.02;  A = 1.02 + 0.855 * 0.2  = 1.191
#   t=1: truncated, delta = 1 + 0.9 * 2.0 - 0.6 = 2.2 (trace cut)       A = 2.2
#   t=0: delta = 1 + 0.9 * 0.6 - 0.5 = 1.04;  A = 1.04 + 0.855 * 2.2  = 2.921
HAND = dict(
    reward=np.ones(5, np.float32),
    value=np.array([0.5, 0.6, 0.7, 0.8, 0.9], np.float32),
    terminated=np.array([0, 0, 0, 1, 0], bool),
    truncated=np.array([0, 1, 0, 0, 0], bool),
    # only t=1 is read; the other entries are poison
    final_value=np.array([np.nan, 2.0, np.inf, -1e9, np.nan], np.float32),
    last_value=np.float32(1.0),
)
HAND_ADV = [2.921, 2.2, 1.191, 0.2, 1.0]
HAND_RET = [3.421, 2.8, 1.891, 1.0, 1.9]


@pytest.mark.parametrize("method", METHODS)
def test_gae_hand_case(wrap, method):
    f = wrap(functools.partial(gae, gamma=0.9, gae_lambda=0.95, method=method))
    adv, ret = f(**HAND)
    assert adv.dtype == jnp.float32 and ret.dtype == jnp.float32
    np.testing.assert_allclose(adv, HAND_ADV, atol=1e-5)
    np.testing.assert_allclose(ret, HAND_RET, atol=1e-5)


def test_gae_positional_issue_order(wrap):
    h = HAND
    f = wrap(lambda *a: gae(*a, 0.9, 0.95))
    adv, ret = f(h["reward"], h["value"], h["terminated"], h["truncated"], h["final_value"], h["last_value"])
    np.testing.assert_allclose(adv, HAND_ADV, atol=1e-5)
    np.testing.assert_allclose(ret, HAND_RET, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_lambda_and_discounted_hand_case(wrap, method):
    lam = wrap(functools.partial(lambda_returns, gamma=0.9, lambda_=0.95, method=method))(**HAND)
    np.testing.assert_allclose(lam, HAND_RET, atol=1e-5)
    kw = {k: v for k, v in HAND.items() if k != "value"}
    disc = wrap(functools.partial(discounted_returns, gamma=0.9, method=method))(**kw)
    # t4: 1 + .9 * 1 | t3: 1 (terminated) | t2: 1 + .9 * 1 | t1: 1 + .9 * 2 | t0: 1 + .9 * 2.8
    np.testing.assert_allclose(disc, [3.52, 2.8, 1.9, 1.0, 1.9], atol=1e-5)


def test_gae_terminated_and_truncated_counts_as_terminated(wrap):
    both = dict(HAND, truncated=np.array([0, 1, 0, 1, 0], bool), final_value=np.full(5, 7.0, np.float32))
    adv, _ = wrap(functools.partial(gae, gamma=0.9, gae_lambda=0.95))(**both)
    assert abs(float(adv[3]) - 0.2) < 1e-6  # 1 - 0.8: final_value 7.0 not bootstrapped
    assert abs(float(adv[1]) - (1 + 0.9 * 7.0 - 0.6)) < 1e-5  # the plain truncation still reads it


def test_gae_without_truncation_arguments(wrap):
    h = HAND
    f = wrap(lambda r, v, te, lv: gae(r, v, te, last_value=lv, gamma=0.9, gae_lambda=0.95))
    adv, _ = f(h["reward"], h["value"], h["terminated"], h["last_value"])
    # no truncation at t=1: the trace runs t=0..3, bootstrapping value[2] at t=1
    a2 = 1 + 0.9 * 0.8 - 0.7 + 0.855 * 0.2
    a1 = 1 + 0.9 * 0.7 - 0.6 + 0.855 * a2
    np.testing.assert_allclose(adv[:3], [1 + 0.9 * 0.6 - 0.5 + 0.855 * a1, a1, a2], atol=1e-5)


# ------------------------------------------------------------------------------------------
# n-step hand cases
# ------------------------------------------------------------------------------------------


def test_n_step_hand_case_with_ends(wrap):
    f = wrap(functools.partial(n_step_returns, gamma=0.9, n=2))
    out = f(**HAND)
    assert isinstance(out, NStepReturns)
    # t0: window [0, 1], ends at the truncation: 1 + .9 + .81 * final_value[1]
    # t1: truncated itself: 1 + .9 * 2      t2: window [2, 3], terminated at 3: 1 + .9, discount 0
    # t3: terminated: 1, discount 0         t4: rollout end: 1 + .9 * last_value
    np.testing.assert_allclose(out.target, [1 + 0.9 + 0.81 * 2, 2.8, 1.9, 1.0, 1.9], atol=1e-5)
    np.testing.assert_array_equal(out.num_steps, [2, 1, 2, 1, 1])
    np.testing.assert_allclose(out.discount, [0.81, 0.9, 0.0, 0.0, 0.9], atol=1e-6)
    assert out.num_steps.dtype == jnp.int32 and out.discount.dtype == jnp.float32


def test_n_step_hand_case_full_windows(wrap):
    r = np.array([1, 2, 3, 4, 5], np.float32)
    v = np.array([10, 20, 30, 40, 50], np.float32)
    no = np.zeros(5, bool)
    f = wrap(lambda r, v, te, lv: n_step_returns(r, v, te, last_value=lv, gamma=0.5, n=2))
    out = f(r, v, no, np.float32(60))
    # full windows bootstrap value[t + 2]; the window of t=3 bootstraps last_value; t=4 is cut to k=1
    np.testing.assert_allclose(out.target, [1 + 1 + 7.5, 2 + 1.5 + 10, 3 + 2 + 12.5, 4 + 2.5 + 15, 5 + 30], atol=1e-5)
    np.testing.assert_array_equal(out.num_steps, [2, 2, 2, 2, 1])
    np.testing.assert_allclose(out.discount, [0.25, 0.25, 0.25, 0.25, 0.5])


def test_n_step_termination_and_truncation_inside_window(wrap):
    r = np.array([1, 1, 1, 1, 1, 1], np.float32)
    v = np.array([0, 100, 100, 100, 100, 100], np.float32)  # reset-state values: must never be read
    term = np.array([0, 0, 1, 0, 0, 0], bool)
    trunc = np.array([0, 0, 0, 0, 1, 0], bool)
    fv = np.array([np.nan, np.nan, np.nan, np.nan, 8.0, np.nan], np.float32)
    f = wrap(functools.partial(n_step_returns, gamma=0.5, n=4))
    out = f(r, v, term, trunc, fv, np.float32(4.0))
    # t0: [0, 2] terminated -> 1 + .5 + .25; t3: [3, 4] truncated -> 1 + .5 + .25 * 8; t5: 1 + .5 * 4
    np.testing.assert_allclose(out.target, [1.75, 1.5, 1.0, 3.5, 5.0, 3.0], atol=1e-5)
    np.testing.assert_array_equal(out.num_steps, [3, 2, 1, 2, 1, 1])
    np.testing.assert_allclose(out.discount, [0, 0, 0, 0.25, 0.5, 0.5])


# ------------------------------------------------------------------------------------------
# against rlax
# ------------------------------------------------------------------------------------------


def rlax_gae(reward, value, terminated, last_value, gamma, gae_lambda):
    """rlax on [T, N]: one stream per env (vmapped), discounts from terminations."""
    discount = gamma * (1.0 - terminated.astype(reward.dtype))
    values = jnp.concatenate([value, last_value[None]], axis=0)

    def one(r_t, discount_t, values):
        return rlax.truncated_generalized_advantage_estimation(r_t, discount_t, gae_lambda, values)

    return jax.vmap(one, in_axes=(1, 1, 1), out_axes=1)(reward, discount, values)


rlax_gae_jit = jax.jit(rlax_gae)


def close(got, want) -> None:
    """float32 equality up to rounding: relative 1e-5, and absolute 1e-5 of the largest magnitude (an associative
    scan rounds its partial sums at their own size, so a small entry next to large ones carries their rounding)."""
    scale = max(1.0, float(np.max(np.abs(np.asarray(want, np.float64)))))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("method", METHODS)
@HYP
@given(seed=st.integers(0, 2**31 - 1), T=st.sampled_from([1, 50, 300]), N=st.sampled_from([1, 8]), gamma=gammas,
       lam=lambdas, p_term=st.sampled_from([0.0, 0.02, 0.2]))
@example(seed=624, T=300, N=1, gamma=0.99, lam=1.0, p_term=0.0)  # a small advantage beside returns near 7
def test_gae_matches_rlax_without_truncation(method, seed, T, N, gamma, lam, p_term):
    r, v, term, _, _, lv = make_rollout(seed, T, (N,), p_term=p_term, p_trunc=0.0)
    expected = rlax_gae_jit(r, v, term, lv, f32(gamma), f32(lam))
    adv, ret = JIT["gae"](r, v, term, last_value=lv, gamma=f32(gamma), gae_lambda=f32(lam), method=method)
    close(adv, expected)
    close(ret, expected + v)


@pytest.mark.parametrize("method", METHODS)
def test_gae_matches_rlax_eager_and_jit(wrap, method):
    r, v, term, _, _, lv = make_rollout(11, 16, (4,), p_term=0.1, p_trunc=0.0)
    expected = rlax_gae(r, v, term, lv, 0.99, 0.95)
    adv, _ = wrap(functools.partial(gae, gamma=0.99, gae_lambda=0.95, method=method))(r, v, term, last_value=lv)
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------
# against the numpy reference (with truncations, trailing batch axes)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@HYP
@given(ro=rollouts, gamma=gammas, lam=lambdas)
def test_gae_and_lambda_returns_match_reference(method, ro, gamma, lam):
    arrays = make_rollout(**ro)
    adv_ref, ret_ref = ref_batched(ref_gae, *[a.astype(np.float64) for a in arrays], gamma=gamma, lam=lam)
    adv, ret = JIT["gae"](*arrays, gamma=f32(gamma), gae_lambda=f32(lam), method=method)
    close(adv, adv_ref)
    close(ret, ret_ref)
    lam_ret = JIT["lambda_returns"](*arrays, gamma=f32(gamma), lambda_=f32(lam), method=method)
    close(lam_ret, ret)


@HYP
@given(ro=rollouts.filter(lambda d: d["T"] <= 12), gamma=gammas, lam=lambdas)
def test_lambda_returns_match_sutton_barto_weighting(ro, gamma, lam):
    arrays = make_rollout(**ro)
    (expected,) = ref_batched(ref_lambda_returns, *[a.astype(np.float64) for a in arrays], gamma=gamma, lam=lam)
    got = JIT["lambda_returns"](*arrays, gamma=f32(gamma), lambda_=f32(lam))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@HYP
@given(ro=rollouts, gamma=gammas, n=st.sampled_from([1, 3, 8]))
def test_n_step_matches_reference(ro, gamma, n):
    arrays = make_rollout(**ro)
    target, ks, disc = ref_batched(ref_n_step, *[a.astype(np.float64) for a in arrays], gamma=gamma, n=n)
    out = JIT["n_step_returns"](*arrays, gamma=f32(gamma), n=n)
    np.testing.assert_allclose(out.target, target, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out.num_steps, ks)
    np.testing.assert_allclose(out.discount, disc, rtol=1e-6)


# ------------------------------------------------------------------------------------------
# properties
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@HYP
@given(seed=st.integers(0, 2**31 - 1), T=st.sampled_from([2, 9, 33]), end_frac=st.floats(0.0, 0.95),
       kind=st.sampled_from(["terminated", "truncated", "both"]), gamma=gammas, lam=lambdas,
       poison=st.sampled_from([None, np.inf, -np.inf, np.nan]))
@example(seed=0, T=9, end_frac=0.95, kind="terminated", gamma=0.9, lam=0.95, poison=np.nan)
def test_nothing_leaks_across_an_episode_end(method, seed, T, end_frac, kind, gamma, lam, poison):
    """Outputs up to an episode end do not depend on anything after it, non-finite values included (a diverging
    critic's `inf` or `NaN` in the next episode's values or in `last_value`)."""
    r, v, term, trunc, fv, lv = make_rollout(seed, T, (3,), p_term=0.0, p_trunc=0.0, nan_final=False)
    e = min(int(end_frac * T), T - 2)  # the episode ends after step e; steps > e are the next episode
    term[e] = kind in ("terminated", "both")
    trunc[e] = kind in ("truncated", "both")
    rng = np.random.default_rng(seed + 1)
    r2, v2, fv2 = r.copy(), v.copy(), fv.copy()
    r2[e + 1:] += rng.normal(size=r2[e + 1:].shape).astype(np.float32) * 10
    v2[e + 1:] += rng.normal(size=v2[e + 1:].shape).astype(np.float32) * 10
    fv2[e + 1:] += 5
    lv2 = lv + 3
    if poison is not None:
        v2[e + 1], lv2 = poison, np.full_like(lv, poison)
    g, lam = f32(gamma), f32(lam)
    f = functools.partial(JIT["gae"], gamma=g, gae_lambda=lam, method=method)
    adv1, ret1 = f(r, v, term, trunc, fv, lv)
    adv2, ret2 = f(r2, v2, term, trunc, fv2, lv2)
    np.testing.assert_array_equal(adv1[: e + 1], adv2[: e + 1])
    np.testing.assert_array_equal(ret1[: e + 1], ret2[: e + 1])
    # and the perturbation does reach the later steps (the test can see a dependence)
    assert not np.allclose(adv1[e + 1:], adv2[e + 1:])
    for other in (
        lambda *a: JIT["lambda_returns"](*a, gamma=g, lambda_=lam, method=method),
        lambda r, v, te, tr, fv, lv: JIT["discounted_returns"](r, te, tr, fv, lv, g, method=method),
        lambda *a: JIT["n_step_returns"](*a, gamma=g, n=T).target,
    ):
        np.testing.assert_array_equal(other(r, v, term, trunc, fv, lv)[: e + 1],
                                      other(r2, v2, term, trunc, fv2, lv2)[: e + 1])


@pytest.mark.parametrize("method", METHODS)
@HYP
@given(seed=st.integers(0, 2**31 - 1), T=st.sampled_from([1, 9, 60]), gamma=gammas)
def test_lambda_one_without_ends_gives_discounted_returns(method, seed, T, gamma):
    r, v, term, trunc, _, lv = make_rollout(seed, T, (4,), p_term=0.0, p_trunc=0.0)
    _, ret = JIT["gae"](r, v, term, last_value=lv, gamma=f32(gamma), gae_lambda=f32(1), method=method)
    disc = JIT["discounted_returns"](r, term, last_value=lv, gamma=f32(gamma), method=method)
    np.testing.assert_allclose(ret, disc, rtol=1e-5, atol=1e-5)
    # independent: sum_i gamma^i r_{t+i} + gamma^(T-t) last_value
    r64 = r.astype(np.float64)
    expected = np.stack([sum(gamma**i * r64[t + i] for i in range(T - t)) + gamma ** (T - t) * lv for t in range(T)])
    np.testing.assert_allclose(disc, expected, rtol=1e-5, atol=1e-5)


@HYP
@given(ro=rollouts, gamma=gammas, extra=st.sampled_from([0, 3]))
def test_n_step_with_n_at_least_T_is_discounted_returns(ro, gamma, extra):
    arrays = make_rollout(**ro)
    r, v, te, tr, fv, lv = arrays
    n = ro["T"] + extra
    out = JIT["n_step_returns"](*arrays, gamma=f32(gamma), n=n)
    disc = JIT["discounted_returns"](r, te, tr, fv, lv, f32(gamma))
    np.testing.assert_allclose(out.target, disc, rtol=1e-5, atol=1e-5)


def test_multiple_trailing_batch_axes_equal_columnwise(wrap):
    arrays = make_rollout(7, 9, (3, 4), p_term=0.1, p_trunc=0.1)
    for method in METHODS:
        adv, ret = wrap(functools.partial(gae, gamma=0.97, gae_lambda=0.9, method=method))(*arrays)
        assert adv.shape == (9, 3, 4)
        for i in range(3):
            for j in range(4):
                col = [a[:, i, j] for a in arrays[:5]] + [arrays[5][i, j]]
                a1, r1 = JIT["gae"](*col, gamma=f32(0.97), gae_lambda=f32(0.9), method=method)
                np.testing.assert_allclose(adv[:, i, j], a1, rtol=1e-6, atol=1e-6)
                np.testing.assert_allclose(ret[:, i, j], r1, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_inputs_are_computed_in_float32(dtype):
    """bfloat16 / float16 inputs give results in their dtype, computed in float32 and rounded once:
    each result is within one rounding of the float64 reference with gamma = 0.99 (in bfloat16
    itself gamma rounds to 0.98828125 and the return of 200 rewards of 1 would be ~76 instead of
    ~86.6)."""
    r, v, term, trunc, fv, lv = make_rollout(3, 200, p_term=0.0, p_trunc=0.02, nan_final=False)
    r = np.abs(r) + 0.5  # positive rewards: long discounted sums, where gamma's rounding shows
    low = [jnp.asarray(x, dtype) for x in (r, v, fv, lv)]
    r, v, fv, lv = (np.asarray(x, np.float64) for x in low)  # the inputs as the function sees them
    args = dict(terminated=jnp.asarray(term), truncated=jnp.asarray(trunc), final_value=low[2], last_value=low[3])
    eps = float(jnp.finfo(dtype).eps)
    cases = [
        (gae(low[0], low[1], gamma=0.99, gae_lambda=0.95, **args), ref_gae(r, v, term, trunc, fv, lv, 0.99, 0.95)),
        (lambda_returns(low[0], low[1], gamma=0.99, lambda_=0.95, **args), ref_lambda_returns(r, v, term, trunc, fv, lv, 0.99, 0.95)),
        (discounted_returns(low[0], gamma=0.99, **args), ref_lambda_returns(r, np.zeros_like(v), term, trunc, fv, lv, 0.99, 1.0)),
        (n_step_returns(low[0], low[1], gamma=0.99, n=50, **args)[::2], ref_n_step(r, v, term, trunc, fv, lv, 0.99, 50)[::2]),
    ]
    for got, want in cases:
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert g.dtype == dtype
            np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=2 * eps, atol=1e-3)


def test_traced_gamma_and_lambda_under_jit():
    arrays = make_rollout(3, 20, (2,))
    f = jax.jit(lambda g, lam: gae(*arrays, gamma=g, gae_lambda=lam))
    adv, _ = f(jnp.float32(0.9), jnp.float32(0.95))
    expected, _ = gae(*arrays, gamma=0.9, gae_lambda=0.95)
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["scan", "associative"])
def test_eager_calls_compile_once(compile_counter, method):
    arrays = make_rollout(5, 16, (3,))
    calls = [
        lambda g: gae(*arrays, gamma=g, gae_lambda=0.95, method=method),
        lambda g: lambda_returns(*arrays, gamma=g, lambda_=0.95, method=method),
        lambda g: discounted_returns(arrays[0], *arrays[2:], gamma=g, method=method),
        lambda g: n_step_returns(*arrays, gamma=g, n=3),
    ]
    for f in calls:
        jax.block_until_ready(f(0.9))
    with compile_counter() as n:
        for f in calls:
            for g in (0.9, 0.95, 0.99):  # the same call again, and new hyperparameters: no new program
                jax.block_until_ready(f(g))
    assert n() == 0


def test_gradients_flow_through_values():
    arrays = make_rollout(4, 10, (2,), p_trunc=0.0, nan_final=False)
    g = jax.grad(lambda v: gae(arrays[0], v, *arrays[2:], gamma=0.9, gae_lambda=0.95)[0].sum())(arrays[1])
    assert np.all(np.isfinite(g)) and np.any(g != 0)


# ------------------------------------------------------------------------------------------
# scan vs associative, long horizons
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 2, 7, 128, 2048])
@pytest.mark.parametrize("gamma,lam", [(0.9, 0.95), (0.99, 0.95), (0.999, 1.0), (1.0, 1.0)])
def test_scan_and_associative_agree(T, gamma, lam):
    p = 0.0 if T == 2048 and gamma == 1.0 else 0.01  # one includes a 2048-step undiscounted trace
    arrays = make_rollout(T * 31 + 5, T, (8,), p_term=p, p_trunc=p)
    if T == 2048:  # all-positive rewards: returns grow to ~min(T, 1 / (1 - gamma)), the hard case
        arrays = (np.abs(arrays[0]) + 1,) + arrays[1:]
    g, lam = f32(gamma), f32(lam)
    for name, kw in (
        ("gae", dict(gamma=g, gae_lambda=lam)),
        ("lambda_returns", dict(gamma=g, lambda_=lam)),
        ("discounted_returns", dict(gamma=g)),
    ):
        args = arrays if name != "discounted_returns" else (arrays[0],) + arrays[2:]
        s = JIT[name](*args, **kw, method="scan")
        a = JIT[name](*args, **kw, method="associative")
        for xs, xa in zip(jax.tree.leaves(s), jax.tree.leaves(a)):
            scale = max(1.0, float(np.max(np.abs(xs))))  # relative to the largest magnitude
            np.testing.assert_allclose(xa, xs, rtol=1e-5, atol=1e-5 * scale)


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------

GOOD = make_rollout(0, 6, (2,))
KW = dict(gamma=0.9, gae_lambda=0.95)


def call_gae(**changes):
    names = ["reward", "value", "terminated", "truncated", "final_value", "last_value"]
    args = dict(zip(names, GOOD))
    args.update(changes)
    args = {k: v for k, v in args.items() if v is not _DROP}
    return gae(**args, **{k: v for k, v in KW.items() if k not in changes})


_DROP = object()


@pytest.mark.parametrize(
    "changes,exc,words",
    [
        (dict(terminated=GOOD[2].astype(np.int32)), TypeError, ["terminated", "bool", "int32"]),
        (dict(truncated=GOOD[3].astype(np.float32)), TypeError, ["truncated", "bool", "float32"]),
        (dict(reward=GOOD[0].astype(np.int32)), TypeError, ["reward", "floating"]),
        (dict(value=GOOD[1].astype(np.float16)), TypeError, ["value", "float32", "float16"]),
        (dict(value=GOOD[1].astype(np.float64)), TypeError, ["value", "float64"]),
        (dict(value=GOOD[1][:5]), ValueError, ["value", "(6, 2)", "(5, 2)"]),
        (dict(terminated=GOOD[2][:, :1]), ValueError, ["terminated", "(6, 2)", "(6, 1)"]),
        (dict(final_value=GOOD[4][None]), ValueError, ["final_value", "(1, 6, 2)"]),
        (dict(last_value=GOOD[5][None]), ValueError, ["last_value", "(2,)", "(1, 2)"]),
        (dict(last_value=1.0), ValueError, ["last_value", "(2,)"]),
        (dict(reward=np.float32(1.0)), ValueError, ["reward", "rank"]),
        (dict(final_value=_DROP), ValueError, ["truncated", "final_value"]),
        (dict(truncated=_DROP), ValueError, ["final_value", "truncated"]),
        (dict(last_value=_DROP), TypeError, ["last_value"]),
        (dict(gamma=1.5), ValueError, ["gamma", "[0, 1]", "1.5"]),
        (dict(gae_lambda=-0.1), ValueError, ["gae_lambda", "[0, 1]"]),
        (dict(gamma=float("nan")), ValueError, ["gamma"]),
        (dict(gamma=jnp.ones(2) * 0.9), ValueError, ["gamma", "scalar"]),
        (dict(gamma=True), TypeError, ["gamma", "got True"]),
        (dict(gamma=1 + 0j), TypeError, ["gamma", "(1+0j)"]),
        (dict(gamma="0.9"), TypeError, ["gamma", "str"]),
        (dict(gamma=None), TypeError, ["gamma"]),
        (dict(method="cumsum"), ValueError, ["method", "cumsum", "associative"]),
    ],
)
def test_gae_bad_input(changes, exc, words):
    with pytest.raises(exc) as info:
        call_gae(**changes)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_integer_gamma_and_lambda_are_numbers_also_traced():
    """An integer discount is a number like any other: a Python 1 passed through jit arrives as an
    int32 tracer (it was refused with "must have a floating dtype")."""
    r, v, term, trunc, fv, lv = make_rollout(0, 6)
    want = gae(r, v, term, trunc, fv, lv, gamma=1.0, gae_lambda=1.0)
    for g in (1, np.int64(1), jnp.int32(1)):
        for got in (gae(r, v, term, trunc, fv, lv, gamma=g, gae_lambda=g), jax.jit(gae)(r, v, term, trunc, fv, lv, gamma=g, gae_lambda=g)):
            np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(jax.jit(discounted_returns)(r, term, trunc, fv, lv, 1), discounted_returns(r, term, trunc, fv, lv, 1.0))


def test_bad_input_fails_at_trace_time_under_jit():
    r, v, te, tr, fv, lv = GOOD
    with pytest.raises(TypeError, match="terminated"):
        jax.jit(lambda te: gae(r, v, te, tr, fv, lv, 0.9, 0.95))(te.astype(np.int32))
    with pytest.raises(ValueError, match="last_value"):
        jax.jit(lambda lv: gae(r, v, te, tr, fv, lv, 0.9, 0.95))(lv[:1])


def test_batch_major_input_is_told_inputs_are_time_major():
    """reward [N, T] with last_value [N]: the last_value shape error says which axis is time."""
    n, t = 4, 16
    r, v, te = np.zeros((n, t), np.float32), np.zeros((n, t), np.float32), np.zeros((n, t), bool)
    lv = np.zeros(n, np.float32)
    hint = "inputs are time-major: reward [T, N], last_value [N]"
    for f in (lambda: gae(r, v, te, last_value=lv, gamma=0.9, gae_lambda=0.95),
              lambda: jax.jit(lambda lv: gae(r, v, te, last_value=lv, gamma=0.9, gae_lambda=0.95))(lv),
              lambda: lambda_returns(r, v, te, last_value=lv, gamma=0.9, lambda_=0.95),
              lambda: discounted_returns(r, te, last_value=lv, gamma=0.9)):
        with pytest.raises(ValueError, match=r"last_value: expected shape \(16,\), got \(4,\)") as info:
            f()
        assert hint in str(info.value) and "(4, 16) reads as T=4 steps; transpose" in str(info.value), str(info.value)


def test_transpose_is_advised_only_for_the_transposed_shape():
    """reward [T, N] with a scalar (or another wrong) last_value is not batch-major: no advice to transpose (it was
    given for every last_value shape error)."""
    t, n = 16, 4
    r, v, te = np.zeros((t, n), np.float32), np.zeros((t, n), np.float32), np.zeros((t, n), bool)
    for lv in (np.float32(0.5), np.zeros(n + 1, np.float32), np.zeros((t, n), np.float32)):
        with pytest.raises(ValueError, match=r"last_value: expected shape \(4,\)") as info:
            gae(r, v, te, last_value=lv, gamma=0.9, gae_lambda=0.95)
        assert "inputs are time-major" in str(info.value) and "transpose" not in str(info.value), str(info.value)


def test_other_functions_check_inputs():
    r, v, te, tr, fv, lv = GOOD
    with pytest.raises(ValueError, match="n"):
        n_step_returns(r, v, te, tr, fv, lv, 0.9, n=0)
    with pytest.raises(ValueError, match="n"):
        n_step_returns(r, v, te, tr, fv, lv, 0.9, n=2.0)
    with pytest.raises(TypeError, match="terminated"):
        discounted_returns(r, te.astype(np.float32), tr, fv, lv, 0.9)
    with pytest.raises(ValueError, match="lambda_"):
        lambda_returns(r, v, te, tr, fv, lv, 0.9, 2.0)
    with pytest.raises(ValueError, match="method"):
        lambda_returns(r, v, te, tr, fv, lv, 0.9, 0.5, method="parallel")
    with pytest.raises(TypeError, match="gamma"):
        discounted_returns(r, te, tr, fv, lv)


def test_wide_batch_matches_reference():
    batch = (2, 64)
    arrays = make_rollout(21, 12, batch, p_term=0.15, p_trunc=0.15)
    a64 = [a.astype(np.float64) for a in arrays]
    adv_ref, ret_ref = ref_batched(ref_gae, *a64, gamma=0.95, lam=0.9)
    (lam_ref,) = ref_batched(ref_lambda_returns, *a64, gamma=0.95, lam=0.7)
    (disc_ref,) = ref_batched(ref_n_step, *a64, gamma=0.95, n=100)[:1]
    for method in METHODS:
        adv, ret = JIT["gae"](*arrays, gamma=f32(0.95), gae_lambda=f32(0.9), method=method)
        np.testing.assert_allclose(adv, adv_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret, ret_ref, rtol=1e-5, atol=1e-5)
        lam = JIT["lambda_returns"](*arrays, gamma=f32(0.95), lambda_=f32(0.7), method=method)
        np.testing.assert_allclose(lam, lam_ref, rtol=1e-5, atol=1e-5)
        r, _, te, tr, fv, lv = arrays
        disc = JIT["discounted_returns"](r, te, tr, fv, lv, f32(0.95), method=method)
        np.testing.assert_allclose(disc, disc_ref, rtol=1e-5, atol=1e-5)
