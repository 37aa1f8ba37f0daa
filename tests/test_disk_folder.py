"""jaxbuffers._disk_folder: compressed (zstd, delta-coded) folders, format versions, kill -9 mid-add and mid-flush,
corrupt chunk files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb
from frame_stacks import stacked_chunk
from host_codecs import CorruptEntryError
from jaxbuffers import disk

STEP = {"obs": jnp.zeros((4, 12, 12), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
ADD = jax.jit(jb.CompressedTrajectoryBuffer.add)
SAMPLE = jax.jit(lambda b: b.sample_transitions(jax.random.key(3), 40, n_step=3, gamma=0.9))


def _make(**kw):
    """A small zstd buffer whose frames are delta coded (keyframe every 3rd) in chunks of 4 KiB (many chunk files)."""
    return jb.CompressedTrajectoryBuffer.create(STEP, num_envs=2, length=10, frame_stack=4, codec="zstd:3", keyframe_interval=3,
                                                chunk_bytes=4096, **kw)


def _chunk(k, t=4):
    """Add number `k`: `t` steps of 2 lanes of compressible frames, episode ends, final observations (deterministic)."""
    rng = np.random.default_rng(k)
    newest = (np.kron(rng.integers(0, 3, (2, t, 3, 3)), np.ones((4, 4), np.int64)) * 80).astype(np.uint8)
    term, trunc = rng.random((2, t)) < 0.1, rng.random((2, t)) < 0.1
    term[:, -1] = True  # each add ends its lanes' episodes: the next add's stacks start afresh
    frames, final = stacked_chunk(newest, term | trunc, 4)  # stacks a frame stacker makes: what frame_stack stores
    step = {"obs": jnp.asarray(frames), "action": jnp.asarray(rng.integers(0, 9, (2, t)), jnp.int32),
            "reward": jnp.asarray(rng.standard_normal((2, t)), jnp.float32)}
    return dict(step=step, terminated=jnp.asarray(term), truncated=jnp.asarray(trunc), final_obs=jnp.asarray(final))


def _filled(buf, adds):
    for k in adds:
        buf = ADD(buf, **_chunk(k))
    return buf


def _same(a, b):
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y))), a, b)))


@pytest.fixture(scope="module")
def zstd_folder(tmp_path_factory):
    """A zstd folder of 9 adds (the ring wrapped three times), flushed, its in-memory twin's sample."""
    path = tmp_path_factory.mktemp("zdisk") / "buf"
    buf = _filled(disk.open(path, "w", _make()), range(9))
    disk.flush(buf)
    buf.close()
    return path, jax.tree.map(np.asarray, SAMPLE(_filled(_make(), range(9))))


def test_a_zstd_delta_coded_folder_reopens_read_only_and_samples_as_in_memory_under_jit(zstd_folder, tmp_path):
    path, expected = zstd_folder
    meta = json.loads((path / "disk.json").read_text())
    assert meta["version"] == 2 and meta["stores"][0]["kind"] == "chunks" and meta["stores"][0]["meta"]["config"]["codec"] == "zstd:3"
    ro = disk.open(path, "r")
    assert _same(SAMPLE(ro), expected)
    assert _same(ro.sample_transitions(jax.random.key(3), 40, n_step=3, gamma=0.9), expected)  # eager too
    assert int(np.max(ro.host.stores[0]._base)) >= 0  # deltas on disk
    with pytest.raises(disk.ReadOnlyError, match="mode='r'"):
        ro.add(**_chunk(20))
    ro.close()
    names = {p.name for p in path.iterdir()}
    assert names == {"disk.json", "state-2", "slot_version-2.npy", "store-0"}  # the first flush's files are gone


def test_a_flipped_byte_in_a_chunk_file_names_the_slot_and_the_file(zstd_folder, tmp_path):
    path, _ = zstd_folder
    shutil.copytree(path, tmp_path / "c")
    ro = disk.open(tmp_path / "c", "r")
    store = ro.host.stores[0]
    slot = int(np.flatnonzero(store._chunk >= 0)[0])
    chunk = tmp_path / "c" / "store-0" / f"chunk-{int(store._chunk[slot]):06d}.bin"
    raw = bytearray(chunk.read_bytes())
    raw[int(store._offset[slot])] ^= 1
    chunk.write_bytes(bytes(raw))
    with pytest.raises(CorruptEntryError, match=rf"slots \[{slot}\] are corrupt .*{chunk.name}"):
        store.get([slot])
    with pytest.raises(jax.errors.JaxRuntimeError, match="CorruptEntryError"):
        jax.block_until_ready(jax.jit(lambda b: b.sample_sequences(jax.random.key(0), 64, 4))(ro))


def test_version_1_folders_open_and_unknown_versions_are_refused_naming_the_file(tmp_path):
    """A version 1 folder (raw stores, `state/`, `slot_version.npy`) opens, and a flush of it in `"r+"` writes
    version 2; version 3 is refused."""
    raw = lambda: jb.CompressedTrajectoryBuffer.create(STEP, num_envs=2, length=10, frame_stack=4, codec="none")  # noqa: E731
    d = tmp_path / "v1"
    disk.flush(_filled(disk.open(d, "w", raw()), range(3)))
    meta = json.loads((d / "disk.json").read_text())  # rewrite it as version 1 wrote it
    (d / "state-2").rename(d / "state")
    (d / "slot_version-2.npy").rename(d / "slot_version.npy")
    files = {"slot_version.npy": meta["files"].pop("slot_version-2.npy"), **meta["files"]}
    stores = [{k: s[k] for k in ("name", "file", "shape", "dtype")} for s in meta["stores"]]
    v1 = {"format": "jaxbuffers.disk", "version": 1, "num_slots": meta["num_slots"], "host": meta["host"], "stores": stores, "files": files}
    (d / "disk.json").write_text(json.dumps(v1))
    assert _same(SAMPLE(disk.open(d, "r")), SAMPLE(_filled(raw(), range(3))))
    disk.flush(_filled(disk.open(d, "r+"), [3]))
    assert json.loads((d / "disk.json").read_text())["version"] == 2 and not (d / "state").exists()
    assert int(disk.open(d, "r").version) == 4
    (d / "disk.json").write_text(json.dumps({**v1, "version": 3}))
    with pytest.raises(jb.CheckpointError, match=r"v1/disk\.json: format version 3, this jaxbuffers reads versions \[1, 2\]"):
        disk.open(d, "r")


_CRASH = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import test_disk_folder as t
    from host_codecs import chunk_arena
    from jaxbuffers import disk

    path, point = sys.argv[1], sys.argv[2]
    buf = t._filled(disk.open(path, "w", t._make()), range(5))
    disk.flush(buf)
    buf = t._filled(buf, range(5, 11))  # not flushed: the ring wraps, chunks the flush named die
    kill = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    if point == "add":  # killed inside the write of a payload of the next add, half of it written
        def half(self, key, value, write=chunk_arena._ChunkFile.__setitem__):
            write(self, slice(key.start, key.start + len(value) // 2), value[: len(value) // 2])
            kill()
        chunk_arena._ChunkFile.__setitem__ = half
        t._filled(buf, [11])
    else:  # killed in a flush: indexes, slot versions and state written, disk.json about to be replaced
        replace = os.replace
        os.replace = lambda a, b: kill() if str(b).endswith("disk.json") else replace(a, b)
        disk.flush(buf)
""")


@pytest.mark.parametrize("point", ["flush", pytest.param("add", marks=pytest.mark.slow)])
def test_kill_9_mid_add_or_mid_flush_reopens_as_the_last_flush(tmp_path, point):
    """A process killed (SIGKILL) in the middle of a flush, or inside an add's write, after adds since its last flush
    that wrapped the ring: the folder reopens as that flush, and `"r+"` deletes the leftovers and continues."""
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _CRASH.format(tests=tests), str(tmp_path / point), point], env=env,
                          stderr=subprocess.PIPE, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    folder = tmp_path / point
    ro, twin = disk.open(folder, "r"), _filled(_make(), range(5))
    assert int(ro.version) == 5 and _same(SAMPLE(ro), SAMPLE(twin))  # never a frame of a later add
    ro.close()
    rw = disk.open(folder, "r+")  # deletes what the interrupted work left, and continues
    store = json.loads((folder / "disk.json").read_text())["stores"][0]
    assert {p.name for p in (folder / "store-0").iterdir()} == {store["index"][len("store-0/"):], *(f"chunk-{int(c):06d}.bin" for c in store["meta"]["chunks"])}
    assert {p.name for p in folder.iterdir()} == {"disk.json", "state-2", "slot_version-2.npy", "store-0"}
    assert _same(SAMPLE(_filled(rw, range(5, 8))), SAMPLE(_filled(twin, range(5, 8))))
    rw.close()
