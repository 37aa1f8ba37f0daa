"""Running a small buffer update as ONE compiled kernel on XLA:CPU.

XLA:CPU turns a jitted program into a sequence of kernels ("thunks") and runs a sequence of more
than 8 of them that does not form a single dependency chain *concurrently*, handing ready kernels
to its worker threads. For an update that touches a few hundred bytes (one item written, a
17-level sum-tree walk) the hand-offs cost far more than the work: on the 2-core test machine a
prioritised add of one item was 13-18 kernels and took 36-90 us per call, of which the work is a
few microseconds.

XLA:CPU also compiles a ``while`` loop whose one iteration accesses under ~1 KB (its cost model's
bytes accessed; option ``xla_cpu_small_while_loop_byte_threshold``) into a single kernel. So
:func:`as_one_kernel` runs the update as the body of a loop of exactly one iteration whose trip
count XLA cannot see (a constant trip count of 1 would be inlined away): for small updates the
whole program is then ~4 kernels and runs on the calling thread (measured: 44-90 -> 14-15 us per
one-item prioritised add; flashbax 16-18 us). For larger updates the loop is an ordinary one
iteration ``while`` and costs about the same as the unwrapped program (measured within noise at
256 vector items and at one Atari frame). The result is the same computation, bit for bit
(tested). Other backends run ``update`` unchanged: GPU/TPU launch kernels per loop step.

The opposite case: a program that only copies many bytes (a one-step write of an Atari frame per
lane) also counts under XLA's 1,000-flop bar for inline execution, and is faster run
asynchronously; :func:`counted_as_work` makes its cost model count it as work.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import jax
import jax.numpy as jnp

T = TypeVar("T")

# Bytes an update may write and still be part of a small loop kernel (module doc: XLA:CPU's
# small-loop threshold, ~1 KB accessed per iteration). Larger item writes are done as ops of their
# own, next to the one-kernel update of the rest (see PrioritisedReplayBuffer.add).
SMALL_LOOP_BYTES = 1024


def as_one_kernel(update: Callable[[T], T], state: T, nonnegative: jax.Array) -> T:
    """``update(state)``, compiled as one kernel on CPU when small enough (module doc).

    Args:
      update: pure function ``state -> new state`` (same pytree structure, shapes and dtypes).
      state: the pytree to update (donation still updates it in place).
      nonnegative: an int32 scalar of ``state`` that is never negative (e.g. a ring head); it
        makes the trip count ``1 + (nonnegative >> 31) == 1`` opaque to the compiler. Under
        ``vmap`` it may be batched.

    Returns:
      ``update(state)``.
    """
    if jax.default_backend() != "cpu" or not isinstance(nonnegative, jax.core.Tracer):
        return update(state)  # other backends; and eager calls (a loop would compile per call)
    trips = 1 + jnp.right_shift(jnp.asarray(nonnegative, jnp.int32), 31)
    return jax.lax.fori_loop(0, trips, lambda _, s: update(s), state)


def map_entries(fn: Callable[[jax.Array], jax.Array], n: int, *, scalar_loop: bool) -> jax.Array:
    """``[fn(k) for k in range(n)]`` stacked: ``fn`` maps an int32 entry number to a scalar.

    With ``scalar_loop`` on CPU it is ONE ``fori_loop`` over the entries (one small kernel, whose
    operations XLA's cost model counts once, not ``n`` times). Otherwise ``fn`` is vectorised over
    ``arange(n)`` with ``vmap`` (one fused elementwise kernel; what GPU/TPU need). Same values
    either way.

    Why the loop matters on CPU: XLA's CPU client runs a program whose cost model counts fewer
    than 1,000 flops *inline* on the calling thread, and every other program on a worker thread.
    A per-call update of a few microseconds of work (a sum-tree write of 256 priorities) then
    pays a thread hand-off that cost 10-35 us on the 2-core test machine, bimodal with the
    scheduler's placement of the two threads. ``n`` elementwise operations written as vector ops
    count ``n`` flops each (transcendentals such as ``pow`` count none); in the loop they count
    once.
    """
    ks = jnp.arange(n, dtype=jnp.int32)
    if not scalar_loop or jax.default_backend() != "cpu":
        return jax.vmap(fn)(ks)
    out = jax.eval_shape(fn, jnp.int32(0))
    return jax.lax.fori_loop(0, n, lambda k, o: o.at[k].set(fn(k)), jnp.zeros((n,), out.dtype))


# Writes of at least this many bytes are made to count as work for XLA's CPU client (see
# counted_as_work). Measured on the 2-core CPU, one jitted trajectory add per Python call of 8
# lanes, asynchronous vs inline: from ~32 KB per add as fast or faster, at 8 KB and below equal;
# at 226 KB (one Atari frame per lane) 30-58 vs 36-63 us per add (noisy, faster in 6 of 9 rounds),
# and bench_trajectory's add/atari/call went from 0.59-0.98x flashbax (4 runs) to 0.94-1.23x (3).
# Inside a lax.scan the extra index arithmetic measured within noise.
ASYNC_MIN_BYTES = 32 * 1024


def counted_as_work(nbytes: int, index: jax.Array) -> jax.Array:
    """``index`` (an int32 scalar >= 0, e.g. a ring head about to be written at), unchanged, but
    computed so that XLA's cost model counts about 2,000 flops, when the write it positions moves
    at least :data:`ASYNC_MIN_BYTES` (``nbytes``; CPU backend, traced; otherwise returned as is).

    Why: XLA's CPU client runs a program whose cost model counts under 1,000 flops *inline* on the
    calling thread (see :func:`map_entries`), and a slice update counts none, however many bytes
    it copies. A jitted call that writes one Atari frame per lane then copies its ~226 KB on the
    Python thread, while asynchronously the next call's dispatch overlaps the copy on another
    core. The index gains ``sum(iota(1024) * (index >> 31))``: always 0 (``index >= 0``) but opaque
    to the compiler, one small fused loop (well under a microsecond), and the data path is not
    touched (a select fused into the update itself slowed writes inside a ``lax.scan``).
    """
    if jax.default_backend() != "cpu" or nbytes < ASYNC_MIN_BYTES or not isinstance(index, jax.core.Tracer):
        return index
    index = jnp.asarray(index, jnp.int32)
    zero = jnp.right_shift(index, 31)
    return index + jnp.sum(jnp.arange(1024, dtype=jnp.int32) * zero)
