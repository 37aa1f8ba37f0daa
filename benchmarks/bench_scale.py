"""Scaling out: `jaxbuffers.ShardedBuffer` from 1 to 8 devices, and actor threads feeding a learner.

Cases (vector items: obs f32[17], action f32[6], reward f32, done bool; 2**16 items in all, split over the shards):

* ``add/vector/B=256/scan``: 256 items per add (256 / S per shard) inside one jitted, donated ``lax.scan``.
* ``sample/vector/global/batch=256/scan``: global uniform sampling of 256 items (`ShardedBuffer.sample`).
* ``sample/vector/prioritised-global/batch=256/scan``: the same with a `PrioritisedReplayBuffer` per shard.
* ``sample/vector/local/batch=256/scan``: per-device sampling, 256 / S items per shard (`sample_local`).

Each case runs on meshes of the first 1, 2, 4 and 8 devices (``variant``), interleaved in one process;
``ratio`` is the 1-device time over this row's (> 1: faster than one device). On a CPU the devices are forced host
devices (``--xla_force_host_platform_device_count=8``, set here unless ``XLA_FLAGS`` already names a count) sharing
the machine's cores, so these rows show the overhead of the sharded program, not a speed-up; on a machine with 8
accelerators the same script measures real devices.

* ``add/episodes/B=16x64/scan``: `add_episodes` of 16 episodes of 64 steps (16 / S per shard; `EpisodeBuffer`s of
  1,024 episodes in all, obs f32[17], action f32[6], meta task int32), throughput in steps.
* ``sample/episodes/{global,local}-transitions/batch=256/scan``: 3-step transitions from the episodes of tasks >= 1
  (a meta filter): global sampling weighted by each shard's passing steps (`sample`), or 256 / S per shard
  (`sample_local`).
* ``epoch/rollout/{local,global}/M=4/scan``: one PPO epoch of 4 minibatches over a rollout of 128 steps x 64 envs
  (64 / S envs per shard): each shard shuffling its own steps (`sample_local(..., method="minibatches")`) or the
  unsharded rollout's permutation split over the shards (`minibatches`, one reduce-scatter per minibatch);
  throughput in steps.

* ``add/compressed-pixels/B=16/scan`` and ``sample/compressed-pixels/{global,local}-transitions/batch=256/scan``:
  `CompressedTrajectoryBuffer` shards (16 envs in all, 1,024 steps per lane, observations uint8[4, 84, 84] with
  frame-stack dedup, zstd -1), one host store per shard: adds of one step of the 16 envs (16 / S per shard, one
  write callback per shard), then 3-step transitions sampled globally (each shard decodes the rows it contributes)
  or 256 / S per shard. Every step holds the same synthetic frame (a block on a dark screen), so these rows show the
  cost of the sharded program and its host callbacks, not of the codec (`bench_compressed.py` measures real frames).

* ``actors-to-learner/4-actors/flush=64``: 4 actor threads append single items through one `Writer` (64 items per
  add) into a `BufferServer` while a learner thread samples 256 items at a time; with a `BlockingRateLimiter`
  (samples per insert 1, ``variant=spi=1``) and without (``variant=unlimited``). Throughput in inserted
  transitions/s (wall time of the whole run).

Run: python benchmarks/bench_scale.py [--quick] [--repeats N]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_runner, batch_of, header, interleaved, parser, row, sample_runner  # noqa: E402

import jaxbuffers as jb  # noqa: E402

BENCH = "scale"
ITEM = {"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0), "done": jnp.bool_(False)}
CAPACITY, BATCH = 2**16, 256


class Sharded:
    """A `ShardedBuffer` over the first `devices` devices, as a `_common` runner impl."""

    def __init__(self, make, devices: int, sample, add=lambda s, batch: s.add(batch)):
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
        self.state = jb.ShardedBuffer.create(make, mesh, "data")
        self._sample, self._add = sample, add

    def add_fn(self):
        return self._add

    def sample_fn(self):
        return self._sample


def _scaling(case: str, impls: dict, run, repeats: int, n: int, items: int, unit: str = "items/s") -> None:
    times = interleaved({name: run(impl) for name, impl in impls.items()}, repeats, n)
    for name, t in times.items():
        row(BENCH, case, "ours", t, n=n, repeats=repeats, items=items, unit=unit, variant=name, anchor="devices=1",
            anchor_seconds=times["devices=1"] if name != "devices=1" else None)


EP_STEP = {"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0)}
EPISODES, EP_LEN, EP_BATCH = 1024, 64, 16
ROLLOUT_STEPS, ROLLOUT_ENVS, MINIBATCHES = 128, 64, 4


def _episodes(counts: list[int], n: int, repeats: int) -> None:
    """`add_episodes` and global / per-device transition sampling under a meta filter, 1 to 8 devices."""
    make = lambda s: lambda: jb.EpisodeBuffer.create(  # noqa: E731
        EP_STEP, max_episodes=EPISODES // s, max_timesteps=EP_LEN, meta={"task": jnp.int32(0)})
    batch = dict(episodes=batch_of(jax.tree.map(lambda x: jnp.zeros((EP_LEN, *x.shape), x.dtype), EP_STEP), EP_BATCH),
                 lengths=jnp.arange(EP_BATCH, dtype=jnp.int32) % EP_LEN + EP_LEN // 2, terminated=jnp.ones(EP_BATCH, bool),
                 final_obs=jnp.ones((EP_BATCH, 17)), meta={"task": jnp.arange(EP_BATCH, dtype=jnp.int32) % 3})
    add = lambda s, b: s.add_episodes(b["episodes"], b["lengths"], terminated=b["terminated"], final_obs=b["final_obs"], meta=b["meta"])  # noqa: E731
    keep = lambda m: m["task"] >= 1  # noqa: E731
    sample = {
        "global": lambda s: lambda b, k: b.sample(k, BATCH, method="sample_transitions", n_step=3, gamma=0.99, where=keep),
        "local": lambda s: lambda b, k: b.sample_local(k, BATCH // s, method="sample_transitions", n_step=3, gamma=0.99, where=keep),
    }
    impls = {name: {f"devices={s}": Sharded(make(s), s, fn(s), add) for s in counts} for name, fn in sample.items()}
    steps = int(batch["lengths"].sum())
    _scaling(f"add/episodes/B={EP_BATCH}x{EP_LEN}/scan", impls["global"], lambda i: add_runner(i, batch, "scan", n), repeats, n, steps, "steps/s")
    for name, group in impls.items():
        for impl in group.values():  # half of the slots, so sampling reads real episodes
            add_runner(impl, batch, "scan", EPISODES // 2 // EP_BATCH)()
        run = lambda i: sample_runner(i, i.sample_fn(), "scan", n)  # noqa: E731
        _scaling(f"sample/episodes/{name}-transitions/batch={BATCH}/scan", group, run, repeats, n, BATCH)


def _rollout_epochs(counts: list[int], n: int, repeats: int) -> None:
    """One PPO epoch over a sharded rollout: per-shard shuffles against the unsharded permutation, 1 to 8 devices."""
    make = lambda s: lambda: jb.RolloutBuffer.create(ITEM, num_envs=ROLLOUT_ENVS // s, num_steps=ROLLOUT_STEPS)  # noqa: E731
    batch = dict(step=batch_of(ITEM, ROLLOUT_ENVS), reward=jnp.ones(ROLLOUT_ENVS), value=jnp.ones(ROLLOUT_ENVS),
                 terminated=jnp.zeros(ROLLOUT_ENVS, bool))
    add = lambda s, b: s.add(b["step"], reward=b["reward"], value=b["value"], terminated=b["terminated"])  # noqa: E731
    epochs = {"local": lambda b, k: b.sample_local(k, MINIBATCHES, method="minibatches"),
              "global": lambda b, k: b.minibatches(k, MINIBATCHES)}
    for name, epoch in epochs.items():
        group = {f"devices={s}": Sharded(make(s), s, epoch, add) for s in counts}
        for impl in group.values():
            add_runner(impl, batch, "scan", ROLLOUT_STEPS)()
        run = lambda i: sample_runner(i, i.sample_fn(), "scan", n)  # noqa: E731
        _scaling(f"epoch/rollout/{name}/M={MINIBATCHES}/scan", group, run, repeats, n, ROLLOUT_STEPS * ROLLOUT_ENVS, "steps/s")


PIX_STEP = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
PIX_ENVS, PIX_LENGTH = 16, 1024


def _compressed(counts: list[int], n: int, repeats: int) -> None:
    """Sharded compressed trajectory buffers: adds, global and per-device transition sampling, 1 to 8 devices."""
    make = lambda s: lambda: jb.CompressedTrajectoryBuffer.create(PIX_STEP, num_envs=PIX_ENVS // s, length=PIX_LENGTH, frame_stack=4)  # noqa: E731
    frame = np.zeros((84, 84), np.uint8)
    frame[30:40, 20:44] = 200
    step = batch_of(PIX_STEP, PIX_ENVS)
    step["obs"] = jnp.broadcast_to(jnp.asarray(frame), (PIX_ENVS, 4, 84, 84))
    batch = {"step": step, "terminated": jnp.zeros(PIX_ENVS, bool)}
    add = lambda s, b: s.add(b["step"], terminated=b["terminated"])  # noqa: E731
    sample = {
        "global": lambda s: lambda b, k: b.sample(k, BATCH, method="sample_transitions", n_step=3, gamma=0.99),
        "local": lambda s: lambda b, k: b.sample_local(k, BATCH // s, method="sample_transitions", n_step=3, gamma=0.99),
    }
    impls = {name: {f"devices={s}": Sharded(make(s), s, fn(s), add) for s in counts} for name, fn in sample.items()}
    _scaling(f"add/compressed-pixels/B={PIX_ENVS}/scan", impls["global"], lambda i: add_runner(i, batch, "scan", n), repeats, n, PIX_ENVS, "steps/s")
    for name, group in impls.items():
        for impl in group.values():  # half of every lane, so sampling reads real steps
            add_runner(impl, batch, "scan", PIX_LENGTH // 2)()
        run = lambda i: sample_runner(i, i.sample_fn(), "scan", n)  # noqa: E731
        _scaling(f"sample/compressed-pixels/{name}-transitions/batch={BATCH}/scan", group, run, repeats, n, BATCH)


def _actors_to_learner(total: int, limited: bool) -> float:
    """Seconds per inserted transition: 4 actor threads, one Writer, a learner thread sampling until told to stop."""
    limiter = jb.BlockingRateLimiter(1.0, min_size=BATCH, error_buffer=4 * BATCH) if limited else None
    server = jb.BufferServer(jb.ReplayBuffer.create(ITEM, CAPACITY), rate_limiter=limiter)
    writer = jb.Writer(server, flush_size=64)
    item = jax.tree.map(lambda x: np.asarray(x), ITEM)
    for _ in range(BATCH // 64):  # fill to min_size and compile add and sample outside the timing
        server.add(jax.tree.map(lambda x: np.stack([x] * 64), item), timeout=60)
    server.sample(None, BATCH, timeout=60)
    stop = threading.Event()

    def actor():
        for _ in range(total // 4):
            writer.append(item, timeout=60)

    def learner():
        try:
            while not stop.is_set():
                server.sample(None, BATCH, timeout=1)
        except (jb.BufferClosed, jb.RateLimiterTimeout):
            pass

    threads = [threading.Thread(target=actor) for _ in range(4)]
    learn = threading.Thread(target=learner)
    t0 = time.perf_counter()
    learn.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    stop.set()
    server.close()
    learn.join()
    return elapsed / total


def main():
    args = parser(__doc__.splitlines()[0]).parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    header(BENCH, args.quick, device_count=jax.device_count())
    counts = [s for s in (1, 2, 4, 8) if s <= jax.device_count()]
    n = 10 if args.quick else 100
    batch = batch_of(ITEM, BATCH)
    uniform = lambda s: Sharded(lambda: jb.ReplayBuffer.create(ITEM, CAPACITY // s), s, lambda b, k: b.sample(k, BATCH))  # noqa: E731
    impls = {f"devices={s}": uniform(s) for s in counts}
    _scaling("add/vector/B=256/scan", impls, lambda i: add_runner(i, batch, "scan", n), repeats, n, BATCH)
    cases = {
        "global": impls,
        "prioritised-global": {f"devices={s}": Sharded(lambda s=s: jb.PrioritisedReplayBuffer.create(ITEM, CAPACITY // s), s,
                                                       lambda b, k: b.sample(k, BATCH)) for s in counts},
        "local": {f"devices={s}": Sharded(lambda s=s: jb.ReplayBuffer.create(ITEM, CAPACITY // s), s,
                                          lambda b, k, s=s: b.sample_local(k, BATCH // s)) for s in counts},
    }
    for name, group in cases.items():
        for impl in group.values():  # a quarter of the capacity, so sampling reads real data
            add_runner(impl, batch, "scan", CAPACITY // 4 // BATCH)()
        run = lambda i: sample_runner(i, i.sample_fn(), "scan", n)  # noqa: E731
        _scaling(f"sample/vector/{name}/batch={BATCH}/scan", group, run, repeats, n, BATCH)
    _episodes(counts, n, repeats)
    _rollout_epochs(counts, max(n // 10, 2), repeats)
    _compressed(counts, max(n // 10, 2), repeats)
    total = 4_096 if args.quick else 40_960
    for limited in (True, False):
        seconds = sorted(_actors_to_learner(total, limited) for _ in range(1 if args.quick else 3))
        row(BENCH, "actors-to-learner/4-actors/flush=64", "ours", seconds[len(seconds) // 2], n=total,
            repeats=len(seconds), unit="transitions/s", variant="spi=1" if limited else "unlimited")


if __name__ == "__main__":
    main()
