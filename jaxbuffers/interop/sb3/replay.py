"""SB3-compatible replay buffers backed by `jaxbuffers.ReplayBuffer`, one item per SB3 row (`[rows, n_envs, ...]`).

Semantics, compression (`compress=`) and the differences from SB3: `docs/api/sb3.md`, "Replay buffers".
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, DictReplayBuffer, ReplayBuffer
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from jaxbuffers import _ring, _validate, checkpoint
from jaxbuffers import replay as _replay
from jaxbuffers.interop.sb3 import _common

__all__ = ["JaxReplayBuffer", "JaxDictReplayBuffer", "FieldView", "sb3_replay_nbytes"]


# The adapter owns its state, so the add donates it (in place, O(row); else a copy of the storage per step).
@functools.partial(jax.jit, donate_argnums=0, static_argnames=("next_in_obs",))
def _add_row(state: _replay.ReplayBuffer, row: Any, next_obs: Any, next_in_obs: bool) -> _replay.ReplayBuffer:
    state = state.add(jax.tree.map(lambda x: x[None], row))
    if next_in_obs:  # optimize_memory_usage: next_obs goes to the next row's observation slot
        obs = _ring.write(state.storage["observations"], jax.tree.map(lambda x: x[None], next_obs), state.head)
        state = state.replace(storage={**state.storage, "observations": obs})
    return state


# The compressed adapter's staged rows, added by one compiled program whatever their number: of the queue's rows
# `[Q, ...]` the first `count` are written as `count` one-row adds would write them (the newest `capacity` of them),
# the others dropped. One program per number of rows would compile up to log2(Q) + 1 of them, each paying a compile
# and the resident memory of its code.
@functools.partial(jax.jit, donate_argnums=0)
def _add_staged(state: _replay.ReplayBuffer, rows: dict, count: jax.Array) -> _replay.ReplayBuffer:
    q, cap = jax.tree.leaves(rows)[0].shape[0], state.capacity
    i = jnp.arange(q, dtype=jnp.int32)
    slots = jnp.where((i < count) & (i >= count - cap), (state.head + i) % cap, cap + i)  # out of range (dropped), distinct
    storage = jax.tree.map(lambda s, x: s.at[slots].set(x, mode="drop"), state.storage, rows)
    head, num_valid = _ring.advance(state.head, state.num_valid, count, cap)
    return state.replace(storage=storage, head=head, num_valid=num_valid, added=_ring.counter_add(state.added, count),
                         metrics=state.metrics.written_at(slots))


# Reads at (row, env) pairs: `ReplayBuffer.get` reads whole rows (every env).
@functools.partial(jax.jit, static_argnames=("next_in_obs",))
def _gather(storage: dict, rows: jax.Array, envs: jax.Array, next_in_obs: bool) -> dict:
    out = jax.tree.map(lambda x: x[rows, envs], storage)
    if next_in_obs:
        out["next_observations"] = jax.tree.map(lambda x: x[(rows + 1) % x.shape[0], envs], storage["observations"])
    out["sb3_dones"] = (out["dones"] & ~out["timeouts"]).astype(jnp.float32)[:, None]
    out["rewards"] = out["rewards"][:, None]
    return out


def _where(xp: Any, held: Any, a: Any, b: Any) -> Any:
    """``a`` where ``held`` (``[B]``), else ``b`` (``[B, ...]``)."""
    return xp.where(held.reshape((-1,) + (1,) * (np.ndim(a) - 1)), a, b)


# A compressed sample is one compiled program: the gather, which rows hold their next observation, and the decode.
@jax.jit
def _gather_decoded(storage: dict, cbuf: Any, rows: jax.Array, envs: jax.Array, newest: jax.Array) -> tuple[dict, Any, Any, jax.Array]:
    g = _gather(storage, rows, envs, next_in_obs=False)
    held = (rows == newest) & ~g["dones"]  # the newest row's next observation is not stored unless its step ended an episode
    tr = cbuf.trajectory.transitions_at(envs * cbuf.trajectory.length + rows, n_step=1, gamma=1.0)
    nxt = jax.tree.map(lambda a, b: _where(jnp, held, a, b), tr.obs, tr.next_obs)  # a valid slot to decode where held
    obs, nxt = cbuf.decode_obs(tr.obs, nxt)
    return g, obs, nxt, held


def _timeout(value: Any, what: str) -> bool:
    """One ``TimeLimit.truncated`` as a bool, checked as ``done`` is (`_common.flags`), or an error naming ``what``."""
    a = _common.flags(_common.numbers(value, what), what)
    if a.shape != ():
        raise ValueError(f"{what}: expected one boolean, got shape {a.shape}")
    return bool(a)


class FieldView:
    """A numpy-like window on one stored field, in SB3's layout ``[rows, n_envs, ...]`` and dtype: ``np.asarray(view)``
    and ``view[k]`` read a host copy; ``view[k] = v`` writes through to the device storage (a copy of the field)."""

    def __init__(self, name: str, dtype: Any, read: Callable[[], jax.Array], write: Callable[[jax.Array], None]):
        self._name, self._dtype, self._read, self._write = name, np.dtype(dtype), read, write

    @property
    def shape(self) -> tuple:
        """SB3's shape of the field, `(rows, n_envs, ...)`."""
        return tuple(self._read().shape)

    @property
    def dtype(self) -> np.dtype:
        """SB3's dtype of the field (float32 for flags, int64 for Discrete actions ...)."""
        return self._dtype

    __len__ = lambda self: self.shape[0]  # noqa: E731
    __getitem__ = lambda self, key: np.asarray(self)[key]  # noqa: E731

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.array(self._read()).astype(self._dtype if dtype is None else dtype, copy=False)

    def __setitem__(self, key, value) -> None:
        """Write ``value`` at ``key`` as SB3's numpy assignment would, checked as ``add`` checks values.

        Raises:
          ValueError: flags other than 0 / 1, or a finite value overflowing a float field.
          TypeError: non-numbers, or a value an integer field or one narrower than SB3's does not hold exactly.
        """
        arr = np.array(self._read())
        arr[key] = _common.stored(_common.numbers(value, self._name), arr.dtype, self._name, arr.dtype != self._dtype)
        self._write(jnp.asarray(arr))

    def __repr__(self) -> str:
        return f"FieldView({self._name}, shape={self.shape}, dtype={self._dtype})"


# Attributes that __setstate__ rebuilds from the checkpoint bytes instead of unpickling them.
_REBUILT = ("_rows_state", "_row_queue", "_writer", "_pending", "_pending_bytes", "_rows", "_step_ends")
_ROW_QUEUE = 256  # compressed adapter: SB3 rows staged on the host before one device add (`_add_staged`)
_MAX_PENDING = 128  # compressed adapter: the default `max_pending`
_COMPRESS_OPTIONS = {"codec", "delta_codec", "keyframe_interval", "frame_stack", "stack_axis", "padding", "chunk_bytes",
                     "max_pending", "keys"}


def _compress_options(compress: bool | dict) -> dict | None:
    """Options of the compressed observation store (None: off)."""
    if compress is False or compress is None:
        return None
    compress = {} if compress is True else compress
    if not isinstance(compress, dict):
        raise TypeError(f"compress: expected a bool or a dict of options, got {type(compress).__name__}")
    if set(compress) - _COMPRESS_OPTIONS:
        raise ValueError(f"compress: unknown options {sorted(set(compress) - _COMPRESS_OPTIONS)}; expected some of {sorted(_COMPRESS_OPTIONS)}")
    return {"padding": "zero", **compress}  # SB3's VecFrameStack fills a new episode's stack with zeros


def sb3_replay_nbytes(buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space, n_envs: int = 1,
                      optimize_memory_usage: bool = False) -> int:
    """Bytes SB3's own ``ReplayBuffer`` / ``DictReplayBuffer`` allocates for these arguments: ``rows * n_envs * (obs
    [* 2 unless optimize_memory_usage] + actions + 3 * 4)`` with ``rows = max(buffer_size // n_envs, 1)``:
    observations in the space's dtype, actions ``[action_dim]`` (float64 kept as float32), rewards, dones and
    timeouts as float32 (the allocation; its resident size grows as SB3 fills the buffer)."""
    shape = get_obs_shape(observation_space)
    obs = sum(jax.tree.leaves(_common.per_key(lambda sp, s, _: int(np.prod(s)) * np.dtype(sp.dtype).itemsize, observation_space, shape)))
    act = get_action_dim(action_space) * _common.sb3_float32(action_space.dtype).itemsize
    return max(buffer_size // n_envs, 1) * n_envs * (obs * (1 if optimize_memory_usage else 2) + act + 3 * 4)


class _JaxReplayImpl:
    """Shared implementation of the two replay classes (mixed in before SB3's class)."""

    _samples_type: type = ReplayBufferSamples

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space, device: th.device | str = "auto",
                 n_envs: int = 1, optimize_memory_usage: bool = False, handle_timeout_termination: bool = True, compress: bool | dict = False):
        buffer_size, n_envs = _validate.static_int("buffer_size", buffer_size), _validate.static_int("n_envs", n_envs)
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        _common.check_space_kind(self, DictReplayBuffer, observation_space)
        optimize_memory_usage = _validate.static_bool("optimize_memory_usage", optimize_memory_usage)
        handle_timeout_termination = _validate.static_bool("handle_timeout_termination", handle_timeout_termination)
        if optimize_memory_usage and handle_timeout_termination:
            raise ValueError("optimize_memory_usage=True and handle_timeout_termination=True cannot be combined (as in SB3: the "
                             "next observation of a timeout would be the next episode's first one); pass handle_timeout_termination=False")
        if optimize_memory_usage and isinstance(observation_space, spaces.Dict):
            raise ValueError("optimize_memory_usage: not supported with Dict observations (as in SB3's DictReplayBuffer)")
        if compress and optimize_memory_usage:
            raise ValueError("compress: supported with optimize_memory_usage=False (it stores each frame once); got optimize_memory_usage=True")
        self.optimize_memory_usage, self.handle_timeout_termination = optimize_memory_usage, handle_timeout_termination
        self.compress = _compress_options(compress)
        n = self.n_envs
        self._rows = _common.Rows(observation_space, action_space, n, _common.sb3_float32(action_space.dtype))
        flag = jax.ShapeDtypeStruct((n,), np.bool_)
        spec = {"observations": self._rows.obs, "actions": self._rows.action,
                "rewards": jax.ShapeDtypeStruct((n,), np.float32), "dones": flag, "timeouts": flag}
        if self.compress is not None:
            del spec["observations"]  # observations live in the compressed buffer
            self._writer = self._new_compressed()
            self._pending = None  # host [n_envs, *obs_shape] (a dict for Dict spaces): the newest row's next observation
            self._step_ends = None  # the constant leaves of the writer's flat step before and after the observation's
        elif not self.optimize_memory_usage:
            spec["next_observations"] = self._rows.obs
        self._state = _replay.ReplayBuffer.create(spec, capacity=self.buffer_size)

    # With ``compress`` the SB3 rows are staged on the host (`_stage_row`) and added when something reads the state.
    @property
    def _state(self) -> _replay.ReplayBuffer:
        queue = self.__dict__.get("_row_queue")
        if queue is not None and queue[1]:
            (rows, filled), state = queue, self.__dict__["_rows_state"]
            self._row_queue = None  # the next add stages into new arrays: the device add may still read these
            self.__dict__["_rows_state"] = _add_staged(state, rows, np.int32(filled))
        return self.__dict__["_rows_state"]

    @_state.setter
    def _state(self, state: _replay.ReplayBuffer) -> None:
        self.__dict__["_rows_state"], self._row_queue = state, None

    def _stage_row(self, row: dict) -> None:
        """Stage one checked row for the next device add (``_row_queue``: ``(arrays [_ROW_QUEUE, ...], filled)``)."""
        queue = self._row_queue
        if queue is None:
            queue = ({k: np.zeros((_ROW_QUEUE, *x.shape), x.dtype) for k, x in row.items()}, 0)  # zeros: rows past the count
        rows, k = queue
        for dst, x in zip(rows.values(), row.values()):  # one order: every row is made by `add`
            dst[k] = x  # a copy: the row may be a view of the caller's arrays
        self._row_queue = (rows, k + 1)
        if k + 1 == _ROW_QUEUE:
            self._state  # noqa: B018 (adds the staged rows)

    def _new_compressed(self):
        from jaxbuffers.compressed import CompressedTrajectoryBuffer, StagingWriter

        opts = dict(self.compress)
        obs = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), self._rows.obs)
        example = {"obs": obs, "action": np.uint8(0), "reward": np.float32(0)}  # unused: the row store holds these
        max_pending = opts.pop("max_pending", max(1, min(_MAX_PENDING, self.buffer_size // 16)))
        keys = opts.pop("keys", None)  # the Dict keys to compress (None: all)
        buf = CompressedTrajectoryBuffer.create(example, num_envs=self.n_envs, length=self.buffer_size,
                                                compress=None if keys is None else tuple(keys), **opts)
        return StagingWriter(buf, max_pending=max_pending, donate=True)  # the adapter reads its state only right away

    @property
    def jax_buffer(self) -> _replay.ReplayBuffer:
        """The backing `jaxbuffers.ReplayBuffer`: one item per SB3 row, leaves ``[rows, n_envs, ...]``. The next
        ``add`` donates these arrays: read it right away, or keep ``jax.tree.map(jnp.copy, buf.jax_buffer)``."""
        return self._state

    @property
    def nbytes(self) -> int:
        """Bytes held (a Python int): device arrays, plus the compressed buffer and staged steps with ``compress``."""
        extra = 0 if self.compress is None else self._writer.nbytes + sum(x.nbytes for x in jax.tree.leaves(self._pending))
        return self._state.memory_bytes + extra

    def _view(self, name: str, dtype: Any, key: str | None = None) -> FieldView:
        def read() -> jax.Array:
            leaf = self._state.storage[name]
            return leaf if key is None else leaf[key]

        def write(value: jax.Array) -> None:
            storage = dict(self._state.storage)
            storage[name] = value if key is None else {**storage[name], key: value}
            self._state = self._state.replace(storage=storage)

        return FieldView(name if key is None else f"{name}/{key}", dtype, read, write)

    def _obs_views(self, name: str) -> Any:
        if self.compress is not None:
            raise AttributeError(f"{name}: held compressed (compress=...); sample() decodes them")
        d = self._rows.obs_dtypes
        return {k: self._view(name, dk, k) for k, dk in d.items()} if isinstance(d, dict) else self._view(name, d)

    @property
    def observations(self) -> Any:
        """SB3's ``observations`` ``[rows, n_envs, *obs_shape]`` (a `FieldView`, a dict of them for Dict spaces)."""
        return self._obs_views("observations")

    @property
    def next_observations(self) -> Any:
        """SB3's ``next_observations`` (absent with ``optimize_memory_usage``, as in SB3)."""
        if self.optimize_memory_usage:
            raise AttributeError("next_observations: not stored with optimize_memory_usage=True (as in SB3)")
        return self._obs_views("next_observations")

    actions = property(lambda self: self._view("actions", self._rows.action_dtype), doc="SB3's ``actions`` ``[rows, n_envs, action_dim]`` in SB3's dtype.")
    rewards = property(lambda self: self._view("rewards", np.float32), doc="SB3's ``rewards`` ``[rows, n_envs]`` float32.")
    dones = property(lambda self: self._view("dones", np.float32), doc="SB3's ``dones`` ``[rows, n_envs]`` as float32 0/1.")
    timeouts = property(lambda self: self._view("timeouts", np.float32), doc="SB3's ``timeouts`` ``[rows, n_envs]`` as float32 0/1.")

    def reset(self) -> None:
        """Empty the buffer (``pos`` 0, not full); storage is kept, as in SB3."""
        super().reset()
        if self.compress is not None:
            self._writer.close()
            self._writer, self._pending = self._new_compressed(), None
        self._state = _common.with_ring_state(self._state, 0, 0, 0)

    def __getstate__(self) -> dict:
        """SB3's attributes plus the buffers as checkpoint bytes (`jaxbuffers.checkpoint.to_bytes`)."""
        state = {k: v for k, v in self.__dict__.items() if k not in _REBUILT}
        buffers = {"rows": self._state}
        if self.compress is not None:
            buffers["observations"] = self._writer.buffer  # flushes the staged steps
            pending = self._pending
            state["_pending"] = None if pending is None else [(x.tobytes(), list(x.shape), x.dtype.str) for x in jax.tree.leaves(pending)]
        state["_checkpoint"] = checkpoint.to_bytes(buffers)
        return state

    def __setstate__(self, state: dict) -> None:
        """Rebuild the buffers with ``__init__``'s arguments, then restore their contents from the checkpoint bytes.

        Raises:
          jaxbuffers.CheckpointError: the bytes are not a checkpoint of buffers with this configuration.
        """
        state = dict(state)
        data, pending = state.pop("_checkpoint"), state.pop("_pending", None)
        compress = state["compress"]
        _JaxReplayImpl.__init__(self, state["buffer_size"] * state["n_envs"], state["observation_space"],
                                state["action_space"], state["device"], compress=compress or False,
                                n_envs=state["n_envs"], optimize_memory_usage=state["optimize_memory_usage"],
                                handle_timeout_termination=state["handle_timeout_termination"])
        targets = {"rows": self._state}
        if compress is not None:
            targets["observations"] = self._writer.buffer
        restored = checkpoint.from_bytes(data, targets)
        self._state = restored["rows"]
        if compress is not None:
            from jaxbuffers.compressed import StagingWriter

            max_pending = self._writer.max_pending
            self._writer.close()
            self._writer = StagingWriter(restored["observations"], max_pending=max_pending, donate=True)
            if pending is not None:
                leaves = [np.frombuffer(raw, np.dtype(dtype)).reshape(shape) for raw, shape, dtype in pending]
                self._pending, self._pending_bytes = jax.tree.unflatten(jax.tree.structure(self._rows.obs), leaves), [raw for raw, _, _ in pending]
        self.__dict__.update(state)

    def add(self, obs: Any, next_obs: Any, action: np.ndarray, reward: np.ndarray, done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Store one transition per env (SB3's signature and semantics).

        ``obs`` ``[n_envs, *obs_shape]`` (a dict of them for Dict spaces); ``next_obs`` the same after the step (the
        terminal observation for envs that ended); ``action`` ``[n_envs, action_dim]`` or reshapeable to it;
        ``reward``, ``done`` ``[n_envs]``; ``infos`` ``n_envs`` dicts.

        Raises:
          ValueError: a wrong number of values, a layout SB3's assignment would refuse, or a done other than 0 / 1
            (the message names the argument).
          TypeError: an integer beyond the int32 an int64 field is held in.
        """
        n, rows = self.n_envs, self._rows
        obs_row = rows.observation(obs, "obs")
        fields = {"actions": rows.action_row(action), "rewards": _common.as_row(reward, (n,), _common.F32, "reward"),
                  "dones": _common.as_row(done, (n,), _common.BOOL, "done"), "timeouts": self._timeouts(infos)}
        next_row = rows.observation(next_obs, "next_obs")
        if self.compress is not None:
            self._add_compressed(obs_row, next_row, fields)
        else:
            fields["observations"] = obs_row
            if not self.optimize_memory_usage:
                fields["next_observations"] = next_row
            self._state = _add_row(self._state, fields, next_row if self.optimize_memory_usage else None, next_in_obs=self.optimize_memory_usage)
        self.pos = (self.pos + 1) % self.buffer_size
        self.full = self.full or self.pos == 0

    def _timeouts(self, infos: Any) -> np.ndarray:
        """``infos[i]["TimeLimit.truncated"]`` (False without ``handle_timeout_termination``), checked as ``done``."""
        n = self.n_envs
        if not self.handle_timeout_termination:
            return _common.zeros(n, np.bool_)
        if not (type(infos) is list and len(infos) == n and all(type(i) is dict for i in infos)):  # SB3's: checked at once
            if not isinstance(infos, (list, tuple)) or len(infos) != n or not all(isinstance(i, Mapping) for i in infos):
                got = f"a {type(infos).__name__} of {len(infos)}" if isinstance(infos, (list, tuple)) else type(infos).__name__
                raise ValueError(f"infos: expected a list of {n} dicts (one per env), got {got}")
        values = [info.get("TimeLimit.truncated", False) for info in infos]
        if all(type(v) is bool for v in values):  # gymnasium's: nothing to check
            return np.array(values)
        return np.array([_timeout(v, f"infos[{i}]['TimeLimit.truncated']") for i, v in enumerate(values)])

    def _add_compressed(self, obs_row: Any, next_row: Any, fields: dict) -> None:
        """Add checked rows (of the writer's spec) to the writer, every episode end as a truncation."""
        w, pending, moved = self._writer, self._pending, True
        if pending is not None:  # an env whose obs is not the previous row's next_obs: that row ends there
            moved = _common.differs(obs_row, pending, self._pending_bytes)
            if moved is not None:
                w.truncate_last(moved, final_obs=pending)
        if self._step_ends is None:  # the writer's flat step: [*head, *obs leaves, *tail] (placeholders around the obs)
            flat = w._treedef.flatten_up_to({"obs": obs_row, "action": _common.zeros(self.n_envs, np.uint8),
                                             "reward": _common.zeros(self.n_envs, np.float32)})
            self._step_ends = (flat[: w._obs_offset], flat[w._obs_offset + len(w._obs_leaves) :])
        head, tail = self._step_ends
        owned = moved is None  # obs is the held copy bit for bit: that read-only copy goes in, kept without a copy
        obs = pending if owned else obs_row
        obs_leaves = [obs] if type(obs) is np.ndarray else w._obs_treedef.flatten_up_to(obs)
        next_leaves = [next_row] if type(next_row) is np.ndarray else w._obs_treedef.flatten_up_to(next_row)
        w._add_checked([*head, *obs_leaves, *tail], _common.zeros(self.n_envs, np.bool_), fields["dones"], next_leaves, owned=owned)
        self._pending, self._pending_bytes = _common.frozen_obs(next_row)  # next_row may be a view of the caller's array
        self._stage_row(fields)

    def sample(self, batch_size: int, env: VecNormalize | None = None):
        """SB3's ``sample``: ``batch_size`` transitions drawn with ``np.random`` as SB3 draws them; ValueError for a
        ``batch_size`` not a Python int >= 1 (before anything is drawn)."""
        return super().sample(_validate.static_int("batch_size", batch_size), env=env)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None):
        # SB3's own `sample` (inherited) draws the rows and calls this, as SB3's `_get_samples` draws the envs.
        env_indices = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))
        return self.samples_at(batch_inds, env_indices, env=env)

    def samples_at(self, batch_inds: np.ndarray, env_indices: np.ndarray, env: VecNormalize | None = None):
        """SB3's ``_get_samples`` at rows ``batch_inds`` and envs ``env_indices`` (int arrays ``[B]``).

        Raises:
          ValueError: the two are not 1-d arrays of one length.
          IndexError: an index outside ``[0, rows)`` / ``[0, n_envs)`` or not of an integer dtype.
        """
        rows, envs = _common.indices(batch_inds, "batch_inds", self.buffer_size), _common.indices(env_indices, "env_indices", self.n_envs)
        if rows.shape != envs.shape:
            raise ValueError(f"batch_inds, env_indices: expected two 1-d arrays of one length, got {rows.shape} and {envs.shape}")
        if self.compress is not None and self._pending is None:
            raise IndexError("samples_at: the buffer is empty")
        rows, envs = rows.astype(np.int32), envs.astype(np.int32)
        if self.compress is not None:
            g, obs, nxt = self._decoded(rows, envs)
        else:
            g = _gather(self._state.storage, rows, envs, next_in_obs=self.optimize_memory_usage)
            obs, nxt = g.get("observations"), g.get("next_observations")
        rew, dtypes = g["rewards"], self._rows.obs_dtypes
        if env is not None:  # normalised on the host from SB3's dtypes, as SB3 does
            obs = self._normalize_obs(self._rows.to_sb3_obs(obs), env)
            nxt = self._normalize_obs(self._rows.to_sb3_obs(nxt), env)
            rew, dtypes = self._normalize_reward(np.asarray(rew), env), None
        fields = {"observations": obs, "actions": g["actions"], "next_observations": nxt, "dones": g["sb3_dones"], "rewards": rew}
        return self._samples_type(**_common.to_sb3(fields, self.device, {"observations": dtypes, "actions": self._rows.action_dtype,
                                                                          "next_observations": dtypes}))

    def _decoded(self, rows: np.ndarray, envs: np.ndarray) -> tuple[dict, Any, Any]:
        """The gathered fields and decoded ``(obs, next_obs)`` at (row, env) pairs (lane = env, slot = row)."""
        cbuf = self._writer.buffer  # flushes the staged steps first
        newest = np.int32((self.pos - 1) % self.buffer_size)
        g, obs, nxt, held = _gather_decoded(self._state.storage, cbuf, rows, envs, newest)
        held = np.asarray(held)
        if not held.any():  # the usual case: no held row, nothing to copy
            return g, obs, nxt
        return g, obs, jax.tree.map(lambda p, x: _where(np, held, p[envs], np.asarray(x)), self._pending, nxt)


class JaxReplayBuffer(_JaxReplayImpl, ReplayBuffer):
    """Drop-in replacement for SB3's ``ReplayBuffer`` (Box, Discrete, MultiDiscrete, MultiBinary observations) with
    jaxbuffers storage (`docs/api/sb3.md`): SB3's arguments plus ``compress`` (``False``, ``True`` or an options dict).

    Raises:
      ValueError: ``optimize_memory_usage`` with ``handle_timeout_termination`` (as SB3) or with ``compress``.
      TypeError: a Dict observation space (use `JaxDictReplayBuffer`), or a float64 space.

    Example:
        ```python
        from stable_baselines3 import DQN
        from jaxbuffers.interop.sb3 import JaxReplayBuffer

        DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=JaxReplayBuffer).learn(10_000)
        ```
    """


class JaxDictReplayBuffer(_JaxReplayImpl, DictReplayBuffer):
    """Drop-in replacement for SB3's ``DictReplayBuffer`` (``spaces.Dict`` observations): `JaxReplayBuffer` without
    ``optimize_memory_usage``, samples ``DictReplayBufferSamples``; ``compress`` also takes ``keys`` (default all)."""

    _samples_type = DictReplayBufferSamples
