"""SB3 PPO on an Atari game with a compressed jaxbuffers rollout buffer, against SB3's own rollout buffer's memory.

The environment is SB3's usual Atari stack: ``make_atari_env`` (AtariWrapper: noop reset, frame skip 4, 84x84
grayscale, episodic life, reward clipping) + ``VecFrameStack(n_stack=4)``, so an observation is uint8 [84, 84, 4].
``CompressedRolloutBuffer`` (sb3-extra-buffers' name and options) keeps the observations compressed on the host,
each distinct frame of the stacks once (``frame_stack=4, stack_axis=0``: PPO's ``VecTransposeImage`` hands the buffer
[4, 84, 84]), and decodes only the minibatch PPO asks for; its minibatches are the ones SB3's own ``RolloutBuffer`` would give
under the same seed (tests/interop/test_sb3_extra_options.py checks it).

At the end it prints the rollout buffer's bytes (device arrays plus compressed host bytes) beside the bytes of SB3's
``RolloutBuffer`` for the same ``n_steps`` and ``n_envs``.

Run: python examples/sb3_ppo_atari.py --total-steps 20000   (a short run)
"""

from __future__ import annotations

import argparse
import time


def sb3_rollout_nbytes(n_steps: int, observation_space, action_space, n_envs: int) -> int:
    """Bytes of the arrays of SB3's own ``RolloutBuffer`` for these arguments (it is built and measured)."""
    from stable_baselines3.common.buffers import RolloutBuffer

    buf = RolloutBuffer(n_steps, observation_space, action_space, device="cpu", n_envs=n_envs)
    names = ("observations", "actions", "rewards", "returns", "episode_starts", "values", "log_probs", "advantages")
    return sum(getattr(buf, k).nbytes for k in names)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="BreakoutNoFrameskip-v4")
    p.add_argument("--total-steps", type=int, default=100_000)
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--n-steps", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--n-epochs", type=int, default=4)
    p.add_argument("--compression-method", default="zstd-1",
                   help="sb3-extra-buffers' names: rle, rle-jit, gzip1..9, igzip0..3, zstd-7..22, none")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import ale_py
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    from jaxbuffers.interop.sb3 import CompressedRolloutBuffer

    gym.register_envs(ale_py)  # the ALE/... and *NoFrameskip-v4 ids
    env = VecFrameStack(make_atari_env(args.env, n_envs=args.n_envs, seed=args.seed), n_stack=4)
    model = PPO(
        "CnnPolicy", env, n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs, learning_rate=2.5e-4,
        clip_range=0.1, ent_coef=0.01, vf_coef=0.5, rollout_buffer_class=CompressedRolloutBuffer,
        rollout_buffer_kwargs=dict(compression_method=args.compression_method, frame_stack=4, stack_axis=0), verbose=1, seed=args.seed,
    )
    t0 = time.perf_counter()
    model.learn(total_timesteps=args.total_steps)
    wall = time.perf_counter() - t0

    buf = model.rollout_buffer
    ours = buf.nbytes
    sb3 = sb3_rollout_nbytes(args.n_steps, env.observation_space, env.action_space, args.n_envs)
    steps = args.n_steps * args.n_envs
    print(f"\n{model.num_timesteps} steps in {wall:.1f} s ({model.num_timesteps / wall:.1f} env steps/s)")
    print(f"rollout buffer, {args.n_steps} steps x {args.n_envs} envs:")
    print(f"  jaxbuffers CompressedRolloutBuffer ({args.compression_method} -> {buf._codec}): {ours / 2**20:,.2f} MiB "
          f"({ours / steps:,.0f} B per step)")
    print(f"  SB3 RolloutBuffer: {sb3 / 2**20:,.2f} MiB ({sb3 / steps:,.0f} B per step); ratio {sb3 / ours:,.1f}x")
    env.close()
    return {"env_steps": model.num_timesteps, "buffer_nbytes": ours, "sb3_nbytes": sb3, "steps_per_rollout": steps}


if __name__ == "__main__":
    main()
