"""Build ``docs/benchmarks.md`` from benchmark JSON lines (``benchmarks/run_all.py`` output).

One page: a header with the machine and package versions (from the benchmarks' header lines),
how to read the tables, then one table per benchmark with each row's median, throughput, ratio to
its anchor and, where a baseline revision ran too, the baseline's median and the speedup.

Run: python benchmarks/report.py benchmarks/results/NAME.jsonl [more.jsonl ...] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["replay", "prioritised", "trajectory", "episodes", "eager", "ppo", "returns", "compressed", "temporal", "sb3", "codecs",
         "torch_interop", "checkpoint", "disk", "scale"]
TITLES = {
    "replay": "Uniform replay (`ReplayBuffer`) against flashbax",
    "prioritised": "Prioritised replay (`PrioritisedReplayBuffer`) against flashbax",
    "trajectory": "Trajectory buffers against flashbax",
    "episodes": "Episode sampling (`EpisodeBuffer`) against memmap-replay-buffer and TorchRL",
    "eager": "Eager calls against jitted calls",
    "ppo": "PPO on CartPole-v1: the example against plain PPO",
    "returns": "GAE against rlax",
    "compressed": "Compressed Atari replay against SB3 and sb3-extra-buffers",
    "temporal": "Temporal coding of Atari frames: bytes per frame",
    "sb3": "SB3 DQN with jaxbuffers' replay buffer",
    "codecs": "Host codecs on Atari frames against memcpy",
    "torch_interop": "JAX to torch hand-off",
    "checkpoint": "Save and restore against np.save / np.load and flashbax's Vault",
    "scale": "Sharded buffers from 1 to 8 devices, and actors feeding a learner",
    "disk": "Sampling a disk-backed buffer larger than memory",
}
NOTES = {
    "replay": "Anchor: flashbax's item buffer (`flashbax-flat` is its flat buffer). `call`: one jitted, donated "
              "call per operation from Python; `scan`: the operations inside one jitted `lax.scan`, as in a jitted "
              "training step. Throughput in items/s. `metrics/...` rows (`bench_replay.py --metrics`): the buffer "
              "without usage metrics (`off`, the anchor), with its scalar counters and `record` of every sample "
              "(`counters`), and with per-slot counts too (`per-slot`, the default); `add+sample+record` is a scanned training "
              "step of one add, one sample of 256 and its `record`, on new buffers that every variant fills alike: a "
              "quarter of the capacity, and (`full/`) all of it. Their ratio is that of the medians; in brackets "
              "the quartiles of the ratio within each round (both timed back to back), the spread the machine's load "
              "leaves; then the same of the process CPU time (all threads), which leaves out the waits for a core "
              "that a busy machine adds to the wall time. Every variant compiles the same add, sample and checksum "
              "and donates its state, and the recorded step updates every metric in place (no copy of the counts or "
              "of the counters). Where the cost goes (callgrind, 200 steps of the quarter-full vector step, "
              "instructions per step outside the thread pool's idle spinning): without metrics about 178k, 53k of "
              "them in the compiled kernels, 59k in XLA's runtime (about 300 per operation launched) and 48k in "
              "memory allocation; in the kernels and the runtime, `counters` adds about 8k (4.3%): one scatter of the 256 draws' age bins into the 32 bins "
              "(3.3k, 13 instructions a draw), one reduction over the batch for the drawn count, the age sum and the "
              "largest age (1.3k), the bins' indices (0.8k), one update of the counters (0.2k) and seven operations "
              "launched; `per-slot` adds about 5k more (7.0% in all): a second scatter of 256 saturating increments "
              "at random positions of the int32 `[capacity]` counts (3.3k), its indices, the add's reset of the "
              "positions it writes, and one more cache line per draw (about 18% more L1 misses per step; on a full "
              "buffer, 400 KB of counts beside 10 MB of storage, about 18% more misses of a 2 MB last-level cache). "
              "The two scatters are O(batch) whatever the layout of the counts, so a step that does nothing but "
              "sample pays them in full, the counts more so on a full buffer; a step that also trains a network "
              "hides them. Timings on this shared machine cannot settle a few percent: two identical steps "
              "compiled apart (the same operations) differed by 4 to 5% within one process, and over three runs of "
              "the vector steps the CPU-time ratio ranged 0.93 to 0.97 (`counters`) and 0.88 to 0.95 (`per-slot`); the instruction "
              "counts above are the steady measure (before the counters and age bins became one array: 5.1% and "
              "7.8%; they were counted before the age sum became three exact integer counters in place of a float32 "
              "sum, which adds one term to the reduction and three counter pairs to the update). The rows shown were "
              "measured on a quiet machine (load average 2 to 3) with the exact age sum; the tree before it, run "
              "right after, gave 0.99 / 0.94 (`counters`, quarter / full) and 0.78 / 0.76 (`per-slot`) in wall time, "
              "0.95 / 0.94 and 0.89 / 0.87 in CPU time: on an idle machine the per-position scatter costs more of "
              "the step than under load.",
    "prioritised": "Anchor: flashbax's prioritised item buffer. `call` / `scan` as for uniform replay; "
                   "`sample+set_priorities/.../scan` is the pair a prioritised training step runs. flashbax picks its "
                   "sum-tree update by backend: on CPU (`flashbax`) a sequential leaf-to-root walk per item (a scan "
                   "over the batch of a loop over the levels, adding deltas to one flat array of sums), a loop small "
                   "enough that XLA:CPU compiles it into one native function; on GPU/TPU (`flashbax-bincount`, shown "
                   "here on the same CPU) a `bincount` over the whole capacity per write. jaxbuffers has one "
                   "tree for every backend: sums and minima (the importance weights' normaliser) recomputed from the "
                   "children, one array per depth (18 at 100k slots). `add` writes a ring run, whose ancestors are "
                   "consecutive rows at every depth: each depth reads and writes one slice (two when the run wraps "
                   "past the capacity), no gather or scatter. `set_priorities` writes any slots: per depth of more "
                   "than B rows one gather and one scatter of the B ancestors, the depths of at most B rows recomputed "
                   "whole. Per call, every state array is an argument and a result of the program: ours passes 28 "
                   "(18 of them the tree's depths) against flashbax's 9, most of the remaining per-call gap at B = 1 "
                   "and 8. flashbax's `set_priorities` also skips what ours checks: "
                   "a slot overwritten since it was sampled is updated anyway. The rows were measured on a quiet "
                   "machine (load average under 2).",
    "trajectory": "Anchor: flashbax's trajectory buffers (8 envs). Add throughput in env steps/s; `chunk16` adds 16 "
                  "steps per env per call. Ours also writes episode flags and a final-observation ring and never "
                  "samples across the write head. The rows were measured on a quiet machine (load average under 2).",
    "episodes": "1,000 episodes of 50 to 200 steps (obs f32[17], action f32[6]). Anchors: memmap-replay-buffer's "
                "`dataloader` (whole episodes; 3-step transitions) and TorchRL: padded episodes in a "
                "`LazyTensorStorage` (whole episodes), `SliceSampler` windows of 3 steps with their discounted return "
                "(3-step transitions; its windows never reach an episode's end) and of 32 steps (sequences). One "
                "batch per operation; ours is one jitted call from Python. "
                "memmap-replay-buffer's loaders run shuffled epochs (without replacement); ours and TorchRL draw with "
                "replacement.",
    "eager": "`ours-eager` calls the buffer method from Python; `ours-jit` wraps the same call in `jax.jit`. "
             "Ratio = jitted time / eager time: 1.0 means the eager call costs what the jitted one does "
             "(target >= 0.8). The current rows were measured on a quiet machine (load average under 2), except "
             "`RolloutBuffer.minibatches` (since a rollout's minibatches need `compute_gae` first, on a state after "
             "it) and `CompressedRolloutBuffer.add`, measured while other jobs loaded the two cores (load average 7 "
             "to 10); the baseline rows ran under load too.",
    "ppo": "Anchor: `plain-ppo`, a PureJaxRL-style PPO with its own loop and metrics; `shared-driver` is the same "
           "buffer-free PPO inside the example's driver. `wall_s_to_475`: seconds from the start (compile included) "
           "to a rolling 20-episode mean return of 475; empty when not reached (quick runs train 5e4 steps only). "
           "Ratio > 1: faster than plain PPO; the target for ours is a time ratio (ours / plain) <= 1.2, i.e. "
           "ratio >= 0.83. Repetition r runs every implementation with seed r; `train_s_to_475` is the part after "
           "compiling, `compile_cpu_s` the process CPU seconds of compiling (steadier than wall time on a loaded "
           "machine).",
    "returns": "Anchor: rlax's GAE vmapped over envs; ours with the reverse scan and the associative scan. "
               "Throughput in steps/s (T x N per call).",
    "compressed": "Recorded Atari transitions. `checksum/*` rows: jitted adds of 500 steps and samples of 256 of a "
                  "compressed trajectory buffer (default codec) with the entry checksums (`ours`), without them "
                  "(`no-checksum`) and computed one call per entry (`per-entry`), interleaved in one process; "
                  "`checksums-only`: the time spent hashing inside each `ours` op, as a share of the op without "
                  "checksums. Memory rows give bytes per transition (growth of the anonymous resident memory, `RssAnon`, "
                  "which file-backed pages the kernel may drop do not blur; `accounted` from "
                  "the buffer's own byte count). Rows run one buffer per subprocess, so only the `same-process` rows "
                  "have ratios (ours against the fastest of sb3-extra-buffers' rle-jit, igzip1 and gzip in that process: samples "
                  "interleaved, one-per-call adds timed buffer after buffer; the Pong and MsPacman ones of December ran "
                  "while other jobs loaded the two cores, load average 11 to 19, which stretches a sample's wall time "
                  "far past its CPU time). `million` rows "
                  "(`--million`): 1M transitions of a random-policy ale-py rollout of 20,000 steps tiled over 8 lanes, "
                  "anonymous RSS growth from a warmed process (after compiling and the first 4,000 transitions; the fill waits "
                  "for every 4th add, so queued adds do not hold their chunks); the SB3 and sb3x "
                  "rows hold 10,000 transitions of the same frames and `extrapolated_bytes` scales them linearly to 1M; "
                  "the sample ratio compares with sb3x's fastest codec. `add_chunk` compares adds of 250 steps x 8 lanes "
                  "with K=8 and K=1 (every frame whole), interleaved. The million rows were measured while other "
                  "jobs loaded the two cores (load average 6 to 15): compare rows of one game with each other, not "
                  "with the other tables. The `add_chunk` rows were measured again, apart from the other million "
                  "rows, after the add path changed (a put encodes its deltas from the batch and their bases; RLE "
                  "XORs each delta into one scratch row and scans it there): the same code as `--million` after a "
                  "fill of 20,000 transitions (`--case million --n 20000`), each row the mean of two runs' medians, "
                  "load average 5.5 to 13; the tree before the change, run alternately with it in separate processes, "
                  "gave K=8 / K=1 ratios of 0.81 to 0.89 (its K=8 adds XORed every delta row out before encoding it). The Pong million rows were measured once more, whole, at the end on a quiet machine (load average under 2); the other games' rows come from earlier runs, possibly on another CPU: compare ratios within a game, not medians across games.",
    "sb3": "SB3 DQN (CnnPolicy) on a replay of recorded Breakout frames. Anchor: SB3's own ReplayBuffer. Memory is "
           "extrapolated to 1M transitions from two fill sizes. `compressed/replay/*` and `compressed/rollout/*`: the "
           "SB3 classes with sb3-extra-buffers' names (`ours:<method>`, with frame_stack=4) against "
           "sb3-extra-buffers 0.5 (`extra:<method>`) and SB3; memory rows one fresh subprocess per variant, call rows "
           "every variant in one process, interleaved (adds in turns of 128, a block's time / 128 per sample: each block "
           "holds the replay adapter's flush of its 128 staged steps); `held_bytes`: tracemalloc's "
           "traced host memory plus the JAX arrays alive (`jax.live_arrays`) after filling, nothing flushed, ratio = ours / sb3-extra-buffers' smallest (< 1: "
           "smaller); `bytes_per_*`: RSS growth between two fills (noisy when the machine swaps); `compressed_dict/*`: "
           "the Dict classes on observations {pixels: the stacks, vector: 4 float32} (ours compress `pixels`), against "
           "sb3-extra-buffers' and SB3's Dict buffers (call rows over 3,000 steps); the `compressed_dict/*` rows were "
           "measured while other jobs loaded the two cores (load average 7 to 22), the `compressed/{replay,rollout}/*` "
           "call rows again on a quiet machine (load average 2 to 3), after the replay add's flush work moved to the "
           "host and the adapters began refusing float values that overflow float32: read "
           "their ratios, not their times against other rows; call rows: ratio = "
           "sb3-extra-buffers' fastest time / ours (> 1: faster); the add, sample and get rows' JSON lines also carry "
           "`cpu_us`, the process CPU time per call (per step for get), and `cpu_ratio` (the same ratio of CPU times), "
           "which waits for a CPU on a loaded machine do not inflate; the `compressed/{replay,rollout}/*` call rows ran "
           "on 2 cores of an Intel Xeon, not the CPU in the table above (the tree before the flush work moved to the "
           "host gave replay add CPU ratios of 0.43 for zstd-1 and 0.46 for igzip1 there, under load). `compressed/replay/keyframe/*`: our replay class "
           "(`zstd-1`) at each `keyframe_interval` K (`/K<k>`), its sample rows in one process beside `extra:rle-jit`, "
           "its held bytes one fresh process per K, ratio = ours / `extra:gzip9`'s. `rollout/*`: the uncompressed `JaxRolloutBuffer` "
           "against SB3's `RolloutBuffer` in one process, one rollout of 2048 Breakout steps as SB3's PPO runs it "
           "(reset, adds, GAE, 4 passes of `get(256)`); ratio = SB3's time / ours (> 1: faster), for `bytes_per_step` "
           "SB3's bytes held / ours.",
    "temporal": "3,000 frames per game (one ale-py lane): each frame XORed (or "
                "subtracted, `sub`) with the lane's previous frame, a keyframe at every episode start and every K "
                "frames (K=1: every frame whole), zstd at the level in the case, a 32 KiB dictionary trained on the "
                "first 1,024 frames for the frames named. `encode_mbs` / `decode_mbs` (one thread) are in the JSON "
                "lines. Chosen: XOR, the dictionary for keyframes and deltas, K=8 (the `compressed` million rows).",
    "codecs": "Throughput in MB/s of raw bytes; ratio = throughput / numpy memcpy bandwidth in the same process. "
              "`checksum/*` rows: a store's put and get of 256 frames with the entry checksums (`ours`: CRC-32, one "
              "compiled loop per batch), with the XXH3 sums of stores saved before (`xxh3`), without them "
              "(`no-checksum`, the anchor; ours, xxh3 and it interleaved in one process) and computed one Python "
              "call per entry (`per-entry`, in a round of its own with the anchor); `checksums-only` / `xxh3-only`: "
              "the time spent computing them inside each op, as a share of the op without checksums (less noisy "
              "than the difference of two timings on a loaded machine). `checksum_loop/*` rows: each candidate's C "
              "function over 256 payloads in one compiled loop, in cache (`hot`) or read from 29 MB (`cold`); "
              "`checksum_function/*`: one Python call per payload.",
    "torch_interop": "Anchor: the numpy route (`torch.from_numpy(np.asarray(x))` and back). Throughput in MB/s.",
    "checkpoint": "A `ReplayBuffer` of real Atari items (`uncompressed`) and a `CompressedTrajectoryBuffer` of recorded "
                  "Breakout steps (`compressed`: device ids plus host arenas), written to the same disk. Throughput in "
                  "GB/s of array bytes. `ours`: `jaxbuffers.save` (each array's bytes written from its memory in orbax's "
                  "layout and checksummed as written, one fsync per file, atomic rename) and "
                  "`jaxbuffers.restore` (each array's bytes copied once into the memory the restored array owns and "
                  "checksummed there, arrays on the device; the host payloads read straight into the arena chunks "
                  "the restored store keeps). Save anchor: `np.save+fsync` of the "
                  "same arrays (the same durability; `np.save` alone leaves them in the page cache, "
                  "`save_vs_np.save` is ours / its rate); restore anchor: `np.load` + `device_put`. flashbax's Vault "
                  "holds device arrays only (uncompressed case), with its default gzip-5 and with zstd-1. Restores "
                  "read what the saves left in the page cache; an untimed `os.sync()` (after a trim of freed memory) precedes every timed call; the rows were measured in one full run on a quiet machine (load average 2 to 3), after the save began dropping the checkpoint it replaces from the page cache and writing each file itself (the tree before gave 0.30x `np.save+fsync` for 1 GB and 0.83x compressed, under load) and after the restore began reading the host payloads straight into the arena chunks (compressed restore 0.37x `np.load` before, 0.51x after, side by side under load). `save_blocking`: how long `save(..., blocking=False)` "
                  "holds the caller (the buffer taken to host memory; the write then runs in the background), beside "
                  "`np.save`. A blocking save's time is writing and fsyncing every file with its checksum taken in the "
                  "same pass, the work of `np.save+fsync` plus the hashing; on a loaded machine both swing "
                  "with the disk's writeback, so compare rows of one run only.",
    "scale": "`ShardedBuffer` on meshes of the first 1, 2, 4 and 8 devices (`variant`); ratio = the 1-device time / "
             "this row's (> 1: faster than one device). On a CPU the devices are forced host devices sharing the "
             "machine's cores: the rows show the cost of the sharded program, not a speed-up. Global sampling draws "
             "256 items from the whole buffer; local sampling 256 / S per shard. `episodes`: `EpisodeBuffer` shards "
             "(episodes of up to 64 steps), adds of 16 episodes (throughput in steps/s) and 3-step transitions under "
             "a meta filter. `epoch/rollout`: one PPO epoch of 4 minibatches over 128 steps x 64 envs, each shard "
             "shuffling its own steps (`local`) or the unsharded permutation split over the shards by one "
             "reduce-scatter per minibatch (`global`), in steps/s. `actors-to-learner`: 4 actor threads "
             "append single items through one `Writer` (64 per add) while a learner samples 256 at a time, with a "
             "samples-per-insert limiter of 1 (`spi=1`) or none; throughput in inserted transitions/s.",
    "disk": "A `CompressedTrajectoryBuffer` (`codec=\"none\"`) in a folder of real Atari stacks (uint8 [4, 84, 84], 8 "
            "envs), built by jitted adds and flushed (`build`, GB/s), then opened read-only in a fresh process with its "
            "files evicted from the page cache and sampled eagerly: 256 3-step transitions per call (512 stacks read). "
            "`rss_growth`: the process's resident memory growth over the timed samples. `numpy-memmap`: the same number "
            "of random stacks read by fancy indexing of the same `.npy` file opened with `np.load(mmap_mode=\"r\")`, "
            "after ours in the same process (its mapped pages count as resident memory; it does no checksum, no frame "
            "bookkeeping and no transfer to JAX). Ratio of ours: numpy-memmap's time / ours. Episodes (`build-episodes`, "
            "`episode-transitions`, `episodes`): a `CompressedEpisodeBuffer` (`codec=\"none\"`, `frame_stack=4`: one "
            "84x84 frame stored per step) of episodes of 400 to 500 steps of recorded Breakout stacks, sampled the same "
            "way: 256 3-step transitions per call (obs, next_obs and the window decoded), or 4 whole episodes per call "
            "(stacks rebuilt, uint8 [4, 500, 4, 84, 84]). Its anchors read 4 random episodes of the same file through "
            "`np.load(mmap_mode=\"r\")`, the files evicted again before each: `numpy-memmap-stacks` builds the same "
            "stacks by fancy indexing (the ratio's anchor), `numpy-memmap` copies the frames only (no stacks). Codecs "
            "(`build-codecs`, `codec-transitions`): the trajectory buffer with `codec=\"none\"` and with `\"zstd:3\"` "
            "(delta coded, a keyframe every 8 steps, its dictionary), the same raw stacks in each folder (`folder_size`: "
            "its disk usage), both opened read-only in one fresh process with their files evicted and sampled in "
            "alternating rounds; `zstd-memory`: the same zstd buffer filled in memory in that process. Ratio: `none`'s "
            "time / this row's. The codecs rows of December were measured while other jobs loaded the two cores (load "
            "average up to about 20): the `zstd` and `zstd-memory` rows swapped order between runs.",
}
VERSIONS = ["python", "jax", "jaxlib", "flax", "flashbax", "rlax", "stable-baselines3", "torch", "numba", "zstandard"]


def fmt(x, digits=3):
    if x is None:
        return ""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x:,.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"
    return str(x)


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def _machine(rows) -> dict | None:
    """The machine of the first header row of the current tree among `rows`."""
    return next((r["machine"] for r in rows if r.get("header") and r.get("tree", "current") == "current"), None)


def header_section(rows, sources) -> list[str]:
    heads = [r for r in rows if r.get("header") and r.get("tree", "current") == "current"]
    quick = any(r.get("quick") for r in heads)
    h = heads[0] if heads else {"machine": {}, "versions": {}}
    m, v = h["machine"], {**h["versions"], "python": h["machine"].get("python")}
    revs: dict[str, list[str]] = {}
    for r in rows:
        if r.get("rev") and r["rev"] not in revs.setdefault(r.get("tree"), []):
            revs[r["tree"]].append(r["rev"])
    out = ["# Benchmarks", "",
           f"Generated by `benchmarks/report.py` from {', '.join(f'`{s}`' for s in sources)}; do not edit by hand.", ""]
    if quick:
        out += ["> **Quick runs (`--quick`)**: smoke-test sizes and few repetitions on a shared, loaded machine. "
                "These numbers show that every benchmark runs and what it reports; they are not measurements to "
                "quote. The full run (`python benchmarks/run_all.py --baseline REV`) replaces this page.", ""]
    out += ["| CPU | cores | backend | " + " | ".join(VERSIONS) + " |", "|" + "---|" * (3 + len(VERSIONS)),
            f"| {m.get('cpu', '')} | {m.get('cores', '')} | {m.get('backend', '')} | "
            + " | ".join(str(v.get(k) or "") for k in VERSIONS) + " |", ""]
    names = lambda tree: ", ".join(f"`{rev[:10]}`" for rev in revs.get(tree, ["?"]))  # noqa: E731
    out += [f"Current tree: {names('current')} (several when benchmarks ran at different commits)."
            + (f" Baseline: {names('baseline')}." if "baseline" in revs else ""), ""]
    out += ["## How to read the tables", "",
            "Each row is one case of one implementation (`impl`: `ours` is jaxbuffers; `variant` names a setting). "
            "`median` is the median over `repeats` timed repetitions of the time of one operation (each repetition "
            "runs `n` operations); implementations of a case are timed interleaved in one process. "
            "`ratio` = the anchor's time / this row's time (> 1: faster than the anchor), given only when both ran "
            "in the same process. Where a baseline revision ran, `baseline` is its median for the same row and "
            "`vs baseline` = baseline time / current time (> 1: the current tree is faster); on rows of other "
            "libraries, whose code is the same in both runs, it shows the run-to-run noise.", ""]
    return out


def bench_section(bench, rows, page_machine: dict | None = None) -> list[str]:
    cur = [r for r in rows if r.get("tree", "current") == "current" and "case" in r and not r.get("header")]
    base = {(r["case"], r.get("impl"), r.get("variant")): r for r in rows
            if r.get("tree") == "baseline" and "case" in r and not r.get("header")}
    own = _machine(rows) or {}
    where = (f" Measured on {own.get('cpu')} ({own.get('cores')} cores), not the machine of the table at the top."
             if page_machine and own and own.get("cpu") != page_machine.get("cpu") else "")
    out = [f"## {TITLES.get(bench, bench)}", "", f"`benchmarks/bench_{bench}.py`. {NOTES.get(bench, '')}{where}", ""]
    has_base = any(k for k in base)
    cols = ["case", "impl", "variant", "median", "throughput", "ratio"] + (["baseline", "vs baseline"] if has_base else [])
    out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in cur:
        if "skipped" in r:
            out.append(f"| {r['case']} | {r.get('impl', '')} | | skipped: {r['skipped']} |" + " |" * (len(cols) - 4))
            continue
        if "value" in r:
            median, thr = "", f"{fmt(r['value'])} {r.get('unit', '')}"
        elif r.get("median_us") is None and "median_us" in r:
            median, thr = "not reached" if r.get("unit") == "s" else "", ""
        elif "median_us" in r:
            median = f"{fmt(r['median_us'] / 1e6)} s" if r.get("unit") == "s" else f"{fmt(r['median_us'])} µs"
            thr = "" if r.get("throughput") is None else f"{fmt(r['throughput'])} {r.get('unit', '')}"
        else:
            continue
        ratio = "" if r.get("ratio") is None else f"{fmt(r['ratio'])} (vs {r.get('anchor')})"
        if ratio and r.get("ratio_spread"):
            ratio += " [{} to {}]".format(*map(fmt, r["ratio_spread"]))
        if ratio and r.get("cpu_ratio_spread"):
            ratio += "; CPU time {} [{} to {}]".format(*map(fmt, [r["cpu_ratio"], *r["cpu_ratio_spread"]]))
        cells = [r["case"], r.get("impl", ""), r.get("variant", "") or "", median, thr, ratio]
        if has_base:
            b = base.get((r["case"], r.get("impl"), r.get("variant")))
            if b and b.get("median_us") and r.get("median_us"):
                unit_s = r.get("unit") == "s"
                cells += [f"{fmt(b['median_us'] / 1e6)} s" if unit_s else f"{fmt(b['median_us'])} µs",
                          fmt(b["median_us"] / r["median_us"])]
            elif b and "value" in b:
                cells += [f"{fmt(b['value'])} {b.get('unit', '')}", ""]
            else:
                cells += ["", ""]
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    errors = [r for r in rows if "error" in r]
    for e in errors:
        last = [x for x in str(e["error"]).strip().splitlines() if x.strip()][-1:] or [""]
        out += ["", f"{e.get('tree', 'current')} run ended early ({e.get('case', 'rc ' + str(e.get('rc')))}): `{last[0][:200]}`"]
    return out + [""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="JSON-lines files")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = p.parse_args()
    rows = load(args.results)
    sources = [str(Path(s).resolve().relative_to(ROOT)) if Path(s).resolve().is_relative_to(ROOT) else s for s in args.results]
    lines = header_section(rows, sources)
    benches = sorted({r["bench"] for r in rows if "bench" in r}, key=lambda b: ORDER.index(b) if b in ORDER else 99)
    for bench in benches:
        lines += bench_section(bench, [r for r in rows if r.get("bench") == bench], _machine(rows))
    Path(args.out).write_text("\n".join(lines).rstrip() + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
