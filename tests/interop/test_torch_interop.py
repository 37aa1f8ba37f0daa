"""jaxbuffers.interop.torch: whole-pytree DLPack conversion, zero copy, dtypes, x64 policy, errors."""

import gc
import os
import subprocess
import sys
import textwrap
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import jaxbuffers as jb  # noqa: E402
from jaxbuffers.interop.torch import SUPPORTED_DTYPES, from_torch, to_torch  # noqa: E402

DTYPES_32 = ["bool", "uint8", "uint16", "uint32", "int8", "int16", "int32", "float16", "bfloat16", "float32", "complex64"]
DTYPES_64 = ["int64", "uint64", "float64", "complex128"]


def random_np(dtype: str, shape, seed: int = 0) -> np.ndarray:
    """Values that use the dtype's range (extremes included), so a narrowing or a bit error shows."""
    return np.asarray(_random_values(dtype, shape, seed))


def _random_values(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    dt = np.dtype(jnp.dtype(dtype))
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
        if a.size >= 2:
            a.flat[0], a.flat[-1] = info.min, info.max
        return a
    if np.issubdtype(dt, np.complexfloating):
        return (rng.standard_normal(shape) * 1e3 + 1j * rng.standard_normal(shape)).astype(dt)
    return (rng.standard_normal(shape) * 100).astype(dt)


def bits(x) -> np.ndarray:
    """Bit pattern of a jax array, torch tensor or numpy array, for exact (NaN-safe) comparison."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16:
            return x.contiguous().view(torch.int16).numpy().view(np.uint16)
        x = x.resolve_conj().numpy()
    a = np.asarray(x)
    if a.dtype == np.bool_:
        return a
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}" if a.dtype.itemsize <= 8 else "u1")


def assert_same(jax_or_np, tensor):
    assert tuple(jax_or_np.shape) == tuple(tensor.shape)
    assert SUPPORTED_DTYPES[np.dtype(jax_or_np.dtype)] == tensor.dtype
    np.testing.assert_array_equal(bits(jax_or_np), bits(tensor))


# ----------------------------------------------------------------------------- dtypes, round trips


@pytest.mark.parametrize("dtype", DTYPES_32)
@pytest.mark.parametrize("shape", [(3, 5), (), (0,), (2, 0, 3)], ids=["2d", "scalar", "empty", "empty3d"])
def test_jax_to_torch_to_jax_round_trip(dtype, shape):
    x = jnp.asarray(random_np(dtype, shape))
    t = to_torch(x)
    assert isinstance(t, torch.Tensor)
    assert_same(x, t)
    back = from_torch(t)
    assert isinstance(back, jax.Array) and back.dtype == x.dtype and back.shape == x.shape
    np.testing.assert_array_equal(bits(back), bits(x))


@pytest.mark.parametrize("dtype", DTYPES_32)
def test_torch_to_jax_to_torch_round_trip(dtype):
    t = to_torch(random_np(dtype, (4, 6), seed=1), copy=True)  # a tensor torch owns
    x = from_torch(t)
    assert_same(x, t)
    np.testing.assert_array_equal(bits(to_torch(x)), bits(t))


@pytest.mark.parametrize("dtype", DTYPES_64)
def test_64bit_tensor_refused_when_x64_off(dtype):
    assert not jax.config.jax_enable_x64
    t = torch.from_numpy(random_np(dtype, (3,)))
    with pytest.raises(TypeError, match=r"from_torch: leaf \['batch'\]\['ids'\].*narrowing.*jax_enable_x64"):
        from_torch({"batch": {"ids": t}})
    # numpy leaves follow the same rule
    with pytest.raises(TypeError, match=r"\[1\].*jax_enable_x64"):
        from_torch((jnp.ones(1), random_np(dtype, (2,))))


@pytest.mark.parametrize("dtype", DTYPES_64)
def test_64bit_round_trip_with_x64(dtype):
    a = random_np(dtype, (5,))  # extremes of the 64-bit range: any narrowing changes them
    with jax.enable_x64(True):
        x = from_torch(torch.from_numpy(a))
        assert x.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(bits(x), bits(a))
        t = to_torch(x)
        assert t.dtype == SUPPORTED_DTYPES[np.dtype(dtype)]
        assert t.data_ptr() == x.unsafe_buffer_pointer()
        np.testing.assert_array_equal(bits(t), bits(a))


@pytest.mark.parametrize("dtype", DTYPES_64)
def test_64bit_numpy_to_torch_is_fine_without_x64(dtype):
    a = random_np(dtype, (2, 3))
    t = to_torch(a)  # torch has every 64-bit dtype: nothing to refuse
    assert_same(a, t)


def test_bfloat16_numpy_leaf():
    a = np.asarray(jnp.asarray([1.5, -2.25, 3e38], jnp.bfloat16))
    t = to_torch(a)
    assert t.dtype == torch.bfloat16
    assert t.data_ptr() == a.ctypes.data
    np.testing.assert_array_equal(t.float().numpy(), [1.5, -2.25, np.float32(a[2])])


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES_32),
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=4),
    view=st.sampled_from(["none", "transpose", "step", "offset"]),
    seed=st.integers(0, 2**16),
    copy=st.booleans(),
)
def test_property_from_torch_views_match_numpy(dtype, shape, view, seed, copy):
    t = to_torch(random_np(dtype, shape, seed), copy=True)  # a tensor torch owns
    if view == "transpose" and t.ndim >= 2:
        t = t.transpose(0, t.ndim - 1)
    elif view == "step" and t.ndim >= 1:
        t = t[..., ::2]
    elif view == "offset" and t.ndim >= 1:
        t = t[1:]
    expected = bits(t.contiguous())
    x = from_torch(t, copy=copy)
    assert x.shape == tuple(t.shape) and x.dtype == jnp.dtype(dtype)
    if copy and t.numel():
        assert x.unsafe_buffer_pointer() != t.data_ptr()
    np.testing.assert_array_equal(bits(x), expected)
    np.testing.assert_array_equal(bits(jax.jit(lambda a: a)(x)), expected)  # usable under jit
    np.testing.assert_array_equal(bits(to_torch(x)), expected)
    t_copy = to_torch(x, copy=True)
    assert t_copy.dtype == t.dtype
    np.testing.assert_array_equal(bits(t_copy), expected)
    if x.size:
        assert t_copy.data_ptr() != x.unsafe_buffer_pointer()


# ------------------------------------------------------------------------------------ trees


class Transition(NamedTuple):
    obs: object
    action: object


@struct.dataclass
class Batch:
    transition: Transition
    weight: jax.Array
    name: str = struct.field(pytree_node=False, default="batch")


def nested_tree():
    return {
        "pixels": (jnp.arange(2 * 84 * 84, dtype=jnp.uint8).reshape(2, 84, 84), jnp.zeros((2,), jnp.bool_)),
        "sample": Batch(Transition(jnp.ones((2, 3), jnp.float16), jnp.asarray([1, 2], jnp.int32)), jnp.asarray([0.5, 2.0])),
        "list": [jnp.bfloat16(1.5), np.int8(-3)],
        "none": None,
    }


def test_nested_tree_keeps_structure_values_and_aliases():
    tree = nested_tree()
    out = to_torch(tree)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(tree)
    assert out["none"] is None and out["sample"].name == "batch"
    for (path, a), t in zip(jax.tree_util.tree_leaves_with_path(tree), jax.tree_util.tree_leaves(out)):
        assert isinstance(t, torch.Tensor), path
        assert_same(a, t)
        if isinstance(a, jax.Array):
            assert t.data_ptr() == a.unsafe_buffer_pointer(), path
    back = from_torch(out)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(tree)
    for a, b in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(back)):
        assert isinstance(b, jax.Array) and b.dtype == np.asarray(a).dtype
        np.testing.assert_array_equal(bits(b), bits(a))


def test_replay_sample_to_torch_and_priorities_back():
    item = {"obs": jnp.zeros((4, 4), jnp.uint8), "action": jnp.int32(0), "done": jnp.bool_(False)}
    buf = jb.ReplayBuffer.create(item, capacity=16)
    batch = {
        "obs": jnp.arange(8 * 16, dtype=jnp.uint8).reshape(8, 4, 4),
        "action": jnp.arange(8, dtype=jnp.int32),
        "done": jnp.arange(8) % 3 == 0,
    }
    buf = jax.jit(lambda b, x: b.add(x))(buf, batch)
    sample = jax.jit(lambda b, k: b.sample(k, 5))(buf, jax.random.key(0))
    out = to_torch(sample)
    assert isinstance(out, jb.ReplaySample)
    idx = np.asarray(sample.indices)
    assert torch.equal(out.indices, torch.from_numpy(idx))
    assert torch.equal(out.item["obs"], torch.from_numpy(np.asarray(batch["obs"])[idx]))
    assert out.item["done"].dtype == torch.bool and out.item["action"].dtype == torch.int32
    assert out.item["obs"].data_ptr() == sample.item["obs"].unsafe_buffer_pointer()
    td = out.item["action"].float() * 0.5  # torch-side result comes back to JAX
    prio = from_torch(td)
    np.testing.assert_allclose(np.asarray(prio), np.asarray(batch["action"])[idx] * 0.5)


# ------------------------------------------------------------------------------ zero copy


def test_zero_copy_jax_to_torch_shares_buffer():
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    t = to_torch(x)
    assert t.data_ptr() == x.unsafe_buffer_pointer()
    t[0, 0] = 100.0  # the documented hazard: an in-place write reaches the "immutable" JAX array
    assert float(x[0, 0]) == 100.0


def test_zero_copy_torch_to_jax_shares_buffer():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    x = from_torch(t)
    assert x.unsafe_buffer_pointer() == t.data_ptr()
    t.mul_(2)
    np.testing.assert_array_equal(np.asarray(x), np.arange(12).reshape(3, 4) * 2)


def test_copy_true_gives_private_memory_both_ways():
    x = jnp.arange(6, dtype=jnp.int32)
    t = to_torch(x, copy=True)
    assert t.data_ptr() != x.unsafe_buffer_pointer()
    t.add_(1)
    np.testing.assert_array_equal(np.asarray(x), np.arange(6))

    src = torch.arange(6, dtype=torch.int32)
    y = from_torch(src, copy=True)
    assert y.unsafe_buffer_pointer() != src.data_ptr()
    src.add_(1)
    np.testing.assert_array_equal(np.asarray(y), np.arange(6))

    z = from_torch(x, copy=True)  # JAX leaves: a fresh array too
    assert z.unsafe_buffer_pointer() != x.unsafe_buffer_pointer()
    assert from_torch(x) is x


def test_transposed_tensor_is_aliased_and_correct():
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    t = base.permute(2, 0, 1)
    assert not t.is_contiguous()
    x = from_torch(t)
    assert x.unsafe_buffer_pointer() == base.data_ptr()
    np.testing.assert_array_equal(np.asarray(x), base.numpy().transpose(2, 0, 1))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: a.sum(axis=0))(x)), base.numpy().transpose(2, 0, 1).sum(0))


@pytest.mark.parametrize(
    "make",
    [
        lambda b: b[:, ::2],  # strided slice
        lambda b: b[:, 1:2],  # gaps between rows
        lambda b: b[0:1].expand(3, 4),  # broadcast (stride 0)
        lambda b: b.reshape(-1)[1:],  # misaligned start
        lambda b: b.T[1:, ::2],  # slice of a transpose
    ],
    ids=["step", "column", "expand", "offset", "transposed-slice"],
)
def test_non_dense_tensor_converts_correctly(make):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = make(base)
    expected = t.contiguous().numpy().copy()
    x = from_torch(t)
    np.testing.assert_array_equal(np.asarray(x), expected)
    base.zero_()  # a copy does not see later writes; an alias would (only dense layouts alias)
    if x.unsafe_buffer_pointer() != t.data_ptr():
        np.testing.assert_array_equal(np.asarray(x), expected)


def test_numpy_leaf_to_torch_aliases_like_from_numpy():
    a = np.arange(10, dtype=np.float32)
    t = to_torch(a)
    assert t.data_ptr() == a.ctypes.data
    flipped = a[::-1]  # negative stride: torch cannot alias it, so it is copied
    tf = to_torch(flipped)
    np.testing.assert_array_equal(tf.numpy(), flipped)
    ro = np.asarray(jnp.arange(4.0))  # read-only view of a JAX buffer
    assert not ro.flags.writeable
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tr = to_torch(ro)
    assert tr.data_ptr() == ro.ctypes.data


def test_numpy_leaf_from_torch_is_copied():
    a = np.arange(5, dtype=np.int32)
    x = from_torch({"a": a})["a"]
    a[0] = 99
    np.testing.assert_array_equal(np.asarray(x), np.arange(5))


def test_to_torch_of_just_dispatched_jit_output_is_ready():
    f = jax.jit(lambda k: jax.random.normal(k, (512, 512)) @ jnp.ones((512, 512)))
    x = f(jax.random.key(1))  # asynchronous dispatch: DLPack export must wait for the result
    t = to_torch(x)
    np.testing.assert_array_equal(t.numpy(), np.asarray(x))


# ---------------------------------------------------------------------- device and lifetimes


def test_device_argument():
    x = jnp.arange(6, dtype=jnp.float32)
    for dev in ("cpu", torch.device("cpu")):
        t = to_torch(x, device=dev)
        assert t.device == torch.device("cpu") and t.data_ptr() == x.unsafe_buffer_pointer()
    m = to_torch({"x": x}, device="meta")["x"]  # another device: moved (here no data), shape kept
    assert m.device.type == "meta" and m.shape == (6,) and m.dtype == torch.float32
    tt = torch.ones(3)
    assert to_torch(tt) is tt
    assert to_torch(tt, copy=True).data_ptr() != tt.data_ptr()
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            to_torch(x, device="cuda")


def test_tensor_outlives_deleted_jax_array_and_vice_versa():
    x = jnp.arange(1000, dtype=jnp.float32)
    t = to_torch(x)
    x.delete()
    _ = [jnp.full((1000,), 7.0) for _ in range(20)]  # reuse freed memory if it was freed
    np.testing.assert_array_equal(t.numpy(), np.arange(1000))
    with pytest.raises(ValueError, match="deleted or donated"):
        to_torch({"x": x})

    t2 = torch.arange(1000, dtype=torch.float32)
    y = from_torch(t2)
    del t2
    gc.collect()
    _ = [torch.full((1000,), 7.0) for _ in range(20)]
    np.testing.assert_array_equal(np.asarray(y), np.arange(1000))


def test_donation_while_a_tensor_aliases_the_array():
    step = jax.jit(lambda a: a + 1, donate_argnums=0)
    x = jnp.arange(1000, dtype=jnp.float32)
    t = to_torch(x)
    y = step(x)
    assert not x.is_deleted()  # JAX refused to donate a buffer with an external reference
    assert y.unsafe_buffer_pointer() != t.data_ptr()
    np.testing.assert_array_equal(t.numpy(), np.arange(1000))
    np.testing.assert_array_equal(np.asarray(y), np.arange(1000) + 1)

    t2 = torch.arange(1000, dtype=torch.float32)
    x2 = from_torch(t2)
    y2 = step(x2)
    assert x2.is_deleted()
    np.testing.assert_array_equal(t2.numpy(), np.arange(1000))  # XLA did not write into torch memory
    np.testing.assert_array_equal(np.asarray(y2), np.arange(1000) + 1)


def test_requires_grad_and_conj_are_handled():
    w = torch.ones(3, requires_grad=True)
    x = from_torch({"w": w * 2})["w"]
    np.testing.assert_array_equal(np.asarray(x), [2.0, 2.0, 2.0])
    c = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()
    assert c.is_conj()
    np.testing.assert_array_equal(np.asarray(from_torch(c)), [1 - 2j, 3 + 1j])


# ----------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "leaf, match",
    [
        ("pixels", r"leaf \['obs'\]\[1\]: cannot convert str"),
        (3, r"leaf \['obs'\]\[1\]: cannot convert int 3: its dtype would be a guess"),
        (2.5, r"cannot convert float 2.5"),
        (object(), r"cannot convert object"),
        (np.array(["a", "b"]), r"leaf \['obs'\]\[1\]: dtype <U1 is not supported"),
        (np.array([1, None], dtype=object), r"dtype object is not supported"),
        (jnp.zeros(2, jnp.float8_e4m3fn), r"dtype float8_e4m3fn is not supported"),
        (np.zeros(2, ">f4"), r"non-native byte order"),
        (jax.random.key(0), r"to_torch: leaf \['obs'\]\[1\]: dtype key<fry> \(a PRNG key\) is not supported.*key_data"),
    ],
)
def test_to_torch_unsupported_leaf_names_the_path(leaf, match):
    with pytest.raises(TypeError, match=match):
        to_torch({"obs": (jnp.ones(1), leaf)})


@pytest.mark.parametrize(
    "leaf, match",
    [
        ("pixels", r"from_torch: leaf \['obs'\]\[1\]: cannot convert str"),
        (7, r"its dtype would be a guess"),
        (torch.zeros(2, dtype=torch.complex32), r"leaf \['obs'\]\[1\]: dtype torch.complex32 is not supported"),
        (torch.zeros(2, dtype=torch.float8_e4m3fn), r"dtype torch.float8_e4m3fn is not supported"),
        (torch.eye(3).to_sparse(), r"sparse_coo tensors are not supported"),
    ],
)
def test_from_torch_unsupported_leaf_names_the_path(leaf, match):
    with pytest.raises(TypeError, match=match):
        from_torch({"obs": (torch.ones(1), leaf)})


def test_to_torch_inside_jit_is_a_clear_error():
    with pytest.raises(TypeError, match=r"leaf \['a'\]: got a traced value.*outside jit"):
        jax.jit(lambda tree: to_torch(tree))({"a": jnp.ones(2)})


# ------------------------------------------------------------------------------- subprocesses


def run_python(code: str, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_importing_jaxbuffers_does_not_import_torch():
    out = run_python(
        """
        import sys
        import jaxbuffers, jaxbuffers.interop
        assert "torch" not in sys.modules, "jaxbuffers imported torch"
        import jaxbuffers.interop.torch
        assert "torch" in sys.modules
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_multi_device_arrays():
    out = run_python(
        """
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from jaxbuffers.interop.torch import to_torch
        mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
        x = jnp.arange(8.0)
        rep = jax.device_put(x, NamedSharding(mesh, P()))
        t = to_torch(rep)
        assert t.tolist() == list(range(8)), t
        assert t.data_ptr() == rep.addressable_data(0).unsafe_buffer_pointer()
        shard = jax.device_put(x, NamedSharding(mesh, P("d")))
        try:
            to_torch({"x": shard})
        except ValueError as e:
            assert "sharded over 2 devices" in str(e) and "['x']" in str(e), e
            print("ok")
        """,
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"},
    )
    assert out.strip() == "ok"


def test_error_hints_fit_the_leaf():
    with pytest.raises(TypeError, match=r"np\.float32\(1\.5\)") as e:
        to_torch({"x": 1.5})
    assert "np.int32" not in str(e.value)
    with pytest.raises(TypeError, match=r"np\.int32\(3\)"):
        to_torch({"x": 3})
    if not jax.config.jax_enable_x64:
        with pytest.raises(TypeError, match=r"array\.astype\(np\.float32\)"):
            from_torch({"x": np.zeros(2, np.float64)})
    # a big-endian numpy leaf is float32 all the same: converted, values kept
    got = from_torch({"x": np.arange(3, dtype=">f4")})["x"]
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), [0, 1, 2])
