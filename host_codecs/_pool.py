"""The thread pool every codec and the store split their batches over (`docs/api/host_codecs.md`, "Thread pool")."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Callable

import numpy as np

__all__ = ["num_threads", "parallel_for", "set_num_threads"]

_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_LOCK = threading.Lock()
_NUM_THREADS: int | None = None
_SHARD = threading.local()  # .active: this thread is running a parallel_for shard


def num_threads() -> int:
    """How many threads a batch is split over: the value given to `set_num_threads`, else the `HOST_CODECS_THREADS`
    environment variable, else the number of CPUs this process may use."""
    global _NUM_THREADS
    if _NUM_THREADS is None:
        env = os.environ.get("HOST_CODECS_THREADS")
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        _NUM_THREADS = max(1, int(env) if env else cpus)
    return _NUM_THREADS


def set_num_threads(n: int | None) -> None:
    """Set how many threads a batch is split over.

    Args:
      n: a positive int (Python or numpy), or None for the default of `num_threads`; at most this many shards run.

    Raises:
      ValueError: `n` is not a positive int or None.
    """
    from ._base import int_arg  # (here: _base imports this module)

    global _NUM_THREADS, _POOL
    n = None if n is None else int_arg("set_num_threads", n)
    with _LOCK:
        _NUM_THREADS = n
        if _POOL is not None and n is not None and n > _POOL._max_workers:
            _POOL = None  # recreated bigger on next use; the old one finishes its tasks


def parallel_for(n: int, body: Callable[[int, int], None], *, work_bytes: int | None = None,
                 min_shard_bytes: int = 1 << 18) -> None:
    """Run `body(start, stop)` over `range(n)`, cut into one contiguous shard per thread.

    Args:
      n: number of items.
      body: called once per shard with its item range, on the calling thread or a pool thread
        (`docs/api/host_codecs.md`, "Thread pool").
      work_bytes: bytes the whole batch touches; shards smaller than `min_shard_bytes` are merged, so a small batch
        runs inline as one shard (and what it calls stays inline).
      min_shard_bytes: smallest shard worth a thread's wake-up.

    Raises:
      Exception: whatever a shard raised (after every shard has finished).
    """
    shards = min(num_threads(), n, n if work_bytes is None else work_bytes // min_shard_bytes)
    if shards <= 1 or getattr(_SHARD, "active", False):
        _run_shard(body, 0, n)
        return
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=num_threads(), thread_name_prefix="host_codecs")
        pool = _POOL
    job = _Shards(body, np.linspace(0, n, shards + 1).astype(np.int64).tolist())
    for _ in range(shards - 1):
        pool.submit(job.work)
    job.work()
    job.wait()


class _Shards:
    """The shards of one `parallel_for`: `work` runs the next unclaimed shard until none is left (any thread may
    call it, any number of times); `wait` returns once every shard has finished, raising the first error of one."""

    def __init__(self, body: Callable[[int, int], None], bounds: list[int]):
        self.body, self.bounds = body, bounds
        self.claimed, self.left = 0, len(bounds) - 1  # shards started, shards not finished
        self.lock, self.done = threading.Lock(), threading.Event()
        self.errors: list[BaseException] = []

    def work(self) -> None:
        while True:
            with self.lock:
                i = self.claimed
                if i >= len(self.bounds) - 1:
                    return
                self.claimed += 1
            try:
                _run_shard(self.body, self.bounds[i], self.bounds[i + 1])
            except BaseException as e:  # noqa: BLE001 - re-raised by wait, on the calling thread
                self.errors.append(e)
            finally:
                with self.lock:
                    self.left -= 1
                    if not self.left:
                        self.done.set()

    def wait(self) -> None:
        self.done.wait()
        if self.errors:
            raise self.errors[0]


def _run_shard(body: Callable[[int, int], None], start: int, stop: int) -> None:
    prev = getattr(_SHARD, "active", False)
    _SHARD.active = True
    try:
        body(start, stop)
    finally:
        _SHARD.active = prev
