r"""Whole-episode storage: `EpisodeBuffer` (its samplers and sample types: `jaxbuffers.episode_sampling`).

Layout: `max_episodes` episode slots of `max_timesteps` steps, leaves `[max_episodes, max_timesteps, ...]`, with the
per-episode `lengths` (int32, in `[0, max_timesteps]`; 0 for a slot never written), the episode's end flags, its
*final observation* (the observation after its last step) and its *meta* fields (one value per episode, e.g. a task
id, declared at `create` with a dtype, a shape and a default). Steps `[length, max_timesteps)` of a slot are zeros.
Episode slots form one ring (`jaxbuffers._ring`): `head` is the slot the next episode goes to, `num_valid` the
episodes held; until the ring is full the valid slots are `[0, num_valid)`.

Step convention (`docs/guide.md`, section 2): step `t` of an episode is the transition
`obs_t --action_t--> obs_{t+1}`, a dict with at least `obs`, `action` and a floating scalar `reward` (names
configurable in `create`), plus any extras. An episode of length $L$ ends after step $L - 1$, by termination
(`terminated`: $obs_L$ is terminal, no bootstrap), by truncation (`truncated`, e.g. a time limit: bootstrap from
$obs_L$) or by neither (a cut made by the collector; bootstrapped like a truncation). Both flags set counts as
terminated (Gymnasium's rule). $obs_L$ is given to `add_episode` as `final_obs` and kept, so the step after the
last one never reads a reset observation. The step flags of a stored episode are derived: step $L - 1$ carries the
episode's flags, and is an episode end for the samplers whatever they are (a window never leaves its episode).

Positions: a step is addressed by `episode * max_timesteps + t` (int32), an episode by its slot.

Full buffer. `circular=True` (default) replaces the oldest episode. `circular=False` keeps the first
`max_episodes` episodes: an add that does not fit writes nothing at all. Called eagerly it raises `ValueError`
(the buffer is unchanged); inside `jit`, where no value can raise, it returns the buffer unchanged except for the
sticky flag `overflowed`, which the caller can test (`buf.overflowed`) after the step.

Sampling (`jaxbuffers.episode_sampling`, methods of `EpisodeBuffer`): whole episodes, sequences, timesteps and
n-step transitions, each with a meta filter `where`; when nothing passes, `can_sample` is False and the samplers
return empty rows (`indices` -1, every other field zero).

Example:

```python
import jax, jax.numpy as jnp
import jaxbuffers as jb

step = {"obs": jnp.zeros(3), "action": jnp.int32(0), "reward": jnp.float32(0)}
buf = jb.EpisodeBuffer.create(step, max_episodes=100, max_timesteps=50, meta={"task_id": jnp.int32(0)})
ep = jax.tree.map(lambda x: jnp.stack([x] * 20), step)            # 20 steps, leaves [20, ...]
buf = buf.add_episode(ep, 20, terminated=True, final_obs=jnp.ones(3), meta={"task_id": jnp.int32(1)})
eps = buf.sample_episodes(jax.random.key(0), 8, where=lambda m: m["task_id"] == 1)   # eps.item [8, 50, ...], eps.mask
tr = buf.sample_transitions(jax.random.key(1), 256, n_step=3, gamma=0.99)
```

References:
  Sutton & Barto (2018), *Reinforcement Learning: An Introduction*, section 7.1 (n-step returns);
  Gymnasium's `terminated` / `truncated` API.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuffers import _compiled, _ring, _validate
from jaxbuffers._metrics import Metrics, Recorded
from jaxbuffers.episode_sampling import (
    EpisodeSample, EpisodeSampling, EpisodeSequenceSample, EpisodeStepSample, EpisodeTransitionSample, expand_mask,
)

__all__ = [
    "EpisodeBuffer", "EpisodeSample", "EpisodeSequenceSample", "EpisodeStepSample", "EpisodeTransitionSample",
    "BufferFullError",
]

class BufferFullError(ValueError):
    """An eager add to a fixed (`circular=False`) `EpisodeBuffer` that has no room for the episodes given."""


def _is_traced(x) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(x))


@_validate.one_member_methods
class EpisodeBuffer(EpisodeSampling, Recorded, struct.PyTreeNode):
    """Whole episodes with lengths, end flags, final observations and meta fields; episode, sequence, step and
    n-step sampling with meta filters.

    Module doc: layout, step convention, full-buffer policy; `jaxbuffers.episode_sampling`: filters, empty rows. Every method is pure; it works under `jit`
    (donated: in place), `lax.scan` and `vmap`, and eagerly runs as one cached compiled program
    (`jaxbuffers._compiled`).
    """

    _cursor = "head"  # the leaf that is a scalar in one buffer (stacked with jax.vmap: `jaxbuffers._validate.members`)

    storage: Any  # step dict, leaves [max_episodes, max_timesteps, *shape], example dtypes; zeros past each length
    lengths: jax.Array  # shape=[max_episodes], dtype=int32: steps of the episode in each slot, 0 if never written
    terminated: jax.Array  # shape=[max_episodes], dtype=bool: the episode ended by termination
    truncated: jax.Array  # shape=[max_episodes], dtype=bool: the episode ended by truncation (and not termination)
    final_obs: Any  # obs pytree, leaves [max_episodes, *obs_shape]: the observation after each episode's last step
    meta: dict  # {name: [max_episodes, *shape]}, declared dtypes: per-episode meta fields
    meta_defaults: dict  # {name: [*shape]}, declared dtypes: the value a field takes when an add omits it
    head: jax.Array  # shape=(), dtype=int32: slot the next episode goes to, in [0, max_episodes)
    num_valid: jax.Array  # shape=(), dtype=int32: episodes stored, in [0, max_episodes]
    added: jax.Array  # shape=[2], dtype=int32: episodes ever added, two-word counter (_ring.counter_*)
    overflowed: jax.Array  # shape=(), dtype=bool: some add to a fixed buffer found no room and wrote nothing (sticky)
    metrics: Metrics  # usage counters; sample_count [max_episodes] by episode slot (jaxbuffers._metrics)
    max_episodes: int = struct.field(pytree_node=False)
    max_timesteps: int = struct.field(pytree_node=False)
    circular: bool = struct.field(pytree_node=False)
    obs_key: str = struct.field(pytree_node=False)
    action_key: str = struct.field(pytree_node=False)
    reward_key: str = struct.field(pytree_node=False)

    @classmethod
    @_validate.keyword_sizes
    def create(
        cls, example_step: Mapping, *, max_episodes: int, max_timesteps: int, meta: Mapping | None = None,
        circular: bool = True, obs_key: str = "obs", action_key: str = "action", reward_key: str = "reward",
        metrics: bool = True,
    ) -> "EpisodeBuffer":
        """An empty buffer of `max_episodes` episodes of up to `max_timesteps` steps.

        Args:
          example_step: one step (no leading axes): a dict with at least `obs_key` (a pytree of arrays),
            `action_key` and `reward_key` (a floating scalar), plus any extras. Arrays or `jax.ShapeDtypeStruct`;
            dtypes are stored exactly.
          max_episodes: episode slots (Python int >= 1).
          max_timesteps: steps per slot (Python int >= 1); `max_episodes * max_timesteps` must fit int32.
          meta: `{name: default}` of the per-episode fields, each default an array (its dtype and shape are the
            field's, its value the default), e.g. `{"task_id": jnp.int32(-1), "goal": jnp.zeros(2)}`; a
            `jax.ShapeDtypeStruct` declares a field whose default is zeros.
          circular: static bool: replace the oldest episode when full (True) or refuse adds (False; module doc).
          obs_key: name of the observation field.
          action_key: name of the action field.
          reward_key: name of the reward field.
          metrics: static bool: keep per-episode sample counts (`jaxbuffers._metrics`; int32 `[max_episodes]`, on
            by default; ages count episodes).

        Raises:
          TypeError: `example_step` or `meta` not a dict, a leaf not an array, `circular` or `metrics` not a bool,
            the reward not of a floating dtype (or not one array).
          ValueError: a size not a positive int or the product above `2**31 - 1`, a required field missing, the
            reward not a scalar, a meta field named like a step field.
        """
        e = _validate.static_int("max_episodes", max_episodes)
        m = _validate.static_int("max_timesteps", max_timesteps)
        if e * m > 2**31 - 1:
            raise ValueError(
                f"max_episodes * max_timesteps: expected at most 2**31 - 1 steps in all (positions are int32 "
                f"episode * max_timesteps + t), got {e} * {m} = {e * m}"
            )
        circular = _validate.static_bool("circular", circular)
        _, _, spec = _validate.trajectory_example(example_step, 1, 1, obs_key, action_key, reward_key)
        meta = {} if meta is None else meta
        if not isinstance(meta, Mapping) or not all(isinstance(k, str) for k in meta):
            raise TypeError(f"meta: expected a dict {{name: default array}} with str names, got {meta!r:.80}")
        if set(meta) & set(spec):  # `update` takes both kinds of field by name
            raise ValueError(f"meta: names {sorted(set(meta) & set(spec))} are step fields too; name the meta fields apart")
        mspec = _validate.item_spec(dict(meta), "meta") if meta else {}
        # copies: a leaf of the buffer must not be the caller's array (donating the buffer would delete it)
        defaults = {k: jnp.zeros(v.shape, v.dtype) if isinstance(v, jax.ShapeDtypeStruct) else jnp.array(v, copy=True) for k, v in meta.items()}
        return cls(
            storage=jax.tree.map(lambda s: jnp.zeros((e, m, *s.shape), s.dtype), spec),
            lengths=jnp.zeros((e,), jnp.int32), terminated=jnp.zeros((e,), bool), truncated=jnp.zeros((e,), bool),
            final_obs=jax.tree.map(lambda s: jnp.zeros((e, *s.shape), s.dtype), spec[obs_key]),
            meta={k: jnp.broadcast_to(defaults[k], (e, *s.shape)).astype(s.dtype) for k, s in mspec.items()},
            meta_defaults=defaults, head=jnp.int32(0), num_valid=jnp.int32(0), added=_ring.counter_zero(),
            overflowed=jnp.bool_(False), metrics=Metrics.create((e,), metrics), max_episodes=e, max_timesteps=m, circular=circular, obs_key=obs_key,
            action_key=action_key, reward_key=reward_key,
        )

    def _metrics_ring(self):
        return self.metrics, self.added, self.head, self.num_valid, self.max_episodes, 1

    # ------------------------------------------------------------------------------------------
    # shape information

    @property
    def step_spec(self) -> Any:
        """Pytree of `jax.ShapeDtypeStruct`: one step (no leading axes), as `example_step` in `create`."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[2:], x.dtype), self.storage)

    @property
    def meta_spec(self) -> dict:
        """`{name: jax.ShapeDtypeStruct}` of one episode's meta fields."""
        return {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in self.meta.items()}

    @property
    def memory_bytes(self) -> int:
        """Bytes of every array held (steps, lengths, flags, final observations, meta, cursors), Python int."""
        return _validate.tree_nbytes(self)

    @_compiled.method()
    def size(self) -> jax.Array:
        """The number of steps stored, summed over the stored episodes (int32 scalar)."""
        return jnp.sum(self.lengths, dtype=jnp.int32)

    @_compiled.method()
    def num_episodes(self) -> jax.Array:
        """The number of episodes stored (int32 scalar), in `[0, max_episodes]`."""
        return self.num_valid

    @_compiled.method()
    def is_full(self) -> jax.Array:
        """Whether every slot holds an episode (bool scalar): a further add replaces the oldest (`circular`) or
        is refused."""
        return self.num_valid >= self.max_episodes

    def num_added(self) -> int:
        """Exact number of episodes ever added (host-side Python int; a stacked state: one member at a time)."""
        return _ring.counter_value(self.added)

    # ------------------------------------------------------------------------------------------
    # adding

    def add_episode(
        self, episode: Mapping, length, *, terminated, truncated=False, final_obs, meta: Mapping | None = None,
        split_long: bool = False,
    ) -> "EpisodeBuffer":
        """Add one episode.

        Args:
          episode: step dict like the example step, leaves `[T, ...]` (exactly the stored dtypes); steps
            `[length, T)` are ignored (padding).
          length: the episode's steps, a Python int or int 0-d array in `[1, T]` (`T` the time axis given; a
            concrete value outside it raises). A traced one (under `jit`, `vmap`, `lax.scan`) is clipped into
            `[0, T]` silently: a length <= 0 adds nothing (the buffer comes back unchanged, `num_added()` does not
            grow: the one trace it leaves), a length > T stores the episode as one of length `T` (its `T` steps,
            flags and `final_obs`), which nothing tells apart afterwards. Check traced lengths in the program
            where they may fall outside `[1, T]`.
          terminated: bool (Python or 0-d array): the last step's `obs_{t+1}` is terminal.
          truncated: bool: the episode was cut after its last step (time limit).
          final_obs: obs pytree like `episode[obs_key]` without the time axis: the observation after the last step
            (before any auto-reset).
          meta: `{name: value}` of declared meta fields (0-d or the field's shape, exactly its dtype; a Python
            scalar of the field's kind is accepted); omitted fields take their default.
          split_long: static bool. With `T > max_timesteps`, False refuses the episode; True stores it as
            `ceil(length / max_timesteps)` episodes, each cut but the last recorded as truncated with the next
            part's first observation as its final observation (the last keeps the episode's flags).

        Returns:
          The new buffer. Cost O(max_timesteps * parts); in place when donated. Called eagerly, one compiled
          program per shape and set of meta fields given.

        Raises:
          BufferFullError: (a `ValueError`) eager add to a full fixed buffer; the buffer is unchanged.
          TypeError: wrong structure or dtype, flags not bool, an unknown meta field.
          ValueError: wrong shapes, `T > max_timesteps` without `split_long`, a concrete `length` outside `[1, T]`.
        """
        args = self._checked_add(self.step_spec, False, episode, length, terminated, truncated, final_obs, meta)
        return self._add_checked(*args, split_long, False)

    def add_episodes(
        self, episodes: Mapping, lengths, *, terminated, truncated=None, final_obs, meta: Mapping | None = None,
        split_long: bool = False,
    ) -> "EpisodeBuffer":
        """Add a batch of `B` episodes: `add_episode` with a leading axis on every argument.

        Args:
          episodes: step dict, leaves `[B, T, ...]`.
          lengths: int `[B]`, each in `[1, T]` (traced: clipped as in `add_episode`, episode by episode; one of
            length <= 0 takes no slot, and the others take consecutive slots as if it were not given).
          terminated: bool `[B]`.
          truncated: bool `[B]`, or None (no episode truncated).
          final_obs: obs pytree, leaves `[B, ...]`.
          meta: `{name: [B, ...]}`; omitted fields take their default.
          split_long: static bool, as in `add_episode`.

        Returns:
          The new buffer; the episodes take slots in batch order. Cost O(B * max_timesteps).

        Raises:
          BufferFullError: eager add to a fixed buffer without room for all of them; the buffer is unchanged.
          TypeError: as `add_episode`.
          ValueError: as `add_episode`.
        """
        args = self._checked_add(self.step_spec, True, episodes, lengths, terminated, truncated, final_obs, meta)
        return self._add_checked(*args, split_long, True)

    def _checked_add(self, spec, batched: bool, episodes, lengths, terminated, truncated, final_obs, meta) -> tuple:
        """The arguments of `add_episode` (`add_episodes` when `batched`) checked against the step `spec` (the
        buffer's own, or the one its user sees when a wrapper stores other leaves), with their errors:
        `(episodes, lengths, terminated, truncated, final_obs, meta)`."""
        name, lname = ("episodes", "lengths") if batched else ("episode", "length")
        if not isinstance(episodes, Mapping):
            raise TypeError(f"{name}: expected a dict like the example step, got {type(episodes).__name__}")
        *lead, t = _validate.check_batch(spec, dict(episodes), 1 + batched, name, ("B", "T")[1 - batched:])
        lead = tuple(lead)
        if 0 in lead:
            raise ValueError(f"{name}: expected at least one episode (B >= 1), got leading axes {list(lead)}")
        lengths = _validate.episode_lengths(lname, lengths, lead, t)
        terminated = _validate.flag("terminated", terminated, lead)
        truncated = np.zeros(lead, bool) if truncated is None else _validate.flag("truncated", truncated, lead)
        final_obs = self._final_obs_arg(spec[self.obs_key], final_obs, len(lead), lead)
        return dict(episodes), lengths, terminated, truncated, final_obs, meta_values(self.meta_spec, meta, lead)

    def _final_obs_arg(self, obs_spec, final_obs, nd: int, lead: tuple):
        """`final_obs` checked against the observation spec with `nd` leading axes `lead`."""
        if final_obs is None:
            raise TypeError(f"final_obs: required: the observation after the last step, shaped like the step's {self.obs_key!r} field")
        _validate.final_obs_not_step(obs_spec, self.obs_key, final_obs)
        got = _validate.check_batch(obs_spec, final_obs, nd, "final_obs", ("B",))
        if tuple(got) != tuple(lead):
            raise ValueError(f"final_obs: expected leading axes {list(lead)} (one observation per episode), got {list(got)}")
        return final_obs

    def _check_time(self, episodes, split_long, batched: bool) -> bool:
        """`split_long` as a bool, after refusing a time axis longer than `max_timesteps` without it."""
        split_long = _validate.static_bool("split_long", split_long)
        t = jax.tree.leaves(episodes)[0].shape[int(batched)]
        if t > self.max_timesteps and not split_long:
            raise ValueError(
                f"episode: time axis of {t} steps is longer than max_timesteps={self.max_timesteps}; slice it to its "
                f"length, create the buffer with max_timesteps >= {t}, or pass split_long=True to store it in parts"
            )
        return split_long

    def _full_error(self, batched: bool) -> BufferFullError:
        return BufferFullError(
            f"add_episode{'s' if batched else ''}: the fixed buffer (circular=False) holds {int(self.num_valid)} of max_episodes="
            f"{self.max_episodes} episodes and has no room for the ones given; nothing was written"
        )

    def _add_checked(self, episodes, lengths, terminated, truncated, final_obs, meta, split_long, batched) -> "EpisodeBuffer":
        self._check_time(episodes, split_long, batched)
        new, refused = self._write(episodes, lengths, terminated, truncated, final_obs, meta, batched)
        if not self.circular and not _is_traced((self, new)) and bool(refused):  # a circular add never refuses
            raise self._full_error(batched)
        return new

    @_compiled.method("batched")
    def _write(self, episodes, lengths, terminated, truncated, final_obs, meta, batched: bool):
        """Write checked episodes (`_rows`, then `_put`). Returns `(buffer, refused)`."""
        new, refused, _ = self._put(self._rows(episodes, lengths, terminated, truncated, final_obs, meta, batched))
        return new, refused

    def _rows(self, episodes, lengths, terminated, truncated, final_obs, meta, batched: bool) -> dict:
        """The slot rows of checked episodes (leaves `[B, T, ...]`, any `T`; one episode without the `B` axis when
        not `batched`): each split into `parts = ceil(T / max_timesteps)` parts, padded with zeros past its length.
        Meta fields not given take their default. Returns `{field: [B * parts, ...]}` for the fields `storage`,
        `lengths`, `terminated`, `truncated`, `final_obs` and `meta` (a part of length 0 is not written)."""
        if not batched:
            episodes, lengths, terminated, truncated, final_obs, meta = jax.tree.map(
                lambda v: jnp.asarray(v)[None], (episodes, lengths, terminated, truncated, final_obs, meta))
        lengths, terminated, truncated = (jnp.asarray(x) for x in (lengths, terminated, truncated))
        m = self.max_timesteps
        b, t = lengths.shape[0], jax.tree.leaves(episodes)[0].shape[1]
        meta = {k: jnp.broadcast_to(jnp.asarray(meta[k]) if k in meta else d, (b, *d.shape)) for k, d in self.meta_defaults.items()}
        parts = -(-t // m)
        lengths = jnp.clip(lengths, 0, t)
        pad = lambda x: jnp.pad(x, [(0, 0), (0, parts * m - t)] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
        steps = jax.tree.map(lambda x: pad(jnp.asarray(x)).reshape(b * parts, m, *x.shape[2:]), episodes)
        i = jnp.arange(parts, dtype=jnp.int32)[None, :]
        part_len = jnp.clip(lengths[:, None] - i * m, 0, m)  # [B, parts]
        last = i == (lengths[:, None] - 1) // m  # the part holding the episode's last step
        # a part cut by the split ends by truncation; its final obs is the next part's first observation
        nxt = jax.tree.map(lambda x: pad(jnp.asarray(x))[:, jnp.minimum((i[0] + 1) * m, parts * m - 1)], episodes[self.obs_key])
        fin = jax.tree.map(lambda f, n: jnp.where(expand_mask(last, n.ndim), jnp.asarray(f)[:, None], n), final_obs, nxt)
        flat = lambda x: x.reshape(b * parts, *x.shape[2:])  # noqa: E731
        rows = dict(
            storage=jax.tree.map(lambda x: jnp.where(expand_mask(jnp.arange(m) < flat(part_len)[:, None], x.ndim), x, 0), steps),
            lengths=flat(part_len), terminated=flat(last & terminated[:, None]),
            truncated=flat(~last | (truncated[:, None] & ~terminated[:, None])),
            final_obs=jax.tree.map(flat, fin),
            meta={k: flat(jnp.broadcast_to(v[:, None], (b, parts, *v.shape[1:]))) for k, v in meta.items()},
        )
        return rows

    def _put(self, rows: dict) -> tuple["EpisodeBuffer", jax.Array, jax.Array]:
        """Scatter the rows of `_rows` with a length >= 1 into consecutive ring slots, or none of them when a fixed
        buffer has no room. Returns `(buffer, refused, slots)`: `slots` int32 `[R]` is each row's slot, or a value
        `>= max_episodes` for a row not written."""
        e = self.max_episodes
        write = rows["lengths"] > 0
        n = jnp.sum(write, dtype=jnp.int32)
        refused = jnp.bool_(False) if self.circular else self.num_valid + n > e
        write = write & ~refused
        slot, keep, head = _ring.final_slots(self.head[None], write[None], e)  # ring slots handed out in order
        cols = jnp.where(keep[0], slot[0], e + jnp.arange(write.shape[0], dtype=jnp.int32))  # dropped rows: past the end
        put = lambda s, x: s.at[cols].set(x, mode="drop", unique_indices=True)  # noqa: E731
        state = dict(storage=self.storage, lengths=self.lengths, terminated=self.terminated, truncated=self.truncated,
                     final_obs=self.final_obs, meta=self.meta)
        state = jax.tree.map(put, state, rows)
        n = jnp.sum(write, dtype=jnp.int32)
        new = self.replace(
            **state, head=head[0], num_valid=jnp.minimum(self.num_valid + n, e).astype(jnp.int32),
            added=_ring.counter_add(self.added, n), overflowed=self.overflowed | refused, metrics=self.metrics.written_at(cols),
        )
        return new, refused, cols.astype(jnp.int32)

    # ------------------------------------------------------------------------------------------
    # in-place edits and reads

    def update(self, indices, fields: Mapping, *, steps=None, generations=None) -> "EpisodeBuffer":
        """Overwrite fields of stored episodes (reward relabelling, hindsight goal relabelling).

        Pass the sample's `generations` when episodes may have been added since the sample was drawn: a row is then
        written only if its slot still holds a stored episode of that generation, and skipped otherwise (an episode
        that overwrote the slot is left as it is; `PrioritisedReplayBuffer.set_priorities`' rule). Without
        `generations` every row in range is written to whatever episode its slot holds now.

        Args:
          indices: int `[B]`, episode slots (e.g. a sample's `indices`); slots outside `[0, max_episodes)` are
            ignored. With repeated slots one of their values is written.
          fields: `{name: values}` of step fields (names of the example step) and meta fields. Without `steps`:
            step fields `[B, max_timesteps, ...]` (whole episodes; values past a length are stored as given but
            never sampled), meta fields `[B, ...]`. With `steps`: step fields `[B, ...]`, one step each.
          steps: optional int `[B]`, the step `t` of each episode to overwrite (e.g. a sample's `steps`); steps
            outside `[0, max_timesteps)` are ignored.
          generations: optional int `[B]`, the sample's `generations` (`jaxbuffers.episode_sampling`, Generations):
            rows whose slot no longer holds that episode, or holds none, are skipped.

        Returns:
          The new buffer, in place when donated; lengths, flags and final observations are unchanged.

        Raises:
          TypeError: an unknown field, a wrong dtype, a meta field with `steps`, non-integer indices or generations.
          ValueError: wrong shapes.
        """
        if not isinstance(fields, Mapping):
            raise TypeError(f"fields: expected a dict {{name: values}}, got {type(fields).__name__}")
        indices = _validate.index_vector("indices", indices)
        b = indices.shape[0]
        unknown = sorted(set(fields) - set(self.storage) - set(self.meta), key=str)
        if unknown:
            raise TypeError(f"fields: unknown names {unknown}; step fields are {sorted(self.storage)}, meta fields {sorted(self.meta)}")
        step_f = {k: v for k, v in fields.items() if k in self.storage}
        meta_f = {k: v for k, v in fields.items() if k not in self.storage}
        spec = self.step_spec
        if steps is not None:
            if meta_f:
                raise TypeError(f"fields: meta fields {sorted(meta_f)} are per episode; update them without steps=")
            steps = _validate.index_vector("steps", steps)
            if steps.shape[0] != b:
                raise ValueError(f"steps: expected shape ({b},) like indices, got {tuple(steps.shape)}")
        lead = (b,) if steps is not None else (b, self.max_timesteps)
        for k, v in step_f.items():
            got = _validate.check_batch(spec[k], v, len(lead), f"fields[{k!r}]", ("B", "max_timesteps"))
            if tuple(got) != lead:
                raise ValueError(f"fields[{k!r}]: expected leading axes {list(lead)}, got {list(got)}")
        for k, v in meta_f.items():
            s = self.meta_spec[k]
            _validate.array(f"fields[{k!r}]", v, (b, *s.shape), s.dtype)
        if generations is not None:
            generations = _validate.vector("generations", generations, b, "integer")
        return self._update(indices, step_f, meta_f, steps, generations)

    @_compiled.method()
    def _update(self, indices, step_f, meta_f, steps, generations):
        e, m = self.max_episodes, self.max_timesteps
        ok = (indices >= 0) & (indices < e)
        if generations is not None:  # the slot still holds the episode sampled
            slot = jnp.clip(indices, 0, e - 1)
            held = _ring.physical_to_logical(slot, self.head, self.num_valid, e) < self.num_valid
            ok = ok & held & (self._generations(slot) == generations.astype(jnp.int32))
        ep = jnp.where(ok, indices, e)  # out of range or stale: dropped
        if steps is None:
            storage = {**self.storage, **{k: self.storage[k].at[ep].set(v, mode="drop") for k, v in step_f.items()}}
        else:
            t = jnp.where((steps >= 0) & (steps < m), steps, m)
            storage = {**self.storage, **{k: self.storage[k].at[ep, t].set(v, mode="drop") for k, v in step_f.items()}}
        meta = {**self.meta, **{k: self.meta[k].at[ep].set(v, mode="drop") for k, v in meta_f.items()}}
        return self.replace(storage=storage, meta=meta)

    @_compiled.method()
    def get_all(self) -> EpisodeSample:
        """Every slot, oldest episode first: an `EpisodeSample` with `B = max_episodes`; slots not holding an
        episode come last, with length 0 and an all-False mask."""
        e = self.max_episodes
        slots = _ring.logical_to_physical(jnp.arange(e, dtype=jnp.int32), self.head, self.num_valid, e)
        held = jnp.arange(e) < self.num_valid
        out = self._episodes(slots)
        return out._replace(lengths=jnp.where(held, out.lengths, 0), mask=out.mask & held[:, None])

def meta_values(meta_spec: Mapping, meta, lead: tuple = ()) -> dict:
    """The meta fields given to an add, checked against `meta_spec` (`{name: jax.ShapeDtypeStruct}`), leaves
    `[*lead, *shape]` (fields not given are left out: the add gives them their default).

    A value is an array of exactly the field's dtype and shape `[*lead, *shape]`, or a Python scalar of the
    field's kind (bool for bool fields; int for integer or floating fields; float for floating fields), which
    is given to every episode of the add.

    Raises:
      TypeError: `meta` not a dict, an unknown name, a wrong dtype or kind.
      ValueError: a wrong shape; a Python int the field's dtype does not hold exactly.
    """
    meta = {} if meta is None else meta
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta: expected a dict {{name: value}}, got {type(meta).__name__}")
    unknown = sorted(set(meta) - set(meta_spec), key=str)
    if unknown:
        raise TypeError(f"meta: unknown fields {unknown}; the buffer declares {sorted(meta_spec)} (create(..., meta=...))")
    out = {}
    for k, s in meta_spec.items():
        want, name, dtype = (*lead, *s.shape), f"meta[{k!r}]", np.dtype(s.dtype)
        v = meta.get(k, None)
        if v is None:
            continue
        if isinstance(v, (bool, int, float)):
            kinds = "b" if isinstance(v, bool) else "iuf" if isinstance(v, int) else "f"
            if dtype.kind not in kinds:
                raise TypeError(f"{name}: expected a value of dtype {dtype}, got {type(v).__name__} {v!r}")
            if dtype.kind in "iu" and not isinstance(v, bool) and not np.iinfo(dtype).min <= v <= np.iinfo(dtype).max:
                raise ValueError(f"{name}: expected a value {dtype} holds, in [{np.iinfo(dtype).min}, {np.iinfo(dtype).max}], got {v}")
            if dtype.kind == "f":
                with np.errstate(over="ignore"):
                    x = np.asarray(float(v) if abs(v) < 2**1024 else math.inf, dtype)
                if math.isfinite(v) and not np.isfinite(x):
                    raise ValueError(f"{name}: expected a value {dtype} holds (at most {float(np.finfo(dtype).max)} in size), got {v}")
                if isinstance(v, int) and np.isfinite(x) and int(x) != v:
                    raise ValueError(f"{name}: expected an int {dtype} holds exactly, got {v} (it would be rounded to {int(x)}); "
                                     "pass a float to accept the rounding")
            out[k] = np.broadcast_to(np.asarray(v, dtype) if dtype.kind != "f" else x, want)
            continue
        out[k] = _validate.array(name, v, want, dtype)
    return out
