"""Codec registry: `"name"` or `"name:level"` -> codec object; tag -> codec.

The known codecs with their tags, levels and packages: `docs/api/host_codecs.md`, "Codecs".

Example:
  >>> from host_codecs import get_codec
  >>> get_codec("igzip:3").level
  3
  >>> get_codec("none").tag
  0
"""

from __future__ import annotations

import importlib.util

from ._base import Codec
from .gzip import IgzipCodec
from .raw import NoneCodec
from .rle import RLECodec
from .zstd import ZstdCodec

__all__ = ["CODECS", "available_codecs", "codec_for_tag", "get_codec", "known_codecs"]

#: name -> codec class.
CODECS: dict[str, type[Codec]] = {c.name: c for c in (NoneCodec, RLECodec, IgzipCodec, ZstdCodec)}
_BY_TAG: dict[int, type[Codec]] = {c.tag: c for c in CODECS.values()}
_NEEDS = {"none": None, "rle": "numba", "igzip": "isal", "zstd": "zstandard"}
_CACHE: dict[tuple[str, int | None], Codec] = {}


def known_codecs() -> list[str]:
    """Every codec name the registry knows, installed or not."""
    return list(CODECS)


def available_codecs() -> list[str]:
    """Codec names whose optional package is importable in this environment."""
    return [n for n, pkg in _NEEDS.items() if pkg is None or importlib.util.find_spec(pkg) is not None]


def get_codec(spec: "str | Codec") -> Codec:
    """The codec object for `spec` (`"rle"`, `"igzip:1"`, `"zstd:3"`, ..., or a `host_codecs.Codec`, returned as it
    is). Codec objects are immutable and cached, so calling this per put is cheap.

    Raises:
      ValueError: unknown name (the message lists the known names) or bad level (it lists the valid levels).
      TypeError: `spec` is neither a string nor a Codec.
      ImportError: the codec's optional package is missing (the message names the extra).
    """
    if isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"codec: expected a name like 'igzip:1' or a Codec, got {type(spec).__name__}")
    name, sep, level_text = spec.strip().partition(":")
    name = name.strip().lower()
    cls = CODECS.get(name)
    if cls is None:
        raise ValueError(f"codec: unknown codec {spec!r}; known codecs: {known_codecs()}")
    level: int | None = None
    if sep:
        try:
            level = int(level_text)
        except ValueError:
            levels = f" in {list(cls.levels)}" if cls.levels else f" (codec {name!r} takes no level)"
            raise ValueError(f"codec {spec!r}: level must be an integer{levels}") from None
    if (name, level) not in _CACHE:
        _CACHE[name, level] = cls(level)
    return _CACHE[name, level]


def codec_for_tag(tag: int) -> Codec:
    """The default-level codec object that decodes entries stored with `tag`; ValueError for an unknown tag (a
    corrupt index)."""
    cls = _BY_TAG.get(int(tag))
    if cls is None:
        raise ValueError(f"codec tag {tag} is unknown; known tags: {sorted(_BY_TAG)}")
    return get_codec(cls.name)
