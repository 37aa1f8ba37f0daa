"""The decode schedule of a store's reads (`host_codecs._plan`) against plain models: random forests of chains with
random requests, keyframes of several codecs and deltas of one or several, cycles and shared bases of a corrupt
index; the compiled loops and the same loops run as Python (what a store without numba runs) agree."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host_codecs import _plan

KERNELS = [pytest.param(lambda f: f, id="compiled"), pytest.param(lambda f: getattr(f, "py_func", f), id="python")]


def _forest(rng, chains: int, longest: int, spread: int):
    """Slots (ascending, spaced by up to `spread`) of `chains` linear chains of 1..`longest` entries in shuffled slot
    order, and each entry's base slot (-1 for a keyframe)."""
    lengths = rng.integers(1, longest + 1, chains)
    slots = np.cumsum(rng.integers(1, spread + 1, lengths.sum())).astype(np.int64)
    rng.shuffle(slots)
    base, at = {}, 0
    for n in lengths:
        chain = slots[at : at + n]
        base.update({int(s): (int(chain[i - 1]) if i else -1) for i, s in enumerate(chain)})
        at += n
    uniq = np.sort(slots)
    return uniq, np.array([base[int(s)] for s in uniq], np.int64)


def _model(uniq, bs, requested):
    """Root, depth, chain order (by keyframe slot, then depth) and target of each entry, by walking."""
    k, where = uniq.size, {int(s): i for i, s in enumerate(uniq)}
    root, depth = np.arange(k), np.zeros(k, np.int64)
    for i in range(k):
        j = i
        while bs[j] >= 0:
            j, depth[i] = where[int(bs[j])], depth[i] + 1
        root[i] = j
    order = np.lexsort((depth, root))
    target = np.arange(k)
    for q, i in enumerate(order):
        later = [j for j in order[q:] if root[j] == root[i] and requested[j]]
        target[i] = later[0] if later else i
    return root, depth, order, target


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), chains=st.integers(1, 30), longest=st.integers(1, 9), spread=st.integers(1, 3),
       shards=st.integers(1, 4), tags=st.sampled_from(["one", "keyframes two", "deltas two"]))
@pytest.mark.parametrize("kernel", KERNELS)
def test_schedule_matches_a_walk_of_each_chain(kernel, seed, chains, longest, spread, shards, tags):
    """`chains`: each entry's base, keyframe, depth, rank and target row as a walk finds them; `decode_order`: the
    entries shard by shard (whole chains, cut evenly), each shard's runs of one codec with every base before its
    deltas (keyframes codec by codec then the deltas in chain order, or depth by depth when deltas have two codecs)."""
    rng = np.random.default_rng(seed)
    uniq, bs = _forest(rng, chains, longest, spread)
    k = uniq.size
    requested = rng.random(k) < 0.5
    base_i, order, root, depth, rank, target, bad = kernel(_plan.chains)(uniq, bs, requested)
    want_root, want_depth, want_order, want_target = _model(uniq, bs, requested)
    assert not bad.any()
    np.testing.assert_array_equal(uniq[base_i[bs >= 0]], bs[bs >= 0])
    assert (base_i[bs < 0] == -1).all()
    for got, want in ((root, want_root), (depth, want_depth), (order, want_order), (target, want_target)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(rank[order], np.arange(k))

    tag = np.full(k, 1, np.int64)
    if tags == "keyframes two":
        tag[depth == 0] = rng.choice([2, 3], int((depth == 0).sum()))
    elif tags == "deltas two":
        tag[depth > 0] = rng.choice([1, 3], int((depth > 0).sum()))
    cuts = np.linspace(0, k, shards + 1)[1:-1]
    do, shard = kernel(_plan.decode_order)(order, root, depth, rank, tag, cuts, 5)
    np.testing.assert_array_equal(np.sort(do), np.arange(k))
    np.testing.assert_array_equal(shard, np.searchsorted(cuts, rank[root], side="right"))
    assert (np.diff(shard[do]) >= 0).all()
    seen = np.zeros(k, bool)
    for i in do:  # every base decoded before its delta, by the same shard
        assert bs[i] < 0 or (seen[base_i[i]] and shard[base_i[i]] == shard[i])
        seen[i] = True
    if np.unique(tag[depth > 0]).size > 1:
        want = np.lexsort((root, tag, depth, shard))
    else:
        lead = shard if (tag == tag[0]).all() else (shard * 2 + (depth > 0)) * 5 + tag
        want = order[np.argsort(lead[order], kind="stable")]
    np.testing.assert_array_equal(do, want)

@pytest.mark.parametrize("kernel", KERNELS)
def test_cycles_and_shared_bases_are_reported_not_walked_forever(kernel):
    """A corrupt index: entries in a cycle, one based on a cycle, and a second delta on one base are `bad`; the rest
    of a read still gets its bases."""
    uniq = np.array([10, 11, 12, 20, 21, 30, 31, 32], np.int64)
    bs = np.array([-1, 10, 11, 21, 20, 20, 30, 30], np.int64)  # 20 <-> 21 a cycle; 30 <- 20; 30 the base of 31 and 32
    base_i, *_, bad = kernel(_plan.chains)(uniq, bs, np.ones(8, bool))
    np.testing.assert_array_equal(bad, [False, False, False, True, True, True, True, True])
    np.testing.assert_array_equal(base_i[:3], [-1, 0, 1])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), chains=st.integers(1, 20), longest=st.integers(1, 9), spread=st.integers(1, 3))
@pytest.mark.parametrize("kernel", KERNELS)
def test_chain_walk_finds_the_slots_a_request_lacks(kernel, seed, chains, longest, spread):
    """`chain_walk` of a random request (sorted, or shuffled with repeats): each slot of the requested entries' chains
    that the request lacks, once, ascending; slots past the base column are empty; a cycle ends the walk."""
    rng = np.random.default_rng(seed)
    uniq, bs = _forest(rng, chains, longest, spread)
    column = np.full(int(uniq.max()) + 1, -1, np.int32)
    column[uniq] = bs
    req = np.unique(np.concatenate([rng.choice(uniq, rng.integers(1, uniq.size + 1)), [column.size + 5]]))
    want = set()
    for s in req.tolist():
        b = int(column[s]) if s < column.size else -1
        while b >= 0:
            want.add(b)
            b = int(column[b])
    shuffled = rng.permutation(np.concatenate([req, req[: rng.integers(0, req.size + 1)]]))  # any order, repeats
    for ask in (req, shuffled):
        got = kernel(_plan.chain_walk)(ask, column)
        assert got.tolist() == sorted(want - set(req.tolist()))  # ascending, each once
    cycle = np.array([-1, -1, -1, 5, -1, 3, -1, 3], np.int32)  # 7 -> 3 -> 5 -> 3 -> ...: the walk stops
    assert set(kernel(_plan.chain_walk)(np.array([7], np.int64), cycle).tolist()) == {3, 5}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("x", [np.zeros(0, np.int64), np.array([5], np.int64), np.array([3, 1, 3, 2, 1, 9, 3], np.int64),
                               np.random.default_rng(0).integers(0, 40, 300),
                               np.array([2**62, -(2**62), 5, 2**62, -1, 5], np.int64)])  # too wide to pack with positions
def test_unique_and_first_of_are_numpys_unique(kernel, x):
    np.testing.assert_array_equal(kernel(_plan.unique)(x), np.unique(x))
    for got, want in zip(kernel(_plan.first_of)(x), np.unique(x, return_index=True, return_inverse=True)):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.int64


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), chains=st.integers(1, 20), longest=st.integers(1, 6), shards=st.integers(1, 3),
       outputs=st.integers(1, 3))
@pytest.mark.parametrize("kernel", KERNELS)
def test_placement_and_copies_match_numpy(kernel, seed, chains, longest, shards, outputs):
    """`placement`: the columns in decode order, each entry's row and its base's row, the runs of one shard and codec,
    and the repeated positions' copies shard by shard, as numpy finds them; `copy_rows` copies exactly those rows."""
    rng = np.random.default_rng(seed)
    uniq, bs = _forest(rng, chains, longest, 2)
    k = uniq.size
    asked = rng.choice(uniq, rng.integers(1, 3 * k + 1))  # repeats; the slots not asked for come after the request
    rest = np.setdiff1d(uniq, asked)
    flat = np.concatenate([asked, rest])
    present = np.flatnonzero(rng.random(flat.size) < 2)  # every position
    u, first, inverse = _plan.first_of(flat[present])
    pos = present[first]
    base_i, order, root, depth, rank, target, bad = _plan.chains(u, bs, pos < asked.size)
    tag = rng.choice([1, 3], k).astype(np.int64)
    cuts = np.linspace(0, k, shards + 1)[1:-1]
    do, shard = _plan.decode_order(order, root, depth, rank, tag, cuts, 5)
    bounds = np.unique(np.concatenate([[0], rng.integers(0, asked.size + 1, outputs - 1), [flat.size]])).astype(np.int64)
    chunk, offset = rng.integers(0, 4, k).astype(np.int32), rng.integers(0, 1000, k).astype(np.uint32)
    length, meta = rng.integers(0, 99, k).astype(np.uint32), rng.integers(0, 3, k).astype(np.uint8)
    runs, cols, into, bases, copies, copy_cuts = kernel(_plan.placement)(
        do, shard, tag, target, base_i, pos, present, inverse, bounds, shards, chunk, offset, length, meta)

    def out_of(p):
        j = np.searchsorted(bounds, p, side="right") - 1
        return j, p - bounds[j]

    for got, want in zip(cols, (chunk[do], offset[do], length[do], meta[do])):
        np.testing.assert_array_equal(got, want)
    assert cols[3].dtype == np.uint8 and cols[0].dtype == np.int64
    out_t, row_t = out_of(pos[target])
    np.testing.assert_array_equal(into, (out_t[do], row_t[do]))
    b = base_i[do]
    np.testing.assert_array_equal(bases, (np.where(b >= 0, out_t[b], -1), np.where(b >= 0, row_t[b], -1)))
    key = tag[do] * shards + shard[do]
    np.testing.assert_array_equal(runs, np.concatenate([[0], np.flatnonzero(np.diff(key)) + 1, [k]]))
    rep = np.flatnonzero(pos[inverse] != present)
    by = np.argsort(shard[inverse[rep]], kind="stable")
    np.testing.assert_array_equal(copies, np.array([*out_of(pos[inverse[rep[by]]]), *out_of(present[rep[by]])]).reshape(4, -1))
    np.testing.assert_array_equal(copy_cuts, np.searchsorted(shard[inverse[rep]][by], np.arange(shards + 1)))

    nbytes = 3
    views = [np.zeros((int(hi - lo), nbytes), np.uint8) for lo, hi in zip(bounds[:-1], bounds[1:])]
    for j, v in enumerate(views):
        v[:] = rng.integers(0, 256, v.shape)
    want = [v.copy() for v in views]
    for sj, sr, dj, dr in copies.T.tolist():
        want[dj][dr] = want[sj][sr]
    addresses = np.array([v.__array_interface__["data"][0] for v in views], np.int64)
    for s in range(shards):
        kernel(_plan.copy_rows)(ctypes.memmove, addresses, copies, nbytes, copy_cuts[s], copy_cuts[s + 1])
    for got, w in zip(views, want):
        np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("kernel", KERNELS)
def test_entry_checks_are_the_stored_checks(kernel):
    """`entry_checks` flags exactly the entries whose check differs from `sums ^ fields ^ base_sums`, and the payloads
    outside their chunk (or in a chunk not there)."""
    from host_codecs.deltas import base_sums

    rng = np.random.default_rng(0)
    k = 500
    sums = rng.integers(0, 2**32, k, dtype=np.uint64).astype(np.uint32)
    tag, meta = rng.integers(0, 5, k).astype(np.uint8), rng.integers(0, 3, k).astype(np.uint8)
    layout = rng.integers(0, 2**16, k).astype(np.uint16)
    base = np.where(rng.random(k) < 0.5, rng.integers(0, 2**31 - 1, k), -1).astype(np.int64)
    base[:3] = [2**31 - 2, 0, -1]
    base_check = rng.integers(0, 2**32, k, dtype=np.uint64).astype(np.uint32)
    fields = tag.astype(np.uint32) | meta.astype(np.uint32) << 8 | layout.astype(np.uint32) << 16  # the store's module doc
    check = sums ^ fields ^ base_sums(base, base_check)
    wrong = rng.random(k) < 0.1
    check[wrong] ^= np.uint32(1) << rng.integers(0, 32, int(wrong.sum())).astype(np.uint32)
    keys, sizes = np.array([2, 5, 9], np.int64), np.array([100, 50, 10], np.int64)
    chunk = rng.choice([1, 2, 5, 9, 12], k).astype(np.int32)
    offset, length = rng.integers(0, 60, k).astype(np.uint32), rng.integers(0, 60, k).astype(np.uint32)
    size_of = dict(zip(keys.tolist(), sizes.tolist()))
    want_outside = np.array([c not in size_of or o + n > size_of[c] for c, o, n in zip(chunk.tolist(), offset.tolist(), length.tolist())])
    bad, outside = kernel(_plan.entry_checks)(sums, check, tag, meta, layout, base, base_check, keys, sizes, chunk, offset, length)
    np.testing.assert_array_equal(bad, wrong)
    np.testing.assert_array_equal(outside, want_outside)
    assert want_outside.any() and not want_outside.all()
    none = kernel(_plan.entry_checks)(sums, check, tag, meta, layout, base, base_check, keys[:0], sizes[:0], chunk, offset, length)[1]
    assert none.all()
