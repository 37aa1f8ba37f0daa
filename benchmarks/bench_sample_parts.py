"""Where the time of a compressed trajectory buffer's sample goes, on real Atari frames, in one process.

For each game: a `CompressedTrajectoryBuffer` (default codec, keyframe interval 8, frame_stack=4) of `--steps`
transitions (8 lanes, a `--real`-step ale-py rollout tiled, as `bench_compressed.py --million` builds it, at a tenth
to a fifth of its size), then:

* ``sample``: jitted ``sample_transitions(256, n_step=3)`` (SB3's fields), median seconds and transitions/s;
* ``host_read``: the host callback of the same samples replayed on their recorded slot ids (no JAX): median wall and
  process CPU, and ``critical_cpu_us``: the CPU time on the path a free core per thread would leave (the calling
  thread's time outside the store's thread pool, plus the busiest thread of each pool call), which moves less with the
  machine's load than the wall time;
* ``decode/<codec>``: CPU spent inside each codec's ``decode_many`` per sample (all threads);
* ``frames``: per sample, the distinct frames asked for and the frames their delta chains add.

Every number is a median over ``--repeats`` samples. On a busy machine the wall times swing with the load; the CPU
times (``cpu_us``, ``critical_cpu_us``, ``decode/*``) are what to compare between two versions of the code.

Usage: ``python benchmarks/bench_sample_parts.py [--games pong,spaceinvaders] [--steps 200000] [--quick]``
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _atari  # noqa: E402
from _common import emit, header, parser, row  # noqa: E402

BENCH = "sample_parts"


def _recorded(buf, n: int, fields) -> list:
    """The host reads of `n` jitted samples: (version, slot ids) of each `read_into` call, and outputs for them (one
    set for all, as XLA reuses its buffers)."""
    import jax

    host, got, out = buf.host, [], []
    real = host.read_into

    def record(version, ids, outs):
        got.append((np.array(version), [np.array(x) for x in ids]))
        out[:] = [[np.empty_like(o) for o in leaf] for leaf in outs]
        return real(version, ids, outs)

    host.read_into = record
    try:
        for i in range(n):
            jax.block_until_ready(fields(buf, jax.random.key(10_000 + i)))
    finally:
        del host.read_into
    return got, out


def _instrumented(repeats: int, read) -> dict:
    """Medians of `read()` (one host read): wall, process CPU, critical-path CPU (module doc), CPU per codec."""
    import host_codecs.store as hs
    from host_codecs.registry import CODECS, get_codec

    lock, now = threading.Lock(), {"pool": 0.0, "busiest": 0.0, "codecs": {}}
    pool = hs.parallel_for

    def timed_pool(count, body, *args, **kwargs):
        per_thread: dict = {}

        def shard(lo, hi):
            t0 = time.thread_time()
            body(lo, hi)
            with lock:
                per_thread[threading.get_ident()] = per_thread.get(threading.get_ident(), 0.0) + time.thread_time() - t0

        t0 = time.thread_time()
        out = pool(count, shard, *args, **kwargs)
        now["pool"] += time.thread_time() - t0
        now["busiest"] += max(per_thread.values(), default=0.0)
        return out

    codecs = {c.name: get_codec(c.name) for c in CODECS.values()}
    originals = {name: c.decode_many for name, c in codecs.items()}

    def timed_decode(name):
        def decode_many(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return originals[name](*args, **kwargs)
            finally:
                with lock:
                    now["codecs"][name] = now["codecs"].get(name, 0.0) + time.thread_time() - t0
        return decode_many

    hs.parallel_for = timed_pool
    for name, c in codecs.items():
        c.decode_many = timed_decode(name)
    samples: dict = {"wall": [], "cpu": [], "critical": []}
    try:
        for i in range(repeats + 5):
            now.update(pool=0.0, busiest=0.0, codecs={})
            c0, w0, t0 = time.process_time(), time.perf_counter(), time.thread_time()
            read(i)
            wall, cpu, caller = time.perf_counter() - w0, time.process_time() - c0, time.thread_time() - t0
            if i >= 5:
                samples["wall"].append(wall)
                samples["cpu"].append(cpu)
                samples["critical"].append(caller - now["pool"] + now["busiest"])
                for name, s in now["codecs"].items():
                    samples.setdefault(f"decode/{name}", []).append(s)
    finally:
        hs.parallel_for = pool
        for name, c in codecs.items():
            del c.decode_many
    return {k: statistics.median(v) for k, v in samples.items()}


def run_game(game: str, steps: int, real: int, repeats: int) -> None:
    import jax

    import bench_compressed

    make, add, chunk = bench_compressed._tiled(game, real, "zstd:-1")
    e, t = 8, 250
    buf = make(steps // e, 8)
    for i in range(-(-steps // (e * t))):
        buf = add(buf, *chunk(i))
        if i % bench_compressed.QUEUED_ADDS == 0:
            jax.block_until_ready(buf)
    buf = jax.block_until_ready(buf)
    fields = jax.jit(lambda b, k: (lambda s: (s.obs, s.action, s.next_obs, s.n_step_return, s.discount))(
        b.sample_transitions(k, 256, n_step=3, gamma=0.99)))
    got, outs = _recorded(buf, 40, fields)
    keys = iter(jax.random.split(jax.random.key(0), repeats + 10))
    for _ in range(5):
        jax.block_until_ready(fields(buf, next(keys)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fields(buf, next(keys)))
        times.append(time.perf_counter() - t0)
    sample_s = statistics.median(times)
    common = {"game": game, "transitions": int(buf.size()), "real_steps": real, "keyframe_interval": 8}
    row(BENCH, f"{game}/sample", "ours", sample_s, n=1, repeats=repeats, items=256, unit="transitions/s", **common)

    def read(i):
        buf.host.read_into(*got[i % len(got)], outs)

    read(0)
    m = _instrumented(repeats, read)
    row(BENCH, f"{game}/host_read", "ours", m["wall"], n=1, repeats=repeats, items=256, unit="transitions/s",
        cpu_us=round(m["cpu"] * 1e6, 1), critical_cpu_us=round(m["critical"] * 1e6, 1), **common)
    for key, s in m.items():
        if key.startswith("decode/"):
            row(BENCH, f"{game}/{key}", "ours", s, n=1, repeats=repeats, unit="s", **common)
    store = buf.host.stores[0]
    asked = [np.unique(np.concatenate([x.reshape(-1) for x in ids])).size for _, ids in got]
    extra = [store.chain_slots(np.concatenate([x.reshape(-1) for x in ids])).size for _, ids in got]
    emit({"bench": BENCH, "case": f"{game}/frames", "impl": "ours", "frames_asked": statistics.median(asked),
          "chain_frames": statistics.median(extra), **common})
    buf.close()


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--games", default="pong,spaceinvaders", help=f"comma-separated, of {sorted(_atari.GAMES)}")
    p.add_argument("--steps", type=int, default=200_000, help="transitions in each buffer")
    p.add_argument("--real", type=int, default=20_000, help="real ale-py steps per game, tiled")
    args = p.parse_args()
    steps = 20_000 if args.quick else args.steps
    repeats = args.repeats or (10 if args.quick else 200)
    header(BENCH, args.quick, steps=steps, real_steps=args.real)
    for game in args.games.split(","):
        run_game(game, steps, args.real, repeats)


if __name__ == "__main__":
    main()
