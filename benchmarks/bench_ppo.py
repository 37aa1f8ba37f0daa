"""PPO on gymnax CartPole-v1: the flagship example (``examples/ppo_gymnax.py``: `RolloutBuffer`,
`gae`, truncation bootstrap) against two anchors without a buffer.

* ``plain-ppo``: a PureJaxRL-style PPO written here with its own network, ``lax.scan`` loop,
  metrics and driver, sharing nothing with the example: rollout as scan outputs, inline GAE,
  time limits treated as terminal. The main anchor.
* ``shared-driver``: the same buffer-free PPO plugged into the example's driver
  (``ppo_gymnax.run``), network, loss and metrics: the buffer's cost with everything else equal.

Configuration (all three): 4 envs x 128 steps per update, actor and critic 64x64 tanh MLPs, 4
epochs x 4 minibatches, Adam lr 2.5e-4 annealed linearly, clip 0.2, entropy 0.01, value 0.5,
gradient norm 0.5, gamma 0.99, lambda 0.95, 5e5 env steps, one seed per run. The updates run in
about 20 compiled chunks; after each the driver reads the rolling mean return of the last 20
finished episodes. Repetition ``r`` runs every implementation with seed ``r`` (so the steps each
needs to reach 475 are compared over the same seeds, not one seed's luck). Rows (medians over
``--reps`` repetitions, implementations alternating):

* ``wall_s_to_475``: seconds from the start (compile included) to the end of the chunk in which
  the rolling mean first reaches 475 (``None`` if it never does);
* ``compile_s``: initialisation and compilation of the chunk program;
* ``compile_cpu_s``: the process CPU seconds of the same span (all threads): steadier than ``compile_s`` on a
  machine other processes load;
* ``train_s_to_475``: ``wall_s_to_475 - compile_s``, the training part of it;
* ``env_steps_per_s``: training env steps / training time (compile excluded).

``ratio`` is the anchor's time / this row's time (for a throughput: this / the anchor's);
``time_ratio`` is this row's time / the anchor's (target for ours against plain-ppo: <= 1.2).
``--quick`` trains 5e4 steps (the target is not reached), one repetition.

Run: python benchmarks/bench_ppo.py [--quick] [--reps 3]
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training.train_state import TrainState
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, parser, row  # noqa: E402

import jaxbuffers  # noqa: E402

BENCH = "ppo"
TARGET = 475.0
ENV, NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES, LR, TOTAL = "CartPole-v1", 4, 128, 4, 4, 2.5e-4, 500_000
GAMMA, LAMBDA, CLIP, ENT, VF, MAX_NORM, WINDOW = 0.99, 0.95, 0.2, 0.01, 0.5, 0.5, 20


def load_example():
    """``examples/ppo_gymnax.py`` of the tree whose jaxbuffers is imported (so a baseline
    revision runs its own example)."""
    path = Path(jaxbuffers.__file__).resolve().parents[1] / "examples" / "ppo_gymnax.py"
    spec = importlib.util.spec_from_file_location("ppo_gymnax", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ppo_gymnax"] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------
# plain-ppo: nothing shared with the example


class Actor(nn.Module):
    actions: int

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.orthogonal
        for _ in range(2):
            x = nn.tanh(nn.Dense(64, kernel_init=init(math.sqrt(2)))(x))
        return nn.Dense(self.actions, kernel_init=init(0.01))(x)


class Critic(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.initializers.orthogonal
        for _ in range(2):
            x = nn.tanh(nn.Dense(64, kernel_init=init(math.sqrt(2)))(x))
        return nn.Dense(1, kernel_init=init(1.0))(x)[..., 0]


def plain_ppo(total_steps: int, seed: int = 0) -> dict:
    env, params = gymnax.make(ENV)
    actor, critic = Actor(env.action_space(params).n), Critic()
    num_updates = total_steps // (NUM_ENVS * NUM_STEPS)
    chunk = math.ceil(num_updates / 20)
    batch = NUM_ENVS * NUM_STEPS
    lr = lambda count: LR * (1.0 - (count // (EPOCHS * MINIBATCHES)) / num_updates)  # noqa: E731
    tx = optax.chain(optax.clip_by_global_norm(MAX_NORM), optax.adam(lr, eps=1e-5))

    def apply(p, obs):
        return actor.apply(p["actor"], obs), critic.apply(p["critic"], obs)

    def init(key):
        k_a, k_c, k_env, key = jax.random.split(key, 4)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, NUM_ENVS), params)
        p = {"actor": actor.init(k_a, obs), "critic": critic.init(k_c, obs)}
        ts = TrainState.create(apply_fn=apply, params=p, tx=tx)
        episodes = (jnp.zeros(NUM_ENVS), jnp.full(WINDOW, jnp.nan), jnp.int32(0))  # running, last WINDOW, count
        return ts, env_state, obs, episodes, key

    def env_step(carry, _):
        ts, env_state, obs, (running, recent, count), key = carry
        key, k_act, k_env = jax.random.split(key, 3)
        logits, value = apply(ts.params, obs)
        action = jax.random.categorical(k_act, logits)
        log_prob = jax.nn.log_softmax(logits)[jnp.arange(NUM_ENVS), action]
        nobs, env_state, reward, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(k_env, NUM_ENVS), env_state, action, params)
        done = term | trunc
        running = running + reward
        # push finished episodes' returns into the ring of the last WINDOW (in env order)
        slot = (count + jnp.cumsum(done) - 1) % WINDOW
        recent = recent.at[jnp.where(done, slot, WINDOW)].set(running, mode="drop")
        count = count + done.sum()
        running = jnp.where(done, 0.0, running)
        return (ts, env_state, nobs, (running, recent, count), key), (obs, action, log_prob, value, reward, done)

    def loss(p, mb):
        obs, action, old_lp, old_v, adv, ret = mb
        logits, v = apply(p, obs)
        logp = jax.nn.log_softmax(logits)
        lp = jnp.take_along_axis(logp, action[:, None], 1)[:, 0]
        entropy = -(jnp.exp(logp) * logp).sum(-1).mean()
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        ratio = jnp.exp(lp - old_lp)
        actor_loss = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - CLIP, 1 + CLIP) * adv).mean()
        v_clip = old_v + jnp.clip(v - old_v, -CLIP, CLIP)
        value_loss = 0.5 * jnp.maximum((v - ret) ** 2, (v_clip - ret) ** 2).mean()
        return actor_loss + VF * value_loss - ENT * entropy

    def update(runner, _):
        runner, traj = lax.scan(env_step, runner, None, NUM_STEPS)
        ts, env_state, obs, episodes, key = runner
        obs_t, action, log_prob, value, reward, done = traj
        _, last_value = apply(ts.params, obs)

        def gae_step(carry, x):
            adv_next, v_next = carry
            r, v, d = x
            delta = r + GAMMA * v_next * (1 - d) - v
            adv = delta + GAMMA * LAMBDA * (1 - d) * adv_next
            return (adv, v), adv

        _, adv = lax.scan(gae_step, (jnp.zeros(NUM_ENVS), last_value), (reward, value, done), reverse=True)
        data = (obs_t, action, log_prob, value, adv, adv + value)

        def epoch(carry, _):
            ts, key = carry
            key, k = jax.random.split(key)
            perm = jax.random.permutation(k, batch)
            mbs = jax.tree.map(lambda x: x.reshape(batch, *x.shape[2:])[perm].reshape(MINIBATCHES, -1, *x.shape[2:]), data)
            ts, losses = lax.scan(lambda t, mb: (t.apply_gradients(grads=jax.grad(loss)(t.params, mb)), None), ts, mbs)
            return (ts, key), None

        (ts, key), _ = lax.scan(epoch, (ts, key), None, EPOCHS)
        recent, count = episodes[1], episodes[2]
        mean_return = jnp.where(count >= WINDOW, jnp.nanmean(recent), jnp.nan)
        return (ts, env_state, obs, episodes, key), mean_return

    t0, c0 = time.perf_counter(), time.process_time()
    runner = jax.jit(init)(jax.random.key(seed))
    run_chunk = jax.jit(lambda r: lax.scan(update, r, None, chunk), donate_argnums=0).lower(runner).compile()
    compile_s, compile_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    train_s, wall_to_target, chunks = 0.0, None, math.ceil(num_updates / chunk)
    for _ in range(chunks):
        tc = time.perf_counter()
        runner, returns = run_chunk(runner)
        returns = np.asarray(returns)
        train_s += time.perf_counter() - tc
        if wall_to_target is None and (returns >= TARGET).any():
            wall_to_target = time.perf_counter() - t0
    return {"compile_s": compile_s, "compile_cpu_s": compile_cpu_s, "env_steps_per_s": chunks * chunk * batch / train_s, "wall_s_to_475": wall_to_target,
            "final_return": float(returns[-1])}


# ---------------------------------------------------------------------------------------------
# ours and shared-driver: the example's driver


def example_run(ppo, make_train, total_steps: int, seed: int = 0) -> dict:
    ppo_make_train = ppo.make_train
    cpu = []  # process CPU seconds after make_train and at the driver's first line (logged right after compiling)

    def timed_make_train(config):
        trainer = make_train(config)
        cpu.append(time.process_time())
        return trainer

    ppo.make_train = timed_make_train
    try:
        s = ppo.run(ppo.PPOConfig(seed=seed, total_steps=total_steps), TARGET, None, log=lambda _: cpu.append(time.process_time()))
    finally:
        ppo.make_train = ppo_make_train
    return {"compile_s": s["compile_s"], "compile_cpu_s": cpu[1] - cpu[0], "env_steps_per_s": s["steps_per_s"],
            "wall_s_to_475": s["seeds"][0]["wall_s_to_target"], "final_return": s["seeds"][0]["final_return"]}


def shared_driver_train(ppo):
    """The buffer-free PPO in the example's driver: its network, loss terms and metrics."""

    def make_train(config):
        env, env_params = gymnax.make(config.env_name)
        net = ppo.ActorCritic(action_dim=env.action_space(env_params).n, discrete=True, hidden=config.hidden)
        N, T = config.num_envs, config.num_steps
        gs = config.update_epochs * config.num_minibatches
        tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                         optax.adam(lambda c: config.lr * (1.0 - (c // gs) / config.num_updates), eps=1e-5))
        reset, step = jax.vmap(env.reset, in_axes=(0, None)), jax.vmap(env.step, in_axes=(0, 0, 0, None))

        def init_one(key):
            key, kn, ke = jax.random.split(key, 3)
            obs, es = reset(jax.random.split(ke, N), env_params)
            ts = TrainState.create(apply_fn=net.apply, params=net.init(kn, obs[0]), tx=tx)
            stats = ppo.EpisodeStats(running=jnp.zeros(N), recent=jnp.zeros(config.window), count=jnp.int32(0))
            return (ts, es, obs, stats, key)

        def env_step(carry, _):
            params, es, obs, stats, key = carry
            key, ka, ke = jax.random.split(key, 3)
            logits, _, v = net.apply(params, obs)
            a = jax.random.categorical(ka, logits).astype(jnp.int32)
            lp = ppo.policy_log_prob(True, logits, None, a)
            nobs, es, r, term, trunc, _ = step(jax.random.split(ke, N), es, a, env_params)
            done = term | trunc
            stats = stats.update(r.astype(jnp.float32), done)
            return (params, es, nobs, stats, key), (obs, a, lp, v, r.astype(jnp.float32), done)

        def loss_fn(params, b):
            obs, a, lp_old, v_old, adv, ret = b
            logits, _, v = net.apply(params, obs)
            lp = ppo.policy_log_prob(True, logits, None, a)
            ent = ppo.policy_entropy(True, logits, None).mean()
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            ratio = jnp.exp(lp - lp_old)
            pl = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - config.clip_eps, 1 + config.clip_eps) * adv).mean()
            vc = v_old + jnp.clip(v - v_old, -config.clip_eps, config.clip_eps)
            vl = 0.5 * jnp.maximum((v - ret) ** 2, (vc - ret) ** 2).mean()
            return pl + config.vf_coef * vl - config.ent_coef * ent

        def update_one(runner, _):
            ts, es, obs, stats, key = runner
            (_, es, obs, stats, key), (o, a, lp, v, r, d) = lax.scan(env_step, (ts.params, es, obs, stats, key), None, T)
            lv = net.apply(ts.params, obs, method=ppo.ActorCritic.value)

            def g(carry, x):
                gae_next, v_next = carry
                r_t, v_t, d_t = x
                delta = r_t + config.gamma * v_next * (1 - d_t) - v_t
                gae_t = delta + config.gamma * config.gae_lambda * (1 - d_t) * gae_next
                return (gae_t, v_t), gae_t

            _, adv = lax.scan(g, (jnp.zeros(N), lv), (r, v, d), reverse=True)
            batch = (o, a, lp, v, adv, adv + v)

            def epoch(c, _):
                ts, key = c
                key, kp = jax.random.split(key)
                perm = jax.random.permutation(kp, T * N)
                mbs = jax.tree.map(lambda x: x.reshape(T * N, *x.shape[2:])[perm].reshape(config.num_minibatches, -1, *x.shape[2:]), batch)

                def mb(ts, b):
                    l, gr = jax.value_and_grad(loss_fn)(ts.params, b)
                    return ts.apply_gradients(grads=gr), l

                ts, l = lax.scan(mb, ts, mbs)
                return (ts, key), l

            (ts, key), l = lax.scan(epoch, (ts, key), None, config.update_epochs)
            m = {"return_mean": stats.mean_return(), "episodes": stats.count, "loss": l.mean(),
                 "policy_loss": l.mean(), "value_loss": l.mean(), "entropy": l.mean()}
            return (ts, es, obs, stats, key), m

        run_chunk = jax.vmap(lambda r: lax.scan(update_one, r, None, config.chunk))
        return ppo.Trainer(config=config, init=jax.vmap(init_one), run_chunk=run_chunk, train=None, network=net)

    return make_train


def main():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3, 1 with --quick)")
    args = p.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    total = 50_000 if args.quick else TOTAL
    header(BENCH, args.quick, total_env_steps=total)
    ppo = load_example()
    impls = {"ours": lambda seed: example_run(ppo, ppo.make_train, total, seed),
             "shared-driver": lambda seed: example_run(ppo, shared_driver_train(ppo), total, seed),
             "plain-ppo": lambda seed: plain_ppo(total, seed)}
    runs = {name: [] for name in impls}
    for rep in range(reps):
        for name, fn in (list(impls.items())[rep % 3:] + list(impls.items())[: rep % 3]):
            r = fn(rep)
            r["train_s_to_475"] = None if r["wall_s_to_475"] is None else r["wall_s_to_475"] - r["compile_s"]
            runs[name].append(r)
    med = {}
    for name, rs in runs.items():
        wall = [r["wall_s_to_475"] for r in rs]
        med[name] = {"compile_s": statistics.median(r["compile_s"] for r in rs),
                     "compile_cpu_s": statistics.median(r["compile_cpu_s"] for r in rs),
                     "env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in rs),
                     "wall_s_to_475": statistics.median(wall) if None not in wall else None,
                     "train_s_to_475": statistics.median(r["train_s_to_475"] for r in rs) if None not in wall else None,
                     "final_return": statistics.median(r["final_return"] for r in rs)}
    for name, m in med.items():
        a = None if name == "plain-ppo" else "plain-ppo"
        for metric in ("wall_s_to_475", "compile_s", "compile_cpu_s", "train_s_to_475", "env_steps_per_s"):
            sec = (1 / m[metric]) if metric == "env_steps_per_s" else m[metric]
            ref = med["plain-ppo"][metric]
            ref_sec = None if ref is None else ((1 / ref) if metric == "env_steps_per_s" else ref)
            extra = {"time_ratio": round(sec / ref_sec, 4) if a and sec and ref_sec else None}
            if name == "ours":
                sd = med["shared-driver"][metric]
                sd_sec = None if sd is None else ((1 / sd) if metric == "env_steps_per_s" else sd)
                extra["time_ratio_vs_shared_driver"] = round(sec / sd_sec, 4) if sec and sd_sec else None
            row(BENCH, f"cartpole/{metric}", name, sec, n=total, repeats=reps,
                unit="env steps/s" if metric == "env_steps_per_s" else "s", anchor=a,
                anchor_seconds=ref_sec if a else None, final_return=m["final_return"],
                runs=[r[metric] for r in runs[name]], seeds=list(range(reps)), **extra)


if __name__ == "__main__":
    main()
