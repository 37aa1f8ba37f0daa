"""Sampling a disk-backed buffer larger than memory: resident memory growth and throughput.

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
  resident memory.

Usage: python benchmarks/bench_disk.py [--quick] [--gb 10] [--batches 400] [--dir PATH]
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


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def build(path: Path, gb: float) -> dict:
    import jax
    import jax.numpy as jnp

    import jaxbuffers as jb
    from jaxbuffers import disk

    with np.load(data_file("atari_rollouts.npz")) as d:
        stacks = d["breakout_frames"][d["breakout_obs_idx"][: ENVS * CHUNK]]  # [4000, 4, 84, 84]
    length = max(CHUNK, int(gb * 1e9) // (ENVS * stacks[0].nbytes) // CHUNK * CHUNK)
    step = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = disk.open(path, "w", jb.CompressedTrajectoryBuffer.create(step, num_envs=ENVS, length=length, codec="none"))
    add = jax.jit(jb.CompressedTrajectoryBuffer.add)
    chunk = {"obs": jnp.asarray(stacks.reshape(ENVS, CHUNK, 4, 84, 84)), "action": jnp.zeros((ENVS, CHUNK), jnp.int32),
             "reward": jnp.zeros((ENVS, CHUNK), jnp.float32)}
    term = jnp.zeros((ENVS, CHUNK), bool)
    t0 = time.perf_counter()
    for _ in range(length // CHUNK):
        buf = add(buf, chunk, terminated=term)
    disk.flush(buf)
    seconds = time.perf_counter() - t0
    nbytes = ENVS * length * stacks[0].nbytes
    buf.close()
    return {"seconds": seconds, "nbytes": nbytes, "steps": ENVS * length}


def measure(path: Path, batches: int) -> dict:
    import jax

    from jaxbuffers import disk

    files = sorted(path.glob("store-*.npy"))
    for p in files:  # our own files only: reads come from the disk, not from what the build left cached
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
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


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=None, help="folder size in GB (default 10; --quick 0.2)")
    p.add_argument("--batches", type=int, default=None, help="timed samples (default 400; --quick 20)")
    p.add_argument("--dir", default=None, help="parent folder of the buffer folder (default: a temporary folder in /tmp)")
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the measuring subprocess
    args = p.parse_args()
    batches = args.batches or (20 if args.quick else 400)
    if args.measure:
        print(json.dumps(measure(Path(args.measure), batches)))
        return
    gb = args.gb or (0.2 if args.quick else 10.0)
    header(BENCH, args.quick, gb=gb)
    parent = Path(tempfile.mkdtemp(prefix="bench_disk_", dir=args.dir or "/tmp"))
    free = shutil.disk_usage(parent).free
    if free < 1.2 * gb * 1e9:
        raise SystemExit(f"--dir: {parent} has {free / 1e9:.1f} GB free, the folder needs {gb} GB; pass a smaller --gb")
    try:
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
