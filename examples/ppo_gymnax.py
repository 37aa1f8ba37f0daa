"""Fully jitted PPO on gymnax with jaxbuffers' RolloutBuffer and GAE.

    python examples/ppo_gymnax.py                       # CartPole-v1, 1 seed, 5e5 env steps
    python examples/ppo_gymnax.py --num-seeds 8         # 8 seeds at once (jax.vmap)
    python examples/ppo_gymnax.py --env Acrobot-v1 --total-steps 1000000
    python examples/ppo_gymnax.py --total-steps 50000   # a short run

Everything between two progress lines is one compiled XLA program: a ``lax.scan`` over PPO
updates, each a ``lax.scan`` over env steps (acting, stepping the env, ``RolloutBuffer.add``)
followed by ``RolloutBuffer.compute_gae`` and ``lax.scan``s over epochs and shuffled minibatches
(``RolloutBuffer.minibatches``). Seeds are a ``jax.vmap`` axis over all of it (the one-off
parameter init runs seed by seed, see ``make_train``). Python only calls the compiled chunk
repeatedly and prints progress.

Time limits are handled properly: gymnax (>= 1.0) returns ``terminated`` and ``truncated``
separately and the observation before the auto-reset in ``info["final_observation"]``; a
truncated step bootstraps from ``V(final_observation)`` (``final_value`` in the buffer) instead
of being treated as terminal.

Hyper-parameters follow the usual CleanRL / PureJaxRL CartPole settings (4 envs x 128 steps,
64x64 tanh MLPs, 4 epochs x 4 minibatches, Adam 2.5e-4 linearly annealed, clip 0.2, GAE 0.99 /
0.95). Prints a table per seed at the end and saves a learning curve to ``--out``.
The mean episodic return is the mean over the last ``--window`` (20) completed episodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training.train_state import TrainState
from jax import lax

from jaxbuffers.rollout import RolloutBuffer, RolloutMinibatch

# Return at which an environment counts as solved (for the "steps to target" column).
DEFAULT_TARGETS = {"CartPole-v1": 475.0, "CartPole-v0": 195.0, "Acrobot-v1": -100.0}


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    env_name: str = "CartPole-v1"
    num_envs: int = 4
    num_steps: int = 128  # rollout length per update
    total_steps: int = 500_000  # env steps per seed (rounded up to whole chunks of updates)
    update_epochs: int = 4
    num_minibatches: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    lr: float = 2.5e-4
    anneal_lr: bool = True
    hidden: int = 64
    max_episode_steps: int = 0  # time limit override (0: the environment's own, 500 on CartPole-v1)
    window: int = 20  # episodes in the rolling mean return
    chunk_updates: int = 0  # updates per compiled chunk (0: about 20 chunks)
    num_seeds: int = 1
    seed: int = 0

    @property
    def steps_per_update(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def chunk(self) -> int:
        wanted = max(1, math.ceil(self.total_steps / self.steps_per_update))
        return self.chunk_updates if self.chunk_updates > 0 else max(1, math.ceil(wanted / 20))

    @property
    def num_chunks(self) -> int:
        wanted = max(1, math.ceil(self.total_steps / self.steps_per_update))
        return math.ceil(wanted / self.chunk)

    @property
    def num_updates(self) -> int:
        return self.num_chunks * self.chunk


# ---------------------------------------------------------------------------------- network
class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (2 x ``hidden``, tanh), orthogonal initialisation.

    Discrete actions: categorical logits ``[..., num_actions]``. Continuous actions: a Gaussian
    mean ``[..., action_dim]`` and a state-independent log standard deviation.
    """

    action_dim: int
    discrete: bool
    hidden: int = 64

    def setup(self):
        ortho = nn.initializers.orthogonal
        zeros = nn.initializers.zeros
        dense = lambda n, scale: nn.Dense(n, kernel_init=ortho(scale), bias_init=zeros)  # noqa: E731
        self.actor = [dense(self.hidden, np.sqrt(2)), dense(self.hidden, np.sqrt(2)), dense(self.action_dim, 0.01)]
        self.critic = [dense(self.hidden, np.sqrt(2)), dense(self.hidden, np.sqrt(2)), dense(1, 1.0)]
        if not self.discrete:
            self.log_std = self.param("log_std", zeros, (self.action_dim,))

    def _mlp(self, layers, x):
        for layer in layers[:-1]:
            x = jnp.tanh(layer(x))
        return layers[-1](x)

    def value(self, obs: jax.Array) -> jax.Array:
        return self._mlp(self.critic, obs)[..., 0]

    def __call__(self, obs: jax.Array):
        out = self._mlp(self.actor, obs)
        log_std = None if self.discrete else jnp.broadcast_to(self.log_std, out.shape)
        return out, log_std, self.value(obs)


def policy_log_prob(discrete: bool, out, log_std, action):
    if discrete:
        logp = jax.nn.log_softmax(out)
        return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]
    z = (action - out) / jnp.exp(log_std)
    return jnp.sum(-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), axis=-1)


def policy_entropy(discrete: bool, out, log_std):
    if discrete:
        logp = jax.nn.log_softmax(out)
        return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return jnp.sum(log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e), axis=-1)


def policy_sample(discrete: bool, key, out, log_std):
    if discrete:
        return jax.random.categorical(key, out).astype(jnp.int32)
    return out + jnp.exp(log_std) * jax.random.normal(key, out.shape, out.dtype)


# ---------------------------------------------------------------------------------- state
class EpisodeStats(struct.PyTreeNode):
    """Running episode returns and a ring of the last ``window`` completed ones (one seed)."""

    running: jax.Array  # shape=[num_envs], float32: return of the episode in progress
    recent: jax.Array  # shape=[window], float32: returns of the last completed episodes
    count: jax.Array  # shape=(), int32: completed episodes (saturates at 2**30)

    def update(self, reward: jax.Array, done: jax.Array) -> "EpisodeStats":
        running = self.running + reward
        window = self.recent.shape[0]
        done_i = done.astype(jnp.int32)
        slot = (self.count + jnp.cumsum(done_i) - done_i) % window
        slot = jnp.where(done, slot, window)  # out of bounds: dropped
        recent = self.recent.at[slot].set(running, mode="drop")
        count = jnp.minimum(self.count + jnp.sum(done_i), 2**30)
        return EpisodeStats(running=jnp.where(done, 0.0, running), recent=recent, count=count)

    def mean_return(self) -> jax.Array:
        """Mean of the last ``min(count, window)`` completed episodes; NaN before the first."""
        n = jnp.minimum(self.count, self.recent.shape[0])
        valid = jnp.arange(self.recent.shape[0]) < n
        return jnp.where(n > 0, jnp.sum(jnp.where(valid, self.recent, 0.0)) / jnp.maximum(n, 1), jnp.nan)


class RunnerState(NamedTuple):
    """Everything carried from one update to the next (one seed; stacked over seeds outside)."""

    train_state: TrainState
    env_state: Any
    obs: jax.Array  # shape=[num_envs, *obs_shape]
    buffer: RolloutBuffer
    stats: EpisodeStats
    key: jax.Array


class Trainer(NamedTuple):
    """What `make_train` returns.

    ``init(keys)`` builds the stacked runner state for ``keys`` ``[num_seeds]``;
    ``run_chunk(state)`` performs ``config.chunk`` updates for every seed and returns
    ``(state, metrics)`` with metrics leaves ``[num_seeds, chunk]``. Both are pure and jittable
    (``run_chunk`` is meant to be jitted with the state donated). ``train(keys)`` runs all
    ``config.num_chunks`` chunks in one program (no progress output).
    """

    config: PPOConfig
    init: Callable[[jax.Array], RunnerState]
    run_chunk: Callable[[RunnerState], tuple[RunnerState, dict]]
    train: Callable[[jax.Array], tuple[RunnerState, dict]]
    network: ActorCritic


def make_train(config: PPOConfig) -> Trainer:
    env, env_params = gymnax.make(config.env_name)
    if config.max_episode_steps > 0:
        env_params = env_params.replace(max_steps_in_episode=config.max_episode_steps)
    action_space = env.action_space(env_params)
    discrete = isinstance(action_space, gymnax.environments.spaces.Discrete)
    if discrete:
        action_dim = int(action_space.n)
    else:
        action_dim = int(np.prod(action_space.shape))
        low = jnp.asarray(action_space.low, jnp.float32)
        high = jnp.asarray(action_space.high, jnp.float32)
    network = ActorCritic(action_dim=action_dim, discrete=discrete, hidden=config.hidden)
    n_envs, n_steps = config.num_envs, config.num_steps
    grad_steps = config.update_epochs * config.num_minibatches

    def lr_schedule(count):
        frac = 1.0 - (count // grad_steps) / config.num_updates
        return config.lr * frac if config.anneal_lr else config.lr

    tx = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate=lr_schedule if config.anneal_lr else config.lr, eps=1e-5),
    )
    reset_envs = jax.vmap(env.reset, in_axes=(0, None))
    step_envs = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def init_one(key: jax.Array) -> RunnerState:
        key, k_net, k_env = jax.random.split(key, 3)
        obs, env_state = reset_envs(jax.random.split(k_env, n_envs), env_params)
        params = network.init(k_net, obs[0])
        train_state = TrainState.create(apply_fn=network.apply, params=params, tx=tx)
        action = jnp.zeros((), jnp.int32) if discrete else jnp.zeros((action_dim,), jnp.float32)
        example_step = {"obs": obs[0], "action": action, "log_prob": jnp.float32(0)}
        buffer = RolloutBuffer.create(example_step, num_steps=n_steps, num_envs=n_envs)
        stats = EpisodeStats(
            running=jnp.zeros(n_envs, jnp.float32),
            recent=jnp.zeros(config.window, jnp.float32),
            count=jnp.int32(0),
        )
        return RunnerState(train_state, env_state, obs, buffer, stats, key)

    def env_step(carry, _):
        params, env_state, obs, buffer, stats, key = carry
        key, k_act, k_env = jax.random.split(key, 3)
        out, log_std, value = network.apply(params, obs)
        action = policy_sample(discrete, k_act, out, log_std)
        log_prob = policy_log_prob(discrete, out, log_std, action)
        env_action = action if discrete else jnp.clip(action, low, high)
        next_obs, env_state, reward, terminated, truncated, info = step_envs(
            jax.random.split(k_env, n_envs), env_state, env_action, env_params
        )
        # V of the real last observation of an episode cut by the time limit (read only there).
        final_value = network.apply(params, info["final_observation"], method=ActorCritic.value)
        reward = reward.astype(jnp.float32)
        buffer = buffer.add(
            {"obs": obs, "action": action, "log_prob": log_prob},
            reward=reward,
            value=value,
            terminated=terminated.astype(bool),
            truncated=truncated.astype(bool),
            final_value=final_value,
        )
        stats = stats.update(reward, terminated | truncated)
        return (params, env_state, next_obs, buffer, stats, key), None

    def loss_fn(params, mb: RolloutMinibatch):
        out, log_std, value = network.apply(params, mb.step["obs"])
        log_prob = policy_log_prob(discrete, out, log_std, mb.step["action"])
        entropy = policy_entropy(discrete, out, log_std)
        w = mb.mask.astype(jnp.float32)
        n = jnp.maximum(jnp.sum(w), 1.0)
        mean = lambda x: jnp.sum(x * w) / n  # noqa: E731  (drops non-trainable steps)
        adv = mb.advantages
        adv_mean = mean(adv)
        adv = (adv - adv_mean) / (jnp.sqrt(mean((adv - adv_mean) ** 2)) + 1e-8)
        ratio = jnp.exp(log_prob - mb.step["log_prob"])
        policy_loss = -mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - config.clip_eps, 1 + config.clip_eps) * adv))
        value_clipped = mb.value + jnp.clip(value - mb.value, -config.clip_eps, config.clip_eps)
        value_loss = 0.5 * mean(jnp.maximum((value - mb.returns) ** 2, (value_clipped - mb.returns) ** 2))
        ent = mean(entropy)
        total = policy_loss + config.vf_coef * value_loss - config.ent_coef * ent
        return total, (policy_loss, value_loss, ent)

    def minibatch_update(train_state, mb):
        grads, aux = jax.grad(loss_fn, has_aux=True)(train_state.params, mb)
        # Recomputing the total from aux keeps one backward pass (value_and_grad would too).
        policy_loss, value_loss, ent = aux
        total = policy_loss + config.vf_coef * value_loss - config.ent_coef * ent
        return train_state.apply_gradients(grads=grads), jnp.stack([total, policy_loss, value_loss, ent])

    def update_one(runner: RunnerState, _):
        train_state, env_state, obs, buffer, stats, key = runner
        buffer = buffer.reset()
        carry = (train_state.params, env_state, obs, buffer, stats, key)
        (_, env_state, obs, buffer, stats, key), _ = lax.scan(env_step, carry, None, n_steps)
        last_value = network.apply(train_state.params, obs, method=ActorCritic.value)
        buffer = buffer.compute_gae(last_value, config.gamma, config.gae_lambda)

        def epoch(carry, _):
            train_state, key = carry
            key, k_perm = jax.random.split(key)
            minibatches = buffer.minibatches(k_perm, config.num_minibatches)
            train_state, losses = lax.scan(minibatch_update, train_state, minibatches)
            return (train_state, key), losses

        (train_state, key), losses = lax.scan(epoch, (train_state, key), None, config.update_epochs)
        total, policy_loss, value_loss, ent = jnp.mean(losses, axis=(0, 1))  # losses [epochs, minibatches, 4]
        metrics = {
            "return_mean": stats.mean_return(),
            "episodes": stats.count,
            "loss": total,
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": ent,
        }
        return RunnerState(train_state, env_state, obs, buffer, stats, key), metrics

    def run_chunk_one(runner: RunnerState):
        return lax.scan(update_one, runner, None, config.chunk)

    # Seeds are initialised one after another (``lax.map``), not vmapped: the orthogonal init's
    # QR of a batch of seeds is split by jaxlib's LAPACK kernel over XLA's intra-op threads, and
    # two such kernels running at once on a 2-thread pool deadlocked (seen once in a test run,
    # jax 0.10.2). One matrix per QR runs inline; the parameters are the same either way.
    init = lambda keys: lax.map(init_one, keys)  # noqa: E731
    def run_chunk(runner: RunnerState):
        # Seeds are a vmap axis; one seed skips the vmap (it cost compile time and throughput) and keeps the axis.
        if jax.tree.leaves(runner)[0].shape[0] > 1:
            return jax.vmap(run_chunk_one)(runner)
        return jax.tree.map(lambda x: x[None], run_chunk_one(jax.tree.map(lambda x: x[0], runner)))

    def train(keys: jax.Array):
        def chunk(runner, _):
            return run_chunk(runner)

        runner, metrics = lax.scan(chunk, init(keys), None, config.num_chunks)
        # [num_chunks, K, chunk] -> [K, num_updates]
        return runner, jax.tree.map(lambda m: jnp.moveaxis(m, 0, 1).reshape(m.shape[1], -1), metrics)

    return Trainer(config=config, init=init, run_chunk=run_chunk, train=train, network=network)


# ---------------------------------------------------------------------------------- driver
def first_crossing(returns: np.ndarray, target: float) -> int | None:
    """Index of the first update whose mean return is >= target (NaN never counts), or None."""
    hit = np.nonzero(np.nan_to_num(returns, nan=-np.inf) >= target)[0]
    return int(hit[0]) if hit.size else None


def run(config: PPOConfig, target: float | None, out_dir: str | None, log: Callable[[str], None] = print) -> dict:
    """Train with progress output; return a summary dict (also written to ``out_dir``)."""
    trainer = make_train(config)
    k = config.num_seeds
    keys = jax.random.split(jax.random.key(config.seed), k)
    t0 = time.perf_counter()
    state = jax.jit(trainer.init)(keys)
    chunk_fn = jax.jit(trainer.run_chunk, donate_argnums=0).lower(state).compile()
    compile_s = time.perf_counter() - t0
    spu = config.steps_per_update
    log(
        f"PPO on {config.env_name}: {k} seed(s) x {config.num_updates} updates x {spu} steps "
        f"= {config.num_updates * spu:,} env steps per seed, {config.num_chunks} chunks of {config.chunk} "
        f"updates; compiled in {compile_s:.1f} s"
    )
    chunks: list[dict] = []
    chunk_s: list[float] = []
    crossed_wall: list[float | None] = [None] * k
    train_s = 0.0
    for c in range(config.num_chunks):
        tc = time.perf_counter()
        state, metrics = chunk_fn(state)
        metrics = jax.device_get(metrics)  # blocks until the chunk is done
        dt = time.perf_counter() - tc
        train_s += dt
        chunk_s.append(dt)
        chunks.append(metrics)
        wall = time.perf_counter() - t0
        if target is not None:
            for s in range(k):
                if crossed_wall[s] is None and first_crossing(metrics["return_mean"][s], target) is not None:
                    crossed_wall[s] = wall
        ret = metrics["return_mean"][:, -1]
        steps = (c + 1) * config.chunk * spu
        sps = config.chunk * spu * k / dt
        ret_txt = f"{np.nanmean(ret):8.1f}" if np.isfinite(ret).any() else "     n/a"
        if k > 1 and np.isfinite(ret).any():
            ret_txt += f" [{np.nanmin(ret):.0f}..{np.nanmax(ret):.0f}]"
        log(
            f"[{c + 1:>3}/{config.num_chunks}] env steps {steps:>10,} | mean return {ret_txt} | "
            f"loss {np.mean(metrics['loss'][:, -1]):8.4f} | {sps:>9,.0f} steps/s | {wall:6.1f} s"
        )
    metrics = {name: np.concatenate([m[name] for m in chunks], axis=1) for name in chunks[0]}
    total_s = time.perf_counter() - t0
    steps_axis = (np.arange(config.num_updates) + 1) * spu
    seeds = []
    for s in range(k):
        idx = first_crossing(metrics["return_mean"][s], target) if target is not None else None
        seeds.append(
            {
                "seed_index": s,
                "final_return": float(metrics["return_mean"][s, -1]),
                "steps_to_target": None if idx is None else int(steps_axis[idx]),
                "wall_s_to_target": crossed_wall[s],
            }
        )
    summary = {
        "env": config.env_name,
        "config": dataclasses.asdict(config),
        "target": target,
        "compile_s": compile_s,
        "train_s": train_s,
        "total_s": total_s,
        "env_steps_per_seed": int(config.num_updates * spu),
        "steps_per_s": config.num_updates * spu * k / train_s,
        "median_chunk_steps_per_s": config.chunk * spu * k / float(np.median(chunk_s)),
        "seeds": seeds,
        "final_loss_finite": bool(np.isfinite(metrics["loss"]).all()),
    }
    log("")
    log(print_table(summary))
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        png = os.path.join(out_dir, f"ppo_{config.env_name}.png")
        plot_curves(steps_axis, metrics["return_mean"], target, config, png)
        summary_path = os.path.join(out_dir, f"ppo_{config.env_name}.json")
        with open(summary_path, "w") as f:
            json.dump(summary, f, indent=2)
        summary["png"] = png
        log(f"learning curve: {png}; summary: {summary_path}")
    summary["metrics"] = metrics
    return summary


def print_table(summary: dict) -> str:
    target = summary["target"]
    tgt = "n/a" if target is None else f"{target:g}"
    head = f"{'seed':>4}  {'final mean return':>17}  {'steps to ' + tgt:>14}  {'wall s to ' + tgt:>14}"
    lines = [head, "-" * len(head)]
    for s in summary["seeds"]:
        steps = "not reached" if s["steps_to_target"] is None else f"{s['steps_to_target']:,}"
        wall = "-" if s["wall_s_to_target"] is None else f"{s['wall_s_to_target']:.1f}"
        lines.append(f"{s['seed_index']:>4}  {s['final_return']:>17.1f}  {steps:>14}  {wall:>14}")
    lines.append(
        f"compile {summary['compile_s']:.1f} s, training {summary['train_s']:.1f} s "
        f"({summary['steps_per_s']:,.0f} env steps/s over all seeds), total {summary['total_s']:.1f} s. "
        f"Wall time to target is measured at the end of the chunk that reached it, compile included."
    )
    return "\n".join(lines)


def plot_curves(steps: np.ndarray, returns: np.ndarray, target: float | None, config: PPOConfig, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for s in range(returns.shape[0]):
        ax.plot(steps, returns[s], lw=1.2, alpha=0.8, label=f"seed {s}" if returns.shape[0] <= 10 else None)
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target:g}")
    ax.set_xlabel("env steps (per seed)")
    ax.set_ylabel(f"mean return (last {config.window} episodes)")
    ax.set_title(f"PPO + jaxbuffers.RolloutBuffer on {config.env_name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def parse_args(argv=None) -> tuple[PPOConfig, argparse.Namespace]:
    d = PPOConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default=d.env_name, help="gymnax environment id (default %(default)s)")
    p.add_argument("--total-steps", type=int, default=d.total_steps, help="env steps per seed (default %(default)s)")
    p.add_argument("--num-seeds", type=int, default=d.num_seeds, help="seeds trained at once with vmap")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--num-envs", type=int, default=d.num_envs)
    p.add_argument("--num-steps", type=int, default=d.num_steps, help="rollout length per update")
    p.add_argument("--update-epochs", type=int, default=d.update_epochs)
    p.add_argument("--num-minibatches", type=int, default=d.num_minibatches)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--no-anneal-lr", action="store_true")
    p.add_argument("--max-episode-steps", type=int, default=0, help="override the time limit (0: the env's own)")
    p.add_argument("--chunk-updates", type=int, default=d.chunk_updates, help="updates per progress line (0: auto)")
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="return to reach; when given, exit with status 1 if a seed never reaches it "
        "(default: reported only, 475 on CartPole-v1)",
    )
    p.add_argument("--out", default="out", help="folder for the learning-curve PNG and summary JSON ('' for none)")
    a = p.parse_args(argv)
    config = PPOConfig(
        env_name=a.env,
        total_steps=a.total_steps,
        num_seeds=a.num_seeds,
        seed=a.seed,
        num_envs=a.num_envs,
        num_steps=a.num_steps,
        update_epochs=a.update_epochs,
        num_minibatches=a.num_minibatches,
        lr=a.lr,
        anneal_lr=not a.no_anneal_lr,
        chunk_updates=a.chunk_updates,
        max_episode_steps=a.max_episode_steps,
    )
    try:  # the rollout's sizes and minibatches as the buffer checks them, traced only (nothing compiled)
        def minibatches():
            rollout = RolloutBuffer.create(jnp.float32(0), num_envs=config.num_envs, num_steps=config.num_steps)
            return rollout.minibatch_indices(jax.random.key(0), config.num_minibatches)

        jax.eval_shape(minibatches)
    except ValueError as e:
        p.error(str(e))
    return config, a


def main(argv=None) -> int:
    config, a = parse_args(argv)
    target = a.target if a.target is not None else DEFAULT_TARGETS.get(config.env_name)
    summary = run(config, target, a.out or None, log=lambda s: print(s, flush=True))
    if a.target is not None and any(s["steps_to_target"] is None for s in summary["seeds"]):
        print(f"target {a.target:g} not reached by every seed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
