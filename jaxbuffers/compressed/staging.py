"""Host-side staging of one-step adds for Python-driven loops: `StagingWriter`.

A training loop written in Python (SB3 style: `env.step`, then `buffer.add` of one step) pays a
program launch and a host callback per add. `StagingWriter` pays them once per *chunk*:

* `writer.add(step, terminated=..., truncated=..., final_obs=...)` checks the step against the
  buffer (the errors of `CompressedTrajectoryBuffer.add`, raised here, not later) and copies it
  into preallocated numpy arrays `[num_envs, max_pending, ...]`. Nothing else.
* When `max_pending` steps are staged, or on `flush`, the staged steps go into the buffer as
  chunk adds `[num_envs, t, ...]`, oldest first, in power-of-two chunks no longer than the
  buffer's `length` (`p = 13` -> `8 + 4 + 1`), so at most `floor(log2(min(max_pending,
  length))) + 1` chunk shapes are ever compiled (twice that when only some carry `truncated`).
* `buffer`, `sample_transitions` and `sample_sequences` flush first: a sample sees every step added before it.
  `sample_transitions` then runs one cached jitted sample (compiled once per batch size and `n_step`).

Until a flush, staged steps are held uncompressed in host memory owned by the writer (`max_pending` steps per env)
and are not in the buffer pytree: a state obtained before the flush does not contain them. A flush that fails (e.g.
`StaleBufferError`) keeps every step not yet added staged, so a retry loses nothing. After a flush the buffer equals
the one the same steps added one by one give (every device array, hence the same samples for the same keys), except
`version`, which counts host writes (one per chunk here).

The buffer stays a pure pytree: the writer is a plain Python object around it, for host loops
only; inside `jit` / `lax.scan` call `CompressedTrajectoryBuffer.add` directly.

Example:
    ``python writer = StagingWriter(CompressedTrajectoryBuffer.create(example, num_envs=1, length=100_000,
    frame_stack=4)) for t in range(n):
        writer.add(step_t, terminated=term_t) # numpy [num_envs, ...]: a copy if t % 4 == 0:
            batch = writer.sample_transitions(key, 32, gamma=0.99)   # flushes, then samples
    buf = writer.buffer # flushed buffer state (pytree) ``
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import numpy as np

from jaxbuffers import _validate

__all__ = ["StagingWriter"]


def _as_float(x):
    """A Python or numpy real scalar as a Python float (traced into the jit as a float32 scalar,
    whatever it was); anything else unchanged, for the checks to judge."""
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
        return float(x)
    return x


def _without_item_obs(s, obs_key: str):
    """The transition sample `s` with `s.item[obs_key]` (the same observations as `s.obs`) set to
    None: returned from a jitted function, the repeat would be a second device copy."""
    return s._replace(item={**s.item, obs_key: None})


def _with_item_obs(s, obs_key: str):
    """Undo `_without_item_obs`: `s.item[obs_key]` is `s.obs` again (no copy)."""
    return s._replace(item={**s.item, obs_key: s.obs})


@functools.partial(jax.jit, static_argnames=("batch_size", "n_step"))
def _sample_transitions_jit(buf, key, batch_size, n_step, gamma, beta):
    """`buf.sample_transitions` (uniform when `beta` is None, else prioritised), jitted once
    per shape, without the sample's repeat of the observations (see `_without_item_obs`)."""
    prioritised = {} if beta is None else {"beta": beta}
    return _without_item_obs(buf.sample_transitions(key, batch_size, n_step=n_step, gamma=gamma, **prioritised), buf.trajectory.obs_key)


def _pow2_pieces(n: int, cap: int | None = None) -> list[int]:
    """`n` as decreasing powers of two, none above `cap`: 13 -> [8, 4, 1]; cap 4 -> [4, 4, 4, 1].
    Chunk lengths, so that a flush of any size compiles one of O(log max_pending) programs."""
    top = 1 << ((cap if cap is not None else n).bit_length() - 1)  # largest power of two <= cap
    out = []
    while n:
        size = min(top, 1 << (n.bit_length() - 1))
        out.append(size)
        n -= size
    return out


class StagingWriter:
    """Stages one-step adds in host numpy arrays and adds them to a compressed buffer in chunks.

    See the module docstring for where staged data lives and when it is flushed.

    Args:
      buffer: a `jaxbuffers.compressed.CompressedTrajectoryBuffer` (or its prioritised
        subclass) state; the writer owns it from now on (add through the writer only).
      max_pending: steps staged before an automatic flush (int >= 1; default 256). Host memory
        held: `max_pending` x one step of every env (compressed leaves: their newest frame), plus, once
        `truncated` is used, the final observations: their uncompressed leaves for every staged step, the newest
        frame of the compressed ones for the steps whose final observation is read (`truncated & ~terminated`).
      donate: each flush gives the wrapped state up to the next one (`add_frames_from_host(donate=True)`: O(chunk)
        device work instead of a copy of the state's arrays per flush); a state read from `buffer` is then valid
        until the next flush only (its arrays are reused by it). Default False: every state read stays valid.

    Raises:
      TypeError: `buffer` is not a compressed trajectory buffer.
      ValueError: `max_pending` not an int >= 1; a stacked (vmapped) `buffer`.
      RuntimeError: `buffer` was closed.

    Every method checks all of its arguments before it stages, flushes or samples anything; after `close()` each
    raises `RuntimeError`.
    """

    def __init__(self, buffer: Any, max_pending: int = 256, donate: bool = False):
        from jaxbuffers.compressed.trajectory import CompressedTrajectoryBuffer

        if not isinstance(buffer, CompressedTrajectoryBuffer):
            raise TypeError(f"buffer: expected a CompressedTrajectoryBuffer, got {type(buffer).__name__}")
        _validate.unstacked("buffer", buffer, "give the writer one member's state")  # checked once: adds do not again
        self.max_pending = _validate.static_int("max_pending", max_pending)
        self.donate = _validate.static_bool("donate", donate)
        buffer.host.check_state("StagingWriter")
        self._buf = buffer
        self._checked: set = set()  # (method, static arguments, key type) whose sample was traced once (`_sample`)
        self._passed: tuple | None = None  # layout of the last arguments `add` accepted (`jaxbuffers._validate.layout`)
        self._spec = buffer.step_spec
        self._obs_key = buffer.trajectory.obs_key
        e, p = buffer.num_envs, self.max_pending
        self.num_envs = e
        leaves, self._treedef = jax.tree.flatten(self._spec)
        self._obs_leaves, self._obs_treedef = jax.tree.flatten(self._spec[self._obs_key])
        # Flat step leaves = the obs leaves, contiguous, at some offset (dict keys are sorted):
        # find it, and which of them are compressed (staged as their newest frame only).
        keys = sorted(self._spec)
        self._obs_offset = sum(len(jax.tree.leaves(self._spec[k])) for k in keys[: keys.index(self._obs_key)])
        self._info = dict(zip(buffer.leaf_index, buffer.leaves))  # obs leaf index -> LeafInfo
        self._stage = []  # per step leaf: [E, P, *leaf] (compressed obs leaves: [E, P, *frame])
        for i, sp in enumerate(leaves):
            info = self._info.get(i - self._obs_offset)
            shape = sp.shape if info is None else info.frame_shape
            self._stage.append(np.zeros((e, p, *shape), sp.dtype))
        self._placeholder = np.zeros((e, p, 3), np.int32)  # stands in for compressed leaves (not read)
        self._terminated = np.zeros((e, p), bool)  # shape=[E, P], dtype=bool
        self._truncated = np.zeros((e, p), bool)  # shape=[E, P], dtype=bool
        # Final observations, on first truncated: the uncompressed obs leaves [E, P, ...] (None for compressed ones), and
        # the newest frames of the compressed leaves only where read, {(step, lane): [frame per compressed leaf]}.
        self._final: list[np.ndarray | None] | None = None
        self._final_frames: dict[tuple[int, int], list[np.ndarray]] = {}
        self._cursors: tuple | None = None  # the wrapped state's (version, *write cursors) on the host, None: read them
        self._n = 0  # staged steps
        # With frame stacks: the newest step added here (its stacks, one [E, *shape] per compressed leaf, and whether
        # it ended each lane's episode), the one the next step's stacks must follow; None: the buffer's last step.
        self._stacked = any(i.stack_axis is not None for i in buffer.leaves)
        self._previous: tuple | None = None
        n_obs = len(self._obs_leaves)
        self._picks = [self._newest(i - self._obs_offset if 0 <= i - self._obs_offset < n_obs else None) for i in range(len(leaves))]
        self._final_picks = [self._newest(i) for i in range(n_obs)]

    def _newest(self, obs_index: int | None) -> tuple | None:
        """The index of what to stage of one validated leaf `[E, ...]`: the newest frame of a compressed frame-stacked
        leaf (a view), None (the leaf) otherwise."""
        info = None if obs_index is None else self._info.get(obs_index)
        if info is None or info.stack_axis is None:
            return None
        return (slice(None),) * (1 + info.stack_axis) + (info.shape[info.stack_axis] - 1,)

    @property
    def pending(self) -> int:
        """Steps staged on the host and not yet in the buffer."""
        return self._n

    @property
    def buffer(self) -> Any:
        """The buffer with every staged step added (flushes first)."""
        return self.flush()

    @buffer.setter
    def buffer(self, new: Any) -> None:
        """Replace the wrapped buffer state (e.g. after `set_priorities`); staged steps are
        flushed into the old state first, so `new` should be derived from `buffer`."""
        if type(new) is not type(self._buf) or new.host is not self._buf.host:
            raise TypeError(f"StagingWriter.buffer: expected a state of the same compressed buffer, got {type(new).__name__}")
        self._buf.host.check_state("StagingWriter.buffer")
        if self._n:
            raise RuntimeError(
                f"StagingWriter.buffer: {self._n} staged steps are not in the buffer yet; read "
                "writer.buffer (which flushes) and derive the new state from it"
            )
        self._buf, self._cursors = new, None
        self._previous = None  # the next step follows the new state's last step

    @property
    def staging_nbytes(self) -> int:
        """Host bytes of the staging arrays (allocated up front; the final-observation ones on
        the first `truncated`) and of the final frames staged (`max_pending` above)."""
        arrays = self._stage + [self._placeholder, self._terminated, self._truncated] + [x for x in self._final or [] if x is not None]
        return sum(x.nbytes for x in arrays) + sum(f.nbytes for fs in self._final_frames.values() for f in fs)

    @property
    def nbytes(self) -> int:
        """The wrapped buffer's `nbytes` plus `staging_nbytes` (does not flush)."""
        return self._buf.nbytes + self.staging_nbytes

    def close(self) -> None:
        """Drop the staged steps and free the buffer's host memory (`buffer.close()`)."""
        self._n = 0
        self._final_frames.clear()
        self._buf.close()

    def _check_add(self, step: dict, terminated, truncated, final_obs) -> None:
        """`add`'s argument checks (structure, shapes, dtypes: they read the arguments' layout only)."""
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((step, terminated, truncated, final_obs))):
            raise TypeError("StagingWriter.add cannot be traced (jit/scan/vmap); call buffer.add() inside traced code")
        self._check_envs("step", _validate.check_batch(self._spec, step, 1, "step"))
        _validate.array("terminated", terminated, (self.num_envs,), np.bool_)
        if truncated is None:
            if final_obs is not None:
                raise ValueError("final_obs: given without truncated; pass truncated=... with it")
            return
        _validate.array("truncated", truncated, (self.num_envs,), np.bool_)
        if final_obs is None:
            raise TypeError(
                "final_obs: required when truncated is given: the true observation after each step, "
                "before any auto-reset (read only where truncated); shaped like step[obs]"
            )
        spec = self._spec[self._obs_key]
        _validate.final_obs_not_step(spec, self._obs_key, final_obs)
        self._check_envs("final_obs", _validate.check_batch(spec, final_obs, 1, "final_obs"))

    def _check_envs(self, what: str, lead: tuple) -> None:
        if lead[0] != self.num_envs:
            raise ValueError(f"{what}: expected leading axis num_envs={self.num_envs} (one step of every env), got {lead[0]}")

    def add(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> None:
        """Stage one step of every env; flush when `max_pending` steps are staged.

        Args: as `CompressedTrajectoryBuffer.add` for one step: `step` leaves
        `[num_envs, ...]` with the example step's dtypes (numpy or JAX arrays), `terminated`
        bool `[num_envs]`, optional `truncated` bool `[num_envs]` with `final_obs`
        (shaped like `step[obs_key]`, read only where `truncated & ~terminated`).

        Raises (before anything is staged):
          TypeError / ValueError: wrong structure, shape or dtype (naming the field), a missing
            `final_obs`, or a call under a JAX transformation; with `frame_stack`, a stack the buffer
            cannot rebuild (`CompressedTrajectoryBuffer.check_stacks`).
          RuntimeError: after `close()`.
        """
        self._buf.host.check_state("StagingWriter.add")
        if not isinstance(step, Mapping):
            raise TypeError(f"step: expected a dict like the example step, got {type(step).__name__}")
        given, sig = _validate.layout((dict(step), terminated, truncated, final_obs))
        if sig != self._passed:  # arguments laid out as the last accepted ones pass the same checks
            self._check_add(dict(step), terminated, truncated, final_obs)
            self._passed = sig
        m = len(self._stage)  # flat: the step's leaves, terminated, then truncated and the final_obs leaves if given
        self._add_checked(given[:m], given[m], None if truncated is None else given[m + 1], None if truncated is None else given[m + 2 :])

    def _add_checked(self, leaves: list, term, trunc, fin: list | None, owned: bool = False) -> None:
        """`add` of checked arguments: ``leaves`` the step's flat leaves (the example step's order, shapes
        ``[num_envs, ...]`` and dtypes), ``term`` / ``trunc`` bool ``[num_envs]`` (``trunc`` None: not given),
        ``fin`` the final observation's flat leaves or None (the SB3 replay adapter makes them so: its checks are
        `add`'s, made once). The frame-stack check and everything after it are `add`'s. ``owned``: the compressed
        leaves are numpy arrays nobody changes from now on, kept as they are for the next step's check (not copied)."""
        buf = self._buf
        buf.host.check_state("StagingWriter.add")
        term = np.asarray(term)
        truncated = trunc = None if trunc is None else np.asarray(trunc)
        boot = None if fin is None else trunc & ~term  # the final observations read
        booted = boot is not None and np.count_nonzero(boot) > 0
        if self._stacked:  # stacks the buffer could not rebuild: refused here, as its add refuses them
            stacks = [np.asarray(leaves[self._obs_offset + i]) for i in buf.leaf_index]
            if self._previous is None:  # the lanes' last steps are in the buffer: read from the store once
                befores, first = jax.device_get(buf.lane_tails())
            else:
                befores, first = self._previous
            if booted or not buf._step_follows(stacks, befores, first):  # else: nothing to name
                finals = None if fin is None else [np.asarray(fin[i])[:, None] for i in buf.leaf_index]
                error = buf._stack_error_of([x[:, None] for x in stacks], befores, np.asarray(first)[:, None], finals,
                                            None if fin is None else boot[:, None])
                if error is not None:
                    raise error
            self._previous = (stacks if owned else [np.array(x) for x in stacks], term if truncated is None else term | trunc)
        j = self._n  # checked: stage copies (JAX arrays are fetched here)
        for dst, x, pick in zip(self._stage, leaves, self._picks):
            dst[:, j] = x if pick is None else np.asarray(x)[pick]
        self._terminated[:, j] = term
        if fin is not None:
            if self._final is None:
                self._allocate_final()
            self._truncated[:, j] = trunc
            if self._dense_finals or booted:
                self._stage_finals(j, boot, fin)
        else:
            self._truncated[:, j] = False
            self._stage_finals(j, None, None)
        self._n = j + 1
        if self._n == self.max_pending:
            self.flush()

    def _allocate_final(self) -> None:
        """The staging arrays of the uncompressed final observation leaves, on first use."""
        if self._final is None:
            self._final = [None if i in self._info else np.zeros((self.num_envs, self.max_pending, *s.shape), s.dtype)
                           for i, s in enumerate(self._obs_leaves)]
            self._dense_finals = sum(x is not None for x in self._final)

    def _stage_finals(self, j: int, boot: np.ndarray | None, fin: list | None, lanes: np.ndarray | None = None) -> None:
        """Stage step ``j``'s final observations ``fin`` (flat obs leaves ``[E, ...]``) where ``boot`` (bool ``[E]``): the
        uncompressed leaves of the ``lanes`` given (default every lane: rows never read stay deterministic), the newest
        frames of the compressed ones (copies) only where read. ``fin`` None: zeros in the uncompressed rows."""
        if self._final is None:
            return
        if fin is None:
            for dst in self._final:
                if dst is not None:
                    dst[:, j] = 0
            return
        sel = slice(None) if lanes is None else lanes
        read = np.flatnonzero(boot).tolist()
        frames = {e: [] for e in read}
        for i, (dst, x, pick) in enumerate(zip(self._final, fin, self._final_picks)):
            x = np.asarray(x)
            if dst is not None:
                dst[sel, j] = x[sel]
                continue
            x = x if pick is None else x[pick]
            for e in read:
                frames[e].append(np.array(x[e]))
        for e in read:
            self._final_frames[(j, e)] = frames[e]

    def truncate_last(self, truncated, final_obs) -> None:
        """`CompressedTrajectoryBuffer.truncate_last_from_host`: mark each lane's newest step truncated, with its final
        observation (`final_obs` like `step[obs_key]`, leaves `[num_envs, ...]`), in the staging arrays when that
        step is staged, else in the buffer. Lanes whose newest step already ended an episode are left as they are.

        Raises (before anything changes): as `CompressedTrajectoryBuffer.truncate_last_from_host`.
        """
        self._buf.host.check_state("StagingWriter.truncate_last")
        if self._n == 0:
            self._buf = self._buf.truncate_last_from_host(truncated, final_obs, donate=self.donate)
            self._previous = self._cursors = None  # the next step follows the buffer's last step
            return
        _validate.array("truncated", truncated, (self.num_envs,), np.bool_)
        self._check_envs("final_obs", _validate.check_batch(self._spec[self._obs_key], final_obs, 1, "final_obs"))
        j, fin = self._n - 1, [np.asarray(x) for x in jax.tree.leaves(final_obs)]
        boot = np.asarray(truncated) & ~(self._terminated[:, j] | self._truncated[:, j])
        if self._stacked:
            error = self._buf.final_error(self._previous[0], [fin[i] for i in self._buf.leaf_index], boot)
            if error is not None:
                raise error
            self._previous = (self._previous[0], self._previous[1] | boot)
        self._allocate_final()
        self._stage_finals(j, boot, fin, lanes=boot)
        self._truncated[:, j] |= boot

    def flush(self) -> Any:
        """Add every staged step to the buffer (power-of-two chunks, oldest first); return it.

        Raises:
          StaleBufferError: the wrapped state was already added to elsewhere (the staged steps stay staged).
          RuntimeError: after `close()`.
        """
        self._buf.host.check_state("StagingWriter.flush")
        n = self._n
        if n == 0:
            return self._buf
        done = 0
        try:
            for size in _pow2_pieces(n, self._buf.length):  # a chunk may not exceed a lane
                a, b = done, done + size
                # Slices of the staging arrays, checked as each step was staged: the device program gets copies
                # (it may run after this returns), the host store compresses the frames before the add returns.
                step, frames = self._chunk(self._stage, self._treedef, self._obs_offset, a, b)
                term = self._terminated[:, a:b]
                fin = frows = trunc = None
                if self._final is not None:
                    trunc = self._truncated[:, a:b]
                    fin, frows = self._final_chunk(a, b, trunc & ~term)
                self._buf, self._cursors = self._buf._add_checked_frames(step, frames, term, trunc, fin, frows, self.donate, self._cursors)
                done = b
        finally:
            if done:
                rest = n - done
                if rest:  # a failed flush: keep the steps not added, oldest first
                    arrays = self._stage + [self._terminated, self._truncated] + [x for x in self._final or [] if x is not None]
                    for x in arrays:
                        x[:, :rest] = x[:, done:n].copy()
                self._final_frames = {(j - done, e): f for (j, e), f in self._final_frames.items() if j >= done}
                self._n = rest
        return self._buf

    def _chunk(self, arrays, treedef, offset: int, a: int, b: int):
        """Steps `[a, b)` as (pytree with placeholders for compressed leaves, their frames)."""
        leaves, frames = [], []
        for i, x in enumerate(arrays):
            if (i - offset) in self._info:
                leaves.append(self._placeholder[:, a:b])
                frames.append(x[:, a:b])
            else:
                leaves.append(x[:, a:b])
        # frames are in leaf order, which is the order of buffer.leaf_index (sorted flat indices)
        return jax.tree.unflatten(treedef, leaves), frames

    def _final_chunk(self, a: int, b: int, boot: np.ndarray):
        """Steps `[a, b)`'s final observations as (pytree with placeholders for compressed leaves, per compressed leaf
        the frames where ``boot`` (bool ``[E, b - a]``), ``[n, *frame]`` lane-major)."""
        leaves = [self._placeholder[:, a:b] if x is None else x[:, a:b] for x in self._final]
        lanes, steps = np.nonzero(boot)
        picked = [self._final_frames[(a + j, e)] for e, j in zip(lanes.tolist(), steps.tolist())]
        rows = [np.stack([p[i] for p in picked]) if picked else np.zeros((0, *info.frame_shape), info.dtype)
                for i, info in enumerate(self._buf.leaves)]
        return jax.tree.unflatten(self._obs_treedef, leaves), rows

    def sample_transitions(self, key: jax.Array, batch_size: int, *, gamma, n_step: int = 1, beta=None) -> Any:
        """Flush, then sample: same arguments and result as the buffer's `sample_transitions`
        (for the prioritised buffer, `beta`: the buffer's default when None).

        Runs one cached compiled sample per `batch_size` and `n_step` that does not return the
        observations twice (`gamma` and `beta` may change between calls without a recompile).

        Raises (before the flush: a refused call leaves the staged steps staged):
          ValueError: `gamma` outside `[0, 1]`, a negative `beta`.
          TypeError: `beta` given for the uniform buffer; as the buffer's `sample_transitions`
            otherwise.
          RuntimeError: after `close()`.
        """
        from jaxbuffers.compressed.trajectory import CompressedPrioritisedTrajectoryBuffer

        prioritised = isinstance(self._buf, CompressedPrioritisedTrajectoryBuffer)
        gamma, beta = _as_float(gamma), _as_float(beta)  # one program whether ints or floats come
        _validate.scalar_parameter("gamma", gamma, 0.0, 1.0)  # inside the program gamma is a tracer
        if beta is not None and not prioritised:
            raise TypeError(f"beta: only a prioritised buffer takes beta, got beta={beta!r} for {type(self._buf).__name__}")
        if beta is not None:
            _validate.scalar_parameter("beta", beta, 0.0)
        elif prioritised:
            beta = 1.0
        extra = {"beta": beta} if prioritised else {}
        self._check_sample(
            key, ("transitions", batch_size, n_step),
            lambda b: b.sample_transitions(key, batch_size, n_step=n_step, gamma=gamma, **extra),
        )
        buf = self.flush()
        s = _sample_transitions_jit(buf, key, batch_size, n_step, gamma, beta)
        return _with_item_obs(s, buf.trajectory.obs_key)

    def sample_sequences(self, key: jax.Array, batch_size: int, *args, **kwargs) -> Any:
        """Flush, then `CompressedTrajectoryBuffer.sample_sequences` (same arguments and errors, raised
        before the flush)."""
        if kwargs.get("beta") is not None:  # traced in the sample: its value is checked here, every call
            _validate.scalar_parameter("beta", kwargs["beta"], 0.0)
        statics = (batch_size, args, tuple(sorted((k, v) for k, v in kwargs.items() if k != "beta")))
        self._check_sample(key, ("sequences", *statics), lambda b: b.sample_sequences(key, batch_size, *args, **kwargs))
        return self.flush().sample_sequences(key, batch_size, *args, **kwargs)

    def _check_sample(self, key: Any, statics: tuple, sample) -> None:
        """Raise the errors `sample(buffer)` would raise, without flushing: the sample is traced on the
        unflushed buffer (`jax.eval_shape`, nothing runs) once per `statics` and kind of `key`; the traced
        scalars' values are the caller's to check, every call."""
        self._buf.host.check_state("StagingWriter sample")
        signature = (statics, type(key), getattr(key, "shape", None), str(getattr(key, "dtype", None)))
        try:
            if signature in self._checked:
                return
        except TypeError:  # an unhashable argument: its check names it below
            signature = None
        jax.eval_shape(sample, self._buf)
        if signature is not None:
            self._checked.add(signature)

    def __repr__(self) -> str:
        return f"StagingWriter(pending={self._n}, max_pending={self.max_pending}, buffer={type(self._buf).__name__})"
