"""SB3 DQN on an Atari game with a compressed jaxbuffers replay buffer, switched on with one argument.

The environment is SB3's usual Atari stack: ``make_atari_env`` (AtariWrapper: noop reset, frame
skip 4, 84x84 grayscale, episodic life, reward clipping) + ``VecFrameStack(n_stack=4)``, then
``VecTransposeImage`` (what CnnPolicy does anyway), so an observation is uint8 [4, 84, 84]
(frames on axis 0, zeros before an episode's first frame).
``JaxReplayBuffer(compress=dict(frame_stack=4, stack_axis=0))`` keeps one compressed frame per
step on the host and rebuilds the stacks at sample time; the samples are exactly what SB3's own
buffer would return (tests/interop/test_sb3_compressed.py checks it on Breakout).

At the end it prints SB3's usual logs (``verbose=1``) and the buffer's bytes against what SB3's
own ``ReplayBuffer`` allocates for the same ``buffer_size``.

Run: python examples/sb3_dqn_atari.py --total-steps 20000   (a short run)
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="BreakoutNoFrameskip-v4")
    p.add_argument("--total-steps", type=int, default=100_000)
    p.add_argument("--buffer-size", type=int, default=100_000)
    p.add_argument("--learning-starts", type=int, default=None, help="default: min(10_000, total_steps // 2)")
    p.add_argument("--n-envs", type=int, default=1)
    p.add_argument("--codec", default="zstd:-1", help="host codec: zstd:-1 (default), zstd:1..22, igzip:0..3, rle, none")
    p.add_argument("--no-compress", action="store_true", help="uncompressed JaxReplayBuffer (for comparison)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import ale_py
    import gymnasium as gym
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack, VecTransposeImage

    from jaxbuffers.interop.sb3 import JaxReplayBuffer, sb3_replay_nbytes

    gym.register_envs(ale_py)  # the ALE/... and *NoFrameskip-v4 ids
    env = VecFrameStack(make_atari_env(args.env, n_envs=args.n_envs, seed=args.seed), n_stack=4)
    # SB3's CnnPolicy would transpose the images to channels-first itself; doing it here makes
    # the frame axis of the stored observations explicit: [4, 84, 84], frames on axis 0.
    env = VecTransposeImage(env)
    compress = False if args.no_compress else dict(frame_stack=4, stack_axis=0, codec=args.codec)
    learning_starts = args.learning_starts if args.learning_starts is not None else min(10_000, args.total_steps // 2)
    model = DQN(
        "CnnPolicy",
        env,
        buffer_size=args.buffer_size,
        learning_starts=learning_starts,
        batch_size=32,
        learning_rate=1e-4,
        train_freq=4,
        target_update_interval=1_000,
        exploration_fraction=0.1,
        exploration_final_eps=0.01,
        optimize_memory_usage=False,
        replay_buffer_class=JaxReplayBuffer,
        replay_buffer_kwargs=dict(compress=compress),
        verbose=1,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    model.learn(total_timesteps=args.total_steps, log_interval=10)
    wall = time.perf_counter() - t0

    buf = model.replay_buffer
    stored = buf.size() * buf.n_envs
    ours = buf.nbytes
    sb3_full = sb3_replay_nbytes(args.buffer_size, env.observation_space, env.action_space, n_envs=args.n_envs)
    sb3_same = sb3_full * stored // (buf.buffer_size * buf.n_envs)
    print(f"\n{args.total_steps} steps in {wall:.1f} s ({args.total_steps / wall:.1f} env steps/s)")
    print(f"replay buffer: {stored:,} transitions stored of {buf.buffer_size * buf.n_envs:,}")
    print(f"  jaxbuffers ({'compressed, ' + args.codec + ', frame dedup' if compress else 'uncompressed'}): {ours / 2**20:,.1f} MiB"
          f" ({ours / max(stored, 1):,.0f} B per stored transition)")
    print(f"  SB3 ReplayBuffer for the same transitions: {sb3_same / 2**20:,.1f} MiB; "
          f"its allocation for buffer_size={args.buffer_size:,}: {sb3_full / 2**30:,.2f} GiB")
    if compress and ours:
        print(f"  ratio (SB3 / jaxbuffers) for the stored transitions: {sb3_same / ours:,.1f}x")


if __name__ == "__main__":
    main()
