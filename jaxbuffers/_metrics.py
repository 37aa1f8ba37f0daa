"""Usage metrics kept in a buffer's state: `Metrics`, and the `record` / `stats` methods every buffer shares.

Counted on the device, inside the training step, as ordinary state leaves (saved by `jaxbuffers.save`):

* inserts: the buffer's own two-word `added` counter (`num_added()`);
* draws recorded: `sampled` (two-word counter), `record_calls`, and `stale`: draws that no longer hold the item
  drawn when recorded (the slot was overwritten between the sample and `record`, or held nothing);
* ages: for each recorded draw, the items (steps per lane, episodes) added after the drawn one, as of the
  `record` call: `age_sum`, `age_max`, and `age_hist`, bin `k = floor(log2(age + 1))` (ages `[2**k - 1,
  2**(k+1) - 2]`, the last bin open);
* per position, with `metrics=True` at `create` (off by default: it adds a scatter of the batch to every add and
  `record`, while the counters above cost a few scalar operations): `sample_count`, draws recorded since the
  position was last written (an add resets it).

`sample` stays pure: a training step records what it drew with `buf = buf.record(sample)` (cost O(batch)). Ages are
those at `record` time, the same as at sample time when no add comes between. A sample with `generations` (the
prioritised buffers') is checked against the slot's current generation, so a draw whose slot was overwritten meanwhile
is counted as `stale` and nowhere else; a uniform sample is taken to be of the buffer it is recorded into.

Histogram bins saturate at `2**31 - 1` rather than wrap; a position's count stops within one batch of it. `stats()` reads everything back as
a host-side dict.
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
_MAX = np.iinfo(np.int32).max


class Metrics(struct.PyTreeNode):
    """Sample-side counters of one buffer (module doc). Build with `Metrics.create`."""

    sampled: jax.Array  # shape=(2,), int32: draws recorded (not stale), two-word counter [high, low] (_ring.counter_*)
    record_calls: jax.Array  # shape=(2,), int32: record calls, two-word counter
    stale: jax.Array  # shape=(2,), int32: draws recorded as stale, two-word counter
    sample_count: jax.Array  # shape=[*positions] (per_slot) or [0], int32: draws recorded since the position was written (stops near 2**31 - 1)
    age_sum: jax.Array  # shape=(), float32: sum of the ages of the recorded draws
    age_max: jax.Array  # shape=(), int32: largest age recorded (0 before any draw)
    age_hist: jax.Array  # shape=[NUM_AGE_BINS], int32: draws by age bin floor(log2(age + 1))
    per_slot: bool = struct.field(pytree_node=False)  # whether sample_count is kept

    @classmethod
    def create(cls, positions: tuple[int, ...], per_slot: bool) -> "Metrics":
        """Zero metrics for a buffer of `positions` (the shape of its position grid, e.g. `(capacity,)` or
        `(num_envs, length)`); `per_slot` (a bool) keeps `sample_count` of that shape.

        Raises:
          TypeError: `per_slot` not a bool (`_validate.static_bool`, named `metrics`).
        """
        per_slot = _validate.static_bool("metrics", per_slot)
        z = _ring.counter_zero
        return cls(
            sampled=z(), record_calls=z(), stale=z(),
            sample_count=jnp.zeros(positions if per_slot else (0,), jnp.int32), age_sum=jnp.float32(0),
            age_max=jnp.int32(0), age_hist=jnp.zeros((NUM_AGE_BINS,), jnp.int32), per_slot=per_slot,
        )

    def written(self, slots: jax.Array, axis: int = 0, in_bounds: bool = True) -> "Metrics":
        """Reset `sample_count` at the written `slots` (distinct int32, along `axis`; with `in_bounds=False` the
        slots outside the axis are ignored). O(slots), in place when donated."""
        if not self.per_slot:
            return self
        at = (slice(None),) * axis + (slots,)
        mode = "promise_in_bounds" if in_bounds else "drop"
        return self.replace(sample_count=self.sample_count.at[at].set(0, unique_indices=True, mode=mode))

    def recorded(self, positions, generations, added, head, num_valid, ring: int, lanes: int = 1) -> "Metrics":
        """Count draws at flat `positions` (int32[B], `lane * ring + slot`) of `lanes` rings of `ring` slots with
        cursors `added` (two-word), `head`, `num_valid`; `generations` (int32[B] or None) as sampled. O(B)."""
        lanes_ring, b = lanes * ring, positions.shape[0]
        pos = jnp.clip(positions, 0, lanes_ring - 1)
        slot = pos % ring
        age = jnp.mod(head - 1 - slot, ring).astype(jnp.int32)  # items written to the ring after this one
        ok = (positions >= 0) & (positions < lanes_ring) & (age < num_valid)  # held: the newest num_valid slots
        if generations is not None:
            ok = ok & (_ring.last_item_number(added, head, slot, ring) == generations)
        # One vectorised reduction (a scatter-add of the batch runs serially on CPU, and each reduction is a pass of
        # its own): per draw, its age bin one-hot (a stale draw falls in no bin, so the bins also count the draws)
        # and its age split in 16-bit halves (their int32 sums cannot wrap for B < 2**15).
        bins = jnp.where(ok, jnp.minimum(31 - jax.lax.clz(age + 1), NUM_AGE_BINS - 1), NUM_AGE_BINS)
        ok_age = jnp.where(ok, age, 0)
        cols = jnp.concatenate([bins[:, None] == jnp.arange(NUM_AGE_BINS, dtype=jnp.int32)[None, :],
                                jnp.stack([ok_age >> 16, ok_age & 0xFFFF], axis=1)], axis=1, dtype=jnp.int32)
        sums = jnp.sum(cols, axis=0, dtype=jnp.int32)
        inc = sums[:NUM_AGE_BINS]
        n = jnp.sum(inc, dtype=jnp.int32)
        age_sum = sums[NUM_AGE_BINS].astype(jnp.float32) * 65536.0 + sums[NUM_AGE_BINS + 1].astype(jnp.float32)
        new = self.replace(
            sampled=_ring.counter_add(self.sampled, n), record_calls=_ring.counter_add(self.record_calls, 1),
            stale=_ring.counter_add(self.stale, b - n), age_sum=self.age_sum + age_sum,
            age_max=jnp.maximum(self.age_max, jnp.max(ok_age, initial=0)),
            age_hist=self.age_hist + jnp.minimum(inc, _MAX - self.age_hist),
        )
        if not self.per_slot:
            return new
        flat = self.sample_count.reshape(-1)
        room = flat[pos] <= _MAX - b  # B more draws of one position cannot wrap past int32
        counts = flat.at[pos].add((ok & room).astype(jnp.int32), mode="promise_in_bounds")
        return new.replace(sample_count=counts.reshape(self.sample_count.shape))


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
            samples, `generations` (int `[B]`).

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
    def _record(self, indices, generations):
        if self._metrics_in is not None:
            inner = getattr(self, self._metrics_in)
            return self.replace(**{self._metrics_in: inner._record(indices, generations)})
        m, added, head, num_valid, ring, lanes = self._metrics_ring()
        g = None if generations is None else generations.astype(jnp.int32)
        return self.replace(metrics=m.recorded(indices.astype(jnp.int32), g, added, head, num_valid, ring, lanes))

    def stats(self, timing: "_timing.Timing | None" = None) -> dict:
        """Usage metrics as a host-side dict (forces a device transfer; `O(positions)` with per-position counts).

        Keys: `inserts` (items ever added; steps per lane for trajectory buffers, episodes for `EpisodeBuffer`),
        `samples` (draws recorded), `record_calls`, `stale`, `age_mean` and `age_max` (None before any draw),
        `age_histogram` (`[{"from", "to", "count"}]`, non-empty bins), and with per-position counts `sample_count`
        (`{"positions_held", "never_sampled", "mean", "max"}` over the positions holding data). With a
        `jaxbuffers.timing()` result, `timing`: its summary of this buffer's methods.

        Raises:
          ValueError: a stacked (vmapped) buffer: index one member out first.
        """
        buf = self
        while buf._metrics_in is not None:
            buf = getattr(buf, buf._metrics_in)
        m, added, head, num_valid, ring, _ = buf._metrics_ring()
        if np.ndim(head):
            raise ValueError(f"stats: a stacked (vmapped) {type(self).__name__} of stack shape {np.shape(head)}; take one "
                             f"member's with jax.tree.map(lambda x: x[i], buf).stats() (jaxbuffers inspect prints a "
                             f"summary per member of a saved one)")
        n = _ring.counter_value(m.sampled)
        out = {
            "inserts": _ring.counter_value(added), "samples": n, "record_calls": _ring.counter_value(m.record_calls),
            "stale": _ring.counter_value(m.stale), "age_mean": float(m.age_sum) / n if n else None,
            "age_max": int(m.age_max) if n else None, "age_histogram": _age_bins(np.asarray(m.age_hist)),
        }
        if m.per_slot:
            counts = np.asarray(m.sample_count).reshape(-1, ring)
            slot = np.arange(ring)
            held = np.broadcast_to((slot - (int(head) - int(num_valid))) % ring < int(num_valid), counts.shape)
            c = counts[held]
            out["sample_count"] = {"positions_held": int(c.size), "never_sampled": int(np.sum(c == 0)),
                                   "mean": float(c.mean()) if c.size else None, "max": int(c.max()) if c.size else None}
        if timing is not None:
            out["timing"] = timing.summary(f"{type(self).__name__}.")
        return out
