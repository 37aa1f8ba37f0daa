"""Uniform replay: jaxbuffers.ReplayBuffer vs flashbax item and flat buffers, same process.

Cases (all with donation on both sides, jitted):
  * add, B in {1, 8, 256}: called once per step from Python ("call") and K times inside one
    jitted ``lax.scan`` ("scan"); throughput in items/s.
  * sample, batch 256, called per step; items/s.
  * capacity scaling: jaxbuffers add (B=256, scan) at capacity 10k vs 1M (the O(B) claim).
Items: vector (obs f32[17], action f32[6], reward f32, done bool; capacity 100k) and Atari
(pixels u8[84,84,4]; capacity 50k). One JSON line per case, ratio = flashbax time / ours.

Run: python benchmarks/bench_replay.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import batch_of, emit, machine_info, parser, time_add_call, time_add_scan, time_sample, versions  # noqa: E402

import flashbax as fbx  # noqa: E402

import jaxbuffers as jb  # noqa: E402

ITEMS = {
    "vector": ({"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0), "done": jnp.bool_(False)}, 100_000),
    "atari": ({"pixels": jnp.zeros((84, 84, 4), jnp.uint8)}, 50_000),
}
SAMPLE = 256


class Ours:
    name = "jaxbuffers"

    def __init__(self, item, capacity):
        self.state = jb.ReplayBuffer.create(item, capacity)
        self._add = jax.jit(jb.ReplayBuffer.add, donate_argnums=0)
        self._sample = jax.jit(lambda s, k: s.sample(k, SAMPLE))

    def add(self, state, batch):
        return self._add(state, batch)

    def add_fn(self):
        return jb.ReplayBuffer.add

    def sample(self, state, key):
        return self._sample(state, key)


class FlashbaxItem:
    name = "flashbax_item"

    def __init__(self, item, capacity):
        self.buf = fbx.make_item_buffer(max_length=capacity, min_length=1, sample_batch_size=SAMPLE, add_sequences=True)
        self.state = self.buf.init(item)
        self._add = jax.jit(self.buf.add, donate_argnums=0)
        self._sample = jax.jit(self.buf.sample)

    def add(self, state, batch):
        return self._add(state, batch)

    def add_fn(self):
        return self.buf.add

    def sample(self, state, key):
        return self._sample(state, key)


class FlashbaxFlat:
    """flashbax flat buffer: adds a fixed batch of B, stores [B, capacity // B] lanes."""

    name = "flashbax_flat"

    def __init__(self, item, capacity, b):
        self.buf = fbx.make_flat_buffer(max_length=capacity, min_length=2 * b, sample_batch_size=SAMPLE, add_batch_size=b)
        self.state = self.buf.init(item)
        self._add = jax.jit(self.buf.add, donate_argnums=0)
        self._sample = jax.jit(self.buf.sample)

    def add(self, state, batch):
        return self._add(state, batch)

    def add_fn(self):
        return self.buf.add

    def sample(self, state, key):
        return self._sample(state, key)


def make_impls(item, capacity, b):
    impls = [Ours(item, capacity), FlashbaxItem(item, capacity)]
    if b > 1:
        impls.append(FlashbaxFlat(item, capacity, b))
    return impls


def fill(impl, item, b, capacity):
    """Fill a quarter of the capacity so sampling reads real data."""
    batch = batch_of(item, b)
    for _ in range(max(1, capacity // 4 // b)):
        impl.state = impl.add(impl.state, batch)


def main():
    args = parser(__doc__).parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    emit({"bench": "replay", "machine": machine_info(), "versions": versions("jax", "jaxlib", "flashbax", "jaxbuffers")})
    batch_sizes = [1, 8, 256]
    for item_name, (item, capacity) in ITEMS.items():
        for b in batch_sizes:
            batch = batch_of(item, b)
            calls = 20 if item_name == "atari" and b == 256 else 200
            steps = max(2, min(200, 2 * capacity // b // 4))
            if args.quick:
                calls, steps = max(2, calls // 10), max(2, steps // 10)
            impls = make_impls(item, capacity, b)
            for mode in ("call", "scan"):
                times = {}
                for impl in impls:
                    fn = time_add_call if mode == "call" else time_add_scan
                    times[impl.name] = fn(impl, batch, calls if mode == "call" else steps, repeats)
                for other in [n for n in times if n != "jaxbuffers"]:
                    emit({
                        "case": f"add/{item_name}/B={b}/{mode}", "anchor": other,
                        "ours_items_per_s": b / times["jaxbuffers"], "anchor_items_per_s": b / times[other],
                        "ratio": times[other] / times["jaxbuffers"],
                    })
            if b == batch_sizes[-1]:
                times = {}
                for impl in impls:
                    fill(impl, item, b, capacity)
                    times[impl.name] = time_sample(impl, 5 if args.quick else 50, repeats)
                for other in [n for n in times if n != "jaxbuffers"]:
                    emit({
                        "case": f"sample/{item_name}/batch={SAMPLE}", "anchor": other,
                        "ours_items_per_s": SAMPLE / times["jaxbuffers"], "anchor_items_per_s": SAMPLE / times[other],
                        "ratio": times[other] / times["jaxbuffers"],
                    })
            del impls
    # capacity scaling: add must cost O(B), not O(capacity). At 1M the storage no longer fits in
    # cache, so some growth is memory bandwidth, not work: the anchor is measured the same way.
    item = ITEMS["vector"][0]
    batch = batch_of(item, 256)
    steps = 20 if args.quick else 200
    for cls in (Ours, FlashbaxItem):
        per = {}
        for cap in (10_000, 1_000_000):
            impl = cls(item, cap)
            per[cap] = time_add_scan(impl, batch, steps, repeats)
            del impl
        emit({
            "case": "add/vector/B=256/scan/capacity-scaling", "impl": cls.name, "us_per_add_10k": per[10_000] * 1e6,
            "us_per_add_1M": per[1_000_000] * 1e6, "ratio_1M_over_10k": per[1_000_000] / per[10_000],
        })


if __name__ == "__main__":
    main()
