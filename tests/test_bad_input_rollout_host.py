"""Bad input to `RolloutHostWriter`: every wrong argument of `add` (and of the constructor) is refused with an error
of ours naming it, before anything is written: the host mirrors, the staged entries, the row and the host stores'
entries are byte for byte as they were, in any order of calls; the documented defaults and JAX inputs give exactly
the state of their explicit numpy equivalents."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS, corrupt, non_arrays, refused, snapshot, wrong_shape
from compressed_bad_input import host_record
from jaxbuffers.compressed import CompressedRolloutBuffer, RolloutHostWriter, StaleBufferError

N, T, K, H, W = 2, 4, 3, 3, 4
EXAMPLE = {"pixels": jnp.zeros((K, H, W), jnp.uint8), "vec": jnp.zeros((2,), jnp.float32)}


def step(n: int = 0) -> dict:
    rng = np.random.default_rng(n)
    return {"pixels": rng.integers(0, 4, (N, K, H, W), dtype=np.uint8), "vec": rng.normal(size=(N, 2)).astype(np.float32)}


def fields(n: int = 0) -> dict:
    r = (n + np.arange(N)).astype(np.float32)
    return {"reward": r, "value": -r, "terminated": np.array([False, n % 2 == 1]), "truncated": np.array([n % 3 == 0, False]),
            "final_value": r + 1, "trainable": np.array([True, n % 2 == 0])}


def writer(adds: int = 2) -> RolloutHostWriter:
    w = RolloutHostWriter(CompressedRolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=T, compress=("pixels",), codec="rle", frame_stack=K))
    for n in range(adds):
        w.add(step(n), **fields(n))
    return w


def state(w: RolloutHostWriter) -> dict:
    """What a refused add must leave as it was: the row, the overflow flag, the host mirrors, the staged entries and
    the host stores' entries."""
    return {"row": w.row, "overflowed": w._overflowed, "mirrors": w._step, "fields": w._fields,
            "pending": [(s, list(d)) for s, d in w._pending], "host": host_record(w._state.host)}


W2 = writer()  # two steps added, entries staged: refused adds must leave it exactly so
FULL = writer(T)  # every row filled: an add with good arguments raises BufferFullError
FIELD = st.sampled_from(sorted(fields()))


@SETTINGS
@given(buffer=non_arrays() | st.sampled_from([jb.RolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=T), CompressedRolloutBuffer])
                | st.builds(lambda: RolloutHostWriter(CompressedRolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=T, compress=("pixels",), codec="rle"))))
def test_create_bad_buffer(buffer):
    refused(lambda: RolloutHostWriter(buffer), "buffer")


def test_create_refuses_stacked_stale_and_closed_buffers():
    """Each reached the writer (a stacked one as a Python conversion error; a stale or closed one was taken, and the
    stale one's adds would have overwritten frames the newer state reads); a store closed later refuses `add`."""
    make = lambda: CompressedRolloutBuffer.create(EXAMPLE, num_envs=N, num_steps=T, compress=("pixels",), codec="rle")  # noqa: E731
    refused(lambda: RolloutHostWriter(jax.vmap(lambda _: make())(jnp.arange(2))), "buffer", exc=(ValueError,))
    old = make()
    new = old.add(step(), **fields())
    refused(lambda: RolloutHostWriter(old), "buffer", state=lambda: host_record(new.host), exc=(StaleBufferError,))
    RolloutHostWriter(new)  # the newest state is taken
    closed = make()
    closed.close()
    refused(lambda: RolloutHostWriter(closed), "buffer", exc=(RuntimeError,))
    w = writer(1)
    w._state.host.close()  # closed while the writer holds it: add refused, the mirrors as they were
    refused(lambda: w.add(step(), **fields()), "add", state=lambda: {k: v for k, v in state(w).items() if k != "host"}, exc=(RuntimeError,))


@SETTINGS
@given(bad=corrupt(step(), "step"))
def test_add_wrong_step(bad):
    refused(lambda: W2.add(bad[0], **fields()), bad[1], state=lambda: state(W2))


@SETTINGS
@given(envs=st.sampled_from([1, 3]), whole=non_arrays().filter(lambda v: not isinstance(v, dict)))
def test_add_wrong_number_of_envs_or_not_a_step(envs, whole):
    s = {k: np.zeros((envs, *v.shape[1:]), v.dtype) for k, v in step().items()}
    refused(lambda: W2.add(s, **fields()), "step", state=lambda: state(W2))
    refused(lambda: W2.add(whole, **fields()), "step", state=lambda: state(W2))


@SETTINGS
@given(
    name=FIELD,
    bad=non_arrays() | wrong_shape((N,)).map(lambda s: np.zeros(s, np.float32))
    | st.sampled_from([np.uint8, np.int32, np.float16, np.bool_, np.float32, np.float64]),
)
@example(name="reward", bad=np.float64)  # never narrowed on the host
@example(name="reward", bad=None)  # a required field: refused naming it (not a KeyError of the defaults)
def test_add_wrong_field(name, bad):
    f = fields()
    if isinstance(bad, type):
        if np.dtype(bad) == f[name].dtype:
            return
        bad = np.zeros(N, bad)
    if bad is None and name in ("truncated", "final_value", "trainable"):
        return  # optional
    refused(lambda: W2.add(step(), **{**f, name: bad}), name, state=lambda: state(W2))


@SETTINGS
@given(which=st.sampled_from(["truncated", "final_value"]), full=st.booleans())
def test_add_truncated_without_final_value(which, full):
    """Refused naming the argument, on a full buffer too (before its BufferFullError)."""
    w = FULL if full else W2
    f = fields()
    del f[which]
    refused(lambda: w.add(step(), **f), which, state=lambda: state(w))



def test_full_buffer_refuses_bad_arguments_first_then_any_add():
    refused(lambda: FULL.add(step(), **{**fields(), "value": np.zeros(N, np.int32)}), "value", state=lambda: state(FULL))
    before = snapshot(state(FULL))
    with pytest.raises(jb.BufferFullError, match="nothing was written"):
        FULL.add(step(), **fields())
    assert snapshot(state(FULL)) == before and not bool(FULL.flush().buffer.overflowed)


def test_defaults_and_jax_inputs_give_the_explicit_state():
    """`truncated` / `final_value` / `trainable` left out are False / 0 / True (and not mirrored until given); JAX
    arrays are read as numpy: the same mirrors, stores and flushed state."""
    a, b, c = writer(0), writer(0), writer(0)
    for n in range(3):
        f = fields(n)
        a.add(step(n), reward=f["reward"], value=f["value"], terminated=f["terminated"])
        b.add(step(n), **{**f, "truncated": np.zeros(N, bool), "final_value": np.zeros(N, np.float32), "trainable": np.ones(N, bool)})
        c.add(jax.tree.map(jnp.asarray, step(n)), **{k: jnp.asarray(v) for k, v in f.items()})
    sa, sb = state(a), state(b)
    assert set(sa["fields"]) == set(sb["fields"]) - {"truncated", "final_value", "trainable"}  # left out: no mirror
    sb["fields"] = {k: v for k, v in sb["fields"].items() if k in sa["fields"]}
    assert snapshot(sa) == snapshot(sb)
    assert snapshot(a.flush()) == snapshot(b.flush())
    ref = writer(3)
    assert snapshot(state(c)) == snapshot(state(ref))
    assert snapshot(c.flush()) == snapshot(ref.flush())
    assert host_record(c.flush().host) == host_record(ref.flush().host)
    d = writer(0)  # an optional field given first at the second add: the first row holds its default
    d.add(step(0), reward=fields(0)["reward"], value=fields(0)["value"], terminated=fields(0)["terminated"])
    d.add(step(1), **fields(1))
    got = d.flush().buffer
    for k, first in (("truncated", False), ("final_value", 0.0), ("trainable", True)):
        np.testing.assert_array_equal(np.asarray(getattr(got, k))[:2], np.stack([np.full(N, first), fields(1)[k]]), err_msg=k)


@SETTINGS
@given(ops=st.lists(st.sampled_from(["add", "bad_step", "bad_field", "bad_pair", "reset", "flush"]), min_size=1, max_size=10))
def test_refused_calls_in_any_order_change_nothing(ops):
    """A writer given every call and one given only the accepted ones hold the same bytes after every call."""
    w, ref = writer(0), writer(0)
    valid = {"add": lambda x, n: x.add(step(n), **fields(n)), "reset": lambda x, n: x.reset(), "flush": lambda x, n: x.flush()}
    refusals = {
        "bad_step": (lambda x: x.add({**step(), "pixels": step()["pixels"][:, :1]}, **fields()), "step['pixels']"),
        "bad_field": (lambda x: x.add(step(), **{**fields(), "terminated": np.zeros(N, np.uint8)}), "terminated"),
        "bad_pair": (lambda x: x.add(step(), **{**fields(), "final_value": None}), "truncated"),
    }
    for n, op in enumerate(ops):
        if op in valid:  # an add to a full rollout is refused by both (BufferFullError), the others taken
            full = []
            for x in (w, ref):
                try:
                    valid[op](x, n)
                    full.append(False)
                except jb.BufferFullError:
                    full.append(True)
            assert full[0] == full[1] and (op == "add" or not full[0])
        else:
            call, name = refusals[op]
            refused(lambda: call(w), name, state=lambda: state(w))
        assert snapshot(state(w)) == snapshot(state(ref))
    assert snapshot(w.flush()) == snapshot(ref.flush())
