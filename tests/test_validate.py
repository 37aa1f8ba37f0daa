"""Trace-time validation: errors name the leaf, the expected and the received shape/dtype."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuffers import _validate

SPEC = _validate.item_spec({"obs": {"pixels": jnp.zeros((2, 3), jnp.uint8), "vec": jnp.zeros(4)}, "a": jnp.int32(0)})


def batch(b=5, **over):
    out = {"obs": {"pixels": jnp.zeros((b, 2, 3), jnp.uint8), "vec": jnp.zeros((b, 4))}, "a": jnp.zeros((b,), jnp.int32)}
    out.update(over)
    return out


def test_ok_returns_leading_axes():
    assert _validate.check_batch(SPEC, batch(7)) == (7,)
    two = jax.tree.map(lambda x: jnp.stack([x, x]), batch(3))
    assert _validate.check_batch(SPEC, two, batch_ndim=2) == (2, 3)


def test_works_on_tracers():
    jax.jit(lambda b: _validate.check_batch(SPEC, b) and 0)(batch(2))


def test_structure_names_missing_and_extra():
    with pytest.raises(TypeError, match=r"missing leaves \[\"\['a'\]\"\]"):
        _validate.check_batch(SPEC, {"obs": batch()["obs"]})
    with pytest.raises(TypeError, match=r"unexpected leaves .*'b'"):
        _validate.check_batch(SPEC, {**batch(), "b": jnp.zeros(5)})


def test_shape_error_names_leaf():
    bad = batch()
    bad["obs"]["pixels"] = jnp.zeros((5, 3, 2), jnp.uint8)
    with pytest.raises(ValueError, match=r"batch\['obs'\]\['pixels'\]: expected shape .*\(2, 3\).*got \(5, 3, 2\)"):
        _validate.check_batch(SPEC, bad)


def test_shape_error_of_one_item_has_no_leading_axes():
    """Without leading axes (one item: `final_obs` of an unbatched add, `Writer.append`) the expected shape is the
    item's own, not a template with an empty list of axes."""
    bad = {"obs": {"pixels": jnp.zeros((3,), jnp.uint8), "vec": jnp.zeros(4)}, "a": jnp.int32(0)}
    with pytest.raises(ValueError) as info:
        _validate.check_batch(SPEC, bad, batch_ndim=0, what="final_obs")
    assert str(info.value) == "final_obs['obs']['pixels']: expected shape (2, 3), got (3,)"


def test_python_scalars_are_named_as_given_not_as_the_traced_array():
    """A compiled method given a Python number where an array belongs names the number, not an int32 tracer."""
    import jaxbuffers as jb

    buf = jb.ReplayBuffer.create({"x": jnp.zeros(2)}, capacity=4).add({"x": jnp.ones((2, 2))})
    with pytest.raises(TypeError, match=r"^key: .*got int 0\b"):
        buf.sample(0, 2)
    with pytest.raises(TypeError, match=r"^n: .*got float 1\.0\b"):
        jb.RateLimiter.create(1.0).insert(1.0)


def test_dtype_error_names_leaf_and_never_casts():
    bad = batch()
    bad["obs"]["vec"] = np.zeros((5, 4), np.float64)
    with pytest.raises(TypeError, match=r"batch\['obs'\]\['vec'\]: expected dtype float32, got float64"):
        _validate.check_batch(SPEC, bad)


def test_inconsistent_leading_axes():
    bad = batch()
    bad["a"] = jnp.zeros((4,), jnp.int32)
    with pytest.raises(ValueError, match=r"leading axes \(5,\) disagree with batch\['a'\]'s \(4,\)"):
        _validate.check_batch(SPEC, bad)


def test_non_array_leaf():
    with pytest.raises(TypeError, match=r"expected an array"):
        _validate.check_batch(SPEC, batch(a=1.0))
    with pytest.raises(TypeError, match=r"example_item\['x'\].*expected an array"):
        _validate.item_spec({"x": 1.0})


def test_a_list_is_told_the_dtype_of_the_place_it_goes():
    """The conversion suggested for a list is to the dtype stored there (float32 only for a float32 place)."""
    for dtype, to in [(np.bool_, "np.bool_"), (np.int32, "np.int32"), (jnp.bfloat16, "jnp.bfloat16"), (None, "dtype")]:
        assert str(_validate.not_array("x", [1, 2], dtype=dtype)).endswith(f"np.asarray(x, {to})")
    with pytest.raises(TypeError, match=r"np\.asarray\(x, np\.uint8\)$"):
        _validate.array("x", [1, 2], (2,), np.uint8)


def test_a_floating_vector_takes_a_list_of_python_ints_and_floats_only():
    """A list of Python ints and floats (also as a compiled program receives them) is read as float32; a complex
    in it is a TypeError naming the field, never a silent cast to its real part."""
    np.testing.assert_array_equal(_validate.vector("priorities", [1, 2.5], 2, "floating"), np.float32([1, 2.5]))
    got = jax.jit(lambda a, b: _validate.vector("priorities", [a, b], 2, "floating"))(1, 2.5)
    assert got.dtype == jnp.float32 and np.array_equal(got, [1, 2.5])
    for bad in ([1 + 2j, 3.0], [1.0, 3 + 0j]):
        with pytest.raises(TypeError, match="priorities: expected a floating dtype"):
            _validate.vector("priorities", bad, 2, "floating")
    with pytest.raises(TypeError, match="priorities: expected a floating dtype"):
        jax.jit(lambda a, b: _validate.vector("priorities", [a, b], 2, "floating"))(1.0, 3 + 0j)


def test_item_spec_rejects_silent_narrowing():
    with pytest.raises(TypeError, match="float64"):
        _validate.item_spec({"x": np.zeros(3, np.float64)})
    with pytest.raises(ValueError, match="at least one array leaf"):
        _validate.item_spec({})


def test_nbytes():
    assert _validate.tree_nbytes(SPEC) == 6 + 16 + 4
    assert _validate.tree_nbytes(batch(10)) == 10 * 26


def test_static_bool():
    from jaxbuffers._validate import static_bool

    assert static_bool("flag", True) is True and static_bool("flag", np.bool_(False)) is False
    for bad in ("False", 0, 1, None, jnp.bool_(True)):
        with pytest.raises(TypeError, match="flag: expected a Python bool"):
            static_bool("flag", bad)


def test_item_spec_names_a_prng_key_leaf():
    """A typed PRNG key leaf is refused with the leaf named and the way to store it (it failed
    with numpy's "Cannot interpret 'key<fry>' as a data type")."""
    import jaxbuffers as jb

    item = {"obs": jnp.zeros(3), "rng": jax.random.key(0)}
    for create in (lambda: _validate.item_spec(item), lambda: jb.ReplayBuffer.create(item, 8)):
        with pytest.raises(TypeError, match=r"example_item\['rng'\]: expected a numeric array, got a PRNG key array.*key_data"):
            create()
    raw = {"obs": jnp.zeros(3), "rng": jax.random.key_data(jax.random.key(0))}  # what to store instead
    assert jb.ReplayBuffer.create(raw, 8).item_spec["rng"].dtype == jnp.uint32


@pytest.mark.parametrize(
    "bad, why",
    [
        (None, ""),
        ("3", ""),
        (object(), ""),
        ({"a": jnp.array([1])}, "entry not a 2- or 3- tuple"),  # a dict holding a JAX array
        ([jnp.int32(1), None], "None is not a valid value"),  # a list mixing a JAX array and None
        ([jnp.int32(1), "a"], "not a valid JAX array type"),
        ([jnp.int32(1), 2**70], "too large"),  # next to a JAX array numpy cannot keep it as an object
        ([[0, 1], [2]], "setting an array element with a sequence"),  # ragged
        (jax.ShapeDtypeStruct((2,), jnp.int32), ""),  # has shape and dtype, holds no values
    ],
)
def test_index_array_refuses_what_is_not_numbers_naming_the_argument(bad, why):
    with pytest.raises(TypeError, match=rf"^where: expected an integer array \(int32\), got {type(bad).__name__} .*{why}"):
        _validate.integer_indices("where", bad)
    with pytest.raises(TypeError, match=r"^indices: expected an integer array"):  # the same inside jit
        jax.jit(lambda: _validate.integer_indices("indices", bad))()


def test_index_array_keeps_valid_input():
    np.testing.assert_array_equal(_validate.integer_indices("i", [1, 2]), [1, 2])
    np.testing.assert_array_equal(_validate.integer_indices("i", np.array([3], np.int64)), [3])
    got = jax.jit(lambda i: _validate.integer_indices("i", [i, 1, [0, 2][1]]))(jnp.int32(5))
    np.testing.assert_array_equal(got, [5, 1, 2])  # a list holding a tracer
    assert _validate.integer_indices("i", [2**70, -(2**70)]).tolist() == [2**31 - 1, -(2**31)]  # saturated
    with pytest.raises(TypeError, match="i: expected an integer dtype"):
        _validate.integer_indices("i", [1.5])


def test_index_array_reads_other_array_likes_through_numpy():
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(_validate.integer_indices("i", torch.tensor([4, 2**40])), [4, 2**31 - 1])
    with pytest.raises(TypeError, match="i: expected an integer dtype"):
        _validate.integer_indices("i", torch.tensor([1.0]))


def _creates():
    from jaxbuffers import PrioritisedTrajectoryBuffer, RolloutBuffer, TrajectoryBuffer
    from jaxbuffers.compressed import CompressedPrioritisedTrajectoryBuffer, CompressedRolloutBuffer, CompressedTrajectoryBuffer

    trajectory, rollout = ("num_envs", "length"), ("num_envs", "num_steps")  # window_length has a default
    return [(TrajectoryBuffer, trajectory), (PrioritisedTrajectoryBuffer, trajectory), (RolloutBuffer, rollout),
            (CompressedTrajectoryBuffer, trajectory), (CompressedPrioritisedTrajectoryBuffer, trajectory),
            (CompressedRolloutBuffer, rollout)]


CREATES = _creates()


@pytest.mark.parametrize("cls, sizes", CREATES, ids=[cls.__name__ for cls, _ in CREATES])
def test_sizes_by_position_name_the_keyword_only_sizes_and_show_the_call(cls, sizes):
    """`create(step, 4, 100)` raised Python's "takes 2 positional arguments but 4 were given"."""
    step = {"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0)}
    names = f"{', '.join(sizes[:-1])} and {sizes[-1]}"
    call = ", ".join(f"{s}=..." for s in sizes)
    with pytest.raises(TypeError) as info:
        cls.create(step, *range(4, 4 + len(sizes)))
    assert str(info.value) == (
        f"{cls.__name__}.create: {names} are keyword-only, got {len(sizes)} positional arguments after "
        f"example_step; call {cls.__name__}.create(example_step, {call})"
    )
    with pytest.raises(TypeError, match=rf"got 1 positional argument after example_step; call {cls.__name__}\.create"):
        cls.create(step, 4, **{s: 4 for s in sizes[1:]})


def test_a_replicated_buffer_must_be_the_same_on_every_process():
    """Several processes saving one replicated buffer: hashes of every array compared, the first that differs named
    with both processes; a leaf held whole (numpy, or a local array) is read as is."""
    from jaxbuffers._validate import processes

    own = {"buffer.json": "a", "['device']['0']": "b", "['device']['1']": "c"}
    processes.same_on_every_process(own, [dict(own), dict(own)], 0)
    with pytest.raises(ValueError, match=r"buffer: .*array \['device'\]\['1'\] differs between process 0 and process 2 .*ShardedBuffer"):
        processes.same_on_every_process(own, [own, own, {**own, "['device']['1']": "x"}], 0)
    with pytest.raises(ValueError, match=r"array \['host'\] differs between process 1 and process 0"):
        processes.same_on_every_process(own, [{**own, "['host']": "h"}, own], 1)
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    for leaf in (x, jnp.asarray(x)):
        got = processes.whole_leaf(leaf)
        assert isinstance(got, np.ndarray) and got.dtype == x.dtype and np.array_equal(got, x)
@pytest.mark.parametrize("stack_axis", [0, 1])
def test_unrebuilt_trajectory_stacks_host_equals_device(stack_axis):
    """The host rule (numpy stacks: bytes compared where the rule reads them) gives the device rule's result on
    stacks that follow, break, restart and end episodes, floats compared bit for bit (NaN equal to itself, -0.0 not
    equal to 0.0)."""
    from jaxbuffers._validate.steps import unrebuilt_trajectory_stacks

    rng = np.random.default_rng(0)
    device_rule = jax.jit(unrebuilt_trajectory_stacks, static_argnames=("stack_axis", "padding"))
    e, t, k = 2, 3, 3  # one shape: a compile per padding
    seen = set()  # (row, value) pairs met: refusals and acceptances of stacks and final observations
    for trial in range(24):
        padding = ("zero", "reset")[trial % 2]
        frames = rng.choice(np.array([0.0, -0.0, 1.0, np.nan], np.float32), size=(e, t + k + 1, 3, 2))

        def stack(lane, i):  # frames i - k + 1 .. i of the lane, stacked on stack_axis
            return np.moveaxis(np.stack([frames[lane, max(i - j, 0)] for j in range(k - 1, -1, -1)]), 0, stack_axis)

        x = np.stack([np.stack([stack(lane, i + 1) for i in range(t)]) for lane in range(e)])
        finals = np.stack([np.stack([stack(lane, i + 2) for i in range(t)]) for lane in range(e)])
        before = np.stack([stack(lane, 0) for lane in range(e)])
        if trial % 3:  # a broken stack or final observation somewhere
            x[rng.integers(e), rng.integers(t)] = rng.integers(0, 2, x.shape[2:])
            finals[rng.integers(e), rng.integers(t)] = 0
        starts, boot = rng.random((e, t)) < 0.3, rng.random((e, t)) < 0.5
        kw = dict(stack_axis=stack_axis, padding=padding)
        host = unrebuilt_trajectory_stacks(x, before, starts, finals, boot, **kw)
        device = device_rule(*map(jnp.asarray, (x, before, starts, finals, boot)), **kw)
        assert isinstance(host, np.ndarray) and host.shape == (2, e, t)
        np.testing.assert_array_equal(host, np.asarray(device), err_msg=f"trial {trial}")
        seen |= {(row, bool(v)) for row in (0, 1) for v in host[row].reshape(-1)}
        np.testing.assert_array_equal(unrebuilt_trajectory_stacks(x, before, starts, None, None, **kw),
                                      np.asarray(device_rule(jnp.asarray(x), jnp.asarray(before), jnp.asarray(starts), None, None, **kw)))
    assert seen == {(0, False), (0, True), (1, False), (1, True)}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e4m3fn, jnp.int4])
def test_compressed_leaves_of_a_dtype_the_host_stores_do_not_take_are_refused_in_create_naming_the_leaf(dtype):
    """(before: `TypeError dtype: expected a numeric dtype ...` from the host store, naming its own argument)"""
    import jaxbuffers as jb

    step = lambda obs: {"obs": obs, "action": jnp.int32(0), "reward": jnp.float32(0)}  # noqa: E731
    bare, nested = step(jnp.zeros((4, 4), dtype)), step({"pixels": jnp.zeros((4, 4), dtype), "pos": jnp.zeros(3, dtype)})
    makes = {
        "example_step['obs']": [lambda: jb.CompressedTrajectoryBuffer.create(bare, num_envs=1, length=4),
                                lambda: jb.CompressedEpisodeBuffer.create(bare, max_episodes=2, max_timesteps=4),
                                lambda: jb.CompressedRolloutBuffer.create(bare, num_envs=1, num_steps=4)],
        "example_step['obs']['pixels']": [lambda: jb.CompressedTrajectoryBuffer.create(nested, num_envs=1, length=4, compress=("pixels",))],
    }
    for leaf, calls in makes.items():
        for make in calls:
            with pytest.raises(TypeError, match=rf"^{re.escape(leaf)}: dtype {np.dtype(dtype).name} cannot be stored compressed: .*'float16'"):
                make()
    on_device = step({"pixels": jnp.zeros((4, 4), jnp.uint8), "pos": jnp.zeros(3, dtype)})  # not compressed: taken
    assert jb.CompressedTrajectoryBuffer.create(on_device, num_envs=1, length=4, compress=("pixels",)).step_spec["obs"]["pos"].dtype == dtype


def test_integer_refuses_another_kind_with_a_type_error_and_a_low_value_with_a_value_error():
    """An int option that is not a size (an id, a thread count): any Python or numpy int, as `int`; a float (even
    `2.0`), a bool or a str is the wrong kind (TypeError), a value below the minimum a ValueError."""
    assert _validate.integer("step_id", np.int64(2**40), 0) == 2**40 and type(_validate.integer("level", -3)) is int
    for bad in (2.0, True, np.bool_(False), "1", None, np.zeros(()), jnp.int32(1)):
        with pytest.raises(TypeError, match=r"step_id: expected an int >= 0, got"):
            _validate.integer("step_id", bad, 0)
    with pytest.raises(TypeError, match=r"level: expected an int, got float 1.5"):
        _validate.integer("level", 1.5)
    with pytest.raises(ValueError, match=r"step_id: expected an int >= 0, got -1"):
        _validate.integer("step_id", -1, 0)


def test_choice_names_what_the_options_are():
    assert _validate.choice("axis", "x", ("x", "y"), "(the mesh's axis names)") == "x"
    for bad in ("z", 0, ["x"]):
        with pytest.raises(ValueError, match=r"axis: expected one of \('x', 'y'\) \(the mesh's axis names\), got"):
            _validate.choice("axis", bad, ("x", "y"), "(the mesh's axis names)")
    with pytest.raises(ValueError, match=r"^mode: expected one of \('w', 'r'\), got 'a'$"):
        _validate.choice("mode", "a", ("w", "r"))


def test_flag_is_a_bool_or_a_bool_array_of_the_shape():
    """A Python or numpy bool fills the shape; a bool array must have it exactly; nothing is cast."""
    assert _validate.flag("terminated", True).shape == () and bool(_validate.flag("terminated", np.bool_(True)))
    np.testing.assert_array_equal(_validate.flag("terminated", False, (2,)), [False, False])
    assert _validate.flag("terminated", jnp.array([True, False]), (2,)).dtype == np.bool_
    for bad in (None, 1, "True", [True]):
        with pytest.raises(TypeError, match=r"terminated: expected a bool or a bool array of shape \(\), got"):
            _validate.flag("terminated", bad)
    for bad in (np.int32(1), np.float32(1), np.array(1)):
        with pytest.raises(TypeError, match="terminated: expected dtype bool"):
            _validate.flag("terminated", bad)
    with pytest.raises(ValueError, match=r"terminated: expected shape \(\), got \(1,\)"):
        _validate.flag("terminated", np.array([True]))


def test_is_array_and_jax_holds():
    assert _validate.is_array(np.zeros(2)) and _validate.is_array(jnp.int32(1)) and _validate.is_array(np.float32(1))
    assert not any(map(_validate.is_array, (1, 1.5, [1], None, jax.ShapeDtypeStruct((2,), jnp.float32))))
    assert _validate.jax_holds(np.float32) and _validate.jax_holds(np.dtype(np.uint8)) and _validate.jax_holds(np.bool_)
    assert not _validate.jax_holds(np.float64) and not _validate.jax_holds(np.int64)


def test_not_narrowed_says_how_to_keep_the_dtype():
    with pytest.raises(TypeError, match=r"x: dtype int64 would be narrowed to int32 \(x64 is off\); convert it$"):
        _validate.not_narrowed("x", np.zeros(2, np.int64))
    with pytest.raises(TypeError, match=r"x: dtype float64 would be narrowed to float32 \(x64 is off\); pass cast=True$"):
        _validate.not_narrowed("x", np.zeros(2), "pass cast=True")
