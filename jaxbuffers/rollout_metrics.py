r"""Usage metrics of one rollout: `rollout_stats` and the `RolloutStats` it returns.

A rollout buffer is refilled every iteration, so its metrics are computed from the rollout and the minibatch indices
an update drew from it rather than kept in its state: how often each step was drawn (every trainable step once per
epoch, when minibatches come from `RolloutBuffer.minibatch_indices`), and the statistics of the advantages and
returns the loss sees. Pure and jittable (call it inside the update, on the indices the update scanned over); cost
O(T N + draws).

Over the *learnt* steps (`learn_mask()`: filled and trainable, the steps the loss keeps), with $A$ the advantages,
$G$ the returns and $V$ the stored values:

$$\bar A = \frac{1}{n}\sum A, \qquad \sigma_A = \sqrt{\frac{1}{n}\sum (A - \bar A)^2}, \qquad
\mathrm{EV} = 1 - \frac{\mathrm{Var}(G - V)}{\mathrm{Var}(G)}$$

(population variances; `explained_variance` is NaN when $\mathrm{Var}(G) = 0$, as Stable-Baselines3's
`explained_variance`; the means, deviations, extremes and fractions are NaN when no step is learnt; every advantage and
return statistic is NaN while the buffer's `has_advantages` is False, i.e. before `compute_gae`).

Example:
    ```python
    def update(buf, key):
        idx = jax.vmap(lambda k: buf.minibatch_indices(k, 4))(jax.random.split(key, 3))  # 3 epochs: [3, 4, T*N/4]
        ...                                                     # scan over idx, gather and learn
        return jb.rollout_stats(buf, idx)                       # s.draw_count [T, N]: 3 for every step
    ```
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _validate
from jaxbuffers.rollout import RolloutMinibatch

__all__ = ["RolloutStats", "rollout_stats"]


class RolloutStats(NamedTuple):
    """What `rollout_stats` returns: device arrays (module doc for the equations)."""

    draw_count: jax.Array  # shape=[T, N], int32: times each step was drawn
    learnt_steps: jax.Array  # shape=(), int32: n, the filled trainable steps
    never_drawn: jax.Array  # shape=(), int32: learnt steps drawn 0 times
    draws_min: jax.Array  # shape=(), int32: fewest draws of a learnt step (0 when none is learnt)
    draws_max: jax.Array  # shape=(), int32: most draws of a learnt step (0 when none is learnt)
    wasted_draws: jax.Array  # shape=(), int32: draws of steps the loss masks out (unfilled or not trainable)
    advantage_mean: jax.Array  # shape=(), float32
    advantage_std: jax.Array  # shape=(), float32
    advantage_min: jax.Array  # shape=(), float32
    advantage_max: jax.Array  # shape=(), float32
    advantage_positive: jax.Array  # shape=(), float32: fraction of learnt steps with A > 0
    return_mean: jax.Array  # shape=(), float32
    return_std: jax.Array  # shape=(), float32
    return_min: jax.Array  # shape=(), float32
    return_max: jax.Array  # shape=(), float32
    explained_variance: jax.Array  # shape=(), float32: 1 - Var(G - V) / Var(G)

    def summary(self) -> dict:
        """The scalars as a host-side dict of Python numbers (None for NaN); `draw_count` left out."""
        out = {}
        for k, v in self._asdict().items():
            if k != "draw_count":
                x = np.asarray(v).item()
                out[k] = None if isinstance(x, float) and x != x else x
        return out


def _moments(x: jax.Array, mask: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(mean, population std) of `x` over `mask` (n = its count), float32; NaN when n == 0."""
    nf = n.astype(jnp.float32)
    mean = jnp.sum(jnp.where(mask, x, 0.0)) / nf
    var = jnp.sum(jnp.where(mask, jnp.square(x - mean), 0.0)) / nf
    return mean, jnp.sqrt(var)


def _extremes(x: jax.Array, mask: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
    lo, hi = jnp.min(jnp.where(mask, x, jnp.inf)), jnp.max(jnp.where(mask, x, -jnp.inf))
    return jnp.where(n > 0, lo, jnp.nan), jnp.where(n > 0, hi, jnp.nan)


def rollout_stats(buf: Any, draws: Any = None) -> RolloutStats:
    """Draw counts of `draws` and advantage / return statistics of a rollout (module doc).

    Args:
      buf: a `jaxbuffers.RolloutBuffer` or `jaxbuffers.CompressedRolloutBuffer` (after `compute_gae`: before it,
        the advantage and return statistics are NaN).
      draws: the flat step indices an update drew (`t * num_envs + env`, int, any shape, e.g. the `[E, M, B]`
        indices of `E` epochs of `minibatch_indices`), or a `RolloutMinibatch` (its `index`), or None (no draws).

    Returns:
      `RolloutStats` (device arrays; `.summary()` for a host dict).

    Raises:
      TypeError: `buf` not a (compressed) rollout buffer; `draws` not integer.
      ValueError: `buf` stacked (vmapped: map `rollout_stats` with `jax.vmap` instead); concrete `draws` outside
        `[0, T * N)` (traced ones there, negatives included, are not counted).
    """
    from jaxbuffers.rollout_diagnostics import _inner

    inner = _inner(buf)  # refuses a stacked rollout outside jax.vmap
    total = inner.num_steps * inner.num_envs
    if isinstance(draws, RolloutMinibatch):
        draws = draws.index
    if draws is None:
        draws = jnp.zeros((0,), jnp.int32)
    else:
        draws = _validate.integer_indices("draws", draws)
        _validate.indices_below("draws", draws, total, f"flat steps t * num_envs + env of T * N = {inner.num_steps} * {inner.num_envs}")
    return _stats(inner, draws.reshape(-1))


@jax.jit
def _stats(inner, draws: jax.Array) -> RolloutStats:
    total = inner.num_steps * inner.num_envs
    draws = jnp.where((draws >= 0) & (draws < total), draws, total)  # no negative indexing: out of range is dropped
    counts = jnp.zeros((total,), jnp.int32).at[draws].add(1, mode="drop").reshape(inner.num_steps, inner.num_envs)
    mask = inner.learn_mask()
    n = jnp.sum(mask, dtype=jnp.int32)
    nan = jnp.float32(jnp.nan)
    adv, ret = (jnp.where(inner.has_advantages, x.astype(jnp.float32), nan) for x in (inner.advantages, inner.returns))
    a_mean, a_std = _moments(adv, mask, n)
    r_mean, r_std = _moments(ret, mask, n)
    _, resid_std = _moments(ret - inner.value.astype(jnp.float32), mask, n)
    ev = jnp.where((n > 0) & (r_std > 0), 1.0 - jnp.square(resid_std) / jnp.where(r_std > 0, jnp.square(r_std), 1.0), jnp.nan)
    big = jnp.iinfo(jnp.int32).max
    return RolloutStats(
        draw_count=counts, learnt_steps=n, never_drawn=jnp.sum(mask & (counts == 0), dtype=jnp.int32),
        draws_min=jnp.where(n > 0, jnp.min(jnp.where(mask, counts, big)), 0), draws_max=jnp.max(jnp.where(mask, counts, 0)),
        wasted_draws=jnp.sum(jnp.where(mask, 0, counts), dtype=jnp.int32),
        advantage_mean=a_mean, advantage_std=a_std, advantage_min=_extremes(adv, mask, n)[0],
        advantage_max=_extremes(adv, mask, n)[1],
        advantage_positive=jnp.where(inner.has_advantages, jnp.sum(mask & (adv > 0), dtype=jnp.float32) / n, nan),
        return_mean=r_mean, return_std=r_std, return_min=_extremes(ret, mask, n)[0], return_max=_extremes(ret, mask, n)[1],
        explained_variance=ev.astype(jnp.float32),
    )
