"""Bad input to `EpisodeBuffer` and `CompressedEpisodeBuffer` (create, add_episode / add_episodes, update, every
sampler, can_sample, `where` filters): refused with an error naming the argument, the stored contents (device leaves
and, for the compressed buffer, host stores) unchanged; the accepted forms of the guide's table give exactly their
result."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS as _SETTINGS, bad_keys, bad_static_ints, bad_unit_scalars, snapshot
from compressed_bad_input import assert_refused, corrupted, record, wrong_tree
from frame_stacks import stacked_episodes
from host_codecs import CorruptEntryError
from jaxbuffers.compressed import CompressedEpisodeBuffer
from jaxbuffers.compressed._common import forced_callbacks

SETTINGS = settings(_SETTINGS, max_examples=15)  # two buffers per example: about as many calls as the replay module's 30
FEW = settings(_SETTINGS, max_examples=6)  # examples that compile programs or build a compressed buffer

E, M, HW = 3, 5, 4
STEP = {"obs": {"pixels": jnp.zeros((HW, HW), jnp.uint8), "vec": jnp.zeros((2,), jnp.float32)},
        "action": jnp.int32(0), "reward": jnp.float32(0)}
META = {"task": jnp.int32(-1)}
KEY = jax.random.key(0)


def episode(t: int = M, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"obs": {"pixels": rng.integers(0, 256, (t, HW, HW), dtype=np.uint8), "vec": rng.standard_normal((t, 2)).astype(np.float32)},
            "action": rng.integers(0, 9, t).astype(np.int32), "reward": rng.standard_normal(t).astype(np.float32)}


def final(seed: int = 0) -> dict:
    return {"pixels": np.full((HW, HW), seed, np.uint8), "vec": np.full(2, seed, np.float32)}


def compressed():
    return CompressedEpisodeBuffer.create(STEP, max_episodes=E, max_timesteps=M, meta=META, compress=("pixels",), codec="rle")


def fill(buf, n: int = 2):
    for i in range(n):
        buf = buf.add_episode(episode(seed=i), 2 + i, terminated=bool(i % 2), final_obs=final(i), meta={"task": i})
    return buf


FILLED = {
    "device": fill(jb.EpisodeBuffer.create(STEP, max_episodes=E, max_timesteps=M, meta=META)),
    "compressed": fill(compressed()),
}
FIXED_FULL = fill(jb.EpisodeBuffer.create(STEP, max_episodes=2, max_timesteps=M, meta=META, circular=False))
KIND = st.sampled_from(sorted(FILLED))


def check(kind: str, call, name, buf=None):
    """`call()` refused with a message that starts with `name` (or one of several); the buffer (device leaves,
    and host stores when compressed) unchanged."""
    buf, names = FILLED[kind] if buf is None else buf, (name,) if isinstance(name, str) else name
    if kind == "compressed":
        err = assert_refused(call, names, buf)
    else:
        before = snapshot(buf)
        err = assert_refused(call, names, errors=(TypeError, ValueError))
        assert snapshot(buf) == before
    assert str(err).startswith(names), f"the message does not start with {names}: {err}"  # not JAX's own words
    return err


# ---------------------------------------------------------------------------------------------------------------
# add_episode / add_episodes

BAD_LENGTHS = st.sampled_from([0, -1, M + 1, 2.0, 2.5, True, None, "2", [2], np.zeros(2, np.int32), np.float32(2), np.array(2.0)])
BAD_FLAGS = st.sampled_from([1, 0, "True", None, np.int32(1), np.array([True, False]), np.float32(1), [True]])
BAD_META = st.sampled_from([{"task": 1.5}, {"task": np.float32(1)}, {"zz": 1}, [1], "task", {"task": np.zeros(2, np.int32)}, {"task": 2**40},
                            {"task": -(2**31) - 1}, {"task": "1"}])


@SETTINGS
@given(kind=KIND, data=st.data())
def test_add_episode_wrong_episode(kind, data):
    what, bad = data.draw(wrong_tree(episode()))
    check(kind, lambda: FILLED[kind].add_episode(bad, 2, terminated=True, final_obs=final()), "episode")


@SETTINGS
@given(kind=KIND, data=st.data())
def test_add_episode_wrong_final_obs(kind, data):
    what, bad = data.draw(wrong_tree(final()))
    check(kind, lambda: FILLED[kind].add_episode(episode(), 2, terminated=True, final_obs=bad), "final_obs")


@SETTINGS
@given(kind=KIND, length=BAD_LENGTHS, flag=BAD_FLAGS, which=st.sampled_from(["terminated", "truncated"]), meta=BAD_META)
def test_add_episode_wrong_length_flags_meta(kind, length, flag, which, meta):
    buf, ep = FILLED[kind], episode()
    check(kind, lambda: buf.add_episode(ep, length, terminated=True, final_obs=final()), "length")
    if not (which == "truncated" and flag is None):  # truncated=None: not truncated, as its default
        check(kind, lambda: buf.add_episode(ep, 2, **{"terminated": True, which: flag}, final_obs=final()), which)
    check(kind, lambda: buf.add_episode(ep, 2, terminated=True, final_obs=final(), meta=meta), "meta")
    check(kind, lambda: buf.add_episode(ep, 2, terminated=True, final_obs=final(), split_long=flag), "split_long")


@SETTINGS
@given(kind=KIND, b=st.integers(1, 3), arg=st.sampled_from(["lengths", "terminated", "truncated", "final_obs", "meta", "B=0", "T>M"]), data=st.data())
def test_add_episodes_wrong_argument(kind, b, arg, data):
    eps = jax.tree.map(lambda x: np.stack([x] * b), episode())
    args = {"lengths": np.full(b, 2, np.int32), "terminated": np.zeros(b, bool), "truncated": np.zeros(b, bool),
            "final_obs": jax.tree.map(lambda x: np.stack([x] * b), final()), "meta": {"task": np.arange(b, dtype=np.int32)}}
    name = arg
    if arg == "B=0":
        eps, args = jax.tree.map(lambda x: x[:0], (eps, args))
        name = "episodes"
    elif arg == "T>M":
        eps, name = jax.tree.map(lambda x: np.concatenate([x, x], 1), eps), "episode"
    elif arg == "meta":
        args["meta"] = data.draw(st.sampled_from([{"task": np.arange(b + 1, dtype=np.int32)}, {"task": np.zeros(b, np.int64)}, {"zz": np.zeros(b)}]))
    elif arg == "final_obs":
        args["final_obs"] = data.draw(wrong_tree(args["final_obs"]))[1]
    elif arg == "lengths":
        args[arg] = data.draw(st.sampled_from([np.zeros(b, np.float32), np.zeros(b + 1, np.int32), np.ones((b, 1), np.int32), np.zeros(b, np.int64),
                                               np.full(b, M + 1, np.uint8), "x", None, 2.0, [2.5] * b, np.ones(b, bool)]))
    else:
        args[arg] = data.draw(st.sampled_from([np.zeros(b, np.int32), np.zeros(b + 1, bool), np.zeros((b, 1), bool), "x", 1, [True] * b,
                                               np.zeros(b, np.float32)] + ([] if arg == "truncated" else [None])))
    check(kind, lambda: FILLED[kind].add_episodes(eps, **args), name)


def test_fixed_buffer_full_refuses_and_keeps_its_episodes():
    err = check("device", lambda: FIXED_FULL.add_episode(episode(), 2, terminated=True, final_obs=final()), "add_episode", FIXED_FULL)
    assert isinstance(err, jb.BufferFullError)


# ---------------------------------------------------------------------------------------------------------------
# samplers, can_sample, where


def samplers(buf, key=KEY, batch_size=2, sequence_length=2, n_step=1, gamma=0.9, where=None):
    return {
        "sample_episodes": lambda: buf.sample_episodes(key, batch_size, where=where),
        "sample_sequences": lambda: buf.sample_sequences(key, batch_size, sequence_length, where=where),
        "sample_timesteps": lambda: buf.sample_timesteps(key, batch_size, where=where),
        "sample_transitions": lambda: buf.sample_transitions(key, batch_size, n_step=n_step, gamma=gamma, where=where),
        "can_sample": lambda: buf.can_sample(batch_size, where=where),
        "can_sample_sequences": lambda: buf.can_sample_sequences(batch_size, sequence_length, where=where),
    }


SAMPLERS = st.sampled_from(sorted(samplers(None)))
BAD_WHERE = st.sampled_from([
    "x", 1, [True] * E, np.ones(E, np.int32), np.ones(E + 1, bool), np.ones((E, 1), bool), jnp.ones(E, jnp.float32),
    lambda m: m["task"], lambda m: m["task"][:1] == 0, lambda m: True, lambda m: m["no_such_field"] == 0,
])


@SETTINGS
@given(kind=KIND, which=SAMPLERS, key=bad_keys(), size=bad_static_ints(), where=BAD_WHERE)
def test_samplers_bad_key_size_where(kind, which, key, size, where):
    buf = FILLED[kind]
    for name, call in samplers(buf, key=key).items():  # every sampler, each example
        if name.startswith("sample"):
            check(kind, call, "key")
    check(kind, samplers(buf, batch_size=size)[which], "batch_size")
    check(kind, samplers(buf, where=where)[which], ("where", "where(meta)"))


@SETTINGS
@given(kind=KIND, size=bad_static_ints() | st.just(M + 1), gamma=bad_unit_scalars() | st.just(None))
def test_sequence_length_n_step_gamma(kind, size, gamma):
    check(kind, samplers(FILLED[kind], sequence_length=size)["sample_sequences"], "sequence_length")
    check(kind, samplers(FILLED[kind], sequence_length=size)["can_sample_sequences"], "sequence_length")
    check(kind, samplers(FILLED[kind], n_step=size)["sample_transitions"], "n_step")
    check(kind, samplers(FILLED[kind], gamma=gamma)["sample_transitions"], "gamma")
    check(kind, lambda: FILLED[kind].transitions_at([0], [0], n_step=size, gamma=0.9), "n_step")
    check(kind, lambda: FILLED[kind].transitions_at([0], [0], gamma=gamma), "gamma")


@SETTINGS
@given(kind=KIND, which=st.sampled_from(["indices", "steps"]),
       bad=st.sampled_from([None, "0", 1.5, [0.5], np.zeros(1, np.float32), np.zeros(1, bool), np.zeros((1, 1), np.int32), np.zeros(2, np.int32), [[0]]]))
def test_transitions_at_bad_positions(kind, which, bad):
    args = {"indices": np.zeros(1, np.int32), "steps": np.zeros(1, np.int32), which: bad}
    names = ("indices", "steps") if getattr(bad, "shape", None) == (2,) else which
    check(kind, lambda: FILLED[kind].transitions_at(args["indices"], args["steps"], gamma=0.9), names)


@FEW
@given(kind=KIND, form=st.sampled_from(["array", "jnp", "callable"]), which=SAMPLERS)
def test_where_forms_give_the_same_result(kind, form, which):
    """The table: `where` is a bool `[max_episodes]` array (numpy or JAX) or a function of the meta fields giving
    one; every form selects the same episodes, so the samples are identical."""
    buf = FILLED[kind]
    want = samplers(buf, where=np.array([False, True, False]))[which]()
    where = {"array": np.array([False, True, False]), "jnp": jnp.array([False, True, False]), "callable": lambda m: m["task"] == 1}[form]
    got = samplers(buf, where=where)[which]()
    assert snapshot(got) == snapshot(want)
    if which == "sample_episodes":
        assert np.all(np.asarray(got.meta["task"]) == 1)


# ---------------------------------------------------------------------------------------------------------------
# update


@SETTINGS
@given(kind=KIND, arg=st.sampled_from(["indices", "fields", "steps", "meta_with_steps", "obs"]),
       bad=st.sampled_from([None, "0", 1.5, [0.5], np.zeros(1, np.float32), np.zeros((1, 1), np.int32), np.zeros(2, np.int32), [[0]]]),
       field=st.sampled_from([{"reward": np.zeros((1, M), np.float64)}, {"reward": np.zeros((1, M - 1), np.float32)}, {"zz": np.zeros(1)},
                              {"task": np.zeros(1, np.float32)}, {"task": np.zeros((1, 1), np.int32)}, [1], {"reward": [[0.0] * M]}]))
def test_update_bad_arguments(kind, arg, bad, field):
    buf = FILLED[kind]
    ok = {"reward": np.ones((1, M), np.float32)}
    if arg == "indices":
        check(kind, lambda: buf.update(bad, ok), ("indices", "fields") if getattr(bad, "shape", None) == (2,) else "indices")
    elif arg == "fields":
        check(kind, lambda: buf.update([0], field), "fields")
    elif arg == "steps" and bad is not None:  # None: no steps, whole episodes
        names = ("steps", "indices") if getattr(bad, "shape", None) == (2,) else "steps"
        check(kind, lambda: buf.update([0], {"reward": np.ones(1, np.float32)}, steps=bad), names)
    elif arg == "meta_with_steps":
        check(kind, lambda: buf.update([0], {"task": np.ones(1, np.int32)}, steps=[0]), "fields")
    elif kind == "compressed":
        check(kind, lambda: buf.update([0], {"obs": jax.tree.map(lambda x: x[None], episode())["obs"]}), "fields")


# ---------------------------------------------------------------------------------------------------------------
# create


@SETTINGS
@given(kind=KIND, size=bad_static_ints(), flag=BAD_FLAGS,
       meta=st.sampled_from([[1], {"a": 1.5}, {"a": None}, {"a": "x"}, {1: jnp.int32(0)}, {"a": np.float64(1)}, {"a": np.array(["s"])}]),
       step=st.sampled_from([[1], None, {"obs": jnp.zeros(2)}, {**STEP, "reward": jnp.zeros(2)}, {**STEP, "action": 1}, {**STEP, "obs": "x"}]))
def test_create_bad_arguments(kind, size, flag, meta, step):
    create = jb.EpisodeBuffer.create if kind == "device" else (lambda s, **kw: CompressedEpisodeBuffer.create(s, codec="rle", **kw))
    for name in ("max_episodes", "max_timesteps"):
        sizes = {"max_episodes": E, "max_timesteps": M, name: size}
        check("device", lambda: create(STEP, **sizes), name)
    check("device", lambda: create(STEP, max_episodes=E, max_timesteps=M, circular=flag), "circular")
    check("device", lambda: create(STEP, max_episodes=E, max_timesteps=M, meta=meta), "meta")
    check("device", lambda: create(step, max_episodes=E, max_timesteps=M), ("example_step", "example_item"))


@pytest.mark.parametrize("name", ["reward", "action", "obs"])
def test_create_meta_named_like_a_step_field(name):
    """`update` takes step and meta fields by name in one dict: a meta field named like a step field could never be
    updated, so `create` refuses it."""
    for create in (jb.EpisodeBuffer.create, lambda s, **kw: CompressedEpisodeBuffer.create(s, codec="rle", **kw)):
        err = check("device", lambda: create(STEP, max_episodes=E, max_timesteps=M, meta={**META, name: jnp.float32(0)}), "meta")
        assert repr(name) in str(err)


def test_create_too_many_steps():
    check("device", lambda: jb.EpisodeBuffer.create(STEP, max_episodes=2**16, max_timesteps=2**16), "max_episodes * max_timesteps")


# ---------------------------------------------------------------------------------------------------------------
# accepted forms and call orders


@FEW
@given(kind=KIND, form=st.sampled_from(["python", "numpy64", "jnp", "none"]))
def test_accepted_scalar_forms_give_the_same_buffer(kind, form):
    """The table: `length` a Python int or integer 0-d array of any width, flags a Python or numpy bool or a bool
    0-d array, a meta value a Python scalar of the field's kind or an array of its dtype (None or left out: the
    field's default): the same episodes. (A compressed buffer adds only to its newest state: fresh ones here.)"""
    make = (lambda: FILLED["device"]) if kind == "device" else (lambda: fill(compressed()))
    ep = episode(seed=7)
    conv = {"python": (3, True, 5), "numpy64": (np.int64(3), np.bool_(True), np.array(5, np.int32)),
            "jnp": (jnp.int32(3), jnp.bool_(True), jnp.int32(5)), "none": (3, True, None)}[form]
    want = make().add_episode(ep, 3, terminated=np.bool_(True), final_obs=final(7), meta={"task": np.int32(-1 if form == "none" else 5)})
    got = make().add_episode(ep, conv[0], terminated=conv[1], final_obs=final(7), meta={"task": conv[2]})
    assert snapshot(got.get_all()) == snapshot(want.get_all())


def _valid(buf, op: str, n: int):
    if op == "add":
        return buf.add_episode(episode(seed=n), 1 + n % M, terminated=True, final_obs=final(n), meta={"task": n})
    return buf.update([n % E], {"reward": np.full((1, M), n, np.float32)})


@FEW
@given(kind=KIND, ops=st.lists(st.sampled_from(["add", "update", "bad_add", "bad_update", "bad_sample", "bad_where"]), min_size=1, max_size=6))
def test_refused_calls_in_any_order_change_nothing(kind, ops):
    """Any order of valid and refused calls gives the buffer the valid calls alone give (each refusal leaves the
    state and its host stores as they were, so the next valid call is not refused as stale); it stays usable."""
    buf = start = FILLED["device"] if kind == "device" else fill(compressed())
    for n, op in enumerate(ops):
        if op in ("add", "update"):
            buf = _valid(buf, op, n)
        elif op == "bad_add":
            check(kind, lambda: buf.add_episode({**episode(), "action": np.zeros(M, np.float32)}, 2, terminated=True, final_obs=final()), "episode['action']", buf)
        elif op == "bad_update":
            check(kind, lambda: buf.update([0], {"reward": np.zeros((1, M), np.int32)}), "fields['reward']", buf)
        elif op == "bad_sample":
            check(kind, lambda: buf.sample_timesteps(None, 2), "key", buf)
        else:
            check(kind, lambda: buf.sample_episodes(KEY, 2, where=np.ones(E, np.int32)), "where", buf)
    if kind == "device":
        ref = start
        for n, op in enumerate(ops):
            ref = _valid(ref, op, n) if op in ("add", "update") else ref
        assert snapshot(buf.get_all()) == snapshot(ref.get_all())
    buf.sample_transitions(jax.random.key(1), 3, gamma=0.9)


@pytest.mark.slow
@SETTINGS
@given(kind=KIND, data=st.data())
def test_add_episode_wrong_episode_under_jit(kind, data):
    """The same refusals of a wrong episode inside a jitted function (device buffer: donated too)."""
    _, bad = data.draw(wrong_tree(episode()))
    if any(not isinstance(x, np.ndarray) for x in jax.tree.leaves(bad)) or not isinstance(bad, dict):
        return
    buf = FILLED["device"]
    # `jax.jit` narrows 64-bit numpy arguments (x64 off) before the buffer sees them: a draw whose only fault is such
    # a dtype arrives well-formed, and is checked eagerly by the test above.
    narrowed = jax.tree.map(lambda x: x.astype(jax.dtypes.canonicalize_dtype(x.dtype)), bad)
    try:
        buf.add_episode(narrowed, 2, terminated=True, final_obs=final())
        return
    except (TypeError, ValueError):
        pass
    check("device", lambda: jax.jit(lambda b, e: b.add_episode(e, 2, terminated=True, final_obs=final()))(buf, bad), "episode")


@pytest.mark.parametrize("kind", ["device", "compressed"])
def test_a_filter_reading_an_undeclared_meta_field_is_named(kind):
    err = check(kind, samplers(FILLED[kind], where=lambda m: m["no_such_field"] == 0)["sample_episodes"], "where(meta)")
    assert "no meta field 'no_such_field'; the buffer declares ['task']" in str(err)


def test_a_python_int_a_float_meta_field_would_round_is_refused():
    buf = jb.EpisodeBuffer.create(STEP, max_episodes=E, max_timesteps=M, meta={"w": jnp.float32(0)})
    err = check("device", lambda: buf.add_episode(episode(), 2, terminated=True, final_obs=final(), meta={"w": 2**30 + 1}),
                "meta['w']", buf=buf)
    assert "float32 holds exactly, got 1073741825 (it would be rounded to 1073741824)" in str(err)
    for ok in (2**30, 3, 0.1):  # exact ints, and floats (rounded as any float literal)
        assert float(buf.add_episode(episode(), 2, terminated=True, final_obs=final(), meta={"w": ok}).meta["w"][0]) == np.float32(ok)


def test_eager_reads_raise_our_errors_not_jax_runtime_errors():
    """Called eagerly, a read of a compressed state whose episode slots were rewritten raises `StaleBufferError`, and
    one of a store whose bytes changed `CorruptEntryError`, not JAX's runtime error carrying their text (through
    `io_callback` / `pure_callback`, the callbacks off the CPU)."""
    with forced_callbacks(False):
        old = fill(compressed())
        new = fill(old, E)  # circular: every slot of old's episodes rewritten
        with pytest.raises(jb.StaleBufferError, match="rewritten"):
            old.get_all()
        with corrupted(new.host), pytest.raises(CorruptEntryError, match="corrupt"):
            new.get_all()
        new.get_all()  # intact again
    new.close()


@pytest.mark.parametrize("padding", ["reset", pytest.param("zero", marks=pytest.mark.slow)])
def test_stacks_the_store_cannot_rebuild_are_refused_naming_the_step(padding):
    """With `frame_stack` the store keeps each step's newest frame and rebuilds the older ones. A stack that is not
    the previous step's shifted by one frame (a reset mid-episode), one padded otherwise at the episode's start, or a
    final observation not stacked on the last steps would come back changed: refused eagerly (`ValueError` naming
    the leaf, the episode and the step) and under `jit` (JAX's error carrying ours), before anything is written, the
    buffer byte-identical. Stacks a frame stacker makes come back exactly (stack axis last here)."""
    k, rng = 3, np.random.default_rng(4)
    step = {"obs": {"pixels": jnp.zeros((HW, HW, k), jnp.uint8), "vec": jnp.zeros((2,), jnp.float32)}, "action": jnp.int32(0),
            "reward": jnp.float32(0)}
    buf = CompressedEpisodeBuffer.create(step, max_episodes=E, max_timesteps=M, compress=("pixels",), frame_stack=k, stack_axis=-1,
                                         padding=padding, codec="rle")
    lengths = np.array([M, 3], np.int32)
    stacks, finals = (np.moveaxis(x, -3, -1) for x in stacked_episodes(rng.integers(0, 256, (2, M + 1, HW, HW), dtype=np.uint8), lengths, k, padding))

    def args(stacks, finals):
        eps = {"obs": {"pixels": stacks, "vec": np.ones((2, M, 2), np.float32)}, "action": np.zeros((2, M), np.int32), "reward": np.zeros((2, M), np.float32)}
        return (eps, lengths), dict(terminated=np.array([True, False]), final_obs={"pixels": finals, "vec": np.zeros((2, 2), np.float32)})

    a, kw = args(stacks, finals)
    buf = buf.add_episodes(*a, **kw)
    got = buf.get_all()
    for i, n in enumerate(lengths):
        np.testing.assert_array_equal(np.asarray(got.item["obs"]["pixels"][i, :n]), stacks[i, :n])
        np.testing.assert_array_equal(np.asarray(got.final_obs["pixels"][i]), finals[i])
    restarted, padded, final = stacks.copy(), stacks.copy(), finals.copy()
    restarted[1, 2] = restarted[1, 2, ..., -1:]  # a reset at step 2: every frame is its newest
    padded[0, 0, ..., 0] = 7  # a frame before the episode's start that is not the padding
    final[1, ..., 0] ^= 1
    for bad_stacks, bad_finals, name, where in ((restarted, finals, "episodes['obs']['pixels']", "step 2 of episode 1"),
                                                (padded, finals, "episodes['obs']['pixels']", "step 0 of episode 0"),
                                                (stacks, final, "final_obs['pixels']", "the final observation of episode 1")):
        a, kw = args(bad_stacks, bad_finals)
        err = assert_refused(lambda: buf.add_episodes(*a, **kw), (name,), buf, errors=(ValueError,))
        assert where in str(err) and "nothing was written" in str(err)
    before = record(buf)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"episodes\['obs'\]\['pixels'\]: step 2 of episode 1 is not the stack"):
        jax.block_until_ready(jax.jit(lambda b, a, kw: b.add_episodes(*a, **kw))(buf, *args(restarted, finals)))
    assert record(buf) == before
    buf.close()
