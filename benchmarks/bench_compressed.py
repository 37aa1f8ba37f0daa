"""Compressed replay of real Atari transitions: jaxbuffers vs sb3-extra-buffers vs SB3.

Same transitions for every buffer (the first ``--n`` steps of ``shared/data/atari_rollouts.npz``,
obs and next obs [4, 84, 84] uint8), one buffer per case, each case in a fresh subprocess so that
process memory can be measured honestly:

* ``bytes_per_transition``: (RSS after filling - RSS before filling) / n, RSS being the anonymous resident
  memory (``RssAnon``; file-backed pages come and go with the machine's memory pressure), measured after
  ``gc.collect()`` and ``malloc_trim(0)``; compile and warm-up happen before the first RSS reading.
  For jaxbuffers the device arrays (CPU backend, allocated at create) are added from their exact
  shapes (``device_nbytes``). The accounting numbers (``accounted_bytes_per_transition``) are
  printed alongside.
* ``add_tps``: transitions/s when adding one transition per call from Python (SB3 style). For
  jaxbuffers this is :class:`jaxbuffers.compressed.StagingWriter` (``add_staged_tps``: steps
  staged in host numpy arrays, flushed as chunk adds, the last flush timed too); also reported:
  ``add_host_tps`` (``add_from_host`` per step), ``add_jit_tps`` (a jitted donated ``add`` per
  step; both over the first 3,000 transitions) and ``add_chunk_tps`` (500 steps per jitted call).
* ``sample_tps_32`` / ``sample_tps_256``: transitions/s of ``sample`` (decode + stack rebuild +
  result on device: a jax array for jaxbuffers, a torch tensor for SB3), median of repeats. For
  jaxbuffers a jitted ``sample_transitions`` returning the fields SB3's sample returns (obs,
  action, next_obs, n-step return, discount); ``sample_full_tps_*`` returns the whole
  ``TransitionSample`` (its ``item`` repeats obs: one more device copy of obs under jit).

Cases: SB3 ``ReplayBuffer`` (with and without ``optimize_memory_usage``), sb3-extra-buffers
``CompressedReplayBuffer`` with every codec it has, and jaxbuffers ``CompressedTrajectoryBuffer``
(frame dedup: one stored frame per step) with several codecs. Because the cases run one after
another, a change of machine load between them moves their ratios (sb3x's sample copies run on
torch's intra-op threads, which stall when a core is busy). So the last cases measure sb3x
(rle-jit, igzip1 and gzip) and jaxbuffers (default codec and rle) **in one process** (torch threads = the CPU
count, and 1): one-per-call adds timed per buffer, samples interleaved: the ratios to quote (``anchor`` = the
fastest sb3x codec of that run).

The ``checksum`` case measures what the host stores' per-entry checksums cost a jaxbuffers buffer (default
codec): jitted adds of 500 steps and jitted ``sample_transitions`` of 256, interleaved in one process on two
buffers of the same transitions, one with the checksums (``impl="ours"``) and one with every checksum replaced by
zero (``impl="no-checksum"``, the anchor; ``overhead_pct`` = the relative cost), and a third with the checksums
computed one ``zlib.crc32`` call per entry (``impl="per-entry"``, ``host_codecs._checksum``'s fallback) instead of one
compiled loop per batch; ``impl="checksums-only"``: the seconds spent computing the checksums inside each ``ours``
op (``overhead_pct`` = that over the op's time without checksums: the cost with less of the machine's noise than the
difference of two timings).

``--million`` (rows ``<game>/million/*``): 1M transitions of a random-policy ale-py rollout of ``--real`` steps
(20,000) tiled over 8 lanes, added as jitted chunks of 250 steps per lane (`run_million`); RSS growth from a warmed
process, the SB3 and sb3x buffers holding ``--anchor-n`` transitions (10,000) of the same frames, each in its own
subprocess, ``extrapolated_bytes`` scaling theirs linearly to 1M; the sample ratio is against the fastest sb3x
codec. ``add_chunk``: chunk adds at the keyframe interval K=8 and at K=1 (every frame whole), interleaved.

``--keyframes 8,4 --delta-codecs none,rle`` (rows ``<game>/keyframes/*``): one buffer per delta codec and keyframe
interval, all in one process (`run_keyframes`): bytes per transition and per frame, the frames a sample decodes per
transition, and sample throughput, interleaved, against the first delta codec at the first interval.

Output: ``_common`` rows, one per case and metric (``case`` = ``<game>/<metric>``, ``variant`` =
the buffer and codec): throughputs in transitions/s, memory as ``value`` in bytes/transition;
then one ``summary`` line per game (which jaxbuffers settings beat each sb3x codec on memory, add
and sample at once). Without the recorded frames the benchmark prints one ``skipped`` row.

Usage: ``python benchmarks/bench_compressed.py [--quick] [--game breakout|pong|all]``
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
ROOT = pathlib.Path(__file__).resolve().parents[1]
import _atari  # noqa: E402
from _common import accumulating, data_file  # noqa: E402

DATA = data_file("atari_rollouts.npz")

BENCH = "compressed"
JAX_CODECS = ["zstd:-1", "zstd:1", "zstd:3", "igzip:0", "igzip:1", "rle"]
DEFAULT = "jaxbuffers zstd:-1"  # jaxbuffers.compressed.DEFAULT_CODEC
SB3X_CODECS = ["none", "rle", "rle-old", "rle-jit", "gzip", "igzip", "igzip1"]


def rss() -> int:
    """Anonymous resident bytes (`RssAnon`: heap and anonymous maps, where buffers live), after `gc.collect()` and
    `malloc_trim(0)`. Not the whole RSS: its file-backed pages (shared libraries) leave it when the kernel reclaims
    them under memory pressure, which made a fill look smaller than the memory it holds."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    with open("/proc/self/statm") as f:  # kernels without RssAnon: resident pages less shared (file-backed) ones
        resident, shared = (int(x) for x in f.read().split()[1:3])
        return (resident - shared) * os.sysconf("SC_PAGE_SIZE")


ALE_FRAMES = False  # set by --ale: every game's frames from `_atari` (the frames of the --million case)


def load(game: str, n: int):
    """`n` transitions of `game`: (obs, next obs, actions, rewards, terminated); Breakout and Pong from
    `shared/data/atari_rollouts.npz`, the other games played with ale-py (`_atari`)."""
    if ALE_FRAMES or game not in ("breakout", "pong"):
        roll = _atari.rollout(game, n)
        frames, obs_idx, next_idx = _atari.stacked(roll)
        return frames[obs_idx], frames[next_idx], roll["action"].astype(np.int64), roll["reward"], roll["terminated"] | roll["truncated"]
    with np.load(DATA) as d:
        frames = d[f"{game}_frames"]
        obs = frames[d[f"{game}_obs_idx"][:n]]
        nxt = frames[d[f"{game}_next_idx"][:n]]
        return obs, nxt, d[f"{game}_actions"][:n], d[f"{game}_rewards"][:n], d[f"{game}_terminated"][:n]


def timed_samples(fn, batch: int, repeats: int) -> float:
    fn(batch)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(batch)
        times.append(time.perf_counter() - t0)
    return batch / statistics.median(times)


# ------------------------------------------------------------------------------------------------
# one case (runs in a subprocess)


def run_sb3(kind: str, codec: str | None, game: str, n: int, repeats: int) -> dict:
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    torch.set_num_threads(os.cpu_count() or 1)
    obs, nxt, act, rew, term = load(game, n)
    ospace = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    aspace = spaces.Discrete(18)
    if kind == "sb3x":
        from sb3_extra_buffers.compressed import CompressedReplayBuffer

        buf = CompressedReplayBuffer(n, ospace, aspace, device="cpu", compression_method=codec)
    else:
        buf = ReplayBuffer(n, ospace, aspace, device="cpu", optimize_memory_usage=(kind == "sb3-opt"),
                           handle_timeout_termination=False)
    info = [{}]

    def add(i):
        buf.add(obs[i : i + 1], nxt[i : i + 1], act[i : i + 1], rew[i : i + 1], term[i : i + 1], info)

    add(0)
    buf.sample(32)
    buf.sample(256)
    r0 = rss()
    t0 = time.perf_counter()
    for i in range(1, n):
        add(i)
    t_add = time.perf_counter() - t0
    r1 = rss()

    def sample_plain(b):
        return buf.sample(b)

    return {
        "bytes_per_transition": (r1 - r0) / (n - 1),
        "add_tps": (n - 1) / t_add,
        "sample_tps_32": timed_samples(sample_plain, 32, repeats),
        "sample_tps_256": timed_samples(sample_plain, 256, repeats),
    }


def run_jax(codec: str, game: str, n: int, repeats: int, mode: str) -> dict:
    """One jaxbuffers case. ``mode``: how the n transitions are added, one per call from Python:
    ``staged`` (:class:`StagingWriter`, the documented Python-loop path), ``host``
    (``add_from_host``), ``jit`` (a jitted donated ``add``); or ``chunk`` (500 per jitted call)."""
    import jax
    import jax.numpy as jnp

    from jaxbuffers import CompressedTrajectoryBuffer, StagingWriter

    obs, nxt, act, rew, term = load(game, n)
    ex = {"obs": jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=n, frame_stack=4, codec=codec, final_obs_capacity=2)
    add = jax.jit(lambda b, s, t: b.add(s, terminated=t), donate_argnums=0)
    act32, rew32 = act.astype(np.int32), rew.astype(np.float32)

    def step_np(a, z):  # host arrays, [1, t, ...]
        return {"obs": obs[None, a:z], "action": act32[None, a:z], "reward": rew32[None, a:z]}, term[None, a:z]

    def step(a, z):  # device arrays
        s, t = step_np(a, z)
        return jax.tree.map(jnp.asarray, s), jnp.asarray(t)

    # What SB3's sample returns (observations, actions, next observations, rewards, dones):
    # obs, action, next_obs, n-step return, discount. The whole TransitionSample also repeats obs
    # and action in ``item``; returned from jit, XLA materialises that repeat as a second device
    # copy of obs (timed separately as sample_full_tps_*).
    sb3_fields = lambda s: (s.obs, s.action, s.next_obs, s.n_step_return, s.discount)  # noqa: E731
    samplers = {b: jax.jit(lambda bf, k, b=b: sb3_fields(bf.sample_transitions(k, b, gamma=0.99))) for b in (32, 256)}
    full_samplers = {b: jax.jit(lambda bf, k, b=b: bf.sample_transitions(k, b, gamma=0.99)) for b in (32, 256)}
    chunk = 500 if mode == "chunk" else 1
    writer = None
    if mode == "staged":
        writer = StagingWriter(buf)
        # Warm-up: compile every chunk shape and touch the staging arrays (fixed host memory,
        # writer.max_pending steps: reported as staging_bytes, not per transition).
        warm = writer.max_pending + writer.max_pending - 1
        for i in range(warm):
            s, t = step_np(i, i + 1)
            writer.add({k: v[:, 0] for k, v in s.items()}, terminated=t[:, 0])
        buf = writer.flush()
        start = warm
    elif mode == "host":
        buf = buf.add_from_host(*step(0, 1)[:1], terminated=step(0, 1)[1])
        start = 1
    else:
        buf = add(buf, *step(0, chunk))
        start = chunk
    keys = iter(jax.random.split(jax.random.key(0), 10_000))
    for b in (32, 256):
        jax.block_until_ready(samplers[b](buf, next(keys)))
    r0 = rss()
    t0 = time.perf_counter()
    if mode == "staged":
        for i in range(start, n):
            s, t = step_np(i, i + 1)
            writer.add({k: v[:, 0] for k, v in s.items()}, terminated=t[:, 0])
        buf = writer.flush()  # the timing includes the last flush
    elif mode == "host":
        for i in range(start, n):
            s, t = step_np(i, i + 1)
            buf = buf.add_from_host(s, terminated=t)
    else:
        for a in range(start, n, chunk):
            buf = add(buf, *step(a, min(a + chunk, n)))
    jax.block_until_ready(buf)
    t_add = time.perf_counter() - t0
    r1 = rss()
    stored = int(buf.size())
    assert stored == n, stored
    rec = {f"add_{mode}_tps": (n - start) / t_add}
    if repeats == 0:
        return rec

    def sample(b):
        jax.block_until_ready(samplers[b](buf, next(keys)))

    def sample_full(b):
        jax.block_until_ready(full_samplers[b](buf, next(keys)))

    def sample_eager(b):
        jax.block_until_ready(sb3_fields(buf.sample_transitions(next(keys), b, gamma=0.99)))

    rec.update({
        # host growth per added transition + device arrays (allocated at create) per transition
        "bytes_per_transition": (r1 - r0) / (n - start) + buf.device_nbytes / n,
        "accounted_bytes_per_transition": buf.nbytes / n,
        "host_payload_bytes_per_frame": sum(s.payload_nbytes for s in buf.host.stores) / buf.host.stores[0].num_entries,
        "sample_tps_32": timed_samples(sample, 32, repeats),
        "sample_tps_256": timed_samples(sample, 256, repeats),
        "sample_full_tps_32": timed_samples(sample_full, 32, repeats),
        "sample_full_tps_256": timed_samples(sample_full, 256, repeats),
        "sample_eager_tps_32": timed_samples(sample_eager, 32, repeats),
        "sample_eager_tps_256": timed_samples(sample_eager, 256, repeats),
    })
    if writer is not None:
        rec["staging_bytes"] = writer.staging_nbytes
    return rec


def _tiled(game: str, real: int, codec: str, e: int = 8, t: int = 250):
    """`(make, add, chunk)` of the tiled cases: `make(length, K)` a `CompressedTrajectoryBuffer` of `e` lanes
    (frame_stack=4), `add` a jitted donated add, `chunk(i)` the `[e, t]` steps number `i*t .. (i+1)*t - 1` of every
    lane: the `real` steps of one ale-py rollout, tiled (lane `e` starts at the first episode start at or after
    `e * real / 8` steps into it; the rollout's last step is marked terminated, so no stack spans a seam)."""
    import jax
    import jax.numpy as jnp

    from jaxbuffers import CompressedTrajectoryBuffer
    from jaxbuffers.compressed import DEFAULT_DELTA_CODEC

    roll = _atari.rollout(game, real)
    frames, obs_idx, _ = _atari.stacked(roll)
    term = roll["terminated"].copy()
    term[-1] = True
    trunc = roll["truncated"] & ~term
    act, rew = roll["action"].astype(np.int32), roll["reward"].astype(np.float32)
    ex = {"obs": jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}

    def make(n, key, delta_codec=DEFAULT_DELTA_CODEC):
        return CompressedTrajectoryBuffer.create(ex, num_envs=e, length=n, frame_stack=4, codec=codec, final_obs_capacity=64,
                                                 keyframe_interval=key, delta_codec=None if delta_codec == "none" else delta_codec)

    add = jax.jit(lambda b, st, te, tr, fo: b.add(st, terminated=te, truncated=tr, final_obs=fo), donate_argnums=0)
    # each lane starts at the first episode start at or after `e * real / 8` (a buffer's first step starts an episode)
    starts = np.concatenate([[0], np.flatnonzero((term | trunc)[:-1]) + 1])
    offsets = starts[np.minimum(np.searchsorted(starts, np.arange(e) * (real // e)), starts.size - 1)][:, None]

    def chunk(i):
        r = (offsets + i * t + np.arange(t)[None, :]) % real
        obs = frames[obs_idx[r]]
        return ({"obs": obs, "action": act[r], "reward": rew[r]}, term[r], trunc[r], obs)

    return make, add, chunk


def run_keyframes(game: str, steps: int, real: int, repeats: int, codec: str, intervals: list[int], delta_codecs: list[str]) -> dict:
    """The ``keyframes`` case: one buffer per delta codec (``"none"``: ``codec`` codes the deltas) and keyframe
    interval K, of ``steps`` transitions each (8 lanes, tiled as in ``--million``), all in one process: host bytes per
    transition, frames a jitted ``sample_transitions(256, n_step=3)`` decodes per transition (the requested frames and
    the chains behind them), and that sample's and a 32 one's throughput, interleaved."""
    import jax

    import host_codecs

    make, add, chunk = _tiled(game, real, codec)
    e, t = 8, 250
    bufs = {}
    for dc in delta_codecs:
        for key in intervals:
            buf = make(steps // e, key, dc)
            for i in range(-(-(steps // e) // t)):
                buf = add(buf, *chunk(i))
            bufs[f"K{key}_{dc}"] = jax.block_until_ready(buf)
    fields = lambda x: (x.obs, x.action, x.next_obs, x.n_step_return, x.discount)  # noqa: E731
    samplers = {b: jax.jit(lambda bf, k, b=b: fields(bf.sample_transitions(k, b, n_step=3, gamma=0.99))) for b in (256, 32)}
    keys = iter(jax.random.split(jax.random.key(0), 100_000))
    rec = {"transitions": steps, "real_steps": real, "codec": codec, "configs": list(bufs)}
    requests = []
    get_many = host_codecs.CompressedStore.get_many

    def counting(store, slot_arrays, **kw):  # the frames a read decodes: the distinct requested slots and their chains
        flat = np.concatenate([np.asarray(x).reshape(-1) for x in slot_arrays])
        with store._lock:
            requests.append(np.unique(np.concatenate([flat, store._chains(flat)])).size)
        return get_many(store, slot_arrays, **kw)

    for name, buf in bufs.items():
        n = int(buf.size())
        rec[f"{name}_host_live_bytes_per_transition"] = buf.host_live_nbytes / n
        rec[f"{name}_payload_bytes_per_frame"] = sum(x.payload_nbytes for x in buf.host.stores) / buf.host.stores[0].num_entries
        host_codecs.CompressedStore.get_many = counting
        try:
            for _ in range(5):
                jax.block_until_ready(samplers[256](buf, next(keys)))
        finally:
            host_codecs.CompressedStore.get_many = get_many
        rec[f"{name}_frames_decoded_per_transition"] = float(np.median(requests[-5:])) / 256
    names = list(bufs)
    for b, fn in samplers.items():
        times = {name: [] for name in bufs}
        for buf in bufs.values():
            jax.block_until_ready(fn(buf, next(keys)))
        for r in range(repeats * (256 // b)):
            for name in (names if r % 2 else names[::-1]):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(bufs[name], next(keys)))
                times[name].append(time.perf_counter() - t0)
        for name, ts in times.items():
            rec[f"{name}_sample_{b}_n3_tps"] = b / statistics.median(ts)
    return rec


QUEUED_ADDS = 4  # run_million: adds dispatched before the fill waits for them


def run_million(game: str, steps: int, real: int, repeats: int, codec: str, keyframe_interval: int) -> dict:
    """`steps` transitions of `game` in a `CompressedTrajectoryBuffer` of 8 lanes (frame_stack=4), added as jitted
    chunks of 250 steps per lane (`_tiled`), waiting for every `QUEUED_ADDS`-th add (each queued add holds its
    chunk's obs and final obs on the device until it runs; unbounded, JAX's CPU client queues dozens of them, gigabytes
    beyond the buffer). RSS growth is measured from a warmed process: after compiling add and both samplers and adding
    the first 4,000 transitions."""
    import jax

    e, t = 8, 250
    length = steps // e
    make, add, chunk = _tiled(game, real, codec)

    buf = make(length, keyframe_interval)
    chunks = -(-length // t)
    warm = 2  # 4,000 transitions
    for i in range(warm):
        buf = add(buf, *chunk(i))
    s256 = jax.jit(lambda b, k: (lambda x: (x.obs, x.action, x.next_obs, x.n_step_return, x.discount))(b.sample_transitions(k, 256, n_step=3, gamma=0.99)))
    s32 = jax.jit(lambda b, k: b.sample_sequences(k, 32, 16).item["obs"])
    keys = iter(jax.random.split(jax.random.key(0), 100_000))
    jax.block_until_ready((s256(buf, next(keys)), s32(buf, next(keys))))
    r0 = rss()
    t0 = time.perf_counter()
    for i in range(warm, chunks):
        buf = add(buf, *chunk(i))
        if i % QUEUED_ADDS == 0:
            jax.block_until_ready(buf)
    jax.block_until_ready(buf)
    t_add = time.perf_counter() - t0
    r1 = rss()
    n = int(buf.size())
    rec = {
        "transitions": n, "real_steps": real, "lanes": e, "keyframe_interval": keyframe_interval, "codec": codec,
        "delta_codec": buf.host.stores[0].config()["delta_codec"] or "none",
        "rss_growth_bytes": r1 - r0, "rss_growth_bytes_per_transition": (r1 - r0) / (n - warm * t * e),
        "host_bytes_per_transition": buf.host_nbytes / n, "host_live_bytes_per_transition": buf.host_live_nbytes / n,
        "device_bytes_per_transition": buf.device_nbytes / n,
        "payload_bytes_per_frame": sum(x.payload_nbytes for x in buf.host.stores) / buf.host.stores[0].num_entries,
        "arena_slack_fraction": 1 - sum(x.payload_nbytes for x in buf.host.stores) / max(buf.host_arena_nbytes, 1),
        "add_fill_tps": (n - warm * t * e) / t_add,
    }
    rec["sample_transitions_256_n3_tps"] = timed_samples(lambda b: jax.block_until_ready(s256(buf, next(keys))), 256, repeats)
    rec["sample_sequences_32x16_tps"] = timed_samples(lambda b: jax.block_until_ready(s32(buf, next(keys))), 32 * 16, repeats)
    buf.close()
    del buf
    # add speed against K = 1 (every frame whole, the coding before temporal coding), interleaved chunk by chunk
    bufs = {key: make(40 * t, key) for key in sorted({1, keyframe_interval})}
    times = {key: [] for key in bufs}
    for i in range(40):
        for key in bufs:
            c = chunk(i)
            t1 = time.perf_counter()
            bufs[key] = jax.block_until_ready(add(bufs[key], *c))
            times[key].append(time.perf_counter() - t1)
    for key, ts in times.items():
        rec[f"add_chunk_K{key}_tps"] = t * e / statistics.median(ts[2:])
    return rec


SIDE_SB3X = ("rle-jit", "igzip1", "gzip")  # sb3x's fastest samplers here (rle-jit, or a deflate one on some games)


def run_side_by_side(game: str, n: int, repeats: int, torch_threads: int) -> dict:
    """sb3x (``SIDE_SB3X`` codecs) and two jaxbuffers settings (the default codec and ``rle``) in ONE process:
    adds one transition per call from Python, timed per buffer (jaxbuffers through the ``StagingWriter``), then
    samples interleaved (same load for all): medians and ratios against the fastest sb3x codec at batch 32 and 256.
    jaxbuffers: jitted ``sample_transitions`` (SB3's fields) and the same call made eagerly."""
    import jax
    import jax.numpy as jnp
    import torch
    from gymnasium import spaces
    from sb3_extra_buffers.compressed import CompressedReplayBuffer

    from jaxbuffers import CompressedTrajectoryBuffer, StagingWriter
    from jaxbuffers.compressed import DEFAULT_CODEC

    torch.set_num_threads(torch_threads)
    obs, nxt, act, rew, term = load(game, n)
    rec = {"codec": DEFAULT_CODEC, "torch_threads": torch_threads, "load_before": os.getloadavg()[0]}
    sbs = {}
    for codec in SIDE_SB3X:
        tag = "sb3x_" + codec.replace("-", "_")
        sb = CompressedReplayBuffer(n, spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(18), device="cpu",
                                    compression_method=codec)
        t0 = time.perf_counter()
        for i in range(n):
            sb.add(obs[i : i + 1], nxt[i : i + 1], act[i : i + 1], rew[i : i + 1], term[i : i + 1], [{}])
        rec[f"add_{tag}"] = n / (time.perf_counter() - t0)
        sbs[tag] = sb
    ex = {"obs": jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    act32 = act.astype(np.int32)
    bufs = {}
    for tag, codec in (("default", DEFAULT_CODEC), ("rle", "rle")):
        w = StagingWriter(CompressedTrajectoryBuffer.create(ex, num_envs=1, length=n, frame_stack=4, final_obs_capacity=2, codec=codec))
        t0 = time.perf_counter()
        for i in range(n):
            w.add({"obs": obs[i : i + 1], "action": act32[i : i + 1], "reward": rew[i : i + 1]}, terminated=term[i : i + 1])
        bufs[tag] = jax.block_until_ready(w.buffer)  # the last flush included
        rec[f"add_{tag}"] = n / (time.perf_counter() - t0)
        rec[f"{tag}_accounted_bytes_per_transition"] = bufs[tag].nbytes / n
    keys = iter(jax.random.split(jax.random.key(0), 100_000))
    fields = lambda s: (s.obs, s.action, s.next_obs, s.n_step_return, s.discount)  # noqa: E731
    for b in (32, 256):
        cases = {tag: (lambda b=b, sb=sb: sb.sample(b)) for tag, sb in sbs.items()}
        for tag, buf in bufs.items():
            jitted = jax.jit(lambda bf, k, b=b: fields(bf.sample_transitions(k, b, gamma=0.99)))
            cases[f"{tag}_jit"] = lambda f=jitted, buf=buf: jax.block_until_ready(f(buf, next(keys)))
            cases[f"{tag}_eager"] = lambda b=b, buf=buf: jax.block_until_ready(
                fields(buf.sample_transitions(next(keys), b, gamma=0.99)))
        times = {k: [] for k in cases}
        for fn in cases.values():
            fn(), fn()
        for r in range(repeats * (256 // b)):  # more rounds for the short calls (noisier)
            order = list(cases)[r % len(cases):] + list(cases)[: r % len(cases)]  # rotated each round
            for k in order:
                t0 = time.perf_counter()
                cases[k]()
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        for k in cases:
            rec[f"{k}_tps_{b}"] = b / med[k]
        fastest = min(sbs, key=lambda k: med[k])
        rec[f"sb3x_fastest_{b}"] = fastest
        for tag in bufs:
            for mode in ("jit", "eager"):
                rec[f"ratio_{tag}_{mode}_vs_sb3x_fastest_{b}"] = med[fastest] / med[f"{tag}_{mode}"]
    rec["load_after"] = os.getloadavg()[0]
    return rec


def run_checksums(game: str, n: int, repeats: int) -> dict:
    """The ``checksum`` case (module doc): median seconds of a 500-step add and a 256 sample, with
    the store's checksums on and off."""
    import jax
    import jax.numpy as jnp

    import host_codecs.store as hs
    from host_codecs import _checksum
    from jaxbuffers import CompressedTrajectoryBuffer

    obs, nxt, act, rew, term = load(game, n)
    ex = {"obs": jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    chunk = 500
    term = term.copy()
    term[((n - chunk) // chunk + 1) * chunk - 1] = True  # the chunks are fed as a ring: its wrap to step 0 starts an episode
    steps = [({"obs": jnp.asarray(obs[None, a : a + chunk]), "action": jnp.asarray(act[None, a : a + chunk].astype(np.int32)),
               "reward": jnp.asarray(rew[None, a : a + chunk].astype(np.float32))}, jnp.asarray(term[None, a : a + chunk]))
             for a in range(0, n - chunk + 1, chunk)]
    add = jax.jit(lambda b, s, t: b.add(s, terminated=t), donate_argnums=0)
    sample = jax.jit(lambda b, k: (lambda x: (x.obs, x.action, x.next_obs, x.n_step_return, x.discount))(
        b.sample_transitions(k, 256, gamma=0.99)))
    real, zeros = hs._payload_sums, (lambda chunks, chunk_ids, *_: np.zeros(len(chunk_ids), np.uint32))
    bufs, heads, keys = {}, {"ours": 0, "no-checksum": 0, "per-entry": 0}, iter(jax.random.split(jax.random.key(0), 100_000))
    _checksum.payload_sums({0: np.zeros(1, np.uint8)}, np.zeros(1, np.int64), np.zeros(1), np.ones(1), np.zeros(1))  # loads the compiled loop
    kernels = dict(_checksum._kernels)

    spent = [0.0]  # seconds inside the checksums during the current "ours" op
    timed = accumulating(real, spent)

    def run(impl, fn):
        hs._payload_sums = zeros if impl == "no-checksum" else timed if impl == "ours" else real
        _checksum._kernels = dict.fromkeys(_checksum.CHECKSUMS, False) if impl == "per-entry" else kernels
        try:
            return jax.block_until_ready(fn())
        finally:
            hs._payload_sums, _checksum._kernels = real, kernels

    for impl in heads:
        def fill(impl=impl):
            b = CompressedTrajectoryBuffer.create(ex, num_envs=1, length=len(steps) * chunk, frame_stack=4, final_obs_capacity=2)
            for st, t in steps:
                b = add(b, st, t)
            return b
        bufs[impl] = run(impl, fill)

    def add_next(impl):  # the next chunk of the ring (overwrites the oldest)
        bufs[impl] = run(impl, lambda: add(bufs[impl], *steps[heads[impl] % len(steps)]))
        heads[impl] += 1

    ops = {"add_chunk500": add_next, "sample_256": lambda impl: run(impl, lambda: sample(bufs[impl], next(keys)))}
    rec = {}
    for op, fn in ops.items():
        times = {impl: [] for impl in [*heads, "checksums-only"]}
        for impl in heads:
            fn(impl)
        for r in range(repeats):
            for impl in (list(heads) if r % 2 else list(heads)[::-1]):
                spent[0] = 0.0
                t0 = time.perf_counter()
                fn(impl)
                times[impl].append(time.perf_counter() - t0)
                if impl == "ours":
                    times["checksums-only"].append(spent[0])
        for impl, ts in times.items():
            rec[f"{op}/{impl}"] = statistics.median(ts)
    return rec


def child(args) -> None:
    kind, codec, game, n, repeats = args.case, args.codec, args.game, args.n, args.repeats
    if kind == "keyframes":
        rec = run_keyframes(game, n, args.real, max(repeats, 20), args.codec or "zstd:-1", [int(k) for k in args.keyframes.split(",")],
                            args.delta_codecs.split(","))
    elif kind == "million":
        rec = run_million(game, n, args.real, max(repeats, 20), args.codec or "zstd:-1", args.keyframe_interval)
    elif kind == "side":
        rec = run_side_by_side(game, n, max(repeats, 30), int(codec))
    elif kind == "checksum":
        rec = run_checksums(game, n, max(repeats, 30))
    elif kind == "jax":
        # Main buffer filled one transition per call through the StagingWriter (bytes, samples);
        # then the other add paths in fresh buffers (add throughput only; fewer transitions
        # for the slow one-step paths).
        rec = run_jax(codec, game, n, repeats, mode="staged")
        rec["add_tps"] = rec["add_staged_tps"]
        rec.update(run_jax(codec, game, n, 0, mode="chunk"))
        rec.update(run_jax(codec, game, min(n, 3000), 0, mode="host"))
        rec.update(run_jax(codec, game, min(n, 3000), 0, mode="jit"))
    else:
        rec = run_sb3(kind, codec, game, n, repeats)
    print("RESULT " + json.dumps(rec), flush=True)


# ------------------------------------------------------------------------------------------------
# driver


def cases():
    out = [("sb3", None, "sb3 ReplayBuffer"), ("sb3-opt", None, "sb3 ReplayBuffer optimize_memory_usage")]
    out += [("sb3x", c, f"sb3x {c}") for c in SB3X_CODECS]
    out += [("jax", c, f"jaxbuffers {c}") for c in JAX_CODECS]
    out += [("side", str(t), f"side-by-side default and rle vs sb3x {'/'.join(SIDE_SB3X)}, torch threads {t}") for t in sorted({os.cpu_count() or 1, 1})]
    out += [("checksum", None, "checksums on and off")]
    return out


def main() -> None:
    from _common import emit, header, parser

    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--game", default="breakout", choices=[*_atari.GAMES, "all"])
    p.add_argument("--million", action="store_true", help="the million-transition case (module doc) for --game")
    p.add_argument("--real", type=int, default=20000, help="--million: real ale-py steps per game, tiled")
    p.add_argument("--keyframe-interval", type=int, default=8, help="--million: the buffer's keyframe_interval")
    p.add_argument("--keyframes", default=None, help="comma-separated keyframe intervals: the keyframes case (run_keyframes) "
                   "for --game, --n transitions (default 160000) tiled from --real steps")
    p.add_argument("--delta-codecs", default="rle", help="--keyframes: comma-separated codecs of the delta frames "
                   "(none: the codec codes them); the first with the first interval is the anchor")
    p.add_argument("--anchor-n", type=int, default=10000, help="--million: transitions in the SB3 / sb3x buffers")
    p.add_argument("--n", type=int, default=None, help="transitions (default 20000; --quick: 1000, and one case of each kind)")
    p.add_argument("--case", default=None, help=argparse_hidden())
    p.add_argument("--codec", default=None, help=argparse_hidden())
    p.add_argument("--only", default=None, help="comma-separated substrings of case names to run")
    p.add_argument("--ale", action="store_true", help=argparse_hidden())
    args = p.parse_args()
    global ALE_FRAMES
    ALE_FRAMES = args.ale
    if args.million:
        million(args)
        return
    if args.keyframes and not args.case:
        keyframes(args)
        return
    args.n = args.n or (1000 if args.quick else 20000)
    if args.quick and not args.only:  # smoke run: one case of each kind
        args.only = "sb3 ReplayBuffer,sb3x rle-jit,jaxbuffers zstd:-1,side-by-side,checksums"
    args.repeats = args.repeats or (5 if args.quick else 15)
    if args.case:
        child(args)
        return
    games = ["breakout", "pong"] if args.game == "all" else [args.game]
    header(BENCH, args.quick, transitions=args.n)
    if DATA is None:
        emit({"bench": BENCH, "case": "all", "impl": "ours", "skipped": "shared/data/atari_rollouts.npz not found"})
        return
    for game in games:
        results = {}
        for kind, codec, name in cases():
            if args.only and not any(s in name for s in args.only.split(",")):
                continue
            cmd = [sys.executable, __file__, "--case", kind, "--game", game, "--n", str(args.n), "--repeats", str(args.repeats)]
            if codec:
                cmd += ["--codec", codec]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT)
            except subprocess.TimeoutExpired:
                emit({"bench": BENCH, "case": f"{game}/all", "variant": name, "error": "timeout"})
                continue
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                emit({"bench": BENCH, "case": f"{game}/all", "variant": name, "error": proc.stderr[-800:]})
                continue
            rec = json.loads(line[-1][7:])
            results[name] = rec
            rows(game, kind, name, rec, args.n, args.repeats)
        summarize(game, results)


def keyframes(args) -> None:
    """`--keyframes 8,4 --delta-codecs none,rle`: per game, `run_keyframes` in a subprocess; one row per delta codec,
    interval and metric (the anchor of the sample rows: the first delta codec with the first interval)."""
    from _common import emit, header, row

    n = args.n or (16000 if args.quick else 160_000)
    args.repeats = args.repeats or (5 if args.quick else 15)
    games = list(_atari.GAMES) if args.game == "all" else [args.game]
    header(BENCH, args.quick, keyframes=args.keyframes, delta_codecs=args.delta_codecs, transitions=n, real_steps=args.real)
    for game in games:
        cmd = [sys.executable, __file__, "--case", "keyframes", "--game", game, "--n", str(n), "--repeats", str(args.repeats),
               "--real", str(args.real), "--keyframes", args.keyframes, "--delta-codecs", args.delta_codecs,
               "--ale"] + (["--codec", args.codec] if args.codec else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=ROOT)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            emit({"bench": BENCH, "case": f"{game}/keyframes", "error": proc.stderr[-800:]})
            continue
        rec = json.loads(line[-1][7:])
        first = rec["configs"][0]
        label = lambda name: f"jaxbuffers {rec['codec']} K={name.split('_')[0][1:]} deltas {name.split('_', 1)[1]}"  # noqa: E731
        for name in rec["configs"]:
            variant = label(name)
            for metric, unit in (("host_live_bytes_per_transition", "bytes/transition"), ("payload_bytes_per_frame", "bytes/frame"),
                                 ("frames_decoded_per_transition", "frames/transition")):
                emit({"bench": BENCH, "case": f"{game}/keyframes/{metric}", "impl": "ours", "variant": variant,
                      "value": round(rec[f"{name}_{metric}"], 2), "unit": unit, "n": rec["transitions"], "repeats": 1,
                      "real_steps": rec["real_steps"]})
            for b in (256, 32):
                tps, anchor = rec[f"{name}_sample_{b}_n3_tps"], rec[f"{first}_sample_{b}_n3_tps"]
                row(BENCH, f"{game}/keyframes/sample_transitions_{b}_n3", "ours", 1 / tps, n=rec["transitions"], repeats=args.repeats,
                    unit="transitions/s", variant=variant, anchor=label(first) if name != first else None,
                    anchor_seconds=1 / anchor if name != first else None)


MILLION_ANCHORS = [("sb3", None), ("sb3x", "rle-jit"), ("sb3x", "igzip1"), ("sb3x", "gzip")]


def million(args) -> None:
    """`--million`: per game, the jaxbuffers case (`run_million`) and SB3 / sb3x buffers of `--anchor-n`
    transitions of the same game (memory extrapolated linearly to the jaxbuffers case's size)."""
    from _common import emit, header, row

    n = args.n or (20000 if args.quick else 1_000_000)
    args.repeats = args.repeats or (5 if args.quick else 15)
    games = list(_atari.GAMES) if args.game == "all" else [args.game]
    header(BENCH, args.quick, million=True, transitions=n, real_steps=args.real, anchor_transitions=args.anchor_n)

    def sub(kind, game, count, codec=None):
        cmd = [sys.executable, __file__, "--case", kind, "--game", game, "--n", str(count), "--repeats", str(args.repeats),
               "--real", str(args.real), "--keyframe-interval", str(args.keyframe_interval), "--ale"] + (["--codec", codec] if codec else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=ROOT)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            emit({"bench": BENCH, "case": f"{game}/million", "variant": f"{kind} {codec}", "error": proc.stderr[-800:]})
            return None
        return json.loads(line[-1][7:])

    for game in games:
        ours = sub("million", game, n)
        if ours is None:
            continue
        variant = f"jaxbuffers {ours['codec']} K={ours['keyframe_interval']} deltas {ours['delta_codec']}"
        case = f"{game}/million"
        for key in ("rss_growth_bytes_per_transition", "host_bytes_per_transition", "host_live_bytes_per_transition",
                    "device_bytes_per_transition"):
            emit({"bench": BENCH, "case": f"{case}/{key}", "impl": "ours", "variant": variant, "value": round(ours[key], 1),
                  "unit": "bytes/transition", "n": ours["transitions"], "repeats": 1, "real_steps": ours["real_steps"]})
        emit({"bench": BENCH, "case": f"{case}/rss_growth", "impl": "ours", "variant": variant, "value": ours["rss_growth_bytes"],
              "unit": "bytes", "n": ours["transitions"], "repeats": 1, "payload_bytes_per_frame": round(ours["payload_bytes_per_frame"], 1),
              "arena_slack_fraction": round(ours["arena_slack_fraction"], 4)})
        anchors = {}
        for kind, codec in MILLION_ANCHORS:
            rec = sub(kind, game, args.anchor_n, codec)
            if rec is not None:
                anchors[f"{kind} {codec or ''}".strip()] = rec
                emit({"bench": BENCH, "case": f"{case}/rss_growth_bytes_per_transition", "impl": IMPL[kind], "variant": f"{kind} {codec or ''}".strip(),
                      "value": round(rec["bytes_per_transition"], 1), "unit": "bytes/transition", "n": args.anchor_n, "repeats": 1,
                      "extrapolated_bytes": round(rec["bytes_per_transition"] * ours["transitions"])})
        fastest = max((r["sample_tps_256"] for k, r in anchors.items() if k.startswith("sb3x")), default=None)
        for key in ("sample_transitions_256_n3", "sample_sequences_32x16"):
            row(BENCH, f"{case}/{key}", "ours", 1 / ours[f"{key}_tps"], n=ours["transitions"], repeats=args.repeats,
                unit="transitions/s", variant=variant,
                anchor="sb3-extra-buffers fastest sample_256" if fastest and key.startswith("sample_transitions") else None,
                anchor_seconds=1 / fastest if fastest and key.startswith("sample_transitions") else None)
        for name, rec in anchors.items():
            row(BENCH, f"{case}/sample_256", IMPL[name.split()[0]], 1 / rec["sample_tps_256"], n=args.anchor_n, repeats=args.repeats,
                unit="transitions/s", variant=name)
        row(BENCH, f"{case}/add_fill", "ours", 1 / ours["add_fill_tps"], n=ours["transitions"], repeats=1, unit="transitions/s", variant=variant)
        k1 = ours.get("add_chunk_K1_tps")
        for key in sorted(k for k in ours if k.startswith("add_chunk_K")):
            row(BENCH, f"{case}/add_chunk", "ours", 1 / ours[key], n=40 * 2000, repeats=38, unit="transitions/s",
                variant=f"jaxbuffers {ours['codec']} {key[10:-4]}", anchor="K=1" if key != "add_chunk_K1_tps" else None,
                anchor_seconds=1 / k1 if key != "add_chunk_K1_tps" and k1 else None)


IMPL = {"sb3": "sb3", "sb3-opt": "sb3", "sb3x": "sb3-extra-buffers", "jax": "ours"}


def rows(game: str, kind: str, name: str, rec: dict, n: int, repeats: int) -> None:
    """One ``_common`` row per metric of one case's record."""
    from _common import emit, row

    if kind == "checksum":
        for key, t in rec.items():
            op, impl = key.split("/")
            t0 = rec[f"{op}/no-checksum"]
            share = {"value": round(100 * t / t0, 2), "unit": "% of the op without checksums"} if impl == "checksums-only" else {"unit": "transitions/s"}
            row(BENCH, f"{game}/checksum/{op}", impl, t, n=n, repeats=max(repeats, 30),
                items=500 if op.startswith("add") else 256, anchor="no-checksum" if impl in ("ours", "per-entry") else None,
                anchor_seconds=t0 if impl in ("ours", "per-entry") else None,
                overhead_pct=round(100 * (t / t0 if impl == "checksums-only" else t / t0 - 1), 2), **share)
        return
    if kind == "side":
        case = f"{game}/same-process/{{}}/torch_threads={rec['torch_threads']}"
        for key, tps in rec.items():
            m = re.fullmatch(r"(.+)_tps_(\d+)", key)
            if m:
                tag, b = m.groups()
                impl = "sb3-extra-buffers" if tag.startswith("sb3x") else "ours"
                fastest = rec[f"sb3x_fastest_{b}"]
                row(BENCH, case.format(f"sample_{b}"), impl, 1 / tps, n=n, repeats=repeats, unit="transitions/s", items=1,
                    variant=tag, anchor=None if impl != "ours" else f"sb3-extra-buffers fastest ({fastest})",
                    anchor_seconds=None if impl != "ours" else 1 / rec[f"{fastest}_tps_{b}"])
        adds = {k[4:]: v for k, v in rec.items() if k.startswith("add_")}
        fastest = max((k for k in adds if k.startswith("sb3x")), key=adds.get)
        for tag, tps in adds.items():
            impl = "sb3-extra-buffers" if tag.startswith("sb3x") else "ours"
            row(BENCH, case.format("add_one_per_call"), impl, 1 / tps, n=n, repeats=1, unit="transitions/s", variant=tag,
                anchor=None if impl != "ours" else f"sb3-extra-buffers fastest ({fastest})",
                anchor_seconds=None if impl != "ours" else 1 / adds[fastest])
        return
    for key, v in rec.items():
        if key.endswith("bytes_per_transition"):
            emit({"bench": BENCH, "case": f"{game}/{key}", "impl": IMPL[kind], "variant": name, "value": round(v, 1),
                  "unit": "bytes/transition", "n": n, "repeats": 1})
        elif "_tps" in key and isinstance(v, (int, float)) and v > 0:
            row(BENCH, f"{game}/{key.replace('_tps', '')}", IMPL[kind], 1 / v, n=n, repeats=repeats, unit="transitions/s",
                variant=name)


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


def summarize(game: str, results: dict) -> None:
    from _common import emit

    sides = {k: v for k, v in results.items() if k.startswith("side-by-side")}
    sb3x = {k: v for k, v in results.items() if k.startswith("sb3x") and not k.endswith(" none")}
    jaxs = {k: v for k, v in results.items() if k.startswith("jaxbuffers")}
    if not sb3x or not jaxs:
        return
    metrics = ("add_tps", "sample_tps_32", "sample_tps_256")
    per_codec, per_codec_chunked, per_codec_jit = {}, {}, {}
    # Bytes: the larger of the RSS reading and the accounting (RSS of a small host store can even
    # read negative when warm-up temporaries are released during the fill).
    size = lambda q: max(q["bytes_per_transition"], q.get("accounted_bytes_per_transition", 0))  # noqa: E731
    for name, r in sb3x.items():
        for add_key, table in (("add_tps", per_codec), ("add_chunk_tps", per_codec_chunked), ("add_jit_tps", per_codec_jit)):
            winners = [
                j for j, q in jaxs.items()
                if size(q) <= r["bytes_per_transition"] and q.get(add_key, 0) >= r["add_tps"]
                and all(q[m] >= r[m] for m in metrics[1:])
            ]
            table[name] = winners or None
    smallest = min(sb3x, key=lambda k: sb3x[k]["bytes_per_transition"])
    d = jaxs.get(DEFAULT)
    rec = {"bench": BENCH, "game": game, "summary": True, "dominating_jax_setting_per_sb3x_codec": per_codec,
           "dominating_with_chunked_adds": per_codec_chunked, "dominating_with_jitted_one_step_adds": per_codec_jit}
    if d:
        rec["default"] = DEFAULT
        rec["default_bytes_vs_smallest_sb3x"] = {
            "smallest_sb3x": smallest,
            "ratio": round(sb3x[smallest]["bytes_per_transition"] / size(d), 2),
        }
        if "sb3x rle-jit" in sb3x:
            rj = sb3x["sb3x rle-jit"]
            rec["default_sample_vs_rle_jit"] = {
                f"b{b}": round(d[f"sample_tps_{b}"] / rj[f"sample_tps_{b}"], 2) for b in (32, 256)
            }
    for k, v in sides.items():
        rec.setdefault("same_process_default_vs_sb3x_fastest", {})[k] = {
            key: round(val, 2) for key, val in v.items() if key.startswith("ratio")
        }
    emit(rec)


if __name__ == "__main__":
    main()
