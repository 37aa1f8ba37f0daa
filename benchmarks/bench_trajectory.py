"""Trajectory buffers: `jaxbuffers.TrajectoryBuffer` / `jaxbuffers.PrioritisedTrajectoryBuffer`
against flashbax's trajectory and prioritised trajectory buffers.

Steps: vector (obs f32[17], action f32[6], reward f32; 8 envs x 12,500 steps) and Atari (obs
u8[84,84,4], action i32, reward f32; 8 envs x 1,250 steps). Cases:

* ``add/<step>/call`` and ``.../scan``: one step of every env per add, one jitted donated call
  per add from Python, or ``n`` adds inside one jitted donated ``lax.scan``; ``.../chunk16``: 16
  steps per env per add, in a scan. Throughput in env steps/s.
* ``sample/<step>/batch=256/seq=<L>/call`` and ``.../scan``: sequences of 2 and 32 steps
  (period 1) from full (wrapped) buffers; the scan sums every sampled leaf.
* ``prioritised/...``: the same add and sample rows for the prioritised buffers (window = L),
  ``set_priorities`` per call and ``sample+set_priorities`` in a scan (the pair a prioritised
  training step runs). Priority exponent 0.6, beta 0.4.
* ours only: ``sample/<step>/batch=256/transitions_n3`` (n-step transitions, n = 3).

The work is not identical: jaxbuffers also stores the episode flags, keeps a final-observation
ring (the add rows pass ``truncated`` and ``final_obs`` every step, so the ring write is compiled
in), and never samples across the write head; flashbax samples across episode ends. flashbax's
step carries ``terminated`` / ``truncated`` fields so both store the same bytes. All
implementations of a case run in one process, interleaved; the anchor is flashbax.
``--quick`` shrinks lengths and repetition counts for a smoke run (and skips Atari sequences of
32).

``--cases`` runs only the cases whose names start with one of its comma-separated prefixes
(``--cases add/,prioritised/add/``: the add rows).

Run: python benchmarks/bench_trajectory.py [--quick] [--repeats N] [--steps vector,atari] [--cases PREFIXES]
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_runner, checksum, compare, header, interleaved, parser, sample_runner  # noqa: E402

import flashbax as fbx  # noqa: E402

import jaxbuffers as jb  # noqa: E402

BENCH = "trajectory"
NUM_ENVS = 8
STEPS = {  # name: (step, steps per lane)
    "vector": ({"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0)}, 12_500),
    "atari": ({"obs": jnp.zeros((84, 84, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}, 1_250),
}
SAMPLE = 256
SEQ_LENS = (2, 32)
CHUNK = 16
ALPHA, BETA = 0.6, 0.4


class Ours:
    """The only place this benchmark touches the jaxbuffers API."""

    name = "ours"

    def __init__(self, step, length, seq_len, prioritised):
        ring = max(2, length // 200 + 1)  # final-observation slots per lane (time limit 200)
        if prioritised:
            self.state = jb.PrioritisedTrajectoryBuffer.create(step, num_envs=NUM_ENVS, length=length, window_length=seq_len,
                                                               priority_exponent=ALPHA, final_obs_capacity=ring)
        else:
            self.state = jb.TrajectoryBuffer.create(step, num_envs=NUM_ENVS, length=length, final_obs_capacity=ring)
        self.prioritised, self.seq_len = prioritised, seq_len

    @staticmethod
    def batch(step, t=None):
        lead = (NUM_ENVS,) if t is None else (NUM_ENVS, t)
        return jax.tree.map(lambda x: jnp.ones((*lead, *x.shape), x.dtype), step), jnp.zeros(lead, bool)

    def add_fn(self):
        return lambda s, b: s.add(b[0], terminated=b[1], truncated=b[1], final_obs=b[0]["obs"])

    def sample_fn(self):
        if self.prioritised:
            return lambda s, k: s.sample_sequences(k, SAMPLE, beta=BETA)
        return lambda s, k: s.sample_sequences(k, SAMPLE, self.seq_len)

    def set_fn(self):
        return lambda s, out, p: s.set_priorities(out.indices, p, out.generations)

    def transitions_fn(self):
        return lambda s, k: s.sample_transitions(k, SAMPLE, n_step=3, gamma=0.99)


class Flashbax:
    name = "flashbax"

    def __init__(self, step, length, seq_len, prioritised):
        kw = dict(add_batch_size=NUM_ENVS, sample_batch_size=SAMPLE, sample_sequence_length=seq_len, period=1,
                  min_length_time_axis=seq_len, max_length_time_axis=length)
        if prioritised:
            device = "gpu" if jax.default_backend() == "gpu" else "cpu"
            self.buf = fbx.make_prioritised_trajectory_buffer(**kw, priority_exponent=ALPHA, device=device)
        else:
            self.buf = fbx.make_trajectory_buffer(**kw)
        self.state = self.buf.init({**step, "terminated": jnp.bool_(False), "truncated": jnp.bool_(False)})

    @staticmethod
    def batch(step, t=None):
        lead = (NUM_ENVS, 1 if t is None else t)
        out = jax.tree.map(lambda x: jnp.ones((*lead, *x.shape), x.dtype), step)
        return {**out, "terminated": jnp.zeros(lead, bool), "truncated": jnp.zeros(lead, bool)}

    def add_fn(self):
        return self.buf.add

    def sample_fn(self):
        return self.buf.sample

    def set_fn(self):
        return lambda s, out, p: self.buf.set_priorities(s, out.indices, p)


def set_call_runner(impl, n):
    """``n`` jitted set_priorities calls at the indices of earlier samples."""
    sample, update = jax.jit(impl.sample_fn()), jax.jit(impl.set_fn(), donate_argnums=0)
    outs = []
    for k in jax.random.split(jax.random.key(1), n):
        o = sample(impl.state, k)  # keep only the handles: whole Atari sequence samples are large
        outs.append(o._replace(item=None) if hasattr(o, "_replace") else o.replace(experience=None))
    pris = list(jax.random.uniform(jax.random.key(2), (n, SAMPLE), minval=0.1, maxval=3.0))

    def calls():
        s = impl.state
        for o, p in zip(outs, pris):
            s = update(s, o, p)
        impl.state = jax.block_until_ready(s)

    return calls


def sample_set_scan_runner(impl, n):
    """``n`` x (sample 256, set their priorities) inside one jitted scan."""
    sample, update = impl.sample_fn(), impl.set_fn()

    def body(s, k):
        out = sample(s, k)
        return update(s, out, jax.random.uniform(k, (SAMPLE,), minval=0.1, maxval=3.0) + 1e-6 * jnp.abs(checksum(out))), None

    f = jax.jit(lambda s, ks: jax.lax.scan(body, s, ks)[0], donate_argnums=0)
    keys = jax.random.split(jax.random.key(4), n)

    def run():
        impl.state = jax.block_until_ready(f(impl.state, keys))

    return run


def run_step(name, step, length, repeats, quick, prioritised, wanted=lambda case: True):
    pre = "prioritised/" if prioritised else ""
    n_add = max(4, min(length, 500) // (10 if quick else 1))
    n_sample = 5 if quick else 50
    seq_lens = SEQ_LENS[:1] if quick and name == "atari" else SEQ_LENS  # Atari sequences of 32 are large
    for seq_len in seq_lens if prioritised else (seq_lens[-1],):
        impls = [Ours(step, length, seq_len, prioritised), Flashbax(step, length, seq_len, prioritised)]
        suffix = f"/seq={seq_len}" if prioritised else ""
        for mode in ("call", "scan", f"chunk{CHUNK}"):
            if not wanted(f"{pre}add/{name}/{mode}{suffix}"):
                continue
            t = CHUNK if mode.startswith("chunk") else None
            m = "scan" if t else mode
            n = max(4, n_add // CHUNK) if t else n_add
            times = interleaved({i.name: add_runner(i, i.batch(step, t), m, n) for i in impls}, repeats, n)
            compare(BENCH, f"{pre}add/{name}/{mode}{suffix}", times, "flashbax", n=n, repeats=repeats,
                    items=NUM_ENVS * (t or 1), unit="env steps/s")
        if not any(wanted(f"{pre}{kind}/{name}") for kind in ("sample", "set_priorities", "sample+set_priorities")):
            continue
        for impl in impls:  # fill every lane past its length (wrapped)
            add_runner(impl, impl.batch(step, CHUNK), "scan", length // CHUNK + 2)()
        lens = (seq_len,) if prioritised else seq_lens
        for seq in lens:
            fbs = impls if prioritised else [impls[0], Flashbax(step, length, seq, False)]
            if not prioritised:
                fbs[1].state, impls[0].seq_len = impls[1].state, seq  # flashbax fixes the length at construction
            for mode in ("call", "scan"):
                times = interleaved({i.name: sample_runner(i, i.sample_fn(), mode, n_sample) for i in fbs}, repeats, n_sample)
                compare(BENCH, f"{pre}sample/{name}/batch={SAMPLE}/seq={seq}/{mode}", times, "flashbax", n=n_sample,
                        repeats=repeats, items=SAMPLE, unit="sequences/s")
        if prioritised:
            times = interleaved({i.name: set_call_runner(i, n_sample) for i in impls}, repeats, n_sample)
            compare(BENCH, f"{pre}set_priorities/{name}/batch={SAMPLE}{suffix}/call", times, "flashbax", n=n_sample,
                    repeats=repeats, items=SAMPLE, unit="updates/s")
            times = interleaved({i.name: sample_set_scan_runner(i, n_sample) for i in impls}, repeats, n_sample)
            compare(BENCH, f"{pre}sample+set_priorities/{name}/batch={SAMPLE}{suffix}/scan", times, "flashbax",
                    n=n_sample, repeats=repeats, items=SAMPLE, unit="sequences/s")
        else:
            ours = impls[0]
            for mode in ("call", "scan"):
                times = interleaved({"ours": sample_runner(ours, ours.transitions_fn(), mode, n_sample)}, repeats, n_sample)
                compare(BENCH, f"sample/{name}/batch={SAMPLE}/transitions_n3/{mode}", times, None, n=n_sample,
                        repeats=repeats, items=SAMPLE, unit="transitions/s")
        del impls


def main():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", default="vector,atari", help="comma-separated step kinds to run (vector, atari)")
    p.add_argument("--cases", default="", help="comma-separated case-name prefixes to run (default: every case)")
    args = p.parse_args()
    prefixes = tuple(c for c in args.cases.split(",") if c)
    wanted = lambda case: not prefixes or any(case.startswith(c) or c.startswith(case) for c in prefixes)  # noqa: E731 (a group too)
    repeats = args.repeats or (3 if args.quick else 9)
    header(BENCH, args.quick)
    for name, (step, length) in STEPS.items():
        if name in args.steps.split(","):
            length //= 20 if args.quick else 1
            for prioritised in (False, True):
                if any(wanted(f"{'prioritised/' if prioritised else ''}{kind}/{name}") for kind in ("add", "sample", "set_priorities", "sample+set_priorities")):
                    run_step(name, step, length, repeats, args.quick, prioritised, wanted)


if __name__ == "__main__":
    main()
