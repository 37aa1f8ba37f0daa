"""GAE, lambda-, discounted and n-step returns over time-major rollouts `[T, *B]` (pure, jittable); step, bootstrap
($V^{next}_t$) and index conventions, evaluation methods, dtypes: `docs/api/rollout.md`, "Return functions"."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxbuffers import _validate

__all__ = ["gae", "lambda_returns", "discounted_returns", "n_step_returns", "NStepReturns"]


class NStepReturns(NamedTuple):
    """Result of `n_step_returns` (unpacks as `target, num_steps, discount`)."""

    target: jax.Array  # shape=[T, *B], dtype=reward.dtype: the n-step return G_t^(k)
    num_steps: jax.Array  # shape=[T, *B], dtype=int32: k, rewards used (1 <= k <= n)
    discount: jax.Array  # shape=[T, *B], dtype=reward.dtype: gamma**k, or 0 after termination


class _Rollout(NamedTuple):
    """Checked inputs, floats widened to at least float32."""

    reward: jax.Array
    value: jax.Array | None
    terminated: jax.Array
    truncated: jax.Array | None
    final_value: jax.Array | None
    last_value: jax.Array
    out: Any  # the dtype of the results: reward's

    @property
    def ended(self) -> jax.Array:
        """$d_t$: terminated or truncated."""
        return self.terminated if self.truncated is None else self.terminated | self.truncated

    def v_next(self) -> jax.Array:
        """$V^{next}_t$ (`gae`), `[T, *B]` (`where`, so unread NaN cannot leak)."""
        nxt = jnp.concatenate([self.value[1:], self.last_value[None]], axis=0)
        if self.truncated is not None:
            nxt = jnp.where(self.truncated, self.final_value, nxt)
        return jnp.where(self.terminated, jnp.zeros((), nxt.dtype), nxt)


def _check(fn: str, method, reward, value, terminated, truncated, final_value, last_value, need_value=True,
           **scalars) -> tuple:
    """The checked `_Rollout`, then each of `scalars` (in `[0, 1]`) as a scalar of the widened dtype (trace time)."""
    _validate.choice(f"{fn}: method", method, ("scan", "associative"))
    reward = _validate.array(f"{fn}: reward", reward, None, "floating")
    if reward.ndim < 1 or reward.shape[0] < 1:
        raise ValueError(f"{fn}: reward: expected time-major [T, *B] with rank >= 1 and T >= 1, got shape {reward.shape}")
    shape, dtype = reward.shape, reward.dtype
    if need_value:
        value = _validate.array(f"{fn}: value", value, shape, dtype)
    terminated = _validate.array(f"{fn}: terminated", terminated, shape, jnp.bool_)
    _validate.final_value_pair(f"{fn}: ", truncated, final_value)
    if truncated is not None:
        truncated = _validate.array(f"{fn}: truncated", truncated, shape, jnp.bool_)
        final_value = _validate.array(f"{fn}: final_value", final_value, shape, dtype)
    if type(last_value) is float:  # a Python scalar carries no dtype of its own (a numpy float64, a subclass, does)
        last_value = jnp.asarray(last_value, dtype)
    try:
        last_value = _validate.array(f"{fn}: last_value", last_value, shape[1:], dtype)
    except ValueError as e:  # its shape: batch-major inputs (reward [N, T], last_value [N]) give this shape
        transposed = len(shape) == 2 and tuple(jnp.shape(last_value)) == shape[:1]
        hint = "; transpose batch-major [N, T] inputs" if transposed else ""
        raise ValueError(f"{e}; inputs are time-major: reward [T, N], last_value [N] (reward {tuple(shape)} reads as "
                         f"T={shape[0]} steps{hint})") from None
    wide = jnp.promote_types(dtype, jnp.float32)
    widen = lambda x: None if x is None else x.astype(wide)  # noqa: E731
    ro = _Rollout(widen(reward), widen(value), terminated, truncated, widen(final_value), widen(last_value), dtype)
    return ro, *(jnp.asarray(_validate.scalar_parameter(f"{fn}: {k}", x, 0.0, 1.0), wide) for k, x in scalars.items())


@functools.partial(jax.jit, static_argnames="method")  # eager calls: one cached program, not a scan traced anew
def _solve(a: jax.Array, b: jax.Array, init: jax.Array, method: str) -> jax.Array:
    r"""$x_t = a_t x_{t+1} + b_t$ for $t = T-1, \dots, 0$ with $x_T$ = `init`; returns `x[0:T]`. Where $a_t = 0$
    (an episode end) $x_t = b_t$ exactly: a non-finite $x_{t+1}$ of the next episode is not read (no `0 * inf`)."""
    if method == "scan":
        return lax.scan(lambda x, ab: (_affine(ab[0], x, ab[1]),) * 2, init, (a, b), reverse=True)[1]
    # Fold x_T into the last step, then compose f_t(x) = a_t x + b_t from the end (reverse: combine(later, earlier)).
    b = b.at[-1].set(_affine(a[-1], init, b[-1]))
    combine = lambda later, earlier: (earlier[0] * later[0], _affine(earlier[0], later[1], earlier[1]))  # noqa: E731
    return lax.associative_scan(combine, (a, b), reverse=True, axis=0)[1]


def _affine(a: jax.Array, x: jax.Array, b: jax.Array) -> jax.Array:
    """`a * x + b`, and `b` where `a == 0` whatever `x` is."""
    return jnp.where(a == 0, b, a * x + b)


def gae(reward: jax.Array, value: jax.Array, terminated: jax.Array, truncated: jax.Array | None = None,
        final_value: jax.Array | None = None, last_value: jax.Array | float | None = None,
        gamma: float | jax.Array | None = None, gae_lambda: float | jax.Array | None = None, *,
        method: str = "scan") -> tuple[jax.Array, jax.Array]:
    r"""Generalized advantage estimates and their returns (Schulman et al. 2016).

    With $d_t$ = terminated$_t$ or truncated$_t$ and $V^{next}_t$ the bootstrap value (0 if terminated, else
    `final_value[t]` if truncated, else `value[t + 1]`, `last_value` at $t = T - 1$):

    $$
    \delta_t = r_t + \gamma V^{next}_t - V(o_t), \qquad
    A_t = \delta_t + \gamma \lambda (1 - d_t) A_{t+1}, \qquad A_T = 0,
    $$

    so $A_t = \sum_{l=0}^{k-1} (\gamma\lambda)^l \delta_{t+l}$ to the first episode end; `returns = advantages + value`.

    Args:
      reward: `[T, *B]` float, `reward[t]` = $r_t$ of step $t$.
      value: `[T, *B]`, `value[t]` = $V(o_t)$, the state step $t$ starts from.
      terminated: `[T, *B]` bool, `terminated[t]`: $o_{t+1}$ is terminal.
      truncated: `[T, *B]` bool, `truncated[t]`: the episode was cut after step $t$; or None.
      final_value: `[T, *B]`, $V(o_{t+1})$ before the auto-reset, read where `truncated[t]`; required with it.
      last_value: `[*B]`, $V(o_T)$, after the last step. Required.
      gamma: discount, scalar in $[0, 1]$. Required.
      gae_lambda: GAE $\lambda$, scalar in $[0, 1]$. Required.
      method: `"scan"` or `"associative"` (static; `docs/api/rollout.md`, "Evaluation").

    Returns:
      `(advantages, returns)`, both `[T, *B]` with the dtype of `reward`.

    Raises:
      TypeError: a required argument is missing, a flag is not bool, or a float argument's dtype is not `reward`'s.
      ValueError: shapes disagree with `reward`, `truncated` without `final_value` (or the reverse), a concrete
        `gamma` / `gae_lambda` outside $[0, 1]$, or an unknown `method`.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxbuffers.returns import gae
      >>> adv, ret = gae(jnp.ones(3), jnp.zeros(3), jnp.array([False, True, False]),
      ...                last_value=jnp.float32(0.5), gamma=0.9, gae_lambda=1.0)
      >>> [round(a, 4) for a in adv.tolist()]  # 1 + 0.9 * 1, 1 (terminated), 1 + 0.9 * 0.5
      [1.9, 1.0, 1.45]

    References:
      Schulman, Moritz, Levine, Jordan, Abbeel (2016). High-Dimensional Continuous Control Using
      Generalized Advantage Estimation. ICLR 2016. https://arxiv.org/abs/1506.02438
    """
    ro, gamma, lam = _check("gae", method, reward, value, terminated, truncated, final_value, last_value,
                            gamma=gamma, gae_lambda=gae_lambda)
    delta = ro.reward + gamma * ro.v_next() - ro.value
    a = jnp.where(ro.ended, jnp.zeros_like(lam), gamma * lam)
    advantages = _solve(a, delta, jnp.zeros_like(ro.last_value), method)
    return advantages.astype(ro.out), (advantages + ro.value).astype(ro.out)


def lambda_returns(reward: jax.Array, value: jax.Array, terminated: jax.Array, truncated: jax.Array | None = None,
                   final_value: jax.Array | None = None, last_value: jax.Array | float | None = None,
                   gamma: float | jax.Array | None = None, lambda_: float | jax.Array | None = None, *,
                   method: str = "scan") -> jax.Array:
    r"""Lambda-returns (Sutton & Barto 2018, section 12.1), cut at episode ends.

    With $V^{next}_t$ and $d_t$ of `gae`:

    $$
    G^\lambda_t = \begin{cases}
      r_t + \gamma V^{next}_t & \text{if } d_t \\
      r_t + \gamma \left[(1 - \lambda) V^{next}_t + \lambda G^\lambda_{t+1}\right] & \text{otherwise}
    \end{cases}, \qquad G^\lambda_T = \text{last\_value},
    $$

    $\lambda = 1$ gives `discounted_returns`; equals the `returns` of `gae` with `gae_lambda = lambda_`. The other
    arguments are as in `gae`.

    Args:
      lambda_: mixing parameter $\lambda$, scalar in $[0, 1]$. Required.

    Returns:
      `[T, *B]` lambda-returns, dtype of `reward`.

    Raises:
      TypeError, ValueError: as in `gae`.
    """
    ro, gamma, lam = _check("lambda_returns", method, reward, value, terminated, truncated, final_value, last_value,
                            gamma=gamma, lambda_=lambda_)
    one = jnp.ones_like(lam)
    b = ro.reward + gamma * jnp.where(ro.ended, one, one - lam) * ro.v_next()
    a = jnp.where(ro.ended, jnp.zeros_like(lam), gamma * lam)
    return _solve(a, b, ro.last_value, method).astype(ro.out)


def discounted_returns(reward: jax.Array, terminated: jax.Array, truncated: jax.Array | None = None,
                       final_value: jax.Array | None = None, last_value: jax.Array | float | None = None,
                       gamma: float | jax.Array | None = None, *, method: str = "scan") -> jax.Array:
    r"""Discounted returns, bootstrapped at truncations and at the end of the rollout.

    $$
    G_t = r_t + \gamma \begin{cases}
      0 & \text{if terminated}_t \\
      \text{final\_value}_t & \text{else if truncated}_t \\
      G_{t+1} & \text{otherwise}
    \end{cases}, \qquad G_T = \text{last\_value},
    $$

    i.e. $G_t = \sum_{i=0}^{k-1} \gamma^i r_{t+i} + \gamma^k V^{next}_{t+k-1}$, $t+k-1$ the first episode end at or
    after $t$ (or $T-1$). `last_value = 0` gives Monte-Carlo returns. The arguments are as in `gae`.

    Returns:
      `[T, *B]` returns, dtype of `reward`.

    Raises:
      TypeError, ValueError: as in `gae`.
    """
    ro, gamma = _check("discounted_returns", method, reward, None, terminated, truncated, final_value, last_value,
                       need_value=False, gamma=gamma)
    zero = jnp.zeros_like(gamma)
    b = ro.reward
    if ro.truncated is not None:
        b = b + jnp.where(ro.truncated & ~ro.terminated, gamma * ro.final_value, zero)
    return _solve(jnp.where(ro.ended, zero, gamma), b, ro.last_value, method).astype(ro.out)


def n_step_returns(reward: jax.Array, value: jax.Array, terminated: jax.Array, truncated: jax.Array | None = None,
                   final_value: jax.Array | None = None, last_value: jax.Array | float | None = None,
                   gamma: float | jax.Array | None = None, *, n: int) -> NStepReturns:
    r"""n-step bootstrapped returns (Sutton & Barto 2018, section 7.1), cut at episode ends.

    The window of step $t$ is the rewards at times $[t, t+k-1]$, $k = \min(n, e - t + 1, T - t)$, $e$ the first
    episode end at or after $t$. With $V^{next}$ of `gae`:

    $$
    G^{(k)}_t = \sum_{i=0}^{k-1} \gamma^i r_{t+i} + \gamma^{boot}_t V^{next}_{t+k-1}, \qquad
    \gamma^{boot}_t = \begin{cases} 0 & \text{if terminated}_{t+k-1} \\ \gamma^k & \text{otherwise} \end{cases}
    $$

    $n \ge T$ gives `discounted_returns`; `discount` re-bootstraps a target (`docs/api/rollout.md`). Cost
    $O(\min(n, T) \cdot T)$; the other arguments are as in `gae` (`value[0]` is never read).

    Args:
      n: window length, a static Python int >= 1.

    Returns:
      `NStepReturns(target, num_steps, discount)`: $G^{(k)}_t$, $k$ and $\gamma^{boot}_t$, each `[T, *B]`.

    Raises:
      TypeError, ValueError: as in `gae`; ValueError for `n` not a Python int >= 1.
    """
    n = _validate.static_int("n_step_returns: n", n)
    ro, gamma = _check("n_step_returns", "scan", reward, value, terminated, truncated, final_value, last_value,
                       gamma=gamma)
    target, num_steps, discount = _n_step(ro.reward, ro.v_next(), ro.ended, ro.terminated, gamma, n)
    return NStepReturns(target.astype(ro.out), num_steps, discount.astype(ro.out))


@functools.partial(jax.jit, static_argnames="n")  # eager calls: one cached program, not a loop traced anew
def _n_step(reward, v_next, ended, terminated, gamma, n: int):
    """`(target, num_steps, discount)` of `n_step_returns` from its checked, widened inputs."""
    dtype, T = reward.dtype, reward.shape[0]
    zero = jnp.zeros((), dtype)
    # Offset i of every window at once, read from arrays padded past the end (a fori_loop: compile time flat in n).
    padded = [jnp.concatenate([x, jnp.zeros_like(x)]) for x in (reward, v_next, ended, terminated)]
    shape = reward.shape
    t = lax.broadcasted_iota(jnp.int32, shape, 0)

    def body(i, carry):
        target, num_steps, discount, open_, gamma_i = carry
        r_i, v_i, end_i, term_i = (lax.dynamic_slice_in_dim(x, i, T, axis=0) for x in padded)
        active = open_ & (t + i < T)  # the window of t still reaches step t + i, inside the rollout
        target = target + jnp.where(active, gamma_i * r_i, zero)
        num_steps = num_steps + active.astype(jnp.int32)
        closes = active & (end_i | (t + i == T - 1) | (i == n - 1))  # an episode end, the rollout's last step or step n
        boot = jnp.where(term_i, zero, gamma_i * gamma)
        target = target + jnp.where(closes, boot * v_i, zero)
        discount = jnp.where(closes, boot, discount)
        return target, num_steps, discount, active & ~closes, gamma_i * gamma

    init = (jnp.zeros(shape, dtype), jnp.zeros(shape, jnp.int32), jnp.zeros(shape, dtype), jnp.ones(shape, jnp.bool_), jnp.ones((), dtype))
    return lax.fori_loop(0, min(n, T), body, init)[:3]  # gamma_i = gamma**i
