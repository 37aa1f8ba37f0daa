"""ReplayBuffer: model-based tests against a plain-Python ring, compile counts, donation, errors."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxbuffers as jb

ITEM = {"obs": jnp.zeros((3,), jnp.float32), "action": jnp.int32(0), "done": jnp.bool_(False)}


def make_batch(start: int, b: int):
    """Batch whose items are numbered start .. start+b-1 (every leaf derived from the number)."""
    n = np.arange(start, start + b)
    return {
        "obs": jnp.asarray(np.stack([n, -n, n * 0.5], axis=1), jnp.float32),
        "action": jnp.asarray(n, jnp.int32),
        "done": jnp.asarray(n % 3 == 0),
    }


class ModelRing:
    """Reference: a Python list ring buffer holding item numbers."""

    def __init__(self, capacity):
        self.capacity, self.slots, self.head, self.n = capacity, [None] * capacity, 0, 0

    def add(self, numbers):
        for x in numbers:
            self.slots[self.head] = x
            self.head = (self.head + 1) % self.capacity
            self.n += 1

    @property
    def valid(self):
        return [s for s in self.slots if s is not None]


def check_against_model(buf, model, jit):
    stored = jax.device_get(buf.storage)  # one copy to the host, read slot by slot
    assert int(buf.size()) == len(model.valid)
    assert bool(buf.is_full()) == (len(model.valid) == model.capacity)
    assert buf.num_added() == model.n
    for slot, number in enumerate(model.slots):
        if number is not None:
            assert stored["action"][slot] == number
            np.testing.assert_array_equal(stored["obs"][slot], [number, -number, number * 0.5])
            assert bool(stored["done"][slot]) == (number % 3 == 0)


# Capacities and batch sizes from small fixed sets (a batch below, at and above the capacity, which
# clips it) so that the add and sample programs compile once per shape and are reused.
SIZES = [1, 2, 3, 5, 8, 17]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@settings(max_examples=30, deadline=None)
@given(
    capacity=st.sampled_from(SIZES),
    ops=st.lists(st.tuples(st.sampled_from(["add", "sample"]), st.sampled_from(SIZES), st.integers(0, 2**31 - 1)), max_size=25),
)
def test_model_based(jit, capacity, ops):
    add = jax.jit(jb.ReplayBuffer.add) if jit else jb.ReplayBuffer.add
    sample = jax.jit(jb.ReplayBuffer.sample, static_argnums=2) if jit else jb.ReplayBuffer.sample
    buf = jb.ReplayBuffer.create(ITEM, capacity)
    model = ModelRing(capacity)
    counter = 0
    for op, n, seed in ops:
        if op == "add":
            b = min(n, capacity)
            buf = add(buf, make_batch(counter, b))
            model.add(range(counter, counter + b))
            counter += b
            check_against_model(buf, model, jit)
        else:
            assert bool(buf.can_sample(n)) == bool(model.valid)
            if not model.valid:
                continue
            out = sample(buf, jax.random.key(seed), n)
            idx = np.asarray(out.indices)
            actions = np.asarray(out.item["action"])
            assert idx.shape == (n,) and actions.shape == (n,)
            for i, a in zip(idx, actions):
                assert model.slots[i] == a  # index points at the item, which the model holds
            np.testing.assert_array_equal(np.asarray(out.item["obs"])[:, 0], actions)


def test_sampling_is_uniform_over_valid_items():
    buf = jb.ReplayBuffer.create(ITEM, 10).add(make_batch(0, 7)).add(make_batch(7, 6))  # valid: 3..12
    out = jax.jit(jb.ReplayBuffer.sample, static_argnums=2)(buf, jax.random.key(0), 50_000)
    values, counts = np.unique(np.asarray(out.item["action"]), return_counts=True)
    assert values.tolist() == list(range(3, 13))
    expected = 5000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 27.88  # chi-square 9 dof, p = 0.001


def test_compiles_once_per_shape(compile_counter):
    buf = jb.ReplayBuffer.create(ITEM, 64)
    add = jax.jit(jb.ReplayBuffer.add, donate_argnums=0)
    sample = jax.jit(jb.ReplayBuffer.sample, static_argnums=2)
    batches = [make_batch(i, 5) for i in range(100)]
    keys = list(jax.random.split(jax.random.key(0), 100))
    with compile_counter() as n:
        for b, k in zip(batches, keys):
            buf = add(buf, b)
            sample(buf, k, 32)
        jax.block_until_ready(buf)
    assert n() == 2  # one add, one sample, over 100 calls


def test_donated_add_updates_in_place():
    buf = jb.ReplayBuffer.create({"x": jnp.zeros((5,), jnp.float32)}, 1_000_000)
    add = jax.jit(jb.ReplayBuffer.add, donate_argnums=0)
    batch = {"x": jnp.ones((256, 5), jnp.float32)}
    buf = add(buf, batch)  # first call may allocate the output
    for _ in range(3):
        ptr = buf.storage["x"].unsafe_buffer_pointer()
        buf = add(buf, batch)
        assert buf.storage["x"].unsafe_buffer_pointer() == ptr
    assert int(buf.size()) == 4 * 256


def test_dict_observations_keep_dtypes_and_memory_bytes():
    item = {"pixels": jnp.zeros((84, 84, 4), jnp.uint8), "vec": jnp.zeros((7,), jnp.float32)}
    buf = jb.ReplayBuffer.create(item, 1000)
    assert buf.memory_bytes == 28_252_000
    assert buf.storage["pixels"].dtype == jnp.uint8 and buf.storage["vec"].dtype == jnp.float32
    batch = {
        "pixels": jnp.full((4, 84, 84, 4), 200, jnp.uint8),
        "vec": jnp.arange(28, dtype=jnp.float32).reshape(4, 7),
    }
    out = buf.add(batch).sample(jax.random.key(0), 16)
    assert out.item["pixels"].dtype == jnp.uint8 and out.item["pixels"].shape == (16, 84, 84, 4)
    assert out.item["vec"].dtype == jnp.float32 and out.item["vec"].shape == (16, 7)
    assert int(out.item["pixels"].min()) == 200
    np.testing.assert_array_equal(np.asarray(out.item["vec"]), np.asarray(batch["vec"])[np.asarray(out.indices)])


@pytest.mark.parametrize(
    "bad, err, pattern",
    [
        ({"obs": jnp.zeros((2, 3)), "action": jnp.zeros((2,), jnp.int32)}, TypeError, r"missing leaves .*done"),
        ({**make_batch(0, 2), "obs": jnp.zeros((2, 4))}, ValueError, r"batch\['obs'\].*\(3,\).*got \(2, 4\)"),
        ({**make_batch(0, 2), "action": jnp.zeros((2,), jnp.float32)}, TypeError, r"batch\['action'\]: expected dtype int32, got float32"),
        (make_batch(0, 9), ValueError, r"batch of 9 items does not fit a ring of capacity 8"),
    ],
    ids=["structure", "shape", "dtype", "oversize"],
)
def test_bad_input_raises_and_leaves_buffer_unchanged(bad, err, pattern):
    buf = jb.ReplayBuffer.create(ITEM, 8).add(make_batch(0, 3))
    before = jax.tree.map(np.asarray, buf)
    for fn in (jb.ReplayBuffer.add, jax.jit(jb.ReplayBuffer.add)):
        with pytest.raises(err, match=pattern):
            fn(buf, bad)
    after = jax.tree.map(np.asarray, buf)
    jax.tree.map(np.testing.assert_array_equal, before, after)


def test_create_errors():
    with pytest.raises(ValueError, match="capacity"):
        jb.ReplayBuffer.create(ITEM, 0)
    with pytest.raises(ValueError, match="min_size"):
        jb.ReplayBuffer.create(ITEM, 4, min_size=5)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="batch_size"):
            jb.ReplayBuffer.create(ITEM, 4).sample(jax.random.key(0), bad)


def test_min_size_and_empty_sample_is_defined():
    """can_sample is True exactly when sample returns only stored items (size >= min_size)."""
    buf = jb.ReplayBuffer.create(ITEM, 8, min_size=3)
    assert not bool(buf.can_sample(1))
    out = buf.sample(jax.random.key(0), 4)  # empty: zeros from slot 0, never garbage
    assert np.all(np.asarray(out.indices) == 0) and np.all(np.asarray(out.item["obs"]) == 0)
    buf = buf.add(make_batch(0, 2))
    assert not bool(buf.can_sample(1))
    assert bool(buf.add(make_batch(2, 1)).can_sample(1))


def test_inside_lax_scan_fills_and_wraps():
    def step(buf, i):
        b = {"obs": jnp.stack([i, -i, i * 0.5])[None].astype(jnp.float32), "action": i[None], "done": (i % 3 == 0)[None]}
        return buf.add(b), buf.size()

    buf, sizes = jax.jit(lambda b: jax.lax.scan(step, b, jnp.arange(20, dtype=jnp.int32)))(jb.ReplayBuffer.create(ITEM, 7))
    assert np.asarray(sizes).tolist() == [min(i, 7) for i in range(20)]
    model = ModelRing(7)
    model.add(range(20))
    check_against_model(buf, model, True)


def test_vmap_over_stacked_buffers_equals_separate_buffers():
    seeds = 3
    bufs = jax.vmap(lambda _: jb.ReplayBuffer.create(ITEM, 5))(jnp.arange(seeds))
    batches = [jax.tree.map(lambda *xs: jnp.stack(xs), *[make_batch(10 * s + k, 3) for s in range(seeds)]) for k in range(3)]
    keys = jax.random.split(jax.random.key(0), seeds)
    for b in batches:
        bufs = jax.jit(jax.vmap(jb.ReplayBuffer.add))(bufs, b)
    out = jax.vmap(jb.ReplayBuffer.sample, in_axes=(0, 0, None))(bufs, keys, 6)
    for s in range(seeds):
        single = jb.ReplayBuffer.create(ITEM, 5)
        for k in range(3):
            single = single.add(make_batch(10 * s + k, 3))
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(lambda x: np.asarray(x[s]), bufs.storage), jax.tree.map(np.asarray, single.storage))
        ref = single.sample(keys[s], 6)
        np.testing.assert_array_equal(np.asarray(out.indices[s]), np.asarray(ref.indices))
    assert np.asarray(jax.vmap(jb.ReplayBuffer.size)(bufs)).tolist() == [5, 5, 5]
    assert [jax.tree.map(lambda x: x[s], bufs).num_added() for s in range(seeds)] == [9, 9, 9]


def test_named_ring_fields_and_with_cursors_checks():
    """The ring state is named fields (head, num_valid, added); with_cursors replaces the given
    ones after a range check and rejects wrong dtypes, shapes and concrete values out of range,
    naming the field; add carries on from what was set."""
    from jaxbuffers import _ring

    buf = jb.ReplayBuffer.create(ITEM, 10)
    assert buf.head.dtype == buf.num_valid.dtype == buf.added.dtype == jnp.int32
    assert (buf.head.shape, buf.num_valid.shape, buf.added.shape) == ((), (), (2,))
    b = buf.with_cursors(head=3, num_valid=10, added=_ring.counter_add(_ring.counter_zero(), 2**30 + 5))
    assert (int(b.head), int(b.num_valid), b.num_added()) == (3, 10, 2**30 + 5)
    b = jax.jit(lambda x: x.with_cursors(head=x.head + 1))(b)  # traced values are not range-checked
    assert (int(b.head), int(b.num_valid), b.num_added()) == (4, 10, 2**30 + 5)
    b = b.add({"obs": jnp.ones((2, 3)), "action": jnp.zeros(2, jnp.int32), "done": jnp.zeros(2, bool)})
    assert (int(b.head), b.num_added()) == (6, 2**30 + 7)
    for kw, err, words in [
        (dict(head=10), ValueError, "head: expected a value in [0, 9]"),
        (dict(head=np.int64(2**32 + 3)), ValueError, "head: expected a value in [0, 9]"),  # not wrapped to 3
        (dict(num_valid=-1), ValueError, "num_valid: expected a value in [0, 10]"),
        (dict(head=jnp.float32(3)), TypeError, "head: expected an integer value"),
        (dict(added=5), ValueError, "added: expected shape (2,)"),
        (dict(added=jnp.array([0, 2**30])), ValueError, "added: expected [high, low]"),
    ]:
        with pytest.raises(err, match=re.escape(words)):
            buf.with_cursors(**kw)


def test_eager_calls_compile_once_per_shape_and_equal_jitted(compile_counter):
    """Eager add / sample / can_sample run one cached program each: after the first call of a
    shape nothing compiles, and the results equal the jitted calls'."""
    buf = jb.ReplayBuffer.create(ITEM, 16)
    add, sample = jax.jit(jb.ReplayBuffer.add), jax.jit(jb.ReplayBuffer.sample, static_argnums=2)
    eager, jitted = buf.add(make_batch(0, 3)), add(buf, make_batch(0, 3))
    eager.sample(jax.random.key(0), 8), eager.can_sample(8)
    with compile_counter() as n:
        for k in range(1, 6):
            eager, jitted = eager.add(make_batch(3 * k, 3)), add(jitted, make_batch(3 * k, 3))
            out = eager.sample(jax.random.key(k), 8)
            assert bool(eager.can_sample(8))
            jax.tree.map(np.testing.assert_array_equal, out, sample(jitted, jax.random.key(k), 8))
    assert n() == 1  # the jitted sample of the reference; none for the eager calls
    jax.tree.map(np.testing.assert_array_equal, eager, jitted)
