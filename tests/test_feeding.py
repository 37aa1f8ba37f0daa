"""Actors feeding a learner: 4 actor threads through one Writer, a learner thread sampling, under a time bound."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb

ITEM = {"obs": np.zeros((3,), np.float32), "action": np.int32(0), "reward": np.float32(0), "tag": np.zeros((2,), np.int32)}


def _item(uid: int) -> dict:
    """An item whose every field encodes `uid` (exact in float32 below 2**24)."""
    return {"obs": np.full((3,), uid, np.float32), "action": np.int32(uid), "reward": np.float32(uid),
            "tag": np.array([uid, -uid], np.int32)}


def _ids(item: dict) -> np.ndarray:
    """The uid of every sampled row; fails if any field of a row disagrees with the others (a torn item)."""
    uid = np.asarray(item["action"])
    obs, rew, tag = (np.asarray(item[k]) for k in ("obs", "reward", "tag"))
    torn = (obs != uid[:, None]).any(1) | (rew != uid) | (tag[:, 0] != uid) | (tag[:, 1] != -uid)
    assert not torn.any(), f"torn items: rows {np.flatnonzero(torn)[:5]}"
    return uid


def test_four_actors_and_a_learner_no_torn_data_ratio_held_clean_shutdown():
    steps, flush, batch, rho = 1_500, 16, 64, 2.0
    limiter = jb.BlockingRateLimiter(rho, min_size=256, error_buffer=256.0)
    server = jb.BufferServer(jb.ReplayBuffer.create(ITEM, capacity=2_048), rate_limiter=limiter, seed=1)
    writer = jb.Writer(server, flush_size=flush)
    errors, sampled = [], []

    def actor(a: int):
        try:
            for t in range(steps):
                writer.append(_item(a * 100_000 + t + 1), timeout=20)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    def learner():
        try:
            while True:
                sampled.append(_ids(server.sample(None, batch, timeout=20).item))
        except jb.BufferClosed:
            pass
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t0 = time.monotonic()
    actors = [threading.Thread(target=actor, args=(a,)) for a in range(4)]
    learn = threading.Thread(target=learner)
    for t in [*actors, learn]:
        t.start()
    for t in actors:
        t.join(60)
    # The learner has caught up when it has no room left; then shut down: it must leave with BufferClosed.
    deadline = time.monotonic() + 30
    while limiter.num_samples_allowed() >= batch:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    server.close()
    learn.join(10)
    assert not errors, errors
    assert not learn.is_alive() and not any(t.is_alive() for t in actors)
    assert time.monotonic() - t0 < 90
    assert limiter.num_inserted == 4 * steps and writer.num_pending == 0
    ids = np.concatenate(sampled)
    written = {a * 100_000 + t + 1 for a in range(4) for t in range(steps)}
    assert set(ids.tolist()) <= written and len({i // 100_000 for i in ids}) == 4
    # Samples-per-insert held: every item was inserted and the learner took rho per insert within the band.
    assert abs(len(ids) - rho * (4 * steps - 256)) <= 256 + batch
    with pytest.raises(jb.BufferClosed):
        writer.append(_item(1))


def test_blocked_learner_gets_a_clear_error_on_shutdown_and_on_timeout():
    limiter = jb.BlockingRateLimiter(1.0, min_size=10, error_buffer=4.0)
    server = jb.BufferServer(jb.ReplayBuffer.create(ITEM, capacity=64), rate_limiter=limiter)
    with pytest.raises(jb.RateLimiterTimeout, match="sample of 8 items"):
        server.sample(None, 8, timeout=0.1)
    caught = []
    t = threading.Thread(target=lambda: caught.append(pytest.raises(jb.BufferClosed, server.sample, None, 8, timeout=30)))
    t.start()
    time.sleep(0.1)
    server.close()
    t.join(5)
    assert not t.is_alive() and len(caught) == 1 and "closed while it waited" in str(caught[0].value)


def test_writer_batches_many_items_into_one_add_in_order():
    calls = []

    def add(buf, batch):
        calls.append(jax.tree.leaves(batch)[0].shape)
        return jb.ReplayBuffer.add(buf, batch)

    server = jb.BufferServer(jb.ReplayBuffer.create(ITEM, capacity=16), add=add)
    writer = jb.Writer(server, flush_size=4)
    for uid in range(1, 11):
        writer.append(_item(uid))
    assert writer.num_pending == 2
    writer.flush()
    buf = server.buffer()
    assert int(buf.size()) == 10 and np.asarray(buf.storage["action"][:10]).tolist() == list(range(1, 11))
    assert calls[0] == (4,)  # one traced add per batch shape
    with pytest.raises(ValueError, match="flush_size"):
        jb.Writer(server, flush_size=0)


def test_writer_refuses_a_flush_size_its_limiter_never_admits():
    # accepted, such a writer raised on every append and flush and kept its items pending for good
    lim = jb.BlockingRateLimiter(1.0, min_size=1, error_buffer=10.0)  # the band is 20 inserts wide
    server = jb.BufferServer(jb.ReplayBuffer.create(ITEM, capacity=64), rate_limiter=lim)
    with pytest.raises(ValueError, match=r"flush_size: an insert of 32 items .* more than the 20.0 the band ever leaves"):
        jb.Writer(server, flush_size=32)
    jb.Writer(server, flush_size=20)  # admitted once the learner has sampled 9 items ahead
    writer = jb.Writer(server, flush_size=11)
    for uid in range(1, 12):
        writer.append(_item(uid), timeout=5)
    assert writer.num_pending == 0 and int(server.buffer().size()) == 11


@pytest.mark.slow  # starts a local Ray cluster
def test_ray_actor_server_takes_numpy_pytrees_from_remote_actors():
    ray = pytest.importorskip("ray", reason="ray is not installed (the Ray integration is optional)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        limit = dict(samples_per_insert=1.0, min_size=8, error_buffer=64.0)
        with pytest.raises(TypeError, match=r"^rate_limit: unexpected keyword argument\(s\) \['samples_per_inserts'\]"):
            jb.ray_server(jb.ReplayBuffer.create(ITEM, capacity=256), rate_limit=dict(samples_per_inserts=1.0))  # no actor made
        server = jb.ray_server(jb.ReplayBuffer.create(ITEM, capacity=256), rate_limit=limit, seed=3)

        @ray.remote
        def actor(server, batches):  # a remote actor sends numpy pytrees
            for batch in batches:
                ray.get(server.add.remote(batch, 30))
            return len(batches)

        stack = lambda uids: jax.tree.map(lambda *xs: np.stack(xs), *map(_item, uids))  # noqa: E731
        work = [[stack(range(a * 1_000 + 8 * t + 1, a * 1_000 + 8 * t + 9)) for t in range(4)] for a in range(2)]
        assert ray.get([actor.remote(server, w) for w in work], timeout=120) == [4, 4]
        out = ray.get(server.sample.remote(None, 32, 30), timeout=60)
        ids = _ids(out.item)
        assert isinstance(out.item["obs"], np.ndarray) and set(ids.tolist()) <= {a * 1_000 + i + 1 for a in range(2) for i in range(32)}
    finally:
        ray.shutdown()


def _stack_batch(prev: int, newest: int) -> dict:
    """One step of one env whose 2-frame obs stack is `(prev, newest)` (4x4 frames of those values)."""
    obs = np.stack([np.full((4, 4), prev, np.uint8), np.full((4, 4), newest, np.uint8)])[None]
    return {"obs": obs, "action": np.zeros(1, np.int32), "reward": np.zeros(1, np.float32)}


def test_server_refused_stack_adds_nothing_counts_nothing_and_keeps_serving():
    step = {"obs": np.zeros((2, 4, 4), np.uint8), "action": np.int32(0), "reward": np.float32(0)}
    buf = jb.CompressedTrajectoryBuffer.create(step, num_envs=1, length=16, frame_stack=2, codec="zstd:3")
    lim = jb.BlockingRateLimiter(1.0, min_size=1, error_buffer=100.0)
    server = jb.BufferServer(buf, add=lambda b, x: b.add(x, terminated=np.zeros(1, bool)),
                             sample=lambda b, k, n: b.sample_sequences(k, n, 1), rate_limiter=lim)
    server.add(_stack_batch(1, 1))
    server.add(_stack_batch(1, 2))
    with pytest.raises(ValueError, match=r"step\['obs'\]: env 0, step 0 of the add is not the stack"):
        server.add(_stack_batch(7, 3))  # the previous frame is 2
    assert lim.num_inserted == 2 and int(server.buffer().size()) == 2
    server.add(_stack_batch(2, 3))  # the server still works, from the state before the refused batch
    assert lim.num_inserted == 3 and int(server.buffer().size()) == 3
    newest = np.asarray(server.sample(None, 8).item["obs"])[:, 0, -1, 0, 0]
    assert set(newest.tolist()) <= {1, 2, 3}


def test_server_over_a_read_only_folder_refuses_adds_and_keeps_serving(tmp_path):
    from jaxbuffers import disk

    step = {"obs": np.zeros((4, 4), np.uint8), "action": np.int32(0), "reward": np.float32(0)}
    made = jb.CompressedTrajectoryBuffer.create(step, num_envs=1, length=8, codec="none")
    batch = {"obs": np.full((1, 4, 4), 5, np.uint8), "action": np.zeros(1, np.int32), "reward": np.zeros(1, np.float32)}
    writer = disk.open(tmp_path / "run", "w", made).add(batch, terminated=np.zeros(1, bool))
    disk.flush(writer)
    writer.close()
    lim = jb.BlockingRateLimiter(1.0, min_size=0, error_buffer=100.0)
    server = jb.BufferServer(disk.open(tmp_path / "run", "r"), add=lambda b, x: b.add(x, terminated=np.zeros(1, bool)),
                             sample=lambda b, k, n: b.sample_sequences(k, n, 1), rate_limiter=lim)
    for _ in range(2):
        with pytest.raises(disk.ReadOnlyError, match="mode='r'"):
            server.add(batch)
    assert lim.num_inserted == 0 and lim.num_inserts_allowed() > 0 and int(server.buffer().size()) == 1
    assert (np.asarray(server.sample(jax.random.key(0), 2, timeout=5).item["obs"]) == 5).all()
    server.buffer().close()


def test_writer_add_that_times_out_keeps_the_accepted_items_and_one_deadline_bounds_the_call():
    lim = jb.BlockingRateLimiter(1.0, min_size=2, error_buffer=(2.0, 2.0))
    server = jb.BufferServer(jb.ReplayBuffer.create(ITEM, capacity=64), rate_limiter=lim)
    writer = jb.Writer(server, flush_size=2)
    for uid in range(1, 5):  # two adds; then the limiter admits no insert until the learner samples
        writer.append(_item(uid), timeout=5)
    writer.append(_item(5), timeout=5)
    with pytest.raises(jb.RateLimiterTimeout):
        writer.append(_item(6), timeout=0.05)
    assert writer.num_pending == 1 and lim.num_inserted == 4  # item 5 kept, item 6 not accepted
    with pytest.raises(jb.RateLimiterTimeout):
        writer.flush(timeout=0.05)
    assert writer.num_pending == 1
    server.sample(None, 4, timeout=5)  # room for inserts again
    writer.append(_item(6), timeout=5)
    buf = server.buffer()
    assert writer.num_pending == 0 and np.asarray(buf.storage["action"][:6]).tolist() == [1, 2, 3, 4, 5, 6]
    # The wait for the writer's lock is taken out of the add's timeout: one deadline for the call.
    waits, add = [], server.add
    server.add = lambda batch, timeout=None: (waits.append(timeout), add(batch, timeout))[1]
    writer.append(_item(7), timeout=10.0)
    writer._lock.acquire()  # another actor holds the writer for 0.5 s while item 8 completes a batch
    threading.Timer(0.5, writer._lock.release).start()
    writer.append(_item(8), timeout=10.0)
    assert len(waits) == 1 and waits[0] <= 10.0 - 0.3  # the timer starts before the call: a margin for the gap


def test_writer_keeps_what_was_appended_when_the_caller_refills_its_numpy_array():
    server = jb.BufferServer(jb.ReplayBuffer.create({"x": np.zeros(3, np.float32)}, capacity=8))
    writer = jb.Writer(server, flush_size=4)
    x = np.zeros(3, np.float32)
    for i in range(4):
        x[:] = i  # an actor reusing one observation array
        writer.append({"x": x})
    assert np.asarray(server.buffer().storage["x"][:4, 0]).tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("frame_stack", [None, 2])
def test_server_adds_to_a_compressed_buffer_equal_direct_adds_and_a_moved_store_is_still_refused(frame_stack):
    from jaxbuffers.compressed import StaleBufferError, _common

    k = frame_stack or 1
    obs = np.zeros((k, 4, 4) if frame_stack else (4, 4), np.uint8)
    step = {"obs": obs, "action": np.int32(0), "reward": np.float32(0)}

    def batch(t: int) -> dict:  # frame t of env 0, stacked over frames t-k+1..t (episode start repeated)
        frames = [np.full((4, 4), max(t - i, 1), np.uint8) for i in reversed(range(k))]
        return {"obs": (np.stack(frames) if frame_stack else frames[0])[None], "action": np.full(1, t, np.int32),
                "reward": np.full(1, t, np.float32)}

    add = lambda b, x: b.add(x, terminated=np.zeros(1, bool))  # noqa: E731
    make = lambda: jb.CompressedTrajectoryBuffer.create(step, num_envs=1, length=16, frame_stack=frame_stack, codec="zstd:3")  # noqa: E731
    server = jb.BufferServer(make(), add=add, sample=lambda b, key, n: b.sample_sequences(key, n, 2))
    direct = make()
    for t in range(1, 7):
        server.add(batch(t))
        direct = add(direct, batch(t))
        # The held state is its store's newest add: the next one is checked without waiting for this one.
        assert _common._newest_add[server._buffer.host][0] is server._buffer.version
    for seed in range(3):
        got = server.sample(jax.random.key(seed), 8)
        want = direct.sample_sequences(jax.random.key(seed), 8, 2)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert np.asarray(got.item["action"]).min() >= 1
    # A state copied out of the server and added to (under jit: no eager check remembers it) moves the store: the
    # server's state, still its newest eager add, is then refused, not forked.
    jax.block_until_ready(jax.jit(add)(server.buffer(), batch(7)))
    with pytest.raises(StaleBufferError, match="version 6 but its host store is at version 7"):
        server.add(batch(7))
    assert int(server.buffer().size()) == 6
    server.sample(jax.random.key(0), 8)
    direct.close()
    server.buffer().close()


def test_server_serves_a_prioritised_buffer_with_beta_and_priority_updates():
    """A learner anneals `beta` through `sample` and writes priorities back through `set_priorities`: the served
    buffer then samples by the new priorities, equal to the same calls on the buffer itself; a stale generation is
    skipped; a uniform buffer's server refuses `set_priorities`, a bad call changes nothing."""
    item = {"obs": np.zeros(3, np.float32)}
    batch = {"obs": np.arange(48, dtype=np.float32).reshape(16, 3)}
    ranks = np.arange(1.0, 17.0, dtype=np.float32)  # unequal priorities: the weights depend on beta
    direct = jb.PrioritisedReplayBuffer.create(item, capacity=16).add(batch, ranks)
    server = jb.BufferServer(jb.PrioritisedReplayBuffer.create(item, capacity=16), seed=0,
                             add=lambda b, x: b.add(x, jnp.arange(1.0, 17.0, dtype=jnp.float32)))
    server.add(batch)
    key = jax.random.key(3)
    s = server.sample(key, 8, beta=0.4)
    want = direct.sample(key, 8, beta=0.4)
    np.testing.assert_array_equal(s.importance_weights, want.importance_weights)
    assert not np.allclose(s.importance_weights, server.sample(key, 8, beta=1.0).importance_weights)  # beta arrived
    new = np.where(np.arange(8) == 0, 1000.0, 1e-3).astype(np.float32)
    server.set_priorities(s.indices, new, s.generations)
    direct = direct.set_priorities(s.indices, new, s.generations)
    np.testing.assert_array_equal(server.buffer().priorities(np.arange(16)), direct.priorities(np.arange(16)))
    assert int(np.asarray(server.buffer().priorities(s.indices[:1]))[0]) == 1000
    drawn = server.sample(jax.random.key(4), 256).indices  # the update reached what the server samples
    np.testing.assert_array_equal(drawn, direct.sample(jax.random.key(4), 256).indices)
    assert np.mean(np.asarray(drawn) == int(s.indices[0])) > 0.5
    before = server.buffer().priorities(np.arange(16))
    server.set_priorities(s.indices, np.full(8, 5.0, np.float32), np.asarray(s.generations) + 1)  # stale: skipped
    np.testing.assert_array_equal(server.buffer().priorities(np.arange(16)), before)
    with pytest.raises(TypeError, match="priorities"):
        server.set_priorities(s.indices, np.ones(8, np.int32), s.generations)
    with pytest.raises(ValueError, match="beta"):
        server.sample(key, 8, beta=-1.0)
    np.testing.assert_array_equal(server.buffer().priorities(np.arange(16)), before)
    step = {"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0)}
    traj = jb.BufferServer(jb.PrioritisedTrajectoryBuffer.create(step, num_envs=1, length=8, window_length=4),
                           add=lambda b, x: b.add(x, terminated=jnp.zeros(1, bool)),
                           sample=jb.PrioritisedTrajectoryBuffer.sample_transitions)  # n_step static, beta traced
    for _ in range(8):
        traj.add({"obs": np.ones((1, 2), np.float32), "action": np.zeros(1, np.int32), "reward": np.ones(1, np.float32)})
    assert np.asarray(traj.sample(key, 4, n_step=3, gamma=0.5, beta=0.4).num_steps).tolist() == [3] * 4
    with pytest.raises(ValueError, match="beta"):
        traj.sample(key, 4, gamma=0.5, beta=-1.0)
    uniform = jb.BufferServer(jb.ReplayBuffer.create(item, capacity=16))
    with pytest.raises(TypeError, match="set_priorities: the served ReplayBuffer has no priorities"):
        uniform.set_priorities(s.indices, new, s.generations)
    server.close()
    with pytest.raises(jb.BufferClosed):
        server.set_priorities(s.indices, new, s.generations)
