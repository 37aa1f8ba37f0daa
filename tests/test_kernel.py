"""Tests of jaxbuffers._kernel: as_one_kernel runs the update exactly once, bit for bit;
map_entries gives the same values as a loop and vectorised; the per-call priority updates are
programs XLA's CPU client runs inline, and large one-step trajectory writes are not
(counted_as_work)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import pytest

from jaxbuffers import PrioritisedReplayBuffer, PrioritisedTrajectoryBuffer, ReplayBuffer, _kernel, _validate

ITEM = {"obs": jnp.zeros(17, jnp.float32), "action": jnp.zeros(6, jnp.float32), "done": jnp.bool_(False)}


def test_update_runs_exactly_once_eager_jit_vmap_scan():
    inc = lambda s: {"n": s["n"] + 1, "x": s["x"] * 2.0}  # noqa: E731 - applied twice would give n + 2
    state = {"n": jnp.int32(5), "x": jnp.float32(1.5)}
    fn = lambda s: _kernel.as_one_kernel(inc, s, s["n"])  # noqa: E731
    for f in (fn, jax.jit(fn)):
        out = f(state)
        assert int(out["n"]) == 6 and float(out["x"]) == 3.0
    stacked = {"n": jnp.array([0, 3, 2**31 - 1], jnp.int32), "x": jnp.ones(3, jnp.float32)}
    out = jax.jit(jax.vmap(fn))(stacked)  # batched trip count (the largest int32 too)
    np.testing.assert_array_equal(np.asarray(out["n"]), [1, 4, -(2**31)])
    np.testing.assert_array_equal(np.asarray(out["x"]), [2.0, 2.0, 2.0])
    out, _ = jax.jit(lambda s: jax.lax.scan(lambda c, _: (fn(c), None), s, None, length=7))(state)
    assert int(out["n"]) == 12 and float(out["x"]) == 1.5 * 2**7


FRAME = {"pixels": jnp.zeros((40, 40), jnp.uint8)}  # 1,600 bytes an item: over SMALL_LOOP_BYTES


def _batch(rng, b, item=ITEM):
    if item is FRAME:
        return {"pixels": jnp.asarray(rng.integers(0, 256, (b, 40, 40)), jnp.uint8)}
    return {
        "obs": jnp.asarray(rng.normal(size=(b, 17)), jnp.float32),
        "action": jnp.asarray(rng.normal(size=(b, 6)), jnp.float32),
        "done": jnp.asarray(rng.random(b) < 0.3),
    }


@pytest.mark.parametrize("item", [ITEM, FRAME], ids=["vector", "frame"])
def test_prioritised_add_equals_the_unwrapped_update_bit_for_bit(item):
    """The buffer's add (run as one kernel; batches over SMALL_LOOP_BYTES write their items
    outside it) and its body called directly give identical states, and the items sit where a
    plain ReplayBuffer puts them: batches on both sides of the threshold, with and without
    priorities, jitted with donation, past wrap-around."""
    rng = np.random.default_rng(0)
    wrapped = jax.jit(lambda b, x, p: b.add(x, p), donate_argnums=0)
    direct = jax.jit(lambda b, x, p: b._add(jax.tree.leaves(x)[0].shape[0], p, x), donate_argnums=0)
    a = PrioritisedReplayBuffer.create(item, 50, priority_exponent=0.6)
    d = PrioritisedReplayBuffer.create(item, 50, priority_exponent=0.6)
    ring = ReplayBuffer.create(item, 50)
    large = set()
    for step in range(40):
        b = int(rng.choice([1, 1, 3, 8, 16]))
        x = _batch(rng, b, item)
        large.add(_validate.tree_nbytes(x) > _kernel.SMALL_LOOP_BYTES)
        p = None if step % 3 == 0 else jnp.asarray(rng.uniform(0.1, 5.0, b), jnp.float32)
        a, d, ring = wrapped(a, x, p), direct(d, x, p), ring.add(x)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(d)):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    for u, v in zip(jax.tree.leaves(a.replay), jax.tree.leaves(ring)):
        np.testing.assert_array_equal(np.asarray(u)[: v.shape[0]], np.asarray(v))  # a's counters end with max_priority
    assert a.num_added() == d.num_added() > 50
    assert large == ({False, True} if item is ITEM else {True})  # both paths taken


def test_map_entries_loop_and_vectorised_agree():
    rng = np.random.default_rng(1)
    for n in (1, 2, 37):
        x = jnp.asarray(rng.normal(size=n), jnp.float32).at[0].set(jnp.nan)
        i = jnp.asarray(rng.integers(-3, n + 3, n), jnp.int32)
        fn = lambda k: jnp.where((i[k] >= 0) & ~jnp.isnan(x[k]), x[jnp.clip(i[k], 0, n - 1)] * 2.0, -1.0)  # noqa: E731
        loop = jax.jit(lambda: _kernel.map_entries(fn, n, scalar_loop=True))()
        vec = jax.jit(lambda: _kernel.map_entries(fn, n, scalar_loop=False))()
        assert loop.shape == (n,) and loop.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(loop), np.asarray(vec))
        np.testing.assert_array_equal(np.asarray(loop), np.asarray(jax.vmap(fn)(jnp.arange(n))))


@pytest.mark.usefixtures("cpu_paths_only")  # XLA:CPU's inline-execution rule
def test_set_priorities_of_256_is_a_cheap_program_on_cpu():
    """XLA's CPU client runs a program whose cost model counts under 1,000 flops on the calling
    thread and hands any other to a worker thread (tens of microseconds on a loaded 2-core
    machine). A 256-entry set_priorities must stay under it (it counted ~4,800 written as vector
    ops); so must flashbax's, the anchor (~580)."""
    buffers = [
        PrioritisedReplayBuffer.create(ITEM, 100_000, priority_exponent=0.6),
        PrioritisedTrajectoryBuffer.create({"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0)}, 8, 12_500, window_length=2, priority_exponent=0.6),
    ]
    i, p = jnp.zeros(256, jnp.int32), jnp.ones(256, jnp.float32)
    for buf in buffers:
        compiled = jax.jit(lambda b: b.set_priorities(i, p, i), donate_argnums=0).lower(buf).compile()
        flops = compiled.cost_analysis()["flops"]
        assert 0 < flops < 1000, (type(buf).__name__, flops)


def test_empty_set_priorities_is_a_no_op_and_bad_dtypes_are_named():
    empty_i, empty_p = jnp.zeros((0,), jnp.int32), jnp.zeros((0,), jnp.float32)
    step = {"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0)}
    prb = PrioritisedReplayBuffer.create(ITEM, 8).add(_batch(np.random.default_rng(0), 3))
    ptb = PrioritisedTrajectoryBuffer.create(step, 1, 8, window_length=2)
    for buf in (prb, ptb):
        for f in (lambda b: b.set_priorities(empty_i, empty_p, empty_i), jax.jit(lambda b: b.set_priorities(empty_i, empty_p, empty_i))):
            out = f(buf)
            for u, v in zip(jax.tree.leaves(out), jax.tree.leaves(buf)):
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
        two = jnp.zeros(2, jnp.int32)
        with pytest.raises(TypeError, match="indices: expected an integer"):
            buf.set_priorities(jnp.zeros(2), jnp.ones(2), two)
        with pytest.raises(TypeError, match="generations: expected an integer"):
            buf.set_priorities(two, jnp.ones(2), jnp.zeros(2))


@pytest.mark.usefixtures("cpu_paths_only")  # XLA:CPU's inline-execution rule
def test_large_one_step_trajectory_writes_are_asynchronous_programs_small_ones_inline():
    """counted_as_work: a per-call add of one Atari frame per lane (226 KB) counts >= 1,000 flops,
    so XLA's CPU client runs it asynchronously (the Python thread's next dispatch overlaps the
    copy); an add of small vector steps stays a cheap, inline program. The index is unchanged:
    the buffers equal those of the plain write (checked by every trajectory test), and here the
    head it returns."""
    from jaxbuffers import TrajectoryBuffer

    flops = {}
    for name, obs in (("atari", jnp.zeros((84, 84, 4), jnp.uint8)), ("vector", jnp.zeros(17, jnp.float32))):
        step = {"obs": obs, "action": jnp.int32(0), "reward": jnp.float32(0)}
        buf = TrajectoryBuffer.create(step, 8, 64, final_obs_capacity=4)
        batch = jax.tree.map(lambda x: jnp.ones((8,) + x.shape, x.dtype), step)
        add = jax.jit(lambda b, s: b.add(s, terminated=jnp.zeros(8, bool)))
        flops[name] = add.lower(buf, batch).compile().cost_analysis()["flops"]
        out = add(buf, batch)
        np.testing.assert_array_equal(np.asarray(out.storage["obs"][:, 0]), np.asarray(batch["obs"]))
        assert int(out.head) == 1
    assert flops["atari"] >= 1000 and flops["vector"] < 1000, flops
    # the same bits, floats' -0.0 and NaN payloads included, for any head >= 0
    bits = np.arange(_kernel.ASYNC_MIN_BYTES // 4, dtype=np.uint32) * np.uint32(2654435761)
    x = {"f": jnp.asarray(bits.view(np.float32)), "u": jnp.asarray(bits.view(np.uint8)[: bits.size])}
    for head in (0, 7, 2**31 - 1):
        out = jax.jit(_kernel.counted_as_work)(x, jnp.int32(head))
        np.testing.assert_array_equal(np.asarray(out["f"]).view(np.uint32), bits)
        np.testing.assert_array_equal(np.asarray(out["u"]), bits.view(np.uint8)[: bits.size])


def _every_path_scenario() -> list:
    """A fixed history on every device buffer whose code differs between XLA:CPU and other
    backends (the one-kernel adds, the walk vs the vectorised tree update, the chained vs the
    vectorised descent, the asynchronous one-step write): adds of 1, 8 and 40 items (past
    wrap-around), samples of 1, 5 and 100 (both descents), set_priorities with duplicates and
    stale generations, one-step trajectory adds of 41 KB (over ASYNC_MIN_BYTES) with truncations.
    Returns every sample and final state as numpy pytrees."""
    from jaxbuffers import TrajectoryBuffer

    rng = np.random.default_rng(1)
    out = []
    buf = PrioritisedReplayBuffer.create(ITEM, 50, priority_exponent=0.6)
    add = jax.jit(lambda b, x: b.add(x), donate_argnums=0)
    sample = jax.jit(lambda b, k, n: b.sample(k, n, 0.4), static_argnums=2)
    setp = jax.jit(lambda b, i, p, g: b.set_priorities(i, p, g), donate_argnums=0)
    for b in (1, 8, 3, 1, 40):
        buf = add(buf, _batch(rng, b))
    for n in (1, 5, 100):
        s = sample(buf, jax.random.key(n), n)
        out.append(s)
        stale = s.generations.at[0].add(1)  # the first entry is refused as stale
        buf = setp(buf, s.indices, jnp.asarray(rng.gamma(1.0, size=n), jnp.float32), stale)
        buf = add(buf, _batch(rng, 1))
    out.append(buf)

    step = {"obs": jnp.zeros((72, 72), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}  # 8 lanes: 41 KB an add
    lanes = lambda: {  # noqa: E731
        "obs": jnp.asarray(rng.integers(0, 256, (8, 72, 72)), jnp.uint8),
        "action": jnp.asarray(rng.integers(0, 4, 8), jnp.int32),
        "reward": jnp.asarray(rng.normal(size=8), jnp.float32),
    }
    flags = lambda p: jnp.asarray(rng.random(8) < p)  # noqa: E731
    tb = TrajectoryBuffer.create(step, 8, 12, final_obs_capacity=3)
    pb = PrioritisedTrajectoryBuffer.create(step, 8, 12, window_length=3, priority_exponent=0.6, final_obs_capacity=3)
    tadd = jax.jit(lambda b, s, te, tr, f: b.add(s, terminated=te, truncated=tr, final_obs=f), donate_argnums=0)
    for _ in range(20):
        s, te, tr = lanes(), flags(0.1), flags(0.2)
        final = lanes()["obs"]
        tb, pb = tadd(tb, s, te, tr, final), tadd(pb, s, te, tr, final)
    out.append(jax.jit(lambda b, k: b.sample_sequences(k, 100, 4))(tb, jax.random.key(7)))
    out.append(jax.jit(lambda b, k: b.sample_transitions(k, 100, n_step=2, gamma=0.9))(tb, jax.random.key(8)))
    psample = jax.jit(lambda b, k, n: b.sample_transitions(k, n, beta=0.4, gamma=0.9), static_argnums=2)
    for n in (1, 64, 100):
        s = psample(pb, jax.random.key(n), n)
        out.append(s)
        pb = setp(pb, s.indices, jnp.asarray(rng.gamma(1.0, size=n), jnp.float32), s.generations)
    out.extend([tb, pb])
    return [jax.tree.map(np.asarray, x) for x in out]


def test_accelerator_paths_give_the_cpu_paths_results_bit_for_bit():
    """The code paths taken on GPU/TPU (``_kernel.accelerator_paths``, run here on the CPU
    backend) give every sample and state of the CPU paths, bit for bit. Without an accelerator
    this is what checks them; ``pytest --accelerator-paths`` runs the whole suite on them."""
    before = _kernel.cpu_paths()  # False on GPU/TPU or under --accelerator-paths: then both runs take the same paths
    cpu = _every_path_scenario()
    with _kernel.accelerator_paths():
        assert not _kernel.cpu_paths()
        other = _every_path_scenario()
    assert _kernel.cpu_paths() == before
    assert len(cpu) == len(other)
    for a, b in zip(cpu, other):
        assert jax.tree.structure(a) == jax.tree.structure(b)
        for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            assert u.dtype == v.dtype and u.shape == v.shape
            np.testing.assert_array_equal(u.view(np.uint8) if u.dtype.kind == "f" else u, v.view(np.uint8) if v.dtype.kind == "f" else v)
