"""SB3 DQN with SB3's own ReplayBuffer vs JaxReplayBuffer (uncompressed and compressed), same process.

Environment: a replay of the recorded Breakout transitions in ``shared/data/atari_rollouts.npz``
(ale-py, AtariPreprocessing + FrameStackObservation(4, padding "reset"), 20,000 steps): a
gymnasium env that ignores the agent's action and returns the recorded next observation, reward
and termination, so every variant sees the same real frames. Observations uint8 [4, 84, 84].

Cases:
  * ``train``: DQN("CnnPolicy") training throughput, env steps/s over the training phase
    (after ``learning_starts``; train_freq 4, batch 32, one gradient step per 4 env steps), the
    three buffers interleaved over repetitions, median reported; ratio = ours / SB3's.
  * ``memory``: resident memory of a buffer of capacity ``N`` filled with ``N`` recorded
    transitions (cycled), measured as the process RSS increase (psutil) in a fresh subprocess
    per variant, from before the buffer is created to after the last add (allocation, fill and
    the compilations of its shapes all count). Measured at two sizes ``N1 < N2``; extrapolated to
    1M as ``fixed + slope * 1e6`` with ``slope = (rss(N2) - rss(N1)) / (N2 - N1)`` and
    ``fixed = rss(N2) - slope * N2`` (the buffers are O(N) by construction: per-row arrays and one
    compressed frame per step). ratio = SB3 / ours.
  * ``buffer_calls``: on the filled N2 buffer, median time of one ``add`` (one env step) and one
    ``sample(32)`` (one gradient step's batch, torch tensors), the buffer's share of a step, and
    of the pair (the compressed adapter stages adds on the host and flushes them at the sample).

  * ``compressed`` / ``compressed_dict``: the compressed SB3 classes (``CompressedReplayBuffer``,
    ``CompressedRolloutBuffer``; their Dict classes on observations {pixels: the stacks, vector: 4 floats}, ours
    compressing ``pixels``) against sb3-extra-buffers' classes of the same names and SB3's own buffers. Bytes held
    (``held_bytes_*``, `compressed_traced_rows`): tracemalloc's traced host memory plus the live JAX arrays, one fresh
    process per variant; ``bytes_per_*``: RSS growth between two fills (noisy when the machine swaps); both with
    ratio = ours / sb3-extra-buffers' smallest. Add, sample and ``get`` times (`compressed_timing_rows`): every variant
    in one process, interleaved, ratio = sb3-extra-buffers' fastest / ours, with ``cpu_us`` and ``cpu_ratio``.
    ``compressed/replay/keyframe/*`` (`keyframe_rows`): our replay class at each ``keyframe_interval``.
    Profile of our rollout ``add`` (one env, ``frame_stack=4``): about a third of its CPU time is the adapter's
    argument checks (SB3's flags, torch values), a third the host writer (the frame comparisons of the stack
    deduplication, the per-step mirrors), the rest the put of the one new frame: its encoding (zstd-1 less than a
    third of igzip1's) and the put's fixed cost, spread over the 128 entries of one put.

  * ``rollout``: SB3's ``RolloutBuffer`` against the uncompressed ``JaxRolloutBuffer`` in one process, one rollout
    of T=2048 Breakout steps: add, GAE, ``get(256)`` passes, bytes held (``rollout_rows``).

Rows (``_common`` format): ``impl`` is ``sb3`` (the anchor) or ``ours`` with ``variant`` ``jax``
(uncompressed) or ``jax_compressed``; memory rows carry ``value`` in GB. Without the recorded
frames the benchmark prints one ``skipped`` row.

Run: python benchmarks/bench_sb3.py [--quick] [--rollout-only | --compressed-timing-only | --compressed-dict-only]
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_file, emit, header, parser, row  # noqa: E402

BENCH = "sb3"
MIN_ROLLOUTS = 9  # rollout rows: timed rollouts at least (medians robust to a preempted reset)
DATA = data_file("atari_rollouts.npz")
IMPL = {"sb3": "sb3", "jax": "ours", "jax_compressed": "ours"}
WARM_STEPS = 40  # training env steps (10 gradient steps) before the training clock starts
COMPRESS = dict(frame_stack=4, stack_axis=0, padding="reset", codec="zstd:-1")  # padding: the recorder's FrameStackObservation; codec: jaxbuffers.compressed.DEFAULT_CODEC


def load(game: str = "breakout"):
    with np.load(DATA) as f:
        frames = f[f"{game}_frames"]
        return {
            "obs": frames[f[f"{game}_obs_idx"]],
            "next_obs": frames[f[f"{game}_next_idx"]],
            "reward": f[f"{game}_rewards"],
            "terminated": f[f"{game}_terminated"],
            "truncated": f[f"{game}_truncated"],
        }


def make_env(data):
    import gymnasium as gym
    from gymnasium import spaces

    class Replay(gym.Env):
        observation_space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
        action_space = spaces.Discrete(4)

        def __init__(self):
            self.t = 0

        def reset(self, *, seed=None, options=None):
            return data["obs"][self.t % len(data["obs"])], {}

        def step(self, action):
            i = self.t % len(data["obs"])
            self.t += 1
            return data["next_obs"][i], float(data["reward"][i]), bool(data["terminated"][i]), bool(data["truncated"][i]), {}

    return Replay


def buffer_kwargs(variant: str):
    from jaxbuffers.interop.sb3 import JaxReplayBuffer

    return {
        "sb3": (None, {}),
        "jax": (JaxReplayBuffer, {}),
        "jax_compressed": (JaxReplayBuffer, {"compress": COMPRESS}),
    }[variant]


def train_rate(data, variant: str, buffer_size: int, learning_starts: int, train_steps: int) -> float:
    import torch as th
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv

    th.set_num_threads(2)
    cls, kw = buffer_kwargs(variant)
    env = DummyVecEnv([make_env(data)])
    model = DQN("CnnPolicy", env, buffer_size=buffer_size, learning_starts=learning_starts, train_freq=4, batch_size=32,
                replay_buffer_class=cls, replay_buffer_kwargs=kw, device="cpu", seed=0, verbose=0)

    # The clock starts after WARM_STEPS training env steps: the first gradient steps compile the
    # sample path (and, compressed, the staging flush of train_freq steps), a one-time cost.
    start = learning_starts + WARM_STEPS

    class Clock(BaseCallback):
        t0 = None

        def _on_step(self):
            if self.num_timesteps == start + 1:
                Clock.t0 = time.perf_counter()
            return True

    model.learn(start + train_steps, callback=Clock())
    return train_steps / (time.perf_counter() - Clock.t0)


def memory_child(variant: str, n: int) -> None:
    """Fill a buffer of capacity n with n recorded transitions; print RSS delta, nbytes and the
    per-call cost of add and sample(32) on the filled buffer, as JSON."""
    import psutil
    from stable_baselines3.common.buffers import ReplayBuffer

    data = load()
    env_cls = make_env(data)
    proc = psutil.Process()
    cls, kw = buffer_kwargs(variant)
    cls = cls or ReplayBuffer
    if variant != "sb3":  # start JAX outside the measured window (compiles of the real shapes stay inside)
        import jax.numpy as jnp

        jnp.zeros(1).block_until_ready()
    m = len(data["obs"])

    def add(buf, j):
        done = data["terminated"][j] | data["truncated"][j]
        buf.add(data["obs"][j : j + 1], data["next_obs"][j : j + 1], np.zeros(1, np.int64), data["reward"][j : j + 1],
                np.array([done]), [{"TimeLimit.truncated": bool(data["truncated"][j])}])

    rss0 = proc.memory_info().rss
    buf = cls(n, env_cls.observation_space, env_cls.action_space, device="cpu", **kw)
    for i in range(n):
        add(buf, i % m)
    rss = proc.memory_info().rss - rss0
    nbytes = buf.nbytes if hasattr(buf, "nbytes") else sum(
        a.nbytes for a in (buf.observations, buf.next_observations, buf.actions, buf.rewards, buf.dones, buf.timeouts))
    t_add, t_sample = [], []
    for i in range(300):
        t = time.perf_counter()
        add(buf, (n + i) % m)
        t_add.append(time.perf_counter() - t)
        t = time.perf_counter()
        buf.sample(32).observations.sum()
        t_sample.append(time.perf_counter() - t)
    # The compressed adapter stages adds on the host and flushes them when it samples: the pair
    # (one add + one sample) is the honest per-step cost, reported as well.
    pair = np.asarray(t_add) + np.asarray(t_sample)
    print(json.dumps({"rss": rss, "nbytes": int(nbytes), "add_us": 1e6 * float(np.median(t_add)),
                      "sample32_us": 1e6 * float(np.median(t_sample)), "add_plus_sample32_us": 1e6 * float(np.median(pair))}))


# --- compressed SB3 classes: jaxbuffers' CompressedReplayBuffer / CompressedRolloutBuffer against
# sb3-extra-buffers' classes of the same names and SB3's own buffers, same frames, same process kind.
# variant: "sb3", "extra:<method>" (sb3-extra-buffers) or "ours:<method>" (jaxbuffers.interop.sb3).
COMPRESSED_VARIANTS = ["sb3", "extra:rle-jit", "extra:igzip1", "extra:gzip9", "ours:zstd-1", "ours:igzip1"]
ADD_BLOCK = 128  # adds per timed block of `compressed_timing_rows`: the replay adapter's staging at these sizes
GET_ROUNDS = 7  # timed get(256) passes per rollout variant (a median of three took a preempted pass too often)


def compressed_class(kind: str, variant: str, dict_obs: bool = False):
    """(class, kwargs) of a variant for kind "replay" or "rollout" (``dict_obs``: the Dict classes, `DICT_SPACE`);
    ``ours:<method>/K<k>``: with ``keyframe_interval=k``."""
    import stable_baselines3.common.buffers as sb3

    name = ("Replay" if kind == "replay" else "Rollout") + "Buffer"
    if variant == "sb3":
        return getattr(sb3, ("Dict" if dict_obs else "") + name), {}
    cls = "Compressed" + ("Dict" if dict_obs else "") + name
    who, method = variant.split(":")
    method, _, k = method.partition("/K")  # ours:<method>/K<k>: keyframe_interval=k
    if who == "extra":
        import sb3_extra_buffers.compressed as x

        return getattr(x, cls), {"compression_method": method}
    import jaxbuffers.interop.sb3 as ours

    # frames stored once: the observations are stacks of 4 on axis 0
    stacked = {"frame_stack": 4, "stack_axis": 0, **({"padding": "reset"} if kind == "replay" else {})}  # reset: the recorder's FrameStackObservation
    stacked.update({"keyframe_interval": int(k)} if k else {})
    return getattr(ours, cls), {"compression_method": method, **stacked, **({"compress_keys": ["pixels"]} if dict_obs else {})}


def observation_space(dict_obs: bool):
    """The recorded stacks' space, or `dict_space`."""
    return dict_space() if dict_obs else make_env({"obs": None}).observation_space


def dict_space():
    """The Dict observation space of the ``compressed_dict`` rows: the recorded stacks and a small float vector."""
    from gymnasium import spaces

    return spaces.Dict({"pixels": spaces.Box(0, 255, (4, 84, 84), np.uint8), "vector": spaces.Box(-1e6, 1e6, (4,), np.float32)})


def compressed_child(kind: str, variant: str, n: int, traced: bool = False, dict_obs: bool = False) -> None:
    """Fill a buffer of n transitions (replay) or n steps (rollout) with recorded frames in a fresh process; print the
    RSS growth as JSON. With ``traced``: only the bytes held, as tracemalloc's traced host memory (numpy arrays, Python
    bytes, the host arenas) plus the JAX arrays alive (``jax.live_arrays``, which tracemalloc does not see) less those
    alive before the buffer was created, immune to swapping. Nothing is flushed or read before it is taken. Times are
    not taken here (`compressed_timing_rows` times every variant in one process). ``dict_obs``: the Dict classes."""
    import psutil

    feed = Feed(kind, dict_obs)
    space, act = observation_space(dict_obs), make_env({"obs": None}).action_space
    cls, kw = compressed_class(kind, variant, dict_obs)
    if variant.startswith("ours"):  # start JAX outside the measured window
        import jax.numpy as jnp

        jnp.zeros(1).block_until_ready()
    if traced:
        import tracemalloc

        warm = cls(256, space, act, device="cpu", **kw)
        for i in range(256):  # lazy imports and compiled code of the first adds: outside the measured window
            feed.add(warm, i)
        del warm
        gc.collect()
        live0 = live_device_bytes() if variant.startswith("ours") else 0
        tracemalloc.start()
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    buf = cls(n, space, act, device="cpu", **kw)
    for i in range(n):
        feed.add(buf, i)
    rss = proc.memory_info().rss - rss0
    if traced:
        host = tracemalloc.get_traced_memory()[0]
        device = live_device_bytes() - live0 if variant.startswith("ours") else 0
        print(json.dumps({"traced": host, "device": device}))
        return
    print(json.dumps({"rss": rss}))


class Feed:
    """The recorded Breakout steps as SB3's DQN (``replay``) or PPO (``rollout``) passes them to ``add``, one env:
    stacks built per add from the frames (the process stays small). With ``dict_obs`` the observations are
    `dict_space`'s: the stack as ``pixels`` and ``vector`` = (reward, done, step / steps, 1)."""

    def __init__(self, kind: str, dict_obs: bool = False):
        import torch as th

        th.set_num_threads(1)
        with np.load(DATA) as f:
            self.frames, self.obs_idx, self.next_idx = f["breakout_frames"], f["breakout_obs_idx"], f["breakout_next_idx"]
            self.reward, term, trunc = f["breakout_rewards"], f["breakout_terminated"], f["breakout_truncated"]
        self.kind, self.m, self.trunc, self.done = kind, len(self.obs_idx), trunc, term | trunc
        self.zero1, self.act = th.zeros(1, 1), np.zeros(1, np.int64)
        self.vector = None
        if dict_obs:
            j = np.arange(self.m)
            self.vector = np.stack([self.reward, self.done, j / self.m, np.ones(self.m)], axis=1).astype(np.float32)

    def obs(self, frame: int, j: int):
        pixels = self.frames[frame][None]
        return pixels if self.vector is None else {"pixels": pixels, "vector": self.vector[j % self.m][None]}

    def add(self, buf, i: int) -> None:
        j = i % self.m
        if self.kind == "replay":
            buf.add(self.obs(self.obs_idx[j], j), self.obs(self.next_idx[j], j + 1), self.act, self.reward[j : j + 1],
                    np.array([self.done[j]]), [{"TimeLimit.truncated": bool(self.trunc[j])}])
        else:
            start = np.array([j > 0 and self.done[j - 1]], np.float32)
            buf.add(self.obs(self.obs_idx[j], j), self.act, self.reward[j : j + 1], start, self.zero1, self.zero1[0])


def shuffled(order: list, rng: np.random.Generator) -> list:
    """``order`` in a random order (from ``rng``, seeded by the caller: not SB3's global numpy RNG). Interleaved
    variants take turns so each round: a fixed rotation keeps each variant right behind the same one, so one always
    starts on the caches another has just filled (e.g. right after gzip9's compression), a bias of its own."""
    return [order[i] for i in rng.permutation(len(order))]


def sample_rounds(bufs: dict, order: list, rounds: int = 100, pick=lambda o: o, rng=None) -> tuple[dict, dict]:
    """``sample(32)`` of each buffer in turn (in a new order each round, `shuffled`), timed until the observation
    tensor can be read (one element is read; ``pick`` takes a Dict observation's pixels): ``(wall, cpu)`` seconds per
    call by buffer key, ``cpu`` the process's CPU time (every thread)."""
    wall, cpu = {v: [] for v in order}, {v: [] for v in order}
    rng = np.random.default_rng(0) if rng is None else rng
    for _ in range(rounds):
        order = shuffled(order, rng)
        for v in order:
            t, c = time.perf_counter(), time.process_time()
            pick(bufs[v].sample(32).observations).reshape(-1)[-1].item()
            wall[v].append(time.perf_counter() - t)
            cpu[v].append(time.process_time() - c)
    return wall, cpu


def compressed_timing_rows(quick: bool, kinds=("replay", "rollout"), dict_obs: bool = False) -> None:
    """Rows ``compressed/<kind>/add`` and ``.../sample32`` (replay) or ``.../get256_per_step`` (rollout): every variant
    in this one process, interleaved, so that their ratios see the same machine load. With ``dict_obs`` the Dict
    classes on `dict_space` observations (ours compress ``pixels`` only), rows ``compressed_dict/...``, a third of the
    steps.

    Each variant's buffer of ``n`` transitions (steps) is filled in blocks of ``ADD_BLOCK`` adds, the variants taking
    turns per block (in a new random order each round, `shuffled`); a block's time / ``ADD_BLOCK`` is one sample of
    the add time, so staged adds and their flushes count at their share (a block is at least the staging of the
    adapters that stage: each block holds their flushes). Then, replay: ``sample(32)`` once per variant in turn, 100
    rounds (timed until the observation tensor can be read: one element is read); rollout:
    ``compute_returns_and_advantage`` and one untimed ``get(256)`` pass per variant (the first pass compiles), then one
    pass per variant in turn, ``GET_ROUNDS`` rounds, its time / ``n``. Medians; ratio: sb3-extra-buffers' fastest
    variant's median / ours (> 1: faster). Every row also carries ``cpu_us``, the median CPU time of the process (all
    threads) per call (per step for get), and ours ``cpu_ratio``, the fastest variant's over ours: on a loaded machine
    a call that hands work between threads waits for CPUs, which the wall time counts."""
    n, block = (3_000 if quick else 9_000) // (3 if dict_obs else 1), ADD_BLOCK
    space, act, prefix = observation_space(dict_obs), make_env({"obs": None}).action_space, "compressed_dict" if dict_obs else "compressed"
    pixels = (lambda o: o["pixels"]) if dict_obs else (lambda o: o)  # noqa: E731
    for kind in kinds:
        feed = Feed(kind, dict_obs)
        bufs = {}
        for v in COMPRESSED_VARIANTS:
            cls, kw = compressed_class(kind, v, dict_obs)
            bufs[v] = cls(n, space, act, device="cpu", **kw)
        order, rng = list(COMPRESSED_VARIANTS), np.random.default_rng(0)
        t_add, cpu_add = {v: [] for v in order}, {v: [] for v in order}
        for b0 in range(0, n, block):
            order = shuffled(order, rng)
            for v in order:
                t, c = time.perf_counter(), time.process_time()
                for i in range(b0, min(b0 + block, n)):
                    feed.add(bufs[v], i)
                t_add[v].append((time.perf_counter() - t) / (min(b0 + block, n) - b0))
                cpu_add[v].append((time.process_time() - c) / (min(b0 + block, n) - b0))
        t_sample = {v: [] for v in order}
        cpu = {v: [] for v in order}  # the process's CPU time (every thread), which waits for a CPU do not inflate
        if kind == "replay":
            t_sample, cpu = sample_rounds(bufs, order, pick=pixels, rng=rng)
        else:
            for v in order:
                bufs[v].compute_returns_and_advantage(feed.zero1, np.zeros(1))
                for mb in bufs[v].get(256):  # untimed: the first pass compiles (once per buffer, not per rollout)
                    pixels(mb.observations).reshape(-1)[-1].item()
            for _ in range(GET_ROUNDS):
                order = shuffled(order, rng)
                for v in order:
                    t, c = time.perf_counter(), time.process_time()
                    for mb in bufs[v].get(256):
                        pixels(mb.observations).reshape(-1)[-1].item()
                    t_sample[v].append((time.perf_counter() - t) / n)
                    cpu[v].append((time.process_time() - c) / n)
        del bufs
        gc.collect()
        extra = [v for v in order if v.startswith("extra")]
        what = "sample32" if kind == "replay" else "get256_per_step"
        for call, times, cpus in (("add", t_add, cpu_add), (what, t_sample, cpu)):
            med = {v: float(np.median(x)) for v, x in times.items()}
            fastest = min(extra, key=med.get)
            for v in COMPRESSED_VARIANTS:
                impl = {"sb3": "sb3", "extra": "sb3-extra-buffers", "ours": "ours"}[v.split(":")[0]]
                a = fastest if impl == "ours" else None
                c = {"cpu_us": round(1e6 * float(np.median(cpus[v])), 3)}
                if a:  # the anchor's CPU time / ours, medians
                    c["cpu_ratio"] = round(float(np.median(cpus[fastest]) / max(np.median(cpus[v]), 1e-12)), 4)
                row(BENCH, f"{prefix}/{kind}/{call}", impl, med[v], n=n, repeats=len(times[v]), unit="calls/s", anchor=a,
                    anchor_seconds=med[fastest] if a else None, variant=v, in_one_process=True, **c)


KEYFRAME_INTERVALS = (1, 2, 4, 8)


def keyframe_rows(quick: bool, method: str = "zstd-1") -> None:
    """Rows ``compressed/replay/keyframe/sample32`` and ``.../held_bytes_per_transition``: our `CompressedReplayBuffer`
    (``method``, frames stored once) at each ``keyframe_interval`` in `KEYFRAME_INTERVALS`, beside sb3-extra-buffers'
    ``rle-jit`` (its fastest sample), all in this one process: the buffers filled with the same ``n`` recorded
    transitions, then ``sample(32)`` once per buffer in turn, 100 rounds. Memory: ``held_bytes_per_transition`` as
    `compressed_traced_rows` measures it (a fresh process per ``K``), ratio to sb3-extra-buffers' smallest (gzip9, its
    own fresh process). ``cpu_ratio``: rle-jit's median CPU time per sample / this one's."""
    n = 3_000 if quick else 9_000
    env_cls = make_env({"obs": None})
    feed = Feed("replay")
    anchor = "extra:rle-jit"
    bufs = {}
    cls, kw = compressed_class("replay", anchor)
    bufs[anchor] = cls(n, env_cls.observation_space, env_cls.action_space, device="cpu", **kw)
    for k in KEYFRAME_INTERVALS:
        cls, kw = compressed_class("replay", f"ours:{method}/K{k}")
        bufs[k] = cls(n, env_cls.observation_space, env_cls.action_space, device="cpu", **kw)
    for i in range(n):
        for b in bufs.values():
            feed.add(b, i)
    wall, cpu = sample_rounds(bufs, list(bufs))
    a_cpu = float(np.median(cpu[anchor]))
    row(BENCH, "compressed/replay/keyframe/sample32", "sb3-extra-buffers", float(np.median(wall[anchor])), n=n, repeats=100,
        unit="calls/s", variant=anchor, in_one_process=True, cpu_us=round(1e6 * a_cpu, 3))
    for k in KEYFRAME_INTERVALS:
        c = float(np.median(cpu[k]))
        row(BENCH, "compressed/replay/keyframe/sample32", "ours", float(np.median(wall[k])), n=n, repeats=100, unit="calls/s",
            anchor=anchor, anchor_seconds=float(np.median(wall[anchor])), variant=f"ours:{method}/K{k}", keyframe_interval=k,
            in_one_process=True, cpu_us=round(1e6 * c, 3), cpu_ratio=round(a_cpu / c, 4))
    del bufs
    gc.collect()

    def held(v: str) -> float:
        out = subprocess.run([sys.executable, __file__, "--compressed-child", "replay", v, str(n), "--traced"], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]
        return (json.loads(out)["traced"] + json.loads(out)["device"]) / n

    smallest = held("extra:gzip9")
    for k in KEYFRAME_INTERVALS:
        b = held(f"ours:{method}/K{k}")
        emit({"bench": BENCH, "case": "compressed/replay/keyframe/held_bytes_per_transition", "impl": "ours", "variant": f"ours:{method}/K{k}",
              "keyframe_interval": k, "value": round(b, 1), "unit": "B/transition", "n": n, "anchor": "extra:gzip9",
              "anchor_value": round(smallest, 1), "ratio": round(b / smallest, 3)})


def live_device_bytes() -> int:
    """Bytes of every JAX array alive in this process."""
    import jax

    return sum(x.nbytes for x in jax.live_arrays())


def compressed_rows(quick: bool, kinds=("replay", "rollout")) -> None:
    """Rows ``compressed/<kind>/bytes_per_...``: bytes per transition (step), the RSS slope between two sizes, each
    in a fresh process (`compressed_child`); ratio: this row / sb3-extra-buffers' smallest."""
    n1, n2 = (1_000, 3_000) if quick else (3_000, 9_000)
    for kind in kinds:
        res = {}
        for v in COMPRESSED_VARIANTS:
            r = [json.loads(subprocess.run([sys.executable, __file__, "--compressed-child", kind, v, str(n)], capture_output=True,
                                           text=True, check=True).stdout.strip().splitlines()[-1]) for n in (n1, n2)]
            res[v] = (r[1]["rss"] - r[0]["rss"]) / (n2 - n1)
        extra = [v for v in res if v.startswith("extra")]
        smallest = min(extra, key=res.get)
        unit = "transition" if kind == "replay" else "step"
        for v, b in res.items():
            impl = {"sb3": "sb3", "extra": "sb3-extra-buffers", "ours": "ours"}[v.split(":")[0]]
            emit({"bench": BENCH, "case": f"compressed/{kind}/bytes_per_{unit}", "impl": impl, "variant": v,
                  "value": round(b, 1), "unit": f"B/{unit} (RSS)", "n": n2, "anchor": None if impl != "ours" else smallest,
                  "ratio": None if impl != "ours" else round(b / max(res[smallest], 1.0), 3), "transitions": [n1, n2]})


def compressed_traced_rows(quick: bool, kinds=("replay", "rollout"), dict_obs: bool = False) -> None:
    """Rows ``compressed/<kind>/held_bytes_per_<unit>``: bytes held per transition (step) after filling N, as
    tracemalloc + device arrays (`compressed_child` with ``traced``); ratio: this row / sb3-extra-buffers' smallest.
    With ``dict_obs``: the Dict classes, rows ``compressed_dict/...``."""
    n = 3_000 if quick else 9_000
    for kind in kinds:
        res = {}
        for v in COMPRESSED_VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--compressed-child", kind, v, str(n), "--traced", *(["--dict"] if dict_obs else [])],
                                 capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            r = json.loads(out)
            res[v] = (r["traced"] + r["device"]) / n
        extra = [v for v in res if v.startswith("extra")]
        smallest = min(extra, key=res.get)
        unit = "transition" if kind == "replay" else "step"
        for v, b in res.items():
            impl = {"sb3": "sb3", "extra": "sb3-extra-buffers", "ours": "ours"}[v.split(":")[0]]
            emit({"bench": BENCH, "case": f"{'compressed_dict' if dict_obs else 'compressed'}/{kind}/held_bytes_per_{unit}", "impl": impl, "variant": v,
                  "value": round(b, 1), "unit": f"B/{unit}", "n": n, "anchor": smallest if impl == "ours" else None,
                  "ratio": round(b / res[smallest], 3) if impl == "ours" else None})


def rollout_rows(quick: bool, repeats: int) -> None:
    """Rows ``rollout/...``: SB3's ``RolloutBuffer`` against the uncompressed ``JaxRolloutBuffer``, in this process.

    One rollout of ``T`` steps of one env with Breakout shapes (observations uint8 ``[4, 84, 84]``, the recorded
    frames; ``Discrete(4)`` actions; value and log-probability torch tensors as SB3's PPO passes them), as SB3's PPO
    uses its one rollout buffer: ``reset``, ``T`` adds, ``compute_returns_and_advantage``, then ``epochs`` passes of
    ``get(256)``, each minibatch read until its observation tensor can be read (one element is read). One warm-up
    rollout per buffer (compiles), then ``repeats`` rollouts, the two buffers alternating; medians:

    * ``rollout/reset``: one ``reset`` of the buffer that held the previous rollout. A call of a fraction of a
      millisecond timed once per rollout: on a loaded machine a preempted call took 5-13 ms of wall time for 0.4 ms
      of its thread's CPU time, so these rows take at least ``MIN_ROLLOUTS`` rollouts (a later reset of an emptied
      buffer is no stand-in: it costs SB3 a tenth of the first);
    * ``rollout/add``: one ``add`` (one env step of every env), the ``T`` adds' time / ``T`` (the adapter stages steps
      on the host and adds 64 at a time, so one add in 64 costs more);
    * ``rollout/compute_gae``: one ``compute_returns_and_advantage``;
    * ``rollout/get256_epoch``: one pass of ``get(256)`` over the ``T`` steps (SB3 flattens its arrays on the first);
    * ``rollout/bytes_per_step``: bytes held by the filled buffer after GAE, per step (tracemalloc's traced host
      memory plus the JAX arrays alive, less those alive before it was created; ratio: SB3's / ours).
    """
    import tracemalloc

    import torch as th
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer

    from jaxbuffers.interop.sb3 import JaxRolloutBuffer

    th.set_num_threads(1)
    T, epochs = (512, 2) if quick else (2048, 4)
    with np.load(DATA) as f:
        obs = f["breakout_frames"][f["breakout_obs_idx"][:T]][:, None]  # [T, 1, 4, 84, 84] uint8
        reward = f["breakout_rewards"][:T, None]
        ends = f["breakout_terminated"][:T] | f["breakout_truncated"][:T]
    starts = np.concatenate([[True], ends[:-1]])[:, None].astype(np.float32)
    obs_space, act_space = spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(4)
    action, value, log_prob = np.zeros((1, 1), np.int64), th.zeros(1, 1), th.zeros(1)
    classes = {"sb3": RolloutBuffer, "jax": JaxRolloutBuffer}

    def new(cls):
        return cls(T, obs_space, act_space, device="cpu", gae_lambda=0.95, gamma=0.99, n_envs=1)

    def rollout(buf, times=None, held=None):
        """One rollout in ``buf``; fills ``times`` (lists per call) or ``held`` (bytes held after GAE, ``buf`` a class:
        the buffer is created inside the measured window)."""
        if held is not None:
            gc.collect()
            live0 = live_device_bytes()
            tracemalloc.start()
            buf = new(buf)
        t0 = time.perf_counter()
        buf.reset()
        t1 = time.perf_counter()
        for t in range(T):
            buf.add(obs[t], action, reward[t], starts[t], value, log_prob)
        if times is not None:
            times["reset"].append(t1 - t0)
            times["add"].append((time.perf_counter() - t1) / T)
        t0 = time.perf_counter()
        buf.compute_returns_and_advantage(value, np.zeros(1, bool))
        if times is not None:
            times["compute_gae"].append(time.perf_counter() - t0)
        if held is not None:
            buf.returns[-1, 0].item()  # waits for the device work (which holds the inputs it was given until done)
            gc.collect()
            held.append(tracemalloc.get_traced_memory()[0] + live_device_bytes() - live0)
            tracemalloc.stop()
        for _ in range(epochs):
            t0 = time.perf_counter()
            for mb in buf.get(256):
                mb.observations.reshape(-1)[-1].item()
            if times is not None:
                times["get256_epoch"].append(time.perf_counter() - t0)

    bufs = {v: new(cls) for v, cls in classes.items()}
    for v in classes:
        rollout(bufs[v])  # warm-up: compiles, lazy imports
    held = {v: [] for v in classes}
    for v, cls in classes.items():
        rollout(cls, held=held[v])
    repeats = repeats if quick else max(repeats, MIN_ROLLOUTS)
    times = {v: {"reset": [], "add": [], "compute_gae": [], "get256_epoch": []} for v in classes}
    for rep in range(repeats):
        for v in (list(classes) if rep % 2 == 0 else list(classes)[::-1]):
            rollout(bufs[v], times[v])
    med = {v: {k: float(np.median(x)) for k, x in t.items()} for v, t in times.items()}
    for call, n in (("reset", 1), ("add", T), ("compute_gae", 1), ("get256_epoch", 1)):  # n: calls per repetition
        for v in classes:
            a = None if v == "sb3" else "sb3"
            row(BENCH, f"rollout/{call}", IMPL[v], med[v][call], n=n, repeats=repeats, unit="calls/s", anchor=a,
                anchor_seconds=med["sb3"][call] if a else None, variant=v, num_steps=T, n_envs=1, minibatch=256,
                epochs=epochs)
    for v in classes:
        emit({"bench": BENCH, "case": "rollout/bytes_per_step", "impl": IMPL[v], "variant": v, "value": round(held[v][0] / T, 1),
              "unit": "B/step", "n": T, "anchor": None if v == "sb3" else "sb3",
              "ratio": None if v == "sb3" else round(held["sb3"][0] / held[v][0], 3)})


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--memory-child", nargs=2, metavar=("VARIANT", "N"), help=ARGPARSE_SUPPRESS)
    p.add_argument("--compressed-child", nargs=3, metavar=("KIND", "VARIANT", "N"), help=ARGPARSE_SUPPRESS)
    p.add_argument("--train-only", action="store_true", help="only the training-throughput case")
    p.add_argument("--compressed-only", action="store_true", help="only the compressed-classes cases")
    p.add_argument("--compressed-traced-only", action="store_true", help="only the held-bytes rows of the compressed classes")
    p.add_argument("--compressed-timing-only", action="store_true", help="only the add and sample rows of the compressed classes")
    p.add_argument("--keyframe-only", action="store_true", help="only the keyframe-interval rows of the compressed replay class")
    p.add_argument("--rollout-only", action="store_true", help="only the uncompressed rollout-buffer rows")
    p.add_argument("--traced", action="store_true", help=ARGPARSE_SUPPRESS)
    p.add_argument("--dict", action="store_true", help=ARGPARSE_SUPPRESS)
    p.add_argument("--compressed-dict-only", action="store_true", help="only the Dict classes' rows (held bytes, add and sample)")
    p.add_argument("--compressed-kinds", default="replay,rollout", help="the compressed classes' cases to run: replay, rollout or both")
    args = p.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]))
        return
    if args.compressed_child:
        compressed_child(args.compressed_child[0], args.compressed_child[1], int(args.compressed_child[2]), args.traced, args.dict)
        return
    quick = args.quick
    repeats = args.repeats or (1 if quick else 3)
    header(BENCH, quick)
    if DATA is None:
        emit({"bench": BENCH, "case": "all", "impl": "ours", "skipped": "shared/data/atari_rollouts.npz not found"})
        return
    if not args.train_only:
        if not (args.compressed_only or args.compressed_traced_only or args.compressed_timing_only or args.compressed_dict_only
                or args.keyframe_only):
            rollout_rows(quick, repeats)
        if args.rollout_only:
            return
        kinds = tuple(args.compressed_kinds.split(","))
        if not (args.compressed_only or args.compressed_traced_only or args.compressed_timing_only or args.compressed_dict_only
                or args.keyframe_only):
            return
        if args.keyframe_only:
            keyframe_rows(quick)
            return
        if args.compressed_timing_only:
            compressed_timing_rows(quick, kinds)
            return
        compressed_traced_rows(quick, kinds)
        if args.compressed_traced_only:
            return
        compressed_rows(quick, kinds)
        compressed_timing_rows(quick, kinds)
        compressed_traced_rows(quick, kinds, dict_obs=True)
        compressed_timing_rows(quick, kinds, dict_obs=True)
    if args.compressed_only:
        return
    variants = ["sb3", "jax", "jax_compressed"]

    # memory at two sizes, a fresh subprocess each: slope = marginal bytes per transition,
    # fixed = the rest (runtime, compiled code); 1M estimate = fixed + slope * 1e6.
    n1, n2 = (2_000, 6_000) if quick else (10_000, 30_000)
    mem = {}
    for v in ([] if args.train_only else variants):
        for n in (n1, n2):
            out = subprocess.run([sys.executable, __file__, "--memory-child", v, str(n)], capture_output=True, text=True, check=True)
            mem[v, n] = json.loads(out.stdout.strip().splitlines()[-1])
    est = {}
    for v in ([] if args.train_only else variants):
        slope = (mem[v, n2]["rss"] - mem[v, n1]["rss"]) / (n2 - n1)
        fixed = mem[v, n2]["rss"] - slope * n2
        est[v] = fixed + slope * 1e6
    for v in ([] if args.train_only else variants):
        emit({"bench": BENCH, "case": "memory/rss_1M_extrapolated", "impl": IMPL[v], "variant": v, "value": round(est[v] / 1e9, 3),
              "unit": "GB", "n": n2, "repeats": 1, "anchor": None if v == "sb3" else "sb3",
              "ratio": None if v == "sb3" else round(est["sb3"] / est[v], 2), "transitions": [n1, n2],
              "rss_bytes": [mem[v, n1]["rss"], mem[v, n2]["rss"]], "nbytes_per_transition": round(mem[v, n2]["nbytes"] / n2, 1),
              "rss_slope_per_transition": round((mem[v, n2]["rss"] - mem[v, n1]["rss"]) / (n2 - n1), 1)})
    for v in ([] if args.train_only else variants):
        r = mem[v, n2]
        for call in ("add", "sample32", "add_plus_sample32"):
            a = None if v == "sb3" else "sb3"
            row(BENCH, f"buffer_calls/{call}", IMPL[v], r[f"{call}_us"] / 1e6, n=300, repeats=1, unit="calls/s", anchor=a,
                anchor_seconds=mem["sb3", n2][f"{call}_us"] / 1e6 if a else None, variant=v, filled=n2)

    # training throughput: interleaved repetitions, medians
    data = load()
    ls, steps = (500, 100) if quick else (1_000, 400)
    rates = {v: [] for v in variants}
    for _ in range(repeats):
        for v in variants:
            rates[v].append(train_rate(data, v, buffer_size=20_000, learning_starts=ls, train_steps=steps))
    med = {v: float(np.median(r)) for v, r in rates.items()}
    for v in variants:
        a = None if v == "sb3" else "sb3"
        row(BENCH, "train/dqn", IMPL[v], 1 / med[v], n=steps, repeats=repeats, unit="env steps/s", anchor=a,
            anchor_seconds=1 / med["sb3"] if a else None, variant=v, runs=[round(x, 2) for x in rates[v]],
            learning_starts=ls, warm_steps=WARM_STEPS)


ARGPARSE_SUPPRESS = "==SUPPRESS=="

if __name__ == "__main__":
    main()
