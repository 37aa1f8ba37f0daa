"""The decode schedule of a `host_codecs.CompressedStore` read: its distinct slots and, with deltas, its chains, the
order, thread and row each entry is decoded in, in compiled loops (numba, imported on first use, the GIL released;
without numba the same loops run as Python).

A read decodes `k` distinct entries (in slot order), each a keyframe or a delta whose base is another of them. Chains
(`host_codecs.deltas`) are decoded keyframe first, then by depth; an entry the read does not ask for is decoded into
the row of the next entry of its chain that it asks for (each delta XORed into it in place, no row of its own). Shards
(one per thread) take whole chains, cut where the entries split evenly in chain order. A shard decodes runs of one
codec, every base before its deltas: when all its deltas have one codec, its keyframes codec by codec in chain
order, then its deltas in chain order; else depth by depth, codec by codec. `placement` turns the schedule into the
per-entry columns the codecs take and the rows copied from a repeated slot's decoded row (`copy_rows`);
`entry_checks` checks the entries a read decodes before they are decoded.
"""

from __future__ import annotations

import numpy as np

__all__ = ["chain_walk", "chains", "copy_rows", "decode_order", "entry_checks", "first_of", "placement", "unique"]

_COMPILED: dict = {}  # function -> its compiled version (numba imported on first use), or itself without numba


def _compiled(f):
    """`f`, compiled by numba on its first call (cached on disk, the GIL released), or run by Python without numba;
    `.py_func` is `f`."""

    def call(*args):
        g = _COMPILED.get(f)
        if g is None:
            try:
                from numba import njit
            except ImportError:  # the same loops, run by Python
                g = f
            else:
                g = njit(nogil=True, cache=True)(f)
            _COMPILED[f] = g
        return g(*args)

    call.py_func, call.__doc__ = f, f.__doc__
    return call


def _stable_order(x: np.ndarray) -> np.ndarray:
    """`np.argsort(x, kind="stable")` of a 1-D int64 `x`: one `np.sort` of each value and its position packed in an
    int64 when they fit (a value below `2**(62 - b)` in magnitude, `b` the bits of `x.size`), else the stable argsort."""
    n = x.size
    b = n.bit_length()
    if n and -(1 << (62 - b)) <= x.min() and x.max() < 1 << (62 - b):
        return np.sort(x << b | np.arange(n)) & ((1 << b) - 1)
    return np.argsort(x, kind="stable")


@_compiled
def _first_of(x, order):
    """`first_of` of `x` taking its stable argsort `order`."""
    n = x.size
    uniq, first, inverse = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    m = -1
    for i in range(n):
        j = order[i]
        if m < 0 or x[j] != uniq[m]:
            m += 1
            uniq[m], first[m] = x[j], j
        inverse[j] = m
    return uniq[: m + 1], first[: m + 1], inverse


def first_of(x):
    """`np.unique(x, return_index=True, return_inverse=True)` of a 1-D array `x` of ints (# dtype=int64): its distinct
    values ascending, the first position of each and the index of each element's value among them (int64), from one
    stable sort (`_stable_order`) and one compiled loop (`.py_func`: the loop run by Python)."""
    return _first_of(x, _stable_order(x))


first_of.py_func = lambda x: _first_of.py_func(x, _stable_order(x))


def unique(x: np.ndarray) -> np.ndarray:
    """`np.unique(x)` of a 1-D array, by one sort (not numpy's hashing)."""
    s = np.sort(x)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s


def chain_walk(slots, base):
    """The slots the chains of the deltas among `slots` (# shape=(n,), dtype=int64, any order, repeats allowed) reach
    and `slots` lacks, ascending and each once, walked down a store's `base` column (# shape=(rows,), dtype=int32;
    slots from `rows` on are empty). Every slot not asked for is met once (chains are linear); a walk longer than
    `rows` slots (a cycle: a corrupt index) stops. The sorts by numpy, the walk compiled (`.py_func`: run by Python)."""
    return unique(_walk(unique(slots), base))


chain_walk.py_func = lambda slots, base: unique(_walk.py_func(unique(slots), base))


@_compiled
def _walk(req, base):
    """The walk of `chain_walk` from the distinct slots `req` (ascending): the slots met (a corrupt index may give one
    twice)."""
    n, rows = req.size, base.size
    out, m = np.empty(max(16, n), np.int64), 0
    for i in range(n):
        b = base[req[i]] if req[i] < rows else -1
        while b >= 0 and m <= rows:
            # is `b` asked for? (a base is often the slot before: `req[i - 1]`, or a slot between it and `req[i]`)
            if i > 0 and b == req[i - 1]:
                break
            if (i > 0 and b < req[i - 1]) or b >= req[i]:
                at = np.searchsorted(req, b)
                if at < n and req[at] == b:
                    break
            if m == out.size:
                out = np.concatenate((out, np.empty(m, np.int64)))
            out[m], m, b = b, m + 1, base[b] if b < rows else -1
    return out[:m]


@_compiled
def chains(uniq, bs, requested):
    """The chains of the `k` distinct entries of a read.

    Args:
      uniq: # shape=(k,), dtype=int64: the entries' slots, ascending.
      bs: # shape=(k,), dtype=int64: each entry's base slot (one of `uniq`), -1 for a keyframe.
      requested: # shape=(k,), dtype=bool: the entries the read asks for (a row of their own).

    Returns:
      `(base_i, order, root, depth, rank, target, bad)`, int64 `[k]` but `bad`: each entry's base (an index into `uniq`,
      -1 for a keyframe); the entries in chain order (chain by chain, in the order of their keyframes, each keyframe
      first, then by depth); each entry's keyframe, depth (0 for a keyframe), rank in `order`, and the entry whose row
      it is decoded into (itself when requested). `bad` (bool `[k]`): the entries no keyframe's chain reaches (a
      corrupt index: a cycle, or a slot the base of two entries); the others but `base_i` then mean nothing.
    """
    k = uniq.size
    base_i, child, bad = np.full(k, -1, np.int64), np.full(k, -1, np.int64), np.zeros(k, np.bool_)
    for i in range(k):
        if bs[i] >= 0:  # the entry before first (a base is often the slot before), else a binary search
            b = i - 1 if i > 0 and uniq[i - 1] == bs[i] else min(np.searchsorted(uniq, bs[i]), k - 1)
            base_i[i] = b
            if child[b] >= 0:
                bad[i] = True
            else:
                child[b] = i
    order, root, depth, rank, target = np.empty(k, np.int64), np.arange(k), np.zeros(k, np.int64), np.full(k, -1, np.int64), np.arange(k)
    q = 0
    for i in range(k):  # each chain from its keyframe, child by child
        if base_i[i] < 0:
            j, d = i, 0
            while j >= 0:
                order[q], rank[j], root[j], depth[j] = j, q, i, d
                q, d, j = q + 1, d + 1, child[j]
    bad |= rank < 0
    nxt, chain = -1, -1
    for p in range(q - 1, -1, -1):  # the next requested entry at or after each one, in its chain
        i = order[p]
        if root[i] != chain:
            nxt, chain = -1, root[i]
        if requested[i]:
            nxt = i
        target[i] = nxt if nxt >= 0 else i
    return base_i, order, root, depth, rank, target, bad


@_compiled
def decode_order(order, root, depth, rank, tag, cuts, num_tags):
    """The entries of `chains` in decode order, and the shard of each.

    Args:
      order, root, depth, rank: of `chains`.
      tag: # shape=(k,), dtype=int64: each entry's codec tag, below `num_tags`.
      cuts: # shape=(shards - 1,), dtype=float64: shard `s` takes the chains whose keyframe's rank is at least
        `cuts[s - 1]` and below `cuts[s]`.

    Returns:
      `(do, shard)`, int64 `[k]`: the entries shard by shard, in each the runs of one codec of the module doc.
    """
    k = order.size
    shard, one_delta_tag, first_tag, delta_tag = np.zeros(k, np.int64), True, tag[0], -1
    for i in range(k):
        for c in cuts:
            shard[i] += c <= rank[root[i]]
        if depth[i] > 0:
            one_delta_tag &= delta_tag < 0 or tag[i] == delta_tag
            delta_tag = tag[i]
        first_tag = first_tag if tag[i] == first_tag else -1
    # a stable counting sort of the entries, in chain order, by the bucket of each
    levels = depth.max() + 1 if not one_delta_tag else 2
    key = np.empty(k, np.int64)
    for i in range(k):
        if first_tag >= 0:  # one codec: chain order
            key[i] = shard[i]
        else:  # keyframes codec by codec, then the deltas (one codec), each in chain order; else depth by depth
            key[i] = (shard[i] * levels + min(depth[i], levels - 1)) * num_tags + tag[i]
    start = np.zeros((cuts.size + 1) * levels * num_tags + 1, np.int64)
    for i in range(k):
        start[key[i] + 1] += 1
    start = np.cumsum(start)
    do = np.empty(k, np.int64)
    for q in range(k):
        i = order[q]
        do[start[key[i]]] = i
        start[key[i]] += 1
    return do, shard


@_compiled
def placement(do, shard, tag, target, base_i, pos, present, inverse, bounds, shards, chunk, offset, length, meta):
    """What a read's shards do, from its schedule: every per-entry column in decode order (a run is one slice of each)
    and the rows that copy a repeated slot's decoded row. Request position `p` is row `p - bounds[j]` of output `j`,
    `bounds[j] <= p < bounds[j + 1]`.

    Args:
      do, shard: of `decode_order`; tag: # shape=(k,), dtype=int64, each entry's codec tag; target, base_i: of
        `chains`; pos: # shape=(k,), dtype=int64, each entry's first request position.
      present: # shape=(p,), dtype=int64: the request positions holding an entry; inverse: # shape=(p,), the entry of
        each (`first_of`).
      bounds: # shape=(m + 1,), dtype=int64: the outputs' first positions, then the request's size; shards: how many.
      chunk, offset, length, meta: # shape=(k,): each entry's index fields.

    Returns:
      `(runs, cols, into, bases, copies, copy_cuts)`: `runs` (int64 `[r + 1]`): where the runs of one shard and codec
      start in decode order, then `k`; `cols`: `(chunk, offset, length)` int64 and `meta` (its dtype) `[k]` in decode
      order; `into`: `(outputs, rows)` int64 `[k]`, where each entry (in decode order) is decoded; `bases`:
      `(outputs, rows)` int64 `[k]` of each one's base (-1: a keyframe); `copies` (int64 `[4, c]`): source output,
      source row, output and row of each repeated position, shard by shard; `copy_cuts` (int64 `[shards + 1]`): shard
      `s` copies `copies[:, copy_cuts[s]:copy_cuts[s + 1]]`.
    """
    k, m = do.size, bounds.size - 1
    out_t, row_t = np.empty(k, np.int64), np.empty(k, np.int64)  # where each entry is decoded (by entry)
    for i in range(k):
        p = pos[target[i]]
        j = min(max(np.searchsorted(bounds, p, side="right") - 1, 0), m - 1)
        out_t[i], row_t[i] = j, p - bounds[j]
    into_out, into_row, base_out, base_row = np.empty(k, np.int64), np.empty(k, np.int64), np.empty(k, np.int64), np.empty(k, np.int64)
    c_chunk, c_offset, c_length, c_meta = np.empty(k, np.int64), np.empty(k, np.int64), np.empty(k, np.int64), np.empty(k, meta.dtype)
    runs, r = np.empty(k + 1, np.int64), 0
    for q in range(k):
        i = do[q]
        if q == 0 or tag[i] != tag[do[q - 1]] or shard[i] != shard[do[q - 1]]:
            runs[r], r = q, r + 1
        into_out[q], into_row[q] = out_t[i], row_t[i]
        b = base_i[i]
        base_out[q], base_row[q] = (out_t[b], row_t[b]) if b >= 0 else (-1, -1)
        c_chunk[q], c_offset[q], c_length[q], c_meta[q] = chunk[i], offset[i], length[i], meta[i]
    runs[r] = k
    # the repeated positions, by the shard that decodes their slot (a stable counting sort)
    copy_cuts = np.zeros(shards + 1, np.int64)
    for i in range(present.size):
        u = inverse[i]
        if pos[u] != present[i]:
            copy_cuts[shard[u] + 1] += 1
    copy_cuts = np.cumsum(copy_cuts)
    at, copies = copy_cuts[:-1].copy(), np.empty((4, copy_cuts[-1]), np.int64)
    for i in range(present.size):
        u = inverse[i]
        if pos[u] != present[i]:
            q, at[shard[u]] = at[shard[u]], at[shard[u]] + 1
            j = min(max(np.searchsorted(bounds, present[i], side="right") - 1, 0), m - 1)
            copies[0, q], copies[1, q] = out_t[u], row_t[u]
            copies[2, q], copies[3, q] = j, present[i] - bounds[j]
    return runs[: r + 1], (c_chunk, c_offset, c_length, c_meta), (into_out, into_row), (base_out, base_row), copies, copy_cuts


@_compiled
def copy_rows(memmove, addresses, copies, nbytes, lo, hi):
    """Row `copies[3, i]` of output `copies[2, i]` = row `copies[1, i]` of output `copies[0, i]`, for `i` in
    `[lo, hi)`: one `memmove` (`ctypes.memmove`) of `nbytes` bytes per row (# dtype=int64 `addresses`: each output's
    first byte; the rows are distinct)."""
    for i in range(lo, hi):
        dst, src = addresses[copies[2, i]] + copies[3, i] * nbytes, addresses[copies[0, i]] + copies[1, i] * nbytes
        memmove(int(dst), int(src), nbytes)  # (Python ints: what ctypes takes without numba)


@_compiled
def entry_checks(sums, check, tag, meta, layout, base, base_check, keys, sizes, chunk, offset, length):
    """The checks of the `k` entries a read decodes, before they are decoded (`host_codecs.store`, Checksums).

    Args:
      sums: # shape=(k,), dtype=uint32: each payload's checksum (`host_codecs._checksum.payload_sums`).
      check, tag, meta, layout, chunk, offset, length: # shape=(k,): each entry's index fields.
      base, base_check: # shape=(k,): each entry's base slot (-1 for a keyframe) and that base's check.
      keys, sizes: # dtype=int64: the chunks' ids (ascending) and sizes (`host_codecs._base.chunk_addresses`).

    Returns:
      `(bad_sum, outside)`, bool `[k]`: the entries whose check is not `sums ^ (tag | meta << 8 | layout << 16)`, XOR
      (a delta) `host_codecs.deltas.base_sums(base, base_check)`; the payloads not inside their chunk.
    """
    k, mask = sums.size, np.int64(0xFFFFFFFF)
    bad_sum, outside = np.zeros(k, np.bool_), np.zeros(k, np.bool_)
    for i in range(k):
        expect = np.int64(sums[i]) ^ np.int64(tag[i]) ^ np.int64(meta[i]) << 8 ^ np.int64(layout[i]) << 16
        b = np.int64(base[i])
        if b >= 0:  # (b + 1) * 0x9E3779B1 modulo 2**32, in 64 bits without overflow
            mixed = (np.uint64((b + 1) & mask) * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF)
            expect ^= np.int64(mixed) ^ np.int64(base_check[i])
        bad_sum[i] = (expect & mask) != np.int64(check[i])
        at = min(np.searchsorted(keys, chunk[i]), keys.size - 1)
        outside[i] = at < 0 or keys[at] != chunk[i] or np.int64(offset[i]) + np.int64(length[i]) > sizes[at]
    return bad_sum, outside
