"""zstd dictionaries: a store builds one from its first entries and encodes later ones with it;
entries read back exactly, are smaller than without it and are standard zstd frames; entries
never decode with the wrong dictionary; samples the trainer refuses give no dictionary."""

from __future__ import annotations

import re

import threading

import numpy as np
import pytest

from hc_helpers import assert_bit_exact
from host_codecs import CompressedStore, available_codecs
from host_codecs._base import ChunkTable

pytestmark = pytest.mark.skipif("zstd" not in available_codecs(), reason="needs zstandard (codecs extra)")


@pytest.fixture(scope="module", params=["breakout", "pong"])
def game_frames(request, atari_stacks):
    """uint8 [5000, 84, 84] of each game in turn: the newest frame of each stacked observation."""
    return np.ascontiguousarray(atari_stacks[f"{request.param}_obs"][:, -1])


def _fill(store, frames, batch):
    for a in range(0, len(frames), batch):
        store.put(np.arange(a, min(a + batch, len(frames))), frames[a : a + batch])


def _reader(d):
    """A zstandard decoder given the dictionary's bytes as a standard zstd dictionary."""
    import zstandard

    return zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(d.data, dict_type=zstandard.DICT_TYPE_FULLDICT))


def _payload(store, slot):
    o, n = int(store._offset[slot]), int(store._length[slot])
    return store._chunks[int(store._chunk[slot])].data[o : o + n].tobytes()


def test_store_trains_once_then_encodes_smaller_and_reads_back_exactly(game_frames):
    import zstandard

    from host_codecs.zstd import ZstdCodec

    codec = ZstdCodec(-1)
    frames = game_frames[:3000]
    plain = CompressedStore(len(frames), codec)
    store = CompressedStore(len(frames), codec, dictionary_bytes=8192, dictionary_samples=600)
    _fill(plain, frames, 256)
    for a in range(0, len(frames), 256):
        store.put(np.arange(a, min(a + 256, len(frames))), frames[a : a + 256])
        if a + 256 < 600:
            assert store.dictionary is None and store.dictionary_nbytes == 0
    d = store.dictionary
    assert d is not None and 0 < len(d.data) <= 8192 and store.dictionary_error is None
    # Entries before the training put have no dictionary (meta 0); that put and later ones do.
    assert (store._meta[:512] == 0).all() and (store._meta[512:] == 1).all() and d.meta == 1
    assert_bit_exact(store.get(np.arange(len(frames))), frames)
    ids = np.random.default_rng(0).integers(0, len(frames), (64, 4))
    assert_bit_exact(store.get(ids), frames[ids])
    # The dictionary is used: an entry decodes with it, and not without it.
    for slot in (512, 2999):
        assert _reader(d).decompress(_payload(store, slot)) == frames[slot].tobytes()
        with pytest.raises(zstandard.ZstdError):
            zstandard.ZstdDecompressor().decompress(_payload(store, slot))
    # Smaller than without a dictionary: live payload bytes of the same entries.
    later = np.arange(1000, len(frames))
    with_dict = store._length[later].astype(np.int64).sum()
    without = plain._length[later].astype(np.int64).sum()
    assert with_dict < 0.7 * without, (with_dict, without)
    assert store.payload_nbytes < plain.payload_nbytes
    # Accounted: the dictionary counts in nbytes.
    s = store.stats()
    assert s["dictionary_nbytes"] == store.dictionary_nbytes >= len(d.data)
    assert s["nbytes"] == store.nbytes == store.arena_nbytes + store.index_nbytes + store.dictionary_nbytes
    # Trained once: more puts keep the same dictionary.
    store.put(np.arange(10), frames[:10])
    assert store.dictionary is d


def test_dictionary_frames_are_standard_zstd_frames(breakout_frames):
    """zstandard itself, given the dictionary bytes as a standard zstd dictionary, reads them."""
    from host_codecs.zstd import ZstdCodec, ZstdDictionary

    rows = breakout_frames[:400].reshape(400, -1)
    d = ZstdDictionary.train(rows[:300], 4096, -1)
    enc = ZstdCodec(-1).encode_batch(rows[300:], np.dtype(np.uint8), d)
    assert (enc.meta == 1).all()
    reader = _reader(d)
    for i, (o, n) in enumerate(zip(enc.offsets.tolist(), enc.lengths.tolist())):
        assert reader.decompress(enc.buffer[o : o + n].tobytes()) == rows[300 + i].tobytes()


def test_dictionary_entries_never_decode_without_or_with_another_dictionary(breakout_frames):
    from host_codecs.zstd import ZstdCodec, ZstdDictionary

    codec = ZstdCodec(-1)
    rows = breakout_frames[:300].reshape(300, -1)
    d = ZstdDictionary.train(rows[:200], 4096, -1)
    other = ZstdDictionary.train(breakout_frames[2000:2300].reshape(300, -1), 4096, -1)
    enc = codec.encode_batch(rows[200:], np.dtype(np.uint8), d)
    chunk = np.zeros(len(enc.buffer) + 8, np.uint8)
    chunk[: len(enc.buffer)] = enc.buffer
    out = np.full((100, rows.shape[1]), 7, np.uint8)
    zeros = np.zeros(100, np.int64)

    def decode(table, meta):
        codec.decode_many(table, zeros, enc.offsets, enc.lengths, meta, [out], zeros, np.arange(100, dtype=np.int64),
                          np.dtype(np.uint8))

    with pytest.raises(ValueError, match="encoded with a dictionary, and none was given"):
        decode({0: chunk}, enc.meta)
    assert (out == 7).all()  # refused before writing
    with pytest.raises(ValueError, match="corrupt entry"):
        decode(ChunkTable({0: chunk}, other), enc.meta)
    for byte in (2, 3, 255):
        bad_meta = enc.meta.copy()
        bad_meta[3] = byte
        with pytest.raises(ValueError, match=rf"unknown entry format \(meta byte {byte}; expected 0 or 1\)"):
            decode(ChunkTable({0: chunk}, d), bad_meta)
    decode(ChunkTable({0: chunk}, d), enc.meta)
    assert_bit_exact(out, rows[200:])


def test_samples_the_trainer_refuses_raise_and_a_store_keeps_going_without_a_dictionary(breakout_frames):
    """zstd's trainer refuses fewer than 5 samples and sizes under 256 bytes: no dictionary, the
    reason kept; a store then encodes every entry without one (meta 0) and reads it back exactly."""
    import zstandard

    from host_codecs.zstd import ZstdDictionary

    rows = breakout_frames[:300].reshape(300, -1)
    with pytest.raises(zstandard.ZstdError):
        zstandard.train_dictionary(4096, [r.tobytes() for r in rows[:4]])
    msg = f"zstd's trainer refused 4 samples of {4 * 7056} bytes for a dictionary of at most 4096 bytes (cannot train dict"
    with pytest.raises(ValueError, match=re.escape(msg)):
        ZstdDictionary.train(rows[:4], 4096, -1)
    with pytest.raises(ValueError, match="at most 200 bytes"):  # too small a dictionary
        ZstdDictionary.train(rows, 200, -1)
    assert ZstdDictionary.train([], 4096, -1) is None and ZstdDictionary.train(rows, 0, -1) is None
    assert ZstdDictionary.train(rows, 4096, -1).meta == 1  # the same samples, enough of them: trained
    # A store whose sample is 3 entries: no dictionary, every entry without one, read back exactly.
    frames = breakout_frames[:1000]
    store = CompressedStore(len(frames), "zstd:-1", dictionary_bytes=4096, dictionary_samples=3)
    _fill(store, frames, 3)
    assert store.dictionary is None and store._trained and store.dictionary_nbytes == 0
    assert (store._meta[:1000] == 0).all()
    assert store.dictionary_error.startswith("zstd's trainer refused 3 samples")
    assert "cannot train dict" in store.dictionary_error
    assert_bit_exact(store.get(np.arange(len(frames))), frames)
    # Entries of 0 bytes: refused too, and read back.
    empty = CompressedStore(40, "zstd:-1", dictionary_bytes=4096, dictionary_samples=3)
    _fill(empty, np.zeros((40, 0), np.uint8), 3)
    assert empty.dictionary is None and (empty._meta[:40] == 0).all()
    assert "3 samples of 0 bytes" in empty.dictionary_error
    assert_bit_exact(empty.get(np.arange(40)), np.zeros((40, 0), np.uint8))


def test_dictionary_arguments_are_checked():
    with pytest.raises(ValueError, match="dictionaries are for the zstd codec"):
        CompressedStore(8, "none", dictionary_bytes=1024)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="dictionary_bytes: expected an int"):
            CompressedStore(8, "zstd:-1", dictionary_bytes=bad)
    with pytest.raises(ValueError, match=r"dictionary_samples: expected an int in \[1, inf\]"):
        CompressedStore(8, "zstd:-1", dictionary_bytes=1024, dictionary_samples=0)


def test_other_codecs_and_levels_in_a_dictionary_store_are_stored_without_it(breakout_frames):
    store = CompressedStore(1200, "zstd:-1", dictionary_bytes=4096, dictionary_samples=300)
    _fill(store, breakout_frames[:600], 300)
    assert store.dictionary is not None
    store.put(np.arange(600, 700), breakout_frames[600:700], codec="zstd:3")
    store.put(np.arange(700, 800), breakout_frames[700:800], codec="none")
    store.put(np.arange(800, 900), breakout_frames[800:900], codec="zstd:-1")  # the default: with it
    assert (store._meta[600:800] == 0).all() and (store._meta[800:900] == 1).all()
    ids = np.random.default_rng(1).integers(0, 900, (50, 4))
    assert_bit_exact(store.get(ids), breakout_frames[ids])


def test_concurrent_writers_and_reader_across_training(breakout_frames):
    """Two writers put versioned frames while a reader reads; the dictionary is trained while
    they run. Every read entry must be exactly the frame of some version of its slot, and a
    slot's version never goes backwards."""
    num_slots, pool = 48, breakout_frames[:256]

    def entry(slot, v):  # a real frame, with the slot and version in its first pixels
        f = pool[(slot * 31 + v) % len(pool)].copy()
        f[0, 0], f[0, 1], f[0, 2] = slot, v % 256, v // 256
        return f

    store = CompressedStore(num_slots, "zstd:-1", dictionary_bytes=4096, dictionary_samples=200,
                            chunk_bytes=1 << 15, min_chunk_bytes=1 << 12)
    store.put(np.arange(num_slots), np.stack([entry(s, 0) for s in range(num_slots)]))
    errors: list[str] = []
    done = threading.Event()
    lock = threading.Lock()
    version = np.zeros(num_slots, np.int64)

    def writer(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(600):
                slots = rng.choice(num_slots, size=int(rng.integers(1, 6)), replace=False)
                with lock:  # the two writers agree on version numbers
                    version[slots] += 1
                    batch = np.stack([entry(int(s), int(version[s])) for s in slots])
                    store.put(slots, batch)
        except Exception as exc:  # pragma: no cover
            errors.append(f"writer: {exc!r}")

    def reader():
        rng = np.random.default_rng(3)
        seen = np.zeros(num_slots, np.int64)
        try:
            while not done.is_set():
                slots = rng.choice(num_slots, size=8, replace=False)
                got = store.get(slots)
                for s, g in zip(slots.tolist(), got):
                    v = int(g[0, 1]) + 256 * int(g[0, 2])
                    if int(g[0, 0]) != s or not np.array_equal(g, entry(s, v)):
                        errors.append(f"slot {s}: not an entry of this slot (torn or wrong dictionary)")
                        return
                    if v < seen[s]:
                        errors.append(f"slot {s} went back from version {seen[s]} to {v}")
                        return
                    seen[s] = v
        except Exception as exc:  # pragma: no cover
            errors.append(f"reader: {exc!r}")

    writers = [threading.Thread(target=writer, args=(i,)) for i in (1, 2)]
    r = threading.Thread(target=reader)
    r.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=300)
    done.set()
    r.join(timeout=60)
    assert not errors, errors
    assert store.dictionary is not None
    assert (store._meta == 1).any()


def test_a_failed_build_leaves_puts_working_and_says_why(monkeypatch, breakout_frames):
    from host_codecs.zstd import ZstdDictionary

    def boom(*a, **k):
        raise MemoryError("no room for the samples")

    monkeypatch.setattr(ZstdDictionary, "train", classmethod(lambda cls, *a, **k: boom()))
    store = CompressedStore(300, "zstd:-1", dictionary_bytes=4096, dictionary_samples=50)
    _fill(store, breakout_frames[:300], 40)  # every put lands, before and after the failed build
    assert store.dictionary is None and store.dictionary_nbytes == 0
    assert store.dictionary_error == "MemoryError: no room for the samples"
    assert_bit_exact(store.get(np.arange(300)), breakout_frames[:300])
    with pytest.raises(ValueError, match=r"dictionary_bytes: expected an int in \[0, 1048576\]"):
        CompressedStore(8, "zstd:-1", dictionary_bytes=1 << 30)


def test_large_entries_build_from_a_bounded_sample(monkeypatch):
    """Entries of 1 MiB: at most 64 MiB of samples (64 entries) are decoded for the build."""
    from host_codecs import store as store_mod
    from host_codecs.zstd import ZstdDictionary

    seen = {}
    real = ZstdDictionary.train.__func__

    def spy(cls, samples, size, level):
        seen["n"] = len(samples)
        return real(cls, samples, size, level)

    monkeypatch.setattr(ZstdDictionary, "train", classmethod(spy))
    rng = np.random.default_rng(0)
    big = np.repeat(rng.integers(0, 4, (1, 1 << 20), dtype=np.uint8), 100, axis=0)
    store = CompressedStore(100, "zstd:-1", dictionary_bytes=4096, dictionary_samples=90)
    _fill(store, big, 30)
    assert seen["n"] == store_mod._MAX_SAMPLE_BYTES >> 20 == 64
    assert store.dictionary is not None
    assert_bit_exact(store.get(np.arange(100)), big)
