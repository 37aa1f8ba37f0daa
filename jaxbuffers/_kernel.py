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

Every choice of the library that depends on the backend asks :func:`cpu_paths`; tests switch all
of them to the GPU/TPU side with :func:`accelerator_paths` (``pytest --accelerator-paths``).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, TypeVar

import jax
import jax.numpy as jnp

T = TypeVar("T")

_accelerator_paths = False  # set only by accelerator_paths() (tests)


def cpu_paths() -> bool:
    """Whether the XLA:CPU-specific code paths apply: the default backend is CPU.

    Every CPU-only choice of the library (this module's loop and cost-model tricks, the sum tree's
    scalar walk and chained descent, the compressed buffers' ``buffer_callback``) asks this one
    function, so that :func:`accelerator_paths` can switch all of them at once."""
    return not _accelerator_paths and jax.default_backend() == "cpu"


@contextlib.contextmanager
def accelerator_paths() -> Iterator[None]:
    """Inside this context the library takes the code paths it takes on GPU/TPU, while running on
    the CPU backend, so the test suite checks those paths without an accelerator (they must give
    the same results). JAX's compile caches are cleared on entry and exit: a function jitted under
    one setting must not be reused under the other. For tests only; not thread-safe."""
    global _accelerator_paths
    old = _accelerator_paths
    jax.clear_caches()
    _accelerator_paths = True
    try:
        yield
    finally:
        _accelerator_paths = old
        jax.clear_caches()

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
    if not cpu_paths() or not isinstance(nonnegative, jax.core.Tracer):
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
    if not scalar_loop or not cpu_paths():
        return jax.vmap(fn)(ks)
    out = jax.eval_shape(fn, jnp.int32(0))
    return jax.lax.fori_loop(0, n, lambda k, o: o.at[k].set(fn(k)), jnp.zeros((n,), out.dtype))


# Writes of at least this many bytes are made to count as work for XLA's CPU client (see
# counted_as_work). Measured on the 2-core CPU, one jitted trajectory add per Python call of 8
# lanes, asynchronous vs inline: from ~32 KB per add as fast or faster, at 8 KB and below equal;
# at 226 KB (one Atari frame per lane) 26-42 vs 47-82 us per add over 8 rounds in one process;
# inside a lax.scan 18.8-23.9 vs 19.8-24.6 (no cost). An opaque zero added to the write index
# (a reduction over 1,024 elements, instead of the select) was as fast per call but is a kernel
# of its own: 20.2-26.2 us in the scan.
ASYNC_MIN_BYTES = 32 * 1024


def counted_as_work(update: T, nonnegative: jax.Array) -> T:
    """``update`` unchanged, written so that XLA's cost model counts its elements as work, when it
    holds at least :data:`ASYNC_MIN_BYTES` (CPU backend, traced; otherwise returned as is). For
    the operand of a slice update: the select below fuses into it (into a scatter it did not, and
    cost an extra pass over the rows).

    Why: XLA's CPU client runs a program whose cost model counts under 1,000 flops *inline* on the
    calling thread (see :func:`map_entries`), and a slice update counts none, however many bytes
    it copies. A jitted call that writes one Atari frame per lane then copies its ~226 KB on the
    Python thread, while asynchronously the next call's dispatch overlaps the copy on another
    core. Each leaf becomes ``where(nonnegative >= 0, leaf, 0)``: the predicate is always true but
    opaque to the compiler, so the values are the same bits.

    Args:
      update: pytree of arrays about to be written.
      nonnegative: an int32 scalar that is never negative (e.g. a ring head); may be batched
        under ``vmap``.
    """
    nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(update))
    if not cpu_paths() or nbytes < ASYNC_MIN_BYTES or not isinstance(nonnegative, jax.core.Tracer):
        return update
    keep = jnp.asarray(nonnegative, jnp.int32) >= 0
    return jax.tree.map(lambda x: jnp.where(keep, x, jnp.zeros((), x.dtype)), update)
