"""Host-compressed on-policy storage: `CompressedRolloutBuffer` (`docs/api/compressed.md`, "Compressed rollouts")."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _compiled, _validate
from jaxbuffers.compressed import _common
from jaxbuffers.compressed._common import LeafInfo
from jaxbuffers.compressed._host import HostBacked, HostStores
from jaxbuffers.compressed.trajectory import DEFAULT_CODEC
from jaxbuffers.rollout import RolloutBuffer, RolloutMinibatch, add_row, advantages_required

__all__ = ["CompressedRolloutBuffer"]


@_common.delegates("advantages", "returns", "has_advantages", "overflowed", "step_index", "reward", "value",
                   "terminated", "truncated", "trainable", "final_value", "num_steps", "float_dtype")
@_validate.one_member_methods(mapped=False)
class CompressedRolloutBuffer(HostBacked):
    """A `jaxbuffers.RolloutBuffer` whose chosen step leaves live compressed on the host.

    Same methods; with the same adds and keys the minibatches are exactly a `RolloutBuffer`'s (float32 `x / 255` for
    compressed leaves with `normalize_images`). Jittable, `lax.scan`-able, donatable; not vmappable.
    """

    buffer: RolloutBuffer  # compressed leaves hold int32 store slots
    version: jax.Array  # shape=(), int32: host-store writes included in this state
    # static: host, leaves, leaf_index (flat indices within the step), normalize_images (HostBacked)

    @classmethod
    @_validate.keyword_sizes
    def create(
        cls, example_step: Any, *, num_envs: int, num_steps: int, compress: Sequence[str] | None = ("obs",),
        codec: str = DEFAULT_CODEC, normalize_images: bool = False, float_dtype: Any = jnp.float32,
        chunk_bytes: int = 64 << 20, dictionary_bytes: int | None = None, frame_stack: int | None = None, stack_axis: int = 0,
    ) -> "CompressedRolloutBuffer":
        """An empty buffer for `num_steps` steps of `num_envs` envs.

        Args:
          example_step: as `jaxbuffers.RolloutBuffer.create`, like `num_envs`, `num_steps` and `float_dtype`.
          compress: the leaves of the step (not only its observation) to store on the host, named as
            `jaxbuffers.compressed.CompressedTrajectoryBuffer.create`'s (same dtypes); None: every leaf of the step.
          codec: as `jaxbuffers.compressed.CompressedTrajectoryBuffer.create`, like `normalize_images`, `chunk_bytes`,
            `dictionary_bytes`, `frame_stack` (one store entry per frame) and `stack_axis`.

        Raises:
          TypeError: a compressed leaf of a dtype the host stores do not take (naming the leaf).
          ValueError: as `jaxbuffers.RolloutBuffer.create`, or `compress` names no leaf, or `normalize_images` meets
            a non-uint8 leaf, or (with `frame_stack`) a leaf's `stack_axis` does not hold `frame_stack` frames.
        """
        spec = _validate.item_spec(example_step, "example_step")
        idx = _common.select_leaves(spec, compress, "example_step")
        k = 1 if frame_stack is None else _validate.static_int("frame_stack", frame_stack)
        infos = [LeafInfo(*f) for f in _validate.frame_leaves(spec, idx, "example_step", frame_stack and k, stack_axis, normalize_images)]
        ids = jax.ShapeDtypeStruct(() if frame_stack is None else (k,), jnp.int32)
        inner = RolloutBuffer.create(
            _common.replace_leaves(spec, idx, [ids] * len(idx)), num_envs=num_envs, num_steps=num_steps, float_dtype=float_dtype
        )
        never = [jnp.full_like(x, -1) for x in _common.pick_leaves(inner.step, idx)]  # the empty slot: zeros
        inner = inner.replace(step=_common.replace_leaves(inner.step, idx, never))
        host = HostStores(
            inner.num_steps * inner.num_envs * k + 1,  # the last slot (-1) is never written: the empty slot
            codec, [i.frame_shape for i in infos], [i.dtype for i in infos],
            [i.name for i in infos], chunk_bytes=chunk_bytes, dictionary_bytes=dictionary_bytes,
        )
        return cls(buffer=inner, version=jnp.int32(0), host=host, leaves=tuple(infos), leaf_index=tuple(idx),
                   normalize_images=bool(normalize_images))

    def _upgraded_from(self, saved_num_slots: int) -> "CompressedRolloutBuffer | None":
        """This restored state, its stores saved with `saved_num_slots`: `self` when it is `host.num_slots`; one fewer
        (before the empty slot, an unwritten step held slot 0): rows `t >= step_index` of all-0 ids become -1 (stacked
        states shard by shard); else None (the checkpoint is refused)."""
        if saved_num_slots == self.host.num_slots:
            return self
        if saved_num_slots != self.host.num_slots - 1:
            return None
        inner, head = self.buffer, jnp.asarray(self.buffer.step_index)

        def empty(ids: jax.Array) -> jax.Array:
            lanes = tuple(range(head.ndim + 1, ids.ndim))  # envs (and frames) of a row
            unwritten = (jnp.arange(inner.num_steps) >= head[..., None]) & ~jnp.any(ids != 0, axis=lanes)
            return jnp.where(unwritten.reshape(unwritten.shape + (1,) * len(lanes)), -1, ids)

        ids = [empty(x) for x in _common.pick_leaves(inner.step, self.leaf_index)]
        return self.replace(buffer=inner.replace(step=_common.replace_leaves(inner.step, self.leaf_index, ids)))

    @property
    def frame_stack(self) -> int | None:
        """`k` of `create`'s `frame_stack` (None: one store entry per observation)."""
        info = self.leaves[0]
        return None if info.stack_axis is None else info.shape[info.stack_axis]

    @property
    def step_spec(self) -> Any:
        """One env step as the user sees it (pytree of `jax.ShapeDtypeStruct`)."""
        specs = [jax.ShapeDtypeStruct(i.shape, i.dtype) for i in self.leaves]
        return _common.replace_leaves(self.buffer.step_spec, self.leaf_index, specs)

    def add(self, step: Any, **fields) -> "CompressedRolloutBuffer":
        """`jaxbuffers.RolloutBuffer.add` (same keyword fields, shapes and errors): the compressed leaves go to the
        host in one ordered callback. On a full buffer: eagerly `BufferFullError` and nothing changes (host store
        included); under a transformation nothing is written and `overflowed` becomes True.

        Raises:
          BufferFullError: called eagerly on a full buffer with arguments it would take, before anything runs.
          StaleBufferError: called eagerly on a state that is not the newest, before anything runs (under `jit`,
            the write callback's `jax.errors.JaxRuntimeError`).
          RuntimeError: the buffer was closed.
        """
        return add_row(self, step, fields)

    @_common.checked_before_dispatch(add=True)
    @_compiled.method()
    def _add(self, step: Any, **fields) -> "CompressedRolloutBuffer":
        """`add` past its eager fill check."""
        (n,) = _validate.check_batch(self.step_spec, step, 1, "step")  # the compressed leaves; inner.add checks the rest
        inner, k = self.buffer, self.frame_stack
        row = jnp.minimum(inner.step_index, inner.num_steps - 1)
        slots = (row * inner.num_envs + jnp.arange(n, dtype=jnp.int32)).astype(jnp.int32)
        datas = _common.pick_leaves(step, self.leaf_index)
        if k is not None:  # every frame of every stack: slot (t * N + e) * k + j
            slots = slots[:, None] * k + jnp.arange(k, dtype=jnp.int32)
            datas = [jnp.moveaxis(x, 1 + i.stack_axis, 1).reshape(n * k, *i.frame_shape) for x, i in zip(datas, self.leaves)]
        new = inner.add(_common.replace_leaves(step, self.leaf_index, [slots] * len(self.leaves)), **fields)
        valid = jnp.broadcast_to(~inner.is_full(), (slots.size,))
        # the slots written are read back from the row the new state holds (equal to `slots` where `valid`): a write
        # depending on no device result runs on another thread than the program, which then waits for it
        slots = _common.pick_leaves(new.step, self.leaf_index)[0][row]
        version = _common.write(self.host, self.version, slots.reshape(-1), valid, datas)
        return self.replace(buffer=new, version=version)

    filled = _common.delegated("filled")
    learn_mask = _common.delegated("learn_mask")
    trainable_size = _common.delegated("trainable_size")

    @_compiled.method()
    def reset(self) -> "CompressedRolloutBuffer":
        """`jaxbuffers.RolloutBuffer.reset` (host entries are overwritten by the next adds)."""
        return self.replace(buffer=self.buffer.reset())

    @_compiled.method("method", scalars={"gamma": (0.0, 1.0), "gae_lambda": (0.0, 1.0)})
    def compute_gae(self, last_value, gamma, gae_lambda, method: str = "scan") -> "CompressedRolloutBuffer":
        """`jaxbuffers.RolloutBuffer.compute_gae` (device only)."""
        return self.replace(buffer=self.buffer.compute_gae(last_value, gamma, gae_lambda, method))

    @_compiled.method("num_minibatches")
    def minibatch_indices(self, key: jax.Array, num_minibatches: int) -> jax.Array:
        """`jaxbuffers.RolloutBuffer.minibatch_indices`: int32 `[M, T * N / M]`."""
        return self.buffer.minibatch_indices(key, num_minibatches)

    @_common.checked_before_dispatch()
    @_compiled.method()
    def gather(self, indices: jax.Array) -> RolloutMinibatch:
        """`jaxbuffers.RolloutBuffer.gather` with the compressed leaves decoded (one host callback per call)."""
        return self._decode(self.buffer.gather(indices), None)

    def decode(self, minibatch: RolloutMinibatch, *, rows: jax.Array | None = None) -> RolloutMinibatch:
        """A `gather` of the inner buffer (`buf.buffer`, compressed leaves holding ids) decoded:
        `buf.decode(buf.buffer.gather(idx))` equals `buf.gather(idx)`.

        Args:
          minibatch: a `RolloutMinibatch` of `self.buffer`, leading axis `B` (`[B, ...]` or `[B, m, ...]`).
          rows: bool `[B]` or None (every row); rows where it is False read nothing and decode as zeros.

        Raises:
          TypeError: not a `RolloutMinibatch`; `rows` not a bool array. ValueError: `rows` not of shape `[B]`.
        """
        return _common.decode_sample({RolloutMinibatch: self._decode}, minibatch, rows, "buffer")

    def _decode(self, mb: RolloutMinibatch, rows: jax.Array | None) -> RolloutMinibatch:
        ids = _common.only_rows(_common.pick_leaves(mb.step, self.leaf_index)[0], rows)
        decoded = _common.read(self.host, self.leaves, self.version, ids)
        lead = ids.ndim - (self.frame_stack is not None)
        out = [_common.finish(x[0], i, lead, None, self.normalize_images) for x, i in zip(decoded, self.leaves)]
        return mb._replace(step=_common.replace_leaves(mb.step, self.leaf_index, out))

    def decode_entries(self) -> tuple[np.ndarray, ...]:
        """Every host-store entry this state's steps may read, each decoded once, for `gather_entries`. Eager only.

        Returns:
          Per compressed leaf, numpy `[n + 1, *frame_shape]` in the stored dtype: row `s < n` the entry of slot `s`
          (`n`: one past the largest slot id the steps hold; an empty slot gives zeros), row `n` zeros.

        Raises:
          StaleBufferError: a slot below `n` was rewritten after this state (a later add), checked before and after
            the decode. RuntimeError: the buffer was closed. ValueError: a stacked (vmapped) state. TypeError: called
            inside `jit` / `vmap` / `scan` (a traced state).
        """
        _validate.host_call("decode_entries", self)
        self.host.check_state("decode_entries")
        ids = np.asarray(_common.pick_leaves(self.buffer.step, self.leaf_index)[0])
        held = ids[(ids >= 0) & (ids < self.host.num_slots - 1)]  # the last slot is the never-written one
        n = int(held.max(initial=-1)) + 1
        out = self.host.read(self.version, np.arange(n + 1, dtype=np.int32))  # n < num_slots: slot n exists
        for x in out:
            x[n] = 0
        return out

    def gather_entries(self, entries: Sequence[np.ndarray], indices: Any) -> RolloutMinibatch:
        """`gather(indices)` with the compressed leaves taken from `decode_entries`' arrays (other ids: the zero row).

        Raises:
          ValueError: `entries` not one `[n + 1, *frame_shape]` array per compressed leaf of this buffer.
          TypeError: `indices` of a non-integer dtype; called inside `jit` / `vmap` / `scan`.
        """
        _validate.host_call("gather_entries", (self, indices))
        entries = _validate.decoded_entries("entries", entries, [(i.frame_shape, i.dtype) for i in self.leaves])
        mb = self.buffer.gather(indices)
        ids = np.asarray(_common.pick_leaves(mb.step, self.leaf_index)[0])
        n = entries[0].shape[0] - 1
        at = np.where((ids >= 0) & (ids < n), ids, n)
        lead = ids.ndim - (self.frame_stack is not None)
        out = [_common.finish(e[at], i, lead, None, self.normalize_images, xp=np) for e, i in zip(entries, self.leaves)]
        return mb._replace(step=_common.replace_leaves(mb.step, self.leaf_index, out))

    def minibatches(self, key: jax.Array, num_minibatches: int) -> RolloutMinibatch:
        """`jaxbuffers.RolloutBuffer.minibatches` (same errors; RuntimeError also for a closed buffer) decoded at once:
        the whole rollout in memory (prefer `minibatch_indices` + `gather`)."""
        def first():  # a closed store, then the arguments, named first
            _common.check_before_dispatch(self, False)
            _validate.refusal(lambda b: b.minibatch_indices(key, num_minibatches), self.buffer)

        advantages_required(self.buffer.has_advantages, "minibatches", first)
        return self._minibatches(key, num_minibatches)

    @_common.checked_before_dispatch()
    @_compiled.method("num_minibatches")
    def _minibatches(self, key: jax.Array, num_minibatches: int) -> RolloutMinibatch:
        """`minibatches` past its eager check."""
        return self.gather(self.minibatch_indices(key, num_minibatches))
