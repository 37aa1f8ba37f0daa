"""Checks of plain-Python options of host-side calls: field names, paths, strs, choices, one entry per member,
a filled buffer, a single JAX process. Re-exported by `jaxbuffers._validate`; every message starts with the
argument's name."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax

from jaxbuffers._validate import unexpected


def names(name: str, value: Any, minimum: int = 0) -> list[str]:
    """A list or tuple of at least ``minimum`` distinct strs (field names), as a list.

    Raises:
      TypeError: not a list or tuple (a lone str too: it would be read letter by letter), an item not a str.
      ValueError: fewer than ``minimum`` names, or a name given twice.
    """
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise unexpected(name, "a list of field names (strs)", value)
    if len(value) < minimum or len(set(value)) != len(value):
        raise ValueError(f"{name}: expected at least {minimum} distinct names, got {list(value)!r:.80}")
    return list(value)


def path(name: str, value: Any) -> pathlib.Path:
    """A file-system path: a non-empty ``str`` or an ``os.PathLike``, as ``pathlib.Path``; else TypeError."""
    if not (isinstance(value, os.PathLike) or (isinstance(value, str) and value)):
        raise unexpected(name, "a folder path (a non-empty str or os.PathLike)", value)
    return pathlib.Path(value)


def text(name: str, value: Any, optional: bool = False) -> Any:
    """A str argument (a name, a prefix), or None where ``optional``; else TypeError naming ``name``."""
    if not (isinstance(value, str) or (optional and value is None)):
        raise unexpected(name, f"a str{' or None' if optional else ''}", value)
    return value


def choice(name: str, value: Any, options: tuple, what: str = "") -> Any:
    """A static option: ``value`` if it is one of ``options``, else ValueError naming ``name``, the options (then
    ``what`` they are, e.g. ``"(the mesh's axis names)"``) and the value."""
    if not any(isinstance(value, type(o)) and value == o for o in options):
        raise ValueError(f"{name}: expected one of {tuple(options)}{what and ' ' + what}, got {value!r}")
    return value


def one_each(name: str, value: Any, n: int, what: str) -> tuple:
    """``value`` (a list or tuple of exactly ``n`` entries, one per ``what``) as a tuple, else TypeError."""
    if not isinstance(value, (list, tuple)) or len(value) != n:
        got = f"{type(value).__name__} of {len(value)}" if isinstance(value, (list, tuple)) else type(value).__name__
        raise TypeError(f"{name}: expected a list or tuple of {n} entries (one per {what}), got {got}")
    return tuple(value)


def filled(what: str, filled: int, size: int, unit: str, hint: str) -> None:
    """RuntimeError naming `what` unless all `size` `unit` are filled (`filled` of them are): a call that needs a full
    buffer, such as SB3's rollout `get`."""
    if filled != size:
        raise RuntimeError(f"{what}: the buffer holds {filled} of buffer_size={size} {unit}; {hint}")


def advantages_missing(what: str, compute: str) -> RuntimeError:
    """The RuntimeError of `what`, a read of a rollout's advantages (eager: its `has_advantages` concrete) while they
    were not computed since its last add or reset; `compute` names the call that computes them."""
    return RuntimeError(f"{what}: the rollout's advantages and returns were not computed since its last add or reset "
                        f"(has_advantages is False); call {compute} first")


def single_process(what: str, why: str) -> None:
    """NotImplementedError naming `what` when JAX runs in several processes (`jax.process_count() > 1`)."""
    if jax.process_count() > 1:
        raise NotImplementedError(f"{what}: jax.process_count() is {jax.process_count()}; {why}")
