r"""Offline datasets: Minari import and export for `jaxbuffers.EpisodeBuffer` (`from_minari`, `to_minari`; import
into a `jaxbuffers.TrajectoryBuffer` too).

Minari stores an episode of $L$ steps as `observations` ($L + 1$ of them: the reset observation, then the one after
each step), `actions`, `rewards`, `terminations`, `truncations` ($L$ each) and `infos` ($L + 1$ entries per key, the
first from the reset). In an `EpisodeBuffer` the same episode is:

| Minari | `EpisodeBuffer` |
|---|---|
| `observations[:L]` | step field `obs` (a dict observation stays a dict) |
| `observations[L]` | the episode's `final_obs` |
| `actions`, `rewards` | step fields `action`, `reward` |
| `terminations[L-1]`, `truncations[L-1]` | the episode's `terminated`, `truncated` |
| `infos[k][:L]` | step field `infos` (a dict; only when the dataset has infos) |
| `infos[k][L]` | meta field `final_info/k` (nested keys joined by `/`) |

Dtypes. Nothing is converted silently. Minari keeps rewards (and often observations and discrete actions) in 64
bits; with `jax_enable_x64` on they are stored as they are. With it off JAX holds no 64-bit arrays, and `from_minari`
refuses a 64-bit field with a `TypeError` naming it, unless `cast_64bit=True` asks for the conversion: float64 to
float32 (rounded to nearest), int64 / uint64 to int32 / uint32, with a `ValueError` naming the field for an integer
that the 32-bit type cannot hold. `to_minari`
writes observations and actions in the dtypes of the spaces given (converted only where every value is kept exactly,
else a `ValueError` naming the field) after checking them against the bounds the spaces define (`Discrete`,
`MultiDiscrete`, `MultiBinary`, `Box`; a `ValueError` naming the field and the first step out), rewards in float64 and 32-bit infos in 64 bits
(the dtype of the Python numbers an env puts in its infos). The round trip
`to_minari(from_minari(d))` is exact for data that float32 holds exactly (float32 observations, integer actions,
rewards such as CartPole's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxbuffers import _validate
from jaxbuffers.episode import EpisodeBuffer

__all__ = ["from_minari", "to_minari"]

_FINAL_INFO = "final_info/"


def _narrow(name: str, x, cast_64bit: bool) -> np.ndarray:
    """`x` as a numpy array JAX can hold: as it is, or (only with `cast_64bit`) 64-bit floats and ints narrowed to 32
    bits, ints range-checked (module doc)."""
    x = np.asarray(x)
    target = np.dtype(jax.dtypes.canonicalize_dtype(x.dtype))
    if not (cast_64bit and x.dtype.kind in "iuf"):
        how = (f"pass cast_64bit=True to store it as {target} (floats rounded to nearest, integers range-checked), or "
               f"enable jax_enable_x64 to keep {x.dtype}") if x.dtype.kind in "iuf" else "convert it"
        return _validate.not_narrowed(name, x, how)
    if x.dtype.kind in "iu":
        info = np.iinfo(target)
        if x.size and (x.min() < info.min or x.max() > info.max):
            raise ValueError(f"{name}: values in [{x.min()}, {x.max()}] do not fit {target} (x64 is off); enable jax_enable_x64")
    return x.astype(target, copy=False)


def _info_names(infos: Mapping, prefix: str = "") -> list[tuple[str, tuple]]:
    """(`a/b` name, key path) of every leaf of a nested info dict."""
    out = []
    for k, v in infos.items():
        if isinstance(v, Mapping):
            out += [(n, (k, *p)) for n, p in _info_names(v, f"{prefix}{k}/")]
        else:
            out.append((f"{prefix}{k}", (k,)))
    return out


def _get(tree: Mapping, path: tuple):
    for k in path:
        tree = tree[k]
    return tree


def _read(dataset, cast_64bit: bool) -> list[dict]:
    """Every episode of a Minari dataset as host arrays: `steps` (step dict, leaves `[L, ...]`), `final` (obs after
    the last step), `term`, `trunc` (the last step's flags) and `meta` (the final infos, module doc)."""
    episodes = list(dataset.iterate_episodes())
    if not episodes:
        raise ValueError("dataset: expected at least one episode, got none")
    info_names = _info_names(episodes[0].infos or {})
    out = []
    for ep in episodes:
        n, where = len(ep), f"dataset episode {ep.id}"
        t_flags, u_flags = np.asarray(ep.terminations, bool), np.asarray(ep.truncations, bool)
        if np.any(t_flags[:-1] | u_flags[:-1]):
            raise ValueError(f"{where}: terminations / truncations set before its last step {n - 1}")
        narrow = lambda name, x: _narrow(f"{where}: {name}", x, cast_64bit)  # noqa: E731
        obs = jax.tree.map(lambda x: narrow("observations", x), ep.observations)
        steps = {"obs": jax.tree.map(lambda x: x[:n], obs), "action": jax.tree.map(lambda x: narrow("actions", x), ep.actions),
                 "reward": narrow("rewards", np.asarray(ep.rewards))}
        meta = {}
        if info_names:
            steps["infos"] = jax.tree_util.tree_map_with_path(
                lambda path, x: narrow(_validate.leaf_path("infos", path), x)[:n], dict(ep.infos))
            meta = {_FINAL_INFO + name: narrow(f"infos[{name}]", np.asarray(_get(ep.infos, p))[n]) for name, p in info_names}
        out.append(dict(steps=steps, final=jax.tree.map(lambda x: x[n], obs), term=bool(t_flags[-1]),
                        trunc=bool(u_flags[-1]), meta=meta, length=n))
    return out


def from_minari(
    dataset, *, into: str = "episodes", max_episodes: int | None = None, max_timesteps: int | None = None,
    circular: bool = True, cast_64bit: bool = False,
):
    """A buffer holding every episode of a Minari dataset, in the dataset's order (module doc: layout, dtypes).

    With `into="episodes"`, an `EpisodeBuffer`. With `into="trajectory"`, a `jaxbuffers.TrajectoryBuffer` of one
    lane holding every step of the dataset in order (`length` = the number of steps), each episode's last step
    flagged (an episode ending by neither flag is flagged truncated) and its final observation in the
    final-observation ring (`final_obs_capacity` = the number of episodes); the final infos are not kept there.

    Args:
      dataset: a `minari.MinariDataset` (e.g. `minari.load_dataset(dataset_id)`).
      into: `"episodes"` or `"trajectory"`.
      max_episodes: (`"episodes"`) episode slots; default: the dataset's number of episodes (of parts, when
        `max_timesteps` splits some); a smaller circular buffer keeps the last ones.
      max_timesteps: (`"episodes"`) steps per slot; default: the longest episode. Longer episodes are stored in
        parts (`EpisodeBuffer.add_episode` with `split_long=True`).
      circular: (`"episodes"`) as in `EpisodeBuffer.create`.
      cast_64bit: with `jax_enable_x64` off, store 64-bit fields in 32 bits (module doc); False refuses them.

    Returns:
      The filled buffer; an `EpisodeBuffer`'s `meta` holds the final infos (module doc).

    Raises:
      TypeError: `dataset` not a Minari dataset; a 64-bit field with `jax_enable_x64` off and `cast_64bit=False` (the
        message names the field); `cast_64bit` or `circular` not a bool.
      ValueError: an empty dataset, an episode whose flags end it before its last step, an integer that int32
        cannot hold (with `cast_64bit`), `into` not one of the two, sizes not ints >= 1 or given with
        `into="trajectory"` (every argument checked before the dataset is read).
      BufferFullError: `circular=False` and more episodes than `max_episodes`.
    """
    if not callable(getattr(dataset, "iterate_episodes", None)):
        raise TypeError(f"dataset: expected a minari.MinariDataset (minari.load_dataset(dataset_id)), got {type(dataset).__name__}")
    _validate.choice("into", into, ("episodes", "trajectory"))
    cast_64bit, circular = _validate.static_bool("cast_64bit", cast_64bit), _validate.static_bool("circular", circular)
    for name, v in (("max_episodes", max_episodes), ("max_timesteps", max_timesteps)):
        if v is not None and into == "trajectory":
            raise ValueError(f"{name}: a size of into='episodes'; a trajectory buffer holds every step of the dataset, got {v!r}")
        if v is not None:
            _validate.static_int(name, v)
    episodes = _read(dataset, cast_64bit)
    lengths = [e["length"] for e in episodes]
    example = jax.tree.map(lambda x: x[0], episodes[0]["steps"])
    if into == "trajectory":
        from jaxbuffers.trajectory import TrajectoryBuffer

        total = sum(lengths)
        buf = TrajectoryBuffer.create(example, num_envs=1, length=total, final_obs_capacity=len(episodes))
        last = np.zeros(total, bool)
        last[np.cumsum(lengths) - 1] = True
        term = np.repeat([e["term"] for e in episodes], lengths) & last
        trunc = last & ~term
        # the observation after each step: the next step's, and the final observation after an episode's last
        nxt = [jax.tree.map(lambda x, f: np.concatenate([x[1:], f[None]]), e["steps"]["obs"], e["final"]) for e in episodes]
        cat = lambda *xs: np.concatenate(xs)[None]  # noqa: E731
        return buf.add(jax.tree.map(cat, *[e["steps"] for e in episodes]), terminated=term[None], truncated=trunc[None],
                       final_obs=jax.tree.map(cat, *nxt))
    longest = max(lengths)
    m = longest if max_timesteps is None else _validate.static_int("max_timesteps", max_timesteps)
    metas = [e["meta"] for e in episodes]
    buf = EpisodeBuffer.create(
        example, max_episodes=sum(-(-n // m) for n in lengths) if max_episodes is None else max_episodes, max_timesteps=m,
        meta={k: np.zeros_like(v) for k, v in metas[0].items()}, circular=circular,
    )
    pad = lambda x: np.concatenate([x, np.zeros((longest - len(x), *x.shape[1:]), x.dtype)])  # noqa: E731
    return buf.add_episodes(
        jax.tree.map(lambda *xs: np.stack([pad(x) for x in xs]), *[e["steps"] for e in episodes]),
        np.asarray(lengths, np.int32), terminated=np.asarray([e["term"] for e in episodes]),
        truncated=np.asarray([e["trunc"] for e in episodes]), final_obs=jax.tree.map(lambda *xs: np.stack(xs), *[e["final"] for e in episodes]),
        meta={k: np.stack([mt[k] for mt in metas]) for k in metas[0]}, split_long=True,
    )


def _widen(x: np.ndarray) -> np.ndarray:
    """int32 / uint32 / float32 infos back to 64 bits (`from_minari` narrowed them; Python numbers are 64-bit)."""
    wide = {np.dtype(np.int32): np.int64, np.dtype(np.uint32): np.uint64, np.dtype(np.float32): np.float64}
    return x.astype(wide[x.dtype]) if x.dtype in wide else x


def _space_dtype(name: str, space, x: np.ndarray, final: bool = False) -> np.ndarray:
    """`x` (one episode's values, steps on axis 0; `final`: the last row is the final observation) in `space`'s
    dtype, every value kept exactly (`_validate.exact_cast`), and inside the bounds the space defines: `Discrete`
    and `MultiDiscrete` `[start, start + n)`, `MultiBinary` {0, 1}, `Box` `[low, high]` elementwise (NaN outside).

    Raises:
      ValueError: a value not kept exactly, or out of the bounds: naming `name`, the first step out and the space.
    """
    from gymnasium import spaces

    dtype = getattr(space, "dtype", None)
    x = x if dtype is None else _validate.exact_cast(name, x, dtype)
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        lo = np.asarray(space.start)
        inside = (x >= lo) & (x < lo + np.asarray(space.n if isinstance(space, spaces.Discrete) else space.nvec))
    elif isinstance(space, spaces.MultiBinary):
        inside = (x == 0) | (x == 1)
    elif isinstance(space, spaces.Box) and np.shape(x)[1:] == space.shape:
        inside = (x >= space.low) & (x <= space.high)
    else:
        return x
    out = ~np.reshape(inside, (len(x), -1)).all(axis=1)
    if out.any():
        t = int(np.argmax(out))
        step = "its final observation" if final and t == len(x) - 1 else f"step {t}"
        raise ValueError(f"{name}: {step} holds {np.asarray(x[t]).tolist()!r:.200}, outside {space} (its bounds); "
                         "nothing was written")
    return x


def to_minari(buffer: EpisodeBuffer, dataset_id: str, *, observation_space, action_space, env: Any = None, **metadata) -> Any:
    """Write the episodes of `buffer` (oldest first) as a new local Minari dataset (module doc: layout, dtypes).

    An episode that ended by neither flag is written as truncated (Minari's convention for a cut episode). A step
    field `infos` and meta fields `final_info/...` become the episode's infos; other extra step fields and meta
    fields are not written.

    Args:
      buffer: an `EpisodeBuffer` with an observation, an action and a reward field.
      dataset_id: the new dataset's id, `(namespace/)(env_name/)name-v(version)`; written under Minari's
        dataset path (`MINARI_DATASETS_PATH`).
      observation_space: the Gymnasium space of the observations; their dtype is written.
      action_space: the Gymnasium space of the actions; their dtype is written.
      env: optional env (id, `EnvSpec` or env) recorded in the dataset.
      **metadata: passed on to `minari.create_dataset_from_buffers` (`algorithm_name`, `author`, ...).

    Returns:
      The `minari.MinariDataset` written.

    Raises:
      TypeError: `buffer` not an `EpisodeBuffer`, `dataset_id` not a str, a space not a Gymnasium space,
        `jpeg_encoding` not a bool (checked before anything is written).
      ValueError: an empty buffer; observations or actions whose values the space's dtype cannot hold exactly
        (out of its range, fractions for an integer dtype, floats it would round), or outside the bounds the space
        defines (`Discrete`, `MultiDiscrete`, `MultiBinary`, `Box`), naming the field, the episode and the first
        step out: nothing is cast silently (checked before anything is written); Minari's errors for the id or
        the spaces.
    """
    import minari
    from minari.data_collector import EpisodeBuffer as MinariEpisode

    from gymnasium import spaces

    if not isinstance(buffer, EpisodeBuffer):
        raise TypeError(f"buffer: expected an EpisodeBuffer, got {type(buffer).__name__}")
    _validate.instance("dataset_id", dataset_id, str, "a str, (namespace/)(env_name/)name-v(version)")
    _validate.instance("observation_space", observation_space, spaces.Space, "a gymnasium space")
    _validate.instance("action_space", action_space, spaces.Space, "a gymnasium space")
    _validate.static_bool("jpeg_encoding", metadata.setdefault("jpeg_encoding", False))
    everything = jax.tree.map(np.asarray, buffer.get_all())
    count = int(buffer.num_episodes())
    if count == 0:
        raise ValueError("buffer: expected at least one episode, got an empty buffer")
    finals = {k[len(_FINAL_INFO):]: v for k, v in everything.meta.items() if k.startswith(_FINAL_INFO)}
    out = []
    for i in range(count):
        n = int(everything.lengths[i])
        item = jax.tree.map(lambda x: x[i][:n], everything.item)
        obs = jax.tree.map(lambda x, f: np.concatenate([x, f[i][None]]), item[buffer.obs_key], everything.final_obs)
        where = f"episode {i}: "
        if isinstance(obs, Mapping):
            obs = {k: _space_dtype(f"{where}{buffer.obs_key}[{k!r}]", observation_space[k], v, True) for k, v in obs.items()}
        else:
            obs = _space_dtype(f"{where}{buffer.obs_key}", observation_space, obs, True)
        term = bool(everything.terminated[i])
        terminations = np.zeros(n, bool)
        truncations = np.zeros(n, bool)
        terminations[-1], truncations[-1] = term, not term
        infos = None
        if "infos" in item:
            infos = {}
            for name, value in jax.tree_util.tree_flatten_with_path(item["infos"])[0]:
                keys = [getattr(p, "key", getattr(p, "name", None)) for p in name]
                last = finals["/".join(str(k) for k in keys)][i]
                node = infos
                for k in keys[:-1]:
                    node = node.setdefault(k, {})
                node[keys[-1]] = _widen(np.concatenate([value, np.asarray(last)[None]]))
        out.append(MinariEpisode(
            id=i, observations=obs, actions=_space_dtype(f"{where}{buffer.action_key}", action_space, item[buffer.action_key]),
            rewards=item[buffer.reward_key].astype(np.float64), terminations=terminations, truncations=truncations,
            infos=infos,
        ))
    return minari.create_dataset_from_buffers(
        dataset_id, out, env=env, observation_space=observation_space, action_space=action_space, **metadata,
    )
