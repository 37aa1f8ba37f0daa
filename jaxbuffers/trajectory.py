"""Per-environment trajectory storage: `TrajectoryBuffer`, its sample types and the n-step window.

Layout, flat positions, the final-observation ring, valid windows and `period`: `docs/api/trajectory.md`;
the step convention: `docs/guide.md`, section 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuffers import _compiled, _ring, _validate
from jaxbuffers._metrics import Metrics, Recorded
from jaxbuffers._steps import EnvSteps

__all__ = ["TrajectoryBuffer", "SequenceSample", "TransitionSample", "episode_mask", "n_step_window"]

_GAMMA = {"gamma": (0.0, 1.0)}


class SequenceSample(NamedTuple):
    """What `TrajectoryBuffer.sample_sequences` returns: `B` sequences of `L` steps (their final
    observations to bootstrap from: `TrajectoryBuffer.final_obs_at(sample.indices, L)`)."""

    item: Any  # dict like the example step, leaves [B, L, ...], stored dtypes
    terminated: jax.Array  # shape=[B, L], dtype=bool: step j ended its episode by termination
    truncated: jax.Array  # shape=[B, L], dtype=bool: step j ended its episode by truncation (time limit)
    indices: jax.Array  # shape=[B], dtype=int32: lane * length + physical slot of the first step

    @property
    def mask(self) -> jax.Array:
        """bool [B, L]: step `j` is in the first step's episode (no episode end in steps `[0, j)`)."""
        return episode_mask(self.terminated, self.truncated)


class TransitionSample(NamedTuple):
    r"""What `TrajectoryBuffer.sample_transitions` returns: `B` n-step transitions.

    With $k$ the number of rewards used ($1 \le k \le n$, cut at the first episode end), the
    bootstrap target is `n_step_return + discount * V(next_obs)` (`n_step_window`).
    """

    obs: Any  # obs_t, leaves [B, ...]
    action: Any  # action_t, leaves [B, ...]
    n_step_return: jax.Array  # shape=[B], dtype=reward dtype: G_t^(k)
    discount: jax.Array  # shape=[B], dtype=reward dtype: gamma**k, 0 if step t+k-1 terminated
    next_obs: Any  # obs_{t+k}, leaves [B, ...]: the true final obs after truncation; after termination the next stored obs (discount 0)
    num_steps: jax.Array  # shape=[B], dtype=int32: k
    item: Any  # the whole step t (every field, extras included), leaves [B, ...]
    indices: jax.Array  # shape=[B], dtype=int32: lane * length + physical slot of step t


def episode_mask(terminated: jax.Array, truncated: jax.Array) -> jax.Array:
    """bool `[..., L]`: step `j` of a window is in its first step's episode (no end in steps `[0, j)`)."""
    pos = jnp.arange(terminated.shape[-1], dtype=jnp.int32)
    first = jnp.min(jnp.where(terminated | truncated, pos, terminated.shape[-1]), axis=-1, keepdims=True)
    return pos <= first


def _flat_take(x: jax.Array, flat: jax.Array) -> jax.Array:
    """`x[lane, slot]` for `x` of shape `[E, length, ...]` and flat ids `lane * length + slot`."""
    e, n = x.shape[:2]
    return jnp.take(x.reshape(e * n, *x.shape[2:]), flat, axis=0, mode="clip")


def _gamma(gamma, dtype) -> jax.Array:
    """`gamma` (`jaxbuffers._validate.scalar_parameter`, in [0, 1]) as a 0-d `dtype` array."""
    if gamma is None:
        raise TypeError("gamma: required (a float in [0, 1] or a 0-d float array)")
    return jnp.asarray(_validate.scalar_parameter("gamma", gamma, 0.0, 1.0)).astype(dtype)


def n_step_window(reward: jax.Array, terminated: jax.Array, truncated: jax.Array, gamma) -> tuple:
    r"""n-step return over windows of `n` steps, cut at the first episode end.

    With $k = \min(n, 1 + j^*)$, $j^*$ the first $j$ with an episode end at step $t + j$:

    $$
    G = \sum_{i=0}^{k-1} \gamma^i r_{t+i}, \qquad
    \text{discount} = \gamma^k (1 - \text{terminated}_{t+k-1})
    $$

    (`jaxbuffers.n_step_returns` is the whole-rollout form.) For rewards narrower than float32 the
    powers and the sum are float32, rounded once at the end (a rounded $\gamma$ compounds in $\gamma^k$).

    Args:
      reward: float[..., n], rewards $r_t, \dots, r_{t+n-1}$ of one window per row.
      terminated: bool[..., n], flags of the same steps.
      truncated: bool[..., n], flags of the same steps.
      gamma: scalar discount in [0, 1].

    Returns:
      `(G, discount, k)`: `G` and `discount` of the reward dtype, `k` int32, shapes `[...]`.
    """
    n = reward.shape[-1]
    acc = jnp.promote_types(reward.dtype, jnp.float32)  # float32, or float64 rewards kept
    g = _gamma(gamma, acc)
    alive = episode_mask(terminated, truncated)  # step i counts iff no end in [0, i)
    powers = g ** jnp.arange(n, dtype=acc)
    ret = jnp.sum(jnp.where(alive, powers * reward.astype(acc), 0), axis=-1).astype(reward.dtype)
    k = jnp.sum(alive, axis=-1, dtype=jnp.int32)
    term_last = jnp.take_along_axis(terminated, (k - 1)[..., None], axis=-1)[..., 0]
    discount = jnp.where(term_last, 0, g**k).astype(reward.dtype)
    return ret, discount, k


@_validate.one_member_methods
class TrajectoryBuffer(Recorded, EnvSteps, struct.PyTreeNode):
    """Per-environment lanes of steps with episode flags; uniform sequence and n-step sampling.

    Layout, final-observation ring, windows and `period`: `docs/api/trajectory.md`; an example: `docs/guide.md`,
    section 3. Every method is pure; it works under `jit` (donated: in place), `lax.scan` and `vmap`, and eagerly
    runs as one cached compiled program (`jaxbuffers._compiled`).

    References:
      Sutton & Barto (2018), *Reinforcement Learning: An Introduction*, section 7.1 (n-step returns);
      Gymnasium's `terminated` / `truncated` API.
    """

    _cursor = "head"  # the leaf that is a scalar in one buffer (stacked with jax.vmap: `jaxbuffers._validate.members`)

    storage: Any  # dict like the example step, leaves [num_envs, length, *shape], example dtypes
    terminated: jax.Array  # shape=[num_envs, length], dtype=bool: stored terminated flags by physical slot
    truncated: jax.Array  # shape=[num_envs, length], dtype=bool: stored truncated flags by physical slot
    final_slot: jax.Array  # shape=[num_envs, length], dtype=int32: final-obs ring slot of a truncated, not terminated step (0 elsewhere)
    final_obs: Any  # obs pytree, leaves [num_envs, final_obs_capacity, *obs_shape]: the final-observation ring
    head: jax.Array  # shape=(), dtype=int32: slot the next step goes to in every lane, in [0, length)
    num_valid: jax.Array  # shape=(), dtype=int32: steps stored per lane, in [0, length]
    added: jax.Array  # shape=[2], dtype=int32: steps ever added per lane, two-word counter (_ring.counter_*)
    final_head: jax.Array  # shape=[num_envs], dtype=int32: next final-obs ring slot per lane, in [0, final_obs_capacity)
    final_owner: jax.Array  # shape=[num_envs, K] ([num_envs, 0] if K = length), dtype=int32: physical slot of each ring slot's stored step, or -1
    lost_prefix: jax.Array  # shape=[num_envs], dtype=int32: oldest steps of a lane through its newest with a lost final obs (no window starts there)
    metrics: Metrics  # usage counters; sample_count [num_envs, length] by window start (jaxbuffers._metrics)
    num_envs: int = struct.field(pytree_node=False)
    length: int = struct.field(pytree_node=False)
    final_obs_capacity: int = struct.field(pytree_node=False)
    obs_key: str = struct.field(pytree_node=False)
    action_key: str = struct.field(pytree_node=False)
    reward_key: str = struct.field(pytree_node=False)

    @classmethod
    @_validate.keyword_sizes
    def create(
        cls, example_step: Mapping, *, num_envs: int, length: int, final_obs_capacity: int | None = None,
        obs_key: str = "obs", action_key: str = "action", reward_key: str = "reward", metrics: bool = True,
    ) -> "TrajectoryBuffer":
        """An empty buffer of `num_envs` lanes of `length` steps.

        Args:
          example_step: one step of one env (no leading axes): a dict with at least `obs_key` (a pytree of arrays),
            `action_key` and `reward_key` (a floating scalar), plus any extras; arrays or `jax.ShapeDtypeStruct`,
            dtypes stored exactly.
          num_envs: lanes (Python int >= 1).
          length: steps kept per lane (Python int >= 1); the oldest are overwritten first.
          final_obs_capacity: final observations kept per lane for truncated steps ($K$, `docs/api/trajectory.md`);
            `None` means `length` (always exact); a value above `length` is reduced to `length`. Below the number of
            truncated steps a lane holds, the oldest final observations are overwritten and no window starting at or
            before a lane's newest such step is drawn (`lost_prefix`, `final_obs_lost`; "Lost final observations" in
            `docs/api/trajectory.md`).
          obs_key: name of the observation field.
          action_key: name of the action field.
          reward_key: name of the reward field.
          metrics: static bool: keep per-position sample counts (`jaxbuffers._metrics`; int32 `[num_envs, length]`,
            on by default; the other counters are always kept).

        Raises:
          TypeError: `example_step` is not a dict, a leaf is not an array, a field name is not a str, `metrics`
            not a bool, the reward not of a floating dtype (or not one array).
          ValueError: a size is not a positive int, `num_envs * length` above `2**31 - 1` (positions are int32
            `lane * length + slot`), a required field missing, the observation without leaves, the reward not a scalar.
        """
        num_envs, length, spec = _validate.trajectory_example(example_step, num_envs, length, obs_key, action_key, reward_key)
        k = length if final_obs_capacity is None else min(_validate.static_int("final_obs_capacity", final_obs_capacity), length)
        zeros = lambda s, n: jnp.zeros((num_envs, n, *s.shape), s.dtype)  # noqa: E731
        return cls(
            storage=jax.tree.map(lambda s: zeros(s, length), spec),
            terminated=jnp.zeros((num_envs, length), bool), truncated=jnp.zeros((num_envs, length), bool),
            final_slot=jnp.zeros((num_envs, length), jnp.int32),
            final_obs=jax.tree.map(lambda s: zeros(s, k), spec[obs_key]), head=jnp.int32(0),
            num_valid=jnp.int32(0), added=_ring.counter_zero(), final_head=jnp.zeros((num_envs,), jnp.int32),
            final_owner=jnp.full((num_envs, k if k < length else 0), -1, jnp.int32), lost_prefix=jnp.zeros((num_envs,), jnp.int32),
            metrics=Metrics.create((num_envs, length), metrics),
            num_envs=num_envs, length=length, final_obs_capacity=k, obs_key=obs_key, action_key=action_key,
            reward_key=reward_key,
        )

    def _cursor_ranges(self) -> dict:
        """`(lo, hi)`, inclusive, of the cursor fields' documented ranges (`_checkpoint_describe._checked_cursors`)."""
        return {"final_head": (0, self.final_obs_capacity - 1), "final_owner": (-1, self.length - 1),
                "lost_prefix": (0, self.length)}

    def _metrics_ring(self):
        return self.metrics, self.added, self.head, self.num_valid, self.length, self.num_envs

    def _env_steps(self) -> tuple[Any, jax.Array, int]:
        return self.storage, self.num_valid, self.length

    def num_added(self) -> int:
        """Exact number of steps ever added per lane (host-side Python int; a stacked state: one member at a time)."""
        return _ring.counter_value(self.added)

    @_compiled.method("batch_size", "sequence_length", "period", "cross_episodes")
    def can_sample(self, batch_size: int, sequence_length: int, *, period: int = 1, cross_episodes: bool = True) -> jax.Array:
        """Whether `sample_sequences` with these arguments returns only valid data (bool scalar): some window it draws
        exists (valid, after its lane's `lost_prefix`; `cross_episodes=False`: inside one episode, an
        `O(num_envs * length)` count). Same arguments and errors as `sample_sequences`, without the key."""
        _validate.static_int("batch_size", batch_size)
        sequence_length = self._sequence_length(sequence_length)
        period = _validate.static_int("period", period)
        if _validate.static_bool("cross_episodes", cross_episodes):
            return self._total_windows(sequence_length, period) > 0
        return self._episode_window_counts(sequence_length, period)[-1] > 0

    @_compiled.method("window", "period")
    def num_valid_windows(self, window: int, *, period: int = 1) -> jax.Array:
        """The number of windows of `window` steps that the uniform samplers draw from (crossing episodes), over all
        lanes (int32 scalar): valid (after each lane's `lost_prefix`) and aligned to `period` ("Windows", "Period",
        "Lost final observations" in `docs/api/trajectory.md`).

        Raises:
          ValueError: `window` or `period` not an int >= 1.
        """
        window, period = _validate.static_int("window", window), _validate.static_int("period", period)
        return self._total_windows(window, period)

    @_compiled.method("batch_size", "n_step", scalars=_GAMMA)
    def can_sample_transitions(self, batch_size: int, *, n_step: int = 1, gamma=None) -> jax.Array:
        """Whether `sample_transitions` with these arguments returns only valid data (bool scalar): some lane holds
        `n_step + 1` steps after its `lost_prefix`. `sample_transitions`' arguments and errors without the key (`gamma`
        optional here: checked when given, it never changes the answer)."""
        _validate.static_int("batch_size", batch_size)
        if gamma is not None:
            _gamma(gamma, self.storage[self.reward_key].dtype)
        return self._total_windows(self._n_step(n_step) + 1) > 0

    @_compiled.method()
    def add(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> "TrajectoryBuffer":
        """Append one step or a chunk of steps to every lane.

        Args:
          step: dict like the example step, leaves `[num_envs, ...]` (one step) or `[num_envs, t, ...]` (a chunk,
            `1 <= t <= length`), exactly the stored dtypes.
          terminated: bool `[num_envs]` or `[num_envs, t]`: `obs_{t+1}` is terminal.
          truncated: optional bool, same shape: the episode was cut after the step.
          final_obs: required with `truncated`: obs pytree like `step[obs_key]`, the true observation after each
            step before any auto-reset. Read where `truncated & ~terminated`.

        Returns:
          The new buffer. Cost O(num_envs * t), plus O(num_envs * K) when $K$ < `length`; in place when donated.

        Raises:
          TypeError: `step` not a dict, wrong structure or dtype (flags must be bool), `final_obs` missing with
            `truncated`.
          ValueError: wrong shapes or `num_envs`, `t` outside `[1, length]`, `final_obs` without `truncated` or with
            other leading axes than `step` (never broadcast).
        """
        args = _validate.trajectory_add(self.step_spec, self.obs_key, self.num_envs, self.length, step, terminated, truncated, final_obs)
        return self.add_prepared(*args)

    def add_prepared(self, step, terminated, truncated, final_obs) -> "TrajectoryBuffer":
        """`add` of arguments that `jaxbuffers._validate.trajectory_add` has checked and given a time axis
        (`[num_envs, t, ...]`), for wrappers that check the step against a spec of their own (compressed buffers)."""
        t = terminated.shape[1]
        if truncated is None:
            truncated = jnp.zeros_like(terminated)
        boot = truncated & ~terminated  # steps that bootstrap from their final observation
        slot, keep, final_head = _ring.final_slots(self.final_head, boot, self.final_obs_capacity)
        flags = (self.terminated, self.truncated, self.final_slot)
        (storage, (term, trunc, fslot)), metrics = self.metrics.write(
            (self.storage, flags), (step, (terminated, truncated, jnp.where(boot, slot, 0))), self.head, axis=1
        )
        store = self.final_obs if final_obs is None else _ring.write_lanes(self.final_obs, final_obs, slot, keep)
        head, num_valid = _ring.advance(self.head, self.num_valid, t, self.length)
        owner, lost = self._track_lost(boot, slot, keep, _ring.write_indices(self.head, t, self.length), t)
        return self.replace(
            storage=storage, terminated=term, truncated=trunc, final_slot=fslot, final_obs=store,
            head=head, num_valid=num_valid, added=_ring.counter_add(self.added, t), final_head=final_head,
            final_owner=owner, lost_prefix=lost, metrics=metrics,
        )

    @property
    def _lossy(self) -> bool:
        """Static: whether a stored step's final observation can be overwritten ($K$ < `length`)."""
        return self.final_obs_capacity < self.length

    def _track_lost(self, boot, slot, keep, steps, written: int) -> tuple[jax.Array, jax.Array]:
        """(`final_owner`, `lost_prefix`) after writing the final observations of steps `boot` bool `[E, t]` (at
        physical slots `steps` int32 `[t]`) to the ring slots `slot` where `keep` (`jaxbuffers._ring.final_slots`),
        and `written` (static: `t` for an add, 0 for `truncate_last`) steps to the lanes. An owner is a stored step
        (-1 once its slot is overwritten, so no step's flags are read). The ring is FIFO, so what it overwrites is its
        oldest: the newest step losing its final observation is the owner of the last slot overwritten, or a step of
        this chunk that `keep` drops. `O(E * (t + K))`; nothing unless $K$ < `length`."""
        if not self._lossy:
            return self.final_owner, self.lost_prefix
        n, k, lanes = self.length, self.final_obs_capacity, jnp.arange(self.num_envs, dtype=jnp.int32)
        num_valid = jnp.minimum(self.num_valid + written, n)
        evicted = self.num_valid + written - num_valid  # oldest steps overwritten by this write
        owner = jnp.where((self.final_owner - self.head) % n < written, -1, self.final_owner)  # owners overwritten
        m = jnp.minimum(jnp.sum(boot, axis=1, dtype=jnp.int32), k)  # ring slots overwritten per lane
        p = owner[lanes, (self.final_head + m - 1) % k]  # the newest of their owners
        old = _ring.physical_to_logical(p, self.head, self.num_valid, n)
        lost = jnp.maximum(self.lost_prefix - evicted, 0)
        lost = jnp.where((m > 0) & (p >= 0), jnp.maximum(lost, old - evicted + 1), lost)
        t = boot.shape[1]  # the newest t steps: logical num_valid - t + j after the write
        fresh = num_valid - t + jnp.arange(1, t + 1, dtype=jnp.int32)  # [t]: a lost step of the chunk and those before it
        lost = jnp.maximum(lost, jnp.max(jnp.where(boot & ~keep, fresh, 0), axis=1))
        owner = _ring.write_lanes(owner, jnp.broadcast_to(steps, boot.shape), slot, keep)
        return owner, lost.astype(jnp.int32)

    @_compiled.method()
    def truncate_last(self, truncated, final_obs) -> "TrajectoryBuffer":
        """Mark each lane's newest step truncated after the fact, with its final observation: the buffer then equals
        the one where that step was added with `truncated=True` and this `final_obs`. Lanes whose newest step already
        ended an episode, and an empty buffer, are unchanged.

        Args:
          truncated: bool `[num_envs]`, the lanes to truncate.
          final_obs: obs pytree, leaves `[num_envs, *obs_shape]` of the stored dtypes: the true observation after
            each lane's newest step (read where truncated).

        Raises:
          TypeError / ValueError: wrong structure, shape or dtype (naming the argument).
        """
        _validate.array("truncated", truncated, (self.num_envs,), jnp.bool_)
        lead = _validate.check_batch(self.step_spec[self.obs_key], final_obs, 1, "final_obs")
        if lead[0] != self.num_envs:
            raise ValueError(f"final_obs: expected leading axis num_envs={self.num_envs}, got {lead[0]}")
        slot = (self.head - 1) % self.length  # each lane's newest step
        ended = self.terminated[:, slot] | self.truncated[:, slot]
        boot = (jnp.asarray(truncated) & ~ended & (self.num_valid > 0))[:, None]
        fslot, keep, final_head = _ring.final_slots(self.final_head, boot, self.final_obs_capacity)
        store = _ring.write_lanes(self.final_obs, jax.tree.map(lambda x: jnp.asarray(x)[:, None], final_obs), fslot, keep)
        owner, lost = self._track_lost(boot, fslot, keep, slot[None], 0)
        return self.replace(
            truncated=self.truncated.at[:, slot].set(self.truncated[:, slot] | boot[:, 0]),
            final_slot=self.final_slot.at[:, slot].set(jnp.where(boot[:, 0], fslot[:, 0], self.final_slot[:, slot])),
            final_obs=store, final_head=final_head, final_owner=owner, lost_prefix=lost,
        )

    @_compiled.method()
    def final_obs_lost(self) -> jax.Array:
        """Whether some stored truncated step's final observation was overwritten (bool scalar, `O(num_envs)`).

        A final observation is overwritten once $K$ truncated (not terminated) steps followed its step in its lane;
        only the steps stored now count. No sampler draws a window that reads one: each lane's windows start after its
        newest such step (`lost_prefix`, "Lost final observations" in `docs/api/trajectory.md`).
        """
        return jnp.any(self.lost_prefix > 0)

    def _with_lost_rebuilt(self) -> "TrajectoryBuffer":
        """This buffer with `final_owner` and `lost_prefix` computed from the flags and `final_slot`, `O(num_envs *
        length)`, as the adds keep them (checkpoints saved before these fields): a step's final observation is lost
        iff $K$ or more truncated (not terminated) steps follow it in its lane; a ring slot's owner is the newest
        stored step holding it (-1 if none)."""
        if not self._lossy:
            return self
        n, pos = self.length, jnp.arange(self.length, dtype=jnp.int32)
        needs = self._logical_order(self.truncated & ~self.terminated) & (pos < self.num_valid)
        c = needs.astype(jnp.int32)
        later = jnp.sum(c, axis=1, keepdims=True) - jnp.cumsum(c, axis=1)  # ring writes after each step
        lost = jnp.max(jnp.where(needs & (later >= self.final_obs_capacity), pos + 1, 0), axis=1)
        lanes = jnp.arange(self.num_envs, dtype=jnp.int32)[:, None]
        newest = jnp.full(self.final_owner.shape, -1, jnp.int32).at[lanes, self._logical_order(self.final_slot)].max(jnp.where(needs, pos, -1))
        owner = jnp.where(newest >= 0, _ring.logical_to_physical(newest, self.head, self.num_valid, n), -1)
        return self.replace(final_owner=owner.astype(jnp.int32), lost_prefix=lost.astype(jnp.int32))

    def _sequence_length(self, sequence_length) -> int:
        sequence_length = _validate.static_int("sequence_length", sequence_length)
        if sequence_length > self.length:
            raise ValueError(f"sequence_length: expected at most length={self.length}, got {sequence_length}")
        return sequence_length

    def _n_step(self, n_step) -> int:
        n_step = _validate.static_int("n_step", n_step)
        if n_step + 1 > self.length:
            raise ValueError(f"n_step: expected at most length - 1 = {self.length - 1}, got {n_step}")
        return n_step

    def _first_start(self, period: int) -> jax.Array:
        """Logical index of a lane's first window start aligned to `period` (`jaxbuffers._ring.aligned_first`)."""
        return _ring.aligned_first(_ring.counter_mod(self.added, period), self.num_valid, period)

    def _lane_windows(self, window: int, period: int) -> tuple[jax.Array, jax.Array]:
        """(first start, number) of the windows of `window` steps drawn in each lane, int32 `[num_envs]`: valid,
        aligned to `period`, starting at or after the lane's `lost_prefix` ("Lost final observations")."""
        first = self._first_start(period)
        behind = jnp.maximum(self.lost_prefix - first, 0)
        first = (first + (behind + period - 1) // period * period).astype(jnp.int32)
        return first, _ring.num_windows(self.num_valid, window, period, first)

    def _total_windows(self, window: int, period: int = 1) -> jax.Array:
        """The windows of `window` steps aligned to `period` that the uniform samplers draw, over all lanes (int32)."""
        if not self._lossy:  # every lane has the same windows
            return (_ring.num_windows(self.num_valid, window, period, self._first_start(period)) * self.num_envs).astype(jnp.int32)
        return jnp.sum(self._lane_windows(window, period)[1], dtype=jnp.int32)

    def _drawn_by(self, method: str, kw: Mapping) -> jax.Array:
        """`num_valid_windows` of the windows `method` (`"sample_sequences"` crossing episodes, or
        `"sample_transitions"`) called with keywords `kw` draws from (a global sample's weight of a shard)."""
        if method == "sample_transitions":
            return self._total_windows(kw.get("n_step", 1) + 1)
        return self._total_windows(kw["sequence_length"], kw.get("period", 1))

    def _uniform_positions(self, key, batch_size: int, window: int, period: int):
        """Uniform (lane, physical start) over the windows drawn: one draw over their number, `O(batch_size)`
        (with $K$ < `length` `O(num_envs + batch_size * log num_envs)`: a lane by its running count, then its window)."""
        key = _validate.key("key", key)
        if not self._lossy:
            first = self._first_start(period)
            per_lane = jnp.maximum(_ring.num_windows(self.num_valid, window, period, first), 1)
            flat = jax.random.randint(key, (batch_size,), 0, per_lane * self.num_envs, jnp.int32)
            starts = _ring.window_starts(flat % per_lane, self.head, self.num_valid, self.length, period, first)
            return flat // per_lane, starts
        first, count = self._lane_windows(window, period)
        cum = jnp.cumsum(count, dtype=jnp.int32)
        r = jax.random.randint(key, (batch_size,), 0, jnp.maximum(cum[-1], 1), jnp.int32)
        lanes = jnp.minimum(jnp.searchsorted(cum, r, side="right"), self.num_envs - 1).astype(jnp.int32)
        starts = _ring.window_starts(r - (cum - count)[lanes], self.head, self.num_valid, self.length, period, first[lanes])
        return lanes, starts

    def _logical_order(self, x: jax.Array) -> jax.Array:
        """`x` `[num_envs, length]` with its columns in logical order (the oldest stored step first)."""
        n = self.length
        return x[:, _ring.logical_to_physical(jnp.arange(n, dtype=jnp.int32), self.head, self.num_valid, n)]

    def _ends_before(self) -> jax.Array:
        """int32 `[num_envs, length + 1]`: `c[lane, l]` counts the episode ends in logical steps `[0, l)`."""
        ends = self._logical_order(self.terminated | self.truncated).astype(jnp.int32)
        return jnp.concatenate([jnp.zeros((self.num_envs, 1), jnp.int32), jnp.cumsum(ends, axis=1)], axis=1)

    def _episode_window_counts(self, window: int, period: int) -> jax.Array:
        """Running count (int32[num_envs * (length - window + 1)]) of the valid, aligned windows with no episode end
        before their last step, by `lane * (length - window + 1) + logical start`."""
        n = self.length
        c = self._ends_before()
        ls = jnp.arange(n - window + 1, dtype=jnp.int32)
        inside = (c[:, ls + window - 1] - c[:, ls]) == 0
        ok = inside & (ls + window <= self.num_valid) & _ring.aligned(ls, self._first_start(period), period)
        if self._lossy:
            ok = ok & (ls >= self.lost_prefix[:, None])
        return jnp.cumsum(ok.reshape(-1).astype(jnp.int32))

    def _episode_positions(self, key, batch_size: int, window: int, period: int):
        """Exact uniform draw over windows inside one episode: cumulative counts + searchsorted."""
        counts = self._episode_window_counts(window, period)
        r = jax.random.randint(_validate.key("key", key), (batch_size,), 0, jnp.maximum(counts[-1], 1), jnp.int32)
        pos = jnp.minimum(jnp.searchsorted(counts, r, side="right").astype(jnp.int32), counts.shape[0] - 1)
        w = self.length - window + 1
        return pos // w, _ring.logical_to_physical(pos % w, self.head, self.num_valid, self.length)

    def _windows(self, lanes, starts, window: int) -> jax.Array:
        """Flat positions int32 `[B, window]` of the windows starting at physical `starts` of `lanes`."""
        return lanes[:, None] * self.length + _ring.window_slots(starts, window, self.length)

    def _sequences(self, lanes, starts, sequence_length: int) -> SequenceSample:
        flat = self._windows(lanes, starts, sequence_length)
        return SequenceSample(
            item=jax.tree.map(lambda x: _flat_take(x, flat), self.storage),
            terminated=_flat_take(self.terminated, flat), truncated=_flat_take(self.truncated, flat),
            indices=(lanes * self.length + starts).astype(jnp.int32),
        )

    def _final_obs(self, flat: jax.Array):
        """Final obs read from the ring at flat positions `flat` (any shape), and where it is real."""
        real = _flat_take(self.truncated & ~self.terminated, flat)  # the step has a ring slot
        fslot = (flat // self.length) * self.final_obs_capacity + _flat_take(self.final_slot, flat)
        return jax.tree.map(lambda f: _flat_take(f, fslot), self.final_obs), real

    def _transitions(self, lanes, starts, n_step: int, gamma) -> TransitionSample:
        flat = self._windows(lanes, starts, n_step + 1)
        fw = flat[:, :n_step]
        term = _flat_take(self.terminated, fw)
        ret, discount, k = n_step_window(_flat_take(self.storage[self.reward_key], fw), term, _flat_take(self.truncated, fw), gamma)
        rows = jnp.arange(lanes.shape[0])
        final, use_final = self._final_obs(fw[rows, k - 1])  # step t + k - 1 truncated: its final obs
        stored = jax.tree.map(lambda x: _flat_take(x, flat[rows, k]), self.storage[self.obs_key])
        pick = lambda f, x: jnp.where(use_final.reshape((-1,) + (1,) * (x.ndim - 1)), f, x)  # noqa: E731
        item = jax.tree.map(lambda x: _flat_take(x, flat[:, 0]), self.storage)
        return TransitionSample(
            obs=item[self.obs_key], action=item[self.action_key], n_step_return=ret, discount=discount,
            next_obs=jax.tree.map(pick, final, stored), num_steps=k, item=item, indices=flat[:, 0].astype(jnp.int32),
        )

    @_compiled.method("batch_size", "sequence_length", "period", "cross_episodes")
    def sample_sequences(
        self, key: jax.Array, batch_size: int, sequence_length: int, *, period: int = 1, cross_episodes: bool = True
    ) -> SequenceSample:
        """Sample `batch_size` sequences of `sequence_length` consecutive steps of one lane.

        Uniform with replacement over the valid windows whose start is aligned to `period` ("Period" in
        `docs/api/trajectory.md`) and comes after its lane's `lost_prefix` (so `final_obs_at` of the sample is exact:
        "Lost final observations"); with `cross_episodes=False` over those with no episode end before their last step
        (exact, `O(num_envs * length)` per call; the default costs `O(batch_size * sequence_length)`, plus
        `O(num_envs)` when `final_obs_capacity < length`).

        Args:
          key: PRNG key.
          batch_size: static int >= 1.
          sequence_length: static int in `[1, length]`.
          period: static int >= 1.
          cross_episodes: static bool.

        Returns:
          `SequenceSample`; defined (real slots, zeros if empty) where `can_sample` is False.

        Raises:
          ValueError: a size not an int >= 1 or `sequence_length > length`.
          TypeError: `cross_episodes` not a bool.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        sequence_length = self._sequence_length(sequence_length)
        period = _validate.static_int("period", period)
        draw = self._uniform_positions if _validate.static_bool("cross_episodes", cross_episodes) else self._episode_positions
        return self._sequences(*draw(key, batch_size, sequence_length, period), sequence_length)

    @_compiled.method("batch_size", "n_step", scalars=_GAMMA)
    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma) -> TransitionSample:
        """Sample `batch_size` n-step transitions uniformly over the valid windows of `n_step + 1` steps.

        The return is cut at the first episode end (`n_step_window`); `next_obs` is `obs_{t+k}`: from the
        final-observation ring if step `t + k - 1` was truncated (never the reset observation), else the stored step
        `t + k` (after termination defined and multiplied by `discount = 0`). A window starts after its lane's
        `lost_prefix`, so the final observation read is never an overwritten one ("Lost final observations" in
        `docs/api/trajectory.md`).

        Args:
          key: PRNG key.
          batch_size: static int >= 1.
          n_step: static int in `[1, length - 1]`.
          gamma: discount in [0, 1], a number or 0-d array (may be traced). Required.

        Returns:
          `TransitionSample`; check `can_sample_transitions(batch_size, n_step=n_step)`.

        Raises:
          ValueError: a size not an int >= 1, `n_step >= length`, a concrete `gamma` outside [0, 1].
          TypeError: `gamma` missing, a bool or not a number.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        n_step = self._n_step(n_step)
        _gamma(gamma, self.storage[self.reward_key].dtype)
        return self._transitions(*self._uniform_positions(key, batch_size, n_step + 1, 1), n_step, gamma)

    def _split_indices(self, indices) -> tuple[jax.Array, jax.Array]:
        flat = jnp.clip(_validate.index_vector("indices", indices), 0, self.num_envs * self.length - 1)
        return flat // self.length, flat % self.length

    @_compiled.method("window", "period", "cross_episodes")
    def valid_starts(self, indices, window: int, *, period: int = 1, cross_episodes: bool = True) -> jax.Array:
        """Whether a window of `window` steps starting at each flat position is one the uniform samplers draw now:
        valid (after its lane's `lost_prefix`) and aligned to `period` (`docs/api/trajectory.md`; `window=n + 1` for
        `n_step=n`), with
        `cross_episodes=False` also no episode end before its last step (`O(num_envs * length)`).

        Args:
          indices: int[B], flat positions.
          window: static int >= 1.
          period: static int >= 1.
          cross_episodes: static bool.

        Returns:
          bool[B]; False for indices outside `[0, num_envs * length)`.
        """
        window, period = _validate.static_int("window", window), _validate.static_int("period", period)
        lanes, slots = self._split_indices(indices)
        wide = _validate.int32_indices(indices)  # saturated: out of range stays out
        in_range = (wide >= 0) & (wide < self.num_envs * self.length)
        logical = _ring.physical_to_logical(slots, self.head, self.num_valid, self.length)
        ok = in_range & (logical + window <= self.num_valid) & _ring.aligned(logical, self._first_start(period), period)
        if self._lossy:
            ok = ok & (logical >= self.lost_prefix[lanes])
        if _validate.static_bool("cross_episodes", cross_episodes):
            return ok
        c, last = self._ends_before(), jnp.minimum(logical + window - 1, self.length)
        return ok & (c[lanes, last] == c[lanes, logical])

    @_compiled.method("sequence_length")
    def sequences_at(self, indices, sequence_length: int) -> SequenceSample:
        """The sequences of `sequence_length` steps starting at flat positions `indices` (int[B]).

        `sequences_at(s.indices, L)` equals the sample `s` of `sample_sequences` (positions: `docs/api/trajectory.md`).
        Returns a `SequenceSample`; raises as `sample_sequences` and for `indices` that are not a 1-D integer array.
        """
        sequence_length = self._sequence_length(sequence_length)
        return self._sequences(*self._split_indices(indices), sequence_length)

    @_compiled.method("sequence_length")
    def final_obs_at(self, indices, sequence_length: int) -> Any:
        """The true final observations of the steps of the sequences starting at `indices` (int[B]), to bootstrap from
        at a truncation inside a sequence: `v_next[:, j] = where(s.truncated[:, j] & ~s.terminated[:, j],
        V(final[:, j]), V(s.item["obs"][:, j + 1]))`.

        Entry `[b, j]` is the `final_obs` given to `add` with step `j` of sequence `b` where it was truncated and not
        terminated (exact at the windows the samplers draw; at a step whose final observation was overwritten,
        whatever holds its ring slot now: "Lost final observations" in `docs/api/trajectory.md`), zeros elsewhere: an
        obs pytree, leaves `[B, sequence_length, ...]`. Arguments and errors as `sequences_at`.
        """
        sequence_length = self._sequence_length(sequence_length)
        final, real = self._final_obs(self._windows(*self._split_indices(indices), sequence_length))
        return jax.tree.map(lambda x: jnp.where(real.reshape(real.shape + (1,) * (x.ndim - 2)), x, jnp.zeros((), x.dtype)), final)

    @_compiled.method("n_step", scalars=_GAMMA)
    def transitions_at(self, indices, *, n_step: int = 1, gamma) -> TransitionSample:
        """The n-step transitions starting at flat positions `indices` (int[B]).

        `transitions_at(s.indices, n_step=n, gamma=g)` equals the sample `s` of `sample_transitions` with the same
        `n` and `g` (positions: `docs/api/trajectory.md`). Returns a `TransitionSample`; raises as
        `sample_transitions` and for `indices` that are not a 1-D integer array.
        """
        n_step = self._n_step(n_step)
        _gamma(gamma, self.storage[self.reward_key].dtype)
        return self._transitions(*self._split_indices(indices), n_step, gamma)
