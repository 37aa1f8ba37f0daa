"""host_codecs._checksum: the compiled loop over a batch gives exactly the checks of one call per entry (`zlib.crc32`
for CRC-32, `xxhash.xxh3_64_intdigest` for the XXH3 sums of stores written before), for payloads in one buffer or
several chunks, past a chunk's end, in a missing chunk, and empty; CRC-32 detects every changed byte and every change
of up to 4 consecutive bytes; snapshots and chunk-store indexes without a `checksum` field (XXH3 sums) stay readable
and writable, and a corrupt byte in them is still detected."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host_codecs import CompressedStore, CorruptEntryError, _checksum
from host_codecs._checksum import CRC32, XXH3

CHUNKS = {0: np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8), 3: bytes(range(256)) * 4, 7: np.zeros(0, np.uint8)}


def per_entry(*args, checksum=CRC32) -> np.ndarray:
    kernels = dict(_checksum._kernels)
    _checksum._kernels[checksum] = False
    try:
        return _checksum.payload_sums(*args, checksum)
    finally:
        _checksum._kernels.clear()
        _checksum._kernels.update(kernels)


@pytest.mark.parametrize("checksum", [CRC32, XXH3])
def test_the_compiled_loop_is_found(checksum):
    """With isal (CRC-32) and xxhash (XXH3) installed, both loops load (else every store takes the per-entry path)."""
    if checksum == CRC32:
        pytest.importorskip("isal")
    assert _checksum._load(checksum) is not False


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(st.tuples(st.sampled_from([0, 3, 7, 9]), st.integers(0, 5100), st.integers(0, 3000), st.integers(0, 2**31)),
                        max_size=12), big=st.booleans(), checksum=st.sampled_from([CRC32, XXH3]))
def test_compiled_loop_equals_one_call_per_entry(entries, big, checksum, monkeypatch):
    """Chunk 9 is missing (hashed as empty), offsets and lengths may run past a chunk's end (hashed as far as it goes);
    `big` splits the batch over the pool's threads."""
    monkeypatch.setattr(_checksum, "_SHARD_BYTES", 1 if big else 1 << 40)
    ids, offs, lens, slots = (np.array([e[i] for e in entries], np.int64) for i in range(4))
    got = _checksum.payload_sums(CHUNKS, ids, offs, lens, slots, checksum)
    assert got.dtype == np.uint32 and got.shape == (len(entries),)
    np.testing.assert_array_equal(got, per_entry(CHUNKS, ids, offs, lens, slots, checksum=checksum))


def test_the_sums_are_the_documented_functions():
    """CRC-32 started from the seed's low 32 bits (`zlib.crc32`); XXH3's low 32 bits seeded `slot ^ length << 32`
    (what stores wrote before: unchanged)."""
    data = CHUNKS[0][100:1100]
    for checksum in (CRC32, XXH3):
        seed = int(_checksum._seeds(checksum, np.array([5]), np.array([1000]))[0])
        want = zlib.crc32(data, seed & 0xFFFFFFFF) if checksum == CRC32 else xxhash.xxh3_64_intdigest(data, 5 ^ 1000 << 32) & 0xFFFFFFFF
        assert _checksum.payload_sums(CHUNKS, [0], [100], [1000], [5], checksum)[0] == want


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 1500), slot=st.integers(0, 2**31 - 1))
def test_crc32_detects_every_changed_byte_and_every_change_of_4_consecutive_bytes(seed, size, slot):
    """Each position changed by every one of a sample of byte masks (0x01, 0x80, 0xFF and random ones), and random
    changes of 2 to 4 consecutive bytes: every sum differs from the stored one (a CRC's guarantee, not luck)."""
    rng = np.random.default_rng(seed)
    payload = rng.integers(0, 256, size, dtype=np.uint8)
    stored = _checksum.payload_sums({0: payload}, [0], [0], [size], [slot])[0]
    masks = np.array([0x01, 0x80, 0xFF, *rng.integers(1, 256, 2)], np.uint8)
    flipped = np.repeat(payload[None], size * masks.size, axis=0)
    pos = np.tile(np.arange(size), masks.size)
    flipped[np.arange(pos.size), pos] ^= np.repeat(masks, size)
    for _ in range(64):  # a burst: 2 to 4 consecutive bytes, each changed
        n = int(rng.integers(2, 5))
        at = int(rng.integers(0, max(size - n, 0) + 1))
        row = payload.copy()
        row[at : at + n] ^= rng.integers(1, 256, min(n, size - at), dtype=np.uint8)
        flipped = np.concatenate([flipped, row[None]])
    k = flipped.shape[0]
    sums = _checksum.payload_sums({0: flipped.reshape(-1)}, np.zeros(k, np.int64), np.arange(k) * size, np.full(k, size), np.full(k, slot))
    assert not np.any(sums == stored)


def _old_style_store(**kw) -> CompressedStore:
    """A store that checksums as stores did before CRC-32 (what a snapshot or index of then holds)."""
    store = CompressedStore(64, **kw)
    store.checksum = XXH3
    return store


@pytest.mark.parametrize("codec", ["none", "rle"])
def test_a_snapshot_without_a_checksum_field_reads_and_writes_its_xxh3_sums(codec):
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 4, (40, 12, 10), dtype=np.uint8)
    old = _old_style_store(codec=codec)
    old.put(np.arange(20), frames[:20])
    old.put(np.arange(20, 30), frames[20:30], bases=np.arange(19, 29))  # deltas: their checks chain the bases'
    meta, arrays = old.export_state()
    assert meta.pop("checksum") == XXH3  # as written before the field existed
    new = CompressedStore(64, codec=codec)
    new.import_state(meta, arrays)
    assert new.checksum == XXH3
    np.testing.assert_array_equal(new.get(np.arange(30)), frames[:30])
    new.put(np.arange(30, 40), frames[30:])  # further puts keep the store's sums: one checksum per store
    np.testing.assert_array_equal(new.get(np.arange(40)), frames)
    new._chunks[new._chunk[3]].data[new._offset[3]] ^= 1  # a flipped byte in an XXH3 entry is still caught
    with pytest.raises(CorruptEntryError, match="slot"):
        new.get(np.array([3]))
    crc = CompressedStore(64, codec=codec)  # a snapshot recording CRC-32 whose sums are XXH3 ones: every entry fails
    crc.import_state({**meta, "checksum": CRC32}, arrays)
    with pytest.raises(CorruptEntryError):
        crc.get(np.array([0]))
    with pytest.raises(ValueError, match="checksum: expected one of"):
        CompressedStore(64, codec=codec).import_state({**meta, "checksum": "md5"}, arrays)


def test_a_chunk_store_index_without_a_checksum_field_opens_with_its_xxh3_sums(tmp_path):
    from host_codecs.chunk_arena import ChunkFileStore

    frames = np.random.default_rng(2).integers(0, 256, (8, 6, 5), dtype=np.uint8)
    store = ChunkFileStore(tmp_path / "s", 16, codec="none", item_shape=(6, 5), dtype=np.uint8, mode="w")
    store.checksum = XXH3
    store.put(np.arange(8), frames)
    meta, token = store.write_index(tmp_path / "index.npz")
    store.commit(token)
    store.close()
    assert meta.pop("checksum") == XXH3
    reopened = ChunkFileStore(tmp_path / "s", 16, codec="none", item_shape=(6, 5), dtype=np.uint8, mode="r", index=tmp_path / "index.npz", meta=meta)
    assert reopened.checksum == XXH3
    np.testing.assert_array_equal(reopened.get(np.arange(8)), frames)
    reopened.close()
