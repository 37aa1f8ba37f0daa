"""Run the benchmarks for the current tree and, with ``--baseline REV``, for a git revision, and
write their JSON lines to one results file.

The benchmark scripts are always the current tree's; what changes is the library they import.
The current tree runs with its root first on ``PYTHONPATH``; the baseline revision is checked out
with ``git worktree add`` into a temporary folder, which goes first on ``PYTHONPATH`` instead
(the PPO benchmark also loads that revision's example). Current and baseline alternate per
benchmark (the order flips from one benchmark to the next), each benchmark a fresh subprocess.
Every JSON line a benchmark prints is written with ``tree`` (``current`` / ``baseline``) and
``rev`` (the commit) added; a benchmark that fails or times out leaves an ``error`` row with the
end of its stderr, so a baseline that lacks an API shows why its rows are missing.

Run: python benchmarks/run_all.py [--quick] [--benches replay,eager] [--baseline 0197e6f]
     [--out benchmarks/results/NAME.jsonl] [--timeout 3600]
then: python benchmarks/report.py benchmarks/results/NAME.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BENCHES = ["replay", "prioritised", "trajectory", "episodes", "eager", "returns", "ppo", "compressed", "sb3", "codecs", "torch_interop",
           "checkpoint", "disk", "scale"]


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def run_one(bench: str, tree: str, rev: str, lib_root: Path, quick: bool, timeout: int, out) -> None:
    cmd = [sys.executable, str(HERE / f"bench_{bench}.py")] + (["--quick"] if quick else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(lib_root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    tag = {"tree": tree, "rev": rev}
    t0 = time.perf_counter()
    print(f"[{time.strftime('%H:%M:%S')}] {bench} ({tree} {rev[:10]})", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, cwd=lib_root, env=env, capture_output=True, text=True, timeout=timeout)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr, rc = f"timed out after {timeout} s", None
    for line in stdout.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.write(json.dumps({**rec, "bench": rec.get("bench", bench), **tag}) + "\n")
    if rc != 0:
        out.write(json.dumps({"bench": bench, "error": stderr[-1500:], "rc": rc, **tag}) + "\n")
    out.flush()
    print(f"    rc={rc} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--benches", default=",".join(BENCHES), help="comma-separated names (bench_<name>.py)")
    p.add_argument("--quick", action="store_true", help="pass --quick to every benchmark (smoke run)")
    p.add_argument("--baseline", default=None, help="a git revision to run as the baseline")
    p.add_argument("--out", default=None, help="results file (default benchmarks/results/<date>[-quick].jsonl)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per benchmark run")
    args = p.parse_args()
    out_path = Path(args.out or HERE / "results" / f"{time.strftime('%Y-%m-%d')}{'-quick' if args.quick else ''}.jsonl")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    current = git("rev-parse", "HEAD") + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    tmp = None
    if args.baseline:
        tmp = Path(tempfile.mkdtemp(prefix="jaxbuffers-baseline-"))
        git("worktree", "add", "--detach", str(tmp / "tree"), args.baseline)
        base_rev = git("rev-parse", "HEAD", cwd=tmp / "tree")
    try:
        with open(out_path, "a") as out:
            for i, bench in enumerate(args.benches.split(",")):
                runs = [("current", current, ROOT)]
                if tmp:
                    runs.append(("baseline", base_rev, tmp / "tree"))
                for tree, rev, lib in runs if i % 2 == 0 else runs[::-1]:
                    run_one(bench, tree, rev, lib, args.quick, args.timeout, out)
    finally:
        if tmp:
            git("worktree", "remove", "--force", str(tmp / "tree"))
    print(out_path)


if __name__ == "__main__":
    main()
