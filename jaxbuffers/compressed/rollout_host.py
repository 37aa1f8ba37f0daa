"""Filling a `CompressedRolloutBuffer` from numpy on the host: `RolloutHostWriter`.

For Python-driven loops (one env step per call, e.g. the SB3 adapters) a jitted `add` per step costs a device
dispatch each time. The writer instead keeps the rollout's device fields as numpy mirrors (`[T, N, ...]`, the
uncompressed step leaves included), puts the compressed leaves into the buffer's host stores (staged, `put_rows`
entries at a time: a put has a fixed cost; the add that fills the buffer puts the rest, as no add can follow it), and
builds the device state once, at `flush` (before GAE or minibatches).

One copy of the per-step fields at a time: the mirrors are 64-byte aligned, so on CPU `flush` hands them to the
device state without a copy (`jax.device_put` adopts them); the next `add` first copies them back into fresh mirrors
(the state `flush` returned keeps its arrays unchanged) and drops the writer's reference to that state's arrays
(`[T, N]` work once per flush followed by adds; the device arrays are freed once no one else holds that state).
While steps are added the device holds none of the rollout's per-step arrays.

Frame deduplication (a buffer created with `frame_stack=k`): frame `j` of env `e`'s new stack is stored only when it
differs from frame `j + 1` of the env's previous stack (a frame stack shifts by one per step) and from frame `j - 1`
of the new stack (Gymnasium's "reset" padding repeats the episode's first frame); otherwise the step's slot list
points at the equal frame already stored. The decision compares bytes, so it is exact for any observations: a
stack that is not a shifted one stores all its frames. A Dict step with several compressed leaves reuses a frame
only where every leaf's frame is equal (the leaves share slot numbering). Within one rollout every reused slot was
written in that rollout (the previous stack is forgotten at `reset`), so no later write of the rollout rewrites it.
The frames stored get slots in the order they are stored (0, 1, 2, ... from `reset`), so the host stores' indexes,
which grow as slots are used (`host_codecs.slot_index`), hold rows for the distinct frames only, not for `k` per step.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _validate
from jaxbuffers.compressed._host import _aligned_empty
from jaxbuffers.compressed.rollout import CompressedRolloutBuffer
from jaxbuffers.episode import BufferFullError

__all__ = ["RolloutHostWriter"]

_FIELDS = ("reward", "value", "terminated", "truncated", "final_value", "trainable")
_DEFAULTS = {"truncated": False, "final_value": 0, "trainable": True}  # optional fields: mirrored once one is given
_DERIVED = ("advantages", "returns")  # written by compute_gae: zeros in the state a flush builds after adds


def _mirror(x) -> np.ndarray:
    """A writable 64-byte aligned host copy of `x` (what `jax.device_put` adopts without a copy on CPU)."""
    x = np.asarray(x)
    out = _aligned_empty(x.shape, x.dtype)
    out[...] = x
    return out


def _placeholder(x) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


class RolloutHostWriter:
    """Adds steps to a `CompressedRolloutBuffer` on the host; `flush` returns the device state.

    Args:
      buffer: the buffer to continue (its filled rows are read back into the mirrors once). The writer owns it
        from now on: add through the writer, and use the state `flush` returns.

    Raises:
      TypeError: `buffer` not a `CompressedRolloutBuffer`. ValueError: a stacked (vmapped) one.
      StaleBufferError: not the state returned by the buffer's last add. RuntimeError: the buffer was closed.

    Memory: the mirrors hold the rollout's uncompressed leaves and per-step fields on the host (`mirror_nbytes`; the
    optional `truncated`, `final_value` and `trainable` only once one is given), the compressed leaves only in the
    host stores; once adds start, the writer holds no device copy of them (module doc).
    """

    def __init__(self, buffer: CompressedRolloutBuffer):
        if not isinstance(buffer, CompressedRolloutBuffer):
            raise TypeError(f"buffer: expected a jaxbuffers.compressed.CompressedRolloutBuffer, got {type(buffer).__name__}")
        _validate.unstacked("buffer", buffer, "give the writer one member's state")
        buffer.host.check_state("RolloutHostWriter(buffer)", int(buffer.version))
        self._state = buffer
        inner = buffer.buffer
        self._steps, self._envs, self._k = inner.num_steps, inner.num_envs, buffer.frame_stack
        self._spec = buffer.step_spec
        leaves, self._treedef = jax.tree.flatten(inner.step)
        self._step = [_mirror(x) for x in leaves]  # ids for the compressed leaves, data for the others
        self._plain = tuple(i for i in range(len(leaves)) if i not in buffer.leaf_index)  # the uncompressed leaves
        self._specs = {k: (getattr(inner, k).shape, getattr(inner, k).dtype) for k in _FIELDS}
        # an optional field holding its default in every filled row has no mirror until a value is given
        self._fields = {k: _mirror(x) for k in _FIELDS for x in [np.asarray(getattr(inner, k))]
                        if k not in _DEFAULTS or (x[: int(inner.step_index)] != _DEFAULTS[k]).any()}
        self._handed = False  # the mirrors are the arrays of the state `flush` returned: copy before writing
        self._owned = False  # `_own_mirrors` made since the writer got a state holding device arrays (made or flushed)
        self.row = int(inner.step_index)
        self._next_slot = self.row * self._envs * (self._k or 1)  # slot of the next frame stored (module doc)
        self._overflowed = bool(inner.overflowed)
        self._prev: tuple[list, list] | None = None  # per env, the last stack's frames (bytes) and their slots
        self._dirty = False
        self._checked: tuple | None = None  # layouts of the last step and fields that passed the checks
        self._pending: list[tuple[int, bytes]] = []  # (slot, entry bytes: `_frame_ids`) not yet put into the host stores

    put_rows = 128  # entries staged per put into the host stores (flush and the add that fills the buffer put the rest)

    @property
    def mirror_nbytes(self) -> int:
        """Bytes of the host mirrors not shared with the device state (Python int; 0 right after `flush`, whose state
        holds them)."""
        return 0 if self._handed else sum(a.nbytes for a in self._step) + sum(a.nbytes for a in self._fields.values())

    def _own_mirrors(self) -> None:
        """Before a write to the mirrors: copy them back if `flush` handed them to the device state, and drop the
        writer's reference to the device state's per-step arrays (module doc)."""
        if self._handed:
            self._step = [_mirror(x) for x in self._step]
            self._fields = {k: _mirror(x) for k, x in self._fields.items()}
            self._handed = False
        inner = self._state.buffer
        if not isinstance(inner.reward, jax.ShapeDtypeStruct):
            inner = inner.replace(step=jax.tree.map(_placeholder, inner.step),
                                  **{k: _placeholder(getattr(inner, k)) for k in _FIELDS + _DERIVED})
            self._state = self._state.replace(buffer=inner)
        self._owned = True

    def add(self, step: Any, *, reward, value, terminated, truncated=None, final_value=None, trainable=None) -> None:
        """`CompressedRolloutBuffer.add` on numpy values: the same arguments, shapes, dtypes and errors (checked
        before anything is written).

        Raises:
          BufferFullError: the rollout is full (`num_steps` rows since `reset`); nothing is written (host stores
            included) and `overflowed` is unchanged, as `CompressedRolloutBuffer.add` eagerly.
          TypeError, ValueError: as `jaxbuffers.RolloutBuffer.add`.
          RuntimeError: the buffer was closed.
        """
        self._add_checked(*self._check_add(step, dict(reward=reward, value=value, terminated=terminated, truncated=truncated,
                                                      final_value=final_value, trainable=trainable)))

    def _check_add(self, step: Any, given: dict) -> tuple[list, dict]:
        """`add`'s checks, changing nothing: ``(the step's flat leaves, the fields as numpy arrays or None)``."""
        n = self._envs
        leaves, sig = _validate.layout(step)
        field_sig = tuple((type(x), getattr(x, "shape", None), getattr(x, "dtype", None)) for x in given.values())
        if (sig, field_sig) != self._checked:  # arguments laid out as the last accepted ones pass the same checks
            (got,) = _validate.check_batch(self._spec, step, 1, "step")
            if got != n:
                raise ValueError(f"step: expected a leading axis of num_envs={n} on every leaf, got {got}")
            if (given["truncated"] is None) != (given["final_value"] is None):
                one, missing = ("truncated", "final_value") if given["final_value"] is None else ("final_value", "truncated")
                raise ValueError(f"{one}: given without {missing}; pass both or neither")
            for k, x in given.items():
                if x is not None or k not in _DEFAULTS:
                    _validate.array(k, x, (n,), self._specs[k][1])
            self._checked = (sig, field_sig)
        return leaves, {k: None if x is None else np.asarray(x) for k, x in given.items()}

    def _add_checked(self, leaves: list, fields: dict) -> None:
        """`add` of checked arguments: ``leaves`` the step's flat leaves (the spec's order, shapes ``[num_envs, ...]``
        and dtypes), ``fields`` numpy ``[num_envs]`` of the fields' dtypes by name, None where not given (the SB3
        adapter makes them so: its checks are `add`'s, made once)."""
        state, row = self._state, self.row
        state.host.check_state("add")
        if row >= self._steps:
            raise BufferFullError(f"add: the rollout buffer is full (step_index={row} of num_steps={self._steps}); "
                                  f"nothing was written. Call reset() for the next rollout")
        if not self._owned:
            self._own_mirrors()
        compressed = state.leaf_index
        slots = self._frame_ids([np.asarray(leaves[i]) for i in compressed])
        if len(self._pending) >= self.put_rows or row + 1 == self._steps:  # full: no later add joins the put
            self._write_pending()
        step = self._step
        for i in compressed:
            step[i][row] = slots
        for i in self._plain:
            step[i][row] = leaves[i]
        mirrors = self._fields
        for k, x in fields.items():
            if x is not None:
                m = mirrors.get(k)
                if m is None:  # the first value given: the rows before hold the default
                    m = mirrors[k] = _mirror(np.full(self._specs[k][0], _DEFAULTS[k], self._specs[k][1]))
                m[row] = x
            elif k in mirrors:  # an optional field given before: this row holds its default
                mirrors[k][row] = _DEFAULTS[k]
        self.row = row + 1
        self._dirty = True

    def _frame_ids(self, stacks: list[np.ndarray]) -> np.ndarray | list[list[int]]:
        """This step's slots, int32 ``[N]`` (numpy) or ``[N, k]`` (nested lists): where each entry is (or an equal entry
        already is) stored. The entries to write are staged (`_pending`) as ``(slot, bytes)``: an entry's bytes are its
        compressed leaves' ``[*frame_shape]`` (C order) joined, each leaf a fixed size; a copy (the caller may reuse its
        arrays)."""
        n, k, row = self._envs, self._k, self.row
        if k is None:
            slots = (row * n + np.arange(n, dtype=np.int32)).astype(np.int32)
            self._pending += [(int(s), b"".join([x[e].tobytes() for x in stacks])) for e, s in enumerate(slots.tolist())]
            return slots
        # The frames as one C-contiguous array [N, k, ...] (a copy only where the stack axis is not the first or
        # several leaves are compressed: then each entry's leaves' bytes joined, [N, k, entry bytes]), so that each
        # frame is compared in place with the kept bytes of an equal frame; only a frame stored is copied (its bytes
        # are the entry staged and the copy kept for the next stack).
        frames = [x if i.stack_axis == 0 else np.moveaxis(x, 1 + i.stack_axis, 1) for x, i in zip(stacks, self._state.leaves)]
        one = np.ascontiguousarray(frames[0]) if len(frames) == 1 else np.concatenate(
            [np.ascontiguousarray(f).reshape(n, k, -1).view(np.uint8) for f in frames], axis=2)
        fresh, slots, keys, nxt = self._pending, [], [], self._next_slot
        old_keys, old_slots = self._prev if self._prev is not None else ((None,) * n, (None,) * n)
        for e in range(n):
            stack, olds, mine, mine_keys = one[e], old_keys[e], [], []
            for j in range(k):
                frame = stack[j, ...]  # an array, 0-d for scalars; every key holds one entry's bytes: startswith is ==
                if olds is not None and j < k - 1 and olds[j + 1].startswith(frame):  # shifted from the previous stack
                    key, s = olds[j + 1], old_slots[e][j + 1]
                elif j and mine_keys[j - 1].startswith(frame):  # repeats its left neighbour ("reset" padding)
                    key, s = mine_keys[j - 1], mine[j - 1]
                else:
                    key, s = frame.tobytes(), nxt
                    nxt += 1
                    fresh.append((s, key))
                mine.append(s)
                mine_keys.append(key)
            slots.append(mine)
            keys.append(mine_keys)
        self._next_slot, self._prev = nxt, (keys, slots)
        return slots

    def _write_pending(self) -> None:
        """Put the staged entries into the host stores (one write: the per-call cost of a put is paid once)."""
        if self._pending:
            host, pending = self._state.host, self._pending
            self._pending = []
            slots = np.array([s for s, _ in pending], np.int32)
            raw = np.frombuffer(b"".join([b for _, b in pending]), np.uint8).reshape(len(pending), -1)
            datas, at = [], 0
            for i in self._state.leaves:  # each leaf's bytes of every entry, as [m, *frame_shape]
                size = math.prod(i.frame_shape) * np.dtype(i.dtype).itemsize
                datas.append(np.ascontiguousarray(raw[:, at : at + size]).view(i.dtype).reshape(-1, *i.frame_shape))
                at += size
            host.write(np.int32(host.version), slots, np.ones(slots.size, np.bool_), *datas)

    def flush(self) -> CompressedRolloutBuffer:
        """The device state holding every add so far (built once after adds; then the same object)."""
        self._write_pending()
        if self._dirty:
            inner = self._state.buffer
            derived = {k: jnp.zeros(x.shape, x.dtype) for k in _DERIVED if isinstance(x := getattr(inner, k), jax.ShapeDtypeStruct)}
            inner = inner.replace(  # device_put adopts the aligned mirrors on CPU (module doc); jnp.asarray would copy
                step=jax.tree.unflatten(self._treedef, [jax.device_put(x) for x in self._step]),
                **{k: jax.device_put(self._fields[k]) if k in self._fields else jnp.full(self._specs[k][0], _DEFAULTS[k], self._specs[k][1])
                   for k in _FIELDS}, **derived,
                step_index=jnp.int32(min(self.row, self._steps)), overflowed=jnp.bool_(self._overflowed),
                has_advantages=jnp.bool_(False),
            )
            self._state = self._state.replace(buffer=inner, version=jnp.int32(self._state.host.version))
            self._dirty, self._handed, self._owned = False, True, False
        return self._state

    def reset(self) -> None:
        """Start a new rollout (row 0; stored frames are overwritten by the next adds)."""
        self.row, self._overflowed, self._prev, self._dirty, self._next_slot = 0, False, None, True, 0
