"""Real Atari frames for the benchmarks, played with ale-py (which ships the ROMs).

Recipe (that of `tests/atari_frames.py`): `gym.make("ALE/<Game>-v5", frameskip=1)` (sticky actions 0.25) ->
`AtariPreprocessing(noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)`, uniformly random actions
from `np.random.default_rng(seed)`, one environment per lane, each seeded `seed + lane` at its first reset.

`steps(game, num_envs, chunk)` yields chunks of `chunk` steps of every lane, so a long rollout is streamed and never
held whole: the newest frame of each step's observation and of its next observation, actions, rewards and flags.
`rollout(game, n)` keeps the first `n` steps of one lane (cached in the temporary folder).
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import numpy as np

GAMES = {
    "breakout": "ALE/Breakout-v5", "pong": "ALE/Pong-v5", "mspacman": "ALE/MsPacman-v5",
    "spaceinvaders": "ALE/SpaceInvaders-v5", "seaquest": "ALE/Seaquest-v5",
}


def _env(game: str):
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing

    gym.register_envs(ale_py)
    return AtariPreprocessing(gym.make(GAMES[game], frameskip=1), noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)


def steps(game: str, num_envs: int, chunk: int, seed: int = 0):
    """Endless chunks of a random-policy rollout of `num_envs` lanes: dicts of `frame` uint8 [E, t, 84, 84] (the
    frame each step starts from), `next_frame` (the frame it returned; after an episode end, the terminal frame),
    `action` int32 [E, t], `reward` float32, `terminated` / `truncated` bool."""
    envs = [_env(game) for _ in range(num_envs)]
    rngs = [np.random.default_rng(seed + e) for e in range(num_envs)]
    cur = [env.reset(seed=seed + e)[0] for e, env in enumerate(envs)]
    while True:
        out = {
            "frame": np.empty((num_envs, chunk, 84, 84), np.uint8), "next_frame": np.empty((num_envs, chunk, 84, 84), np.uint8),
            "action": np.empty((num_envs, chunk), np.int32), "reward": np.empty((num_envs, chunk), np.float32),
            "terminated": np.empty((num_envs, chunk), bool), "truncated": np.empty((num_envs, chunk), bool),
        }
        for e, env in enumerate(envs):
            for t in range(chunk):
                a = int(rngs[e].integers(env.action_space.n))
                nxt, r, term, trunc, _ = env.step(a)
                out["frame"][e, t], out["next_frame"][e, t] = cur[e], nxt
                out["action"][e, t], out["reward"][e, t], out["terminated"][e, t], out["truncated"][e, t] = a, r, term, trunc
                cur[e] = env.reset()[0] if term or trunc else nxt
        yield out


def rollout(game: str, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The first `n` steps of one lane of `steps(game, 1, n, seed)`, without the lane axis (cached)."""
    path = pathlib.Path(tempfile.gettempdir()) / f"jaxbuffers_bench_{game}_{n}_{seed}.npz"
    if path.exists():
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    out = {k: v[0] for k, v in next(steps(game, 1, n, seed)).items()}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **out)
    os.replace(tmp, path)
    return out


def stacked(roll: dict[str, np.ndarray], k: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frame stacks of a `rollout`, frames stored once: `(frames [F, 84, 84], obs_idx [n, k], next_idx [n, k])` with
    `obs[t] = frames[obs_idx[t]]` the stack step `t` starts from and `next_obs[t] = frames[next_idx[t]]` the one it
    returned (`FrameStackObservation(k, padding_type="reset")`: an episode's first stack repeats its first frame)."""
    n = roll["frame"].shape[0]
    ends = roll["terminated"] | roll["truncated"]
    start = np.zeros(n, np.int64)
    for t in range(1, n):
        start[t] = t if ends[t - 1] else start[t - 1]
    t = np.arange(n)[:, None]
    obs_idx = np.maximum(t - np.arange(k - 1, -1, -1)[None, :], start[:, None])
    next_idx = np.concatenate([obs_idx[:, 1:], n + t], axis=1)
    return np.concatenate([roll["frame"], roll["next_frame"]]), obs_idx.astype(np.int32), next_idx.astype(np.int32)
