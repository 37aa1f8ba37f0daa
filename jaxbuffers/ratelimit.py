r"""Samples-per-insert rate limiting: `RateLimiter` (pure state inside `jit`) and `BlockingRateLimiter` (threads).

The rule is Reverb's `SampleToInsertRatio` (Cassirer et al. 2021). With $I$ the items inserted, $S$ the items
sampled, $\rho$ the target samples per insert and $m$ the minimum size, the *balance* is

$$
D = \rho I - S, \qquad \text{offset} = \rho m, \qquad
D_{lo} = \text{offset} - e_{lo}, \quad D_{hi} = \text{offset} + e_{hi},
$$

($e$ = `error_buffer`, one number for both sides or a pair `(e_lo, e_hi)`), and

* an insert of $n$ items may run when $I + n \le m$ (the buffer is still filling) or $D + \rho n \le D_{hi}$;
* a sample of $n$ items may run when $I \ge m$ and $D - n \ge D_{lo}$.

So after the first $m$ inserts, $S$ stays within $[\rho I - \rho m - e_{hi} - \rho n, \rho I - \rho m + e_{lo}]$:
the learner sees each item $\rho$ times on average, never running ahead of the actors by more than the band.
A request for $n$ items is counted as $n$ samples (a learner update of batch $B$ is $n = B$; `num_updates`
turns the allowance into updates).

Progress. A single insert and a single sample are both refused when $D_{hi} - \rho < D < D_{lo} + 1$, so the band
must be at least $\rho + 1$ wide (checked at `create`); with batches of $n_I$ inserts and $n_S$ samples it must be
at least $\rho n_I + n_S$ wide, or both sides can wait on each other forever (`BlockingRateLimiter` refuses a
request that no balance could admit).

Exact integers. $\rho$ is held as a fraction $p / q$ (denominator at most 10,000, within `1e-9` relative of the
value given: a value that no such fraction matches is refused), and the balance in units of $1/q$ as the int32
$qD = pI - qS$, which the rule keeps within the band: it never drifts as a float sum would. The band edges are
rounded inwards to whole units. Items ever inserted and sampled are two-word counters
(`jaxbuffers._ring.counter_*`), exact past `2**31`. Inside `jit` the limiter does not stop anything: it says what
may run (`num_samples_allowed`, `can_insert`, ...) and the step records what ran; recording more than allowed is
counted faithfully, with the balance saturating at $\pm 2^{30}$ units.

Example (inside a jitted step):
  ```python
  lim = jb.RateLimiter.create(samples_per_insert=8.0, min_size=1_000, error_buffer=256.0)
  lim = lim.insert(num_envs)                    # after adding one step of every env
  n = lim.num_updates(batch_size=256)           # updates that may run now (int32)
  # run n updates (lax.while_loop / a masked fori_loop), then:
  lim = lim.sample(n * 256)
  ```

References:
  Cassirer et al., "Reverb: A Framework for Experience Replay", 2021 (rate limiters, `SampleToInsertRatio`).
"""

from __future__ import annotations

import fractions
import math
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuffers import _ring, _validate

__all__ = ["RateLimiter", "BlockingRateLimiter", "RateLimiterClosed", "RateLimiterTimeout"]

_MAX_DENOMINATOR = 10_000
_SATURATE = 2**30  # the int32 balance is clamped into [-_SATURATE, _SATURATE]


class _Band(struct.PyTreeNode):
    """The static rule: rho = `num / den`, the minimum size and the band edges in units of `1 / den`."""

    num: int = struct.field(pytree_node=False)
    den: int = struct.field(pytree_node=False)
    min_size: int = struct.field(pytree_node=False)
    lo: int = struct.field(pytree_node=False)  # D_lo * den, rounded up
    hi: int = struct.field(pytree_node=False)  # D_hi * den, rounded down

    @classmethod
    def create(cls, samples_per_insert, min_size, error_buffer) -> "_Band":
        try:
            rho = _validate.static_float("samples_per_insert", samples_per_insert, 0.0, 1e6)
        except ValueError:
            rho = 0.0  # NaN or out of range: the message below, one for every refused value
        if rho <= 0:
            raise ValueError(f"samples_per_insert: expected a number in (0, 1e6], got {samples_per_insert}")
        frac = fractions.Fraction(rho).limit_denominator(_MAX_DENOMINATOR)
        if abs(float(frac) - rho) > 1e-9 * rho:
            raise ValueError(
                f"samples_per_insert: expected a fraction p/q with q <= {_MAX_DENOMINATOR} (within 1e-9 relative), "
                f"got {rho!r}; the nearest is {frac} = {float(frac)!r}"
            )
        min_size = _validate.static_int("min_size", min_size, minimum=0)
        if isinstance(error_buffer, (tuple, list)):
            if len(error_buffer) != 2:
                raise ValueError(f"error_buffer: expected a number or a pair (below, above), got {error_buffer!r}")
            e_lo, e_hi = (_validate.static_float(f"error_buffer[{i}]", e, 0.0, 1e9) for i, e in enumerate(error_buffer))
        else:
            e_lo = e_hi = _validate.static_float("error_buffer", error_buffer, 0.0, 1e9)
        num, den = frac.numerator, frac.denominator
        offset = num * min_size  # rho * m in units of 1 / den
        lo, hi = offset - math.floor(e_lo * den), offset + math.floor(e_hi * den)
        if hi - lo < num + den:
            raise ValueError(
                f"error_buffer: the band [{lo / den}, {hi / den}] around rho * min_size = {offset / den} is narrower "
                f"than samples_per_insert + 1 = {(num + den) / den}: one insert and one sample would both wait forever; "
                f"got error_buffer={error_buffer!r}"
            )
        if max(abs(lo), abs(hi)) + num + den > _SATURATE // 2:
            raise ValueError(
                f"min_size / error_buffer: the band edges {lo / den} and {hi / den} times the denominator {den} must "
                f"stay below 2**29 in magnitude (the balance is an int32 of units 1/{den})"
            )
        return cls(num=num, den=den, min_size=min_size, lo=lo, hi=hi)

    # The rule, written once for Python ints (host) and int32 arrays (jit); `xp` is numpy or jax.numpy.

    def can_insert(self, inserted, balance, n):
        return (inserted + n <= self.min_size) | (balance + n * self.num <= self.hi)

    def can_sample(self, inserted, balance, n):
        return (inserted >= self.min_size) & (balance - n * self.den >= self.lo)

    def inserts_allowed(self, xp, inserted, balance):
        filling = self.min_size - inserted
        return xp.maximum(xp.maximum(filling, (self.hi - balance) // self.num), 0)

    def samples_allowed(self, xp, inserted, balance):
        return xp.where(inserted >= self.min_size, xp.maximum((balance - self.lo) // self.den, 0), 0)

    def describe(self) -> str:
        return (f"samples_per_insert={self.num}/{self.den}, min_size={self.min_size}, "
                f"band=[{self.lo / self.den}, {self.hi / self.den}]")


class RateLimiter(struct.PyTreeNode):
    """Samples-per-insert limiter as pure state (module doc): it says how many inserts and samples may run now.

    Build it with `create`; `insert(n)` and `sample(n)` record what ran and return a new limiter. Every method is
    pure and jittable; counts may be traced int32 scalars (non-negative, below `2**30` per call).
    """

    inserted: jax.Array  # shape=(2,), int32: items ever inserted, two-word counter [high, low] (_ring.counter_*)
    sampled: jax.Array  # shape=(2,), int32: items ever sampled, two-word counter [high, low]
    balance: jax.Array  # shape=(), int32: (rho * inserted - sampled) * den, saturating at +-2**30
    filling: jax.Array  # shape=(), int32: inserts still needed to reach min_size, in [0, min_size]
    band: _Band = struct.field(pytree_node=False)  # rho = num / den, min_size and the band edges (units of 1 / den)

    @classmethod
    def create(cls, samples_per_insert: float, *, min_size: int = 1, error_buffer: float | tuple = 100.0) -> "RateLimiter":
        """A limiter with nothing inserted or sampled.

        Args:
          samples_per_insert: $\\rho > 0$, a fraction with denominator at most 10,000 (module doc).
          min_size: $m$, items inserted before any sample may run (Python int >= 0).
          error_buffer: $e \\ge 0$, samples the learner may run ahead (below) or behind (above) the target;
            a number for both sides or a pair `(below, above)`.

        Raises:
          ValueError: a value out of range, a band narrower than $\\rho + 1$, or band edges that do not fit
            the int32 balance (module doc).
          TypeError: a value that is not a number.
        """
        band = _Band.create(samples_per_insert, min_size, error_buffer)
        return cls(
            inserted=_ring.counter_zero(), sampled=_ring.counter_zero(), balance=jnp.int32(0),
            filling=jnp.int32(band.min_size), band=band,
        )

    @property
    def samples_per_insert(self) -> float:
        """$\\rho$ as a Python float."""
        return self.band.num / self.band.den

    @property
    def min_size(self) -> int:
        """$m$, a Python int."""
        return self.band.min_size

    def _inserted(self):
        """Items inserted, saturated at `min_size` (all the rule needs of it): int32 scalar."""
        return jnp.int32(self.band.min_size) - self.filling

    def num_inserted(self) -> int:
        """Exact items ever inserted: a host-side Python int."""
        return _ring.counter_value(self.inserted)

    def num_sampled(self) -> int:
        """Exact items ever sampled: a host-side Python int."""
        return _ring.counter_value(self.sampled)

    def can_insert(self, n=1) -> jax.Array:
        """Whether an insert of `n` items may run now (bool scalar)."""
        return self.band.can_insert(self._inserted(), self.balance, _count("n", n))

    def can_sample(self, n=1) -> jax.Array:
        """Whether a sample of `n` items may run now (bool scalar)."""
        return self.band.can_sample(self._inserted(), self.balance, _count("n", n))

    def num_inserts_allowed(self) -> jax.Array:
        """The largest `n` for which `can_insert(n)` holds now (int32 scalar, >= 0)."""
        return self.band.inserts_allowed(jnp, self._inserted(), self.balance).astype(jnp.int32)

    def num_samples_allowed(self) -> jax.Array:
        """The largest `n` for which `can_sample(n)` holds now (int32 scalar, >= 0)."""
        return self.band.samples_allowed(jnp, self._inserted(), self.balance).astype(jnp.int32)

    def num_updates(self, batch_size: int) -> jax.Array:
        """Learner updates of `batch_size` sampled items that may run now: `num_samples_allowed() // batch_size`.

        Raises:
          ValueError: `batch_size` not a Python int >= 1.
        """
        batch_size = _validate.static_int("batch_size", batch_size)
        return self.num_samples_allowed() // batch_size

    def insert(self, n=1) -> "RateLimiter":
        """Record an insert of `n` items (int >= 0, may be traced): the new limiter."""
        n = _count("n", n)
        balance = jnp.minimum(self.balance + n * self.band.num, _SATURATE)
        return self.replace(
            inserted=_ring.counter_add(self.inserted, n), balance=balance.astype(jnp.int32),
            filling=jnp.maximum(self.filling - n, 0).astype(jnp.int32),
        )

    def sample(self, n=1) -> "RateLimiter":
        """Record a sample of `n` items (int >= 0, may be traced): the new limiter."""
        n = _count("n", n)
        balance = jnp.maximum(self.balance - n * self.band.den, -_SATURATE)
        return self.replace(sampled=_ring.counter_add(self.sampled, n), balance=balance.astype(jnp.int32))


def _count(name: str, n) -> jax.Array:
    """`n` as an int32 scalar: a Python int or a concrete 0-d integer array in `[0, 2**30)`, or a traced 0-d integer
    array (not range-checked)."""
    if isinstance(n, (int, np.integer)) and not isinstance(n, bool):
        if not 0 <= n < 2**30:
            raise ValueError(f"{name}: expected an int in [0, 2**30), got {n}")
        return jnp.int32(n)
    if not _validate.is_array(n):  # a Python float, bool, string...: named as given, not as the array it would become
        raise _validate.unexpected(name, "an int or a 0-d integer array", n)
    x = _validate.as_array(n)
    if x.shape != () or not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name}: expected an int or a 0-d integer array, got {x.dtype}{list(x.shape)}")
    if not isinstance(x, jax.core.Tracer):  # a concrete array is range-checked as a Python int is
        return _count(name, int(x))
    return x.astype(jnp.int32)


class RateLimiterTimeout(TimeoutError):
    """A blocked insert or sample waited longer than its timeout; the message says which, and the limiter's counts."""


class RateLimiterClosed(RuntimeError):
    """The limiter was closed (shutdown) while a caller waited, or a caller came after it was closed."""


class BlockingRateLimiter:
    """The rule of `RateLimiter` for host threads: `await_insert` / `await_sample` block until the request may run.

    Thread-safe. A waiting call wakes when the other side records progress, when its timeout expires
    (`RateLimiterTimeout`) or when `close` is called (`RateLimiterClosed`, also raised by every later call). The
    counts are Python ints: exact and unbounded. Admission and recording are one step under the lock, so two callers
    can never both use the same room in the band.

    Two-phase inserts: `reserve_insert` waits for room and holds it (later inserts see it used; samples do not yet
    see the items), then `commit_insert` records the insert or `cancel_insert` gives the room back, as if the
    request never came. A caller whose insert may still fail after admission (a buffer that refuses a batch when
    it runs) reserves, and commits only once the items are stored: a sample is never admitted on items that were
    not stored.

    Example:
      ```python
      lim = jb.BlockingRateLimiter(samples_per_insert=4.0, min_size=1_000, error_buffer=512.0)
      # actor thread:   lim.await_insert(len(batch), timeout=10.0); buffer_add(batch)
      # learner thread: lim.await_sample(256, timeout=10.0); buffer_sample(256)
      # shutdown:       lim.close()   # every waiting thread raises RateLimiterClosed
      ```
    """

    def __init__(self, samples_per_insert: float, *, min_size: int = 1, error_buffer: float | tuple = 100.0):
        """Arguments and errors as `RateLimiter.create`."""
        self.band = _Band.create(samples_per_insert, min_size, error_buffer)
        self._cond = threading.Condition()
        self._inserted = 0
        self._reserved = 0  # inserts admitted by reserve_insert, not yet committed or cancelled
        self._sampled = 0
        self._closed = False

    @property
    def num_inserted(self) -> int:
        """Items inserted so far (Python int)."""
        return self._inserted

    @property
    def num_sampled(self) -> int:
        """Items sampled so far (Python int)."""
        return self._sampled

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed

    def num_inserts_allowed(self) -> int:
        """Items an insert could add now without waiting (Python int, >= 0)."""
        with self._cond:
            ahead = self._inserted + self._reserved
            return int(self.band.inserts_allowed(np, min(ahead, self.band.min_size), self._balance(self._reserved)))

    def num_samples_allowed(self) -> int:
        """Items a sample could take now without waiting (Python int, >= 0)."""
        with self._cond:
            return int(self.band.samples_allowed(np, min(self._inserted, self.band.min_size), self._balance()))

    def _balance(self, reserved: int = 0) -> int:
        return (self._inserted + reserved) * self.band.num - self._sampled * self.band.den

    def _state(self) -> str:
        b = self.band
        reserved = f" (+{self._reserved} reserved)" if self._reserved else ""
        return (f"inserted={self._inserted}{reserved}, sampled={self._sampled}, balance={self._balance() / b.den} "
                f"({b.describe()})")

    def _await(self, what: str, n, timeout: float | None, admits, name: str) -> None:
        n = _validate.static_int(name, n, minimum=0)
        timeout = _validate.timeout("timeout", timeout)
        self._check_admissible(what, n, name)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise RateLimiterClosed(f"{what} of {n} items: the rate limiter was closed ({self._state()})")
                if admits(n):
                    if what == "insert":
                        self._reserved += n
                    else:
                        self._sampled += n
                        self._cond.notify_all()
                    return
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RateLimiterTimeout(
                        f"{what} of {n} items: not admitted within timeout={timeout} s ({self._state()}); "
                        f"the other side (the {'learner' if what == 'insert' else 'actors'}) made no room"
                    )
                self._cond.wait(left)

    def _check_admissible(self, what: str, n: int, name: str) -> None:
        # The balance never leaves [min(0, lo), hi] by admitted requests: beyond that room nothing is ever admitted.
        b = self.band
        room = b.hi - min(0, b.lo) if what == "insert" else b.hi - b.lo
        cost = n * (b.num if what == "insert" else b.den)
        if cost > room and not (what == "insert" and n <= b.min_size):
            raise ValueError(
                f"{name}: {'an' if what == 'insert' else 'a'} {what} of {n} items moves the balance by {cost / b.den}, more than the {room / b.den} the "
                f"band ever leaves: no balance admits it ({b.describe()}); split the request"
            )

    def check_insert(self, n: int, *, name: str = "n") -> None:
        """Refuse an insert of `n` items that no balance ever admits (every `await_insert(n)` would raise), without
        waiting or counting anything; `name` is what the error calls `n`.

        Raises:
          ValueError: `n` is not an int >= 0, or `n * samples_per_insert` exceeds the band's width (and `n > min_size`).
        """
        self._check_admissible("insert", _validate.static_int(name, n, minimum=0), name)

    def await_insert(self, n: int = 1, timeout: float | None = None, *, name: str = "n") -> None:
        """Block until an insert of `n` items may run, then record it (`reserve_insert` then `commit_insert`).

        Args:
          n: items (Python int >= 0).
          timeout: seconds to wait at most (`None`: forever).
          name: what the errors call `n` (the caller's own argument, e.g. `batch_size` for a server's sample).

        Raises:
          RateLimiterTimeout: not admitted within `timeout`.
          RateLimiterClosed: `close` was called before or while waiting.
          TypeError: `timeout` not None or a number (a bool, a str).
          ValueError: `n` invalid, `timeout` negative or NaN, or `n` too large for any balance to admit.
        """
        self.reserve_insert(n, timeout, name=name)
        self.commit_insert(n)

    def reserve_insert(self, n: int = 1, timeout: float | None = None, *, name: str = "n") -> None:
        """Block until an insert of `n` items may run, then hold its room: later inserts are admitted as if it had
        run, samples as if it had not, until `commit_insert(n)` or `cancel_insert(n)`. Arguments and errors as
        `await_insert`."""
        b = self.band

        def admits(k: int) -> bool:
            ahead = self._inserted + self._reserved
            return b.can_insert(min(ahead, b.min_size), self._balance(self._reserved), k)

        self._await("insert", n, timeout, admits, name)

    def commit_insert(self, n: int) -> None:
        """Record the insert of `n` items reserved by `reserve_insert` (it ran); wakes waiting samples.

        Raises:
          ValueError: `n` is more than the items reserved and not yet committed or cancelled.
        """
        self._settle("commit_insert", n, commit=True)

    def cancel_insert(self, n: int) -> None:
        """Give back the room of `n` items reserved by `reserve_insert` (the insert did not run): nothing is
        counted, and waiting inserts may use the room. Works after `close` too. Errors as `commit_insert`."""
        self._settle("cancel_insert", n, commit=False)

    def _settle(self, what: str, n: int, commit: bool) -> None:
        n = _validate.static_int("n", n, minimum=0)
        with self._cond:
            if n > self._reserved:
                raise ValueError(f"n: {what} of {n} items, but only {self._reserved} are reserved ({self._state()})")
            self._reserved -= n
            if commit:
                self._inserted += n
            self._cond.notify_all()

    def await_sample(self, n: int = 1, timeout: float | None = None, *, name: str = "n") -> None:
        """Block until a sample of `n` items may run, then record it. Arguments and errors as `await_insert`."""
        b = self.band
        self._await("sample", n, timeout, lambda k: b.can_sample(min(self._inserted, b.min_size), self._balance(), k), name)

    def close(self) -> None:
        """Shut down: every waiting and later `await_*` raises `RateLimiterClosed`. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __enter__(self) -> "BlockingRateLimiter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
