"""The `jaxbuffers` console script: see what is in a saved buffer.

```
jaxbuffers inspect PATH [--json]                      type, configuration, sizes, bytes, fields, episodes, priorities
jaxbuffers video PATH --episode K --out ep.mp4        one episode's frames (mp4, gif, or a folder of PNG frames)
jaxbuffers sheet PATH --out sheet.png                 a contact sheet of sampled frames with episode/step labels
jaxbuffers serve PATH [--port 8765]                   a local web page to step through episodes frame by frame
```

PATH is a folder written by `jaxbuffers.save` (any buffer type), or the folder of a disk-backed buffer
(`jaxbuffers.disk`, opened read-only). Of a stacked (vmapped) buffer, `--member I` picks one member; `inspect` without
it prints a summary per member. A saved `ShardedBuffer` is read as its shards stacked, one member per shard. How steps are cut into episodes and numbered, and
how an image field and its frame stack are recognised: `jaxbuffers.cli._view` and `jaxbuffers.cli._images`. The
commands run with `jax_enable_x64` on, so a checkpoint with 64-bit fields reads as saved. The
commands need the `inspect` extra (`pip install 'jaxbuffers[inspect]'`: rich, Pillow, imageio, imageio-ffmpeg).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main", "build_parser"]

_EXTRA = ("rich", "PIL", "imageio", "imageio_ffmpeg")  # modules of the inspect extra
_EPILOG = ("PATH is a checkpoint folder written by jaxbuffers.save (any buffer type) or the folder of a disk-backed "
           "buffer (jaxbuffers.disk).")


def _path_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH")
    p.add_argument("--member", metavar="I", help="of a stacked (vmapped) buffer, the member to show: I, or I,J,... "
                   "for several stack axes; of a saved ShardedBuffer, the shard")


def _image_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", metavar="FIELD", help="the image field to show (default: the first image field, "
                   "observation fields first), e.g. obs or obs.pixels")
    p.add_argument("--stack-axis", default="auto", choices=("auto", "0", "-1", "none"),
                   help="axis of a frame stack in the image field: auto (recorded by a compressed buffer, else "
                        "guessed: a small first or last axis), 0, -1, or none (a single frame with channels)")
    p.add_argument("--layout", default="tile", choices=("tile", "newest"),
                   help="tile: a stack's frames side by side, oldest first (default); newest: its newest frame only")


def _global_args(p: argparse.ArgumentParser, default) -> argparse.ArgumentParser:
    """The options of every command, taken before or after the sub-command: `default` is their value in the main
    parser, `argparse.SUPPRESS` in each sub-command's (so that one left out there keeps the value given before)."""
    bars = p.add_mutually_exclusive_group()
    bars.add_argument("--no-progress", action="store_true", default=default, help="no progress bars")
    bars.add_argument("--progress", action="store_true", default=default,
                      help="progress bars also when stderr is not a terminal (default: only on a terminal)")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `jaxbuffers` command (one sub-command per tool). The global options
    (`--no-progress`, `--progress`) go before or after the sub-command."""
    parser = _global_args(argparse.ArgumentParser(prog="jaxbuffers", description="See what is in a saved jaxbuffers buffer.", epilog=_EPILOG), False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = [_global_args(argparse.ArgumentParser(add_help=False), argparse.SUPPRESS)]

    p = sub.add_parser("inspect", parents=common, help="type, configuration, sizes, bytes, per-field statistics, episodes, priorities",
                       description="Print what a saved buffer holds: its type and configuration, steps held, bytes on "
                                   "device, host and disk, each field's dtype, shape, min, max and mean (compressed "
                                   "fields decoded), episode counts and a length histogram, an episode buffer's meta fields, "
                                   "priority statistics, usage metrics, and a rollout's advantage and return "
                                   "statistics. Of a stacked (vmapped) buffer without --member: a summary per member.",
                       epilog=_EPILOG)
    _path_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--no-decode", action="store_true", help="skip the statistics of compressed fields (they decode "
                   "every stored observation)")

    p = sub.add_parser("video", parents=common, help="write one episode's frames as mp4, gif or PNG frames",
                       description="Write the frames of one episode exactly as stored (a compressed buffer's frame "
                                   "stacks rebuilt), with a band below each frame giving the episode, step, reward "
                                   "and end flags. .mp4 is H.264 (lossy); .gif and PNG frames are lossless for gray "
                                   "frames (a gif merges identical consecutive frames into one longer frame).",
                       epilog=_EPILOG)
    _path_args(p)
    p.add_argument("--episode", type=int, required=True, metavar="K", help="episode number (0: the first; see inspect)")
    p.add_argument("--out", required=True, help="output: a .mp4 or .gif file, or a new or empty folder (ending in /) for PNG frames, in an existing folder")
    p.add_argument("--no-overlay", action="store_true", help="frames only, no text band")
    p.add_argument("--scale", type=int, default=2, help="integer upscaling, nearest neighbour (default 2)")
    p.add_argument("--fps", type=float, default=15.0, help="frames per second (default 15)")
    _image_args(p)

    p = sub.add_parser("sheet", parents=common, help="a contact sheet of sampled frames with episode/step labels",
                       description="Draw steps uniformly without replacement (seeded) and write their frames as one "
                                   "image grid, each labelled with its episode and step.", epilog=_EPILOG)
    _path_args(p)
    p.add_argument("--out", required=True, help="output image file, in the format its extension names (.png, .jpg, .gif, ...), in an existing folder")
    p.add_argument("--count", type=int, default=16, help="frames to draw (default 16)")
    p.add_argument("--columns", type=int, default=8, help="frames per row (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    p.add_argument("--episode", type=int, metavar="K", help="draw from episode K only")
    p.add_argument("--scale", type=int, default=1, help="integer upscaling, nearest neighbour (default 1)")
    _image_args(p)

    p = sub.add_parser("serve", parents=common, help="a local web page to step through episodes frame by frame",
                       description="Serve a page on 127.0.0.1 (loopback only) with an episode list, the frame as "
                                   "stored, the step's fields beside it, and prev/next buttons (arrow keys). Stop "
                                   "with Ctrl-C.", epilog=_EPILOG)
    _path_args(p)
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765; 0: any free port)")
    p.add_argument("--scale", type=int, default=4, help="integer upscaling of frames, nearest neighbour (default 4)")
    _image_args(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `jaxbuffers` command with `argv` (default: `sys.argv[1:]`); returns the exit status (1 and no message
    when the reader of stdout closed it early, as in `jaxbuffers inspect --json PATH | head`).

    The command runs with `jax_enable_x64` on (restored on return), so a checkpoint with 64-bit fields reads as
    saved; a 32-bit checkpoint reads and shows the same either way (every leaf keeps its saved dtype)."""
    args = build_parser().parse_args(argv)
    import jax

    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        code = _run(args)
        sys.stdout.flush()  # a reader gone is found here, not in the flush at exit
        return code
    except BrokenPipeError:  # the reader of stdout closed it (`| head`): stop quietly, as rich's tables do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit writes nowhere
        return 1
    finally:
        jax.config.update("jax_enable_x64", x64)


def _run(args: argparse.Namespace) -> int:
    """`main` once its arguments are parsed."""
    from jaxbuffers.cli._commands import (
        CliError, load, member, print_stacked_summary, print_summary, stack_shape, stacked_summary, summary, write_sheet,
        write_video,
    )
    from jaxbuffers.cli._view import BufferView, ViewError

    progress = False if args.no_progress else True if args.progress else None
    loaded = None
    try:
        buffer, meta, root = load(args.path, progress=progress)
        loaded = buffer
        stack = stack_shape(meta)
        if args.command == "inspect" and stack and args.member is None:
            s = stacked_summary(buffer, meta, root, progress=progress, decode=not args.no_decode)
            if args.json:
                print(json.dumps(s, indent=1))
            else:
                print_stacked_summary(s)
            return 0
        buffer = member(buffer, stack, args.member, meta.get("sharded"))
        if args.command == "inspect":
            s = summary(buffer, meta, root, progress=progress, decode=not args.no_decode)
            if args.json:
                print(json.dumps(s, indent=1))
            else:
                print_summary(s)
        elif args.command == "video":
            out = write_video(BufferView(buffer), args.episode, args.out, image=args.image, stack_axis=args.stack_axis,
                              layout=args.layout, with_overlay=not args.no_overlay, scale=args.scale, fps=args.fps,
                              progress=progress)
            print(f"wrote episode {args.episode} to {out}")
        elif args.command == "sheet":
            out = write_sheet(BufferView(buffer), args.out, count=args.count, columns=args.columns, seed=args.seed,
                              episode=args.episode, image=args.image, stack_axis=args.stack_axis, layout=args.layout,
                              scale=args.scale)
            print(f"wrote {out}")
        elif args.command == "serve":
            from jaxbuffers.cli._images import find_image
            from jaxbuffers.cli._server import make_server

            view = BufferView(buffer)
            server = make_server(view, find_image(view, args.image, args.stack_axis, args.layout), port=args.port, scale=args.scale)
            host, port = server.server_address[:2]
            print(f"serving {root} on http://{host}:{port}/  (Ctrl-C to stop)", flush=True)
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                pass
            finally:
                server.server_close()
    except (CliError, ViewError) as e:
        print(f"jaxbuffers {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in _EXTRA:
            raise
        print(f"jaxbuffers {args.command}: error: needs {e.name.split('.')[0]!r} from the inspect extra: "
              f"pip install 'jaxbuffers[inspect]'", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 (frames of a disk folder changed after its flush: one line, not a trace)
        corrupt = _corrupt_entry(e)
        if corrupt is None:
            raise
        print(f"jaxbuffers {args.command}: error: PATH: {corrupt} (the folder's files were changed after its last "
              "jaxbuffers.disk.flush, by something other than jaxbuffers.disk: restore them from a copy)", file=sys.stderr)
        return 2
    finally:  # a disk folder's files (a compressed buffer's host memory) are released when the command ends
        if callable(getattr(loaded, "close", None)):
            loaded.close()
    return 0


def _corrupt_entry(e: BaseException) -> str | None:
    """The message of a `host_codecs.CorruptEntryError` raised as `e` or inside a JAX callback `e` wraps, else None."""
    from host_codecs import CorruptEntryError

    if isinstance(e, CorruptEntryError):
        return str(e)
    lines = [ln for ln in str(e).splitlines() if ln.startswith("CorruptEntryError: ")]
    return lines[-1].removeprefix("CorruptEntryError: ") if lines else None
