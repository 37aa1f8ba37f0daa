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
# How to read each table, in a few sentences; what a benchmark times and how is its module docstring.
NOTES = {
    "replay": "Anchor: flashbax's item buffer; `flashbax-flat` is its flat buffer. `call`: one jitted, donated call "
              "per operation from Python; `scan`: the operations inside one jitted `lax.scan`, as in a training "
              "step. Items/s; target: `scan` rows >= 1.0, `call` rows >= 0.8. `metrics/...` rows: the buffer with "
              "its scalar counters (`counters`) and with per-slot counts too (`per-slot`, the default) against none "
              "(`off`); `add+sample+record` is a training step on a quarter-full buffer, `full/` on a full one; its "
              "`control` has no metrics but carries out the sum of each sample's indices, which moves the step's "
              "time by changing its compiled schedule as much as any other cheap output (benchmark docstring).",
    "prioritised": "Anchor: flashbax's prioritised item buffer with the sum-tree update it uses on CPU; "
                   "`flashbax-bincount` is the update it uses on GPU/TPU, run on the same CPU. `call` / `scan` as "
                   "for uniform replay; `sample+set_priorities/.../scan` is the pair a prioritised training step "
                   "runs. Items/s (updates/s for `set_priorities`); target: `scan` rows >= 1.0, `call` rows >= 0.8.",
    "trajectory": "Anchor: flashbax's trajectory buffers, prioritised ones for `prioritised/...` (8 envs). `call` / "
                  "`scan` as for uniform replay; `chunk16` adds 16 steps per env per call. Adds in env steps/s, "
                  "samples in sequences (of `seq` steps) per second. Ours also stores episode flags and a "
                  "final-observation ring and never samples across the write head. Target: `scan` rows >= 1.0, "
                  "`call` rows >= 0.8.",
    "episodes": "1,000 episodes of 50 to 200 steps, one batch per operation (ours: one jitted call). Each `ours` "
                "row's ratio names its anchor: memmap-replay-buffer's `dataloader` or TorchRL (padded episodes in a "
                "`LazyTensorStorage`, `SliceSampler` windows). memmap-replay-buffer draws without replacement, ours "
                "and TorchRL with; TorchRL's 3-step windows never reach an episode's end, so it does slightly less "
                "work.",
    "eager": "`ours-eager` calls the buffer method from Python; `ours-jit` wraps the same call in `jax.jit`. Ratio = "
             "jitted time / eager time: 1.0 means the eager call costs what the jitted one does; target >= 0.8. The "
             "baseline rows ran under heavy load: their `vs baseline` is not a speed-up to quote.",
    "ppo": "Anchor: `plain-ppo`, a PureJaxRL-style PPO with its own loop and metrics; `shared-driver` is the same "
           "buffer-free PPO inside the example's driver. `wall_s_to_475`: seconds from the start, compile included, "
           "to a rolling 20-episode mean return of 475 (or `not reached`); `train_s_to_475` is its part after "
           "compiling; `compile_cpu_s`: CPU seconds of compiling, steadier under load. Ratio > 1: faster than plain "
           "PPO; target for ours: ratio >= 0.83 (time ratio <= 1.2).",
    "returns": "Anchor: rlax's GAE vmapped over envs; ours with the reverse scan (`scan`) and the associative scan "
               "(`associative`). Throughput in steps/s (T x N per call).",
    "compressed": "Recorded Atari transitions. The per-codec rows (`bytes_per_transition` of anonymous RSS growth, "
                  "`accounted_...` by the buffer's own count, `add...`, `sample...`) run one buffer per subprocess "
                  "and have no ratio; `same-process/...` compare ours with sb3-extra-buffers' fastest codec in one "
                  "process; `checksum/...`: with and without the entry checksums (`checksums-only`: their share of "
                  "the op). `million/...`: 1M transitions, SB3 and sb3x extrapolated from 10,000; `keyframes/...` "
                  "and `million/add_chunk` set keyframe intervals side by side. Some runs were loaded or on another "
                  "CPU: compare ratios within a game.",
    "temporal": "Bytes per frame (smaller is better) over 3,000 frames per game: each frame XORed (`xor`) or "
                "subtracted (`sub`) from its lane's previous frame, a keyframe every K frames (K=1: every frame "
                "whole), zstd at the case's level, a dictionary for the frames the variant names. The compressed "
                "buffers use `xor`, K=8 and the dictionary for keyframes (their deltas are run-length coded). Coding "
                "speeds (`encode_mbs`, `decode_mbs`) are in the JSON lines.",
    "sb3": "Recorded Breakout frames through SB3's buffers and ours. `train/dqn`: env steps/s, ratio ours / SB3; "
           "`memory/...` (RSS extrapolated to 1M), `buffer_calls/...`, `rollout/...`: SB3 / ours; `compressed...` "
           "call rows (`ours:<codec>` against sb3-extra-buffers 0.5's `extra:<codec>`): its fastest time / ours; all "
           "> 1 favour ours. `held_bytes_...`, `bytes_per_...`: ours / sb3-extra-buffers' smallest (< 1: smaller). "
           "RSS rows are noisy, even negative, when the machine swaps. Groups ran apart, some on another CPU, "
           "`compressed_dict/...` under heavy load: compare ratios, not times.",
    "codecs": "Codec rows (`<game>/<frame>/<mode>/<op>`, `variant` the codec): MB/s of raw bytes, ratio = throughput "
              "/ numpy memcpy bandwidth in the same process; `item`: one entry per call, `batch256`: 256 per call on "
              "all threads (`_1thread`: one). `checksum/...`: a store's put and get of 256 frames with CRC-32 "
              "(`ours`), with older stores' XXH3 sums (`xxh3`), without (`no-checksum`, the anchor) and one call per "
              "entry (`per-entry`); `checksums-only` / `xxh3-only`: their share of the op. `checksum_loop/...`, "
              "`checksum_function/...`: candidate checksums against `xxh3_64`.",
    "torch_interop": "Anchor: the numpy route (`torch.from_numpy(np.asarray(x))` and back). Throughput in MB/s; "
                     "`_copy` cases copy on both sides; `numpy_backed`: a tensor made by `torch.from_numpy`, which "
                     "JAX copies.",
    "checkpoint": "`uncompressed`: a `ReplayBuffer` of Atari items; `compressed`: a `CompressedTrajectoryBuffer` of "
                  "Breakout steps. GB/s of array bytes; ratio = anchor time / ours. Save anchor `np.save+fsync`, the "
                  "durability ours gives (`np.save` alone leaves the files in the page cache); restore anchor "
                  "`np.load` + `device_put`; flashbax's Vault (gzip-5, zstd-1) in the uncompressed case only. "
                  "`save_vs_np.save`: our save rate over `np.save`'s (target >= 0.7). `save_blocking`: how long a "
                  "non-blocking save holds the caller. Disk writeback swings between runs: compare rows of one run.",
    "disk": "Disk-backed buffers, their folders evicted from the page cache, sampled eagerly. `build...`: GB/s "
            "written; samples in transitions/s (256 3-step transitions per call) or episodes/s (4 whole episodes); "
            "`rss_growth`: resident memory growth over the timed samples. Ratio = anchor time / ours: `numpy-memmap` "
            "(random stacks from a memmapped `.npy`, no checksum or frame bookkeeping), `numpy-memmap-stacks` for "
            "episodes, `none` for the codec rows (`zstd-memory`: zstd in memory). The codec rows ran under heavy "
            "load: `zstd` and `zstd-memory` swapped order between runs.",
    "scale": "`variant`: the devices of the mesh; ratio = the 1-device time / this row's (> 1: faster than one "
             "device). On a CPU the devices are forced host devices sharing its cores: the rows show the sharded "
             "program's overhead, not a speed-up. `global` samples the whole buffer, `local` 256 / S per shard. "
             "`actors-to-learner`: inserted transitions/s of 4 actor threads beside a sampling learner, with "
             "(`spi=1`) or without a rate limiter.",
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
            "`median` is the median over `repeats` timed repetitions of one operation's time; `throughput` follows "
            "from it, or holds the row's value where nothing is timed. Implementations of a case are timed "
            "interleaved in one process. `ratio` = the anchor's time / this row's (> 1: faster than the anchor), "
            "given only when both ran in the same process; a table's note says where it means something else. In "
            "brackets: the quartiles of the ratio taken per round, then the same of the process CPU time, which "
            "leaves out the waits for a core. `baseline`: the same row's median at a baseline revision; `vs "
            "baseline` = its time / the current time (> 1: the current tree is faster; on other libraries' rows, "
            "noise). Other jobs may load the machine: a few percent is noise, and where a table gathers several "
            "runs, compare its ratios rather than its medians.", ""]
    return out


def bench_section(bench, rows, page_machine: dict | None = None, run_machines: list | None = None) -> list[str]:
    cur = [r for r in rows if r.get("tree", "current") == "current" and "case" in r and not r.get("header")]
    base = {(r["case"], r.get("impl"), r.get("variant")): r for r in rows
            if r.get("tree") == "baseline" and "case" in r and not r.get("header")}
    own = _machine(rows) or {}
    runs = list(dict.fromkeys(r.get("rev", "")[:8] for r in cur))
    if len(runs) > 1:
        known = {r["rev"][:8]: r["machine"].get("cpu") for r in (run_machines or []) if r["rev"][:8] in runs}
        where = (f" Rows come from {len(runs)} runs, named by the commit they measured (column `run`); compare ratios "
                 "within a run. CPU of a run where its header line was kept: "
                 + ("; ".join(f"`{rev}` {cpu}" for rev, cpu in known.items()) or "none") + ".")
    elif page_machine and own and own.get("cpu") != page_machine.get("cpu"):
        where = f" Measured on {own.get('cpu')} ({own.get('cores')} cores), not the machine of the table at the top."
    else:
        where = ""
    out = [f"## {TITLES.get(bench, bench)}", "", f"`benchmarks/bench_{bench}.py`. {NOTES.get(bench, '')}{where}", ""]
    has_base = any(k for k in base)
    cols = ["case", "impl", "variant", "median", "throughput", "ratio"] + (["baseline", "vs baseline"] if has_base else [])
    cols += ["run"] if len(runs) > 1 else []
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
        cells += [f"`{r.get('rev', '')[:8]}`"] if len(runs) > 1 else []
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
        lines += bench_section(bench, [r for r in rows if r.get("bench") == bench], _machine(rows),
                               [r for r in rows if r.get("header") and r.get("tree", "current") == "current"])
    Path(args.out).write_text("\n".join(lines).rstrip() + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
