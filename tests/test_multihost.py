"""Two processes on localhost through `jax.distributed` (CPU, 2 devices each): one sharded buffer over 4 devices,
each process adding its own rows, global sampling drawing across both processes.

Run as a script, this file is one of the two processes (`python test_multihost.py PROCESS_ID PORT`).
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


def _worker(pid: int, port: int) -> None:
    import jax
    import jax.numpy as jnp

    import jaxbuffers as jb

    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid, initialization_timeout=120)
    assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
    mesh = jax.make_mesh((4,), ("data",))
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
    print(json.dumps(result), flush=True)
    jax.distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two JAX processes on localhost; python -m pytest -m slow tests/test_multihost.py
def test_two_processes_sample_one_global_buffer(tmp_path):
    from scipy.stats import chi2

    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")])}
    # Output to files, not pipes: a worker blocked on a full pipe would stall the other in a collective.
    logs = [(tmp_path / f"out{pid}.txt", tmp_path / f"err{pid}.txt") for pid in range(2)]
    procs = []
    for pid, (out, err) in enumerate(logs):
        with open(out, "w") as o, open(err, "w") as e:
            procs.append(subprocess.Popen([sys.executable, __file__, str(pid), str(port)], env=env, stdout=o, stderr=e))
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
    assert outs[0]["uniform"] == outs[1]["uniform"] and outs[0]["prioritised"] == outs[1]["prioritised"]  # replicated
    assert outs[0]["size"] == 2 * 2 * CAPACITY  # the shards keep their last CAPACITY rows
    # Each shard keeps its last 2 adds (CAPACITY = 2 * ROWS): ids of adds 1 and 2 of both processes, 32 items.
    stored = np.array([pid * 1_000 + a * 2 * ROWS + r for pid in range(2) for a in range(ADDS - 2, ADDS) for r in range(2 * ROWS)])
    leaves = _priority(stored).astype(np.float64) ** 0.6
    for kind, p in (("uniform", np.full(len(stored), 1 / len(stored))), ("prioritised", leaves / leaves.sum())):
        ids = np.asarray(outs[0][kind])
        assert set(ids.tolist()) <= set(stored.tolist())
        counts = np.array([np.sum(ids == i) for i in stored])
        expected = len(ids) * p
        assert chi2.sf(float(((counts - expected) ** 2 / expected).sum()), len(stored) - 1) > 1e-3, kind

if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]))
