"""Bad input to CompressedTrajectoryBuffer and CompressedPrioritisedTrajectoryBuffer: every wrong argument, eager
and under `jit`, is refused with an error of ours naming it, and leaves the buffer (device leaves and host store)
exactly as it was; stale states are refused before anything runs where the state is concrete."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compressed_bad_input import (
    BAD_SIZES, MODES, SETTINGS, WRONG_KEYS, assert_refused, corrupted, foreign_inputs, record, run_in, sampling_calls,
    torch_tensor, wrong_array, wrong_trajectory_add, wrong_tree,
)
from host_codecs import CorruptEntryError
from jaxbuffers.compressed._common import forced_callbacks
from jaxbuffers.compressed import CompressedPrioritisedTrajectoryBuffer, CompressedTrajectoryBuffer, StaleBufferError

E, LENGTH, K, H, W = 2, 6, 2, 3, 4
EXAMPLE = {
    "obs": {"pixels": jnp.zeros((K, H, W), jnp.uint8), "vec": jnp.zeros(2, jnp.float32)},
    "action": jnp.int32(0), "reward": jnp.float32(0),
}


def _step(rng, t=None):
    """Steps that each start an episode: every stack is one random frame repeated (the "reset" padding)."""
    lead = (E,) if t is None else (E, t)
    frame = rng.integers(0, 256, (*lead, 1, H, W), dtype=np.uint8)
    return {
        "obs": {"pixels": np.repeat(frame, K, axis=len(lead)), "vec": rng.normal(size=(*lead, 2)).astype(np.float32)},
        "action": rng.integers(0, 4, lead).astype(np.int32), "reward": rng.normal(size=lead).astype(np.float32),
    }


def _good_add(rng):
    """One step that ends every lane's episode (so the next `_step` starts one), final observations the step's
    stacks shifted by a new frame."""
    step = _step(rng)
    newest = rng.integers(0, 256, (E, 1, H, W), dtype=np.uint8)
    final = {"pixels": np.concatenate([step["obs"]["pixels"][:, 1:], newest], axis=1), "vec": rng.normal(size=(E, 2)).astype(np.float32)}
    flags = {"terminated": np.array([False, True]), "truncated": np.array([True, False]), "final_obs": final}
    return step, flags


def _filled(cls, **kw):
    rng = np.random.default_rng(0)
    buf = cls.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, compress=("pixels",), codec="rle", final_obs_capacity=2, **kw)
    for _ in range(4):
        step, flags = _good_add(rng)
        buf = buf.add(step, **flags)
    return buf


@pytest.fixture(scope="module")
def bufs():
    """One filled buffer of each kind, shared by the examples (a refused call changes nothing), and a newer state
    holder for the stale-state tests."""
    out = {"uniform": _filled(CompressedTrajectoryBuffer), "prioritised": _filled(CompressedPrioritisedTrajectoryBuffer, window_length=2)}
    yield out
    for b in out.values():
        b.close()


@SETTINGS
@given(data=st.data(), kind=st.sampled_from(["uniform", "prioritised"]), arg=st.sampled_from(["step", "terminated", "truncated", "final_obs"]),
       mode=st.sampled_from(["eager", "jit", "donated", "from_host"]), seed=st.integers(0, 2**16))
def test_add_refuses_each_wrong_argument_and_changes_nothing(bufs, data, kind, arg, mode, seed):
    buf = bufs[kind]
    step, flags, names = wrong_trajectory_add(data, arg, *_good_add(np.random.default_rng(seed)))
    if mode == "from_host":
        assert_refused(lambda: buf.add_from_host(step, **flags), names, buf)
    else:
        call, target = run_in(mode, buf, lambda b: b.add(step, **flags))
        assert_refused(call, names, target)


@SETTINGS
@given(data=st.data(), kind=st.sampled_from(["uniform", "prioritised"]), arg=st.sampled_from(["frames", "final_frames", "step", "terminated"]))
def test_add_frames_from_host_refuses_each_wrong_argument(bufs, data, kind, arg):
    """The staging writer's add (frames given as host arrays, placeholders in the step) checks what it is given."""
    buf = bufs[kind]
    rng = np.random.default_rng(0)
    step = _step(rng, t=2)
    frames = [step["obs"]["pixels"][:, :, -1]]
    step["obs"]["pixels"] = np.zeros((E, 2, 3), np.int32)
    args = {"step": step, "frames": frames, "terminated": np.zeros((E, 2), bool), "truncated": np.ones((E, 2), bool),
            "final_obs": dict(step["obs"]), "final_frames": [frames[0].copy()]}
    if arg in ("frames", "final_frames"):
        _, bad = data.draw(wrong_array(frames[0]), arg)
        args[arg] = data.draw(st.sampled_from([[bad], bad, None]), arg)
    elif arg == "step":
        _, args["step"] = data.draw(wrong_tree(step), "step")
    else:
        _, args["terminated"] = data.draw(wrong_array(args["terminated"]), "terminated")
    assert_refused(lambda: buf.add_frames_from_host(**args), (arg,), buf)


def _sample_calls(kind):
    """`sampling_calls` and the buffer's other readers: (argument, wrong values, call of (state, value))."""
    return sampling_calls(kind == "prioritised", LENGTH) + [
        ("indices", st.sampled_from([None, "0", np.zeros(2, np.float32), np.zeros((2, 2), np.int32), [0.5]]), lambda b, v: b.final_obs_at(v, 2)),
        ("sequence_length", BAD_SIZES | st.just(LENGTH + 1), lambda b, v: b.final_obs_at(jnp.arange(2), v)),
        ("batch_size", BAD_SIZES, lambda b, v: b.can_sample_transitions(v)),
    ]


@SETTINGS
@given(data=st.data(), kind=st.sampled_from(["uniform", "prioritised"]), mode=MODES)
def test_samplers_refuse_each_wrong_argument_and_change_nothing(bufs, data, kind, mode):
    buf = bufs[kind]
    calls = _sample_calls(kind)
    name, values, method = calls[data.draw(st.integers(0, len(calls) - 1), "call")]
    value = data.draw(values, name)
    call, target = run_in(mode, buf, lambda b: method(b, value))
    assert_refused(call, (name,), target)


@SETTINGS
@given(data=st.data(), kind=st.sampled_from(["uniform", "prioritised"]), mode=st.sampled_from(["eager", "jit"]))
def test_decode_obs_refuses_ids_of_another_structure_shape_or_dtype(bufs, data, kind, mode):
    """Float ids were truncated and ids of another shape were decoded; both are refused, naming obs."""
    buf = bufs[kind]
    stored = jax.tree.map(np.asarray, buf.trajectory.storage["obs"])
    what, bad = data.draw(wrong_tree({k: v[:, :3] for k, v in stored.items()}), "obs")
    if what.startswith("leaf") and data.draw(st.booleans(), "float ids"):
        bad = {**bad, "pixels": stored["pixels"][:, :3].astype(np.float32) + 0.5}
    call, target = run_in(mode, buf, lambda b: b.decode_obs(bad))
    assert_refused(call, ("obs",), target)


@SETTINGS
@given(data=st.data(), mode=MODES)
def test_set_priorities_refuses_each_wrong_argument_and_changes_nothing(bufs, data, mode):
    buf = bufs["prioritised"]
    good = {"indices": np.arange(3, dtype=np.int32), "priorities": np.ones(3, np.float32),
            "generations": np.asarray(buf.buffer.generations_at(jnp.arange(3)))}
    arg = data.draw(st.sampled_from(sorted(good)), "argument")
    _, good[arg] = data.draw(wrong_array(good[arg]).filter(lambda d: not _accepted_vector(arg, d[1])), arg)
    call, target = run_in(mode, buf, lambda b: b.set_priorities(**good))
    assert_refused(call, tuple(good), target)  # a length names the first to disagree


def _accepted_vector(arg, v) -> bool:
    """Values `set_priorities` documents as accepted: any integer dtype for indices and generations (saturated),
    any floating dtype for priorities, and lists of such numbers."""
    a = np.asarray(v) if isinstance(v, (list, np.ndarray, jax.Array)) else None
    if a is None or a.shape != (3,):
        return False
    kind = np.floating if arg == "priorities" else np.integer
    return np.issubdtype(a.dtype, kind)


# ------------------------------------------------------------------------------------------------
# Documented accepted results.


@SETTINGS
@given(ids=st.lists(st.integers(-2**31, 2**31 - 1), min_size=3, max_size=3), normal=st.booleans())
def test_decode_obs_reads_ids_the_buffer_never_made_as_zeros(bufs, ids, normal):
    """Ids outside the store decode as a step never written (zeros), never another slot's frame or an error;
    the ids a sample makes decode as before."""
    buf = bufs["uniform"]
    stored = jax.tree.map(np.asarray, buf.trajectory.storage["obs"])
    one = {"pixels": np.asarray([ids], np.int32), "vec": stored["vec"][0, :1]}
    slots = buf.host.num_slots
    outside = not 0 <= ids[0] < slots - 1
    got = np.asarray(buf.decode_obs(one)["pixels"])
    if outside:
        np.testing.assert_array_equal(got, 0)
    else:  # a real slot: its frame is the newest of the stack
        np.testing.assert_array_equal(got[0, -1], buf.host.stores[0].get(np.array([ids[0]]), missing="zeros")[0])


def test_sampling_before_any_add_gives_zeros_and_cannot_sample():
    for cls, kw in ((CompressedTrajectoryBuffer, {}), (CompressedPrioritisedTrajectoryBuffer, {"window_length": 2})):
        buf = cls.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, compress=("pixels",), codec="rle", **kw)
        assert not bool(buf.can_sample_transitions(4))
        tr = buf.sample_transitions(jax.random.key(0), 4, gamma=0.9)
        np.testing.assert_array_equal(np.asarray(tr.obs["pixels"]), 0)
        np.testing.assert_array_equal(np.asarray(tr.next_obs["pixels"]), 0)
        assert buf.host.num_writes == 0
        buf.close()


# ------------------------------------------------------------------------------------------------
# Stale states and donation.


@pytest.mark.parametrize("cls, kw", [(CompressedTrajectoryBuffer, {}), (CompressedPrioritisedTrajectoryBuffer, {"window_length": 2})])
def test_stale_state_refused_before_dispatch_and_the_newer_state_keeps_its_arrays(cls, kw):
    """`b1 = b0.add(...)`; then an add on b0 is refused with StaleBufferError before anything runs (eagerly, from
    the host, and right after b1's add was dispatched); under the caller's own jit with b0 donated, the write
    callback refuses it; b1 keeps every array and the store, and adds and samples as if nothing happened."""
    rng = np.random.default_rng(1)
    buf = cls.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, compress=("pixels",), codec="rle", final_obs_capacity=2, **kw)
    step0, flags0 = _good_add(rng)
    b0 = buf.add(step0, **flags0)
    step, flags = _good_add(rng)
    for _ in range(3):  # b1's add dispatched and b0 reused at once: refused every time, directly
        b1 = b0.add(step, **flags)
        err = assert_refused(lambda: b0.add(step, **flags), ("add",), b0, b1, errors=(StaleBufferError,))
        assert "version" in str(err)
        assert_refused(lambda: b0.add_from_host(step, **flags), ("add",), b0, b1, errors=(StaleBufferError,))
        b0 = b1
    b0, b1 = b1, b1.add(step, **flags)
    before = record(b1)
    add = jax.jit(cls.add, donate_argnums=0)
    with pytest.raises(jax.errors.JaxRuntimeError, match="StaleBufferError"):
        jax.block_until_ready(add(b0, step, **flags))
    assert record(b1) == before
    b2 = add(b1, step, **flags)  # the newer state carries on, donated
    ref = cls.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, compress=("pixels",), codec="rle", final_obs_capacity=2, **kw)
    ref = ref.add(step0, **flags0)
    for _ in range(5):
        ref = ref.add(step, **flags)
    a = b2.sample_transitions(jax.random.key(3), 8, gamma=0.9)
    b = ref.sample_transitions(jax.random.key(3), 8, gamma=0.9)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b))
    buf.close()
    ref.close()


def test_states_share_no_arrays_so_donating_an_old_one_spares_the_new():
    """What the guide promises: a state returned by a method holds no array of the state it came from."""
    def pointers(tree):
        return {x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)}

    b0 = _filled(CompressedPrioritisedTrajectoryBuffer, window_length=2)
    step, flags = _good_add(np.random.default_rng(3))
    new = [b0.set_priorities(jnp.arange(2), jnp.ones(2), b0.buffer.generations_at(jnp.arange(2))),
           jax.jit(lambda b: b.set_priorities(jnp.arange(2), jnp.ones(2), b.buffer.generations_at(jnp.arange(2))))(b0),
           b0.add(step, **flags)]
    for b1 in new:
        assert not pointers(b0) & pointers(b1)
    b0.close()


def test_sample_of_an_older_state_served_while_its_slots_are_unchanged_refused_once_rewritten():
    """Samples check slots, not states: an older state samples what it sampled before until a later add rewrites
    one of its slots; then its sample is refused (inside the read callback), also with the state donated, and
    the newest state is untouched."""
    rng = np.random.default_rng(2)
    buf = CompressedTrajectoryBuffer.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, compress=("pixels",), codec="rle")
    for _ in range(2):
        buf = buf.add(_step(rng), terminated=np.ones(E, bool))
    old = buf
    first = jax.tree.map(np.asarray, old.sample_sequences(jax.random.key(0), 4, 2))
    buf = buf.add(_step(rng), terminated=np.ones(E, bool))  # new slots only
    again = jax.tree.map(np.asarray, old.sample_sequences(jax.random.key(0), 4, 2))
    jax.tree.map(np.testing.assert_array_equal, first, again)
    for _ in range(buf.frame_ring):  # wraps: old's slots are rewritten
        buf = buf.add(_step(rng), terminated=np.ones(E, bool))
    before = record(buf)
    with pytest.raises(jax.errors.JaxRuntimeError, match="rewritten"):
        jax.block_until_ready(jax.jit(lambda b: b.sample_sequences(jax.random.key(0), 4, 2), donate_argnums=0)(old))
    assert record(buf) == before
    buf.add(_step(rng), terminated=np.ones(E, bool)).sample_sequences(jax.random.key(0), 4, 2)
    buf.close()


def test_calls_after_close_are_refused_before_dispatch():
    buf = _filled(CompressedTrajectoryBuffer)
    step, flags = _good_add(np.random.default_rng(0))
    buf.close()
    for call in (lambda: buf.add(step, **flags), lambda: buf.add_from_host(step, **flags),
                 lambda: buf.sample_transitions(jax.random.key(0), 2, gamma=0.9), lambda: buf.sample_sequences(jax.random.key(0), 2, 2),
                 lambda: buf.decode_obs(buf.trajectory.storage["obs"])):
        with pytest.raises(RuntimeError, match="after close"):
            call()


@foreign_inputs
@pytest.mark.parametrize("kind", ["uniform", "prioritised"])
def test_torch_tensors_and_wrong_keys_are_named(bufs, kind):
    buf = bufs[kind]
    step, flags = _good_add(np.random.default_rng(0))
    assert_refused(lambda: buf.add({**step, "action": torch_tensor(step["action"])}, **flags), ("step",), buf)
    assert_refused(lambda: buf.add(step, **{**flags, "terminated": torch_tensor(flags["terminated"])}), ("terminated",), buf)
    ids = np.asarray(buf.trajectory.storage["obs"]["pixels"])
    assert_refused(lambda: buf.decode_obs({"pixels": torch_tensor(ids), "vec": np.zeros((E, LENGTH, 2), np.float32)}), ("obs",), buf)
    for key in WRONG_KEYS:
        assert_refused(lambda: buf.sample_transitions(key, 2, gamma=0.9), ("key",), buf)
        assert_refused(lambda: jax.jit(lambda b: b.sample_sequences(key, 2, 2 if kind == "uniform" else None))(buf), ("key",), buf)


@pytest.mark.parametrize("cls,in_place", [  # the other callback path by default: tests/test_bad_input_episode.py
    (CompressedTrajectoryBuffer, True), pytest.param(CompressedPrioritisedTrajectoryBuffer, False, marks=pytest.mark.slow),
    pytest.param(CompressedTrajectoryBuffer, False, marks=pytest.mark.slow),
    pytest.param(CompressedPrioritisedTrajectoryBuffer, True, marks=pytest.mark.slow),
])
def test_eager_reads_raise_our_errors_not_jax_runtime_errors(cls, in_place):
    """Called eagerly, a sample of a state whose slots were rewritten raises `StaleBufferError` and one of a store
    whose bytes changed raises `CorruptEntryError` (not JAX's runtime error carrying their text), with either
    callback mechanism; the newest state samples as before afterwards."""
    kw = {"window_length": 2} if cls is CompressedPrioritisedTrajectoryBuffer else {}
    with forced_callbacks(in_place):
        buf = _filled(cls, **kw)
        old, rng = buf, np.random.default_rng(5)
        for _ in range(buf.frame_ring):  # wraps: old's slots are rewritten
            step, flags = _good_add(rng)
            buf = buf.add(step, **flags)
        want = jax.tree.map(np.asarray, buf.sample_transitions(jax.random.key(1), 4, gamma=0.9))
        with pytest.raises(StaleBufferError, match="rewritten"):
            old.sample_transitions(jax.random.key(1), 4, gamma=0.9)
        with corrupted(buf.host), pytest.raises(CorruptEntryError, match="corrupt"):
            buf.sample_transitions(jax.random.key(1), 4, gamma=0.9)
        got = jax.tree.map(np.asarray, buf.sample_transitions(jax.random.key(1), 4, gamma=0.9))
        jax.tree.map(np.testing.assert_array_equal, got, want)
    buf.close()


@pytest.mark.parametrize("prioritised", [False, True])
def test_create_refuses_unknown_keywords_by_name(prioritised):
    """An unknown keyword: a TypeError naming the keyword, from `create` (not from its shared helper); `metrics`
    is not one (it goes to the device buffer); a non-bool `metrics` is refused by name."""
    from jaxbuffers.compressed import CompressedPrioritisedTrajectoryBuffer, CompressedTrajectoryBuffer

    step = {"obs": jnp.zeros((4, 4), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    cls, kw = (CompressedPrioritisedTrajectoryBuffer, {"window_length": 2}) if prioritised else (CompressedTrajectoryBuffer, {})
    with pytest.raises(TypeError, match="create.*compresion") as info:
        cls.create(step, num_envs=2, length=8, **kw, compresion=True)
    assert "_build" not in str(info.value)
    with pytest.raises(TypeError, match="metrics"):
        cls.create(step, num_envs=2, length=8, **kw, metrics=1)


@pytest.mark.parametrize("cls, kw", [(CompressedTrajectoryBuffer, {}),  # the prioritised one inherits the add: -m slow
                                     pytest.param(CompressedPrioritisedTrajectoryBuffer, {"window_length": 2}, marks=pytest.mark.slow)])
def test_stacks_the_buffer_cannot_rebuild_are_refused_and_change_nothing(cls, kw):
    """With frame_stack, a stack that is not the previous step's shifted by one frame (or, at an episode start, not
    padded as `padding` says) would come back as another stack: refused eagerly, from the host and under jit (in
    the write callback), naming the leaf, env and step, the buffer byte-identical; the stacks a frame stacker makes
    are accepted and sampled back as given."""
    rng = np.random.default_rng(7)
    buf = cls.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, compress=("pixels",), codec="rle", **kw)
    frames = rng.integers(0, 256, (E, 5, H, W), dtype=np.uint8)
    stack = lambda t: np.stack([frames[:, max(t - 1, 0)], frames[:, t]], axis=1)  # noqa: E731  (reset padding at t = 0)

    def step(pixels):
        lead = pixels.shape[: pixels.ndim - 3]
        return {"obs": {"pixels": pixels, "vec": np.zeros((*lead, 2), np.float32)}, "action": np.zeros(lead, np.int32), "reward": np.zeros(lead, np.float32)}

    no = {"terminated": np.zeros(E, bool)}
    unpadded = stack(1)  # the first step after create starts an episode: its older frame must be the padding
    err = assert_refused(lambda: buf.add(step(unpadded), **no), ("step['obs']['pixels']",), buf, errors=(ValueError,))
    assert "env 0, step 0 of the add is not the stack the buffer rebuilds" in str(err)
    buf = buf.add(step(stack(0)), **no).add(step(stack(1)), **no)
    jumped = stack(2)
    jumped[1] = np.stack([frames[1, 3], frames[1, 4]])  # env 1 skips frames: [3, 4] after [0, 1]
    for mode in ("eager", "jit"):  # (a donated state's arrays are gone once its program ran, refused or not)
        call, target = run_in(mode, buf, lambda b: b.add(step(jumped), **no))
        err = assert_refused(call, ("step['obs']['pixels']",), target, errors=(ValueError, jax.errors.JaxRuntimeError))
        assert "env 1, step 0 of the add" in str(err)
    assert_refused(lambda: buf.add_from_host(step(jumped), **no), ("step['obs']['pixels']",), buf, errors=(ValueError,))
    chunk = np.stack([stack(2), stack(2)], axis=1)  # [E, 2, ...]: step 1 repeats step 0 instead of shifting
    err = assert_refused(lambda: buf.add(step(chunk), terminated=np.zeros((E, 2), bool)), ("step['obs']['pixels']",), buf, errors=(ValueError,))
    assert "env 0, step 1 of the add" in str(err)
    cut = {"terminated": np.zeros(E, bool), "truncated": np.ones(E, bool), "final_obs": {"pixels": stack(2), "vec": np.zeros((E, 2), np.float32)}}
    err = assert_refused(lambda: buf.add(step(stack(2)), **cut), ("final_obs['pixels']",), buf, errors=(ValueError,))
    assert "the final observation of env 0, step 0" in str(err)
    buf = buf.add(step(stack(2)), **{**cut, "final_obs": {"pixels": stack(3), "vec": np.zeros((E, 2), np.float32)}})
    buf = buf.add(step(stack(4)[:, [1, 1]]), **no)  # after the truncation an episode starts: padded with its frame
    got = np.asarray(buf.decode_obs(buf.trajectory.storage["obs"])["pixels"])[:, :4]
    want = np.stack([stack(0), stack(1), stack(2), stack(4)[:, [1, 1]]], axis=1)
    np.testing.assert_array_equal(got, want)
    buf.close()


def test_an_eager_add_checks_its_stacks_in_its_write_with_no_other_program(compile_counter):
    """An eager add with frame stacks runs one compiled program whose write callback makes the stack check (the
    first add compiles one program, nothing decoded: the lanes' last frames are those the store kept): a good add compiles nothing
    more after the first of its shape; a refused one raises our ValueError (not JAX's runtime error) naming the
    leaf, env and step, with the state and store byte-identical and still the newest (it adds next); the same from
    the host."""
    rng = np.random.default_rng(11)
    frames = rng.integers(0, 256, (E, 6, H, W), dtype=np.uint8)
    stack = lambda t: np.stack([frames[:, max(t - 1, 0)], frames[:, t]], axis=1)  # noqa: E731

    def step(pixels):
        return {"obs": {"pixels": pixels, "vec": np.zeros((E, 2), np.float32)}, "action": np.zeros(E, np.int32), "reward": np.zeros(E, np.float32)}

    no = {"terminated": np.zeros(E, bool)}
    buf = CompressedTrajectoryBuffer.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, compress=("pixels",), codec="rle")
    with compile_counter() as first:
        buf = buf.add(step(stack(0)), **no)
    assert first() == 1  # the add's program, check included
    buf = buf.add_from_host(step(stack(1)), **no)
    reads = buf.host.num_reads
    with compile_counter() as compiles:
        buf = buf.add(step(stack(2)), **no)
        for add in (buf.add, buf.add_from_host):
            err = assert_refused(lambda: add(step(stack(4)), **no), ("step['obs']['pixels']",), buf, errors=(ValueError,))
            assert type(err) is ValueError and "env 0, step 0 of the add" in str(err)
        buf = buf.add_from_host(step(stack(3)), **no).add(step(stack(4)), **no)
    assert compiles() == 0 and buf.host.num_reads == reads
    assert int(buf.version) == 5
    got = np.asarray(buf.decode_obs(buf.trajectory.storage["obs"])["pixels"])[:, :5]
    np.testing.assert_array_equal(got, np.stack([stack(t) for t in range(5)], axis=1))
    buf.close()


@pytest.mark.parametrize("value, err, match", [("bogus", ValueError, "delta_codec: codec: unknown codec 'bogus'"),
                                               ("zstd:99", ValueError, "delta_codec: codec 'zstd': level"),
                                               (3, TypeError, "delta_codec: codec: expected a name")])
def test_a_bad_delta_codec_is_refused_naming_it(value, err, match):
    with pytest.raises(err, match=match):
        CompressedTrajectoryBuffer.create(EXAMPLE, num_envs=E, length=LENGTH, frame_stack=K, compress=("pixels",), delta_codec=value)


def test_stack_check_reads_the_last_frames_kept_and_decodes_after_a_restore_or_for_an_older_state(tmp_path):
    """The stack check compares each lane's first step with the frames its last steps wrote, kept by the store
    (`HostStores.read_recent`: no decode, also for chunks shorter than `k - 1`); a restored buffer (a new store) and
    an older state decode them from the store instead, and both ways accept exactly the shifted stacks and refuse
    the others before anything is written."""
    import jaxbuffers as jb
    from frame_stacks import stacked_chunk

    k, e = 4, 3
    example = {"obs": jnp.zeros((k, H, W), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(example, num_envs=e, length=16, frame_stack=k, codec="rle")
    rng = np.random.default_rng(3)
    ends = np.zeros((e, 9), bool)
    ends[1, 2] = True  # env 1's episode ends after step 2: its step 3 starts one
    stacks, _ = stacked_chunk(rng.integers(0, 256, (e, 9, H, W), dtype=np.uint8), ends, k)
    part = lambda a, b: {"obs": stacks[:, a:b], "action": np.zeros((e, b - a), np.int32), "reward": np.zeros((e, b - a), np.float32)}  # noqa: E731
    add = jax.jit(lambda b, s, t: b.add(s, terminated=t))
    states = [buf]
    for a, b in ((0, 1), (1, 2), (2, 4), (4, 5)):  # chunks of 1 and 2 < k - 1 steps
        before = states[-1].host.num_reads
        states.append(add(states[-1], part(a, b), ends[:, a:b]))
        assert int(states[-1].version) == len(states) - 1
        assert states[-1].host.num_reads == before  # the frames the check reads came from memory

    jumped = part(5, 6)
    jumped["obs"] = jumped["obs"].copy()
    jumped["obs"][2, 0, 0] = stacks[2, 3, 0]  # env 2's oldest frame is not step 4's second
    jb.save(tmp_path / "ck", states[-1])
    restored = jb.restore(tmp_path / "ck")
    older = states[-2]  # expects steps 4.. next; its slots are unchanged
    for state, good, bad in ((restored, part(5, 6), jumped), (older, part(4, 5), part(5, 6))):
        reads = state.host.num_reads
        state.check_stacks(good, terminated=ends[:, 0:1])
        assert state.host.num_reads > reads  # decoded from the store
        with pytest.raises(ValueError, match="env 2, step 0 of the add" if state is restored else "env 0, step 0 of the add"):
            state.check_stacks(bad, terminated=ends[:, 0:1])
    err = assert_refused(lambda: restored.add(jumped, terminated=ends[:, 5:6]), ("step['obs']",), restored, errors=(ValueError,))
    assert "env 2, step 0 of the add" in str(err)
    for state in (restored, states[-1]):
        state = add(add(state, part(5, 6), ends[:, 5:6]), part(6, 9), ends[:, 6:9])
        got = np.asarray(state.decode_obs(state.trajectory.storage["obs"]))[:, :9]
        np.testing.assert_array_equal(got, stacks)
        state.close()
    with pytest.raises(jax.errors.JaxRuntimeError, match="env 2, step 0 of the add"):
        jax.block_until_ready(add(jb.restore(tmp_path / "ck"), jumped, ends[:, 5:6]))
