"""PPO example throughput: examples/ppo_gymnax.py (RolloutBuffer + gae, truncation bootstrap) vs a
buffer-free PureJaxRL-style anchor (scan outputs as storage, inline GAE, time limits treated as
terminal, so no critic pass on the final observation). Same network, loss, optimiser, metric and
driver (``ppo_gymnax.run``); repetitions alternate in one process. One JSON line per run, then one
per metric with medians and the ratio ours / anchor.

Run: python benchmarks/bench_ppo.py [--reps 3] [--seeds 1]
"""

import argparse
import importlib.util
import json
import pathlib
import statistics
import sys

import gymnax
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState
from jax import lax

_EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "ppo_gymnax.py"
spec = importlib.util.spec_from_file_location("ppo_gymnax", _EXAMPLE)
ppo = importlib.util.module_from_spec(spec)
sys.modules["ppo_gymnax"] = ppo
spec.loader.exec_module(ppo)
ours_make_train = ppo.make_train

def anchor_make_train(config):
    env, env_params = gymnax.make(config.env_name)
    n_act = env.action_space(env_params).n
    net = ppo.ActorCritic(action_dim=n_act, discrete=True, hidden=config.hidden)
    N, T = config.num_envs, config.num_steps
    gs = config.update_epochs * config.num_minibatches
    sched = lambda c: config.lr * (1.0 - (c // gs) / config.num_updates)
    tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(sched, eps=1e-5))
    reset = jax.vmap(env.reset, in_axes=(0, None)); step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

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
        nobs, es, r, term, trunc, info = step(jax.random.split(ke, N), es, a, env_params)
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

    init = jax.vmap(init_one)
    run_chunk = jax.vmap(lambda r: lax.scan(update_one, r, None, config.chunk))
    return ppo.Trainer(config=config, init=init, run_chunk=run_chunk, train=None, network=net)

ap = argparse.ArgumentParser(); ap.add_argument("--reps", type=int, default=3); ap.add_argument("--seeds", type=int, default=1)
args = ap.parse_args()
res = {"ours": [], "anchor": []}
for rep in range(args.reps):
    for name, mk in (("ours", ours_make_train), ("anchor", anchor_make_train)):
        for seed in range(args.seeds):
            ppo.make_train = mk
            s = ppo.run(ppo.PPOConfig(seed=seed), 475.0, None, log=lambda x: None)
            row = {"case": name, "rep": rep, "seed": seed, "compile_s": round(s["compile_s"], 2), "train_s": round(s["train_s"], 2),
                   "steps_per_s": round(s["steps_per_s"]), "median_chunk_steps_per_s": round(s["median_chunk_steps_per_s"]), "steps_to_475": s["seeds"][0]["steps_to_target"],
                   "wall_s_to_475": s["seeds"][0]["wall_s_to_target"] and round(s["seeds"][0]["wall_s_to_target"], 2),
                   "final_return": s["seeds"][0]["final_return"]}
            res[name].append(row); print(json.dumps(row), flush=True)
for k in ("compile_s", "steps_per_s", "median_chunk_steps_per_s", "train_s", "wall_s_to_475"):
    o = statistics.median(r[k] for r in res["ours"]); a = statistics.median(r[k] for r in res["anchor"])
    print(json.dumps({"metric": k, "ours_median": o, "anchor_median": a, "ratio_ours_over_anchor": round(o / a, 3)}))
