"""What a rollout holds and where its bytes live: `trainable_diagnostics`, `memory_estimate`, `total_size`,
`get_minibatches` for `jaxbuffers.RolloutBuffer` and `jaxbuffers.CompressedRolloutBuffer` (OakEmu-RL's
`RolloutBuffer` names); an example: `docs/api/rollout.md`, "Diagnostics"."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxbuffers import _validate
from jaxbuffers.rollout import RolloutBuffer, RolloutMinibatch, advantages_required

__all__ = ["TrainableDiagnostics", "RolloutMemoryEstimate", "trainable_diagnostics", "memory_estimate", "total_size",
           "get_minibatches"]


class TrainableDiagnostics(NamedTuple):
    """Counts over the filled steps of a rollout (`trainable_diagnostics`): trainable ones were marked `trainable` at
    `add`, frozen ones not (in GAE, not in the loss). Device scalars unless noted."""

    total_steps: int  # Python int: T * N, the capacity
    filled_steps: jax.Array  # shape=(), int32
    trainable_steps: jax.Array  # shape=(), int32
    frozen_steps: jax.Array  # shape=(), int32: filled_steps - trainable_steps
    trainable_fraction: jax.Array  # shape=(), float32: trainable / filled (0 when nothing is filled)
    trainable_per_env: jax.Array  # shape=[N], int32
    episode_ends: jax.Array  # shape=(), int32: filled steps that are terminated or truncated


@dataclasses.dataclass(frozen=True)
class RolloutMemoryEstimate:
    """Bytes of a rollout by where they live (`memory_estimate`), Python ints."""

    cpu_bytes: int  # host memory: a compressed rollout's host stores, and the device arrays on a CPU device
    gpu_bytes: int  # accelerator memory: the device arrays on an accelerator
    minibatch_bytes: int  # one minibatch as the loss reads it, observations decoded
    platform: str  # where the device arrays live: "cpu", "gpu", "tpu"

    @property
    def total_bytes(self) -> int:
        """``cpu_bytes + gpu_bytes``."""
        return self.cpu_bytes + self.gpu_bytes

    @property
    def memory_gb(self) -> float:
        """``total_bytes`` in GiB (2**30 bytes)."""
        return self.total_bytes / 2**30


def _inner(buf: Any) -> RolloutBuffer:
    """The `RolloutBuffer` of ``buf`` (itself, or a compressed rollout's device part)."""
    inner = getattr(buf, "buffer", buf)
    if not isinstance(inner, RolloutBuffer):
        raise TypeError(f"buf: expected a RolloutBuffer or a CompressedRolloutBuffer, got {type(buf).__name__}")
    _validate.unstacked("buf", inner, "call this under jax.vmap or index one member out")
    return inner


def total_size(buf: Any) -> int:
    """Steps the rollout holds when full, ``num_steps * num_envs`` (Python int)."""
    inner = _inner(buf)
    return inner.num_steps * inner.num_envs


@jax.jit
def _counts(inner: RolloutBuffer) -> tuple:
    filled, trainable = inner.filled(), inner.learn_mask()
    n_filled, n_train = jnp.sum(filled, dtype=jnp.int32), jnp.sum(trainable, dtype=jnp.int32)
    fraction = jnp.where(n_filled > 0, n_train / jnp.maximum(n_filled, 1), 0.0).astype(jnp.float32)
    ends = jnp.sum(filled & (inner.terminated | inner.truncated), dtype=jnp.int32)
    return n_filled, n_train, n_filled - n_train, fraction, jnp.sum(trainable, axis=0, dtype=jnp.int32), ends


def trainable_diagnostics(buf: Any) -> TrainableDiagnostics:
    """Counts of filled, trainable and frozen steps and episode ends (`TrainableDiagnostics`).

    Raises:
      TypeError: ``buf`` is not a (compressed) rollout buffer.
    """
    return TrainableDiagnostics(total_size(buf), *_counts(_inner(buf)))


def memory_estimate(buf: Any, minibatch_size: int | None = None) -> RolloutMemoryEstimate:
    """Where the rollout's bytes live, and one decoded minibatch of ``minibatch_size`` steps (all when None).

    Raises:
      TypeError: ``buf`` is not a (compressed) rollout buffer.
      ValueError: ``minibatch_size`` not an int in ``[1, total_size]``.
    """
    inner, total = _inner(buf), total_size(buf)
    size = total if minibatch_size is None else _validate.static_int("minibatch_size", minibatch_size)
    if size > total:
        raise ValueError(f"minibatch_size: expected at most total_size={total}, got {size}")
    host, device = (buf.host_nbytes, buf.device_nbytes) if inner is not buf else (0, inner.memory_bytes)
    minibatch = jax.eval_shape(buf.gather, jax.ShapeDtypeStruct((size,), jnp.int32))
    arrays = [x for x in jax.tree.leaves(inner) if isinstance(x, jax.Array)]
    platform = next(iter(arrays[0].devices())).platform if arrays else jax.default_backend()
    on_cpu = platform == "cpu"
    return RolloutMemoryEstimate(cpu_bytes=host + (device if on_cpu else 0), gpu_bytes=0 if on_cpu else device,
                                 minibatch_bytes=_validate.tree_nbytes(minibatch), platform=platform)


def _device(device: Any) -> jax.Device | None:
    if device is None or isinstance(device, jax.Device):
        return device
    name = str(device).split(":")[0]  # "cuda:0" names its platform
    platform = {"cuda": "gpu", "rocm": "gpu"}.get(name, name)
    try:
        return jax.devices(platform)[0]
    except RuntimeError:
        raise ValueError(f"device: no JAX device of platform {platform!r} (from {device!r}); have {jax.devices()}") from None


def _torch_device(device: Any, buf: Any) -> Any:
    """``device`` if it is a ``torch.device`` torch can use for every leaf of ``buf``'s minibatches (else ValueError /
    TypeError), None if it is not a torch device."""
    torch = sys.modules.get("torch")  # a torch.device exists only once torch is imported
    if torch is None or not isinstance(device, torch.device):
        return None
    from jaxbuffers.interop.torch import SUPPORTED_DTYPES

    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:  # torch without CUDA asserts
        raise ValueError(f"device: torch cannot place tensors on {device!r}: {err}") from None
    spec = jax.eval_shape(buf.gather, jax.ShapeDtypeStruct((1,), jnp.int32))
    for path, leaf in jax.tree_util.tree_leaves_with_path(spec):
        if leaf.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"device: a torch device, but leaf {_validate.leaf_name(path)} has dtype {leaf.dtype}, "
                            f"which has no torch dtype; pass a JAX device or None")
    return device


def get_minibatches(buf: Any, key: jax.Array, batch_size: int, device: Any = None) -> Iterator[RolloutMinibatch]:
    """Every step once, shuffled by ``key``, in minibatches of ``batch_size`` steps placed on ``device``, each
    gathered (and decoded) when the iterator reaches it.

    Args:
      buf: a `RolloutBuffer` or `CompressedRolloutBuffer` (after `compute_gae`).
      key: a JAX PRNG key.
      batch_size: steps per minibatch, dividing ``total_size(buf)``.
      device: a ``torch.device`` (every leaf a ``torch.Tensor`` on it, through `jaxbuffers.interop.torch.to_torch`;
        the tensors are the minibatch's own); a `jax.Device` or a platform name (``"cpu"``, ``"gpu"``, ``"cuda"``,
        ``"cuda:0"``: the platform's first device): JAX arrays on that device; None: JAX arrays where the rollout is.

    Yields:
      `RolloutMinibatch` with leaves ``[batch_size, ...]``: ``jax.Array``, or ``torch.Tensor`` for a torch device.

    Raises (by the call, before any minibatch is gathered):
      TypeError: ``buf`` is not a (compressed) rollout buffer; ``key`` is not a PRNG key; a torch ``device`` while a
        leaf has a dtype torch lacks (`jaxbuffers.interop.torch.SUPPORTED_DTYPES`).
      ValueError: ``batch_size`` not an int >= 1 or not dividing the rollout; no JAX device of the platform asked
        for; a torch ``device`` torch cannot use (``cuda`` without CUDA).
      RuntimeError: ``has_advantages`` False, as ``RolloutBuffer.minibatches``.
    """
    total = total_size(buf)
    tensors_on = _torch_device(device, buf)
    dev = None if tensors_on is not None else _device(device)
    batch_size = _validate.divisor("batch_size", batch_size, total, "total_size")
    indices = buf.minibatch_indices(key, total // batch_size)
    advantages_required(_inner(buf).has_advantages, "get_minibatches")
    return _gathered(buf, indices, dev, tensors_on)


def _gathered(buf: Any, indices: jax.Array, dev: jax.Device | None, tensors_on: Any) -> Iterator[RolloutMinibatch]:
    if tensors_on is not None:
        from jaxbuffers.interop.torch import to_torch
    for idx in indices:
        mb = buf.gather(idx)
        if tensors_on is not None:
            yield to_torch(mb, tensors_on)
        else:
            yield mb if dev is None else jax.device_put(mb, dev)
