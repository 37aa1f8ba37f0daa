"""CompressedStore: batches, indexing, mixed codecs, missing slots, accounting, compaction,
concurrency, and a model-based property test."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hc_helpers import assert_bit_exact
from host_codecs import CompressedStore, available_codecs, get_codec

HAVE = set(available_codecs())
needs_all = pytest.mark.skipif(
    not {"rle", "igzip", "zstd"} <= HAVE, reason="needs numba, isal and zstandard (codecs extra)"
)


def frames(n, seed=0):
    """Compressible uint8 [n, 84, 84] frames with a per-frame signature."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, 84, 84), np.uint8)
    for i in range(n):
        r = rng.integers(0, 70)
        out[i, r : r + 10] = i % 251
        out[i, :, rng.integers(0, 84)] = 255
    return out


@needs_all
def test_mixed_codecs_each_entry_decoded_with_its_own(atari_stacks):
    obs = atari_stacks["breakout_obs"][:40]
    store = CompressedStore(40, codec="rle")
    specs = ["rle", "igzip:1", "none", "zstd:3", "rle:16"]
    for k, spec in enumerate(specs):
        slots = np.arange(k, 40, len(specs))
        store.put(slots, obs[slots], codec=spec if spec != "rle" else None)
    assert store._codec.tolist() == [[1, 2, 0, 3, 1][i % 5] for i in range(40)]
    order = np.random.default_rng(0).permutation(40)
    assert_bit_exact(store.get(order), obs[order])
    per = store.stats()["codecs"]
    assert {k: v["entries"] for k, v in per.items()} == {"none": 8, "rle": 16, "igzip": 8, "zstd": 8}
    assert per["none"]["payload_ratio"] == 1.0


@needs_all
def test_store_with_other_default_decodes_entries():
    # The default codec only picks how new entries are written; decoding follows the tags.
    data = frames(6)
    for default in ("none", "igzip:0", "zstd:1"):
        store = CompressedStore(6, codec=default)
        store.put([0, 1, 2], data[:3], codec="rle")
        store.put([3, 4, 5], data[3:])
        assert_bit_exact(store.get(np.arange(6)), data)


def test_numpy_style_indexing():
    store = CompressedStore(10, codec="none")
    data = np.arange(10 * 6, dtype=np.int16).reshape(10, 2, 3)
    store[:] = data
    assert_bit_exact(store[3], data[3])
    assert_bit_exact(store[-1], data[9])
    assert_bit_exact(store[[1, 1, 4]], data[[1, 1, 4]])
    assert_bit_exact(store[2:8:3], data[2:8:3])
    assert_bit_exact(store[np.array([[0, 1], [2, 3]])], data[[[0, 1], [2, 3]]])
    store[4] = -data[4]
    assert_bit_exact(store[4], -data[4])
    assert len(store) == 10


def test_repeated_slots_last_write_wins():
    store = CompressedStore(5, codec="none")
    store.put([1, 2, 1], np.array([[1], [2], [3]], np.int32))
    assert store.get([1, 2]).ravel().tolist() == [3, 2]
    assert store.num_entries == 2


def test_missing_slots():
    store = CompressedStore(8, codec="none")
    store.put([2], np.ones((1, 3), np.float32))
    with pytest.raises(KeyError, match=r"never written.*\[0, 5\].*missing='zeros'"):
        store.get([0, 2, 5])
    got = store.get([0, 2, 5], missing="zeros")
    assert_bit_exact(got, np.array([[0, 0, 0], [1, 1, 1], [0, 0, 0]], np.float32))
    with pytest.raises(KeyError, match="shape is unknown"):
        store.get([0, 1], missing="zeros")
    declared = CompressedStore(8, codec="none", item_shape=(3,), dtype=np.float32)
    assert_bit_exact(declared.get([0, 1], missing="zeros"), np.zeros((2, 3), np.float32))
    store.delete([2])
    assert not store.written([2]).any()
    with pytest.raises(KeyError):
        store[2]
    with pytest.raises(ValueError, match="missing"):
        store.get([2], missing="nan")


def test_input_validation():
    store = CompressedStore(4, codec="none", item_shape=(2,), dtype=np.uint8)
    with pytest.raises(TypeError, match="integer slot ids"):
        store.put(np.array([0.0]), np.zeros((1, 2), np.uint8))
    with pytest.raises(IndexError, match="slot 4 out of range"):
        store.put([4], np.zeros((1, 2), np.uint8))
    with pytest.raises(ValueError, match="leading batch axis of 2"):
        store.put([0, 1], np.zeros((3, 2), np.uint8))
    with pytest.raises(ValueError, match=r"shape \(2,\) and dtype uint8, got shape \(2,\) and dtype float32"):
        store.put([0], np.zeros((1, 2), np.float32))
    free = CompressedStore(4, codec="none")
    with pytest.raises(TypeError, match="numeric dtype"):
        free.put([0], np.array([["a"]], dtype=object))
    with pytest.raises(TypeError, match="native byte order"):
        free.put([0], np.zeros((1, 2), ">f4"))
    free.put([0], np.zeros((1, 2), np.uint8))
    free.put([1], np.zeros((1, 3), np.uint8))
    with pytest.raises(ValueError, match="different dtypes/shapes"):
        free.get([0, 1])
    with pytest.raises(ValueError, match="num_slots"):
        CompressedStore(0)
    with pytest.raises(ValueError, match="unknown codec"):
        CompressedStore(4, codec="lzma")


def test_out_argument():
    store = CompressedStore(4, codec="none")
    data = np.arange(12, dtype=np.float64).reshape(4, 3)
    store[:] = data
    out = np.empty((2, 3), np.float64)
    assert store.get([3, 0], out=out) is out
    assert_bit_exact(out, data[[3, 0]])
    with pytest.raises(ValueError, match="out: expected"):
        store.get([3, 0], out=np.empty((2, 3), np.float32))


@pytest.mark.parametrize("spec", [s for s in ("zstd:-1", "rle", "igzip:1", "none") if s.split(":")[0] in HAVE])
def test_read_only_or_strided_out_is_refused_before_writing(spec):
    # The native kernels write through raw addresses: a read-only output (e.g. a read-only
    # memory map) must be refused up front, and left untouched.
    store = CompressedStore(4, codec=spec)
    store.put(np.arange(3), np.arange(36, dtype=np.float32).reshape(3, 3, 4) + 1)
    for ids in ([0, 1, 2], [0, 1, 1]):
        ro = np.zeros((3, 3, 4), np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="out: expected a writeable .*read-only"):
            store.get(np.array(ids), out=ro)
        assert not ro.any()
    strided = np.zeros((3, 3, 8), np.float32)[..., ::2]
    with pytest.raises(ValueError, match="not C-contiguous"):
        store.get(np.arange(3), out=strided)


@pytest.mark.parametrize("spec", sorted({"none", "rle", "igzip:1"} & {s.split(":")[0] for s in HAVE} | {"none"}))
def test_accounting(spec, atari_stacks):
    spec = {"igzip": "igzip:1"}.get(spec, spec)
    obs = atari_stacks["pong_obs"][:100]
    store = CompressedStore(1000, codec=spec)
    assert store.nbytes == store.index_nbytes and store.compression_ratio == 0.0
    store.put(np.arange(100), obs)
    s = store.stats()
    assert s["raw_nbytes"] == obs.nbytes == store.raw_nbytes
    assert s["payload_nbytes"] == int(store._length[:100].sum()) == store.payload_nbytes
    assert 28 * 100 <= s["index_nbytes"] < 28 * 1000  # 28 bytes per row, rows grown for the slots written only
    assert s["nbytes"] == s["arena_nbytes"] + s["index_nbytes"] == store.nbytes
    assert s["arena_nbytes"] == s["payload_nbytes"] + s["slack_nbytes"]
    assert s["slack_nbytes"] >= 0 and s["arena_nbytes"] <= 2 * s["payload_nbytes"] + (64 << 10)
    assert store.compression_ratio == pytest.approx(obs.nbytes / store.nbytes)
    assert s["codecs"][store.codec.name]["entries"] == 100
    # overwrite with the same data: same payload, more dead space until reclaimed
    store.put(np.arange(100), obs)
    assert store.payload_nbytes == s["payload_nbytes"]
    store.delete(np.arange(50))
    assert store.raw_nbytes == obs[50:].nbytes
    store.clear()
    s = store.stats()
    assert (s["entries"], s["payload_nbytes"], s["arena_nbytes"], s["codecs"]) == (0, 0, 0, {})


def test_fifo_overwrite_releases_chunks_without_compaction():
    data = frames(64)
    store = CompressedStore(256, codec="none", chunk_bytes=1 << 16, min_chunk_bytes=1 << 14)
    for step in range(40):
        slots = (np.arange(16) + 16 * step) % 256
        store.put(slots, data[(np.arange(16) + step) % 64])
    s = store.stats()
    live = 256 * 84 * 84
    assert s["payload_nbytes"] == live
    assert s["arena_nbytes"] <= live + 2 * (1 << 16)  # at most ~two partly used chunks extra
    assert s["compactions"] == 0


def test_random_overwrite_compacts_and_stays_correct():
    rng = np.random.default_rng(0)
    data = frames(50)
    store = CompressedStore(200, codec="none", chunk_bytes=1 << 15, min_chunk_bytes=1 << 12)
    model = {}
    for _ in range(300):
        slots = rng.choice(200, size=rng.integers(1, 9), replace=False)
        idx = rng.integers(0, 50, slots.size)
        store.put(slots, data[idx])
        model.update(zip(slots.tolist(), idx.tolist()))
    s = store.stats()
    assert s["compactions"] > 0
    assert s["dead_nbytes"] <= 0.25 * s["arena_nbytes"] + (1 << 15)
    keys = np.array(sorted(model))
    assert_bit_exact(store.get(keys), data[[model[k] for k in keys.tolist()]])


@pytest.mark.parametrize("spec", [s for s in ("rle", "igzip:0", "none") if s.split(":")[0] in HAVE])
def test_concurrent_writer_and_reader_never_see_torn_entries(spec):
    """A writer publishes versions 1..N of each slot (entry = the version everywhere); a reader
    must see constant entries whose version never goes backwards. Small chunks force chunk
    release and compaction while the reader runs."""
    num_slots, n_ops = 32, 3000
    store = CompressedStore(num_slots, codec=spec, chunk_bytes=1 << 14, min_chunk_bytes=1 << 12)
    store.put(np.arange(num_slots), np.zeros((num_slots, 16, 16), np.int32))
    errors: list[str] = []
    done = threading.Event()

    def writer():
        rng = np.random.default_rng(1)
        version = np.zeros(num_slots, np.int64)
        try:
            for _ in range(n_ops):
                slots = rng.choice(num_slots, size=rng.integers(1, 5), replace=False)
                version[slots] += 1
                batch = np.broadcast_to(version[slots, None, None], (slots.size, 16, 16)).astype(np.int32)
                store.put(slots, batch, codec=["none", spec][int(rng.integers(0, 2))])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(f"writer: {exc!r}")
        finally:
            done.set()

    def reader():
        rng = np.random.default_rng(2)
        seen = np.zeros(num_slots, np.int64)
        reads = 0
        try:
            while not done.is_set() or reads < 100:
                slots = rng.choice(num_slots, size=8, replace=False)
                got = store.get(slots)
                first = got[:, :1, :1]
                if not (got == first).all():
                    errors.append(f"torn entry in slots {slots.tolist()}")
                    return
                v = first.reshape(-1).astype(np.int64)
                if (v < seen[slots]).any():
                    errors.append("a slot went back to an older version")
                    return
                seen[slots] = v
                reads += 1
        except Exception as exc:  # pragma: no cover
            errors.append(f"reader: {exc!r}")

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert store.stats()["compactions"] + store.stats()["num_chunks"] > 1


@st.composite
def operations(draw):
    ops = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["put", "put", "delete", "get"]))
        slots = draw(st.lists(st.integers(-12, 11), min_size=0, max_size=6))
        ops.append((kind, slots, draw(st.integers(0, 2**31 - 1)), draw(st.sampled_from(["none", "rle", "igzip:0"]))))
    return ops


@settings(max_examples=30, deadline=None)
@given(ops=operations())
def test_model_based_against_a_dict(ops):
    """Random put/delete/get sequences against a plain dict; tiny chunks exercise compaction."""
    store = CompressedStore(12, codec="none", chunk_bytes=256, min_chunk_bytes=64)
    model: dict[int, np.ndarray] = {}
    for kind, slots, seed, spec in ops:
        norm = [s % 12 for s in slots]
        if kind == "put":
            rng = np.random.default_rng(seed)
            batch = (rng.integers(0, 3, (len(slots), 5, 4)) * rng.integers(0, 200)).astype(np.uint8)
            store.put(slots, batch, codec=spec if spec.split(":")[0] in HAVE else "none")
            for s, b in zip(norm, batch):
                model[s] = b
        elif kind == "delete":
            store.delete(slots)
            for s in norm:
                model.pop(s, None)
        else:
            present = [s for s in slots if s % 12 in model]
            if present:
                assert_bit_exact(store.get(present), np.stack([model[s % 12] for s in present]))
            absent = [s for s in slots if s % 12 not in model]
            if absent:
                with pytest.raises(KeyError):
                    store.get(absent)
        assert store.num_entries == len(model)
        assert store.raw_nbytes == 20 * len(model)
        s = store.stats()
        assert s["arena_nbytes"] - s["payload_nbytes"] == s["slack_nbytes"] >= 0


@pytest.mark.parametrize("threads", [1, 3])
def test_thread_count_does_not_change_results(threads, atari_stacks):
    import host_codecs

    obs = atari_stacks["pong_obs"][:96]
    try:
        host_codecs.set_num_threads(threads)
        assert host_codecs.num_threads() == threads
        for spec in [s for s in ("rle", "igzip:1", "zstd:1") if s.split(":")[0] in HAVE]:
            store = CompressedStore(96, codec=spec, chunk_bytes=1 << 14, min_chunk_bytes=1 << 12)
            store.put(np.arange(96), obs)
            assert_bit_exact(store.get(np.arange(96)[::-1]), obs[::-1])
    finally:
        host_codecs.set_num_threads(None)
    with pytest.raises(ValueError, match=r"^set_num_threads: expected an int in \[1, inf\], got 0$"):
        host_codecs.set_num_threads(0)


def test_set_num_threads_takes_a_numpy_int_as_every_int_argument():
    import host_codecs

    try:
        host_codecs.set_num_threads(np.int64(2))
        assert host_codecs.num_threads() == 2 and type(host_codecs.num_threads()) is int
    finally:
        host_codecs.set_num_threads(None)
    for bad in (True, 2.0, "2"):
        with pytest.raises(ValueError, match=rf"^set_num_threads: expected an int in \[1, inf\], got {re.escape(repr(bad))}$"):
            host_codecs.set_num_threads(bad)


def _codec_for(spec):
    """The codec named by ``spec``; skips the test when its package is not installed."""
    if spec.split(":")[0] not in HAVE:
        pytest.skip(f"{spec} not installed")
    return get_codec(spec)


def _spread_over_chunks(enc, chunk_of):
    """Copy the payloads of an EncodedBatch into arena-like chunks: payload ``i`` into chunk
    ``chunk_of[i]``, 8-byte aligned, not at the chunk's first byte. Returns (chunks, offsets)."""
    chunks, offsets = {}, np.zeros(len(chunk_of), np.int64)
    for c in np.unique(chunk_of).tolist():
        sel = np.flatnonzero(chunk_of == c)
        buf = np.zeros(int(sum((int(enc.lengths[i]) + 7) // 8 * 8 for i in sel)) + 64, np.uint8)
        pos = 16
        for i in sel.tolist():
            n = int(enc.lengths[i])
            buf[pos : pos + n] = enc.buffer[enc.offsets[i] : enc.offsets[i] + n]
            offsets[i], pos = pos, pos + (n + 7) // 8 * 8
        chunks[c] = buf
    return chunks, offsets


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_sharded_get_with_repeats_mixed_codecs_and_chunks(threads, atari_stacks):
    """A batch large enough to be split over threads (decode and the copies of repeated slots
    run in one shard per thread), with repeats, empty slots, two codecs and many arena chunks:
    every row equals the entry of its slot."""
    import host_codecs

    obs = atari_stacks["breakout_obs"][:120, -1]  # 84 x 84 frames: 7 KB each
    specs = [s for s in ("zstd:-1", "rle", "none") if s.split(":")[0] in HAVE]
    store = CompressedStore(130, codec=specs[0], chunk_bytes=1 << 14, min_chunk_bytes=1 << 12)
    for k, spec in enumerate(specs):
        slots = np.arange(k, 120, len(specs))
        store.put(slots, obs[slots], codec=spec)
    rng = np.random.default_rng(threads)
    slots = np.concatenate([rng.integers(0, 120, 300), [125, 3, 3, 126]])  # ~2 MB decoded, 2 empty
    rng.shuffle(slots)
    expect = np.where((slots < 120)[:, None, None], obs[np.minimum(slots, 119)], 0)
    try:
        host_codecs.set_num_threads(threads)
        assert store._chunk[:120].max() > 3  # the entries span several chunks
        assert_bit_exact(store.get(slots, missing="zeros"), expect)
        out = np.full((slots.size, 84, 84), 7, np.uint8)
        store.get(slots, missing="zeros", out=out)
        assert_bit_exact(out, expect)
    finally:
        host_codecs.set_num_threads(None)


def test_parallel_for_runs_the_shards_no_pool_thread_started_on_the_caller():
    """With every pool thread busy (blocked in two other batches), a batch still finishes: its caller runs the shard a
    pool thread would have run. A shard's error is raised on the caller once every shard has finished."""
    import host_codecs
    from host_codecs import parallel_for

    release, started = threading.Event(), threading.Semaphore(0)

    def blocking(a, b):
        started.release()
        assert release.wait(30)

    ran, done = [], threading.Event()

    def caller():
        parallel_for(2, lambda a, b: ran.append((threading.get_ident(), a, b)), work_bytes=1 << 30)
        done.set()

    from host_codecs import _pool

    try:
        host_codecs.set_num_threads(2)
        with _pool._LOCK:
            _pool._POOL = None  # a pool of exactly 2 threads (an earlier test of this process may have grown it)
        blockers = [threading.Thread(target=parallel_for, args=(2, blocking), kwargs={"work_bytes": 1 << 30}) for _ in range(2)]
        for t in blockers:
            t.start()
        for _ in range(4):  # both shards of both batches running: the pool's two threads are held
            assert started.acquire(timeout=30)
        t = threading.Thread(target=caller)
        t.start()
        assert done.wait(30)  # not held up by the busy pool
        assert sorted((a, b) for _, a, b in ran) == [(0, 1), (1, 2)] and {i for i, _, _ in ran} == {t.ident}
        release.set()
        for b in blockers:
            b.join(30)

        def failing(a, b):
            if a == 1:
                raise RuntimeError("shard 1 failed")
            ran.append(a)

        ran.clear()
        with pytest.raises(RuntimeError, match="shard 1 failed"):
            parallel_for(2, failing, work_bytes=1 << 30)
        assert ran == [0]  # the other shard ran to its end
    finally:
        release.set()
        host_codecs.set_num_threads(None)


def test_nested_parallel_for_runs_inline():
    """parallel_for called from inside a shard runs its whole range on that thread, once."""
    import host_codecs
    from host_codecs import parallel_for

    seen, outer = [], []
    lock = threading.Lock()

    def inner(a, b):
        with lock:
            seen.append((threading.get_ident(), a, b))

    def body(a, b):
        with lock:
            outer.append((threading.get_ident(), a, b))
        parallel_for(10, inner, work_bytes=1 << 30)

    try:
        host_codecs.set_num_threads(2)  # two shards also where the process may use one CPU only
        parallel_for(4, body, work_bytes=1 << 30)
        assert sorted((a, b) for _, a, b in outer) == [(0, 2), (2, 4)]
        assert sorted((a, b) for _, a, b in seen) == [(0, 10), (0, 10)]  # one inline call per shard
        assert {t for t, _, _ in seen} == {t for t, _, _ in outer}  # on the shard's own thread
        parallel_for(10, inner, work_bytes=1 << 30)  # top level again: sharded
    finally:
        host_codecs.set_num_threads(None)
    assert len(seen) == 4
    # A batch too small to split runs inline as one shard, and what it calls stays inline (the
    # store's read decides once for the decode and the copies it contains).
    seen.clear()
    try:
        host_codecs.set_num_threads(2)
        parallel_for(4, lambda a, b: parallel_for(10, inner, work_bytes=1 << 30), work_bytes=1 << 10)
        assert [(a, b) for _, a, b in seen] == [(0, 10)] and seen[0][0] == threading.get_ident()
        parallel_for(10, inner, work_bytes=1 << 30)  # the flag is restored: sharded again
        assert len(seen) == 3
    finally:
        host_codecs.set_num_threads(None)


@pytest.mark.parametrize("threads", [1, 2])
def test_get_many_decodes_each_slot_once_into_separate_outputs(threads, atari_stacks):
    """get_many: several slot arrays (shapes S_j), each into its own output; slots repeated within
    and across the arrays, empty slots, two codecs, many arena chunks, given and fresh outputs."""
    import host_codecs

    frames_ = atari_stacks["pong_obs"][:90, -1]
    specs = [s for s in ("zstd:-1", "rle", "igzip:0", "none") if s.split(":")[0] in HAVE]
    store = CompressedStore(100, codec=specs[0], chunk_bytes=1 << 13, min_chunk_bytes=1 << 12)
    for k, spec in enumerate(specs[:2]):
        sl = np.arange(k, 90, 2)
        store.put(sl, frames_[sl], codec=spec)
    rng = np.random.default_rng(threads)
    starts = rng.integers(0, 86, 40)
    obs_ids = starts[:, None] + np.arange(4)[None]  # [40, 4] stacks
    next_ids = obs_ids + 1  # shares 3 of 4 frames with obs_ids
    extra = np.array([[95, 3], [3, 3]])  # 95: empty
    ids = [obs_ids, next_ids, extra]

    def want(x):
        return np.where((x < 90)[..., None, None], frames_[np.minimum(x, 89)], 0)

    try:
        host_codecs.set_num_threads(threads)
        got = store.get_many(ids, missing="zeros")
        outs = [np.full(x.shape + (84, 84), 9, np.uint8) for x in ids]
        back = store.get_many(ids, missing="zeros", outs=outs)
    finally:
        host_codecs.set_num_threads(None)
    for x, g, o, b in zip(ids, got, outs, back):
        assert b is o
        assert_bit_exact(g, want(x))
        assert_bit_exact(o, want(x))
    with pytest.raises(KeyError, match="never written"):
        store.get_many(ids)
    with pytest.raises(ValueError, match="one per slot array"):
        store.get_many(ids, outs=outs[:2])
    with pytest.raises(ValueError, match=r"outs\[1\]: expected a writeable C-contiguous array of shape \(40, 4, 84, 84\)"):
        store.get_many(ids, missing="zeros", outs=[outs[0], outs[1][:, :2], outs[2]])
    empty = store.get_many([np.zeros(0, np.int64), obs_ids[:2]])
    assert empty[0].shape == (0, 84, 84) and empty[1].shape == (2, 4, 84, 84)


@pytest.mark.parametrize("spec", ["zstd:-1", "rle", "igzip:1", "none"])
def test_decode_many_into_several_outputs(spec, atari_stacks):
    """Codec.decode_many (payloads over several chunks, entries to rows of several outputs)
    equals decoding every payload on its own; rows and payload ranges are checked first."""
    codec = _codec_for(spec)
    rows = atari_stacks["breakout_obs"][:30, -1].reshape(30, -1)
    enc = codec.encode_batch(rows, np.uint8)
    rng = np.random.default_rng(1)
    chunk_of = rng.choice([1, 4], size=30)
    chunks, offsets = _spread_over_chunks(enc, chunk_of)
    outs = [np.zeros((12, rows.shape[1]), np.uint8), np.zeros((25, rows.shape[1]), np.uint8)]
    out_ids = np.array([0] * 12 + [1] * 18, np.int64)
    dest = np.concatenate([rng.permutation(12), rng.permutation(25)[:18]]).astype(np.int64)
    codec.decode_many(chunks, chunk_of, offsets, enc.lengths, enc.meta, outs, out_ids, dest, np.uint8)
    for i in range(30):
        np.testing.assert_array_equal(outs[out_ids[i]][dest[i]], rows[i])
    bad = dest.copy()
    bad[3] = 12  # past the end of output 0
    with pytest.raises(ValueError, match="row index out of range"):
        codec.decode_many(chunks, chunk_of, offsets, enc.lengths, enc.meta, outs, out_ids, bad, np.uint8)
    too_long = enc.lengths.astype(np.int64).copy()
    too_long[7] = chunks[chunk_of[7]].shape[0]  # runs past the end of its own chunk
    with pytest.raises(ValueError, match="payload index out of range"):
        codec.decode_many(chunks, chunk_of, offsets, too_long, enc.meta, outs, out_ids, dest, np.uint8)


def test_get_many_argument_errors_leave_outputs_untouched():
    store = CompressedStore(4, codec="none")
    store.put([0, 1], np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="slot_arrays: expected at least one array"):
        store.get_many([])
    good = np.full((2, 3), 5, np.float32)
    with pytest.raises(TypeError, match=r"outs\[1\]: expected a numpy array, got list"):
        store.get_many([[0, 3], [1]], missing="zeros", outs=[good, [[0.0, 0.0, 0.0]]])
    with pytest.raises(ValueError, match=r"outs\[1\]: expected a writeable"):
        store.get_many([[0, 3], [1]], missing="zeros", outs=[good, np.zeros((2, 3), np.float32)])
    assert (good == 5).all()  # slot 3 is empty, but outs[0] was not zeroed: the call failed first



@pytest.mark.parametrize("threads", [1, 2])
def test_a_corrupt_entry_is_reported_before_planning_errors_and_nothing_is_written(threads):
    """A corrupt entry is reported before what the rest of the read would refuse (here a wrong `out` dtype), and an
    output is not written (not even the zeros of an empty slot) when an entry is corrupt, with one thread or two."""
    import host_codecs
    from host_codecs import CorruptEntryError

    try:
        host_codecs.set_num_threads(threads)
        store = CompressedStore(8, codec="rle", item_shape=(64,), dtype=np.uint8, name="obs")
        store.put(np.arange(4), np.arange(4 * 64, dtype=np.uint8).reshape(4, 64))
        store.put(np.arange(4, 6), np.arange(2 * 64, dtype=np.uint8).reshape(2, 64), bases=[2, 4])
        store._check[5] ^= 1  # the delta at the end of a chain
        out = np.full((4, 64), 7, np.uint8)
        with pytest.raises(CorruptEntryError, match=r"slots \[5\] are corrupt"):
            store.get([0, 5, 7, 5], missing="zeros", out=np.zeros((4, 64), np.int8))
        with pytest.raises(CorruptEntryError, match=r"slots \[5\] are corrupt"):
            store.get([0, 5, 7, 5], missing="zeros", out=out)
        assert (out == 7).all()
        store._check[5] ^= 1
        store.get([0, 5, 7, 5], missing="zeros", out=out)
        assert_bit_exact(out[[0, 2]], np.stack([np.arange(64, dtype=np.uint8), np.zeros(64, np.uint8)]))
        assert_bit_exact(out[[1, 3]], np.stack([np.arange(64, 128, dtype=np.uint8)] * 2))  # deltas read as put
    finally:
        host_codecs.set_num_threads(None)


@pytest.mark.parametrize("spec", [s for s in ("zstd:-1", "rle", "igzip:1", "none") if s.split(":")[0] in HAVE])
def test_codecs_refuse_rows_and_ranges_out_of_bounds(spec):
    """decode_into / decode_many check rows (also negative ones) and payload ranges before their
    kernels write or read without bounds checks."""
    codec = _codec_for(spec)
    rows = np.arange(4 * 64, dtype=np.uint8).reshape(4, 64)
    enc = codec.encode_batch(rows, np.uint8)
    chunk = np.zeros(-(-enc.buffer.size // 8) * 8, np.uint8)
    chunk[: enc.buffer.size] = enc.buffer
    for bad in ([0, 1, 2, 4], [0, -1, 2, 3]):
        out = np.zeros((4, 64), np.uint8)
        with pytest.raises(ValueError, match="row index out of range"):
            codec.decode_into(chunk, enc.offsets, enc.lengths, enc.meta, out, np.array(bad, np.int64), np.uint8)
        assert not out.any()
    read_only = np.zeros((4, 64), np.uint8)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        codec.decode_into(chunk, enc.offsets, enc.lengths, enc.meta, read_only, np.arange(4), np.uint8)
    too_long = enc.lengths.astype(np.int64) + chunk.shape[0]
    with pytest.raises(ValueError, match="payload index out of range"):
        codec.decode_into(chunk, enc.offsets, too_long, enc.meta, np.zeros((4, 64), np.uint8), np.arange(4), np.uint8)
    with pytest.raises(ValueError, match="output index out of range"):
        codec.decode_many({0: chunk}, np.zeros(4, np.int64), enc.offsets, enc.lengths, enc.meta,
                          [np.zeros((4, 64), np.uint8)], np.array([0, 0, 1, 0]), np.arange(4), np.uint8)


@st.composite
def read_requests(draw):
    """Written slots (some left empty) and a read of several slot arrays with repeats."""
    num_slots = draw(st.integers(1, 30))
    written = draw(st.lists(st.integers(0, num_slots - 1), unique=True, min_size=1))
    sizes = draw(st.lists(st.integers(0, 20), min_size=1, max_size=4))
    hot = draw(st.lists(st.integers(-num_slots, num_slots - 1), min_size=1, max_size=8))  # few ids: repeats
    arrays = [np.array([draw(st.sampled_from(hot)) for _ in range(n)], np.int64) for n in sizes]
    return num_slots, written, arrays


@settings(max_examples=100, deadline=None)
@given(req=read_requests())
def test_get_many_decodes_each_distinct_slot_once(req):
    """Each distinct written slot of a read is decoded once, whatever its repeats within and
    across the slot arrays; every position holds its slot's entry, empty slots zeros."""
    from host_codecs import NoneCodec

    num_slots, written, arrays = req
    store = CompressedStore(num_slots, codec="none", item_shape=(2, 3), dtype=np.int16)
    data = np.arange(num_slots * 6, dtype=np.int16).reshape(num_slots, 2, 3) + 1
    store.put(written, data[written])
    decoded = []
    real = NoneCodec.decode_into
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NoneCodec, "decode_into", lambda self, c, o, n, m, out, rows, dt: (decoded.extend(rows.tolist()), real(self, c, o, n, m, out, rows, dt))[1])
        got = store.get_many(arrays, missing="zeros")
    ids = np.concatenate(arrays) % num_slots
    assert len(decoded) == len(set(ids.tolist()) & set(written))
    for x, g in zip(arrays, got):
        want = np.where(np.isin(x % num_slots, written)[:, None, None], data[x % num_slots], 0)
        assert_bit_exact(g, want.astype(np.int16))


@pytest.mark.skipif("zstd" not in HAVE, reason="needs zstandard")
def test_a_flipped_byte_in_a_stored_zstd_payload_raises(atari_stacks):
    frames_ = atari_stacks["pong_obs"][:8, -1]
    store = CompressedStore(8, codec="zstd:3")
    store.put(np.arange(8), frames_)
    c, o, n = int(store._chunk[5]), int(store._offset[5]), int(store._length[5])
    store._chunks[c].data[o + n // 2] ^= 0x5A  # a byte in the middle of slot 5's frame
    assert_bit_exact(store.get([0, 4, 6]), frames_[[0, 4, 6]])
    with pytest.raises(ValueError, match=r"slots \[5\] are corrupt \(checksum mismatch\)"):
        store.get(np.arange(8))


def test_unsigned_ids_past_int64_are_refused_not_wrapped():
    store = CompressedStore(10, "none")
    store.put(np.arange(10), np.arange(10, dtype=np.int32)[:, None])
    huge = np.array([2**64 - 1], np.uint64)  # as int64 this is -1, i.e. slot 9
    for call in (lambda: store.get(huge), lambda: store.get_many([np.array([0]), huge]), lambda: store.put(huge, np.zeros((1, 1), np.int32))):
        with pytest.raises(IndexError, match=r"(slots|slot_arrays\[1\]): slot 18446744073709551615 out of range"):
            call()
    assert store.get(np.array([9], np.uint64)).tolist() == [[9]]


@pytest.mark.skipif(not {"zstd", "rle"} <= HAVE, reason="needs zstandard and numba")
def test_a_read_is_split_over_threads_only_when_its_codecs_decode_in_compiled_loops(atari_stacks):
    """zstd keyframes (decoded payload by payload from Python) keep a read on one shard: one decode call per codec;
    RLE alone (`threaded_decode`) is split into a shard per thread. The frames come back the same either way."""
    import host_codecs

    frames = atari_stacks["pong_obs"][:320, -1]  # 320 frames of 7 KB: more than two read shards' worth
    slots, bases = np.arange(320), np.where(np.arange(320) % 8, np.arange(320) - 1, -1)  # chains of 8
    calls: list = []
    try:
        host_codecs.set_num_threads(2)
        for codec, delta, want in (("zstd:-1", "rle", {"zstd": 1, "rle": 1}), ("rle", None, {"rle": 2})):
            store = CompressedStore(320, codec=codec, delta_codec=delta, item_shape=(84, 84), dtype=np.uint8)
            store.put(slots, frames, bases=bases)
            used = {get_codec(c.split(":")[0]) for c in (codec, delta) if c}  # the objects reads decode with
            for c in used:
                c.decode_many = (lambda f, name: lambda *a, **k: (calls.append(name), f(*a, **k))[1])(c.decode_many, c.name)
            try:
                calls.clear()
                assert_bit_exact(store.get(slots[::-1]), frames[::-1])
            finally:
                for c in used:
                    del c.decode_many
            assert {n: calls.count(n) for n in set(calls)} == want, codec
    finally:
        host_codecs.set_num_threads(None)
