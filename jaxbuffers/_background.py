"""Background work that the interpreter's exit waits for: `start(fn, *args, what=)` runs `fn` in a thread of its own
and returns a `concurrent.futures.Future`.

Why and how the interpreter's exit waits for it: `docs/api/checkpoint.md`, "Background saves at exit".
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
import traceback
from typing import Any, Callable

__all__ = ["start", "finish_at_exit", "taken"]

_UNTAKEN: dict[concurrent.futures.Future, str] = {}  # started jobs whose outcome nobody has taken yet -> what they do
_LOCK = threading.Lock()


def start(fn: Callable[..., Any], *args: Any, what: str) -> concurrent.futures.Future:
    """`fn(*args)` in a new thread that is not a daemon; the future holds its result or exception. `what` names the
    job in the report of its failure at exit ("save to /path")."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    with _LOCK:
        _UNTAKEN[future] = what
    _hook_newest()

    def run():
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits
            future.set_exception(e)
        else:
            taken(future)

    threading.Thread(target=run, name="jaxbuffers-background").start()
    return future


def taken(future: concurrent.futures.Future) -> None:
    """Mark `future`'s outcome as taken by its caller (its error, if any, was raised to them): not reported at exit."""
    with _LOCK:
        _UNTAKEN.pop(future, None)


def _hook_newest() -> None:
    """Register `finish_at_exit` as `threading`'s newest exit hook unless it already is (hooks run newest first)."""
    hooks = getattr(threading, "_threading_atexits", None)
    if hooks is None or not hasattr(threading, "_register_atexit"):  # not CPython's threading: joined threads only
        return
    if hooks and getattr(hooks[-1], "func", None) is finish_at_exit:
        return
    try:
        threading._register_atexit(finish_at_exit)
    except RuntimeError:  # already shutting down: the hook registered before runs
        pass


def finish_at_exit() -> None:
    """Wait for every started job; report each failed one whose error was not taken, then exit with status 1."""
    with _LOCK:
        jobs = dict(_UNTAKEN)
    failed = []
    for future, what in jobs.items():
        error = future.exception()  # waits
        if error is not None:
            failed.append((what, error))
        taken(future)
    if not failed:
        return
    for what, error in failed:
        print(f"jaxbuffers: {what} failed before the interpreter exited; nothing was written in its place:", file=sys.stderr)
        traceback.print_exception(error, file=sys.stderr)
    for thread in threading.enumerate():  # what the normal exit would join next (e.g. removing a replaced folder)
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing more to say
            pass
    os._exit(1)
