"""A buffer state stacked with `jax.vmap` (one buffer per member) called without `vmap`: every public method of every
buffer class refuses it, eagerly and under `jit`, naming the method and the member axis; under `jax.vmap` the same
methods work per member (`jaxbuffers._validate.members`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb
from buffer_calls import BUFFERS, KEY

S = 3  # members


def _stacked(b):
    return jax.tree.map(lambda x: jnp.stack([x] * S), b)


def _refusals(name: str, sanity: bool) -> dict:
    """{method: what went wrong} over the calls of `BUFFERS[name]` on a stacked state (`sanity`: each call is made
    on one member's state first, which takes it)."""
    one, calls = BUFFERS[name](sanity)
    stacked = _stacked(one)
    wrong = {}
    for method, call in calls.items():
        if sanity and not (name.startswith("Compressed") and method.startswith("add")):  # an add would leave `one` stale
            call(one)
        try:
            call(stacked)
            wrong[method] = "accepted"
        except Exception as e:  # noqa: BLE001 - every refusal is compared below
            if not (type(e) is ValueError and str(e).startswith(f"{name}.{method}: the state has a leading member axis of {S} ")):
                wrong[method] = f"{type(e).__name__}: {str(e)[:120]}"
    return wrong


@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_every_method_refuses_a_stacked_state_outside_vmap(name):
    """A stacked state is refused before anything runs, naming the method and the member axis (before, some methods
    read the member axis as data, others failed inside JAX)."""
    assert _refusals(name, sanity=False) == {}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_every_refused_call_is_taken_by_one_member(name):
    """The calls refused above are ones that one member's state takes."""
    assert _refusals(name, sanity=True) == {}


def test_refused_under_jit_and_taken_under_vmap():
    """Under `jit` the refusal is raised while tracing; under `vmap` each member is one buffer (member `s` holds
    `100 * s + {0, 1, 2}`: every sampled item is its own member's)."""
    stacked = jax.vmap(lambda s: jb.ReplayBuffer.create({"x": jnp.int32(0)}, 4).add({"x": 100 * s + jnp.arange(3, dtype=jnp.int32)}))(
        jnp.arange(S, dtype=jnp.int32))
    with pytest.raises(ValueError, match=rf"^ReplayBuffer\.sample: the state has a leading member axis of {S} .*jax\.vmap"):
        jax.jit(lambda b: b.sample(KEY, S))(stacked)
    with pytest.raises(ValueError, match=r"^ReplayBuffer\.add: the state has a leading member axis"):
        jax.jit(lambda b: b.add({"x": jnp.full((1, 4), 7, jnp.int32)}))(stacked)
    out = jax.jit(jax.vmap(lambda b, k: b.sample(k, 5)))(stacked, jax.random.split(KEY, S))
    assert ((np.asarray(out.item["x"]) // 100) == np.arange(S)[:, None]).all()
    assert np.asarray(jax.vmap(jb.ReplayBuffer.size)(stacked)).tolist() == [3] * S
    with pytest.raises(ValueError, match=r"^ReplayBuffer\.num_added: .*take one member"):
        stacked.num_added()


@pytest.mark.parametrize("name", sorted(n for n in BUFFERS if "Rollout" not in n))  # a rollout has no sampler
def test_every_can_sample_takes_exactly_its_samplers_arguments(name):
    """`can_sample*` answers for the sampler called with the same arguments, so it takes them, key apart: the same
    names, kinds, order and defaults (a sampler's required argument may have one there: `gamma`, `batch_size`). `PrioritisedReplayBuffer.can_sample`
    refused `beta=`, `TrajectoryBuffer.can_sample_transitions` refused `gamma=`."""
    import inspect

    cls = type(BUFFERS[name](False)[0])
    samplers = [m for m in dir(cls) if m.startswith("sample") and callable(getattr(cls, m))]
    assert samplers
    for sampler in samplers:
        checker = f"can_{sampler}" if hasattr(cls, f"can_{sampler}") else "can_sample"
        want = [p for p in inspect.signature(getattr(cls, sampler)).parameters.values() if p.name != "key"]
        got = list(inspect.signature(getattr(cls, checker)).parameters.values())
        assert [(p.name, p.kind) for p in got] == [(p.name, p.kind) for p in want], (checker, sampler)
        for p, q in zip(want, got):
            assert p.default is p.empty or q.default == p.default, (checker, sampler, p.name)


@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_host_side_methods_refuse_jit_and_vmap_naming_what_to_read_inside(name):
    """`num_added` and `stats` read values on the host: under `jit` or `jax.vmap` they are a TypeError naming the
    method and the state to read inside instead (it was JAX's TracerArrayConversionError)."""
    one, calls = BUFFERS[name](True)
    host = [m for m in ("num_added", "stats") if m in calls]
    inside = {"num_added": r"buf\.added", "stats": r"buf\.metrics"}
    for method in host:
        call = calls[method]
        call(one)  # eager: a host value
        for how, run in (("jit", lambda: jax.jit(call)(one)), ("vmap", lambda: jax.vmap(call)(_stacked(one)))):
            with pytest.raises(TypeError, match=rf"^{name}\.{method} is read on the host: call it outside jit/vmap; "
                                                rf"inside, .*{inside[method]}"):
                run()
    assert name.endswith("RolloutBuffer") or host == ["num_added", "stats"]
