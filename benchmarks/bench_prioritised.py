"""Prioritised replay: `jaxbuffers.PrioritisedReplayBuffer` against flashbax's prioritised item
buffer.

Cases, for vector items (obs f32[17], action f32[6], reward f32, done bool; capacity 100k) and
Atari items (pixels u8[84,84,4]; capacity 50k), priority exponent 0.6, beta 0.4:

* ``add/<item>/B=<b>/call`` and ``.../scan``: one jitted, donated add per call from Python, and
  ``n`` adds inside one jitted, donated ``lax.scan``; b in {1, 8, 256}.
* ``sample/<item>/batch=<k>/call`` and ``.../scan``: k = 256 (and 1024 for vector items) after
  filling a quarter of the capacity; ours also computes importance weights, flashbax returns
  probabilities only. The scan sums every sampled leaf, so nothing is dead code.
* ``set_priorities/<item>/batch=256/call`` and ``.../scan``: updates at the indices of earlier
  samples.
* ``sample+set_priorities/<item>/batch=256/scan``: the pair a prioritised training step runs,
  inside one scan (the new priorities depend on the sample, so the sample stays live).

All implementations of a case run in one process, interleaved; the anchor is flashbax with the
sum-tree update it picks for the backend in use (on CPU a sequential scan over the batch, one
leaf-to-root walk per item). ``flashbax-bincount`` is the same buffer with the update flashbax
runs on GPU and TPU (a ``bincount`` over the whole capacity per write), shown on every backend
for comparison; jaxbuffers has one update for every backend.

How the two trees differ. flashbax's CPU walk adds deltas to one flat array of sums, a loop small enough for
XLA:CPU to compile into one native function. jaxbuffers keeps sums and minima (the importance weights' normaliser) recomputed from the children, one array per depth (18 at 100k slots).
An add writes a ring run, whose ancestors are consecutive rows at every depth: one slice read and written per depth
(two when the run wraps), no gather or scatter. ``set_priorities`` writes any slots: one gather and one scatter of
the B ancestors per depth of more than B rows, the shallower depths recomputed whole; it also skips a slot
overwritten since it was sampled, which flashbax updates anyway. Every state array is an argument and a result of
a per-call program: 28 for ours (18 of them the tree's depths) against flashbax's 9, most of the per-call gap at
B = 1 and 8.

``--quick`` shrinks capacities and repetition counts for a smoke run.

``--metrics`` runs only the cost of usage metrics instead (as in ``bench_replay.py``).

Run: python benchmarks/bench_prioritised.py [--quick] [--repeats N] [--metrics]
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_runner, batch_of, checksum, compare, header, interleaved, metrics_cases, parser, sample_runner  # noqa: E402

import flashbax as fbx  # noqa: E402

import jaxbuffers as jb  # noqa: E402

BENCH = "prioritised"
ITEMS = {
    "vector": ({"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0), "done": jnp.bool_(False)}, 100_000),
    "atari": ({"pixels": jnp.zeros((84, 84, 4), jnp.uint8)}, 50_000),
}
SAMPLE = 256
ALPHA, BETA = 0.6, 0.4


class Ours:
    """The only place this benchmark touches the jaxbuffers API."""

    name = "ours"

    def __init__(self, item, capacity):
        self.state = jb.PrioritisedReplayBuffer.create(item, capacity, priority_exponent=ALPHA)

    def add_fn(self):
        return lambda s, batch: s.add(batch)

    def sample_fn(self, batch_size=SAMPLE):
        return lambda s, k: s.sample(k, batch_size, beta=BETA)

    def set_fn(self):
        return lambda s, out, p: s.set_priorities(out.indices, p, out.generations)


class Flashbax:
    name = "flashbax"

    def __init__(self, item, capacity, device=None):
        device = device or ("gpu" if jax.default_backend() == "gpu" else "cpu")
        self.kwargs = dict(max_length=capacity, min_length=1, sample_batch_size=SAMPLE, add_sequences=True,
                           priority_exponent=ALPHA, device=device)
        self.buf = fbx.make_prioritised_item_buffer(**self.kwargs)
        self.state = self.buf.init(item)

    def add_fn(self):
        return self.buf.add

    def sample_fn(self, batch_size=SAMPLE):
        # flashbax fixes the batch size when the buffer is made; the state is the same pytree
        return fbx.make_prioritised_item_buffer(**{**self.kwargs, "sample_batch_size": batch_size}).sample

    def set_fn(self):
        return lambda s, out, p: self.buf.set_priorities(s, out.indices, p)


class FlashbaxBincount(Flashbax):
    """flashbax's prioritised item buffer with its GPU/TPU sum-tree update (``device="tpu"``)."""

    name = "flashbax-bincount"

    def __init__(self, item, capacity):
        # flashbax falls back to its CPU update when the named device is absent; let it keep "tpu".
        from flashbax.buffers import prioritised_item_buffer, prioritised_trajectory_buffer

        saved = prioritised_item_buffer.validate_device, prioritised_trajectory_buffer.validate_device
        prioritised_item_buffer.validate_device = prioritised_trajectory_buffer.validate_device = lambda device: True
        try:
            super().__init__(item, capacity, device="tpu")
        finally:
            prioritised_item_buffer.validate_device, prioritised_trajectory_buffer.validate_device = saved


def set_runner(impl, mode: str, n: int, with_sample: bool = False):
    """``n`` set_priorities at the indices of earlier samples (jitted calls or one scan); with
    ``with_sample``, each scan step samples first and updates the sampled indices."""
    sample, update = impl.sample_fn(), impl.set_fn()
    keys = jax.random.split(jax.random.key(1), n)
    pris = jax.random.uniform(jax.random.key(2), (n, SAMPLE), minval=0.1, maxval=3.0)
    if with_sample:
        def body(s, x):
            out = sample(s, x[0])
            return update(s, out, x[1] + 1e-6 * jnp.abs(checksum(out))), None
        f = jax.jit(lambda s: jax.lax.scan(body, s, (keys, pris))[0], donate_argnums=0)
        return lambda: setattr(impl, "state", jax.block_until_ready(f(impl.state)))
    outs = jax.jit(jax.vmap(sample, in_axes=(None, 0)))(impl.state, keys)
    outs = outs._replace(item=None) if hasattr(outs, "_replace") else outs.replace(experience=None)
    if mode == "scan":
        f = jax.jit(lambda s, o, p: jax.lax.scan(lambda c, x: (update(c, *x), None), s, (o, p))[0], donate_argnums=0)
        return lambda: setattr(impl, "state", jax.block_until_ready(f(impl.state, outs, pris)))
    g = jax.jit(update, donate_argnums=0)
    pairs = [(jax.tree.map(lambda x, i=i: x[i], outs), pris[i]) for i in range(n)]

    def calls():
        s = impl.state
        for o, p in pairs:
            s = g(s, o, p)
        impl.state = jax.block_until_ready(s)

    return calls


def main():
    args = parser(__doc__.splitlines()[0]).parse_args()
    repeats = args.repeats or (3 if args.quick else 301 if args.metrics else 9)  # --metrics: short runs, ratios of a few %
    shrink = 20 if args.quick else 1
    header(BENCH, args.quick)
    if args.metrics:
        create = lambda item, capacity, metrics: jb.PrioritisedReplayBuffer.create(  # noqa: E731
            item, capacity, priority_exponent=ALPHA, metrics=metrics)
        metrics_cases(BENCH, create, lambda s, k: s.sample(k, SAMPLE, beta=BETA), ITEMS, repeats, args.quick)
        return
    for item_name, (item, capacity) in ITEMS.items():
        capacity //= shrink
        impls = [Ours(item, capacity), Flashbax(item, capacity), FlashbaxBincount(item, capacity)]
        for b in (1, 8, 256):
            batch = batch_of(item, b)
            for mode in ("call", "scan"):
                n = max(4, min(200, capacity // b // 4) // (5 if args.quick else 1))
                times = interleaved({i.name: add_runner(i, batch, mode, n) for i in impls}, repeats, n)
                compare(BENCH, f"add/{item_name}/B={b}/{mode}", times, "flashbax", n=n, repeats=repeats, items=b)
        for impl in impls:  # a quarter of the capacity, so sampling reads real data
            add_runner(impl, batch_of(item, 256), "scan", max(1, capacity // 4 // 256))()
        n = 5 if args.quick else 50
        for k in (SAMPLE, 1024) if item_name == "vector" else (SAMPLE,):
            for mode in ("call", "scan"):
                times = interleaved({i.name: sample_runner(i, i.sample_fn(k), mode, n) for i in impls}, repeats, n)
                compare(BENCH, f"sample/{item_name}/batch={k}/{mode}", times, "flashbax", n=n, repeats=repeats, items=k)
        for mode in ("call", "scan"):
            times = interleaved({i.name: set_runner(i, mode, n) for i in impls}, repeats, n)
            compare(BENCH, f"set_priorities/{item_name}/batch={SAMPLE}/{mode}", times, "flashbax", n=n, repeats=repeats,
                    items=SAMPLE, unit="updates/s")
        times = interleaved({i.name: set_runner(i, "scan", n, with_sample=True) for i in impls}, repeats, n)
        compare(BENCH, f"sample+set_priorities/{item_name}/batch={SAMPLE}/scan", times, "flashbax", n=n, repeats=repeats,
                items=SAMPLE)
        del impls


if __name__ == "__main__":
    main()
