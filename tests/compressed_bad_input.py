"""Shared by the bad-input tests of the compressed buffers and the staging writer: strategies for wrong arguments
and the check that a refused call changed nothing (device leaves byte for byte, host store contents and version).
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from jaxbuffers import TrajectoryBuffer, _validate
from jaxbuffers.compressed import StagingWriter, StaleBufferError

# Each example traces a new program (refused at trace time, so nothing compiles): a few dozen per test.
SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)

#: What a refusal may raise: errors of ours, never JAX's runtime error from inside a callback.
OURS = (TypeError, ValueError, RuntimeError, StaleBufferError)


def host_record(host) -> dict:
    """The host stores' contents (every slot decoded; empty slots as zeros) and counters."""
    if host.closed:
        return {"closed": True}
    slots = np.arange(host.num_slots)
    return {
        "version": host.version, "num_writes": host.num_writes, "num_rows": host.num_rows,
        "slot_version": host.slot_version.tobytes(),
        "contents": [s.get(slots, missing="zeros").tobytes() for s in host.stores],
    }


@contextlib.contextmanager
def corrupted(host):
    """Inside the block every entry of the host stores fails its checksum on read (as after a flipped payload byte);
    restored after it."""
    for s in host.stores:
        s._check ^= 1
    try:
        yield
    finally:
        for s in host.stores:
            s._check ^= 1


def record(thing: Any) -> dict:
    """Everything a refused call must leave as it was: a compressed buffer state's device leaves (dtype, shape,
    bytes) and host record; for a `StagingWriter`, also its staged rows and wrapped state."""
    if isinstance(thing, StagingWriter):
        n = thing.pending
        dense = [x for x in thing._final or [] if x is not None]  # the compressed leaves' final frames: _final_frames
        staged = [x[:, :n].tobytes() for x in thing._stage + [thing._terminated, thing._truncated] + dense]
        finals = sorted((key, [f.tobytes() for f in frames]) for key, frames in thing._final_frames.items())
        return {"pending": n, "staged": staged, "finals": finals, "buffer": record(thing._buf)}
    leaves = [(str(x.dtype), x.shape, np.asarray(x).tobytes()) for x in jax.tree.leaves(thing)]
    return {"device": leaves, "host": host_record(thing.host)}


def assert_refused(call: Callable[[], Any], names: tuple[str, ...], *things: Any, errors: tuple = OURS) -> Exception:
    """`call()` raises one of `errors` whose message starts with, or names, one of `names` (an argument or leaf),
    and every one of `things` (buffer states, writers) is exactly as it was before. Returns the error."""
    before = [record(t) for t in things]
    try:
        out = call()
        jax.block_until_ready(out)
    except errors as e:
        err = e
    else:
        raise AssertionError(f"accepted, expected an error naming one of {names}; returned {type(out).__name__}")
    msg = str(err)
    assert any(re.search(rf"(^|\W){re.escape(n)}(\W|$)", msg) for n in names), f"{type(err).__name__} does not name {names}: {msg}"
    for t, b in zip(things, before):
        assert record(t) == b, f"{type(t).__name__} changed by a refused call ({msg[:120]})"
    return err


MODES = st.sampled_from(["eager", "jit", "donated"])


def run_in(mode: str, buf: Any, call: Callable[[Any], Any]) -> tuple[Callable[[], Any], Any]:
    """(`call(buf)` eagerly, under `jit`, or under `jit` with the state donated; the state it is given). A donated
    state is a copy of `buf`, so that a wrong acceptance fails one example, not the ones after it."""
    if mode == "eager":
        return lambda: call(buf), buf
    if mode == "donated":
        buf = jax.tree.map(jnp.copy, buf)
    return lambda: jax.jit(call, donate_argnums=(0,) if mode == "donated" else ())(buf), buf


# ------------------------------------------------------------------------------------------------
# Strategies. Each draws (description, wrong value) for one argument, given the right value.

NOT_ARRAYS = st.sampled_from([None, "x", "0", b"0", 1.5, True, {"a": 1}, object()])


@st.composite
def wrong_array(draw, good: Any) -> tuple[str, Any]:
    """A wrong stand-in for the array `good`: another dtype, another shape, a list or a non-array."""
    good = np.asarray(good)
    kind = draw(st.sampled_from(["dtype", "shape", "list", "other"]))
    if kind == "dtype":
        others = [d for d in (np.bool_, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64, np.complex64) if np.dtype(d) != good.dtype]
        bad = good.astype(draw(st.sampled_from(others)))
        if bad.dtype.itemsize < 8 and draw(st.booleans()):  # a JAX array too (64-bit ones JAX would narrow)
            bad = jnp.asarray(bad)
        return f"dtype {bad.dtype}", bad
    if kind == "shape":
        shape = list(good.shape)
        how = draw(st.sampled_from(["grow", "shrink", "add_axis", "drop_axis"] if shape else ["add_axis"]))
        if how == "add_axis":
            shape.insert(draw(st.integers(0, len(shape))), draw(st.integers(0, 3)))
        elif how == "drop_axis":
            shape.pop(draw(st.integers(0, len(shape) - 1)))
        else:
            i = draw(st.integers(0, len(shape) - 1))
            shape[i] = shape[i] + 1 if how == "grow" else max(shape[i] - 1, 0) if shape[i] != 1 else 2
        return f"shape {tuple(shape)}", np.zeros(shape, good.dtype)
    if kind == "list":
        return "list", good.tolist()
    return "not an array", draw(NOT_ARRAYS)


@st.composite
def wrong_tree(draw, good: dict) -> tuple[str, Any]:
    """`good` (a dict pytree of arrays) with one thing wrong: a leaf (`wrong_array`), a missing or extra field,
    or the whole tree replaced. Returns (description, tree)."""
    kind = draw(st.sampled_from(["leaf", "leaf", "leaf", "missing", "extra", "whole"]))
    if kind == "whole":
        return "not a dict", draw(st.sampled_from([None, "step", [1, 2], 3.0]))
    if kind == "extra":
        return "extra field", {**good, "extra": np.zeros(1, np.float32)}
    if kind == "missing" and len(good) > 1:
        key = draw(st.sampled_from(sorted(good)))
        return f"missing {key!r}", {k: v for k, v in good.items() if k != key}
    leaves, treedef = jax.tree.flatten(good)
    i = draw(st.integers(0, len(leaves) - 1))
    what, bad = draw(wrong_array(leaves[i]))
    return f"leaf {i}: {what}", jax.tree.unflatten(treedef, [bad if j == i else x for j, x in enumerate(leaves)])


def wrong_trajectory_add(data: Any, arg: str, step: dict, flags: dict) -> tuple[dict, dict, tuple[str, ...]]:
    """The arguments of a trajectory add, `step` and `flags` (`terminated`, `truncated`, `final_obs`), with `arg`
    wrong (drawn from hypothesis' `data`; `truncated` and `final_obs` sometimes left out when right); and the
    names an error may give."""
    flags = dict(flags)
    if not data.draw(st.booleans(), "truncated given") and arg not in ("truncated", "final_obs"):
        del flags["truncated"], flags["final_obs"]
    args = {"step": step, **flags}
    strategy = wrong_tree if isinstance(args[arg], dict) else wrong_array
    _, args[arg] = data.draw(strategy(args[arg]), arg)
    step = args.pop("step")
    return step, args, ("truncated", "final_obs") if arg == "truncated" else (arg,)


BAD_SIZES = st.sampled_from([0, -1, 2.5, 2.0, True, "3", None, 2**40, np.float32(2)])
#: Wrong values of a discount or a lambda (a number in [0, 1]); `BAD_EXPONENTS`: of beta (a number >= 0).
BAD_SCALARS = st.sampled_from([-0.5, 1.5, 7, float("nan"), float("inf"), None, "0.9", True, [0.9], np.ones(2, np.float32), 1 + 2j])
BAD_EXPONENTS = st.sampled_from([-0.5, -1, float("nan"), float("inf"), "0.9", True, [0.9], np.ones(2, np.float32), 1 + 2j])
NOT_DEFAULT = BAD_SIZES.filter(lambda v: v is not None)  # None: the default n_step / sequence_length of some buffers


def sampling_calls(prioritised: bool, length: int) -> list:
    """(argument, strategy of wrong values, call of (state or writer, value)) for `sample_transitions` and
    `sample_sequences` of a compressed trajectory buffer (lanes of `length` steps) or a writer around one."""
    key = jax.random.key(0)
    beta = {"beta": 0.5} if prioritised else {}
    seq = () if prioritised else (2,)
    calls = [
        ("batch_size", BAD_SIZES, lambda b, v: b.sample_transitions(key, v, gamma=0.9, **beta)),
        ("n_step", NOT_DEFAULT | st.just(length), lambda b, v: b.sample_transitions(key, 4, n_step=v, gamma=0.9, **beta)),
        ("gamma", BAD_SCALARS, lambda b, v: b.sample_transitions(key, 4, gamma=v, **beta)),
        ("batch_size", BAD_SIZES, lambda b, v: b.sample_sequences(key, v, *seq, **beta)),
        ("sequence_length", NOT_DEFAULT | st.just(length + 1), lambda b, v: b.sample_sequences(key, 4, v, **beta)),
    ]
    if prioritised:
        return calls + [
            ("beta", BAD_EXPONENTS, lambda b, v: b.sample_transitions(key, 4, gamma=0.9, beta=v)),
            ("beta", BAD_EXPONENTS, lambda b, v: b.sample_sequences(key, 4, beta=v)),
        ]
    return calls + [
        ("beta", st.sampled_from([0.5, 1.0, -1.0]), lambda b, v: b.sample_transitions(key, 4, gamma=0.9, beta=v)),  # uniform: none
        ("period", BAD_SIZES, lambda b, v: b.sample_sequences(key, 4, 2, period=v)),
        ("cross_episodes", st.sampled_from(["no", 1, None, np.array(True)]), lambda b, v: b.sample_sequences(key, 4, 2, cross_episodes=v)),
    ]
#: Wrong PRNG keys: not a key, a raw key of the wrong dtype or length, a batch of keys.
WRONG_KEYS = [None, "key", 0, 1.5, [0, 1], np.zeros(2, np.int32), np.zeros(3, np.uint32), jax.random.split(jax.random.key(0))]


@functools.cache
def _foreign_inputs_named() -> bool:
    """Whether the shared checks name the argument for a torch tensor given as an array and for a non-key given as
    a PRNG key (the device buffers' sampling checks, which the compressed buffers reach through their inner buffer)."""
    import torch

    try:
        _validate.array("x", torch.zeros(1))
    except TypeError as e:
        if not str(e).startswith("x:"):
            return False
    example = {"obs": jnp.zeros(1), "action": jnp.int32(0), "reward": jnp.float32(0)}
    try:
        TrajectoryBuffer.create(example, num_envs=1, length=2).sample_sequences(None, 1, 1)
    except TypeError as e:
        return str(e).startswith("key")
    return False


#: Marks a test of torch tensors and wrong PRNG keys, which needs `_foreign_inputs_named`.
foreign_inputs = pytest.mark.skipif(
    not _foreign_inputs_named(), reason="jaxbuffers._validate does not name torch tensors and wrong PRNG keys"
)


def torch_tensor(x: Any) -> Any:
    """`x` (numpy) as a CPU torch tensor."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(x))
