"""Shared benchmark helpers: timing with medians, JSON lines, machine and version info."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from importlib import metadata
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def machine_info() -> dict:
    """CPU model, core count, platform and JAX backend, for the docs table header."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "backend": jax.default_backend()}


def flashbax_device() -> str:
    """flashbax's ``device`` argument for the JAX backend in use ("cpu", "gpu" or "tpu"): flashbax
    picks its sum-tree update for that device, so the anchor runs its own best code on each."""
    backend = jax.default_backend()
    if backend in ("gpu", "cuda", "rocm"):
        return "gpu"
    return "tpu" if backend == "tpu" else "cpu"


def versions(*packages: str) -> dict:
    """Installed versions of ``packages`` (``None`` where not installed)."""
    out = {}
    for p in packages:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def median_seconds(fn: Callable[[], object], *, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs; ``fn`` must block on its result."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def emit(record: dict) -> None:
    """Print one JSON line (the benchmark protocol)."""
    print(json.dumps(record), flush=True)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="short run (fewer repetitions and sizes)")
    p.add_argument("--repeats", type=int, default=None, help="timed repetitions per case (median reported)")
    return p


# ---------------------------------------------------------------------------------------------
# Buffer timing: an "impl" wraps one library's buffer with ``state``, jitted ``add(state, batch)``
# and ``sample(state, key)`` (donated where the library allows), and ``add_fn()``, the un-jitted
# add for use inside ``lax.scan``.


def batch_of(item, b: int, fill=1):
    """A batch of ``b`` copies of ``item`` filled with ``fill`` (leading axis ``b``)."""
    return jax.tree.map(lambda x: jax.numpy.full((b, *x.shape), fill, x.dtype), item)


def time_add_call(impl, batch, calls: int, repeats: int) -> float:
    """Seconds per jitted add called from Python (median over ``repeats`` runs of ``calls`` adds)."""
    box = {"s": impl.state}

    def run():
        s = box["s"]
        for _ in range(calls):
            s = impl.add(s, batch)
        box["s"] = jax.block_until_ready(s)

    t = median_seconds(run, repeats=repeats)
    impl.state = box["s"]
    return t / calls


def time_add_scan(impl, batch, steps: int, repeats: int) -> float:
    """Seconds per add when ``steps`` adds run inside one jitted, donated ``lax.scan``."""
    add = impl.add_fn()
    f = jax.jit(lambda s, b: jax.lax.scan(lambda c, _: (add(c, b), None), s, None, length=steps)[0], donate_argnums=0)
    box = {"s": impl.state}

    def run():
        box["s"] = jax.block_until_ready(f(box["s"], batch))

    t = median_seconds(run, repeats=repeats)
    impl.state = box["s"]
    return t / steps


def time_sample(impl, calls: int, repeats: int) -> float:
    """Seconds per jitted sample called from Python (fresh key per call)."""
    keys = list(jax.random.split(jax.random.key(0), calls))

    def run():
        out = None
        for k in keys:
            out = impl.sample(impl.state, k)
        jax.block_until_ready(out)

    return median_seconds(run, repeats=repeats) / calls


def interleaved(runs: dict, repeats: int, per: int = 1) -> dict:
    """Median seconds per operation of each ``runs[name]()`` (which does ``per`` operations and
    blocks; one warm-up call each), timed round-robin: every repetition runs each implementation
    once, in an order rotated by one per repetition. On this shared 2-core machine the
    implementation timed first in a round measured up to 1.5x slower than the same code timed
    second (same process), so a fixed order would bias the ratio."""
    for fn in runs.values():
        fn()
    order = list(runs)
    times = {name: [] for name in runs}
    for _ in range(repeats):
        order = order[1:] + order[:1]
        for name in order:
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) / per for name, t in times.items()}


def tree_leaves_and_root(impl_name: str, state) -> tuple:
    """The priority sum tree of a prioritised buffer state, ours or flashbax's: (float64 leaves as
    numpy, float root). Ours: ``state.tree`` (:class:`jaxbuffers.sum_tree.SumMinTree`); flashbax:
    ``state.sum_tree_state.nodes``, a flat heap whose last level (from ``2**depth - 1``) holds the
    leaves and whose node 0 is the root."""
    if impl_name == "jaxbuffers":
        return np.asarray(state.tree.leaves(), np.float64), float(state.tree.total())
    tree = state.sum_tree_state
    first = 2**tree.tree_depth - 1
    nodes = np.asarray(tree.nodes)
    return nodes[first : first + tree.capacity].astype(np.float64), float(nodes[0])


def tree_check(case: str, impl_name: str, state, indices_of_samples) -> dict:
    """One correctness record of a prioritised buffer: the root's relative error against the
    float64 sum of its leaves (a tree whose parents are recomputed from their children stays at
    float32 rounding; one updated by adding deltas drifts), and how many of the given sampled
    indices landed on a slot of priority 0 (must be none)."""
    leaves, root = tree_leaves_and_root(impl_name, state)
    exact = leaves.sum()
    hits = np.concatenate([np.asarray(i).reshape(-1) for i in indices_of_samples])
    return {
        "check": case, "impl": impl_name, "root_rel_error": abs(root - exact) / exact if exact > 0 else abs(root),
        "zero_priority_draws": int((leaves[np.clip(hits, 0, leaves.size - 1)] <= 0).sum()), "draws": int(hits.size),
    }


def priority_checks(case: str, impls, sample_and_update, rounds: int, batch: int = 256) -> None:
    """The "correct results" half of a prioritised target, one ``check`` line (:func:`tree_check`)
    per implementation after each of two phases, each ``rounds`` samples of ``batch`` followed by
    set_priorities at the sampled indices inside one jitted ``lax.scan``: priorities ``1000 u**3``
    (``u ~ U[0, 1)``: six decades), then priorities 1e-4 (what remains when large priorities
    fall; a tree updated by deltas keeps their rounding). ``sample_and_update(impl)`` returns
    ``(sample(state, key) -> out with .indices, update(state, out, priorities) -> state)``."""
    keys = jax.random.split(jax.random.key(11), rounds)
    phases = [
        (f"{rounds} sample+set_priorities of {batch}, priorities 1000 u**3", lambda k: 1000.0 * jax.random.uniform(k, (batch,)) ** 3),
        (f"then {rounds} more with priorities 1e-4", lambda k: jnp.full((batch,), 1e-4)),
    ]
    for impl in impls:
        sample, update = sample_and_update(impl)
        for label, priorities in phases:

            def step(s, k, priorities=priorities):
                return update(s, sample(s, k), priorities(jax.random.fold_in(k, 1))), None

            impl.state = jax.jit(lambda s, ks, step=step: jax.lax.scan(step, s, ks)[0])(impl.state, keys)
            draws = [sample(impl.state, k).indices for k in jax.random.split(jax.random.key(12), 50)]
            emit(tree_check(f"correctness/{case}/{label}", impl.name, impl.state, draws))
