r"""`PrioritisedTrajectoryBuffer`: a `jaxbuffers.TrajectoryBuffer` whose window starts are drawn by priority.

A drop-in for the uniform buffer (`docs/guide.md`, section 1): its samplers take a keyword `beta=1.0` and add
`probabilities`, `importance_weights` and `generations` to the uniform samples (priority policy and weights:
`docs/api/replay.md`, "Prioritised replay"). The tree of window starts, its upkeep and `period`:
`docs/api/trajectory.md`, "Prioritised windows".

References:
  Schaul, Quan, Antonoglou, Silver (2016), *Prioritized Experience Replay*, ICLR.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxbuffers import _compiled, _priority, _ring, _validate
from jaxbuffers.sum_tree import SumMinTree
from jaxbuffers._metrics import Recorded
from jaxbuffers._wrapper import Wrapper, forward_fields
from jaxbuffers.trajectory import SequenceSample, TrajectoryBuffer, TransitionSample, episode_mask

__all__ = ["PrioritisedTrajectoryBuffer", "PrioritisedSequenceSample", "PrioritisedTransitionSample"]

_GAMMA, _BETA = {"gamma": (0.0, 1.0)}, {"beta": (0.0, float("inf"))}
_GAMMA_BETA = {**_GAMMA, **_BETA}


class PrioritisedSequenceSample(NamedTuple):
    """`jaxbuffers.SequenceSample`'s fields, plus the priority fields (`PrioritisedTransitionSample`)."""

    item: Any  # dict like the example step, leaves [B, L, ...]
    terminated: jax.Array  # shape=[B, L], dtype=bool
    truncated: jax.Array  # shape=[B, L], dtype=bool
    indices: jax.Array  # shape=[B], dtype=int32: lane * length + physical start slot (a position)
    probabilities: jax.Array  # shape=[B], dtype=float32: P(i)
    importance_weights: jax.Array  # shape=[B], dtype=float32: w_i, in [0, 1] (0 only when w_i underflows float32)
    generations: jax.Array  # shape=[B], dtype=int32: generation of the start slot when sampled

    @property
    def mask(self) -> jax.Array:
        """bool [B, L]: as `jaxbuffers.SequenceSample.mask`."""
        return episode_mask(self.terminated, self.truncated)


class PrioritisedTransitionSample(NamedTuple):
    """`jaxbuffers.TransitionSample`'s fields, plus `probabilities`, `importance_weights` (in [0, 1], 0 only when
    the weight underflows float32) and `generations` (what `set_priorities` takes back)."""

    obs: Any
    action: Any
    n_step_return: jax.Array  # shape=[B]
    discount: jax.Array  # shape=[B]
    next_obs: Any
    num_steps: jax.Array  # shape=[B], dtype=int32
    item: Any  # the whole step t, leaves [B, ...]
    indices: jax.Array  # shape=[B], dtype=int32: lane * length + physical slot of step t (a position)
    probabilities: jax.Array  # shape=[B], dtype=float32
    importance_weights: jax.Array  # shape=[B], dtype=float32
    generations: jax.Array  # shape=[B], dtype=int32


@_validate.one_member_methods
@forward_fields("buffer", TrajectoryBuffer)  # storage, ..., head, ..., length, obs_key, ...: read-only
class PrioritisedTrajectoryBuffer(Recorded, Wrapper, struct.PyTreeNode):
    """A `jaxbuffers.TrajectoryBuffer` whose window starts are sampled in proportion to priority.

    Its tree and `period`: `docs/api/trajectory.md`, "Prioritised windows".
    """

    _cursor = "buffer.head"  # the leaf that is a scalar in one buffer (stacked with jax.vmap: `jaxbuffers._validate.members`)

    buffer: TrajectoryBuffer  # the steps
    tree: SumMinTree  # capacity num_envs * length; leaf slot * num_envs + lane: p^alpha at a valid window start, else 0
    max_priority: jax.Array  # shape=(), dtype=float32: largest priority set so far (1 initially); new windows get it
    phase: jax.Array  # shape=(), dtype=int32: steps ever added per lane modulo period (window alignment), in [0, period)
    window_length: int = struct.field(pytree_node=False)
    period: int = struct.field(pytree_node=False)
    priority_exponent: float = struct.field(pytree_node=False)
    epsilon: float = struct.field(pytree_node=False)  # smallest priority kept, > 0
    _metrics_in = "buffer"  # record / stats: the metrics of the wrapped TrajectoryBuffer

    def _cursor_ranges(self) -> dict:
        """`(lo, hi)`, inclusive, of the cursor fields' documented ranges (`_checkpoint_describe._checked_cursors`)."""
        return {"phase": (0, self.period - 1)}

    @classmethod
    @_validate.keyword_sizes
    def create(
        cls, example_step: Mapping, *, num_envs: int, length: int, window_length: int = 2, period: int = 1,
        priority_exponent: float = 0.6, epsilon: float = 1e-6, final_obs_capacity: int | None = None,
        obs_key: str = "obs", action_key: str = "action", reward_key: str = "reward", metrics: bool = True,
    ) -> "PrioritisedTrajectoryBuffer":
        r"""An empty prioritised buffer.

        Args:
          example_step: as `jaxbuffers.TrajectoryBuffer.create`, like `num_envs`, `length`,
            `final_obs_capacity`, `obs_key`, `action_key`, `reward_key` and `metrics` (not repeated here).
          window_length: static window of a position: sequences of up to this length, or n-step
            transitions with `n_step <= window_length - 1`. The default 2 holds one-step transitions (what
            `TrajectoryBuffer.sample_transitions` draws by default), so swapping the class is one token.
          period: window starts every `period` steps (absolute alignment, "Period" in `docs/api/trajectory.md`).
          priority_exponent: $\alpha$ in `[0, 1]`.
          epsilon: smallest priority kept, in `[1e-30, 1]`.

        Raises:
          ValueError: bad sizes (`num_envs * length` above `2**30`: one tree leaf per position),
            `window_length > length`, $\alpha$ or `epsilon` out of range.
        """
        num_envs, length = _validate.static_int("num_envs", num_envs), _validate.static_int("length", length)
        if num_envs * length > 2**30:  # checked before any storage is allocated
            raise ValueError(
                f"num_envs * length: expected at most 2**30 positions (one sum-tree leaf each), got {num_envs} * {length} = {num_envs * length}"
            )
        window_length = _validate.static_int("window_length", window_length)
        if window_length > length:
            raise ValueError(f"window_length: expected at most length={length}, got {window_length}")
        buf = TrajectoryBuffer.create(
            example_step, num_envs=num_envs, length=length, final_obs_capacity=final_obs_capacity,
            obs_key=obs_key, action_key=action_key, reward_key=reward_key, metrics=metrics,
        )
        return cls(
            buffer=buf, tree=SumMinTree.create(num_envs * length), max_priority=jnp.float32(1.0),
            phase=jnp.int32(0), window_length=window_length, period=_validate.static_int("period", period),
            priority_exponent=_validate.static_float("priority_exponent", priority_exponent, 0.0, 1.0),
            epsilon=_validate.static_float("epsilon", epsilon, 1e-30, 1.0),
        )

    @property
    def memory_bytes(self):
        """Bytes of every array held (steps and tree)."""
        return _validate.tree_nbytes(self)

    @_compiled.method("batch_size", "sequence_length", "period", "cross_episodes", scalars=_BETA)
    def can_sample(self, batch_size: int, sequence_length: int | None = None, *, period: int | None = None,
                   cross_episodes: bool = True, beta=1.0) -> jax.Array:
        """Whether `sample_sequences` with these arguments returns only valid data (bool scalar): some window it
        draws from has a positive priority (the tree's total, or with `cross_episodes=False` its in-episode part).
        `sample_sequences`' arguments without the key; same errors."""
        _validate.static_int("batch_size", batch_size)
        sequence_length = self._sequence_length(sequence_length, period)
        if _validate.static_bool("cross_episodes", cross_episodes):
            return self.tree.total() > 0
        return jnp.any(self._in_episode_leaves(sequence_length) > 0)

    @_compiled.method("batch_size", "n_step", scalars=_GAMMA_BETA)
    def can_sample_transitions(self, batch_size: int, *, n_step: int = 1, gamma=None, beta=1.0) -> jax.Array:
        """Whether `sample_transitions` with these arguments returns only valid data (bool scalar).
        `sample_transitions`' arguments without the key (`gamma` optional here); same errors."""
        _validate.static_int("batch_size", batch_size)
        self._n_step(n_step)
        if gamma is not None:
            self.buffer.can_sample_transitions(batch_size, gamma=gamma)  # gamma's own checks
        return self.tree.total() > 0

    @_compiled.method("window", "period")
    def num_valid_windows(self, window: int | None = None, *, period: int | None = None) -> jax.Array:
        """`jaxbuffers.TrajectoryBuffer.num_valid_windows` (int32 scalar); `window` None: `window_length`, `period`
        None: `create`'s. With both None: the positions with a positive priority, the windows the samplers draw."""
        window = self.window_length if window is None else window
        return self.buffer.num_valid_windows(window, period=self.period if period is None else period)

    @_compiled.method("window", "period", "cross_episodes")
    def valid_starts(self, indices, window: int | None = None, *, period: int | None = None, cross_episodes: bool = True) -> jax.Array:
        """`jaxbuffers.TrajectoryBuffer.valid_starts` (bool `[B]`); `window` None: `window_length`, `period` None:
        `create`'s. With both None and `cross_episodes=True`: exactly the positions with a positive priority."""
        window = self.window_length if window is None else window
        return self.buffer.valid_starts(indices, window, period=self.period if period is None else period, cross_episodes=cross_episodes)

    @property
    def step_spec(self) -> Any:
        """`jaxbuffers.TrajectoryBuffer.step_spec`."""
        return self.buffer.step_spec

    @_compiled.method()
    def final_obs_lost(self) -> jax.Array:
        """`jaxbuffers.TrajectoryBuffer.final_obs_lost` (bool scalar)."""
        return self.buffer.final_obs_lost()

    @_compiled.method()
    def truncate_last(self, truncated, final_obs) -> "PrioritisedTrajectoryBuffer":
        """`jaxbuffers.TrajectoryBuffer.truncate_last` (same arguments and errors). The priorities are unchanged (which
        windows are valid does not depend on episode ends; only `cross_episodes=False` draws do, read at sampling),
        but for the windows that start at or before a step whose final observation this one overwrote (`_drop_lost`)."""
        new = self.buffer.truncate_last(truncated, final_obs)
        return self.replace(buffer=new, tree=self._drop_lost(self.tree, new, 0))

    @_compiled.method()
    def generations_at(self, indices: jax.Array) -> jax.Array:
        """Generation of flat positions `indices` (int, any shape; TypeError for other dtypes), int32: the number
        (modulo `2**32`) of the step last written to the slot, changed exactly when it is overwritten
        (`jaxbuffers._ring.last_item_number`). Indices outside `[0, num_envs * length)` are clamped into it."""
        b = self.buffer
        slots = jnp.mod(jnp.clip(_validate.integer_indices("indices", indices), 0, b.num_envs * b.length - 1), b.length)
        return _ring.last_item_number(b.added, b.head, slots, b.length)

    @_compiled.method()
    def priorities(self, indices: jax.Array) -> jax.Array:
        """Priorities of flat positions `indices` (int, any shape; TypeError for other dtypes), float32; invalid
        windows and indices outside `[0, num_envs * length)` read 0."""
        return _priority.priorities_at(self.tree, self._leaf(_validate.integer_indices("indices", indices)), self.priority_exponent)

    def _leaf(self, indices: jax.Array) -> jax.Array:
        """Tree leaves (int32, same shape) of flat positions `lane * length + slot`: `slot * num_envs + lane`, so that
        one slot of every lane, and consecutive slots, are consecutive leaves; positions outside
        `[0, num_envs * length)` map to -1, outside the tree."""
        e, n = self.buffer.num_envs, self.buffer.length
        return jnp.where((indices >= 0) & (indices < e * n), (indices % n) * e + indices // n, -1).astype(jnp.int32)

    def _from_lane_order(self) -> "PrioritisedTrajectoryBuffer":
        """This buffer with a tree whose leaves are in the order `lane * length + slot` (checkpoints written before the
        order `slot * num_envs + lane`) rebuilt in this order: the same leaf values, the sums recomputed."""
        e, n = self.buffer.num_envs, self.buffer.length
        leaves = self.tree.leaves().reshape(e, n).T.reshape(-1)
        tree = SumMinTree.create(e * n, self.tree.dtype).set(jnp.arange(e * n, dtype=jnp.int32), leaves, distinct=True)
        return self.replace(tree=tree)

    def _position(self, leaves: jax.Array) -> jax.Array:
        """Flat positions `lane * length + slot` (int32, same shape) of tree leaves in `[0, num_envs * length)`."""
        e, n = self.buffer.num_envs, self.buffer.length
        return ((leaves % e) * n + leaves // e).astype(jnp.int32)

    @property
    def generations(self):
        """Generations of every position, int32 `[num_envs, length]` (`O(capacity)`, for tests and debugging)."""
        return self.generations_at(jnp.arange(self.buffer.num_envs * self.buffer.length, dtype=jnp.int32)).reshape(self.buffer.num_envs, -1)

    def num_added(self) -> int:
        """Exact number of steps ever added per lane (host-side Python int): `jaxbuffers.TrajectoryBuffer.num_added`."""
        return self.buffer.num_added()

    @_compiled.method()
    def add(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> "PrioritisedTrajectoryBuffer":
        """`jaxbuffers.TrajectoryBuffer.add` (same arguments and errors), plus the priority bookkeeping."""
        b = self.buffer
        return self.add_prepared(*_validate.trajectory_add(b.step_spec, b.obs_key, b.num_envs, b.length, step, terminated, truncated, final_obs))

    def add_prepared(self, step, terminated, truncated, final_obs) -> "PrioritisedTrajectoryBuffer":
        """`jaxbuffers.TrajectoryBuffer.add_prepared`, plus the priority bookkeeping."""
        old = self.buffer
        new = old.add_prepared(step, terminated, truncated, final_obs)
        e, n, w, t = old.num_envs, old.length, self.window_length, terminated.shape[1]
        phase = ((self.phase + t) % self.period).astype(jnp.int32)
        # One run of tree leaves, the same slots in every lane (leaves `slot * num_envs + lane` are consecutive): the
        # last min(t + w - 1, length) steps (logical nv - r + k). The t written ones get the max priority if they start
        # a whole aligned window and 0 otherwise; the windows before the chunk made whole (nv - w - t + 1 + i for
        # i < min(t, w - 1)) get it if they exist and are aligned; the others are not written (NaN).
        r, m = min(t + w - 1, n), min(t, w - 1)
        k = jnp.arange(r, dtype=jnp.int32)
        logical = new.num_valid - r + k
        made_whole = (logical >= new.num_valid - w - t + 1) & (logical < new.num_valid - w - t + 1 + m)
        aligned = _ring.aligned(logical, _ring.aligned_first(phase, new.num_valid, self.period), self.period)
        start = (logical >= 0) & (logical + w <= new.num_valid) & aligned
        fresh = _priority.priority_leaf(self.max_priority, self.priority_exponent)
        written = k >= r - t
        vals = jnp.where(written, jnp.where(start, fresh, 0), jnp.where(made_whole & start, fresh, jnp.nan)).astype(jnp.float32)
        if old._lossy:  # [r, num_envs]: no window starts in a lane's lost prefix
            vals = jnp.where(jnp.isnan(vals)[:, None] | (logical[:, None] >= new.lost_prefix), vals[:, None], 0).reshape(-1)
        first = _ring.logical_to_physical(logical[0], new.head, new.num_valid, n)
        tree = self.tree.set_run(first * e, vals if old._lossy else jnp.repeat(vals, e))
        return self.replace(buffer=new, tree=self._drop_lost(tree, new, t), phase=phase)

    def _drop_lost(self, tree: SumMinTree, new: TrajectoryBuffer, written: int) -> SumMinTree:
        """`tree` with priority 0 at the windows that `new` (this buffer's steps after writing `written` steps, static)
        added to each lane's `lost_prefix` ("Lost final observations" in `docs/api/trajectory.md`). The prefix can grow
        by up to `length` in one add, but each stored step enters it once: the (lane, step) pairs entering, numbered
        over all lanes, zeroed in blocks of `num_envs * min(written + window_length - 1, length)` leaves in a loop,
        `O((steps entering + num_envs * block) * log capacity)` (amortised `O(num_envs * t log capacity)` an add, however
        the lanes' prefixes grow)."""
        old = self.buffer
        if not old._lossy:
            return tree
        e, n = old.num_envs, old.length
        lo = jnp.maximum(old.lost_prefix - (old.num_valid + written - new.num_valid), 0)  # in the new logical order
        count = (new.lost_prefix - lo).astype(jnp.int32)  # [E]: steps entering each lane's prefix
        cum = jnp.cumsum(count, dtype=jnp.int32)
        block = e * max(min(written + self.window_length - 1, n), 1)
        ks = jnp.arange(block, dtype=jnp.int32)

        def zero(carry):
            i, tree = carry
            j = i * block + ks  # [block]: pair numbers; pair j is in the lane whose running count first exceeds it
            lane = jnp.minimum(jnp.searchsorted(cum, j, side="right"), e - 1).astype(jnp.int32)
            logical = lo[lane] + j - (cum - count)[lane]
            leaf = _ring.logical_to_physical(logical, new.head, new.num_valid, n) * e + lane
            drop = j < cum[-1]
            return i + 1, tree.set(leaf, jnp.zeros(drop.shape, tree.dtype), drop, distinct=True)

        blocks = (cum[-1] + block - 1) // block
        return jax.lax.while_loop(lambda c: c[0] < blocks, zero, (jnp.int32(0), tree))[1]

    def _sequence_length(self, sequence_length, period=None) -> int:
        if period is not None and _validate.static_int("period", period) != self.period:
            raise ValueError(
                f"period: the priority tree holds the windows aligned to create's period={self.period}; got {period} "
                f"(pass period={self.period} or leave it out)"
            )
        if sequence_length is None:
            return self.window_length
        sequence_length = _validate.static_int("sequence_length", sequence_length)
        if sequence_length > self.window_length:
            raise ValueError(f"sequence_length: expected at most window_length={self.window_length}, got {sequence_length}")
        return sequence_length

    def _n_step(self, n_step) -> int:
        if self.window_length < 2:
            raise ValueError(
                "sample_transitions: needs window_length >= 2 (an n-step transition spans n_step + 1 steps); "
                f"this buffer was created with window_length={self.window_length}"
            )
        n_step = _validate.static_int("n_step", n_step)
        if n_step > self.window_length - 1:
            raise ValueError(f"n_step: expected 1 <= n_step <= window_length - 1 = {self.window_length - 1}, got {n_step}")
        return n_step

    def _in_episode_leaves(self, sequence_length: int) -> jax.Array:
        """The tree's leaves (float32 `[num_envs * length]`) where no episode end lies before the window's last step."""
        positions = jnp.arange(self.buffer.num_envs * self.buffer.length, dtype=jnp.int32)
        inside = self.buffer.valid_starts(positions, sequence_length, period=self.period, cross_episodes=False)
        return jnp.where(inside, self.tree.get(self._leaf(positions)), 0)

    def _draw(self, key, batch_size: int, beta, leaves=None):
        batch_size = _validate.static_int("batch_size", batch_size)
        if leaves is None:
            leaf, probs, weights = _priority.draw(self.tree, key, batch_size, beta)
            idx = self._position(leaf)
        else:
            idx, probs, weights = _priority.draw_from_leaves(leaves, key, batch_size, beta)
        return idx, (probs, weights, self.generations_at(idx))

    @_compiled.method("batch_size", "sequence_length", "period", "cross_episodes", scalars=_BETA)
    def sample_sequences(
        self, key: jax.Array, batch_size: int, sequence_length: int | None = None, *, period: int | None = None,
        cross_episodes: bool = True, beta=1.0,
    ) -> PrioritisedSequenceSample:
        r"""A `PrioritisedSequenceSample` of sequences whose start is drawn in proportion to $p^\alpha$ (stratified,
        sum tree); with `cross_episodes=False` among the windows with no episode end before their last step only (an
        `O(num_envs * length)` pass; probabilities and the weights' normaliser are those of that set). `key`,
        `batch_size` and `cross_episodes` are as in `jaxbuffers.TrajectoryBuffer.sample_sequences`.

        Args:
          sequence_length: static int `<= window_length` (default `window_length`).
          period: static int, `create`'s `period` (None: that one); the tree holds only those windows.
          beta: importance exponent >= 0 (may be traced; a traced negative one counts as 0).

        Raises:
          ValueError: bad sizes, `sequence_length > window_length`, `period` not `create`'s, a concrete `beta` < 0.
          TypeError: `cross_episodes` not a bool.
        """
        sequence_length = self._sequence_length(sequence_length, period)
        cross = _validate.static_bool("cross_episodes", cross_episodes)
        idx, extra = self._draw(key, batch_size, beta, None if cross else self._in_episode_leaves(sequence_length))
        return PrioritisedSequenceSample(*self.buffer.sequences_at(idx, sequence_length), *extra)

    @_compiled.method("batch_size", "n_step", scalars=_GAMMA_BETA)
    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma, beta=1.0) -> PrioritisedTransitionSample:
        """A `PrioritisedTransitionSample` of n-step transitions (`jaxbuffers.TrajectoryBuffer.sample_transitions`)
        drawn by priority; `key`, `batch_size` and `gamma` (required) as there.

        Args:
          n_step: static int in `[1, window_length - 1]` (default 1, as `TrajectoryBuffer`'s).
          beta: importance exponent >= 0 (may be traced; a traced negative one counts as 0).

        Raises:
          ValueError: bad sizes, `window_length < 2`, `n_step` too large, `gamma` / `beta` out of range.
          TypeError: `gamma` missing or a bool.
        """
        n_step = self._n_step(n_step)
        idx, extra = self._draw(key, batch_size, beta)
        return PrioritisedTransitionSample(*self.buffer.transitions_at(idx, n_step=n_step, gamma=gamma), *extra)

    @_compiled.method("sequence_length")
    def sequences_at(self, indices, sequence_length: int | None = None) -> SequenceSample:
        """`jaxbuffers.TrajectoryBuffer.sequences_at` (a `jaxbuffers.SequenceSample`; same errors); `sequence_length`
        None: `window_length`, as `sample_sequences`."""
        return self.buffer.sequences_at(indices, self.window_length if sequence_length is None else sequence_length)

    @_compiled.method("n_step", scalars=_GAMMA)
    def transitions_at(self, indices, *, n_step: int = 1, gamma) -> TransitionSample:
        """`jaxbuffers.TrajectoryBuffer.transitions_at` (a `jaxbuffers.TransitionSample`; same arguments, defaults
        and errors)."""
        return self.buffer.transitions_at(indices, n_step=n_step, gamma=gamma)

    @_compiled.method("sequence_length")
    def final_obs_at(self, indices, sequence_length: int) -> Any:
        """`jaxbuffers.TrajectoryBuffer.final_obs_at`: the final observations at the truncated steps of the sequences
        starting at `indices` (a sample's `indices`)."""
        return self.buffer.final_obs_at(indices, sequence_length)

    @_compiled.method()
    def set_priorities(self, indices: jax.Array, priorities: jax.Array, generations: jax.Array) -> "PrioritisedTrajectoryBuffer":
        r"""Set the priorities of sampled positions (typically `|TD error| + eps`), following the priority policy.

        An entry is ignored when its start slot was overwritten since sampling (generation differs), its window is
        not valid now (leaf 0) or the index is out of range. Duplicate indices: the last entry wins; `max_priority`
        grows to the largest priority written.

        Args:
          indices: int32[B] from a sample's `indices`.
          priorities: float[B], raw priorities ($\alpha$ is applied here).
          generations: int32[B] from the same sample's `generations`.

        Raises:
          ValueError: the three not of one shape `[B]`.
          TypeError: wrong dtype kinds.
        """
        return _priority.set_priorities(
            self, self._leaf(_validate.index_vector("indices", indices)), priorities, generations,
            lambda leaf, gen: (self.generations_at(self._position(leaf)) == gen) & (self.tree.get(leaf) > 0),  # 0: not valid now
        )
