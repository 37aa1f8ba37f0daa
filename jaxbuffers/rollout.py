"""On-policy storage: :class:`RolloutBuffer`, its minibatch type and its memory-pressure report.

A rollout buffer holds one rollout of ``num_steps`` (``T``) steps from ``num_envs`` (``N``)
parallel environments, time-major ``[T, N, ...]``, for algorithms such as PPO and A2C: collect
``T`` steps with :meth:`RolloutBuffer.add`, compute advantages once with
:meth:`RolloutBuffer.compute_gae`, then iterate over shuffled minibatches with
:meth:`RolloutBuffer.minibatches` for a few epochs, and :meth:`RolloutBuffer.reset` for the next
rollout. Everything is pure and jittable; the buffer can be carried through ``lax.scan`` and
stacked under ``jax.vmap`` (one buffer per seed or learner).

What is stored
--------------
Two kinds of fields, kept apart so that neither can be confused with the other:

* ``step``: the user's own pytree for one env step (observation, action, log-probability,
  recurrent state, anything), exactly as given by ``example_step`` in :meth:`RolloutBuffer.create`
  (no batch axis there; ``[num_envs, ...]`` at ``add``; ``[T, N, ...]`` in storage). It is stored
  and handed back, never interpreted.
* The fields GAE needs, with the step conventions of ``docs/guide.md`` (section 2) / :mod:`jaxbuffers.returns`
  (step ``t`` is the transition ``obs_t --action_t--> obs_{t+1}``), passed to ``add`` as keyword
  arguments so their meaning is explicit: ``reward`` (``r_t``), ``value`` (``V(obs_t)``),
  ``terminated`` (``obs_{t+1}`` is terminal), and optionally ``truncated`` (episode cut by a time
  limit after step ``t``) with ``final_value`` (``V`` of the real ``obs_{t+1}`` before the
  auto-reset, read only where ``truncated``). ``trainable`` (optional, default True) marks steps
  that are kept (they take part in GAE: their rewards and values are real) but must not be
  learned from, e.g. steps taken by a scripted controller.

:meth:`RolloutBuffer.compute_gae` adds ``advantages`` and ``returns`` (``[T, N]``).

Defined behaviour at the edges
------------------------------
* ``add`` on a full buffer (``step_index == num_steps``) is a no-op on the data: nothing is
  overwritten (overwriting step 0 would break the time order GAE relies on) and the flag
  ``overflowed`` becomes True until :meth:`RolloutBuffer.reset`. An error is impossible here: the
  fill level is a traced value.
* A partially filled buffer is handled exactly: :meth:`RolloutBuffer.compute_gae` bootstraps the
  last filled step ``step_index - 1`` from ``last_value`` (unless it is terminated or truncated)
  and writes zero advantages and returns into the unfilled rows, and the unfilled rows are
  excluded from learning (``mask`` False, not counted by ``trainable_size``).
* :meth:`RolloutBuffer.reset` only moves ``step_index`` back to 0: the storage is kept (no
  reallocation, no O(capacity) zeroing); stale rows are masked as unfilled until overwritten.

Example::

    import jax, jax.numpy as jnp
    import jaxbuffers as jb

    N, T = 4, 128
    example = {"obs": jnp.zeros(4), "action": jnp.int32(0), "log_prob": jnp.float32(0)}
    buf = jb.RolloutBuffer.create(example, num_steps=T, num_envs=N)
    step = jax.tree.map(lambda x: jnp.stack([x] * N), example)      # leaves [N, ...]
    for t in range(T):                                               # (a lax.scan in practice)
        buf = buf.add(step, reward=jnp.ones(N), value=jnp.zeros(N),
                      terminated=jnp.zeros(N, bool))
    buf = buf.compute_gae(last_value=jnp.zeros(N), gamma=0.99, gae_lambda=0.95)
    mbs = buf.minibatches(jax.random.key(0), num_minibatches=4)     # leaves [4, 128, ...]
    print(buf.estimate_memory_pressure(num_minibatches=4))          # a readable table
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from jaxbuffers import _validate
from jaxbuffers import returns as _returns

__all__ = ["RolloutBuffer", "RolloutMinibatch", "RolloutMemoryPressure"]


class RolloutMinibatch(NamedTuple):
    """Steps gathered from a :class:`RolloutBuffer` (what ``minibatches`` and ``gather`` return).

    Every leaf has the leading shape of the indices it was gathered with, written ``[*L]`` below
    (``[num_minibatches, minibatch_size]`` for :meth:`RolloutBuffer.minibatches`). Float fields
    have the buffer's ``float_dtype`` (float32 by default).
    """

    step: Any  # user pytree like example_step, leaves [*L, ...], the stored dtypes
    reward: jax.Array  # shape=[*L], float: r_t
    value: jax.Array  # shape=[*L], float: V(obs_t) as stored at collection time
    terminated: jax.Array  # shape=[*L], bool
    truncated: jax.Array  # shape=[*L], bool
    final_value: jax.Array  # shape=[*L], float: meaningful only where truncated
    advantages: jax.Array  # shape=[*L], float: from compute_gae (zeros before it)
    returns: jax.Array  # shape=[*L], float: advantages + value (zeros before compute_gae)
    mask: jax.Array  # shape=[*L], bool: learn from this step (trainable and filled)
    index: jax.Array  # shape=[*L], int32: flat step index t * num_envs + env


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


@dataclasses.dataclass(frozen=True)
class RolloutMemoryPressure:
    """Bytes a :class:`RolloutBuffer` and one PPO-style update over it need (host-side ints).

    Returned by :meth:`RolloutBuffer.estimate_memory_pressure`; ``str()`` prints it as a table.
    For a stacked buffer (one per seed under ``jax.vmap``) every number covers all of them.

    Definitions (``S`` = ``num_steps * num_envs`` steps, ``M`` = ``num_minibatches``):

    * ``storage_bytes``: everything the buffer holds (the sum of ``field_bytes``), alive for
      the whole update. Equals :attr:`RolloutBuffer.memory_bytes`.
    * ``minibatch_bytes``: one :class:`RolloutMinibatch` of ``S / M`` steps, every field
      (``step`` leaves, the GAE fields, ``advantages``, ``returns``, ``mask``, ``index``). This is
      what the loss reads and the gradient is taken through.
    * ``shuffled_bytes``: the shuffled copy of all ``S`` steps that :meth:`RolloutBuffer.minibatches`
      materialises (``M * minibatch_bytes``): the ``xs`` of a ``lax.scan`` over minibatches.
    * ``peak_bytes``: projected peak of one epoch with :meth:`RolloutBuffer.minibatches`:
      storage + shuffled copy + one minibatch (the slice the scan body feeds the loss).
    * ``peak_bytes_gathered``: the same epoch when each minibatch is gathered inside the scan
      body (:meth:`RolloutBuffer.minibatch_indices` + :meth:`RolloutBuffer.gather`): storage +
      the permutation (``S`` int32) + one minibatch. No full copy is made.

    Not included (they depend on the model, not the buffer): parameters, optimiser state,
    activations and gradients. XLA drops unused fields (e.g. ``reward`` when the loss never
    reads it), so these are upper bounds for the buffer's share.
    """

    num_steps: int
    num_envs: int
    num_minibatches: int
    minibatch_size: int
    field_bytes: tuple[tuple[str, int], ...]  # (field name, bytes in storage), in storage order
    storage_bytes: int
    minibatch_bytes: int
    shuffled_bytes: int
    peak_bytes: int
    peak_bytes_gathered: int

    def __str__(self) -> str:
        rows = [(name, b) for name, b in self.field_bytes]
        rows += [
            ("= storage (buffer.memory_bytes)", self.storage_bytes),
            (f"one minibatch ({self.minibatch_size} steps, all fields)", self.minibatch_bytes),
            (f"shuffled copy ({self.num_minibatches} minibatches)", self.shuffled_bytes),
            ("peak, minibatches(): storage + copy + 1 minibatch", self.peak_bytes),
            ("peak, gather per minibatch: storage + perm + 1 mb", self.peak_bytes_gathered),
        ]
        width = max(len(r[0]) for r in rows)
        head = (
            f"RolloutBuffer memory: {self.num_steps} steps x {self.num_envs} envs, "
            f"{self.num_minibatches} minibatches of {self.minibatch_size}"
        )
        lines = [head, f"{'field':<{width}}  {'bytes':>14}  {'':>11}", "-" * (width + 29)]
        for i, (name, b) in enumerate(rows):
            if i == len(self.field_bytes):
                lines.append("-" * (width + 29))
            lines.append(f"{name:<{width}}  {b:>14,}  {_fmt_bytes(b):>11}")
        return "\n".join(lines)


_GAE_FIELDS = ("reward", "value", "terminated", "truncated", "final_value", "trainable", "advantages", "returns")


class RolloutBuffer(struct.PyTreeNode):
    """Time-major ``[num_steps, num_envs]`` on-policy storage with GAE and shuffled minibatches.

    See the module docstring for what is stored and the behaviour at the edges. Build it with
    :meth:`create`; every method is pure and returns a new buffer (or arrays). Under
    ``jax.vmap`` a stacked buffer (every array leaf with a leading axis ``K``) behaves as ``K``
    independent buffers: ``jax.vmap(lambda _: RolloutBuffer.create(...), axis_size=K)(None)``
    builds one; the Python-int configuration is shared.
    """

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
    num_steps: int = struct.field(pytree_node=False)
    num_envs: int = struct.field(pytree_node=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(
        cls, example_step: Any, num_steps: int, num_envs: int, *, float_dtype: Any = jnp.float32
    ) -> "RolloutBuffer":
        """An empty buffer for ``num_steps`` steps of ``num_envs`` envs.

        Args:
          example_step: one env's step, no batch axis: a pytree of arrays or
            ``jax.ShapeDtypeStruct`` (e.g. ``{"obs": f32[4], "action": i32[], "log_prob": f32[]}``).
            Storage keeps exactly these dtypes. Do not put reward/value/flags here: they are
            separate keyword arguments of :meth:`add`.
          num_steps: ``T``, rollout length (Python int >= 1).
          num_envs: ``N``, parallel environments (Python int >= 1).
          float_dtype: dtype of ``reward``, ``value``, ``final_value``, ``advantages`` and
            ``returns`` (a floating dtype; float32 by default).

        Raises:
          ValueError: ``num_steps`` or ``num_envs`` < 1, or an empty example.
          TypeError: a leaf of the example is not an array, or ``float_dtype`` is not floating.
        """
        num_steps = _validate.static_int("num_steps", num_steps)
        num_envs = _validate.static_int("num_envs", num_envs)
        float_dtype = np.dtype(float_dtype)
        if not jnp.issubdtype(float_dtype, jnp.floating):
            raise TypeError(f"float_dtype: expected a floating dtype, got {float_dtype}")
        spec = _validate.item_spec(example_step, "example_step")
        shape = (num_steps, num_envs)
        # Distinct arrays per field (never one shared zeros array): donation needs unaliased buffers.
        zeros_f = lambda: jnp.zeros(shape, float_dtype)  # noqa: E731
        zeros_b = lambda: jnp.zeros(shape, jnp.bool_)  # noqa: E731
        return cls(
            step=jax.tree.map(lambda s: jnp.zeros((*shape, *s.shape), s.dtype), spec),
            reward=zeros_f(),
            value=zeros_f(),
            terminated=zeros_b(),
            truncated=zeros_b(),
            final_value=zeros_f(),
            trainable=zeros_b(),
            advantages=zeros_f(),
            returns=zeros_f(),
            step_index=jnp.int32(0),
            overflowed=jnp.bool_(False),
            has_advantages=jnp.bool_(False),
            num_steps=num_steps,
            num_envs=num_envs,
        )

    # ------------------------------------------------------------------ properties
    @property
    def float_dtype(self) -> np.dtype:
        """dtype of the float fields (reward, value, final_value, advantages, returns)."""
        return np.dtype(self.reward.dtype)

    @property
    def step_spec(self) -> Any:
        """Pytree of ``jax.ShapeDtypeStruct``: one env step's shapes and dtypes (no batch axis)."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[2:], x.dtype), self.step)

    @property
    def memory_bytes(self) -> int:
        """Bytes of every stored array (the step pytree, the GAE fields and the counters), Python int."""
        return _validate.tree_nbytes(self)

    def size(self) -> jax.Array:
        """Rows filled, i.e. ``step_index`` (int32 scalar in ``[0, num_steps]``)."""
        return self.step_index

    def is_full(self) -> jax.Array:
        """Whether all ``num_steps`` rows are filled (bool scalar)."""
        return self.step_index >= self.num_steps

    def filled(self) -> jax.Array:
        """bool ``[T, N]``: the row was written since the last reset (``t < step_index``)."""
        rows = jnp.arange(self.num_steps, dtype=jnp.int32) < self.step_index
        return jnp.broadcast_to(rows[:, None], (self.num_steps, self.num_envs))

    def learn_mask(self) -> jax.Array:
        """bool ``[T, N]``: steps to learn from, ``trainable & filled()``."""
        return self.trainable & self.filled()

    def trainable_size(self) -> jax.Array:
        """Number of filled steps marked trainable (int32 scalar in ``[0, T * N]``)."""
        return jnp.sum(self.learn_mask(), dtype=jnp.int32)

    # ------------------------------------------------------------------ add
    def _per_env(self, name: str, x: Any, dtype: Any) -> jax.Array:
        """Check a per-env field: an array of shape [num_envs] and exactly ``dtype`` (trace time)."""
        dtype = np.dtype(dtype)
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(
                f"{name}: expected an array of shape ({self.num_envs},) and dtype {dtype}, got {type(x).__name__}"
            )
        if tuple(x.shape) != (self.num_envs,):
            raise ValueError(f"{name}: expected shape ({self.num_envs},) (one value per env), got {tuple(x.shape)}")
        if np.dtype(x.dtype) != dtype:
            raise TypeError(f"{name}: expected dtype {dtype}, got {np.dtype(x.dtype)} (nothing is cast implicitly)")
        return jnp.asarray(x)

    def add(
        self,
        step: Any,
        *,
        reward: jax.Array,
        value: jax.Array,
        terminated: jax.Array,
        truncated: jax.Array | None = None,
        final_value: jax.Array | None = None,
        trainable: jax.Array | None = None,
    ) -> "RolloutBuffer":
        """Write one step of every env at row ``step_index`` and advance it.

        Args:
          step: pytree like ``example_step`` with a leading axis ``num_envs`` on every leaf,
            exactly the stored dtypes.
          reward: ``[N]`` float_dtype, ``r_t``.
          value: ``[N]`` float_dtype, ``V(obs_t)``.
          terminated: ``[N]`` bool, ``obs_{t+1}`` is terminal (no bootstrap).
          truncated: ``[N]`` bool, the episode was cut after this step (time limit); requires
            ``final_value``. Omitted: False.
          final_value: ``[N]`` float_dtype, ``V`` of the real ``obs_{t+1}`` before the auto-reset;
            read only where ``truncated``. Requires ``truncated``.
          trainable: ``[N]`` bool, learn from this step. Omitted: True.

        Returns:
          The new buffer. Cost O(N * step bytes), in place when donated. On a full buffer nothing
          is written and ``overflowed`` becomes True (see the module docstring). Writing clears
          ``has_advantages``.

        Raises (at trace time; messages name the field):
          TypeError: wrong tree structure or dtype (nothing is cast).
          ValueError: wrong shape or leading axis, or ``truncated``/``final_value`` without the other.
        """
        (n,) = _validate.check_batch(self.step_spec, step, 1, "step")
        if n != self.num_envs:
            raise ValueError(
                f"step: expected a leading axis of num_envs={self.num_envs} on every leaf, got {n}"
            )
        fdt, n_envs = self.float_dtype, self.num_envs
        if (truncated is None) != (final_value is None):
            given, missing = ("truncated", "final_value") if final_value is None else ("final_value", "truncated")
            raise ValueError(
                f"{given}: given without {missing}; a truncated step bootstraps from final_value "
                f"(V of the real next observation), so pass both or neither"
            )
        fields = {
            "reward": self._per_env("reward", reward, fdt),
            "value": self._per_env("value", value, fdt),
            "terminated": self._per_env("terminated", terminated, jnp.bool_),
            "truncated": jnp.zeros(n_envs, jnp.bool_) if truncated is None
            else self._per_env("truncated", truncated, jnp.bool_),
            "final_value": jnp.zeros(n_envs, fdt) if final_value is None
            else self._per_env("final_value", final_value, fdt),
            "trainable": jnp.ones(n_envs, jnp.bool_) if trainable is None
            else self._per_env("trainable", trainable, jnp.bool_),
        }
        full = self.is_full()
        row = jnp.minimum(self.step_index, self.num_steps - 1)

        def write(store: jax.Array, x: jax.Array) -> jax.Array:
            # Select against the old row (O(N)), never lax.cond on the whole storage: under vmap a
            # cond becomes a select over every row, O(T * N).
            old = lax.dynamic_index_in_dim(store, row, 0, keepdims=False)
            x = jnp.where(full, old, jnp.asarray(x))
            return lax.dynamic_update_index_in_dim(store, x, row, 0)

        new_step = jax.tree.map(write, self.step, step)
        updates = {k: write(getattr(self, k), v) for k, v in fields.items()}
        return self.replace(
            step=new_step,
            **updates,
            step_index=jnp.where(full, self.step_index, self.step_index + 1).astype(jnp.int32),
            overflowed=self.overflowed | full,
            has_advantages=jnp.bool_(False),
        )

    def reset(self) -> "RolloutBuffer":
        """Empty the buffer for the next rollout: ``step_index`` 0, flags cleared, storage kept.

        No reallocation and no zeroing (O(1)); rows not yet rewritten count as unfilled.
        """
        return self.replace(
            step_index=jnp.zeros_like(self.step_index),
            overflowed=jnp.zeros_like(self.overflowed),
            has_advantages=jnp.zeros_like(self.has_advantages),
        )

    # ------------------------------------------------------------------ advantages
    def compute_gae(
        self,
        last_value: jax.Array,
        gamma: float | jax.Array,
        gae_lambda: float | jax.Array,
        method: str = "scan",
    ) -> "RolloutBuffer":
        """Store GAE ``advantages`` and ``returns`` computed with :func:`jaxbuffers.returns.gae`.

        With a full buffer this is exactly ``returns.gae(reward, value, terminated, truncated,
        final_value, last_value, gamma=gamma, gae_lambda=gae_lambda, method=method)`` on the
        stored arrays (see that function for the recursion, the conventions and the reference,
        Schulman et al. 2016). With ``k = step_index < T`` rows filled it equals ``gae`` on the
        first ``k`` rows (step ``k - 1`` bootstraps from ``last_value`` unless it ended an
        episode), and rows ``>= k`` get zeros.

        Args:
          last_value: ``[N]`` float_dtype, ``V(obs_k)``: the value of the observation after the
            last filled step (``V(obs_T)`` for a full buffer).
          gamma: discount in ``[0, 1]`` (Python float or traced scalar).
          gae_lambda: GAE lambda in ``[0, 1]``.
          method: ``"scan"`` or ``"associative"`` (static), see :mod:`jaxbuffers.returns`.

        Returns:
          The buffer with ``advantages`` and ``returns`` (``[T, N]`` float_dtype) written and
          ``has_advantages`` True.

        Raises:
          TypeError / ValueError: ``last_value`` has the wrong dtype / shape (message names it),
            or ``gae`` rejects ``gamma``, ``gae_lambda`` or ``method``.
        """
        last_value = self._per_env("last_value", last_value, self.float_dtype)
        t = jnp.arange(self.num_steps, dtype=jnp.int32)[:, None]
        filled = t < self.step_index
        # The last filled row bootstraps from last_value: expressed as a truncation there (a
        # terminated step still wins), so gae itself handles a partial rollout. For a full buffer
        # this changes nothing: at t = T - 1 gae already bootstraps from last_value.
        cut = (t == self.step_index - 1) & ~self.truncated
        truncated = self.truncated | cut
        final_value = jnp.where(cut, last_value[None, :], self.final_value)
        adv, ret = _returns.gae(
            self.reward,
            self.value,
            self.terminated,
            truncated,
            final_value,
            last_value,
            gamma=gamma,
            gae_lambda=gae_lambda,
            method=method,
        )
        zero = jnp.zeros((), self.float_dtype)
        return self.replace(
            advantages=jnp.where(filled, adv, zero),
            returns=jnp.where(filled, ret, zero),
            has_advantages=jnp.bool_(True),
        )

    # ------------------------------------------------------------------ minibatches
    def _check_num_minibatches(self, num_minibatches: Any) -> int:
        total = self.num_steps * self.num_envs
        if isinstance(num_minibatches, bool) or not isinstance(num_minibatches, (int, np.integer)):
            raise TypeError(f"num_minibatches: expected a Python int, got {type(num_minibatches).__name__}")
        m = int(num_minibatches)
        if m <= 0:
            raise ValueError(f"num_minibatches: expected an int >= 1, got {m}")
        if total % m:
            divisors = [d for d in range(1, min(total, 64) + 1) if total % d == 0]
            raise ValueError(
                f"num_minibatches: num_steps * num_envs = {self.num_steps} * {self.num_envs} = {total} steps "
                f"is not divisible by num_minibatches={m}; choose a divisor of {total} (e.g. {divisors})"
            )
        return m

    def minibatch_indices(self, key: jax.Array, num_minibatches: int) -> jax.Array:
        """A random permutation of the ``T * N`` flat step indices, shaped into minibatches.

        Args:
          key: a JAX PRNG key.
          num_minibatches: ``M``, static Python int dividing ``T * N``.

        Returns:
          int32 ``[M, T * N / M]``: every flat index ``t * num_envs + env`` exactly once.
          Unfilled and non-trainable steps are included (``gather`` masks them), so shapes stay
          static.

        Raises:
          ValueError: ``M <= 0`` or ``M`` does not divide ``T * N`` (at trace time).
          TypeError: ``M`` is not a Python int.
        """
        m = self._check_num_minibatches(num_minibatches)
        total = self.num_steps * self.num_envs
        perm = jax.random.permutation(key, total).astype(jnp.int32)
        return perm.reshape(m, total // m)

    def gather(self, indices: jax.Array) -> RolloutMinibatch:
        """The steps at flat indices ``indices`` (int32 ``[*L]``, values in ``[0, T * N)``).

        Returns:
          :class:`RolloutMinibatch` with leaves ``[*L, ...]``; ``mask`` is ``trainable & filled``.
          Out-of-range indices are clipped (defined, but a caller bug).

        Raises:
          TypeError: ``indices`` of a non-integer dtype (they were truncated before).
        """
        total = self.num_steps * self.num_envs
        indices = _validate.integer_indices("indices", indices)  # wide ints saturate, floats raise

        def take(x: jax.Array) -> jax.Array:
            return jnp.take(x.reshape(total, *x.shape[2:]), indices, axis=0, mode="clip")

        return RolloutMinibatch(
            step=jax.tree.map(take, self.step),
            reward=take(self.reward),
            value=take(self.value),
            terminated=take(self.terminated),
            truncated=take(self.truncated),
            final_value=take(self.final_value),
            advantages=take(self.advantages),
            returns=take(self.returns),
            mask=take(self.learn_mask()),
            index=jnp.clip(indices, 0, total - 1),
        )

    def minibatches(self, key: jax.Array, num_minibatches: int) -> RolloutMinibatch:
        """All ``T * N`` steps, shuffled, as ``num_minibatches`` minibatches for ``lax.scan``.

        ``gather(minibatch_indices(key, num_minibatches))``: leaves
        ``[num_minibatches, T * N / num_minibatches, ...]``; each step appears exactly once.
        Drop non-trainable (and unfilled) steps in the loss with ``mask``. This materialises a
        shuffled copy of the buffer (see :class:`RolloutMemoryPressure`); to avoid it, scan over
        ``minibatch_indices`` and ``gather`` one minibatch per iteration.

        ``advantages`` / ``returns`` are whatever :meth:`compute_gae` last wrote: zeros (or the
        previous rollout's values) if it was not called after the last ``add``. That cannot be
        checked at trace time; ``has_advantages`` (traced bool) says whether it was.

        Raises:
          ValueError: ``num_minibatches <= 0`` or it does not divide ``T * N`` (trace time).
        """
        return self.gather(self.minibatch_indices(key, num_minibatches))

    # ------------------------------------------------------------------ memory
    def estimate_memory_pressure(self, num_minibatches: int) -> RolloutMemoryPressure:
        """Per-field storage bytes and the projected peak of an update (see :class:`RolloutMemoryPressure`).

        Host-side arithmetic on shapes only (works on abstract buffers, e.g. from
        ``jax.eval_shape``). A stacked buffer counts every stacked copy.

        Raises:
          ValueError: ``num_minibatches <= 0`` or not dividing ``T * N``.
        """
        m = self._check_num_minibatches(num_minibatches)
        steps = self.num_steps * self.num_envs
        copies = int(np.prod(self.reward.shape, dtype=np.int64)) // steps  # K for a stacked buffer
        field_bytes: list[tuple[str, int]] = []
        for path, leaf in jax.tree_util.tree_flatten_with_path(self.step)[0]:
            field_bytes.append((f"step{_validate.leaf_name(path) if path else ''}", _validate.tree_nbytes(leaf)))
        for name in _GAE_FIELDS:
            field_bytes.append((name, _validate.tree_nbytes(getattr(self, name))))
        field_bytes.append(
            ("counters (step_index, flags)", _validate.tree_nbytes((self.step_index, self.overflowed, self.has_advantages)))
        )
        storage = sum(b for _, b in field_bytes)
        # Per step: every stored [T, N] field except `trainable` (replaced by `mask`, also bool) plus
        # the int32 `index`: exactly the fields of RolloutMinibatch.
        per_step = sum(b for name, b in field_bytes if not name.startswith("counters")) // (copies * steps)
        per_step += np.dtype(np.int32).itemsize
        mb_size = steps // m
        minibatch = copies * mb_size * per_step
        shuffled = m * minibatch
        perm = copies * steps * np.dtype(np.int32).itemsize
        return RolloutMemoryPressure(
            num_steps=self.num_steps,
            num_envs=self.num_envs,
            num_minibatches=m,
            minibatch_size=mb_size,
            field_bytes=tuple(field_bytes),
            storage_bytes=storage,
            minibatch_bytes=minibatch,
            shuffled_bytes=shuffled,
            peak_bytes=storage + shuffled + minibatch,
            peak_bytes_gathered=storage + perm + minibatch,
        )
