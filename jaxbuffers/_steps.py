"""Methods of the buffers that store the steps of `num_envs` envs, one row (a step of every env) at a time."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxbuffers import _compiled, _validate


class EnvSteps:
    """Mixin: `step_spec`, `memory_bytes`, `size` and `is_full`, written once so that they mean the same in every
    buffer of per-env steps (`jaxbuffers.RolloutBuffer`, `jaxbuffers.TrajectoryBuffer`).

    The buffer names its parts in `_env_steps()`: `(steps, filled, rows)`, its step pytree (leaves with two leading
    axes, rows and envs in either order), the rows written (int32 scalar) and the rows it holds (static int).
    """

    def _env_steps(self) -> tuple[Any, jax.Array, int]:
        raise NotImplementedError

    @property
    def step_spec(self) -> Any:
        """Pytree of `jax.ShapeDtypeStruct`: one step of one env (no leading axes), as `example_step` in `create`."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[2:], x.dtype), self._env_steps()[0])

    @property
    def memory_bytes(self) -> int:
        """Bytes of every array held (the steps, the per-step fields and flags, the cursors), Python int."""
        return _validate.tree_nbytes(self)

    @_compiled.method()
    def size(self) -> jax.Array:
        """The number of steps stored, counted over all envs: rows written times `num_envs` (int32 scalar)."""
        return (self._env_steps()[1] * self.num_envs).astype(jnp.int32)

    @_compiled.method()
    def is_full(self) -> jax.Array:
        """Whether every row is written (bool scalar): `num_steps` rows of a `RolloutBuffer` (a further `add` writes
        nothing), `length` steps per lane of a `TrajectoryBuffer` (a further `add` overwrites the oldest)."""
        _, filled, rows = self._env_steps()
        return filled >= rows
