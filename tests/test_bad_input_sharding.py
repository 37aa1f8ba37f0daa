"""Bad input to `ShardedBuffer` (create, add, sample, sample_local, can_sample, set_priorities, apply, shard):
refused with an error naming the argument, before any program is built or run, the sharded state unchanged; the
accepted forms give exactly their documented result.

Most cases run on one device (a mesh of one shard). The refusal of a leading axis that the shards do not divide needs
two: it is marked `devices(2)`, and `test_on_two_forced_devices` reruns this file on two forced host devices under
`-m slow`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS, bad_keys, bad_static_ints, corrupt, refused, snapshot, traceable

FEW = settings(SETTINGS, max_examples=6)  # each example may trace a shard_map program
ITEM = {"obs": jnp.zeros((2,), jnp.float32), "a": jnp.int32(0)}
S = min(jax.device_count(), 2)
MESH = jax.make_mesh((S,), ("data",), devices=jax.devices()[:S])


def rows(b: int, start: int = 0) -> dict:
    i = np.arange(start, start + b)
    return {"obs": np.stack([i, -i], 1).astype(np.float32), "a": i.astype(np.int32)}


def _filled(make):
    return jb.ShardedBuffer.create(make, MESH, "data").add(rows(2 * S)).add(rows(2 * S, 10))


REPLAY = _filled(lambda: jb.ReplayBuffer.create(ITEM, capacity=8))
PRIORITISED = _filled(lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=8))
KEY = jax.random.key(0)


@FEW
@given(make=st.sampled_from([None, 1, "ReplayBuffer", lambda: 3, lambda: {"a": jnp.zeros(2)}]),
       mesh=st.sampled_from([None, "data", jax.devices(), (1,)]), axis=st.sampled_from([None, 0, "model", ["data"], ("data",)]))
def test_create_bad_arguments(make, mesh, axis):
    good = lambda: jb.ReplayBuffer.create(ITEM, capacity=4)  # noqa: E731
    refused(lambda: jb.ShardedBuffer.create(make, MESH, "data"), "make")
    refused(lambda: jb.ShardedBuffer.create(good, mesh, "data"), "mesh")
    refused(lambda: jb.ShardedBuffer.create(good, MESH, axis), "axis")


@FEW
@given(bad=corrupt(rows(2 * S), "batch"))
@example(bad=({**rows(2 * S), "obs": rows(2 * S)["obs"].astype(np.float64)}, "batch['obs']"))  # was narrowed silently
@example(bad=({**rows(2 * S), "obs": [[0.0, 0.0]] * (2 * S)}, "batch['obs']"))  # was refused as "args[0]...: a scalar"
def test_add_wrong_batch(bad):
    """A wrong batch is refused naming the leaf as the buffer's own `add` names it (a float64 numpy leaf too,
    which the program's boundary would have narrowed to float32)."""
    refused(lambda: REPLAY.add(bad[0]), (bad[1], "batch"), state=REPLAY)
    if traceable(bad[0]):
        refused(lambda: jax.jit(jb.ShardedBuffer.add)(REPLAY, bad[0]), (bad[1], "batch"), state=REPLAY)


def test_a_float64_numpy_leaf_for_a_uint8_field_is_refused_as_unsharded():
    """A numpy float64 leaf where the buffer stores uint8: the unsharded buffer's own message (the leaf, the dtype it
    expects and the one that came), not the boundary's "would be narrowed"; a float64 leaf for a float32 field too."""
    item = {"obs": jnp.zeros((2,), jnp.uint8), "a": jnp.int32(0)}
    make = lambda: jb.ReplayBuffer.create(item, capacity=8)  # noqa: E731
    sharded = jb.ShardedBuffer.create(make, MESH, "data")
    for field, want in (("obs", "uint8"), ("a", "int32")):
        batch = {"obs": np.zeros((2 * S, 2), np.uint8), "a": np.zeros(2 * S, np.int32), field: np.zeros((2 * S, 2)[: 2 if field == "obs" else 1])}
        with pytest.raises(TypeError) as unsharded:
            make().add(batch)
        err = refused(lambda: sharded.add(batch), f"batch['{field}']", state=sharded)
        assert str(err) == str(unsharded.value) and f"expected dtype {want}, got float64" in str(err)
    err = refused(lambda: REPLAY.add({**rows(2 * S), "obs": rows(2 * S)["obs"].astype(np.float64)}), "batch['obs']", state=REPLAY)
    assert "expected dtype float32, got float64" in str(err)


def test_restore_names_the_one_meta_default_of_a_sharded_episode_buffer(tmp_path):
    """A sharded target whose meta default differs from the checkpoint's: the message gives the default, once (not
    one per shard), as for an unsharded buffer."""
    step = {"obs": jnp.zeros((2,), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    make = lambda d: lambda: jb.EpisodeBuffer.create(step, max_episodes=2, max_timesteps=3, meta={"task": jnp.int32(d)})  # noqa: E731
    path = jb.save(tmp_path / "ckpt", jb.ShardedBuffer.create(make(-1), MESH, "data"), progress=False)
    other = jb.ShardedBuffer.create(make(7), MESH, "data")
    with pytest.raises(jb.CheckpointError, match=r"meta' field 'task': the checkpoint's default is -1, the target's is 7 \(create"):
        jb.restore(path, other, progress=False)


@FEW
@given(priorities=st.sampled_from(["x", [1.0, "a"], np.ones((2 * S, 2), np.float32), np.ones(2 * S + 1, np.float32)]),
       flag=st.sampled_from([[True], {"a": 1}]))
def test_add_wrong_extra_arguments(priorities, flag):
    """A prioritised add's priorities refused by name (by position or keyword); an unhashable keyword value is
    refused naming the keyword, not as Python's "unhashable type"."""
    name = ("priorities", "args[1]")
    refused(lambda: PRIORITISED.add(rows(2 * S), priorities), name, state=PRIORITISED)
    refused(lambda: PRIORITISED.add(rows(2 * S), priorities=priorities), name, state=PRIORITISED)
    refused(lambda: REPLAY.add(rows(2 * S), extra=flag), "extra", state=REPLAY)


def test_add_unknown_keyword_named_as_an_argument():
    """A keyword the buffer's add does not take is named as such, before its value is looked at."""
    err = refused(lambda: REPLAY.add(rows(2 * S), foo=[1]), "foo", state=REPLAY, exc=(TypeError,))
    assert "unexpected keyword argument(s) ['foo']" in str(err), err


@settings(SETTINGS, max_examples=12)  # two buffers, eight refusals each
@given(key=bad_keys(), batch_size=bad_static_ints(), method=st.sampled_from([None, 1, "nope", "add", "_run", "sample_transitions", ["sample"]]))
@example(key=None, batch_size=2.0, method="nope")  # 2.0 found the cached program of 2
def test_sampling_bad_arguments(key, batch_size, method):
    for buf in (REPLAY, PRIORITISED):
        for call in (buf.sample, buf.sample_local):
            refused(lambda: call(key, 2), "key", state=buf)
            refused(lambda: call(KEY, batch_size), "batch_size", state=buf)
            refused(lambda: call(KEY, 2, method=method), "method", state=buf)
        refused(lambda: buf.can_sample(batch_size), "batch_size", state=buf)
        refused(lambda: buf.can_sample(2, method=method), "method", state=buf)


@SETTINGS
@given(beta=st.sampled_from(["x", None, -1.0, float("nan"), np.ones(2, np.float32), True]))
def test_global_sample_bad_beta(beta):
    refused(lambda: PRIORITISED.sample(KEY, 2, beta=beta), "beta", state=PRIORITISED)


@SETTINGS
@given(arg=st.sampled_from(["shard", "indices", "priorities"]), bad=st.sampled_from(["none", "float", "long", "str"]))
def test_set_priorities_bad_arguments(arg, bad):
    good = {"shard": np.zeros(2, np.int32), "indices": np.zeros(2, np.int32), "priorities": np.ones(2, np.float32)}
    wrong = {"none": None, "str": "ab", "long": np.zeros(3, good[arg].dtype),
             "float": np.zeros(2, np.float32 if arg != "priorities" else np.int32)}[bad]
    args = {**good, arg: wrong}
    sample = PRIORITISED.sample(KEY, 2)
    refused(lambda: PRIORITISED.set_priorities(args["shard"], args["indices"], args["priorities"], sample.sample.generations),
            arg if bad != "long" else ("indices", "priorities", "shard"), state=PRIORITISED)  # which of the lengths is wrong
    refused(lambda: REPLAY.set_priorities(*good.values(), np.zeros(2, np.int32)), "set_priorities", state=REPLAY)


@SETTINGS
@given(s=bad_static_ints(minimum=0) | st.just(S), fn=st.sampled_from([None, 1, "size"]))
def test_shard_and_apply_bad_arguments(s, fn):
    refused(lambda: REPLAY.shard(s), "s", state=REPLAY)
    refused(lambda: REPLAY.apply(fn), "fn", state=REPLAY)
    refused(lambda: REPLAY.apply(lambda b, x: b, "x"), "args[0]", state=REPLAY)


def _same_samples(forms: dict, betas: list, global_: bool = True) -> None:
    want = PRIORITISED.sample(KEY, 2)
    for key in forms.values() if global_ else ():
        for beta in betas:
            assert snapshot(PRIORITISED.sample(key, 2, **beta)) == snapshot(want)
    assert all(snapshot(REPLAY.sample_local(k, 2)) == snapshot(REPLAY.sample_local(KEY, 2)) for k in forms.values())


def test_accepted_keys_give_the_same_samples():
    """The table: a key as `jax.random.key(seed)` or `jax.random.PRNGKey(seed)` (JAX or numpy uint32) draws exactly
    the same local samples (the global ones: the slow variant, one more program per key form)."""
    raw = jax.random.key_data(KEY)
    _same_samples({"typed": KEY, "raw": raw, "raw_numpy": np.asarray(raw)}, [{}], global_=False)


@pytest.mark.slow
def test_accepted_keys_give_the_same_global_samples():
    raw = jax.random.key_data(KEY)
    _same_samples({"typed": KEY, "raw": raw, "raw_numpy": np.asarray(raw)}, [{}])


@pytest.mark.slow  # one program per form of beta
def test_accepted_betas_give_the_same_samples():
    """`beta` as a Python float, a numpy scalar or a 0-d JAX or numpy array: the same samples (1.0 is the default).
    A refused `beta=True` first: it hashes like `1.0`, and its program was once found for `beta=1.0`."""
    refused(lambda: PRIORITISED.sample(KEY, 2, beta=True), "beta", state=PRIORITISED)
    _same_samples({"typed": KEY}, [{"beta": 1.0}, {"beta": np.float32(1)}, {"beta": np.array(1.0, np.float32)}, {"beta": jnp.float32(1)}])


@pytest.mark.devices(2)
@FEW
@given(b=st.integers(1, 7).filter(lambda b: b % S))
def test_leading_axis_not_divided_by_the_shards(b):
    """Rows the shards cannot split evenly: refused naming the leaf and the shard count (two or more devices)."""
    refused(lambda: REPLAY.add(rows(b)), ("batch['obs']", "batch['a']"), state=REPLAY)
    refused(lambda: REPLAY.apply(lambda buf, x: buf, np.zeros(b, np.float32)), "args[0]", state=REPLAY)


@pytest.mark.devices(2)
def test_a_refused_add_names_the_shape_passed_not_a_shards_block():
    bad = {"obs": np.ones((4 * S, 3), np.float32), "a": np.zeros(4 * S, np.int32)}
    err = refused(lambda: REPLAY.add(bad), "batch['obs']", state=REPLAY)
    assert f"got {(4 * S, 3)} (each of the {S} shards checks its block of 4 rows)" in str(err), str(err)


def test_add_episodes_concrete_lengths_out_of_range():
    """Concrete `lengths` outside `[1, max_timesteps]` are refused as by the unsharded buffer, before any program
    runs (a compressed buffer's stores keep their version)."""
    for compressed in (False, True):
        step = {"obs": jnp.zeros((3, 3), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
        cls = jb.compressed.CompressedEpisodeBuffer if compressed else jb.EpisodeBuffer
        buf = jb.ShardedBuffer.create(lambda: cls.create(step, max_episodes=2, max_timesteps=4), MESH, "data")
        eps = {"obs": np.ones((S, 4, 3, 3), np.uint8), "action": np.zeros((S, 4), np.int32), "reward": np.zeros((S, 4), np.float32)}
        kw = dict(terminated=np.ones(S, bool), final_obs=np.ones((S, 3, 3), np.uint8))
        for bad in (5, 0, -3):
            lengths = np.full(S, 2, np.int32)
            lengths[-1] = bad
            err = refused(lambda: buf.add_episodes(eps, lengths, **kw), "lengths", state=buf.shards)
            assert "[1, 4]" in str(err)
            if compressed:
                assert [h.version for h in buf.shards.host.shards] == [0] * S
        ok = buf.add_episodes(eps, np.full(S, 4, np.int32), **kw)
        assert int(ok.size()) == 4 * S


@pytest.mark.slow  # a subprocess of its own on 2 forced devices: python -m pytest -m slow tests/test_bad_input_sharding.py
@pytest.mark.fewer_devices(2)
def test_on_two_forced_devices(forced_devices):
    ran = sum(1 for name in globals() if name.startswith("test_")) - 1
    last = forced_devices(__file__, 2, "test_on_two_forced_devices")
    assert f"{ran} passed, 1 deselected" in last  # every other test ran
