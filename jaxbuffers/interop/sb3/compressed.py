"""SB3 buffer classes with sb3-extra-buffers' names and constructor options, stored by jaxbuffers.

`CompressedRolloutBuffer`, `CompressedDictRolloutBuffer`, `CompressedReplayBuffer` and `CompressedDictReplayBuffer`
take the arguments of the sb3-extra-buffers classes of the same names, so a training script switches by changing
its import. Rollouts are stored in a `jaxbuffers.compressed.CompressedRolloutBuffer` (observations compressed on the
host, the rest on the device, GAE and minibatches as `JaxRolloutBuffer`); replays in a `JaxReplayBuffer` with
``compress=`` (each frame stored once). Samples are SB3's under the same numpy seed.

Options (the sb3-extra-buffers names):

* ``compression_method``: a method name, optionally with a level (``"gzip9"``, ``"zstd-3"``, ``"lz4-block/9"``).
  Mapped to a `host_codecs` codec, losslessly, by `codec_for`:

  | method | codec |
  |---|---|
  | ``none`` | ``none`` |
  | ``rle``, ``rle-jit``, ``rle-old`` | ``rle:B``, ``B`` the bits of ``runs_type`` (8 when ``dtypes`` is not given: the count width is picked per entry) |
  | ``gzip``, ``igzip`` (level ``L``, default 9) | ``igzip:min(L, 3)`` (raw deflate; gzip framing only costs time) |
  | ``zstd`` (level ``L``, default 0) | ``zstd:L`` (``zstd:3`` for 0, zstd's own default) |
  | ``lz4-frame``, ``lz4-block`` | refused (``ValueError``): no lz4 codec; ``igzip0`` is the nearest in speed and size |

* ``compression_kwargs``: ``compresslevel`` (the level when the method name has none: a level in the name wins, as in
  sb3-extra-buffers, so ``"gzip9"`` with ``compresslevel=1`` is level 9), ``threads`` (zstd only, an int >= 0: it sets
  only how many threads encode, never the bytes; accepted and checked, but the store splits every batch over
  `host_codecs`' own thread pool, sized by `host_codecs.set_num_threads`), ``elem_type`` and ``runs_type`` (override
  ``dtypes``); ``decompression_kwargs``: the same dtypes or nothing (each entry records its codec, so decoding needs
  no options). Other keys raise ``ValueError``.
* ``dtypes``: ``dict(elem_type=..., runs_type=...)`` or one dtype for both. ``elem_type`` is the dtype observations
  are stored in (default: the space's): a narrower one is allowed when every value fits exactly (e.g. pixels in a
  float32 space held as uint8); a value that does not raises ``TypeError`` at ``add`` (sb3-extra-buffers clips and
  casts silently). ``runs_type`` (uint8, uint16, uint32) is the smallest run count of ``rle``.
* ``normalize_images``: sampled observations (of compressed uint8 keys) come back as float32 ``x / 255``.
* ``output_dtype`` (replay): ``"raw"`` (the space's dtype) or ``"float"`` (float32).
* ``optimize_memory_usage`` (replay): a bool, accepted and a no-op. In SB3 and sb3-extra-buffers it stores each
  observation once (row ``i``'s next observation read from row ``i + 1``) instead of twice; these classes always do:
  an env's observations are one lane of a compressed trajectory buffer, the next row's observation is the next
  observation and an episode's terminal one is kept in its final-observation ring. So the samples are those of SB3's
  buffer without it (its draws skip row ``pos`` with it), the attribute stays False, and nothing is refused with it:
  not ``handle_timeout_termination`` (which SB3 and sb3-extra-buffers refuse beside it, their next observation of a
  timeout being the next episode's first) nor Dict spaces (which sb3-extra-buffers refuses).

Extensions: ``compress_keys`` (Dict classes): the observation keys to compress (default all); the others are stored
as they are. ``frame_stack``, ``stack_axis``: store each frame of stacked observations once (replay: as
`JaxReplayBuffer`'s ``compress``; rollout: each distinct frame of a rollout once, found by comparing each new stack
with the env's previous one, `jaxbuffers.compressed.RolloutHostWriter`). ``padding`` (replay, with ``frame_stack``):
how an episode's first stack is padded, as `jaxbuffers.compressed.CompressedTrajectoryBuffer.create` says:
``"zero"`` (default: SB3's ``VecFrameStack``) or ``"reset"`` (its first frame repeated: Gymnasium's
``FrameStackObservation`` by default). Stacks padded otherwise are refused at ``add`` (``ValueError``), never stored
as other stacks. ``keyframe_interval`` (replay): ``K`` of the temporal coding, a positive int (default
`jaxbuffers.compressed.trajectory.DEFAULT_KEYFRAME_INTERVAL`; 1 for the ``none`` codec): each frame is stored as a
delta against the one before it except every ``K``-th of an episode, stored whole, so sampling a frame decodes at most
``K`` entries; ``1`` stores every frame whole (more bytes, fewer decodes). A value that is not an int >= 1 raises
``ValueError``.

Differences from sb3-extra-buffers 0.5 that remain: lz4 methods are refused; gzip levels above 3 encode at igzip's 3
(raw deflate: other bytes, the same values); ``threads`` sets no thread count; ``optimize_memory_usage`` changes
nothing (so no sample skips row ``pos``); ``compression_kwargs`` keys other than the four above are refused (it hands
them to its compressor, which ignores those it does not take) and its dtypes add to ``dtypes`` (it uses one or the
other); a value ``elem_type`` does not hold raises ``TypeError`` (it clips and casts), and a finite float64 value
beyond float32 raises ``ValueError`` (it stores inf).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import DictReplayBuffer, DictRolloutBuffer, ReplayBuffer, RolloutBuffer
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, DictRolloutBufferSamples

from jaxbuffers import _validate
from jaxbuffers.interop.sb3 import _common
from jaxbuffers.interop.sb3.replay import _JaxReplayImpl
from jaxbuffers.interop.sb3.rollout import _JaxRolloutImpl

__all__ = ["CompressedRolloutBuffer", "CompressedDictRolloutBuffer", "CompressedReplayBuffer", "CompressedDictReplayBuffer",
           "codec_for"]

_RUNS_BITS = {np.dtype(np.uint8): 8, np.dtype(np.uint16): 16, np.dtype(np.uint32): 32}
_LZ4 = ("lz4-frame", "lz4-block")
_METHODS = ("none", "rle", "rle-jit", "rle-old", "gzip", "igzip", "zstd", *_LZ4)
_KWARGS = {"compresslevel", "threads", "elem_type", "runs_type"}


def _split_method(method: Any) -> tuple[str, int | None]:
    """``(name, level or None)`` of a method string: ``"gzip9"``, ``"zstd-3"``, ``"lz4-block/9"``, ``"rle-jit"``."""
    if not isinstance(method, str):
        raise TypeError(f"compression_method: expected a method name such as 'rle' or 'zstd3', got {type(method).__name__}")
    name, sep, level = method.strip().lower().rpartition("/")
    if sep:
        if not re.fullmatch(r"-?\d+", level):
            raise ValueError(f"compression_method: {method!r} has no integer level after '/'")
        return name, int(level)
    m = re.fullmatch(r"([a-z]+)(-?\d+)", level)
    return (m.group(1), int(m.group(2))) if m else (level, None)


def _dtypes(dtypes: Any, compression_kwargs: dict | None, decompression_kwargs: dict | None) -> tuple[np.dtype | None, np.dtype | None, int | None, bool]:
    """``(elem_type, runs_type, compresslevel, threads given)`` from the three options (None: not given)."""
    if dtypes is None:
        d = {}
    elif isinstance(dtypes, dict):
        if set(dtypes) - {"elem_type", "runs_type"}:
            raise ValueError(f"dtypes: unknown keys {sorted(set(dtypes) - {'elem_type', 'runs_type'})}; expected elem_type, runs_type")
        d = dict(dtypes)
    else:
        d = {"elem_type": dtypes, "runs_type": dtypes}
    kw = dict(compression_kwargs or {})
    if set(kw) - _KWARGS:
        raise ValueError(f"compression_kwargs: unknown keys {sorted(set(kw) - _KWARGS)}; expected some of {sorted(_KWARGS)}")
    level, threads = kw.pop("compresslevel", None), kw.pop("threads", None)
    if level is not None:
        level = _validate.integer("compression_kwargs['compresslevel']", level)
    if threads is not None:
        _validate.integer("compression_kwargs['threads']", threads, minimum=0)  # 0: one per CPU
    d.update(kw)
    elem = None if d.get("elem_type") is None else np.dtype(d["elem_type"])
    runs = None if d.get("runs_type") is None else np.dtype(d["runs_type"])
    for k, v in (decompression_kwargs or {}).items():
        if k not in ("elem_type", "runs_type"):
            raise ValueError(f"decompression_kwargs: unknown key {k!r}; each entry records its codec, only elem_type and runs_type are accepted")
        mine = elem if k == "elem_type" else runs
        if mine is None or np.dtype(v) != mine:
            raise ValueError(f"decompression_kwargs[{k!r}]: {np.dtype(v)} differs from the {k} compression uses ({mine})")
    return elem, runs, level, threads is not None


def codec_for(compression_method: str = "rle", compression_kwargs: dict | None = None, dtypes: Any = None,
              decompression_kwargs: dict | None = None) -> tuple[str, np.dtype | None]:
    """The `host_codecs` codec name and the element dtype (None: the space's) for sb3-extra-buffers' options.

    See the module doc for the mapping.

    Raises:
      ValueError: an unknown or lz4 method, a level the codec does not take, unknown option keys, ``threads`` below 0
        or with a method other than zstd, a ``runs_type`` other than uint8/16/32, decompression dtypes other than the
        compression ones.
      TypeError: a method that is not a string, a level or ``threads`` that is not an int.
    """
    name, level = _split_method(compression_method)
    elem, runs, kw_level, threads = _dtypes(dtypes, compression_kwargs, decompression_kwargs)
    level = level if level is not None else kw_level  # as sb3-extra-buffers: the method name's level wins
    if threads and name != "zstd":
        raise ValueError(f"compression_kwargs['threads']: only zstd takes it, got compression_method {compression_method!r}")
    if name in _LZ4:
        raise ValueError(f"compression_method: {compression_method!r} (lz4) has no jaxbuffers codec; use 'igzip0' (raw deflate "
                         f"level 0, close to lz4 in speed and size), 'zstd-1' or 'rle'")
    _validate.choice("compression_method", name, _METHODS, "(a level may follow: 'gzip9', 'zstd-3')")
    if name == "none":
        codec = "none"
    elif name.startswith("rle"):
        if runs is not None and runs not in _RUNS_BITS:
            raise ValueError(f"dtypes['runs_type']: expected one of uint8, uint16, uint32, got {runs}")
        codec = f"rle:{8 if runs is None else _RUNS_BITS[runs]}"
    elif name in ("gzip", "igzip"):
        level = 9 if level is None else level
        if not 0 <= level <= 9:
            raise ValueError(f"compression_method: {compression_method!r} level {level} is outside gzip's 0..9")
        codec = f"igzip:{min(level, 3)}"
    else:
        codec = f"zstd:{3 if not level else level}"
    from host_codecs import get_codec

    get_codec(codec)  # a level zstd does not take raises here, naming the valid ones
    return codec, elem


def _elem_rows(rows: _common.Rows, space: spaces.Space, elem: np.dtype | None, keys: Sequence[str] | None) -> None:
    """Store the chosen observation keys (all when ``keys`` is None) of ``rows`` in ``elem``.

    Raises:
      TypeError: ``elem`` cannot hold the space's range (a float space is accepted: values are checked at ``add``).
    """
    if elem is None:
        return

    def one(sp, s, what):
        bounds = _common._int_bounds(sp)
        if np.issubdtype(elem, np.integer) and bounds is not None:
            info = np.iinfo(elem)
            if bounds[0] < info.min or bounds[1] > info.max:
                raise TypeError(f"dtypes['elem_type']: {elem} cannot hold {what}'s range {bounds}")
        _common.storage_dtype(elem, sp, "dtypes['elem_type']")
        return jax.ShapeDtypeStruct(s.shape, elem)

    if isinstance(space, spaces.Dict):
        rows.obs = {k: s if keys is not None and k not in keys else one(space[k], s, f"observation[{k!r}]") for k, s in rows.obs.items()}
    else:
        rows.obs = one(space, rows.obs, "observation")


def _compress_keys(space: spaces.Space, compress_keys: Sequence[str] | None) -> tuple[str, ...] | None:
    """The Dict keys to compress (None: every key), checked against the space."""
    if compress_keys is None:
        return None
    if not isinstance(space, spaces.Dict):
        raise ValueError("compress_keys: only for Dict observation spaces")
    if isinstance(compress_keys, str):
        raise TypeError(f"compress_keys: expected a sequence of keys, got the string {compress_keys!r}")
    keys = tuple(compress_keys)
    unknown = sorted(set(keys) - set(space.spaces))
    if unknown or not keys:
        raise ValueError(f"compress_keys: expected some of the space's keys {sorted(space.spaces)}, got {list(keys)}")
    return keys


def _check_normalize(normalize_images: bool, space: spaces.Space, keys: tuple[str, ...] | None, elem: np.dtype | None = None) -> None:
    """With ``normalize_images``, ``ValueError`` naming a compressed observation (every one when ``keys`` is None)
    not of dtype uint8 (``elem``, the stored dtype, where given, else the space's): ``x / 255`` applies to uint8 only."""
    if normalize_images:
        for k, sp in space.spaces.items() if isinstance(space, spaces.Dict) else [(None, space)]:
            if keys is None or k in keys:
                _validate.normalizable("observation" if k is None else f"observation[{k!r}]", sp.dtype if elem is None else elem)


class _CompressedRolloutImpl(_JaxRolloutImpl):
    """The rollout classes' shared implementation: `_JaxRolloutImpl` over a compressed backing buffer."""

    _OPTIONS = ("dtypes", "normalize_images", "compression_method", "compression_kwargs", "decompression_kwargs",
                "compress_keys", "frame_stack", "stack_axis", "_codec", "_elem", "_keys")

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space, device: th.device | str = "auto",
                 gae_lambda: float = 1, gamma: float = 0.99, n_envs: int = 1, dtypes: Any = None, normalize_images: bool = False,
                 compression_method: str = "rle", compression_kwargs: dict | None = None, decompression_kwargs: dict | None = None,
                 compress_keys: Sequence[str] | None = None, frame_stack: int | None = None, stack_axis: int = -1):
        self.frame_stack, self.stack_axis = frame_stack, stack_axis
        self.dtypes, self.normalize_images = dtypes, bool(normalize_images)
        self.compression_method, self.compression_kwargs, self.decompression_kwargs = compression_method, compression_kwargs, decompression_kwargs
        self.compress_keys = compress_keys
        self._codec, self._elem = codec_for(compression_method, compression_kwargs, dtypes, decompression_kwargs)
        self._keys = _compress_keys(observation_space, compress_keys)
        _check_normalize(self.normalize_images, observation_space, self._keys, self._elem)  # rollouts decode the stored dtype
        super().__init__(buffer_size, observation_space, action_space, device, gae_lambda=gae_lambda, gamma=gamma, n_envs=n_envs)

    def _new_state(self, example: Any) -> Any:
        from jaxbuffers.compressed import CompressedRolloutBuffer as Backing

        _elem_rows(self._rows, self.observation_space, self._elem, self._keys)
        example["obs"] = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), self._rows.obs)
        names = ("obs",) if self._keys is None else tuple(f"['obs'][{k!r}]" for k in self._keys)
        return Backing.create(example, num_envs=self.n_envs, num_steps=self.buffer_size, compress=names, codec=self._codec,
                              normalize_images=self.normalize_images, frame_stack=self.frame_stack, stack_axis=self.stack_axis)

    _owns_state = False  # the host writer keeps the device state it flushed

    # Adds go to a host writer (numpy mirrors + host stores, no device call per step); the device state is built
    # when something reads it (GAE, minibatches, the numpy fields, checkpoints).
    @property
    def _state(self) -> Any:
        return self._writer.flush()

    @_state.setter
    def _state(self, state: Any) -> None:
        from jaxbuffers.compressed import RolloutHostWriter

        self._writer = RolloutHostWriter(state)

    def _put(self, step: dict, reward: np.ndarray, value: np.ndarray) -> None:
        # `_add_rows` made the writer's checks (its rows have the writer's spec): write them as they are
        w = self._writer
        fields = {"reward": reward, "value": value, "terminated": _common.zeros(self.n_envs, np.bool_), "truncated": None,
                  "final_value": None, "trainable": None}
        w._add_checked(w._treedef.flatten_up_to(step), fields)

    def _epoch_gather(self):
        # One pass of get(): every stored frame decoded once (about one per step with frame_stack: a stack shares its
        # frames with k - 1 other steps), each minibatch gathered from them on the host. The decoded frames live
        # while the pass does: 1/k of the stacked observations SB3's own buffer keeps.
        state = self._state
        entries = state.decode_entries()
        return lambda idx: state.gather_entries(entries, idx)

    def __getstate__(self) -> dict:
        """`JaxRolloutBuffer.__getstate__` (the host writer is rebuilt from the checkpoint)."""
        state = super().__getstate__()
        state.pop("_writer", None)
        return state

    @property
    def _rollout(self) -> Any:
        return self._state.buffer

    def _with_rollout(self, inner: Any) -> Any:
        return self._state.replace(buffer=inner)

    def _normalized(self, key: str | None) -> bool:
        return self.normalize_images and (self._keys is None or key in self._keys)

    @property
    def _sample_obs_dtypes(self) -> Any:
        d = self._rows.obs_dtypes
        if isinstance(d, dict):
            return {k: np.dtype(np.float32) if self._normalized(k) else v for k, v in d.items()}
        return np.dtype(np.float32) if self._normalized(None) else d

    @property
    def observations(self) -> Any:
        """``[T, n_envs, *obs_shape]`` decoded read-only host copy in the space's dtypes (float32 ``x / 255`` with
        ``normalize_images``; a dict for Dict spaces)."""
        mb = self._state.gather(jnp.arange(self.buffer_size * self.n_envs, dtype=jnp.int32))
        obs = jax.tree.map(lambda x: np.asarray(x).reshape(self.buffer_size, self.n_envs, *x.shape[1:]), mb.step["obs"])
        return _common.read_only(jax.tree.map(lambda x, d: x.astype(d, copy=False), obs, self._sample_obs_dtypes))

    @property
    def nbytes(self) -> int:
        """Bytes held: device arrays, the compressed host bytes and the host writer's numpy mirrors of the per-step
        fields, a Python int."""
        return self._state.nbytes + self._writer.mirror_nbytes

    def __setstate__(self, state: dict) -> None:
        """`JaxRolloutBuffer.__setstate__` with the compression options restored first."""
        self.__dict__.update({k: state[k] for k in self._OPTIONS})
        super().__setstate__(state)


class CompressedRolloutBuffer(_CompressedRolloutImpl, RolloutBuffer):
    """sb3-extra-buffers' ``CompressedRolloutBuffer``: a ``RolloutBuffer`` for PPO and A2C whose observations are
    compressed on the host (module doc: options). Same samples as SB3's ``RolloutBuffer`` under the same seed.

    Raises:
      ValueError, TypeError: options as `codec_for` says; a Dict space (use `CompressedDictRolloutBuffer`);
        ``normalize_images`` with a non-uint8 stored dtype.

    Example:
        ```python
        from stable_baselines3 import PPO
        from jaxbuffers.interop.sb3 import CompressedRolloutBuffer

        PPO("CnnPolicy", env, rollout_buffer_class=CompressedRolloutBuffer,
            rollout_buffer_kwargs=dict(compression_method="zstd-1"))
        ```
    """


class CompressedDictRolloutBuffer(_CompressedRolloutImpl, DictRolloutBuffer):
    """sb3-extra-buffers' ``CompressedDictRolloutBuffer`` (``spaces.Dict`` observations): every key compressed, or
    those in ``compress_keys``; samples are ``DictRolloutBufferSamples``."""

    _samples_type = DictRolloutBufferSamples


class _CompressedReplayImpl(_JaxReplayImpl):
    """The replay classes' shared implementation: `_JaxReplayImpl` with ``compress`` from sb3-extra-buffers' options."""

    _OPTIONS = ("dtypes", "normalize_images", "output_dtype", "compression_method", "compression_kwargs",
                "decompression_kwargs", "compress_keys", "_elem", "_keys")

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space, device: th.device | str = "auto",
                 n_envs: int = 1, optimize_memory_usage: bool = False, handle_timeout_termination: bool = True, dtypes: Any = None,
                 normalize_images: bool = False, compression_method: str = "rle", compression_kwargs: dict | None = None,
                 decompression_kwargs: dict | None = None, output_dtype: str = "raw", compress_keys: Sequence[str] | None = None,
                 frame_stack: int | None = None, stack_axis: int = -1, padding: str = "zero", keyframe_interval: int | None = None):
        _validate.choice("output_dtype", output_dtype, ("raw", "float"))
        _validate.static_bool("optimize_memory_usage", optimize_memory_usage)  # a no-op (module doc), checked
        self.dtypes, self.normalize_images, self.output_dtype = dtypes, bool(normalize_images), output_dtype
        self.compression_method, self.compression_kwargs, self.decompression_kwargs = compression_method, compression_kwargs, decompression_kwargs
        self.compress_keys = compress_keys
        codec, self._elem = codec_for(compression_method, compression_kwargs, dtypes, decompression_kwargs)
        self._keys = _compress_keys(observation_space, compress_keys)
        self.padding = padding
        stacking = {"frame_stack": frame_stack, "stack_axis": stack_axis, "padding": padding}
        compress = {"codec": codec, **({} if frame_stack is None else stacking)}
        if keyframe_interval is not None:
            compress["keyframe_interval"] = _validate.static_int("keyframe_interval", keyframe_interval)
        if self._keys is not None:
            compress["keys"] = self._keys
        _check_normalize(self.normalize_images, observation_space, self._keys)
        super().__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs, optimize_memory_usage=False,
                         handle_timeout_termination=handle_timeout_termination, compress=compress)

    def _new_compressed(self):
        _elem_rows(self._rows, self.observation_space, self._elem, self._keys)
        return super()._new_compressed()

    def _out_obs(self, obs: Any) -> Any:
        def one(x, key=None):
            if self.normalize_images and x.dtype == th.uint8 and (self._keys is None or key in self._keys):
                return x.to(th.float32) / 255.0
            return x.to(th.float32) if self.output_dtype == "float" else x

        return {k: one(v, k) for k, v in obs.items()} if isinstance(obs, dict) else one(obs)

    def samples_at(self, batch_inds: np.ndarray, env_indices: np.ndarray, env: Any = None):
        """`JaxReplayBuffer.samples_at`, observations as ``normalize_images`` and ``output_dtype`` say."""
        s = super().samples_at(batch_inds, env_indices, env=env)
        return s._replace(observations=self._out_obs(s.observations), next_observations=self._out_obs(s.next_observations))

    def __setstate__(self, state: dict) -> None:
        """`JaxReplayBuffer.__setstate__` with the compression options restored first."""
        self.__dict__.update({k: state[k] for k in self._OPTIONS})
        super().__setstate__(state)


class CompressedReplayBuffer(_CompressedReplayImpl, ReplayBuffer):
    """sb3-extra-buffers' ``CompressedReplayBuffer`` for DQN, SAC, TD3...: observations compressed on the host
    (module doc: options), each stored once; same samples as SB3's ``ReplayBuffer`` under the same seed.

    Raises:
      ValueError, TypeError: options as `codec_for` says; a Dict space (use `CompressedDictReplayBuffer`);
        ``optimize_memory_usage`` that is not a bool (``TypeError``); ``normalize_images`` with a compressed key of a
        non-uint8 space.
    """


class CompressedDictReplayBuffer(_CompressedReplayImpl, DictReplayBuffer):
    """sb3-extra-buffers' ``CompressedDictReplayBuffer`` (``spaces.Dict`` observations): every key compressed, or
    those in ``compress_keys``; samples are ``DictReplayBufferSamples``."""

    _samples_type = DictReplayBufferSamples
