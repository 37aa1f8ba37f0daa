"""A checkpoint's arrays written straight from host memory and read straight into the memory the restored arrays
own, checksummed on the bytes written and read.

`arrays/` of a one-process save is an orbax-checkpoint PyTree checkpoint of numpy arrays, in the layout
`orbax.checkpoint.PyTreeCheckpointHandler(use_ocdbt=False, use_compression=False)` writes for them: `_METADATA` (the
tree: each array's keys, `np.ndarray`; each empty dict, `Dict`) and every array as a zarr v2 array of a single
uncompressed C-order chunk, `arrays/<name>/.zarray` and one chunk file (`0`, `0.0`, ...) holding the array's bytes as
they lie in memory (`<name>`: its keys joined by `.`); an array of a dtype other than numpy's and bfloat16 (float8,
int4, ...) as the unsigned integers of its item size holding its bytes (`stored`). `write` writes those files itself:
each array's bytes go from the memory they lie in to the file, hashed block by block as they are handed to the
kernel, each file synced once, several files at once. (orbax's own write, through tensorstore, takes each array through buffers of its own and
writes each file under a temporary name, then syncs and renames it and syncs its folder; the manifest then had to
read every file back to hash it.) Several processes' saves are written by orbax (`jaxbuffers._checkpoint_processes`).

An array stored as one chunk is read here with one copy of its bytes:

* onto one CPU device (arrays of `_MAPPED` bytes or more): the file is memory-mapped and XLA copies it into a
  buffer of its own (which a donation then updates in place); its xxh3-64 is taken over that buffer;
* anywhere else (an accelerator, several devices, small arrays, the host stores' numpy arrays): the file is read
  into host memory and hashed in the same pass, then put on the devices;
* a host store's packed payloads (`HostSource`): read, when the store asks for them, straight into the arena chunks
  it then holds (`host_codecs.CompressedStore.import_state`), hashed in the same pass; the other host arrays become
  the store's index as they were read.

Either way the bytes checked against the manifest are the bytes the restored array holds (or was copied from), and
a mismatch raises `CheckpointError` naming the file. Any other layout (several chunks, compression, another dtype
than expected, ocdbt) is not planned here and is read by orbax.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xxhash

from host_codecs import num_threads
from host_codecs.snapshot import PayloadRuns
from jaxbuffers._checkpoint_describe import _DTYPES, _NAMED_DTYPES, CheckpointError
from jaxbuffers._checkpoint_files import _BLOCK, _SYNC_THREADS, _mismatch, _Progress, _write_file

_MAPPED = 1 << 20  # bytes: smaller arrays are read and put (no copy program compiled for each shape)
_READ_BLOCK = 4 << 20  # bytes of one positioned read (`_read_into`)
_NAMED = {d for n, d in _DTYPES.items() if n in _NAMED_DTYPES}  # stored under their own zarr dtype
_ZARR_DTYPES = {("bfloat16" if d == jnp.bfloat16 else d.str): d for d in _NAMED}


# --- how each dtype is stored ---

def stored_dtype(dtype: Any) -> np.dtype:
    """The dtype an array of `dtype` is stored as: itself for numpy's dtypes and bfloat16 (zarr and tensorstore name
    them), else (float8, float4, int4, uint4, int2, ...: ml_dtypes that not every zarr reader names) the unsigned
    integers of its item size holding its bytes as JAX holds them on host (a sub-byte value in the low bits of a
    byte). buffer.json names the dtype itself."""
    dtype = np.dtype(dtype)
    return dtype if dtype in _NAMED else np.dtype(f"uint{8 * dtype.itemsize}")


def stored(x: Any) -> Any:
    """`x` (a numpy array, or a JAX array anywhere) as it is stored (`stored_dtype`), the same bytes."""
    want = stored_dtype(x.dtype)
    if want == x.dtype:
        return x
    if isinstance(x, np.ndarray):
        return x.view(want)
    return _to_bits(x)


def loaded(x: Any, dtype: Any) -> Any:
    """The array of `dtype` stored as `x` (`stored`; a numpy array, or a JAX array anywhere); `x` itself when it is not
    of `dtype`'s stored dtype (the caller names the mismatch)."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype or x.dtype != stored_dtype(dtype):
        return x
    if isinstance(x, np.ndarray):
        return x.view(dtype)
    return _from_bits(x, dtype)


@jax.jit
def _to_bits(x: jax.Array) -> jax.Array:
    bits = jax.dtypes.itemsize_bits(x.dtype)
    return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{bits}")).astype(stored_dtype(x.dtype))


@functools.partial(jax.jit, static_argnums=1)
def _from_bits(x: jax.Array, dtype: np.dtype) -> jax.Array:
    return jax.lax.bitcast_convert_type(x.astype(jnp.dtype(f"uint{jax.dtypes.itemsize_bits(dtype)}")), dtype)


def _chunk_file(shape: tuple) -> str:
    """The name of the one chunk file of an array of `shape`."""
    return ".".join("0" * len(shape)) if shape else "0"


# --- writing ---

def write(root: Path, tree: dict, progress) -> dict[str, dict]:
    """Write `tree` (dicts of string keys down to arrays on host memory: numpy, JAX arrays on a CPU device, or a host
    store's payload as the runs of arena bytes it joins, `host_codecs.snapshot.PayloadRuns`, written as one array) into
    the new folder `root / "arrays"` (module doc), each file synced (its folders are not: `_write_manifest` syncs
    them). Returns the manifest entry of every file written, by path relative to `root`.

    Raises:
      OSError: naming the file that could not be written.
    """
    folder, quiet = root / "arrays", _Progress(False, "")  # the bar counts the arrays' bytes
    folder.mkdir()
    files: list[tuple[str, Any]] = []
    tree_metadata = {}
    for keys, x in _items(tree):
        value = {"value_type": "Dict", "skip_deserialize": True}
        if x is not None:
            a = x if isinstance(x, PayloadRuns) else stored(np.asarray(x))  # a CPU array's own memory, no copy
            name = ".".join(keys)
            (folder / name).mkdir()
            zdtype = "bfloat16" if a.dtype == jnp.bfloat16 else a.dtype.str
            z = {"chunks": list(a.shape), "compressor": None, "dimension_separator": ".", "dtype": zdtype,
                 "fill_value": None, "filters": None, "order": "C", "shape": list(a.shape), "zarr_format": 2}
            files.append((f"{name}/.zarray", json.dumps(z, separators=(",", ":")).encode()))
            if a.size:
                files.append((f"{name}/{_chunk_file(a.shape)}", a))
            value = {"value_type": "np.ndarray", "skip_deserialize": False}
        keyed = [{"key": k, "key_type": 2} for k in keys]  # key_type 2: a dict key
        tree_metadata[str(keys)] = {"key_metadata": keyed, "value_metadata": value}
    metadata = {"tree_metadata": tree_metadata, "use_ocdbt": False, "use_zarr3": False,
                "store_array_data_equal_to_fill_value": True, "custom_metadata": None}
    files.append(("_METADATA", json.dumps(metadata).encode()))
    files.sort(key=lambda f: -(len(f[1]) if isinstance(f[1], bytes) else f[1].nbytes))  # the largest first

    def one(f: tuple[str, Any]) -> dict:
        data = f[1].runs if isinstance(f[1], PayloadRuns) else f[1]
        return _write_file(folder / f[0], data, quiet if isinstance(data, bytes) else progress)

    with ThreadPoolExecutor(_SYNC_THREADS) as pool:
        entries = list(pool.map(one, files))
    return {f"arrays/{rel}": e for (rel, _), e in zip(files, entries)}


def _items(tree: dict, keys: tuple = ()):
    """`(keys, array)` of every array of `tree` and `(keys, None)` of every empty dict, keys sorted as JAX flattens."""
    for k in sorted(tree):
        if isinstance(tree[k], dict) and tree[k]:
            yield from _items(tree[k], (*keys, k))
        else:
            yield (*keys, k), None if isinstance(tree[k], dict) else tree[k]


# --- reading ---

class Chunk(NamedTuple):
    """One array stored as one uncompressed C-order chunk file."""

    rel: str  # the chunk file, relative to the checkpoint folder (its manifest key)
    shape: tuple
    dtype: np.dtype


def deferred(listed: dict) -> set[str]:
    """The files of `listed` (manifest paths) that may be array chunks under `arrays/<name>/`: their checksums are
    taken while they are read (`plan`), every other file is verified first."""
    return {rel for rel in listed if rel.startswith("arrays/") and rel.count("/") == 2 and not rel.rsplit("/", 1)[1].startswith(".")}


def plan(root: Path, names: dict[str, tuple], listed: dict) -> dict[str, Chunk] | None:
    """The chunk of each array `name` of `names`, which maps it to its expected `(shape, dtype)` (either None: any),
    or None if any of them is stored otherwise (orbax then reads them all). Each `root / "arrays" / name / ".zarray"`
    must have been verified against the manifest `listed`."""
    out = {}
    for name, (shape, dtype) in names.items():
        chunk = _single_chunk(root, name, listed)
        if chunk is None or (shape is not None and chunk.shape != tuple(shape)) or (dtype is not None and chunk.dtype != stored_dtype(dtype)):
            return None
        out[name] = chunk if dtype is None else chunk._replace(dtype=np.dtype(dtype))  # a dtype stored as bytes: itself
    return out


def _single_chunk(root: Path, name: str, listed: dict) -> Chunk | None:
    rel = f"arrays/{name}/.zarray"
    if rel not in listed:
        return None
    try:
        z = json.loads((root / rel).read_text())
        shape = tuple(int(n) for n in z["shape"])
        simple = (z.get("zarr_format") == 2 and z.get("compressor") is None and not z.get("filters") and z.get("order") == "C"
                  and [int(n) for n in z["chunks"]] == list(shape) and z["dtype"] in _ZARR_DTYPES)
        simple = simple and z.get("dimension_separator", ".") == "."
    except (OSError, ValueError, KeyError, TypeError):
        return None  # orbax reads it, or names what is wrong with it
    if not simple:
        return None
    dtype = np.dtype(_ZARR_DTYPES[z["dtype"]])
    key = f"arrays/{name}/{_chunk_file(shape)}"
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if key not in listed or int(listed[key]["bytes"]) != nbytes or nbytes == 0:
        return None
    return Chunk(key, shape, dtype)


def _hash(data: np.ndarray, progress) -> str:
    h, flat = xxhash.xxh3_64(), data.reshape(-1).view(np.uint8)
    for a in range(0, flat.size, _BLOCK):
        h.update(flat[a : a + _BLOCK])
        progress.update(min(_BLOCK, flat.size - a))
    return h.hexdigest()


def to_host(root: Path, chunk: Chunk, want: str, progress) -> np.ndarray:
    """The chunk's array in new host memory, hashed block by block as it is read.

    Raises:
      CheckpointError: its xxh3-64 is not `want`, or the file ends early (naming the file).
    """
    out = np.empty(chunk.shape, chunk.dtype)
    _read_into(root / chunk.rel, [out.reshape(-1).view(np.uint8)], want, progress)
    return out


class HostSource:
    """A host store's packed payload file, read when its store asks for it straight into the arena chunks it will
    hold (`host_codecs.CompressedStore.import_state`'s payload source): one copy of the bytes, hashed as read.

    Attributes:
      nbytes: the file's size (the payload's).
    """

    def __init__(self, root: Path, chunk: Chunk, want: str, progress):
        self.path, self.want, self.progress = root / chunk.rel, want, progress
        self.nbytes = chunk.dtype.itemsize * int(np.prod(chunk.shape))

    def read_pieces(self, pieces: list[np.ndarray]) -> None:
        """Fill `pieces` (uint8, sizes summing to `nbytes`) with the file's bytes in order.

        Raises:
          CheckpointError: the sizes do not sum to the file's, its xxh3-64 is not the manifest's, or the file ends
            early (naming the file).
        """
        if sum(p.nbytes for p in pieces) != self.nbytes:
            raise CheckpointError(f"{self.path}: {self.nbytes} bytes, asked for {sum(p.nbytes for p in pieces)}")
        _read_into(self.path, pieces, self.want, self.progress)


def _read_into(path: Path, flats: list[np.ndarray], want: str, progress) -> None:
    """Read the file `path` into the uint8 arrays `flats` in order, hashing block by block (to_host): blocks of
    `_READ_BLOCK` bytes read by a pool of threads (positioned reads, the GIL released), hashed in file order by the
    calling thread as they arrive."""
    blocks, at = [], 0
    for flat in flats:
        blocks += [(at + a, flat[a : a + _READ_BLOCK]) for a in range(0, flat.size, _READ_BLOCK)]
        at += flat.size
    h = xxhash.xxh3_64()
    fd = os.open(path, os.O_RDONLY)
    try:
        def read(block: tuple[int, np.ndarray]) -> bool:
            start, view = block
            got = 0
            while got < view.size and (n := os.preadv(fd, [view[got:]], start + got)):
                got += n
            return got == view.size

        with ThreadPoolExecutor(max(1, min(len(blocks) - 1, num_threads()))) as pool:  # one block: read here
            for (_, view), whole in zip(blocks, pool.map(read, blocks) if len(blocks) > 1 else map(read, blocks)):
                if not whole:
                    raise CheckpointError(f"{path}: shorter than the manifest says (truncated while read)")
                h.update(view)
                progress.update(view.size)
    finally:
        os.close(fd)
    if h.hexdigest() != want:
        raise _mismatch(path)


_copy_one = jax.jit(jnp.copy)  # one program per shape, dtype and sharding, compiled once for every later restore


def on_devices(arrays: list[np.ndarray], shardings: list) -> list:
    """`arrays` put on `shardings`, each in memory that XLA owns, so that donating it updates it in place.

    On CPU `device_put` can wrap the numpy memory itself (depending on its alignment), and donating such an array
    copies it: those arrays are copied once here, each by a copy program compiled once per shape, dtype and sharding.
    (Which arrays are wrapped changes from one restore to the next with where numpy's allocator put them, so one
    program over all of them would be compiled anew at almost every restore.)"""
    out = jax.device_put(arrays, shardings)
    wrapped = [i for i, (a, x) in enumerate(zip(arrays, out)) if a.nbytes and _wraps(a, x)]
    for i in wrapped:
        out[i] = _copy_one(out[i])
    return out


def _wraps(a: np.ndarray, x: jax.Array) -> bool:
    lo = a.ctypes.data
    return any(s.device.platform == "cpu" and lo <= s.data.unsafe_buffer_pointer() < lo + a.nbytes for s in x.addressable_shards)


def to_device(root: Path, chunk: Chunk, want: str, sharding: jax.sharding.Sharding, progress) -> jax.Array:
    """The chunk's array on `sharding`, in memory XLA owns, its bytes copied once and hashed (module doc).

    Raises:
      CheckpointError: its xxh3-64 is not `want` (naming the file).
    """
    nbytes = chunk.dtype.itemsize * int(np.prod(chunk.shape))
    one_cpu = len(sharding.device_set) == 1 and next(iter(sharding.device_set)).platform == "cpu"
    if not one_cpu or nbytes < _MAPPED or chunk.dtype not in _NAMED or chunk.dtype == jnp.bfloat16:  # numpy's dlpack: numpy's dtypes
        return on_devices([to_host(root, chunk, want, progress)], [sharding])[0]
    path = root / chunk.rel
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != nbytes:
            raise CheckpointError(f"{path}: its size changed since the manifest was checked")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mapped.madvise(mmap.MADV_WILLNEED)  # read ahead from the disk if the file is not in the page cache
    x = on_devices([np.frombuffer(mapped, chunk.dtype).reshape(chunk.shape)], [sharding])[0].block_until_ready()
    view = np.from_dlpack(x)  # XLA's buffer, zero-copy; dropped before returning, so a donation still updates in place
    try:
        got = _hash(view, progress)
    finally:
        del view
    if got != want:
        raise _mismatch(path)
    return x
