"""JAX <-> torch hand-off: jaxbuffers.interop.torch vs the numpy route, same process.

Batch: an Atari sample, uint8 [256, 84, 84, 4] (7.2 MB), as one array and as a replay-style tree
(obs, next_obs uint8 [256, 84, 84, 4]; action int32 [256]; reward float32 [256]; done bool [256]).
Cases (median wall time per call; ratio = anchor time / ours, >1 means ours is faster):
  * to_torch            vs torch.from_numpy(np.asarray(x))        (both zero copy on CPU)
  * to_torch(copy=True) vs torch.from_numpy(np.array(x))          (both one copy)
  * from_torch          vs jnp.asarray(t.numpy())                 (ours zero copy; anchor copies)
  * from_torch(copy=True) vs jnp.asarray(t.numpy())               (both one copy)
  * from_torch of a torch.from_numpy tensor (16-byte aligned: JAX copies it) vs the same anchor
``_common`` rows (``impl`` ours / numpy-route), timed interleaved; each row also says whether the
result shares memory with its source (``zero_copy``).

Run: python benchmarks/bench_torch_interop.py [--quick]
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, interleaved, parser, row  # noqa: E402

import torch  # noqa: E402

from jaxbuffers.interop.torch import from_torch, to_torch  # noqa: E402

# the anchor's torch.from_numpy on a read-only view of a JAX buffer warns on every call
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def jax_ptr(x) -> int:
    return x.unsafe_buffer_pointer()


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    repeats = args.repeats or (20 if args.quick else 200)
    header("torch_interop", args.quick)

    key = jax.random.key(0)
    obs = jax.random.randint(key, (256, 84, 84, 4), 0, 256, jnp.int32).astype(jnp.uint8)
    tree = {
        "obs": obs,
        "next_obs": jnp.roll(obs, 1, axis=0),
        "action": jnp.arange(256, dtype=jnp.int32),
        "reward": jnp.linspace(0, 1, 256, dtype=jnp.float32),
        "done": jnp.arange(256) % 7 == 0,
    }
    jax.block_until_ready(tree)
    # torch-allocated tensors (64-byte aligned, as a torch model's outputs are); the numpy-backed
    # case shows the copy JAX makes for 16-byte-aligned numpy memory
    t_obs = torch.empty(obs.shape, dtype=torch.uint8).copy_(torch.from_numpy(np.asarray(obs)))
    t_tree = {k: to_torch(v, copy=False).clone() for k, v in tree.items()}
    t_np = torch.from_numpy(np.array(obs))

    def to_np_tree(tr, conv):
        return {k: conv(v) for k, v in tr.items()}

    cases = [
        # name, ours, anchor, shares memory (ours, anchor)
        ("to_torch/array", lambda: to_torch(obs), lambda: torch.from_numpy(np.asarray(obs)),
         lambda o: o.data_ptr() == jax_ptr(obs), lambda a: a.data_ptr() == jax_ptr(obs)),
        ("to_torch/tree", lambda: to_torch(tree), lambda: to_np_tree(tree, lambda v: torch.from_numpy(np.asarray(v))),
         lambda o: o["obs"].data_ptr() == jax_ptr(obs), lambda a: a["obs"].data_ptr() == jax_ptr(obs)),
        ("to_torch_copy/array", lambda: to_torch(obs, copy=True), lambda: torch.from_numpy(np.array(obs)),
         lambda o: o.data_ptr() == jax_ptr(obs), lambda a: a.data_ptr() == jax_ptr(obs)),
        ("from_torch/array", lambda: from_torch(t_obs), lambda: jnp.asarray(t_obs.numpy()),
         lambda o: jax_ptr(o) == t_obs.data_ptr(), lambda a: jax_ptr(a) == t_obs.data_ptr()),
        ("from_torch/tree", lambda: from_torch(t_tree), lambda: to_np_tree(t_tree, lambda v: jnp.asarray(v.numpy())),
         lambda o: jax_ptr(o["obs"]) == t_tree["obs"].data_ptr(), lambda a: jax_ptr(a["obs"]) == t_tree["obs"].data_ptr()),
        ("from_torch/numpy_backed", lambda: from_torch(t_np), lambda: jnp.asarray(t_np.numpy()),
         lambda o: jax_ptr(o) == t_np.data_ptr(), lambda a: jax_ptr(a) == t_np.data_ptr()),
        ("from_torch_copy/array", lambda: from_torch(t_obs, copy=True), lambda: jnp.asarray(t_obs.numpy()),
         lambda o: jax_ptr(o) == t_obs.data_ptr(), lambda a: jax_ptr(a) == t_obs.data_ptr()),
    ]
    for name, ours, anchor, ours_shared, anchor_shared in cases:
        block = jax.block_until_ready
        times = interleaved({"ours": lambda: block(ours()), "numpy-route": lambda: block(anchor())}, repeats)
        nbytes = int(obs.size) * (2 if "tree" in name else 1)
        row("torch_interop", name, "numpy-route", times["numpy-route"], n=1, repeats=repeats, items=nbytes / 1e6, unit="MB/s",
            zero_copy=bool(anchor_shared(anchor())))
        row("torch_interop", name, "ours", times["ours"], n=1, repeats=repeats, items=nbytes / 1e6, unit="MB/s",
            anchor="numpy-route", anchor_seconds=times["numpy-route"], zero_copy=bool(ours_shared(ours())))


if __name__ == "__main__":
    main()
