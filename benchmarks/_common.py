"""Shared benchmark helpers: interleaved timing with medians, the JSON-lines row format, machine
and version info.

Every benchmark prints one JSON object per line. A header line per run
(``{"bench", "header": true, "machine", "versions", "quick"}``) and then one row per case and
implementation:

```
{"bench": "replay", "case": "add/vector/B=8/scan", "impl": "ours", "median_us": 3.1,
 "throughput": 2.6e6, "unit": "items/s", "n": 200, "repeats": 7,
 "anchor": "flashbax", "ratio": 1.4}
```

``median_us`` is the median over ``repeats`` timed repetitions of the time of one operation (each
repetition runs ``n`` operations and is divided by ``n``); ``throughput`` is items per second
derived from it. ``ratio`` is the anchor's median time divided by this row's (> 1: this
implementation is faster than its anchor); it is set only when both ran in the same process. Rows
may carry more keys (a case's parameters, a correctness flag).
"""

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

VERSIONED = ("jax", "jaxlib", "flax", "flashbax", "rlax", "stable-baselines3", "sb3-extra-buffers", "torch", "numba",
             "zstandard", "numpy", "gymnax", "optax")


def machine_info() -> dict:
    """CPU model, core count, Python version and JAX backend (with its devices)."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()]}


def versions(*packages: str) -> dict:
    """Installed versions of ``packages`` (default: every package the benchmarks use; ``None``
    where not installed)."""
    out = {}
    for p in packages or VERSIONED:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def emit(record: dict) -> None:
    """Print one JSON line."""
    print(json.dumps(record), flush=True)


def header(bench: str, quick: bool, **extra) -> None:
    """The first line of every benchmark's output."""
    emit({"bench": bench, "header": True, "quick": quick, "machine": machine_info(), "versions": versions(), **extra})


def row(bench: str, case: str, impl: str, seconds: float | None, *, n: int, repeats: int, items: float = 1,
        unit: str = "items/s", anchor: str | None = None, anchor_seconds: float | None = None, **extra) -> dict:
    """Emit (and return) one result row: ``seconds`` is the median time of one operation, which
    handles ``items`` items (throughput = items / seconds in ``unit``; ``unit="s"``: a duration,
    no throughput)."""
    rec = {
        "bench": bench, "case": case, "impl": impl,
        "median_us": None if seconds is None else round(seconds * 1e6, 3),
        "throughput": None if not seconds or unit == "s" else round(items / seconds, 3), "unit": unit,
        "n": n, "repeats": repeats, "anchor": anchor,
        "ratio": round(anchor_seconds / seconds, 4) if anchor_seconds and seconds else None, **extra,
    }
    emit(rec)
    return rec


def compare(bench: str, case: str, times: dict, anchor: str | None, *, n: int, repeats: int, items: float = 1,
            unit: str = "items/s", **extra) -> None:
    """One row per implementation of ``times`` (name -> median seconds per operation), each
    non-anchor row with its ratio to ``anchor``."""
    for impl, t in times.items():
        a = None if impl == anchor or anchor not in times else anchor
        row(bench, case, impl, t, n=n, repeats=repeats, items=items, unit=unit, anchor=a,
            anchor_seconds=times[a] if a else None, **extra)


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, few repetitions")
    p.add_argument("--repeats", type=int, default=None, help="timed repetitions per case (median reported)")
    p.add_argument("--metrics", action="store_true", help="only the cost of usage metrics (with and without, side by side)")
    return p


def accumulating(fn: Callable, total: list) -> Callable:
    """`fn`, adding the seconds each call takes to `total[0]`: the time spent inside `fn` during an operation."""

    def timed(*args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            total[0] += time.perf_counter() - t0

    return timed


def interleaved(runs: dict[str, Callable[[], object]], repeats: int, per: int = 1, samples: dict | None = None,
                setup: Callable[[], object] | None = None, cpu: dict | None = None) -> dict:
    """Median seconds per operation of each ``runs[name]()`` (which does ``per`` operations and
    blocks on its result; one untimed warm-up call each, which also compiles), timed round-robin:
    each repetition runs every implementation once, in an order rotated by one per repetition, so
    a change of machine load or a first-in-round penalty hits every implementation alike. A
    ``samples`` dict receives every repetition's seconds per run, by name, and a ``cpu`` dict the
    process CPU time (all threads) of each. ``setup()`` runs untimed before every timed call (e.g.
    ``os.sync``: no run pays for the disk writes the previous one left)."""
    for fn in runs.values():
        fn()
    order = list(runs)
    times = {name: [] for name in runs}
    cpus = {name: [] for name in runs}
    for _ in range(repeats):
        order = order[1:] + order[:1]
        for name in order:
            if setup is not None:
                setup()
            c0, t0 = time.process_time(), time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
            cpus[name].append(time.process_time() - c0)
    if samples is not None:
        samples.update(times)
    if cpu is not None:
        cpu.update(cpus)
    return {name: statistics.median(t) / per for name, t in times.items()}


def batch_of(item, b: int, fill=1):
    """A batch of ``b`` copies of ``item`` filled with ``fill`` (leading axis ``b``)."""
    return jax.tree.map(lambda x: jnp.full((b, *x.shape), fill, x.dtype), item)


# ---------------------------------------------------------------------------------------------
# Runners over an "impl": an object with a ``state`` attribute and ``add_fn()`` /
# ``sample_fn(batch_size)`` returning pure functions ``add(state, batch) -> state`` and
# ``sample(state, key) -> pytree``. "call" runs one jitted (donated) call per operation from
# Python; "scan" runs all operations inside one jitted ``lax.scan``, as a jitted training step does.


def _threaded(impl, step):
    def run():
        impl.state = jax.block_until_ready(step(impl.state))

    return run


def add_runner(impl, batch, mode: str, n: int):
    """``n`` adds of ``batch``, as ``n`` jitted calls ("call") or one jitted scan ("scan")."""
    add = impl.add_fn()
    if mode == "scan":
        f = jax.jit(lambda s, b: jax.lax.scan(lambda c, _: (add(c, b), None), s, None, length=n)[0], donate_argnums=0)
        return _threaded(impl, lambda s: f(s, batch))
    g = jax.jit(add, donate_argnums=0)

    def calls(s):
        for _ in range(n):
            s = g(s, batch)
        return s

    return _threaded(impl, calls)


def checksum(tree) -> jax.Array:
    """A float32 sum over every leaf: keeps a sample's gathers live inside a scan."""
    return sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.number))


def sample_runner(impl, sample, mode: str, n: int):
    """``n`` samples ``sample(state, key)``, as ``n`` jitted calls ("call") or inside one jitted
    scan ("scan", every sampled leaf summed so none of it is dead code)."""
    keys = jax.random.split(jax.random.key(0), n)
    if mode == "scan":
        f = jax.jit(lambda s, ks: jax.lax.scan(lambda acc, k: (acc + checksum(sample(s, k)), None), jnp.float32(0), ks)[0])
        return lambda: jax.block_until_ready(f(impl.state, keys))
    g = jax.jit(sample)
    key_list = list(keys)

    def calls():
        out = None
        for k in key_list:
            out = g(impl.state, k)
        jax.block_until_ready(out)

    return calls


def data_file(name: str):
    """``shared/data/<name>`` (recorded Atari frames) from ``$JAXBUFFERS_DATA`` or a ``shared``
    folder in or above the checkout; ``None`` when absent."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    dirs = [Path(os.environ["JAXBUFFERS_DATA"])] if os.environ.get("JAXBUFFERS_DATA") else []
    dirs += [p / "shared" / "data" for p in (root, *root.parents)]
    return next((d / name for d in dirs if (d / name).is_file()), None)


# ---------------------------------------------------------------------------------------------
# The cost of usage metrics (``--metrics``): one buffer class with and without them, side by side.


class _Metrics:
    """A buffer made by ``create(metrics=...)``; ``record`` says whether each sample is recorded into it, ``extra``
    whether the step carries out one cheap scalar of each sample instead (the ``control`` variant)."""

    def __init__(self, name: str, create, per_slot: bool, record: bool, sample, extra: bool = False):
        self.name, self.state, self.record, self.sample = name, create(metrics=per_slot), record, sample
        self.extra = extra

    def add_fn(self):
        return lambda s, batch: s.add(batch)


def _sample_record_runner(impl, n: int, item):
    """``n`` training steps inside one jitted, donated scan: add one item, sample, and record the sample into the
    state when ``impl.record`` (when ``impl.extra``, add the sum of its indices to an int32 carried out of the loop
    instead). The add makes the buffer a real loop carry in every variant, as in training (a scan that never changes
    the buffer lets XLA hoist it out of the loop, which only the variant without metrics gets)."""
    keys = jax.random.split(jax.random.key(0), n)
    one = batch_of(item, 1)

    def body(carry, k):
        s, acc, extra = carry
        s = s.add(one)
        out = impl.sample(s, k)
        extra = extra + jnp.sum(out.indices) if impl.extra else extra
        return ((s.record(out) if impl.record else s), acc + checksum(out), extra), None

    f = jax.jit(lambda s, ks: jax.lax.scan(body, (s, jnp.float32(0), jnp.int32(0)), ks)[0], donate_argnums=0)

    def run():
        impl.state, acc, extra = jax.block_until_ready(f(impl.state, keys))

    return run


def _metrics_compare(bench: str, case: str, runs: dict, repeats: int, n: int, items: int) -> None:
    """``compare`` of ``runs`` against ``off``, each row with ``ratio_spread``: the quartiles of the ratio taken within
    each repetition (``off``'s time over this row's, both timed in the same round), the spread the load leaves; and
    ``cpu_ratio`` / ``cpu_ratio_spread``: the same of the process CPU times (all threads), which a busy machine's
    waits for a core leave out."""
    samples: dict = {}
    cpu: dict = {}
    times = interleaved(runs, repeats, n, samples, cpu=cpu)

    def quartiles(x):
        return [round(float(q), 4) for q in np.percentile(x, [25, 75])]

    for impl, t in times.items():
        a = None if impl == "off" else "off"
        extra = {"ratio_spread": None}
        if a is not None:
            c = np.asarray(cpu["off"]) / np.asarray(cpu[impl])
            extra = {"ratio_spread": quartiles(np.asarray(samples["off"]) / np.asarray(samples[impl])),
                     "cpu_ratio": round(float(np.median(cpu["off"]) / np.median(cpu[impl])), 4), "cpu_ratio_spread": quartiles(c)}
        row(bench, case, impl, t, n=n, repeats=repeats, items=items, anchor=a, anchor_seconds=times["off"] if a else None,
            cpu_us=round(1e6 * float(np.median(cpu[impl])) / n, 3), **extra)


def metrics_cases(bench: str, create, sample, items: dict, repeats: int, quick: bool, full: tuple = (),
                  control: tuple = ()) -> None:
    """Rows ``metrics/add/<item>/B=<b>/scan`` and ``metrics/add+sample+record/<item>/batch=<k>/scan`` (a training
    step: add one item, sample a batch, record it): the buffer without metrics (``metrics=False``, nothing recorded;
    the anchor), with the O(1) counters only (``metrics=False``, every sample recorded) and with per-slot counts too
    (``metrics=True``, the default, recorded); for the items named in ``control``, the training step also has a
    ``control``: no metrics, the sum of each sample's indices carried out of the loop, one cheap reduction and output
    that any step may add: how much the step's time moves with its compiled schedule rather than with the work added.
    Each row also carries ``ratio_spread`` (``_metrics_compare``).

    The training step runs on new buffers, every variant filled alike: a quarter of the capacity, and for the items
    named in ``full`` also the whole capacity (``.../batch=<k>/full/scan``; a full buffer's gathers and counts spread
    over the whole storage, as in a long run).

    ``create(item, capacity, metrics=...)`` builds the buffer, ``sample(state, key)`` draws a batch of 256.
    """
    kinds = (("off", False, False, False), ("control", False, False, True), ("counters", False, True, False),
             ("per-slot", True, True, False))

    def made(item, capacity, names):
        return [_Metrics(name, lambda metrics: create(item, capacity, metrics=metrics), per, rec, sample, extra)
                for name, per, rec, extra in kinds if name in names]

    for item_name, (item, capacity) in items.items():
        capacity //= 20 if quick else 1
        adders = made(item, capacity, ("off", "per-slot"))  # an add touches the per-slot counts only
        for b in (1, 256):
            n = max(4, min(200, capacity // b // 4) // (5 if quick else 1))
            _metrics_compare(bench, f"metrics/add/{item_name}/B={b}/scan",
                             {i.name: add_runner(i, batch_of(item, b), "scan", n) for i in adders}, repeats, n, b)
        del adders
        for part, fill in (("", capacity // 4), ("full/", capacity))[:2 if item_name in full else 1]:
            impls = made(item, capacity, ("off", "counters", "per-slot") + (("control",) if item_name in control else ()))
            for impl in impls:  # every variant holds the same items, so its gathers read the same spread of storage
                add_runner(impl, batch_of(item, 256), "scan", max(1, fill // 256))()
            n = 5 if quick else 50
            _metrics_compare(bench, f"metrics/add+sample+record/{item_name}/batch=256/{part}scan",
                             {i.name: _sample_record_runner(i, n, item) for i in impls}, repeats, n, 256)
            del impls
