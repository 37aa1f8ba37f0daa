"""Prioritised replay: jaxbuffers.PrioritisedReplayBuffer vs flashbax's prioritised item buffer.

Same process, same sizes and dtypes, every call jitted with the buffer donated on both sides.
Cases:
  * add, B in {1, 8, 256}: K adds inside one jitted ``lax.scan`` ("scan") and one jitted call per
    add from Python ("call"); items/s.
  * sample, batch 256 (ours also computes importance weights; flashbax returns probabilities
    only); items/s: one jitted call per sample from Python, and (``.../scan``) K samples inside one
    jitted ``lax.scan``; vector items also at batch 1024 (per call and in a scan).
  * set_priorities, batch 256 at sampled indices; updates/s: one jitted call per update from Python
    ("call", includes dispatch) and K updates inside one jitted ``lax.scan`` ("scan", the cost
    inside a training step).
  * correctness (vector items, after the timed cases; ``_common.priority_checks``): 4,000 samples
    + set_priorities of 256 with priorities spanning six decades, then 4,000 with priorities 1e-4;
    after each phase a ``check`` line per implementation: the sum tree's root against the float64
    sum of its leaves (relative error) and draws of zero-priority slots in 50 samples.
Every case times both implementations interleaved (round-robin per repetition, the order rotated
each repetition), median reported.
Items: vector (obs f32[17], action f32[6], reward f32, done bool; capacity 100k) and Atari
(pixels u8[84,84,4]; capacity 50k). Buffers are filled to a quarter of capacity before the sample
and set_priorities cases. One JSON line per case; ratio = flashbax time / ours (> 1: ours faster).

Run: python benchmarks/bench_prioritised.py [--quick] [--repeats N]
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import batch_of, emit, flashbax_device, interleaved, machine_info, parser, priority_checks, versions  # noqa: E402

import flashbax as fbx  # noqa: E402

from jaxbuffers.prioritised import PrioritisedReplayBuffer  # noqa: E402

ITEMS = {
    "vector": ({"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0), "done": jnp.bool_(False)}, 100_000),
    "atari": ({"pixels": jnp.zeros((84, 84, 4), jnp.uint8)}, 50_000),
}
SAMPLE = 256
ALPHA, BETA = 0.6, 0.4


class Ours:
    name = "jaxbuffers"

    def __init__(self, item, capacity):
        self.state = PrioritisedReplayBuffer.create(item, capacity, priority_exponent=ALPHA)
        self.add = jax.jit(self.add_fn(), donate_argnums=0)
        self._sample = jax.jit(lambda s, k: s.sample(k, SAMPLE, BETA))
        self._set = jax.jit(lambda s, i, g, p: s.set_priorities(i, p, g), donate_argnums=0)

    def add_fn(self):
        return lambda s, batch: s.add(batch)

    def sample(self, state, key):
        return self._sample(state, key)

    @staticmethod
    def sample_fn(batch_size):
        return lambda s, k: s.sample(k, batch_size, BETA)

    def set_priorities(self, state, indices, generations, p):
        return self._set(state, indices, generations, p)

    def set_priorities_fn(self):
        return lambda s, i, g, p: s.set_priorities(i, p, g)


class Flashbax:
    name = "flashbax_prioritised_item"

    def __init__(self, item, capacity):
        self.kwargs = dict(
            max_length=capacity, min_length=1, sample_batch_size=SAMPLE, add_sequences=True,
            priority_exponent=ALPHA, device=flashbax_device(),
        )
        self.buf = fbx.make_prioritised_item_buffer(**self.kwargs)
        self.state = self.buf.init(item)
        self.add = jax.jit(self.buf.add, donate_argnums=0)
        self._sample = jax.jit(self.buf.sample)
        self._set = jax.jit(lambda s, i, g, p: self.buf.set_priorities(s, i, p), donate_argnums=0)

    def add_fn(self):
        return self.buf.add

    def sample(self, state, key):
        return self._sample(state, key)

    def sample_fn(self, batch_size):
        # flashbax fixes the batch size when the buffer is made; the state is the same pytree
        buf = self.buf if batch_size == SAMPLE else fbx.make_prioritised_item_buffer(**{**self.kwargs, "sample_batch_size": batch_size})
        return buf.sample

    def set_priorities(self, state, indices, generations, p):
        return self._set(state, indices, generations, p)

    def set_priorities_fn(self):
        return lambda s, i, g, p: self.buf.set_priorities(s, i, p)


def _stateful(impl, step):
    """A timed run that threads ``impl.state`` through ``step(state) -> state`` and blocks."""

    def run():
        impl.state = jax.block_until_ready(step(impl.state))

    return run


def add_runs(impls, batch, mode: str, n: int) -> dict:
    """Per implementation: ``n`` adds, as ``n`` jitted calls ("call") or one jitted scan ("scan")."""
    runs = {}
    for impl in impls:
        if mode == "scan":
            add = impl.add_fn()
            f = jax.jit(lambda s, b, add=add: jax.lax.scan(lambda c, _: (add(c, b), None), s, None, length=n)[0], donate_argnums=0)
            runs[impl.name] = _stateful(impl, lambda s, f=f: f(s, batch))
        else:

            def calls(s, impl=impl):
                for _ in range(n):
                    s = impl.add(s, batch)
                return s

            runs[impl.name] = _stateful(impl, calls)
    return runs


def sample_runs(impls, calls: int, batch_size: int = SAMPLE, mode: str = "call") -> dict:
    """Per implementation: ``calls`` samples of ``batch_size``, as jitted calls ("call") or inside
    one jitted scan ("scan"; every leaf of each sample is summed, so none of it is dead code)."""
    keys = jax.random.split(jax.random.key(0), calls)
    runs = {}
    for impl in impls:
        fn = impl.sample_fn(batch_size)
        if mode == "scan":

            def many(s, ks, fn=fn):
                def body(acc, k):
                    return acc + sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(fn(s, k))), None

                return jax.lax.scan(body, jnp.float32(0), ks)[0]

            runs[impl.name] = lambda f=jax.jit(many), impl=impl: jax.block_until_ready(f(impl.state, keys))
        else:
            f = jax.jit(fn) if batch_size != SAMPLE else impl.sample

            def run(impl=impl, f=f):
                out = None
                for k in keys:
                    out = f(impl.state, k)
                jax.block_until_ready(out)

            runs[impl.name] = run
    return runs


def set_priorities_runs(impls, calls: int, mode: str) -> dict:
    """Per implementation: ``calls`` set_priorities at indices of earlier samples (fresh
    generations), as jitted calls ("call") or inside one jitted scan ("scan")."""
    runs = {}
    for impl in impls:
        outs = [impl.sample(impl.state, k) for k in jax.random.split(jax.random.key(1), calls)]
        idx = [o.indices for o in outs]
        gens = [getattr(o, "generations", o.indices) for o in outs]  # flashbax has no generations
        pris = [jax.random.uniform(k, (SAMPLE,), minval=0.1, maxval=3.0) for k in jax.random.split(jax.random.key(2), calls)]
        if mode == "scan":
            fn = impl.set_priorities_fn()
            f = jax.jit(lambda s, i, g, p, fn=fn: jax.lax.scan(lambda c, x: (fn(c, *x), None), s, (i, g, p))[0], donate_argnums=0)
            stacked = (jnp.stack(idx), jnp.stack(gens), jnp.stack(pris))
            runs[impl.name] = _stateful(impl, lambda s, f=f, a=stacked: f(s, *a))
        else:

            def calls_(s, impl=impl, args=list(zip(idx, gens, pris))):
                for i, g, p in args:
                    s = impl.set_priorities(s, i, g, p)
                return s

            runs[impl.name] = _stateful(impl, calls_)
    return runs


def fill(impl, item, capacity, b=256):
    """Fill a quarter of the capacity so sampling reads real data."""
    batch = batch_of(item, b)
    for _ in range(max(1, capacity // 4 // b)):
        impl.state = impl.add(impl.state, batch)


def sample_and_update(impl):
    """For :func:`_common.priority_checks`: sample 256, update at the sampled indices."""
    sample, setp = impl.sample_fn(SAMPLE), impl.set_priorities_fn()
    return sample, lambda s, out, p: setp(s, out.indices, getattr(out, "generations", out.indices), p)


def report(case, times, per_call_items, unit="items_per_s"):
    ours = times["jaxbuffers"]
    for other in [n for n in times if n != "jaxbuffers"]:
        emit({
            "case": case, "anchor": other,
            f"ours_{unit}": per_call_items / ours, f"anchor_{unit}": per_call_items / times[other],
            "ratio": times[other] / ours,
        })


def main():
    args = parser(__doc__).parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    emit({"bench": "prioritised", "machine": machine_info(), "versions": versions("jax", "jaxlib", "flashbax", "jaxbuffers")})
    for item_name, (item, capacity) in ITEMS.items():
        impls = [Ours(item, capacity), Flashbax(item, capacity)]
        for b in (1, 8, 256):
            batch = batch_of(item, b)
            calls = 20 if item_name == "atari" and b == 256 else 200
            steps = max(2, min(200, 2 * capacity // b // 4))
            if args.quick:
                calls, steps = max(2, calls // 10), max(2, steps // 10)
            for mode in ("scan", "call"):
                n = steps if mode == "scan" else calls
                times = interleaved(add_runs(impls, batch, mode, n), repeats)
                report(f"add/{item_name}/B={b}/{mode}", {k: t / n for k, t in times.items()}, b)
        for impl in impls:
            fill(impl, item, capacity)
        calls = 5 if args.quick else 50
        times = interleaved(sample_runs(impls, calls), repeats)
        report(f"sample/{item_name}/batch={SAMPLE}", {k: t / calls for k, t in times.items()}, SAMPLE)
        for b, mode in [(SAMPLE, "scan")] + ([(1024, "call"), (1024, "scan")] if item_name == "vector" else []):
            times = interleaved(sample_runs(impls, calls, b, mode), repeats)
            report(f"sample/{item_name}/batch={b}/{mode}", {k: t / calls for k, t in times.items()}, b)
        for mode in ("call", "scan"):
            times = interleaved(set_priorities_runs(impls, calls, mode), repeats)
            report(f"set_priorities/{item_name}/batch={SAMPLE}/{mode}", {k: t / calls for k, t in times.items()}, SAMPLE, "updates_per_s")
        if item_name == "vector":  # the tree code is the same for every item
            priority_checks("vector", impls, sample_and_update, 200 if args.quick else 4000)
        del impls


if __name__ == "__main__":
    main()
