"""The `inspect`, `video` and `sheet` commands, on a checkpoint folder written by `jaxbuffers.save`."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxbuffers.cli._images import (IMAGE_RULE, MAX_SHEET_PIXELS, ImageField, check_scale, contact_sheet, find_image,
                                    label_width, overlay, scaled, sheet_shape)
from jaxbuffers.cli._view import SUPPORTED_NAMES, BufferView, ViewError, is_floating, is_numeric
from jaxbuffers.compressed import ShardedHostStores

__all__ = ["load", "member", "stack_shape", "summary", "stacked_summary", "print_summary", "print_stacked_summary", "write_video", "write_sheet", "CliError"]


class CliError(ValueError):
    """A command-line argument or file that cannot be used; the message names it, what was expected and what came."""


def load(path: str | Path, progress: bool | None = None) -> tuple[Any, dict, Path]:
    """(buffer, its buffer.json description, the folder) of the checkpoint at `path` (a folder written by
    `jaxbuffers.save`, or the folder of a disk-backed buffer, `jaxbuffers.disk`, opened read-only).

    Raises:
      CliError: no such folder, not a checkpoint, a checkpoint that cannot be read, or one of a buffer type the tools
        do not read (the message names the type found and the types read).
    """
    import jaxbuffers
    from jaxbuffers import disk
    from jaxbuffers.checkpoint import CheckpointError

    root = Path(path).absolute()
    if not root.exists():
        raise CliError(f"PATH: expected a checkpoint folder written by jaxbuffers.save, got {path} (no such file or folder)")
    on_disk = root.is_dir() and (root / "disk.json").is_file()
    state = root
    if on_disk:  # the device state folder disk.json names (`jaxbuffers._disk_folder`)
        from jaxbuffers import _disk_folder

        try:
            state = _disk_folder.state_path(root, json.loads((root / "disk.json").read_text()))
        except (ValueError, OSError, AttributeError):
            state = root / "state"
    if not root.is_dir() or not ((state / "buffer.json").is_file() or (state / "manifest.json").is_file()):
        what = "a file" if not root.is_dir() else "a folder without buffer.json / manifest.json"
        raise CliError(f"PATH: expected a checkpoint folder written by jaxbuffers.save, got {path} ({what})")
    try:
        meta = json.loads((state / "buffer.json").read_text())
        name = meta.get("class") if isinstance(meta, dict) else None
        if name not in SUPPORTED_NAMES:
            raise CliError(f"PATH: {path} holds a checkpoint of a {name!r}; the tools read {', '.join(SUPPORTED_NAMES)}")
        if on_disk:
            buffer = disk.open(root, "r")
        else:  # an example holding NamedTuples or dataclasses reads with stand-ins of their recorded layout
            from jaxbuffers._checkpoint_describe import layout_target

            buffer = jaxbuffers.restore(root, layout_target(meta, root), progress=progress)
    except (CheckpointError, json.JSONDecodeError, OSError) as e:
        raise CliError(f"PATH: {path} could not be read as a jaxbuffers checkpoint: {e}") from None
    return buffer, meta, root


def stack_shape(meta: dict | None) -> tuple[int, ...]:
    """The stack (vmapped leading) shape a checkpoint recorded; `()` for a single buffer."""
    return tuple(int(n) for n in (meta or {}).get("stack_shape") or ())


def member(buffer: Any, stack: tuple[int, ...], index: str | None, sharded: dict | None = None) -> Any:
    """Member `index` (`"I"` or `"I,J,..."`, one integer per stack axis) of a stacked buffer (of a saved `ShardedBuffer`,
    `sharded` its buffer.json entry: shard `I`); the buffer itself when it is not stacked and `index` is None.

    Raises:
      CliError: a stacked buffer without `index` (it says how to pick one), an index for a buffer that is not stacked,
        or an index that is not one integer per stack axis within the stack shape.
    """
    if not stack:
        if index is not None:
            raise CliError(f"--member: expected no member index (this buffer is not stacked), got {index!r}")
        return buffer
    hint = ",".join(f"0..{n - 1}" for n in stack)
    if index is None:
        what = (f"a ShardedBuffer of {stack[0]} {type(buffer).__name__} shards (mesh axis {sharded.get('axis')!r}), saved "
                f"stacked {stack}; pick one shard" if sharded else
                f"a stacked (vmapped) {type(buffer).__name__} of stack shape {stack}; pick one buffer")
        raise CliError(f"PATH: {what} with --member {hint} (inspect without --member prints a summary per member)")
    try:
        ix = tuple(int(i) for i in str(index).split(","))
    except ValueError:
        ix = ()
    if len(ix) != len(stack) or not all(0 <= i < n for i, n in zip(ix, stack)):
        raise CliError(f"--member: expected {len(stack)} comma-separated integer(s) in {hint} (stack shape {stack}), got {index!r}")
    return _take(buffer, ix)


def _take(buffer: Any, ix: tuple[int, ...]) -> Any:
    """Member `ix` of a stacked buffer; of the compressed shards of a saved `ShardedBuffer`, with shard `ix[0]`'s own
    host store."""
    out = jax.tree.map(lambda x: x[ix], buffer)
    host = getattr(buffer, "host", None)
    return out.replace(host=host.shards[ix[0]]) if isinstance(host, ShardedHostStores) else out


def _example(tree: Any) -> Any:
    """buffer.json's encoded example as {name: "shape dtype"} (readable)."""
    if not isinstance(tree, dict) or len(tree) != 1:
        return tree
    (kind, v), = tree.items()
    if kind == "dict":
        return {k: _example(x) for k, x in v}
    if kind in ("list", "tuple"):
        return [_example(x) for x in v]
    if kind == "array":
        return f"{v[1]}{list(v[0])}"
    if kind == "node" and isinstance(v, list) and len(v) == 3:  # a NamedTuple, dataclass, ...: its type and children
        return {"type": v[0], **{str(k[-1]): _example(x) for k, x in zip(v[1], v[2]) if isinstance(k, list)}}
    return None


def _hidden(progress: bool | None) -> bool | None:
    """tqdm's `disable` for the command's `progress`: None shows a bar only when stderr is a terminal (tqdm's rule
    for `disable=None`), as `save` and `restore` do; True / False always / never."""
    return None if progress is None else not progress


def _bytes(buffer: Any, root: Path | None) -> dict[str, int]:
    """Bytes of `buffer`: `device` (its arrays), `host` (its host stores), and of its folder `root`: `disk`, the space
    its files take (allocated blocks: a never-written part of a sparse file, e.g. a slot of a `codec="none"` disk
    folder, takes none) and `disk_apparent`, the sum of their sizes."""
    from jaxbuffers import _validate

    host = int(getattr(buffer, "host_nbytes", 0) or 0)
    stats = [p.stat() for p in root.rglob("*") if p.is_file()] if root is not None else None
    return {"device": _validate.tree_nbytes(buffer), "host": host,
            "disk": None if stats is None else sum(_allocated(st) for st in stats),
            "disk_apparent": None if stats is None else sum(st.st_size for st in stats)}


def _allocated(st: os.stat_result) -> int:
    """Bytes a file takes on its file system: its 512-byte blocks (POSIX `st_blocks`), else its size."""
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else blocks * 512


def _fmt_sizes(b: dict) -> str:
    """The `bytes` of a summary in words: device, host, and disk used (with the files' apparent size where it
    differs, e.g. sparse files)."""
    disk = _fmt_bytes(b["disk"])
    if b.get("disk_apparent") is not None and _fmt_bytes(b["disk_apparent"]) != disk:
        disk += f" allocated, {_fmt_bytes(b['disk_apparent'])} apparent"
    return f"device {_fmt_bytes(b['device'])}, host {_fmt_bytes(b['host'])}, disk {disk}"


def _field_stats(view: BufferView, name: str, progress: bool | None, decode: bool = True) -> dict:
    shape, dtype = view.spec(name)
    compressed = name in view.compressed_fields
    out = {"field": name, "dtype": dtype.name, "shape": list(shape), "compressed": compressed}
    if view.num_steps == 0 or (compressed and not decode) or not is_numeric(dtype):
        return {**out, "min": None, "max": None, "mean": None, "nonfinite": None}
    lo, hi, total, count, nonfinite = np.inf, -np.inf, 0.0, 0, 0
    chunk = max(1, (64 << 20) // max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize))
    if compressed:
        chunk = min(chunk, 8192)
    with tqdm(total=view.num_steps, desc=f"{'decode' if compressed else 'read'} {name}", unit="step",
              disable=_hidden(progress), leave=False, delay=1.0) as bar:
        for a in range(0, view.num_steps, chunk):
            x = view.column(name, np.arange(a, min(a + chunk, view.num_steps)))
            bar.update(len(x))
            if is_floating(x.dtype):
                bad = ~np.isfinite(x)
                nonfinite += int(bad.sum())
                x = x[~bad]
            if x.size:
                lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
                total, count = total + float(x.sum(dtype=np.float64)), count + x.size
    stats = {"min": lo if count else None, "max": hi if count else None, "mean": total / count if count else None}
    return {**out, **stats, "nonfinite": nonfinite}


def _priorities(buffer: Any) -> dict | None:
    from jaxbuffers.compressed import CompressedPrioritisedTrajectoryBuffer
    from jaxbuffers.prioritised import PrioritisedReplayBuffer
    from jaxbuffers.prioritised_trajectory import PrioritisedTrajectoryBuffer

    p = buffer.buffer if isinstance(buffer, CompressedPrioritisedTrajectoryBuffer) else buffer
    if isinstance(p, PrioritisedReplayBuffer):
        r = p.replay
        n = int(r.num_valid)
        slots = (int(r.head) - n + np.arange(n)) % r.capacity
        pr = np.asarray(p.priorities(np.asarray(slots, np.int32))) if n else np.zeros(0)
        held = pr
    elif isinstance(p, PrioritisedTrajectoryBuffer):
        pr = np.asarray(p.priorities(np.arange(p.buffer.num_envs * p.buffer.length, dtype=np.int32)))
        held = pr[pr > 0]  # invalid windows hold no priority
    else:
        return None
    out = {"alpha": p.priority_exponent, "epsilon": p.epsilon, "max_priority": float(p.max_priority), "count": int(held.size)}
    if held.size:
        q = np.quantile(held, [0.0, 0.5, 0.99, 1.0])
        out.update(min=float(q[0]), median=float(q[1]), p99=float(q[2]), max=float(q[3]), mean=float(held.mean()),
                   effective_sample_size=float(held.sum() ** 2 / np.square(held).sum()) if held.any() else 0.0)
    return out


def _usage(buffer: Any) -> dict | None:
    """The buffer's usage metrics (`stats()`), reached through wrapped buffers; None for a buffer without them."""
    while not hasattr(buffer, "stats") and hasattr(buffer, "buffer"):
        buffer = buffer.buffer
    return buffer.stats() if hasattr(buffer, "stats") else None


def _rollout_usage(buffer: Any) -> dict | None:
    """Advantage and return statistics of a rollout's learnt steps (`jaxbuffers.rollout_stats`, no draws); None for
    other buffers."""
    from jaxbuffers.compressed import CompressedRolloutBuffer
    from jaxbuffers.rollout import RolloutBuffer
    from jaxbuffers.rollout_metrics import rollout_stats

    if not isinstance(buffer, (RolloutBuffer, CompressedRolloutBuffer)):
        return None
    inner = buffer.buffer if isinstance(buffer, CompressedRolloutBuffer) else buffer
    draws = ("never_drawn", "draws_min", "draws_max", "wasted_draws")  # no draws are saved with a rollout
    return {"has_advantages": bool(inner.has_advantages),
            **{k: v for k, v in rollout_stats(buffer).summary().items() if k not in draws}}


def _histogram(lengths: np.ndarray, bins: int = 10) -> list[dict]:
    if not len(lengths):
        return []
    lo, hi = int(lengths.min()), int(lengths.max())
    edges = np.unique(np.linspace(lo, hi + 1, min(bins, hi + 1 - lo) + 1).astype(np.int64))
    counts, _ = np.histogram(lengths, bins=edges)
    return [{"from": int(a), "to": int(b) - 1, "count": int(c)} for a, b, c in zip(edges[:-1], edges[1:], counts)]


def summary(buffer: Any, meta: dict | None = None, root: Path | None = None, progress: bool | None = None,
            decode: bool = True) -> dict:
    """Everything `jaxbuffers inspect` shows, as a JSON-ready dict (`decode=False`: no statistics of compressed
    fields, which would decode every stored observation)."""
    view = BufferView(buffer)
    eps = view.episodes
    complete = np.array([e.length for e in eps if not e.partial], np.int64)
    partial = np.array([e.length for e in eps if e.partial], np.int64)
    cfg = dict((meta or {}).get("config") or {})
    for k in ("example", "meta"):  # encoded trees of arrays: shown as {name: "dtype[shape]"}
        if k in cfg:
            cfg[k] = _example(cfg[k])
    if "compress" in cfg:  # saved as full leaf names ("['pixels']"): shown as the fields are named ("obs.pixels")
        cfg["compress"] = list(view.compressed_fields)
    image = find_image(view)
    return {
        "path": str(root) if root is not None else None,
        "type": view.kind,
        "config": cfg,
        "size": int(np.asarray(buffer.size())),
        "steps_held": view.num_steps,
        "steps_held_label": view.held_label,
        "num_added": int(buffer.num_added()) if hasattr(buffer, "num_added") else None,
        "num_added_unit": view.added_unit,
        "bytes": _bytes(buffer, root),
        "fields": [_field_stats(view, n, progress, decode) for n in view.fields],
        "image_field": None if image is None else {"field": image.name, "shape": list(image.shape), "stack_axis": image.stack_axis},
        "episodes": {
            "from": list(view.flags_from),
            "count": len(eps),
            "complete": int(len(complete)),
            "partial": int(len(partial)),
            "terminated": sum(e.terminated for e in eps),
            "truncated": sum(e.truncated for e in eps),
            "length_min": int(complete.min()) if len(complete) else None,
            "length_mean": float(complete.mean()) if len(complete) else None,
            "length_max": int(complete.max()) if len(complete) else None,
            "length_histogram": _histogram(complete),
        },
        "meta": [_meta_stats(name, values, default) for name, (values, default) in view.meta.items()],
        "priorities": _priorities(buffer),
        "metrics": _usage(buffer),
        "rollout": _rollout_usage(buffer),
    }


def stacked_summary(buffer: Any, meta: dict | None, root: Path | None, progress: bool | None = None,
                    decode: bool = True) -> dict:
    """`summary` of each member of a stacked (vmapped) buffer: `{"path", "type", "stack_shape", "sharded", "bytes",
    "members": [{"member": [i, ...], **summary of member i}]}`; of a saved `ShardedBuffer` member `i` is shard `i` and
    `sharded` is `{"axis", "num_shards"}` (else None)."""
    stack = stack_shape(meta)
    members = []
    for ix in np.ndindex(*stack):
        one = summary(_take(buffer, ix), meta, None, progress, decode)
        del one["path"], one["bytes"]
        members.append({"member": list(ix), **one})
    return {"path": str(root) if root is not None else None, "type": type(buffer).__name__, "stack_shape": list(stack),
            "sharded": (meta or {}).get("sharded"), "bytes": _bytes(buffer, root), "members": members}


_MAX_VALUES = 16  # meta fields with at most this many distinct values get their counts


def _meta_stats(name: str, values: np.ndarray, default: np.ndarray) -> dict:
    """A per-episode meta field: dtype, shape, default, and over the held episodes min / max and, for a scalar
    field of few distinct values, the count of episodes per value."""
    out = {"name": name, "dtype": values.dtype.name, "shape": list(values.shape[1:]), "default": default.tolist(),
           "min": None, "max": None, "values": None}
    if len(values) and is_numeric(values.dtype):
        out["min"], out["max"] = values.min().item(), values.max().item()
    if values.ndim == 1 and len(values):
        uniq, counts = np.unique(values, return_counts=True)
        if len(uniq) <= _MAX_VALUES:
            out["values"] = [{"value": u.item(), "episodes": int(c)} for u, c in zip(uniq, counts)]
    return out


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def print_summary(s: dict, console=None) -> None:
    """`summary` as rich tables on the terminal (default console: rich markup and emoji codes off, so field names,
    folder names and meta values from the checkpoint are printed as written, never read as markup or emoji)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(markup=False, emoji=False)
    head = Table(title=f"{s['type']}  {s['path'] or ''}", show_header=False)
    head.add_row(s.get("steps_held_label") or "steps held", str(s["steps_held"]))
    head.add_row("size()", str(s["size"]))
    if s["num_added"] is not None:
        head.add_row(f"ever added ({s.get('num_added_unit') or 'items'})", _num(s["num_added"]))
    head.add_row("bytes", _fmt_sizes(s["bytes"]))
    for k, v in s["config"].items():
        plain = k == "compress" and isinstance(v, list)  # field names, one after another
        head.add_row(k, ", ".join(v) if plain else json.dumps(v) if isinstance(v, (dict, list)) else str(v))
    console.print(head)

    fields = Table(title="fields (per step)")
    for c in ("field", "dtype", "shape", "min", "max", "mean", "nan/inf"):
        fields.add_column(c, justify="left" if c in ("field", "dtype", "shape") else "right")
    for f in s["fields"]:
        name = f["field"] + (" (compressed)" if f["compressed"] else "")
        fields.add_row(name, f["dtype"], str(f["shape"]), _num(f["min"]), _num(f["max"]), _num(f["mean"]), _num(f["nonfinite"]))
    console.print(fields)

    e = s["episodes"]
    eps = Table(title=f"episodes (from {', '.join(e['from']) or 'no flags'})", show_header=False)
    eps.add_row("count", f"{e['count']} ({e['complete']} complete, {e['partial']} partial)")
    eps.add_row("ended", f"{e['terminated']} terminated, {e['truncated']} truncated")
    eps.add_row("length (complete)", f"min {_num(e['length_min'])}, mean {_num(e['length_mean'])}, max {_num(e['length_max'])}")
    top = max([h["count"] for h in e["length_histogram"]] or [1])
    for h in e["length_histogram"]:
        bar = "#" * max(1 if h["count"] else 0, round(30 * h["count"] / top))
        eps.add_row(f"  {h['from']}-{h['to']}", f"{h['count']:>6} {bar}")
    console.print(eps)

    if s.get("meta"):
        mt = Table(title="meta fields (per episode, over the held episodes)")
        for c in ("name", "dtype", "shape", "default", "min", "max", "episodes per value"):
            mt.add_column(c)
        for m in s["meta"]:
            counts = ", ".join(f"{v['value']}: {v['episodes']}" for v in m["values"]) if m["values"] is not None else "-"
            mt.add_row(m["name"], m["dtype"], str(m["shape"]), json.dumps(m["default"]), _num(m["min"]), _num(m["max"]), counts)
        console.print(mt)

    if s["priorities"] is not None:
        pr = Table(title="priorities", show_header=False)
        for k, v in s["priorities"].items():
            pr.add_row(k, _num(v))
        console.print(pr)

    r = s.get("rollout")
    if r is not None:
        ro = Table(title="advantages and returns (learnt steps)" + ("" if r["has_advantages"] else ": compute_gae has not run"),
                   show_header=False)
        for k, v in r.items():
            if k != "has_advantages":
                ro.add_row(k, _num(v))
        console.print(ro)

    m = s.get("metrics")
    if m is not None:
        us = Table(title="usage", show_header=False)
        for k in ("inserts", "samples", "record_calls", "stale", "age_mean", "age_max"):
            us.add_row(k, _num(m[k]))
        for k, v in (m.get("sample_count") or {}).items():
            us.add_row(f"sample_count {k}", _num(v))
        top = max([h["count"] for h in m["age_histogram"]] or [1])
        for h in m["age_histogram"]:
            bar = "#" * max(1, round(30 * h["count"] / top))
            us.add_row(f"  age {h['from']}-{'' if h['to'] is None else h['to']}", f"{h['count']:>6} {bar}")
        console.print(us)


def print_stacked_summary(s: dict, console=None) -> None:
    """`stacked_summary` as one rich table, a row per member (the console as `print_summary`'s)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(markup=False, emoji=False)
    sharded = s.get("sharded")
    what = "shard" if sharded else "member"
    kind = (f"ShardedBuffer of {sharded['num_shards']} shards (mesh axis {sharded['axis']!r})" if sharded else "stacked")
    t = Table(title=f"{s['type']} {kind} {tuple(s['stack_shape'])}  {s['path'] or ''}",
              caption=f"bytes: {_fmt_sizes(s['bytes'])}; "
                      f"--member I for one {what}'s full tables")
    unit = (s["members"][0].get("num_added_unit") or "items") if s["members"] else "items"
    for c in (what, "steps held", f"ever added ({unit})", "episodes (complete)", "mean length", "samples recorded"):
        t.add_column(c, justify="right")
    for m in s["members"]:
        e, u = m["episodes"], m.get("metrics") or {}
        t.add_row(",".join(map(str, m["member"])), str(m["steps_held"]), _num(m["num_added"]),
                  f"{e['count']} ({e['complete']})", _num(e["length_mean"]), _num(u.get("samples")))
    console.print(t)


def _image(view: BufferView, image: str | None, stack_axis: str, layout: str) -> ImageField:
    field = find_image(view, image, stack_axis, layout)
    if field is None:
        shapes = {n: list(view.spec(n)[0]) for n in view.specs}
        axis = "" if stack_axis == "auto" else f" with --stack-axis {stack_axis}"
        raise CliError(f"PATH: expected a buffer with an image field ({IMAGE_RULE}){axis}, got fields {shapes}")
    return field


def _step_lines(view: BufferView, ep, t: int, pos: int) -> list[str]:
    reward = None
    for n in ("reward", "rewards"):
        if n in view.fields:
            reward = float(np.asarray(view.column(n, [pos])[0]).reshape(-1)[0])
            break
    flags = [f for f in ("terminated", "truncated", "done") if f in view.fields and bool(np.asarray(view.column(f, [pos])[0]).any())]
    line = f"ep {ep.index} step {t}" + (f"  r={reward:.3g}" if reward is not None else "")
    return [line, " ".join(flags) or "-"]


def episode_pictures(view: BufferView, k: int, field: ImageField, *, with_overlay: bool, scale: int, progress: bool | None = None) -> list[np.ndarray]:
    """The pictures of episode `k`, one per step, as `video` writes them."""
    ep = view.episode(k)
    raw = view.column(field.name, ep.positions)
    out = []
    for t, (pos, x) in enumerate(tqdm(list(zip(ep.positions, raw)), desc=f"render episode {k}", unit="frame",
                                      disable=_hidden(progress), leave=False, delay=1.0)):
        p = field.picture(x)
        out.append(overlay(p, _step_lines(view, ep, t, int(pos)), scale) if with_overlay else scaled(p, scale))
    return out


def write_video(view: BufferView, k: int, out: str | Path, *, image: str | None = None, stack_axis: str = "auto",
                layout: str = "tile", with_overlay: bool = True, scale: int = 2, fps: float = 15.0,
                progress: bool | None = None) -> Path:
    """Write episode `k` to `out`: `.mp4` (H.264 through imageio-ffmpeg), `.gif` (lossless for gray frames and up to
    256 colours; identical consecutive frames become one longer frame), or a folder (`out/` or no suffix): one
    lossless PNG per step, `frame_00000.png`, ...; the folder must be new or empty (`CliError` otherwise), so that
    it never mixes the frames of two exports. The folder `out` goes into must exist (`CliError` otherwise, before
    anything is drawn or written)."""
    out = Path(out)
    field = _image(view, image, stack_axis, layout)
    check_scale(field, scale)
    if not 0 < fps < float("inf"):
        raise CliError(f"--fps: expected a finite number > 0, got {fps}")
    suffix = out.suffix.lower()
    if suffix == ".gif" and round(1000 / fps) > _GIF_MAX_MS:
        raise CliError(f"--fps: a GIF frame lasts at most {_GIF_MAX_MS / 1000} s, so a .gif needs fps >= "
                       f"{1000 / _GIF_MAX_MS:.6g}, got {fps}")
    if suffix not in ("", ".gif", ".mp4") and not str(out).endswith("/"):
        raise CliError(f"--out: expected a .mp4 or .gif file or a folder for PNG frames, got {out}")
    if (suffix == "" or str(out).endswith("/")) and out.is_dir() and any(out.iterdir()):
        raise CliError(f"--out: the folder {out} is not empty: PNG frames are written only into a new or empty folder "
                       "(remove its files or give another folder)")
    _check_out_folder(out)
    pics = episode_pictures(view, k, field, with_overlay=with_overlay, scale=scale, progress=progress)
    with _writing(out):
        _write_frames(out, suffix, pics, fps, progress)
    return out


_GIF_MAX_MS = 655_350  # a GIF frame's delay is an unsigned 16-bit count of hundredths of a second


def _check_out_folder(out: Path) -> None:
    """CliError unless the folder `out` goes into exists: the commands make no folder but a new PNG frame folder."""
    parent = out.absolute().parent
    if not parent.is_dir():
        what = "is a file, not a folder" if parent.exists() else "does not exist"
        raise CliError(f"--out: the folder {parent} {what}; create it first (nothing was written)")


@contextlib.contextmanager
def _writing(out: Path):
    """An `OSError` while writing `out` (a folder that cannot be made, no permission, a full disk) as a `CliError`."""
    try:
        yield
    except OSError as e:
        raise CliError(f"--out: cannot write {out}: {e.strerror or e}" + (f" ({e.filename})" if e.filename else "")) from None


def _write_frames(out: Path, suffix: str, pics: list, fps: float, progress: bool | None) -> None:
    """`write_video`'s writing, by the suffix of `out`."""
    bar = lambda xs: tqdm(xs, desc=f"write {out.name}", unit="frame", disable=_hidden(progress), leave=False, delay=1.0)  # noqa: E731
    if suffix == "" or str(out).endswith("/"):
        out.mkdir(exist_ok=True)
        from PIL import Image

        for t, p in enumerate(bar(pics)):
            Image.fromarray(p).save(out / f"frame_{t:05d}.png")
    elif suffix == ".gif":
        from PIL import Image

        ims = [Image.fromarray(p) for p in pics]
        ims[0].save(out, save_all=True, append_images=ims[1:], duration=round(1000 / fps), loop=0, optimize=False)
    elif suffix == ".mp4":
        _write_mp4(out, pics, fps, bar)


_PIXEL_FORMATS = {(2, 1): "gray", (3, 1): "gray", (3, 3): "rgb24", (3, 4): "rgba"}  # (ndim, channels) -> ffmpeg's name
_MP4_CRF = 10  # H.264 constant rate factor (0 lossless .. 51 worst)


def _write_mp4(out: Path, pics: list, fps: float, bar) -> None:
    """H.264 `.mp4` of `pics` (uint8 `[H, W]` or `[H, W, C]`, padded to even sides) by the ffmpeg executable that
    imageio-ffmpeg ships, fed raw frames through a pipe.

    The encoder is started with `start_new_session` (a terminal's Ctrl-C stops this command, which then stops the
    encoder, rather than the encoder alone): that is done by C code between fork and exec, so CPython starts the
    child with vfork and no Python runs in it, and JAX's threads are never forked. (imageio's writer passes
    `preexec_fn=os.setpgrp`, which forks this multithreaded process and runs Python in the copy: the deadlock JAX
    warns of.)"""
    import subprocess
    import tempfile

    try:
        import imageio_ffmpeg
    except ImportError:
        raise CliError("--out: writing .mp4 needs imageio-ffmpeg (pip install 'jaxbuffers[inspect]'); "
                       "or write a .gif or a folder of PNG frames") from None
    h, w = pics[0].shape[:2]
    pix = _PIXEL_FORMATS.get((pics[0].ndim, pics[0].shape[2] if pics[0].ndim == 3 else 1))
    if pix is None:
        raise CliError(f"--out: an .mp4 takes gray, RGB or RGBA pictures, got pictures of shape {pics[0].shape}")
    pad = ((0, h % 2), (0, w % 2)) + (((0, 0),) if pics[0].ndim == 3 else ())
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", pix,
           "-s", f"{w + w % 2}x{h + h % 2}", "-r", repr(float(fps)), "-i", "-", "-an", "-c:v", "libx264",
           "-pix_fmt", "yuv420p", "-crf", str(_MP4_CRF), str(out.absolute())]  # absolute: never read as an option
    # ffmpeg's messages go to a file, not a pipe: a pipe read only at the end could fill and block both sides
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        try:
            try:
                for p in bar(pics):
                    proc.stdin.write(np.ascontiguousarray(np.pad(p, pad)).tobytes())
                proc.stdin.close()
            except BrokenPipeError:  # the encoder stopped: its message follows
                pass
            proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        log.seek(0)
        err = log.read().decode(errors="replace").strip()
    if proc.returncode != 0:
        raise CliError(f"--out: ffmpeg could not write {out} (exit status {proc.returncode}): {err[-500:]}")


def write_sheet(view: BufferView, out: str | Path, *, count: int = 16, columns: int = 8, seed: int = 0,
                episode: int | None = None, image: str | None = None, stack_axis: str = "auto", layout: str = "tile",
                scale: int = 1) -> Path:
    """A contact sheet of `count` steps drawn uniformly without replacement (seeded by `seed`) from the buffer (or
    from episode `episode`; all of them, with a notice on stderr, when `count` is more than it holds), in storage
    order, each labelled with its episode and step, in the image format the suffix of `out` names (`.png`, `.jpg`,
    `.gif`, ...: any that Pillow writes; `CliError` for another). `CliError`, before anything is drawn or written,
    when the folder `out` goes into does not exist, the buffer (episode) holds no steps, or the sheet would hold more
    than `MAX_SHEET_PIXELS` pixels."""
    from PIL import Image

    out = Path(out)
    fmt = Image.registered_extensions().get(out.suffix.lower())
    if fmt not in Image.SAVE:
        raise CliError(f"--out: expected a file ending in an image format's extension (.png, .jpg, .gif, ...), got {out}")
    field = _image(view, image, stack_axis, layout)
    for option, value, least in (("--count", count, 1), ("--columns", columns, 1), ("--seed", seed, 0)):
        if value < least:
            raise CliError(f"{option}: expected an integer >= {least}, got {value}")
    check_scale(field, scale)
    _check_out_folder(out)
    pool = view.episode(episode).positions if episode is not None else np.arange(view.num_steps)
    if not len(pool):
        raise CliError(f"sheet: no frames to show ({'the buffer' if episode is None else f'episode {episode}'} holds no steps)")
    if count > len(pool):
        where = "the buffer holds" if episode is None else f"episode {episode} holds"
        print(f"jaxbuffers sheet: --count {count} is more than the {len(pool)} steps {where}: drew all {len(pool)}",
              file=sys.stderr)
    n = min(count, len(pool))
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(pool, size=n, replace=False))
    eps, ts = view.step_labels()
    labels = [f"ep {eps[p]} t {ts[p]}" if eps[p] >= 0 else f"step {p}" for p in picks]
    blank = field.picture(np.zeros(field.shape, field.dtype))
    cell = overlay(blank, labels[:1], scale, label_width(labels, scale)).shape[:2]
    height, width, used = sheet_shape(cell, n, columns)
    if height * width > MAX_SHEET_PIXELS:
        raise CliError(f"--count/--columns/--scale: expected a sheet of at most {MAX_SHEET_PIXELS} pixels, got {n} frames of "
                       f"{cell[0]}x{cell[1]} in {used} columns ({height}x{width} pixels): draw fewer frames or pass a smaller --scale")
    pics = [field.picture(x) for x in view.column(field.name, picks)]
    with _writing(out):
        Image.fromarray(contact_sheet(pics, labels, columns, scale)).save(out, format=fmt)
    return out
