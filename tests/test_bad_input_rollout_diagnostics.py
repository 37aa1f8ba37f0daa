"""Bad input to the rollout diagnostics (`total_size`, `trainable_diagnostics`, `memory_estimate`,
`get_minibatches`): refused with an error naming the argument, by the call itself (for `get_minibatches`, before
any minibatch is gathered), the rollout byte-identical; the documented accepted values give exactly their result:
`minibatch_size` None or in `[1, total_size]` (bytes proportional to it), any `batch_size` dividing the rollout
(every step once), a platform name, a JAX device or None for `device` (a torch device: tensors torch can hold)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS, bad_keys, bad_static_ints, non_arrays, refused, snapshot

N, T = 2, 4
BUF = jb.RolloutBuffer.create({"obs": jnp.zeros((3,), jnp.float32)}, num_envs=N, num_steps=T)
for _t in range(T):
    BUF = BUF.add({"obs": np.full((N, 3), _t, np.float32)}, reward=np.arange(N, dtype=np.float32) + _t,
                  value=np.zeros(N, np.float32), terminated=np.array([False, _t == 1]))
BUF = BUF.compute_gae(np.ones(N, np.float32), 0.9, 0.8)
TOTAL = N * T
FUNCTIONS = {
    "total_size": jb.total_size, "trainable_diagnostics": jb.trainable_diagnostics, "memory_estimate": jb.memory_estimate,
    "get_minibatches": lambda b: jb.get_minibatches(b, jax.random.key(0), 2),
}
STACKED = jax.vmap(lambda r: BUF.replace(reward=BUF.reward + r))(jnp.arange(2, dtype=jnp.float32))


@settings(SETTINGS, max_examples=15)
@given(fn=st.sampled_from(sorted(FUNCTIONS)),
       buf=non_arrays() | st.sampled_from([jb.RolloutBuffer, BUF.reward, STACKED, jb.ReplayBuffer.create({"x": jnp.zeros(())}, capacity=2)]))
def test_what_is_not_one_rollout_is_refused_naming_buf(fn, buf):
    refused(lambda: FUNCTIONS[fn](buf), "buf", state=BUF)


@SETTINGS
@given(size=bad_static_ints().filter(lambda v: v is not None) | st.integers(TOTAL + 1, 2**31 - 1))  # None: documented, all
def test_memory_estimate_refuses_a_minibatch_size_outside_1_to_total(size):
    refused(lambda: jb.memory_estimate(BUF, size), "minibatch_size", state=BUF)


@SETTINGS
@given(size=st.one_of(st.none(), st.integers(1, TOTAL)))
def test_memory_estimate_accepts_none_and_sizes_up_to_total(size):
    whole, got = jb.memory_estimate(BUF), jb.memory_estimate(BUF, size)
    assert got.minibatch_bytes * TOTAL == whole.minibatch_bytes * (TOTAL if size is None else size)
    assert (got.cpu_bytes, got.gpu_bytes, got.platform) == (whole.cpu_bytes, whole.gpu_bytes, whole.platform)


@SETTINGS
@given(data=st.data(), arg=st.sampled_from(["key", "batch_size", "device"]))
def test_get_minibatches_refuses_each_wrong_argument_by_the_call(data, arg):
    """Refused when called, not at the first `next` (a generator would raise only there)."""
    args = {"key": jax.random.key(0), "batch_size": 2, "device": None}
    args[arg] = data.draw({
        "key": bad_keys(),
        "batch_size": bad_static_ints() | st.sampled_from([3, 5, 7, TOTAL + 1]),  # 3, 5, 7 do not divide 8
        "device": st.sampled_from(["tpu", "gpu", "cuda:0", "npu", "nowhere"]),
    }[arg], arg)
    refused(lambda: jb.get_minibatches(BUF, **args), arg, state=BUF)


@pytest.mark.parametrize("batch_size, device", [(1, None), (2, "cpu"), (4, jax.devices()[0]), (8, None)])
def test_get_minibatches_gives_every_step_once_for_every_divisor(batch_size, device, seed=3):
    before = snapshot(BUF)
    mbs = list(jb.get_minibatches(BUF, jax.random.key(seed), batch_size, device))
    assert len(mbs) == TOTAL // batch_size and all(m.index.shape == (batch_size,) for m in mbs)
    assert sorted(np.concatenate([np.asarray(m.index) for m in mbs]).tolist()) == list(range(TOTAL))
    assert snapshot(BUF) == before


@pytest.mark.parametrize("batch_size", [2.0, "2", None, True, 3])
def test_get_minibatches_raises_for_batch_size_what_its_docstring_lists(batch_size):
    """A size that is not an int is a ValueError (guide, section 8: sizes); the docstring listed it under TypeError."""
    with pytest.raises(ValueError, match="batch_size") as info:
        jb.get_minibatches(BUF, jax.random.key(0), batch_size)
    raises = jb.get_minibatches.__doc__.split("Raises", 1)[1]
    listed = [line.split(":")[0].strip() for line in raises.splitlines() if "``batch_size``" in line]
    assert listed == [type(info.value).__name__], raises


def test_get_minibatches_refuses_a_torch_device_for_a_leaf_torch_cannot_hold_by_the_call():
    torch = pytest.importorskip("torch")
    f8 = jnp.float8_e4m3fn
    buf = jb.RolloutBuffer.create({"obs": jnp.zeros(2, f8)}, num_envs=N, num_steps=1)
    zeros = np.zeros(N, np.float32)
    buf = buf.add({"obs": jnp.zeros((N, 2), f8)}, reward=zeros, value=zeros, terminated=np.zeros(N, bool))
    buf = buf.compute_gae(zeros, 0.9, 0.8)
    error = refused(lambda: jb.get_minibatches(buf, jax.random.key(0), 1, device=torch.device("cpu")), "device",
                    state=buf, exc=(TypeError,))
    assert "step['obs']" in str(error) and "float8_e4m3fn" in str(error)
    assert next(jb.get_minibatches(buf, jax.random.key(0), 1, device="cpu")).step["obs"].dtype == f8  # JAX: kept
