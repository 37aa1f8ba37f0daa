"""trainable_diagnostics, memory_estimate, total_size, get_minibatches on plain and compressed rollouts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb

T, N = 4, 3
EXAMPLE = {"obs": jnp.zeros((6, 6), jnp.uint8), "action": jnp.int32(0)}


def _filled(compressed, rows=3, normalize=False):
    if compressed:
        buf = jb.CompressedRolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=T, codec="zstd:1", normalize_images=normalize)
    else:
        buf = jb.RolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=T)
    rng = np.random.default_rng(0)
    for t in range(rows):
        step = {"obs": jnp.asarray(rng.integers(0, 3, (N, 6, 6)), jnp.uint8), "action": jnp.arange(N, dtype=jnp.int32)}
        buf = buf.add(step, reward=jnp.ones(N), value=jnp.zeros(N), terminated=jnp.array([t == 1, False, False]),
                      trainable=jnp.array([True, t != 0, False]))
    return buf


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "compressed"])
def test_trainable_diagnostics_counts(compressed):
    d = jb.trainable_diagnostics(_filled(compressed))
    assert isinstance(d, jb.TrainableDiagnostics) and d.total_steps == jb.total_size(_filled(compressed, 0)) == T * N
    assert (int(d.filled_steps), int(d.trainable_steps), int(d.frozen_steps), int(d.episode_ends)) == (9, 5, 4, 1)
    np.testing.assert_array_equal(d.trainable_per_env, [3, 2, 0])
    assert float(d.trainable_fraction) == pytest.approx(5 / 9)
    assert float(jb.trainable_diagnostics(_filled(compressed, 0)).trainable_fraction) == 0.0
    with pytest.raises(TypeError, match="buf"):
        jb.trainable_diagnostics(jb.ReplayBuffer.create(EXAMPLE, capacity=4))


def test_memory_estimate_splits_host_and_device():
    plain, comp = _filled(False), _filled(True, normalize=True)
    m = jb.memory_estimate(plain, minibatch_size=6)
    assert m.platform == "cpu" and m.cpu_bytes == plain.memory_bytes and m.gpu_bytes == 0
    assert m.memory_gb == pytest.approx(plain.memory_bytes / 2**30)
    c = jb.memory_estimate(comp, minibatch_size=6)
    assert c.cpu_bytes == comp.host_nbytes + comp.device_nbytes and c.gpu_bytes == 0
    assert c.minibatch_bytes - m.minibatch_bytes == 6 * 36 * 3  # decoded obs are float32 with normalize_images
    with pytest.raises(ValueError, match="minibatch_size"):
        jb.memory_estimate(plain, minibatch_size=T * N + 1)


@pytest.mark.parametrize("compressed, normalize", [(False, False), (True, False), (True, True)],
                         ids=["plain", "compressed", "compressed-normalized"])
def test_memory_estimate_minibatch_bytes_are_the_gathered_minibatchs(compressed, normalize):
    """minibatch_bytes is the nbytes of what gather returns (it once counted a sixth float field per step)."""
    buf = _filled(compressed, normalize=normalize)
    for size in (1, 6, T * N):
        mb = buf.gather(jnp.arange(size, dtype=jnp.int32))
        assert jb.memory_estimate(buf, minibatch_size=size).minibatch_bytes == sum(x.nbytes for x in jax.tree.leaves(mb))
    if not compressed:
        assert jb.memory_estimate(buf, minibatch_size=6).minibatch_bytes == buf.estimate_memory_pressure(2).minibatch_bytes


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "compressed"])
def test_get_minibatches_covers_every_step_on_the_device(compressed):
    buf = _filled(compressed, rows=T).compute_gae(jnp.zeros(N), 0.99, 0.95)
    mbs = list(jb.get_minibatches(buf, jax.random.key(0), 4, device="cpu"))
    assert len(mbs) == 3 and all(mb.step["obs"].shape == (4, 6, 6) for mb in mbs)
    assert sorted(np.concatenate([np.asarray(mb.index) for mb in mbs]).tolist()) == list(range(T * N))
    assert all(next(iter(mb.reward.devices())).platform == "cpu" for mb in mbs)
    want = buf.gather(jnp.asarray(mbs[1].index))
    np.testing.assert_array_equal(mbs[1].step["obs"], want.step["obs"])
    with pytest.raises(ValueError, match="batch_size"):
        next(jb.get_minibatches(buf, jax.random.key(0), 5))
    with pytest.raises(ValueError, match="device"):
        next(jb.get_minibatches(buf, jax.random.key(0), 4, device="tpu"))


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "compressed"])
def test_get_minibatches_refuses_a_rollout_without_advantages(compressed):
    """Before compute_gae the advantages are not the rollout's: refused by the call, as RolloutBuffer.minibatches,
    after the arguments' own errors."""
    buf = _filled(compressed, rows=T)
    with pytest.raises(ValueError, match="batch_size"):
        jb.get_minibatches(buf, jax.random.key(0), 5)
    with pytest.raises(RuntimeError, match=r"^get_minibatches: .*\(has_advantages is False\); call compute_gae\("):
        jb.get_minibatches(buf, jax.random.key(0), 4)
    assert len(list(jb.get_minibatches(buf.compute_gae(jnp.zeros(N), 0.99, 0.95), jax.random.key(0), 4))) == 3


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "compressed"])
def test_get_minibatches_to_a_torch_device_yields_torch_tensors_on_it(compressed):
    """A torch device gives each minibatch as torch tensors there (values, dtypes, shapes of the JAX minibatch);
    they are the minibatch's own memory: writing them in place leaves the rollout unchanged."""
    torch = pytest.importorskip("torch")
    buf = _filled(compressed, rows=T).compute_gae(jnp.zeros(N), 0.99, 0.95)
    want = list(jb.get_minibatches(buf, jax.random.key(0), 4))
    got = list(jb.get_minibatches(buf, jax.random.key(0), 4, device=torch.device("cpu")))
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert isinstance(g, jb.RolloutMinibatch) and jax.tree.structure(g) == jax.tree.structure(w)
        for t, x in zip(jax.tree.leaves(g), jax.tree.leaves(w)):
            assert isinstance(t, torch.Tensor) and t.device == torch.device("cpu")
            assert t.numpy().dtype == x.dtype and t.shape == x.shape
            np.testing.assert_array_equal(t.numpy(), np.asarray(x))
    for t in jax.tree.leaves(got):
        t.zero_()
    again = list(jb.get_minibatches(buf, jax.random.key(0), 4))
    jax.tree.map(np.testing.assert_array_equal, again, want)


def test_get_minibatches_refuses_a_torch_device_torch_cannot_use_by_the_call():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("needs a torch without CUDA")
    buf = _filled(False, rows=T).compute_gae(jnp.zeros(N), 0.99, 0.95)
    with pytest.raises(ValueError, match=r"^device: .*cuda"):
        jb.get_minibatches(buf, jax.random.key(0), 4, device=torch.device("cuda"))
