"""Whole pytrees between JAX and PyTorch through DLPack, zero copy where the frameworks allow it (import this
submodule explicitly: `jaxbuffers` never imports PyTorch). `SUPPORTED_DTYPES` maps each numpy/JAX dtype converted
(both directions) to its torch dtype. Leaf policy, dtypes, copies, aliasing and errors: `docs/api/torch.md`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

try:
    import torch
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("jaxbuffers.interop.torch needs PyTorch; install it with `pip install 'jaxbuffers[torch]'`") from err

from jaxbuffers import _validate
from jaxbuffers._validate import leaf_name

__all__ = ["SUPPORTED_DTYPES", "from_torch", "to_torch"]

_NAMES = ("bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128")
# numpy/JAX dtype -> torch dtype, for every dtype this module converts (both directions).
SUPPORTED_DTYPES: dict[np.dtype, torch.dtype] = {np.dtype(getattr(jnp, n.replace("bool", "bool_"))): getattr(torch, n) for n in _NAMES}
_TORCH_TO_NUMPY = {t: n for n, t in SUPPORTED_DTYPES.items()}
_BF16 = np.dtype(jnp.bfloat16)
_SUPPORTED_NAMES = ", ".join(str(d) for d in SUPPORTED_DTYPES)
_WRAPS = ((bool, "np.bool_"), (int, "np.int32"), (float, "np.float32"), (complex, "np.complex64"))


def _where(fn: str, path) -> str:
    return f"{fn}: leaf {leaf_name(path)}"


def _bad_leaf(fn: str, path, leaf) -> TypeError:
    wrap = next((w for t, w in _WRAPS if isinstance(leaf, t)), None)
    hint = ("expected a jax.Array, torch.Tensor, numpy array or numpy scalar" if wrap is None
            else f"its dtype would be a guess; wrap it with an explicit dtype, e.g. {wrap}({leaf!r})")
    text = repr(leaf)
    text = text if len(text) <= 60 else text[:57] + "..."
    return TypeError(f"{_where(fn, path)}: cannot convert {type(leaf).__name__} {text}: {hint}")


def _check_dtype(fn: str, path, dtype, supported: dict = SUPPORTED_DTYPES) -> None:
    if dtype not in supported:
        names = ", ".join(map(str, supported))
        raise TypeError(f"{_where(fn, path)}: dtype {dtype} is not supported (supported: {names}); "
                        "cast it explicitly first")


def _check_x64(path, dtype: np.dtype, shown, numpy: bool = False) -> None:
    """Refuse a 64-bit dtype that JAX would narrow (x64 off) instead of narrowing it silently."""
    if not _validate.jax_holds(dtype):
        narrow = str(jax.dtypes.canonicalize_dtype(dtype))
        cast = f"array.astype(np.{narrow})" if numpy else f"tensor.to(torch.{narrow})"
        raise TypeError(f"{_where('from_torch', path)}: {shown} cannot become a JAX array without narrowing to "
                        f"{narrow} because jax_enable_x64 is off; cast it explicitly (e.g. {cast}) or "
                        f'enable 64-bit JAX with jax.config.update("jax_enable_x64", True)')


def _jax_leaf_to_torch(path, x: jax.Array, host: bool = False) -> torch.Tensor:
    if isinstance(x, jax.core.Tracer):
        raise TypeError(f"{_where('to_torch', path)}: got a traced value ({type(x).__name__}); to_torch converts "
                        f"concrete arrays, so call it outside jit/vmap/scan, on the function's outputs")
    dtype = x.dtype
    if dtype not in SUPPORTED_DTYPES:
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # numpy has no dtype for typed keys
            raise TypeError(f"{_where('to_torch', path)}: dtype {dtype} (a PRNG key) is not supported (supported: "
                            f"{_SUPPORTED_NAMES}); convert its raw bits with jax.random.key_data first")
        _check_dtype("to_torch", path, np.dtype(dtype))
    if x.is_deleted():
        raise ValueError(f"{_where('to_torch', path)}: the JAX array has been deleted or donated")
    if len(x.sharding.device_set) > 1:
        if not x.is_fully_replicated:
            raise ValueError(f"{_where('to_torch', path)}: array of shape {x.shape} is sharded over "
                             f"{len(x.sharding.device_set)} devices; gather it first (jax.device_get or a replicated "
                             f"sharding) or convert its shards: [to_torch(s.data) for s in x.addressable_shards]")
        x = x.addressable_data(0)  # every local shard holds the whole array: use the first, no copy
    if host:  # a CPU tensor through numpy's view (cheaper than JAX's DLPack export); one copy from another device.
        a = np.asarray(x)  # C-contiguous, native byte order: only bfloat16 needs `_numpy_leaf_to_torch`
        return _numpy_leaf_to_torch(path, a) if dtype == _BF16 else torch.from_dlpack(a)
    return torch.from_dlpack(x)


def _numpy_leaf_to_torch(path, a: np.ndarray) -> torch.Tensor:
    dtype = a.dtype
    if not dtype.isnative:
        raise TypeError(f"{_where('to_torch', path)}: non-native byte order {dtype.str}; convert it first with a.astype(a.dtype.newbyteorder('='))")
    _check_dtype("to_torch", path, dtype)
    if a.size and any(s < 0 or s % a.itemsize for s in a.strides):
        a = np.ascontiguousarray(a)  # strides torch cannot represent (DLPack aborts on negative ones): one copy
    if dtype == _BF16:  # numpy has no DLPack code for ml_dtypes.bfloat16: reinterpret the bits
        return torch.from_dlpack(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_dlpack(a)  # not from_numpy: same aliasing, no warning for read-only arrays


def to_torch(tree: Any, device: torch.device | str | int | None = None, *, copy: bool = False) -> Any:
    """The same tree with every array leaf a ``torch.Tensor`` of its shape and dtype (`SUPPORTED_DTYPES`), zero copy
    where possible.

    Args:
      tree: any pytree whose leaves are ``jax.Array``, ``numpy.ndarray``/numpy scalars or ``torch.Tensor``.
      device: torch device (``torch.device``, ``"cpu"``, ``"cuda:0"``, index) for every tensor (one copy for a leaf
        elsewhere), or ``None`` to keep each leaf on its device (a JAX GPU array becomes a CUDA tensor).
      copy: if True every returned tensor owns its memory (safe to write in place); if False (default) tensors
        alias the JAX/numpy buffers where possible: do not write them in place.

    Raises:
      TypeError: a leaf that is not an array (e.g. a Python number or string), an unsupported dtype, or a traced
        value (called inside ``jit``); the message names the leaf path.
      ValueError: a deleted/donated JAX array, or one sharded over several devices.
    """
    copy = _validate.static_bool("copy", copy)
    dev = None if device is None else torch.device(device)
    host = dev is not None and dev.type == "cpu"

    def convert(path, leaf):
        if isinstance(leaf, torch.Tensor):
            t = leaf
        elif isinstance(leaf, jax.Array):
            t = _jax_leaf_to_torch(path, leaf, host)
        elif isinstance(leaf, (np.ndarray, np.generic)):
            t = _numpy_leaf_to_torch(path, np.asarray(leaf))
        else:
            raise _bad_leaf("to_torch", path, leaf)
        moved = t if dev is None else t.to(dev)
        if copy and moved is t:  # .to() returns the tensor itself when nothing moves
            if isinstance(leaf, jax.Array) and moved.device.type == "cpu":  # via numpy (docs/api/torch.md, "Copies")
                moved = _numpy_leaf_to_torch(path, np.array(leaf))
            else:
                moved = moved.clone(memory_format=torch.contiguous_format)
        return moved

    try:  # leaf paths name a leaf in an error only: the conversion that fails is made again with them
        return jax.tree.map(lambda leaf: convert(None, leaf), tree)
    except (TypeError, ValueError):
        return jax.tree_util.tree_map_with_path(convert, tree)


def _dense_up_to_permutation(t: torch.Tensor) -> bool:
    """True if the strides are a permutation of a dense row-major layout (what XLA can alias)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _torch_leaf_to_jax(path, t: torch.Tensor, copy: bool) -> jax.Array:
    if t.layout != torch.strided:
        raise TypeError(f"{_where('from_torch', path)}: {t.layout} tensors are not supported; convert with tensor.to_dense()")
    _check_dtype("from_torch", path, t.dtype, _TORCH_TO_NUMPY)
    _check_x64(path, _TORCH_TO_NUMPY[t.dtype], t.dtype)
    t = t.detach().resolve_conj().resolve_neg()
    dense = t.numel() > 0 and _dense_up_to_permutation(t)
    if t.device.type == "cpu" and (copy or not dense):  # one copy into XLA memory from a numpy view (any strides)
        view = t.view(torch.uint16).numpy().view(_BF16) if t.dtype == torch.bfloat16 else t.numpy()
        return jnp.array(view, copy=True)
    if copy:
        t = t.clone(memory_format=torch.contiguous_format)
    elif not dense:
        t = t.contiguous()
    try:
        return jax.dlpack.from_dlpack(t)
    except BufferError as err:
        raise TypeError(f"{_where('from_torch', path)}: DLPack refused the tensor: {err}") from err


def from_torch(tree: Any, *, copy: bool = False) -> Any:
    """The same tree with every ``torch.Tensor`` leaf a ``jax.Array`` of its shape and dtype on the JAX device of the
    tensor, zero copy where possible.

    Args:
      tree: any pytree whose leaves are ``torch.Tensor``, ``jax.Array`` (kept) or numpy arrays/scalars (copied).
      copy: if True the JAX arrays own their memory; if False (default) each array aliases its tensor's memory
        where the layout allows it (on the tensor's device): do not write the tensor in place afterwards.

    Raises:
      TypeError: a leaf that is not an array, an unsupported dtype or layout, or a 64-bit tensor (int64, uint64,
        float64, complex128) while ``jax_enable_x64`` is off (never narrowed silently); the message names the leaf.
    """
    copy = _validate.static_bool("copy", copy)

    def convert(path, leaf):
        if isinstance(leaf, torch.Tensor):
            return _torch_leaf_to_jax(path, leaf, copy)
        if isinstance(leaf, jax.Array):
            return jnp.array(leaf, copy=True) if copy else leaf
        if isinstance(leaf, (np.ndarray, np.generic)):
            a = np.asarray(leaf)
            if not a.dtype.isnative:  # e.g. big-endian '>f4' read from a file: the same values, native order
                a = a.astype(a.dtype.newbyteorder("="))
            _check_dtype("from_torch", path, a.dtype)
            _check_x64(path, a.dtype, f"numpy {a.dtype}", numpy=True)
            return jnp.array(a, copy=True)
        raise _bad_leaf("from_torch", path, leaf)

    return jax.tree_util.tree_map_with_path(convert, tree)
