"""Tests of jaxbuffers.compressed.episode: CompressedEpisodeBuffer.

Model-based: a seeded random sequence of adds (single and batched, random lengths, flags, meta values), reward
relabelling and every sampler (with and without a meta filter) runs on a `CompressedEpisodeBuffer` and on an
`EpisodeBuffer` holding the same (uncompressed) episodes; every output must be identical. The episodes' stacked
observations are what a frame stacker makes from each episode's frames, so frame dedup must rebuild them exactly.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_episode import assert_empty_rows

import jaxbuffers as jb
from jaxbuffers import checkpoint as ckpt
from jaxbuffers.compressed import CompressedEpisodeBuffer

K, HW, E, M = 3, 5, 3, 5


def stacks(frames: np.ndarray, axis: int, padding: str) -> np.ndarray:
    """Frame stacks `[n, ...]` of frames `[n, HW, HW]` of one episode: stack `t` holds frames `t-K+1 .. t`, those
    before the episode's start repeating frame 0 (`"reset"`) or zeros."""
    n = len(frames)
    idx = np.arange(n)[:, None] + np.arange(-K + 1, 1)[None, :]
    out = frames[np.maximum(idx, 0)]
    if padding == "zero":
        out = np.where((idx < 0)[..., None, None], 0, out)
    return np.moveaxis(out, 1, axis % 4 if axis < 0 else axis + 1) if axis else out


CONFIGS = {
    "stack0-reset-circular": dict(kind="stack", axis=0, padding="reset", circular=True),
    "stack-last-zero-fixed": dict(kind="stack", axis=-1, padding="zero", circular=False),
    "dict-whole-circular": dict(kind="dict", circular=True),
}


def _setup(cfg, **extra):
    if cfg["kind"] == "stack":
        shape = (K, HW, HW) if cfg["axis"] == 0 else (HW, HW, K)
        obs = jnp.zeros(shape, jnp.uint8)
        kw = dict(frame_stack=K, stack_axis=cfg["axis"], padding=cfg["padding"], codec="rle")
    else:
        obs = {"pixels": jnp.zeros((HW, HW), jnp.uint8), "vec": jnp.zeros((2,), jnp.float32)}
        kw = dict(compress=("pixels",), codec="zstd:1", dictionary_bytes=0)
    step = {"obs": obs, "action": jnp.int32(0), "reward": jnp.float32(0)}
    common = dict(max_episodes=E, max_timesteps=M, meta={"task_id": jnp.int32(-1)}, circular=cfg["circular"])
    return step, CompressedEpisodeBuffer.create(step, **common, **kw, **extra), jb.EpisodeBuffer.create(step, **common)


def _episode(rng, cfg, n: int, t: int):
    """One episode of `n` steps padded to `t`, and its final observation."""
    frames = rng.integers(0, 256, (n + 1, HW, HW), dtype=np.uint8)
    if cfg["kind"] == "stack":
        obs = stacks(frames, cfg["axis"], cfg["padding"])
    else:
        obs = {"pixels": frames, "vec": rng.standard_normal((n + 1, 2)).astype(np.float32)}
    pad = lambda x: np.concatenate([x[:n], np.zeros((t - n, *x.shape[1:]), x.dtype)])  # noqa: E731
    ep = {"obs": jax.tree.map(pad, obs), "action": rng.integers(0, 9, t).astype(np.int32),
          "reward": rng.standard_normal(t).astype(np.float32)}
    return ep, jax.tree.map(lambda x: x[n], obs)


def _samples(b, key):
    where = lambda m: m["task_id"] == 1  # noqa: E731
    return (b.sample_episodes(key, 3), b.sample_episodes(key, 2, where=where), b.sample_sequences(key, 4, 2),
            b.sample_timesteps(key, 5, where=where), b.sample_transitions(key, 6, n_step=3, gamma=0.9),
            b.get_all(), b.can_sample(2, where=where))


def _same(a, b, what):
    assert jax.tree.structure(a) == jax.tree.structure(b), what
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=what)


def run(cfg, seed: int, use_jit: bool, num_ops: int = 10, **extra):
    _, cbuf, ubuf = _setup(cfg, **extra)
    rng = np.random.default_rng(seed)

    def add_one(b, ep, n, te, tr, fo, task):
        return b.add_episode(ep, n, terminated=te, truncated=tr, final_obs=fo, meta={"task_id": task})

    def add_two(b, eps, n, te, tr, fo, task):
        return b.add_episodes(eps, n, terminated=te, truncated=tr, final_obs=fo, meta={"task_id": task})

    def relabel(b, s, r):
        return b.update(s.indices, {"reward": r}, steps=s.steps, generations=s.generations)

    samples = _samples
    if use_jit:
        add_one, add_two, relabel = (jax.jit(f, donate_argnums=0) for f in (add_one, add_two, relabel))
        samples = jax.jit(_samples)
    last = None
    for i in range(num_ops):
        op = int(rng.integers(0, 4)) if i else 0
        key = jax.random.key(int(rng.integers(1 << 30)))
        if op in (0, 1):
            nb = 1 if op == 0 else 2
            lens = rng.integers(1, M + 1, nb)
            t = M  # one shape: each program compiles once
            eps = [_episode(rng, cfg, int(n), t) for n in lens]
            args = [jax.tree.map(lambda *x: np.stack(x), *[e for e, _ in eps]), lens.astype(np.int32),
                    rng.random(nb) < 0.5, rng.random(nb) < 0.5, jax.tree.map(lambda *x: np.stack(x), *[f for _, f in eps]),
                    rng.integers(0, 2, nb).astype(np.int32)]
            if nb == 1:
                args = [jax.tree.map(lambda x: x[0], a) for a in args]
                args[2], args[3] = bool(args[2]), bool(args[3])
            add = add_one if nb == 1 else add_two
            full = not cfg["circular"] and int(ubuf.num_episodes()) + nb > E
            if full and not use_jit:
                for b in (cbuf, ubuf):
                    with pytest.raises(jb.BufferFullError, match="no room"):
                        add(b, *args)
                continue
            cbuf, ubuf = add(cbuf, *args), add(ubuf, *args)
            assert bool(cbuf.overflowed) == bool(ubuf.overflowed)
        elif op == 2 and last is not None:
            r = jnp.asarray(rng.standard_normal(6).astype(np.float32))
            cbuf, ubuf = relabel(cbuf, last, r), relabel(ubuf, last, r)
        else:
            got, want = samples(cbuf, key), samples(ubuf, key)
            _same(got, want, f"op {i}")
            last = want[4]
    _same(samples(cbuf, jax.random.key(3)), samples(ubuf, jax.random.key(3)), "end")
    _same(cbuf.buffer.lengths, ubuf.lengths, "lengths")
    return cbuf, ubuf


@pytest.mark.slow  # the default run: test_temporal_coding_is_exact_after_episodes_are_replaced (circular, K = 8, jit)
def test_exact_against_the_uncompressed_buffer():
    cbuf, ubuf = run(CONFIGS["stack-last-zero-fixed"], seed=8, use_jit=True)
    assert cbuf.step_spec == ubuf.step_spec


@pytest.mark.slow
@pytest.mark.parametrize("use_jit, config", [(True, "stack0-reset-circular"), (True, "dict-whole-circular"), (False, "stack-last-zero-fixed")])
def test_exact_against_the_uncompressed_buffer_each_layout(config, use_jit):
    run(CONFIGS[config], seed=7 + use_jit, use_jit=use_jit)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_exact_against_the_uncompressed_buffer_more_seeds(config, seed):
    run(CONFIGS[config], seed=100 + seed, use_jit=bool(seed % 2), num_ops=16)


def _filled(cfg_name="stack0-reset-circular", n_eps=2):
    cfg = CONFIGS[cfg_name]
    _, cbuf, _ = _setup(cfg)
    rng = np.random.default_rng(0)
    for _ in range(n_eps):
        ep, fin = _episode(rng, cfg, 4, M)
        cbuf = cbuf.add_episode(ep, 4, terminated=True, final_obs=fin)
    return cbuf, cfg, rng


def test_one_frame_per_step_is_stored():
    cbuf, _, _ = _filled(n_eps=2)
    assert cbuf.host.num_rows == 2 * (4 + 1)  # 4 steps and the final observation, one frame each
    assert cbuf.host.stores[0]._declared[1] == (HW, HW)
    assert cbuf.device_nbytes < cbuf.uncompressed_nbytes() // 4


def test_stale_states_are_refused():
    cbuf, cfg, rng = _filled()
    ep, fin = _episode(rng, cfg, 3, M)
    newer = cbuf.add_episode(ep, 3, terminated=False, final_obs=fin)
    with pytest.raises(jb.StaleBufferError, match="last add"):
        cbuf.add_episode(ep, 3, terminated=False, final_obs=fin)
    newer = newer.add_episode(ep, 3, terminated=False, final_obs=fin)  # the newest state carries on
    newer = newer.add_episode(ep, 3, terminated=False, final_obs=fin)  # slots of cbuf's episodes rewritten
    with pytest.raises(Exception, match="StaleBufferError|rewritten"):
        jax.block_until_ready(cbuf.get_all())
    assert int(newer.num_episodes()) == E


def test_a_refused_add_leaves_the_buffer_as_it_was():
    cbuf, cfg, rng = _filled("stack-last-zero-fixed", n_eps=3)
    before, version, writes = jax.tree.map(np.asarray, cbuf.get_all()), int(cbuf.version), cbuf.host.num_writes
    ep, fin = _episode(rng, cfg, 3, M)
    with pytest.raises(jb.BufferFullError):
        cbuf.add_episode(ep, 3, terminated=False, final_obs=fin)
    with pytest.raises(ValueError, match="split_long: not with frame_stack=3"):
        cbuf.add_episode(jax.tree.map(lambda x: np.concatenate([x, x]), ep), 7, terminated=False, final_obs=fin, split_long=True)
    with pytest.raises(TypeError, match="episode\\['obs'\\]: expected dtype uint8"):
        cbuf.add_episode({**ep, "obs": ep["obs"].astype(np.int16)}, 3, terminated=False, final_obs=fin)
    with pytest.raises(ValueError, match="episode\\['obs'\\]: expected shape"):
        cbuf.add_episode({**ep, "obs": ep["obs"][..., :2]}, 3, terminated=False, final_obs=fin)
    with pytest.raises(TypeError, match="fields: 'obs' holds host-compressed leaves"):
        cbuf.update(jnp.zeros(1, jnp.int32), {"obs": jnp.zeros((1, M, HW, HW, K), jnp.uint8)})
    assert int(cbuf.version) == version and cbuf.host.num_writes == writes
    _same(cbuf.get_all(), before, "after refusals")
    # inside jit the full fixed buffer writes nothing and sets the sticky flag
    add = jax.jit(lambda b: b.add_episode(ep, 3, terminated=False, final_obs=fin))
    new = add(cbuf)
    assert bool(new.overflowed) and not bool(cbuf.overflowed)
    _same(new.get_all(), before, "after an overflowing jitted add")


def test_corrupt_host_bytes_are_detected():
    cbuf, _, _ = _filled()
    store = cbuf.host.stores[0]
    store._check[0] ^= 1  # the checksum of step 0 of the first episode
    with pytest.raises(Exception, match="corrupt"):
        jax.block_until_ready(cbuf.get_all())


def test_vmap_of_an_add_is_refused():
    cbuf, cfg, rng = _filled()
    ep, fin = _episode(rng, cfg, 3, M)
    eps = jax.tree.map(lambda x: np.stack([x, x]), ep)
    fins = np.stack([fin, fin])
    with pytest.raises(ValueError, match="cannot be vmapped"):
        jax.vmap(lambda e, f: cbuf.add_episode(e, 3, terminated=False, final_obs=f))(eps, fins)


def test_decode_of_an_inner_sample_with_rows_left_out_as_zeros():
    cbuf, _, _ = _filled("dict-whole-circular", n_eps=3)
    inner = cbuf.buffer.sample_transitions(jax.random.key(4), 6, n_step=2, gamma=0.9)
    rows = np.array([True, False, True, False, False, True])
    decode = jax.jit(lambda b, s, r: b.decode(s, rows=r))
    part, full = (jax.tree.map(np.asarray, decode(cbuf, inner, r)) for r in (rows, np.ones(6, bool)))
    for name, x, y in (("obs", part.obs["pixels"], full.obs["pixels"]), ("next_obs", part.next_obs["pixels"], full.next_obs["pixels"]),
                       ("window", part.window["obs"]["pixels"], full.window["obs"]["pixels"])):
        np.testing.assert_array_equal(x[rows], y[rows], err_msg=name)
        assert not x[~rows].any(), name  # zeros, read from the never-written slot
    np.testing.assert_array_equal(part.obs["vec"], full.obs["vec"])  # device leaves untouched
    with pytest.raises(TypeError, match="sample: expected one of"):
        cbuf.decode(inner._asdict())
    with pytest.raises(ValueError, match=r"rows: expected shape \(6,\)"):
        cbuf.decode(inner, rows=rows[:3])


@pytest.mark.parametrize("use_jit, config", [(True, "stack0-reset-circular"), (False, "dict-whole-circular")])
def test_nothing_passes_gives_the_same_empty_rows(use_jit, config):
    """A filter nothing passes (and a window longer than every episode): both buffers return the same empty rows
    (indices -1, zeros, decoded observations included); a filter that passes still decodes the same rows."""
    cfg = CONFIGS[config]
    _, cbuf, ubuf = _setup(cfg)
    rng = np.random.default_rng(1)
    for task in (0, 1, 0):  # every slot held: a wrong sampler would decode some episode's frames
        ep, fin = _episode(rng, cfg, 4, M)
        cbuf, ubuf = (b.add_episode(ep, 4, terminated=False, final_obs=fin, meta={"task_id": task}) for b in (cbuf, ubuf))

    def samples(b, where, length):
        key = jax.random.key(2)
        return (b.sample_episodes(key, 3, where=where), b.sample_timesteps(key, 3, where=where),
                b.sample_transitions(key, 3, n_step=2, gamma=0.9, where=where),
                b.sample_sequences(key, 3, length, where=where))

    run = jax.jit(samples, static_argnums=2) if use_jit else samples
    nothing = np.asarray(ubuf.meta["task_id"]) == 7
    got, want = run(cbuf, nothing, 2), run(ubuf, nothing, 2)
    _same(got, want, "nothing passes")
    for s in got:
        assert_empty_rows(s)
    one = np.asarray(ubuf.meta["task_id"]) == 1
    got, want = run(cbuf, one, M), run(ubuf, one, M)  # the window of M steps fits no episode of 4
    _same(got, want, "window longer than every episode")
    assert_empty_rows(got[3])
    for s in got[:3]:
        np.testing.assert_array_equal(np.asarray(s.indices), 1)


# --- temporal coding (keyframe_interval) ---

@pytest.mark.parametrize("config, interval", [("stack0-reset-circular", 8), pytest.param("dict-whole-circular", 2, marks=pytest.mark.slow)])
def test_temporal_coding_is_exact_after_episodes_are_replaced(config, interval):
    """Deltas against the step before, a keyframe every `interval` steps (K=2: several chains per episode), through
    enough adds that the ring replaces episodes (longer ones by shorter ones too): every sampler still returns exactly
    what the uncompressed buffer returns under jit."""
    cbuf, ubuf = run(CONFIGS[config], seed=21, use_jit=True, num_ops=14, keyframe_interval=interval)
    assert cbuf.keyframe_interval == interval and ubuf.num_added() > E and cbuf.step_spec == ubuf.step_spec
    store = cbuf.host.stores[0]
    held = [(e, t) for e in range(E) for t in range(int(ubuf.lengths[e]))]
    assert all((store._base[e * M + t] == -1) == (t % interval == 0) for e, t in held)  # the layout of the module doc


def test_a_replaced_episode_drops_the_deltas_its_shorter_successor_leaves_without_base():
    cfg = CONFIGS["dict-whole-circular"]
    _, cbuf, ubuf = _setup(cfg, keyframe_interval=8)
    rng = np.random.default_rng(5)
    for n in (M, M, M, 2):  # the 4th episode (2 steps) replaces the first (M steps) in slot 0
        ep, fin = _episode(rng, cfg, n, M)
        cbuf, ubuf = (b.add_episode(ep, n, terminated=True, final_obs=fin) for b in (cbuf, ubuf))
    store = cbuf.host.stores[0]
    assert (store._chunk[2:M] < 0).all()  # the old steps 2.. of slot 0: their chain's base was rewritten, deleted
    assert (store._base[[1, M + 1, 2 * M + 1]] == [0, M, 2 * M]).all() and (store._chunk[M:3 * M] >= 0).all()
    _same(cbuf.get_all(), ubuf.get_all(), "after the replacement")  # every stored frame and final observation


def test_temporal_coding_stores_slowly_changing_frames_in_fewer_bytes():
    step = {"obs": jnp.zeros((32, 32), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    rng = np.random.default_rng(0)
    frames = np.repeat(rng.integers(0, 256, (1, 32, 32), dtype=np.uint8), 17, axis=0)
    for t in range(1, 17):  # a few pixels change per step
        frames[t:, rng.integers(0, 32, 4), rng.integers(0, 32, 4)] = rng.integers(0, 256, 4, dtype=np.uint8)
    ep = {"obs": frames[:16], "action": np.zeros(16, np.int32), "reward": np.zeros(16, np.float32)}
    sizes = {}
    for interval in (1, 8):
        b = CompressedEpisodeBuffer.create(step, max_episodes=2, max_timesteps=16, codec="zstd:1", dictionary_bytes=0,
                                           keyframe_interval=interval)
        b = b.add_episode(ep, 16, terminated=True, final_obs=frames[16])
        np.testing.assert_array_equal(np.asarray(b.get_all().item["obs"][0]), frames[:16])
        sizes[interval] = b.host_live_nbytes
    assert sizes[8] < sizes[1] * 0.6, sizes


def test_keyframe_interval_default_and_refusals():
    step = {"obs": jnp.zeros((4, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    create = lambda **kw: CompressedEpisodeBuffer.create(step, max_episodes=2, max_timesteps=3, **kw)  # noqa: E731
    assert create().keyframe_interval == jb.compressed.DEFAULT_KEYFRAME_INTERVAL
    assert create(codec="none").keyframe_interval == 1 and create(codec="none", keyframe_interval=4).keyframe_interval == 4
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="keyframe_interval: expected a Python int >= 1"):
            create(keyframe_interval=bad)


def test_temporal_coding_round_trips_through_a_checkpoint(tmp_path):
    cfg = CONFIGS["stack0-reset-circular"]
    step, cbuf, _ = _setup(cfg, keyframe_interval=8)
    rng = np.random.default_rng(2)
    for n in (M, 3, M, 4):  # slot 0 replaced
        ep, fin = _episode(rng, cfg, n, M)
        cbuf = cbuf.add_episode(ep, n, terminated=False, truncated=True, final_obs=fin)
    jb.save(tmp_path / "ck", cbuf)
    got = jb.restore(tmp_path / "ck")
    assert got.keyframe_interval == 8 and got.host is not cbuf.host
    _same(got.get_all(), cbuf.get_all(), "restored")
    ep, fin = _episode(rng, cfg, M, M)
    got, cbuf = (b.add_episode(ep, M, terminated=True, final_obs=fin) for b in (got, cbuf))  # adds go on as deltas
    _same(got.get_all(), cbuf.get_all(), "restored, then added to")
    other = CompressedEpisodeBuffer.create(step, max_episodes=E, max_timesteps=M, meta={"task_id": jnp.int32(-1)},
                                           frame_stack=K, codec="rle", keyframe_interval=1)
    with pytest.raises(jb.CheckpointError, match="config 'keyframe_interval'"):
        jb.restore(tmp_path / "ck", other)


def test_a_checkpoint_without_keyframe_interval_restores_whole_frames(tmp_path):
    """A checkpoint written before `keyframe_interval` existed (every frame whole) restores with K = 1."""
    cfg = CONFIGS["dict-whole-circular"]
    _, cbuf, _ = _setup(cfg, keyframe_interval=1)
    ep, fin = _episode(np.random.default_rng(3), cfg, 4, M)
    cbuf = cbuf.add_episode(ep, 4, terminated=True, final_obs=fin)
    root = tmp_path / "ck"
    jb.save(root, cbuf)
    meta = json.loads((root / "buffer.json").read_text())
    del meta["config"]["keyframe_interval"]
    (root / "buffer.json").write_text(json.dumps(meta))
    ckpt._write_manifest(root, ckpt._Progress(False, ""))
    got = jb.restore(root)
    assert got.keyframe_interval == 1
    _same(got.get_all(), cbuf.get_all(), "restored")
