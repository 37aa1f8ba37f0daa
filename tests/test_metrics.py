"""Usage metrics (`record`, `stats`, `jaxbuffers.timing`): counts and ages against a plain-Python model of each
buffer's ring, stale draws, saturation, donation, checkpoints and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxbuffers as jb
from jaxbuffers import _metrics as mm
from jaxbuffers._metrics import HIST
from metrics_model import RingModel, metrics_of as _metrics

ITEM = {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}
STEP = {"obs": jax.ShapeDtypeStruct((2,), jnp.float32), "action": jax.ShapeDtypeStruct((), jnp.int32),
        "reward": jax.ShapeDtypeStruct((), jnp.float32)}
PIXELS = {"obs": jax.ShapeDtypeStruct((4, 4), jnp.uint8), "action": jax.ShapeDtypeStruct((), jnp.int32),
          "reward": jax.ShapeDtypeStruct((), jnp.float32)}  # a compressed buffer's step: obs on the host
CAP, E, L, EPS, T = 7, 2, 6, 5, 4


def _zeros(spec, lead):
    return jax.tree.map(lambda s: jnp.zeros((*lead, *s.shape), s.dtype), spec)


# --- one (create, add n, sample) per buffer kind, and the model's ring ---

def _replay(prioritised, **kw):
    cls = jb.PrioritisedReplayBuffer if prioritised else jb.ReplayBuffer
    return (lambda: cls.create(ITEM, CAP, **kw), lambda b, n: b.add(_zeros(ITEM, (n,))),  # per-slot counts: the default
            lambda b, k: b.sample(k, 4), RingModel(CAP))


def _trajectory(prioritised, compressed=False, **kw):
    if compressed:
        from jaxbuffers.compressed import CompressedPrioritisedTrajectoryBuffer, CompressedTrajectoryBuffer
        cls = CompressedPrioritisedTrajectoryBuffer if prioritised else CompressedTrajectoryBuffer
        extra = {"window_length": 2} if prioritised else {}
        create = lambda: cls.create(PIXELS, num_envs=E, length=L, codec="zstd:1", **extra, **kw)  # noqa: E731
        step = PIXELS
    else:
        cls = jb.PrioritisedTrajectoryBuffer if prioritised else jb.TrajectoryBuffer
        extra = {"window_length": 2} if prioritised else {}
        create = lambda: cls.create(STEP, num_envs=E, length=L, **extra, **kw)  # noqa: E731
        step = STEP
    if prioritised:
        sample = lambda b, k: b.sample_sequences(k, 5)  # noqa: E731
    else:
        sample = lambda b, k: b.sample_transitions(k, 5, n_step=1, gamma=0.9)  # noqa: E731
    add = lambda b, n: b.add(_zeros(step, (E, n)), terminated=jnp.zeros((E, n), bool))  # noqa: E731
    return create, add, sample, RingModel(L, E)


def _episode(compressed=False, **kw):
    if compressed:
        from jaxbuffers.compressed import CompressedEpisodeBuffer
        create = lambda: CompressedEpisodeBuffer.create(PIXELS, max_episodes=EPS, max_timesteps=T, codec="zstd:1", **kw)  # noqa: E731
        step = PIXELS
    else:
        create = lambda: jb.EpisodeBuffer.create(STEP, max_episodes=EPS, max_timesteps=T, **kw)  # noqa: E731
        step = STEP
    add = lambda b, n: b.add_episodes(_zeros(step, (n, T)), jnp.full((n,), 2, jnp.int32), terminated=jnp.ones(n, bool),  # noqa: E731
                                      final_obs=_zeros(step["obs"], (n,)))
    return create, add, lambda b, k: b.sample_timesteps(k, 4), RingModel(EPS)


KINDS = {"replay": lambda **kw: _replay(False, **kw), "prioritised": lambda **kw: _replay(True, **kw),
         "trajectory": lambda **kw: _trajectory(False, **kw), "prioritised-trajectory": lambda **kw: _trajectory(True, **kw),
         "episode": _episode, "compressed-trajectory": lambda **kw: _trajectory(False, True, **kw),
         "compressed-prioritised-trajectory": lambda **kw: _trajectory(True, True, **kw),
         "compressed-episode": lambda **kw: _episode(True, **kw)}  # (create, add, sample, model); kw: create's
COMPRESSED = [k for k in KINDS if k.startswith("compressed")]

# op: (add before, draw?, add between sample and record)
OPS = st.lists(st.tuples(st.sampled_from([0, 1, 3]), st.booleans(), st.sampled_from([0, 0, 2])), min_size=1, max_size=10)


def _check_ops(kind, ops, seed):
    """Run `ops` (add before, draw?, add between sample and record) on a new buffer of `kind` and its model."""
    create, add, sample, model = KINDS[kind]()
    buf, key = create(), jax.random.key(seed)
    assert _metrics(buf).per_slot
    for before, draw, between in ops:
        if before:
            buf = add(buf, before)
            model.add(before)
        if draw and model.added:
            key, k = jax.random.split(key)
            s = sample(buf, k)
            gens = getattr(s, "generations", None)
            if gens is not None:  # a sampled position holds the item the model has there
                assert [model.generation(int(p)) for p in s.indices] == [int(g) for g in gens]
            if between:
                buf = add(buf, between)
                model.add(between)
            buf = buf.record(s)
            model.record(np.asarray(s.indices), None if gens is None else np.asarray(gens))
        model.check(buf)
    if hasattr(buf, "host"):
        buf.close()


@pytest.mark.parametrize("kind", [k if k not in COMPRESSED else pytest.param(k, marks=pytest.mark.slow) for k in KINDS])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, seed=st.integers(0, 2**16))
def test_counts_and_ages_match_a_model(kind, ops, seed):
    """Every buffer with positions, as `create` makes it (per-position counts on), compressed ones included (each
    new compressed buffer compiles its own programs: -m slow)."""
    _check_ops(kind, ops, seed)


@pytest.mark.parametrize("kind", [k if "prioritised" not in k else pytest.param(k, marks=pytest.mark.slow) for k in COMPRESSED])
def test_compressed_counts_and_ages_match_a_model(kind):
    """One sequence through a compressed buffer (adds of one size: one compile): adds that wrap the ring, draws
    recorded after an add (stale for a prioritised sample whose slot was rewritten), repeated draws."""
    _check_ops(kind, [(3, True, 0), (3, True, 3), (0, True, 0), (3, True, 0)], 3)


def test_an_overwritten_draw_is_stale_and_counted_nowhere_else():
    buf = jb.PrioritisedReplayBuffer.create(ITEM, 4, metrics=True).add(_zeros(ITEM, (4,)))
    s = buf.sample(jax.random.key(0), 8)
    buf = buf.add(_zeros(ITEM, (4,))).record(s)  # every slot rewritten
    st_ = buf.stats()
    assert (st_["samples"], st_["stale"], st_["age_max"]) == (0, 8, None)
    assert st_["sample_count"]["max"] == 0
    # the same draws recorded without an add in between all count
    fresh = buf.record(buf.sample(jax.random.key(1), 8)).stats()
    assert (fresh["samples"], fresh["stale"]) == (8, 8)


def test_an_empty_buffer_records_its_draws_as_stale():
    buf = jb.ReplayBuffer.create(ITEM, 4)
    s = buf.stats() | {}
    buf = buf.record(buf.sample(jax.random.key(0), 3))
    assert buf.stats()["stale"] == 3 and buf.stats()["samples"] == 0 == s["samples"]


def test_empty_rows_are_not_draws_and_not_stale():
    """A sample's empty rows (`indices` -1: a `where=` sampler with nothing to draw) count neither as samples nor as
    stale (they used to be stale); a position not held, or past the buffer's positions, is stale."""
    step = {"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0)}
    ep = jb.EpisodeBuffer.create(step, max_episodes=4, max_timesteps=3, meta={"task": jnp.int32(0)})
    ep = ep.add_episode(_zeros(step, (3,)), 3, terminated=True, final_obs=jnp.zeros(2))
    none = ep.sample_timesteps(jax.random.key(0), 5, where=lambda meta: meta["task"] == 1)
    assert np.asarray(none.indices).tolist() == [-1] * 5
    s = ep.record(none).stats()
    assert (s["samples"], s["stale"], s["record_calls"], s["sample_count"]["max"]) == (0, 0, 1, 0)
    buf = jb.ReplayBuffer.create(ITEM, 4).add(_zeros(ITEM, (2,)))  # slots 0 and 1 held
    s = buf.record(jb.ReplaySample(item=None, indices=jnp.array([-1, 0, 3, 9, -1], jnp.int32))).stats()
    assert (s["samples"], s["stale"]) == (1, 2)


def test_an_add_resets_the_counts_of_the_slots_it_writes():
    buf = jb.ReplayBuffer.create(ITEM, 4, metrics=True).add(_zeros(ITEM, (4,)))
    buf = buf.record(jb.ReplaySample(item=None, indices=jnp.array([0, 1, 2, 3, 3], jnp.int32)))
    np.testing.assert_array_equal(buf.metrics.sample_count, [1, 1, 1, 2])
    buf = buf.add(_zeros(ITEM, (2,)))
    np.testing.assert_array_equal(buf.metrics.sample_count, [0, 0, 1, 2])


def test_counts_saturate_instead_of_wrapping():
    buf = jb.ReplayBuffer.create(ITEM, 4, metrics=True).add(_zeros(ITEM, (4,)))
    top = np.iinfo(np.int32).max
    m = buf.metrics
    buf = buf.replace(metrics=m.replace(sample_count=m.sample_count.at[1].set(top - 1), totals=m.totals.at[HIST + 1].set(top - 1)))
    buf = buf.record(jb.ReplaySample(item=None, indices=jnp.array([1, 1, 1, 2, 2], jnp.int32)))  # slot 2: age 1, bin 1
    assert int(buf.metrics.sample_count[1]) == top  # stops at the top, never wraps
    assert int(buf.metrics.sample_count[2]) == 2
    assert int(buf.metrics.age_hist[1]) == top
    buf = buf.record(jb.ReplaySample(item=None, indices=jnp.array([1, 1, 1, 1], jnp.int32)))
    assert int(buf.metrics.sample_count[1]) == top
    assert buf.stats()["samples"] == 9


def test_the_counters_carry_into_their_high_words_exactly():
    """`samples`, `stale` and `record_calls` share `Metrics.totals` with the age bins: a record that takes their low
    words past `2**30 - 1` carries into their high words exactly, and leaves the bins and the word after `age_max`."""
    from jaxbuffers import _metrics as mm
    from jaxbuffers._ring import LOW_MASK

    buf = jb.ReplayBuffer.create(ITEM, 4).add(_zeros(ITEM, (3,)))  # slot 3 holds nothing: its draws are stale
    m = buf.metrics
    totals = m.totals.at[mm.SAMPLED:mm.AGE_MAX].set(jnp.array([5, LOW_MASK - 1, 0, LOW_MASK, 2, LOW_MASK - 2], jnp.int32))
    buf = buf.replace(metrics=m.replace(totals=totals.at[mm.AGE_MAX].set(7)))
    buf = jax.jit(lambda b: b.record(jb.ReplaySample(item=None, indices=jnp.array([0, 1, 2, 3, 3, 3, 3], jnp.int32))))(buf)
    s = buf.stats()
    assert s["samples"] == 5 * 2**30 + LOW_MASK - 1 + 3
    assert s["record_calls"] == 2**30
    assert s["stale"] == 2 * 2**30 + LOW_MASK - 2 + 4
    assert s["age_max"] == 7  # the largest age recorded before (the ages drawn now are 0 to 2)
    t = np.asarray(buf.metrics.totals)
    assert t[mm.AGE_MAX + 1] == 0 and t[mm.HIST:].sum() == 3 and t[mm.HIST:mm.HIST + 2].tolist() == [1, 2]
    for counter in (buf.metrics.sampled, buf.metrics.record_calls, buf.metrics.stale):
        assert 0 <= int(counter[1]) <= LOW_MASK


def test_the_age_sum_is_exact_for_large_batches_and_long_runs():
    buf = jb.ReplayBuffer.create(ITEM, 2**16).add(_zeros(ITEM, (2**16,)))  # slot 0 holds the oldest: age 2**16 - 1
    for b in (2**15, 2**15 + 1, 2**17):  # part sums per call stay below 2**30 up to MAX_RECORD draws
        s = buf.record(jb.ReplaySample(item=None, indices=jnp.zeros(b, jnp.int32))).stats()
        assert s["samples"] == b and s["age_max"] == 2**16 - 1 and s["age_mean"] == 2**16 - 1
    # a long run of calls with ages 2**16 - 1 and 1: the float32 running sum these replace drifts from the exact one
    step = jax.jit(lambda b, i: b.record(jb.ReplaySample(item=None, indices=i)))
    idx = jnp.concatenate([jnp.zeros(2**12 + 1, jnp.int32), jnp.full(2**12, 2**16 - 2, jnp.int32)])
    for _ in range(300):
        buf = step(buf, idx)
    s = buf.stats()
    calls, per_call = 300, (2**12 + 1) * (2**16 - 1) + 2**12 * 1  # odd: a float32 running sum loses its low bits
    assert s["samples"] == calls * (2**13 + 1) and s["age_mean"] == calls * per_call / (calls * (2**13 + 1))
    parts = np.asarray(buf.metrics.age_sum_parts)
    assert mm.age_sum(parts) == calls * per_call and parts.shape == (3, 2)
    with pytest.raises(ValueError, match="record: expected at most"):
        buf.record(jb.ReplaySample(item=None, indices=jnp.zeros(mm.MAX_RECORD + 1, jnp.int32)))


def test_record_of_a_stacked_buffer_counts_each_member_apart():
    bufs = jax.vmap(lambda n: jb.ReplayBuffer.create(ITEM, CAP, metrics=True))(jnp.arange(2))
    bufs = jax.vmap(lambda b: b.add(_zeros(ITEM, (CAP - 2,))))(bufs)  # the next add of 3 wraps past the end
    idx = jnp.array([[0, 0, 4, 6], [1, 2, 3, 3]], jnp.int32)  # member 0: slot 6 holds nothing yet (stale)
    bufs = jax.vmap(lambda b, i: b.record(jb.ReplaySample(item=None, indices=i)))(bufs, idx)
    for i in range(2):
        model = RingModel(CAP)
        model.add(CAP - 2)
        model.record(np.asarray(idx[i]))
        model.check(jax.tree.map(lambda x: x[i], bufs))
    bufs = jax.vmap(lambda b: b.add(_zeros(ITEM, (3,))))(bufs)  # slots 5, 6, 0: their counts reset
    np.testing.assert_array_equal(bufs.metrics.sample_count, [[0, 0, 0, 0, 1, 0, 0], [0, 1, 1, 2, 0, 0, 0]])


def test_without_per_slot_counts_the_other_counters_stay():
    buf = jb.TrajectoryBuffer.create(STEP, num_envs=E, length=L, metrics=False)
    buf = buf.add(_zeros(STEP, (E, 3)), terminated=jnp.zeros((E, 3), bool))
    assert buf.metrics.sample_count.shape == (0,)
    buf = buf.record(buf.sample_sequences(jax.random.key(0), 6, 2))
    s = buf.stats()
    assert s["samples"] == 6 and "sample_count" not in s
    with pytest.raises(TypeError, match="metrics"):
        jb.ReplayBuffer.create(ITEM, 4, metrics=1)
    from jaxbuffers.compressed import CompressedEpisodeBuffer
    off = CompressedEpisodeBuffer.create(PIXELS, max_episodes=2, max_timesteps=2, codec="zstd:1", metrics=False)
    assert not _metrics(off).per_slot and "sample_count" not in off.stats()
    off.close()


def test_per_position_counts_are_on_by_default():
    """Every buffer with positions keeps them unless `metrics=False`: the shape of its position grid, int32."""
    made = [jb.ReplayBuffer.create(ITEM, CAP), jb.PrioritisedReplayBuffer.create(ITEM, CAP),
            jb.TrajectoryBuffer.create(STEP, num_envs=E, length=L),
            jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=2),
            jb.EpisodeBuffer.create(STEP, max_episodes=EPS, max_timesteps=T)]
    shapes = [(CAP,), (CAP,), (E, L), (E, L), (EPS,)]
    for buf, shape in zip(made, shapes):
        m = _metrics(buf)
        assert m.per_slot and m.sample_count.shape == shape and m.sample_count.dtype == jnp.int32, type(buf).__name__
        assert buf.stats()["sample_count"] == {"positions_held": 0, "never_sampled": 0, "mean": None, "max": None}


def test_record_inside_a_donated_jitted_step_is_in_place():
    buf = jb.PrioritisedReplayBuffer.create(ITEM, 64, metrics=True).add(_zeros(ITEM, (64,)))

    def step(b, key):
        s = b.sample(key, 8)
        return b.add(_zeros(ITEM, (2,))).record(s)

    f = jax.jit(step, donate_argnums=0)
    buf = f(buf, jax.random.key(0))
    ptrs = [x.unsafe_buffer_pointer() for x in jax.tree.leaves(buf)]
    buf = f(buf, jax.random.key(1))
    assert [x.unsafe_buffer_pointer() for x in jax.tree.leaves(buf)] == ptrs
    assert buf.stats()["samples"] + buf.stats()["stale"] == 16


def test_record_refuses_what_is_not_a_sample():
    buf = jb.ReplayBuffer.create(ITEM, 4)
    with pytest.raises(TypeError, match="sample"):
        buf.record(jnp.arange(3))
    with pytest.raises(TypeError, match="sample.indices"):
        buf.record(jb.ReplaySample(item=None, indices=jnp.zeros(3)))
    with pytest.raises(ValueError, match="sample.indices"):
        buf.record(jb.ReplaySample(item=None, indices=jnp.zeros((3, 1), jnp.int32)))
    p = jb.PrioritisedReplayBuffer.create(ITEM, 4)
    s = p.sample(jax.random.key(0), 3)
    with pytest.raises(ValueError, match="sample.generations"):
        p.record(s._replace(generations=s.generations[:2]))


def test_stats_of_a_stacked_buffer_asks_for_one_member():
    bufs = jax.vmap(lambda _: jb.ReplayBuffer.create(ITEM, 4))(jnp.arange(2))
    with pytest.raises(ValueError, match="stacked"):
        bufs.stats()


def test_metrics_survive_a_checkpoint(tmp_path):
    for metrics in (True, False):
        buf = jb.PrioritisedTrajectoryBuffer.create(STEP, num_envs=E, length=L, window_length=2, metrics=metrics)
        buf = buf.add(_zeros(STEP, (E, 4)), terminated=jnp.zeros((E, 4), bool))
        buf = buf.record(buf.sample_sequences(jax.random.key(0), 6))
        jb.save(tmp_path / f"ck{metrics}", buf)
        got = jb.restore(tmp_path / f"ck{metrics}")
        assert got.stats() == buf.stats()
        assert _metrics(got).per_slot is metrics


@pytest.mark.parametrize("kind", ["replay", pytest.param("episode", marks=pytest.mark.slow), "compressed-trajectory"])
def test_a_checkpoint_written_without_per_position_counts_restores(kind, tmp_path):
    """A checkpoint whose buffer.json has no `metrics` (written when per-position counts were off by default, so it
    holds none) restores without them, its counters as saved; a target made with the default is refused naming
    `metrics`, one made with `metrics=False` takes it. A new checkpoint names `metrics` either way."""
    import json

    from jaxbuffers import _checkpoint_files as files

    create, add, sample, _ = KINDS[kind](metrics=False)
    buf = add(create(), 3)
    buf = buf.record(sample(buf, jax.random.key(0)))
    path = jb.save(tmp_path / "old", buf, progress=False)
    meta = json.loads((path / "buffer.json").read_text())
    assert meta["config"]["metrics"] is False
    del meta["config"]["metrics"]
    (path / "buffer.json").write_text(json.dumps(meta))
    files._write_manifest(path, files._Progress(False, ""))
    back = jb.restore(path)
    assert not _metrics(back).per_slot and back.stats() == buf.stats() and back.stats()["samples"] > 0
    default = KINDS[kind]()[0]()
    with pytest.raises(jb.CheckpointError, match="metrics.*metrics=False"):
        jb.restore(path, default)
    into = jb.restore(path, create())
    assert into.stats() == buf.stats()
    jb.save(tmp_path / "new", default, progress=False)
    assert json.loads((tmp_path / "new" / "buffer.json").read_text())["config"]["metrics"] is True
    for b in (buf, back, default, into):
        if hasattr(b, "host"):
            b.close()


def test_timing_counts_eager_calls_and_spans_but_not_traced_ones():
    buf = jb.ReplayBuffer.create(ITEM, 8)
    add = jax.jit(jb.ReplayBuffer.add)
    buf = add(buf, _zeros(ITEM, (2,)))  # compiled before the block
    with jb.timing() as t:
        buf = buf.add(_zeros(ITEM, (2,)))
        buf = buf.add(_zeros(ITEM, (2,)))
        buf = buf.record(buf.sample(jax.random.key(0), 4))
        buf = add(buf, _zeros(ITEM, (2,)))  # a user's own jit: traced already, no buffer call of its own
        with jb._timing.span("encode"):
            pass
    s = t.summary()
    assert {k: v["calls"] for k, v in s.items()} == {"ReplayBuffer.add": 2, "ReplayBuffer.record": 1,
                                                     "ReplayBuffer.sample": 1, "encode": 1}
    assert all(v["total_s"] >= v["max_s"] >= v["mean_s"] * 0 >= 0 for v in s.values())
    assert set(buf.stats(timing=t)["timing"]) == {"ReplayBuffer.add", "ReplayBuffer.record", "ReplayBuffer.sample"}
    buf = buf.add(_zeros(ITEM, (2,)))  # outside the block: not counted
    assert t.summary()["ReplayBuffer.add"]["calls"] == 2


def test_compressed_buffers_record_into_their_wrapped_buffer():
    pytest.importorskip("zstandard")
    step = {"obs": jnp.zeros((8, 8), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = jb.CompressedTrajectoryBuffer.create(step, num_envs=2, length=16, codec="zstd:1")
    for t in range(6):
        buf = buf.add({"obs": jnp.full((2, 8, 8), t, jnp.uint8), "action": jnp.zeros(2, jnp.int32),
                       "reward": jnp.zeros(2, jnp.float32)}, terminated=jnp.zeros(2, bool))
    sample = buf.sample_transitions(jax.random.key(0), 8, n_step=1, gamma=0.99)
    out = buf.record(sample)
    assert type(out) is jb.CompressedTrajectoryBuffer and out.host is buf.host
    assert out.stats() == out.buffer.stats() and out.stats()["samples"] == 8
    assert buf.stats()["samples"] == 0
