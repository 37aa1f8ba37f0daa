"""Per-environment trajectory storage: :class:`TrajectoryBuffer` and :class:`PrioritisedTrajectoryBuffer`.

Layout
------
Every field of a step is stored in *lanes*, one per environment: leaves ``[num_envs, length, ...]``.
All lanes are written together (one step ``[num_envs, ...]`` or a chunk ``[num_envs, t, ...]`` per
``add``), so they share one ring (``head``, ``num_valid``; see :mod:`jaxbuffers._ring`, the only
place wrap-around lives). ``num_valid`` counts steps *per lane*.

Step convention (``docs/guide.md``, section 2)
----------------------------------------------
Step ``t`` of a lane is the transition ``obs_t --action_t--> obs_{t+1}``. A step is a dict with at
least the fields ``obs`` (any pytree of arrays), ``action`` and ``reward`` (a floating scalar per
step); other keys are extras stored alongside (their names are configurable in :meth:`create`).
The episode flags are passed to :meth:`TrajectoryBuffer.add` explicitly:

* ``terminated[t]``: ``obs_{t+1}`` is terminal (no bootstrap).
* ``truncated[t]``: the episode was cut after step ``t`` (time limit); ``obs_{t+1}`` is *not*
  terminal and must be bootstrapped from. A step both terminated and truncated counts as
  terminated (Gymnasium's rule).
* An *episode end* is a step that is terminated or truncated; step ``t`` starts an episode iff
  step ``t - 1`` ended one.

Observations are stored once: the next observation of step ``t`` is the ``obs`` of step ``t + 1``
of the same lane. That is wrong exactly where an environment auto-resets: after an episode end
step ``t + 1`` holds the *reset* observation. After termination it does not matter (the discount
is 0). After truncation the true final observation is needed, so ``add`` takes it as
``final_obs`` and keeps it in a **final-observation ring**: per lane, ``final_obs_capacity`` (K)
slots, one written per truncated (and not terminated) step, each step remembering its slot.

Trade-off of the final-observation ring. Memory is ``K`` observations per lane instead of
``length`` (a full ``next_obs`` store doubles observation memory). It is exact as long as no lane
holds more than ``K`` truncated steps at once, i.e. ``K >= length / (shortest truncated episode)``
(with a time limit ``T_max``: ``K = ceil(length / T_max) + 1``). The default ``K = length`` is
always exact. If a lane holds more than ``K`` truncated steps, the oldest final observations are
overwritten, and transitions bootstrapping from a lost one read a newer one.
:meth:`TrajectoryBuffer.final_obs_lost` (an exact ``O(capacity)`` check) tells whether a step
stored *now* has lost its final observation; it keeps no record of the past (it reads False again
once such steps are overwritten), so size ``K`` as above rather than rely on checking it. The
flags and the ring slot of a step share one int32 (``meta``); the ring cursors (``head``,
``num_valid``, ``added``, ``final_head``) share one int32 array (``counters``), because every
array of the state costs dispatch time on each jitted call.

Sampling
--------
A *window* of ``w`` steps starting at a lane's logical step ``l`` (0 = oldest stored) is valid when
``l + w <= num_valid``: it never straddles the write head. Sequences use ``w = sequence_length``;
n-step transitions use ``w = n_step + 1`` (the window must include the step that holds
``obs_{t+n}``), so the newest ``n_step`` steps of a lane are sampled once later steps arrive.
Positions are flat ``index = lane * length + physical_slot``; :meth:`TrajectoryBuffer.transitions_at`
and :meth:`TrajectoryBuffer.sequences_at` read the transitions / sequences at given positions (what
the samplers return there), :meth:`TrajectoryBuffer.final_obs_at` the final observations of a
sequence's truncated steps, and :meth:`TrajectoryBuffer.valid_starts` says which positions the
samplers can draw.

Example::

    import jax, jax.numpy as jnp
    import jaxbuffers as jb

    step = {"obs": jnp.zeros(17), "action": jnp.zeros(6), "reward": jnp.float32(0)}
    buf = jb.TrajectoryBuffer.create(step, num_envs=8, length=1000)
    batch = jax.tree.map(lambda x: jnp.stack([x] * 8), step)          # [num_envs, ...]
    done = jnp.zeros(8, bool)
    buf = buf.add(batch, terminated=done, truncated=done, final_obs=batch["obs"])
    # ... more adds ...
    seq = buf.sample_sequences(jax.random.key(0), 256, sequence_length=32)   # seq.item["obs"]: [256, 32, 17]
    tr = buf.sample_transitions(jax.random.key(1), 256, n_step=3, gamma=0.99)

References: Schaul, Quan, Antonoglou, Silver (2016), *Prioritized Experience Replay*, ICLR
(proportional prioritisation, importance weights); Sutton & Barto (2018), section 7.1 (n-step
returns); Gymnasium's ``terminated`` / ``truncated`` API.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuffers import _ring, _validate
from jaxbuffers._priority import (
    float_bits as _float_bits,
    RENAMED_KEYWORDS,
    priorities_at,
    priority_leaf,
    probabilities_and_weights,
    unexpected_keywords,
    write_priorities,
)
from jaxbuffers.sum_tree import SumMinTree

# Episode-flag bits of the per-step meta word (bits 2+ hold the final-observation ring slot) and of
# SequenceSample.flags.
FLAG_TERMINATED = 1
FLAG_TRUNCATED = 2
# Largest final-observation ring (per lane): its slot is packed above the 2 flag bits of an int32.
_FINAL_SLOT_MAX = 2**29

__all__ = [
    "TrajectoryBuffer",
    "SequenceSample",
    "TransitionSample",
    "PrioritisedTrajectoryBuffer",
    "PrioritisedTrajectorySample",
]


# ------------------------------------------------------------------------------------------------
# sample types


class SequenceSample(NamedTuple):
    """What :meth:`TrajectoryBuffer.sample_sequences` returns (``B`` sequences of ``L`` steps).

    The episode flags travel packed in one ``uint8`` array (one output array instead of three:
    every output of a jitted sample costs executor time and memory, measured ~35 us of a 256 x 32
    vector sample on CPU); ``terminated``, ``truncated`` and ``mask`` are computed from it on
    access, so inside a jitted step they fuse into whatever uses them. The final observations of
    truncated steps (to bootstrap from) are read separately: :meth:`TrajectoryBuffer.final_obs_at`.
    """

    item: Any  # dict like the example step, leaves [B, L, ...], stored dtypes
    flags: jax.Array  # shape=[B, L], dtype=uint8: bit 0 terminated, bit 1 truncated (FLAG_TERMINATED | FLAG_TRUNCATED)
    indices: jax.Array  # shape=[B], dtype=int32: lane * length + physical slot of the first step

    @property
    def terminated(self) -> jax.Array:
        """bool [B, L]: step ``j`` ended its episode by termination."""
        return (self.flags & FLAG_TERMINATED) != 0

    @property
    def truncated(self) -> jax.Array:
        """bool [B, L]: step ``j`` ended its episode by truncation (time limit)."""
        return (self.flags & FLAG_TRUNCATED) != 0

    @property
    def mask(self) -> jax.Array:
        """bool [B, L]: step ``j`` is in the first step's episode (no episode end in steps ``[0, j)``)."""
        return _window_mask(self.flags != 0)


class TransitionSample(NamedTuple):
    """What :meth:`TrajectoryBuffer.sample_transitions` returns (``B`` n-step transitions).

    With ``k`` the number of rewards used (``1 <= k <= n``, cut at the first episode end):
    ``n_step_return = sum_{i<k} gamma^i r_{t+i}``, ``discount = gamma^k (1 - terminated_{t+k-1})``,
    and the bootstrap target is ``n_step_return + discount * V(next_obs)``.
    """

    obs: Any  # obs_t, leaves [B, ...]
    action: Any  # action_t, leaves [B, ...]
    n_step_return: jax.Array  # shape=[B], dtype=reward dtype: G_t^(k)
    discount: jax.Array  # shape=[B], dtype=reward dtype: gamma**k, 0 if step t+k-1 terminated
    next_obs: Any  # obs_{t+k}, leaves [B, ...]: the true final obs after truncation; after termination the next stored obs (the reset obs; discount is 0)
    num_steps: jax.Array  # shape=[B], dtype=int32: k
    item: Any  # the whole step t (every field, extras included), leaves [B, ...]
    indices: jax.Array  # shape=[B], dtype=int32: lane * length + physical slot of step t


# ------------------------------------------------------------------------------------------------
# helpers


def _check_flag(name: str, flag, lead: tuple[int, ...]) -> jax.Array:
    if not hasattr(flag, "shape") or not hasattr(flag, "dtype"):
        raise TypeError(f"{name}: expected a bool array of shape {list(lead)}, got {type(flag).__name__}")
    if tuple(flag.shape) != tuple(lead):
        raise ValueError(f"{name}: expected shape {list(lead)} (one flag per env and step), got {list(flag.shape)}")
    if np.dtype(flag.dtype) != np.dtype(bool):
        raise TypeError(f"{name}: expected dtype bool, got {np.dtype(flag.dtype)} (convert with .astype(bool))")
    return jnp.asarray(flag)


def prepare_add(spec, obs_key: str, num_envs: int, length: int, step, terminated, truncated, final_obs):
    """Check the arguments of a trajectory buffer's ``add`` against the step ``spec`` (trace time)
    and give them a time axis: ``(step, terminated, truncated, final_obs)``, leaves ``[E, t, ...]``
    (``truncated`` and ``final_obs`` stay None when not given). Shared by the device and the
    compressed buffers.

    Raises:
      TypeError: ``step`` not a dict, wrong structure or dtype, flags not bool, ``final_obs``
        missing with ``truncated``.
      ValueError: wrong shapes or ``num_envs``; a chunk of ``t < 1`` or ``t > length`` steps;
        ``final_obs`` without ``truncated`` or with other leading axes than ``step`` (it is never
        broadcast).
    """
    if not isinstance(step, Mapping):
        raise TypeError(f"step: expected a dict like the example step, got {type(step).__name__}")
    step = dict(step)
    # One step [num_envs, ...] or a chunk [num_envs, t, ...]: told apart by the first leaf's rank.
    leaves, spec0 = jax.tree.leaves(step), jax.tree.leaves(spec)[0]
    nd = 2 if leaves and getattr(leaves[0], "ndim", -1) == len(spec0.shape) + 2 else 1
    lead = _validate.check_batch(spec, step, nd, "step", ("num_envs", "t"))
    if lead[0] != num_envs:
        raise ValueError(f"step: expected leading axis num_envs={num_envs}, got {lead[0]}")
    _ring.check_batch_fits(1 if nd == 1 else lead[1], length, "step chunk (time axis)")
    terminated = _check_flag("terminated", terminated, lead)
    if truncated is None:
        if final_obs is not None:
            raise ValueError("final_obs: given without truncated; pass truncated=... with it")
    else:
        truncated = _check_flag("truncated", truncated, lead)
        if final_obs is None:
            raise TypeError(
                "final_obs: required when truncated is given: the true observation after each step, "
                "before any auto-reset (read only where truncated); shaped like step[obs] "
                f"(leading axes {list(lead)})"
            )
        got = _validate.check_batch(spec[obs_key], final_obs, nd, "final_obs", ("num_envs", "t"))
        if tuple(got) != tuple(lead):
            raise ValueError(
                f"final_obs: expected leading axes {list(lead)} like step (one observation per env"
                f"{' and step' if nd == 2 else ''}), got {list(got)}"
            )
    if nd == 1:
        ex = lambda x: jnp.expand_dims(jnp.asarray(x), 1)  # noqa: E731
        step, terminated = jax.tree.map(ex, step), ex(terminated)
        truncated = None if truncated is None else ex(truncated)
        final_obs = None if final_obs is None else jax.tree.map(ex, final_obs)
    return step, terminated, truncated, final_obs


def _window_mask(ends: jax.Array) -> jax.Array:
    """``mask[..., j]`` = no episode end among steps ``[0, j)`` of the window (bool, same shape)."""
    # First end's position (L when none) by one min-reduction: a cumsum over the window lowers to
    # a log-depth scan of many small ops on CPU (measured ~40 us of a 256 x 32 sample).
    pos = jnp.arange(ends.shape[-1], dtype=jnp.int32)
    first = jnp.min(jnp.where(ends, pos, ends.shape[-1]), axis=-1, keepdims=True)
    return pos <= first


def _flat_take(x: jax.Array, flat: jax.Array) -> jax.Array:
    """``x[lane, slot]`` for ``x`` of shape ``[E, length, ...]`` and flat ids ``lane * length + slot``."""
    e, n = x.shape[:2]
    return jnp.take(x.reshape(e * n, *x.shape[2:]), flat, axis=0, mode="clip")


def where_real(real: jax.Array, tree: Any) -> Any:
    """``tree`` (leaves ``[B, L, ...]``) with zeros wherever ``real`` (bool ``[B, L]``) is False."""
    return jax.tree.map(lambda x: jnp.where(real.reshape(real.shape + (1,) * (x.ndim - 2)), x, jnp.zeros((), x.dtype)), tree)


def _gamma(gamma, dtype) -> jax.Array:
    """``gamma`` (:func:`jaxbuffers._validate.scalar_parameter`, in [0, 1]) as a 0-d ``dtype`` array."""
    if gamma is None:
        raise TypeError("gamma: required (a float in [0, 1] or a 0-d float array)")
    return jnp.asarray(_validate.scalar_parameter("gamma", gamma, 0.0, 1.0)).astype(dtype)


def n_step_window(reward: jax.Array, terminated: jax.Array, truncated: jax.Array, gamma) -> tuple:
    """n-step return over windows of ``n`` steps, cut at the first episode end.

    Args:
      reward: float[..., n], rewards ``r_t .. r_{t+n-1}`` of one window per row.
      terminated, truncated: bool[..., n], flags of the same steps.
      gamma: scalar discount in [0, 1].

    Returns:
      ``(G, discount, k)`` with ``k = min(n, 1 + first j with an episode end at step t+j)``,

      .. math:: G = \\sum_{i=0}^{k-1} \\gamma^i r_{t+i}, \\qquad
                \\text{discount} = \\gamma^k (1 - \\text{terminated}_{t+k-1})

      ``G`` and ``discount`` have the reward dtype, ``k`` is int32. (:func:`jaxbuffers.returns.n_step_returns`
      works on whole rollouts with values; this is the per-window form used at sample time.)
      For rewards narrower than float32 (bfloat16, float16) ``gamma``, its powers and the sum are
      computed in float32 and rounded once at the end: rounding ``gamma`` first (bfloat16 0.99 is
      0.98828) compounds in ``gamma^k`` (k = 100: 0.309 instead of 0.366).
    """
    n = reward.shape[-1]
    acc = jnp.promote_types(reward.dtype, jnp.float32)  # float32, or float64 rewards kept
    g = _gamma(gamma, acc)
    alive = _window_mask(terminated | truncated)  # step i counts iff no end in [0, i)
    powers = g ** jnp.arange(n, dtype=acc)
    ret = jnp.sum(jnp.where(alive, powers * reward.astype(acc), 0), axis=-1).astype(reward.dtype)
    k = jnp.sum(alive, axis=-1, dtype=jnp.int32)
    term_last = jnp.take_along_axis(terminated, (k - 1)[..., None], axis=-1)[..., 0]
    discount = jnp.where(term_last, 0, g**k).astype(reward.dtype)
    return ret, discount, k


# ------------------------------------------------------------------------------------------------
# uniform trajectory buffer


class TrajectoryBuffer(struct.PyTreeNode):
    """Per-environment lanes of steps with episode flags; uniform sequence and n-step sampling.

    See the module docstring for the layout, the step convention and the final-observation ring.
    Build it with :meth:`create`; every method is pure and returns a new buffer. Works under
    ``jit`` (donate it to update in place), ``lax.scan`` and ``vmap`` over stacked buffers.
    """

    storage: Any  # dict like the example step, leaves [num_envs, length, *shape], example dtypes
    meta: jax.Array  # shape=[num_envs, length], dtype=int32: bit 0 terminated, bit 1 truncated, bits 2.. final-obs ring slot
    final_obs: Any  # obs pytree, leaves [num_envs, final_obs_capacity, *obs_shape]: final-observation ring
    counters: jax.Array  # shape=[4 + num_envs + k], dtype=int32: head, num_valid, added (2 words), final_head per lane (see properties), then k words of a wrapping buffer (add keeps them)
    num_envs: int = struct.field(pytree_node=False)
    length: int = struct.field(pytree_node=False)
    final_obs_capacity: int = struct.field(pytree_node=False)
    obs_key: str = struct.field(pytree_node=False)
    action_key: str = struct.field(pytree_node=False)
    reward_key: str = struct.field(pytree_node=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(
        cls,
        example_step: Mapping,
        num_envs: int,
        length: int,
        *,
        final_obs_capacity: int | None = None,
        obs_key: str = "obs",
        action_key: str = "action",
        reward_key: str = "reward",
    ) -> "TrajectoryBuffer":
        """An empty buffer of ``num_envs`` lanes of ``length`` steps.

        Args:
          example_step: one step of one env (no leading axes): a dict with at least ``obs_key``
            (a pytree of arrays), ``action_key`` and ``reward_key`` (a floating scalar), plus any
            extras. Arrays or ``jax.ShapeDtypeStruct``; dtypes are stored exactly.
          num_envs: lanes (Python int >= 1).
          length: steps kept per lane (Python int >= 1); the oldest are overwritten first.
          final_obs_capacity: final observations kept per lane for truncated steps (K, see the
            module docstring); ``None`` means ``length`` (always exact). A value above ``length``
            is reduced to ``length``: a lane never holds more truncated steps than that, so the
            extra slots would be memory never used.
          obs_key, action_key, reward_key: the field names.

        Raises:
          TypeError: ``example_step`` is not a dict, a leaf is not an array, reward not floating.
          ValueError: a size is not a positive int, ``num_envs * length`` above ``2**31 - 1`` (positions
            are int32 ``lane * length + slot``), a final-observation ring above ``2**29`` slots per
            lane, a required field is missing, reward not scalar.
        """
        num_envs = _validate.static_int("num_envs", num_envs)
        length = _validate.static_int("length", length)
        k = length if final_obs_capacity is None else _validate.static_int("final_obs_capacity", final_obs_capacity)
        k = min(k, length)  # a lane never holds more than `length` truncated steps: more slots would never be used
        if k > _FINAL_SLOT_MAX:  # the ring slot is packed into the int32 step flags, above 2 bits
            raise ValueError(
                f"final_obs_capacity: expected at most 2**29 = {_FINAL_SLOT_MAX} (the slot is packed into int32 "
                f"step flags), got {k}{'' if final_obs_capacity is not None else ' (from length; pass a smaller final_obs_capacity)'}"
            )
        if num_envs * length > 2**31 - 1:
            raise ValueError(
                f"num_envs * length: expected at most 2**31 - 1 steps in all (positions are int32 lane * length + slot), "
                f"got {num_envs} * {length} = {num_envs * length}"
            )
        if not isinstance(example_step, Mapping):
            raise TypeError(
                f"example_step: expected a dict with fields {obs_key!r}, {action_key!r}, {reward_key!r} "
                f"(plus any extras), got {type(example_step).__name__}"
            )
        for name in (obs_key, action_key, reward_key):
            if name not in example_step:
                raise ValueError(
                    f"example_step: missing field {name!r} (got fields {sorted(example_step)}); pass "
                    f"obs_key/action_key/reward_key to create if your names differ"
                )
        spec = _validate.item_spec(dict(example_step), "example_step")
        if not jax.tree.leaves(spec[obs_key]):
            raise ValueError(f"example_step[{obs_key!r}]: expected at least one array leaf (the observation), got {example_step[obs_key]!r}")
        rspec = spec[reward_key]
        if not isinstance(rspec, jax.ShapeDtypeStruct) or rspec.shape != () or not jnp.issubdtype(rspec.dtype, jnp.floating):
            raise ValueError(f"example_step[{reward_key!r}]: expected a floating scalar per step, got {rspec}")
        zeros = lambda s, n: jnp.zeros((num_envs, n, *s.shape), s.dtype)  # noqa: E731
        return cls(
            storage=jax.tree.map(lambda s: zeros(s, length), spec),
            meta=jnp.zeros((num_envs, length), jnp.int32),
            final_obs=jax.tree.map(lambda s: zeros(s, k), spec[obs_key]),
            counters=jnp.zeros((_ring.CURSORS + num_envs,), jnp.int32),
            num_envs=num_envs,
            length=length,
            final_obs_capacity=k,
            obs_key=obs_key,
            action_key=action_key,
            reward_key=reward_key,
        )

    # ------------------------------------------------------------------ properties
    # The ring cursors share one int32 array (``counters``): every pytree leaf of a jitted call's
    # arguments and results costs host dispatch time (~1 us per leaf per call measured on CPU), and
    # these are always read and written together.
    @property
    def head(self) -> jax.Array:
        """int32 scalar: slot the next step is written to, in ``[0, length)``."""
        return self.counters[..., 0]

    @property
    def num_valid(self) -> jax.Array:
        """int32 scalar: steps stored per lane, in ``[0, length]``."""
        return self.counters[..., 1]

    @property
    def added(self) -> jax.Array:
        """int32[2]: steps ever added per lane, a two-word counter (see :mod:`jaxbuffers._ring`)."""
        return self.counters[..., 2:_ring.CURSORS]

    @property
    def final_head(self) -> jax.Array:
        """int32[num_envs]: next final-observation ring slot per lane, in ``[0, final_obs_capacity)``."""
        return self.counters[..., _ring.CURSORS : _ring.CURSORS + self.num_envs]

    @property
    def step_spec(self) -> Any:
        """Dict of ``jax.ShapeDtypeStruct``: one step of one env (derived from storage)."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[2:], x.dtype), self.storage)

    @property
    def terminated(self) -> jax.Array:
        """bool[num_envs, length]: stored ``terminated`` flags by physical slot (unpacked from ``meta``)."""
        return (self.meta & FLAG_TERMINATED) != 0

    @property
    def truncated(self) -> jax.Array:
        """bool[num_envs, length]: stored ``truncated`` flags by physical slot (unpacked from ``meta``)."""
        return (self.meta & FLAG_TRUNCATED) != 0

    @property
    def memory_bytes(self) -> int:
        """Bytes of every array the buffer holds (steps, flags, final-obs ring, bookkeeping)."""
        return _validate.tree_nbytes(self)

    def size(self) -> jax.Array:
        """Steps stored over all lanes: ``num_envs * num_valid`` (int32 scalar)."""
        return self.num_valid * self.num_envs

    def is_full(self) -> jax.Array:
        """Whether every lane holds ``length`` steps (bool scalar)."""
        return self.num_valid >= self.length

    def num_added(self) -> int:
        """Exact number of steps ever added per lane (host-side Python int; a numpy int64 array for a stacked, vmapped buffer)."""
        return _ring.counter_value(self.added)

    def can_sample(self, sequence_length: int = 1, *, period: int = 1, cross_episodes: bool = True) -> jax.Array:
        """Whether a valid window of ``sequence_length`` steps exists (bool scalar).

        For :meth:`sample_transitions` with ``n_step=n`` pass ``sequence_length=n + 1``. With
        ``cross_episodes=False`` it checks for a window wholly inside one episode (``O(num_envs *
        length)``, like that sampling mode). A ``sequence_length`` above ``length`` gives False
        (no such window can exist; :meth:`sample_sequences` raises for it).

        Raises (trace time):
          ValueError: ``sequence_length`` or ``period`` not an int >= 1. TypeError:
          ``cross_episodes`` not a bool.
        """
        sequence_length = _validate.static_int("sequence_length", sequence_length)
        period = _validate.static_int("period", period)
        cross_episodes = _validate.static_bool("cross_episodes", cross_episodes)
        if sequence_length > self.length:
            return jnp.zeros((), bool)
        if cross_episodes:
            return _ring.num_windows(self.num_valid, sequence_length, period) > 0
        return self._episode_window_counts(sequence_length, period)[-1] > 0

    # ------------------------------------------------------------------ add
    def _prepare(self, step, terminated, truncated, final_obs):
        """Validate an add; return ``(step, terminated, truncated, final_obs, t)`` with a time axis."""
        step, terminated, truncated, final_obs = prepare_add(
            self.step_spec, self.obs_key, self.num_envs, self.length, step, terminated, truncated, final_obs
        )
        t = terminated.shape[1]
        if truncated is None:
            truncated = jnp.zeros_like(terminated)
        return step, terminated, truncated, final_obs, t

    def add(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> "TrajectoryBuffer":
        """Append one step or a chunk of steps to every lane.

        Args:
          step: dict like the example step, leaves ``[num_envs, ...]`` (one step) or
            ``[num_envs, t, ...]`` (a chunk, ``1 <= t <= length``), exactly the stored dtypes.
          terminated: bool ``[num_envs]`` or ``[num_envs, t]``: ``obs_{t+1}`` is terminal.
          truncated: optional bool, same shape: the episode was cut after the step. Omitted means
            never truncated.
          final_obs: required with ``truncated``: obs pytree shaped like ``step[obs_key]``, the true
            observation after each step before any auto-reset (Gymnasium/gymnax
            ``final_observation``). Read only where ``truncated & ~terminated``.

        Returns:
          The new buffer. Cost O(num_envs * t); in place when donated.

        Raises (trace time):
          TypeError: wrong structure or dtype (flags must be bool), final_obs missing.
          ValueError: wrong shapes, wrong ``num_envs``, ``t > length``.
        """
        step, terminated, truncated, final_obs, t = self._prepare(step, terminated, truncated, final_obs)
        e, n, kcap = self.num_envs, self.length, self.final_obs_capacity

        # Final-observation ring: one slot per step that bootstraps from its final obs.
        boot = truncated & ~terminated  # [E, t]
        cum = boot.astype(jnp.int32) if t == 1 else jnp.cumsum(boot.astype(jnp.int32), axis=1)
        n_new = cum[:, -1]
        slot = (self.final_head[:, None] + cum - 1) % kcap
        meta = terminated.astype(jnp.int32) | (truncated.astype(jnp.int32) << 1) | (jnp.where(boot, slot, 0) << 2)
        storage, meta = _ring.write((self.storage, self.meta), (step, meta), self.head, axis=1)
        store = self.final_obs
        if final_obs is not None:
            # One scatter that skips (mode="drop") every step without a truncation. A lane with more
            # than K truncations in one chunk keeps the last K. For one step a lax.cond around it
            # measured no faster on CPU than the dropped scatter; for chunks (whose dropped scatter
            # grows with t) the cond skips it when no step of the chunk bootstraps.
            keep = boot if t == 1 else boot & (n_new[:, None] - cum < kcap)

            def scatter(st):
                # The indices are computed here, inside the cond's branch for chunks: one kernel
                # fewer per chunk add without truncations (every kernel is an executor step on CPU).
                rows = jnp.broadcast_to(jnp.arange(e, dtype=jnp.int32)[:, None], (e, t))
                # Skipped entries point past the end, each to its own index, so all (row, col) pairs
                # are distinct: unique_indices lets XLA scatter them in parallel (a measured 10x here).
                cols = jnp.where(keep, slot, kcap + jnp.arange(t, dtype=jnp.int32)[None, :])
                obs = final_obs
                if t == 1:  # [E] indices and [E, ...] rows: no relayout copy of the update before the scatter
                    rows, cols, obs = rows[:, 0], cols[:, 0], jax.tree.map(lambda x: x[:, 0], final_obs)
                return jax.tree.map(lambda s, x: s.at[rows, cols].set(x, mode="drop", unique_indices=True), st, obs)

            store = scatter(store) if t == 1 else jax.lax.cond(jnp.any(keep), scatter, lambda st: st, store)
        head, num_valid = _ring.advance(self.head, self.num_valid, t, n)
        final_head = (self.final_head + n_new) % kcap
        return self.replace(
            storage=storage,
            meta=meta,
            final_obs=store,
            counters=_ring.pack_cursors(
                head, num_valid, _ring.counter_add(self.added, t), final_head, self.counters[_ring.CURSORS + self.num_envs :]
            ),
        )

    def final_obs_lost(self) -> jax.Array:
        """Whether some stored truncated step's final observation was overwritten (bool scalar).

        True only when a lane holds more than ``final_obs_capacity`` (K) truncated steps at once (see
        the module docstring). Exact: ring slots are handed out in order per lane, so a truncated
        step's final observation survives iff fewer than K truncated (and not terminated) steps
        came after it in its lane, and every later step is still stored. It describes the steps
        stored now, not the past: once the affected steps are overwritten it is False again,
        although samples drawn meanwhile may have read a wrong final observation. Costs
        ``O(num_envs * length)``: a diagnostic, not a per-step check.
        """
        n = self.length
        logical = jnp.arange(n, dtype=jnp.int32)
        phys = _ring.logical_to_physical(logical, self.head, self.num_valid, n)
        meta = self.meta[:, phys]  # [E, n], logical order
        needs = ((meta & 3) == 2) & (logical < self.num_valid)
        c = needs.astype(jnp.int32)
        later = jnp.sum(c, axis=1, keepdims=True) - jnp.cumsum(c, axis=1)  # ring writes after each step
        return jnp.any(needs & (later >= self.final_obs_capacity))

    # ------------------------------------------------------------------ sampling
    def _uniform_positions(self, key, batch_size: int, window: int, period: int):
        """Uniform (lane, physical start) over valid windows: one draw over ``num_envs * windows``."""
        nw = _ring.num_windows(self.num_valid, window, period)
        per_lane = jnp.maximum(nw, 1)
        flat = jax.random.randint(key, (batch_size,), 0, per_lane * self.num_envs, jnp.int32)
        lanes = flat // per_lane
        starts = _ring.window_starts(flat % per_lane, self.head, self.num_valid, self.length, period)
        return lanes, starts

    def _episode_window_counts(self, window: int, period: int) -> jax.Array:
        """Running count (int32[num_envs * (length - window + 1)]) of valid windows that stay in one episode.

        Entry ``lane * W + l`` (logical start ``l``, ``W = length - window + 1``) is valid when
        ``l + window <= num_valid``, ``l % period == 0`` and no episode end lies in steps
        ``[l, l + window - 1)`` (an end at the last step is allowed). ``O(num_envs * length)``.
        """
        n = self.length
        phys = _ring.logical_to_physical(jnp.arange(n, dtype=jnp.int32), self.head, self.num_valid, n)
        ends = ((self.meta[:, phys] & 3) != 0).astype(jnp.int32)  # logical order
        c = jnp.concatenate([jnp.zeros((self.num_envs, 1), jnp.int32), jnp.cumsum(ends, axis=1)], axis=1)
        w = n - window + 1
        ls = jnp.arange(w, dtype=jnp.int32)
        inside = (c[:, ls + window - 1] - c[:, ls]) == 0
        ok = inside & (ls + window <= self.num_valid) & (ls % period == 0)
        return jnp.cumsum(ok.reshape(-1).astype(jnp.int32))

    def _episode_positions(self, key, batch_size: int, window: int, period: int):
        """Exact uniform draw over windows inside one episode: cumulative counts + searchsorted."""
        counts = self._episode_window_counts(window, period)
        total = counts[-1]
        r = jax.random.randint(key, (batch_size,), 0, jnp.maximum(total, 1), jnp.int32)
        pos = jnp.searchsorted(counts, r, side="right").astype(jnp.int32)
        w = self.length - window + 1
        pos = jnp.minimum(pos, counts.shape[0] - 1)  # only when nothing is valid (can_sample False)
        lanes, logical = pos // w, pos % w
        return lanes, _ring.logical_to_physical(logical, self.head, self.num_valid, self.length)

    def _sequence_length(self, sequence_length) -> int:
        sequence_length = _validate.static_int("sequence_length", sequence_length)
        if sequence_length > self.length:
            raise ValueError(f"sequence_length: expected at most length={self.length}, got {sequence_length}")
        return sequence_length

    def _sequences(self, lanes, starts, sequence_length: int) -> SequenceSample:
        slots = _ring.window_slots(starts, sequence_length, self.length)  # [B, L]
        flat = lanes[:, None] * self.length + slots
        item = jax.tree.map(lambda x: _flat_take(x, flat), self.storage)
        flags = (_flat_take(self.meta, flat) & (FLAG_TERMINATED | FLAG_TRUNCATED)).astype(jnp.uint8)
        return SequenceSample(item=item, flags=flags, indices=(lanes * self.length + starts).astype(jnp.int32))

    def _final_obs(self, lanes, starts, sequence_length: int):
        """``(final obs [B, L, ...] read from the ring at every step, bool [B, L] where it is real)``."""
        slots = _ring.window_slots(starts, sequence_length, self.length)  # [B, L]
        meta = _flat_take(self.meta, lanes[:, None] * self.length + slots)
        real = (meta & 3) == FLAG_TRUNCATED  # truncated and not terminated: the step has a ring slot
        fslot = lanes[:, None] * self.final_obs_capacity + (meta >> 2)  # slot 0 where not real (in range)
        return jax.tree.map(lambda f: _flat_take(f, fslot), self.final_obs), real

    def _transitions(self, lanes, starts, n_step: int, gamma) -> TransitionSample:
        slots = _ring.window_slots(starts, n_step + 1, self.length)  # [B, n + 1]
        flat = lanes[:, None] * self.length + slots
        fw = flat[:, :n_step]
        reward = _flat_take(self.storage[self.reward_key], fw)
        meta = _flat_take(self.meta, fw)
        term, trunc = (meta & FLAG_TERMINATED) != 0, (meta & FLAG_TRUNCATED) != 0
        ret, discount, k = n_step_window(reward, term, trunc, gamma)
        rows = jnp.arange(lanes.shape[0])
        last = meta[rows, k - 1]  # meta of step t + k - 1
        use_final = (last & 3) == 2  # truncated and not terminated
        fslot = lanes * self.final_obs_capacity + (last >> 2)
        next_flat = flat[rows, k]
        next_obs = jax.tree.map(
            lambda x, f: jnp.where(
                use_final.reshape((-1,) + (1,) * (x.ndim - 2)), _flat_take(f, fslot), _flat_take(x, next_flat)
            ),
            self.storage[self.obs_key],
            self.final_obs,
        )
        item = jax.tree.map(lambda x: _flat_take(x, flat[:, 0]), self.storage)
        return TransitionSample(
            obs=item[self.obs_key], action=item[self.action_key], n_step_return=ret, discount=discount,
            next_obs=next_obs, num_steps=k, item=item, indices=flat[:, 0].astype(jnp.int32),
        )

    def sample_sequences(
        self, key: jax.Array, batch_size: int, sequence_length: int, *, period: int = 1, cross_episodes: bool = True
    ) -> SequenceSample:
        """Sample ``batch_size`` sequences of ``sequence_length`` consecutive steps of one lane.

        Uniform with replacement over the valid (lane, start) positions: the start's logical index
        ``l`` (0 = oldest stored step) is a multiple of ``period`` and ``l + sequence_length <=
        num_valid`` (never straddles the write head). With ``cross_episodes=False`` only windows
        with no episode end before their last step are candidates, drawn exactly uniformly by a
        cumulative count over all positions and ``searchsorted`` (``O(num_envs * length)`` per call;
        the default mode costs ``O(batch_size * sequence_length)``).

        Args:
          key: PRNG key. batch_size, sequence_length, period: static Python ints >= 1
          (``sequence_length <= length``). cross_episodes: static bool.

        Returns:
          :class:`SequenceSample`. When ``can_sample(...)`` is False the result is defined (real
          slots, zeros if empty) but not meaningful.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        sequence_length = self._sequence_length(sequence_length)
        period = _validate.static_int("period", period)
        if _validate.static_bool("cross_episodes", cross_episodes):
            lanes, starts = self._uniform_positions(key, batch_size, sequence_length, period)
        else:
            lanes, starts = self._episode_positions(key, batch_size, sequence_length, period)
        return self._sequences(lanes, starts, sequence_length)

    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma) -> TransitionSample:
        """Sample ``batch_size`` n-step transitions uniformly over valid (lane, step) positions.

        Position ``t`` is valid when steps ``t .. t + n_step`` are stored (a window of ``n_step + 1``
        that never crosses the write head). The return is cut at the first episode end
        (:func:`n_step_window`); ``next_obs`` is ``obs_{t+k}``: read from step ``t + k`` of the same
        lane, or from the final-observation ring if step ``t + k - 1`` was truncated (never the
        reset observation). After termination ``next_obs`` is the stored step ``t + k`` (the next
        episode's first observation), defined but multiplied by ``discount = 0``.

        Args:
          key: PRNG key. batch_size, n_step: static Python ints >= 1 (``n_step < length``).
          gamma: discount in [0, 1], a Python number or 0-d integer or float array (may be traced). Required.

        Returns:
          :class:`TransitionSample`. Check ``can_sample(n_step + 1)`` first.

        Raises (trace time):
          ValueError: ``batch_size`` / ``n_step`` not an int >= 1, ``n_step >= length``, a
          concrete ``gamma`` outside [0, 1] or not a scalar. TypeError: ``gamma`` missing or a
          bool.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        n_step = _validate.static_int("n_step", n_step)
        if n_step + 1 > self.length:
            raise ValueError(f"n_step: expected at most length - 1 = {self.length - 1}, got {n_step}")
        _gamma(gamma, self.storage[self.reward_key].dtype)
        lanes, starts = self._uniform_positions(key, batch_size, n_step + 1, 1)
        return self._transitions(lanes, starts, n_step, gamma)


    # ------------------------------------------------------------------ reads at given positions
    def _split_indices(self, indices) -> tuple[jax.Array, jax.Array]:
        indices = _validate.index_array(indices)
        if indices.ndim != 1:
            raise ValueError(f"indices: expected a 1-D array [B] of flat positions (lane * length + slot), got shape {indices.shape}")
        flat = jnp.clip(_validate.integer_indices("indices", indices), 0, self.num_envs * self.length - 1)
        return flat // self.length, flat % self.length

    def valid_starts(self, indices, window: int, *, period: int = 1) -> jax.Array:
        """Whether a window of ``window`` steps starting at each flat position is valid now.

        Valid means what the uniform samplers draw from: the start's logical index ``l`` (0 = oldest
        stored step of its lane) is a multiple of ``period`` and ``l + window <= num_valid`` (the
        window is stored and does not straddle the write head). For :meth:`transitions_at` with
        ``n_step=n`` pass ``window=n + 1``.

        Args:
          indices: int[B], flat positions ``lane * length + physical slot``.
          window, period: static Python ints >= 1.

        Returns:
          bool[B]; ``False`` for indices outside ``[0, num_envs * length)``.
        """
        window = _validate.static_int("window", window)
        period = _validate.static_int("period", period)
        lanes, slots = self._split_indices(indices)
        wide = _validate.int32_indices(indices)  # saturated: out of range stays out
        in_range = (wide >= 0) & (wide < self.num_envs * self.length)
        logical = _ring.physical_to_logical(slots, self.head, self.num_valid, self.length)
        return in_range & (logical + window <= self.num_valid) & (logical % period == 0)

    def sequences_at(self, indices, sequence_length: int) -> SequenceSample:
        """The sequences of ``sequence_length`` steps starting at given flat positions.

        The read behind :meth:`sample_sequences`: ``sequences_at(s.indices, L)`` equals a sample
        ``s`` taken with sequence length ``L``. Use it to re-read positions you sampled or chose
        yourself (e.g. an external sampler, or another library's layout on top of the lanes).

        Args:
          indices: int[B] (any integer dtype), flat positions ``lane * length + physical slot`` of
            the first step, as the sample types' ``indices`` hold them.
          sequence_length: static Python int in ``[1, length]``.

        Returns:
          :class:`SequenceSample` (leaves ``[B, sequence_length, ...]``). Positions are NOT checked
          against the write head: a window that runs past the newest step reads physically
          following slots (older data after wrap-around, zeros if never written); check with
          :meth:`valid_starts` when positions are not from a sampler. Indices outside
          ``[0, num_envs * length)`` are clamped into it (garbage in, defined out).

        Raises (trace time):
          ValueError / TypeError: ``indices`` not a 1-D integer array, bad ``sequence_length``.
        """
        sequence_length = self._sequence_length(sequence_length)
        lanes, slots = self._split_indices(indices)
        return self._sequences(lanes, slots, sequence_length)

    def final_obs_at(self, indices, sequence_length: int) -> Any:
        """The true final observations of the steps of the sequences starting at given flat positions.

        What a sequence learner needs to bootstrap at a time-limit truncation inside a sequence:
        the step after a truncated step ``j`` holds the next episode's reset observation, so the
        bootstrap value of step ``j`` must be computed from its final observation instead, e.g.
        ``v_next[:, j] = where(s.truncated[:, j] & ~s.terminated[:, j], V(final[:, j]),
        V(s.item["obs"][:, j + 1]))``. Entry ``[b, j]`` is the ``final_obs`` given to :meth:`add`
        with step ``j`` of sequence ``b`` where that step was truncated and not terminated, read
        from the final-observation ring (exact unless :meth:`final_obs_lost`); zeros at every other
        step. Not part of :meth:`sample_sequences` because few learners need it and it is a
        gather of ``B x L`` observations: call it with the sample's ``indices`` when you do
        (``final_obs_at(s.indices, L)``, also with a :class:`PrioritisedTrajectoryBuffer`'s
        ``buffer``).

        Args:
          indices: int[B] (any integer dtype), flat positions ``lane * length + physical slot`` of
            the first step, as the sample types' ``indices`` hold them.
          sequence_length: static Python int in ``[1, length]``.

        Returns:
          obs pytree like ``step[obs_key]``, leaves ``[B, sequence_length, ...]`` in the stored
          dtypes. Positions are not checked against the write head (as :meth:`sequences_at`);
          indices outside ``[0, num_envs * length)`` are clamped into it.

        Raises (trace time):
          ValueError / TypeError: ``indices`` not a 1-D integer array, bad ``sequence_length``.
        """
        sequence_length = self._sequence_length(sequence_length)
        lanes, slots = self._split_indices(indices)
        final, real = self._final_obs(lanes, slots, sequence_length)
        return where_real(real, final)

    def transitions_at(self, indices, *, n_step: int = 1, gamma) -> TransitionSample:
        """The n-step transitions starting at given flat positions.

        The read behind :meth:`sample_transitions` (same return, cut at the first episode end,
        ``next_obs`` from the final-observation ring after a truncation): ``transitions_at(s.indices,
        n_step=n, gamma=g)`` equals a sample ``s`` taken with the same ``n`` and ``g``.

        Args:
          indices: int[B] (any integer dtype), flat positions ``lane * length + physical slot`` of
            step ``t``, as the sample types' ``indices`` hold them.
          n_step: static Python int in ``[1, length - 1]``.
          gamma: discount in [0, 1], Python float or 0-d array (may be traced).

        Returns:
          :class:`TransitionSample` (leaves ``[B, ...]``). Positions are NOT checked: a window of
          ``n_step + 1`` steps that runs past the newest step reads physically following slots
          (older data after wrap-around), and so may the ``next_obs`` of the newest step; check
          with :meth:`valid_starts` (``window=n_step + 1``) when positions are not from a sampler.
          Indices outside ``[0, num_envs * length)`` are clamped into it.

        Raises (trace time):
          ValueError / TypeError: ``indices`` not a 1-D integer array, bad ``n_step`` or ``gamma``.
        """
        n_step = _validate.static_int("n_step", n_step)
        if n_step + 1 > self.length:
            raise ValueError(f"n_step: expected at most length - 1 = {self.length - 1}, got {n_step}")
        _gamma(gamma, self.storage[self.reward_key].dtype)
        lanes, slots = self._split_indices(indices)
        return self._transitions(lanes, slots, n_step, gamma)


# ------------------------------------------------------------------------------------------------
# prioritised trajectory buffer


# Other APIs' names for PrioritisedTrajectoryBuffer.create's keywords (flashbax's included), named in its errors.
_TRAJECTORY_RENAMED = {**RENAMED_KEYWORDS, "sequence_length": "window_length", "sample_sequence_length": "window_length", "max_length_time_axis": "length"}

# Keywords PrioritisedTrajectoryBuffer.create passes on to TrajectoryBuffer.create.
_TRAJECTORY_CREATE_KEYWORDS = frozenset(
    name for name, p in inspect.signature(TrajectoryBuffer.create).parameters.items() if p.kind is p.KEYWORD_ONLY
)


class PrioritisedTrajectorySample(NamedTuple):
    """What the sampling methods of :class:`PrioritisedTrajectoryBuffer` return."""

    item: Any  # a SequenceSample or TransitionSample (leaves [B, ...])
    indices: jax.Array  # shape=[B], dtype=int32: lane * length + physical start slot (tree leaf)
    probabilities: jax.Array  # shape=[B], dtype=float32: P(i) = p_i^alpha / sum_k p_k^alpha
    importance_weights: jax.Array  # shape=[B], dtype=float32: (N P(i))^-beta / max_j (N P(j))^-beta
    generations: jax.Array  # shape=[B], dtype=int32: generation of the start slot when sampled (see generations_at)


class PrioritisedTrajectoryBuffer(struct.PyTreeNode):
    """A :class:`TrajectoryBuffer` whose window starts are sampled in proportion to priority.

    Positions (``lane * length + slot``) are leaves of an on-device :class:`~jaxbuffers.sum_tree.SumMinTree`.
    A position holds ``p^alpha`` only while its window of ``window_length`` steps is valid (stored,
    not straddling the write head, aligned to ``period``); every other leaf is 0, so invalid
    windows are never sampled. Each ``add`` of ``t`` steps zeroes the ``num_envs * t`` overwritten
    starts and gives the ``<= num_envs * t`` newly completed windows the running max priority:
    O(num_envs * t * log capacity), never O(capacity).

    ``period`` alignment here is absolute (step ``a`` ever added in a lane, counting from 0, starts
    a window iff ``a % period == 0``), so a position's eligibility never changes while it is stored.
    Before the ring wraps this equals the uniform buffer's "from the oldest" rule.

    Importance weights (Schaul et al. 2016): ``w_i = (N P(i))^-beta / max_j (N P(j))^-beta`` with
    ``N`` the number of valid positions; the max is over the valid positions (the tree's minimum
    over positive leaves), so ``w_i = (p_i^alpha / min_j p_j^alpha)^-beta``.

    To re-read sampled positions use ``self.buffer.transitions_at(indices, ...)`` /
    ``self.buffer.sequences_at(indices, ...)`` (:class:`TrajectoryBuffer`); :meth:`final_obs_at` reads
the final observations of sampled sequences. To ask whether a
    position is valid here use ``priorities(indices) > 0``, not ``self.buffer.valid_starts(indices,
    window_length, period=period)``: that counts ``period`` from the oldest stored step, so with
    ``period > 1`` the two can disagree once the ring has wrapped.

    Priority policy (:meth:`set_priorities`), the same as :class:`jaxbuffers.PrioritisedReplayBuffer`'s:
    NaN -> current max priority; negative, zero or below ``epsilon`` -> ``epsilon``; above
    :data:`jaxbuffers.prioritised.PRIORITY_MAX` (1e20, incl. +inf) -> ``PRIORITY_MAX``. Updates for a
    position whose start slot was overwritten since it was sampled (generation differs), or whose
    window is not valid now, are ignored.
    """

    buffer: TrajectoryBuffer  # its counters end with two words of ours: max_priority's bits, phase (see the properties)
    tree: SumMinTree  # capacity num_envs * length; leaves p^alpha at valid starts, else 0 (sums + min over positive leaves)
    window_length: int = struct.field(pytree_node=False)
    period: int = struct.field(pytree_node=False)
    priority_exponent: float = struct.field(pytree_node=False)
    epsilon: float = struct.field(pytree_node=False)  # smallest priority kept, > 0

    @classmethod
    def create(
        cls,
        example_step: Mapping,
        num_envs: int,
        length: int,
        *,
        window_length: int | None = None,
        period: int = 1,
        priority_exponent: float = 0.6,
        epsilon: float = 1e-6,
        **kwargs,
    ) -> "PrioritisedTrajectoryBuffer":
        """An empty prioritised buffer.

        Args:
          example_step, num_envs, length, **kwargs: as :meth:`TrajectoryBuffer.create`.
          window_length: static window of a position (required): sequences of up to this length,
            or n-step transitions with ``n_step <= window_length - 1``.
          period: window starts every ``period`` steps (absolute alignment, see the class doc).
          priority_exponent: alpha in ``[0, 1]`` (as :class:`jaxbuffers.PrioritisedReplayBuffer`: larger exponents overflow float32 leaves at PRIORITY_MAX).
          epsilon: smallest priority kept, in ``[1e-30, 1]`` (policy in the class doc).

        Raises:
          ValueError: bad sizes (``num_envs * length`` above ``2**30``: one sum-tree leaf per position),
            ``window_length > length``, alpha outside ``[0, 1]``, ``epsilon`` out of range.
          TypeError: ``window_length`` missing, or a keyword this method does not take (named,
            with the ones it takes).
        """
        unknown = sorted(set(kwargs) - _TRAJECTORY_CREATE_KEYWORDS)
        if window_length is None:  # required; a default of None only so that a renamed keyword gets its hint
            hint = "".join(f" ({k}: use window_length)" for k in unknown if _TRAJECTORY_RENAMED.get(k) == "window_length")
            raise TypeError(f"PrioritisedTrajectoryBuffer.create: window_length is required{hint}")
        if unknown:
            raise unexpected_keywords(
                "PrioritisedTrajectoryBuffer.create", unknown,
                f"window_length, period, priority_exponent, epsilon and {', '.join(sorted(_TRAJECTORY_CREATE_KEYWORDS))}",
                _TRAJECTORY_RENAMED,
            )
        num_envs, length = _validate.static_int("num_envs", num_envs), _validate.static_int("length", length)
        if num_envs * length > 2**30:  # checked before any storage is allocated
            raise ValueError(
                f"num_envs * length: expected at most 2**30 positions (one sum-tree leaf each), got {num_envs} * {length} = {num_envs * length}"
            )
        buf = TrajectoryBuffer.create(example_step, num_envs, length, **kwargs)
        window_length = _validate.static_int("window_length", window_length)
        period = _validate.static_int("period", period)
        if window_length > buf.length:
            raise ValueError(f"window_length: expected at most length={buf.length}, got {window_length}")
        alpha = _validate.static_float("priority_exponent", priority_exponent, 0.0, 1.0)
        epsilon = _validate.static_float("epsilon", epsilon, 1e-30, 1.0)
        cap = buf.num_envs * buf.length
        tail = jnp.stack([_float_bits(jnp.float32(1.0)), jnp.int32(0)])  # max_priority 1, phase 0
        return cls(
            buffer=buf.replace(counters=jnp.concatenate([buf.counters, tail])),
            tree=SumMinTree.create(cap),
            window_length=window_length,
            period=period,
            priority_exponent=alpha,
            epsilon=epsilon,
        )

    # ------------------------------------------------------------------ state in the counters
    # Two int32 words at the end of ``buffer.counters`` (one array with the ring cursors: every
    # array of a jitted call's arguments and results costs host dispatch time, ~0.8 us per donated
    # array per call on the 2-core CPU).
    @property
    def max_priority(self) -> jax.Array:
        """float32 scalar: the largest priority set so far, 1.0 initially (new windows get it)."""
        return jax.lax.bitcast_convert_type(self.buffer.counters[..., -2], jnp.float32)

    @property
    def phase(self) -> jax.Array:
        """int32 scalar: steps ever added per lane, modulo ``period``."""
        return self.buffer.counters[..., -1]

    def _with(self, *, max_priority=None, phase=None) -> "PrioritisedTrajectoryBuffer":
        c = self.buffer.counters
        if max_priority is not None:
            c = c.at[-2].set(_float_bits(max_priority))
        if phase is not None:
            c = c.at[-1].set(jnp.asarray(phase, jnp.int32))
        return self.replace(buffer=self.buffer.replace(counters=c))

    # ------------------------------------------------------------------ delegation
    @property
    def memory_bytes(self) -> int:
        """Bytes of every array held (the buffer and the tree)."""
        return _validate.tree_nbytes(self)

    def size(self) -> jax.Array:
        """Steps stored over all lanes (int32 scalar)."""
        return self.buffer.size()

    def is_full(self) -> jax.Array:
        """Whether every lane holds ``length`` steps (bool scalar)."""
        return self.buffer.is_full()

    def can_sample(self) -> jax.Array:
        """Whether some window is valid (the tree's total is positive), bool scalar."""
        return self.tree.total() > 0

    def num_valid_windows(self) -> jax.Array:
        """N: valid positions over all lanes (int32 scalar)."""
        b = self.buffer
        m = b.num_valid - self.window_length  # last valid logical start
        first = (b.num_valid - self.phase) % self.period  # first l with (added - num_valid + l) % period == 0
        per_lane = jnp.where(m >= first, (m - first) // self.period + 1, 0)
        return (per_lane * b.num_envs).astype(jnp.int32)

    # ------------------------------------------------------------------ generations
    def generations_at(self, indices: jax.Array) -> jax.Array:
        """Generation of flat positions ``indices`` (int, any shape, ``lane * length + slot``):
        int32, same shape. Raises TypeError for a non-integer dtype.

        The number (modulo ``2**32``) of the step last written to the position's slot, counted per
        lane from 0 (all lanes advance together): it changes exactly when the slot is overwritten,
        which is what :meth:`set_priorities` checks. Derived from the ring cursors
        (:func:`jaxbuffers._ring.last_item_number`), so no per-slot array is stored or updated.
        """
        b = self.buffer
        slots = jnp.mod(_validate.integer_indices("indices", indices), b.length)
        return _ring.last_item_number(b.added, b.head, slots, b.length)

    def priorities(self, indices: jax.Array) -> jax.Array:
        """Priorities of flat positions ``indices`` (int, any shape): float32, same shape.

        Recovered from the tree as ``leaf ** (1/alpha)``
        (:func:`jaxbuffers.prioritised.priorities_at`: float32 rounding; alpha = 0 reads 1).
        Positions whose window is not valid now and indices outside ``[0, num_envs * length)``
        read 0.

        Raises:
          TypeError: ``indices`` of a non-integer dtype.
        """
        return priorities_at(self.tree, indices, self.priority_exponent)

    @property
    def generations(self) -> jax.Array:
        """Generations of every position, int32 ``[num_envs, length]`` (an ``O(capacity)`` array
        for tests and debugging; see :meth:`generations_at`)."""
        b = self.buffer
        flat = jnp.arange(b.num_envs * b.length, dtype=jnp.int32)
        return self.generations_at(flat).reshape(b.num_envs, b.length)

    # ------------------------------------------------------------------ add
    def add(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> "PrioritisedTrajectoryBuffer":
        """:meth:`TrajectoryBuffer.add`, plus the priority bookkeeping (class doc). Same args and errors."""
        old = self.buffer
        t = old._prepare(step, terminated, truncated, final_obs)[-1]
        new = old.add(step, terminated=terminated, truncated=truncated, final_obs=final_obs)
        e, n, w = old.num_envs, old.length, self.window_length
        phase = ((self.phase + t) % self.period).astype(jnp.int32)
        # 2 E t tree writes, entry k = (part, lane, i): part 0 zeroes the overwritten start
        # old.head + i of each lane; part 1 gives each lane's newly completed window, logical start
        # (new coordinates) v' - w - t + 1 + i, the max priority if it is a window start. One
        # elementwise expression of k (XLA: one or two kernels, not one per piece; every kernel
        # is an executor step on CPU).
        k = jnp.arange(2 * e * t, dtype=jnp.int32)
        is_new, lane, i = k >= e * t, (k // t) % e, k % t
        logical = new.num_valid - w - t + 1 + i
        ok = (logical >= 0) & ((phase - new.num_valid + logical) % self.period == 0)
        slot = jnp.where(is_new, _ring.logical_to_physical(logical, new.head, new.num_valid, n), (old.head + i) % n)
        fresh = priority_leaf(self.max_priority, self.priority_exponent)
        vals = jnp.where(is_new, jnp.where(ok, fresh, jnp.nan), 0).astype(jnp.float32)  # NaN: not written
        # O(E t log P). When window_length <= t a newly completed window can start at a slot written
        # by this very add; it comes later in the batch and the last write wins, so no set_unique here.
        return self.replace(buffer=new, tree=self.tree.set(lane * n + slot, vals))._with(phase=phase)

    # ------------------------------------------------------------------ sample
    def _draw(self, key, batch_size: int, beta):
        batch_size = _validate.static_int("batch_size", batch_size)
        idx = self.tree.sample_stratified(key, batch_size)
        probs, weights = probabilities_and_weights(self.tree, self.tree.get(idx), beta)
        gens = self.generations_at(idx)
        n = self.buffer.length
        return idx, idx // n, idx % n, probs, weights, gens

    def sample_sequences(
        self, key: jax.Array, batch_size: int, *, beta, sequence_length: int | None = None
    ) -> PrioritisedTrajectorySample:
        """Sequences whose start is drawn in proportion to ``p^alpha`` (stratified, sum tree).

        Args:
          key: PRNG key. batch_size: static int >= 1. beta: importance exponent (float, may be traced).
          sequence_length: static, ``<= window_length`` (default ``window_length``).

        Returns:
          :class:`PrioritisedTrajectorySample` whose ``item`` is a :class:`SequenceSample`.
        """
        sequence_length = self.window_length if sequence_length is None else _validate.static_int("sequence_length", sequence_length)
        if sequence_length > self.window_length:
            raise ValueError(f"sequence_length: expected at most window_length={self.window_length}, got {sequence_length}")
        idx, lanes, starts, probs, weights, gens = self._draw(key, batch_size, beta)
        return PrioritisedTrajectorySample(self.buffer._sequences(lanes, starts, sequence_length), idx, probs, weights, gens)

    def final_obs_at(self, indices, sequence_length: int) -> Any:
        """:meth:`TrajectoryBuffer.final_obs_at` of ``self.buffer``: the final observations at the
        truncated steps of the sequences starting at ``indices`` (a sample's ``indices``)."""
        return self.buffer.final_obs_at(indices, sequence_length)

    def sample_transitions(
        self, key: jax.Array, batch_size: int, *, beta, gamma, n_step: int | None = None
    ) -> PrioritisedTrajectorySample:
        """n-step transitions (see :meth:`TrajectoryBuffer.sample_transitions`) drawn by priority.

        ``n_step`` defaults to ``window_length - 1`` and must not exceed it. The ``item`` is a
        :class:`TransitionSample`.
        """
        n_step = self.window_length - 1 if n_step is None else _validate.static_int("n_step", n_step)
        if self.window_length < 2:
            raise ValueError(
                "sample_transitions: needs window_length >= 2 (an n-step transition spans n_step + 1 steps); "
                f"this buffer was created with window_length={self.window_length}"
            )
        if not 1 <= n_step <= self.window_length - 1:
            raise ValueError(f"n_step: expected 1 <= n_step <= window_length - 1 = {self.window_length - 1}, got {n_step}")
        _gamma(gamma, self.buffer.storage[self.buffer.reward_key].dtype)
        idx, lanes, starts, probs, weights, gens = self._draw(key, batch_size, beta)
        return PrioritisedTrajectorySample(self.buffer._transitions(lanes, starts, n_step, gamma), idx, probs, weights, gens)

    # ------------------------------------------------------------------ priorities
    def set_priorities(self, indices: jax.Array, priorities: jax.Array, generations: jax.Array) -> "PrioritisedTrajectoryBuffer":
        """Set the priorities of sampled positions (typically ``|TD error| + eps``).

        Args:
          indices: int32[B] from a sample's ``indices``.
          priorities: float[B], raw priorities (alpha is applied here); policy in the class doc.
          generations: int32[B] from the same sample's ``generations``.

        An entry is ignored when its start slot was overwritten since sampling (generation
        differs), when its window is not valid now (leaf is 0), or when the index is out of range.
        Duplicate indices: the last entry wins; ``max_priority`` grows to the largest priority actually written.
        """
        indices = _validate.index_array(indices)
        priorities = jnp.asarray(priorities)
        generations = jnp.asarray(generations)
        if indices.ndim != 1 or priorities.shape != indices.shape or generations.shape != indices.shape:
            raise ValueError(
                f"indices, priorities, generations: expected three [B] arrays, got shapes "
                f"{indices.shape}, {priorities.shape}, {generations.shape}"
            )
        for name, x in (("indices", indices), ("generations", generations)):
            if not jnp.issubdtype(x.dtype, jnp.integer):
                raise TypeError(f"{name}: expected an integer dtype (int32), got {x.dtype}")
        if not jnp.issubdtype(priorities.dtype, jnp.floating):
            raise TypeError(f"priorities: expected a floating dtype, got {priorities.dtype}")
        leaf_row = self.tree.padded_capacity
        tree, max_p = write_priorities(
            self.tree, _validate.int32_indices(indices), priorities, generations.astype(jnp.int32),
            # a position whose window is not valid now has leaf 0
            lambda slot, gen: (self.generations_at(slot) == gen) & (self.tree.nodes[slot + leaf_row, 0] > 0),
            self.max_priority, self.epsilon, self.priority_exponent,
        )
        return self.replace(tree=tree)._with(max_priority=max_p)
