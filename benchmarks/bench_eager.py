"""Eager against jitted: every add and sample method of every buffer, called as a plain method
from Python against the same call wrapped in `jax.jit`.

A buffer method called eagerly should run as one cached compiled program, so its cost is the
jitted call's. Each case times ``n`` calls per repetition both ways, interleaved in one process;
the buffer state is threaded through the adds (no donation on either side, so both pay the same
copies). Row ``impl="ours-eager"`` has ``anchor="ours-jit"`` and ``ratio`` = jitted time / eager
time (1.0: the eager call is as fast as the jitted one; the target is >= 0.8).

Cases: ``ReplayBuffer.add`` (B = 8) / ``sample`` (256); ``PrioritisedReplayBuffer.add`` /
``sample`` (256, beta 0.4); ``TrajectoryBuffer.add`` (8 envs, one step) / ``sample_sequences``
(256 x 32) / ``sample_transitions`` (256, n_step 3); ``PrioritisedTrajectoryBuffer.add`` /
``sample_sequences`` (256, window 32); ``RolloutBuffer.add`` (4 envs; a rollout of 128 steps per
repetition from an empty buffer) / ``minibatches`` (4 of 128 steps x 4 envs, after ``compute_gae``);
``CompressedTrajectoryBuffer.add`` (8 envs of u8[84,84,4] frames) / ``sample_transitions``
(256, n_step 3); ``CompressedRolloutBuffer.add`` (8 envs of u8[84,84,4] frames; a rollout of 128 steps per
repetition, from the last one reset). Their frames are one random frame (values 0..3), the same every step; the
``.../breakout`` cases add the two compressed buffers' steps of recorded Breakout stacks instead (8 lanes of
``shared/data/atari_rollouts.npz``, a new step per call, 128 calls per repetition: one rollout; the trajectory
buffer holds 128 steps, so it overwrites its oldest as the rollout refills its rows). ``--quick`` lowers the
repetition counts; ``--only`` runs the cases whose names contain one of its comma-separated strings.

Profile of the compressed rollout add (why it cost a multiple of the trajectory add on a loaded machine, eager
and jitted alike): its host write took its slots from no device result, so XLA's CPU runtime ran the write on a
thread of its own beside the program's state updates and the calling thread waited for it; two thread wake-ups per
add, each a scheduler delay when the cores are busy. Its CPU time on the recorded steps was about the trajectory
add's (on the repeated random frame the trajectory add codes 7 in 8 frames as empty deltas); the write now reads
its slots from the updated state and runs on the calling thread.

Run: python benchmarks/bench_eager.py [--quick] [--repeats N] [--only NAMES]
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import batch_of, compare, data_file, header, interleaved, parser  # noqa: E402

import jaxbuffers as jb  # noqa: E402

BENCH = "eager"
VEC = {"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0)}
ENVS = 8


def cases():
    """(name, initial state (or a function making a fresh one per side), operation, threads
    state) per case. The operation is
    ``op(state, key) -> new state`` for adds, ``-> sample`` for samplers. The only place this
    benchmark touches the jaxbuffers API."""
    step = batch_of(VEC, ENVS)
    flags = jnp.zeros(ENVS, bool)

    def traj_add(s, k):
        return s.add(step, terminated=flags, truncated=flags, final_obs=step["obs"])

    def filled(state, add, n):
        for i in range(n):
            state = add(state, jax.random.key(i))
        return state

    out = []
    replay = jb.ReplayBuffer.create(VEC, 10_000)
    items = batch_of(VEC, 8)  # built once: inside `op` the eager side would pay its construction
    replay_add = lambda s, k: s.add(items)  # noqa: E731
    out += [("ReplayBuffer.add", replay, replay_add, True),
            ("ReplayBuffer.sample", filled(replay, replay_add, 100), lambda s, k: s.sample(k, 256), False)]
    pri = jb.PrioritisedReplayBuffer.create(VEC, 10_000, priority_exponent=0.6)
    out += [("PrioritisedReplayBuffer.add", pri, replay_add, True),
            ("PrioritisedReplayBuffer.sample", filled(pri, replay_add, 100), lambda s, k: s.sample(k, 256, beta=0.4), False)]
    traj = jb.TrajectoryBuffer.create(VEC, num_envs=ENVS, length=1_000, final_obs_capacity=8)
    full = filled(traj, traj_add, 200)
    out += [("TrajectoryBuffer.add", traj, traj_add, True),
            ("TrajectoryBuffer.sample_sequences", full, lambda s, k: s.sample_sequences(k, 256, 32), False),
            ("TrajectoryBuffer.sample_transitions", full, lambda s, k: s.sample_transitions(k, 256, n_step=3, gamma=0.99), False)]
    ptraj = jb.PrioritisedTrajectoryBuffer.create(VEC, num_envs=ENVS, length=1_000, window_length=32, final_obs_capacity=8)
    out += [("PrioritisedTrajectoryBuffer.add", ptraj, traj_add, True),
            ("PrioritisedTrajectoryBuffer.sample_sequences", filled(ptraj, traj_add, 200),
             lambda s, k: s.sample_sequences(k, 256, beta=0.4), False)]
    ro_step = batch_of({"obs": jnp.zeros(4), "action": jnp.int32(0), "log_prob": jnp.float32(0)}, 4)
    zeros, no = jnp.zeros(4), jnp.zeros(4, bool)

    def ro_add(s, k):
        return s.add(ro_step, reward=zeros, value=zeros, terminated=no)

    ro = jb.RolloutBuffer.create({"obs": jnp.zeros(4), "action": jnp.int32(0), "log_prob": jnp.float32(0)},
                                 num_steps=128, num_envs=4)
    out += [("RolloutBuffer.add", ro, ro_add, "rollout"),
            ("RolloutBuffer.minibatches", filled(ro, ro_add, 128).compute_gae(zeros, 0.99, 0.95), lambda s, k: s.minibatches(k, 4), False)]
    pix = {"obs": jnp.zeros((84, 84, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    frames = {"obs": jax.random.randint(jax.random.key(0), (ENVS, 84, 84, 4), 0, 4, jnp.int32).astype(jnp.uint8),
              "action": jnp.zeros(ENVS, jnp.int32), "reward": jnp.zeros(ENVS)}

    def comp_add(s, k):
        return s.add(frames, terminated=flags, truncated=flags, final_obs=frames["obs"])

    def comp():  # each side adds to its own buffer: states of one buffer share its host store
        return jb.CompressedTrajectoryBuffer.create(pix, num_envs=ENVS, length=500, final_obs_capacity=8)

    comp_full = filled(comp(), comp_add, 100)
    out += [("CompressedTrajectoryBuffer.add", comp, comp_add, True),
            ("CompressedTrajectoryBuffer.sample_transitions", comp_full,
             lambda s, k: s.sample_transitions(k, 256, n_step=3, gamma=0.99), False)]
    no8 = jnp.zeros(ENVS, bool)

    def comp_ro_add(s, k):
        return s.add(frames, reward=frames["reward"], value=frames["reward"], terminated=no8)

    def comp_ro():  # its own host store per side, as comp()
        return jb.CompressedRolloutBuffer.create(pix, num_envs=ENVS, num_steps=128)

    out += [("CompressedRolloutBuffer.add", comp_ro, comp_ro_add, "rollout-reset")]
    steps = breakout_steps(128)
    if steps is not None:  # op(state, step): the step is the call's argument (a new one per call)
        out += [("CompressedTrajectoryBuffer.add/breakout",
                 lambda: jb.CompressedTrajectoryBuffer.create(pix, num_envs=ENVS, length=128, final_obs_capacity=8),
                 lambda s, x: s.add(x, terminated=no8, truncated=no8, final_obs=x["obs"]), True, steps),
                ("CompressedRolloutBuffer.add/breakout", comp_ro,
                 lambda s, x: s.add(x, reward=x["reward"], value=x["reward"], terminated=no8), "rollout-reset", steps)]
    return out


def breakout_steps(n):
    """``n`` steps of ``ENVS`` lanes of recorded Breakout stacks (lane ``e`` from step ``e * 2000`` of the recording):
    device dicts of ``obs`` u8[ENVS, 84, 84, 4], ``action`` int32 and ``reward`` float32 ``[ENVS]``; None without
    the recorded frames."""
    path = data_file("atari_rollouts.npz")
    if path is None:
        return None
    with np.load(path) as d:
        frames, idx = d["breakout_frames"], d["breakout_obs_idx"]
    rows = idx[np.arange(ENVS)[:, None] * 2000 + np.arange(n)].transpose(1, 0, 2)  # [n, ENVS, 4] frame ids
    obs = np.moveaxis(frames[rows], 2, -1)  # [n, ENVS, 84, 84, 4]
    return [{"obs": jnp.asarray(o), "action": jnp.zeros(ENVS, jnp.int32), "reward": jnp.zeros(ENVS)} for o in obs]


def runner(op, state, threads, n, args=None):
    """``n`` calls of ``op``; adds thread the state (a rollout restarts from the empty buffer; a host-backed one from
    its last state reset: an older state of it is stale). ``op``'s second argument: a key per call, or ``args[i]``."""
    keys = args[:n] if args is not None else list(jax.random.split(jax.random.key(1), n))
    state = state() if callable(state) else state
    box = {"s": state}

    def run():
        s = state if threads == "rollout" else box["s"].reset() if threads == "rollout-reset" else box["s"]
        out = None
        for k in keys:
            out = op(s, k)
            if threads:
                s = out
        box["s"] = s if threads else box["s"]
        jax.block_until_ready(out)

    return run


def main():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated substrings of case names to run")
    args = p.parse_args()
    repeats = args.repeats or (3 if args.quick else 15)
    header(BENCH, args.quick)
    for name, state, op, threads, *per_call in cases():
        if args.only and not any(w in name for w in args.only.split(",")):
            continue
        n = 128 if threads in ("rollout", "rollout-reset") or per_call else (10 if args.quick else 100)
        jitted, per_call = jax.jit(op), (per_call or [None])[0]
        times = interleaved({"ours-eager": runner(op, state, threads, n, per_call),
                             "ours-jit": runner(jitted, state, threads, n, per_call)}, repeats, n)
        compare(BENCH, name, times, "ours-jit", n=n, repeats=repeats, unit="calls/s")


if __name__ == "__main__":
    main()
