"""host_codecs.chunk_arena.ChunkFileStore: exact reads against the in-memory store, reopening an index, bounded folder
size over many wraps, append-only crash safety, corrupt and truncated chunk files, read-only refusal."""

from __future__ import annotations

import numpy as np
import pytest

from host_codecs import CompressedStore, CorruptEntryError
from host_codecs.chunk_arena import ChunkFileStore
from host_codecs.file_store import FileStore, ReadOnlyError

N = 48
KW = dict(item_shape=(24, 24), dtype=np.uint8, chunk_bytes=1 << 14, min_chunk_bytes=1 << 12)


def _frames(n, seed=0):
    """`n` compressible frames: blocks of a few grey levels, each a small change of the one before."""
    rng = np.random.default_rng(seed)
    base = np.kron(rng.integers(0, 4, (n, 6, 6)), np.ones((4, 4), np.int64)) * 60
    return (base + (rng.random((n, 24, 24)) < 0.02)).astype(np.uint8)


def _pair(tmp_path, codec="zstd:3", **kw):
    return ChunkFileStore(tmp_path / "s", N, codec, mode="w", **KW, **kw), CompressedStore(N, codec, **KW, **kw)


def _folder_bytes(path):
    return sum(p.stat().st_size for p in path.iterdir())


def _reopen(st, tmp_path, name, mode="r"):
    meta, token = st.write_index(tmp_path / "s" / name)
    st.commit(token)
    return ChunkFileStore(tmp_path / "s", N, st.codec.spec, mode=mode, index=tmp_path / "s" / name, meta=meta, **KW)


@pytest.mark.parametrize("codec", ["zstd:3", "rle"])
def test_reads_equal_the_in_memory_store_with_deltas_and_after_reopening(tmp_path, codec):
    disk, mem = _pair(tmp_path, codec)
    frames = _frames(200)
    for i in range(0, 200, 8):  # a ring of N slots, wrapped four times, every batch a delta chain of 8
        s = np.arange(i, i + 8) % N
        bases = np.concatenate([[-1], s[:-1]])
        for st in (disk, mem):
            st.put(s, frames[i : i + 8], bases=bases)
    ids = np.random.default_rng(1).integers(0, N, (4, 30))
    want = mem.get(ids)
    np.testing.assert_array_equal(disk.get(ids), want)
    a, b = disk.get_many([ids[0], ids[1]])
    np.testing.assert_array_equal(a, want[0]), np.testing.assert_array_equal(b, want[1])
    ro = _reopen(disk, tmp_path, "index-1.npz")
    np.testing.assert_array_equal(ro.get(ids), want)
    with pytest.raises(ReadOnlyError, match="mode='r'"):
        ro.put([0], frames[:1])
    assert ro.num_entries == mem.num_entries and ro.payload_nbytes == mem.payload_nbytes


def test_a_ring_that_wraps_many_times_keeps_its_folder_bounded(tmp_path):
    disk, mem = _pair(tmp_path)
    frames = _frames(N * 8)
    sizes = []
    for wrap in range(60):
        for i in range(0, N, 8):
            disk.put(np.arange(i, i + 8), frames[(wrap * N + i) % frames.shape[0] :][:8])
        if wrap % 7 == 6:  # flushes now and then: the files only the previous index named go
            disk.commit(disk.write_index(tmp_path / "s" / f"index-{wrap}.npz")[1])
            (tmp_path / "s" / f"index-{wrap - 7}.npz").unlink(missing_ok=True)
        sizes.append(_folder_bytes(tmp_path / "s"))
    live = disk.payload_nbytes
    assert disk.stats()["num_chunks"] < 10
    # at most the chunks of the last index plus those written since, each about the live payloads and its slack
    assert max(sizes[20:]) < 4 * live + 2 * KW["chunk_bytes"] + 4096, (sizes, live)
    assert max(sizes[40:]) <= 1.5 * max(sizes[10:20])  # no growth with the wraps


def test_the_last_index_reopens_whole_after_later_puts_and_leftovers_go_on_r_plus(tmp_path):
    disk, _ = _pair(tmp_path)
    frames = _frames(4 * N)
    disk.put(np.arange(N), frames[:N])
    meta, token = disk.write_index(tmp_path / "s" / "index-1.npz")
    disk.commit(token)
    for k in range(1, 4):  # overwrite every slot three times without a new index: chunks die, new ones appear
        disk.put(np.arange(N), frames[k * N : (k + 1) * N])
    np.testing.assert_array_equal(disk.get(np.arange(N)), frames[3 * N :])
    names = {p.name for p in (tmp_path / "s").iterdir()}
    st = ChunkFileStore(tmp_path / "s", N, "zstd:3", mode="r+", index=tmp_path / "s" / "index-1.npz", meta=meta, **KW)
    np.testing.assert_array_equal(st.get(np.arange(N)), frames[:N])  # as of that index: append-only
    left = {p.name for p in (tmp_path / "s").iterdir()}
    assert left < names and left == {"index-1.npz", *(f"chunk-{int(c):06d}.bin" for c in meta["chunks"])}
    st.put([0, 1], frames[5:7])  # and it continues
    np.testing.assert_array_equal(st.get([0, 1, 2]), frames[[5, 6, 2]])


def test_a_flipped_byte_or_a_truncated_chunk_file_names_the_slot_and_file(tmp_path):
    disk, _ = _pair(tmp_path)
    frames = _frames(N)
    disk.put(np.arange(N), frames)
    chunk, offset = int(disk._chunk[17]), int(disk._offset[17])
    path = tmp_path / "s" / f"chunk-{chunk:06d}.bin"
    raw = bytearray(path.read_bytes())
    raw[offset + 3] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptEntryError, match=rf"slots \[17\] are corrupt .*chunk-{chunk:06d}\.bin"):
        disk.get([3, 17])
    np.testing.assert_array_equal(disk.get([3]), frames[[3]])
    meta, token = disk.write_index(tmp_path / "s" / "index-1.npz")
    disk.commit(token)
    last = max(int(c) for c in meta["chunks"])
    (tmp_path / "s" / f"chunk-{last:06d}.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=rf"chunk-{last:06d}\.bin: 0 bytes; the store's index needs"):
        ChunkFileStore(tmp_path / "s", N, "zstd:3", mode="r", index=tmp_path / "s" / "index-1.npz", meta=meta, **KW)
    in_last = np.flatnonzero(disk._chunk == last)
    with pytest.raises(CorruptEntryError, match=f"slots \\[{in_last[0]}"):  # the open store reads the cut file as zeros
        disk.get(in_last[:1])


def test_reopening_checks_the_configuration_and_the_index(tmp_path):
    disk, _ = _pair(tmp_path)
    disk.put(np.arange(4), _frames(4))
    meta, token = disk.write_index(tmp_path / "s" / "index-1.npz")
    disk.commit(token)
    with pytest.raises(ValueError, match="config codec is 'zstd:3', this store has 'rle"):
        ChunkFileStore(tmp_path / "s", N, "rle", mode="r", index=tmp_path / "s" / "index-1.npz", meta=meta, **KW)
    bad = {**meta, "chunks": {c: 8 for c in meta["chunks"]}}
    with pytest.raises(ValueError, match=r"index-1\.npz: entries of slots \[0, 1, 2, 3\] name a chunk, range"):
        ChunkFileStore(tmp_path / "s", N, "zstd:3", mode="r", index=tmp_path / "s" / "index-1.npz", meta=bad, **KW)
    with pytest.raises(ValueError, match="not empty"):
        ChunkFileStore(tmp_path / "s", N, "zstd:3", mode="w", **KW)


def test_a_read_of_only_empty_slots_gives_zeros_without_touching_the_chunk_files(tmp_path):
    store = ChunkFileStore(tmp_path / "s", 8, "zstd:3", item_shape=(4, 4), dtype=np.uint8, mode="w")
    store.put(np.arange(2), np.ones((2, 4, 4), np.uint8))
    got = store.get_many([np.array([5, 6])], missing="zeros")[0]
    assert got.shape == (2, 4, 4) and not got.any()
    np.testing.assert_array_equal(store.get_many([np.array([1, 7])], missing="zeros")[0], [np.ones((4, 4)), np.zeros((4, 4))])


def test_import_from_a_payload_source_writes_its_pieces_into_chunk_files(tmp_path):
    """The pieces a payload source fills (`import_state`) cannot become chunk files: they are written into new ones,
    and the store reads and writes on as the in-memory store does."""
    files, mem = _pair(tmp_path)
    frames = _frames(2 * N)
    mem.put(np.arange(N), frames[:N])
    meta, arrays = mem.export_state()

    class Source:
        nbytes = arrays["payload"].nbytes

        def read_pieces(self, pieces):
            at = 0
            for p in pieces:
                p[:] = arrays["payload"][at : at + p.size]
                at += p.size

    files.import_state(meta, {**arrays, "payload": Source()}, adopt=True)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [f"chunk-{c:06d}.bin" for c in sorted(files._arena.chunks)]
    assert _folder_bytes(tmp_path / "s") == files.stats()["arena_nbytes"] == Source.nbytes
    for s in (files, mem):
        s.put(np.arange(N // 2), frames[N : N + N // 2])
    np.testing.assert_array_equal(files.get(np.arange(N)), mem.get(np.arange(N)))


@pytest.mark.parametrize("directory", ["", None, 3, b"s"])
def test_a_directory_that_is_not_a_path_is_refused_naming_it(tmp_path, directory, monkeypatch):
    """`directory` is checked as `FileStore`'s `path` is: an empty str (the current folder) or a non-path is a
    TypeError naming it, before anything is created."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=r"^directory: expected a file path \(a non-empty str or os.PathLike\), got "):
        ChunkFileStore(directory, N, "zstd:3", mode="w", **KW)
    assert list(tmp_path.iterdir()) == []


def test_a_bad_mode_is_refused_as_file_stores_is(tmp_path):
    for make in (lambda: ChunkFileStore(tmp_path / "s", N, "zstd:3", mode="a", **KW),
                 lambda: FileStore(tmp_path / "f", N, (2,), np.uint8, mode="a")):
        with pytest.raises(ValueError, match=r"^mode: expected 'w', 'r\+' or 'r', got 'a'$"):
            make()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mode", ["r", "r+"])
@pytest.mark.parametrize("index", ["", 3, b"index-1.npz"])
def test_an_index_that_is_not_a_path_is_refused_naming_it(tmp_path, index, mode, monkeypatch):
    """`index` is checked as `directory` (and `FileStore`'s `index`) is: an empty str (the current folder) or a
    non-path is a TypeError naming it, before the folder is touched; a `meta` that is not a dict names `meta`."""
    st, _ = _pair(tmp_path)
    st.put(np.arange(4), _frames(4))
    meta, token = st.write_index(tmp_path / "s" / "index-1.npz")
    st.commit(token)
    (tmp_path / "s" / "leftover").write_bytes(b"x")  # "r+" removes the files an index it opens does not name
    monkeypatch.chdir(tmp_path / "s")
    with pytest.raises(TypeError, match=r"^index: expected a file path \(a non-empty str or os.PathLike\), got "):
        ChunkFileStore(tmp_path / "s", N, "zstd:3", mode=mode, index=index, meta=meta, **KW)
    with pytest.raises(TypeError, match=r"^meta: expected the dict write_index returned with the index file, got list "):
        ChunkFileStore(tmp_path / "s", N, "zstd:3", mode=mode, index=tmp_path / "s" / "index-1.npz", meta=[meta], **KW)
    assert (tmp_path / "s" / "leftover").exists()
