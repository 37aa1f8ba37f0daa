"""Wrong arguments to host_codecs' public API (CompressedStore put / get / get_many / [] / []= /
delete, get_codec, Codec.encode / decode): each call is refused with an error raised by host_codecs
that names the argument, and the store's contents and accounting are byte-identical afterwards
(and the store stays usable)."""

from __future__ import annotations

import importlib.util
import re
import traceback
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import host_codecs
from host_codecs import CompressedStore, get_codec

N, ITEM = 12, (3, 4)
PACKAGE = str(Path(host_codecs.__file__).parent)
ERRORS = (TypeError, ValueError, IndexError, KeyError)
HAVE_TORCH = importlib.util.find_spec("torch") is not None


class _Weird:
    """An object that is no array, no sequence and no number."""


def _torch(*values, dtype="float32", grad=False):
    import torch

    return torch.tensor(values, dtype=getattr(torch, dtype), requires_grad=grad)


# Slot ids no call accepts: wrong types, non-integers, out of range, ragged, too large for int64.
BAD_SLOTS = [
    None, "a", b"x", 1.5, [1.5], [0, 1.5], 1j, True, [True, False], np.array([1.0]), {"a": 1}, _Weird(),
    [[0], [1, 2]], [N], [-N - 1], [0, 2**70], np.array([2**63], np.uint64), np.array(["1"]),
]
if HAVE_TORCH:
    BAD_SLOTS += [_torch(1.0), _torch(0.0, 1.0, grad=True)]
slot_strategy = st.one_of(
    st.sampled_from(BAD_SLOTS),
    st.integers().filter(lambda i: not -N <= i < N).map(lambda i: [0, i]),
    hnp.arrays(st.sampled_from([np.float32, np.float64, np.bool_, np.complex64]), st.integers(1, 4)),
)
BAD_ARRAYS = [
    None, "abc", _Weird(), [[1, 2], [3]], np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.int64),
    np.zeros((2, 3, 4), bool), np.zeros((2, 3, 5), np.uint8), np.zeros((3, 3, 4), np.uint8), np.zeros((2, 12), np.uint8),
    np.zeros((2, 3, 4), ">u2"), np.zeros((2, 3, 4), object), np.uint8(3),
]
if HAVE_TORCH:
    BAD_ARRAYS += [_torch(*[[[0.0] * 4] * 3] * 2)]
BAD_MISSING = [None, 1, "zero", ["raise"], np.array("raise"), _Weird()]
BAD_CODECS = [1, 1.5, b"none", "", "foo", "rle:7", "zstd:x", "igzip:-1", "none:1", _Weird(), ["rle"]]
BAD_KEYS = [None, "a", 1.5, True, (0.5,), [[0], [1, 2]], slice(None, None, 0), slice(0.5, 2), N, -N - 1, 2**70]


def _numeric_batch(x) -> bool:
    """`x` converts to a batch of two entries of a supported dtype."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError, RuntimeError):
        return False
    return a.dtype in host_codecs.DTYPES and a.ndim >= 1 and a.shape[0] == 2


def _outs(shape):
    """Wrong output arrays for a read of `shape` (uint8 entries)."""
    full = (*shape, *ITEM)
    ro = np.zeros(full, np.uint8)
    ro.flags.writeable = False
    return [
        np.zeros(full, np.float32), np.zeros((*shape, 4, 3), np.uint8), np.zeros((*full[:-1], 8), np.uint8)[..., ::2],
        ro, [[0] * 4] * 3, "out", _Weird(),
    ] + ([_torch(0.0)] if HAVE_TORCH else [])


@pytest.fixture(scope="module")
def stores():
    declared = CompressedStore(N, "none", item_shape=ITEM, dtype=np.uint8, name="obs")
    declared.put(np.arange(0, N, 2), np.arange(N // 2 * 12, dtype=np.uint8).reshape(N // 2, *ITEM))
    free = CompressedStore(N, "none")
    free.put(np.array([1, 2]), np.ones((2, 5), np.float16))
    return declared, free


def _state(store: CompressedStore) -> tuple:
    """Everything a store holds, as bytes: index, layouts, arena bytes, accounting, dictionary state."""
    arena = store._arena
    chunks = tuple((c, ch.used, ch.live_bytes, ch.live_count, ch.data[: ch.used].tobytes()) for c, ch in sorted(arena.chunks.items()))
    return (
        tuple(a.tobytes() for a in store._index()), tuple(store._layouts), store._tags.tobytes(), chunks,
        arena.nbytes, arena.dead_nbytes, store._rows_seen, store._trained, store._dictionary, store._compactions,
    )


def _refused(call, *names: str, store: CompressedStore | None = None) -> None:
    """`call()` raises one of ERRORS from host_codecs' own code, naming one of `names`; `store` unchanged."""
    before = None if store is None else _state(store)
    with pytest.raises(ERRORS) as info:
        call()
    exc = info.value
    origin = traceback.extract_tb(exc.__traceback__)[-1].filename
    assert origin.startswith(PACKAGE), f"raised outside host_codecs ({origin}): {exc!r}"
    msg = str(exc.args[0]) if exc.args else ""
    assert any(re.search(rf"(?<!\w){re.escape(n)}(?!\w)", msg) for n in names), f"{names} not named in {msg!r}"
    if store is not None:
        assert _state(store) == before, "a refused call changed the store"


@settings(max_examples=60, deadline=None)
@given(slots=slot_strategy, which=st.sampled_from(["put", "get", "get_many", "delete", "written"]))
def test_bad_slot_ids_are_refused(stores, slots, which):
    declared, _ = stores
    calls = {
        "put": (lambda: declared.put(slots, np.zeros((1, *ITEM), np.uint8)), "slots"),
        "get": (lambda: declared.get(slots), "slots"),
        "get_many": (lambda: declared.get_many([np.array([0]), slots]), "slot_arrays[1]"),
        "delete": (lambda: declared.delete(slots), "slots"),
        "written": (lambda: declared.written(slots), "slots"),
    }
    call, name = calls[which]
    _refused(call, name, store=declared)


@pytest.mark.parametrize("slots", [np.zeros((1, 1), np.int64), np.int64(0), 0, [[0]]], ids=repr)
def test_put_refuses_ids_that_are_not_one_dimensional(stores, slots):
    declared, _ = stores
    _refused(lambda: declared.put(slots, np.zeros((1, *ITEM), np.uint8)), "slots", store=declared)


@settings(max_examples=40, deadline=None)
@given(arrays=st.sampled_from(BAD_ARRAYS), declared_store=st.booleans())
def test_bad_arrays_are_refused(stores, arrays, declared_store):
    store = stores[0 if declared_store else 1]
    if not declared_store and _numeric_batch(arrays):
        return  # any numeric batch of two fits a store without a declared item shape
    _refused(lambda: store.put([0, 1], arrays), "arrays", store=store)
    _refused(lambda: store.__setitem__([0, 1], arrays), "value", store=store)


@settings(max_examples=30, deadline=None)
@given(codec=st.sampled_from(BAD_CODECS))
def test_bad_codecs_are_refused(stores, codec):
    declared, _ = stores
    _refused(lambda: get_codec(codec), "codec")
    _refused(lambda: declared.put([0], np.zeros((1, *ITEM), np.uint8), codec=codec), "codec", store=declared)


@settings(max_examples=40, deadline=None)
@given(missing=st.sampled_from(BAD_MISSING), shape=st.sampled_from([(2,), (1, 2)]), out_index=st.integers(0, 7))
def test_bad_read_options_are_refused(stores, missing, shape, out_index):
    declared, _ = stores
    ids = np.zeros(shape, np.int64)
    _refused(lambda: declared.get(ids, missing=missing), "missing", store=declared)
    out = _outs(shape)[out_index % len(_outs(shape))]
    _refused(lambda: declared.get(ids, out=out), "out", store=declared)
    _refused(lambda: declared.get_many([ids, ids], outs=[np.zeros((*shape, *ITEM), np.uint8), out]), "outs[1]", store=declared)


@pytest.mark.parametrize("slot_arrays,outs,name", [
    (None, None, "slot_arrays"), (5, None, "slot_arrays"), ([], None, "slot_arrays"), ("ab", None, "slot_arrays"),
    ([[0], None], None, "slot_arrays[1]"), ([[0]], 5, "outs"), ([[0]], [], "outs"), ([[0]], [None], "out"),
])
def test_bad_get_many_arguments_are_refused(stores, slot_arrays, outs, name):
    declared, _ = stores
    _refused(lambda: declared.get_many(slot_arrays, outs=outs), name, store=declared)


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_bad_keys_are_refused(stores, key):
    declared, _ = stores
    _refused(lambda: declared[key], "key", store=declared)
    _refused(lambda: declared.__setitem__(key, np.zeros(ITEM, np.uint8)), "key", store=declared)


def test_accepted_inputs_read_and_write_as_documented(stores):
    """The forms the docs accept: lists and any integer dtype as ids, negative ids from the end, torch integer tensors."""
    declared, _ = stores
    want = declared.get(np.array([0, 2]))
    np.testing.assert_array_equal(declared.get([0, -N + 2]), want)
    np.testing.assert_array_equal(declared.get(np.array([0, 2], np.uint8)), want)
    np.testing.assert_array_equal(declared[0:4:2], want)
    if HAVE_TORCH:
        np.testing.assert_array_equal(declared.get(_torch(0, 2, dtype="int64")), want)


@settings(max_examples=40, deadline=None)
@given(
    spec=st.sampled_from([s for s in ("none", "rle", "igzip:1", "zstd:1") if s.split(":")[0] in host_codecs.available_codecs()]),
    case=st.sampled_from([
        ("encode", None, "array"), ("encode", "abc", "array"), ("encode", [[1], [2, 3]], "array"), ("encode", _Weird(), "array"),
        ("encode", np.zeros(3, ">i4"), "array"),
        ("decode", (None, np.uint8, (2,)), "payload"), ("decode", (5, np.uint8, (2,)), "payload"),
        ("decode", ("ab", np.uint8, (2,)), "payload"), ("decode", (b"", np.uint8, (2,)), "payload"),
        ("decode", (b"\0ab", "foo", (2,)), "dtype"), ("decode", (b"\0ab", object, (2,)), "dtype"),
        ("decode", (b"\0ab", np.uint8, "ab"), "shape"), ("decode", (b"\0ab", np.uint8, (-1,)), "shape"),
        ("decode", (b"\0ab", np.uint8, (2.5,)), "shape"), ("decode", (b"\0ab", np.uint8, None), "shape"),
    ]),
)
def test_bad_codec_arguments_are_refused(spec, case):
    codec = get_codec(spec)
    method, arg, name = case
    _refused(lambda: codec.encode(arg) if method == "encode" else codec.decode(*arg), name)
