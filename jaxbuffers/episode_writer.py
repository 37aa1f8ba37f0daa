"""Episode assembly from per-env steps on the host: `EpisodeWriter`.

Actors step their envs at their own pace and hand the writer one step at a time, keyed by an env id (any hashable
value; an env id seen for the first time starts an episode). The writer keeps each env's episode in progress, in
host memory (numpy), and commits it to its `jaxbuffers.EpisodeBuffer` when it ends:

* by termination or truncation (the flags of the step's env half), or
* by reaching the buffer's `max_timesteps` steps: *auto-truncation*, recorded as a truncation whose final
  observation is that step's `next_obs`; the env's next step starts a new episode in the buffer.

A step has two halves, which may arrive separately and in either order, from different threads:

* the *env half*: the step's fields that are not policy fields (`obs`, `reward`, extras), with `next_obs` (the
  true observation after the step, before any auto-reset), `terminated` and `truncated`;
* the *policy half*: the policy fields named at construction (by default `action`, and `log_prob` and `value`
  when the buffer's step has them).

Halves are matched by `(env_id, step_id)`. Step ids of an env are consecutive integers from 0, over the env's whole
life (across its episodes; `discard` starts an env again at 0). An env steps one step after another, so its env
halves come in step-id order: the first env half of an env is step 0 and each later one is the step after the
last, and any other id is refused on arrival (`ValueError` naming `step_id`, the env id, the id expected and the id
given; nothing is kept), so a misnumbered env (e.g. one that appears late and counts from a global step) fails
loudly instead of waiting for steps that never come. Policy halves may come in any order, before or after their
env half, for any step not joined yet up to `policy_lead - 1` steps after the one whose env half comes next
(`policy_lead` defaults to the buffer's `max_timesteps`: a policy half may run ahead of env halves still in
transit, not by a whole episode); any other id is refused the same way (the message names the range taken). Steps join their episode in step-id order, and only once both halves are there: a step missing its
policy half, and every later step of that env, waits; it is never committed without it (`pending` lists what
waits). `add_step` gives both halves at once.

Every public method takes one lock, so actor threads may call it concurrently; a commit (one eager
`add_episode`, padded to `max_timesteps` so that every commit runs the same compiled program) runs under the lock.
Each half is checked on arrival against the buffer's step spec, exactly as `EpisodeBuffer.add_episode` would (the
leaf named, nothing cast), so a wrong half raises in the thread that sent it and changes nothing.

Example:

```python
buf = jb.EpisodeBuffer.create(step, max_episodes=1000, max_timesteps=500)
writer = jb.EpisodeWriter(buf)
writer.add_env(env_id, t, {"obs": obs, "reward": r}, next_obs=obs2, terminated=term, truncated=trunc)
writer.add_policy(env_id, t, {"action": a})          # before or after the env half
buf = writer.buffer                                  # every committed episode
```
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxbuffers import _validate
from jaxbuffers.episode import EpisodeBuffer, meta_values

__all__ = ["EpisodeWriter"]


class _Env:
    """One env's state: its episode in progress and its halves waiting for their partner."""

    __slots__ = ("next_id", "next_env_id", "env_halves", "policy_halves", "steps", "meta")

    def __init__(self):
        self.next_id = 0  # the step id that joins the episode next
        self.next_env_id = 0  # the step id of the env half expected next (env halves come in order)
        self.env_halves: dict[int, tuple] = {}  # step id -> (fields, next_obs, terminated, truncated, meta)
        self.policy_halves: dict[int, dict] = {}  # step id -> fields
        self.steps: list[tuple[dict, Any]] = []  # the episode in progress: (step dict, next_obs)
        self.meta: dict = {}


class EpisodeWriter:
    """Assembles episodes from per-env steps (and separate env / policy halves) and commits them to an
    `EpisodeBuffer`; thread-safe. Module doc: ids, halves, commits.

    Args:
      buffer: the `EpisodeBuffer` committed to (an uncompressed one: a
        `jaxbuffers.compressed.CompressedEpisodeBuffer` is refused); `buffer` (the attribute) is the latest one.
      policy_keys: names of the step fields in the policy half; default: those of `("action", "log_prob",
        "value")` that the buffer's step has (the action field always). Every other field is in the env half.
      policy_lead: an int >= 1: a policy half may come for a step up to `policy_lead - 1` steps after the one whose
        env half the env expects next (module doc). Default: the buffer's `max_timesteps`.

    Raises:
      TypeError: `buffer` is not an `EpisodeBuffer` (a compressed one included), `policy_keys` not a list of strs.
      ValueError: no policy key, one given twice, one that is not a field of the step, or the observation or
        reward among them; `policy_lead` not an int >= 1.
    """

    def __init__(self, buffer: EpisodeBuffer, *, policy_keys: Sequence[str] | None = None, policy_lead: int | None = None):
        if not isinstance(buffer, EpisodeBuffer):
            raise TypeError(f"buffer: expected an EpisodeBuffer, got {type(buffer).__name__}")
        self._policy_lead = buffer.max_timesteps if policy_lead is None else _validate.static_int("policy_lead", policy_lead)
        spec = buffer.step_spec
        if policy_keys is None:
            policy_keys = [buffer.action_key] + [k for k in ("log_prob", "value") if k in spec and k != buffer.action_key]
        policy_keys = _validate.names("policy_keys", policy_keys, 1)
        for k in policy_keys:
            if k not in spec:
                raise ValueError(f"policy_keys: {k!r} is not a field of the step (fields {sorted(spec)})")
            if k in (buffer.obs_key, buffer.reward_key):
                raise ValueError(f"policy_keys: {k!r} is the observation or the reward, which the env half carries")
        self._buffer = buffer
        self._policy_spec = {k: spec[k] for k in policy_keys}
        self._env_spec = {k: v for k, v in spec.items() if k not in self._policy_spec}
        self._obs_spec = spec[buffer.obs_key]
        self._envs: dict[Hashable, _Env] = {}
        self._lock = threading.Lock()

    @property
    def buffer(self) -> EpisodeBuffer:
        """The buffer with every episode committed so far."""
        with self._lock:
            return self._buffer

    @property
    def policy_keys(self) -> tuple[str, ...]:
        """Names of the policy-half fields."""
        return tuple(self._policy_spec)

    def in_progress(self, env_id: Hashable) -> int:
        """Steps of `env_id`'s episode in progress (joined, not yet committed); 0 for an unknown env."""
        _env_id(env_id)
        with self._lock:
            env = self._envs.get(env_id)
            return 0 if env is None else len(env.steps)

    def pending(self, env_id: Hashable) -> tuple[list[int], list[int]]:
        """Step ids of `env_id` waiting for their partner: `(env halves without a policy half, policy halves
        without an env half)`, sorted."""
        _env_id(env_id)
        with self._lock:
            env = self._envs.get(env_id)
            if env is None:
                return [], []
            return sorted(env.env_halves.keys() - env.policy_halves.keys()), sorted(env.policy_halves.keys() - env.env_halves.keys())

    def add_env(
        self, env_id: Hashable, step_id: int, fields: Mapping, *, next_obs, terminated, truncated=False,
        meta: Mapping | None = None,
    ) -> int:
        """Give the env half of step `step_id` of env `env_id`.

        Args:
          env_id: any hashable id of the env.
          step_id: int >= 0, the step's id in its env: 0 for the env's first env half, then the step after the
            last env half given (module doc).
          fields: the env-half fields of the step (every step field but the policy keys), one step, no leading
            axis, exactly the stored dtypes.
          next_obs: the observation after the step, before any auto-reset (the episode's final observation when
            the step ends it).
          terminated: bool: `next_obs` is terminal.
          truncated: bool: the episode was cut after this step.
          meta: optional `{name: value}` of the buffer's meta fields (as in `EpisodeBuffer.add_episode`) for this
            step's episode and the env's later ones, until given again; fields never given take their default.

        Returns:
          The number of episodes this call committed.

        Raises:
          TypeError: a field missing or extra, a wrong dtype, flags not a bool or a bool array, an `env_id` that is
            not hashable, a `step_id` that is not an int (`"0"`, `0.0`, `True`).
          ValueError: a wrong shape (a flag array's included: `()`), a negative step id, a step id already given or already joined, a step id other
            than the one expected (the message names the env, the id expected and the id given).
          BufferFullError: a commit into a full fixed buffer (the episode is dropped; later steps go on).
        """
        _env_id(env_id), _step_id(step_id)
        fields = self._check("fields", self._env_spec, fields)
        next_obs = self._check("next_obs", self._obs_spec, next_obs)
        terminated, truncated = _bool("terminated", terminated), _bool("truncated", truncated)
        meta = self._meta(meta)
        with self._lock:
            env = self._env(env_id, step_id, "env_halves")
            env.env_halves[step_id] = (fields, next_obs, terminated, truncated, meta)
            env.next_env_id += 1
            return self._drain(env)

    def add_policy(self, env_id: Hashable, step_id: int, fields: Mapping) -> int:
        """Give the policy half of step `step_id` of env `env_id`: the policy-key fields, one step, no leading
        axis, exactly the stored dtypes; any step id not given nor joined yet, up to `policy_lead - 1` steps after
        the env half the env expects next (policy halves come in any order, module doc). Returns the number of
        episodes committed; raises as `add_env`, and `ValueError` naming `step_id`, the env, the range of ids it
        takes and the id given for any other id."""
        _env_id(env_id), _step_id(step_id)
        fields = self._check("fields", self._policy_spec, fields)
        with self._lock:
            env = self._env(env_id, step_id, "policy_halves")
            env.policy_halves[step_id] = fields
            return self._drain(env)

    def add_step(
        self, env_id: Hashable, step: Mapping, *, next_obs, terminated, truncated=False, meta: Mapping | None = None,
        step_id: int | None = None,
    ) -> int:
        """Give both halves of a step at once: `step` is the whole step dict. `step_id` defaults to the id of the
        env half the env expects next (0 for a new env). Returns the number of episodes committed; raises as
        `add_env`."""
        _env_id(env_id)
        if step_id is not None:
            _step_id(step_id)
        if not isinstance(step, Mapping):
            raise TypeError(f"step: expected a dict like the example step, got {type(step).__name__}")
        missing = sorted(set(self._policy_spec) - set(step))
        if missing:
            raise TypeError(f"step: missing policy fields {missing}")
        policy = {k: step[k] for k in self._policy_spec}
        rest = {k: v for k, v in step.items() if k not in self._policy_spec}
        policy = self._check("step", self._policy_spec, policy)
        rest = self._check("step", self._env_spec, rest)
        terminated, truncated = _bool("terminated", terminated), _bool("truncated", truncated)
        next_obs = self._check("next_obs", self._obs_spec, next_obs)
        meta = self._meta(meta)
        with self._lock:
            if step_id is None:
                step_id = self._envs[env_id].next_env_id if env_id in self._envs else 0
            self._env(env_id, step_id, "env_halves", register=False)  # both halves checked before either is kept
            env = self._env(env_id, step_id, "policy_halves")
            env.env_halves[step_id] = (rest, next_obs, terminated, truncated, meta)
            env.policy_halves[step_id] = policy
            env.next_env_id += 1
            return self._drain(env)

    def discard(self, env_id: Hashable) -> int:
        """Drop `env_id`'s episode in progress and its waiting halves (an actor that died); its next step id
        starts again at 0. Returns the number of steps dropped from the episode in progress."""
        _env_id(env_id)
        with self._lock:
            env = self._envs.pop(env_id, None)
            return 0 if env is None else len(env.steps)

    # ---------------------------------------------------------------------------------------------

    def _check(self, name: str, spec: dict, fields) -> Any:
        """Host copies (numpy) of `fields`, checked against `spec` with no leading axis."""
        if isinstance(spec, dict) and not isinstance(fields, Mapping):
            raise TypeError(f"{name}: expected a dict with fields {sorted(spec)}, got {type(fields).__name__}")
        if isinstance(fields, Mapping):
            fields = dict(fields)
        _validate.check_batch(spec, fields, 0, name)
        return jax.tree.map(np.array, fields)  # a copy: the caller may reuse its arrays

    def _meta(self, meta) -> dict:
        """The meta fields given (checked as `EpisodeBuffer.add_episode` checks them), host copies."""
        if meta is None:
            return {}
        checked = meta_values(self._buffer.meta_spec, meta)
        return {k: np.asarray(checked[k]) for k in meta}

    def _env(self, env_id: Hashable, step_id, half: str, register: bool = True) -> _Env:
        """`env_id`'s state, after checking that `step_id` may bring its `half` (`"env_halves"` or `"policy_halves"`);
        a new env is registered only when the check passes and `register` (a refused half leaves no trace)."""
        _step_id(step_id)
        env = self._envs.get(env_id) or _Env()
        kind = half.split("_")[0]
        if kind == "policy":
            hi = env.next_env_id + self._policy_lead - 1
            taken = f"env {env_id!r} takes policy halves of the steps in [{env.next_id}, {hi}] not given yet"
            if step_id < env.next_id or step_id in env.policy_halves:
                raise ValueError(f"step_id: the policy half of step {step_id} of env {env_id!r} was already given ({taken})")
            if step_id > hi:
                raise ValueError(
                    f"step_id: {taken} (at most policy_lead={self._policy_lead} steps from step {env.next_env_id}, whose env "
                    f"half comes next), got {step_id}"
                )
        elif step_id < env.next_env_id:
            raise ValueError(f"step_id: the env half of step {step_id} of env {env_id!r} was already given")
        if kind == "env" and step_id != env.next_env_id:
            first = "its first env half is step 0" if env.next_env_id == 0 else f"the env half after step {env.next_env_id - 1}"
            raise ValueError(
                f"step_id: env {env_id!r} expects the env half of step {env.next_env_id} next ({first}: an env's step ids "
                f"count from 0 and its env halves come in step order), got {step_id}"
            )
        if register:
            self._envs.setdefault(env_id, env)
        return env

    def _drain(self, env: _Env) -> int:
        """Join the complete steps in id order; commit every episode that ends. Returns the commits made."""
        commits = 0
        while env.next_id in env.env_halves and env.next_id in env.policy_halves:
            fields, next_obs, term, trunc, meta = env.env_halves.pop(env.next_id)
            policy = env.policy_halves.pop(env.next_id)
            env.next_id += 1
            env.steps.append(({**fields, **policy}, next_obs))
            env.meta.update(meta)
            full = len(env.steps) >= self._buffer.max_timesteps
            if term or trunc or full:
                steps, env.steps, episode_meta, env.meta = env.steps, [], env.meta, dict(env.meta)
                self._commit(steps, term, trunc or not term, episode_meta)
                commits += 1
        return commits

    def _commit(self, steps: list, terminated: bool, truncated: bool, meta: dict) -> None:
        """`add_episode` of the steps, padded to `max_timesteps` (one compiled program for every commit)."""
        m, n = self._buffer.max_timesteps, len(steps)
        spec = self._buffer.step_spec
        episode = jax.tree.map(
            lambda s, *xs: np.concatenate([np.stack(xs), np.zeros((m - n, *s.shape), s.dtype)]), spec, *[s for s, _ in steps]
        )
        self._buffer = self._buffer.add_episode(
            episode, np.int32(n), terminated=np.bool_(terminated), truncated=np.bool_(truncated),
            final_obs=steps[-1][1], meta=meta,
        )


def _env_id(env_id) -> None:
    _validate.static_value("env_id", env_id, "a hashable id (an int, a str, a tuple)")


def _step_id(step_id) -> None:
    """TypeError for a `step_id` that is not an int (bools, floats and strings included), ValueError for one < 0."""
    _validate.integer("step_id", step_id, minimum=0)


def _bool(name: str, x) -> bool:
    """A host flag: a Python or numpy bool, or a 0-d bool array (`_validate.flag`)."""
    return bool(_validate.flag(name, x))
