"""Episode storage: `jaxbuffers.EpisodeBuffer` against memmap-replay-buffer's dataloader and TorchRL's
`SliceSampler`, on the same episodes in one process.

Data: 1,000 episodes (``--quick``: 100) of lengths drawn uniformly in [50, 200] (seed 0), steps of obs f32[17],
action f32[6] and reward f32, stored whole in each implementation (jaxbuffers: `max_timesteps=200`; memmap-replay-
buffer: `max_timesteps=200` in a temporary folder; TorchRL: a `LazyTensorStorage` of the steps with an episode id).
Cases, one sampled batch per operation, one jitted call from Python for jaxbuffers (as a dataloader's batch):

* ``episodes/batch=32``: whole episodes padded to 200 steps with mask and lengths; anchor memmap-replay-buffer's
  ``dataloader(batch_size=32, shuffle=True)`` (trajectory level, ``_lens``). Episodes/s.
* ``transitions_n3/batch=256``: 3-step transitions cut at episode ends; anchor memmap-replay-buffer's
  ``dataloader(batch_size=256, n_steps=3, shuffle=True)``. jaxbuffers also computes the n-step return and
  discount. Transitions/s.
* ``sequences/batch=256/seq=32``: 256 windows of 32 steps inside one episode; anchor TorchRL's
  ``SliceSampler(slice_len=32, traj_key="episode", strict_length=True, cache_values=True)`` (a batch of
  256 * 32 steps). Sequences/s.

The first two cases are also run against TorchRL (the rows with ``"anchor": "torchrl"``):

* whole episodes: a ``ReplayBuffer`` over a ``LazyTensorStorage`` of episodes, each a TensorDict of 200 steps padded
  with zeros plus ``mask`` and ``length`` (TorchRL's trajectory-level storage), sampling 32 with its default
  ``RandomSampler``;
* 3-step transitions: ``SliceSampler(slice_len=3, traj_key="episode", strict_length=True, cache_values=True)``
  (256 windows of 3 steps inside one episode) and the 3-step discounted return of each window computed in torch.
  Its windows never reach an episode's end, so it never cuts a return there (jaxbuffers cuts and bootstraps at the
  end, and samples every step): TorchRL does slightly less work per transition.

memmap-replay-buffer's loaders iterate a shuffled epoch (without replacement); jaxbuffers and TorchRL draw with
replacement. Each row's ``median_us`` is the time of one batch.

Run: python benchmarks/bench_episodes.py [--quick] [--repeats N]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import compare, header, interleaved, parser, versions  # noqa: E402

import jaxbuffers as jb  # noqa: E402

BENCH = "episodes"
MAX_T = 200
OBS, ACT = 17, 6


def make_episodes(num: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for n in rng.integers(50, MAX_T + 1, size=num):
        out.append({"obs": rng.normal(size=(n, OBS)).astype(np.float32), "action": rng.normal(size=(n, ACT)).astype(np.float32),
                    "reward": rng.normal(size=n).astype(np.float32)})
    return out


def ours(episodes):
    """The only place this benchmark touches the jaxbuffers API: a filled buffer and jitted samplers."""
    step = {k: v[0] for k, v in episodes[0].items()}
    buf = jb.EpisodeBuffer.create(step, max_episodes=len(episodes), max_timesteps=MAX_T)
    lengths = np.array([len(e["reward"]) for e in episodes], np.int32)
    pad = lambda x: np.concatenate([x, np.zeros((MAX_T - len(x), *x.shape[1:]), x.dtype)])  # noqa: E731
    stacked = {k: np.stack([pad(e[k]) for e in episodes]) for k in step}
    final = np.zeros((len(episodes), OBS), np.float32)
    buf = buf.add_episodes(stacked, lengths, terminated=np.ones(len(episodes), bool), final_obs=final)
    fns = {
        "episodes": jax.jit(lambda b, k: b.sample_episodes(k, 32)),
        "transitions": jax.jit(lambda b, k: b.sample_transitions(k, 256, n_step=3, gamma=0.99)),
        "sequences": jax.jit(lambda b, k: b.sample_sequences(k, 256, 32)),
    }
    keys = iter(jax.random.split(jax.random.key(0), 1_000_000))
    return {name: (lambda f=f, per=1: jax.block_until_ready([f(buf, next(keys)) for _ in range(per)])) for name, f in fns.items()}


def memmap(episodes, folder):
    from memmap_replay_buffer import ReplayBuffer

    rb = ReplayBuffer(folder, max_episodes=len(episodes), max_timesteps=MAX_T,
                      fields=dict(obs=("float", (OBS,)), action=("float", (ACT,)), reward="float"), overwrite=True)
    for e in episodes:
        rb.store_episode(**e)
    rb.flush()

    def loop(loader):
        it = [iter(loader)]

        def run(per=1):
            for _ in range(per):
                try:
                    next(it[0])
                except StopIteration:
                    it[0] = iter(loader)
                    next(it[0])

        return run

    return {"episodes": loop(rb.dataloader(batch_size=32, shuffle=True)),
            "transitions": loop(rb.dataloader(batch_size=256, n_steps=3, shuffle=True))}


def torchrl(episodes):
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler

    n = sum(len(e["reward"]) for e in episodes)
    pad = lambda x: np.concatenate([x, np.zeros((MAX_T - len(x), *x.shape[1:]), x.dtype)])  # noqa: E731
    lengths = np.array([len(e["reward"]) for e in episodes])
    whole = TensorDict({
        **{k: torch.from_numpy(np.stack([pad(e[k]) for e in episodes])) for k in ("obs", "action", "reward")},
        "mask": torch.from_numpy(np.arange(MAX_T)[None, :] < lengths[:, None]), "length": torch.from_numpy(lengths),
    }, batch_size=[len(episodes)])
    episodes_rb = ReplayBuffer(storage=LazyTensorStorage(len(episodes)), batch_size=32)
    episodes_rb.extend(whole)
    td = TensorDict({
        "obs": torch.from_numpy(np.concatenate([e["obs"] for e in episodes])),
        "action": torch.from_numpy(np.concatenate([e["action"] for e in episodes])),
        "reward": torch.from_numpy(np.concatenate([e["reward"] for e in episodes])),
        "episode": torch.from_numpy(np.concatenate([np.full(len(e["reward"]), i) for i, e in enumerate(episodes)])),
    }, batch_size=[n])
    rb = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=256 * 32,
                      sampler=SliceSampler(slice_len=32, traj_key="episode", strict_length=True, cache_values=True))
    rb.extend(td)
    nstep_rb = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=256 * 3,
                            sampler=SliceSampler(slice_len=3, traj_key="episode", strict_length=True, cache_values=True))
    nstep_rb.extend(td)
    discounts = torch.tensor([1.0, 0.99, 0.99**2])

    def repeat(fn):
        def run(per=1):
            for _ in range(per):
                fn()

        return run

    def nstep():
        s = nstep_rb.sample()
        return s, (s["reward"].view(256, 3) * discounts).sum(-1)

    return {"sequences": repeat(rb.sample), "episodes": repeat(episodes_rb.sample), "transitions": repeat(nstep)}


def main():
    args = parser(__doc__.splitlines()[0]).parse_args()
    num = 100 if args.quick else 1_000
    repeats = args.repeats or (3 if args.quick else 7)
    per = 3 if args.quick else 20
    header(BENCH, args.quick, episodes=num, max_timesteps=MAX_T, anchors=versions("memmap-replay-buffer", "torchrl", "tensordict"))
    episodes = make_episodes(num)
    with tempfile.TemporaryDirectory() as folder:
        ours_fns, memmap_fns, torchrl_fns = ours(episodes), memmap(episodes, folder), torchrl(episodes)
        cases = [
            ("episodes/batch=32", "episodes", 32, "memmap-replay-buffer", memmap_fns),
            ("transitions_n3/batch=256", "transitions", 256, "memmap-replay-buffer", memmap_fns),
            ("sequences/batch=256/seq=32", "sequences", 256, "torchrl", torchrl_fns),
            ("episodes/batch=32", "episodes", 32, "torchrl", torchrl_fns),
            ("transitions_n3/batch=256", "transitions", 256, "torchrl", torchrl_fns),
        ]
        for case, name, items, anchor, other in cases:
            unit = f"{name}/s"
            runs = {"ours": lambda f=ours_fns[name]: f(per=per), anchor: lambda f=other[name]: f(per=per)}
            times = interleaved(runs, repeats, per=per)
            compare(BENCH, case, times, anchor, n=per, repeats=repeats, items=items, unit=unit)


if __name__ == "__main__":
    main()
