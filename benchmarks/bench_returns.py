"""GAE: jaxbuffers.gae (reverse scan and associative scan) vs rlax's GAE vmapped over envs.

Both sides are jitted, float32, time-major [T, N] with terminations (no truncation: rlax has no
separate truncation input), on the same inputs, in the same process, timed alternately. Each
case prints one JSON line; ``ratio`` = rlax time / jaxbuffers time (> 1: jaxbuffers is faster).

    python benchmarks/bench_returns.py            # T in {128, 2048}, N in {8, 256}
    python benchmarks/bench_returns.py --quick    # fewer repetitions
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import rlax

import jaxbuffers
from jaxbuffers.returns import gae

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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions (smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repetitions per case (median)")
    args = parser.parse_args()
    repeats = args.repeats or (5 if args.quick else 21)

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
            for method in ("scan", "associative"):
                print(
                    json.dumps(
                        {
                            "bench": "gae",
                            "T": T,
                            "N": N,
                            "dtype": "float32",
                            "method": method,
                            "jaxbuffers_us": round(med[method] * 1e6, 2),
                            "rlax_us": round(med["rlax"] * 1e6, 2),
                            "ratio": round(med["rlax"] / med[method], 3),
                            "repeats": repeats,
                            "calls_per_repeat": inner,
                            "backend": jax.default_backend(),
                            "jax": jax.__version__,
                            "rlax": getattr(rlax, "__version__", "?"),
                            "jaxbuffers": jaxbuffers.__version__,
                            "python": platform.python_version(),
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
