"""A read-only, episode-aware view of any jaxbuffers buffer, for the command-line tools.

`BufferView(buffer)` lists the stored steps of a buffer in a fixed order and cuts them into episodes:

* `ReplayBuffer`, `PrioritisedReplayBuffer`: items oldest to newest. Episodes come from a top-level boolean
  `terminated` / `truncated` / `done` leaf of the item, when it has one; otherwise there are none.
* `TrajectoryBuffer`, `PrioritisedTrajectoryBuffer` and their compressed variants: lane by lane, each lane's steps
  oldest to newest, cut after every step whose `terminated` or `truncated` flag is set.
* `RolloutBuffer`, `CompressedRolloutBuffer`: env by env, the rows written, cut at the flags likewise.
* `EpisodeBuffer`, `CompressedEpisodeBuffer`: the stored episodes, oldest first, each of its stored length.

Episode `k` of the tools is `episodes[k]` in that order. An episode is *partial* when the buffer does not hold its
first step (it was overwritten, precedes the buffer, or the buffer cannot tell: a lane's oldest step once older
steps were overwritten, a rollout's first row) or its last one (it has not ended yet).

Observations are read exactly as stored: a compressed buffer decodes them through its own decoder, so frame stacks are
rebuilt as sampling rebuilds them (`jaxbuffers.compressed.trajectory`, frame-stack dedup).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _validate
from jaxbuffers.compressed import (
    CompressedEpisodeBuffer, CompressedPrioritisedTrajectoryBuffer, CompressedRolloutBuffer, CompressedTrajectoryBuffer,
)
from jaxbuffers.episode import EpisodeBuffer
from jaxbuffers.prioritised import PrioritisedReplayBuffer
from jaxbuffers.prioritised_trajectory import PrioritisedTrajectoryBuffer
from jaxbuffers.replay import ReplayBuffer
from jaxbuffers.rollout import RolloutBuffer
from jaxbuffers.trajectory import TrajectoryBuffer

__all__ = ["BufferView", "Episode", "ViewError", "field_name", "SUPPORTED"]

#: the buffer types the tools read (a subclass is read as its base)
SUPPORTED = (
    ReplayBuffer, PrioritisedReplayBuffer, TrajectoryBuffer, PrioritisedTrajectoryBuffer, RolloutBuffer, EpisodeBuffer,
    CompressedTrajectoryBuffer, CompressedPrioritisedTrajectoryBuffer, CompressedRolloutBuffer, CompressedEpisodeBuffer,
)
SUPPORTED_NAMES = tuple(c.__name__ for c in SUPPORTED)

_DECODE_CHUNKS = (64, 2048)  # steps decoded per host call: small requests, bulk reads (one compiled program each)
_FLAG_NAMES = ("terminated", "truncated", "done")


class ViewError(ValueError):
    """A request the buffer cannot answer (an episode out of range, no image field...); the message names the
    argument, what was expected and what came."""


@dataclasses.dataclass(frozen=True)
class Episode:
    """One episode (or the part of it the buffer holds)."""

    index: int  # k: position in `BufferView.episodes`
    lane: int  # env lane, episode slot (EpisodeBuffer) or -1 (item replay)
    positions: np.ndarray  # int64 [length]: the episode's steps, as positions in the view's step order
    terminated: bool  # ended by termination
    truncated: bool  # ended by truncation (and not termination)
    has_start: bool  # the buffer holds the episode's first step
    has_end: bool  # the buffer holds its last step (an end flag, or a stored EpisodeBuffer episode)

    @property
    def length(self) -> int:
        return int(len(self.positions))

    @property
    def partial(self) -> bool:
        return not (self.has_start and self.has_end)


def is_floating(dtype: Any) -> bool:
    """Whether a field's dtype is floating: numpy's and the extended ones JAX stores (bfloat16, float8), which
    numpy's own `np.issubdtype(dtype, np.floating)` does not count."""
    return bool(jnp.issubdtype(dtype, jnp.floating))


def is_numeric(dtype: Any, bools: bool = True) -> bool:
    """Whether a field holds real numbers (`is_floating`, integers of any width JAX stores) or, with `bools`,
    bools: what has a min, max and mean."""
    return bool(is_floating(dtype) or jnp.issubdtype(dtype, jnp.integer) or (bools and jnp.issubdtype(dtype, jnp.bool_)))


def field_name(path) -> str:
    """`obs.pixels`, `action`, `0.reward`: a leaf path written with dots."""
    parts = []
    for k in path:
        parts.append(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))))
    return ".".join(parts) or "value"


def _split(lanes: np.ndarray, ends: np.ndarray) -> list[tuple[int, int, int]]:
    """(lane, start, stop) runs of positions: a new run at each lane change and after each end."""
    n = len(lanes)
    last = np.asarray(ends, bool).copy()
    if n:
        last[:-1] |= lanes[1:] != lanes[:-1]
        last[-1] = True
    stops = np.flatnonzero(last) + 1
    starts = np.concatenate([[0], stops[:-1]]).astype(np.int64)
    return [(int(lanes[a]), int(a), int(b)) for a, b in zip(starts, stops)]


class BufferView:
    """Steps, fields, episodes and images of a buffer (module doc), all as numpy arrays.

    Args:
      buffer: a jaxbuffers buffer, not stacked (no vmapped leading axes).

    Raises:
      ViewError: a buffer type the tools do not read, or a stacked buffer.
    """

    def __init__(self, buffer: Any):
        self.buffer = buffer
        self.kind = type(buffer).__name__
        b = buffer
        stack = _validate.member_axes(b)
        if stack:
            raise ViewError(f"buffer: a stacked (vmapped) {self.kind} of stack shape {stack}; expected a single buffer "
                            f"(index one member out first)")
        self.compressed = isinstance(b, (CompressedTrajectoryBuffer, CompressedRolloutBuffer, CompressedEpisodeBuffer))
        if isinstance(b, (CompressedTrajectoryBuffer,)):
            traj = b.trajectory
        elif isinstance(b, PrioritisedTrajectoryBuffer):
            traj = b.buffer
        elif isinstance(b, TrajectoryBuffer):
            traj = b
        else:
            traj = None
        self._extra: dict[str, np.ndarray] = {}  # per-step fields beside the step's own: flags, values...
        self.meta: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # per-episode meta fields (EpisodeBuffer)
        if traj is not None:
            self._init_trajectory(traj)
        elif isinstance(b, (RolloutBuffer, CompressedRolloutBuffer)):
            self._init_rollout(b.buffer if isinstance(b, CompressedRolloutBuffer) else b)
        elif isinstance(b, (EpisodeBuffer, CompressedEpisodeBuffer)):
            self._init_episodes(b.buffer if isinstance(b, CompressedEpisodeBuffer) else b)
        elif isinstance(b, (ReplayBuffer, PrioritisedReplayBuffer)):
            self._init_replay(b.replay if isinstance(b, PrioritisedReplayBuffer) else b)
        else:
            raise ViewError(f"buffer: expected one of the types the tools read ({', '.join(SUPPORTED_NAMES)}), "
                            f"got a {self.kind}")
        if self.compressed:
            self._spec = b.step_spec  # the decoded fields, not the ids stored on device
        self.num_steps = int(len(self._index[0]))
        self._cache: dict[str, np.ndarray] = {}
        self.leaves = {self._name(p): x for p, x in jax.tree_util.tree_flatten_with_path(self._storage)[0]}
        self.specs = {self._name(p): x for p, x in jax.tree_util.tree_flatten_with_path(self._spec)[0]}
        self.compressed_fields = self._compressed_names()

    # --- per-kind layout: self._storage (leaves with leading step axes), self._index (arrays into them), flags ---

    def _init_replay(self, r: ReplayBuffer) -> None:
        head, n, cap = int(r.head), int(r.num_valid), r.capacity
        slots = (head - n + np.arange(n)) % cap
        self._storage, self._spec, self._index = r.storage, r.item_spec, (slots,)
        self.held_label, self.added_unit = "items held", "items"
        flags = {}
        if isinstance(r.storage, dict):
            for k in _FLAG_NAMES:
                x = r.storage.get(k)
                if x is not None and np.ndim(x) == 1 and x.dtype == jnp.bool_:
                    flags[k] = np.asarray(x)[slots]
        lanes = np.full(n, -1)
        if flags:
            ends = np.zeros(n, bool)
            for v in flags.values():
                ends |= v
            term = flags.get("terminated", flags.get("done", np.zeros(n, bool)))
            self._episodes_from_runs(lanes, ends, term, flags.get("truncated", np.zeros(n, bool)),
                                     first_start=r.num_added() == n)
        else:
            self.episodes = []
        self.flags_from = tuple(flags)

    def _init_trajectory(self, t: TrajectoryBuffer) -> None:
        head, n, E, L = int(t.head), int(t.num_valid), t.num_envs, t.length
        slots = np.tile((head - n + np.arange(n)) % L, E)
        lanes = np.repeat(np.arange(E), n)
        self._storage, self._spec, self._index = t.storage, t.step_spec, (lanes, slots)
        self.held_label, self.added_unit = f"steps held (all {E} lanes)", "steps per lane"
        term, trunc = np.asarray(t.terminated)[lanes, slots], np.asarray(t.truncated)[lanes, slots]
        self._extra.update(terminated=term, truncated=trunc)
        self._episodes_from_runs(lanes, term | trunc, term, trunc, first_start=t.num_added() == n)
        self.flags_from = ("terminated", "truncated")

    def _init_rollout(self, r: RolloutBuffer) -> None:
        T, N = int(r.step_index), r.num_envs
        rows, envs = np.tile(np.arange(T), N), np.repeat(np.arange(N), T)
        self._storage, self._spec, self._index = r.step, r.step_spec, (rows, envs)
        self.held_label, self.added_unit = f"steps held (all {N} envs)", None
        for k in ("reward", "value", "terminated", "truncated", "final_value", "trainable", "advantages", "returns"):
            self._extra[k] = np.asarray(getattr(r, k))[rows, envs]
        term, trunc = self._extra["terminated"], self._extra["truncated"]
        self._episodes_from_runs(envs, term | trunc, term, trunc, first_start=False)  # a rollout starts mid-episode
        self.flags_from = ("terminated", "truncated")

    def _init_episodes(self, e: EpisodeBuffer) -> None:
        head, n, M = int(e.head), int(e.num_valid), e.max_episodes
        order = (head - n + np.arange(n)) % M
        lengths = np.asarray(e.lengths)[order]
        slots = np.repeat(order, lengths)
        ts = np.concatenate([np.arange(x) for x in lengths]) if n else np.zeros(0, int)
        self._storage, self._spec, self._index = e.storage, e.step_spec, (slots, ts)
        self.held_label, self.added_unit = f"steps held (all {n} episodes)", "episodes"
        # meta field -> (its value for each held episode [n, *shape], its default)
        self.meta = {k: (np.asarray(x)[order], np.asarray(e.meta_defaults[k])) for k, x in e.meta.items()}
        term_ep, trunc_ep = np.asarray(e.terminated)[order], np.asarray(e.truncated)[order]
        last = np.zeros(len(slots), bool)
        ends = np.cumsum(lengths) - 1
        last[ends[lengths > 0]] = True
        self._extra["terminated"] = last & np.repeat(term_ep, lengths)
        self._extra["truncated"] = last & np.repeat(trunc_ep, lengths)
        for name, x in e.meta.items():
            self._extra[f"meta.{name}"] = np.repeat(np.asarray(x)[order], lengths, axis=0)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
        self.episodes = [
            Episode(k, int(order[k]), np.arange(starts[k], starts[k] + lengths[k]), bool(term_ep[k]),
                    bool(trunc_ep[k] and not term_ep[k]), True, True)
            for k in range(n)
        ]
        self.flags_from = ("lengths",)

    def _episodes_from_runs(self, lanes, ends, term, trunc, first_start: bool) -> None:
        self.episodes = []
        prev_lane = None
        for lane, a, b in _split(lanes, ends):
            has_start = first_start or lane == prev_lane  # a lane's first run starts a new episode only if nothing was lost
            prev_lane = lane
            self.episodes.append(Episode(len(self.episodes), lane, np.arange(a, b), bool(term[b - 1]),
                                         bool(trunc[b - 1] and not term[b - 1]), bool(has_start), bool(ends[b - 1])))

    def _name(self, path) -> str:
        """A step field's name; `step.<name>` where the buffer has a per-step field of its own so named (a
        `terminated` leaf beside a trajectory's flags)."""
        name = field_name(path)
        return f"step.{name}" if name in self._extra else name

    def _compressed_names(self) -> tuple[str, ...]:
        if not self.compressed:
            return ()
        b = self.buffer
        if isinstance(b, (CompressedTrajectoryBuffer, CompressedEpisodeBuffer)):
            obs_key = b.obs_key if isinstance(b, CompressedEpisodeBuffer) else b.trajectory.obs_key
            sub = jax.tree_util.tree_flatten_with_path(b.step_spec[obs_key])[0]
            return tuple(".".join([obs_key, field_name(sub[i][0])]) if sub[i][0] else obs_key for i in b.leaf_index)
        flat = jax.tree_util.tree_flatten_with_path(b.step_spec)[0]
        return tuple(self._name(flat[i][0]) for i in b.leaf_index)

    # --- reading ---

    @property
    def fields(self) -> list[str]:
        """Names of the per-step fields: the step's (or item's) leaves, then the buffer's own per-step fields."""
        return list(self.specs) + [k for k in self._extra if k not in self.specs]

    def spec(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """(shape of one step's value, dtype) of a field: as `add` takes it (compressed leaves decoded to their stored
        bytes, also under `normalize_images`)."""
        if name in self.specs:
            s = self.specs[name]
            if name in self.compressed_fields and self.buffer.normalize_images:
                return tuple(s.shape), np.dtype(np.uint8)  # the stored bytes, not the float32 samples
            return tuple(s.shape), np.dtype(s.dtype)
        x = self._extra[name]
        return tuple(x.shape[1:]), x.dtype

    def column(self, name: str, positions: np.ndarray | None = None) -> np.ndarray:
        """Values of field `name` at `positions` (default: every stored step), `[n, *shape]`."""
        if name not in self.specs and name not in self._extra:
            raise ViewError(f"field: expected one of {self.fields}, got {name!r}")
        pos = np.arange(self.num_steps) if positions is None else np.asarray(positions, np.int64)
        if name in self._extra:
            return self._extra[name][pos]
        if name in self.compressed_fields:
            return self._decode(name, pos)
        if name not in self._cache:
            self._cache[name] = np.asarray(self.leaves[name])
        return self._cache[name][tuple(ix[pos] for ix in self._index)]

    def _decode(self, name: str, pos: np.ndarray) -> np.ndarray:
        """Decoded values of a compressed field, in fixed-size chunks (`_DECODE_CHUNKS`) so that every request
        reuses one of two compiled decoders."""
        b = self.buffer
        chunk = _DECODE_CHUNKS[0] if len(pos) <= _DECODE_CHUNKS[0] else _DECODE_CHUNKS[1]
        j = self.compressed_fields.index(name)
        shape, dtype = self.spec(name)
        out = np.empty((len(pos), *shape), np.uint8 if b.normalize_images else dtype)
        for a in range(0, len(pos), chunk):
            part = pos[a : a + chunk]
            padded = np.concatenate([part, np.full(chunk - len(part), part[0])])
            ix = tuple(i[padded] for i in self._index)
            if isinstance(b, CompressedTrajectoryBuffer):
                key = b.trajectory.obs_key
                obs = jax.tree.map(lambda x: np.asarray(x)[ix], b.trajectory.storage[key])
                leaf = jax.tree.leaves(b.decode_obs(obs))[b.leaf_index[j]]
            elif isinstance(b, CompressedEpisodeBuffer):  # (episode slot, step): the stored observation of that step
                at = b.transitions_at(jnp.asarray(ix[0], jnp.int32), jnp.asarray(ix[1], jnp.int32), gamma=1.0)
                leaf = jax.tree.leaves(at.obs)[b.leaf_index[j]]
            else:
                flat = ix[0] * b.num_envs + ix[1]
                leaf = jax.tree.leaves(b.gather(jnp.asarray(flat, jnp.int32)).step)[b.leaf_index[j]]
            x = np.asarray(leaf)[: len(part)]
            if b.normalize_images:  # decoded as x * (1/255): the stored bytes come back exactly
                x = np.rint(x * 255.0).astype(np.uint8)
            out[a : a + len(part)] = x
        return out

    def episode(self, k: int, name: str = "--episode") -> Episode:
        """Episode `k`, or ViewError naming `name` (the option or query parameter that gave `k`) and the range."""
        n = len(self.episodes)
        if not isinstance(k, (int, np.integer)) or not 0 <= k < n:
            what = f"an episode number in [0, {n - 1}]" if n else "no episode number: this buffer holds no episodes"
            raise ViewError(f"{name}: expected {what}, got {k!r}")
        return self.episodes[k]

    def step_labels(self) -> tuple[np.ndarray, np.ndarray]:
        """(episode number, step within the episode) of every stored step, int64 `[num_steps]` each (-1 outside
        any episode)."""
        ep, t = np.full(self.num_steps, -1, np.int64), np.full(self.num_steps, -1, np.int64)
        for e in self.episodes:
            ep[e.positions] = e.index
            t[e.positions] = np.arange(e.length)
        return ep, t
