"""The sb3-extra-buffers-named SB3 classes: every constructor option, samples against SB3's own buffers."""

from __future__ import annotations

import pickle

import jax
import numpy as np
import pytest

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.buffers import DictReplayBuffer, DictRolloutBuffer, ReplayBuffer, RolloutBuffer  # noqa: E402

from jaxbuffers.interop.sb3 import (  # noqa: E402
    CompressedDictReplayBuffer, CompressedDictRolloutBuffer, CompressedReplayBuffer, CompressedRolloutBuffer, codec_for,
)

PIX = spaces.Box(0, 255, (3, 6, 6), np.uint8)
FPIX = spaces.Box(0, 255, (3, 6, 6), np.float32)  # pixels in a float space
DICT = spaces.Dict({"img": spaces.Box(0, 255, (2, 5, 5), np.uint8), "vec": spaces.Box(-1, 1, (3,), np.float32)})
ACT = spaces.Discrete(3)


@pytest.mark.parametrize("method, kwargs, dtypes, codec", [
    ("rle", None, None, "rle:8"), ("rle-jit", None, dict(elem_type=np.uint8, runs_type=np.uint16), "rle:16"),
    ("rle-old", None, dict(elem_type=np.uint8, runs_type=np.uint32), "rle:32"), ("rle", None, np.uint8, "rle:8"),
    ("gzip", None, None, "igzip:3"), ("gzip1", None, None, "igzip:1"), ("gzip9", None, None, "igzip:3"),
    ("igzip0", None, None, "igzip:0"), ("igzip", dict(compresslevel=2), None, "igzip:2"),
    ("zstd", None, None, "zstd:3"), ("zstd5", None, None, "zstd:5"), ("zstd-3", None, None, "zstd:-3"),
    ("zstd", dict(compresslevel=7), None, "zstd:7"), ("none", None, None, "none"), ("ZSTD/4", None, None, "zstd:4"),
    # the method name's level wins over compresslevel, as in sb3-extra-buffers; zstd takes threads (encoding only)
    ("gzip9", dict(compresslevel=1), None, "igzip:3"), ("igzip0", dict(compresslevel=2), None, "igzip:0"),
    ("zstd5", dict(compresslevel=1), None, "zstd:5"), ("zstd/-2", dict(compresslevel=7), None, "zstd:-2"),
    ("zstd-1", dict(threads=4), None, "zstd:-1"), ("zstd", dict(compresslevel=2, threads=0), None, "zstd:2"),
])
def test_codec_for_maps_every_method_name(method, kwargs, dtypes, codec):
    assert codec_for(method, kwargs, dtypes)[0] == codec


@pytest.mark.parametrize("method, kwargs, dtypes, decomp, error, match", [
    ("lz4-frame", None, None, None, ValueError, "lz4"), ("lz4-block/9", None, None, None, ValueError, "igzip0"),
    ("brotli", None, None, None, ValueError, r"compression_method: expected one of \('none', 'rle'.*got 'brotli'"), ("gzip12", None, None, None, ValueError, "0..9"),
    ("zstd99", None, None, None, ValueError, "level"), ("rle", dict(threads=2), None, None, ValueError, "threads"),
    ("rle", None, dict(elem_type=np.uint8, runs_type=np.uint64), None, ValueError, "runs_type"),
    ("rle", None, dict(elem=np.uint8), None, ValueError, "dtypes: unknown keys"),
    ("rle", None, dict(runs_type=np.uint16), dict(runs_type=np.uint8), ValueError, "decompression_kwargs"),
    ("zstd", dict(compresslevel="3"), None, None, TypeError, "compresslevel"), (3, None, None, None, TypeError, "compression_method"),
    ("gzip1", dict(threads=2), None, None, ValueError, "threads.*only zstd"), ("zstd", dict(threads=-1), None, None, ValueError, "threads"),
    ("zstd", dict(threads=2.0), None, None, TypeError, "threads"), ("zstd", dict(threads=True), None, None, TypeError, "threads"),
])
def test_codec_for_refuses_with_the_option_named(method, kwargs, dtypes, decomp, error, match):
    with pytest.raises(error, match=match):
        codec_for(method, kwargs, dtypes, decomp)


def _obs(space, n, rng):
    if isinstance(space, spaces.Dict):
        return {k: _obs(s, n, rng) for k, s in space.spaces.items()}
    if space.shape == (3,):
        return rng.uniform(-1, 1, (n, 3)).astype(space.dtype)
    return rng.integers(0, 4, (n, *space.shape)).astype(space.dtype)  # few values: runs to encode


def _fill_rollout(bufs, space, n, steps, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        args = (_obs(space, n, rng), rng.integers(0, 3, (n, 1)), rng.normal(size=n).astype(np.float32),
                (rng.random(n) < 0.3).astype(np.float32), th.from_numpy(rng.normal(size=(n, 1)).astype(np.float32)),
                th.from_numpy(rng.normal(size=n).astype(np.float32)))
        for b in bufs:
            b.add(*args)
    last = th.from_numpy(rng.normal(size=(n, 1)).astype(np.float32))
    for b in bufs:
        b.compute_returns_and_advantage(last, np.array([1] + [0] * (n - 1)))


def _assert_same(a, b, normalized=()):
    for f in a._fields:
        x, y = getattr(a, f), getattr(b, f)
        if isinstance(x, dict):
            for k in x:
                want = x[k].float() / 255 if k in normalized else x[k]
                assert y[k].dtype == want.dtype, (f, k)
                th.testing.assert_close(y[k], want, rtol=1e-6, atol=1e-6, msg=f"{f}[{k}]")
        elif x is not None:
            want = x.float() / 255 if f in ("observations", "next_observations") and normalized else x
            assert y.dtype == want.dtype, (f, y.dtype, want.dtype)
            th.testing.assert_close(y, want, rtol=1e-6, atol=1e-6, msg=f)


def _rollout_batches(buf, seed=5):
    np.random.seed(seed)
    return list(buf.get(6))


@pytest.mark.parametrize("method, normalize", [
    ("rle", False), ("gzip1", True), ("zstd-1", False), ("none", True),
])
def test_rollout_equals_sb3_every_method(method, normalize):
    n, steps = 2, 9
    ref = RolloutBuffer(steps, PIX, ACT, "cpu", n_envs=n)
    ours = CompressedRolloutBuffer(steps, PIX, ACT, "cpu", n_envs=n, compression_method=method, normalize_images=normalize)
    assert isinstance(ours, RolloutBuffer)
    _fill_rollout([ref, ours], PIX, n, steps)
    want = ref.observations / np.float32(255) if normalize else ref.observations  # before get() reorders SB3's
    np.testing.assert_allclose(ours.observations, want, rtol=1e-6)
    for a, b in zip(_rollout_batches(ref), _rollout_batches(ours)):
        _assert_same(a, b, normalized=("observations",) if normalize else ())


def test_rollout_elem_type_narrower_than_the_space_is_exact_or_refused():
    n, steps = 2, 5
    ref = RolloutBuffer(steps, FPIX, ACT, "cpu", n_envs=n)
    ours = CompressedRolloutBuffer(steps, FPIX, ACT, "cpu", n_envs=n, dtypes=dict(elem_type=np.uint8, runs_type=np.uint8))
    assert ours.jax_buffer.step_spec["obs"].dtype == np.uint8
    _fill_rollout([ref, ours], FPIX, n, steps)
    for a, b in zip(_rollout_batches(ref), _rollout_batches(ours)):
        _assert_same(a, b)  # float32 back, as SB3
    bad = CompressedRolloutBuffer(steps, FPIX, ACT, "cpu", n_envs=n, dtypes=np.uint8)
    obs = np.full((n, *FPIX.shape), 0.5, np.float32)
    with pytest.raises(TypeError, match="obs"):
        bad.add(obs, np.zeros((n, 1)), np.zeros(n), np.zeros(n), th.zeros(n, 1), th.zeros(n))
    with pytest.raises(TypeError, match="elem_type"):
        CompressedRolloutBuffer(steps, spaces.Box(0, 1000, (4,), np.int32), ACT, "cpu", dtypes=np.uint8)
    with pytest.raises(ValueError, match="normalize_images"):
        CompressedRolloutBuffer(steps, FPIX, ACT, "cpu", normalize_images=True)


@pytest.mark.parametrize("keys", [None, ("img",)], ids=["all-keys", "img-only"])
def test_dict_rollout_equals_sb3(keys):
    n, steps = 3, 6
    ref = DictRolloutBuffer(steps, DICT, ACT, "cpu", n_envs=n)
    ours = CompressedDictRolloutBuffer(steps, DICT, ACT, "cpu", n_envs=n, compression_method="zstd1", compress_keys=keys,
                                       normalize_images=keys is not None)
    assert isinstance(ours, DictRolloutBuffer)
    _fill_rollout([ref, ours], DICT, n, steps)
    for a, b in zip(_rollout_batches(ref), _rollout_batches(ours)):
        _assert_same(a, b, normalized=("img",) if keys else ())
    with pytest.raises(ValueError, match="compress_keys"):
        CompressedDictRolloutBuffer(steps, DICT, ACT, "cpu", compress_keys=("nope",))


def test_rollout_pickles_through_checkpoint_bytes():
    n, steps = 2, 4
    ours = CompressedRolloutBuffer(steps, PIX, ACT, "cpu", n_envs=n, compression_method="gzip3", normalize_images=True)
    _fill_rollout([ours], PIX, n, steps)
    back = pickle.loads(pickle.dumps(ours))
    assert back.compression_method == "gzip3" and back._codec == "igzip:3"
    for a, b in zip(_rollout_batches(ours), _rollout_batches(back)):
        _assert_same(a, b)


def _fill_replay(bufs, space, n, steps, seed=0):
    """SB3's off-policy loop: the next row's obs is this row's next_obs unless the env ended (then a reset obs)."""
    rng = np.random.default_rng(seed)
    obs = _obs(space, n, rng)
    for _ in range(steps):
        nxt = _obs(space, n, rng)
        done = rng.random(n) < 0.25
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
        act, rew = rng.integers(0, 3, n), rng.normal(size=n)
        for b in bufs:
            b.add(obs, nxt, act, rew, done, infos)
        reset = _obs(space, n, rng)
        pick = lambda a, r: np.where(done.reshape((n,) + (1,) * (a.ndim - 1)), r, a)  # noqa: E731
        obs = {k: pick(nxt[k], reset[k]) for k in nxt} if isinstance(nxt, dict) else pick(nxt, reset)


def _replay_samples(buf, seed=11):
    np.random.seed(seed)
    return buf.sample(16)


@pytest.mark.parametrize("method, output_dtype, normalize", [
    ("rle", "raw", False), ("igzip1", "float", False), ("zstd-2", "raw", True), ("gzip", "float", True),
])
def test_replay_equals_sb3_with_options(method, output_dtype, normalize):
    n, size, steps = 2, 20, 17  # 10 rows per env: the ring wraps
    ref = ReplayBuffer(size, PIX, ACT, "cpu", n_envs=n)
    ours = CompressedReplayBuffer(size, PIX, ACT, "cpu", n_envs=n, compression_method=method, output_dtype=output_dtype,
                                  normalize_images=normalize)
    _fill_replay([ref, ours], PIX, n, steps)
    a, b = _replay_samples(ref), _replay_samples(ours)
    if output_dtype == "float" and not normalize:
        a = a._replace(observations=a.observations.float(), next_observations=a.next_observations.float())
    _assert_same(a, b, normalized=normalize)


@pytest.mark.parametrize("keys", [pytest.param(None, marks=pytest.mark.slow), ("img",)], ids=["all-keys", "img-only"])
def test_dict_replay_equals_sb3_and_pickles(keys):
    n, size, steps = 2, 16, 13
    ref = DictReplayBuffer(size, DICT, ACT, "cpu", n_envs=n)
    ours = CompressedDictReplayBuffer(size, DICT, ACT, "cpu", n_envs=n, compression_method="zstd1", compress_keys=keys)
    assert isinstance(ours, DictReplayBuffer)
    _fill_replay([ref, ours], DICT, n, steps)
    _assert_same(_replay_samples(ref), _replay_samples(ours))
    back = pickle.loads(pickle.dumps(ours))
    _assert_same(_replay_samples(ref), _replay_samples(back))


def test_replay_refuses_options_it_cannot_honour():
    with pytest.raises(ValueError, match="output_dtype"):
        CompressedReplayBuffer(8, PIX, ACT, "cpu", output_dtype="half")
    with pytest.raises(TypeError, match="optimize_memory_usage"):
        CompressedReplayBuffer(8, PIX, ACT, "cpu", optimize_memory_usage="False")
    with pytest.raises(ValueError, match="lz4"):
        CompressedReplayBuffer(8, PIX, ACT, "cpu", compression_method="lz4-frame")
    with pytest.raises(TypeError, match="CompressedDictReplayBuffer|JaxDictReplayBuffer"):
        CompressedReplayBuffer(8, DICT, ACT, "cpu")
    for cls in (CompressedReplayBuffer, CompressedRolloutBuffer):  # x / 255 of float pixels: one check, one message
        with pytest.raises(ValueError, match="normalize_images: .*observation.* has dtype float32; x / 255 is defined for uint8"):
            cls(8, FPIX, ACT, "cpu", normalize_images=True)
    with pytest.raises(ValueError, match=r"normalize_images: observation\['vec'\] has dtype float32"):
        CompressedDictReplayBuffer(8, DICT, ACT, "cpu", normalize_images=True)
    CompressedDictReplayBuffer(8, DICT, ACT, "cpu", normalize_images=True, compress_keys=["img"])  # the uint8 key only


@pytest.mark.parametrize("space, timeouts", [(PIX, False), (PIX, True), (DICT, False)], ids=["timeouts-as-dones", "timeouts", "dict"])
def test_replay_optimize_memory_usage_is_accepted_and_changes_nothing(space, timeouts):
    """sb3-extra-buffers takes ``optimize_memory_usage=True`` to store each observation once: ours always does, so
    the option is a no-op: the same bytes held and the samples of SB3's buffer without it, with either timeout
    handling and for Dict spaces."""
    n, size, steps = 2, 20, 17
    sb3_cls, cls = (DictReplayBuffer, CompressedDictReplayBuffer) if space is DICT else (ReplayBuffer, CompressedReplayBuffer)
    kw = dict(n_envs=n, handle_timeout_termination=timeouts, compression_method="zstd1", compression_kwargs=dict(threads=2))
    ref, plain, ours = sb3_cls(size, space, ACT, "cpu", n_envs=n, handle_timeout_termination=timeouts), cls(size, space, ACT, "cpu", **kw), \
        cls(size, space, ACT, "cpu", optimize_memory_usage=True, **kw)
    _fill_replay([ref, plain, ours], space, n, steps)
    assert ours.nbytes == plain.nbytes
    _assert_same(_replay_samples(ref), _replay_samples(ours))
    _assert_same(_replay_samples(ref), _replay_samples(pickle.loads(pickle.dumps(ours))))


@pytest.mark.parametrize("k", [1, 3])
def test_replay_keyframe_interval_equals_sb3_and_pickles(k):
    n, size, steps = 2, 20, 17
    ref = ReplayBuffer(size, PIX, ACT, "cpu", n_envs=n)
    ours = CompressedReplayBuffer(size, PIX, ACT, "cpu", n_envs=n, compression_method="zstd-1", keyframe_interval=k)
    _fill_replay([ref, ours], PIX, n, steps)
    assert ours._writer.buffer.keyframe_interval == k
    _assert_same(_replay_samples(ref), _replay_samples(ours))
    back = pickle.loads(pickle.dumps(ours))
    assert back._writer.buffer.keyframe_interval == k
    _assert_same(_replay_samples(ref), _replay_samples(back))


@pytest.mark.parametrize("k", [0, -2, 2.0, True, "8"])
def test_replay_keyframe_interval_refused_unless_a_positive_int(k):
    with pytest.raises(ValueError, match="keyframe_interval: expected a Python int >= 1"):
        CompressedReplayBuffer(8, PIX, ACT, "cpu", keyframe_interval=k)


def test_replay_sample_observations_alias_the_decoded_arrays(monkeypatch):
    """The sampled observation tensors share memory with the decoded JAX arrays (DLPack, no copy)."""
    from jaxbuffers.interop.sb3 import _common

    seen, real = set(), _common.to_torch

    def spy(tree, device=None, **kw):
        seen.update(x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree) if isinstance(x, jax.Array))
        return real(tree, device=device, **kw)

    ours = CompressedReplayBuffer(20, PIX, ACT, "cpu", n_envs=2, compression_method="zstd-1")
    _fill_replay([ours], PIX, 2, 17)
    monkeypatch.setattr(_common, "to_torch", spy)
    s = _replay_samples(ours)
    assert s.observations.dtype == th.uint8 and s.observations.data_ptr() in seen
    assert s.next_observations.data_ptr() in seen


def test_contents_of_sb3_extra_buffers_buffers_convert():
    """replay_to_jax / rollout_to_jax read sb3-extra-buffers' compressed buffers (one bytes object per observation)."""
    xb = pytest.importorskip("sb3_extra_buffers.compressed")
    from jaxbuffers.interop.sb3 import replay_to_jax, rollout_to_jax

    n = 2
    for cls, space, method in ((xb.CompressedReplayBuffer, PIX, "rle"), (xb.CompressedDictReplayBuffer, DICT, "igzip1")):
        ref = (DictReplayBuffer if space is DICT else ReplayBuffer)(12, space, ACT, "cpu", n_envs=n)
        theirs = cls(12, space, ACT, "cpu", n_envs=n, compression_method=method,
                     dtypes=dict(elem_type=np.float32 if space is DICT else np.uint8, runs_type=np.uint16))
        _fill_replay([ref, theirs], space, n, 4)
        got, want = replay_to_jax(theirs), replay_to_jax(ref)
        for x, y in zip(jax_leaves(got.storage), jax_leaves(want.storage)):
            np.testing.assert_array_equal(x, y)
        assert got.size() == want.size() == 8
    ref = RolloutBuffer(5, PIX, ACT, "cpu", n_envs=n)
    theirs = xb.CompressedRolloutBuffer(5, PIX, ACT, "cpu", n_envs=n, compression_method="gzip1")
    _fill_rollout([ref, theirs], PIX, n, 5)
    want = np.asarray(rollout_to_jax(ref).step["obs"])
    np.testing.assert_array_equal(np.asarray(rollout_to_jax(theirs).step["obs"]), want)
    list(theirs.get(5))  # reorders its arrays in place
    np.testing.assert_array_equal(np.asarray(rollout_to_jax(theirs).step["obs"]), want)


def jax_leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_rollout_frame_stack_equals_sb3_and_stores_each_frame_once():
    """frame_stack=4, stack_axis=-1 (VecFrameStack's [H, W, 4]) on stacks that shift by one frame per step and restart
    (zeros then the first frame, as VecFrameStack) at episode starts: SB3's samples, a pickle round trip, and at most one
    stored entry per distinct frame of each episode."""
    n, steps, k = 2, 9, 4
    space = spaces.Box(0, 255, (5, 6, k), np.uint8)
    ref = RolloutBuffer(steps, space, ACT, "cpu", n_envs=n)
    ours = CompressedRolloutBuffer(steps, space, ACT, "cpu", n_envs=n, compression_method="zstd-1", frame_stack=k, stack_axis=-1)
    rng = np.random.default_rng(2)
    stack = np.zeros((n, 5, 6, k), np.uint8)
    start = np.ones(n, np.float32)
    episodes, owners = [], []  # per episode, its distinct frames and its env
    current = [None] * n
    for _ in range(steps):
        stack = np.where(start[:, None, None, None] > 0, 0, stack)
        stack = np.concatenate([stack[..., 1:], rng.integers(0, 256, (n, 5, 6, 1), dtype=np.uint8)], axis=-1)
        for e in range(n):
            if start[e]:
                current[e] = set()
                episodes.append(current[e])
                owners.append(e)
            current[e] |= {stack[e, ..., j].tobytes() for j in range(k)}
        args = (stack, rng.integers(0, 3, (n, 1)), rng.normal(size=n).astype(np.float32), start,
                th.from_numpy(rng.normal(size=(n, 1)).astype(np.float32)), th.from_numpy(rng.normal(size=n).astype(np.float32)))
        for b in (ref, ours):
            b.add(*args)
        start = (rng.random(n) < 0.3).astype(np.float32)
    for b in (ref, ours):
        b.compute_returns_and_advantage(th.zeros(n, 1), np.zeros(n))
    # at most one entry per distinct frame of each episode (the zeros frame of a restart may reuse the previous
    # stack's), at least one per distinct frame of each env
    per_env = [set().union(*(d for d, e in zip(episodes, owners) if e == env)) for env in range(n)]
    assert sum(map(len, per_env)) <= ours.jax_buffer.host.num_rows <= sum(map(len, episodes)) < n * steps * k
    back = pickle.loads(pickle.dumps(ours))
    assert back.frame_stack == k
    for a, b, c in zip(_rollout_batches(ref), _rollout_batches(ours), _rollout_batches(back)):
        _assert_same(a, b)
        _assert_same(a, c)


class _Counter(__import__("gymnasium").Env):
    """A tiny env of uint8 `[3, 2]` frames (random values), episodes of 2 to 6 steps: for frame stacking."""

    observation_space = spaces.Box(0, 255, (3, 2), np.uint8)
    action_space = ACT

    def __init__(self, seed: int):
        self._rng, self._t, self._end = np.random.default_rng(seed), 0, 0

    def _frame(self):
        return self._rng.integers(0, 256, (3, 2), dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        self._t, self._end = 0, int(self._rng.integers(2, 7))
        return self._frame(), {}

    def step(self, action):
        self._t += 1
        return self._frame(), 1.0, self._t >= self._end, False, {}


def _frame_stacked_replays(padding: str | None, steps: int = 40, n: int = 2, size: int = 64):
    """SB3's ReplayBuffer and ours (frame_stack=4, `padding`) fed the same steps of Gymnasium's FrameStackObservation
    (which pads an episode's first stack with its first frame); returns both."""
    from gymnasium.wrappers import FrameStackObservation
    from stable_baselines3.common.vec_env import DummyVecEnv

    env = DummyVecEnv([lambda s=s: FrameStackObservation(_Counter(s), 4) for s in range(n)])
    ref = ReplayBuffer(size, env.observation_space, ACT, "cpu", n_envs=n)
    kw = {} if padding is None else {"padding": padding}
    ours = CompressedReplayBuffer(size, env.observation_space, ACT, "cpu", n_envs=n, compression_method="zstd-1", frame_stack=4, stack_axis=0, **kw)
    obs, rng = env.reset(), np.random.default_rng(0)
    for _ in range(steps):
        action = rng.integers(0, 3, n)
        new, reward, done, infos = env.step(action)
        nxt = new.copy()
        for i, d in enumerate(done):
            if d:
                nxt[i] = infos[i]["terminal_observation"]
        for b in (ref, ours):
            b.add(obs, nxt, action[:, None], reward, done, infos)
        obs = new
    return ref, ours


def test_replay_frame_stack_padding_reset_equals_sb3_with_gymnasium_frame_stack():
    """Gymnasium's FrameStackObservation pads with the first frame: `padding="reset"` samples what SB3's own
    ReplayBuffer samples under the same numpy seed; the default `padding="zero"` (VecFrameStack's) refuses those
    stacks at the first add instead of storing other ones."""
    ref, ours = _frame_stacked_replays("reset")
    for seed in (0, 1):
        np.random.seed(seed)
        a = ref.sample(32)
        np.random.seed(seed)
        b = ours.sample(32)
        for name in ("observations", "next_observations", "actions", "rewards", "dones"):
            np.testing.assert_array_equal(getattr(a, name).numpy(), getattr(b, name).numpy(), err_msg=name)
    with pytest.raises(ValueError, match=r"step\['obs'\]: env 0, step 0 .* not the stack the buffer rebuilds"):
        _frame_stacked_replays(None, steps=1)


def _stacked_steps(steps: int, n: int, vec_dim: int = 4):
    """SB3's off-policy loop over Gymnasium's FrameStackObservation(4) of `_Counter` envs, with a random float32
    ``vector`` beside each stack: yields ``(obs, next_obs, action, reward, done, infos)`` for the Dict space
    {pixels, vector} (the plain space's observations are the ``pixels``)."""
    from gymnasium.wrappers import FrameStackObservation
    from stable_baselines3.common.vec_env import DummyVecEnv

    env = DummyVecEnv([lambda s=s: FrameStackObservation(_Counter(s), 4) for s in range(n)])
    rng = np.random.default_rng(3)
    vec = lambda: rng.uniform(-1, 1, (n, vec_dim)).astype(np.float32)  # noqa: E731
    obs = {"pixels": env.reset(), "vector": vec()}
    for _ in range(steps):
        action = rng.integers(0, 3, n)
        new, reward, done, infos = env.step(action)
        new = {"pixels": new, "vector": vec()}
        nxt = {"pixels": new["pixels"].copy(), "vector": new["vector"].copy()}
        for i, d in enumerate(done):
            if d:  # the terminal observation; the next row's obs is the reset one
                nxt["pixels"][i], nxt["vector"][i] = infos[i]["terminal_observation"], rng.uniform(-1, 1, vec_dim)
        yield obs, nxt, action, reward, done, infos
        obs = new


def _stacked_spaces(vec_dim: int = 4):
    pix = spaces.Box(0, 255, (4, 3, 2), np.uint8)
    return pix, spaces.Dict({"pixels": pix, "vector": spaces.Box(-1, 1, (vec_dim,), np.float32)})


def test_dict_replay_stores_the_pixels_as_the_plain_class_plus_the_other_keys_own_bytes():
    """`CompressedDictReplayBuffer` compressing ``pixels`` (frame stacks) beside a float32 ``vector``, against
    `CompressedReplayBuffer` given the same stacks: the host stores hold the same bytes, the row stores the same, and
    the device arrays differ by exactly the vector's rows (``[rows, n_envs, 4]`` float32 for the observations and as
    many for the final-observation ring), the staging arrays by the vector's staged steps; samples equal SB3's
    ``DictReplayBuffer``'s under the same seed. (A pixel key stored without frame dedup or temporal coding, a second
    copy of the next observations, or the vector widened or padded breaks one of these.)"""
    n, size, steps, dim = 2, 48, 40, 4
    pix, space = _stacked_spaces(dim)
    opts = dict(compression_method="zstd-1", frame_stack=4, stack_axis=0, padding="reset")
    ref = DictReplayBuffer(size, space, ACT, "cpu", n_envs=n)
    plain = CompressedReplayBuffer(size, pix, ACT, "cpu", n_envs=n, **opts)
    ours = CompressedDictReplayBuffer(size, space, ACT, "cpu", n_envs=n, compress_keys=["pixels"], **opts)
    for obs, nxt, action, reward, done, infos in _stacked_steps(steps, n, dim):
        ref.add(obs, nxt, action[:, None], reward, done, infos)
        ours.add(obs, nxt, action[:, None], reward, done, infos)
        plain.add(obs["pixels"], nxt["pixels"], action[:, None], reward, done, infos)
    _assert_same(_replay_samples(ref), _replay_samples(ours))
    rows, vec = size // n, dim * np.dtype(np.float32).itemsize
    staged = ours._writer.staging_nbytes - plain._writer.staging_nbytes
    assert staged == 2 * n * ours._writer.max_pending * vec  # the steps and the final observations staged
    a, b = plain._writer.buffer, ours._writer.buffer
    assert b.host.num_rows == a.host.num_rows and b.host_arena_nbytes == a.host_arena_nbytes
    assert b.host_nbytes == a.host_nbytes
    assert b.device_nbytes - a.device_nbytes == 2 * rows * n * vec
    assert ours._state.memory_bytes == plain._state.memory_bytes
    assert ours.nbytes - plain.nbytes == 2 * rows * n * vec + staged + n * vec  # + the held next observation


def test_dict_rollout_stores_the_pixels_as_the_plain_class_plus_the_other_keys_own_bytes():
    """`CompressedDictRolloutBuffer` compressing ``pixels`` (frame stacks, one stored frame per distinct frame) beside
    a float32 ``vector``, against `CompressedRolloutBuffer` given the same stacks: the host stores hold the same bytes
    and the rest differs by exactly the vector's ``[T, n_envs, 4]`` float32; minibatches equal SB3's
    ``DictRolloutBuffer``'s under the same seed."""
    n, steps, dim = 2, 24, 4
    pix, space = _stacked_spaces(dim)
    opts = dict(compression_method="zstd-1", frame_stack=4, stack_axis=0)
    ref = DictRolloutBuffer(steps, space, ACT, "cpu", n_envs=n)
    plain = CompressedRolloutBuffer(steps, pix, ACT, "cpu", n_envs=n, **opts)
    ours = CompressedDictRolloutBuffer(steps, space, ACT, "cpu", n_envs=n, compress_keys=["pixels"], **opts)
    rng, start = np.random.default_rng(4), np.ones(n, np.float32)
    for obs, _, action, reward, done, _ in _stacked_steps(steps, n, dim):
        value, logp = th.from_numpy(rng.normal(size=(n, 1)).astype(np.float32)), th.from_numpy(rng.normal(size=n).astype(np.float32))
        for b, o in ((ref, obs), (ours, obs), (plain, obs["pixels"])):
            b.add(o, action[:, None], reward, start, value, logp)
        start = done.astype(np.float32)
    vec = dim * np.dtype(np.float32).itemsize
    assert ours._writer.mirror_nbytes - plain._writer.mirror_nbytes == steps * n * vec
    a, b = plain._state, ours._state
    assert b.host.num_rows == a.host.num_rows and b.host_arena_nbytes == a.host_arena_nbytes
    assert b.host_nbytes == a.host_nbytes
    assert ours.nbytes - plain.nbytes == b.device_nbytes - a.device_nbytes == steps * n * vec
    for buf in (ref, ours):
        buf.compute_returns_and_advantage(th.zeros(n, 1), np.zeros(n))
    for x, y in zip(_rollout_batches(ref), _rollout_batches(ours)):
        _assert_same(x, y)


def test_rollout_host_copies_refuse_writes_they_would_drop():
    ours = CompressedRolloutBuffer(2, PIX, ACT, "cpu", n_envs=1)
    for _ in range(2):
        ours.add(np.zeros((1, *PIX.shape), np.uint8), np.array([1]), np.ones(1), np.zeros(1), th.zeros(1, 1), th.zeros(1))
    for name in ("observations", "actions", "episode_starts", "rewards"):
        with pytest.raises(ValueError, match="read-only"):
            getattr(ours, name)[0] = 1
    assert ours.actions.ravel().tolist() == [1, 1]


def test_replay_to_jax_refuses_a_compressed_adapter_naming_it():
    """A `JaxReplayBuffer` with ``compress`` (and so jaxbuffers' `CompressedReplayBuffer`) holds its observations in
    a host store `replay_to_jax` does not read: a TypeError naming the class and the option, not an AttributeError."""
    from jaxbuffers.interop.sb3 import CompressedReplayBuffer, JaxReplayBuffer, replay_to_jax

    for buf in (CompressedReplayBuffer(12, PIX, ACT, "cpu", compression_method="gzip1"),
                JaxReplayBuffer(12, PIX, ACT, "cpu", compress=True)):
        _fill_replay([buf], PIX, 1, 3)
        with pytest.raises(TypeError, match=rf"buffer: a {type(buf).__name__} with compress=\.\.\. "):
            replay_to_jax(buf)
