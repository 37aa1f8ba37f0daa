"""SB3-compatible replay buffers backed by :class:`jaxbuffers.ReplayBuffer`.

:class:`JaxReplayBuffer` and :class:`JaxDictReplayBuffer` subclass SB3's ``ReplayBuffer`` and
``DictReplayBuffer``, so every off-policy SB3 algorithm (DQN, SAC, TD3, ...) accepts them as
``replay_buffer_class``. They keep SB3's interface and semantics and store nothing in numpy: one
SB3 row (one ``add``: one transition of each of the ``n_envs`` envs) is one item of a
:class:`jaxbuffers.ReplayBuffer` of capacity ``buffer_size // n_envs``, so the device storage has
SB3's own layout ``[buffer_size // n_envs, n_envs, ...]`` and ``pos`` equals the ring's ``head``.

Semantics kept from SB3 (``stable_baselines3.common.buffers``, 2.x):

* ``buffer_size`` is split over envs: ``max(buffer_size // n_envs, 1)`` rows.
* ``add(obs, next_obs, action, reward, done, infos)``: SB3's off-policy loop has already put the
  terminal observation (``infos[i]["terminal_observation"]``) into ``next_obs`` of envs that
  ended; ``timeouts`` records ``infos[i]["TimeLimit.truncated"]`` when
  ``handle_timeout_termination`` (default) and is all False otherwise.
* ``sample(batch_size, env)`` draws rows then envs with ``np.random`` exactly as SB3 does (same
  seed, same batch), and returns ``ReplayBufferSamples`` torch tensors on ``device`` with
  ``dones = done and not timeout`` (``[B, 1]`` float32), ``rewards`` ``[B, 1]`` float32,
  observations and actions in SB3's dtypes. With a ``VecNormalize`` ``env`` the observations and
  rewards are normalised at sampling time, as SB3 does (``_normalize_obs`` / ``_normalize_reward``).
* ``optimize_memory_usage=True`` (non-Dict only, exclusive with ``handle_timeout_termination``):
  observations are stored once and the next observation of row ``i`` is row ``i + 1``; the row at
  ``pos`` is never sampled once full. This also inherits SB3's limitation: at an episode end the
  stored next observation is replaced by the next episode's first one (harmless for true
  terminations, whose target ignores it).

Compression (``compress=``, :class:`JaxReplayBuffer` only, not with ``optimize_memory_usage``):
``True`` or a dict of options for :meth:`jaxbuffers.compressed.CompressedTrajectoryBuffer.create`
(``codec``, ``frame_stack``, ``stack_axis``, ``padding``, ``chunk_bytes``; ``padding`` defaults to
``"zero"``, what SB3's ``VecFrameStack`` does at an episode start), plus ``max_pending`` (default
16) for the :class:`~jaxbuffers.compressed.StagingWriter` that adds SB3's one-step ``add`` s to it
in chunks: up to ``max_pending`` steps (observation and next observation of every env) are held
uncompressed in host numpy arrays, counted in ``nbytes``, and flushed when full or when SB3
samples (so a sample always sees every added step; DQN samples every ``train_freq`` steps). The observations then live in
a :class:`~jaxbuffers.compressed.CompressedTrajectoryBuffer` with one lane per env (row ``t`` of
env ``e`` is step ``t`` of lane ``e``); with ``frame_stack=k`` only the newest frame of each
observation is stored and the stacks are rebuilt at sample time. Every SB3 episode end (``done``)
is handed to it as a truncation so that its next observation (the terminal one SB3 stores) is
kept in the final-observation ring; the newest row's next observation, not yet in the ring, is
held uncompressed until the next ``add``. Samples are identical to SB3's (tested on real
Breakout with ``AtariWrapper`` + ``VecFrameStack``). Example for SB3's Atari stack (CnnPolicy
transposes to channels-first, so the frame axis is 0)::

    DQN("CnnPolicy", env, replay_buffer_class=JaxReplayBuffer,
        replay_buffer_kwargs=dict(compress=dict(frame_stack=4, stack_axis=0, codec="zstd:3")))

The stacks are rebuilt from the newest frames, so ``frame_stack`` is exact only for observations
made by a frame stacker (the older frames of a stack are not read at ``add``). Likewise the
``next_obs`` given to ``add`` is read only where ``done`` (the terminal observation); elsewhere
the next row's ``obs`` is used, which is the same array in SB3's loop. The
``observations`` / ``next_observations`` views are not available when compressed, and a
compressed buffer cannot be pickled (SB3's ``save_replay_buffer``): it raises ``TypeError``.

Differences, all lossless: flags are stored as bool (SB3: float32 0/1); 64-bit integer data
(e.g. ``Discrete`` actions, int64 in gymnasium) is stored as int32 when the space's bounds prove
it fits and is given back as int64; float64 observation spaces are refused (JAX would narrow them
with ``jax_enable_x64`` off). SB3's numpy fields (``observations``, ``dones`` ...) are available
as read-mostly views (:class:`FieldView`) for code that inspects them; writing through them is
supported (SB3 itself writes ``dones[pos] = True`` when it truncates the last trajectory) but
costs a copy of the field.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, DictReplayBuffer, ReplayBuffer
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from jaxbuffers import _ring
from jaxbuffers import replay as _replay
from jaxbuffers.interop.sb3 import _common

__all__ = ["JaxReplayBuffer", "JaxDictReplayBuffer", "FieldView", "sb3_replay_nbytes"]


@functools.partial(jax.jit, donate_argnums=0, static_argnames=("next_in_obs",))
def _add_row(state: _replay.ReplayBuffer, row: Any, next_obs: Any, next_in_obs: bool) -> _replay.ReplayBuffer:
    state = state.add(jax.tree.map(lambda x: x[None], row))
    if next_in_obs:  # optimize_memory_usage: next_obs goes to the next row's observation slot
        obs = _ring.write(state.storage["observations"], jax.tree.map(lambda x: x[None], next_obs), state.head)
        state = state.replace(storage={**state.storage, "observations": obs})
    return state


@functools.partial(jax.jit, static_argnames=("next_in_obs",))
def _gather(state: _replay.ReplayBuffer, rows: jax.Array, envs: jax.Array, next_in_obs: bool):
    s = state.storage
    if "observations" not in s:  # compressed: decoded separately
        obs = nxt = None
    else:
        obs = jax.tree.map(lambda x: x[rows, envs], s["observations"])
    if obs is None:
        pass
    elif next_in_obs:
        nxt = jax.tree.map(lambda x: x[(rows + 1) % x.shape[0], envs], s["observations"])
    else:
        nxt = jax.tree.map(lambda x: x[rows, envs], s["next_observations"])
    dones = (s["dones"][rows, envs] & ~s["timeouts"][rows, envs]).astype(jnp.float32)[:, None]
    return obs, s["actions"][rows, envs], nxt, dones, s["rewards"][rows, envs][:, None]


def _compressed_add(writer, obs: np.ndarray, next_obs: np.ndarray, done: np.ndarray) -> None:
    n = done.shape[0]
    step = {"obs": obs, "action": np.zeros((n,), np.uint8), "reward": np.zeros((n,), np.float32)}
    # Every SB3 episode end is handed over as a truncation so that its true next observation
    # (the terminal one SB3 stores) is kept in the final-observation ring; SB3's own dones and
    # timeouts live in the row store. SB3 adds from Python one step at a time: the StagingWriter
    # copies the step into host arrays and adds them to the compressed buffer in chunks (at the
    # latest when SB3 next samples), instead of one device call per step.
    writer.add(step, terminated=np.zeros_like(done), truncated=done, final_obs=next_obs)


@jax.jit
def _compressed_gather(cbuf, dones: jax.Array, rows: jax.Array, envs: jax.Array, newest: jax.Array, pending: jax.Array):
    """Decoded (obs, next_obs) of SB3 rows/envs in ONE jitted call: the one-step transitions at
    (lane = env, slot = row), their frames decoded by the buffer's host callback straight into the
    outputs (on CPU), and the newest rows' next observations taken from ``pending``.

    ``dones``: SB3's stored dones ``[rows, n_envs]``; after an episode end the next observation
    comes from the final-observation ring (every done was added as a truncation). The newest
    row's next observation is not stored yet (it becomes the next row's obs): it is held in
    ``pending`` ``[n_envs, *obs_shape]`` and used instead.
    """
    traj = cbuf.trajectory
    tr = traj.transitions_at(envs * traj.length + rows, n_step=1, gamma=jnp.float32(1.0))
    use_pending = (rows == newest) & ~dones[rows, envs]
    next_ids = jnp.where(use_pending[:, None], tr.obs, tr.next_obs)  # a valid slot to decode; replaced below
    obs, nxt = cbuf.decode_obs(tr.obs, next_ids)
    nxt = jnp.where(use_pending.reshape((-1,) + (1,) * (nxt.ndim - 1)), pending[envs], nxt)
    return obs, nxt


class FieldView:
    """A numpy-like window on one stored field, in SB3's layout ``[rows, n_envs, ...]`` and dtype.

    ``np.asarray(view)`` and ``view[k]`` read a host copy; ``view[k] = v`` writes through to the
    device storage (O(field size); meant for rare edits such as SB3 marking the last stored
    transition done). ``shape`` and ``dtype`` are SB3's. Because ``view[k]`` is a copy, a chained
    write ``view[k][j] = v`` changes only that copy; write ``view[k, j] = v``.
    """

    def __init__(self, owner: "_JaxReplayImpl", path: tuple, dtype: np.dtype):
        self._owner, self._path, self._dtype = owner, path, np.dtype(dtype)

    def _leaf(self) -> jax.Array:
        leaf = self._owner._state.storage
        for k in self._path:
            leaf = leaf[k]
        return leaf

    @property
    def shape(self) -> tuple[int, ...]:
        """SB3's shape of the field, ``(rows, n_envs, ...)``."""
        return tuple(self._leaf().shape)

    @property
    def dtype(self) -> np.dtype:
        """SB3's dtype of the field (float32 for flags, int64 for Discrete actions ...)."""
        return self._dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.array(self._leaf()).astype(self._dtype, copy=False)
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, key) -> np.ndarray:
        return np.asarray(self)[key]

    def __setitem__(self, key, value) -> None:
        arr = np.array(self._leaf())
        arr[key] = np.asarray(value)
        self._owner._replace_leaf(self._path, jnp.asarray(arr))

    def __repr__(self) -> str:
        return f"FieldView({'/'.join(map(str, self._path))}, shape={self.shape}, dtype={self._dtype})"


def _compress_options(compress: bool | dict) -> dict | None:
    """Options for :meth:`jaxbuffers.compressed.CompressedTrajectoryBuffer.create` (None: off)."""
    if compress is False or compress is None:
        return None
    if compress is True:
        compress = {}
    if not isinstance(compress, dict):
        raise TypeError(f"compress: expected a bool or a dict of options, got {type(compress).__name__}")
    allowed = {"codec", "frame_stack", "stack_axis", "padding", "chunk_bytes", "max_pending"}
    extra = set(compress) - allowed
    if extra:
        raise ValueError(f"compress: unknown options {sorted(extra)}; expected some of {sorted(allowed)}")
    # SB3's VecFrameStack fills a new episode's stack with zeros.
    return {"padding": "zero", **compress}


def sb3_replay_nbytes(
    buffer_size: int,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    n_envs: int = 1,
    optimize_memory_usage: bool = False,
) -> int:
    """Bytes SB3's own ``ReplayBuffer`` / ``DictReplayBuffer`` allocates for these arguments.

    ``rows * n_envs * (obs [* 2 unless optimize_memory_usage] + actions + 3 * 4)`` with
    ``rows = max(buffer_size // n_envs, 1)``: observations (and next observations) in the space's
    dtype, actions ``[action_dim]`` (float64 cast to float32), and rewards, dones, timeouts as
    float32. This is the allocation; its resident size grows as SB3 fills the buffer.
    """
    from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape

    rows = max(buffer_size // n_envs, 1)
    shape = get_obs_shape(observation_space)
    if isinstance(observation_space, spaces.Dict):
        obs = sum(int(np.prod(shape[k])) * np.dtype(s.dtype).itemsize for k, s in observation_space.spaces.items())
    else:
        obs = int(np.prod(shape)) * np.dtype(observation_space.dtype).itemsize
    act = get_action_dim(action_space) * np.dtype(ReplayBuffer._maybe_cast_dtype(action_space.dtype)).itemsize
    per = obs * (1 if optimize_memory_usage else 2) + act + 3 * 4
    return rows * n_envs * per


class _JaxReplayImpl:
    """Shared implementation of the two replay classes (mixed in before SB3's class)."""

    _samples_type: type = ReplayBufferSamples

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        compress: bool | dict = False,
    ):
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(int(buffer_size) // int(n_envs), 1)
        is_dict = isinstance(observation_space, spaces.Dict)
        if is_dict != isinstance(self, DictReplayBuffer):
            want = "JaxDictReplayBuffer" if is_dict else "JaxReplayBuffer"
            raise TypeError(
                f"observation_space: {type(self).__name__} got a {type(observation_space).__name__} space; "
                f"use {want} for it"
            )
        if optimize_memory_usage and handle_timeout_termination:
            raise ValueError(
                "optimize_memory_usage=True and handle_timeout_termination=True cannot be combined "
                "(as in SB3's ReplayBuffer: the stored next observation of a timeout would be the "
                "next episode's first one); pass handle_timeout_termination=False"
            )
        if optimize_memory_usage and is_dict:
            raise ValueError("optimize_memory_usage: not supported with Dict observations (as in SB3's DictReplayBuffer)")
        if compress and (is_dict or optimize_memory_usage):
            raise ValueError(
                "compress: supported for JaxReplayBuffer with optimize_memory_usage=False (compression "
                "with frame dedup already stores each frame once); got "
                + ("a Dict observation space" if is_dict else "optimize_memory_usage=True")
            )
        self.optimize_memory_usage = bool(optimize_memory_usage)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.compress = _compress_options(compress)

        n = self.n_envs
        obs_spec = _common.obs_spec(observation_space, self.obs_shape, (n,), "observation_space")
        self._obs_dtypes = _common.obs_dtypes(observation_space)
        self._action_dtype = np.dtype(ReplayBuffer._maybe_cast_dtype(action_space.dtype))
        spec = {
            "observations": obs_spec,
            "actions": jax.ShapeDtypeStruct(
                (n, self.action_dim), _common.storage_dtype(self._action_dtype, action_space, "action_space")
            ),
            "rewards": jax.ShapeDtypeStruct((n,), np.float32),
            "dones": jax.ShapeDtypeStruct((n,), np.bool_),
            "timeouts": jax.ShapeDtypeStruct((n,), np.bool_),
        }
        self._spec = dict(spec)
        if self.compress is not None:
            del spec["observations"]  # observations live in the compressed buffer
            self._writer = self._new_compressed()  # StagingWriter around the CompressedTrajectoryBuffer
            self._pending = None  # host [n_envs, *obs_shape]: the newest row's next observation
        elif not self.optimize_memory_usage:
            spec["next_observations"] = obs_spec
        self._state = _replay.ReplayBuffer.create(spec, capacity=self.buffer_size)

    def _new_compressed(self):
        from jaxbuffers.compressed import CompressedTrajectoryBuffer, StagingWriter

        s = self._spec["observations"]
        example = {
            "obs": jax.ShapeDtypeStruct(s.shape[1:], s.dtype),
            "action": jax.ShapeDtypeStruct((), np.uint8),  # unused (the row store keeps actions)
            "reward": jax.ShapeDtypeStruct((), np.float32),  # unused (the row store keeps rewards)
        }
        opts = dict(self.compress)
        max_pending = opts.pop("max_pending", 16)
        cbuf = CompressedTrajectoryBuffer.create(example, num_envs=self.n_envs, length=self.buffer_size, **opts)
        return StagingWriter(cbuf, max_pending=max_pending)

    # ------------------------------------------------------------------ state access
    @property
    def jax_buffer(self) -> _replay.ReplayBuffer:
        """The backing :class:`jaxbuffers.ReplayBuffer`: one item per SB3 row, leaves ``[rows, n_envs, ...]``.

        The adapter's next ``add`` donates these arrays (they are updated in place), after which
        the object returned here raises "Array has been deleted" when read: read it right away, or
        keep ``jax.tree.map(jnp.copy, buf.jax_buffer)``."""
        return self._state

    @property
    def nbytes(self) -> int:
        """Bytes held: the device arrays (allocated up front) plus, with ``compress``, the
        compressed buffer's device ids and host bytes (arenas, indexes), a Python int."""
        extra = 0 if self.compress is None else self._writer.nbytes + (0 if self._pending is None else self._pending.nbytes)
        return self._state.memory_bytes + extra

    def _replace_leaf(self, path: tuple, value: jax.Array) -> None:
        def put(tree, keys):
            if not keys:
                return value
            return {**tree, keys[0]: put(tree[keys[0]], keys[1:])}

        self._state = self._state.replace(storage=put(self._state.storage, path))

    def _views(self, name: str, dtypes: Any) -> Any:
        if self.compress is not None and name in ("observations", "next_observations"):
            raise AttributeError(f"{name}: held compressed (compress=...); sample() decodes them")
        if isinstance(dtypes, dict):
            return {k: FieldView(self, (name, k), d) for k, d in dtypes.items()}
        return FieldView(self, (name,), dtypes)

    @property
    def observations(self) -> Any:
        """SB3's ``observations`` ``[rows, n_envs, *obs_shape]`` (a :class:`FieldView`, a dict of them for Dict spaces)."""
        return self._views("observations", self._obs_dtypes)

    @property
    def next_observations(self) -> Any:
        """SB3's ``next_observations`` (absent with ``optimize_memory_usage``, as in SB3)."""
        if self.optimize_memory_usage:
            raise AttributeError("next_observations: not stored with optimize_memory_usage=True (as in SB3)")
        return self._views("next_observations", self._obs_dtypes)

    @property
    def actions(self) -> FieldView:
        """SB3's ``actions`` ``[rows, n_envs, action_dim]`` in SB3's dtype."""
        return FieldView(self, ("actions",), self._action_dtype)

    @property
    def rewards(self) -> FieldView:
        """SB3's ``rewards`` ``[rows, n_envs]`` float32."""
        return FieldView(self, ("rewards",), np.float32)

    @property
    def dones(self) -> FieldView:
        """SB3's ``dones`` ``[rows, n_envs]`` as float32 0/1 (stored as bool)."""
        return FieldView(self, ("dones",), np.float32)

    @property
    def timeouts(self) -> FieldView:
        """SB3's ``timeouts`` ``[rows, n_envs]`` as float32 0/1 (stored as bool; all 0 unless
        ``handle_timeout_termination``)."""
        return FieldView(self, ("timeouts",), np.float32)

    # ------------------------------------------------------------------ SB3 interface
    def reset(self) -> None:
        """Empty the buffer (``pos`` 0, not full); storage is kept, as in SB3."""
        super().reset()
        if self.compress is not None:
            self._writer.close()
            self._writer, self._pending = self._new_compressed(), None
        self._state = self._state.with_cursors(head=0, num_valid=0, added=_ring.counter_zero())

    def __getstate__(self) -> dict:
        if self.compress is not None:
            raise TypeError(
                "JaxReplayBuffer(compress=...) cannot be pickled (SB3's save_replay_buffer pickles it): its "
                "observations live in host compressed stores that jitted code reaches by callbacks. Use "
                "compress=False for a buffer you need to save."
            )
        return self.__dict__.copy()

    def _obs_row(self, obs: Any, what: str) -> Any:
        return _common.obs_row(obs, self._spec["observations"], (), self.observation_space, self._obs_dtypes, what)

    def add(
        self,
        obs: Any,
        next_obs: Any,
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Store one transition per env (SB3's signature and semantics; see the module docstring).

        Args:
          obs: ``[n_envs, *obs_shape]`` (dict of them for Dict spaces), observation before the step.
          next_obs: same, observation after it, with the terminal observation already put in for
            envs that ended (SB3's ``_store_transition`` does this).
          action: ``[n_envs, action_dim]`` (or anything reshapeable to it, e.g. ``[n_envs]``).
          reward: ``[n_envs]``. done: ``[n_envs]`` (terminated or truncated).
          infos: ``n_envs`` dicts; ``"TimeLimit.truncated"`` marks a timeout.

        Values are cast to the stored dtypes as numpy assignment does (as SB3). ``ValueError``
        (naming the argument): a wrong number of values, a layout SB3's assignment would refuse,
        a done other than 0 / 1. ``TypeError``: an integer beyond the int32 an int64 field is held
        in (``_common.as_row``).
        """
        n = self.n_envs
        sp = self._spec
        row = {
            "observations": self._obs_row(obs, "obs"),
            "actions": _common.as_row(
                action, sp["actions"].shape, sp["actions"].dtype, "action", reshape=True, exact=sp["actions"].dtype != self._action_dtype
            ),
            "rewards": _common.as_row(reward, (n,), np.float32, "reward"),
            "dones": _common.as_row(done, (n,), np.bool_, "done"),
        }
        if self.handle_timeout_termination:
            if len(infos) != n:
                raise ValueError(f"infos: expected {n} dicts (one per env), got {len(infos)}")
            row["timeouts"] = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])
        else:
            row["timeouts"] = np.zeros(n, np.bool_)
        next_row = self._obs_row(next_obs, "next_obs")
        if self.compress is not None:
            obs_row = row.pop("observations")
            _compressed_add(self._writer, obs_row, next_row, row["dones"])
            self._pending = np.array(next_row)  # a copy: next_row may be a view of the caller's array
            self._state = _add_row(self._state, row, None, next_in_obs=False)
        elif self.optimize_memory_usage:
            self._state = _add_row(self._state, row, next_row, next_in_obs=True)
        else:
            row["next_observations"] = next_row
            self._state = _add_row(self._state, row, None, next_in_obs=False)
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0

    def sample(self, batch_size: int, env: VecNormalize | None = None):
        """``batch_size`` transitions drawn uniformly (with replacement), as SB3 draws them.

        Rows come from ``np.random.randint`` over the valid rows (skipping the row at ``pos`` when
        full with ``optimize_memory_usage``), then one env per sample; so with the same numpy
        seed this returns exactly the batch SB3's own buffer would. Returns
        ``ReplayBufferSamples`` (``DictReplayBufferSamples``) of torch tensors on ``device``.
        """
        if self.optimize_memory_usage and self.full:
            rows = (np.random.randint(1, self.buffer_size, size=batch_size) + self.pos) % self.buffer_size
        else:
            upper = self.buffer_size if self.full else self.pos
            rows = np.random.randint(0, upper, size=batch_size)
        return self._get_samples(rows, env=env)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None):
        env_indices = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))
        return self.samples_at(batch_inds, env_indices, env=env)

    def samples_at(self, batch_inds: np.ndarray, env_indices: np.ndarray, env: VecNormalize | None = None):
        """The transitions at rows ``batch_inds`` and envs ``env_indices`` (int arrays ``[B]``).

        Equals SB3's ``_get_samples`` with the same indices, field by field.

        Raises:
          IndexError: an index outside ``[0, rows)`` / ``[0, n_envs)``, or not of an integer dtype
          (as numpy would).
        """
        rows = np.asarray(batch_inds)
        envs = np.asarray(env_indices)
        if rows.shape != envs.shape or rows.ndim != 1:
            raise ValueError(f"batch_inds, env_indices: expected two 1-d arrays of one length, got {rows.shape} and {envs.shape}")
        for name, idx, hi in (("batch_inds", rows, self.buffer_size), ("env_indices", envs, self.n_envs)):
            if not np.issubdtype(idx.dtype, np.integer):
                raise IndexError(f"{name}: expected integer indices (as numpy indexing), got dtype {idx.dtype}")
            if idx.size and (idx.min() < 0 or idx.max() >= hi):
                raise IndexError(f"{name}: values must lie in [0, {hi}), got range [{idx.min()}, {idx.max()}]")
        rows_j, envs_j = jnp.asarray(rows, jnp.int32), jnp.asarray(envs, jnp.int32)
        obs, act, nxt, dones, rew = _gather(self._state, rows_j, envs_j, next_in_obs=self.optimize_memory_usage)
        if self.compress is not None:
            if self._pending is None:
                raise IndexError("samples_at: the buffer is empty")
            newest = jnp.int32((self.pos - 1) % self.buffer_size)
            cbuf = self._writer.buffer  # flushes the staged steps first
            obs, nxt = _compressed_gather(cbuf, self._state.storage["dones"], rows_j, envs_j, newest, self._pending)
        dev = self.device
        if env is not None:  # normalised from SB3's dtypes, as SB3 does (int32-stored fields come back int64)
            sb3_dtypes = lambda t: jax.tree.map(lambda x, d: np.asarray(x).astype(d, copy=False), t, self._obs_dtypes)  # noqa: E731
            obs = self._normalize_obs(sb3_dtypes(obs), env)
            nxt = self._normalize_obs(sb3_dtypes(nxt), env)
            rew_t = self.to_torch(self._normalize_reward(np.asarray(rew), env))
            obs_t = jax.tree.map(self.to_torch, obs)
            nxt_t = jax.tree.map(self.to_torch, nxt)
        else:
            rew_t = _common.to_torch_tensor(rew, dev)
            obs_t = jax.tree.map(lambda x, d: _common.to_torch_tensor(x, dev, d), obs, self._obs_dtypes)
            nxt_t = jax.tree.map(lambda x, d: _common.to_torch_tensor(x, dev, d), nxt, self._obs_dtypes)
        return self._samples_type(
            observations=obs_t,
            actions=_common.to_torch_tensor(act, dev, self._action_dtype),
            next_observations=nxt_t,
            dones=_common.to_torch_tensor(dones, dev),
            rewards=rew_t,
        )


class JaxReplayBuffer(_JaxReplayImpl, ReplayBuffer):
    """Drop-in replacement for SB3's ``ReplayBuffer`` (Box, Discrete, MultiDiscrete, MultiBinary
    observations) with jaxbuffers storage; see the module docstring.

    Example::

        from stable_baselines3 import DQN
        from jaxbuffers.interop.sb3 import JaxReplayBuffer

        model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=JaxReplayBuffer)
        model.learn(10_000)

    Args (SB3's, same meaning): ``buffer_size``, ``observation_space``, ``action_space``,
    ``device``, ``n_envs``, ``optimize_memory_usage``, ``handle_timeout_termination``.

    Raises:
      ValueError: ``optimize_memory_usage`` with ``handle_timeout_termination`` (as SB3).
      TypeError: a Dict observation space (use :class:`JaxDictReplayBuffer`), or a float64 space.
    """


class JaxDictReplayBuffer(_JaxReplayImpl, DictReplayBuffer):
    """Drop-in replacement for SB3's ``DictReplayBuffer`` (``spaces.Dict`` observations).

    SB3 selects ``DictReplayBuffer`` by itself for Dict spaces; pass this class as
    ``replay_buffer_class`` instead. Samples are ``DictReplayBufferSamples``. Same arguments and
    semantics as :class:`JaxReplayBuffer`; ``optimize_memory_usage`` is not supported (as SB3).
    """

    _samples_type = DictReplayBufferSamples
