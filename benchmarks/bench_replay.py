"""Uniform replay: `jaxbuffers.ReplayBuffer` against flashbax's item and flat buffers.

Cases, for vector items (obs f32[17], action f32[6], reward f32, done bool; capacity 100k) and
Atari items (pixels u8[84,84,4]; capacity 50k):

* ``add/<item>/B=<b>/call``: one jitted, donated add of ``b`` items per call from Python.
* ``add/<item>/B=<b>/scan``: ``n`` adds inside one jitted, donated ``lax.scan`` (what a jitted
  training step does); b in {1, 8, 256}.
* ``sample/<item>/batch=256/call`` and ``.../scan``: the same two ways, after filling a quarter
  of the capacity (the scan sums every sampled leaf so the gather is not dead code).
* ``add/vector/B=256/scan/capacity=<c>``: the add at capacity 10k and 1M (an add costs O(B), not
  O(capacity); at 1M the storage leaves the caches, which both sides pay).

All implementations of a case run in one process, interleaved (``_common.interleaved``); the
anchor is flashbax's item buffer (flashbax's flat buffer is an extra row for b > 1).
``--quick`` shrinks capacities and repetition counts for a smoke run.

``--metrics`` runs only the cost of usage metrics instead (``_common.metrics_cases``): adds, and a training step of
one add, one sample of 256 and its ``record``, in a scan, without metrics (``off``, the anchor), with the scalar
counters (``counters``) and with per-slot counts too (``per-slot``, the default); the vector step also on a full
buffer, and with a ``control``: no metrics, the sum of each sample's indices carried out of the loop.
Every variant compiles the same add, sample and checksum and donates its state; the recorded step updates every
metric in place. Each row's ratio is that of the medians, with the quartiles of the per-round ratio and the same of
the process CPU times (``_common._metrics_compare``). ``--items vector`` runs the vector items only.

Where the metrics' cost goes (callgrind, the quarter-full vector step, instructions per step outside the thread
pool's idle spinning, three runs; steadier than timings, which differ by a few percent between two identical steps
compiled apart): 175k to 180k without metrics, about 53k of them in the compiled kernels and the rest in XLA's
runtime and memory allocation. ``counters`` adds 4 to 5% (7k to 9k), most of it in its kernels: a
scatter-add of the 256 draws' held flags at their age bins (9 instructions a draw), one reduction over the batch,
the bins' index and updates, the counter words' pass, and a copy of the 46 words into the loop carry. ``per-slot``
adds 3 to 5% more (5k to 9k): about 4k in kernels (a second scatter, of saturating increments at random positions
of the int32 ``[capacity]`` counts, 13 instructions a draw; its index and placeholder updates; the add's reset of
the positions it writes) and about 2k in memory allocation. XLA:CPU also splits that scatter into two tasks on the
thread pool, as it writes into a large array; that shows in the pool's traffic, left out of these counts.
``control`` adds under 1%. Both scatters are O(batch); a step that also trains a network hides them (the Atari
rows).

The compiled step has no other difference: ``record`` reads the sample's indices only, never its items, so nothing
orders the add or the gathers after it; the buffer is donated and updated in place in every variant (of the state,
only the 46 counter words and the 2-word ``added`` are copied in the loop, the latter in ``off`` too). With both
cores free, XLA runs a step's independent operations on two threads, and the step's time then depends more on the
order its compiled schedule gives the sample's four gathers than on the work added: a step whose schedule starts
with the ``[256, 6]`` action gather ran about 12 us (40%) slower than one starting with another gather, whichever
variant it was. Which variant gets that order follows from the whole graph, not from its cost: ``counters`` gets it,
and so does ``control`` (the sum, or the largest, of the indices gives the same schedule), while ``off`` and
``per-slot`` do not (``jax.jit(f).lower(...).compile().as_text()``, the ops after the indices). A quiet run's
``counters`` wall ratio of 0.77 beside a CPU-time ratio of 0.95 comes from that order, not from the counters' work;
``control`` measures the order apart from any metric. On a loaded machine, or pinned to one core, one thread runs
everything and the orders cost the same: the CPU ratio then reads the metrics' own cost, and the wall ratios spread
widely (the rows at ``e59477e`` were measured at a load average of 9 to 11 on two cores).

Run: python benchmarks/bench_replay.py [--quick] [--repeats N] [--metrics] [--items vector atari]
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_runner, batch_of, compare, header, interleaved, metrics_cases, parser, sample_runner  # noqa: E402

import flashbax as fbx  # noqa: E402

import jaxbuffers as jb  # noqa: E402

BENCH = "replay"
ITEMS = {
    "vector": ({"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0), "done": jnp.bool_(False)}, 100_000),
    "atari": ({"pixels": jnp.zeros((84, 84, 4), jnp.uint8)}, 50_000),
}
SAMPLE = 256


class Ours:
    """The only place this benchmark touches the jaxbuffers API."""

    name = "ours"

    def __init__(self, item, capacity, b):
        self.state = jb.ReplayBuffer.create(item, capacity)

    def add_fn(self):
        return lambda s, batch: s.add(batch)

    def sample_fn(self):
        return lambda s, k: s.sample(k, SAMPLE)


class Flashbax:
    name = "flashbax"

    def __init__(self, item, capacity, b):
        self.buf = fbx.make_item_buffer(max_length=capacity, min_length=1, sample_batch_size=SAMPLE, add_sequences=True)
        self.state = self.buf.init(item)

    def add_fn(self):
        return self.buf.add

    def sample_fn(self):
        return self.buf.sample


class FlashbaxFlat(Flashbax):
    """flashbax's flat buffer: a fixed add batch of b, stored as [b, capacity // b] lanes."""

    name = "flashbax-flat"

    def __init__(self, item, capacity, b):
        self.buf = fbx.make_flat_buffer(max_length=capacity, min_length=2 * b, sample_batch_size=SAMPLE, add_batch_size=b)
        self.state = self.buf.init(item)


def main():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--items", nargs="+", choices=list(ITEMS), default=list(ITEMS), help="item kinds to run (default: all)")
    args = p.parse_args()
    items = {k: v for k, v in ITEMS.items() if k in args.items}
    repeats = args.repeats or (3 if args.quick else 301 if args.metrics else 9)  # --metrics: short runs, ratios of a few %
    shrink = 20 if args.quick else 1
    header(BENCH, args.quick)
    if args.metrics:
        metrics_cases(BENCH, jb.ReplayBuffer.create, lambda s, k: s.sample(k, SAMPLE), items, repeats, args.quick,
                      full=("vector",), control=("vector",))
        return
    for item_name, (item, capacity) in items.items():
        capacity //= shrink
        for b in (1, 8, 256):
            batch = batch_of(item, b)
            impls = [Ours(item, capacity, b), Flashbax(item, capacity, b)] + ([FlashbaxFlat(item, capacity, b)] if b > 1 else [])
            for mode in ("call", "scan"):
                n = max(4, min(200, capacity // b // 4) // (5 if args.quick else 1))
                times = interleaved({i.name: add_runner(i, batch, mode, n) for i in impls}, repeats, n)
                compare(BENCH, f"add/{item_name}/B={b}/{mode}", times, "flashbax", n=n, repeats=repeats, items=b)
            if b == 256:
                for impl in impls:  # a quarter of the capacity, so sampling reads real data
                    add_runner(impl, batch, "scan", max(1, capacity // 4 // b))()
                n = 5 if args.quick else 50
                for mode in ("call", "scan"):
                    times = interleaved({i.name: sample_runner(i, i.sample_fn(), mode, n) for i in impls}, repeats, n)
                    compare(BENCH, f"sample/{item_name}/batch={SAMPLE}/{mode}", times, "flashbax", n=n, repeats=repeats, items=SAMPLE)
            del impls
    item, batch = ITEMS["vector"][0], batch_of(ITEMS["vector"][0], 256)
    n = 20 if args.quick else 200
    for capacity in (10_000, 1_000_000 // shrink):
        impls = [Ours(item, capacity, 256), Flashbax(item, capacity, 256)]
        times = interleaved({i.name: add_runner(i, batch, "scan", n) for i in impls}, repeats, n)
        compare(BENCH, f"add/vector/B=256/scan/capacity={capacity}", times, "flashbax", n=n, repeats=repeats, items=256)


if __name__ == "__main__":
    main()
