"""Save and restore of large buffers: `jaxbuffers.save` / `restore` against `np.save` / `np.load` and flashbax's Vault.

Cases, side by side in one process, the same arrays written to the same disk (a temporary folder, `--dir`):

* `uncompressed`: a `ReplayBuffer` of `--gb` GB (default 1) of real Atari items (`obs` uint8 [4, 84, 84] stacks
  cycled from `shared/data/atari_rollouts.npz`, int32 action, float32 reward).
* `compressed`: a `CompressedTrajectoryBuffer` (frame dedup, zstd:-1 with its dictionary) of `--steps` (default
  1,000,000) of the recorded Breakout steps, cycled: device ids plus host arenas.

Implementations, each timed `--repeats` times interleaved (median reported), every timed call preceded by an
untimed `os.sync()` (after a trim of freed memory and the end of the background deletion of the checkpoint a save
replaced) so that none pays for the disk writes another left behind:

* `ours`: `jaxbuffers.save` (host-store export, each array written from its memory in orbax's layout and hashed
  (xxh3-64) as written (a file over 8 MB: hashed by a second thread during the write, and its written blocks handed
  to the disk meanwhile, a sync started every 8 MB, one at a time), one fsync per file, manifest, atomic rename) and
  `jaxbuffers.restore` (every file checked against its checksum, each array's bytes copied once into the memory the
  restored array owns and hashed there; host payloads read straight into the arena chunks the restored store keeps).
* `ours-async` (case `save_blocking`): the time `jaxbuffers.save(..., blocking=False)` blocks the caller (the
  snapshot of the buffer; the write then runs in a background thread and is waited for, untimed, before the next
  repetition), beside the `np.save` median of the same run.
* `np.save`: `np.save` of every array of the buffer (for the compressed buffer: its device arrays and the host
  stores' `export_state` arrays, the export included in the timing) and `np.save+fsync` (the same, then fsync of
  every file: what `ours` guarantees; `np.save` alone leaves the files in the page cache); their restore rows are
  `np.load` + `jax.device_put`.
* `flashbax-vault`: `Vault.write` / `Vault.read` of the same item arrays (uncompressed case only: a Vault holds
  device arrays, not a host store), with its default compression (gzip level 5) and with zstd level 1.

Restores read files the preceding save left in the page cache, for every implementation alike. Throughput is GB/s
of array bytes (the buffer's device arrays plus, compressed, the host bytes written). Ratio: anchor time / ours
(anchor `np.save+fsync` for saves, `np.load` for restores; > 1: ours is faster); `save_vs_np.save` is ours' save
rate over `np.save`'s. `fill_s` and `size`: the time to fill the buffer and the bytes saved.

Usage: python benchmarks/bench_checkpoint.py [--quick] [--gb 1.0] [--steps 1000000] [--dir PATH]
       [--case all|uncompressed|compressed]
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import compare, data_file, emit, header, interleaved, parser  # noqa: E402

import jaxbuffers as jb  # noqa: E402

BENCH = "checkpoint"
DATA = data_file("atari_rollouts.npz")


def recorded(game: str = "breakout"):
    with np.load(DATA) as d:
        frames = d[f"{game}_frames"]
        ends = d[f"{game}_terminated"] | d[f"{game}_truncated"]
        ends[-1] = True  # the recording is cycled: its first step starts an episode again
        return frames, d[f"{game}_obs_idx"], d[f"{game}_actions"].astype(np.int32), d[f"{game}_rewards"], ends


def uncompressed_buffer(gb: float):
    frames, obs_idx, act, rew, _ = recorded()
    item = {"obs": jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    capacity = int(gb * 1e9) // (4 * 84 * 84 + 8)
    buf = jb.ReplayBuffer.create(item, capacity=capacity)
    add = jax.jit(jb.ReplayBuffer.add, donate_argnums=0)
    chunk, n = 1000, len(obs_idx)
    for a in range(0, capacity, chunk):
        b = min(chunk, capacity - a)
        idx = (np.arange(a, a + b) % n)
        buf = add(buf, {"obs": jnp.asarray(frames[obs_idx[idx]]), "action": jnp.asarray(act[idx]), "reward": jnp.asarray(rew[idx])})
    return jax.block_until_ready(buf)


def compressed_buffer(steps: int):
    frames, obs_idx, act, rew, term = recorded()
    ex = {"obs": jax.ShapeDtypeStruct((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = jb.CompressedTrajectoryBuffer.create(ex, num_envs=1, length=steps, frame_stack=4, final_obs_capacity=2)
    add = jax.jit(lambda b, s, t: b.add(s, terminated=t), donate_argnums=0)
    chunk, n = 500, len(obs_idx)
    for a in range(0, steps, chunk):
        idx = np.arange(a, min(a + chunk, steps)) % n
        step = {"obs": jnp.asarray(frames[obs_idx[idx]][None]), "action": jnp.asarray(act[idx][None]), "reward": jnp.asarray(rew[idx][None])}
        buf = add(buf, step, jnp.asarray(term[idx][None]))
    return jax.block_until_ready(buf)


def arrays_of(buf) -> dict:
    """Every array the buffer's checkpoint holds, as numpy (host-store exports for a compressed buffer)."""
    out = {f"leaf{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(buf))}
    if hasattr(buf, "host"):
        for i, s in enumerate(buf.host.stores):
            out.update({f"store{i}_{k}": a for k, a in s.export_state()[1].items()})
        out["slot_version"] = buf.host.slot_version
    return out


def fsync_all(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def settle() -> None:
    """Untimed, before every timed call: free what the previous call left (glibc keeps freed memory of its threads'
    arenas until trimmed: without it the Vault and tensorstore runs pile up gigabytes), wait for the deletion of the
    checkpoint a save replaced (a background thread of `jaxbuffers.save`) and sync the disk, so that no call pays for
    the work another left."""
    for t in threading.enumerate():
        if t.name == "jaxbuffers-remove-old":
            t.join()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    os.sync()


def run_case(case: str, buf, root: Path, repeats: int, vault: bool) -> None:
    nbytes = sum(a.nbytes for a in arrays_of(buf).values())
    folder = lambda name: root / case / name  # noqa: E731

    def fresh(name):
        p = folder(name)
        shutil.rmtree(p, ignore_errors=True)
        p.mkdir(parents=True)
        return p

    def np_save(sync):
        def run():
            p = fresh("np")
            for k, a in arrays_of(buf).items():
                np.save(p / f"{k}.npy", a)
            if sync:
                fsync_all(p)
        return run

    def np_load():
        p = folder("np")
        out = [np.load(f) for f in sorted(p.iterdir())]
        jax.block_until_ready([jax.device_put(a) for a in out if a.ndim])

    saves = {"ours": lambda: jb.save(folder("ours"), buf, progress=False), "np.save+fsync": np_save(True), "np.save": np_save(False)}
    restores = {"ours": lambda: jax.block_until_ready(jb.restore(folder("ours"), progress=False)), "np.load": np_load}
    if vault:
        from flashbax.buffers.trajectory_buffer import TrajectoryBufferState
        from flashbax.vault import Vault

        n = buf.capacity
        state = TrajectoryBufferState(experience=jax.tree.map(lambda x: x[None], buf.storage), current_index=jnp.int32(n), is_full=jnp.bool_(True))
        for name, comp in (("flashbax-vault", None), ("flashbax-vault-zstd1", {"id": "zstd", "level": 1})):
            def write(name=name, comp=comp):
                shutil.rmtree(folder(name), ignore_errors=True)
                with contextlib.redirect_stdout(io.StringIO()):  # Vault prints on create and load
                    v = Vault("v", experience_structure=state.experience, rel_dir=str(folder(name)), vault_uid="x", compression=comp)
                    v.write(state, source_interval=(0, n))

            def read(name=name):
                with contextlib.redirect_stdout(io.StringIO()):
                    st = Vault("v", rel_dir=str(folder(name)), vault_uid="x").read()
                jax.block_until_ready(st.experience)

            saves[name], restores[name] = write, read
    gb = nbytes / 1e9
    emit({"bench": BENCH, "case": f"{case}/size", "impl": "ours", "value": round(gb, 4), "unit": "GB of arrays"})
    t_save = interleaved(saves, repeats, setup=settle)
    compare(BENCH, f"{case}/save", {k: t_save[k] for k in ("np.save+fsync", "ours", "np.save", *[k for k in t_save if "vault" in k])},
            "np.save+fsync", n=1, repeats=repeats, items=gb, unit="GB/s")
    t_restore = interleaved(restores, repeats, setup=settle)
    compare(BENCH, f"{case}/restore", t_restore, "np.load", n=1, repeats=repeats, items=gb, unit="GB/s")
    ratio = t_save["np.save"] / t_save["ours"]
    emit({"bench": BENCH, "case": f"{case}/save_vs_np.save", "impl": "ours", "value": round(ratio, 3), "unit": "x np.save rate"})
    blocked = []  # save(blocking=False): the time until the training loop may go on (the write then runs behind it)
    for _ in range(repeats):
        settle()
        t0 = time.perf_counter()
        pending = jb.save(folder("ours-async"), buf, progress=False, blocking=False)
        blocked.append(time.perf_counter() - t0)
        pending.wait()
    compare(BENCH, f"{case}/save_blocking", {"np.save": t_save["np.save"], "ours-async": statistics.median(blocked)}, "np.save",
            n=1, repeats=repeats, items=gb, unit="GB/s")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=1.0, help="size of the uncompressed buffer")
    p.add_argument("--steps", type=int, default=1_000_000, help="steps of the compressed buffer")
    p.add_argument("--dir", default=None, help="folder to write in (default: a temporary folder)")
    p.add_argument("--case", choices=("all", "uncompressed", "compressed"), default="all", help="run only this case")
    args = p.parse_args()
    gb, steps = (0.05, 20_000) if args.quick else (args.gb, args.steps)
    repeats = args.repeats or (1 if args.quick else 5)
    header(BENCH, args.quick, gb=gb, steps=steps)
    if DATA is None:
        emit({"bench": BENCH, "case": "all", "impl": "ours", "skipped": "shared/data/atari_rollouts.npz not found"})
        return
    root = Path(tempfile.mkdtemp(prefix="jaxbuffers-bench-", dir=args.dir))
    try:
        if args.case in ("all", "uncompressed"):
            t0 = time.perf_counter()
            buf = uncompressed_buffer(gb)
            emit({"bench": BENCH, "case": "uncompressed/fill_s", "impl": "ours", "value": round(time.perf_counter() - t0, 2), "unit": "s"})
            run_case("uncompressed", buf, root, repeats, vault=True)
            del buf
            shutil.rmtree(root / "uncompressed", ignore_errors=True)
        if args.case == "uncompressed":
            return
        t0 = time.perf_counter()
        buf = compressed_buffer(steps)
        emit({"bench": BENCH, "case": "compressed/fill_s", "impl": "ours", "value": round(time.perf_counter() - t0, 2), "unit": "s",
              "steps": steps, "host_bytes_per_step": round(buf.host_nbytes / steps, 1)})
        run_case("compressed", buf, root, repeats, vault=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
