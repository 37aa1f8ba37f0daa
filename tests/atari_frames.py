"""Real Atari frames for the tests, generated with ale-py (which ships the ROMs).

Recipe: `gym.make("ALE/<Game>-v5", frameskip=1)` (sticky actions 0.25) ->
`AtariPreprocessing(noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)`, stacked 4
deep with reset padding (the first stack of an episode repeats its first frame, as
`FrameStackObservation(4, padding_type="reset")` does), uniformly random actions from
`np.random.default_rng(seed)`, the environment seeded once at its first reset. The same seed gives
the same arrays.

`rollout(game, num_steps)` returns, frames stored once:

- `<game>_frames` uint8 [F, 84, 84]: every frame the environment returned, in order
  (F = num_steps + 1 + number of episode ends: one per step, one per reset).
- `<game>_obs_idx`, `<game>_next_idx` int32 [num_steps, 4]: `obs[t] = frames[obs_idx[t]]` is the
  stacked observation before step t, `next_obs[t] = frames[next_idx[t]]` the one step t returned.
- `<game>_actions` int64, `<game>_rewards` float32, `<game>_terminated` bool,
  `<game>_truncated` bool, each [num_steps].

`stacks(rollouts)` gives `<game>_obs` uint8 [num_steps, 4, 84, 84]: the stacked observations
`obs[t]` (consecutive, across episode ends).

This recipe has no truncations: episodes end by game over, long before the v5 time limit.
"""

from __future__ import annotations

import fcntl
import os
import pathlib

import numpy as np

GAMES = {"breakout": "ALE/Breakout-v5", "pong": "ALE/Pong-v5"}
STACK = 4


def rollout(game: str, num_steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Play `num_steps` random steps of `game` ("breakout" or "pong"); arrays as in the module doc."""
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing

    gym.register_envs(ale_py)
    env = gym.make(GAMES[game], frameskip=1)
    env = AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
    rng = np.random.default_rng(seed)
    n_actions = int(env.action_space.n)
    frames = [env.reset(seed=seed)[0]]
    stack = [0] * STACK
    obs_idx = np.zeros((num_steps, STACK), np.int32)
    next_idx = np.zeros((num_steps, STACK), np.int32)
    actions = np.zeros(num_steps, np.int64)
    rewards = np.zeros(num_steps, np.float32)
    terminated = np.zeros(num_steps, bool)
    truncated = np.zeros(num_steps, bool)
    for t in range(num_steps):
        actions[t] = rng.integers(n_actions)
        frame, rewards[t], terminated[t], truncated[t], _ = env.step(actions[t])
        frames.append(frame)
        obs_idx[t], stack = stack, stack[1:] + [len(frames) - 1]
        next_idx[t] = stack
        if terminated[t] or truncated[t]:
            frames.append(env.reset()[0])
            stack = [len(frames) - 1] * STACK
    env.close()
    out = {"frames": np.stack(frames), "obs_idx": obs_idx, "next_idx": next_idx, "actions": actions,
           "rewards": rewards, "terminated": terminated, "truncated": truncated}
    return {f"{game}_{k}": v for k, v in out.items()}


def rollouts(num_steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """`rollout` of every game in `GAMES`, in one dict."""
    return {k: v for game in GAMES for k, v in rollout(game, num_steps, seed).items()}


def stacks(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`<game>_obs` uint8 [num_steps, 4, 84, 84]: every stacked observation `obs[t]` of `data`
    (a `rollouts` dict)."""
    return {f"{game}_obs": data[f"{game}_frames"][data[f"{game}_obs_idx"]] for game in GAMES}


def cached(path: pathlib.Path, make) -> dict[str, np.ndarray]:
    """The arrays saved at `path` (an .npz), made by `make()` and saved first if absent.

    Processes sharing `path` (pytest-xdist workers) take an exclusive lock beside it, so one makes
    the file and the others wait and read it; the file appears whole (`os.replace` of a finished
    temporary file), so no reader ever sees half of it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not path.exists():
                tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                with open(tmp, "wb") as f:
                    np.savez(f, **make())
                os.replace(tmp, path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    with np.load(path) as f:
        return {k: f[k] for k in f.files}
