"""Trajectory buffers: jaxbuffers.TrajectoryBuffer / PrioritisedTrajectoryBuffer vs flashbax's
trajectory and prioritised trajectory buffers, same process, same sizes, donation on both sides.

Cases (every call jitted, buffer donated):
  * add one step per env: one jitted call per step from Python ("call") and K steps inside one
    jitted ``lax.scan`` ("scan"); add a chunk of 16 steps per env inside a scan ("chunk16").
    Throughput in env-steps/s (num_envs steps per add).
  * sample batch 256 of sequences of length 2 and 32 (period 1); sequences/s.
  * prioritised: add (scan, one step), sample (batch 256, length 2 and 32; ours computes
    importance weights, flashbax returns probabilities only), set_priorities (256 updates).
  * ours only: n-step transitions (batch 256, n = 3), within-episode sequences, and sequences of
    32 with their final observations (``final_obs_at``, the ring read for truncated steps).

Work is not identical: jaxbuffers also stores the episode flags separately, keeps the
final-observation ring (written on truncated steps; the add cases pass ``truncated`` and a
``final_obs`` every step, so the ring scatter is always compiled in), masks sequences at episode ends, and never samples across the write head; flashbax samples
across episode ends. For fairness flashbax's step also carries ``terminated``/``truncated`` fields.
Steps: vector (obs f32[17], action f32[6], reward f32; 8 envs x 12,500 steps) and Atari (pixels
u8[84,84,4] as obs, action i32, reward f32; 8 envs x 1,250 steps). Buffers are filled completely
(wrapped) before sampling. One JSON line per case; ratio = flashbax time / ours (> 1: ours faster).
After the prioritised vector cases of window 2, ``check`` lines (``_common.priority_checks``): the
sum tree's root against the float64 sum of its leaves and draws of zero-priority positions, after
4,000 sample+set_priorities of 256 and 4,000 more with priorities 1e-4.

Run: python benchmarks/bench_trajectory.py [--quick] [--repeats N] [--steps vector,atari] [--part uniform|prioritised]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, flashbax_device, interleaved, machine_info, parser, priority_checks, versions  # noqa: E402

import flashbax as fbx  # noqa: E402

from jaxbuffers.trajectory import PrioritisedTrajectoryBuffer, TrajectoryBuffer  # noqa: E402

NUM_ENVS = 8
STEPS = {
    # name: (step, steps per lane, final-obs ring slots per lane = ceil(length / time limit) + 1)
    "vector": ({"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0)}, 12_500, 64),
    "atari": ({"obs": jnp.zeros((84, 84, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}, 1_250, 16),
}
SAMPLE = 256
SEQ_LENS = (2, 32)
CHUNK = 16
ALPHA, BETA = 0.6, 0.4


def env_step(step, t=None, fill=1):
    """Our step (leaves [E, ...] or [E, t, ...]) and flags; flashbax's step adds the flags as fields."""
    lead = (NUM_ENVS,) if t is None else (NUM_ENVS, t)
    ours = jax.tree.map(lambda x: jnp.full((*lead, *x.shape), fill, x.dtype), step)
    flags = jnp.zeros(lead, bool)
    fbx_lead = (NUM_ENVS, 1 if t is None else t)
    theirs = jax.tree.map(lambda x: jnp.full((*fbx_lead, *x.shape), fill, x.dtype), step)
    theirs = {**theirs, "terminated": jnp.zeros(fbx_lead, bool), "truncated": jnp.zeros(fbx_lead, bool)}
    return (ours, flags), theirs


class Ours:
    name = "jaxbuffers"

    def __init__(self, step, length, prioritised=False, seq_len=2, ring=None):
        if prioritised:
            self.state = PrioritisedTrajectoryBuffer.create(
                step, NUM_ENVS, length, window_length=seq_len, priority_exponent=ALPHA, final_obs_capacity=ring
            )
        else:
            self.state = TrajectoryBuffer.create(step, NUM_ENVS, length, final_obs_capacity=ring)
        self.prioritised = prioritised
        self.add = jax.jit(self.add_fn(), donate_argnums=0)
        if prioritised:
            self._sample = jax.jit(lambda s, k: s.sample_sequences(k, SAMPLE, beta=BETA))
        else:
            self._sample = jax.jit(lambda s, k, n: s.sample_sequences(k, SAMPLE, n), static_argnums=2)
        self._set = jax.jit(lambda s, i, g, p: s.set_priorities(i, p, g), donate_argnums=0)

    @staticmethod
    def add_fn():
        def add(s, batch):
            (step, flags) = batch
            return s.add(step, terminated=flags, truncated=flags, final_obs=step["obs"])
        return add

    def pick(self, batch):
        return batch[0]

    def sample(self, state, key, n):
        return self._sample(state, key) if self.prioritised else self._sample(state, key, n)

    @staticmethod
    def handles(out):
        return out._replace(item=None, probabilities=None, importance_weights=None)

    def set_priorities(self, state, out, p):
        return self._set(state, out.indices, out.generations, p)

    def sample_fn(self, state, key, n):
        return state.sample_sequences(key, SAMPLE, beta=BETA)

    @staticmethod
    def rewards(out):
        return out.item.item["reward"]

    def set_fn(self, state, out, p):
        return state.set_priorities(out.indices, p, out.generations)


class Flashbax:
    def __init__(self, step, length, prioritised=False, seq_len=2):
        kw = dict(add_batch_size=NUM_ENVS, sample_batch_size=SAMPLE, sample_sequence_length=seq_len, period=1,
                  min_length_time_axis=seq_len, max_length_time_axis=length)
        if prioritised:
            self.name = "flashbax_prioritised_trajectory"
            self.buf = fbx.make_prioritised_trajectory_buffer(**kw, priority_exponent=ALPHA, device=flashbax_device())
        else:
            self.name = "flashbax_trajectory"
            self.buf = fbx.make_trajectory_buffer(**kw)
        self.prioritised = prioritised
        self.state = self.buf.init({**step, "terminated": jnp.bool_(False), "truncated": jnp.bool_(False)})
        self.add = jax.jit(self.buf.add, donate_argnums=0)
        self._sample = jax.jit(self.buf.sample)
        if prioritised:
            self._set = jax.jit(lambda s, i, p: self.buf.set_priorities(s, i, p), donate_argnums=0)

    def add_fn(self):
        return self.buf.add

    def pick(self, batch):
        return batch[1]

    def sample(self, state, key, n):
        return self._sample(state, key)

    @staticmethod
    def handles(out):
        return out.replace(experience=None) if hasattr(out, "replace") else out._replace(experience=None)

    def set_priorities(self, state, out, p):
        return self._set(state, out.indices, p)

    def sample_fn(self, state, key, n):
        return self.buf.sample(state, key)

    @staticmethod
    def rewards(out):
        return out.experience["reward"]

    def set_fn(self, state, out, p):
        return self.buf.set_priorities(state, out.indices, p)


def add_call_runner(impl, batch, calls):
    def run():
        s = impl.state
        for _ in range(calls):
            s = impl.add(s, batch)
        impl.state = jax.block_until_ready(s)
    return run


def add_scan_runner(impl, batch, steps):
    add = impl.add_fn()
    f = jax.jit(lambda s, b: jax.lax.scan(lambda c, _: (add(c, b), None), s, None, length=steps)[0], donate_argnums=0)

    def run():
        impl.state = jax.block_until_ready(f(impl.state, batch))
    return run


def fill(impl, batch_chunk, length):
    """Fill every lane past its length (wrapped) with chunk adds inside one scan."""
    add_scan_runner(impl, batch_chunk, length // CHUNK + 2)()


def sample_runner(impl, n, calls):
    keys = list(jax.random.split(jax.random.key(0), calls))

    def run():
        out = None
        for k in keys:
            out = impl.sample(impl.state, k, n)
        jax.block_until_ready(out)
    return run


def set_priorities_runner(impl, n, calls):
    # Keep only what set_priorities needs: whole samples (Atari, seq 32: 230 MB each) for every call
    # exhausted memory in an earlier version of this benchmark.
    outs = [impl.handles(impl.sample(impl.state, k, n)) for k in jax.random.split(jax.random.key(1), calls)]
    pris = [jax.random.uniform(k, (SAMPLE,), minval=0.1, maxval=3.0) for k in jax.random.split(jax.random.key(2), calls)]

    def run():
        s = impl.state
        for o, p in zip(outs, pris):
            s = impl.set_priorities(s, o, p)
        impl.state = jax.block_until_ready(s)
    return run


def sample_update_scan_runner(impl, n, steps):
    """``steps`` x (sample 256, set their priorities) inside one jitted scan: the in-training cost."""
    def body(s, k):
        out = impl.sample_fn(s, k, n)
        # priorities depend on the sampled rewards, so the sample's gather is not dead code
        p = jax.random.uniform(k, (SAMPLE,), minval=0.1, maxval=3.0) + 1e-6 * jnp.abs(impl.rewards(out).sum())
        return impl.set_fn(s, out, p), None

    f = jax.jit(lambda s, keys: jax.lax.scan(body, s, keys)[0], donate_argnums=0)
    keys = jax.random.split(jax.random.key(4), steps)

    def run():
        impl.state = jax.block_until_ready(f(impl.state, keys))
    return run


def report(case, unit, per_op, times, ours="jaxbuffers"):
    for other in [n for n in times if n != ours]:
        emit({
            "case": case, "anchor": other,
            f"ours_{unit}_per_s": per_op / times[ours], f"anchor_{unit}_per_s": per_op / times[other],
            "ratio": times[other] / times[ours],
        })


def uniform(name, step, length, ring, one, chunk, calls, scan_steps, nsamp, repeats):
    # ---------------- uniform: add
    impls = [Ours(step, length, ring=ring), Flashbax(step, length)]
    for mode in ("call", "scan", f"chunk{CHUNK}"):
        if mode == "call":
            runs = {i.name: add_call_runner(i, i.pick(one), calls) for i in impls}
            times = interleaved(runs, repeats, calls)
        elif mode == "scan":
            runs = {i.name: add_scan_runner(i, i.pick(one), scan_steps) for i in impls}
            times = interleaved(runs, repeats, scan_steps)
        else:
            k = max(10, scan_steps // 4)
            runs = {i.name: add_scan_runner(i, i.pick(chunk), k) for i in impls}
            times = interleaved(runs, repeats, k * CHUNK)
        report(f"add/{name}/{mode}", "env_steps", NUM_ENVS, times)

    # ---------------- uniform: sample
    for impl in impls:
        fill(impl, impl.pick(chunk), length)
    for n in SEQ_LENS:
        fb = Flashbax(step, length, seq_len=n)  # flashbax fixes the sequence length at construction
        fb.state = impls[1].state
        times = interleaved({i.name: sample_runner(i, n, nsamp) for i in (impls[0], fb)}, repeats, nsamp)
        report(f"sample/{name}/batch={SAMPLE}/seq={n}", "sequences", SAMPLE, times)
    ours = impls[0]
    fns = {
        "transitions_n3": jax.jit(lambda s, k: s.sample_transitions(k, SAMPLE, n_step=3, gamma=0.99)),
        "seq32_within_episode": jax.jit(lambda s, k: s.sample_sequences(k, SAMPLE, 32, cross_episodes=False)),
        "seq32_with_final_obs": jax.jit(lambda s, k: (q := s.sample_sequences(k, SAMPLE, 32), s.final_obs_at(q.indices, 32))),
    }
    for label, fn in fns.items():
        keys = list(jax.random.split(jax.random.key(3), nsamp))

        def run(fn=fn, keys=keys):
            out = None
            for k in keys:
                out = fn(ours.state, k)
            jax.block_until_ready(out)

        t = interleaved({"ours": run}, repeats, nsamp)["ours"]
        emit({"case": f"sample/{name}/batch={SAMPLE}/{label}", "anchor": None, "ours_samples_per_s": SAMPLE / t})
    del impls, fb


def prioritised(name, step, length, ring, one, chunk, scan_steps, nsamp, repeats, checks):
    for n in SEQ_LENS:
        impls = [Ours(step, length, prioritised=True, seq_len=n, ring=ring), Flashbax(step, length, prioritised=True, seq_len=n)]
        runs = {i.name: add_scan_runner(i, i.pick(one), scan_steps) for i in impls}
        report(f"prioritised/add/{name}/scan/seq={n}", "env_steps", NUM_ENVS, interleaved(runs, repeats, scan_steps))
        for impl in impls:
            fill(impl, impl.pick(chunk), length)
        times = interleaved({i.name: sample_runner(i, n, nsamp) for i in impls}, repeats, nsamp)
        report(f"prioritised/sample/{name}/batch={SAMPLE}/seq={n}", "sequences", SAMPLE, times)
        times = interleaved({i.name: set_priorities_runner(i, n, nsamp) for i in impls}, repeats, nsamp)
        report(f"prioritised/set_priorities/{name}/call/batch={SAMPLE}/seq={n}", "updates", SAMPLE, times)
        times = interleaved({i.name: sample_update_scan_runner(i, n, nsamp) for i in impls}, repeats, nsamp)
        report(f"prioritised/sample+set_priorities/{name}/scan/batch={SAMPLE}/seq={n}", "sequences", SAMPLE, times)
        if name == "vector" and n == SEQ_LENS[0]:  # the tree code is the same for every step and window
            priority_checks(f"prioritised/{name}/seq={n}", impls, lambda i, n=n: (lambda s, k: i.sample_fn(s, k, n), i.set_fn), checks)
        del impls


def main():
    p = parser(__doc__)
    p.add_argument("--steps", default="vector,atari", help="comma-separated step kinds to run (vector, atari)")
    p.add_argument("--part", choices=("all", "uniform", "prioritised"), default="all", help="which buffers to time")
    args = p.parse_args()
    # The default run takes about 5 minutes on a 2-core CPU (compiles included), --quick about 2.5.
    repeats = args.repeats or (3 if args.quick else 9)
    q = 10 if args.quick else 1
    start = time.perf_counter()
    emit({"bench": "trajectory", "machine": machine_info(), "versions": versions("jax", "jaxlib", "flashbax", "jaxbuffers")})
    for name, (step, length, ring) in STEPS.items():
        if name not in args.steps.split(","):
            continue
        one, chunk = env_step(step), env_step(step, CHUNK)
        calls = max(5, (50 if name == "atari" else 200) // q)
        scan_steps = max(10, min(length, 500) // q)
        nsamp = max(5, 50 // q)

        if args.part != "prioritised":
            uniform(name, step, length, ring, one, chunk, calls, scan_steps, nsamp, repeats)
        if args.part != "uniform":
            prioritised(name, step, length, ring, one, chunk, scan_steps, nsamp, repeats, 200 if args.quick else 4000)
    emit({"bench": "trajectory", "done": True, "elapsed_s": round(time.perf_counter() - start, 1)})


if __name__ == "__main__":
    main()
