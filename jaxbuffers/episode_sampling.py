r"""Sampling from an `EpisodeBuffer`: the sample types and the samplers (`EpisodeSampling`, methods of
`jaxbuffers.EpisodeBuffer`; layout and step convention in `jaxbuffers.episode`).

Filters. Every sampler and `can_sample` take `where`: `None` (every stored episode), a bool array
`[max_episodes]` by slot, or a function of the meta dict (leaves `[max_episodes, ...]`) returning one, e.g.
`where=lambda meta: meta["task_id"] == 1`. Draws are uniform over what passes (episodes, windows or steps). A
function is traced each time the sampler is called eagerly; pass a mask (or call inside `jit`) to avoid that.

Nothing to draw. When nothing passes (`can_sample`, or `can_sample_sequences` for `sample_sequences`, is False:
no stored episode passes the filter, or none holds a window of the length asked), a sampler returns *empty rows*:
`indices` -1 (no slot: `update` ignores it, `record` counts it nowhere) and every other field zero or False, so
`mask` is all False, `lengths` and `num_steps` 0, `window_mask` all False, `discount` 0. Rows are never read from
a slot that did not pass. `indices >= 0` tells the rows drawn from data apart (e.g. after
`jaxbuffers.sample_mixed`).

Draws. A sampler counts the units each episode slot holds (1 per passing episode, its steps, or its windows of the
length asked), draws `batch_size` of them uniformly with replacement from the running total (an O(max_episodes)
search, `_draw`) and gathers the rows at the slots and steps drawn.

Generations. Every sample carries `generations`: for each row, the number (modulo `2**32`) of the episode its slot
held when it was read. `EpisodeBuffer.update(..., generations=s.generations)` writes a row only while its slot still
holds that episode, so a relabel computed from a sample never lands on an episode added after it (the rule of
`PrioritisedReplayBuffer.set_priorities`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _compiled, _ring, _validate
from jaxbuffers.trajectory import n_step_window

__all__ = ["EpisodeSample", "EpisodeSequenceSample", "EpisodeStepSample", "EpisodeTransitionSample"]

GAMMA = {"gamma": (0.0, 1.0)}
"""The range of the samplers' traced `gamma` (`jaxbuffers._compiled.method`'s `scalars`)."""


class EpisodeSample(NamedTuple):
    """What `EpisodeBuffer.sample_episodes` and `EpisodeBuffer.get_all` return: `B` whole episodes, padded."""

    item: Any  # step dict, leaves [B, max_timesteps, ...]: zeros past each episode's length
    mask: jax.Array  # shape=[B, max_timesteps], dtype=bool: t < length
    lengths: jax.Array  # shape=[B], dtype=int32
    terminated: jax.Array  # shape=[B], dtype=bool: the episode ended by termination
    truncated: jax.Array  # shape=[B], dtype=bool: the episode ended by truncation
    final_obs: Any  # obs pytree, leaves [B, ...]: obs after the last step
    meta: dict  # {name: [B, ...]}, declared dtypes
    indices: jax.Array  # shape=[B], dtype=int32: episode slots; -1 in an empty row (module doc)
    generations: jax.Array  # shape=[B], dtype=int32: episode number of each slot at sampling; pass to update


class EpisodeSequenceSample(NamedTuple):
    """What `EpisodeBuffer.sample_sequences` returns: `B` windows of `L` consecutive steps inside one episode."""

    item: Any  # step dict, leaves [B, L, ...]
    terminated: jax.Array  # shape=[B, L], dtype=bool: step j is the episode's last and it terminated
    truncated: jax.Array  # shape=[B, L], dtype=bool: step j is the episode's last and it was truncated
    next_obs: Any  # obs pytree, leaves [B, ...]: obs after step L - 1 (the final obs when that step is the last)
    meta: dict  # {name: [B, ...]}
    indices: jax.Array  # shape=[B], dtype=int32: episode slots; -1 in an empty row (module doc)
    starts: jax.Array  # shape=[B], dtype=int32: step of the window's first step in its episode
    generations: jax.Array  # shape=[B], dtype=int32: episode number of each slot at sampling; pass to update


class EpisodeStepSample(NamedTuple):
    """What `EpisodeBuffer.sample_timesteps` returns: `B` single steps."""

    item: Any  # step dict, leaves [B, ...]
    next_obs: Any  # obs pytree, leaves [B, ...]: obs_{t+1} (the final obs at the last step)
    terminated: jax.Array  # shape=[B], dtype=bool: step flags (last step of a terminated episode)
    truncated: jax.Array  # shape=[B], dtype=bool: step flags (last step of a truncated episode)
    meta: dict  # {name: [B, ...]}
    indices: jax.Array  # shape=[B], dtype=int32: episode slots; -1 in an empty row (module doc)
    steps: jax.Array  # shape=[B], dtype=int32: t
    generations: jax.Array  # shape=[B], dtype=int32: episode number of each slot at sampling; pass to update


class EpisodeTransitionSample(NamedTuple):
    r"""What `EpisodeBuffer.sample_transitions` returns: `B` n-step transitions.

    With $k$ the number of rewards used ($1 \le k \le n$, cut at the episode's last step), the bootstrap target
    is `n_step_return + discount * V(next_obs)` (`jaxbuffers.trajectory.n_step_window`).
    """

    obs: Any  # obs_t, leaves [B, ...]
    action: Any  # action_t, leaves [B, ...]
    n_step_return: jax.Array  # shape=[B], dtype=reward dtype: G_t^(k)
    discount: jax.Array  # shape=[B], dtype=reward dtype: gamma**k, 0 if step t+k-1 terminated
    next_obs: Any  # obs_{t+k}, leaves [B, ...]: the episode's final obs when t + k = length
    num_steps: jax.Array  # shape=[B], dtype=int32: k
    item: Any  # the whole step t, leaves [B, ...]
    window: Any  # steps t .. t+n-1, leaves [B, n, ...]: zeros past the episode's end
    window_mask: jax.Array  # shape=[B, n], dtype=bool: j < k
    meta: dict  # {name: [B, ...]}
    indices: jax.Array  # shape=[B], dtype=int32: episode slots; -1 in an empty row (module doc)
    steps: jax.Array  # shape=[B], dtype=int32: t
    generations: jax.Array  # shape=[B], dtype=int32: episode number of each slot at sampling; pass to update


class EpisodeSampling:
    """The samplers of `jaxbuffers.EpisodeBuffer` (module doc: filters, draws, empty rows), reading its state
    (`storage`, `lengths`, `terminated`, `truncated`, `final_obs`, `meta`, `num_valid`) and configuration."""

    def _filter(self, where):
        """The filter as a bool `[max_episodes]` mask by slot, or None for every episode (checked at trace time)."""
        if where is None:
            return None
        mask, name = (self._where_of_meta(where), "where(meta)") if callable(where) else (where, "where")
        e = self.max_episodes
        if not hasattr(mask, "shape") or tuple(mask.shape) != (e,) or np.dtype(mask.dtype) != np.dtype(bool):
            got = f"shape {tuple(mask.shape)} dtype {mask.dtype}" if hasattr(mask, "shape") else type(mask).__name__
            raise TypeError(f"{name}: expected a bool array of shape ({e},) (one flag per episode slot), got {got}")
        return mask

    def _where_of_meta(self, where):
        """`where(meta)`; a meta field the buffer does not declare raises `TypeError` naming `where` and the fields (as
        `add_episode` and `update` refuse unknown fields)."""
        try:
            return where(self.meta)
        except KeyError as e:
            if not e.args or e.args[0] in self.meta:
                raise
            raise TypeError(f"where(meta): no meta field {e.args[0]!r}; the buffer declares {sorted(self.meta)} "
                           "(create(..., meta=...))") from None

    def _passing(self, mask) -> jax.Array:
        """bool `[max_episodes]`: the slots holding an episode that passes `mask` (None: every held slot)."""
        held = jnp.arange(self.max_episodes) < self.num_valid
        return held if mask is None else held & jnp.asarray(mask)

    def _sequence_length(self, sequence_length) -> int:
        sequence_length = _validate.static_int("sequence_length", sequence_length)
        if sequence_length > self.max_timesteps:
            raise ValueError(f"sequence_length: expected at most max_timesteps={self.max_timesteps}, got {sequence_length}")
        return sequence_length

    def can_sample(self, batch_size: int, *, where=None) -> jax.Array:
        """Whether `sample_episodes`, `sample_timesteps` and `sample_transitions` with this filter return only
        valid data (bool scalar): some stored episode passes `where` (module doc)."""
        _validate.static_int("batch_size", batch_size)
        return self._any(self._filter(where), 1)

    def can_sample_transitions(self, batch_size: int, *, n_step: int = 1, gamma=None, where=None) -> jax.Array:
        """Whether `sample_transitions` with these arguments returns only valid data (bool scalar): `can_sample`.
        `sample_transitions`' arguments without the key (`gamma` optional here: checked when given); same errors."""
        _validate.static_int("n_step", n_step, maximum=self.max_timesteps)
        if gamma is not None:
            self._transition_args(n_step, gamma)
        return self.can_sample(batch_size, where=where)

    def can_sample_sequences(self, batch_size: int, sequence_length: int, *, where=None) -> jax.Array:
        """Whether `sample_sequences` with these arguments returns only valid data (bool scalar): some episode
        passing `where` holds at least `sequence_length` steps."""
        _validate.static_int("batch_size", batch_size)
        return self._any(self._filter(where), self._sequence_length(sequence_length))

    @_compiled.method("min_length")
    def _any(self, mask, min_length: int) -> jax.Array:
        return jnp.any(self._passing(mask) & (self.lengths >= min_length))

    def sample_episodes(self, key: jax.Array, batch_size: int, *, where=None) -> EpisodeSample:
        """Sample `batch_size` whole episodes, uniformly with replacement over the stored episodes passing `where`.

        Args:
          key: PRNG key.
          batch_size: static int >= 1.
          where: filter (module doc).

        Returns:
          `EpisodeSample`, leaves `[batch_size, max_timesteps, ...]` padded with zeros, `mask` and `lengths`; empty
          rows (`indices` -1, `mask` all False) when `can_sample` is False (module doc).

        Raises:
          ValueError: `batch_size` not an int >= 1.
          TypeError: `where` not giving a bool `[max_episodes]`, or reading a meta field the buffer does not declare.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        return self._sample_episodes(_validate.key("key", key), batch_size, self._filter(where))

    @_compiled.method("batch_size")
    def _sample_episodes(self, key, batch_size: int, mask) -> EpisodeSample:
        ep, _, ok = _draw(key, batch_size, self._passing(mask).astype(jnp.int32))
        return _rows_or_empty(ok, self._episodes(ep))

    def sample_sequences(self, key: jax.Array, batch_size: int, sequence_length: int, *, where=None) -> EpisodeSequenceSample:
        """Sample `batch_size` windows of `sequence_length` consecutive steps, each inside one episode.

        Uniform with replacement over every window `[s, s + L)` with `s + L <= length` of the episodes passing
        `where` (an episode of length `l` holds `max(l - L + 1, 0)` windows); an O(max_episodes) draw.

        Args:
          key: PRNG key.
          batch_size: static int >= 1.
          sequence_length: static int in `[1, max_timesteps]`.
          where: filter (module doc).

        Returns:
          `EpisodeSequenceSample`; empty rows (`indices` -1, zeros) when `can_sample_sequences` is False (module doc).

        Raises:
          ValueError: a size not an int >= 1 or `sequence_length > max_timesteps`.
          TypeError: `where` not giving a bool `[max_episodes]`, or reading a meta field the buffer does not declare.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        sequence_length = self._sequence_length(sequence_length)
        return self._sample_sequences(_validate.key("key", key), batch_size, sequence_length, self._filter(where))

    @_compiled.method("batch_size", "sequence_length")
    def _sample_sequences(self, key, batch_size: int, sequence_length: int, mask) -> EpisodeSequenceSample:
        counts = jnp.where(self._passing(mask), jnp.maximum(self.lengths - sequence_length + 1, 0), 0)
        ep, start, ok = _draw(key, batch_size, counts)
        t = start[:, None] + jnp.arange(sequence_length, dtype=jnp.int32)  # [B, L]
        term, trunc = self._step_flags(ep[:, None], t)
        return _rows_or_empty(ok, EpisodeSequenceSample(
            item=jax.tree.map(lambda x: x[ep[:, None], t], self.storage), terminated=term, truncated=trunc,
            next_obs=self._next_obs(ep, start + sequence_length), meta=self._meta(ep), indices=ep, starts=start,
            generations=self._generations(ep),
        ))

    def sample_timesteps(self, key: jax.Array, batch_size: int, *, where=None) -> EpisodeStepSample:
        """Sample `batch_size` steps, uniformly with replacement over every step of the episodes passing `where`.

        Args:
          key: PRNG key.
          batch_size: static int >= 1.
          where: filter (module doc).

        Returns:
          `EpisodeStepSample`; empty rows (`indices` -1, zeros) when `can_sample` is False (module doc).

        Raises:
          ValueError: `batch_size` not an int >= 1.
          TypeError: `where` not giving a bool `[max_episodes]`, or reading a meta field the buffer does not declare.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        return self._sample_timesteps(_validate.key("key", key), batch_size, self._filter(where))

    @_compiled.method("batch_size")
    def _sample_timesteps(self, key, batch_size: int, mask) -> EpisodeStepSample:
        ep, t, ok = _draw(key, batch_size, jnp.where(self._passing(mask), self.lengths, 0))
        term, trunc = self._step_flags(ep, t)
        return _rows_or_empty(ok, EpisodeStepSample(
            item=jax.tree.map(lambda x: x[ep, t], self.storage), next_obs=self._next_obs(ep, t + 1),
            terminated=term, truncated=trunc, meta=self._meta(ep), indices=ep, steps=t, generations=self._generations(ep),
        ))

    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma, where=None) -> EpisodeTransitionSample:
        r"""Sample `batch_size` n-step transitions, uniformly with replacement over every step of the episodes
        passing `where`.

        From step $t$ of an episode of length $L$, $k = \min(n, L - t)$ rewards are used:

        $$
        G_t = \sum_{i=0}^{k-1} \gamma^i r_{t+i}, \qquad
        \text{discount}_t = \gamma^k (1 - \text{terminated}_{t+k-1}),
        $$

        with `terminated` set only at the last step of a terminated episode (`jaxbuffers.trajectory.n_step_window`,
        the same conventions as `TrajectoryBuffer.sample_transitions`). `next_obs` is $obs_{t+k}$: the stored step
        $t + k$, or the episode's final observation when $t + k = L$ (never a reset observation).

        Args:
          key: PRNG key.
          batch_size: static int >= 1.
          n_step: static int in `[1, max_timesteps]`.
          gamma: discount in [0, 1], a number or 0-d array (may be traced). Required.
          where: filter (module doc).

        Returns:
          `EpisodeTransitionSample`; empty rows (`indices` -1, `num_steps` 0, `window_mask` all False, zeros)
          when `can_sample` is False (module doc).

        Raises:
          ValueError: a size not an int >= 1, `n_step > max_timesteps`, a concrete `gamma` outside [0, 1].
          TypeError: `gamma` missing or not a number, `where` not giving a bool `[max_episodes]`, or reading a meta field the buffer does not declare.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        n_step = self._transition_args(n_step, gamma)
        return self._sample_transitions(_validate.key("key", key), batch_size, n_step, gamma, self._filter(where))

    def _transition_args(self, n_step, gamma) -> int:
        """`n_step` as an int in `[1, max_timesteps]`, after checking `gamma` (required, in [0, 1])."""
        n_step = _validate.static_int("n_step", n_step, maximum=self.max_timesteps)
        if gamma is None:
            raise TypeError("gamma: required (a float in [0, 1] or a 0-d float array)")
        _validate.scalar_parameter("gamma", gamma, 0.0, 1.0)
        return n_step

    @_compiled.method("batch_size", "n_step", scalars=GAMMA)
    def _sample_transitions(self, key, batch_size: int, n_step: int, gamma, mask) -> EpisodeTransitionSample:
        ep, t, ok = _draw(key, batch_size, jnp.where(self._passing(mask), self.lengths, 0))
        return _rows_or_empty(ok, self._transitions(ep, t, n_step, gamma))

    def transitions_at(self, indices, steps, *, n_step: int = 1, gamma) -> EpisodeTransitionSample:
        """The n-step transitions from step `steps[b]` of episode slot `indices[b]` (int `[B]` each):
        `transitions_at(s.indices, s.steps, n_step=n, gamma=g)` equals the sample `s` of `sample_transitions` (one
        with rows drawn: not its empty rows). Indices are clipped into range. Raises as `sample_transitions` and for non-integer or non-1-D indices."""
        n_step = self._transition_args(n_step, gamma)
        return self._transitions_at(*positions(indices, steps), n_step, gamma)

    @_compiled.method("n_step", scalars=GAMMA)
    def _transitions_at(self, ep, t, n_step: int, gamma) -> EpisodeTransitionSample:
        ep = jnp.clip(ep, 0, self.max_episodes - 1)
        return self._transitions(ep, jnp.clip(t, 0, self.max_timesteps - 1), n_step, gamma)

    # ------------------------------------------------------------------------------------------
    # reads at given slots

    def _generations(self, ep) -> jax.Array:
        """Generation of episode slots `ep` (int32, in range): the number, modulo `2**32`, of the episode last written
        there (`_ring.last_item_number`); what `update(..., generations=)` compares."""
        return _ring.last_item_number(self.added, self.head, ep, self.max_episodes)

    def _meta(self, ep) -> dict:
        return {k: v[ep] for k, v in self.meta.items()}

    def _episodes(self, ep) -> EpisodeSample:
        lengths = self.lengths[ep]
        return EpisodeSample(
            item=jax.tree.map(lambda x: x[ep], self.storage),
            mask=jnp.arange(self.max_timesteps, dtype=jnp.int32)[None, :] < lengths[:, None], lengths=lengths,
            terminated=self.terminated[ep], truncated=self.truncated[ep],
            final_obs=jax.tree.map(lambda x: x[ep], self.final_obs), meta=self._meta(ep), indices=ep.astype(jnp.int32),
            generations=self._generations(ep),
        )

    def _step_flags(self, ep, t):
        """Step flags (bool, shape of `t`): the last step carries the episode's flags."""
        last = t == self.lengths[ep] - 1
        return last & self.terminated[ep], last & self.truncated[ep]

    def _next_obs(self, ep, t):
        """`obs_t` of episodes `ep` (shape [B]), the final observation where `t` is the episode's length."""
        at_end = t >= self.lengths[ep]
        stored = jax.tree.map(lambda x: x[ep, jnp.minimum(t, self.max_timesteps - 1)], self.storage[self.obs_key])
        final = jax.tree.map(lambda x: x[ep], self.final_obs)
        return jax.tree.map(lambda f, s: jnp.where(expand_mask(at_end, s.ndim), f, s), final, stored)

    def _transitions(self, ep, t, n_step: int, gamma) -> EpisodeTransitionSample:
        tw = t[:, None] + jnp.arange(n_step, dtype=jnp.int32)  # [B, n]
        inside = tw < self.lengths[ep][:, None]
        tc = jnp.minimum(tw, self.max_timesteps - 1)
        epw = ep[:, None]
        term, trunc = self._step_flags(epw, tw)
        ends = tw >= self.lengths[ep][:, None] - 1  # the last step and beyond: a window never leaves its episode
        reward = self.storage[self.reward_key][epw, tc]
        ret, discount, k = n_step_window(reward, term, ends & ~term, gamma)
        window = jax.tree.map(lambda x: jnp.where(expand_mask(inside, x.ndim), x[epw, tc], 0), self.storage)
        item = jax.tree.map(lambda x: x[ep, t], self.storage)
        return EpisodeTransitionSample(
            obs=item[self.obs_key], action=item[self.action_key], n_step_return=ret, discount=discount,
            next_obs=self._next_obs(ep, t + k), num_steps=k, item=item, window=window,
            window_mask=jnp.arange(n_step, dtype=jnp.int32)[None, :] < k[:, None], meta=self._meta(ep),
            indices=ep.astype(jnp.int32), steps=t.astype(jnp.int32), generations=self._generations(ep),
        )


def positions(indices, steps) -> tuple[jax.Array, jax.Array]:
    """`(indices, steps)` of `transitions_at`: integer vectors of one length."""
    ep, t = _validate.index_vector("indices", indices), _validate.index_vector("steps", steps)
    if ep.shape != t.shape:
        raise ValueError(f"steps: expected shape {tuple(ep.shape)} like indices, got {tuple(t.shape)}")
    return ep, t


def expand_mask(mask: jax.Array, ndim: int) -> jax.Array:
    """`mask` with trailing unit axes up to `ndim` dimensions (to select between arrays with feature axes)."""
    return mask.reshape(mask.shape + (1,) * (ndim - mask.ndim))


def _draw(key, batch_size: int, counts: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Uniform draw over the units of `counts` (int32 `[E]`, units per episode): `(episode, unit)` int32 `[B]` and
    `ok` (bool scalar: some unit exists).

    Unit `r` of the running total is episode `searchsorted(cumsum, r, 'right')` at offset `r - (cumsum - count)`;
    with no unit at all every draw is `(0, 0)` and `ok` is False.
    """
    cum = jnp.cumsum(counts)
    r = jax.random.randint(key, (batch_size,), 0, jnp.maximum(cum[-1], 1), jnp.int32)
    ep = jnp.searchsorted(cum, r, side="right").astype(jnp.int32)
    ep = jnp.where(cum[-1] > 0, jnp.minimum(ep, counts.shape[0] - 1), 0)
    unit = jnp.where(cum[-1] > 0, r - (cum[ep] - counts[ep]), 0)
    return ep, unit.astype(jnp.int32), cum[-1] > 0


def _rows_or_empty(ok: jax.Array, sample):
    """`sample` when `ok` (bool scalar), else its empty rows (module doc): `indices` -1, every other field zero."""
    empty = jax.tree.map(jnp.zeros_like, sample)._replace(indices=jnp.full_like(sample.indices, -1))
    return jax.tree.map(lambda x, z: jnp.where(ok, x, z), sample, empty)
