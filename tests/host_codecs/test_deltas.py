"""Delta entries of CompressedStore (`put(..., bases=)`): exact chains against a dict model, checksums chained
through the bases, refused arguments, and the arena's slack while it grows and while a ring overwrites it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host_codecs import CompressedStore, CorruptEntryError

SHAPE = (12, 10)


def _frames(rng, n):
    """Frames that change a little from one to the next (as game frames do)."""
    base = rng.integers(0, 256, SHAPE, dtype=np.uint8)
    out = np.empty((n, *SHAPE), np.uint8)
    for i in range(n):
        base = base.copy()
        base[rng.integers(0, SHAPE[0]), :] = rng.integers(0, 256)
        out[i] = base
    return out


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    codec=st.sampled_from(["none", "rle", "zstd:-1", "igzip:1"]),
    delta_codec=st.sampled_from([None, "rle"]),
    ring=st.integers(4, 20),
    key=st.integers(1, 6),
    chunks=st.lists(st.integers(1, 7), min_size=1, max_size=12),
    fresh=st.booleans(),
)
def test_frame_ring_of_deltas_matches_a_dict(seed, codec, delta_codec, ring, key, chunks, fresh):
    """Frames written to a ring of `ring + key - 1` slots as chains of `key` (a keyframe, then deltas against the
    previous slot; the deltas coded by `delta_codec` when given), in chunks: every frame of the newest `ring` reads
    back exactly, also a random few of them read into two outputs (with repeats, most chain frames not asked for). With
    `fresh`, each put goes to a store object that did not make the previous put (its bases are decoded from the store,
    not remembered)."""
    rng = np.random.default_rng(seed)
    size = ring + key - 1
    store = CompressedStore(size, codec, item_shape=SHAPE, dtype=np.uint8, delta_codec=delta_codec)
    frames = _frames(rng, sum(chunks) * 2)
    model, t = {}, 0
    for n in chunks * 2:
        n = min(n, ring)  # a chunk never rewrites a slot its first delta is based on
        ts = np.arange(t, t + n)
        bases = np.where(ts % key == 0, -1, (ts - 1) % size)
        store.put(ts % size, frames[ts], bases=bases)
        if fresh:
            store._recent = None
        model.update({int(x) % size: int(x) for x in ts})
        t += n
        live = [s for s, x in model.items() if x >= t - ring]
        got = store.get(np.array(live))
        np.testing.assert_array_equal(got, frames[[model[s] for s in live]])
        pick = rng.choice(np.array(live), size=int(rng.integers(1, 2 * len(live) + 1)))  # a random few, some repeated
        for ids, read in zip((pick, pick[::-3]), store.get_many([pick, pick[::-3]])):  # chain frames not asked for: in place
            np.testing.assert_array_equal(read, frames[[model[s] for s in ids.tolist()]])
        held = np.flatnonzero(store.written(np.arange(size)))
        np.testing.assert_array_equal(store.get(held), frames[[model[s] for s in held.tolist()]])  # no delta lost its base
    assert (store._base >= 0).any() == (key > 1 and t > 1)
    if delta_codec is not None and key > 1 and t > 1:
        delta = store._chunk[store._base >= 0] >= 0
        assert set(store._codec[store._base >= 0][delta].tolist()) <= {1}  # the RLE tag


def test_a_rewritten_keyframe_fails_its_deltas_checksums():
    rng = np.random.default_rng(0)
    f = _frames(rng, 4)
    store = CompressedStore(8, "zstd:-1", item_shape=SHAPE, dtype=np.uint8)
    store.put(np.arange(4), f, bases=np.array([-1, 0, 1, 2]))
    np.testing.assert_array_equal(store.get(np.array([3])), f[3:])
    store._child[:] = -1  # without the links to its deltas, rewriting a keyframe leaves them stale
    store.put(np.array([0]), f[1:2])
    with pytest.raises(CorruptEntryError, match=r"slots \[1"):
        store.get(np.array([3]))
    store.put(np.array([1]), f[1:2])  # slot 1 whole again: slot 2 still refers to the old slot 1
    with pytest.raises(CorruptEntryError, match=r"slots \[2\]"):
        store.get(np.array([2, 3]))
    store._base[3] = 5  # a base that was deleted
    with pytest.raises(CorruptEntryError, match="base slot is empty"):
        store.get(np.array([3]))


def test_a_delta_never_outlives_its_base():
    """Rewriting (or deleting) a slot deletes the deltas after it in its chain, up to the next keyframe; the rest
    reads back exactly, so every stored entry decodes. A second delta on one base is refused."""
    f = _frames(np.random.default_rng(4), 8)
    store = CompressedStore(8, "zstd:-1", item_shape=SHAPE, dtype=np.uint8)
    store.put(np.arange(8), f, bases=np.array([-1, 0, 1, 2, -1, 4, 5, 6]))
    np.testing.assert_array_equal(store.dependents([1]), [2, 3])
    store.put(np.array([1]), f[:1])  # slots 2 and 3 lose their chain: deleted
    np.testing.assert_array_equal(store.written(np.arange(8)), [1, 1, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(store.get(np.array([0, 1, 4, 5, 6, 7])), f[[0, 0, 4, 5, 6, 7]])
    store.delete([5])
    np.testing.assert_array_equal(store.written(np.arange(8)), [1, 1, 0, 0, 1, 0, 0, 0])
    with pytest.raises(ValueError, match="bases: slot 0 is the base of several rows"):
        store.put(np.array([2, 3]), f[:2], bases=np.array([0, 0]))
    store.put(np.array([2]), f[2:3], bases=np.array([0]))  # slot 1 is whole now: 0 is nobody's base
    np.testing.assert_array_equal(store.get(np.array([2])), f[2:3])
    with pytest.raises(ValueError, match="bases: slot 0 is already the base of slot 2"):
        store.put(np.array([3]), f[3:4], bases=np.array([0]))


def test_a_changed_base_pointer_fails_the_checksum():
    f = _frames(np.random.default_rng(1), 3)
    store = CompressedStore(8, "none", item_shape=SHAPE, dtype=np.uint8)
    store.put(np.arange(3), f, bases=np.array([-1, 0, 1]))
    store._base[2] = 0
    with pytest.raises(CorruptEntryError, match=r"slots \[2\]"):
        store.get(np.array([2]))


def test_bad_bases_are_refused_before_anything_is_stored():
    f = _frames(np.random.default_rng(2), 3)
    store = CompressedStore(8, "none", item_shape=SHAPE, dtype=np.uint8)
    store.put(np.array([5]), f[:1])
    before = tuple(a.copy() for a in store._index())
    cases = [
        (np.arange(3), np.array([-1, 0]), ValueError, r"bases: expected shape \(3,\)"),
        (np.arange(3), np.array([-1, 1, 0]), ValueError, "bases: slot 1 is given itself"),
        (np.arange(3), np.array([-1, 0, 7]), ValueError, "bases: slot 7 is empty"),
        (np.arange(3), np.array([-1, 2, 0]), ValueError, "later row of the batch"),
        (np.arange(3), np.array([-1, 0, 8]), IndexError, "bases: slot 8 out of range"),
        (np.array([0, 1, 1]), np.array([-1, 0, 5]), ValueError, "repeated slots"),
        (np.arange(3), np.array([-1.0, 0.0, 1.0]), TypeError, "bases: expected integer"),
    ]
    for slots, bases, err, match in cases:
        with pytest.raises(err, match=match):
            store.put(slots, f, bases=bases)
        assert all(np.array_equal(a, b) for a, b in zip(before, store._index()))


def test_one_read_decodes_each_chain_frame_once():
    """A read of deltas that share a chain decodes every slot of the chain once (counted through the codec), and
    `chains_out` receives the chain slots it decoded besides the requested ones (`chain_slots`)."""
    f = _frames(np.random.default_rng(3), 8)
    store = CompressedStore(8, "none", item_shape=SHAPE, dtype=np.uint8)
    store.put(np.arange(8), f, bases=np.array([-1, 0, 1, 2, 3, 4, 5, 6]))
    calls = []
    codec = store.codec
    orig = codec.decode_many

    def counting(*args, **kwargs):
        calls.append(len(args[7]))  # rows decoded
        return orig(*args, **kwargs)

    codec.decode_many = counting
    chains: list = []
    try:
        got = store.get_many([np.array([7, 5, 5]), np.array([6, 3])], chains_out=chains)
    finally:
        del codec.decode_many
    np.testing.assert_array_equal(got[0], f[[7, 5, 5]])
    np.testing.assert_array_equal(got[1], f[[6, 3]])
    assert sum(calls) == 8  # slots 0..7, each once
    assert len(chains) == 1 and sorted(chains[0].tolist()) == [0, 1, 2, 4] == sorted(store.chain_slots([7, 5, 5, 6, 3]).tolist())


def _payloads(rng, n):
    return [rng.integers(0, 256, int(rng.integers(40, 400)), dtype=np.uint8) for _ in range(n)]


@pytest.mark.parametrize("min_chunk", [1 << 12, 1 << 14])
def test_arena_slack_stays_under_a_quarter_growing_and_as_a_ring(min_chunk):
    """Growing, and then overwriting its oldest entries as a ring does, the arena never holds more than 25% of its
    bytes as slack (padding, freed and unused space) once its payloads fill a few first chunks."""
    rng = np.random.default_rng(0)
    n = 4000
    store = CompressedStore(n, "none", chunk_bytes=1 << 20, min_chunk_bytes=min_chunk)
    worst, t = 0.0, 0
    for _ in range(3 * n // 50):
        slots = np.arange(t, t + 50) % n
        for s, p in zip(slots.tolist(), _payloads(rng, 50)):  # entries of different sizes
            store.put(np.array([s]), p[None])
        t += 50
        st_ = store.stats()
        if st_["payload_nbytes"] > 4 * min_chunk:
            worst = max(worst, st_["slack_nbytes"] / st_["arena_nbytes"])
    assert 0 < worst <= 0.25, worst


@pytest.mark.parametrize("codec, dtype", [("none", np.uint8), ("rle", np.uint8), ("rle:16", np.uint8), ("rle:32", np.uint8),
                                          ("rle", np.uint16), ("zstd:-1", np.uint8), ("igzip:1", np.uint8)])
def test_decode_many_xors_each_delta_with_its_base_row(codec, dtype):
    """`Codec.decode_many(..., bases=)`: entry `i` decodes to its payload XOR the row `bases` names: an earlier entry
    of the same call (chains spread over two outputs, bases listed before their deltas) or a row decoded before the
    call; a base row that a later entry decodes first, or a row out of range is refused. RLE: counts of each width
    (levels 16 and 32), and runs of 2-byte words."""
    from host_codecs import get_codec

    c = get_codec(codec)
    f = _frames(np.random.default_rng(5), 7).reshape(7, -1)
    base = np.array([-1, 0, 1, 6, 3, 2])  # chains 0 -> 1 -> 2 -> 5 and 6 -> 3 -> 4 (6: a row decoded before the call)
    coded = f[:6] ^ np.where((base >= 0)[:, None], f[base], 0).astype(np.uint8)
    outs = [np.zeros((3, f.shape[1]), np.uint8), np.zeros((5, f.shape[1]), np.uint8)]
    out_ids, rows = np.array([1, 0, 1, 0, 0, 1, 1]), np.array([3, 0, 1, 2, 1, 0, 4])
    outs[1][4] = f[6]
    enc = c.encode_batch(coded, np.dtype(dtype))
    if codec.startswith("rle:"):
        assert set(enc.meta.tolist()) == {int(codec[4:]) // 8}  # every count that wide
    chunk = np.zeros(-(-enc.buffer.size // 8) * 8, np.uint8)
    chunk[: enc.buffer.size] = enc.buffer
    args = ({0: chunk}, np.zeros(6, np.int64), enc.offsets, enc.lengths, enc.meta, outs, out_ids[:6], rows[:6], np.dtype(dtype))
    at = lambda b: (np.where(b >= 0, out_ids[b], -1), np.where(b >= 0, rows[b], -1))  # noqa: E731
    c.decode_many(*args, bases=at(base))
    for i in range(6):
        np.testing.assert_array_equal(outs[out_ids[i]][rows[i]], f[i])
    for bad, match in (
        (np.array([-1, 2, 1, 6, 3, 2]), "a delta's base must be decoded before it"),
        (np.array([-1, 0, 5, 6, 3, 2]), "a delta's base must be decoded before it"),
    ):
        with pytest.raises(ValueError, match=match):
            c.decode_many(*args, bases=at(bad))
    with pytest.raises(ValueError, match="bases: base row index out of range"):
        c.decode_many(*args, bases=(np.array([-1, 0, 1, 0, 0, 1]), np.array([-1, 0, 1, 9, 1, 0])))


@pytest.mark.parametrize("codec", ["none", "rle", "zstd:-1", "igzip:1"])
def test_decode_many_xors_a_delta_into_its_own_row(codec):
    """A delta whose base is its own row is XORed into it in place (a chain's entries not asked for are decoded into
    the row of the next one): a chain 0 -> 1 -> 2 decoded into one row holds entry 2; entry 3, based on that row,
    into another row; a chain decoded in place from a row decoded before the call (entry 4 on entry 3's row)."""
    from host_codecs import get_codec

    c = get_codec(codec)
    f = _frames(np.random.default_rng(7), 6).reshape(6, -1)
    base = np.array([-1, 0, 1, 2, 3])
    coded = f[:5] ^ np.where((base >= 0)[:, None], f[base], 0).astype(np.uint8)
    enc = c.encode_batch(coded, np.dtype(np.uint8))
    chunk = np.zeros(-(-enc.buffer.size // 8) * 8, np.uint8)
    chunk[: enc.buffer.size] = enc.buffer
    outs = [np.full((2, f.shape[1]), 9, np.uint8)]
    args = ({0: chunk}, np.zeros(4, np.int64), enc.offsets[:4], enc.lengths[:4], enc.meta[:4], outs)
    c.decode_many(*args, np.zeros(4, np.int64), np.array([0, 0, 0, 1]), np.dtype(np.uint8),
                  bases=(np.array([-1, 0, 0, 0]), np.array([-1, 0, 0, 0])))
    np.testing.assert_array_equal(outs[0], f[2:4])
    c.decode_many({0: chunk}, np.zeros(1, np.int64), enc.offsets[4:], enc.lengths[4:], enc.meta[4:], outs, np.zeros(1, np.int64),
                  np.ones(1, np.int64), np.dtype(np.uint8), bases=(np.zeros(1, np.int64), np.ones(1, np.int64)))
    np.testing.assert_array_equal(outs[0][1], f[4])


def test_a_chain_of_entries_of_several_codecs_reads_back():
    """Deltas put with another codec than their keyframe's: a read decodes each with its own codec, then XORs."""
    f = _frames(np.random.default_rng(6), 6)
    store = CompressedStore(8, "zstd:-1", item_shape=SHAPE, dtype=np.uint8)
    store.put(np.arange(3), f[:3], bases=np.array([-1, 0, 1]), codec="none")
    store.put(np.arange(3, 6), f[3:], bases=np.array([2, 3, 4]))
    assert set(store.stats()["codecs"]) == {"none", "zstd"}
    got = store.get_many([np.array([5, 1]), np.array([4, 4, 0])])
    np.testing.assert_array_equal(got[0], f[[5, 1]])
    np.testing.assert_array_equal(got[1], f[[4, 4, 0]])


def test_a_delta_codec_codes_the_deltas_of_default_puts_only():
    """`delta_codec`: the deltas of a put with the default codec get it, its keyframes the default codec (and its
    dictionary); a put naming a codec codes all of its rows with that one; the config records it, reads decode both."""
    f = _frames(np.random.default_rng(8), 40)
    store = CompressedStore(40, "zstd:-1", item_shape=SHAPE, dtype=np.uint8, delta_codec="rle", dictionary_bytes=4096, dictionary_samples=8)
    bases = np.where(np.arange(20) % 5 == 0, -1, np.arange(20) - 1)
    store.put(np.arange(20), f[:20], bases=bases)
    store.put(np.arange(20, 30), f[20:30], bases=np.r_[-1, np.arange(20, 29)], codec="igzip:1")
    codecs = store.stats()["codecs"]
    assert codecs["zstd"]["entries"] == 4 and codecs["rle"]["entries"] == 16 and codecs["igzip"]["entries"] == 10
    assert store.config()["delta_codec"] == "rle:8" and CompressedStore(4, "zstd:-1").config()["delta_codec"] is None
    got = store.get_many([np.arange(30)[::-1], np.array([7, 23])])
    np.testing.assert_array_equal(got[0], f[:30][::-1])
    np.testing.assert_array_equal(got[1], f[[7, 23]])
    meta, arrays = store.export_state()
    other = CompressedStore(40, "zstd:-1", item_shape=SHAPE, dtype=np.uint8, delta_codec="rle", dictionary_bytes=4096, dictionary_samples=8)
    other.import_state(meta, arrays)
    np.testing.assert_array_equal(other.get(np.arange(30)), f[:30])
    with pytest.raises(ValueError, match="store config delta_codec: expected None"):
        CompressedStore(40, "zstd:-1", item_shape=SHAPE, dtype=np.uint8, dictionary_bytes=4096, dictionary_samples=8).import_state(meta, arrays)


def test_the_rows_kept_for_the_next_puts_deltas_are_counted():
    """A put with bases keeps, decoded, the rows no delta of it is based on (the next put's likely bases): `nbytes`
    and `stats()` count them; a put without bases, `delete` and `clear` drop them."""
    rng = np.random.default_rng(4)
    frames = _frames(rng, 6)
    store = CompressedStore(16, codec="none")
    store.put(np.arange(3), frames[:3], bases=np.array([-1, 0, 1]))  # one chain: slot 2 is its tip
    s = store.stats()
    assert s["recent_nbytes"] == store.recent_nbytes == frames[0].nbytes + store._recent[0].nbytes > frames[0].nbytes
    assert s["nbytes"] == store.nbytes == s["arena_nbytes"] + s["index_nbytes"] + s["recent_nbytes"]
    store.put(np.arange(3, 6), frames[3:], bases=np.array([2, 3, -1]))  # tips: slots 4 and 5
    assert store.recent_nbytes == 2 * frames[0].nbytes + store._recent[0].nbytes
    store.delete([5])
    assert store.recent_nbytes == 0 and store.nbytes == store.arena_nbytes + store.index_nbytes


def test_membership_by_binary_search_is_isin():
    from host_codecs.deltas import _in_sorted

    rng = np.random.default_rng(0)
    for n, m in [(0, 5), (5, 0), (1, 1), (64, 60), (300, 1000)]:
        s, x = np.unique(rng.integers(0, 2_000_000, n)), rng.integers(0, 2_000_000, m)
        x[: m // 2] = rng.choice(s, m // 2) if s.size else x[: m // 2]
        np.testing.assert_array_equal(_in_sorted(x, s), np.isin(x, s))


@pytest.mark.parametrize("shape", [(12, 10), (13, 7)])
def test_noise_deltas_round_trip(shape):
    """The worst case of RLE deltas (noise: every byte its own run, a payload twice the frame): exact, for frames
    of a multiple of 8 bytes and not, with bases in the put, kept from the last put, and decoded from the store."""
    rng = np.random.default_rng(7)
    f = rng.integers(0, 256, (7, *shape), dtype=np.uint8)
    store = CompressedStore(16, "zstd:-1", item_shape=shape, dtype=np.uint8, delta_codec="rle")
    store.put(np.arange(4), f[:4], bases=np.array([-1, 0, 1, 2]))
    store.put(np.array([8]), f[4:5], bases=np.array([-1]))  # the rows kept for the next put's bases: slot 8's
    store.put(np.array([4, 5]), f[5:], bases=np.array([3, 4]))  # slot 3 decoded from the store
    np.testing.assert_array_equal(store.get(np.array([0, 1, 2, 3, 8, 4, 5])), f)
    assert int(store._length[5]) > f[0].nbytes
