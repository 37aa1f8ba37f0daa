"""DQN on an Atari game with a host-compressed, frame-deduplicated replay buffer.

The environment runs on the host (ale-py through Gymnasium, standard preprocessing: 84x84
grayscale, frame skip 4, up to 30 no-ops, stacks of 4 frames). Everything else is one jitted
function per env step: the buffer's ``add`` (newest frames go to the host store through a
host callback), and every ``--train-freq`` steps a ``sample`` (decode + stack rebuild through
a host callback) and the Q-learning update (Mnih et al. 2015; optional n-step returns and
proportional prioritised replay, Schaul et al. 2016).

By default the buffer holds 1,000,000 transitions: each stored step keeps one compressed
84x84 frame on the host plus a few int32 on device, instead of two 4x84x84 stacks.

Run::

    python examples/dqn_atari.py --total-steps 200000            # Breakout
    python examples/dqn_atari.py --env ALE/Pong-v5 --n-step 3 --prioritised
    python examples/dqn_atari.py --total-steps 300 --buffer-size 1000 --learning-starts 100   # smoke
    python examples/dqn_atari.py --checkpoint-dir runs/breakout --checkpoint-every 100000
    python examples/dqn_atari.py --checkpoint-dir runs/breakout --resume   # continues from the latest checkpoint

Checkpoints (``--checkpoint-dir``) are steps of an orbax ``CheckpointManager``: the train state (parameters, target,
optimiser, PRNG key, the current observations) and the replay buffer (``jaxbuffers.BufferSave``: device arrays and
the compressed host frames) saved as one step, named by the env steps done. ``--resume`` restores the latest and
continues from its step counter. The environments restart (their emulator state is not saved), so each env's newest
stored step is marked truncated at the restart (``truncate_last_from_host``), with the saved observation that
followed it as its final observation, and the first step after the restart starts a new episode.
"""

from __future__ import annotations

import argparse
import collections
import os
import time

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

import jaxbuffers as jb
from jaxbuffers.compressed import CompressedPrioritisedTrajectoryBuffer, CompressedTrajectoryBuffer


def make_env(env_id: str, seed: int, num_envs: int) -> gym.vector.VectorEnv:
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)

    def thunk():
        env = gym.make(env_id, frameskip=1)  # AtariPreprocessing does the frame skipping
        env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
        return FrameStackObservation(env, 4, padding_type="reset")

    # SAME_STEP autoreset: a done step returns the reset obs and the true final obs in info,
    # which is the buffer's convention (final_obs for truncated steps).
    envs = gym.vector.SyncVectorEnv([thunk] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=seed)
    return envs


class QNetwork(nn.Module):
    """Nature-DQN torso: uint8 [B, 4, 84, 84] -> Q-values [B, num_actions]."""

    num_actions: int

    @nn.compact
    def __call__(self, obs):
        x = jnp.transpose(obs, (0, 2, 3, 1)).astype(jnp.float32) / 255.0
        x = nn.relu(nn.Conv(32, (8, 8), (4, 4), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, (4, 4), (2, 2), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, (3, 3), (1, 1), padding="VALID")(x))
        x = nn.relu(nn.Dense(512)(x.reshape(x.shape[0], -1)))
        return nn.Dense(self.num_actions)(x)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="ALE/Breakout-v5")
    p.add_argument("--total-steps", type=int, default=1_000_000, help="env steps (all envs)")
    p.add_argument("--num-envs", type=int, default=1)
    p.add_argument("--buffer-size", type=int, default=1_000_000, help="transitions kept (all envs)")
    p.add_argument("--codec", default="zstd:-1", help="host codec (jaxbuffers.compressed.DEFAULT_CODEC; zstd:1..22, zstd:-7..-1, igzip:0..3, rle, none)")
    p.add_argument("--learning-starts", type=int, default=80_000)
    p.add_argument("--train-freq", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--n-step", type=int, default=1)
    p.add_argument("--prioritised", action="store_true")
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--beta", type=float, default=0.4)
    p.add_argument("--target-update", type=int, default=1000, help="env steps between target syncs")
    p.add_argument("--eps-end", type=float, default=0.01)
    p.add_argument("--eps-fraction", type=float, default=0.1)
    p.add_argument("--log-every", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None, help="folder of the checkpoints (an orbax CheckpointManager)")
    p.add_argument("--checkpoint-every", type=int, default=100_000, help="env steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    args = p.parse_args(argv)
    if args.resume and args.checkpoint_dir is None:
        p.error("--resume needs --checkpoint-dir")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    envs = make_env(args.env, args.seed, args.num_envs)
    num_actions = int(envs.single_action_space.n)
    n_envs = args.num_envs
    length = max(args.buffer_size // n_envs, args.n_step + 2)

    example = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    # One truncation per 27k steps at most (108k-frame time limit, frame skip 4): a small
    # final-frame ring per lane is exact.
    common = dict(frame_stack=4, stack_axis=0, codec=args.codec, final_obs_capacity=length // 20_000 + 2)
    if args.prioritised:
        buf = CompressedPrioritisedTrajectoryBuffer.create(
            example, num_envs=n_envs, length=length, window_length=args.n_step + 1, priority_exponent=args.alpha, **common
        )
    else:
        buf = CompressedTrajectoryBuffer.create(example, num_envs=n_envs, length=length, **common)

    net = QNetwork(num_actions)
    key = jax.random.key(args.seed)
    key, k0 = jax.random.split(key)
    params = jax.jit(net.init)(k0, jnp.zeros((1, 4, 84, 84), jnp.uint8))  # one compile, not one per layer op
    tx = optax.adam(args.lr, eps=1.5e-4)
    state = {"params": params, "target": jax.tree.map(jnp.copy, params), "opt": tx.init(params), "buf": buf}

    def loss_fn(params, target, tr, weights):
        q = net.apply(params, tr.obs)
        q_a = jnp.take_along_axis(q, tr.action[:, None], axis=1)[:, 0]
        q_next = net.apply(target, tr.next_obs).max(axis=1)
        # n-step target (Sutton & Barto 7.1): G + gamma^k (1 - terminated) max_a Q'(s_{t+k}, a);
        # rewards clipped to their sign as in Mnih et al. (2015).
        y = tr.n_step_return + tr.discount * jax.lax.stop_gradient(q_next)
        td = q_a - y
        return jnp.mean(weights * optax.huber_loss(td)), td

    def update(state, key):
        b = state["buf"]
        if args.prioritised:  # a drop-in: the uniform sample's fields plus importance weights
            tr = b.sample_transitions(key, args.batch_size, n_step=args.n_step, gamma=args.gamma, beta=args.beta)
            weights = tr.importance_weights
        else:
            tr = b.sample_transitions(key, args.batch_size, n_step=args.n_step, gamma=args.gamma)
            weights = jnp.ones(args.batch_size)
        (loss, td), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], state["target"], tr, weights)
        upd, opt = tx.update(grads, state["opt"], state["params"])
        params = optax.apply_updates(state["params"], upd)
        if args.prioritised:
            b = b.set_priorities(tr.indices, jnp.abs(td) + 1e-6, tr.generations)
        return {**state, "params": params, "opt": opt, "buf": b}, loss

    @jax.jit
    def act(params, obs, key, eps):
        q = net.apply(params, obs)
        greedy = jnp.argmax(q, axis=1).astype(jnp.int32)
        k1, k2 = jax.random.split(key)
        rand = jax.random.randint(k1, greedy.shape, 0, num_actions, jnp.int32)
        return jnp.where(jax.random.uniform(k2, greedy.shape) < eps, rand, greedy)

    def train_step(state, step, terminated, truncated, final_obs, key, do_update, do_sync):
        """One env step: add to the buffer, then (every train_freq steps) sample and learn."""
        state = {**state, "buf": state["buf"].add(step, terminated=terminated, truncated=truncated, final_obs=final_obs)}
        state, loss = jax.lax.cond(do_update, update, lambda s, k: (s, jnp.float32(0)), state, key)
        target = jax.tree.map(lambda t, p: jnp.where(do_sync, p, t), state["target"], state["params"])
        return {**state, "target": target}, loss

    train_step = jax.jit(train_step, donate_argnums=0)

    mngr, steps = None, 0
    if args.checkpoint_dir is not None:
        mngr = ocp.CheckpointManager(os.path.abspath(args.checkpoint_dir), options=ocp.CheckpointManagerOptions(max_to_keep=2))
    if args.resume and mngr.latest_step() is not None:
        steps = mngr.latest_step()
        train = {k: state[k] for k in ("params", "target", "opt")}
        obs_spec = jax.ShapeDtypeStruct((n_envs, *envs.single_observation_space.shape), envs.single_observation_space.dtype)
        abstract = {**jax.eval_shape(lambda: {**train, "key": jax.random.key_data(key)}), "obs": obs_spec}
        out = mngr.restore(steps, args=ocp.args.Composite(
            train=ocp.args.StandardRestore(abstract), buffer=jb.BufferRestore(state["buf"])))
        state = {**out.train, "buf": out.buffer}
        key = jax.random.wrap_key_data(state.pop("key"))
        # The environments start new episodes below, so each lane's newest stored step is cut there: truncated, with
        # the observation that followed it (saved with it) as its final observation.
        last_obs = np.asarray(state.pop("obs"))
        state["buf"] = state["buf"].truncate_last_from_host(np.ones(n_envs, bool), last_obs)
        print(f"resumed from step {steps:,} ({int(state['buf'].size()):,} stored transitions)", flush=True)
    resumed_from = steps

    obs, _ = envs.reset(seed=args.seed + steps)
    returns, ep_ret = collections.deque(maxlen=20), np.zeros(n_envs)
    all_returns = []
    t0, last_t, last_steps, loss = time.time(), time.time(), steps, 0.0
    raw_bytes = state["buf"].uncompressed_nbytes()
    buf0 = state["buf"]
    raw_per_transition = raw_bytes / (buf0.num_envs * buf0.length)  # an uncompressed buffer, per slot

    def per_stored(b):
        """Device + host bytes (host arenas counted whole, preallocated space included) per stored step."""
        return b.nbytes / max(int(b.size()), 1)

    while steps < args.total_steps:
        eps = max(args.eps_end, 1.0 - (1.0 - args.eps_end) * steps / max(1.0, args.eps_fraction * args.total_steps))
        key, ka, ku = jax.random.split(key, 3)
        action = np.asarray(act(state["params"], jnp.asarray(obs), ka, eps))
        next_obs, reward, term, trunc, info = envs.step(action)
        done = term | trunc
        final = next_obs.copy()
        if done.any():
            for i in np.flatnonzero(done):
                final[i] = info["final_obs"][i]
        ep_ret += reward
        for i in np.flatnonzero(done):
            returns.append(ep_ret[i])
            all_returns.append(float(ep_ret[i]))
            ep_ret[i] = 0
        step = {"obs": jnp.asarray(obs), "action": jnp.asarray(action, jnp.int32),
                "reward": jnp.asarray(np.sign(reward), jnp.float32)}
        steps += n_envs
        learn = steps >= args.learning_starts and (steps // n_envs) % args.train_freq == 0
        sync = learn and (steps // n_envs) % max(1, args.target_update // n_envs) == 0
        state, l = train_step(state, step, jnp.asarray(term), jnp.asarray(trunc), jnp.asarray(final), ku,
                              jnp.bool_(learn), jnp.bool_(sync))
        if learn:
            loss = l
        obs = next_obs
        if mngr is not None and (steps % args.checkpoint_every < n_envs or steps >= args.total_steps):
            train = {k: state[k] for k in ("params", "target", "opt")}
            mngr.save(steps, args=ocp.args.Composite(
                train=ocp.args.StandardSave({**train, "key": jax.random.key_data(key), "obs": np.asarray(obs)}),
                buffer=jb.BufferSave(state["buf"])))
            mngr.wait_until_finished()  # the next train_step donates the state being written
        if steps % args.log_every < n_envs or steps >= args.total_steps:
            now = time.time()
            b = state["buf"]
            sps = (steps - last_steps) / max(now - last_t, 1e-9)
            mean_ret = float(np.mean(returns)) if returns else float("nan")
            print(
                f"steps {steps:>9,}  {sps:7.0f} steps/s  episodes {len(all_returns):5d}  "
                f"return(last {len(returns)}) {mean_ret:7.2f}  loss {float(loss):.3g}  eps {eps:.3f}  "
                f"buffer {b.nbytes / 2**20:8.1f} MiB: {per_stored(b):,.0f} B per stored transition vs "
                f"{raw_per_transition:,.0f} B raw ({raw_per_transition / max(per_stored(b), 1):.0f}x smaller)",
                flush=True,
            )
            last_t, last_steps = now, steps
    elapsed = time.time() - t0
    b = state["buf"]
    summary = {
        "env_steps": steps,
        "resumed_from": resumed_from,
        "seconds": elapsed,
        "steps_per_second": (steps - resumed_from) / elapsed,
        "episodes": len(all_returns),
        "mean_return_last20": float(np.mean(returns)) if returns else None,
        "buffer_nbytes": b.nbytes,
        "buffer_host_nbytes": b.host_nbytes,
        "buffer_raw_nbytes": raw_bytes,
        "stored_transitions": int(b.size()),
        "bytes_per_stored_transition": per_stored(b),
        "raw_bytes_per_transition": raw_per_transition,
    }
    print(summary, flush=True)
    envs.close()
    if mngr is not None:
        mngr.close()
    return summary


if __name__ == "__main__":
    main()
