"""On-policy storage: `RolloutBuffer` (one time-major `[T, N, ...]` rollout), its minibatch and memory report
(what is stored, a full buffer, a partial rollout, `reset`, an example: `docs/api/rollout.md`)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from jaxbuffers import _compiled, _validate
from jaxbuffers import returns as _returns
from jaxbuffers._steps import EnvSteps
from jaxbuffers.episode import BufferFullError

__all__ = ["RolloutBuffer", "RolloutMinibatch", "RolloutMemoryPressure"]


class RolloutMinibatch(NamedTuple):
    """Steps gathered from a `RolloutBuffer` (`minibatches`, `gather`): leaves lead with the indices' shape `[*L]`
    (`[num_minibatches, minibatch_size]` for `minibatches`); float fields have the buffer's `float_dtype`."""

    step: Any  # user pytree like example_step, leaves [*L, ...], the stored dtypes
    reward: jax.Array  # shape=[*L], float: r_t
    value: jax.Array  # shape=[*L], float: V(obs_t) as stored at collection time
    terminated: jax.Array  # shape=[*L], bool
    truncated: jax.Array  # shape=[*L], bool
    final_value: jax.Array  # shape=[*L], float: meaningful only where truncated
    advantages: jax.Array  # shape=[*L], float: from compute_gae (NaN while has_advantages is False)
    returns: jax.Array  # shape=[*L], float: advantages + value (NaN while has_advantages is False)
    mask: jax.Array  # shape=[*L], bool: learn from this step (trainable and filled)
    index: jax.Array  # shape=[*L], int32: flat step index t * num_envs + env


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


@dataclasses.dataclass(frozen=True)
class RolloutMemoryPressure:
    """Bytes a `RolloutBuffer` and one PPO-style update over it need (Python ints; `str()`: a table), from
    `RolloutBuffer.estimate_memory_pressure`; what the fields count: `docs/api/rollout.md`."""

    num_steps: int
    num_envs: int
    num_minibatches: int
    minibatch_size: int
    field_bytes: tuple[tuple[str, int], ...]  # (field name, bytes in storage), in storage order
    storage_bytes: int  # all the buffer holds (sum of field_bytes), alive for the whole update: = memory_bytes
    minibatch_bytes: int  # one RolloutMinibatch of S / M steps, every field: what the loss reads
    shuffled_bytes: int  # the shuffled copy of all S steps `minibatches` makes (M x minibatch_bytes): a scan's xs
    peak_bytes: int  # one epoch with `minibatches`: storage + shuffled copy + one minibatch
    peak_bytes_gathered: int  # one epoch of minibatch_indices + gather in the scan: storage + S int32 + one minibatch

    def __str__(self) -> str:
        rows = [
            *self.field_bytes, ("= storage (buffer.memory_bytes)", self.storage_bytes),
            (f"one minibatch ({self.minibatch_size} steps, all fields)", self.minibatch_bytes),
            (f"shuffled copy ({self.num_minibatches} minibatches)", self.shuffled_bytes),
            ("peak, minibatches(): storage + copy + 1 minibatch", self.peak_bytes),
            ("peak, gather per minibatch: storage + perm + 1 mb", self.peak_bytes_gathered),
        ]
        width = max(len(r[0]) for r in rows)
        rule = "-" * (width + 29)
        lines = [f"RolloutBuffer memory: {self.num_steps} steps x {self.num_envs} envs, {self.num_minibatches} "
                 f"minibatches of {self.minibatch_size}", f"{'field':<{width}}  {'bytes':>14}  {'':>11}", rule]
        for i, (name, b) in enumerate(rows):
            if i == len(self.field_bytes):
                lines.append(rule)
            lines.append(f"{name:<{width}}  {b:>14,}  {_fmt_bytes(b):>11}")
        return "\n".join(lines)


_GAE_FIELDS = ("reward", "value", "terminated", "truncated", "final_value", "trainable", "advantages", "returns")


def advantages_required(flag: Any, what: str, first=None, compute: str = "compute_gae(last_value, gamma, gae_lambda)") -> None:
    """Unless every entry of the concrete, addressable `flag` (`has_advantages`, `()` or `[S]`) is True, `first()`
    raises the call's own errors, then RuntimeError naming `what` and `compute`."""
    if isinstance(flag, jax.core.Tracer) or not flag.is_fully_addressable:
        return
    if _compiled.host_int(flag) if flag.ndim == 0 else np.all(np.asarray(flag)):
        return
    if first is not None:
        first()
    raise _validate.advantages_missing(what, compute)


def add_row(buf: Any, step: Any, fields: dict) -> Any:
    """`buf._add(step, **fields)`: one row of a rollout (compressed or not); eagerly, BufferFullError on a full buffer
    (after the arguments' own errors)."""
    if isinstance(buf.step_index, jax.core.Tracer):
        return buf._add(step, **fields)
    at = _compiled.host_int(buf.step_index)  # remembered by the last eager add: no wait for its write
    if at >= buf.num_steps:
        _validate.refusal(lambda b: b._add(step, **fields), buf)
        raise BufferFullError(f"add: the rollout buffer is full (step_index={at} of num_steps={buf.num_steps}); "
                              f"nothing was written. Call reset() for the next rollout")
    out = buf._add(step, **fields)
    _compiled.remember_int(out.step_index, at + 1)  # room was left: the cursor advanced by one
    return out


@_validate.one_member_methods
class RolloutBuffer(EnvSteps, struct.PyTreeNode):
    """Time-major `[num_steps, num_envs]` on-policy storage with GAE and shuffled minibatches (`docs/api/rollout.md`);
    `jax.vmap(lambda _: RolloutBuffer.create(...), axis_size=K)(None)` builds $K$ independent buffers."""

    _cursor = "step_index"  # the leaf that is a scalar in one buffer (stacked with jax.vmap: `jaxbuffers._validate.members`)

    step: Any  # user pytree like example_step, leaves [T, N, *step_shape], example's dtypes
    reward: jax.Array  # shape=[T, N], float_dtype: r_t
    value: jax.Array  # shape=[T, N], float_dtype: V(obs_t)
    terminated: jax.Array  # shape=[T, N], bool: obs_{t+1} is terminal
    truncated: jax.Array  # shape=[T, N], bool: episode cut (time limit) after step t
    final_value: jax.Array  # shape=[T, N], float_dtype: V(real obs_{t+1}); read only where truncated
    trainable: jax.Array  # shape=[T, N], bool: learn from this step
    advantages: jax.Array  # shape=[T, N], float_dtype: GAE, written by compute_gae
    returns: jax.Array  # shape=[T, N], float_dtype: advantages + value, written by compute_gae
    step_index: jax.Array  # shape=(), int32: next row to write = rows filled, in [0, T]
    overflowed: jax.Array  # shape=(), bool: an add was ignored because the buffer was full
    has_advantages: jax.Array  # shape=(), bool: compute_gae ran after the last add / reset
    num_steps: int = struct.field(pytree_node=False)  # T
    num_envs: int = struct.field(pytree_node=False)  # N

    def _cursor_ranges(self) -> dict:
        """`(lo, hi)`, inclusive, of the cursor fields' documented ranges."""
        return {"step_index": (0, self.num_steps)}

    @classmethod
    @_validate.keyword_sizes
    def create(cls, example_step: Any, *, num_envs: int, num_steps: int, float_dtype: Any = jnp.float32) -> "RolloutBuffer":
        """An empty buffer for `num_steps` steps of `num_envs` envs.

        Args:
          example_step: one env's step, no batch axis: a pytree of arrays or `jax.ShapeDtypeStruct` (dtypes kept
            exactly), e.g. `{"obs": f32[4], "action": i32[], "log_prob": f32[]}` (reward, value, flags: `add`'s).
          num_envs: $N$, parallel environments (Python int >= 1).
          num_steps: $T$, rollout length (Python int >= 1).
          float_dtype: dtype of `reward`, `value`, `final_value`, `advantages` and `returns`.

        Raises:
          ValueError: `num_envs` or `num_steps` not a Python int >= 1, or an empty example.
          TypeError: a leaf of the example is not an array, `float_dtype` not floating or not stored as it is.
        """
        num_envs, num_steps = _validate.static_int("num_envs", num_envs), _validate.static_int("num_steps", num_steps)
        float_dtype = _validate.storable_dtype("float_dtype", float_dtype)
        spec = _validate.item_spec(example_step, "example_step")
        shape = (num_steps, num_envs)
        # Distinct arrays per field (never one shared zeros array): donation needs unaliased buffers.
        zeros = lambda dtype: jnp.zeros(shape, dtype)  # noqa: E731
        return cls(
            step=jax.tree.map(lambda s: jnp.zeros((*shape, *s.shape), s.dtype), spec),
            **{k: zeros(jnp.bool_ if k in ("terminated", "truncated", "trainable") else float_dtype) for k in _GAE_FIELDS},
            step_index=jnp.int32(0), overflowed=jnp.bool_(False), has_advantages=jnp.bool_(False),
            num_steps=num_steps, num_envs=num_envs,
        )

    @property
    def float_dtype(self) -> np.dtype:
        """dtype of the float fields (reward, value, final_value, advantages, returns)."""
        return np.dtype(self.reward.dtype)

    def _env_steps(self) -> tuple[Any, jax.Array, int]:
        return self.step, self.step_index, self.num_steps

    @_compiled.method()
    def filled(self) -> jax.Array:
        """bool `[T, N]`: the row was written since the last reset (`t < step_index`)."""
        rows = jnp.arange(self.num_steps, dtype=jnp.int32) < self.step_index
        return jnp.broadcast_to(rows[:, None], (self.num_steps, self.num_envs))

    @_compiled.method()
    def learn_mask(self) -> jax.Array:
        """bool `[T, N]`: steps to learn from, `trainable & filled()`."""
        return self.trainable & self.filled()

    @_compiled.method()
    def trainable_size(self) -> jax.Array:
        """Number of filled steps marked trainable (int32 scalar in `[0, T * N]`)."""
        return jnp.sum(self.learn_mask(), dtype=jnp.int32)

    def _per_env(self, name: str, x: Any, dtype: Any, default: Any = None) -> jax.Array:
        """A per-env field: `[num_envs]` of exactly `dtype` (trace time); `default` where omitted."""
        if x is None and default is not None:
            return jnp.full(self.num_envs, default, dtype)
        return _validate.array(name, x, (self.num_envs,), dtype)

    def add(self, step: Any, *, reward: jax.Array, value: jax.Array, terminated: jax.Array,
            truncated: jax.Array | None = None, final_value: jax.Array | None = None,
            trainable: jax.Array | None = None) -> "RolloutBuffer":
        """Write one step of every env at row `step_index` and advance it (in place when donated); `has_advantages`
        becomes False. On a full buffer under a transformation nothing is written and `overflowed` becomes True.

        Args:
          step: pytree like `example_step`, leading axis `num_envs` on every leaf, stored dtypes.
          reward: `[N]` float_dtype, $r_t$.
          value: `[N]` float_dtype, $V(o_t)$.
          terminated: `[N]` bool, $o_{t+1}$ is terminal (no bootstrap).
          truncated: `[N]` bool, the episode was cut after this step; with `final_value`. Omitted: False.
          final_value: `[N]` float_dtype, $V$ of the real $o_{t+1}$, read only where `truncated`.
          trainable: `[N]` bool, learn from this step. Omitted: True.

        Raises:
          BufferFullError: called eagerly on a full buffer with arguments it would take; nothing changes.
          TypeError: wrong tree structure or dtype; the message names the field.
          ValueError: wrong shape or leading axis, or `truncated` / `final_value` without the other.
        """
        fields = dict(reward=reward, value=value, terminated=terminated, truncated=truncated, final_value=final_value,
                      trainable=trainable)
        return add_row(self, step, fields)

    @_compiled.method()
    def _add(self, step, *, reward, value, terminated, truncated, final_value, trainable) -> "RolloutBuffer":
        """`add` past its eager fill check (a full buffer under a transformation writes nothing)."""
        (n,) = _validate.check_batch(self.step_spec, step, 1, "step")
        if n != self.num_envs:
            raise ValueError(f"step: expected a leading axis of num_envs={self.num_envs} on every leaf, got {n}")
        _validate.final_value_pair("", truncated, final_value)
        fdt = self.float_dtype
        fields = {
            "reward": self._per_env("reward", reward, fdt), "value": self._per_env("value", value, fdt),
            "terminated": self._per_env("terminated", terminated, jnp.bool_),
            "truncated": self._per_env("truncated", truncated, jnp.bool_, False),
            "final_value": self._per_env("final_value", final_value, fdt, 0),
            "trainable": self._per_env("trainable", trainable, jnp.bool_, True),
        }
        full = self.is_full()
        # Unsigned: with a signed index's wraps XLA cannot see that the read and the write address the same row.
        row = jnp.minimum(self.step_index, self.num_steps - 1).astype(jnp.uint32)

        def write(store: jax.Array, x: jax.Array) -> jax.Array:
            # Select against the old row, O(N): a lax.cond becomes a select over all O(T * N) under vmap.
            at = (row,) + (jnp.uint32(0),) * (store.ndim - 1)
            old = lax.dynamic_slice(store, at, (1, *store.shape[1:]))
            return lax.dynamic_update_slice(store, jnp.where(full, old, jnp.asarray(x)[None]), at)

        return self.replace(
            step=jax.tree.map(write, self.step, step),
            **{k: write(getattr(self, k), v) for k, v in fields.items()},
            step_index=jnp.where(full, self.step_index, self.step_index + 1).astype(jnp.int32),
            overflowed=self.overflowed | full, has_advantages=jnp.bool_(False),
        )

    @_compiled.method()
    def reset(self) -> "RolloutBuffer":
        """Empty the buffer for the next rollout: `step_index` 0, flags cleared, `advantages` and `returns` zeroed
        (until the next `compute_gae`), the rest of the storage kept."""
        false = jnp.bool_(False)
        zero = lambda x: x.at[...].set(0)  # noqa: E731 - over the old arrays: a donated buffer keeps them
        return self.replace(step_index=jnp.zeros_like(self.step_index), overflowed=false, has_advantages=false,
                            advantages=zero(self.advantages), returns=zero(self.returns))

    def compute_gae(self, last_value: jax.Array, gamma: float | jax.Array, gae_lambda: float | jax.Array, method: str = "scan") -> "RolloutBuffer":
        r"""Store `advantages` and `returns` of `jaxbuffers.returns.gae` on the first $k$ = `step_index` rows (row
        $k - 1$ bootstraps from `last_value` unless it ended an episode); rows $\ge k$ get zeros.

        Args:
          last_value: `[N]` float_dtype, $V(o_k)$, the value after the last filled row.
          gamma: discount in $[0, 1]$ (Python float or traced scalar).
          gae_lambda: GAE $\lambda$ in $[0, 1]$.
          method: `"scan"` or `"associative"` (static), see `jaxbuffers.returns`.

        Returns:
          The buffer with `advantages` and `returns` (`[T, N]` float_dtype) written and `has_advantages` True.

        Raises:
          TypeError, ValueError: `last_value` of the wrong dtype or shape, or as `gae` for the others.
        """
        out = self._compute_gae(last_value, gamma, gae_lambda, method)
        if not isinstance(out.has_advantages, jax.core.Tracer):  # eager: `minibatches` reads the flag on the host
            _compiled.remember_int(out.has_advantages, 1)
        return out

    @_compiled.method("method", scalars={"gamma": (0.0, 1.0), "gae_lambda": (0.0, 1.0)})
    def _compute_gae(self, last_value, gamma, gae_lambda, method) -> "RolloutBuffer":
        """`compute_gae` (its eager result's flag remembered on the host by the caller)."""
        last_value = self._per_env("last_value", last_value, self.float_dtype)
        filled = self.filled()
        # The last filled row bootstraps from last_value: a truncation there (a terminated step still wins).
        cut = (jnp.arange(self.num_steps, dtype=jnp.int32)[:, None] == self.step_index - 1) & ~self.truncated
        final_value = jnp.where(cut, last_value[None, :], self.final_value)
        adv, ret = _returns.gae(self.reward, self.value, self.terminated, self.truncated | cut, final_value, last_value,
                                gamma=gamma, gae_lambda=gae_lambda, method=method)
        zero = jnp.zeros((), self.float_dtype)
        return self.replace(advantages=jnp.where(filled, adv, zero), returns=jnp.where(filled, ret, zero), has_advantages=jnp.bool_(True))

    def _check_num_minibatches(self, num_minibatches: Any) -> int:
        what = f"num_steps * num_envs = {self.num_steps} * {self.num_envs}"
        return _validate.divisor("num_minibatches", num_minibatches, self.num_steps * self.num_envs, what)

    @_compiled.method("num_minibatches")
    def minibatch_indices(self, key: jax.Array, num_minibatches: int) -> jax.Array:
        """A random permutation of the `T * N` flat step indices, shaped into minibatches.

        Args:
          key: a JAX PRNG key.
          num_minibatches: $M$, static Python int dividing `T * N`.

        Returns:
          int32 `[M, T * N / M]`: every flat index `t * num_envs + env` exactly once (`gather` masks unfilled ones).

        Raises:
          ValueError: $M$ is not a Python int >= 1 or does not divide `T * N`.
        """
        m = self._check_num_minibatches(num_minibatches)
        total = self.num_steps * self.num_envs
        return jax.random.permutation(_validate.key("key", key), total).astype(jnp.int32).reshape(m, total // m)

    @_compiled.method()
    def gather(self, indices: jax.Array) -> RolloutMinibatch:
        """The steps at flat indices `indices` (int32 `[*L]`, values in `[0, T * N)`).

        Returns:
          `RolloutMinibatch` with leaves `[*L, ...]`; `mask` is `trainable & filled`. Out-of-range indices are
          clipped. `advantages` and `returns` are NaN while `has_advantages` is False.

        Raises:
          TypeError: `indices` of a non-integer dtype.
        """
        total = self.num_steps * self.num_envs
        indices = _validate.integer_indices("indices", indices)  # wide ints saturate, floats raise

        def take(x: jax.Array) -> jax.Array:
            return jnp.take(x.reshape(total, *x.shape[2:]), indices, axis=0, mode="clip")

        fields = {k: take(getattr(self, k)) for k in RolloutMinibatch._fields if k not in ("step", "mask", "index")}
        nan = jnp.asarray(jnp.nan, self.float_dtype)
        fields.update({k: jnp.where(self.has_advantages, fields[k], nan) for k in ("advantages", "returns")})
        mask, index = take(self.learn_mask()), jnp.clip(indices, 0, total - 1)
        return RolloutMinibatch(step=jax.tree.map(take, self.step), **fields, mask=mask, index=index)

    def minibatches(self, key: jax.Array, num_minibatches: int) -> RolloutMinibatch:
        """`gather(minibatch_indices(key, num_minibatches))`: all `T * N` steps, shuffled, leaves `[num_minibatches,
        T * N / num_minibatches, ...]` for `lax.scan` (a shuffled copy of the buffer: scan `gather` to avoid it).

        Raises:
          ValueError: as `minibatch_indices` (checked first).
          RuntimeError: called eagerly while `has_advantages` is False.
        """
        advantages_required(self.has_advantages, "minibatches", lambda: _validate.refusal(
            lambda b: b._minibatches(key, num_minibatches), self))  # the arguments' own errors first
        return self._minibatches(key, num_minibatches)

    @_compiled.method("num_minibatches")
    def _minibatches(self, key: jax.Array, num_minibatches: int) -> RolloutMinibatch:
        return self.gather(self.minibatch_indices(key, num_minibatches))

    def estimate_memory_pressure(self, num_minibatches: int) -> RolloutMemoryPressure:
        """Per-field storage bytes and the projected peak of an update (`RolloutMemoryPressure`), from shapes only
        (abstract buffers from `jax.eval_shape` work); a stacked buffer counts every member.

        Raises:
          ValueError: as `minibatch_indices`.
        """
        m = self._check_num_minibatches(num_minibatches)
        steps = self.num_steps * self.num_envs
        copies = int(np.prod(self.reward.shape, dtype=np.int64)) // steps  # K for a stacked buffer
        field_bytes = [(_validate.leaf_path("step", p), _validate.tree_nbytes(x)) for p, x in jax.tree_util.tree_flatten_with_path(self.step)[0]]
        field_bytes += [(name, _validate.tree_nbytes(getattr(self, name))) for name in _GAE_FIELDS]
        counters = _validate.tree_nbytes((self.step_index, self.overflowed, self.has_advantages))
        storage = sum(b for _, b in field_bytes) + counters
        stacked = self.reward.ndim - 2
        member = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[stacked:], x.dtype), self)
        per_step = _validate.tree_nbytes(jax.eval_shape(RolloutBuffer.gather, member, jax.ShapeDtypeStruct((1,), jnp.int32)))
        minibatch = copies * (steps // m) * per_step
        return RolloutMemoryPressure(
            num_steps=self.num_steps, num_envs=self.num_envs, num_minibatches=m, minibatch_size=steps // m,
            field_bytes=(*field_bytes, ("counters (step_index, flags)", counters)), storage_bytes=storage,
            minibatch_bytes=minibatch, shuffled_bytes=m * minibatch, peak_bytes=storage + m * minibatch + minibatch,
            peak_bytes_gathered=storage + copies * steps * 4 + minibatch)  # 4: the int32 permutation
