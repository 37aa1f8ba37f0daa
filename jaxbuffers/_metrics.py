"""Usage metrics kept in a buffer's state: `Metrics`, and the `record` / `stats` methods every buffer shares.

Counted on the device, inside the training step, as ordinary state leaves (saved by `jaxbuffers.save`):

* inserts: the buffer's own two-word `added` counter (`num_added()`);
* draws recorded: `sampled` (two-word counter), `record_calls`, and `stale`: draws of a position that does not
  hold the item drawn when recorded (the slot was overwritten between the sample and `record`, held nothing, or is
  past this buffer's positions). A sample's empty rows (`indices` -1: a `where=` sample with nothing to draw) were
  never drawn and are counted nowhere;
* ages: for each recorded draw, the items (steps per lane, episodes) added after the drawn one, as of the
  `record` call: `age_sum`, `age_max`, and `age_hist`, bin `k = floor(log2(age + 1))` (ages `[2**k - 1,
  2**(k+1) - 2]`, the last bin open);
* per position (on by default; `metrics=False` at `create` keeps the counters above only): `sample_count`, draws
  recorded since the position was last written. An add resets the positions it writes in the same ring write as
  the data (`Metrics.write`), and `record` counts them with one scatter of the batch: O(batch) each. No insert step
  is kept per position: a ring's slot `s` holds item number `added - 1 - ((head - 1 - s) mod ring)`
  (`jaxbuffers._ring.last_item_number`), so ages come from the cursors alone.

The integer counters and the age bins share one int32 leaf, `totals` (`sampled`, `record_calls`, `stale`, `age_max`,
`age_sum_parts` and `age_hist` are views of it, `TOTALS` entries: the three two-word counters at `SAMPLED`, `CALLS`,
`STALE`, the largest age at `AGE_MAX` (the word after it stays 0), the age sum at `AGE_SUM` as three two-word counters
of the ages' 11-bit parts (`age = p0 + p1 * 2**11 + p2 * 2**22`: exact at any length of run, where a float sum would
drift), the bins from `HIST`), so that `record` updates them all with one elementwise pass and one scatter of the
batch's bins into the same array, whatever the number of counters.

`sample` stays pure: a training step records what it drew with `buf = buf.record(sample)` (cost O(batch)). Ages are
those at `record` time, the same as at sample time when no add comes between. A sample with `generations` (the
prioritised buffers') is checked against the slot's current generation, so a draw whose slot was overwritten meanwhile
is counted as `stale` and nowhere else; a uniform sample is taken to be of the buffer it is recorded into.

Histogram bins and position counts are int32 (4 bytes per position) that saturate: they stop at `2**31 - 1` rather
than wrap. A narrower count would saturate within reach: a 1,000-item dataset sampled 256 at a time gives each item
65,536 draws in 256,000 updates. `stats()` reads everything back as a host-side dict.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxbuffers import _compiled, _ring, _timing, _validate

__all__ = ["Metrics", "Recorded", "NUM_AGE_BINS"]

NUM_AGE_BINS = 32
SAMPLED, CALLS, STALE, AGE_MAX, AGE_SUM, HIST = 0, 2, 4, 6, 8, 14  # where each starts in `Metrics.totals` (word 7: 0)
TOTALS = HIST + NUM_AGE_BINS
AGE_PART_BITS = 11  # the age sum is kept as the sums of three 11-bit parts of each age (module doc)
MAX_RECORD = 2**30 // 2**AGE_PART_BITS  # draws per `record` call: a call's part sums stay below 2**30
_MAX = np.iinfo(np.int32).max


class Metrics(struct.PyTreeNode):
    """Sample-side counters of one buffer (module doc). Build with `Metrics.create`."""

    totals: jax.Array  # shape=[TOTALS], int32: the counters and age bins below, one array (module doc)
    sample_count: jax.Array  # shape=[*positions] (per_slot) or [0], int32: draws recorded since the position was written (stops at 2**31 - 1)
    per_slot: bool = struct.field(pytree_node=False)  # whether sample_count is kept

    @property
    def sampled(self) -> jax.Array:
        """Draws recorded (not stale): int32 `[..., 2]`, a two-word counter `[high, low]` (`jaxbuffers._ring`)."""
        return self.totals[..., SAMPLED:SAMPLED + 2]

    @property
    def record_calls(self) -> jax.Array:
        """`record` calls: int32 `[..., 2]`, a two-word counter."""
        return self.totals[..., CALLS:CALLS + 2]

    @property
    def stale(self) -> jax.Array:
        """Draws recorded as stale: int32 `[..., 2]`, a two-word counter."""
        return self.totals[..., STALE:STALE + 2]

    @property
    def age_max(self) -> jax.Array:
        """Largest age recorded (0 before any draw): int32 `[...]`."""
        return self.totals[..., AGE_MAX]

    @property
    def age_sum_parts(self) -> jax.Array:
        """Sum of the recorded ages as three two-word counters (int32 `[..., 3, 2]`) of the ages' 11-bit parts
        `p_k = (age >> 11 k) & 2047`: the sum is `sum_k value_k * 2**(11 k)` (`age_sum` reads it on the host)."""
        return self.totals[..., AGE_SUM:HIST].reshape(*self.totals.shape[:-1], 3, 2)

    @property
    def age_hist(self) -> jax.Array:
        """Draws by age bin `floor(log2(age + 1))`, the last bin open: int32 `[..., NUM_AGE_BINS]` (stop at `2**31 - 1`)."""
        return self.totals[..., HIST:]

    @classmethod
    def create(cls, positions: tuple[int, ...], per_slot: bool) -> "Metrics":
        """Zero metrics for a buffer of `positions` (the shape of its position grid, e.g. `(capacity,)` or
        `(num_envs, length)`); `per_slot` (a bool) keeps `sample_count` of that shape.

        Raises:
          TypeError: `per_slot` not a bool (`_validate.static_bool`, named `metrics`).
        """
        per_slot = _validate.static_bool("metrics", per_slot)
        return cls(totals=jnp.zeros((TOTALS,), jnp.int32), sample_count=jnp.zeros(positions if per_slot else (0,), jnp.int32),
                   per_slot=per_slot)

    def write(self, storage: Any, rows: Any, head: jax.Array, axis: int = 0) -> tuple[Any, "Metrics"]:
        """`jaxbuffers._ring.write(storage, rows, head, axis)`, with `sample_count` reset to 0 at the positions written
        by the same write (one set of ring indices for every leaf). Returns `(storage, metrics)`. O(rows), in place
        when donated."""
        if not self.per_slot:
            return _ring.write(storage, rows, head, axis), self
        shape = list(self.sample_count.shape)
        shape[axis] = jax.tree.leaves(rows)[0].shape[axis]
        storage, counts = _ring.write((storage, self.sample_count), (rows, jnp.zeros(shape, jnp.int32)), head, axis)
        return storage, self.replace(sample_count=counts)

    def written_at(self, slots: jax.Array) -> "Metrics":
        """Reset `sample_count` at the written `slots` (distinct int32; slots outside `[0, positions)` are ignored).
        O(slots), in place when donated."""
        if not self.per_slot:
            return self
        return self.replace(sample_count=self.sample_count.at[slots].set(0, unique_indices=True, mode="drop"))

    def recorded(self, positions, generations, added, head, num_valid, ring: int, lanes: int = 1, mine=None) -> "Metrics":
        """Count draws at flat `positions` (int32[B], `lane * ring + slot`) of `lanes` rings of `ring` slots with
        cursors `added` (two-word), `head`, `num_valid`; `generations` (int32[B] or None) as sampled; `mine` (bool[B]
        or None: all) the draws of this buffer, the others counted nowhere (a shard's part of a global sample), as
        are negative positions (empty rows: not drawn). O(B).

        Raises:
          ValueError: more than `MAX_RECORD` draws in one call (record them in parts).
        """
        lanes_ring, b = lanes * ring, positions.shape[0]
        if b > MAX_RECORD:
            raise ValueError(f"record: expected at most {MAX_RECORD} draws per call (the exact age sum), got {b}; "
                             f"record the sample in parts")
        pos = jnp.clip(positions, 0, lanes_ring - 1)
        slot = pos % ring if lanes > 1 else pos
        back = head - 1 - slot  # in [-ring, ring - 1)
        age = jnp.where(back < 0, back + ring, back).astype(jnp.int32)  # items written to the ring after this one
        ok = (positions >= 0) & (positions < lanes_ring) & (age < num_valid)  # held: the newest num_valid slots
        if generations is not None:
            ok = ok & (_ring.last_item_number(added, head, slot, ring) == generations)
        if mine is not None:
            ok = ok & mine
        drawn = positions >= 0 if mine is None else (positions >= 0) & mine
        ok_age = jnp.where(ok, age, 0)
        # One pass over the batch for the totals: drawn, the sums of the ages' three 11-bit parts (each below
        # MAX_RECORD * 2**11 = 2**30: exact in int32) and the largest age. The bins take one scatter-add of the draws
        # held (1, else 0) at every draw's bin (always in bounds: no index of its own to mask), the counters one
        # elementwise pass over `totals` after it (`_add_totals`); the positions one scatter of saturating increments
        # (a stale draw goes past the end and is dropped). Scatters of the batch beat one-hot sums on CPU.
        mask = 2**AGE_PART_BITS - 1
        parts = tuple((ok_age >> (AGE_PART_BITS * k)) & mask for k in range(3))
        held = ok.astype(jnp.int32)
        operands = (held, drawn.astype(jnp.int32), *parts, ok_age)
        n, drawn, *sums, age_max = jax.lax.reduce(
            operands, tuple(jnp.zeros((), x.dtype) for x in operands),
            lambda x, y: (*(u + v for u, v in zip(x[:-1], y[:-1])), jnp.maximum(x[-1], y[-1])), (0,))
        bins = HIST + jnp.minimum(31 - jax.lax.clz(age + 1), NUM_AGE_BINS - 1)  # age in [0, ring): bin in [0, 32)
        binned = jax.lax.scatter_add(self.totals, bins[:, None], held, _SCATTER_1D, mode="promise_in_bounds")
        new = self.replace(totals=_add_totals(binned, n, drawn - n, age_max, sums))
        if not self.per_slot:
            return new
        counts = _count(self.sample_count.reshape(-1), jnp.where(ok, pos, lanes_ring))
        return new.replace(sample_count=counts.reshape(self.sample_count.shape))


def _add_totals(totals: jax.Array, sampled, stale, age_max, age_parts) -> jax.Array:
    """`totals` (int32 `[TOTALS]`, its bins just scatter-added) with one call taken in: `sampled`, `stale`, one call
    and the three `age_parts` sums (int32 scalars in `[0, 2**30)`) added to their two-word counters
    (`_ring.counter_add`, exact), `age_max` taken in, and a bin that the scatter-add took past `2**31 - 1` (it wrapped
    negative: a bin holds at most `2**31 - 1` and a call adds fewer than `2**31`) stopped there. One elementwise
    pass over the seven pairs before the bins (the fourth, `[age_max, 0]`, gets 0 added) and the bins."""
    inc = jnp.stack([jnp.asarray(x, jnp.int32) for x in (sampled, 1, stale, 0, *age_parts)])  # one per pair
    words = _ring.counter_add(totals[:HIST].reshape(-1, 2), inc).reshape(-1)
    words = jnp.where(jnp.arange(HIST) == AGE_MAX, jnp.maximum(words, age_max), words)
    bins = totals[HIST:]
    return jnp.concatenate([words, jnp.where(bins < 0, _MAX, bins)])


_SCATTER_1D = jax.lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))


def _saturating_increment(x: jax.Array) -> jax.Array:
    return x + (x != _MAX).astype(x.dtype)


def _count(counts: jax.Array, at: jax.Array) -> jax.Array:
    """`counts` (int32 [K]) plus one at each of `at` (int32 [B], repeats counted; entries outside `[0, K)` dropped),
    each count stopping at `2**31 - 1`. One scatter, in place when donated."""
    return jax.lax.scatter_apply(counts, at[:, None], _saturating_increment, _SCATTER_1D, update_shape=at.shape,
                                 mode="drop")


def held_counts(counts: np.ndarray, head: int, num_valid: int, ring: int) -> np.ndarray:
    """The per-position counts (`[lanes, ring]`, host) of the slots a ring with cursors `head`, `num_valid` holds, 1-D."""
    held = (np.arange(ring) - (head - num_valid)) % ring < num_valid
    return counts[np.broadcast_to(held, counts.shape)]


def age_sum(parts) -> int:
    """Host-side exact sum of the recorded ages from `Metrics.age_sum_parts` (`[..., 3, 2]`: summed over any leading
    axes, e.g. shards): a Python int; forces a device transfer."""
    values = np.asarray(_ring.counter_value(np.asarray(parts).reshape(-1, 3, 2))).reshape(-1, 3)
    return sum(int(v) << (AGE_PART_BITS * k) for row in values.tolist() for k, v in enumerate(row))


def summary(inserts: int, samples: int, record_calls: int, stale: int, age_sum: int, age_max: int, age_hist: np.ndarray,
            counts: np.ndarray | None) -> dict:
    """The dict `Recorded.stats` returns, from host values: the counters, the age sum, largest age and bins, and the
    per-position counts of the positions held (None: not kept)."""
    out = {
        "inserts": inserts, "samples": samples, "record_calls": record_calls, "stale": stale,
        "age_mean": age_sum / samples if samples else None, "age_max": age_max if samples else None,
        "age_histogram": _age_bins(age_hist),
    }
    if counts is not None:
        c = counts
        out["sample_count"] = {"positions_held": int(c.size), "never_sampled": int(np.sum(c == 0)),
                               "mean": float(c.mean()) if c.size else None, "max": int(c.max()) if c.size else None}
    return out


def _age_bins(hist: np.ndarray) -> list[dict]:
    return [{"from": 2**k - 1, "to": (2 ** (k + 1) - 2) if k < NUM_AGE_BINS - 1 else None, "count": int(c)}
            for k, c in enumerate(hist) if c]


class Recorded:
    """Mixin of every buffer with metrics: `record` and `stats`.

    The buffer names its ring in `_metrics_ring()`: `(metrics, added, head, num_valid, ring, lanes)`, its `Metrics`,
    the two-word count of items ever added (per lane), the write head, the slots held (per lane), the slots per lane
    and the lanes (positions are `lane * ring + slot`).
    A buffer that keeps its metrics in a wrapped buffer sets `_metrics_in` to that field's name instead.
    """

    _metrics_in: str | None = None

    def _metrics_ring(self) -> tuple[Metrics, jax.Array, jax.Array, jax.Array, int, int]:
        raise NotImplementedError

    def record(self, sample: Any) -> Any:
        """The buffer with the draws of `sample` counted (module doc of `jaxbuffers._metrics`): pure, O(batch).

        Args:
          sample: what a sampler of this buffer returned: anything with `indices` (int `[B]`) and, for prioritised
            samples, `generations` (int `[B]`). Nothing in a sample names the buffer it came from (a buffer of the
            same kind and size makes the same indices), so none is refused: a sample of another buffer is counted
            as draws of this one's positions, those not held (or past its positions) as `stale`. Empty rows
            (`indices` -1, as a `where=` sampler returns when nothing passes) were not drawn: counted nowhere.

        Returns:
          The new buffer (only its metrics differ).

        Raises:
          TypeError: `sample` without `indices`, or non-integer `indices` / `generations`.
          ValueError: `indices` not 1-D, or `generations` of another shape.
        """
        if not hasattr(sample, "indices"):
            raise TypeError(f"sample: expected a sample of this buffer (with indices), got {type(sample).__name__}")
        indices = _validate.index_vector("sample.indices", sample.indices)
        generations = getattr(sample, "generations", None)
        if generations is not None:
            generations = _validate.vector("sample.generations", generations, indices.shape[0], "integer")
        return self._record(indices, generations)

    @_compiled.method()
    def _record(self, indices, generations, mine=None):
        """`record` of checked `indices` and `generations` (int `[B]`); `mine` (bool `[B]` or None) as
        `Metrics.recorded` takes it."""
        if self._metrics_in is not None:
            inner = getattr(self, self._metrics_in)
            return self.replace(**{self._metrics_in: inner._record(indices, generations, mine)})
        m, added, head, num_valid, ring, lanes = self._metrics_ring()
        g = None if generations is None else generations.astype(jnp.int32)
        return self.replace(metrics=m.recorded(indices.astype(jnp.int32), g, added, head, num_valid, ring, lanes, mine))

    def _metrics_owner(self) -> Any:
        """The buffer whose state holds the metrics (this one, or the one `_metrics_in` names, followed down)."""
        buf = self
        while buf._metrics_in is not None:
            buf = getattr(buf, buf._metrics_in)
        return buf

    def stats(self, timing: "_timing.Timing | None" = None) -> dict:
        """Usage metrics as a host-side dict (forces a device transfer; `O(positions)` with per-position counts).

        Keys: `inserts` (items ever added; steps per lane for trajectory buffers, episodes for `EpisodeBuffer`),
        `samples` (draws recorded), `record_calls`, `stale`, `age_mean` and `age_max` (None before any draw),
        `age_histogram` (`[{"from", "to", "count"}]`, non-empty bins), and with per-position counts `sample_count`
        (`{"positions_held", "never_sampled", "mean", "max"}` over the positions holding data). With a
        `jaxbuffers.timing()` result, `timing`: its summary of this buffer's methods.

        Raises:
          ValueError: a state stacked with `jax.vmap` (`jaxbuffers._validate.one_member_methods`, applied by every
            buffer class): take one member out first (`jaxbuffers inspect` prints a summary per member of a saved one).
        """
        m, added, head, num_valid, ring, _ = self._metrics_owner()._metrics_ring()
        counts = None
        if m.per_slot:
            counts = held_counts(np.asarray(m.sample_count).reshape(-1, ring), int(head), int(num_valid), ring)
        out = summary(_ring.counter_value(added), _ring.counter_value(m.sampled), _ring.counter_value(m.record_calls),
                      _ring.counter_value(m.stale), age_sum(m.age_sum_parts), int(m.age_max), np.asarray(m.age_hist),
                      counts)
        if timing is not None:
            out["timing"] = timing.summary(f"{type(self).__name__}.")
        return out
