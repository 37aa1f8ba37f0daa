"""GAE: jaxbuffers.gae (reverse scan and associative scan) vs rlax's GAE vmapped over envs.

Both sides are jitted, float32, time-major [T, N] with terminations (no truncation: rlax has no
separate truncation input), on the same inputs, in the same process, timed alternately. Each
case prints ``_common`` rows: ``impl`` ``ours`` (``variant`` scan / associative, anchor ``rlax``)
and ``rlax``; ``ratio`` = rlax time / ours (> 1: ours is faster).

    python benchmarks/bench_returns.py            # T in {128, 2048}, N in {8, 256}
    python benchmarks/bench_returns.py --quick    # fewer repetitions
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import rlax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, parser, row  # noqa: E402

from jaxbuffers import gae  # noqa: E402

GAMMA, LAMBDA = 0.99, 0.95


def rlax_gae(reward, value, terminated, last_value):
    """The anchor: rlax works on one stream; vmap it over the env axis of [T, N] inputs."""
    discount = GAMMA * (1.0 - terminated.astype(reward.dtype))
    values = jnp.concatenate([value, last_value[None]], axis=0)

    def one(r_t, discount_t, values_):
        return rlax.truncated_generalized_advantage_estimation(r_t, discount_t, LAMBDA, values_)

    advantages = jax.vmap(one, in_axes=1, out_axes=1)(reward, discount, values)
    return advantages, advantages + value


def ours(method):
    def f(reward, value, terminated, last_value):
        return gae(reward, value, terminated, last_value=last_value, gamma=GAMMA, gae_lambda=LAMBDA, method=method)

    return f


def time_call(fn, args, inner):
    """Mean seconds per call over `inner` back-to-back calls, synchronised at the end."""
    t0 = time.perf_counter()
    for _ in range(inner):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / inner


def main():
    args = parser(__doc__.splitlines()[0]).parse_args()
    repeats = args.repeats or (5 if args.quick else 21)
    header("returns", args.quick)

    rng = np.random.default_rng(0)
    for T in (128, 2048):
        for N in (8, 256):
            inputs = (
                jnp.asarray(rng.normal(size=(T, N)), jnp.float32),
                jnp.asarray(rng.normal(size=(T, N)), jnp.float32),
                jnp.asarray(rng.random((T, N)) < 0.01),
                jnp.asarray(rng.normal(size=(N,)), jnp.float32),
            )
            fns = {"rlax": jax.jit(rlax_gae), "scan": jax.jit(ours("scan")), "associative": jax.jit(ours("associative"))}
            results = {k: jax.block_until_ready(f(*inputs)) for k, f in fns.items()}  # compile + warm up
            for k in ("scan", "associative"):  # same numbers as the anchor before timing anything
                np.testing.assert_allclose(results[k][0], results["rlax"][0], rtol=1e-4, atol=1e-4)
            # calls per timed repetition: ~>= 20 ms of work per repetition
            per_call = min(time_call(fns["rlax"], inputs, 10) for _ in range(3))
            inner = max(1, min(2000, int(0.02 / max(per_call, 1e-7))))
            times = {k: [] for k in fns}
            for _ in range(repeats):  # alternate, so load changes hit every side alike
                for k, f in fns.items():
                    times[k].append(time_call(f, inputs, inner))
            med = {k: statistics.median(v) for k, v in times.items()}
            case = f"gae/T={T}/N={N}/float32"
            row("returns", case, "rlax", med["rlax"], n=inner, repeats=repeats, items=T * N, unit="steps/s")
            for method in ("scan", "associative"):
                row("returns", case, "ours", med[method], n=inner, repeats=repeats, items=T * N, unit="steps/s",
                    anchor="rlax", anchor_seconds=med["rlax"], variant=method)


if __name__ == "__main__":
    main()
