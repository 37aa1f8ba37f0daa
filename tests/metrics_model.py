"""A plain-Python model of a buffer's ring and of its usage metrics (`record`, `stats`): the item number each slot
holds, the draws recorded per position, the ages and the stale draws; shared by the metric tests of the buffers and
of the sharded buffer."""

from __future__ import annotations

import numpy as np
import pytest

from jaxbuffers._metrics import NUM_AGE_BINS


class RingModel:
    """A ring of `ring` slots per lane (all lanes written together): item number per slot, draws per position."""

    def __init__(self, ring: int, lanes: int = 1):
        self.ring, self.lanes = ring, lanes
        self.item = [None] * ring  # item number last written to each slot (the same in every lane)
        self.count = np.zeros((lanes, ring), np.int64)
        self.added = self.head = 0
        self.ages, self.stale, self.calls = [], 0, 0

    def add(self, n: int) -> None:
        for _ in range(n):
            self.item[self.head] = self.added
            self.count[:, self.head] = 0
            self.added += 1
            self.head = (self.head + 1) % self.ring

    def generation(self, position: int) -> int | None:
        return self.item[position % self.ring]

    def record(self, positions, generations=None) -> None:
        self.calls += 1
        for i, p in enumerate(positions):
            if p < 0:  # an empty row: not drawn
                continue
            lane, slot = divmod(int(p), self.ring)
            item = self.item[slot]
            if item is None or (generations is not None and int(generations[i]) != item):
                self.stale += 1
                continue
            self.ages.append(self.added - 1 - item)
            self.count[lane, slot] += 1

    def held_counts(self) -> np.ndarray:
        """The draws of the positions holding an item, lane by lane."""
        return self.count[:, np.array([x is not None for x in self.item])].ravel()

    def check(self, buf) -> None:
        """`buf.stats()` and `buf`'s metric arrays are this model's."""
        assert_stats(buf.stats(), [self])
        m = metrics_of(buf)
        np.testing.assert_array_equal(np.asarray(m.age_hist), age_hist(self.ages))
        np.testing.assert_array_equal(np.asarray(m.sample_count).reshape(self.lanes, self.ring), self.count)


def age_hist(ages) -> np.ndarray:
    """Draws by age bin `floor(log2(age + 1))`, the last bin open."""
    hist = np.zeros(NUM_AGE_BINS, np.int64)
    for a in ages:
        hist[min((a + 1).bit_length() - 1, NUM_AGE_BINS - 1)] += 1
    return hist


def assert_stats(s: dict, models: list[RingModel], per_lane: bool = False) -> None:
    """`s` (a `stats()` dict) is what the rings `models` together give: one model, or one per shard of a sharded
    buffer (`per_lane`: inserts are the steps per lane every shard shares, else the sum; `record_calls` the most any
    shard counted)."""
    ages = [a for m in models for a in m.ages]
    assert s["inserts"] == (max if per_lane else sum)(m.added for m in models)
    assert s["samples"] == len(ages)
    assert s["stale"] == sum(m.stale for m in models)
    assert s["record_calls"] == max(m.calls for m in models)
    if ages:
        assert s["age_max"] == max(ages)
        assert s["age_mean"] == pytest.approx(sum(ages) / len(ages), rel=1e-6)
    else:
        assert s["age_max"] is None and s["age_mean"] is None
    assert [(h["from"], h["count"]) for h in s["age_histogram"]] == [(2**k - 1, int(c)) for k, c in enumerate(age_hist(ages)) if c]
    c = np.concatenate([m.held_counts() for m in models])
    assert s["sample_count"] == {"positions_held": c.size, "never_sampled": int(np.sum(c == 0)),
                                 "mean": float(c.mean()) if c.size else None, "max": int(c.max()) if c.size else None}


def metrics_of(buf):
    """The `Metrics` of a buffer (of the buffer it wraps, for those that keep them there)."""
    while getattr(buf, "_metrics_in", None):
        buf = getattr(buf, buf._metrics_in)
    return buf.metrics
