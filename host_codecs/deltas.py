"""Delta chains of a `host_codecs.CompressedStore`: temporal coding of similar consecutive entries.

`put(..., bases=b)` stores entry `i` as `arrays[i] XOR entry(b[i])` (bytewise), coded like any entry (with the
store's dictionary when it has one; `Codec.encode_deltas`: RLE XORs inside its encoder); `b[i] = -1` stores it whole (a keyframe). Reading a delta decodes its chain
(base, base of base, ... down to a keyframe): every slot of the chains of one request is decoded once, a chain's
entries in order on one thread (`host_codecs._plan`: the schedule), and the codec XORs each delta with its base as it
decodes it (`Codec.decode_many(..., bases=)`: the base's bytes are still in cache); a slot the request reads only as a
base is decoded into the row of the next slot of its chain that the request asks for, each delta XORed into it in
place (no row of its own, no copy). Chains are linear: a slot is the base of at most
one live delta. A delta never outlives its base: rewriting or deleting a slot also deletes the deltas after it in
its chain (`dependents`), so every stored entry decodes. (A frame ring that keeps each chain's keyframe while a
stored step reads its frames deletes only frames no step reads.)

Index columns (beside the store's others, `host_codecs.store`):

```
base    # shape=(rows,), dtype=int32,  slot this entry is a delta against, -1 = none (a keyframe)
child   # shape=(rows,), dtype=int32,  the delta put last with this slot as its base, -1 = none
```

A delta's checksum also XORs in `base_sums` of its base slot and the base's checksum when the delta was put, so a
delta whose base was rewritten since fails its check.

`DeltaChains` is the part of `CompressedStore` that keeps these columns; it works on the store's own index and
lock, and holds no state of its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _plan
from ._base import integer_ids

__all__ = ["DeltaChains", "base_sums"]


def base_sums(base: np.ndarray, base_check: np.ndarray) -> np.ndarray:
    """# dtype=uint32: what a delta's check XORs in, from its base slot and the base's check (0 for `base == -1`)."""
    b = np.asarray(base, np.int64)
    mixed = ((b + 1) * 0x9E3779B1 & 0xFFFFFFFF).astype(np.uint32) ^ np.asarray(base_check, np.uint32)
    return np.where(b >= 0, mixed, np.uint32(0)).astype(np.uint32)


def _in_sorted(x: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """`np.isin(x, sorted_set)` for a sorted 1-D `sorted_set`: a binary search (`np.isin` of integers builds a table
    the size of their range, here up to the store's slot count, on every call)."""
    if not sorted_set.size:
        return np.zeros(np.shape(x), bool)
    return sorted_set[np.minimum(np.searchsorted(sorted_set, x), sorted_set.size - 1)] == x


class DeltaChains:
    """The delta-chain half of `CompressedStore` (module doc): argument checks of `bases`, the chain and dependent
    walks over the `base` / `child` columns, and where the bases of a put's rows are."""

    def chain_slots(self, slots: Any) -> np.ndarray:
        """The slots (int64, unique) that decoding `slots` also decodes (the bases of their delta chains) and
        `slots` lacks; empty when no slot of `slots` holds a delta."""
        s = self._slots(slots).reshape(-1)
        with self._lock:
            return self._chains(s)

    def dependents(self, slots: Any) -> np.ndarray:
        """The slots (int64, unique) of the live deltas whose chains pass through `slots` and that `slots` lacks: what
        a `put` to `slots` or a `delete` of them deletes too (module doc, Deltas)."""
        s = np.unique(self._slots(slots).reshape(-1))
        with self._lock:
            return self._dependents(s)

    def _dependents(self, s: np.ndarray) -> np.ndarray:
        """`dependents` of unique slots `s`; under the lock."""
        out, cur, ordered = [], s, np.sort(s)
        for _ in range(self.num_slots):
            c = self._child[self._at(cur)]
            c, par = c[c >= 0], cur[c >= 0]
            live = (self._chunk[c] >= 0) & (self._base[c] == par) & ~_in_sorted(c, ordered)
            cur = c[live]
            if not cur.size:
                break
            out.append(cur)
        return np.unique(np.concatenate(out)).astype(np.int64) if out else np.zeros(0, np.int64)

    def _chains(self, flat: np.ndarray) -> np.ndarray:
        """The slots (int64, unique) the chains of the deltas among `flat` reach and `flat` lacks; under the lock."""
        if not (self._base[self._at(flat)] >= 0).any():
            return np.zeros(0, np.int64)
        return _plan.chain_walk(flat, self._base)

    def _bases(self, bases: Any, s: np.ndarray) -> np.ndarray:
        """`bases` of a put of slots `s`, checked: int64 `[B]`, -1 for whole entries."""
        base = integer_ids(bases, "bases").astype(np.int64)
        if base.shape != s.shape:
            raise ValueError(f"bases: expected shape {s.shape} (one per slot), got shape {base.shape}")
        if base.size and (int(base.min()) < -1 or int(base.max()) >= self.num_slots):
            bad = int(base.min()) if int(base.min()) < -1 else int(base.max())
            raise IndexError(f"bases: slot {bad} out of range for a store of {self.num_slots} slots (-1: no base)")
        if (base == s).any():
            raise ValueError(f"bases: slot {int(s[base == s][0])} is given itself as its base")
        used, count = np.unique(base[base >= 0], return_counts=True)
        if (count > 1).any():
            raise ValueError(f"bases: slot {int(used[count > 1][0])} is the base of several rows (a slot is the base of at most one delta)")
        return base

    def _delta_parts(self, s: np.ndarray, base: np.ndarray, rows: np.ndarray, code: int, item_shape):
        """What `Codec.encode_deltas` takes for a put of unique slots `s`: `(idx, src, ext)`, `idx` the batch rows with
        `base >= 0`, `src[k]` the batch row of row `idx[k]`'s base when an earlier row of the batch writes it, else
        `-1 - j` for row `j` of `ext` (uint8 `[J, nbytes]`: the last put's row of that slot, else the stored entry
        decoded)."""
        n = s.size
        src = np.full(n, n, np.int64)
        idx = np.flatnonzero(base >= 0)
        by_slot = np.argsort(s)
        at = by_slot[np.minimum(np.searchsorted(s, base[idx], sorter=by_slot), n - 1)]
        inside = s[at] == base[idx]
        later = inside & (at > idx)
        if later.any():
            i = int(idx[later][0])
            raise ValueError(f"bases: row {i} is based on slot {int(base[i])}, which a later row of the batch rewrites")
        src[idx[inside]] = at[inside]
        need = base[idx[~inside]]
        ext = np.empty((need.size, rows.shape[1]), np.uint8)
        src[idx[~inside]] = -1 - np.arange(need.size)
        if need.size:
            hit = np.zeros(need.size, bool)
            recent = self._recent
            if recent is not None and recent[0].size and recent[1].shape[1] == rows.shape[1]:
                order = np.argsort(recent[0])
                j = order[np.minimum(np.searchsorted(recent[0], need, sorter=order), recent[0].size - 1)]
                hit = recent[0][j] == need
                ext[hit] = recent[1][j[hit]]
            if (~hit).any():
                miss = need[~hit]
                with self._lock:
                    empty = self._chunk[self._at(miss)] < 0
                    lids = self._layout[self._at(miss)]
                if empty.any():
                    raise ValueError(f"bases: slot {int(miss[empty][0])} is empty (a delta needs a stored base)")
                if (lids != self._layout_ids.get((code, tuple(item_shape)), -1)).any():
                    raise ValueError("bases: a base slot holds an entry of another dtype or shape")
                ext[~hit] = self.get(miss).reshape(miss.size, -1).view(np.uint8)
        return idx, src[idx], ext

    def _check_linear(self, s: np.ndarray, base: np.ndarray, delta: np.ndarray) -> None:
        """ValueError when a put of slots `s` would make a slot the base of a second live delta; under the lock."""
        b_, x_ = base[delta], s[delta]
        c_ = self._child[b_]
        taken = (c_ >= 0) & (c_ != x_) & ~_in_sorted(c_, np.sort(s))
        taken[taken] = (self._chunk[c_[taken]] >= 0) & (self._base[c_[taken]] == b_[taken])
        if taken.any():
            raise ValueError(f"bases: slot {int(b_[taken][0])} is already the base of slot {int(c_[taken][0])} (a slot is the base of at most one delta)")

    def _link(self, s: np.ndarray, base: np.ndarray | None, rows: np.ndarray) -> None:
        """Record the bases of a put of slots `s` whose checks are set (`base_sums` chained level by level: a
        delta's check takes its base's final check) and remember its rows; under the lock."""
        self._base[s] = -1 if base is None else base
        if base is None:
            return
        delta = base >= 0
        self._child[base[delta]] = s[delta]
        pending = np.flatnonzero(delta)
        while pending.size:
            ready = ~_in_sorted(base[pending], np.sort(s[pending]))
            i = pending[ready]
            self._check[s[i]] ^= base_sums(base[i], self._check[base[i]])
            pending = pending[~ready]
        tip = ~_in_sorted(s, np.sort(base))  # the rows no delta of this put is based on: the likely bases of the next put
        self._recent = (s[tip], rows[tip])
