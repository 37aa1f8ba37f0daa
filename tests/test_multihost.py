"""Two processes on localhost through `jax.distributed` (CPU, 2 devices each): one sharded buffer over 4 devices,
each process adding its own rows, global sampling drawing across both processes; a compressed buffer whose shards'
host stores live in the process of their devices.

Run as a script, this file is one of the two processes (`python test_multihost.py CASE PROCESS_ID PORT OUT_DIR`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ADDS, ROWS, CAPACITY, DRAWS = 3, 4, 8, 256  # per add, each process gives ROWS rows to each of its 2 shards


def _priority(ids: np.ndarray) -> np.ndarray:
    """Priorities of the prioritised case (alpha 0.6, the default): 1 to 7 by id."""
    return (np.asarray(ids) % 7 + 1).astype(np.float32)


def _device_buffers(pid: int, mesh, out_dir: str) -> dict:
    import jax
    import jax.numpy as jnp

    import jaxbuffers as jb

    item = {"obs": jnp.zeros((2,), jnp.float32), "id": jnp.int32(0)}
    result = {"pid": pid}
    for kind, make in (("uniform", jb.ReplayBuffer), ("prioritised", jb.PrioritisedReplayBuffer)):
        buf = jb.ShardedBuffer.create(lambda make=make: make.create(item, capacity=CAPACITY), mesh, "data")
        add = jax.jit(jb.ShardedBuffer.add, donate_argnums=0)
        for a in range(ADDS):
            ids = pid * 1_000 + a * 2 * ROWS + np.arange(2 * ROWS, dtype=np.int32)  # this process's rows
            batch = buf.local_batch({"obs": np.stack([ids, -ids], 1).astype(np.float32), "id": ids})
            extra = (buf.local_batch(_priority(ids)),) if kind == "prioritised" else ()
            buf = add(buf, batch, *extra)
        draw = jax.jit(lambda b, keys: jax.lax.map(lambda k: b.sample(k, DRAWS).sample.item, keys))
        out = draw(buf, jax.random.split(jax.random.key(0), 40))  # replicated: every process reads it whole
        ids, obs = (np.asarray(x.addressable_data(0)) for x in (out["id"], out["obs"]))
        assert np.array_equal(obs[..., 0], ids) and np.array_equal(obs[..., 1], -ids), "torn rows"
        result[kind] = ids.ravel().tolist()
        result["size"] = int(buf.size())
    envs = 2 * ROWS  # a rollout of ROWS envs per shard: an eager epoch after its GAE, the flag spread over both processes
    roll = jb.ShardedBuffer.create(lambda: jb.RolloutBuffer.create(item, num_envs=ROWS, num_steps=ADDS), mesh, "data")
    add = jax.jit(lambda b, s, f, d: b.add(s, reward=f, value=f, terminated=d))
    for a in range(ADDS):
        ids = pid * 1_000 + a * envs + np.arange(envs, dtype=np.int32)
        step = roll.local_batch({"obs": np.stack([ids, -ids], 1).astype(np.float32), "id": ids})
        roll = add(roll, step, roll.local_batch(np.ones(envs, np.float32)), roll.local_batch(np.zeros(envs, bool)))
    gae = jax.jit(lambda b, v: b.apply(lambda s, v: s.compute_gae(v, 0.9, 0.9), v))
    roll_epoch = gae(roll, roll.local_batch(np.ones(envs, np.float32))).minibatches(jax.random.key(1), 2)
    result["epoch_shape"] = list(roll_epoch.advantages.shape)
    return result



# --- a compressed trajectory buffer: E lanes, E / 4 per shard; process p adds lanes [p * E / 2, (p + 1) * E / 2) ---

E, LENGTH, PIXEL_ADDS, K = 8, 6, 9, 4
FRAME = (6, 6)


def _pixel_steps(count: int = PIXEL_ADDS):
    """`count` steps of `E` lanes: frame stacks of `K` that shift by one frame per step, reset at episode ends,
    with flags and final observations (the same in every process and in the reference)."""
    rng = np.random.default_rng(11)
    stack = np.repeat(rng.integers(0, 4, (E, 1, *FRAME), np.uint8), K, axis=1)
    for t in range(count):
        term, trunc = rng.random(E) < 0.15, rng.random(E) < 0.15
        fin = np.concatenate([stack[:, 1:], rng.integers(0, 4, (E, 1, *FRAME), np.uint8)], axis=1)
        yield ({"obs": stack.copy(), "action": np.full(E, t, np.int32), "reward": rng.standard_normal(E).astype(np.float32)},
               {"terminated": term, "truncated": trunc, "final_obs": fin})
        new = rng.integers(0, 4, (E, *FRAME), np.uint8)
        stack = np.concatenate([stack[:, 1:], new[:, None]], axis=1)
        stack[term | trunc] = new[term | trunc][:, None]


def _make_pixels(num_envs: int):
    import jax.numpy as jnp

    import jaxbuffers as jb

    step = {"obs": jnp.zeros((K, *FRAME), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    return jb.CompressedTrajectoryBuffer.create(step, num_envs=num_envs, length=LENGTH, frame_stack=K, final_obs_capacity=4)


def _pixel_adds(buf, pid: int, steps) -> object:
    """`buf` (sharded over the 4 devices) after adding this process's lanes of `steps`."""
    import jax

    import jaxbuffers as jb

    add = jax.jit(jb.ShardedBuffer.add, donate_argnums=0)
    mine = slice(pid * E // 2, (pid + 1) * E // 2)
    for step, kw in steps:
        buf = add(buf, buf.local_batch({k: v[mine] for k, v in step.items()}), **{k: buf.local_batch(v[mine]) for k, v in kw.items()})
    return buf


def _pixel_record(buf, prefix: str = "") -> dict:
    """A global sample of `buf` (whole: it is replicated) and this process's shards' observations decoded in logical
    order, as numpy arrays by name."""
    import jax

    tr = jax.jit(lambda b, k: b.sample(k, 64, method="sample_transitions", n_step=2, gamma=0.9))(buf, jax.random.key(3))
    arrays = {prefix + jax.tree_util.keystr(p): np.asarray(x.addressable_data(0)) for p, x in jax.tree_util.tree_flatten_with_path(tr)[0]}
    for s, d in enumerate(buf.mesh.devices.ravel()):
        if d.process_index == jax.process_index():
            one = buf.shard(s)
            t = one.trajectory
            order = (int(t.head) - int(t.num_valid) + np.arange(int(t.num_valid))) % LENGTH
            arrays[f"{prefix}shard{s}"] = np.asarray(one.decode_obs(t.storage["obs"][:, order]))
    return arrays


def _compressed_buffer(pid: int, mesh, out_dir: str) -> dict:
    """Adds of this process's lanes, a global sample (written whole), and this process's shards decoded in logical
    order (written per shard), for the reference to compare."""
    import jaxbuffers as jb

    buf = _pixel_adds(jb.ShardedBuffer.create(lambda: _make_pixels(E // 4), mesh, "data"), pid, _pixel_steps())
    arrays = _pixel_record(buf)
    for s in range(4):
        if f"shard{s}" in arrays:
            assert buf.shards.host.shards[s].num_writes == buf.shards.host.shards[s].version == PIXEL_ADDS
    np.savez(os.path.join(out_dir, f"compressed{pid}.npz"), **arrays)
    return {"pid": pid, "size": int(buf.size()), "shards": sorted(k for k in arrays if k.startswith("shard"))}


# --- checkpoints: 2 processes save, 2 new processes restore; each records the next samples and its shards ---

def _replay_adds(buf, pid: int, adds: range):
    import jax

    import jaxbuffers as jb

    add = jax.jit(jb.ShardedBuffer.add, donate_argnums=0)
    for a in adds:
        ids = pid * 1_000 + a * 2 * ROWS + np.arange(2 * ROWS, dtype=np.int32)
        buf = add(buf, buf.local_batch({"obs": np.stack([ids, -ids], 1).astype(np.float32), "id": ids}), buf.local_batch(_priority(ids)))
    return buf


def _checkpoint(pid: int, mesh, out_dir: str, phase: str) -> dict:
    """`phase` "save": fill a prioritised replay buffer and a compressed trajectory buffer (both sharded), save them;
    "restore": restore them into new buffers. Either then records the next global samples, every leaf's rows of this
    process, its shards' observations, and the same after one more add each (written to `{phase}{pid}.npz`)."""
    import jax
    import jax.numpy as jnp

    import jaxbuffers as jb
    from jaxbuffers.sharding import _local_rows

    item = {"obs": jnp.zeros((2,), jnp.float32), "id": jnp.int32(0)}
    replay = jb.ShardedBuffer.create(lambda: jb.PrioritisedReplayBuffer.create(item, capacity=CAPACITY), mesh, "data")
    pixels = jb.ShardedBuffer.create(lambda: _make_pixels(E // 4), mesh, "data")
    steps = list(_pixel_steps(PIXEL_ADDS + 2))  # one more add after each record, then one that makes a state stale
    folders = [os.path.join(out_dir, "ck_replay"), os.path.join(out_dir, "ck_pixels")]
    if phase == "save":
        replay, pixels = _replay_adds(replay, pid, range(ADDS)), _pixel_adds(pixels, pid, steps[:PIXEL_ADDS - 1])
        for folder, buf in zip(folders, (replay, pixels)):
            assert jb.save(folder, buf) == jb.save(folder, buf)  # the second replaces the first
    else:
        replay, pixels = (jb.restore(folder, target) for folder, target in zip(folders, (replay, pixels)))
        other = jb.restore(folders[1] + "_one", jb.ShardedBuffer.create(lambda: _make_pixels(E // 4), mesh, "data"))
        one, several = _pixel_record(other), _pixel_record(pixels)  # saved by one process, restored in two
        assert sorted(one) == sorted(several) and all(np.array_equal(one[k], several[k]) for k in one)
    arrays = {}
    for j, when in enumerate(("now", "next")):
        out = jax.jit(lambda b, k: b.sample(k, DRAWS))(replay, jax.random.key(5))
        arrays.update({f"{when}.replay{jax.tree_util.keystr(p)}": np.asarray(x.addressable_data(0))
                       for p, x in jax.tree_util.tree_flatten_with_path(out)[0]})
        for i, x in enumerate(jax.tree.leaves(replay.shards) + jax.tree.leaves(pixels.shards)):
            arrays.update({f"{when}.leaf{i}.row{s}": r for s, r in _local_rows(x).items()})
        arrays.update(_pixel_record(pixels, f"{when}.pixels"))
        replay, pixels = _replay_adds(replay, pid, range(ADDS, ADDS + 1)), _pixel_adds(pixels, pid, steps[PIXEL_ADDS - 1 + j:PIXEL_ADDS + j])
    if phase == "save":  # an older state than its host stores: refused by every process before anything is written
        newer = jax.block_until_ready(_pixel_adds(jax.tree.map(jnp.copy, pixels), pid, steps[PIXEL_ADDS + 1:]))
        try:
            jb.save(os.path.join(out_dir, "ck_stale"), pixels)
            raise AssertionError("a stale state was saved")
        except jb.StaleBufferError as e:
            assert "save: this buffer state has version" in str(e) and not os.path.exists(os.path.join(out_dir, "ck_stale"))
        jb.save(os.path.join(out_dir, "ck_stale"), newer)
    np.savez(os.path.join(out_dir, f"{phase}{pid}.npz"), **arrays)
    return {"pid": pid, "size": int(replay.size()), "pixels": int(pixels.size())}


# --- every kind of save by every process: replicated buffers, blocking=False, meta defaults, an orbax manager step,
# and saves that one process fails ---

def _rows(tree) -> list[np.ndarray]:
    """Every leaf of `tree` as this process sees it: its rows of a global array (stacked), else the whole array."""
    import jax

    from jaxbuffers.sharding import _local_rows

    out = []
    for x in jax.tree.leaves(tree):
        whole = not isinstance(x, jax.Array) or x.is_fully_addressable
        out.append(np.asarray(x) if whole else np.stack([r for _, r in sorted(_local_rows(x).items())]))
    return out


def _assert_same(a, b, what: str) -> None:
    ra, rb = _rows(a), _rows(b)
    assert len(ra) == len(rb), what
    for i, (x, y) in enumerate(zip(ra, rb)):
        assert x.dtype == y.dtype and np.array_equal(x, y), f"{what}: leaf {i}"


def _raises(kind: type, call, *fragments: str) -> str:
    try:
        call()
    except kind as e:
        assert all(f in str(e) for f in fragments), (str(e), fragments)
        return str(e)
    raise AssertionError(f"expected {kind.__name__} with {fragments}")


def _collective(pid: int, mesh, out_dir: str) -> dict:
    import glob
    from pathlib import Path

    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxbuffers as jb
    from jaxbuffers import _checkpoint_processes

    def folder(name: str) -> Path:
        return Path(out_dir) / name

    def untouched(name: str, manifest: bytes) -> None:  # the previous checkpoint whole, no temporary folder left
        assert (folder(name) / "manifest.json").read_bytes() == manifest
        assert not glob.glob(str(folder(f".{name}.tmp-*"))), "a temporary folder was left"

    item = {"obs": jnp.zeros((2,), jnp.float32), "id": jnp.int32(0)}
    new_replay = lambda: jb.ShardedBuffer.create(lambda: jb.PrioritisedReplayBuffer.create(item, capacity=CAPACITY), mesh, "data")
    # One replicated buffer: every process makes the same adds; process 0 writes it, each process reads it whole.
    rep = jb.PrioritisedReplayBuffer.create(item, capacity=CAPACITY)
    for a in range(ADDS):
        ids = a * ROWS + np.arange(ROWS, dtype=np.int32)
        rep = rep.add({"obs": np.stack([ids, -ids], 1).astype(np.float32), "id": ids}, _priority(ids))
    assert jb.save(folder("rep"), rep) == folder("rep")
    back = jb.restore(folder("rep"), rep)
    _assert_same(back, rep, "replicated")
    _assert_same(back.sample(jax.random.key(1), 16), rep.sample(jax.random.key(1), 16), "replicated sample")
    # blocking=False: the buffers as of the call (the sharded one donated to later adds), committed once both wrote.
    sharded = _replay_adds(new_replay(), pid, range(ADDS))
    before = _rows(sharded)
    pending = [jb.save(folder("async_rep"), rep, blocking=False), jb.save(folder("async_sharded"), sharded, blocking=False)]
    sharded = _replay_adds(sharded, pid, range(ADDS, ADDS + 2))
    assert [p.wait(120) for p in pending] == [folder("async_rep"), folder("async_sharded")]
    _assert_same(jb.restore(folder("async_rep"), rep), rep, "blocking=False replicated")
    got = _rows(jb.restore(folder("async_sharded"), new_replay()))
    assert all(np.array_equal(x, y) for x, y in zip(got, before)), "blocking=False sharded: not the state of the call"
    # A non-sharded buffer that differs between the processes: refused by both, nothing written.
    ids = np.array([999], np.int32)
    differs = rep.add({"obs": np.zeros((1, 2), np.float32), "id": ids}, _priority(ids)) if pid == 1 else rep
    _raises(ValueError, lambda: jb.save(folder("differs"), differs), "differs between process", "ShardedBuffer")
    assert not folder("differs").exists()
    # Episode meta defaults: a target whose default differs is refused by every process, naming the field.
    step = {"obs": jnp.zeros((2,), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    episodes = lambda d: jb.ShardedBuffer.create(
        lambda: jb.EpisodeBuffer.create(step, max_episodes=2, max_timesteps=3, meta={"task": jnp.int32(d)}), mesh, "data")
    jb.save(folder("episodes"), episodes(-1))
    _raises(jb.CheckpointError, lambda: jb.restore(folder("episodes"), episodes(7)), "meta' field 'task'", "default is -1, the target's is 7")
    assert (_rows(jb.restore(folder("episodes"), episodes(-1)).shards.meta_defaults["task"])[0] == -1).all()
    # A ring cursor out of range in rows only process 1 holds (shard 3's head edited in the saved chunk): both refuse.
    jb.save(folder("cursors"), sharded)
    if pid == 0:
        from jaxbuffers import _checkpoint_files

        leaves = json.loads((folder("cursors") / "buffer.json").read_text())["leaves"]
        i = next(i for i, leaf in enumerate(leaves) if leaf["path"] == ".replay.head")
        chunks = sorted(f for f in (folder("cursors") / "arrays" / f"device.{i}").rglob("*") if f.is_file() and not f.name.startswith("."))
        assert [f.name for f in chunks] == ["0", "1", "2", "3"], chunks  # one chunk per shard
        chunks[3].write_bytes(np.array([99], "<i4").tobytes())
        _checkpoint_files._write_manifest(folder("cursors"), _checkpoint_files._Progress(False, ""))
    multihost_utils.sync_global_devices("cursor edited")
    _raises(jb.CheckpointError, lambda: jb.restore(folder("cursors"), new_replay()), "replay.head: expected a value in [0, 7], got")
    # An orbax manager step: a train state, the sharded buffer and the replicated one, saved together in the background.
    state = {"w": jax.device_put(np.arange(6, dtype=np.float32), NamedSharding(mesh, P())), "step": np.array([7], np.int32)}
    mngr = ocp.CheckpointManager(folder("run"), options=ocp.CheckpointManagerOptions(max_to_keep=2))
    before = _rows(sharded)
    mngr.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state), buffer=jb.BufferSave(sharded), replicated=jb.BufferSave(rep)))
    sharded = _replay_adds(sharded, pid, range(ADDS + 2, ADDS + 3))  # donated while the step is written
    mngr.wait_until_finished()
    out = mngr.restore(1, args=ocp.args.Composite(state=ocp.args.StandardRestore(state), buffer=jb.BufferRestore(new_replay()),
                                                  replicated=jb.BufferRestore(rep)))
    _assert_same(out.state, state, "manager: train state")
    _assert_same(out.replicated, rep, "manager: replicated buffer")
    assert all(np.array_equal(x, y) for x, y in zip(_rows(out.buffer), before)), "manager: sharded buffer"
    mngr.close()
    # One process fails to export its host stores (process 1 closed its shards' stores): both raise, nothing written.
    pixels = _pixel_adds(jb.ShardedBuffer.create(lambda: _make_pixels(E // 4), mesh, "data"), pid, _pixel_steps())
    record = _pixel_record(pixels)
    jb.save(folder("pixels"), pixels)
    manifest = (folder("pixels") / "manifest.json").read_bytes()
    if pid == 1:
        for s in (2, 3):
            pixels.shards.host.shards[s].close()
    _raises(RuntimeError, lambda: jb.save(folder("pixels"), pixels), *(["after close()"] if pid else ["process 1 could not export its host stores", "after close()", "nothing was written"]))
    untouched("pixels", manifest)
    again = _pixel_record(jb.restore(folder("pixels"), jb.ShardedBuffer.create(lambda: _make_pixels(E // 4), mesh, "data")))
    assert sorted(again) == sorted(record) and all(np.array_equal(again[k], record[k]) for k in record)
    # One process fails to write its parts (blocking=False): every process's wait raises, nothing is committed.
    manifest = (folder("async_sharded") / "manifest.json").read_bytes()
    if pid == 1:
        def full(*args, **kwargs):
            raise OSError("no space left on device")
        _checkpoint_processes.write_parts = full
    pending = jb.save(folder("async_sharded"), sharded, blocking=False)
    _raises(RuntimeError, pending.wait, "process 1 could not write its parts (OSError: no space left on device)", "nothing was committed")
    untouched("async_sharded", manifest)
    return {"pid": pid, "ok": True}


def _replicated(pid: int, mesh, out_dir: str) -> dict:
    """A replicated buffer saved in the background by both processes (process 0 writes it) and read by each."""
    import jax.numpy as jnp

    import jaxbuffers as jb

    buf = jb.ReplayBuffer.create({"obs": jnp.zeros((2,), jnp.float32)}, capacity=CAPACITY)
    buf = buf.add({"obs": np.arange(2 * ROWS, dtype=np.float32).reshape(ROWS, 2)})
    folder = os.path.join(out_dir, "replicated")
    assert jb.save(folder, buf, blocking=False).wait(60) == jb.save(folder, buf)
    _assert_same(jb.restore(folder, buf), buf, "replicated")
    return {"pid": pid, "ok": True}


def _byte_dtypes(pid: int, mesh, out_dir: str) -> dict:
    """Fields of dtypes stored as their bytes (float8_e4m3 and uint4: tensorstore names neither), in a sharded buffer
    (each process writes its parts) and in a replicated one (process 0 writes it): back bit for bit. A folder inside
    a checkpoint: refused by both processes, naming it, nothing written."""
    import jax
    import jax.numpy as jnp

    import jaxbuffers as jb

    item = {"q": jnp.zeros((2,), jnp.float8_e4m3), "u": jnp.zeros((), jnp.uint4)}
    rows = lambda n, seed: {"q": np.random.default_rng(seed).integers(0, 256, (n, 2), dtype=np.uint8).view(jnp.float8_e4m3),  # noqa: E731
                            "u": (np.arange(n) % 16).astype(jnp.uint4)}
    new = lambda: jb.ShardedBuffer.create(lambda: jb.ReplayBuffer.create(item, capacity=CAPACITY), mesh, "data")  # noqa: E731
    sharded = jax.jit(jb.ShardedBuffer.add)(new(), new().local_batch(rows(2 * ROWS, pid)))
    rep = jb.ReplayBuffer.create(item, capacity=CAPACITY).add(jax.tree.map(jnp.asarray, rows(ROWS, 7)))
    for name, buf, target in (("sharded", sharded, new()), ("rep", rep, rep)):
        jb.save(os.path.join(out_dir, name), buf)
        back = jb.restore(os.path.join(out_dir, name), target)
        for x, y in zip(_rows(back), _rows(buf)):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name
    inside = os.path.join(out_dir, "rep", "sub")
    _raises(ValueError, lambda: jb.save(inside, rep), f"is inside the checkpoint {os.path.join(out_dir, 'rep')}")
    assert not os.path.exists(inside)
    return {"pid": pid, "ok": True}


def _worker(case: str, pid: int, port: int, out_dir: str) -> None:
    import jax

    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid, initialization_timeout=120)
    assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
    mesh = jax.make_mesh((4,), ("data",))
    cases = {"device": _device_buffers, "compressed": _compressed_buffer,
             "save": lambda *a: _checkpoint(*a, "save"), "restore": lambda *a: _checkpoint(*a, "restore"),
             "collective": _collective, "replicated": _replicated, "byte_dtypes": _byte_dtypes}
    result = cases[case](pid, mesh, out_dir)
    print(json.dumps(result), flush=True)
    jax.distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _two_processes(case: str, tmp_path) -> list[dict]:
    """Run `case` in two worker processes; their JSON results (each worker's last line)."""
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")])}
    # Output to files, not pipes: a worker blocked on a full pipe would stall the other in a collective.
    logs = [(tmp_path / f"out{pid}.txt", tmp_path / f"err{pid}.txt") for pid in range(2)]
    procs = []
    for pid, (out, err) in enumerate(logs):
        with open(out, "w") as o, open(err, "w") as e:
            procs.append(subprocess.Popen([sys.executable, __file__, case, str(pid), str(port), str(tmp_path)], env=env, stdout=o, stderr=e))
    outs = []
    try:
        for p, (out, err) in zip(procs, logs):
            p.wait(timeout=300)
            assert p.returncode == 0, err.read_text()[-4000:]
            outs.append(json.loads(out.read_text().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


@pytest.mark.parametrize("text", [".ck.tmp-1-ab", "a" + "é" * 300, "a" + "€" * 200, "x" * 600])
def test_a_broadcast_text_is_cut_at_a_character_boundary(text):
    """Process 0's folder name or refusal, in one process: at most `_NAME_BYTES` bytes of utf-8, never a character
    cut in two (a refusal naming a path of accented letters)."""
    from jaxbuffers import _checkpoint_processes as processes

    got = processes._broadcast_text(text)
    assert text.startswith(got) and len(got.encode()) <= processes._NAME_BYTES
    assert len(got.encode()) > processes._NAME_BYTES - 4 if len(text.encode()) > processes._NAME_BYTES else got == text


@pytest.mark.slow  # two JAX processes on localhost; python -m pytest -m slow tests/test_multihost.py
def test_two_processes_sample_one_global_buffer(tmp_path):
    from scipy.stats import chi2

    outs = _two_processes("device", tmp_path)
    assert outs[0]["uniform"] == outs[1]["uniform"] and outs[0]["prioritised"] == outs[1]["prioritised"]  # replicated
    assert outs[0]["size"] == 2 * 2 * CAPACITY  # the shards keep their last CAPACITY rows
    assert outs[0]["epoch_shape"] == outs[1]["epoch_shape"] == [4, 2, ADDS * ROWS // 2]  # [S, M, T * N / M]
    # Each shard keeps its last 2 adds (CAPACITY = 2 * ROWS): ids of adds 1 and 2 of both processes, 32 items.
    stored = np.array([pid * 1_000 + a * 2 * ROWS + r for pid in range(2) for a in range(ADDS - 2, ADDS) for r in range(2 * ROWS)])
    leaves = _priority(stored).astype(np.float64) ** 0.6
    for kind, p in (("uniform", np.full(len(stored), 1 / len(stored))), ("prioritised", leaves / leaves.sum())):
        ids = np.asarray(outs[0][kind])
        assert set(ids.tolist()) <= set(stored.tolist())
        counts = np.array([np.sum(ids == i) for i in stored])
        expected = len(ids) * p
        assert chi2.sf(float(((counts - expected) ** 2 / expected).sum()), len(stored) - 1) > 1e-3, kind


@pytest.mark.slow  # two JAX processes on localhost
def test_two_processes_hold_a_compressed_buffer_equal_to_the_unsharded_one(tmp_path):
    import jax

    outs = _two_processes("compressed", tmp_path)
    assert [o["shards"] for o in outs] == [["shard0", "shard1"], ["shard2", "shard3"]]  # each process its own shards
    assert outs[0]["size"] == outs[1]["size"] == E * min(PIXEL_ADDS, LENGTH)
    whole = _make_pixels(E)
    for step, kw in _pixel_steps():
        whole = whole.add(step, **kw)
    got = [dict(np.load(tmp_path / f"compressed{pid}.npz")) for pid in range(2)]
    t, n = whole.trajectory, E // 4
    order = (int(t.head) - int(t.num_valid) + np.arange(int(t.num_valid))) % LENGTH
    stored = np.asarray(whole.decode_obs(t.storage["obs"][:, order]))
    for s in range(4):  # every lane's observations, oldest first, decoded from the store of the process holding it
        np.testing.assert_array_equal(got[s // 2][f"shard{s}"], stored[s * n:(s + 1) * n])
    sample = {k: v for k, v in got[0].items() if not k.startswith("shard")}
    for k in sample:
        np.testing.assert_array_equal(sample[k], got[1][k])  # replicated: both processes read the same sample
    shard, indices = sample[".shard"], sample[".sample.indices"]
    positions = (shard * n + indices // LENGTH) * LENGTH + indices % LENGTH
    assert len(np.unique(shard)) == 4  # drawn from both processes' shards
    ref = whole.decode(whole.buffer.transitions_at(positions, n_step=2, gamma=0.9))
    for p, x in jax.tree_util.tree_flatten_with_path(ref._replace(indices=indices))[0]:
        np.testing.assert_array_equal(sample[".sample" + jax.tree_util.keystr(p)], np.asarray(x), err_msg=jax.tree_util.keystr(p))


@pytest.mark.slow  # two JAX processes on localhost, twice
def test_two_processes_save_and_two_new_processes_restore_the_same_buffers(tmp_path):
    import jax

    import jaxbuffers as jb

    saved = _two_processes("save", tmp_path)
    stacked = jb.restore(tmp_path / "ck_pixels")  # in one process: the 4 shards stacked, each with its store
    for s in range(4):
        one = jax.tree.map(lambda x: x[s], stacked).replace(host=stacked.host.shards[s])
        t = one.trajectory
        order = (int(t.head) - int(t.num_valid) + np.arange(int(t.num_valid))) % LENGTH
        np.testing.assert_array_equal(np.asarray(one.decode_obs(t.storage["obs"][:, order])), np.load(tmp_path / f"save{s // 2}.npz")[f"now.pixelsshard{s}"])
    jb.save(tmp_path / "ck_pixels_one", stacked)  # saved by one process: restored in two below
    restored = _two_processes("restore", tmp_path)
    assert saved == restored
    for pid in range(2):
        a, b = np.load(tmp_path / f"save{pid}.npz"), np.load(tmp_path / f"restore{pid}.npz")
        assert sorted(a.files) == sorted(b.files) and any(".leaf" in k for k in a.files)
        for k in a.files:  # every leaf's rows, the next samples, the stored frames; and again after one more add
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    meta = json.loads((tmp_path / "ck_pixels" / "buffer.json").read_text())
    assert meta["host"]["layout"] == "stacked" and len(meta["host"]["shards"]) == 4


@pytest.mark.slow  # two JAX processes on localhost (~20 s on a loaded 2-core machine)
def test_two_processes_save_one_replicated_buffer_in_the_background(tmp_path):
    """The smallest several-process save: a buffer both processes hold whole, saved with blocking=False by both
    (committed once both finished), then blocking, and restored by each."""
    assert _two_processes("replicated", tmp_path) == [{"pid": 0, "ok": True}, {"pid": 1, "ok": True}]


@pytest.mark.slow  # two JAX processes on localhost
def test_two_processes_save_every_kind_together_and_commit_nothing_when_one_fails(tmp_path):
    """Several processes: one replicated buffer (written by process 0, refused when it differs), blocking=False saves
    committed once both processes wrote, a meta default the target does not share refused by both, an orbax manager
    step of a train state and both buffers; a save in which one process fails to export or to write raises in both
    and leaves the previous checkpoint whole."""
    assert _two_processes("collective", tmp_path) == [{"pid": 0, "ok": True}, {"pid": 1, "ok": True}]


@pytest.mark.slow  # two JAX processes on localhost
def test_two_processes_save_and_restore_fields_stored_as_bytes(tmp_path):
    assert _two_processes("byte_dtypes", tmp_path) == [{"pid": 0, "ok": True}, {"pid": 1, "ok": True}]


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
