"""jaxbuffers._disk_folder: compressed (zstd, delta-coded) folders, format versions, kill -9 mid-add and mid-flush,
corrupt chunk files."""

from __future__ import annotations

import gc
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


def _make(codec="zstd:3", **kw):
    """A small zstd buffer whose frames are delta coded (keyframe every 3rd) in chunks of 4 KiB (many chunk files);
    with `codec="none"`, the same buffer raw."""
    if codec == "none":
        return jb.CompressedTrajectoryBuffer.create(STEP, num_envs=2, length=10, frame_stack=4, codec="none", **kw)
    return jb.CompressedTrajectoryBuffer.create(STEP, num_envs=2, length=10, frame_stack=4, codec=codec, keyframe_interval=3,
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


def _same_contents(a, b):
    """Whether two compressed buffers (on disk or in memory) hold the same state: every device leaf, and every slot
    of every host store (empty ones as zeros), compared whole (no program compiled for either)."""
    same = all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))
    slots = np.arange(a.host.num_slots)
    return same and all(np.array_equal(x.get(slots, missing="zeros"), y.get(slots, missing="zeros")) for x, y in zip(a.host.stores, b.host.stores, strict=True))


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
    assert meta["version"] == 3 and meta["stores"][0]["kind"] == "chunks" and meta["stores"][0]["meta"]["config"]["codec"] == "zstd:3"
    ro = disk.open(path, "r")
    assert _same(SAMPLE(ro), expected)
    assert _same(ro.sample_transitions(jax.random.key(3), 40, n_step=3, gamma=0.9), expected)  # eager too
    assert int(np.max(ro.host.stores[0]._base)) >= 0  # deltas on disk
    with pytest.raises(disk.ReadOnlyError, match="mode='r'"):
        ro.add(**_chunk(20))
    ro.close()
    names = {p.name for p in path.iterdir()}
    assert names == {"disk.json", "disk.lock", "state-2", "slot_version-2.npy", "store-0"}  # the first flush's files are gone


def test_a_template_of_another_chunk_bytes_reopens_the_folder_with_its_own_chunking(zstd_folder, tmp_path):
    """`chunk_bytes` is a tuning: a template that differs only there opens the folder ("r" and "r+"), whose chunk
    files keep their 4 KiB chunking, and the buffer adds, flushes and samples as one opened with the folder's own;
    a template that differs elsewhere is still refused."""
    path, expected = zstd_folder
    template = lambda length=10: jb.CompressedTrajectoryBuffer.create(  # noqa: E731 - _make's but 64 KiB chunks
        STEP, num_envs=2, length=length, frame_stack=4, codec="zstd:3", keyframe_interval=3, chunk_bytes=1 << 16)
    copies = [shutil.copytree(path, tmp_path / name) for name in ("theirs", "own")]
    bufs = [disk.open(path, "r", template()), disk.open(copies[0], "r+", template()), disk.open(copies[1], "r+", _make())]
    for b in bufs:
        assert b.host.stores[0].config()["chunk_bytes"] == 4096 and _same(SAMPLE(b), expected)
    bufs.pop(0).close()
    bufs = [ADD(b, **_chunk(30)) for b in bufs]
    for b in bufs:
        disk.flush(b)
    assert _same(SAMPLE(bufs[0]), SAMPLE(bufs[1]))
    for b in bufs:
        b.close()
    reopened = [disk.open(c, "r") for c in copies]
    assert _same_contents(*reopened)
    for b in reopened:
        b.close()
    with pytest.raises(jb.CheckpointError, match="config 'length' differs"):
        disk.open(path, "r+", template(length=12))


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


def test_a_damaged_file_entry_of_disk_json_is_refused_naming_the_file_and_the_key(zstd_folder, tmp_path):
    """disk.json whose file entry lost its size is refused as a CheckpointError naming disk.json, the file and the key."""
    path, _ = zstd_folder
    shutil.copytree(path, tmp_path / "c")
    meta = json.loads((tmp_path / "c" / "disk.json").read_text())
    name = next(iter(meta["files"]))
    meta["files"][name] = {"bytez": 1, "xxh3_64": meta["files"][name]["xxh3_64"]}
    (tmp_path / "c" / "disk.json").write_text(json.dumps(meta))
    with pytest.raises(jb.CheckpointError, match=rf"disk\.json: files\['{name}'\]: expected 'bytes', an int >= 0.*got"):
        disk.open(tmp_path / "c", "r")


@pytest.mark.parametrize("edit, says", [
    (lambda m: m.__setitem__("host", None), r"host: expected a dict"),
    (lambda m: m["host"].__setitem__("num_rows", "x"), r"host\.num_rows: expected an int >= 0, got 'x'"),
    (lambda m: m.__setitem__("generation", [5]), r"generation: expected an int >= 0, got \[5\]"),
    (lambda m: m.__setitem__("stores", [5]), r"stores\[0\]: expected a dict, got 5"),
    (lambda m: m.__setitem__("state", "../elsewhere"), r"state: expected a relative path inside the folder, got '\.\./elsewhere'"),
    (lambda m: m["stores"][0].__setitem__("index", "/etc/x"), r"stores\[0\]\.index: expected a relative path inside the folder"),
    (lambda m: m["stores"][0].__setitem__("meta", "x"), r"stores\[0\]\.meta: expected a dict, got 'x'"),
    (lambda m: m["stores"][0]["meta"].__setitem__("chunks", "x"), r"stores: an entry this jaxbuffers cannot read"),
    (lambda m: m.__setitem__("slot_version", "gone.npy"), r"gone\.npy: missing"),
], ids=["host-null", "host-count-a-str", "generation-a-list", "store-an-int", "state-outside", "index-absolute", "meta-a-str",
        "chunks-a-str", "slot-versions-missing"])
def test_a_damaged_disk_json_is_refused_naming_the_file_and_the_field(zstd_folder, tmp_path, edit, says):
    """disk.json with a field of another type, or a file name outside the folder (a flush deletes what the previous
    disk.json named), is refused as a CheckpointError naming the file and the field; nothing is opened."""
    path, _ = zstd_folder
    shutil.copytree(path, tmp_path / "c")
    meta = json.loads((tmp_path / "c" / "disk.json").read_text())
    edit(meta)
    (tmp_path / "c" / "disk.json").write_text(json.dumps(meta))
    with pytest.raises(jb.CheckpointError, match=says):
        disk.open(tmp_path / "c", "r")


def test_version_1_and_2_folders_open_and_unknown_versions_are_refused_naming_the_file(tmp_path):
    """Folders as versions 1 and 2 wrote them (a raw store in one file beside its index `store-0.index.npy` of two
    rows; version 1 also `state/`, `slot_version.npy`, no generation) open, and a flush of one in `"r+"` writes
    version 3; version 4 is refused."""
    d, twin = tmp_path / "old", _filled(_make("none"), range(5))
    buf = _filled(disk.open(d, "w", _make("none")), range(3))
    disk.flush(buf)
    buf = _filled(buf, [3, 4])  # the ring wraps, rewriting slots the flush named: entries in both files
    disk.flush(buf)
    buf.close()
    meta = json.loads((d / "disk.json").read_text())
    g = meta["generation"]
    index = np.load(d / f"store-0.index-{g}.npy")
    frames = np.load(d / "store-0.npy")
    second = (index[0] >> 1) == 1  # entries in the second file
    assert second.any()
    frames[second] = np.load(d / "store-0.1.npy")[second]  # one file, as they wrote it
    np.save(d / "store-0.npy", frames)
    np.save(d / "store-0.index.npy", np.stack([index[0] & 1, index[1]]))
    for p in ("store-0.1.npy", f"store-0.index-{g}.npy"):
        (d / p).unlink()
    idx = {"store-0.index.npy": {"bytes": (d / "store-0.index.npy").stat().st_size, "xxh3_64": jb.checkpoint._hash_file(d / "store-0.index.npy", jb.checkpoint._Progress(False, ""))}}
    sv = {f"slot_version-{g}.npy": meta["files"][f"slot_version-{g}.npy"]}
    stores = [{k: s[k] for k in ("name", "file", "shape", "dtype")} for s in meta["stores"]]
    v2 = {**meta, "version": 2, "stores": [{**s, "kind": "raw", "index": "store-0.index.npy"} for s in stores], "files": {**sv, **idx}}
    v1 = {"format": "jaxbuffers.disk", "version": 1, "num_slots": meta["num_slots"], "host": meta["host"], "stores": stores,
          "files": {"slot_version.npy": sv[f"slot_version-{g}.npy"], **idx}}
    for version, old in ((2, v2), (1, v1)):
        (d / "disk.json").write_text(json.dumps(old))
        if version == 1:
            (d / f"state-{g}").rename(d / "state")
            (d / f"slot_version-{g}.npy").rename(d / "slot_version.npy")
        assert _same_contents(disk.open(d, "r"), twin), version
    rw = disk.open(d, "r+")
    disk.flush(_filled(rw, [5]))
    rw.close()
    assert json.loads((d / "disk.json").read_text())["version"] == 3 and not (d / "state").exists()
    assert {p.name for p in d.iterdir()} == {"disk.json", "disk.lock", "state-1", "slot_version-1.npy", "store-0.npy", "store-0.1.npy", "store-0.index-1.npy"}
    assert _same_contents(disk.open(d, "r"), _filled(twin, [5]))
    (d / "disk.json").write_text(json.dumps({**v1, "version": 4}))
    with pytest.raises(jb.CheckpointError, match=r"old/disk\.json: format version 4, this jaxbuffers reads versions \[1, 2, 3\]"):
        disk.open(d, "r")


_CRASH = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import test_disk_folder as t
    from host_codecs import chunk_arena
    from jaxbuffers import disk

    path, point, codec = sys.argv[1:4]
    buf = t._filled(disk.open(path, "w", t._make(codec)), range(5))
    disk.flush(buf)
    buf = t._filled(buf, range(5, 11))  # not flushed: the ring wraps, rewriting every slot the flush named
    kill = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    if point == "add" and codec == "none":  # killed inside the write of the next add's rows, half of them written
        pwrite = os.pwrite
        os.pwrite = lambda fd, data, at: (pwrite(fd, memoryview(data).cast("B")[: len(memoryview(data).cast("B")) // 2], at), kill())
        t._filled(buf, [11])
    elif point == "add":  # killed inside the write of a payload of the next add, half of it written
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
@pytest.mark.parametrize("codec", ["zstd:3", "none"])
def test_kill_9_mid_add_or_mid_flush_reopens_as_the_last_flush(tmp_path, point, codec):
    """A process killed (SIGKILL) in the middle of a flush, or inside an add's write, after adds since its last flush
    that wrapped the ring: the folder reopens as that flush, exactly, and `"r+"` deletes the leftovers and continues
    (zstd: chunk files; none: the raw store's two copies)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _CRASH.format(tests=tests), str(tmp_path / point), point, codec], env=env,
                          stderr=subprocess.PIPE, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    folder = tmp_path / point
    ro, twin = disk.open(folder, "r"), _filled(_make(codec), range(5))
    assert int(ro.version) == 5 and _same_contents(ro, twin)  # every device leaf and stored frame: never one of a later add
    ro.close()
    rw = disk.open(folder, "r+")  # deletes what the interrupted work left, and continues
    store = json.loads((folder / "disk.json").read_text())["stores"][0]
    if codec == "none":
        assert {p.name for p in folder.iterdir()} == {"disk.json", "disk.lock", "state-2", "slot_version-2.npy", "store-0.npy", "store-0.1.npy", "store-0.index-2.npy"}
    else:
        assert {p.name for p in (folder / "store-0").iterdir()} == {store["index"][len("store-0/"):], *(f"chunk-{int(c):06d}.bin" for c in store["meta"]["chunks"])}
        assert {p.name for p in folder.iterdir()} == {"disk.json", "disk.lock", "state-2", "slot_version-2.npy", "store-0"}
    assert _same_contents(_filled(rw, range(5, 8)), _filled(twin, range(5, 8)))
    rw.close()


# --- one writer per folder; read-only opens beside the writer ---

def _files(d):
    return {p.name: p.stat().st_mtime_ns for p in d.iterdir()}


_HOLDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    import test_disk_folder as t
    from jaxbuffers import disk
    buf = disk.open(sys.argv[1], "w", t._make("none"))  # created and flushed empty
    print("ready", flush=True)
    time.sleep(600)
""")


def test_a_writer_in_another_process_holds_the_folder_until_it_is_killed(tmp_path):
    """Another process's writable open: ours is refused naming its pid, a read-only open reads its last flush; once
    it is killed (SIGKILL: no close, no cleanup), the folder opens for writing."""
    tests, d = os.path.dirname(os.path.abspath(__file__)), tmp_path / "held"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER.format(tests=tests), str(d)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready", proc.stderr.read().decode()[-2000:]
        with pytest.raises(disk.FolderLockedError, match=rf"{d} is open for writing .* by process {proc.pid}, which holds .*disk\.lock"):
            disk.open(d, "r+")
        assert int(disk.open(d, "r").version) == 0
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    rw = disk.open(d, "r+")
    assert int(rw.version) == 0 and rw.host.folder_lock.fd >= 0
    rw.close()


def test_one_writer_in_this_process_and_read_only_opens_beside_it(tmp_path, monkeypatch):
    """A second writable open (`"r+"`, `"w"`) is refused, naming this process, with nothing read or deleted, until
    the writer is closed or collected. `"r"` beside the writer: opened in the middle of its flush (every file of the
    new generation written, disk.json not yet replaced) it reads the previous flush exactly; after it, the new one. A
    commit landing while an open reads the folder (the files it read deleted) is retried. A read-only buffer whose
    entries the writer rewrote after a later flush raises `StaleBufferError`."""
    d = tmp_path / "rw"
    w = _filled(disk.open(d, "w", _make("none")), range(3))
    disk.flush(w)
    before = _files(d)
    who = rf"{d} is open for writing \(mode 'w' or 'r\+'\) by process {os.getpid()} \(this process\)"
    for mode, arg in (("r+", None), ("w", _make("none"))):
        with pytest.raises(disk.FolderLockedError, match=who):
            disk.open(d, mode, arg)
    assert _files(d) == before  # the refused "w" did not empty the folder
    w = _filled(w, range(3, 6))  # rewrites slots the flush named
    seen, replace = [], os.replace

    def commit_point(a, b):
        if str(b).endswith("disk.json"):
            seen.append(disk.open(d, "r"))
        replace(a, b)

    monkeypatch.setattr(os, "replace", commit_point)
    disk.flush(w)
    monkeypatch.setattr(os, "replace", replace)
    first = seen[0]
    assert int(first.version) == 3 and _same_contents(first, _filled(_make("none"), range(3)))
    assert int(disk.open(d, "r").version) == 6

    state_path, flushed = disk._disk_folder.state_path, []

    def commit_meanwhile(folder, meta):  # the writer commits after this open read disk.json, deleting what it names
        if not flushed:
            flushed.append(disk.flush(later))
        return state_path(folder, meta)

    later = _filled(w, range(6, 8))
    monkeypatch.setattr(disk._disk_folder, "state_path", commit_meanwhile)
    again = disk.open(d, "r")
    monkeypatch.setattr(disk._disk_folder, "state_path", state_path)
    assert flushed and int(again.version) == 8 and _same_contents(again, _filled(_make("none"), range(8)))
    later = _filled(later, range(8, 11))  # rewrites the copies of entries the first read-only buffer reads
    with pytest.raises(jb.StaleBufferError, match="opened with mode='r' at generation 2; a writer has since flushed .*reopen"):
        first.sample_transitions(jax.random.key(3), 40, n_step=3, gamma=0.9)
    later.close()
    rw = disk.open(d, "r+")  # released by close
    del rw
    gc.collect()
    disk.open(d, "w", _make("none")).close()  # released when the writer was collected


def test_the_lock_without_a_recorded_pid_and_without_fcntl(tmp_path, monkeypatch):
    """A lock held with no pid written in the lock file: the refusal says "another handle". Without `fcntl` (a system
    that has none), nothing is locked: both opens proceed, each writing its pid (the documented behaviour)."""
    import fcntl

    from jaxbuffers import _disk_folder

    fd = os.open(tmp_path / "disk.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(disk.FolderLockedError, match=r"open for writing \(mode 'w' or 'r\+'\) by another handle"):
        _disk_folder.FolderLock(tmp_path)
    os.close(fd)
    monkeypatch.setattr(_disk_folder, "fcntl", None)
    a, b = _disk_folder.FolderLock(tmp_path), _disk_folder.FolderLock(tmp_path)
    assert (tmp_path / "disk.lock").read_text() == f"{os.getpid()}\n"
    a.release(), b.release()
