"""Tests of jaxbuffers.prioritised_trajectory: PrioritisedTrajectoryBuffer against the reference
model of test_trajectory.py (the tree holds exactly the valid windows), weights, priority policy."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_trajectory import ADD, EXAMPLE, FINAL_AT, OBS_DIM, PSEQ, PTRANS, SETP, Ref, do_add, host, make_chunk

from jaxbuffers import TrajectoryBuffer
from jaxbuffers.prioritised_trajectory import PrioritisedTrajectoryBuffer


def by_position(buf) -> jax.Array:
    """The tree leaf of every flat position `lane * length + slot`, in that order: leaf `slot * num_envs + lane`."""
    e, n = buf.buffer.num_envs, buf.buffer.length
    p = jnp.arange(e * n, dtype=jnp.int32)
    return (p % n) * e + p // n


def tree_leaves(buf) -> np.ndarray:
    """The tree's leaf of every flat position of a prioritised buffer (p^alpha at valid starts, else 0)."""
    return np.asarray(buf.tree.get(by_position(buf)))


def test_prioritised_sequences_final_obs_through_the_buffer():
    pbuf = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=2, length=6, window_length=3)
    rng = np.random.default_rng(5)
    ref = Ref(2, 6)
    for i in range(9):
        chunk = make_chunk(rng, 2, 1, i, p_term=0.2, p_trunc=0.5)
        pbuf = do_add(pbuf, ADD, *chunk, as_step=True)
        ref.add(*chunk)
    out = host(PSEQ(pbuf, jax.random.key(0), 32, 0.4))
    final = np.asarray(FINAL_AT(pbuf.buffer, out.indices, 3))
    np.testing.assert_array_equal(np.asarray(pbuf.final_obs_at(out.indices, 3)), final)
    for b in range(32):
        lane, a = ref.locate(out.indices[b])
        for i in range(3):
            s = ref.steps[lane][a + i]
            np.testing.assert_array_equal(final[b, i], s["final"] if s["trunc"] and not s["term"] else 0)






def _valid_starts(ref: Ref, window: int, period: int) -> set[int]:
    """Flat indices of valid positions (absolute period alignment)."""
    lo = ref.total - ref.num_valid
    return {
        e * ref.n + a % ref.n
        for e in range(ref.e) for a in range(lo, ref.total - window + 1) if a % period == 0
    }


@jax.jit
def _tree_reads(buf, key):
    """The tree's leaves and min, num_valid_windows, can_sample and 32 sampled sequences: one program per buffer."""
    return (buf.tree.get(by_position(buf)), buf.tree.min(),
            buf.num_valid_windows(), buf.can_sample(1), buf.sample_sequences(key, 32, beta=0.5))


def run_prioritised_model(data, free):
    # two fixed shapes (one lane with a long ring, three lanes with a short one): each window and
    # period compiles its adds for two shapes, not four
    num_envs, length = data.draw(st.tuples(st.integers(1, 3), st.integers(2, 8)) if free else st.sampled_from([(1, 7), (3, 4)]))
    window = data.draw(st.integers(1, length) if free else st.sampled_from([1, 3]))
    period = data.draw(st.integers(1, 3) if free else st.sampled_from([1, 2]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    buf = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=num_envs, length=length, window_length=window, period=period)
    ref = Ref(num_envs, length)
    add = ADD
    counter = 0
    for _ in range(data.draw(st.integers(1, 6))):
        t = data.draw(st.integers(1, length) if free else st.sampled_from(sorted({1, 2, length})))
        chunk = make_chunk(rng, num_envs, t, counter)
        counter += t
        buf = add(buf, {"obs": chunk[0], "action": chunk[1], "reward": chunk[2]}, *chunk[3:])
        ref.add(*chunk)
        valid = _valid_starts(ref, window, period)
        leaves, tree_min, num_windows, can, out = _tree_reads(buf, jax.random.key(counter))
        leaves = np.asarray(leaves)
        assert set(np.flatnonzero(leaves > 0).tolist()) == valid
        pos = leaves[leaves > 0]
        assert float(tree_min) == (pos.min() if pos.size else np.inf)  # min over valid windows only
        assert int(num_windows) == len(valid)
        assert bool(can) == bool(valid)
        if valid:
            out = host(out)
            assert set(np.asarray(out.indices).tolist()) <= valid
            for b in range(32):
                lane, a = ref.locate(out.indices[b])
                np.testing.assert_array_equal(out.item["obs"][b, 0], ref.steps[lane][a]["obs"])
                assert a + window <= ref.total


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_prioritised_tree_holds_exactly_the_valid_windows(data):
    run_prioritised_model(data, free=False)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_prioritised_tree_free_shapes(data):
    run_prioritised_model(data, free=True)


def _three_position_buffer():
    """1 lane, length 8, window 6, 8 steps added: valid positions are slots 0, 1, 2."""
    buf = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=8, window_length=6, priority_exponent=1.0)
    rng = np.random.default_rng(0)
    chunk = make_chunk(rng, 1, 8, 0, p_term=0, p_trunc=0)
    return ADD(buf, {"obs": chunk[0], "action": chunk[1], "reward": chunk[2]}, *chunk[3:])


def test_prioritised_importance_weights():
    buf = _three_position_buffer()
    gens = buf.generations.reshape(-1)[jnp.arange(3)]
    buf = SETP(buf, jnp.arange(3), jnp.array([1.0, 2.0, 4.0]), gens)
    out = host(PSEQ(buf, jax.random.key(0), 300, 0.4))
    idx = np.asarray(out.indices)
    assert set(idx.tolist()) == {0, 1, 2}
    np.testing.assert_allclose(np.asarray(out.probabilities), np.array([1, 2, 4])[idx] / 7, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.importance_weights), np.array([1.0, 0.757858, 0.574349])[idx], rtol=1e-5)
    # frequencies follow priorities (stratified: deterministic bands, so a loose bound suffices)
    freq = np.bincount(idx, minlength=3) / 300
    np.testing.assert_allclose(freq, [1 / 7, 2 / 7, 4 / 7], atol=0.02)


def test_prioritised_transitions_and_new_max_priority():
    buf = _three_position_buffer()
    gens = buf.generations.reshape(-1)[jnp.arange(3)]
    buf = SETP(buf, jnp.arange(3), jnp.array([1.0, 2.0, 9.0]), gens)
    assert float(buf.max_priority) == 9.0
    out = host(PTRANS(buf, jax.random.key(1), 16, 1.0, 0.9))
    assert out.n_step_return.shape == (16,) and set(np.asarray(out.indices).tolist()) <= {0, 1, 2}
    np.testing.assert_array_equal(out.num_steps, 1)  # n_step defaults to 1, as the uniform buffer's
    # a new step completes the window at slot 3 with the running max priority (9 ** alpha)
    rng = np.random.default_rng(5)
    c = make_chunk(rng, 1, 1, 8, p_term=0, p_trunc=0)
    buf = ADD(buf, {"obs": c[0], "action": c[1], "reward": c[2]}, *c[3:])
    leaves = np.asarray(tree_leaves(buf))
    np.testing.assert_array_equal(leaves, [0, 2, 9, 9, 0, 0, 0, 0])  # slot 0 overwritten, slot 3 new


def test_prioritised_stale_updates_ignored_and_policy():
    buf = _three_position_buffer()
    gens0 = buf.generations.reshape(-1)[jnp.arange(3)]
    rng = np.random.default_rng(1)
    # Overwrite slots 0..5 (6 steps): slots 0..2 become valid again only after more steps.
    c = make_chunk(rng, 1, 6, 8, p_term=0, p_trunc=0)
    buf = ADD(buf, {"obs": c[0], "action": c[1], "reward": c[2]}, *c[3:])
    before = np.asarray(tree_leaves(buf))
    after = SETP(buf, jnp.arange(3), jnp.array([5.0, 5.0, 5.0]), gens0)
    np.testing.assert_array_equal(np.asarray(tree_leaves(after)), before)  # stale: ignored
    # Valid positions now: logical starts 0..2 = absolute steps 6, 7, 8 = slots 6, 7, 0.
    assert set(np.flatnonzero(before).tolist()) == {6, 7, 0}
    # slot 0 is valid again but was rewritten: the old generation must not update it
    assert float(after.tree.get(jnp.array([0]))[0]) == before[0]
    cur = after.generations.reshape(-1)
    idx = jnp.array([6, 7, 0, 3])  # 3 is not a valid window: ignored
    after = SETP(after, idx, jnp.array([jnp.nan, -1.0, jnp.inf, 2.0]), cur[idx])
    leaves = np.asarray(tree_leaves(after))
    assert leaves[3] == 0
    assert leaves[6] == pytest.approx(1.0)  # NaN -> current max priority (1)
    assert leaves[7] == pytest.approx(1e-6)  # negative -> epsilon
    assert leaves[0] == pytest.approx(1e20, rel=1e-6)  # +inf -> PRIORITY_MAX (same policy as PrioritisedReplayBuffer)
    np.testing.assert_allclose(float(after.tree.total()), leaves.sum(), rtol=1e-6)


def test_prioritised_set_priorities_eager_uncompiled_and_jitted_agree():
    """The compiled eager call, the op-by-op function and a jitted call give the same tree and
    running max, with duplicates, stale entries, invalid windows and out-of-range indices."""
    rng = np.random.default_rng(5)
    buf = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=2, length=16, window_length=3, priority_exponent=0.7)
    for counter in range(0, 22, 11):
        obs, action, reward, term, trunc, final = make_chunk(rng, 2, 11, counter)
        buf = ADD(buf, {"obs": obs, "action": action, "reward": reward}, term, trunc, final)
    idx = jnp.asarray(rng.integers(-2, 34, 90), jnp.int32)  # duplicates, out of range, invalid windows
    gens = buf.generations.reshape(-1)[jnp.clip(idx, 0, 31)].at[::6].add(1)  # some stale
    pri = jnp.asarray(rng.uniform(0, 30, 90), jnp.float32).at[4].set(jnp.nan).at[8].set(-1.0)
    eager = buf.set_priorities(idx, pri, gens)
    plain = PrioritisedTrajectoryBuffer.set_priorities.uncompiled(buf, idx, pri, gens)
    jitted = SETP(buf, idx, pri, gens)
    for other in (plain, jitted):
        np.testing.assert_array_equal(tree_leaves(eager), tree_leaves(other))
        assert float(eager.max_priority) == float(other.max_priority) > 1.0
    before, after = tree_leaves(buf), tree_leaves(eager)
    assert set(np.flatnonzero(after > 0)) == set(np.flatnonzero(before > 0))  # no invalid window written
    assert not np.array_equal(before, after)


def test_prioritised_jit_scan_vmap():
    buf = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=2, length=6, window_length=3)
    rng = np.random.default_rng(2)
    chunks = [make_chunk(rng, 2, 1, i) for i in range(8)]
    xs = [np.stack([c[i][:, 0] for c in chunks]) for i in range(6)]

    def body(b, x):
        obs, action, reward, term, trunc, final = x
        return b.add({"obs": obs, "action": action, "reward": reward}, terminated=term, truncated=trunc, final_obs=final), None

    scanned, _ = jax.jit(lambda b, xs: jax.lax.scan(body, b, xs))(buf, xs)
    seq = buf
    for c in chunks:
        seq = do_add(seq, ADD, *c, as_step=True)
    jax.tree.map(np.testing.assert_array_equal, scanned, seq)
    many = jax.tree.map(lambda x: jnp.stack([x] * 2), scanned)
    out = jax.jit(jax.vmap(lambda b, k: b.sample_sequences(k, 8, beta=0.4)))(many, jax.random.split(jax.random.key(0), 2))
    assert out.item["obs"].shape == (2, 8, 3, OBS_DIM)
    upd = jax.jit(jax.vmap(lambda b, i, g: b.set_priorities(i, jnp.full(i.shape, 3.0), g)))(many, out.indices, out.generations)
    assert np.all(np.asarray(upd.max_priority) == 3.0)


def test_prioritised_weight_formula_matches_n_times_p():
    # w_i = (N P(i))^-beta / max_j (N P(j))^-beta, with N the number of valid positions.
    buf = _three_position_buffer()
    gens = buf.generations.reshape(-1)[jnp.arange(3)]
    buf = SETP(buf, jnp.arange(3), jnp.array([3.0, 1.0, 2.0]), gens)
    out = host(PSEQ(buf, jax.random.key(2), 64, 0.7))
    n = int(buf.num_valid_windows())
    assert n == 3
    p = np.array([3.0, 1.0, 2.0]) / 6
    w = (n * p) ** -0.7
    w = w / w.max()
    np.testing.assert_allclose(np.asarray(out.importance_weights), w[np.asarray(out.indices)], rtol=1e-5)
    assert math.isclose(float(np.asarray(out.probabilities).max()), 0.5, rel_tol=1e-6)


def test_prioritised_duplicates_last_wins_and_only_winners_raise_max():
    buf = _three_position_buffer()
    gens = buf.generations.reshape(-1)[jnp.array([1, 1, 2])]
    # slot 1 twice: 50 loses to 3; slot 2 gets 2. The running max must be 3, not 50.
    out = SETP(buf, jnp.array([1, 1, 2]), jnp.array([50.0, 3.0, 2.0]), gens)
    leaves = np.asarray(tree_leaves(out))
    np.testing.assert_allclose(leaves[:3], [1.0, 3.0, 2.0], rtol=1e-6)  # alpha = 1; slot 0 keeps max 1
    assert float(out.max_priority) == 3.0


def test_prioritised_argument_checks_match_the_item_buffer():
    buf = _three_position_buffer()
    with pytest.raises(ValueError, match="priority_exponent"):
        PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=8, window_length=2, priority_exponent=2.0)
    with pytest.raises(ValueError, match="beta"):
        buf.sample_sequences(jax.random.key(0), 4, beta=-1.0)
    with pytest.raises(ValueError, match="beta"):
        buf.sample_transitions(jax.random.key(0), 4, beta=float("nan"), gamma=0.9)
    empty = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=8, window_length=2)
    out = empty.sample_sequences(jax.random.key(0), 4, beta=0.4)
    np.testing.assert_array_equal(np.asarray(out.importance_weights), 1.0)  # as PrioritisedReplayBuffer
    np.testing.assert_array_equal(np.asarray(out.probabilities), 0.0)


def test_prioritised_alpha_zero_losing_duplicate_does_not_raise_max():
    buf = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=8, window_length=6, priority_exponent=0.0)
    chunk = make_chunk(np.random.default_rng(0), 1, 8, 0, p_term=0, p_trunc=0)
    buf = ADD(buf, {"obs": chunk[0], "action": chunk[1], "reward": chunk[2]}, *chunk[3:])
    gens = buf.generations.reshape(-1)[jnp.array([1, 1])]
    out = SETP(buf, jnp.array([1, 1]), jnp.array([100.0, 2.0]), gens)
    assert float(out.max_priority) == 2.0


def test_prioritised_create_arguments():
    buf = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=8, window_length=2, final_obs_capacity=3)
    assert buf.buffer.final_obs_capacity == 3
    assert PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=8).window_length == 2  # one-step transitions
    with pytest.raises(ValueError, match=r"n_step: expected 1 <= n_step <= window_length - 1 = 1, got 2"):
        PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=8).sample_transitions(jax.random.key(0), 2, n_step=2,
                                                                                            gamma=0.9)
    with pytest.raises(TypeError, match="positional"):
        PrioritisedTrajectoryBuffer.create(EXAMPLE, 1, 8, window_length=2)  # sizes are keywords
    with pytest.raises(ValueError, match="window_length: expected at most length=8"):
        PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=8, window_length=9)
    # one sum-tree leaf per position: refused before any storage is allocated
    with pytest.raises(ValueError, match=r"num_envs \* length: expected at most 2\*\*30 positions .* = 1073741832"):
        PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=8, length=2**27 + 1, window_length=2)


def test_prioritised_priorities_read_back_what_was_set():
    buf = _three_position_buffer()
    gens = buf.generations.reshape(-1)[jnp.arange(3)]
    buf = SETP(buf, jnp.arange(3), jnp.array([3.0, 0.5, 2.0]), gens)
    got = np.asarray(buf.priorities(jnp.array([0, 1, 2, 3, 7, -1, 8, 100])))
    # valid windows read their priority; slot 3 and 7 start no valid window, -1 / 8 / 100 are outside
    np.testing.assert_allclose(got, [3.0, 0.5, 2.0, 0, 0, 0, 0, 0], rtol=1e-6)
    half = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=8, window_length=6, priority_exponent=0.5)
    chunk = make_chunk(np.random.default_rng(0), 1, 8, 0, p_term=0, p_trunc=0)
    half = ADD(half, {"obs": chunk[0], "action": chunk[1], "reward": chunk[2]}, *chunk[3:])
    half = SETP(half, jnp.arange(3), jnp.array([3.0, 0.5, 2.0]), gens)
    np.testing.assert_allclose(np.asarray(half.priorities(jnp.arange(3))), [3.0, 0.5, 2.0], rtol=1e-6)
    with pytest.raises(TypeError, match="indices"):
        buf.priorities(jnp.array([1.0]))
    with pytest.raises(TypeError, match="indices"):
        buf.generations_at(jnp.array([1.0]))


def test_drop_in_for_the_uniform_buffer_and_flat_samples():
    """The same create sizes, add and sampler calls work on both buffers; the prioritised samples
    have the uniform fields (item is the stored step dict) plus the priority fields."""
    rng = np.random.default_rng(7)
    bufs = [TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=8), PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=2, length=8, window_length=3)]
    for i in range(6):
        c = make_chunk(rng, 2, 1, i)
        bufs = [do_add(b, ADD, *c, as_step=True) for b in bufs]
    uni, pri = bufs
    key = jax.random.key(0)
    su, sp = uni.sample_sequences(key, 4, 3), pri.sample_sequences(key, 4, 3)
    st_u, st_p = uni.sample_transitions(key, 4, n_step=2, gamma=0.9), pri.sample_transitions(key, 4, n_step=2, gamma=0.9)
    assert sp._fields[: len(su._fields)] == su._fields and st_p._fields[: len(st_u._fields)] == st_u._fields
    for s in (sp, st_p):
        assert s._fields[-3:] == ("probabilities", "importance_weights", "generations")
        assert set(s.item) == {"obs", "action", "reward"}
    assert sp.mask.shape == (4, 3) and sp.item["obs"].shape == (4, 3, OBS_DIM)
    # the sampled positions read back what the uniform reads return there
    jax.tree.map(np.testing.assert_array_equal, host(pri.buffer.sequences_at(sp.indices, 3))[:4], host(sp)[:4])
    assert bool(pri.can_sample(4, 3)) and bool(pri.can_sample_transitions(4, n_step=2))
    assert int(pri.size()) == int(uni.size()) == 12  # steps over all envs


def test_prioritised_eager_calls_compile_once_and_equal_jit(compile_counter):
    rng = np.random.default_rng(8)
    chunks = [make_chunk(rng, 2, 1, i) for i in range(8)]
    eager = jitted = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=2, length=6, window_length=3)
    calls = lambda b, k: (b.sample_sequences(k, 4, beta=0.5), b.sample_transitions(k, 4, gamma=0.9, beta=0.5), b.can_sample(4))  # noqa: E731
    jitted_calls = jax.jit(calls)
    for i, c in enumerate(chunks):
        if i == 4:
            counter = compile_counter()
            n = counter.__enter__()
        eager = eager.add({"obs": c[0][:, 0], "action": c[1][:, 0], "reward": c[2][:, 0]}, terminated=c[3][:, 0], truncated=c[4][:, 0], final_obs=c[5][:, 0])
        jitted = do_add(jitted, ADD, *c, as_step=True)
        if i >= 3:
            got, want = calls(eager, jax.random.key(i)), jitted_calls(jitted, jax.random.key(i))
            jax.tree.map(np.testing.assert_array_equal, host(got), host(want))
            s = got[0]
            eager = eager.set_priorities(s.indices, jnp.full(4, float(i)), s.generations)
            jitted = SETP(jitted, s.indices, jnp.full(4, float(i)), s.generations)
    counter.__exit__(None, None, None)
    assert n() == 0
    jax.tree.map(np.testing.assert_array_equal, eager, jitted)
    with pytest.raises(ValueError, match="beta"):
        eager.sample_sequences(jax.random.key(0), 4, beta=-0.5)


def test_num_added_and_a_too_long_chunk_name_the_buffer_sizes():
    """`num_added` as on the uniform buffer; a chunk longer than the lanes names `length`."""
    step = {"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = PrioritisedTrajectoryBuffer.create(step, num_envs=2, length=5, window_length=2)
    chunk = {"obs": jnp.zeros((2, 3, 2)), "action": jnp.zeros((2, 3), jnp.int32), "reward": jnp.zeros((2, 3))}
    for _ in range(3):
        buf = buf.add(chunk, terminated=jnp.zeros((2, 3), bool))
    assert buf.num_added() == 9 == buf.buffer.num_added()
    long = jax.tree.map(lambda x: jnp.concatenate([x, x], axis=1), chunk)
    for b in (buf, buf.buffer):
        with pytest.raises(ValueError, match=r"does not fit a ring of length 5; split it or create the buffer with length >= 6"):
            b.add(long, terminated=jnp.zeros((2, 6), bool))


def test_period_is_the_same_rule_in_the_uniform_and_prioritised_buffers():
    """`period` counts from the first step ever added in both buffers: once the ring wraps, the uniform buffer's
    window starts are the prioritised buffer's (they were re-anchored at the oldest stored step on every add), a
    stored step's eligibility never changes, and `period = window` gives fixed non-overlapping chunks."""
    length, window, period = 7, 2, 2
    u = TrajectoryBuffer.create(EXAMPLE, num_envs=1, length=length)
    p = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=1, length=length, window_length=window, period=period)
    every = jnp.arange(length, dtype=jnp.int32)
    for t in range(12):
        step = {"obs": np.zeros((1, OBS_DIM), np.float32), "action": np.array([t], np.int32), "reward": np.zeros(1, np.float32)}
        u, p = ADD(u, step, np.zeros(1, bool), None, None), p.add(step, terminated=np.zeros(1, bool))
        starts = np.asarray(u.valid_starts(every, window, period=period))
        np.testing.assert_array_equal(starts, np.asarray(p.priorities(every)) > 0)
        first = np.asarray(u.sequences_at(every, window).item["action"][:, 0])[starts]  # step numbers of the starts
        assert (first % period == 0).all() and len(first) == int(u.num_valid_windows(window, period=period))
        assert int(u.num_valid_windows(window, period=period)) == int(p.num_valid_windows())


def _filled_pair(steps=11, length=6, window=3, period=1, seed=11, p_term=0.25):
    rng = np.random.default_rng(seed)
    bufs = [TrajectoryBuffer.create(EXAMPLE, num_envs=2, length=length),
            PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=2, length=length, window_length=window, period=period)]
    for i in range(steps):
        c = make_chunk(rng, 2, 1, i, p_term=p_term, p_trunc=0.0)
        bufs = [do_add(b, ADD, *c, as_step=True) for b in bufs]
    return bufs


def test_truncate_last_keeps_the_tree_equal_to_the_valid_starts():
    """truncate_last on the prioritised buffer is the uniform one's on its steps, and afterwards the tree's nonzero
    leaves are exactly the valid window starts (it had no truncate_last)."""
    for period in (1, 2):
        uni, pri = _filled_pair(period=period)
        final = jnp.asarray(np.full((2, OBS_DIM), 7.5, np.float32))
        lanes = jnp.array([True, False])
        uni, pri = uni.truncate_last(lanes, final), pri.truncate_last(lanes, final)
        jax.tree.map(np.testing.assert_array_equal, host(pri.buffer), host(uni))
        positions = jnp.arange(2 * 6, dtype=jnp.int32)
        np.testing.assert_array_equal(tree_leaves(pri) > 0, np.asarray(pri.valid_starts(positions)))
        np.testing.assert_array_equal(np.asarray(pri.valid_starts(positions)),
                                      np.asarray(uni.valid_starts(positions, 3, period=period)))
        assert int(pri.num_valid_windows()) == int(np.sum(tree_leaves(pri) > 0)) == int(uni.num_valid_windows(3, period=period))
        # a sequence read through the prioritised buffer sees the truncation and its final observation
        newest = jnp.asarray([(int(uni.head) - 1) % 6], jnp.int32)
        assert bool(pri.sequences_at(newest, 1).truncated[0, 0]) and not bool(pri.final_obs_lost())
        np.testing.assert_array_equal(np.asarray(pri.transitions_at(newest, n_step=1, gamma=0.5).next_obs[0]), 7.5)


def test_reads_at_positions_and_static_fields_are_the_wrapped_buffers():
    uni, pri = _filled_pair()
    idx = jnp.array([2, 9, 4], jnp.int32)
    jax.tree.map(np.testing.assert_array_equal, host(pri.sequences_at(idx, 2)), host(uni.sequences_at(idx, 2)))
    jax.tree.map(np.testing.assert_array_equal, host(pri.sequences_at(idx)), host(uni.sequences_at(idx, 3)))  # window_length
    jax.tree.map(np.testing.assert_array_equal, host(pri.transitions_at(idx, gamma=0.9)),
                 host(uni.transitions_at(idx, gamma=0.9)))  # n_step 1 by default, as the uniform buffer's
    assert pri.step_spec == uni.step_spec
    for name in ("length", "final_obs_capacity", "obs_key", "action_key", "reward_key", "num_envs"):
        assert getattr(pri, name) == getattr(uni, name), name


def test_every_method_is_wrapped_and_the_delegating_properties_stay_properties():
    """The class decorator wraps every public method, the delegating ones included (stacked-state check, then host
    timing under the class's own name); the forwarded properties are properties with a docstring, which no
    decorator wraps (as the uniform buffer's), and read static values also on a stacked state."""
    import inspect

    import jaxbuffers as jb

    cls = PrioritisedTrajectoryBuffer
    methods = {n for n in dir(cls) if not n.startswith("_") and inspect.isfunction(inspect.getattr_static(cls, n))}
    assert {"final_obs_lost", "final_obs_at", "num_added", "truncate_last", "sequences_at", "add"} <= methods
    wrapped = {n for n in methods if all(getattr(getattr(cls, n), flag, False) for flag in ("one_member", "timed"))}
    assert methods - wrapped == {"replace"}  # flax's own copy: never wrapped
    _, pri = _filled_pair()
    stacked = jax.tree.map(lambda x: jnp.stack([x, x]), pri)
    for name in ("step_spec", "length", "final_obs_capacity", "obs_key", "action_key", "reward_key"):
        assert isinstance(inspect.getattr_static(cls, name), property) and inspect.getdoc(getattr(cls, name)), name
        if name != "step_spec":  # the spec of a stacked state's leaves has the member axis (as the uniform buffer's)
            assert getattr(stacked, name) == getattr(pri.buffer, name), name
    with pytest.raises(ValueError, match=r"^PrioritisedTrajectoryBuffer\.final_obs_lost: the state has a leading"):
        stacked.final_obs_lost()
    final = jnp.zeros((2, OBS_DIM), jnp.float32)
    pri.truncate_last(jnp.ones(2, bool), final)  # compiled outside the block
    with jb.timing() as t:
        pri.truncate_last(jnp.ones(2, bool), final)
        pri.final_obs_lost()
    assert {k: v["calls"] for k, v in t.summary().items()} == {
        "PrioritisedTrajectoryBuffer.truncate_last": 1, "PrioritisedTrajectoryBuffer.final_obs_lost": 1}


def test_sample_sequences_takes_period_and_cross_episodes():
    """period= is create's (others refused: the tree holds those windows); cross_episodes=False draws by priority
    among the windows with no episode end before their last step, with probabilities and weights of that set."""
    uni, pri = _filled_pair(steps=13, period=1)
    key = jax.random.key(3)
    jax.tree.map(np.testing.assert_array_equal, host(pri.sample_sequences(key, 8, period=1)), host(pri.sample_sequences(key, 8)))
    with pytest.raises(ValueError, match="period"):
        pri.sample_sequences(key, 8, period=2)
    with pytest.raises(ValueError, match="period"):
        pri.can_sample(8, period=2)
    positions = jnp.arange(12, dtype=jnp.int32)
    inside = np.asarray(uni.valid_starts(positions, 3, cross_episodes=False))
    assert 0 < inside.sum() < np.asarray(uni.valid_starts(positions, 3)).sum()  # some windows cross an episode end
    pri = pri.set_priorities(positions, jnp.arange(1.0, 13.0), pri.generations_at(positions))
    leaves = np.where(inside, tree_leaves(pri), 0)
    s = pri.sample_sequences(key, 512, cross_episodes=False, beta=0.5)
    idx = np.asarray(s.indices)
    assert inside[idx].all() and np.asarray(s.mask).all()  # every step in the first one's episode
    np.testing.assert_allclose(np.asarray(s.probabilities), leaves[idx] / leaves.sum(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(s.importance_weights), (leaves[idx] / leaves[inside].min()) ** -0.5, rtol=1e-5)
    freq = np.bincount(idx, minlength=12) / idx.size
    np.testing.assert_allclose(freq, leaves / leaves.sum(), atol=0.03)  # stratified: within a stratum of the due rate
    assert bool(pri.can_sample(1, cross_episodes=False))
    empty = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=2, length=6, window_length=3)
    assert not bool(empty.can_sample(1, cross_episodes=False))


# The ways PrioritisedTrajectoryBuffer takes TrajectoryBuffer's calls differently, each a consequence of the tree
# indexing one kind of window fixed at create (guide, section 1: the drop-in paragraph).
_WINDOW_FIXED_AT_CREATE = {
    # period defaults to create's (None); another period is refused by the samplers (the tree holds create's windows)
    ("sample_sequences", "period", "default None for 1"),
    ("can_sample", "period", "default None for 1"),
    ("valid_starts", "period", "default None for 1"),
    ("num_valid_windows", "period", "default None for 1"),
}


def test_a_drop_in_for_the_trajectory_buffer():
    """Every public method, property and static field of TrajectoryBuffer, with parameters that take its calls, but
    for the listed differences (truncate_last, final_obs_lost, transitions_at, sequences_at, valid_starts, step_spec,
    length were missing; sample_sequences refused period= and cross_episodes=)."""
    from test_prioritised import drop_in_differences

    assert drop_in_differences(TrajectoryBuffer, PrioritisedTrajectoryBuffer) == _WINDOW_FIXED_AT_CREATE


def test_reads_the_state_fields_of_the_trajectory_buffer():
    """`storage`, `terminated`, `truncated`, `final_obs`, `final_slot`, `final_head`, `head`, `num_valid`, `added`,
    `metrics` (and every other public field and property of TrajectoryBuffer) read the wrapped buffer's."""
    from test_prioritised import assert_reads_as_the_wrapped

    rng = np.random.default_rng(3)
    pri = PrioritisedTrajectoryBuffer.create(EXAMPLE, num_envs=2, length=8, window_length=3)
    for i in range(11):
        pri = do_add(pri, ADD, *make_chunk(rng, 2, 1, i, p_trunc=0.4), as_step=True)
    assert int(np.sum(pri.truncated)) > 0 and int(np.sum(pri.final_head)) > 0
    assert_reads_as_the_wrapped(pri, "buffer")
    assert pri.storage["obs"].shape == (2, 8, OBS_DIM) and pri.terminated.shape == (2, 8)


def test_a_traced_negative_beta_counts_as_zero():
    _, pri = _filled_pair(p_term=0.05)
    pri = pri.set_priorities(jnp.arange(12), jnp.arange(1.0, 13.0), pri.generations_at(jnp.arange(12)))
    assert np.sum(np.asarray(pri.valid_starts(jnp.arange(12), cross_episodes=False))) > 1
    for cross in (True, False):
        draw = jax.jit(lambda b, beta: b.sample_sequences(jax.random.key(2), 32, cross_episodes=cross, beta=beta))
        np.testing.assert_array_equal(np.asarray(draw(pri, -2.0).importance_weights), 1)
        assert np.asarray(draw(pri, 1.0).importance_weights).min() < 1
