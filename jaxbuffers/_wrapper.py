"""Methods and fields of a buffer that keeps its data in a wrapped buffer (its `buffer` or `replay` field)."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable

import jax

from jaxbuffers import _compiled


class Wrapper:
    """Mixin: `num_envs`, `size` and `is_full` answered by the wrapped `self.buffer`."""

    @property
    def num_envs(self) -> int:
        """Envs (lanes) whose steps are stored (static Python int): the wrapped buffer's `num_envs`."""
        return self.buffer.num_envs

    @_compiled.method()
    def size(self) -> jax.Array:
        """The number of steps stored, counted over all envs (int32 scalar): the wrapped buffer's `size`."""
        return self.buffer.size()

    @_compiled.method()
    def is_full(self) -> jax.Array:
        """Whether the wrapped buffer is full (bool scalar): its `is_full`."""
        return self.buffer.is_full()


def forward_fields(inner: str, wrapped: type) -> Callable[[type], type]:
    """Class decorator: a read-only property `name` returning `self.<inner>.<name>` for each public field of the
    `wrapped` buffer class (state arrays and static sizes) that the decorated class does not define itself, so that
    a wrapper reads as the buffer it wraps (`buf.storage`, `buf.head`, ... are `buf.<inner>.storage`, ...)."""

    def forward(cls: type) -> type:
        for f in dataclasses.fields(wrapped):
            if not f.name.startswith("_") and not hasattr(cls, f.name):
                doc = f"`{f.name}` of the wrapped `{wrapped.__name__}` (read-only; replace it there)."
                setattr(cls, f.name, property(operator.attrgetter(f"{inner}.{f.name}"), doc=doc))
        return cls

    return forward
