"""Methods of a buffer that keeps its steps in a wrapped buffer, its `buffer` field."""

from __future__ import annotations

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
