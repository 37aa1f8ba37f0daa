"""host_codecs.FileStore: modes, reopen checks, exact reads, checksums."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from host_codecs import CorruptEntryError
from host_codecs.file_store import FileStore, ReadOnlyError


def _filled(tmp_path, n=16):
    st = FileStore(tmp_path / "x", n, (3, 5), np.float32, mode="w", name="x")
    data = np.random.default_rng(0).standard_normal((n, 3, 5)).astype(np.float32)
    st.put(np.arange(n - 1), data[: n - 1])  # slot n - 1 stays empty
    return st, data


def test_reads_are_exact_with_repeats_zeros_and_several_outputs(tmp_path):
    st, data = _filled(tmp_path)
    ids = np.array([[3, 3], [14, 0]])
    np.testing.assert_array_equal(st.get(ids), data[ids])
    chains: list = []
    a, b = st.get_many([np.array([5, 15, 6]), np.array([6, 5])], missing="zeros", chains_out=chains)
    assert len(chains) == 1 and chains[0].size == 0  # no deltas in a file store
    np.testing.assert_array_equal(a, np.stack([data[5], np.zeros((3, 5), np.float32), data[6]]))
    np.testing.assert_array_equal(b, data[[6, 5]])
    with pytest.raises(KeyError, match="never written"):
        st.get([15])
    st.put([2, 2], data[[7, 8]])  # the last one wins
    np.testing.assert_array_equal(st.get([2])[0], data[8])


def test_modes_and_reopen(tmp_path):
    st, data = _filled(tmp_path)
    st.flush()
    st.close()
    rw = FileStore(tmp_path / "x", 16, (3, 5), np.float32, mode="r+")
    np.testing.assert_array_equal(rw.get(np.arange(15)), data[:15])
    rw.put([15], data[15:])
    rw.flush()
    rw.close()
    ro = FileStore(tmp_path / "x", 16, (3, 5), np.float32, mode="r")
    np.testing.assert_array_equal(ro.get(np.arange(16)), data)
    with pytest.raises(ReadOnlyError, match="mode='r'"):
        ro.put([0], data[:1])
    np.testing.assert_array_equal(ro.get([0]), data[:1])
    with pytest.raises(ValueError, match=r"x\.npy: shape .* on disk, expected \(16, 3, 6\)"):
        FileStore(tmp_path / "x", 16, (3, 6), np.float32, mode="r")
    with pytest.raises(ValueError, match=r"x\.npy: dtype float32 on disk, expected float64"):
        FileStore(tmp_path / "x", 16, (3, 5), np.float64, mode="r")
    with pytest.raises(ValueError, match="mode"):
        FileStore(tmp_path / "x", 16, (3, 5), np.float32, mode="a")


def test_changed_bytes_and_truncation_are_detected(tmp_path):
    st, data = _filled(tmp_path)
    st.flush()
    with open(st.data_path, "r+b") as f:  # one byte of slot 4
        f.seek(st._offsets[0] + 4 * st.row_nbytes + 7)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptEntryError, match=r"x\.npy: slots \[4\]"):
        st.get([1, 4])
    np.testing.assert_array_equal(st.get([1]), data[[1]])
    st.close()
    with open(st.data_path, "r+b") as f:
        f.truncate(st._offsets[0] + 3 * st.row_nbytes)
    with pytest.raises(ValueError, match="truncated"):
        FileStore(tmp_path / "x", 16, (3, 5), np.float32, mode="r")


def test_put_refuses_other_shapes_and_dtypes(tmp_path):
    st, data = _filled(tmp_path)
    with pytest.raises(ValueError, match="arrays: expected shape"):
        st.put([0], data[:1].astype(np.float64))
    with pytest.raises(IndexError, match="slot 16 out of range"):
        st.put([16], data[:1])
    np.testing.assert_array_equal(st.get([0]), data[:1])


def test_puts_never_overwrite_what_the_last_commit_names(tmp_path):
    """Slots rewritten after a flush go to their other copy: a store reopened from the flushed index reads the flushed
    entries exactly, the writer reads its newest ones (runs of consecutive slots split between the two files), and
    after the next flush a reopen reads those. A store whose index names no second copy opens without its file."""
    st, data = _filled(tmp_path)
    st.flush()
    new = data[::-1].copy()
    st.put(np.arange(4, 12), new[4:12])
    st.put([5], new[[0]])  # a second put of a slot before the commit rewrites the same copy
    want = data.copy()
    want[4:12], want[5] = new[4:12], new[0]
    np.testing.assert_array_equal(st.get(np.arange(15)), want[:15])
    assert st._index[2].tolist() == [0] * 4 + [1] * 8 + [0] * 4
    ro = FileStore(tmp_path / "x", 16, (3, 5), np.float32, mode="r")
    np.testing.assert_array_equal(ro.get(np.arange(15)), data[:15])
    st.flush()
    st.put(np.arange(0, 8), data[:8])  # slots 4..7 back to copy 0, 0..3 to copy 1
    np.testing.assert_array_equal(FileStore(tmp_path / "x", 16, (3, 5), np.float32, mode="r").get(np.arange(15)), want[:15])
    st.flush()
    want[:8] = data[:8]
    np.testing.assert_array_equal(FileStore(tmp_path / "x", 16, (3, 5), np.float32, mode="r").get(np.arange(15)), want[:15])
    assert st._index[2].tolist() == [1] * 4 + [0] * 4 + [1] * 4 + [0] * 4
    st.close()
    one, old = tmp_path / "one", FileStore(tmp_path / "one", 4, (2,), np.uint8, mode="w")
    old.put(np.arange(4), np.arange(8, dtype=np.uint8).reshape(4, 2))
    old.flush()
    old.close()
    assert np.load(old.index_path)[0].tolist() == [1] * 4  # as a store of one file wrote it
    old.copy_path.unlink()
    np.testing.assert_array_equal(FileStore(one, 4, (2,), np.uint8, mode="r").get(np.arange(4)), np.arange(8).reshape(4, 2))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
def test_files_close_when_a_store_is_dropped_unclosed_and_when_its_constructor_fails(tmp_path):
    st, data = _filled(tmp_path)
    st.flush()
    st.close()
    st.close()  # twice: nothing more to close
    before = _open_fds()
    for _ in range(20):
        ro = FileStore(tmp_path / "x", 16, (3, 5), np.float32, mode="r")
        np.testing.assert_array_equal(ro.get([4]), data[[4]])
        del ro  # never closed: collected, its two files close
    gc.collect()
    assert _open_fds() == before
    with open(tmp_path / "x.1.npy", "r+b") as f:  # the copy file, checked after the data file is opened
        f.truncate(200)
    for _ in range(20):
        with pytest.raises(ValueError, match=r"x\.1\.npy: .* \(truncated\)"):
            FileStore(tmp_path / "x", 16, (3, 5), np.float32, mode="r")
    assert _open_fds() == before


def test_sizes_and_paths_are_refused_naming_the_argument(tmp_path):
    """`num_slots` an int >= 1 (Python or numpy); `path` and `index` a non-empty str or os.PathLike: anything else is
    refused naming the argument, before any file is created."""
    assert FileStore(tmp_path / "a", np.int32(2), (1,), np.uint8, mode="w").num_slots == 2
    for bad in (0, 1.0, True, "2", None):
        with pytest.raises(ValueError, match=r"num_slots: expected an int in \[1, inf\], got"):
            FileStore(tmp_path / "b", bad, (1,), np.uint8, mode="w")
    for bad in (None, "", 5, b"x"):
        with pytest.raises(TypeError, match=r"path: expected a file path \(a non-empty str or os.PathLike\), got"):
            FileStore(bad, 2, (1,), np.uint8, mode="w")
        if bad is not None:  # None: the default index file
            with pytest.raises(TypeError, match=r"index: expected a file path \(a non-empty str or os.PathLike\), got"):
                FileStore(tmp_path / "c", 2, (1,), np.uint8, mode="w", index=bad)
    assert not any(tmp_path.glob("[bc]*"))
