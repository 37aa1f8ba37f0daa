"""Corrupt bytes never read back as data: random byte flips in stored payloads and index rows of a
CompressedStore are each detected on read (CorruptEntryError naming the slot), for every codec;
decoders never inflate a corrupt payload past the entry's size."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from hc_helpers import assert_bit_exact
from host_codecs import CompressedStore, CorruptEntryError, available_codecs, get_codec

HAVE = set(available_codecs())
SHAPE = (84, 84)
# (codec, dictionary_bytes): every codec, zstd with and without the store's dictionary
SETTINGS = [("none", 0), ("rle", 0), ("igzip:1", 0), ("zstd:-1", 0), ("zstd:-1", 4096)]
INDEX_FIELDS = ("_chunk", "_offset", "_length", "_codec", "_meta", "_layout", "_check")


def _frames(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` distinct compressible uint8 frames: a shared background, a few blocks, some noise."""
    base = np.zeros(SHAPE, np.uint8)
    base[10:20] = 142
    base[60:] = 80
    frames = np.repeat(base[None], n, axis=0)
    for f in frames:
        y, x = rng.integers(0, 70, 2)
        f[y : y + 8, x : x + 12] = rng.integers(1, 255)
        f[rng.integers(0, 84, 30), rng.integers(0, 84, 30)] = rng.integers(0, 256, 30)
    return frames


def _params():
    for spec, d in SETTINGS:
        marks = pytest.mark.skipif(spec.split(":")[0] not in HAVE, reason=f"needs the package of {spec}")
        yield pytest.param(spec, d, id=f"{spec}{'/dict' if d else ''}", marks=marks)


def _filled(spec: str, dictionary_bytes: int, rng, n: int = 48):
    store = CompressedStore(n, codec=spec, item_shape=SHAPE, dtype=np.uint8, dictionary_bytes=dictionary_bytes,
                            dictionary_samples=16, name="obs")
    frames = _frames(rng, n)
    for lo in range(0, n, 16):
        store.put(np.arange(lo, lo + 16), frames[lo : lo + 16])
    if dictionary_bytes:
        assert store.dictionary is not None and (store._meta[16:] == 1).all(), store.dictionary_error
    return store, frames


def _assert_detected(store: CompressedStore, slot: int, what: str) -> None:
    with pytest.raises(CorruptEntryError, match=rf"CompressedStore 'obs': slots \[{slot}\] are corrupt") as info:
        store.get(np.array([slot, (slot + 1) % store.num_slots, slot]))
    assert "changed after they were written" in str(info.value), what


def _flip_and_read(spec: str, dictionary_bytes: int, trials: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    store, frames = _filled(spec, dictionary_bytes, rng)
    for trial in range(trials):
        slot = int(rng.integers(store.num_slots))
        mask = int(rng.integers(1, 256))
        if trial % 2:  # a payload byte
            c, o, n = int(store._chunk[slot]), int(store._offset[slot]), int(store._length[slot])
            k = o + int(rng.integers(n))
            data = store._chunks[c].data
            data[k] ^= mask
            _assert_detected(store, slot, f"payload byte {k - o} of {n} ^ {mask:#x}")
            data[k] ^= mask
        else:  # a byte of the slot's index row
            field = INDEX_FIELDS[int(rng.integers(len(INDEX_FIELDS)))]
            raw = getattr(store, field).view(np.uint8)
            k = slot * getattr(store, field).itemsize + int(rng.integers(getattr(store, field).itemsize))
            raw[k] ^= mask
            _assert_detected(store, slot, f"{field} byte ^ {mask:#x}")
            raw[k] ^= mask
    assert_bit_exact(store.get(np.arange(store.num_slots)), frames)  # every flip undone: all intact


@pytest.mark.parametrize("spec,dictionary_bytes", list(_params()))
def test_every_flipped_byte_is_detected_on_read(spec, dictionary_bytes):
    _flip_and_read(spec, dictionary_bytes, trials=400, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("spec,dictionary_bytes", list(_params()))
def test_every_flipped_byte_is_detected_on_read_long(spec, dictionary_bytes):
    for seed in range(1, 6):
        _flip_and_read(spec, dictionary_bytes, trials=4000, seed=seed)


def test_entries_moved_between_slots_and_invalid_chunk_ids_are_detected():
    rng = np.random.default_rng(1)
    store, frames = _filled("none", 0, rng)
    for f in INDEX_FIELDS[:3] + INDEX_FIELDS[-1:]:  # slot 3 now points at slot 4's payload and check
        getattr(store, f)[3] = getattr(store, f)[4]
    _assert_detected(store, 3, "a payload of another slot")
    store._chunk[7] = -2  # not the empty marker (-1): never read as an empty slot
    with pytest.raises(CorruptEntryError, match=r"slots \[7\] are corrupt \(an invalid chunk id\)"):
        store.get([7], missing="zeros")
    assert_bit_exact(store.get(np.arange(8, 48)), frames[8:])  # the other slots read as before


@pytest.mark.skipif("igzip" not in HAVE, reason="needs isal")
def test_a_small_igzip_payload_never_inflates_past_the_entry_size():
    """A 64 KB deflate stream of 64 MiB of zeros, decoded as a 7,056-byte entry: refused without
    allocating more than a few entries' worth of memory."""
    from isal import igzip_lib

    bomb = igzip_lib.compress(bytes(64 << 20), 1, igzip_lib.COMP_DEFLATE)
    assert len(bomb) < 100_000
    codec = get_codec("igzip:1")
    chunk = np.zeros(-(-len(bomb) // 8) * 8, np.uint8)
    chunk[: len(bomb)] = np.frombuffer(bomb, np.uint8)
    out = np.zeros((1, SHAPE[0] * SHAPE[1]), np.uint8)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="inflates past the entry's 7056 bytes"):
            codec.decode_into(chunk, np.zeros(1, np.int64), np.array([len(bomb)]), np.zeros(1, np.uint8), out, np.zeros(1, np.int64), np.uint8)
        with pytest.raises(ValueError, match="inflates past"):
            codec.decode(b"\0" + bomb, np.uint8, SHAPE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    ok = codec.encode(np.ones(SHAPE, np.uint8))
    assert_bit_exact(codec.decode(ok, np.uint8, SHAPE), np.ones(SHAPE, np.uint8))
    with pytest.raises(ValueError, match="gives 7056 bytes .* has 3 bytes after its end"):
        codec.decode(ok + b"abc", np.uint8, SHAPE)


@pytest.mark.skipif("zstd" not in HAVE, reason="needs zstandard")
def test_a_small_zstd_frame_never_inflates_past_the_entry_size():
    """A zstd frame of 64 MiB of zeros (a few KB), decoded as a 7,056-byte entry: refused from its
    header, before anything is allocated for it."""
    import zstandard

    bomb = zstandard.ZstdCompressor(level=1).compress(bytes(64 << 20))
    assert len(bomb) < 100_000
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="declares 67108864 bytes, expected 7056"):
            get_codec("zstd:1").decode(b"\0" + bomb, np.uint8, SHAPE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
