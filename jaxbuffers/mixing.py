"""Batches from `K` sources in an exact composition (e.g. offline and online data half and half, as in RLPD, Ball et
al. 2023): `sample_mixed`, `mixed_counts`, `MixedSample`; an example: `docs/api/episodes.md`, "Mixing sources".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _validate

__all__ = ["MixedSample", "mixed_counts", "sample_mixed"]


class MixedSample(NamedTuple):
    """What `sample_mixed` returns."""

    item: Any  # the sources' rows concatenated (in source order unless shuffled), leaves [batch_size, ...]
    source: jax.Array  # shape=[batch_size], dtype=int32: the source each row came from


def mixed_counts(batch_size: int, proportions: Sequence[float]) -> tuple[int, ...]:
    r"""Rows per source of a batch of `batch_size`, apportioned by the largest-remainder rule:

    $$
    c_i = \lfloor B p_i \rfloor + [\,i \text{ is among the } B - \sum_j \lfloor B p_j \rfloor
    \text{ largest remainders } B p_i - \lfloor B p_i \rfloor\,], \qquad p_i = w_i / \textstyle\sum_j w_j,
    $$

    ties going to the earlier source.

    Args:
      batch_size: static int >= 1.
      proportions: one number >= 0 per source, a positive sum: a sequence or a 1-d numpy array.

    Returns:
      A tuple of Python ints summing to `batch_size`.

    Raises:
      ValueError: `batch_size` not an int >= 1, no proportions, a proportion negative, NaN or infinite, or all 0.
      TypeError: `proportions` neither a sequence nor a 1-d numpy array of numbers, a proportion that is not a number.
    """
    batch_size = _validate.static_int("batch_size", batch_size)
    if isinstance(proportions, np.ndarray) and proportions.ndim == 1 and proportions.dtype.kind in "iuf":
        proportions = proportions.tolist()  # a 1-d numpy array of numbers: its values, each checked below
    if isinstance(proportions, (str, bytes)) or not isinstance(proportions, Sequence):
        got = type(proportions).__name__
        if isinstance(proportions, np.ndarray):
            got = f"an array of shape {proportions.shape} and dtype {proportions.dtype}"
        raise TypeError(f"proportions: expected a sequence (or a 1-d numpy array) of numbers, one per source, got {got}")
    if not proportions:
        raise ValueError(f"proportions: expected a non-empty sequence of numbers, one per source, got {proportions!r}")
    w = [_validate.static_float(f"proportions[{i}]", p, 0.0, math.inf) for i, p in enumerate(proportions)]
    largest = max(w)
    if not 0 < largest < math.inf:
        raise ValueError(f"proportions: expected finite non-negative numbers with a positive sum, got {list(proportions)}")
    w = [x / largest for x in w]  # each in [0, 1]: the sum stays finite (two proportions of 1e308 overflowed it)
    total = math.fsum(w)
    exact = [batch_size * x / total for x in w]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(w)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: batch_size - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


def sample_mixed(key: jax.Array, samplers: Sequence[Callable[[jax.Array, int], Any]], batch_size: int,
                 proportions: Sequence[float], *, shuffle: bool = False) -> MixedSample:
    """Draw `batch_size` rows from `samplers` in the exact composition `mixed_counts(batch_size, proportions)`.

    Args:
      key: PRNG key; source `i` samples with `jax.random.split(key, K + 1)[i]`, the shuffle with the last.
      samplers: `K` functions `(key, n) -> pytree` of `[n, ...]` leaves, alike in structure, row shapes and dtypes
        (one with count 0 is not called).
      batch_size: static int >= 1.
      proportions: `K` non-negative numbers (`mixed_counts`).
      shuffle: static bool: permute the rows uniformly; by default source 0's rows come first, then source 1's...

    Returns:
      `MixedSample`: `item` (leaves `[batch_size, ...]`) and `source` (int32 `[batch_size]`).

    Raises:
      ValueError: `len(proportions) != len(samplers)`, a source returning other than `n` rows or other row shapes
        than source 0's, and as `mixed_counts`.
      TypeError: a sampler not callable, a source of another structure or dtypes than source 0, `shuffle` not a bool.
    """
    shuffle = _validate.static_bool("shuffle", shuffle)
    key = _validate.key("key", key)
    if isinstance(samplers, (str, bytes)) or not isinstance(samplers, Sequence):
        raise TypeError(f"samplers: expected a sequence of functions (key, n) -> pytree, got {type(samplers).__name__}")
    counts, samplers = mixed_counts(batch_size, proportions), list(samplers)
    if len(samplers) != len(proportions):
        raise ValueError(f"proportions: expected one per sampler ({len(samplers)}), got {len(proportions)}")
    for i, s in enumerate(samplers):
        _validate.instance(f"samplers[{i}]", s, callable, "a function (key, n) -> pytree of [n, ...] rows")
    keys = jax.random.split(key, len(samplers) + 1)
    parts, spec = [], None
    for i, (s, n) in enumerate(zip(samplers, counts)):
        if n == 0:
            continue
        out = s(keys[i], n)
        if spec is None:  # the first source's leaves must be arrays JAX holds as they are; the rest must match them
            for path, x in jax.tree_util.tree_flatten_with_path(out)[0]:
                _validate.array(_validate.leaf_path(f"samplers[{i}](key, {n})", path), x)
            spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x)[1:], jnp.result_type(x)), out)
        lead = _validate.check_batch(spec, out, 1, f"samplers[{i}](key, {n})")
        if lead[0] != n:
            raise ValueError(f"samplers[{i}](key, {n}): expected {n} rows (leading axis), got {lead[0]}")
        parts.append(out)
    item = jax.tree.map(lambda *xs: jnp.concatenate([jnp.asarray(x) for x in xs]), *parts)
    source = jnp.asarray(np.repeat(np.arange(len(counts), dtype=np.int32), counts))
    if shuffle:
        perm = jax.random.permutation(keys[-1], batch_size)
        item, source = jax.tree.map(lambda x: x[perm], item), source[perm]
    return MixedSample(item=item, source=source)
