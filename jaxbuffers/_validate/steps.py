"""Checks of env steps for the trajectory, episode and compressed buffers: example steps, `add`s, compressed frames."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from host_codecs import DTYPES
from jaxbuffers._validate import _is_int, check_batch, flag, index_array, item_spec, leaf_path, static_int


def final_value_pair(prefix: str, truncated, final_value) -> None:
    """ValueError naming the one given (after `prefix`) unless `truncated` and `final_value` come both or neither."""
    if (truncated is None) != (final_value is None):
        given, missing = ("truncated", "final_value") if final_value is None else ("final_value", "truncated")
        raise ValueError(f"{prefix}{given}: given without {missing}; a truncated step bootstraps from final_value "
                         f"(V of the real next observation), so pass both or neither")


def trajectory_example(example_step, num_envs, length, obs_key: str, action_key: str, reward_key: str):
    """`(num_envs, length, spec)` of a trajectory buffer's `create`: int32 positions, an obs, action, float reward."""
    num_envs, length = static_int("num_envs", num_envs), static_int("length", length)
    for arg, key in (("obs_key", obs_key), ("action_key", action_key), ("reward_key", reward_key)):
        if not isinstance(key, str):
            raise TypeError(f"{arg}: expected a str, the name of a field of example_step, got {type(key).__name__} {key!r}")
    if num_envs * length > 2**31 - 1:
        raise ValueError(f"num_envs * length: expected at most 2**31 - 1 steps in all (positions are int32 lane * "
                         f"length + slot), got {num_envs} * {length} = {num_envs * length}")
    if not isinstance(example_step, Mapping):
        raise TypeError(f"example_step: expected a dict with fields {obs_key!r}, {action_key!r}, {reward_key!r} "
                        f"(plus any extras), got {type(example_step).__name__}")
    for name in (obs_key, action_key, reward_key):
        if name not in example_step:
            raise ValueError(f"example_step: missing field {name!r} (got fields {sorted(example_step)}); pass "
                             f"obs_key/action_key/reward_key to create if your names differ")
    spec = item_spec(dict(example_step), "example_step")
    if not jax.tree.leaves(spec[obs_key]):
        raise ValueError(f"example_step[{obs_key!r}]: expected at least one array leaf (the observation), got {example_step[obs_key]!r}")
    rspec = spec[reward_key]
    if not isinstance(rspec, jax.ShapeDtypeStruct) or not jnp.issubdtype(rspec.dtype, jnp.floating):  # kind or dtype
        raise TypeError(f"example_step[{reward_key!r}]: expected a floating scalar per step, got {rspec}")
    if rspec.shape != ():
        raise ValueError(f"example_step[{reward_key!r}]: expected a floating scalar per step, got shape {rspec.shape}")
    return num_envs, length, spec


def _leaf_at(tree, path):
    """The subtree of `tree` at a key path, or None."""
    for k in path:
        try:
            tree = tree[k.key if hasattr(k, "key") else k.idx if hasattr(k, "idx") else k.name]
        except (KeyError, IndexError, TypeError):
            return None
    return tree


def final_obs_not_step(obs_spec, obs_key: str, final_obs) -> None:
    """TypeError for a whole step (a dict with an `obs_key` field) passed as a trajectory buffer's `final_obs`."""
    if isinstance(final_obs, Mapping) and obs_key in final_obs and not (isinstance(obs_spec, Mapping) and obs_key in obs_spec):
        raise TypeError(f"final_obs: expected the observation only, shaped like the step's {obs_key!r} field, not the "
                        f"whole step (got a dict with the fields {sorted(final_obs, key=str)}); pass its {obs_key!r} "
                        f"field alone")


def trajectory_add(spec, obs_key: str, num_envs: int, length: int, step, terminated, truncated, final_obs):
    """Check a trajectory buffer's `add` against the step `spec` (`TrajectoryBuffer.add`'s errors); returns `(step,
    terminated, truncated, final_obs)` with leaves `[num_envs, t, ...]` (None stays None)."""
    from jaxbuffers import _ring  # the ring's own fit check

    if not isinstance(step, Mapping):
        raise TypeError(f"step: expected a dict like the example step, got {type(step).__name__}")
    step = dict(step)
    # One step [num_envs, ...] or a chunk [num_envs, t, ...]: the rank of most leaves says (a tie: `terminated`'s).
    specs = jax.tree_util.tree_flatten_with_path(spec)[0]
    extra = [getattr(_leaf_at(step, p), "ndim", -1) - len(s.shape) for p, s in specs]
    one, two = extra.count(1), extra.count(2)
    nd = 2 if two > one or (two == one and getattr(terminated, "ndim", 1) == 2) else 1
    lead = check_batch(spec, step, nd, "step", ("num_envs", "t"))
    if lead[0] != num_envs:
        raise ValueError(f"step: expected leading axis num_envs={num_envs}, got {lead[0]}")
    _ring.check_batch_fits(1 if nd == 1 else lead[1], length, "step chunk (time axis)", "length")
    terminated = jnp.asarray(flag("terminated", terminated, lead, fill=False))
    if truncated is None:
        if final_obs is not None:
            raise ValueError("final_obs: given without truncated; pass truncated=... with it")
    else:
        truncated = jnp.asarray(flag("truncated", truncated, lead, fill=False))
        if final_obs is None:
            raise TypeError("final_obs: required when truncated is given: the true observation after each step, "
                            "before any auto-reset (read only where truncated); shaped like step[obs] "
                            f"(leading axes {list(lead)})")
        final_obs_not_step(spec[obs_key], obs_key, final_obs)
        got = check_batch(spec[obs_key], final_obs, nd, "final_obs", ("num_envs", "t"))
        if tuple(got) != tuple(lead):
            raise ValueError(f"final_obs: expected leading axes {list(lead)} like step (one observation per env"
                             f"{' and step' if nd == 2 else ''}), got {list(got)}")
    if nd == 1:
        ex = lambda x: None if x is None else jax.tree.map(lambda v: jnp.expand_dims(jnp.asarray(v), 1), x)  # noqa: E731
        step, terminated, truncated, final_obs = ex(step), ex(terminated), ex(truncated), ex(final_obs)
    return step, terminated, truncated, final_obs


def normalizable(name: str, dtype) -> None:
    """``ValueError`` naming ``name`` unless ``normalize_images`` (``x / 255``) applies to its ``dtype`` (uint8)."""
    if np.dtype(dtype) != np.uint8:
        raise ValueError(f"normalize_images: {name} has dtype {np.dtype(dtype)}; x / 255 is defined for uint8 images only")


def frame_leaves(obs_spec, indices, what: str, frame_stack, stack_axis: int, normalize_images: bool) -> list[tuple]:
    """`(name, shape, dtype, frame_shape, stack_axis or None)` of the observation leaves number `indices` that a
    compressed buffer stores on the host (a dtype they take; `stack_axis` holding `frame_stack` frames)."""
    flat = jax.tree_util.tree_flatten_with_path(obs_spec)[0]
    out = []
    for i in indices:
        path, s = flat[i]
        name, shape, dtype = leaf_path(what, path), tuple(s.shape), np.dtype(s.dtype)
        if dtype not in DTYPES:
            raise TypeError(f"{name}: dtype {s.dtype} cannot be stored compressed: the host stores take "
                            f"{[d.name for d in DTYPES]} (keep the leaf on the device by leaving it out of `compress`, "
                            "or store it as one of these dtypes)")
        if normalize_images:
            normalizable(name, s.dtype)
        if frame_stack is None:
            out.append((name, shape, dtype, shape, None))
            continue
        if not -len(shape) <= stack_axis < len(shape):
            raise ValueError(f"stack_axis: {stack_axis} is out of range for {name} of shape {shape}")
        ax = stack_axis % len(shape)
        if shape[ax] != frame_stack:
            raise ValueError(f"frame_stack: {name} has shape {shape}, so axis {stack_axis} holds {shape[ax]} frames, "
                             f"expected frame_stack={frame_stack}; set stack_axis to the frame axis (0 for [k, H, W], "
                             f"-1 for [H, W, k])")
        out.append((name, shape, dtype, shape[:ax] + shape[ax + 1:], ax))
    return out


def _part(x, lead: int, start: int, stop: int):
    """`x[..., start:stop, ...]` along axis `lead` (a slice: no gather)."""
    return x[(slice(None),) * lead + (slice(start, stop),)]


def _differs(a, b, lead: int):
    """bool `a.shape[:lead]`: whether `a` and `b` differ in some byte past their first `lead` axes (bit for bit)."""
    if jnp.issubdtype(a.dtype, jnp.floating):
        width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        a, b = jax.lax.bitcast_convert_type(a, width), jax.lax.bitcast_convert_type(b, width)
    d = (a ^ b).reshape(*a.shape[:lead], int(np.prod(a.shape[lead:])))
    return jnp.max(d, axis=-1, initial=0) != 0


def _padding_breaks(x, lead: int, padding: str):
    """bool `[*L]` of stacks `x` `[*L, k, *frame]` (`lead = len(L)`): the older frames are not the `padding`."""
    k = x.shape[lead]
    older, newest = _part(x, lead, 0, k - 1), _part(x, lead, k - 1, k)
    return _differs(older, jnp.zeros_like(older) if padding == "zero" else jnp.broadcast_to(newest, older.shape), lead)


def _shift_breaks(x, prev, lead: int):
    """bool `[*L]` of stacks `x`, `prev` of the steps before (`[*L, k, *frame]`): `x[j] != prev[j + 1]`, j < k - 1."""
    k = x.shape[lead]
    return _differs(_part(x, lead, 0, k - 1), _part(prev, lead, 1, k), lead)


def unrebuilt_stacks(stacks, finals, lengths, *, stack_axis: int, padding: str) -> jax.Array:
    """bool `[B, T + 1]`: where stacks `[B, T, *shape]` (`k` frames along `stack_axis`) and finals `[B, *shape]` (column
    `T`) are not what a store of each step's newest frame rebuilds: step 0's older frames its `padding` (`"reset"`:
    its newest frame repeated, or `"zero"`), later stacks the one before shifted (`x[t][j] == x[t - 1][j + 1]`)."""
    x = jnp.moveaxis(stacks, 2 + stack_axis, 2)  # [B, T, k, *frame]
    f = jnp.moveaxis(finals, 1 + stack_axis, 1)  # [B, k, *frame]
    t = x.shape[1]
    lengths = jnp.asarray(lengths, jnp.int32)
    start = _padding_breaks(x[:, 0], 1, padding)  # [B]
    shifted = _shift_breaks(x[:, 1:], x[:, :-1], 2)  # [B, T - 1]
    bad = jnp.concatenate([start[:, None], shifted], axis=1) & (jnp.arange(t) < lengths[:, None])
    last = jax.vmap(lambda s, n: s[jnp.clip(n - 1, 0, t - 1)])(x, lengths)  # [B, k, *frame]: the last step's stack
    bad_final = _shift_breaks(f, last, 1) & (lengths > 0)
    return jnp.concatenate([bad, bad_final[:, None]], axis=1)


def unrebuilt_trajectory_stacks(stacks, before, starts, finals, boot, *, stack_axis: int, padding: str) -> jax.Array:
    """`unrebuilt_stacks` of chunks `[E, t, *shape]` after the rebuilt stacks `before` (`[E, *shape]`), episodes
    starting where `starts`, `finals` compared where `boot`: bool `[2, E, t]` (row 1: finals), numpy for numpy."""
    if isinstance(stacks, np.ndarray):
        return _host_unrebuilt(stacks, before, starts, finals, boot, stack_axis=stack_axis, padding=padding)
    x = jnp.moveaxis(stacks, 2 + stack_axis, 2)  # [E, t, k, *frame]
    prev = jnp.concatenate([jnp.moveaxis(jnp.asarray(before), 1 + stack_axis, 1)[:, None], x[:, :-1]], axis=1)
    bad = jnp.where(starts, _padding_breaks(x, 2, padding), _shift_breaks(x, prev, 2))
    bad_final = jnp.zeros_like(bad)
    if finals is not None:
        bad_final = _shift_breaks(jnp.moveaxis(finals, 2 + stack_axis, 2), x, 2) & boot
    return jnp.stack([bad, bad_final])


def _host_unrebuilt(stacks, before, starts, finals, boot, *, stack_axis: int, padding: str) -> np.ndarray:
    """`unrebuilt_trajectory_stacks` on the host, one step at a time (no temporaries the size of the chunk)."""
    x, prev0, f = np.asarray(stacks), np.asarray(before), None if finals is None else np.asarray(finals)
    if stack_axis:  # the k axis after the leading axes (views)
        x, prev0 = np.moveaxis(x, 2 + stack_axis, 2), np.moveaxis(prev0, 1 + stack_axis, 1)
        f = None if f is None else np.moveaxis(f, 2 + stack_axis, 2)
    e_n, t_n, k = x.shape[:3]  # x: [E, t, k, *frame]
    starts, read = np.asarray(starts).tolist(), None if f is None else np.asarray(boot).tolist()
    bad = np.zeros((2, e_n, t_n), np.bool_)
    for e in range(e_n):
        for t in range(t_n):
            bad[0, e, t] = host_stack_breaks(x[e, t], prev0[e] if t == 0 else x[e, t - 1], starts[e][t], padding)
            bad[1, e, t] = read is not None and read[e][t] and not same_bytes(f[e, t, : k - 1], x[e, t, 1:])
    return bad


def host_stack_breaks(stack: np.ndarray, older: np.ndarray, start: bool, padding: str) -> bool:
    """`unrebuilt_trajectory_stacks` of one stack ``[k, *frame]`` on the host, ``older`` the step before's (bytes)."""
    k = stack.shape[0]
    if start:
        kept = stack[: k - 1].tobytes()
        return kept != (bytes(len(kept)) if padding == "zero" else stack[k - 1].tobytes() * (k - 1))
    return not same_bytes(stack[: k - 1], older[1:])


def same_bytes(a: np.ndarray | bytes, b: np.ndarray | bytes) -> bool:
    """Whether ``a`` and ``b`` (numpy arrays or ``bytes``) hold the same bytes (``b`` read in place if contiguous)."""
    a = a if type(a) is bytes else a.tobytes()
    size = len(b) if type(b) is bytes else b.nbytes
    if type(b) is not bytes and not b.flags.c_contiguous:
        b = b.tobytes()
    return len(a) == size and a.startswith(b)


_UNREBUILT = ("is not the stack the buffer rebuilds from each step's newest frame (with frame_stack, each stack is "
              "the previous step's shifted by one frame, padded at the episode's start as `padding` says), so its "
              "older frames would be lost (nothing was written). Store such observations whole (frame_stack=None), or "
              "give each episode the stacks a frame stacker makes from its start")


def _first(bad: np.ndarray) -> tuple[int, int] | None:
    """`(row, column)` of the first True of a 2-D bool array, or None."""
    hits = np.argwhere(bad)
    return (int(hits[0][0]), int(hits[0][1])) if hits.size else None


def unrebuilt_stack_error(bad: np.ndarray, names: list[tuple[str, str]], batched: bool) -> ValueError | None:
    """The error naming the first stack `unrebuilt_stacks` found (`bad`: `[L, B, T + 1]`, `names` per leaf), or None."""
    for (step_name, final_name), leaf in zip(names, np.asarray(bad)):
        if (hit := _first(leaf)) is None:
            continue
        e, t = hit
        episode = f"episode {e}" if batched else "the episode"
        final = t == leaf.shape[1] - 1
        what = f"{final_name}: the final observation of {episode}" if final else f"{step_name}: step {t} of {episode}"
        return ValueError(f"{what} {_UNREBUILT}")
    return None


def unrebuilt_trajectory_stack_error(bad: np.ndarray, names: list[tuple[str, str]]) -> ValueError | None:
    """The error naming the first stack `unrebuilt_trajectory_stacks` found (`bad`: `[L, 2, E, t]`), or None."""
    for (step_name, final_name), leaf in zip(names, np.asarray(bad)):
        for row, name in enumerate((step_name, final_name)):
            if (hit := _first(leaf[row])) is not None:
                return ValueError(f"{name}: {'the final observation of ' if row else ''}env {hit[0]}, step {hit[1]} of "
                                  f"the add {_UNREBUILT} (a buffer's first step, and each lane's step after an episode "
                                  f"end, starts an episode)")
    return None


def episode_lengths(name: str, x, shape: tuple, t: int):
    """Episode lengths of `shape` as int32: integers, concrete ones in `[1, t]` (traced ones are clipped by the add)."""
    if _is_int(x):
        x = np.full(shape, int(x), np.int64)
    x = index_array(x, name)
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name}: expected an integer dtype (int32), got {x.dtype}")
    if isinstance(x, jax.core.Tracer):
        return x.astype(jnp.int32)
    v = np.asarray(x)
    if np.any(v < 1) or np.any(v > t):
        raise ValueError(f"{name}: expected values in [1, {t}] (the episode's time axis holds {t} steps), got {v.tolist()}")
    return v.astype(np.int32)


def host_call(name: str, state) -> None:
    """TypeError naming `name`, a method reading host stores, when `state` holds traced arrays."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(state)):
        raise TypeError(f"{name}: reads the host stores directly, so it is called eagerly, on a concrete state "
                        f"(not inside jit, vmap or scan); inside a program use gather")


def decoded_entries(name: str, entries, frames: list) -> list:
    """`decode_entries`' entries: per leaf (`frames`: `(frame_shape, dtype)`) numpy `[n + 1, *frame_shape]`, one `n`."""
    got = list(entries) if isinstance(entries, (list, tuple)) else None
    ok = got is not None and len(got) == len(frames) and all(
        isinstance(e, np.ndarray) and e.ndim == 1 + len(shape) and e.shape[1:] == tuple(shape) and e.shape[0] >= 1
        and e.dtype == np.dtype(dtype) and e.shape[0] == got[0].shape[0] for e, (shape, dtype) in zip(got, frames))
    if not ok:
        want = [f"[n + 1, {', '.join(map(str, shape))}] {np.dtype(dtype)}" for shape, dtype in frames]
        shown = [f"{getattr(e, 'shape', None)} {getattr(e, 'dtype', type(e).__name__)}" for e in got] if got is not None else type(entries).__name__
        raise ValueError(f"{name}: expected numpy arrays {want} with one n (the buffer's decode_entries), got {shown}")
    return got
