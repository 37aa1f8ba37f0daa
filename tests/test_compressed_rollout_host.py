"""RolloutHostWriter: host-side adds to a CompressedRolloutBuffer, frame-stack dedup, device `add` with frame_stack."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuffers import BufferFullError, RolloutBuffer
from jaxbuffers.compressed import CompressedRolloutBuffer, RolloutHostWriter

H, W, K = 6, 5, 4


def _stacks(rng, num_envs, steps, stack_axis, broken_at=None):
    """Frame-stacked observations with "reset" padding: per env, episodes of random frames; a new episode starts
    with probability 0.15. At step ``broken_at`` env 0 gets a stack of unrelated frames (not a shifted one)."""
    out = np.zeros((steps, num_envs, K, H, W), np.uint8)
    for e in range(num_envs):
        stack = None
        for t in range(steps):
            f = rng.integers(0, 256, (H, W), dtype=np.uint8)
            stack = np.stack([f] * K) if stack is None or rng.random() < 0.15 else np.concatenate([stack[1:], f[None]])
            if t == broken_at and e == 0:
                stack = rng.integers(0, 256, (K, H, W), dtype=np.uint8)
            out[t, e] = stack
    return out if stack_axis == 0 else np.moveaxis(out, 2, -1)


def _example(stack_axis):
    shape = (K, H, W) if stack_axis == 0 else (H, W, K)
    return {"obs": {"pixels": jnp.zeros(shape, jnp.uint8), "vec": jnp.zeros(2, jnp.float32)}, "logp": jnp.float32(0)}


def _compare(a, b):
    mask = np.asarray(b.mask)  # unfilled rows hold stale ids: compare what the learner reads
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x)[mask], np.asarray(y)[mask])


@pytest.mark.parametrize("frame_stack, stack_axis", [  # stack_axis=-1 through the SB3 adapter: tests/interop/test_sb3_extra_options.py
    (K, 0), pytest.param(K, -1, marks=pytest.mark.slow), pytest.param(None, 0, marks=pytest.mark.slow)])
def test_writer_matches_rollout_buffer_and_device_add(stack_axis, frame_stack):
    """Over two rollouts (the second given more steps than fit), the writer's flushed state gives the minibatches of a
    RolloutBuffer fed the same steps, and so does the device `add` of a buffer with the same frame_stack; with
    frame_stack the writer stores each distinct frame once (a stack that is not a shifted one stores all of its)."""
    n, t = 2, 12
    rng = np.random.default_rng(0)
    ex = _example(stack_axis)
    kw = dict(num_envs=n, num_steps=t, compress=("pixels",), codec="rle", frame_stack=frame_stack,
              stack_axis=stack_axis if frame_stack else 0)
    writer = RolloutHostWriter(CompressedRolloutBuffer.create(ex, **kw))
    dev = CompressedRolloutBuffer.create(ex, **kw)
    ref = RolloutBuffer.create(ex, num_envs=n, num_steps=t)
    for r, adds in enumerate((t, t + 2)):
        writer.reset()
        dev, ref = dev.reset(), ref.reset()
        pixels = _stacks(rng, n, adds, stack_axis, broken_at=5 if r == 0 else None)
        for i in range(adds):
            step = {"obs": {"pixels": pixels[i], "vec": rng.normal(size=(n, 2)).astype(np.float32)},
                    "logp": rng.normal(size=n).astype(np.float32)}
            f = dict(reward=rng.normal(size=n).astype(np.float32), value=np.zeros(n, np.float32), terminated=rng.random(n) < 0.2)
            if i < t:
                writer.add(step, **f)
                dev, ref = dev.add(step, **f), ref.add(step, **f)
            else:  # an eager add on a full buffer, compressed or not, on the host or not, raises and changes nothing
                for full in (writer, dev, ref):
                    with pytest.raises(BufferFullError):
                        full.add(step, **f)
        if r == 0 and frame_stack:  # distinct frames: the first stack's and one per later step, +3 for the broken one
            fr = pixels if stack_axis == 0 else np.moveaxis(pixels, -1, 2)
            distinct = sum(len({fr[i, e, j].tobytes() for i in range(t) for j in range(K)}) for e in range(n))
            assert writer.flush().host.num_rows == distinct < n * t * K
    buf = writer.flush()
    assert not bool(buf.buffer.overflowed) and int(buf.buffer.step_index) == t
    key = jax.random.key(1)
    want = ref.compute_gae(jnp.zeros(n), 0.9, 0.8).minibatches(key, 4)
    _compare(buf.compute_gae(jnp.zeros(n), 0.9, 0.8).minibatches(key, 4), want)
    _compare(dev.compute_gae(jnp.zeros(n), 0.9, 0.8).minibatches(key, 4), want)
    idx = np.random.default_rng(1).permutation(n * t + 3).astype(np.int32)  # 3 out of range: clipped, as gather clips
    for state in (buf, dev):  # an epoch gathered from the entries decoded once equals one that decodes per minibatch
        entries = state.decode_entries()
        assert entries[0].shape[0] - 1 <= state.host.num_slots - 1 and not entries[0][-1].any()
        _compare(state.gather_entries(entries, idx), state.gather(idx))


def test_writer_keeps_its_own_copy_of_the_previous_stack():
    """A caller that overwrites its observation array in place after `add` (as vectorised envs reuse buffers)
    does not make the next stack look like a shifted copy of it."""
    n, t = 1, 4
    ex = _example(0)
    writer = RolloutHostWriter(CompressedRolloutBuffer.create(ex, num_envs=n, num_steps=t, compress=("pixels",), codec="rle", frame_stack=K))
    ref = RolloutBuffer.create(ex, num_envs=n, num_steps=t)
    pixels = _stacks(np.random.default_rng(3), n, t, 0)
    obs = np.zeros_like(pixels[0])
    for i in range(t):
        obs[...] = pixels[i]
        step = {"obs": {"pixels": obs, "vec": np.zeros((n, 2), np.float32)}, "logp": np.zeros(n, np.float32)}
        f = dict(reward=np.zeros(n, np.float32), value=np.zeros(n, np.float32), terminated=np.zeros(n, bool))
        writer.add(step, **f)
        ref = ref.add(jax.tree.map(np.copy, step), **f)
    obs[...] = 0
    _compare(writer.flush().gather(jnp.arange(t, dtype=jnp.int32)), ref.gather(jnp.arange(t, dtype=jnp.int32)))


def test_writer_refuses_bad_steps_before_writing():
    """A wrong dtype or number of envs raises naming the field and leaves the buffer as it was, also after a step
    of the same layout passed (the layout check is cached per layout, not skipped)."""
    n = 2
    ex = _example(0)
    writer = RolloutHostWriter(CompressedRolloutBuffer.create(ex, num_envs=n, num_steps=3, compress=("pixels",), codec="rle", frame_stack=K))
    good = {"obs": {"pixels": np.zeros((n, K, H, W), np.uint8), "vec": np.zeros((n, 2), np.float32)}, "logp": np.zeros(n, np.float32)}
    f = dict(reward=np.zeros(n, np.float32), value=np.zeros(n, np.float32), terminated=np.zeros(n, bool))
    writer.add(good, **f)
    bad = jax.tree.map(np.copy, good)
    bad["obs"]["pixels"] = bad["obs"]["pixels"].astype(np.int32)
    with pytest.raises(TypeError, match=r"step\['obs'\]\['pixels'\]"):
        writer.add(bad, **f)
    with pytest.raises(ValueError, match="num_envs=2"):
        writer.add(jax.tree.map(lambda x: x[:1], good), **f)
    with pytest.raises(TypeError, match="reward"):
        writer.add(good, **dict(f, reward=np.zeros(n, np.int32)))
    assert writer.row == 1 and int(writer.flush().buffer.step_index) == 1


def test_flushed_state_keeps_its_arrays_and_the_index_holds_distinct_frames():
    """`flush` hands the mirrors to the device state: adds after it leave that state's arrays as they were (a second
    rollout rewrites every row). Frames are numbered in the order they are stored, so the stores' index rows follow
    the distinct frames written, not `k` per step; a writer taking over a filled buffer continues past its slots."""
    n, t = 2, 120
    rng = np.random.default_rng(5)
    ex = _example(0)
    buf = CompressedRolloutBuffer.create(ex, num_envs=n, num_steps=t, compress=("pixels",), codec="none", frame_stack=K)
    writer = RolloutHostWriter(buf)
    f = dict(value=np.zeros(n, np.float32), terminated=np.zeros(n, bool))
    first = None
    for r in range(2):
        writer.reset()
        pixels = _stacks(rng, n, t, 0)
        for i in range(t):
            writer.add({"obs": {"pixels": pixels[i], "vec": rng.normal(size=(n, 2)).astype(np.float32)},
                       "logp": np.zeros(n, np.float32)}, reward=np.full(n, r + i, np.float32), **f)
        state = writer.flush()
        if first is None:
            first = state
            kept = [np.array(x) for x in jax.tree.leaves(state.buffer)]
            store = state.host.stores[0]
            distinct = int(state.host.num_rows)
            assert distinct < n * t * K and distinct <= store.index_rows <= max(256, 1.25 * distinct)
    for x, y in zip(jax.tree.leaves(first.buffer), kept):
        np.testing.assert_array_equal(np.asarray(x), y)
    assert writer.mirror_nbytes == 0  # the flushed state holds the mirrors
    half = CompressedRolloutBuffer.create(ex, num_envs=n, num_steps=4, compress=("pixels",), codec="none", frame_stack=K)
    step = {"obs": {"pixels": _stacks(rng, n, 1, 0)[0], "vec": np.zeros((n, 2), np.float32)}, "logp": np.zeros(n, np.float32)}
    half = half.add(step, reward=np.zeros(n, np.float32), **f)  # the device add: slots (t * N + e) * K + j of row 0
    w2 = RolloutHostWriter(half)
    w2.add(jax.tree.map(lambda x: x[:: -1].copy(), step), reward=np.zeros(n, np.float32), **f)
    out = w2.flush().gather(jnp.arange(2 * n, dtype=jnp.int32))
    np.testing.assert_array_equal(np.asarray(out.step["obs"]["pixels"])[:n], step["obs"]["pixels"])
    np.testing.assert_array_equal(np.asarray(out.step["obs"]["pixels"])[n:], step["obs"]["pixels"][::-1])


def test_the_add_that_fills_the_buffer_puts_the_staged_entries():
    """Entries wait in the writer until `put_rows` are staged, except after the add that fills the buffer (no add
    can follow it): the stores then hold every distinct frame before any `flush`, and the flushed state reads them."""
    n, t = 2, 6
    rng = np.random.default_rng(7)
    ex = _example(0)
    buf = CompressedRolloutBuffer.create(ex, num_envs=n, num_steps=t, compress=("pixels",), codec="rle", frame_stack=K)
    writer = RolloutHostWriter(buf)
    writer.put_rows = 10 * n * t * K  # more than the rollout stores: only the fill puts
    pixels = _stacks(rng, n, t, 0)
    f = dict(reward=np.zeros(n, np.float32), value=np.zeros(n, np.float32), terminated=np.zeros(n, bool))
    for i in range(t):
        assert buf.host.num_rows == 0
        writer.add({"obs": {"pixels": pixels[i], "vec": np.zeros((n, 2), np.float32)}, "logp": np.zeros(n, np.float32)}, **f)
    distinct = sum(len({pixels[i, e, j].tobytes() for i in range(t) for j in range(K)}) for e in range(n))
    assert buf.host.num_rows == distinct and buf.host.num_writes == 1
    out = writer.flush().gather(jnp.arange(n * t, dtype=jnp.int32))
    np.testing.assert_array_equal(np.asarray(out.step["obs"]["pixels"]), pixels.reshape(n * t, K, H, W))


def test_writer_stacks_scalar_frames():
    """A compressed leaf whose frames are scalars (a stack of shape `[K]`) is stored and rebuilt like any other."""
    n, k, t = 2, 3, 4
    ex = {"pixels": jnp.zeros((k,), jnp.uint8), "action": jnp.int32(0)}
    w = RolloutHostWriter(CompressedRolloutBuffer.create(ex, num_envs=n, num_steps=t, compress=("pixels",), codec="rle",
                                                        frame_stack=k))
    x, want = np.zeros((n, k), np.uint8), []
    for s in range(t):
        x = np.concatenate([x[:, 1:], np.full((n, 1), s + 1, np.uint8)], 1)
        want.append(x.copy())
        w.add({"pixels": x.copy(), "action": np.zeros(n, np.int32)}, reward=np.zeros(n, np.float32),
              value=np.zeros(n, np.float32), terminated=np.zeros(n, bool))
    got = np.asarray(w.flush().gather(jnp.arange(t * n, dtype=jnp.int32)).step["pixels"]).reshape(t, n, k)
    np.testing.assert_array_equal(got, np.stack(want))


def test_writer_add_on_a_full_rollout_raises_and_writes_nothing():
    """An add past `num_steps` raises BufferFullError, as `CompressedRolloutBuffer.add` does on the same state:
    the rows, the host stores and `overflowed` are those of the full rollout; after `reset` adds work again."""
    n = 2
    writer = RolloutHostWriter(CompressedRolloutBuffer.create({"obs": jnp.zeros((H, W), jnp.uint8)}, num_envs=n, num_steps=2, codec="rle"))

    def add(t):
        writer.add({"obs": np.full((n, H, W), t, np.uint8)}, reward=np.full(n, t, np.float32), value=np.zeros(n, np.float32),
                   terminated=np.zeros(n, bool))

    add(0), add(1)
    rows = writer.flush().host.num_rows
    with pytest.raises(BufferFullError, match="full"):
        add(2)
    buf = writer.flush()
    assert not bool(buf.buffer.overflowed) and int(buf.buffer.step_index) == 2 and buf.host.num_rows == rows
    np.testing.assert_array_equal(np.asarray(buf.buffer.reward), [[0, 0], [1, 1]])
    np.testing.assert_array_equal(np.asarray(buf.gather(jnp.arange(2 * n, dtype=jnp.int32)).step["obs"])[:, 0, 0], [0, 0, 1, 1])
    writer.reset()
    add(5)
    np.testing.assert_array_equal(np.asarray(writer.flush().buffer.reward)[0], [5, 5])
