"""Host-compressed trajectory buffers: :class:`CompressedTrajectoryBuffer` and its prioritised variant.

A :class:`CompressedTrajectoryBuffer` is a :class:`jaxbuffers.TrajectoryBuffer` (lanes, episode
flags, final-observation ring, sequences and n-step transitions: all of that logic is reused,
not copied) whose chosen observation leaves (``compress=("pixels",)``) are replaced by small
int32 ids, while the pixels live compressed in host :class:`host_codecs.CompressedStore` s.
Sampling asks the device buffer for the ids of the sampled steps (cheap int32 gathers) and
decodes them in one host callback per sample (see :mod:`jaxbuffers.compressed._host` for the
callback rules: exactly-once ordered writes, versioned reads, not vmappable).

Frame-stack dedup (``frame_stack=k``)
-------------------------------------
When an observation leaf is a stack of the last ``k`` frames (Gymnasium's
``FrameStackObservation``; ``stack_axis`` says where the ``k`` axis is: ``0`` for ``[4, 84, 84]``,
``-1`` for ``[84, 84, 4]``), only the *newest* frame of each step's observation is stored and the
stacks are rebuilt at sample time:

* Each lane has a ring of ``length + k - 1`` frames (the frame of every stored step plus the
  ``k - 1`` before the oldest one, which its stack needs).
* Each step records ``ep_pos = min(steps since its episode started, k - 1)``. A step starts an
  episode when the previous step of its lane was terminated *or truncated* (a time-limit end is
  an episode end too), and the lane's very first step starts one. The stack of a step reads the
  frames ``d = k-1, ..., 0`` steps back; frames from before the episode start are padding:
  ``padding="reset"`` repeats the episode's first frame (Gymnasium's ``padding_type="reset"``),
  ``padding="zero"`` gives zeros. So a stack never mixes two episodes.
* A truncated step's true final observation (``final_obs``) keeps its own newest frame in a
  per-lane ring of ``final_obs_capacity`` frames (the same ring discipline as the device buffer's
  final-observation ring), stacked on the step's own frames.

This is exact when the observations given to ``add`` are what such a frame stacker produced (the
older ``k - 1`` frames of each stack are *not* read at add time). Without ``frame_stack`` every
compressed leaf is stored whole, one entry per step.

Ids stored on device: per compressed leaf, int32 ``[3]`` per step: ``(newest, prev, ep_pos)``,
the store slot of the newest frame, the store slot of the frame one step back (in the lane's
frame ring), and ``ep_pos``. Store slots: lane ``e``'s frame ring is ``[e * F, (e + 1) * F)``
(``F = length + k - 1``); final frames follow at ``num_envs * F + e * K + j``.

Example::

    import jax, jax.numpy as jnp, numpy as np
    import jaxbuffers as jb
    from jaxbuffers.compressed import CompressedTrajectoryBuffer

    step = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(step, num_envs=8, length=100_000, frame_stack=4)
    batch = jax.tree.map(lambda x: jnp.stack([x] * 8), step)
    done = jnp.zeros(8, bool)
    add = jax.jit(CompressedTrajectoryBuffer.add, donate_argnums=0)
    buf = add(buf, batch, terminated=done, truncated=done, final_obs=batch["obs"])
    buf = add(buf, batch, terminated=done, truncated=done, final_obs=batch["obs"])
    tr = buf.sample_transitions(jax.random.key(0), 32, n_step=1, gamma=0.99)   # tr.obs: uint8[32, 4, 84, 84]
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuffers import _validate
from jaxbuffers.compressed import _common
from jaxbuffers.compressed._common import LeafInfo
from jaxbuffers.compressed._host import HostStores
from jaxbuffers.trajectory import (
    PrioritisedTrajectoryBuffer,
    PrioritisedTrajectorySample,
    SequenceSample,
    TrajectoryBuffer,
    TransitionSample,
    prepare_add,
    where_real,
)

__all__ = ["CompressedTrajectoryBuffer", "CompressedPrioritisedTrajectoryBuffer", "DEFAULT_CODEC"]

#: Codec of the host stores unless ``codec=`` is given (see docs/benchmarks.md for the trade-offs).
DEFAULT_CODEC = "zstd:-1"

_ID = jax.ShapeDtypeStruct((3,), jnp.int32)


def _build(
    example_step: Mapping,
    num_envs: int,
    length: int,
    *,
    compress,
    frame_stack,
    stack_axis: int,
    padding: str,
    codec: str,
    normalize_images: bool,
    final_obs_capacity,
    obs_key: str,
    chunk_bytes: int,
    dictionary_bytes: int | None,
):
    """Shared part of both ``create`` s: returns (inner example step, config dict)."""
    if not isinstance(example_step, Mapping):
        raise TypeError(f"example_step: expected a dict with an {obs_key!r} field, got {type(example_step).__name__}")
    if obs_key not in example_step:
        raise ValueError(f"example_step: missing field {obs_key!r} (got fields {sorted(example_step)})")
    num_envs, length = _validate.static_int("num_envs", num_envs), _validate.static_int("length", length)
    if padding not in ("reset", "zero"):
        raise ValueError(f"padding: expected 'reset' (repeat the episode's first frame, Gymnasium's default) or 'zero', got {padding!r}")
    k = 1
    if frame_stack is not None:
        if isinstance(frame_stack, bool) or not isinstance(frame_stack, (int, np.integer)) or frame_stack < 1:
            raise ValueError(f"frame_stack: expected an int >= 1 (frames per observation) or None, got {frame_stack!r}")
        k = int(frame_stack)
    # as TrajectoryBuffer.create: at most `length` (more slots would never be used)
    kcap = length if final_obs_capacity is None else min(_validate.static_int("final_obs_capacity", final_obs_capacity), length)
    spec = _validate.item_spec(dict(example_step), "example_step")
    obs_spec = spec[obs_key]
    what = f"example_step[{obs_key!r}]"
    idx = _common.select_leaves(obs_spec, compress, what)
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(obs_spec)[0]]
    leaves = jax.tree.leaves(obs_spec)
    infos = []
    for i in idx:
        s = leaves[i]
        name = f"{what}{_validate.leaf_name(paths[i]) if paths[i] else ''}"
        if normalize_images and np.dtype(s.dtype) != np.uint8:
            raise ValueError(f"normalize_images: {name} has dtype {s.dtype}; x / 255 is defined for uint8 images only")
        if frame_stack is None:
            infos.append(LeafInfo(name, tuple(s.shape), np.dtype(s.dtype), tuple(s.shape), None))
            continue
        rank = len(s.shape)
        if not -rank <= stack_axis < rank:
            raise ValueError(f"stack_axis: {stack_axis} is out of range for {name} of shape {tuple(s.shape)}")
        ax = stack_axis % rank
        if s.shape[ax] != k:
            raise ValueError(
                f"frame_stack: {name} has shape {tuple(s.shape)}, so axis {stack_axis} holds {s.shape[ax]} "
                f"frames, expected frame_stack={k}; set stack_axis to the frame axis (0 for [k, H, W], "
                f"-1 for [H, W, k])"
            )
        frame = tuple(d for j, d in enumerate(s.shape) if j != ax)
        infos.append(LeafInfo(name, tuple(s.shape), np.dtype(s.dtype), frame, ax))
    ring = length + k - 1
    host = HostStores(
        num_envs * ring + num_envs * kcap + 1,  # the last slot is never written: the empty slot
        codec,
        [i.frame_shape for i in infos],
        [i.dtype for i in infos],
        [i.name for i in infos],
        chunk_bytes=chunk_bytes,
        dictionary_bytes=dictionary_bytes,
    )
    inner_obs = _common.replace_leaves(obs_spec, idx, [_ID] * len(idx))
    inner_step = dict(spec)
    inner_step[obs_key] = inner_obs
    config = dict(
        host=host,
        leaves=tuple(infos),
        leaf_index=tuple(idx),
        frame_stack=k,
        padding=padding,
        normalize_images=bool(normalize_images),
        frame_ring=ring,
    )
    return inner_step, kcap, config


@jax.jit
def _add_device_jit(buf, step, terminated, truncated, final_obs):
    """The device half of an add, jitted once per buffer configuration (see ``add_from_host``)."""
    return buf._add_device(step, terminated, truncated, final_obs)


@functools.partial(jax.jit, static_argnames=("batch_size", "n_step"))
def _sample_ids_jit(buf, key, batch_size, n_step, gamma):
    """The device half of ``sample_transitions_from_host``: the sample with id leaves, and the
    store slots (+ zero-pad masks) of the obs and next-obs stacks."""
    s = buf.buffer.sample_transitions(key, batch_size, n_step=n_step, gamma=gamma)
    return s, buf._frame_ids(_common.pick_leaves(s.obs, buf.leaf_index)[0]), buf._frame_ids(
        _common.pick_leaves(s.next_obs, buf.leaf_index)[0]
    )


@functools.partial(jax.jit, static_argnames=("batch_size", "n_step"))
def _sample_ids_prioritised_jit(buf, key, batch_size, n_step, gamma, beta):
    """:func:`_sample_ids_jit` for the prioritised buffer (the sample's ``item`` holds the ids)."""
    s = buf.buffer.sample_transitions(key, batch_size, beta=beta, gamma=gamma, n_step=n_step)
    return s, buf._frame_ids(_common.pick_leaves(s.item.obs, buf.leaf_index)[0]), buf._frame_ids(
        _common.pick_leaves(s.item.next_obs, buf.leaf_index)[0]
    )


@jax.jit
def _add_ids_jit(buf, step, terminated, truncated, final_obs):
    """The device half of a staged chunk add (no pixels on device; see ``_add_frames_from_host``)."""
    return buf._add_ids(step, terminated, truncated, final_obs)


class CompressedTrajectoryBuffer(struct.PyTreeNode):
    """A :class:`~jaxbuffers.TrajectoryBuffer` whose chosen observation leaves live compressed on the host.

    Same methods and sample types as :class:`~jaxbuffers.TrajectoryBuffer`; sampled observations
    are decoded (and frame stacks rebuilt) on the host. With the same adds and keys it returns
    exactly what a ``TrajectoryBuffer`` returns (float32 ``x / 255`` for compressed leaves when
    ``normalize_images``). See the module docstring for frame dedup and the id layout, and
    :mod:`jaxbuffers.compressed._host` for the callback rules. Not vmappable (one host store);
    jittable, ``lax.scan``-able, donatable.
    """

    buffer: Any  # TrajectoryBuffer (PrioritisedTrajectoryBuffer for the subclass); compressed leaves hold int32[3] ids
    frame_head: jax.Array  # shape=(), dtype=int32: position of the next step in every lane's frame ring, in [0, frame_ring)
    next_ep_pos: jax.Array  # shape=[num_envs], dtype=int32: ep_pos of each lane's next step (0 = starts an episode)
    final_head: jax.Array  # shape=[num_envs], dtype=int32: next final-frame slot per lane, in [0, final_obs_capacity)
    version: jax.Array  # shape=(), dtype=int32: host-store writes included in this state
    host: HostStores = struct.field(pytree_node=False)
    leaves: tuple = struct.field(pytree_node=False)  # LeafInfo per compressed leaf
    leaf_index: tuple = struct.field(pytree_node=False)  # flat index of each compressed leaf within obs
    frame_stack: int = struct.field(pytree_node=False)  # k (1: no dedup)
    padding: str = struct.field(pytree_node=False)
    normalize_images: bool = struct.field(pytree_node=False)
    frame_ring: int = struct.field(pytree_node=False)  # F = length + k - 1 frames per lane

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(
        cls,
        example_step: Mapping,
        num_envs: int,
        length: int,
        *,
        compress: Sequence[str] | None = None,
        frame_stack: int | None = None,
        stack_axis: int = 0,
        padding: str = "reset",
        codec: str = DEFAULT_CODEC,
        normalize_images: bool = False,
        final_obs_capacity: int | None = None,
        obs_key: str = "obs",
        action_key: str = "action",
        reward_key: str = "reward",
        chunk_bytes: int = 64 << 20,
        dictionary_bytes: int | None = None,
    ) -> "CompressedTrajectoryBuffer":
        """An empty compressed buffer of ``num_envs`` lanes of ``length`` steps.

        Args:
          example_step, num_envs, length, final_obs_capacity, obs_key, action_key, reward_key: as
            :meth:`jaxbuffers.TrajectoryBuffer.create`. Size ``final_obs_capacity`` (K) to the
            number of truncations a lane can hold (``ceil(length / T_max) + 1``): it also sizes the
            host's final-frame ring.
          compress: names of the observation leaves to store on the host (dict keys on the leaf's
            path, e.g. ``("pixels",)``); ``None``: every leaf of the observation. Other leaves
            stay on device.
          frame_stack: ``k`` when the compressed leaves are stacks of the last ``k`` frames: store
            one frame per step and rebuild stacks at sample time (module docstring). ``None``:
            store each observation whole.
          stack_axis: axis of the ``k`` frames within one observation (``0``: ``[k, H, W]``,
            ``-1``: ``[H, W, k]``).
          padding: ``"reset"`` (repeat the episode's first frame) or ``"zero"``.
          codec: host codec (``"zstd:-1"`` default: zstd's fast level -1, see :mod:`host_codecs.zstd`; ``"zstd:1".."zstd:22"``, ``"igzip:0".."igzip:3"``, ``"rle"``, ``"none"``).
          normalize_images: sampled compressed leaves come back float32 in ``[0, 1]`` (``x / 255``,
            uint8 leaves only) instead of their stored dtype.
          chunk_bytes: largest host arena chunk.
          dictionary_bytes: most content bytes of the zstd dictionary each host store builds
            from its first 1,024 frames and encodes later frames with (``None``: 16 KiB for a
            zstd codec, 0 otherwise; 0: no dictionary). 84x84 Atari frames: 2-3x smaller,
            decode ~2x faster (:class:`host_codecs.ZstdDictionary`).

        Raises:
          TypeError / ValueError: as ``TrajectoryBuffer.create``; ``compress`` naming no leaf;
            a stacked leaf whose ``stack_axis`` does not hold ``frame_stack`` frames;
            ``normalize_images`` on a non-uint8 leaf; a bad ``padding``; an unknown codec;
            ``dictionary_bytes`` with a codec other than zstd.
        """
        inner_step, kcap, config = _build(
            example_step, num_envs, length, compress=compress, frame_stack=frame_stack,
            stack_axis=stack_axis, padding=padding, codec=codec, normalize_images=normalize_images,
            final_obs_capacity=final_obs_capacity, obs_key=obs_key, chunk_bytes=chunk_bytes,
            dictionary_bytes=dictionary_bytes,
        )
        inner = TrajectoryBuffer.create(
            inner_step, num_envs, length, final_obs_capacity=kcap, obs_key=obs_key,
            action_key=action_key, reward_key=reward_key,
        )
        return cls._wrap(inner, config)

    @classmethod
    def _wrap(cls, inner, config):
        e = int(num_envs_of(inner))
        # Unwritten steps hold id -1 (decoded as zeros, like the zeros of an unwritten plain
        # TrajectoryBuffer), so even a sample taken before can_sample is True matches it exactly.
        traj = inner.buffer if isinstance(inner, PrioritisedTrajectoryBuffer) else inner
        idx = config["leaf_index"]
        empty = lambda tree: _common.replace_leaves(  # noqa: E731
            tree, idx, [jnp.full_like(x, -1) for x in _common.pick_leaves(tree, idx)]
        )
        storage = dict(traj.storage)
        storage[traj.obs_key] = empty(storage[traj.obs_key])
        traj = traj.replace(storage=storage, final_obs=empty(traj.final_obs))
        inner = inner.replace(buffer=traj) if isinstance(inner, PrioritisedTrajectoryBuffer) else traj
        return cls(
            buffer=inner,
            frame_head=jnp.int32(0),
            next_ep_pos=jnp.zeros((e,), jnp.int32),
            final_head=jnp.zeros((e,), jnp.int32),
            version=jnp.int32(0),
            **config,
        )

    # ------------------------------------------------------------------ properties
    @property
    def trajectory(self) -> TrajectoryBuffer:
        """The device-side :class:`~jaxbuffers.TrajectoryBuffer` (compressed leaves hold ids)."""
        return self.buffer

    @property
    def num_envs(self) -> int:
        """Number of lanes (static Python int)."""
        return self.trajectory.num_envs

    @property
    def length(self) -> int:
        """Steps kept per lane (static Python int)."""
        return self.trajectory.length

    @property
    def final_obs_capacity(self) -> int:
        """Final observations kept per lane for truncated steps (K; static Python int)."""
        return self.trajectory.final_obs_capacity

    @property
    def step_spec(self) -> Any:
        """Dict of ``jax.ShapeDtypeStruct``: one step of one env as the user sees it."""
        traj = self.trajectory
        spec = dict(traj.step_spec)
        spec[traj.obs_key] = _common.replace_leaves(
            spec[traj.obs_key], self.leaf_index, [jax.ShapeDtypeStruct(i.shape, i.dtype) for i in self.leaves]
        )
        return spec

    @property
    def device_nbytes(self) -> int:
        """Bytes of every device array (the id-holding trajectory buffer and the counters)."""
        return _validate.tree_nbytes(self)

    @property
    def host_nbytes(self) -> int:
        """Host bytes held: compressed arenas, store indexes and slot versions (honest, see host_codecs)."""
        return self.host.nbytes

    @property
    def nbytes(self) -> int:
        """``device_nbytes + host_nbytes``."""
        return self.device_nbytes + self.host_nbytes

    def uncompressed_nbytes(self) -> int:
        """Bytes a plain ``TrajectoryBuffer`` with the same configuration would hold (shapes only)."""
        traj = self.trajectory
        abstract = jax.eval_shape(
            lambda: TrajectoryBuffer.create(
                self.step_spec, traj.num_envs, traj.length, final_obs_capacity=traj.final_obs_capacity,
                obs_key=traj.obs_key, action_key=traj.action_key, reward_key=traj.reward_key,
            )
        )
        return _validate.tree_nbytes(abstract)

    def size(self) -> jax.Array:
        """Steps stored over all lanes (int32 scalar)."""
        return self.buffer.size()

    def is_full(self) -> jax.Array:
        """Whether every slot of every lane holds a step (bool scalar)."""
        return self.buffer.is_full()

    def num_added(self) -> int:
        """Exact number of steps ever added per lane (host-side Python int)."""
        return self.trajectory.num_added()

    def can_sample(self, sequence_length: int = 1, **kwargs) -> jax.Array:
        """:meth:`jaxbuffers.TrajectoryBuffer.can_sample` (for n-step transitions pass ``n_step + 1``)."""
        return self.buffer.can_sample(sequence_length, **kwargs)

    def close(self) -> None:
        """Free the host memory now (the buffer cannot be used afterwards)."""
        self.host.close()

    # ------------------------------------------------------------------ add
    def _prepare(self, step, terminated, truncated, final_obs):
        """Validate against the user-facing spec; return everything with a time axis."""
        traj = self.trajectory
        return prepare_add(self.step_spec, traj.obs_key, traj.num_envs, traj.length, step, terminated, truncated, final_obs)

    def add(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> "CompressedTrajectoryBuffer":
        """Append one step ``[num_envs, ...]`` or a chunk ``[num_envs, t, ...]`` to every lane.

        Same arguments, shapes and errors as :meth:`jaxbuffers.TrajectoryBuffer.add`. The newest
        frame of each compressed observation (the whole observation without ``frame_stack``) and,
        where ``truncated & ~terminated``, of its ``final_obs`` are written to the host in one
        ordered callback; the device buffer gets their ids.

        Returns:
          The new buffer (the previous state must not be added to again: that would fork the
          shared host store, and the write raises).
        """
        new, (slots, valid, datas) = self._add_device(step, terminated, truncated, final_obs)
        return new.replace(version=_common.write(self.host, self.version, slots, valid, datas))

    def add_from_host(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> "CompressedTrajectoryBuffer":
        """:meth:`add` for Python-driven loops (one env step per call, SB3 style); not traceable.

        Same arguments, results, shapes and errors as :meth:`add`, and the buffer it returns is
        identical. The device part runs as one jitted call (compiled once per buffer) and the host
        write is a direct Python call instead of a host callback. Per step it costs about what a
        jitted :meth:`add` costs (Breakout, 2-core CPU: 365-392 us against 320-392 us); it was
        twice as fast while the jitted write was an ``io_callback``. It is also what
        :class:`~jaxbuffers.compressed.StagingWriter` flushes through. Use :meth:`add` inside
        ``jit`` / ``lax.scan``.

        Raises:
          TypeError: called under a JAX transformation (use :meth:`add` there).
          StaleBufferError: this state was already added to (raised directly, not wrapped).
        """
        if isinstance(self.version, jax.core.Tracer):
            raise TypeError("add_from_host cannot be traced (jit/scan/vmap); call add() inside traced code")
        new, parts = _add_device_jit(self, step, terminated, truncated, final_obs)
        slots, valid, datas = jax.device_get(parts)
        version = self.host.write(np.asarray(self.version), slots, valid, *datas)
        return new.replace(version=jnp.asarray(version, jnp.int32))

    def _add_device(self, step, terminated, truncated, final_obs):
        """Everything :meth:`add` does on device; returns (state without the version bump, write parts)."""
        step, terminated, truncated, final_obs = self._prepare(step, terminated, truncated, final_obs)
        e, t = terminated.shape
        obs = step[self.trajectory.obs_key]
        datas = [
            _common.newest_frame(x, i, 2).reshape(e * t, *i.frame_shape)
            for x, i in zip(_common.pick_leaves(obs, self.leaf_index), self.leaves)
        ]
        if truncated is not None:
            fframes = [
                _common.newest_frame(x, i, 2).reshape(e * t, *i.frame_shape)
                for x, i in zip(_common.pick_leaves(final_obs, self.leaf_index), self.leaves)
            ]
            datas = [jnp.concatenate([d, f]) for d, f in zip(datas, fframes)]
        new, (slots, valid) = self._add_ids(step, terminated, truncated, final_obs)
        return new, (slots, valid, datas)

    def _add_ids(self, step, terminated, truncated, final_obs):
        """The device half of an add given a time axis (``[E, t]`` flags): ids, episode positions,
        the inner buffer's add. The compressed leaves of ``step[obs]`` / ``final_obs`` are not read
        (they are replaced by ids; any array stands in for them). Returns (state without the
        version bump, (store slots ``[M]``, rows to write ``[M]``)): rows ``[0, E*t)`` are the
        newest frames of the steps, lane-major, then (with ``truncated``) ``E*t`` final frames."""
        traj = self.trajectory
        e, t = terminated.shape
        k, ring, kcap = self.frame_stack, self.frame_ring, traj.final_obs_capacity
        j = jnp.arange(t, dtype=jnp.int32)
        lane = jnp.arange(e, dtype=jnp.int32)[:, None]
        pos = (self.frame_head + j) % ring  # [t]
        newest = lane * ring + pos[None, :]  # [E, t] store slots of this chunk's frames
        prev = lane * ring + ((pos - 1) % ring)[None, :]
        ends = terminated if truncated is None else terminated | truncated
        # ep_pos: steps since the episode start (clipped to k - 1). Step j starts an episode iff
        # step j - 1 ended one (or, for j = 0, the previous add's last step did: next_ep_pos == 0).
        last_end = jax.lax.cummax(jnp.where(ends, j[None, :], -1), axis=1)
        before = jnp.concatenate([jnp.full((e, 1), -1, jnp.int32), last_end[:, :-1]], axis=1)
        ep = jnp.where(before >= 0, j[None, :] - before - 1, self.next_ep_pos[:, None] + j[None, :])
        ep = jnp.minimum(ep, k - 1).astype(jnp.int32)
        next_ep = jnp.where(ends[:, -1], 0, jnp.minimum(ep[:, -1] + 1, k - 1)).astype(jnp.int32)
        ids = jnp.stack([newest, prev, ep], axis=-1).astype(jnp.int32)  # [E, t, 3]

        obs = step[traj.obs_key]
        slots = newest.reshape(-1)
        valid = jnp.ones((e * t,), bool)
        final_head = self.final_head
        inner_final = None
        if truncated is not None:
            boot = truncated & ~terminated
            cum = jnp.cumsum(boot.astype(jnp.int32), axis=1)
            fslot = (final_head[:, None] + cum - 1) % kcap
            fstore = e * ring + lane * kcap + fslot  # [E, t]
            final_head = ((final_head + cum[:, -1]) % kcap).astype(jnp.int32)
            fids = jnp.stack([fstore, newest, jnp.minimum(ep + 1, k - 1)], axis=-1).astype(jnp.int32)
            slots = jnp.concatenate([slots, fstore.reshape(-1)])
            valid = jnp.concatenate([valid, boot.reshape(-1)])
            inner_final = _common.replace_leaves(final_obs, self.leaf_index, [fids] * len(self.leaves))
        inner_step = dict(step)
        inner_step[traj.obs_key] = _common.replace_leaves(obs, self.leaf_index, [ids] * len(self.leaves))
        inner = self.buffer.add(inner_step, terminated=terminated, truncated=truncated, final_obs=inner_final)
        new = self.replace(
            buffer=inner,
            frame_head=((self.frame_head + t) % ring).astype(jnp.int32),
            next_ep_pos=next_ep,
            final_head=final_head,
        )
        return new, (slots, valid)

    def _add_frames_from_host(self, step, frames, terminated, truncated=None, final_obs=None, final_frames=None):
        """:meth:`add_from_host` of a chunk whose compressed leaves are given as host frames.

        For :class:`~jaxbuffers.compressed.StagingWriter`, which has already validated the
        steps. ``step`` / ``final_obs``: ``[E, t, ...]`` pytrees whose compressed leaves are
        placeholders (not read); ``frames`` / ``final_frames``: per compressed leaf, numpy
        ``[E, t, *frame_shape]``, the newest frame of each observation (of each final
        observation). Only the flags and the other leaves go to the device; the frames are
        written to the host store directly. Same resulting state as :meth:`add_from_host` of
        the full observations.
        """
        new, (slots, valid) = _add_ids_jit(self, step, terminated, truncated, final_obs)
        slots, valid = jax.device_get((slots, valid))
        e, t = terminated.shape
        datas = [np.reshape(f, (e * t, *i.frame_shape)) for f, i in zip(frames, self.leaves)]
        if truncated is not None:
            datas = [np.concatenate([d, np.reshape(f, (e * t, *i.frame_shape))]) for d, f, i in zip(datas, final_frames, self.leaves)]
        version = self.host.write(np.asarray(self.version), slots, valid, *datas)
        return new.replace(version=jnp.asarray(version, jnp.int32))

    # ------------------------------------------------------------------ decode
    def _frame_ids(self, ids: jax.Array):
        """ids ``[*S, 3]`` -> (store slots ``[*S, k]`` oldest to newest, zero-pad mask or None)."""
        k, ring = self.frame_stack, self.frame_ring
        newest, prev, ep = ids[..., 0], ids[..., 1], ids[..., 2]
        empty = self.host.num_slots - 1  # never written: decodes as zeros
        newest = jnp.where(newest < 0, empty, newest)
        if self.leaves[0].stack_axis is None:
            return newest, None
        d = (k - 1) - jnp.arange(k, dtype=jnp.int32)  # frames back, per stack position
        pad = None
        if self.padding == "reset":
            back = jnp.minimum(d, ep[..., None])
        else:
            pad = d > ep[..., None]
            back = jnp.where(pad, 0, d)
        base = (prev // ring)[..., None] * ring
        older = base + ((prev % ring)[..., None] - (back - 1)) % ring
        fids = jnp.where((back == 0) | (prev < 0)[..., None], newest[..., None], older)
        return fids.astype(jnp.int32), pad

    def decode_obs(self, *obs: Any) -> Any:
        """Replace the id leaves of sampled observation pytrees (leaves ``[*S, 3]``) by the decoded
        observations ``[*S, *shape]``. Several pytrees are decoded in one host callback (frames
        they share are decoded once); one pytree in, one out; several in, a tuple out."""
        fids, pads, leads = [], [], []
        for o in obs:
            ids = _common.pick_leaves(o, self.leaf_index)[0]
            f, p = self._frame_ids(ids)
            fids.append(f)
            pads.append(p)
            leads.append(ids.ndim - 1)
        decoded = _common.read(self.host, self.leaves, self.version, *fids)
        outs = []
        for j, o in enumerate(obs):
            leaves = [_common.finish(decoded[i][j], info, leads[j], pads[j], self.normalize_images) for i, info in enumerate(self.leaves)]
            outs.append(_common.replace_leaves(o, self.leaf_index, leaves))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _decode_pair(self, obs: Any, next_obs: Any):
        """Decode ``obs`` and ``next_obs`` in one callback (they share most stack frames)."""
        return self.decode_obs(obs, next_obs)

    def _decode_transitions(self, s: TransitionSample) -> TransitionSample:
        obs, next_obs = self._decode_pair(s.obs, s.next_obs)
        item = dict(s.item)
        item[self.trajectory.obs_key] = obs
        return s._replace(obs=obs, next_obs=next_obs, item=item)

    def _decode_sequences(self, s: SequenceSample) -> SequenceSample:
        item = dict(s.item)
        key = self.trajectory.obs_key
        item[key] = self.decode_obs(item[key])
        return s._replace(item=item)

    def final_obs_at(self, indices, sequence_length: int) -> Any:
        """:meth:`jaxbuffers.TrajectoryBuffer.final_obs_at`, observations decoded (``[B, L, ...]``):
        at every truncated (and not terminated) step of the sequences starting at ``indices``, the
        true final observation (for the prioritised buffer too); zeros elsewhere. One host callback;
        the other steps read the store's never-written slot (zeros), not their frames."""
        inner = self.trajectory
        sequence_length = inner._sequence_length(sequence_length)
        lanes, slots = inner._split_indices(indices)
        final, real = inner._final_obs(lanes, slots, sequence_length)
        ids = [jnp.where(real[..., None], x, -1) for x in _common.pick_leaves(final, self.leaf_index)]  # -1: decodes as zeros
        return self.decode_obs(_common.replace_leaves(where_real(real, final), self.leaf_index, ids))

    # ------------------------------------------------------------------ sample
    def sample_sequences(
        self, key: jax.Array, batch_size: int, sequence_length: int, *, period: int = 1, cross_episodes: bool = True
    ) -> SequenceSample:
        """:meth:`jaxbuffers.TrajectoryBuffer.sample_sequences`, observations decoded (``[B, L, ...]``)."""
        s = self.buffer.sample_sequences(key, batch_size, sequence_length, period=period, cross_episodes=cross_episodes)
        return self._decode_sequences(s)

    def sample_transitions_from_host(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma) -> TransitionSample:
        """:meth:`sample_transitions` for Python-driven loops; not traceable. Same arguments and
        the same result (bit for bit, tested) for the same buffer and key.

        The index draw runs as one jitted call (compiled once per buffer and shape); the frames
        are then decoded by a direct host call into fresh 64-byte aligned numpy arrays, which
        JAX adopts without a copy on the CPU backend (other backends copy them to the device
        once). Compared with the jitted :meth:`sample_transitions`, this skips the host callback
        (JAX's slow dispatch path for callback-holding programs) and the copy of the callback's
        result into XLA's output buffers. Inside ``jit`` use :meth:`sample_transitions`.

        Raises:
          TypeError: called under a JAX transformation.
          StaleBufferError: the buffer state is older than the host store (raised directly).
        """
        self._check_eager(key)
        s, obs_ids, next_ids = _sample_ids_jit(self, key, batch_size, n_step, gamma)
        return self._decode_host_transitions(s, obs_ids, next_ids)

    def _check_eager(self, key) -> None:
        if isinstance(self.version, jax.core.Tracer) or isinstance(key, jax.core.Tracer):
            raise TypeError("sample_transitions_from_host cannot be traced (jit/scan/vmap); call sample_transitions() there")

    def _decode_host_transitions(self, s: TransitionSample, obs_ids, next_ids) -> TransitionSample:
        """A sample with id leaves -> the decoded sample (eager; see :meth:`_decode_host`)."""
        obs, nxt = self._decode_host([obs_ids[0], next_ids[0]], [obs_ids[1], next_ids[1]])
        obs = _common.replace_leaves(s.obs, self.leaf_index, obs)
        nxt = _common.replace_leaves(s.next_obs, self.leaf_index, nxt)
        item = dict(s.item)
        item[self.trajectory.obs_key] = obs
        return s._replace(obs=obs, next_obs=nxt, item=item)

    def _decode_host(self, fids: list, pads: list) -> list[list[jax.Array]]:
        """Eager decode (no callback) of store-slot arrays from :meth:`_frame_ids`.

        Args:
          fids: per request, int32 ``[*S, k]`` slots (``[*S]`` without frame dedup), device or host.
          pads: per request, bool ``[*S, k]`` zero-padding mask or None.

        Returns:
          Per request, per compressed leaf: the finished observations (jax arrays; on the CPU
          backend they adopt the decoded, 64-byte aligned host memory without a copy).
        """
        fids, pads = jax.device_get((list(fids), list(pads)))
        decoded = self.host.read(np.asarray(self.version), *fids, aligned=True)
        m = len(fids)
        out: list[list[jax.Array]] = [[] for _ in range(m)]
        for i, info in enumerate(self.leaves):
            for j in range(m):
                frames = decoded[i * m + j]  # a fresh array: zero the padded frames in place
                if pads[j] is not None:
                    frames[np.asarray(pads[j])] = 0
                lead = fids[j].ndim - (0 if info.stack_axis is None else 1)
                # device_put, not jnp.asarray: the latter copies host memory (measured: 0.67 ms at batch
                # 256); device_put adopts it on the CPU backend.
                out[j].append(_common.finish(jax.device_put(frames), info, lead, None, self.normalize_images))
        return out

    def sample_transitions(self, key: jax.Array, batch_size: int, *, n_step: int = 1, gamma) -> TransitionSample:
        """:meth:`jaxbuffers.TrajectoryBuffer.sample_transitions`, ``obs`` / ``next_obs`` decoded.

        ``next_obs`` after a truncation is the true final observation (its stack rebuilt from the
        step's frames and the stored final frame).
        """
        return self._decode_transitions(self.buffer.sample_transitions(key, batch_size, n_step=n_step, gamma=gamma))


def num_envs_of(inner) -> int:
    return inner.buffer.num_envs if isinstance(inner, PrioritisedTrajectoryBuffer) else inner.num_envs


class CompressedPrioritisedTrajectoryBuffer(CompressedTrajectoryBuffer):
    """A :class:`~jaxbuffers.trajectory.PrioritisedTrajectoryBuffer` with host-compressed observations.

    ``create`` takes the arguments of both :meth:`CompressedTrajectoryBuffer.create` and
    :meth:`PrioritisedTrajectoryBuffer.create`; sampling returns a
    :class:`~jaxbuffers.trajectory.PrioritisedTrajectorySample` whose ``item`` is decoded.
    """

    @classmethod
    def create(
        cls,
        example_step: Mapping,
        num_envs: int,
        length: int,
        *,
        window_length: int,
        period: int = 1,
        priority_exponent: float = 0.6,
        epsilon: float = 1e-6,
        compress: Sequence[str] | None = None,
        frame_stack: int | None = None,
        stack_axis: int = 0,
        padding: str = "reset",
        codec: str = DEFAULT_CODEC,
        normalize_images: bool = False,
        final_obs_capacity: int | None = None,
        obs_key: str = "obs",
        action_key: str = "action",
        reward_key: str = "reward",
        chunk_bytes: int = 64 << 20,
        dictionary_bytes: int | None = None,
    ) -> "CompressedPrioritisedTrajectoryBuffer":
        """An empty prioritised compressed buffer (arguments: see the two ``create`` s it combines)."""
        inner_step, kcap, config = _build(
            example_step, num_envs, length, compress=compress, frame_stack=frame_stack,
            stack_axis=stack_axis, padding=padding, codec=codec, normalize_images=normalize_images,
            final_obs_capacity=final_obs_capacity, obs_key=obs_key, chunk_bytes=chunk_bytes,
            dictionary_bytes=dictionary_bytes,
        )
        inner = PrioritisedTrajectoryBuffer.create(
            inner_step, num_envs, length, window_length=window_length, period=period,
            priority_exponent=priority_exponent, epsilon=epsilon, final_obs_capacity=kcap, obs_key=obs_key,
            action_key=action_key, reward_key=reward_key,
        )
        return cls._wrap(inner, config)

    @property
    def trajectory(self) -> TrajectoryBuffer:
        """The device-side :class:`~jaxbuffers.TrajectoryBuffer` under the prioritised wrapper."""
        return self.buffer.buffer

    def can_sample(self) -> jax.Array:  # type: ignore[override]
        """Whether some window is valid (bool scalar)."""
        return self.buffer.can_sample()

    def sample_sequences(  # type: ignore[override]
        self, key: jax.Array, batch_size: int, *, beta, sequence_length: int | None = None
    ) -> PrioritisedTrajectorySample:
        """:meth:`PrioritisedTrajectoryBuffer.sample_sequences`, observations decoded."""
        s = self.buffer.sample_sequences(key, batch_size, beta=beta, sequence_length=sequence_length)
        return s._replace(item=self._decode_sequences(s.item))

    def sample_transitions_from_host(  # type: ignore[override]
        self, key: jax.Array, batch_size: int, *, beta, gamma, n_step: int | None = None
    ) -> PrioritisedTrajectorySample:
        """:meth:`sample_transitions` for Python-driven loops; not traceable. Same arguments and
        the same result (bit for bit, tested) for the same buffer and key: the draw runs as one
        jitted call, the frames are decoded by a direct host call (see
        :meth:`CompressedTrajectoryBuffer.sample_transitions_from_host`).

        Raises:
          TypeError: called under a JAX transformation.
          StaleBufferError: the buffer state is older than the host store (raised directly).
        """
        self._check_eager(key)
        s, obs_ids, next_ids = _sample_ids_prioritised_jit(self, key, batch_size, n_step, gamma, beta)
        return s._replace(item=self._decode_host_transitions(s.item, obs_ids, next_ids))

    def sample_transitions(  # type: ignore[override]
        self, key: jax.Array, batch_size: int, *, beta, gamma, n_step: int | None = None
    ) -> PrioritisedTrajectorySample:
        """:meth:`PrioritisedTrajectoryBuffer.sample_transitions`, ``obs`` / ``next_obs`` decoded."""
        s = self.buffer.sample_transitions(key, batch_size, beta=beta, gamma=gamma, n_step=n_step)
        return s._replace(item=self._decode_transitions(s.item))

    def set_priorities(self, indices: jax.Array, priorities: jax.Array, generations: jax.Array) -> "CompressedPrioritisedTrajectoryBuffer":
        """:meth:`PrioritisedTrajectoryBuffer.set_priorities` (device only, no host work)."""
        return self.replace(buffer=self.buffer.set_priorities(indices, priorities, generations))
