"""Sampling a disk-backed buffer larger than memory: resident memory growth and throughput.

Two cases (`--case`): `trajectory` (below) and `episodes` (after it).

A `CompressedTrajectoryBuffer` with `codec="none"` moved to a folder (`jaxbuffers.disk.open(..., "w", ...)`) is
filled with `--gb` GB (default 10) of real Atari stacks (`obs` uint8 [4, 84, 84] stacks cycled from
`shared/data/atari_rollouts.npz`, 8 envs, chunks of 500 steps per env), flushed and closed. A fresh subprocess then
opens the folder read-only, evicts its files from the page cache (`posix_fadvise(DONTNEED)` on those files only),
samples once (compiling), and records its resident memory (VmRSS) before and after `--batches` samples of 256 3-step
transitions (obs and next_obs decoded: 512 stacks per batch) drawn uniformly over the whole folder.

Rows:

* `build`: GB/s of stacks written by jitted adds (host callback, pwrite) plus the flush.
* `sample/transitions/B=256`: `ours` (the disk buffer, eager calls) in transitions/s, and `rss_growth` in MB, the
  process's resident memory growth over the timed samples.
* `numpy-memmap`: the same number of random stack reads as numpy fancy indexing of the same `.npy` file opened with
  `np.load(mmap_mode="r")` (the memmap-replay-buffer way), after ours in the same process: its mapped pages count as
  resident memory, and it does no checksum, no frame bookkeeping and no transfer to JAX. Ratio: its time / ours.

Episodes: a `CompressedEpisodeBuffer` (`codec="none"`, `frame_stack=4`: one 84x84 frame stored per step) in a
folder of `--episode-gb` GB (default 4) of episodes of 400 to 500 steps whose observations are the frame stacks of
consecutive recorded frames, added 8 episodes per jitted `add_episodes`, flushed and closed; then, in a fresh
process with the files evicted as above, eager samples of two kinds with the RSS growth over each:

* `sample/episode-transitions/B=256`: `sample_transitions(256, n_step=3)` (obs, next_obs and the 3-step window's
  stacks decoded), in transitions/s.
* `sample/episodes/B=4`: `sample_episodes(4)`: whole episodes (stacks `[4, 500, 4, 84, 84]` rebuilt from the
  frames), in episodes/s. Anchors, after ours in the same process, the files evicted again before each, reading the
  same `.npy` file opened with `np.load(mmap_mode="r")` (the `[max_episodes, max_timesteps]` memmap layout) for the
  same number of random episodes: `numpy-memmap-stacks` builds the same stacks by fancy indexing (the ratio's
  anchor), `numpy-memmap` copies each episode's frames only (a slice, no stacks).

Codecs (`--case codecs`): the trajectory case's buffer twice, `codec="none"` and `codec="zstd:3"` (its default delta
coding, `keyframe_interval=8`, and zstd dictionary), each filled with the same `--codec-gb` GB (default 1.5) of raw
stacks, flushed and closed; then one fresh process opens both read-only, evicts their files, compiles, and times
`sample_transitions(256, n_step=3)` on each in alternating rounds (4 rounds of `--batches / 4` samples each):

* `build-codecs/<impl>`: GB/s of raw stacks written (adds plus flush); `folder_size`: the folder's disk usage.
* `sample/codec-transitions/B=256`: transitions/s (median over the rounds) of `zstd:3` against `none` (the ratio's
  anchor), and `rss_growth` in MB of each: the process's resident memory growth summed over its own rounds;
  `zstd-memory` is the same zstd buffer filled in memory in the measuring process (no folder), sampled in the same
  rounds: what decoding costs without the reads from disk. Ratio: `none`'s time / this row's.

Usage: python benchmarks/bench_disk.py [--quick] [--case all|trajectory|episodes|codecs] [--gb 10] [--episode-gb 4]
       [--codec-gb 1.5] [--batches 400] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_file, emit, header, parser, row  # noqa: E402

BENCH = "disk"
ENVS, CHUNK = 8, 500
EP_T, EP_BATCH, EP_SAMPLE = 500, 8, 4  # max_timesteps, episodes per add, episodes per sample
CODECS = {"none": "none", "zstd": "zstd:3"}  # impl name -> codec of the codecs case
ROUNDS = 4
GB = 1.5  # raw GB of the codecs case (the measuring process builds its in-memory buffer of the same size)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def build(path: Path | None, gb: float, codec: str = "none") -> dict:
    """Fill the folder `path` (None: an in-memory buffer, returned as `buffer`) with `gb` GB of stacks (module doc)."""
    import jax
    import jax.numpy as jnp

    import jaxbuffers as jb
    from jaxbuffers import disk

    with np.load(data_file("atari_rollouts.npz")) as d:
        stacks = d["breakout_frames"][d["breakout_obs_idx"][: ENVS * CHUNK]]  # [4000, 4, 84, 84]
    length = max(CHUNK, int(gb * 1e9) // (ENVS * stacks[0].nbytes) // CHUNK * CHUNK)
    step = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = jb.CompressedTrajectoryBuffer.create(step, num_envs=ENVS, length=length, codec=codec)
    buf = buf if path is None else disk.open(path, "w", buf)
    add = jax.jit(jb.CompressedTrajectoryBuffer.add)
    chunk = {"obs": jnp.asarray(stacks.reshape(ENVS, CHUNK, 4, 84, 84)), "action": jnp.zeros((ENVS, CHUNK), jnp.int32),
             "reward": jnp.zeros((ENVS, CHUNK), jnp.float32)}
    term = jnp.zeros((ENVS, CHUNK), bool)
    t0 = time.perf_counter()
    for _ in range(length // CHUNK):
        buf = add(buf, chunk, terminated=term)
    if path is None:
        return {"buffer": jax.block_until_ready(buf)}
    disk.flush(buf)
    seconds = time.perf_counter() - t0
    nbytes = ENVS * length * stacks[0].nbytes
    buf.close()
    folder = sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())  # allocated: the .npy file is sparse
    return {"seconds": seconds, "nbytes": nbytes, "steps": ENVS * length, "folder_bytes": folder}


def measure_codecs(parent: Path, batches: int) -> dict:
    """Both folders of the codecs case, read-only, sampled in alternating rounds (module doc)."""
    import gc

    import jax

    from jaxbuffers import disk

    bufs = {"zstd-memory": build(None, GB, CODECS["zstd"])["buffer"]}  # the zstd folder's buffer, in memory
    for impl in CODECS:
        evict([p for p in (parent / impl).rglob("*") if p.is_file()])
        bufs[impl] = disk.open(parent / impl, "r")
    keys = jax.random.split(jax.random.key(0), batches + 1)
    draw = lambda b, k: jax.block_until_ready(b.sample_transitions(k, 256, n_step=3, gamma=0.99))  # noqa: E731
    for b in bufs.values():
        draw(b, keys[0])
    per = max(batches // ROUNDS, 1)
    out = {f"{impl}_{k}": [] if k == "s" else 0.0 for impl in bufs for k in ("s", "rss_mb")}
    for r in range(ROUNDS):
        for impl, b in bufs.items():
            gc.collect()
            before = rss_mb()
            t0 = time.perf_counter()
            for k in keys[1 + r * per : 1 + (r + 1) * per]:
                draw(b, k)
            out[f"{impl}_s"].append((time.perf_counter() - t0) / per)
            gc.collect()
            out[f"{impl}_rss_mb"] += rss_mb() - before
    out["rss_mb"], out["calls"] = rss_mb(), per * ROUNDS
    return out


def run_codecs(parent: Path, gb: float, batches: int) -> None:
    builds = {impl: build(parent / impl, gb, codec) for impl, codec in CODECS.items()}
    size = f"{builds['none']['nbytes'] / 1e9:.1f}GB"
    for impl, b in builds.items():
        row(BENCH, f"build-codecs/{size}", impl, b["seconds"], n=1, repeats=1, items=b["nbytes"] / 1e9, unit="GB/s",
            steps=b["steps"], folder_gb=round(b["folder_bytes"] / 1e9, 3))
        emit({"bench": BENCH, "case": f"build-codecs/{size}/folder_size", "impl": impl, "value": round(b["folder_bytes"] / 1e9, 3), "unit": "GB"})
    cmd = [sys.executable, __file__, "--measure-codecs", str(parent), "--batches", str(batches), "--codec-gb", str(gb)]
    m = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    case = f"sample/codec-transitions/B=256/{size}"
    impls = [*CODECS, "zstd-memory"]
    t = {impl: float(np.median(m[f"{impl}_s"])) for impl in impls}
    for impl in impls:
        row(BENCH, case, impl, t[impl], n=m["calls"], repeats=ROUNDS, items=256, unit="transitions/s",
            anchor=None if impl == "none" else "none", anchor_seconds=None if impl == "none" else t["none"])
        emit({"bench": BENCH, "case": f"{case}/rss_growth", "impl": impl, "value": round(m[f"{impl}_rss_mb"], 1), "unit": "MB",
              "rss_before_mb": round(m["rss_mb"], 1)})


def measure(path: Path, batches: int) -> dict:
    import jax

    from jaxbuffers import disk

    evict(sorted(path.glob("store-*.npy")))
    buf = disk.open(path, "r")
    keys = jax.random.split(jax.random.key(0), batches + 1)
    jax.block_until_ready(buf.sample_transitions(keys[0], 256, n_step=3, gamma=0.99))
    before = rss_mb()
    t0 = time.perf_counter()
    for k in keys[1:]:
        jax.block_until_ready(buf.sample_transitions(k, 256, n_step=3, gamma=0.99))
    ours = time.perf_counter() - t0
    after = rss_mb()
    data = np.load(path / "store-0.npy", mmap_mode="r")
    rng = np.random.default_rng(0)
    mm_before = rss_mb()
    t0 = time.perf_counter()
    for _ in range(batches):
        np.ascontiguousarray(data[np.sort(rng.integers(0, data.shape[0] - 1, 512))])
    mm = time.perf_counter() - t0
    return {"ours_s": ours, "ours_rss_mb": after - before, "rss_mb": before, "memmap_s": mm, "memmap_rss_mb": rss_mb() - mm_before}


def evict(files: list[Path]) -> None:
    """Drop `files` from the page cache (our own files only), so reads come from the disk."""
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def build_episodes(path: Path, gb: float) -> dict:
    import jax
    import jax.numpy as jnp

    import jaxbuffers as jb
    from jaxbuffers import disk

    with np.load(data_file("atari_rollouts.npz")) as d:
        frames = d["breakout_frames"]  # [20108, 84, 84]
    rng = np.random.default_rng(0)
    frame_bytes = frames[0].nbytes
    num_episodes = max(2 * EP_BATCH, int(gb * 1e9) // (EP_T * frame_bytes) // EP_BATCH * EP_BATCH)
    step = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = disk.open(path, "w", jb.CompressedEpisodeBuffer.create(
        step, max_episodes=num_episodes, max_timesteps=EP_T, frame_stack=4, codec="none"))
    batches = []
    for _ in range(2):  # two batches of episodes, cycled: stacks of consecutive frames from random starts ("reset" padding)
        start = rng.integers(0, len(frames) - EP_T - 1, EP_BATCH)
        t = np.arange(EP_T + 1)[:, None] + np.arange(-3, 1)[None, :]
        idx = start[:, None, None] + np.maximum(t, 0)[None]  # [8, T + 1, 4]
        stacks = frames[idx]
        batches.append(({"obs": jnp.asarray(stacks[:, :EP_T]), "action": jnp.zeros((EP_BATCH, EP_T), jnp.int32),
                         "reward": jnp.zeros((EP_BATCH, EP_T), jnp.float32)}, stacks))
    add = jax.jit(jb.CompressedEpisodeBuffer.add_episodes)
    term = jnp.zeros(EP_BATCH, bool)
    # each episode's final observation is the stack after its last step (the stack check refuses another)
    lengths = [rng.integers(400, EP_T + 1, EP_BATCH).astype(np.int32) for _ in range(num_episodes // EP_BATCH)]
    finals = [jnp.asarray(batches[i % 2][1][np.arange(EP_BATCH), n]) for i, n in enumerate(lengths)]
    stored = 0
    t0 = time.perf_counter()
    for i in range(num_episodes // EP_BATCH):
        eps, final = batches[i % 2][0], finals[i]
        buf = add(buf, eps, jnp.asarray(lengths[i]), terminated=term, final_obs=final)
        stored += int(lengths[i].sum()) + EP_BATCH  # one frame per step and per final observation
    disk.flush(buf)
    seconds = time.perf_counter() - t0
    buf.close()
    return {"seconds": seconds, "nbytes": stored * frame_bytes, "episodes": num_episodes, "steps": stored - num_episodes}


def measure_episodes(path: Path, batches: int) -> dict:
    import gc

    import jax

    from jaxbuffers import disk

    evict(sorted(path.glob("store-*.npy")))
    buf = disk.open(path, "r")
    out = {}
    for kind, calls, draw in (("transitions", batches, lambda k: buf.sample_transitions(k, 256, n_step=3, gamma=0.99)),
                              ("episodes", max(batches // 4, 5), lambda k: buf.sample_episodes(k, EP_SAMPLE))):
        keys = jax.random.split(jax.random.key(1), calls + 1)
        jax.block_until_ready(draw(keys[0]))
        gc.collect()
        before = rss_mb()
        t0 = time.perf_counter()
        for k in keys[1:]:
            jax.block_until_ready(draw(k))
        out[f"{kind}_s"] = (time.perf_counter() - t0) / calls
        gc.collect()
        out[f"{kind}_rss_mb"], out[f"{kind}_calls"] = rss_mb() - before, calls
    out["rss_mb"] = rss_mb()
    held, lengths = int(buf.num_episodes()), np.asarray(buf.buffer.lengths)
    calls = out["episodes_calls"]
    back = np.arange(EP_T)[:, None] + np.arange(-3, 1)[None, :]  # stack position j of step t: frame t - 3 + j

    def frames(data, e):  # the episode's frames: a copy reads the pages
        return np.array(data[e * EP_T : e * EP_T + lengths[e]])

    def stacks(data, e):  # the episode's stacks [T, 4, 84, 84] ("reset" padding), zeros past its length
        stack = np.zeros((EP_T, 4, 84, 84), np.uint8)
        stack[: lengths[e]] = data[e * EP_T + np.maximum(back[: lengths[e]], 0)]
        return stack

    for name, read in (("memmap", frames), ("memmap_stacks", stacks)):
        evict(sorted(path.glob("store-*.npy")))  # what was read before is not in the page cache
        data = np.load(path / "store-0.npy", mmap_mode="r")
        rng = np.random.default_rng(0)  # the same episodes for both
        mm_before = rss_mb()
        t0 = time.perf_counter()
        for _ in range(calls):
            np.stack([read(data, e) for e in rng.integers(0, held, EP_SAMPLE).tolist()]) if name == "memmap_stacks" else [
                read(data, e) for e in rng.integers(0, held, EP_SAMPLE).tolist()]
        out[f"{name}_s"] = (time.perf_counter() - t0) / calls
        out[f"{name}_rss_mb"] = rss_mb() - mm_before
        del data
    return out


def run_episodes(parent: Path, gb: float, batches: int) -> None:
    b = build_episodes(parent / "eps", gb)
    size = f"{b['nbytes'] / 1e9:.1f}GB"
    row(BENCH, f"build-episodes/{size}", "ours", b["seconds"], n=1, repeats=1, items=b["nbytes"] / 1e9, unit="GB/s",
        episodes=b["episodes"], steps=b["steps"])
    cmd = [sys.executable, __file__, "--measure-episodes", str(parent / "eps"), "--batches", str(batches)]
    m = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    case = f"sample/episode-transitions/B=256/{size}"
    row(BENCH, case, "ours", m["transitions_s"], n=m["transitions_calls"], repeats=1, items=256, unit="transitions/s")
    emit({"bench": BENCH, "case": f"{case}/rss_growth", "impl": "ours", "value": round(m["transitions_rss_mb"], 1), "unit": "MB"})
    case = f"sample/episodes/B={EP_SAMPLE}/{size}"
    row(BENCH, case, "ours", m["episodes_s"], n=m["episodes_calls"], repeats=1, items=EP_SAMPLE, unit="episodes/s",
        anchor="numpy-memmap-stacks", anchor_seconds=m["memmap_stacks_s"])
    row(BENCH, case, "numpy-memmap-stacks", m["memmap_stacks_s"], n=m["episodes_calls"], repeats=1, items=EP_SAMPLE, unit="episodes/s")
    row(BENCH, case, "numpy-memmap", m["memmap_s"], n=m["episodes_calls"], repeats=1, items=EP_SAMPLE, unit="episodes/s")
    emit({"bench": BENCH, "case": f"{case}/rss_growth", "impl": "ours", "value": round(m["episodes_rss_mb"], 1), "unit": "MB",
          "rss_before_mb": round(m["rss_mb"], 1)})
    for impl, key in (("numpy-memmap-stacks", "memmap_stacks_rss_mb"), ("numpy-memmap", "memmap_rss_mb")):
        emit({"bench": BENCH, "case": f"{case}/rss_growth", "impl": impl, "value": round(m[key], 1), "unit": "MB"})


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=None, help="folder size in GB (default 10; --quick 0.2)")
    p.add_argument("--batches", type=int, default=None, help="timed samples (default 400; --quick 20)")
    p.add_argument("--dir", default=None, help="parent folder of the buffer folder (default: a temporary folder in /tmp)")
    p.add_argument("--episode-gb", type=float, default=None, help="episode folder size in GB (default 4; --quick 0.2)")
    p.add_argument("--case", choices=("all", "trajectory", "episodes", "codecs"), default="all")
    p.add_argument("--codec-gb", type=float, default=None, help="raw GB of each folder of the codecs case (default 1.5; --quick 0.1)")
    p.add_argument("--measure-codecs", default=None, help=argparse.SUPPRESS)
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the measuring subprocesses
    p.add_argument("--measure-episodes", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    batches = args.batches or (20 if args.quick else 400)
    if args.measure:
        print(json.dumps(measure(Path(args.measure), batches)))
        return
    if args.measure_episodes:
        print(json.dumps(measure_episodes(Path(args.measure_episodes), batches)))
        return
    if args.measure_codecs:
        global GB
        GB = args.codec_gb
        print(json.dumps(measure_codecs(Path(args.measure_codecs), batches)))
        return
    gb = (args.gb or (0.2 if args.quick else 10.0)) if args.case in ("all", "trajectory") else 0.0
    ep_gb = (args.episode_gb or (0.2 if args.quick else 4.0)) if args.case in ("all", "episodes") else 0.0
    codec_gb = (args.codec_gb or (0.1 if args.quick else 1.5)) if args.case in ("all", "codecs") else 0.0
    header(BENCH, args.quick, gb=gb, episode_gb=ep_gb, codec_gb=codec_gb)
    parent = Path(tempfile.mkdtemp(prefix="bench_disk_", dir=args.dir or "/tmp"))
    free = shutil.disk_usage(parent).free
    if free < 1.2 * (gb + ep_gb + codec_gb) * 1e9:
        raise SystemExit(f"--dir: {parent} has {free / 1e9:.1f} GB free, the folders need {gb + ep_gb + codec_gb} GB; pass a smaller --gb")
    try:
        if codec_gb:
            run_codecs(parent, codec_gb, batches)
        if ep_gb:
            run_episodes(parent, ep_gb, batches)
        if not gb:
            return
        b = build(parent / "buf", gb)
        row(BENCH, f"build/{b['nbytes'] / 1e9:.1f}GB", "ours", b["seconds"], n=1, repeats=1, items=b["nbytes"] / 1e9, unit="GB/s",
            steps=b["steps"])
        cmd = [sys.executable, __file__, "--measure", str(parent / "buf"), "--batches", str(batches)]
        m = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        case = f"sample/transitions/B=256/{b['nbytes'] / 1e9:.1f}GB"
        row(BENCH, case, "ours", m["ours_s"] / batches, n=batches, repeats=1, items=256, unit="transitions/s",
            anchor="numpy-memmap", anchor_seconds=m["memmap_s"] / batches)
        row(BENCH, case, "numpy-memmap", m["memmap_s"] / batches, n=batches, repeats=1, items=256, unit="transitions/s")
        emit({"bench": BENCH, "case": f"{case}/rss_growth", "impl": "ours", "value": round(m["ours_rss_mb"], 1), "unit": "MB",
              "rss_before_mb": round(m["rss_mb"], 1)})
        emit({"bench": BENCH, "case": f"{case}/rss_growth", "impl": "numpy-memmap", "value": round(m["memmap_rss_mb"], 1), "unit": "MB"})
    finally:
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
