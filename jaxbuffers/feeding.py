"""Actors feeding a learner on one host: `BufferServer` (a buffer shared by threads), `Writer` (many actors, one add).

The buffer itself stays an immutable pytree; the server holds the current one and swaps it under a lock:

* `BufferServer.add` and `BufferServer.sample` run one jitted program each (the add donated, so in place), one at a
  time, and a sample's result is ready before the lock is released: a sample never sees half an add (no torn
  items), whatever the threads do.
* With a `jaxbuffers.BlockingRateLimiter` an add first waits for room to insert and a sample for room to sample
  (Reverb's samples-per-insert rule); the waits happen outside the lock, so a blocked actor never stops the learner.
* `close` (shutdown) wakes every blocked caller with `BufferClosed` and refuses later calls with it; timeouts raise
  `jaxbuffers.RateLimiterTimeout`. Nothing waits forever unless asked to (`timeout=None`).

`Writer` batches: actor threads `append` single items (numpy pytrees, no batch axis); every `flush_size` items are
stacked on the host into one batch and added with one `BufferServer.add`, in arrival order.

For actors on other machines, `ray_server` runs a `BufferServer` as a Ray actor; actors send numpy pytrees.

Example:
  ```python
  server = jb.BufferServer(jb.ReplayBuffer.create(item, capacity=100_000), seed=0,
                           rate_limiter=jb.BlockingRateLimiter(4.0, min_size=1_000, error_buffer=512.0))
  writer = jb.Writer(server, flush_size=64)
  # actor threads: writer.append(item)              (numpy pytree like `item`)
  # learner thread: out = server.sample(None, 256)  (None: the server's own key stream)
  #                 server.set_priorities(out.indices, new_priorities, out.generations)  (a prioritised buffer)
  server.close()                                    # blocked callers raise BufferClosed
  ```
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxbuffers import _compiled, _validate
from jaxbuffers.compressed import _common
from jaxbuffers.ratelimit import BlockingRateLimiter, RateLimiterClosed, RateLimiterTimeout

__all__ = ["BufferServer", "Writer", "BufferClosed", "ray_server"]


class BufferClosed(RateLimiterClosed):
    """The `BufferServer` was closed (shutdown) before or while the caller waited."""


def _leading(batch: Any) -> int:
    leaves = jax.tree.leaves(batch)
    if not leaves or np.ndim(leaves[0]) == 0:
        raise ValueError("batch: expected a pytree of arrays with a leading batch axis, got no such leaf")
    return int(np.shape(leaves[0])[0])


def _server_arguments(buffer: Any, add: Any, sample: Any, rate_limiter: Any, seed: Any) -> int:
    """The checks of `BufferServer`'s arguments (also made by `ray_server` before any actor exists); returns `seed`.

    Raises:
      TypeError: a `buffer` without `add` / `sample` methods (and no `add=` / `sample=`), `add` or `sample` not
        callable, `rate_limiter` not a `BlockingRateLimiter`. ValueError: `seed` not an int >= 0.
    """
    for name, fn, method in (("add", add, "add"), ("sample", sample, "sample")):
        if fn is None and not callable(getattr(type(buffer), method, None)):
            raise TypeError(f"buffer: expected a buffer state with an {method} method (or pass {name}=), got {type(buffer).__name__}")
        if fn is not None and not callable(fn):
            raise TypeError(f"{name}: expected a function or None, got {type(fn).__name__}")
    if rate_limiter is not None and not isinstance(rate_limiter, BlockingRateLimiter):
        raise TypeError(f"rate_limiter: expected a BlockingRateLimiter or None, got {type(rate_limiter).__name__}")
    return _validate.static_int("seed", seed, minimum=0)


class BufferServer:
    """A jaxbuffers buffer shared by actor and learner threads (module doc).

    Args:
      buffer: any jaxbuffers buffer (the initial state). It is donated: the server's first add reuses its arrays,
        so do not use `buffer` (or arrays it holds) after passing it; read the state through `buffer()`.
      add: `(buffer, batch) -> buffer`; default `type(buffer).add`. Jitted here with the buffer donated.
      sample: `(buffer, key, batch_size, **kwargs) -> sample`; default `type(buffer).sample`. Jitted with
        `batch_size` static (and a buffer method's static keywords, `sample` below).
      rate_limiter: optional `jaxbuffers.BlockingRateLimiter`; an add of `B` items is `B` inserts, a sample of
        `batch_size` items `batch_size` samples. `close` closes it.
      seed: seed of the server's own key stream, used by `sample(None, ...)`.
    """

    def __init__(self, buffer: Any, *, add: Callable | None = None, sample: Callable | None = None,
                 rate_limiter: BlockingRateLimiter | None = None, seed: int = 0):
        seed = _server_arguments(buffer, add, sample, rate_limiter, seed)
        self._buffer = buffer
        self._add_fn = add or type(buffer).add
        self._add = jax.jit(self._add_fn, donate_argnums=0)
        self._add_kept = jax.jit(self._add_fn)  # buffers whose store may refuse a batch when the add runs (`_added`)
        sample = sample or type(buffer).sample
        static = tuple(n for n in getattr(sample, "static", ()) if n != "batch_size")  # a buffer method's static keywords
        self._sample = jax.jit(sample, static_argnums=2, static_argnames=static)
        self._sample_scalars = getattr(sample, "scalars", {})  # range-checked when concrete
        setter = getattr(type(buffer), "set_priorities", None)
        self._set_priorities = None if setter is None else jax.jit(setter, donate_argnums=0)
        self._limiter = rate_limiter
        self._key = jax.random.key(seed)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def rate_limiter(self) -> BlockingRateLimiter | None:
        """The limiter given at construction (or None)."""
        return self._limiter

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed

    def buffer(self) -> Any:
        """The current buffer (a consistent snapshot; later adds do not change it, and it is not donated by them)."""
        with self._lock:
            self._check_open("buffer")
            return jax.tree.map(lambda x: x.copy(), self._buffer)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise BufferClosed(f"{what}: the buffer server was closed")

    def _admit(self, what: str, n: int, timeout: float | None) -> None:
        self._check_open(what)
        timeout = _validate.timeout("timeout", timeout)  # checked with or without a limiter
        if self._limiter is not None:
            wait = self._limiter.reserve_insert if what == "add" else self._limiter.await_sample
            try:
                wait(n, timeout, name="batch_size" if what == "sample" else "batch")
            except RateLimiterClosed as e:
                raise BufferClosed(f"{what}: the buffer server was closed while it waited ({e})") from None

    def add(self, batch: Any, timeout: float | None = None) -> None:
        """Add `batch` (leaves with a leading axis `B`, numpy or JAX arrays, exactly the buffer's dtypes).

        Waits for the rate limiter's room for `B` inserts first (at most `timeout` seconds); the limiter counts
        the inserts once the batch is stored (`BlockingRateLimiter.reserve_insert`, then `commit_insert`, or
        `cancel_insert` when the add raised), so a sample is never admitted on items that were not stored.

        Raises:
          BufferClosed: the server was closed before or while waiting.
          jaxbuffers.RateLimiterTimeout: no room within `timeout`.
          TypeError / ValueError: `timeout` not None or a number >= 0 (checked with or without a limiter); the
            buffer's `add` refused the batch (nothing is added and the limiter counts
            nothing: the batch is checked before the limiter is asked). A numpy leaf that JAX would narrow (float64
            or int64 with `jax_enable_x64` off) is refused as the buffer's own eager `add` refuses it, never cast.
            A batch the buffer's host store refuses when the add runs (a compressed buffer's frame stack that is
            not the one it rebuilds) raises the error the buffer's eager `add` raises (naming leaf, env and step);
            nothing is added, the limiter counts nothing and the server keeps its buffer.
          jaxbuffers.disk.ReadOnlyError, jaxbuffers.compressed.StaleBufferError, RuntimeError: a disk folder opened
            with `mode="r"`, a compressed buffer whose store has moved past the held state, or a closed store:
            refused before the add runs, the server unchanged.
        """
        n = _leading(batch)
        self._check_open("add")
        _validate.array_leaves("batch", batch)  # what jit cannot even take as an argument
        self._check_batch(batch)
        self._admit("add", n, timeout)
        try:
            with self._lock:
                self._check_open("add")
                self._buffer = self._added(self._buffer, batch)
        except BaseException:
            if self._limiter is not None:
                self._limiter.cancel_insert(n)
            raise
        if self._limiter is not None:
            self._limiter.commit_insert(n)

    def _added(self, buf: Any, batch: Any) -> Any:
        """`buf` with `batch` added. A buffer without a host store: the donated add. A compressed or disk-backed
        buffer: its store's checks first (`_common.check_before_dispatch`: open, writable, the newest state), and
        when its write may refuse the batch as it runs (`_write_may_refuse`: frame stacks checked on the host) the
        add without donation, waited for, so that a refusal raises the buffer's own exception and `buf` stays
        whole. The result is remembered as its store's newest add (`_common.remember_add`), as an eager add is: the
        next add is checked without waiting for this one to run."""
        host = getattr(buf, "host", None)
        if not isinstance(host, _common.HostStores) or isinstance(getattr(buf, "version", None), jax.core.Tracer):
            return self._add(buf, batch)
        made = _common.check_before_dispatch(buf, True)
        if not getattr(buf, "_write_may_refuse", False):
            out = self._add(buf, batch)
        else:
            out = _common.run_eager([host], lambda: self._add_kept(buf, batch), wait=True)
        _common.remember_add(out, made)
        return out

    def _check_batch(self, batch: Any) -> None:
        """The buffer's own checks of `batch`, traced (nothing runs), before the limiter counts anything. The jitted
        add's abstract signature would see a float64 numpy leaf as float32 (JAX narrows it at the call): such a
        batch is traced with its leaves as given, so the buffer's add names the dtype that came."""
        leaves = jax.tree_util.tree_leaves(batch)
        if _compiled.all_passable(leaves):
            self._add.eval_shape(self._buffer, batch)
            return
        jax.eval_shape(lambda buf: self._add_fn(buf, batch), self._buffer)
        for path, x in jax.tree_util.tree_flatten_with_path(batch)[0]:  # a custom add that took it: still not cast
            if not _compiled.passable(x):
                _validate.not_narrowed(_validate.leaf_path("batch", path), x)

    def sample(self, key: jax.Array | None, batch_size: int, timeout: float | None = None, **kwargs) -> Any:
        """A sample of `batch_size` items drawn with `key` (`None`: the next key of the server's own stream).

        Waits for the rate limiter's room for `batch_size` samples first. The result is computed and ready before
        any later add runs. `kwargs` go to the sample function: for a buffer method (the default `sample`, or e.g.
        `sample=jb.PrioritisedTrajectoryBuffer.sample_transitions`) its static keywords (`n_step`, ...) as static
        values and the others traced (a prioritised buffer's `beta`, annealed from call to call without a new
        compilation), range-checked when concrete as the method checks them; for another function, all traced and
        checked only by it.

        Raises:
          BufferClosed, jaxbuffers.RateLimiterTimeout: as `add`; TypeError / ValueError for `timeout` as `add`,
            and what the buffer's `sample` raises for `kwargs` (before the limiter counts anything).
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        if key is not None:
            _validate.key("key", key)
        for name, (lo, hi) in self._sample_scalars.items():  # traced in the jitted sample: checked here, as given
            if kwargs.get(name) is not None:
                _validate.scalar_parameter(name, kwargs[name], lo, hi)
        self._check_open("sample")
        self._sample.eval_shape(self._buffer, self._key if key is None else key, batch_size, **kwargs)  # before counting
        self._admit("sample", batch_size, timeout)
        with self._lock:
            self._check_open("sample")
            if key is None:
                self._key, key = jax.random.split(self._key)
            return jax.block_until_ready(self._sample(self._buffer, key, batch_size, **kwargs))

    def set_priorities(self, indices: Any, priorities: Any, generations: Any) -> None:
        """The served prioritised buffer's `set_priorities`, run under the server's lock with the buffer donated:
        priorities computed from a sample (its `indices` and `generations`) change what the server samples next.
        Entries whose generation is stale (their slot was overwritten since the sample) are skipped, as the
        buffer's method skips them. Not rate-limited (neither an insert nor a sample).

        Raises:
          BufferClosed: the server was closed.
          TypeError: the served buffer has no `set_priorities` (a uniform buffer).
          TypeError / ValueError: what the buffer's `set_priorities` raises; the buffer is unchanged.
        """
        if self._set_priorities is None:
            raise TypeError(f"set_priorities: the served {type(self._buffer).__name__} has no priorities (serve a "
                            f"prioritised buffer)")
        self._check_open("set_priorities")
        self._set_priorities.eval_shape(self._buffer, indices, priorities, generations)  # refused before it runs
        with self._lock:
            self._check_open("set_priorities")
            self._buffer = self._set_priorities(self._buffer, indices, priorities, generations)

    def close(self) -> None:
        """Shut down: blocked and later calls raise `BufferClosed`. Idempotent."""
        self._closed = True
        if self._limiter is not None:
            self._limiter.close()


class Writer:
    """Thread-safe batching front of a `BufferServer`: single items in, one add per `flush_size` items.

    Args:
      server: the `BufferServer` to add to.
      flush_size: items per add (Python int >= 1), a batch the server's rate limiter can admit.

    Raises:
      TypeError: `server` is not a `BufferServer`. ValueError: `flush_size` is not an int >= 1, or an insert of
        `flush_size` items is one the server's limiter never admits (`BlockingRateLimiter.check_insert`).

    Appends are serialised: the append that completes a batch stacks it on the host and adds it while the others
    wait (back-pressure: with a rate limiter, actors slow down to the learner's pace). Items still pending at
    `close` are dropped. An append or flush that raises keeps every item accepted before it pending (a later
    append or `flush` adds them); the item of an append that raised was not accepted.
    """

    def __init__(self, server: BufferServer, flush_size: int):
        if not isinstance(server, BufferServer):
            raise TypeError(f"server: expected a BufferServer, got {type(server).__name__}")
        flush_size = _validate.static_int("flush_size", flush_size)
        if server.rate_limiter is not None:  # a batch the limiter never admits would leave its items pending for good
            server.rate_limiter.check_insert(flush_size, name="flush_size")
        self.server = server
        self.flush_size = flush_size
        self._pending: list = []
        self._spec: Any = None
        self._lock = threading.Lock()

    @property
    def num_pending(self) -> int:
        """Items appended and not yet added."""
        return len(self._pending)

    def append(self, item: Any, timeout: float | None = None) -> None:
        """Queue one item (a pytree of arrays like the buffer's item, no batch axis); add a batch when full.

        The item's numpy leaves are copied when queued: the caller may refill its arrays in place at once.

        `timeout` bounds the whole call: the wait for the writer's lock and the add's wait for the limiter share
        one deadline. On any error the item is not queued, and the items queued before it stay pending.

        Raises:
          jaxbuffers.RateLimiterTimeout: the lock and the limiter not both obtained within `timeout` seconds.
          BufferClosed: the server was closed.
          TypeError / ValueError: `BufferServer.add`'s, for the batch this item completes (its other errors likewise).
        """
        deadline = self._acquire("append", timeout)
        try:
            if self.server.closed:
                raise BufferClosed("append: the buffer server was closed")
            if self._pending:  # one structure, dtype and shape per batch, checked before the item is queued
                _validate.check_batch(self._spec, item, 0, "item")
            else:
                self._spec = self._checked_first(item)
            # numpy leaves are copied: an actor that refills one observation array in place must not change
            # the items already queued (they are stacked only when the batch is flushed)
            self._pending.append(jax.tree.map(lambda x: x.copy() if isinstance(x, np.ndarray) else x, item))
            if len(self._pending) >= self.flush_size:
                try:
                    self._flush(deadline)
                except BaseException:
                    self._pending.pop()
                    raise
        finally:
            self._lock.release()

    def _acquire(self, what: str, timeout: float | None) -> float | None:
        """Take the writer's lock within `timeout` seconds; returns the call's deadline (`time.monotonic()`).

        Raises:
          TypeError / ValueError: `timeout` not None or a number >= 0 (`_validate.timeout`).
          jaxbuffers.RateLimiterTimeout: the lock not obtained in time.
        """
        timeout = _validate.timeout("timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise RateLimiterTimeout(f"{what}: another actor's add held the writer for more than timeout={timeout} s")
        return deadline

    def _checked_first(self, item: Any) -> Any:
        """The spec of the first item of a batch, once the buffer's `add` took it (traced, nothing runs) as a row of
        a batch of one and of `flush_size` rows. A refusal is the buffer's message with the item's leaf named
        (`item['x']: expected dtype float32, got float64 ...`, where the add says `batch['x']`)."""
        _validate.array_leaves("item", item)
        try:
            if not _compiled.all_passable(jax.tree.leaves(item)):  # a dtype JAX would narrow: as given
                self.server._check_batch(jax.tree.map(lambda x: x[None], item))
            rows = jax.tree.map(lambda x: jax.ShapeDtypeStruct((self.flush_size, *np.shape(x)), x.dtype), item)
            self.server._add.eval_shape(self.server._buffer, rows)
        except (TypeError, ValueError) as e:
            msg = f"item{str(e)[5:]}" if str(e).startswith(("batch[", "batch:")) else f"item: {e}"
            for shape in {np.shape(x) for x in jax.tree.leaves(item)}:  # the shape passed, not the batch's it made
                for lead in {1, self.flush_size}:
                    msg = msg.replace(f"got {(lead, *shape)}", f"got an item of shape {shape}")
            raise type(e)(f"{msg} (the item checked as a row of the batches of {self.flush_size} this writer adds)") from None
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), item)

    def flush(self, timeout: float | None = None) -> None:
        """Add the pending items now (fewer than `flush_size`; nothing when none are pending); `timeout` as
        `append`'s. On an error they stay pending."""
        deadline = self._acquire("flush", timeout)
        try:
            if self._pending:
                self._flush(deadline)
        finally:
            self._lock.release()

    def _flush(self, deadline: float | None) -> None:
        """Add the pending items in one batch; they are removed from the queue only once the add returned."""
        batch = jax.tree.map(lambda *xs: np.stack(xs), *self._pending)
        self.server.add(batch, None if deadline is None else max(0.0, deadline - time.monotonic()))
        self._pending = []


def ray_server(buffer: Any, *, rate_limit: dict | None = None, max_concurrency: int = 16, **kwargs) -> Any:
    """A `BufferServer` running as a Ray actor (needs `ray`, and `ray.init()` called).

    Its methods are the server's, called with `.remote(...)`: actors send numpy pytrees to `add.remote(batch)`;
    `sample.remote(None, batch_size)` returns the sample with numpy leaves. `max_concurrency` threads serve calls,
    so a blocked add never stops a sample (keep it above the number of callers that may block at once).

    Args:
      buffer: the initial buffer.
      rate_limit: keyword arguments of a `jaxbuffers.BlockingRateLimiter` built inside the actor (a limiter
        holds a lock and lives in one process), e.g. `dict(samples_per_insert=4.0, min_size=1_000)`.
      max_concurrency: threads serving calls (int >= 1).
      kwargs: `BufferServer`'s other arguments (`seed`, `add`, `sample`).

    Every argument is checked here, before Ray is imported or started and before any actor exists, raising what
    `BufferServer` and `BlockingRateLimiter` raise for them (the limiter is built here once for its checks).

    Raises:
      TypeError: `rate_limit` not a dict, a key of it `BlockingRateLimiter` does not take or a required one missing
        (`samples_per_insert`), a keyword `BufferServer` does not take (`rate_limiter`: pass `rate_limit`), and
        `BufferServer`'s TypeErrors (`buffer` without `add` / `sample` methods, `add` / `sample` not callable).
      ValueError: `max_concurrency` not an int >= 1, `BlockingRateLimiter`'s ValueErrors for the values of
        `rate_limit` (e.g. a negative `samples_per_insert`), `seed` not an int >= 0.
      ImportError: ray is not installed.
    """
    if rate_limit is not None:
        BlockingRateLimiter(**_validate.keyword_dict("rate_limit", rate_limit, BlockingRateLimiter.__init__))
    max_concurrency = _validate.static_int("max_concurrency", max_concurrency)
    if "rate_limiter" in kwargs:
        raise TypeError("rate_limiter: ray_server builds its limiter inside the actor; pass rate_limit=dict(...) of its arguments")
    _validate.parameters("ray_server", BufferServer.__init__, kwargs)
    _server_arguments(buffer, kwargs.get("add"), kwargs.get("sample"), None, kwargs.get("seed", 0))
    import ray

    class _Remote(BufferServer):
        def __init__(self, buffer, rate_limit, **kwargs):
            limiter = None if rate_limit is None else BlockingRateLimiter(**rate_limit)
            super().__init__(buffer, rate_limiter=limiter, **kwargs)

        def sample(self, key, batch_size, timeout=None, **kwargs):  # numpy leaves, for transport
            return jax.tree.map(np.asarray, super().sample(key, batch_size, timeout, **kwargs))

    return ray.remote(max_concurrency=max_concurrency)(_Remote).remote(buffer, rate_limit, **kwargs)
