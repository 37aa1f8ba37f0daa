"""Tests of jaxbuffers.compressed._host: the host stores' versions under concurrent writers and
readers (every read returns the entries of the version it asked for, or raises
StaleBufferError), and write arguments refused before anything is written."""

from __future__ import annotations

import math

import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuffers.compressed import CompressedTrajectoryBuffer, StaleBufferError
from jaxbuffers.compressed._host import HostStores
from frame_stacks import stacked_chunk

FRAME = (6, 7)


def _frames(steps: np.ndarray) -> np.ndarray:
    """One frame per step number, every pixel the step (so a frame names the step that wrote it)."""
    return np.broadcast_to(np.asarray(steps, np.int32)[:, None, None], (len(steps), *FRAME)).copy()


class _Switching:
    """Run the threads with a tiny GIL switch interval, so they interleave between most bytecodes."""

    def __enter__(self):
        self.before = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)

    def __exit__(self, *exc):
        sys.setswitchinterval(self.before)


def _run_threads(targets, seconds: float, enough=None, limit: float = 60.0) -> None:
    """Run every `targets[i](stop)` in its own thread for `seconds`, and on until `enough()` holds
    (at most `limit` seconds in all: a loaded machine may starve a thread for a while); re-raise the
    first failure."""
    stop, errors = threading.Event(), []

    def guard(fn):
        try:
            fn(stop)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=guard, args=(fn,)) for fn in targets]
    with _Switching():
        for t in threads:
            t.start()
        stop.wait(seconds)
        deadline = time.monotonic() + limit - seconds
        while enough is not None and not stop.is_set() and not enough() and time.monotonic() < deadline:
            stop.wait(0.1)
        stop.set()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]


def _stress_host_stores(codec: str, seconds: float, writers: int = 2, readers: int = 3, num_slots: int = 6, least: int = 0) -> dict:
    """Writers add steps to a shared `HostStores` (each from the newest published state; a fork
    is refused), readers decode random slots of whichever state was published last and compare
    every frame with the step that state says the slot holds, for `seconds` and on until there were
    more than `least` writes and reads. Returns the counts."""
    host = HostStores(num_slots, codec, [FRAME, FRAME], [np.int32, np.int32], ["obs", "next_obs"])
    published = {"state": (0, np.full(num_slots, -1, np.int64))}  # (version, slot -> step), swapped whole
    counts = {"writes": 0, "forks": 0, "reads": 0, "stale": 0}
    publish = threading.Lock()

    def writer(seed):
        def run(stop):
            rng = np.random.default_rng(seed)
            while not stop.is_set():
                version, held = published["state"]
                step = version + 1
                slots = rng.choice(num_slots, size=int(rng.integers(1, 4)), replace=False)
                try:
                    host.write(np.int32(version), slots.astype(np.int32), np.ones(len(slots), bool), _frames([step] * len(slots)), _frames([step + 1] * len(slots)))
                except StaleBufferError:
                    counts["forks"] += 1
                    continue
                held = held.copy()
                held[slots] = step
                with publish:
                    published["state"] = (version + 1, held)
                counts["writes"] += 1
        return run

    def reader(seed):
        def run(stop):
            rng = np.random.default_rng(seed)
            while not stop.is_set():
                version, held = published["state"]
                ids = rng.integers(0, num_slots, size=(2, int(rng.integers(1, 8))))
                try:
                    obs, nxt = host.read(np.int32(version), ids[0], ids[1])[:2]  # store 0, both id arrays
                    outs = [[np.zeros((ids.shape[1], *FRAME), np.int32)] for _ in range(2)]
                    host.read_into(np.int32(version), [ids[0]], outs)  # the in-place read, every store
                    obs1 = outs[1][0]
                except StaleBufferError:
                    counts["stale"] += 1
                    continue
                for got, slot_ids, shift in ((obs, ids[0], 0), (nxt, ids[1], 0), (obs1, ids[0], 1)):
                    want = np.where(held[slot_ids] >= 0, held[slot_ids] + shift, 0)  # never written: zeros
                    np.testing.assert_array_equal(got[:, 0, 0], want, err_msg=f"version {version}: frames of another step")
                    assert (got == got[:, :1, :1]).all(), "a torn frame"
                counts["reads"] += 1
        return run

    def enough():
        return counts["writes"] > least and counts["reads"] > least

    _run_threads([writer(i) for i in range(writers)] + [reader(100 + i) for i in range(readers)], seconds, enough)
    return counts


@pytest.mark.parametrize("codec", ["none", "zstd:-1"])
def test_reads_see_their_version_or_raise_under_threads(codec):
    counts = _stress_host_stores(codec, seconds=2.0, least=20)
    assert counts["writes"] > 20 and counts["reads"] > 20, counts


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["none", "rle", "igzip:1", "zstd:-1"])
def test_reads_see_their_version_or_raise_under_threads_long(codec):
    counts = _stress_host_stores(codec, seconds=30.0, writers=3, readers=4, least=1000)
    assert counts["writes"] > 1000 and counts["reads"] > 1000, counts


def test_trajectory_samples_match_their_flags_under_threads():
    """A thread adding to a compressed trajectory buffer while others sample it: every sampled
    frame stack is the one of the step the sample's own fields name (the action carries the step
    number, every pixel of a step's frame is that number mod 251), or the sample raises."""
    k, n_slots, mod = 4, 16, 251
    ex = {"obs": jax.ShapeDtypeStruct((k, *FRAME), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    published = {"buf": CompressedTrajectoryBuffer.create(ex, num_envs=1, length=n_slots, frame_stack=k, codec="none")}
    add = jax.jit(CompressedTrajectoryBuffer.add)
    sample = jax.jit(lambda b, key: b.sample_transitions(key, 8, n_step=1, gamma=0.9))
    counts = {"writes": 0, "reads": 0, "stale": 0}
    no_end = jnp.zeros((1,), bool)

    def step(t):
        stack = _frames(np.maximum(np.arange(t - k + 1, t + 1), 0) % mod).astype(np.uint8)[None]  # reset padding
        return {"obs": jnp.asarray(stack), "action": jnp.asarray([t], jnp.int32), "reward": jnp.zeros(1)}

    for t in range(n_slots):  # compiled before the threads start, and sampleable
        published["buf"] = add(published["buf"], step(t), terminated=no_end)
    jax.block_until_ready(sample(published["buf"], jax.random.key(0)))

    def writer(stop):
        t = n_slots
        while not stop.is_set():
            published["buf"] = jax.block_until_ready(add(published["buf"], step(t), terminated=no_end))
            counts["writes"] += 1
            t += 1
            time.sleep(0.001 * (t % 2))  # every other rewrite waits: some samples finish between them

    def reader(seed):
        def run(stop):
            key = jax.random.key(seed)
            while not stop.is_set():
                buf = published["buf"]
                key, sub = jax.random.split(key)
                try:
                    s = jax.device_get(sample(buf, sub))
                except Exception as exc:  # the stale read surfaces from the callback wrapped by JAX
                    assert "rewritten" in str(exc), exc
                    counts["stale"] += 1
                    continue
                t = s.action.astype(np.int64)
                np.testing.assert_array_equal(s.obs[:, -1, 0, 0], t % mod, err_msg="obs of another step")
                np.testing.assert_array_equal(s.next_obs[:, -1, 0, 0], (t + 1) % mod, err_msg="next_obs of another step")
                np.testing.assert_array_equal(s.obs[:, 0, 0, 0], np.where(t >= k - 1, t - k + 1, 0) % mod)
                counts["reads"] += 1
        return run

    _run_threads([writer, reader(1), reader(2)], seconds=4.0)
    assert counts["writes"] > 20 and counts["reads"] > 5, counts


def test_write_refuses_mismatched_arrays_before_writing_anything():
    host = HostStores(4, "none", [FRAME, FRAME], [np.int32, np.int32], ["obs", "depth"])
    good = _frames([1, 2])
    slots, valid = np.array([0, 1], np.int32), np.ones(2, bool)
    host.write(np.int32(0), slots, valid, good, good)
    before = [s.get(np.arange(4), missing="zeros").copy() for s in host.stores], host.slot_version.copy()
    bad_cases = [
        ((good,), "expected 2 arrays"),
        ((good, good.astype(np.int16)), "depth: expected shape"),
        ((good, good[:1]), "depth: expected shape"),
        ((good[:, :3], good), "obs: expected shape"),
    ]
    for datas, match in bad_cases:
        with pytest.raises(ValueError, match=match):
            host.write(np.int32(1), slots, valid, *datas)
        assert host.version == 1 and host.num_writes == 1
        np.testing.assert_array_equal(host.slot_version, before[1])
        for s, b in zip(host.stores, before[0]):
            np.testing.assert_array_equal(s.get(np.arange(4), missing="zeros"), b)
    host.write(np.int32(1), slots, valid, good + 1, good)  # still usable
    assert host.version == 2


def test_concurrent_reads_decode_at_the_same_time(monkeypatch):
    """Two reads of one store are inside their decoders together (a read holds no lock while it
    decodes): each decode waits for the other at a barrier, which times out if reads take turns."""
    from host_codecs import NoneCodec

    host = HostStores(4, "none", [FRAME], [np.int32], ["obs"])
    host.write(np.int32(0), np.arange(4, dtype=np.int32), np.ones(4, bool), _frames([1, 2, 3, 4]))
    barrier, real = threading.Barrier(2, timeout=10), NoneCodec.decode_into

    def meeting(self, *args):
        barrier.wait()
        return real(self, *args)

    monkeypatch.setattr(NoneCodec, "decode_into", meeting)
    results, errors = [], []

    def read(slot):
        try:
            results.append(host.read(np.int32(1), np.array([slot]))[0][0, 0, 0])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(s,)) for s in (0, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert sorted(results) == [1, 4]


def test_a_stale_read_of_a_delta_whose_keyframe_was_rewritten_raises_stale():
    """A state reads slot 2, a delta on slots 1 and 0; a later write rewrites only the keyframe (slot 0). Reading
    slot 2 with the older version raises StaleBufferError (the chain's versions are checked), never a frame decoded
    against the newer keyframe, nor a checksum error."""
    host = HostStores(8, "zstd:-1", [FRAME], [np.int32], ["pixels"])
    v1 = host.write(np.int32(0), np.arange(3, dtype=np.int32), np.ones(3, bool), _frames([1, 2, 3]), bases=np.array([-1, 0, 1], np.int32))
    np.testing.assert_array_equal(host.read(v1, np.array([2]))[0], _frames([3]))
    host.write(v1, np.array([0], np.int32), np.ones(1, bool), _frames([9]), bases=np.array([-1], np.int32))
    with pytest.raises(StaleBufferError, match="rewritten"):
        host.read(v1, np.array([2]))
    outs = [[np.zeros((1, *FRAME), np.int32)]]
    with pytest.raises(StaleBufferError, match="rewritten"):
        host.read_into(v1, [np.array([2])], outs)


def test_host_bytes_report_live_payloads_and_arena_capacity_apart():
    ex = {"obs": jnp.zeros((4, 12, 10), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=2, length=50, frame_stack=4, codec="none")
    assert buf.host_live_nbytes == buf.host_nbytes - buf.host_arena_nbytes  # empty: no payload, no arena
    rng = np.random.default_rng(0)
    stacks, _ = stacked_chunk(rng.integers(0, 256, (2, 15, 12, 10), dtype=np.uint8), np.zeros((2, 15), bool), 4)
    for i in range(3):
        obs = jnp.asarray(stacks[:, 5 * i : 5 * i + 5])
        step = {"obs": obs, "action": jnp.zeros((2, 5), jnp.int32), "reward": jnp.zeros((2, 5))}
        buf = buf.add(step, terminated=jnp.zeros((2, 5), bool))
    payload = sum(s.payload_nbytes for s in buf.host.stores)
    assert payload == 30 * 120  # codec "none": 30 frames of 120 bytes, deltas as large as keyframes
    assert buf.host_live_nbytes == buf.host_nbytes - buf.host_arena_nbytes + payload
    assert buf.host_arena_nbytes >= payload


def test_host_bytes_count_the_frames_kept_decoded():
    """`host_nbytes` counts every byte the host holds: besides arenas, indexes and slot versions, the frames each
    lane's last `k - 1` steps wrote, kept for the next add's stack check (at most `2 E (k - 1)` per store), and the
    rows a delta put keeps for the next put's deltas; closing frees both."""
    e, k, frame = 3, 4, (12, 10)
    ex = {"obs": jnp.zeros((k, *frame), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(ex, num_envs=e, length=50, frame_stack=k, codec="none", keyframe_interval=30)
    host = buf.host
    assert host.recent_nbytes == 0 and all(s.recent_nbytes == 0 for s in host.stores)
    rng = np.random.default_rng(0)
    stacks, _ = stacked_chunk(rng.integers(0, 256, (e, 12, *frame), dtype=np.uint8), np.zeros((e, 12), bool), k)
    add = jax.jit(lambda b, s: b.add(s, terminated=jnp.zeros((e, s["obs"].shape[1]), bool)))
    # a chunk of k - 1 or more keeps each lane's last k - 1; later adds keep theirs too, up to 2 (k - 1) per lane
    for (a, b), per_lane in zip(((0, 5), (5, 6), (6, 7), (7, 12)), (k - 1, k, k + 1, 2 * (k - 1))):
        buf = add(buf, {"obs": stacks[:, a:b], "action": np.zeros((e, b - a), np.int32), "reward": np.zeros((e, b - a), np.float32)})
        assert host.recent_nbytes == e * per_lane * math.prod(frame)
        assert buf.host_nbytes == sum(s.nbytes for s in host.stores) + host.slot_version.nbytes + host.recent_nbytes
        store = host.stores[0]  # keeps the newest frame of each lane: the next put's first deltas are based on it
        assert store.recent_nbytes >= e * math.prod(frame)
        assert store.nbytes == store.arena_nbytes + store.index_nbytes + store.recent_nbytes
    assert e * (k - 1) * math.prod(frame) <= host.recent_nbytes <= 2 * e * (k - 1) * math.prod(frame)
    buf.close()
    assert host.recent_nbytes == 0 and host.stores[0].recent_nbytes == 0


def test_slot_versions_grow_with_the_slots_written():
    """`slot_version` holds the slots written (a slot past it reads as never written), grows with them, and takes
    back a saved copy of any length up to `num_slots` (older saves hold every slot)."""
    host = HostStores(100_000, "none", [FRAME], [np.int32], ["obs"])
    host.write(np.int32(0), np.arange(10, dtype=np.int32), np.ones(10, bool), _frames(np.arange(10)))
    assert host.slot_version.size <= 256
    host.read(np.int32(1), np.array([3, 99_999]))  # not stale: the far slot was never written
    host.write(np.int32(1), np.array([5000], np.int32), np.ones(1, bool), _frames([7]))
    assert 5000 < host.slot_version.size <= 1.25 * 5001 and host.slot_version[5000] == 2
    with pytest.raises(StaleBufferError):
        host.read(np.int32(1), np.array([5000]))
    full = np.zeros(100_000, np.int32)
    full[:5001] = host.slot_version[:5001]
    host.set_slot_versions(full, "saved")
    assert host.slot_version.size == 100_000 and host.slot_version[5000] == 2
    with pytest.raises(ValueError, match="saved: expected int32"):
        host.set_slot_versions(np.zeros(100_001, np.int32), "saved")
