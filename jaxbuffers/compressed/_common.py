"""Device-side helpers shared by the compressed buffers: leaf selection, host callbacks, output finishing.

How the two halves talk: `docs/api/compressed.md`, "Device and host".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

try:  # in-place host callback (CPU/GPU), experimental in JAX
    from jax.experimental.buffer_callback import buffer_callback as _buffer_callback
except ImportError:  # pragma: no cover - older or newer JAX without it
    _buffer_callback = None

from jaxbuffers import _validate
from jaxbuffers.compressed._host import HostStores, ShardedHostStores, StaleBufferError


def select_leaves(spec: Any, compress: Sequence[str] | None, what: str) -> tuple[int, ...]:
    """Flat indices (`jax.tree.leaves` order) of the leaves of `spec` whose path holds a dict key or attribute name in
    `compress`, or whose full name (`_validate.leaf_name`, e.g. `['pixels']`) is; `None`: every leaf.

    Raises:
      ValueError: a name selects nothing (the message lists the leaves). TypeError: `compress` is a bare string.
    """
    leaves = jax.tree_util.tree_flatten_with_path(spec)[0]
    if compress is None:
        return tuple(range(len(leaves)))
    if isinstance(compress, str):
        raise TypeError(f"compress: expected a tuple of leaf names, e.g. ({compress!r},), got the string {compress!r}")
    names, chosen, used, known = set(compress), [], set(), set()
    for i, (path, _) in enumerate(leaves):
        # dict keys and attribute names along the path (sequence indices skipped), and the full name
        keys = {str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)}
        keys |= {k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey)}
        known |= keys
        keys.add(_validate.leaf_name(path))
        if keys & names:
            chosen.append(i)
            used |= keys & names
    known = sorted(known) or [_validate.leaf_name(p) for p, _ in leaves if p]  # a tuple's leaves: their full names
    if names - used and not known:
        raise ValueError(f"compress: {sorted(names - used)} name no leaf of {what}: it is one array, with no names inside "
                         f"it; leave compress out (None: the whole array is compressed)")
    if names - used:
        raise ValueError(f"compress: {sorted(names - used)} name no leaf of {what}; the names inside it are {known}")
    if not chosen:
        raise ValueError(f"compress: selects no leaf of {what}")
    return tuple(chosen)


def replace_leaves(tree: Any, indices: Sequence[int], values: Sequence[Any]) -> Any:
    """`tree` with its leaves number `indices` (`jax.tree.leaves` order) replaced by `values`."""
    leaves, treedef = jax.tree.flatten(tree)
    new = dict(zip(indices, values))
    return jax.tree.unflatten(treedef, [new.get(i, x) for i, x in enumerate(leaves)])


def pick_leaves(tree: Any, indices: Sequence[int]) -> list:
    leaves = jax.tree.leaves(tree)
    return [leaves[i] for i in indices]


@dataclasses.dataclass(frozen=True)
class LeafInfo:
    """Static description of one compressed leaf (hashable: it lives in a static field)."""

    name: str
    shape: tuple[int, ...]  # one observation (a whole stack with frame dedup)
    dtype: np.dtype
    frame_shape: tuple[int, ...]  # what one store entry holds
    stack_axis: int | None  # axis of `shape` holding the k frames (frame dedup), else None


def obs_leaves(example_step: Any, obs_key: str, compress, frame_stack, stack_axis: int, padding: str, normalize_images: bool) -> tuple:
    """A frame-deduplicating buffer's `create` arguments, checked: `(step spec, flat indices of the compressed leaves
    within the observation, [LeafInfo], k = frame_stack or 1)`. TypeError / ValueError: `example_step` not a dict or
    without `obs_key`; a bad `padding` or `frame_stack`; as `select_leaves` and `_validate.frame_leaves`."""
    if not isinstance(example_step, Mapping):
        raise TypeError(f"example_step: expected a dict with an {obs_key!r} field, got {type(example_step).__name__}")
    if obs_key not in example_step:
        raise ValueError(f"example_step: missing field {obs_key!r} (got fields {sorted(example_step)})")
    spec = _validate.item_spec(dict(example_step), "example_step")
    obs_spec, what = spec[obs_key], f"example_step[{obs_key!r}]"
    if padding not in ("reset", "zero"):
        raise ValueError(f"padding: expected 'reset' (repeat the episode's first frame, Gymnasium's default) or 'zero', got {padding!r}")
    k = 1 if frame_stack is None else _validate.static_int("frame_stack", frame_stack)
    idx = select_leaves(obs_spec, compress, what)
    infos = [LeafInfo(*f) for f in _validate.frame_leaves(obs_spec, idx, what, frame_stack and k, stack_axis, normalize_images)]
    return spec, idx, infos, k


def newest_frame(x: jax.Array, info: LeafInfo, lead: int) -> jax.Array:
    """The entry to store for observations `x` (`[*lead, *info.shape]`): the newest frame of each stack (index
    `k - 1` along the stack axis), or the whole observation."""
    if info.stack_axis is None:
        return x
    k = info.shape[info.stack_axis]
    return jax.lax.index_in_dim(x, k - 1, axis=lead + info.stack_axis, keepdims=False)


_forced: bool | None = None  # set by forced_callbacks only


def in_place_callbacks(host: Any = None) -> bool:
    """Whether host callbacks to `host` traced now use `buffer_callback` (True) or `io_callback` / `pure_callback`,
    for writes and reads alike (why: `docs/api/compressed.md`, "Device and host")."""
    if _forced is not None:
        return _forced
    one_program_per_device = jax.device_count() == 1 or isinstance(host, ShardedHostStores)
    return _buffer_callback is not None and jax.default_backend() == "cpu" and one_program_per_device


@contextlib.contextmanager
def forced_callbacks(in_place: bool) -> Iterator[None]:
    """Trace host callbacks with the given mechanism inside the block (tests run both on CPU); use buffers created
    inside it (a cached program keeps its mechanism)."""
    global _forced
    before, _forced = _forced, bool(in_place)
    try:
        yield
    finally:
        _forced = before


def write(
    host: HostStores, version: jax.Array, slots: jax.Array, valid: jax.Array, datas: Sequence[jax.Array], bases: jax.Array | None = None,
    refuse: tuple[jax.Array, Callable[[np.ndarray], Exception | None]] | None = None, recent: tuple | None = None,
) -> jax.Array:
    """Host callback writing `datas[i][valid]` at `slots[valid]` (`HostStores.write`); returns the new version (int32
    scalar). `refuse`: `(values, error)`: before writing, `error(*values)` (numpy; `values` an array or a tuple of
    them) returns the exception to raise instead, or None. ValueError: under `vmap` (a buffer is one host store)."""
    args = (*host.operands(), version, slots.astype(jnp.int32), valid, *datas)
    n = len(args)
    if bases is not None:
        args = (*args, bases.astype(jnp.int32))
    checks = () if refuse is None else refuse[0] if isinstance(refuse[0], tuple) else (refuse[0],)
    args = (*args, *checks)

    def checked_write(*a):
        if refuse is not None:
            error = refuse[1](*(np.asarray(x) for x in a[len(a) - len(checks):]))
            if error is not None:
                raise error
        return host.write(*a[:n], bases=None if bases is None else a[n], recent=recent)

    put = keeping(host, checked_write)
    out = jax.ShapeDtypeStruct((), jnp.int32)
    if in_place_callbacks(host):

        def fill(ctx, new_version, *buffers):
            np.asarray(new_version)[...] = put(*(np.asarray(b) for b in buffers))

        call = _buffer_callback(fill, out, has_side_effect=True)
    else:
        call = lambda *a: io_callback(put, out, *a, ordered=True)  # noqa: E731

    write_once = jax.custom_batching.custom_vmap(call)

    @write_once.def_vmap
    def _refuse_vmap(axis_size, in_batched, *args):
        raise ValueError(
            "compressed buffer add: cannot be vmapped; a compressed buffer is one host store, so "
            "buffers cannot be stacked (vmap over sampling keys of one buffer works)"
        )

    return write_once(*args)


def read(host: HostStores, infos: Sequence[LeafInfo], version: jax.Array, *ids: jax.Array) -> list:
    """Host callback decoding the slots `ids` (int32, any shapes `S_j`) of every leaf of `infos` after the write that
    made `version`: `out[leaf][j]` `[*S_j, *frame_shape]` (`HostStores.read_into` / `HostStores.read`)."""
    ids = [x.astype(jnp.int32) for x in ids]
    m, lead = len(ids), host.operands()
    shapes = tuple(jax.ShapeDtypeStruct((*x.shape, *i.frame_shape), i.dtype) for i in infos for x in ids)
    if in_place_callbacks(host):

        def fill(ctx, outs, *args):
            outs, args = [np.asarray(o) for o in outs], [np.asarray(a) for a in args]
            front = args[: len(lead) + 1]  # the shard (sharded stores) and the version
            keeping(host, host.read_into)(*front, args[len(lead) + 1 :], [outs[i * m : (i + 1) * m] for i in range(len(infos))])

        flat = _buffer_callback(fill, shapes, vmap_method="broadcast_all")(*lead, version, *ids)
    else:
        flat = jax.pure_callback(keeping(host, host.read), shapes, *lead, version, *ids, vmap_method="broadcast_all")
    return [list(flat[i * m : (i + 1) * m]) for i in range(len(infos))]


# HostStores -> the exception its newest failed host callback raised during an eager call, and the number of eager
# calls running (exceptions are kept only then: a kept one holds its frames).
_raised: "weakref.WeakKeyDictionary[HostStores, BaseException]" = weakref.WeakKeyDictionary()
_eager: "weakref.WeakKeyDictionary[HostStores, int]" = weakref.WeakKeyDictionary()
_eager_lock = threading.Lock()  # eager calls may run in several threads


def keeping(host: HostStores, fn: Callable) -> Callable:
    """`fn`, a host callback's body, keeping the exception it raises for `run_eager` (JAX hands the caller a
    `jax.errors.JaxRuntimeError` carrying only its text)."""

    def call(*args):
        try:
            return fn(*args)
        except Exception as e:
            if _eager.get(host):
                _raised[host] = e
            raise

    return call


def run_eager(hosts: Sequence[HostStores], call: Callable[[], Any], wait: bool) -> Any:
    """`call()`, an eager call of buffers whose stores are `hosts`, raising the exception a host callback of `hosts`
    raised, not the error carrying its text; `wait`: wait for the result, so that a read's error is raised here."""
    with _eager_lock:
        for host in hosts:
            _eager[host] = _eager.get(host, 0) + 1
    try:
        out = call()
        if wait:
            jax.block_until_ready(out)
        return out
    except Exception as e:  # JAX's own type, which varies with the callback mechanism (a ValueError from pure_callback)
        for host in hosts:
            kept = _raised.get(host)
            if kept is not None and kept is not e and f"{type(kept).__name__}: {kept}" in str(e):
                raise kept from e
        raise
    finally:
        with _eager_lock:
            for host in hosts:
                _eager[host] -= 1
                if not _eager[host]:
                    _raised.pop(host, None)


def reads_of(buffers: Callable[[Any], Sequence[Any]]) -> Callable:
    """Decorate a public read of several compressed buffers (`buffers(self)`) with `run_eager` when called eagerly."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            bufs = buffers(self)
            if any(isinstance(b.version, jax.core.Tracer) for b in bufs):
                return method(self, *args, **kwargs)
            return run_eager([b.host for b in bufs], lambda: method(self, *args, **kwargs), wait=True)

        return call

    return wrap


# HostStores -> (the version array of the newest add dispatched eagerly, the version its write makes): its write may
# not have run yet.
_newest_add: "weakref.WeakKeyDictionary[HostStores, tuple[jax.Array, int]]" = weakref.WeakKeyDictionary()


def check_before_dispatch(buf: Any, add: bool) -> int | None:
    """An eager call's checks before anything is dispatched: the store is open and an add's state is the newest (the
    newest eager add's state without waiting for it). Returns an add's version to be, else None.

    Raises:
      RuntimeError: the buffer was closed.
      StaleBufferError: `add` and a later add was made from this state (or one derived from it), or it was donated.
    """
    if isinstance(buf.version, jax.core.Tracer):
        return None
    if not add:
        buf.host.check_state("sample")
        return None
    last, made = _newest_add.get(buf.host, (None, 0))
    if last is buf.version and buf.host.version <= made:  # the newest eager add's state, and no write ran past it
        buf.host.check_state("add")
        return made + 1
    if last is not None and last is not buf.version:
        try:
            last.block_until_ready()
        except Exception:  # that add failed: the store did not move (its caller got the error)
            pass
    if getattr(buf.version, "is_deleted", lambda: False)():  # given to a call with `donate_argnums`: that call made the newer state
        raise StaleBufferError("compressed buffer add: this buffer state was donated to a call (donate_argnums), which made "
                               "a newer state; add to the state that call returned (refused before anything ran)")
    version = int(buf.version)  # waits for the add that produced this state
    buf.host.check_state("add", version)
    return version + 1


def remember_add(out: Any, made: int | None) -> None:
    """Record `out`, an add's state whose write makes version `made`, as its store's newest add."""
    if made is not None:
        _newest_add[out.host] = (out.version, made)


def check_add_before_dispatch(buf: Any, add: Callable[[Any], Any]) -> int | None:
    """`check_before_dispatch` of an add; a stale state's wrong arguments are named first, as under `jit` (`add(buf)`
    is traced)."""
    try:
        return check_before_dispatch(buf, True)
    except StaleBufferError:
        jax.eval_shape(add, buf)
        raise


def delegated(name: str, via: str = "buffer") -> Callable:
    """A compressed buffer's method `name` reading device fields only: `getattr(self, via).name(...)`."""

    def method(self, *args, **kwargs):
        return getattr(getattr(self, via), name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"`{name}` of the wrapped device buffer (`self.{via}`): device fields only, exactly its result."
    return method


NOT_WRAPPED = {
    "memory_bytes": "device bytes only: a compressed buffer reports `nbytes` = `device_nbytes` + `host_nbytes`",
    "storage": "holds the ids of the compressed leaves, not observations (the device buffer is `buf.buffer`)",
    "step": "holds the ids of the compressed leaves, not observations (the device buffer is `buf.buffer`)",
    "final_obs": "holds the ids of the compressed leaves, not observations (`final_obs_at` decodes them)",
    "add_prepared": "takes the ids the buffer makes (the device buffer is `buf.buffer`)",
    "truncate_last": "a host write: `truncate_last_from_host` (or `StagingWriter.truncate_last`)",
    "generations": "a field of the prioritised device buffer (`buf.buffer.generations`; `generations_at` is a method of both)",
    "estimate_memory_pressure": "a projection of device arrays; the compressed rollout decodes its pixels per minibatch",
}
"""Public attributes of the wrapped device buffers that the compressed buffers do not have, and why (docs/guide.md §4
lists them)."""


def delegates(*names: str, via: str = "buffer") -> Callable[[type], type]:
    """Class decorator of a compressed buffer: read-only properties `names`, each `getattr(self, via).name` (fields
    of the wrapped device buffer that hold no compressed data)."""

    def decorate(cls: type) -> type:
        for name in names:
            prop = property(lambda self, n=name: getattr(getattr(self, via), n))
            prop.__doc__ = f"`{name}` of the wrapped device buffer (`self.{via}`), read only."
            setattr(cls, name, prop)
        return cls

    return decorate


def checked_before_dispatch(add: bool = False) -> Callable:
    """Decorate a public method of a compressed buffer (above `jaxbuffers._compiled.method`) with
    `check_before_dispatch` (an add: `check_add_before_dispatch`, then `remember_add`) and, called eagerly,
    `run_eager`: a read waits for its result, an add only when its write may refuse it (`_write_may_refuse`)."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            run = lambda b: method(b, *args, **kwargs)  # noqa: E731
            made = check_add_before_dispatch(self, run) if add else check_before_dispatch(self, False)
            if isinstance(self.version, jax.core.Tracer):
                return run(self)
            wait = not add or getattr(self, "_write_may_refuse", False)
            out = run_eager([self.host], lambda: run(self), wait=wait)
            remember_add(out, made)
            return out

        return call

    return wrap


def stack_slots(ids: jax.Array, *, frame_stack: int, ring: int, num_lanes: int, empty: int, stacked: bool, padding: str):
    """Store slots of the frames of observations given by ids int32 `[*S, 3]` = `(newest, prev, ep_pos)`, in a store
    of `num_lanes` rings of `ring` frames (lane `l`: slots `[l * ring, (l + 1) * ring)`) and a never-written slot
    `empty` (zeros). `newest` outside `[0, empty)` reads `empty`; `prev` negative or past the rings: no older frame.

    Returns `(slots, pad)`: with `stacked`, int32 `[*S, k]` oldest to newest (frame `j` is `k - 1 - j` steps back,
    `min(k - 1 - j, ep_pos)` with `"reset"` padding) and bool `[*S, k]`, the frames to zero (`"zero"` padding) or
    None; without, `[*S]` and None.
    """
    k = frame_stack
    newest, prev, ep = ids[..., 0], ids[..., 1], ids[..., 2]
    outside = (newest < 0) | (newest >= empty)  # -1 (an unwritten step), or ids the buffer never made
    newest = jnp.where(outside, empty, newest)
    prev = jnp.where(outside | (prev >= num_lanes * ring), -1, prev)  # -1: no older frame
    ep = jnp.clip(ep, 0, k - 1)
    if not stacked:
        return newest, None
    d = (k - 1) - jnp.arange(k, dtype=jnp.int32)  # frames back, per stack position
    pad = None
    if padding == "reset":
        back = jnp.minimum(d, ep[..., None])
    else:
        pad = d > ep[..., None]
        back = jnp.where(pad, 0, d)
    base = (prev // ring)[..., None] * ring
    older = base + ((prev % ring)[..., None] - (back - 1)) % ring
    fids = jnp.where((back == 0) | (prev < 0)[..., None], newest[..., None], older)
    return fids.astype(jnp.int32), pad


def only_rows(ids: jax.Array, rows: jax.Array | None) -> jax.Array:
    """`ids` `[S0, ...]` with the rows where bool `rows` `[S0]` is False set to -1 (the never-written slot, read as
    zeros without decoding); `rows` None: every row."""
    return ids if rows is None else jnp.where(rows.reshape(rows.shape + (1,) * (ids.ndim - 1)), ids, -1)


def finish(frames: jax.Array, info: LeafInfo, lead: int, pad: jax.Array | None, normalize: bool, xp: Any = jnp) -> jax.Array:
    """Decoded entries `frames` (`[*S, k, *frame_shape]` oldest to newest with frame dedup, else `[*S, *shape]`;
    `lead = len(S)`) -> observations, zero where `pad` (bool `[*S, k]`, or None); with `normalize` float32
    `x * float32(1 / 255)` (within 1 ulp of `x / 255`, exact at 0 and 255). `xp`: `jax.numpy` or `numpy`."""
    if info.stack_axis is not None:
        if pad is not None:
            zero = xp.zeros((), frames.dtype)
            frames = xp.where(pad.reshape(pad.shape + (1,) * len(info.frame_shape)), zero, frames)
        if info.stack_axis:  # 0: already in place (skip the identity transpose)
            frames = xp.moveaxis(frames, lead, lead + info.stack_axis)
    if normalize:
        frames = frames.astype(xp.float32) * xp.float32(1.0 / 255.0)
    return frames


def decode_sample(decoders: Mapping[type, Callable], sample: Any, rows: Any, inner: str) -> Any:
    """A compressed buffer's `decode`: `decoders[type(sample)](sample, rows)`, checked (`inner` names the buffer the
    sample comes from). TypeError: another sample type; `rows` not a bool array. ValueError: `rows` not `[B]`."""
    if type(sample) not in decoders:
        raise TypeError(f"sample: expected one of {sorted(c.__name__ for c in decoders)} of this buffer's inner {inner}, "
                        f"got {type(sample).__name__}")
    if rows is not None:
        lead = (sample.indices if hasattr(sample, "indices") else sample.index).shape[0]  # a rollout minibatch: index
        rows = _validate.array("rows", rows, (lead,), bool)
    return decoders[type(sample)](sample, rows)
