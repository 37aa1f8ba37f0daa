"""jaxbuffers.disk: disk-backed compressed buffers (modes, flush and reopen, config checks) and Concatenated."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb
from frame_stacks import stacked_chunk, stacked_episodes
from host_codecs import CorruptEntryError
from jaxbuffers import _disk_folder, disk
from rollout_layouts import before_empty_slot, unwritten_zeroed

STEP = {"obs": jnp.zeros((4, 6, 6), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
ADD = jax.jit(jb.CompressedTrajectoryBuffer.add)


def _make(num_envs=2, length=12, **kw):
    return jb.CompressedTrajectoryBuffer.create(STEP, num_envs=num_envs, length=length, codec="none", frame_stack=4, **kw)


def _chunk(t, seed, num_envs=2):
    """`t` steps of `num_envs` lanes as one chunk (leaves [num_envs, t, ...]) with episode ends and final observations."""
    rng = np.random.default_rng(seed)
    newest = rng.integers(0, 256, (num_envs, t, 6, 6), dtype=np.uint8)
    term, trunc = rng.random((num_envs, t)) < 0.15, rng.random((num_envs, t)) < 0.1
    term[:, -1] = True  # each chunk ends its lanes' episodes: the next chunk's stacks start afresh
    obs, final = stacked_chunk(newest, term | trunc, 4)  # stacks a frame stacker makes: what frame_stack stores
    step = {"obs": jnp.asarray(obs), "action": jnp.asarray(rng.integers(0, 9, (num_envs, t)), jnp.int32),
            "reward": jnp.asarray(rng.standard_normal((num_envs, t)), jnp.float32)}
    return dict(step=step, terminated=jnp.asarray(term), truncated=jnp.asarray(trunc), final_obs=jnp.asarray(final))


def _add(buf, chunk, pieces=1):
    """`buf` with `chunk` added in `pieces` equal chunks (a chunk must fit the lanes)."""
    for part in zip(*(np.split(np.asarray(x), pieces, axis=1) for x in jax.tree.leaves(chunk))):
        buf = ADD(buf, **jax.tree.unflatten(jax.tree.structure(chunk), [jnp.asarray(x) for x in part]))
    return buf


def _sample(buf):
    s = buf.sample_transitions(jax.random.key(3), 48, n_step=3, gamma=0.9)
    return jax.tree.map(np.asarray, s)


def _rss_mb():
    """This process's resident memory (VmRSS), MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _same(a, b):
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y))), a, b)))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A folder of 20 steps (wrapped around its 12-step lanes), flushed; its in-memory twin; the twin's sample."""
    path = tmp_path_factory.mktemp("disk") / "buf"
    chunk = _chunk(20, seed=0)
    buf, twin = (_add(b, chunk, 2) for b in (disk.open(path, "w", _make()), _make()))
    disk.flush(buf)
    expected = _sample(twin)
    assert _same(_sample(buf), expected)  # eager sampling of the disk buffer is the in-memory buffer's
    under_jit = jax.jit(lambda b: b.sample_transitions(jax.random.key(3), 48, n_step=3, gamma=0.9))(buf)
    assert _same(under_jit, expected)  # and under jit
    buf.close()
    return path, twin, expected


@pytest.fixture
def folder(built, tmp_path):
    """A copy of the built folder (tests may change it) and the in-memory twin's sample."""
    path, _, expected = built
    shutil.copytree(path, tmp_path / "buf")
    return tmp_path / "buf", expected


def test_reopen_read_only_gives_identical_samples_and_refuses_writes(folder):
    path, expected = folder
    ro = disk.open(path, "r")
    assert _same(_sample(ro), expected)
    with pytest.raises(disk.ReadOnlyError, match="mode='r'"):
        ro.add(**_chunk(1, seed=5))
    with pytest.raises(jax.errors.JaxRuntimeError, match="ReadOnlyError"):
        jax.block_until_ready(ADD(ro, **_chunk(1, seed=5)))
    with pytest.raises(disk.ReadOnlyError, match="flush"):
        disk.flush(ro)
    assert ro.host.version == int(ro.version) == 2 and ro.host.num_writes == 2
    assert _same(_sample(ro), expected)  # nothing changed


def test_flush_then_reopen_in_a_fresh_process_gives_identical_samples(folder, tmp_path):
    path, expected = folder
    script = textwrap.dedent(f"""
        import jax, numpy as np
        from jaxbuffers import disk
        s = disk.open({str(path)!r}, "r").sample_transitions(jax.random.key(3), 48, n_step=3, gamma=0.9)
        np.savez({str(tmp_path / 'out.npz')!r}, *jax.tree.leaves(s))
    """)
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    got = np.load(tmp_path / "out.npz")
    want = jax.tree.leaves(expected)
    assert len(got.files) == len(want)
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[f"arr_{i}"], w)


def test_r_plus_continues_and_the_last_flush_is_what_reopens(built, folder):
    path, _ = folder
    twin = built[1]
    chunk = _chunk(9, seed=1)
    rw = ADD(disk.open(path, "r+"), **chunk)
    disk.flush(rw)
    rw.close()
    assert _same(_sample(disk.open(path, "r")), _sample(ADD(twin, **chunk)))


def test_old_states_and_unflushed_adds(folder):
    path, expected = folder
    buf = disk.open(path, "r+")
    newer = _add(buf, _chunk(16, seed=2), 2)  # rewrites every frame slot
    with pytest.raises(jb.StaleBufferError, match="flush"):
        disk.flush(buf)
    with pytest.raises(TypeError, match="disk-backed"):
        disk.flush(_make())
    with pytest.raises(TypeError, match="disk-backed CompressedTrajectoryBuffer is its folder"):
        jb.save(path.parent / "ckpt", newer)
    assert not (path.parent / "ckpt").exists()
    newer.close()  # not flushed: the folder still holds the first 20 steps, every entry of them whole
    assert _same(_sample(disk.open(path, "r")), expected)


def test_config_checks_name_the_field(folder, tmp_path):
    path, _ = folder
    with pytest.raises(jb.CheckpointError, match="config 'padding'"):
        disk.open(path, "r", _make(padding="zero"))
    with pytest.raises(jb.CheckpointError, match="config 'num_envs'"):
        disk.open(path, "r", jax.eval_shape(lambda: _make(num_envs=3)))
    disk.open(path, "r", jax.eval_shape(_make)).close()  # the same configuration opens
    meta = json.loads((path / "disk.json").read_text())
    meta["stores"][0]["shape"] = [6, 7]
    (path / "disk.json").write_text(json.dumps(meta))
    with pytest.raises(jb.CheckpointError, match=r"disk.json: stores\[0\] is \{.*'shape': \[6, 7\].*needs \{.*'shape': \[6, 6\]"):
        disk.open(path, "r")
    with pytest.raises(ValueError, match="keyframe_interval=2 with codec='none'"):
        disk.open(tmp_path / "z", "w", _make(keyframe_interval=2))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not a jaxbuffers disk folder"):
        disk.open(tmp_path / "other", "w", _make())
    assert (tmp_path / "other" / "keep.txt").exists()
    with pytest.raises(ValueError, match="mode"):
        disk.open(path, "a")
    with pytest.raises(jb.CheckpointError, match="disk.json: missing"):
        disk.open(tmp_path / "none", "r")


def test_a_corrupt_index_file_is_named(folder):
    path, _ = folder
    p = path / json.loads((path / "disk.json").read_text())["stores"][0]["index"]
    assert p.name == "store-0.index-2.npy"
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 1
    p.write_bytes(bytes(raw))
    with pytest.raises(jb.CheckpointError, match=r"store-0\.index-2\.npy"):
        disk.open(path, "r")


# --- Concatenated ---

ITEM = {"obs": jnp.zeros((3,), jnp.int32), "action": jnp.int32(0), "reward": jnp.float32(0)}


def _reopened(buf, path):
    """`buf` itself when `path` is None; else `buf` (a disk buffer in `path`) flushed, closed and reopened read-only."""
    if path is None:
        return buf
    disk.flush(buf)
    buf.close()
    return disk.open(path, "r")


def _tagged(b, num_envs, length, steps, path=None):
    """A buffer (in `path` when given, flushed and reopened read-only) whose step (lane e, step t) has obs [b, e, t]
    and action t; no episode ends."""
    buf = jb.CompressedTrajectoryBuffer.create(ITEM, num_envs=num_envs, length=length, codec="none")
    buf = buf if path is None else disk.open(path, "w", buf)
    lanes, t = np.arange(num_envs)[:, None], np.arange(steps)[None, :]
    obs = np.stack(np.broadcast_arrays(np.full_like(lanes, b), lanes, t), axis=-1).astype(np.int32)
    step = {"obs": jnp.asarray(obs), "action": jnp.asarray(obs[..., 2]), "reward": jnp.zeros((num_envs, steps))}
    buf = _add(buf, {"step": step, "terminated": jnp.zeros((num_envs, steps), bool)}, -(-steps // length))
    return _reopened(buf, path)


def test_concatenated_is_uniform_over_the_union_with_exact_contents(tmp_path):
    parts = [_tagged(0, 2, 10, 10, tmp_path / "a"), _tagged(1, 1, 30, 30, tmp_path / "b"), _tagged(2, 3, 4, 9)]
    cat = disk.Concatenated.create(parts)
    assert int(cat.size()) == 20 + 30 + 12
    # valid 1-step transitions: (lane, t) with t + 1 stored (the last 4 steps for the wrapped buffer)
    valid = {(0, e, t) for e in range(2) for t in range(9)} | {(1, 0, t) for t in range(29)} | {(2, e, t) for e in range(3) for t in range(5, 8)}
    out = jax.jit(lambda c, k: c._transitions(k, 6000, gamma=0.5))(cat, jax.random.key(0))
    s, src = jax.device_get((out.sample, out.source))
    obs, nxt = np.asarray(s.obs), np.asarray(s.next_obs)
    np.testing.assert_array_equal(obs[:, 0], src)  # rows from the buffer the source names
    np.testing.assert_array_equal(nxt, obs + np.array([0, 0, 1]))  # next obs: the next step of that lane
    np.testing.assert_array_equal(np.asarray(s.action), obs[:, 2])
    rows, n = np.unique(obs, axis=0, return_counts=True)
    assert {tuple(r) for r in rows.tolist()} == valid  # every valid window, nothing else
    expected = n.sum() / len(valid)
    chi2 = float(((n - expected) ** 2 / expected).sum())
    assert chi2 < 100.0, chi2  # 58 degrees of freedom: p < 1e-5 above 100
    eager = cat.sample_sequences(jax.random.key(1), 16, 4)
    seq_obs = np.asarray(eager.sample.item["obs"])
    np.testing.assert_array_equal(seq_obs[:, :, 0], np.broadcast_to(np.asarray(eager.source)[:, None], (16, 4)))
    np.testing.assert_array_equal(np.diff(seq_obs[:, :, 2], axis=1), 1)


def test_concatenated_refuses_other_configurations(tmp_path):
    a = jb.CompressedTrajectoryBuffer.create(ITEM, num_envs=1, length=4, codec="none")
    b = jb.CompressedTrajectoryBuffer.create({**ITEM, "action": jnp.float32(0)}, num_envs=1, length=4, codec="none")
    with pytest.raises(ValueError, match=re.escape("buffers[1]: config 'example' differs at example['action']: dtype float32 in buffers[1], int32 in buffers[0]")):
        disk.Concatenated.create([a, b])
    c = jb.CompressedTrajectoryBuffer.create(ITEM, num_envs=1, length=4, codec="rle")
    with pytest.raises(ValueError, match=r"buffers\[1\]: config 'codec'"):
        disk.Concatenated.create([a, c])
    with pytest.raises(ValueError, match="at least one"):
        disk.Concatenated.create([])


def test_concatenated_refuses_a_buffer_or_a_folder_given_twice(tmp_path):
    """Twice the same buffer (or folder, however spelt) would be sampled with double weight and closed twice."""
    a = _tagged(0, 1, 4, 4)
    with pytest.raises(ValueError, match=re.escape("buffers[2]: the buffer of buffers[0] again")):
        disk.Concatenated.create([a, _tagged(1, 1, 4, 4), a])
    ro = _tagged(0, 1, 4, 4, tmp_path / "a")
    (tmp_path / "x").mkdir()
    again = disk.open(tmp_path / "x" / ".." / "a", "r")
    for twice in ([ro, ro], [ro, again]):
        with pytest.raises(ValueError, match=re.escape(f"buffers[1]: the folder {(tmp_path / 'a').resolve()} of buffers[0] again")):
            disk.Concatenated.create(twice)
    eps = _tagged_episodes(0, 2, 3, [3])
    with pytest.raises(ValueError, match=re.escape("buffers[1]: the buffer of buffers[0] again")):
        disk.ConcatenatedEpisodes.create([eps, eps])
    ro.close(), again.close()


def test_a_compressed_rollout_buffer_on_disk_gives_the_same_minibatches(tmp_path):
    step = {"obs": jnp.zeros((5,), jnp.uint8), "action": jnp.int32(0)}
    make = lambda: jb.CompressedRolloutBuffer.create(step, num_envs=2, num_steps=4, codec="none")  # noqa: E731
    rng = np.random.default_rng(0)
    bufs = [disk.open(tmp_path / "r", "w", make()), make()]
    for _ in range(4):
        s = {"obs": jnp.asarray(rng.integers(0, 256, (2, 5), dtype=np.uint8)), "action": jnp.asarray(rng.integers(0, 4, 2), jnp.int32)}
        kw = dict(reward=jnp.asarray(rng.standard_normal(2), jnp.float32), value=jnp.zeros(2), terminated=jnp.asarray(rng.random(2) < 0.3))
        bufs = [b.add(s, **kw) for b in bufs]
    buf, twin = (b.compute_gae(jnp.zeros(2), 0.9, 0.95) for b in bufs)
    disk.flush(buf)
    key = jax.random.key(0)
    assert _same(disk.open(tmp_path / "r", "r").minibatches(key, 2), twin.minibatches(key, 2))


def test_a_compressed_rollout_folder_of_the_layout_before_the_empty_slot_opens_in_this_one(tmp_path):
    step = {"obs": jnp.zeros((5,), jnp.uint8), "action": jnp.int32(0)}
    make = lambda codec: jb.CompressedRolloutBuffer.create(step, num_envs=2, num_steps=3, codec=codec)  # noqa: E731
    rng = np.random.default_rng(1)

    def add(*bufs):
        s = {"obs": jnp.asarray(rng.integers(0, 256, (2, 5), dtype=np.uint8)), "action": jnp.asarray(rng.integers(0, 4, 2), jnp.int32)}
        kw = dict(reward=jnp.asarray(rng.standard_normal(2), jnp.float32), value=jnp.zeros(2), terminated=jnp.zeros(2, bool))
        out = [b.add(s, **kw) for b in bufs]
        return out if len(out) > 1 else out[0]

    written, old = add(*add(disk.open(tmp_path / "r", "w", before_empty_slot(make("zstd:1"))), before_empty_slot(make("zstd:1"))))
    old = old.compute_gae(jnp.zeros(2), 0.9, 0.95)  # 2 of 3 rows; its in-memory twin
    disk.flush(written.compute_gae(jnp.zeros(2), 0.9, 0.95))
    written.close()
    assert json.loads((tmp_path / "r" / "disk.json").read_text())["num_slots"] == 6
    key = jax.random.key(0)
    ro = disk.open(tmp_path / "r", "r")
    assert ro.host.num_slots == 7 and np.asarray(ro.buffer.step["obs"])[2].tolist() == [-1, -1]
    assert _same(ro.minibatches(key, 2), unwritten_zeroed(old.minibatches(key, 2), old))
    ro.close()
    rw, old = add(disk.open(tmp_path / "r", "r+", make("zstd:1")), old)  # the same head: row 2
    gae = lambda b: b.compute_gae(jnp.zeros(2), 0.9, 0.95)  # noqa: E731 - minibatches read advantages
    assert _same(gae(rw).minibatches(key, 2), gae(old).minibatches(key, 2))
    disk.flush(rw)  # written in this layout from now on
    rw.close()
    assert json.loads((tmp_path / "r" / "disk.json").read_text())["num_slots"] == 7
    assert _same(gae(disk.open(tmp_path / "r", "r")).minibatches(key, 2), gae(old).minibatches(key, 2))
    raw = disk.open(tmp_path / "raw", "w", before_empty_slot(make("none")))  # a raw store's file has one row per slot
    disk.flush(add(raw))
    with pytest.raises(jb.CheckpointError, match="num_slots is 6"):
        disk.open(tmp_path / "raw", "r")


@pytest.mark.slow
def test_sampling_a_folder_larger_than_the_samples_keeps_resident_memory_flat(tmp_path):
    """1 GB of frames on disk; 200 samples of 256 transitions (about 2.9 GB of frames read) grow RSS by < 200 MB."""
    item = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = disk.open(tmp_path / "big", "w", jb.CompressedTrajectoryBuffer.create(item, num_envs=8, length=4500, codec="none"))
    frames = jnp.asarray(np.random.default_rng(0).integers(0, 256, (8, 500, 4, 84, 84), dtype=np.uint8))
    chunk = {"obs": frames, "action": jnp.zeros((8, 500), jnp.int32), "reward": jnp.zeros((8, 500))}
    for _ in range(9):
        buf = ADD(buf, chunk, terminated=jnp.zeros((8, 500), bool))
    disk.flush(buf)
    buf.close()
    del frames, chunk
    ro = disk.open(tmp_path / "big", "r")
    keys = jax.random.split(jax.random.key(0), 201)
    jax.block_until_ready(ro.sample_transitions(keys[0], 256, n_step=3, gamma=0.99))

    before = _rss_mb()
    for k in keys[1:]:
        jax.block_until_ready(ro.sample_transitions(k, 256, n_step=3, gamma=0.99))
    assert _rss_mb() - before < 200


def test_a_prioritised_buffer_keeps_its_priorities_on_disk(tmp_path):
    make = lambda: jb.CompressedPrioritisedTrajectoryBuffer.create(  # noqa: E731
        STEP, num_envs=2, length=12, window_length=3, codec="none", frame_stack=4)
    chunk = _chunk(10, seed=4)
    buf, twin = (ADD(b, **chunk) for b in (disk.open(tmp_path / "p", "w", make()), make()))
    key = jax.random.key(0)
    s = buf.sample_transitions(key, 16, gamma=0.9)
    buf, twin = (b.set_priorities(s.indices, jnp.arange(1.0, 17.0), s.generations) for b in (buf, twin))
    disk.flush(buf)
    got = disk.open(tmp_path / "p", "r").sample_transitions(key, 32, gamma=0.9, beta=0.4)
    assert _same(got, twin.sample_transitions(key, 32, gamma=0.9, beta=0.4))


# --- episodes ---

EP_STEP = {"obs": jnp.zeros((4, 6, 6), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
EP_T = 8


def _make_episodes(**kw):
    kw = {"max_episodes": 4, "max_timesteps": EP_T, "meta": {"task": jnp.int32(-1)}, **kw}
    return jb.CompressedEpisodeBuffer.create(EP_STEP, codec="none", frame_stack=4, **kw)


def _episodes(seed, n):
    """`n` episodes as one batch (leaves [n, EP_T, ...]) of random lengths in [1, EP_T], flags, final observations and
    task ids; observations are stacks of 4 random frames as a frame stacker makes them."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, EP_T + 1, n)
    stacks, finals = stacked_episodes(rng.integers(0, 256, (n, EP_T + 1, 6, 6), dtype=np.uint8), lengths, 4)
    eps = {"obs": jnp.asarray(stacks), "action": jnp.asarray(rng.integers(0, 9, (n, EP_T)), jnp.int32),
           "reward": jnp.asarray(rng.standard_normal((n, EP_T)), jnp.float32)}
    return dict(episodes=eps, lengths=jnp.asarray(lengths, jnp.int32), terminated=jnp.asarray(rng.random(n) < 0.5),
                final_obs=jnp.asarray(finals), meta={"task": jnp.asarray(rng.integers(0, 2, n), jnp.int32)})


def _add_episodes(buf, batch):
    b = dict(batch)
    return buf.add_episodes(b.pop("episodes"), b.pop("lengths"), **b)


def _episode_samples(b):
    """Every sampler of an episode buffer, one key each, with and without a meta filter."""
    k = jax.random.key(7)
    where = lambda m: m["task"] == 1  # noqa: E731
    return (b.sample_episodes(k, 3, where=where), b.sample_sequences(k, 5, 2), b.sample_timesteps(k, 6, where=where),
            b.sample_transitions(k, 8, n_step=3, gamma=0.9))


EP_SAMPLES = jax.jit(_episode_samples)


@pytest.fixture(scope="module")
def episodes_built(tmp_path_factory):
    """A folder of 6 episodes (wrapped around its 4 slots), flushed; its in-memory twin; the twin's samples."""
    path = tmp_path_factory.mktemp("disk_ep") / "eps"
    buf, twin = disk.open(path, "w", _make_episodes()), _make_episodes()
    for seed in (0, 1):
        buf, twin = (_add_episodes(b, _episodes(seed, 3)) for b in (buf, twin))
    disk.flush(buf)
    buf.close()
    return path, twin, jax.tree.map(np.asarray, EP_SAMPLES(twin))


def test_an_episode_folder_reopens_with_identical_samples_jit_and_eager(episodes_built, tmp_path):
    path, twin, expected = episodes_built
    shutil.copytree(path, tmp_path / "eps")
    ro = disk.open(tmp_path / "eps", "r", jax.eval_shape(_make_episodes))
    assert int(ro.num_episodes()) == 4 and ro.host.num_rows == twin.host.num_rows
    assert _same(EP_SAMPLES(ro), expected)
    batch = _episodes(2, 1)
    with pytest.raises(disk.ReadOnlyError, match="mode='r'"):
        _add_episodes(ro, batch)
    with pytest.raises(disk.ReadOnlyError, match="flush"):
        disk.flush(ro)
    ro.close()
    rw = _add_episodes(disk.open(tmp_path / "eps", "r+"), batch)  # r+ continues from the flushed state (checked above)
    want = rw.sample_transitions(jax.random.key(7), 8, n_step=3, gamma=0.9)  # eager
    disk.flush(rw)
    rw.close()
    reopened = disk.open(tmp_path / "eps", "r")
    assert int(reopened.num_episodes()) == 4 and reopened.host.num_rows == twin.host.num_rows + int(batch["lengths"][0]) + 1
    assert _same(reopened.sample_transitions(jax.random.key(7), 8, n_step=3, gamma=0.9), want)


def test_an_episode_folder_checks_its_configuration(episodes_built):
    path, _, _ = episodes_built
    with pytest.raises(jb.CheckpointError, match="config 'max_timesteps'"):
        disk.open(path, "r", jax.eval_shape(lambda: _make_episodes(max_timesteps=EP_T + 1)))
    with pytest.raises(jb.CheckpointError, match=re.escape("config 'meta' differs at meta['task']: dtype int32 in the checkpoint, float32 in the target")):
        disk.open(path, "r", jax.eval_shape(lambda: _make_episodes(meta={"task": jnp.float32(0)})))
    with pytest.raises(jb.CheckpointError, match="CompressedEpisodeBuffer"):
        disk.open(path, "r", jax.eval_shape(_make))


def _tagged_episodes(b, max_episodes, max_timesteps, lengths, path=None):
    """An episode buffer (in `path` when given, flushed and reopened read-only) holding episodes of `lengths`: step t
    of the i-th episode added has obs [b, i, t] and action t, its final observation [b, i, length]; task i % 2."""
    buf = jb.CompressedEpisodeBuffer.create(ITEM, max_episodes=max_episodes, max_timesteps=max_timesteps, codec="none",
                                            meta={"task": jnp.int32(0)})
    buf = buf if path is None else disk.open(path, "w", buf)
    n = len(lengths)
    i, t = np.arange(n)[:, None], np.arange(max_timesteps + 1)[None, :]
    obs = np.stack(np.broadcast_arrays(np.full_like(i, b), i, t), axis=-1).astype(np.int32)  # [n, T + 1, 3]
    lengths = np.asarray(lengths, np.int32)
    eps = {"obs": jnp.asarray(obs[:, :-1]), "action": jnp.asarray(obs[:, :-1, 2]), "reward": jnp.zeros((n, max_timesteps))}
    buf = buf.add_episodes(eps, lengths, terminated=jnp.ones(n, bool), final_obs=jnp.asarray(obs[i[:, 0], lengths]),
                           meta={"task": jnp.asarray(np.arange(n) % 2, jnp.int32)})
    return _reopened(buf, path)


def test_concatenated_episodes_are_uniform_over_the_union_with_exact_contents(tmp_path):
    parts = [_tagged_episodes(0, 3, 6, [6, 2, 4], tmp_path / "a"), _tagged_episodes(1, 3, 9, [9, 1, 3])]  # a folder, memory
    lengths = {(0, 0): 6, (0, 1): 2, (0, 2): 4, (1, 0): 9, (1, 1): 1, (1, 2): 3}
    cat = disk.ConcatenatedEpisodes.create(parts)
    assert int(cat.size()) == sum(lengths.values()) and int(cat.num_episodes()) == 6
    out = jax.jit(lambda c, k: (c.sample_transitions(k, 6000, n_step=2, gamma=0.5), c.sample_episodes(k, 64),
                                c.sample_sequences(k, 64, 3)))(cat, jax.random.key(0))
    tr, eps, seqs = jax.device_get(out)
    obs, nxt, src = np.asarray(tr.sample.obs), np.asarray(tr.sample.next_obs), np.asarray(tr.source)
    np.testing.assert_array_equal(obs[:, 0], src)  # rows from the buffer the source names, its frames decoded
    np.testing.assert_array_equal(nxt, obs + np.array([0, 0, 1]) * tr.sample.num_steps[:, None])  # stored step or final obs
    rows, n = np.unique(obs, axis=0, return_counts=True)
    assert {tuple(r) for r in rows.tolist()} == {(b, i, t) for (b, i), l in lengths.items() for t in range(l)}
    expected = n.sum() / len(rows)
    chi2 = float(((n - expected) ** 2 / expected).sum())
    assert chi2 < 90.0, chi2  # 24 degrees of freedom: p < 1e-8 above 90
    e_obs, mask = np.asarray(eps.sample.item["obs"]), np.asarray(eps.sample.mask)
    assert e_obs.shape == (64, 9, 3)  # padded to the longest max_timesteps
    for r in range(64):
        b, i = e_obs[r, 0, :2]
        length = lengths[(b, i)]
        assert eps.source[r] == b and eps.sample.lengths[r] == length and mask[r].sum() == length and mask[r, :length].all()
        np.testing.assert_array_equal(e_obs[r, :length, 2], np.arange(length))
        assert not e_obs[r, length:].any()
        np.testing.assert_array_equal(eps.sample.final_obs[r], [b, i, length])
    s_obs = np.asarray(seqs.sample.item["obs"])
    np.testing.assert_array_equal(np.diff(s_obs[:, :, 2], axis=1), 1)  # windows inside one episode
    assert {(b, i) for b, i in s_obs[:, 0, :2].tolist()} == {k for k, l in lengths.items() if l >= 3}
    steps = cat.sample_timesteps(jax.random.key(1), 200, where=lambda m: m["task"] == 1)  # eager, filtered
    s_obs = np.asarray(steps.sample.item["obs"])
    np.testing.assert_array_equal(s_obs[:, 0], steps.source)
    assert {tuple(r) for r in s_obs.tolist()} == {(b, 1, t) for b in (0, 1) for t in range(lengths[(b, 1)])}  # odd episodes only


def test_concatenated_episodes_refuse_other_configurations():
    a = _tagged_episodes(0, 2, 3, [3])
    b = jb.CompressedEpisodeBuffer.create(ITEM, max_episodes=2, max_timesteps=3, codec="none", meta={"task": jnp.int16(0)})
    with pytest.raises(ValueError, match=re.escape("buffers[1]: config 'meta' differs at meta['task']: dtype int16 in buffers[1], int32 in buffers[0]")):
        disk.ConcatenatedEpisodes.create([a, b])
    with pytest.raises(TypeError, match=r"buffers\[1\]: expected a CompressedEpisodeBuffer, got CompressedTrajectoryBuffer"):
        disk.ConcatenatedEpisodes.create([a, _make()])
    cat = disk.ConcatenatedEpisodes.create([a, _tagged_episodes(1, 2, 3, [3])])
    with pytest.raises(TypeError, match="where: expected a list or tuple of 2 entries"):
        cat.sample_timesteps(jax.random.key(0), 4, where=[jnp.ones(2, bool)])
    with pytest.raises(ValueError, match=r"where\[1\]: expected shape \(2,\), got \(3,\)"):
        cat.sample_timesteps(jax.random.key(0), 4, where=[jnp.ones(2, bool), jnp.ones(3, bool)])


@pytest.mark.slow
def test_sampling_whole_episodes_from_a_large_folder_keeps_resident_memory_flat(tmp_path):
    """About 0.9 GB of frames on disk (256 episodes of 500 steps, one 84x84 frame stored per step); 40 samples of 4
    whole episodes (uint8 [4, 500, 4, 84, 84] each) grow RSS by < 200 MB."""
    step = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    make = lambda: jb.CompressedEpisodeBuffer.create(step, max_episodes=256, max_timesteps=500, frame_stack=4, codec="none")  # noqa: E731
    buf = disk.open(tmp_path / "big", "w", make())
    stacks, finals = stacked_episodes(np.random.default_rng(0).integers(0, 256, (16, 501, 84, 84), dtype=np.uint8), np.full(16, 500), 4)
    eps = {"obs": jnp.asarray(stacks), "action": jnp.zeros((16, 500), jnp.int32), "reward": jnp.zeros((16, 500))}
    del stacks
    add = jax.jit(jb.CompressedEpisodeBuffer.add_episodes)
    for _ in range(16):
        buf = add(buf, eps, jnp.full(16, 500, jnp.int32), terminated=jnp.ones(16, bool), final_obs=jnp.asarray(finals))
    disk.flush(buf)
    buf.close()
    del eps
    ro = disk.open(tmp_path / "big", "r")
    keys = jax.random.split(jax.random.key(0), 41)
    jax.block_until_ready(ro.sample_episodes(keys[0], 4))

    before = _rss_mb()
    for k in keys[1:]:
        jax.block_until_ready(ro.sample_episodes(k, 4))
    assert _rss_mb() - before < 200


def _with_delta_codec(obj, spec):
    """`obj` (parsed JSON) with every `delta_codec` of every dict in it set to `spec`."""
    if isinstance(obj, dict):
        return {k: spec if k == "delta_codec" else _with_delta_codec(v, spec) for k, v in obj.items()}
    return [_with_delta_codec(v, spec) for v in obj] if isinstance(obj, list) else obj


def test_a_keyframe_interval_1_folder_that_recorded_a_delta_codec_reopens(tmp_path):
    """A `keyframe_interval=1` folder whose files recorded the default delta codec (builds before `K = 1` dropped the
    unused codec) reopens, read-only and for writing, and gives its in-memory twin's sample."""
    from jaxbuffers import _checkpoint_files as files

    make = lambda: jb.CompressedTrajectoryBuffer.create(STEP, num_envs=2, length=12, codec="zstd:1", frame_stack=4, keyframe_interval=1)  # noqa: E731
    chunk = _chunk(20, seed=5)
    buf, twin = (_add(b, chunk, 2) for b in (disk.open(tmp_path / "k1", "w", make()), make()))
    assert buf.host.stores[0].delta_codec is None
    disk.flush(buf)
    buf.close()
    for f in (tmp_path / "k1").rglob("*.json"):
        f.write_text(json.dumps(_with_delta_codec(json.loads(f.read_text()), "rle:8")))
    for state in (tmp_path / "k1").glob("state-*"):
        files._write_manifest(state, files._Progress(False, ""))
    assert '"delta_codec": "rle:8"' in (tmp_path / "k1" / "disk.json").read_text()
    for mode in ("r", "r+"):
        old = disk.open(tmp_path / "k1", mode)
        assert old.host.stores[0].delta_codec is None and _same(_sample(old), _sample(twin))
        old.close()


def _without(obj, key):
    """`obj` (parsed JSON) with every `key` of every dict in it removed."""
    if isinstance(obj, dict):
        return {k: _without(v, key) for k, v in obj.items() if k != key}
    return [_without(v, key) for v in obj] if isinstance(obj, list) else obj


def test_a_folder_written_before_delta_codec_reopens(tmp_path):
    """A folder whose stores coded deltas with its codec and whose JSON files predate `delta_codec` reopens with the
    deltas coded by the codec, giving the in-memory twin's sample; a buffer of the default delta codec is refused. A
    folder of the default (RLE deltas, read from its chunk files) reopens with its twin's sample too."""
    from jaxbuffers import _checkpoint_files as files

    make = lambda **kw: jb.CompressedTrajectoryBuffer.create(STEP, num_envs=2, length=12, codec="zstd:1", frame_stack=4, **kw)  # noqa: E731
    chunk = _chunk(20, seed=4)
    buf, twin = (_add(b, chunk, 2) for b in (disk.open(tmp_path / "old", "w", make(delta_codec=None)), make(delta_codec=None)))
    disk.flush(buf)
    buf.close()
    for f in (tmp_path / "old").rglob("*.json"):
        f.write_text(json.dumps(_without(json.loads(f.read_text()), "delta_codec")))
    for state in (tmp_path / "old").glob("state-*"):  # the checkpoint of the device state: its manifest again
        files._write_manifest(state, files._Progress(False, ""))
    assert "delta_codec" not in "".join(f.read_text() for f in (tmp_path / "old").rglob("*.json"))
    old = disk.open(tmp_path / "old", "r")
    assert old.host.stores[0].delta_codec is None
    assert _same(_sample(old), _sample(twin))
    with pytest.raises(jb.CheckpointError, match="delta_codec"):
        disk.open(tmp_path / "old", "r", make())
    new, twin = (_add(b, chunk, 2) for b in (disk.open(tmp_path / "new", "w", make()), make()))  # RLE deltas read from chunk files
    disk.flush(new)
    new.close()
    new = disk.open(tmp_path / "new", "r")
    assert set(new.host.stores[0].stats()["codecs"]) == {"zstd", "rle"}
    assert _same(_sample(new), _sample(twin))


def test_concatenated_episodes_sequences_longer_than_one_buffer_draw_from_the_others():
    step = {"obs": jnp.zeros((4, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}

    def filled(max_timesteps, n, fill):
        buf = jb.CompressedEpisodeBuffer.create(step, max_episodes=2, max_timesteps=max_timesteps, codec="none")
        return buf.add_episode({"obs": jnp.full((n, 4, 4), fill, jnp.uint8), "action": jnp.zeros(n, jnp.int32),
                                "reward": jnp.zeros(n)}, n, terminated=True, final_obs=jnp.zeros((4, 4), jnp.uint8))

    both = disk.ConcatenatedEpisodes.create([filled(5, 5, 1), filled(8, 8, 2)])
    assert bool(both.can_sample_sequences(4, 6)) and bool(both.can_sample_sequences(4, 3))
    out = both.sample_sequences(jax.random.key(0), 16, 6)
    assert (np.asarray(out.source) == 1).all() and (np.asarray(out.sample.item["obs"]) == 2).all()
    for call in (lambda: both.can_sample_sequences(4, 9), lambda: both.sample_sequences(jax.random.key(0), 4, 9)):
        with pytest.raises(ValueError, match=r"^sequence_length: .* got 9 \(max_timesteps: \[5, 8\]\)"):
            call()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
@pytest.mark.parametrize("codec", ["none", "zstd:3"])
def test_episode_readers_close_what_they_open(tmp_path, codec, monkeypatch):
    """Readers of an episode folder, each sampled (which keeps it in JAX's compile caches) and closed by a `with`
    block, a reader dropped unclosed before any host call, and opens that fail after the files were opened (a reader,
    a writer, a new folder whose first flush fails): the process holds no more descriptors afterwards."""
    make = lambda: jb.CompressedEpisodeBuffer.create(EP_STEP, codec=codec, frame_stack=4, max_episodes=4, max_timesteps=EP_T,  # noqa: E731
                                                     meta={"task": jnp.int32(-1)})
    path = tmp_path / "eps"
    with disk.open(path, "w", make()) as buf:
        disk.flush(_add_episodes(buf, _episodes(0, 3)))
    copy = shutil.copytree(path, tmp_path / "copy")
    with pytest.raises(RuntimeError, match="after close"):  # the block closed it
        _add_episodes(buf, _episodes(1, 1))
    sample = lambda b: b.sample_transitions(jax.random.key(0), 8, n_step=2, gamma=0.9)  # noqa: E731
    with disk.open(path, "r") as ro:
        expected = jax.tree.map(np.asarray, sample(ro))
    gc.collect()
    before = _open_fds()
    for _ in range(3):
        with disk.open(path, "r") as ro:
            assert _same(sample(ro), expected)
        with disk.ConcatenatedEpisodes.create([disk.open(path, "r"), disk.open(copy, "r")]) as both:
            jax.block_until_ready(both.sample_timesteps(jax.random.key(0), 8))
        ro = disk.open(path, "r")
        assert int(ro.num_episodes()) == 3  # device fields only: no host call keeps it alive
        del ro
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    meta = json.loads((broken / "disk.json").read_text())
    meta["host"]["version"] += 1  # the device state no longer matches: found once the stores are open
    (broken / "disk.json").write_text(json.dumps(meta))
    for mode in ("r", "r+") * 3:
        with pytest.raises(jb.CheckpointError, match="a flush was interrupted"):
            disk.open(broken, mode)
    def full_disk(*args):
        raise OSError("no space left on device")

    monkeypatch.setattr(_disk_folder, "commit", full_disk)
    raised = []  # kept, as a notebook keeps its last traceback: the frames that made the stores stay alive
    for i in range(3):
        with pytest.raises(OSError, match="no space left") as info:
            disk.open(tmp_path / f"new{i}", "w", make())
        raised.append(info)
    monkeypatch.undo()
    gc.collect()
    assert _open_fds() == before
    _disk_folder.FolderLock(broken).release()  # each failed "r+" or "w" released the folder's lock
    for i in range(3):
        _disk_folder.FolderLock(tmp_path / f"new{i}").release()
