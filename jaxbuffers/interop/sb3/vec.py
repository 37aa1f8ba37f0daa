"""`DummyVecRolloutBuffer`: one SB3 rollout buffer object over a list of buffers (`docs/api/sb3.md`, "Several
buffers behind one")."""

from __future__ import annotations

import concurrent.futures
import inspect
import weakref
from typing import Any, Callable, Iterable

import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, RolloutBuffer
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape

from jaxbuffers import _validate
from jaxbuffers._validate import sb3_rollout

__all__ = ["DummyVecRolloutBuffer"]

_OWN = ("_buffers", "_executor", "_finalizer", "use_threads")


def _prepare(i: int, buf: Any, name: str, fn: Callable, args: tuple, kwargs: dict) -> Callable[[], Any]:
    """Buffer ``i``'s checks of ``fn(*args, **kwargs)``, changing nothing, and the call to make once every buffer
    passed; a refusal is raised again, same type, with the buffer's index and method first in its message."""
    own, prepare = getattr(buf, "check_call", None), getattr(buf, "prepare_call", None)
    try:
        if callable(prepare):
            return prepare(name, *args, **kwargs)
        if callable(own):
            own(name, *args, **kwargs)
        elif isinstance(buf, RolloutBuffer):
            sb3_rollout.check(buf, name, *args, **kwargs)
        else:
            inspect.signature(fn).bind(*args, **kwargs)
        return lambda: fn(*args, **kwargs)
    except Exception as e:
        where = f"buffers[{i}] ({type(buf).__name__}.{name})"
        try:
            again = type(e)(f"{where}: {e}")
        except Exception:
            e.add_note(f"refused by {where}, before any buffer was called")
            raise e from None
        raise again from e


class DummyVecRolloutBuffer(RolloutBuffer):
    """A rollout buffer that forwards every call to ``buffers`` and returns one result per buffer. ``buffer_size``,
    ``observation_space``, ``action_space``, ``device`` and ``n_envs`` are SB3's, kept as attributes.

    Args:
      use_threads: run the calls of one delegated method concurrently in a thread pool (one worker per buffer).
      buffers: the underlying buffers, each with SB3's rollout methods.
      **kwargs: SB3 ``RolloutBuffer`` options (``gae_lambda``, ``gamma``), kept as attributes.

    Raises:
      TypeError: ``buffers`` is not an iterable of objects with ``add``, ``reset`` and ``full`` (the message names
        the index), or ``use_threads`` is not a bool.
      ValueError: an unknown keyword argument; a buffer whose ``n_envs``, ``obs_shape`` or ``action_dim`` differs
        from the facade's (the message names the index).
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space, device: th.device | str = "auto",
                 n_envs: int = 1, use_threads: bool = False, buffers: Iterable[BaseBuffer] | None = None, **kwargs: Any):
        use_threads = _validate.static_bool("use_threads", use_threads)
        unknown = sorted(set(kwargs) - {"gae_lambda", "gamma"})
        if unknown:
            raise ValueError(f"kwargs: unknown options {unknown}; expected some of ['gae_lambda', 'gamma']")
        bufs = list(buffers or [])
        for i, b in enumerate(bufs):
            missing = [m for m in ("add", "reset", "full") if not hasattr(b, m)]
            if missing:
                raise TypeError(f"buffers[{i}]: a {type(b).__name__} has no {missing}; expected a rollout buffer")
            want = {"n_envs": n_envs, "obs_shape": get_obs_shape(observation_space), "action_dim": get_action_dim(action_space)}
            for name, value in want.items():  # what every add through the facade must fit (where the buffer says)
                if getattr(b, name, value) != value:
                    raise ValueError(f"buffers[{i}]: a {type(b).__name__} with {name}={getattr(b, name)}, the facade's is {value}")
        self._buffers, self.use_threads = bufs, use_threads
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=max(len(bufs), 1)) if use_threads else None
        # Shut down when the facade is collected or at interpreter exit, while the modules it needs still exist.
        self._finalizer = None if self._executor is None else weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.gae_lambda, self.gamma = kwargs.get("gae_lambda", 1), kwargs.get("gamma", 0.99)
        self.generator_ready = False

    @property
    def buffers(self) -> tuple:
        """The underlying buffers, in call order."""
        return tuple(self._buffers)

    @property
    def full(self) -> bool:
        """True when every underlying buffer is full (True for no buffers)."""
        return all(bool(b.full) for b in self._buffers)

    @full.setter
    def full(self, value: bool) -> None:
        pass  # SB3's reset assigns it; fullness is the buffers'

    @property
    def pos(self) -> int:
        """Steps added since ``reset``: the smallest ``pos`` of the buffers (0 for no buffers)."""
        return min((int(b.pos) for b in self._buffers if hasattr(b, "pos")), default=0)

    @pos.setter
    def pos(self, value: int) -> None:
        pass  # SB3's reset assigns it; positions are the buffers'

    def call(self, name: str, *args: Any, **kwargs: Any) -> list:
        """``[getattr(b, name)(*args, **kwargs) for b in buffers]``, concurrently with ``use_threads``. Every buffer's
        arguments are checked before any buffer is called (by its ``check_call``, SB3's rollout checks, or its
        method's signature), so a call one buffer refuses changes none; an exception raised during the call itself
        propagates with a note naming the buffer's index.

        Raises:
          AttributeError: a buffer without ``name`` (named with its index).
          Exception: the refusing buffer's own exception type (``TypeError``, ``ValueError``, ``IndexError``,
            ``RuntimeError``, ...), its message starting ``buffers[i] (Class.name):`` and naming the argument.
        """
        return self.prepare_call(name, *args, **kwargs)()

    def check_call(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Every buffer's checks of ``call(name, *args, **kwargs)``, changing nothing (a facade may hold facades):
        raises what `call` raises before it calls any buffer."""
        self.prepare_call(name, *args, **kwargs)

    def prepare_call(self, name: str, *args: Any, **kwargs: Any) -> Callable[[], list]:
        """`check_call`, returning `call` as a function of no arguments, with the arguments each buffer converted at
        the check. Nothing changes until it is called."""
        fns = [getattr(b, name, None) for b in self._buffers]
        for i, (b, fn) in enumerate(zip(self._buffers, fns)):
            if not callable(fn):
                raise AttributeError(f"buffers[{i}]: a {type(b).__name__} has no method {name!r}")
        calls = [_prepare(i, b, name, fn, args, kwargs) for i, (b, fn) in enumerate(zip(self._buffers, fns))]

        def run() -> list:
            if self._executor is None:
                return [self._run(i, c, fn) for i, (c, fn) in enumerate(zip(calls, fns))]
            tasks = [self._executor.submit(self._run, i, c, fn) for i, (c, fn) in enumerate(zip(calls, fns))]
            return [t.result() for t in tasks]

        return run

    @staticmethod
    def _run(i: int, call: Callable[[], Any], fn: Callable) -> Any:
        try:
            return call()
        except Exception as e:
            e.add_note(f"in buffers[{i}] ({type(fn.__self__).__name__}.{fn.__name__})")
            raise

    def add(self, *args: Any, **kwargs: Any) -> list:
        """``add`` on every buffer (SB3's arguments); one result per buffer."""
        return self.call("add", *args, **kwargs)

    def reset(self) -> list:
        """``reset`` on every buffer."""
        if hasattr(self, "_buffers"):
            out = self.call("reset")
            BaseBuffer.reset(self)
            return out
        return []

    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: Any) -> list:
        """``compute_returns_and_advantage`` on every buffer."""
        return self.call("compute_returns_and_advantage", last_values, dones)

    def get(self, batch_size: int | None = None) -> list:
        """Each buffer's minibatch generator (SB3's ``get``), one per buffer."""
        return self.call("get", batch_size)

    def sample(self, batch_size: int, env: Any = None) -> list:
        """Each buffer's ``sample``."""
        return self.call("sample", batch_size, env=env)

    def size(self) -> list:
        """Each buffer's ``size()``."""
        return self.call("size")

    def _get_samples(self, batch_inds: Any, env: Any = None) -> list:
        return self.call("_get_samples", batch_inds, env)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the facade lacks: read them from every buffer.
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        bufs = self.__dict__.get("_buffers", [])
        if bufs and all(callable(getattr(b, name, None)) for b in bufs):
            return lambda *args, **kwargs: self.call(name, *args, **kwargs)
        missing = [i for i, b in enumerate(bufs) if not hasattr(b, name)]
        if not bufs or missing:
            raise AttributeError(f"{name}: not an attribute of the facade or of buffers {missing}")
        return [getattr(b, name) for b in bufs]

    def close(self) -> None:
        """Shut the thread pool down (nothing without ``use_threads``)."""
        if self._executor is not None:
            self._finalizer.detach()
            self._executor.shutdown(cancel_futures=True)
            self._executor = None
