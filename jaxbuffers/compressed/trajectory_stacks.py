"""The frame-stack check of `jaxbuffers.compressed.CompressedTrajectoryBuffer` (`docs/api/compressed.md`, "Which
stacks"): `jaxbuffers._validate.unrebuilt_trajectory_stacks` run on the host by an add's write callback before it
writes, against the stacks the store rebuilds from the frames its last write kept (`HostStores.read_recent`).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxbuffers import _compiled, _validate
from jaxbuffers.compressed import _common


class StackChecked:
    """Base of `CompressedTrajectoryBuffer` holding its frame-stack check (module doc)."""

    @property
    def _stacked(self) -> bool:
        """Whether the compressed leaves are frame stacks (the store keeps each step's newest frame only)."""
        return self.leaves[0].stack_axis is not None

    _write_may_refuse = _stacked  # an add's write callback may refuse it: an eager add waits for its write

    def check_stacks(self, step: Mapping, *, terminated, truncated=None, final_obs=None) -> None:
        """Raise the error `add` raises for frame stacks it cannot store (`docs/api/compressed.md`, "Which stacks"),
        without adding; arguments as `add`'s.

        Raises:
          ValueError: a stack that is not the one the buffer rebuilds (named by leaf, env and step); and `add`'s
            argument errors. Nothing without `frame_stack`.
        """
        self.host.check_state("check_stacks")
        if not self._stacked:
            return
        error = self._stack_refusal(*jax.device_get(self._stack_operands(step, terminated, truncated, final_obs)))
        if error is not None:
            raise error

    @_compiled.method()
    def _stack_operands(self, step, terminated, truncated, final_obs) -> tuple:
        """`_checked_stack_operands` of `add`'s arguments, checked as `add` checks them."""
        return self._checked_stack_operands(*_validate.trajectory_add(
            self.step_spec, self.trajectory.obs_key, self.num_envs, self.length, step, terminated, truncated, final_obs
        ))

    def _checked_stack_operands(self, step, terminated, truncated, final_obs) -> tuple:
        """`_stack_refusal`'s operands for an add of checked `[E, t]` inputs: `_tail_operands`, the episode ends bool
        `[E, t]`, each leaf's stacks, and with `truncated` its final observations and `truncated & ~terminated`."""
        ends = terminated if truncated is None else terminated | truncated
        stacks = _common.pick_leaves(step[self.trajectory.obs_key], self.leaf_index)
        finals = [] if truncated is None else [*_common.pick_leaves(final_obs, self.leaf_index), truncated & ~terminated]
        return (*self._tail_operands.uncompiled(self), ends, *stacks, *finals)

    def _stack_refusal(self, *operands: np.ndarray) -> ValueError | None:
        """On the host: `stack_error` given `_checked_stack_operands` (numpy)."""
        befores, first = self._tails(operands)
        n, m = self.host.num_operands + 4, len(self.leaves)
        ends, stacks, rest = operands[n], operands[n + 1 : n + 1 + m], operands[n + 1 + m :]
        starts = np.concatenate([first[:, None], ends[:, :-1]], axis=1)
        return self.stack_error(stacks, befores, starts, list(rest[:m]) if rest else None, rest[-1] if rest else None)

    def _tails(self, ops: tuple) -> tuple:
        """`lane_tails` on the host, from `_tail_operands` (numpy) at the front of `ops`."""
        n = self.host.num_operands + 1  # (operands() traces: not callable in a callback)
        fids, pad, first = ops[n : n + 3]
        if not self._stacked:
            return [], first
        pad = pad if pad.shape else None  # zeros where `pad` (a scalar: none)
        return [
            np.moveaxis(b if pad is None else np.where(pad.reshape(pad.shape + (1,) * (b.ndim - 2)), 0, b), 1, 1 + i.stack_axis)
            for b, i in zip(self.host.read_recent(*ops[:n], fids), self.leaves)
        ], first

    @_compiled.method()
    def _tail_operands(self) -> tuple:
        """The operands of `lane_tails`: the store's leading operands and the version, the slots of each lane's last
        frames back to its episode start int32 `[E, k]` (none where the next step starts one) and their zero-pad mask
        (a scalar when there is none), and whether each lane's next step starts an episode bool `[E]`."""
        ring, going = self.frame_ring, self.next_ep_pos > 0  # going: the next step continues the last step's episode
        lane = jnp.arange(self.num_envs, dtype=jnp.int32) * ring
        ids = jnp.stack([jnp.where(going, lane + (self.frame_head - 1) % ring, -1),
                         jnp.where(going, lane + (self.frame_head - 2) % ring, -1),
                         jnp.maximum(self.next_ep_pos - 1, 0)], axis=-1).astype(jnp.int32)
        fids, pad = self._frame_ids(ids)
        return (*self.host.operands(), self.version, fids, jnp.zeros(()) if pad is None else pad, self.next_ep_pos == 0)

    def lane_tails(self) -> tuple:
        """`(stacks, starts)`, numpy: per compressed leaf `[num_envs, *shape]` the stack the store rebuilds for each
        lane's last step (zeros where the next step starts an episode; none without frame stacks), and bool
        `[num_envs]`, whether each lane's next step starts an episode.

        Raises:
          StaleBufferError: the store moved past this state (read on the host, `HostStores.read_recent`).
        """
        return self._tails(jax.device_get(self._tail_operands()))

    def stack_error(self, stacks, befores, starts, finals=None, boot=None) -> ValueError | None:
        """The error `add` raises for these frame stacks, or None, computed on the host in numpy.

        Args:
          stacks: per compressed leaf, numpy `[num_envs, t, *shape]`, the stacks of a chunk of steps.
          befores: per compressed leaf, numpy `[num_envs, *shape]`, the stack of each lane's step before the chunk
            (`lane_tails`, or the stacks of the last step given), read where that step did not end an episode.
          starts: bool `[num_envs, t]`, the steps that start an episode.
          finals, boot: per compressed leaf numpy `[num_envs, t, *shape]` final observations and bool `[num_envs, t]`
            where they are read (truncated and not terminated); or None.
        """
        return self._stack_error_of(stacks, befores, starts, finals, boot)

    def _stack_error_of(self, stacks, befores, starts, finals=None, boot=None) -> ValueError | None:
        """`stack_error` without its one-member check (a `StagingWriter` checks that once)."""
        bad = [
            _validate.unrebuilt_trajectory_stacks(x, b, starts, None if finals is None else f, boot, stack_axis=i.stack_axis, padding=self.padding)
            for x, b, f, i in zip(stacks, befores, finals or [None] * len(stacks), self.leaves)
        ]
        return self._stack_error(np.stack(bad)) if any(np.count_nonzero(b) for b in bad) else None

    def _step_follows(self, stacks, befores, starts) -> bool:
        """Whether one step's stacks (per leaf numpy `[num_envs, *shape]`) pass `stack_error` after `befores` given
        `starts` bool `[num_envs]`, stack by stack (`jaxbuffers._validate.host_stack_breaks`), for a `StagingWriter`."""
        starts = np.asarray(starts).tolist()
        for x, before, i in zip(stacks, befores, self.leaves):
            if i.stack_axis:  # the k axis after the env axis (views)
                x, before = np.moveaxis(x, 1 + i.stack_axis, 1), np.moveaxis(before, 1 + i.stack_axis, 1)
            for e, start in enumerate(starts):
                if _validate.host_stack_breaks(x[e], before[e], start, self.padding):
                    return False
        return True

    def final_error(self, befores, finals, boot) -> ValueError | None:
        """The error `add` raises for final observations that are not their step's stack shifted by one frame, or
        None: `befores` / `finals` per leaf numpy `[num_envs, *shape]`, compared where `boot` (bool `[num_envs]`)."""
        e = len(boot)
        bad = [
            _validate.unrebuilt_trajectory_stacks(b[:, None], b, np.ones((e, 1), bool), f[:, None], np.asarray(boot)[:, None],
                                                  stack_axis=i.stack_axis, padding=self.padding)[1]
            for b, f, i in zip(befores, finals, self.leaves)
        ]
        return self._stack_error(np.stack([np.stack([np.zeros_like(b), b]) for b in bad])) if any(b.any() for b in bad) else None

    def _recent_rows(self, m: int, finals: bool) -> tuple[np.ndarray, int] | None:
        """`HostStores.write`'s `recent` for an add writing `m` rows (`[E, t]` steps, then as many final frames when
        `finals`): each lane's last `k - 1` frames (the next add's stack check reads them), capped at `2 E (k - 1)`
        frames. None without frame stacks."""
        if not self._stacked:
            return None
        k, e = self.frame_stack, self.num_envs
        t = m // (e * (2 if finals else 1))
        rows = np.zeros((2 * e if finals else e, t), bool)
        rows[:e, max(t - (k - 1), 0):] = True
        return rows.reshape(-1), 2 * e * (k - 1)

    def _stack_error(self, bad: np.ndarray) -> ValueError | None:
        """`_validate.unrebuilt_trajectory_stack_error` of bool `[leaves, 2, E, t]`, leaves named as `add`'s."""
        obs = f"[{self.trajectory.obs_key!r}]"
        names = [(f"step{i.name[len('example_step'):]}", f"final_obs{i.name[len('example_step' + obs):]}") for i in self.leaves]
        return _validate.unrebuilt_trajectory_stack_error(bad, names)
