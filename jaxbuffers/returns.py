"""Return and advantage estimators over time-major rollouts: GAE, lambda-, discounted and n-step returns.

All functions are pure and jittable. They work on whole rollouts, time-major, with any number
of trailing batch axes (``[T]``, ``[T, N]``, ``[T, N, M]``, ...); there is no need to ``vmap``
over environments.

.. _returns-conventions:

Conventions (shared by every function in this module)
-----------------------------------------------------

These are the step conventions of ``docs/guide.md`` (section 2). Step ``t`` (``0 <= t < T``) is the transition
``obs_t --action_t--> obs_{t+1}``, and every ``[T, ...]`` argument is indexed by that step:

==================  ============  =====================================================================
argument            shape         meaning at index ``t``
==================  ============  =====================================================================
``reward``          ``[T, *B]``   ``r_t``, the reward received on step ``t`` (float)
``value``           ``[T, *B]``   ``V(obs_t)``, the value of the state the step *starts* from (float)
``terminated``      ``[T, *B]``   ``obs_{t+1}`` is terminal: its value is 0, nothing is bootstrapped (bool)
``truncated``       ``[T, *B]``   the episode was cut after step ``t`` (time limit); ``obs_{t+1}`` is not
                                  terminal and is bootstrapped from ``final_value[t]`` (bool)
``final_value``     ``[T, *B]``   ``V(obs_{t+1})`` of the real last observation, before the auto-reset;
                                  read **only** where ``truncated[t]`` (elsewhere it may hold anything,
                                  even NaN) (float)
``last_value``      ``[*B]``      ``V(obs_T)``, the value of the observation after the rollout (float)
==================  ============  =====================================================================

A step that is both ``terminated`` and ``truncated`` counts as **terminated** (no bootstrap):
the terminal state has value 0 whatever the time limit says. An *episode end* is a step that is
terminated or truncated. After an episode end, ``value[t + 1]`` is the value of the first
observation of the *next* episode, so it is never used for step ``t``, and no reward, value
or trace ever crosses an episode end.

Everything is built on the value the step bootstraps from, ``V_next[t]``:

.. math::

    V^{next}_t = \\begin{cases}
        0 & \\text{if terminated}_t \\\\
        \\text{final\\_value}_t & \\text{else if truncated}_t \\\\
        \\text{value}_{t+1} & \\text{else if } t < T - 1 \\\\
        \\text{last\\_value} & \\text{else } (t = T - 1)
    \\end{cases}

and on the indicator ``d_t = terminated_t or truncated_t``, which cuts every trace.

*Index convention.* "Rewards at times [t, t+k-1]" means ``reward[t], ..., reward[t+k-1]``:
the reward of the step starting at ``obs_t`` carries index ``t``. This is one less than the
Sutton & Barto / rlax convention, where the same reward is called ``r_{t+1}``; our
``reward[t]`` is rlax's ``r_t[t]`` in a sequence ``r_t`` at times ``[1, T]``.

*The end of the rollout* (``t = T - 1`` without an episode end) is not an episode end: every
function bootstraps there from ``last_value`` (pass zeros to disable).

*Dtypes.* Flags must be ``bool`` (``x.astype(bool)`` for 0/1 arrays) and all float arguments
must share one floating dtype; nothing is cast silently. A Python ``float`` is accepted for
``last_value`` when the batch shape is ``()``. ``gamma`` and the lambdas are scalars (Python
numbers or 0-d integer or float arrays, possibly traced; bools and complex numbers are refused);
when concrete they must lie in ``[0, 1]``.
All checks run at trace time and raise ``TypeError`` (dtype) or ``ValueError`` (shape, range).
Results have the dtype of ``reward``. Inputs of fewer than 32 bits (``bfloat16``, ``float16``) are
computed in ``float32`` and the results rounded to their dtype once, at the end: in ``bfloat16``
itself ``gamma = 0.99`` would round to ``0.98828125`` (an effective horizon of 85 steps instead of
100) and every step of the recursion would round again.

*Two evaluation strategies.* The backward recursions here are all affine,
``x_t = a_t x_{t+1} + b_t``. ``method="scan"`` (default) evaluates them with a reverse
``lax.scan`` (``T`` sequential steps, cheapest on CPU). ``method="associative"`` composes the
affine maps ``(a, b)`` with ``lax.associative_scan`` in ``O(log T)`` depth, meant for long
horizons on accelerators; on a CPU it is 2-6x slower than the scan at ``T = 2048``
(``docs/benchmarks.md``).
Both agree to float32 rounding: measured at ``T = 2048`` with all-positive rewards (returns up
to ~1600), the two differ by at most ~7e-6 relative (``gamma = 0.999, lambda = 1``; ~6e-7 at
``gamma = 0.99, lambda = 0.95``), each within 6e-6 of a float64 evaluation with the same float32
``gamma``. Note that rounding ``gamma = 0.999`` itself to float32 changes ``gamma**1000`` by
~1.3e-5 relative, more than either method's own error.

*Finite inputs.* ``final_value`` is selected with ``where``, so NaN/inf where it is not read
never propagate. The other float inputs must be finite: an episode end multiplies the later
trace by 0, and ``0 * inf`` is NaN.

References:
    Schulman, Moritz, Levine, Jordan, Abbeel (2016). *High-Dimensional Continuous Control Using
    Generalized Advantage Estimation*. ICLR 2016. https://arxiv.org/abs/1506.02438

    Sutton & Barto (2018). *Reinforcement Learning: An Introduction*, 2nd ed., sections 7.1
    (n-step returns) and 12.1 (the lambda-return).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxbuffers import _validate

__all__ = ["gae", "lambda_returns", "discounted_returns", "n_step_returns", "NStepReturns"]

_METHODS = ("scan", "associative")


class NStepReturns(NamedTuple):
    """Result of :func:`n_step_returns` (unpacks as ``target, num_steps, discount``)."""

    target: jax.Array  # shape=[T, *B], dtype=reward.dtype: the n-step return G_t^(k)
    num_steps: jax.Array  # shape=[T, *B], dtype=int32: k, rewards used (1 <= k <= n)
    discount: jax.Array  # shape=[T, *B], dtype=reward.dtype: gamma**k, or 0 after termination


# --------------------------------------------------------------------------------------------
# input checks (trace time)
# --------------------------------------------------------------------------------------------


def _missing(fn: str, name: str) -> TypeError:
    return TypeError(f"{fn}() missing required argument '{name}'")


def _as_array(fn: str, name: str, x: Any) -> jax.Array:
    if x is None:
        raise _missing(fn, name)
    dtype = getattr(x, "dtype", None)
    if dtype is not None and not isinstance(x, jax.core.Tracer):
        canonical = jax.dtypes.canonicalize_dtype(dtype)
        if canonical != dtype:  # e.g. numpy float64 with x64 off: JAX would narrow it silently
            raise TypeError(
                f"{fn}: `{name}` has dtype {dtype}, which JAX would narrow to {canonical} "
                f"(jax_enable_x64 is off); convert it explicitly with `.astype({canonical})`"
            )
    try:
        return jnp.asarray(x)
    except TypeError as e:
        raise TypeError(f"{fn}: `{name}` must be an array, got {type(x).__name__}") from e


def _check_scalar(fn: str, name: str, x: Any) -> Any:
    """gamma / lambda: a scalar in [0, 1] when its value is known at trace time
    (:func:`jaxbuffers._validate.scalar_parameter`)."""
    if x is None:
        raise _missing(fn, name)
    return _validate.scalar_parameter(f"{fn}: `{name}`", x, 0.0, 1.0)


def _check_rollout(
    fn: str,
    reward: Any,
    value: Any,
    terminated: Any,
    truncated: Any,
    final_value: Any,
    last_value: Any,
    *,
    need_value: bool = True,
) -> tuple[jax.Array, jax.Array | None, jax.Array, jax.Array | None, jax.Array | None, jax.Array]:
    """Checks ranks, shapes and dtypes against the conventions; returns the inputs as arrays."""
    reward = _as_array(fn, "reward", reward)
    if reward.ndim < 1:
        raise ValueError(f"{fn}: `reward` must be time-major [T, ...] with rank >= 1, got shape {reward.shape}")
    if reward.shape[0] < 1:
        raise ValueError(f"{fn}: `reward` must hold at least one step (T >= 1), got shape {reward.shape}")
    if not jnp.issubdtype(reward.dtype, jnp.floating):
        raise TypeError(f"{fn}: `reward` must have a floating dtype, got {reward.dtype}")
    dtype, shape, batch = reward.dtype, reward.shape, reward.shape[1:]

    def check_float(name: str, x: jax.Array, expected: tuple[int, ...], what: str) -> jax.Array:
        if x.shape != expected:
            raise ValueError(
                f"{fn}: `{name}` must have shape {what} = {expected} (from `reward` {shape}), got {x.shape}"
            )
        if x.dtype != dtype:
            raise TypeError(
                f"{fn}: `{name}` must have the dtype of `reward` ({dtype}), got {x.dtype}; "
                f"nothing is cast silently, convert with `.astype({dtype})`"
            )
        return x

    def check_flag(name: str, x: jax.Array) -> jax.Array:
        if x.shape != shape:
            raise ValueError(f"{fn}: `{name}` must have shape [T, *B] = {shape} (from `reward`), got {x.shape}")
        if x.dtype != jnp.bool_:
            raise TypeError(
                f"{fn}: `{name}` must have dtype bool, got {x.dtype}; "
                f"nothing is cast silently, pass `{name}.astype(bool)` for 0/1 flags"
            )
        return x

    if need_value:
        value = check_float("value", _as_array(fn, "value", value), shape, "[T, *B]")
    terminated = check_flag("terminated", _as_array(fn, "terminated", terminated))
    if truncated is None:
        if final_value is not None:
            raise ValueError(
                f"{fn}: `final_value` was given without `truncated`; it is read only where `truncated` "
                f"is True, so pass `truncated` too (or drop `final_value`)"
            )
    else:
        truncated = check_flag("truncated", _as_array(fn, "truncated", truncated))
        if final_value is None:
            raise ValueError(
                f"{fn}: `truncated` was given without `final_value`; a truncated step bootstraps from "
                f"`final_value` (V of the observation before the auto-reset), shape {shape}"
            )
        final_value = check_float("final_value", _as_array(fn, "final_value", final_value), shape, "[T, *B]")
    if isinstance(last_value, float) and batch == ():
        last_value = jnp.asarray(last_value, dtype)  # a Python scalar carries no dtype of its own
    last_value = check_float("last_value", _as_array(fn, "last_value", last_value), batch, "[*B]")
    return reward, value, terminated, truncated, final_value, last_value


def _widen(*xs: jax.Array | None) -> tuple:
    """The float inputs in the dtype the returns are computed in: at least float32 (module doc,
    *Dtypes*); ``None`` stays ``None``."""
    return tuple(None if x is None else x.astype(jnp.promote_types(x.dtype, jnp.float32)) for x in xs)


def _check_method(fn: str, method: Any) -> str:
    if method not in _METHODS:
        raise ValueError(f"{fn}: unknown `method` {method!r}; expected one of {_METHODS}")
    return method


# --------------------------------------------------------------------------------------------
# core
# --------------------------------------------------------------------------------------------


class _Steps(NamedTuple):
    """The per-step inputs, either all steps ([T, *B]) or one step ([*B]) inside the scan."""

    reward: jax.Array
    value: jax.Array | None
    terminated: jax.Array
    truncated: jax.Array | None
    final_value: jax.Array | None


def _bootstrap(step: _Steps, value_after: jax.Array) -> jax.Array:
    """V_next of the module docstring, given value_after = V(obs_{t+1}) as stored (value[t+1] or
    last_value). `where`, not products, so NaN in unread final_value slots cannot leak."""
    nxt = value_after
    if step.truncated is not None:
        nxt = jnp.where(step.truncated, step.final_value, nxt)
    return jnp.where(step.terminated, jnp.zeros((), nxt.dtype), nxt)


def _ended(step: _Steps) -> jax.Array:
    return step.terminated if step.truncated is None else step.terminated | step.truncated


def _value_after(steps: _Steps, last_value: jax.Array) -> jax.Array:
    """[T, *B]: value[t + 1], and last_value at t = T - 1."""
    return jnp.concatenate([steps.value[1:], last_value[None]], axis=0)


# Per-step width (prod of the batch shape) from which the scan evaluates (a_t, b_t) inside its
# body: one pass over memory, a win for wide batches (memory-bound); for narrow ones the extra
# ops per iteration cost more, so (a, b) are computed up front in one fused elementwise pass.
# Measured on a 2-core CPU (noisy): fused 1.1-1.6x faster at width 256, 1.4-1.8x slower at 32.
_FUSED_SCAN_MIN_WIDTH = 128


def _solve(coeffs, steps: _Steps, last_value: jax.Array, init: jax.Array, method: str) -> jax.Array:
    """Solves x_t = a_t * x_{t+1} + b_t for t = T-1, ..., 0 with x_T = init; returns x[0:T].

    (a_t, b_t) = coeffs(step_t, value_after_t) is elementwise, so it can be evaluated per step
    inside the scan (value[t + 1] carried along) or on whole arrays up front.
    """
    if method == "scan" and math.prod(init.shape) >= _FUSED_SCAN_MIN_WIDTH:

        def fused_body(carry, step):
            x_next, value_after = carry
            a_t, b_t = coeffs(step, value_after)
            x_t = a_t * x_next + b_t
            return (x_t, value_after if step.value is None else step.value), x_t

        _, xs = lax.scan(fused_body, (init, last_value), steps, reverse=True)
        return xs

    value_after = None if steps.value is None else _value_after(steps, last_value)
    a, b = coeffs(steps, value_after)
    if method == "scan":

        def body(x_next, ab):
            x_t = ab[0] * x_next + ab[1]
            return x_t, x_t

        _, xs = lax.scan(body, init, (a, b), reverse=True)
        return xs

    # Fold x_T into the last step, then compose the maps f_t(x) = a_t x + b_t from the end:
    # x_t = (f_t o f_{t+1} o ... o f_{T-1})(0). With reverse=True, combine(later, earlier).
    b = b.at[-1].add(a[-1] * init)

    def combine(later, earlier):
        a_l, b_l = later
        a_e, b_e = earlier
        return a_e * a_l, a_e * b_l + b_e

    _, xs = lax.associative_scan(combine, (a, b), reverse=True, axis=0)
    return xs


# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------


def gae(
    reward: jax.Array,
    value: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array | None = None,
    final_value: jax.Array | None = None,
    last_value: jax.Array | float | None = None,
    gamma: float | jax.Array | None = None,
    gae_lambda: float | jax.Array | None = None,
    *,
    method: str = "scan",
) -> tuple[jax.Array, jax.Array]:
    r"""Generalized advantage estimates and their returns (Schulman et al. 2016).

    Follows the conventions of the module docstring (step ``t`` is ``obs_t -> obs_{t+1}``;
    ``V_next`` is the bootstrap value of step ``t``; ``d_t`` = terminated or truncated):

    .. math::

        \delta_t = r_t + \gamma V^{next}_t - V(obs_t), \qquad
        A_t = \delta_t + \gamma \lambda (1 - d_t) A_{t+1}, \qquad A_T = 0,

    so ``A_t = sum_{l=0}^{k-1} (gamma lambda)^l delta_{t+l}`` over the steps ``[t, t+k-1]`` up
    to and including the first episode end (or the end of the rollout). A terminated step does
    not bootstrap; a truncated step bootstraps from ``final_value`` and the trace stops there.
    ``returns = advantages + value`` (the lambda-return targets for the value function, equal
    to :func:`lambda_returns` with the same ``lambda``).

    The arguments may be given in the order
    ``gae(reward, value, terminated, truncated, final_value, last_value, gamma, gae_lambda)``
    or by keyword, omitting ``truncated`` and ``final_value`` when there is no truncation.
    Gradients flow through every float input; wrap the result in ``jax.lax.stop_gradient``
    for targets.

    Args:
      reward: ``[T, *B]`` float, rewards at times ``[0, T-1]``.
      value: ``[T, *B]``, same dtype, ``V(obs_t)`` at times ``[0, T-1]``.
      terminated: ``[T, *B]`` bool.
      truncated: ``[T, *B]`` bool, or ``None`` (no truncation; then ``final_value`` must be None).
      final_value: ``[T, *B]``, same dtype, read only where ``truncated``; required with ``truncated``.
      last_value: ``[*B]``, same dtype, ``V(obs_T)``. Required.
      gamma: discount, scalar in ``[0, 1]``. Required.
      gae_lambda: GAE lambda, scalar in ``[0, 1]``. Required.
      method: ``"scan"`` (default) or ``"associative"``; static.

    Returns:
      ``(advantages, returns)``, both ``[T, *B]`` with the dtype of ``reward``.

    Raises:
      TypeError: a required argument is missing, a flag is not bool, or a float argument does not
        share the floating dtype of ``reward``.
      ValueError: shapes disagree with ``reward``, ``truncated`` comes without ``final_value`` (or
        the reverse), ``gamma``/``gae_lambda`` is concrete and outside ``[0, 1]``, or ``method`` is
        unknown.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxbuffers.returns import gae
      >>> adv, ret = gae(jnp.ones(3), jnp.zeros(3), jnp.array([False, True, False]),
      ...                last_value=jnp.float32(0.5), gamma=0.9, gae_lambda=1.0)
      >>> [round(a, 4) for a in adv.tolist()]  # 1 + 0.9 * 1, 1 (terminated), 1 + 0.9 * 0.5
      [1.9, 1.0, 1.45]
    """
    fn = "gae"
    method = _check_method(fn, method)
    gamma = _check_scalar(fn, "gamma", gamma)
    gae_lambda = _check_scalar(fn, "gae_lambda", gae_lambda)
    reward, value, terminated, truncated, final_value, last_value = _check_rollout(
        fn, reward, value, terminated, truncated, final_value, last_value
    )
    out = reward.dtype
    reward, value, final_value, last_value = _widen(reward, value, final_value, last_value)
    dtype = reward.dtype
    gamma_ = jnp.asarray(gamma, dtype)
    trace = gamma_ * jnp.asarray(gae_lambda, dtype)
    zero = jnp.zeros((), dtype)

    def coeffs(step, value_after):
        delta = step.reward + gamma_ * _bootstrap(step, value_after) - step.value
        return jnp.where(_ended(step), zero, trace), delta

    steps = _Steps(reward, value, terminated, truncated, final_value)
    advantages = _solve(coeffs, steps, last_value, jnp.zeros_like(last_value), method)
    return advantages.astype(out), (advantages + value).astype(out)


def lambda_returns(
    reward: jax.Array,
    value: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array | None = None,
    final_value: jax.Array | None = None,
    last_value: jax.Array | float | None = None,
    gamma: float | jax.Array | None = None,
    lambda_: float | jax.Array | None = None,
    *,
    method: str = "scan",
) -> jax.Array:
    r"""Lambda-returns (Sutton & Barto 2018, section 12.1), cut at episode ends.

    With the conventions of the module docstring (``V_next``, ``d_t``):

    .. math::

        G^\lambda_t = \begin{cases}
            r_t + \gamma V^{next}_t & \text{if } d_t \\
            r_t + \gamma \left[(1 - \lambda) V^{next}_t + \lambda G^\lambda_{t+1}\right] & \text{otherwise}
        \end{cases}, \qquad G^\lambda_T = \text{last\_value},

    i.e. the lambda-weighted mix of the n-step returns of :func:`n_step_returns` over rewards at
    times ``[t, t+k-1]``, each window stopping at the first episode end. ``lambda_ = 1`` gives
    :func:`discounted_returns`, ``lambda_ = 0`` the one-step TD target ``r_t + gamma V_next``.
    Equals the ``returns`` of :func:`gae` with ``gae_lambda = lambda_`` (computed independently).

    Args:
      reward, value, terminated, truncated, final_value, last_value: as in :func:`gae`.
      gamma: discount, scalar in ``[0, 1]``. Required.
      lambda_: mixing parameter, scalar in ``[0, 1]``. Required.
      method: ``"scan"`` (default) or ``"associative"``; static.

    Returns:
      ``[T, *B]`` lambda-returns, dtype of ``reward``.

    Raises:
      TypeError, ValueError: as in :func:`gae`.
    """
    fn = "lambda_returns"
    method = _check_method(fn, method)
    gamma = _check_scalar(fn, "gamma", gamma)
    lambda_ = _check_scalar(fn, "lambda_", lambda_)
    reward, value, terminated, truncated, final_value, last_value = _check_rollout(
        fn, reward, value, terminated, truncated, final_value, last_value
    )
    out = reward.dtype
    reward, value, final_value, last_value = _widen(reward, value, final_value, last_value)
    dtype = reward.dtype
    gamma_ = jnp.asarray(gamma, dtype)
    lam = jnp.asarray(lambda_, dtype)
    zero, one = jnp.zeros((), dtype), jnp.ones((), dtype)

    def coeffs(step, value_after):
        ended = _ended(step)
        b = step.reward + gamma_ * jnp.where(ended, one, one - lam) * _bootstrap(step, value_after)
        return jnp.where(ended, zero, gamma_ * lam), b

    steps = _Steps(reward, value, terminated, truncated, final_value)
    return _solve(coeffs, steps, last_value, last_value, method).astype(out)


def discounted_returns(
    reward: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array | None = None,
    final_value: jax.Array | None = None,
    last_value: jax.Array | float | None = None,
    gamma: float | jax.Array | None = None,
    *,
    method: str = "scan",
) -> jax.Array:
    r"""Discounted returns, bootstrapped at truncations and at the end of the rollout.

    With the conventions of the module docstring:

    .. math::

        G_t = r_t + \gamma \begin{cases}
            0 & \text{if terminated}_t \\
            \text{final\_value}_t & \text{else if truncated}_t \\
            G_{t+1} & \text{otherwise}
        \end{cases}, \qquad G_T = \text{last\_value},

    i.e. ``G_t = sum_{i=0}^{k-1} gamma^i r_{t+i} + gamma^k V_next_{t+k-1}`` over rewards at
    times ``[t, t+k-1]``, where ``t+k-1`` is the first episode end at or after ``t`` (or
    ``T-1``). Values are not needed except to bootstrap, so there is no ``value`` argument.
    Pass ``last_value = 0`` for Monte-Carlo returns that ignore the unfinished tail.

    Args:
      reward, terminated, truncated, final_value, last_value: as in :func:`gae`.
      gamma: discount, scalar in ``[0, 1]``. Required.
      method: ``"scan"`` (default) or ``"associative"``; static.

    Returns:
      ``[T, *B]`` returns, dtype of ``reward``.

    Raises:
      TypeError, ValueError: as in :func:`gae`.
    """
    fn = "discounted_returns"
    method = _check_method(fn, method)
    gamma = _check_scalar(fn, "gamma", gamma)
    reward, _, terminated, truncated, final_value, last_value = _check_rollout(
        fn, reward, None, terminated, truncated, final_value, last_value, need_value=False
    )
    out = reward.dtype
    reward, final_value, last_value = _widen(reward, final_value, last_value)
    dtype = reward.dtype
    gamma_ = jnp.asarray(gamma, dtype)
    zero = jnp.zeros((), dtype)

    def coeffs(step, value_after):  # value_after is never needed: G_{t+1} carries last_value
        b = step.reward
        if step.truncated is not None:
            b = b + jnp.where(step.truncated & ~step.terminated, gamma_ * step.final_value, zero)
        return jnp.where(_ended(step), zero, gamma_), b

    steps = _Steps(reward, None, terminated, truncated, final_value)
    return _solve(coeffs, steps, last_value, last_value, method).astype(out)


def n_step_returns(
    reward: jax.Array,
    value: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array | None = None,
    final_value: jax.Array | None = None,
    last_value: jax.Array | float | None = None,
    gamma: float | jax.Array | None = None,
    *,
    n: int,
) -> NStepReturns:
    r"""n-step bootstrapped returns (Sutton & Barto 2018, section 7.1), cut at episode ends.

    For each step ``t`` the window is the rewards at times ``[t, t+k-1]`` with

    ``k = min(n, e - t + 1, T - t)``, where ``e >= t`` is the first episode end at or after ``t``,

    i.e. the window stops early at a termination, at a truncation, or at the end of the rollout.
    With the conventions of the module docstring (``V_next``):

    .. math::

        G^{(k)}_t = \sum_{i=0}^{k-1} \gamma^i r_{t+i} + \gamma_t^{boot} \, V^{next}_{t+k-1},
        \qquad \gamma_t^{boot} = \begin{cases} 0 & \text{if terminated}_{t+k-1} \\
        \gamma^k & \text{otherwise} \end{cases}

    so the bootstrap value is ``value[t+n]`` for a full window inside the rollout,
    ``final_value[t+k-1]`` when the window ends at a truncation, ``last_value`` when it reaches
    the end of the rollout (``t + k = T``) and 0 after a termination. ``n >= T`` gives
    :func:`discounted_returns`. ``discount`` lets the caller re-bootstrap from another value
    estimate (e.g. a target network): ``target - discount * V_next[t+k-1] + discount * V'``.

    Cost: ``O(min(n, T) * T * B)``: one vectorised pass per window offset, in a ``lax.fori_loop``.

    Args:
      reward, value, terminated, truncated, final_value, last_value: as in :func:`gae`
        (``value[0]`` is never read: a bootstrap is always at least one step ahead).
      gamma: discount, scalar in ``[0, 1]``. Required.
      n: window length, a static Python ``int >= 1``.

    Returns:
      :class:`NStepReturns` ``(target, num_steps, discount)``: the targets ``G^(k)_t``
      (``[T, *B]``, dtype of ``reward``), ``k`` (``[T, *B]`` int32, ``1 <= k <= n``) and the
      bootstrap discount ``gamma**k`` or 0 (``[T, *B]``, dtype of ``reward``).

    Raises:
      TypeError, ValueError: as in :func:`gae`; ``n`` not an int ``>= 1``.
    """
    fn = "n_step_returns"
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{fn}: `n` must be a static Python int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"{fn}: `n` must be >= 1, got {n}")
    gamma = _check_scalar(fn, "gamma", gamma)
    reward, value, terminated, truncated, final_value, last_value = _check_rollout(
        fn, reward, value, terminated, truncated, final_value, last_value
    )
    out = reward.dtype
    reward, value, final_value, last_value = _widen(reward, value, final_value, last_value)
    dtype = reward.dtype
    T = reward.shape[0]
    gamma_ = jnp.asarray(gamma, dtype)
    steps = _Steps(reward, value, terminated, truncated, final_value)
    v_next = _bootstrap(steps, _value_after(steps, last_value))
    ended = _ended(steps)
    zero = jnp.zeros((), dtype)

    # Offset i of every window at once: y[t] = x[t + i], read from arrays padded past the end of
    # the rollout (rewards 0, flags False, `in_rollout` False). A fori_loop keeps compile time flat in n.
    def pad(x: jax.Array, fill) -> jax.Array:
        return jnp.concatenate([x, jnp.full(x.shape, fill, x.dtype)], axis=0)

    padded = (
        pad(reward, 0),
        pad(v_next, 0),
        pad(ended, False),
        pad(terminated, False),
        pad(jnp.zeros(reward.shape, jnp.bool_).at[-1].set(True), False),  # last step of the rollout
        pad(jnp.ones(reward.shape, jnp.bool_), False),  # inside the rollout
    )

    def body(i, carry):
        target, num_steps, discount, open_, gamma_i = carry
        r_i, v_i, end_i, term_i, last_i, in_i = (lax.dynamic_slice_in_dim(x, i, T, axis=0) for x in padded)
        active = open_ & in_i  # the window of t still reaches step t + i
        target = target + jnp.where(active, gamma_i * r_i, zero)
        num_steps = num_steps + active.astype(jnp.int32)
        closes = active & (end_i | last_i | (i == n - 1))
        boot = jnp.where(term_i, zero, gamma_i * gamma_)
        target = target + jnp.where(closes, boot * v_i, zero)
        discount = jnp.where(closes, boot, discount)
        return target, num_steps, discount, active & ~closes, gamma_i * gamma_

    init = (
        jnp.zeros_like(reward),
        jnp.zeros(reward.shape, jnp.int32),
        jnp.zeros_like(reward),
        jnp.ones(reward.shape, jnp.bool_),
        jnp.ones((), dtype),  # gamma ** i
    )
    target, num_steps, discount, _, _ = lax.fori_loop(0, min(n, T), body, init)
    return NStepReturns(target.astype(out), num_steps, discount.astype(out))
