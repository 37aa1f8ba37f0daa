"""Observations as pictures: which field is an image, how a frame stack is laid out, overlays, contact sheets.

A field is an image when one step of it is `[H, W]`, `[H, W, C]` (C = 1 or 3), or a stack of `k <= 8` such frames
along its first or last axis (`[k, H, W]`, `[H, W, k]`, `[k, H, W, C]`), with `H, W >= 8`. A compressed buffer's
frame-stack axis is known; otherwise a 3-d field whose last axis is 1 or 3 holds channels, and a small first or last
axis is a stack (so `[84, 84, 4]` is read as a stack of 4 grayscale frames; `--stack-axis` says otherwise).

A stack is shown as its frames side by side, oldest on the left, pixel for pixel (`layout="tile"`), or as its
newest frame alone (`layout="newest"`). Float images in `[0, 1]` are shown as `round(255 x)`.
"""

from __future__ import annotations

import numpy as np

from jaxbuffers.cli._view import is_floating, is_numeric

__all__ = ["ImageField", "find_image", "overlay", "contact_sheet", "STACK_AXES", "IMAGE_RULE"]

STACK_AXES = ("auto", "0", "-1", "none")
_MAX_STACK = 8
_MIN_SIDE = 8
IMAGE_RULE = (f"[H, W], [H, W, C] with C 1 or 3, or a stack of at most {_MAX_STACK} such frames on the first or last axis; "
              f"H, W >= {_MIN_SIDE} unless --stack-axis is given")
"""Which fields `find_image` takes for images on its own (the error messages quote it)."""


class ImageField:
    """How to turn one step's value of an image field into a picture `[H, W]` (gray) or `[H, W, 3]` (RGB), uint8."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, stack_axis: int | None, layout: str = "tile"):
        self.name, self.shape, self.dtype, self.stack_axis, self.layout = name, tuple(shape), np.dtype(dtype), stack_axis, layout

    def __repr__(self) -> str:
        return f"ImageField({self.name!r}, shape={self.shape}, stack_axis={self.stack_axis}, layout={self.layout!r})"

    def picture(self, x: np.ndarray) -> np.ndarray:
        """One step's value (`self.shape`) -> uint8 picture (floats in [0, 1] scaled by 255; NaN drawn as 0)."""
        x = np.asarray(x)
        if x.dtype != np.uint8:
            x = np.clip(np.rint(np.nan_to_num(x.astype(np.float64) * 255.0, nan=0.0)), 0, 255).astype(np.uint8) \
                if is_floating(x.dtype) else np.clip(x, 0, 255).astype(np.uint8)
        if self.stack_axis is not None:
            frames = np.moveaxis(x, self.stack_axis, 0)
            x = frames[-1] if self.layout == "newest" else np.concatenate(list(frames), axis=1)
        if x.ndim == 3 and x.shape[-1] == 1:
            x = x[..., 0]
        return np.ascontiguousarray(x)

    def pictures(self, xs: np.ndarray) -> np.ndarray:
        """`[n, *shape]` -> `[n, H, W(, 3)]` uint8."""
        return np.stack([self.picture(x) for x in xs]) if len(xs) else np.zeros((0, 1, 1), np.uint8)


def _guess_stack(shape: tuple[int, ...]) -> int | None | str:
    """Stack axis of an image field of `shape` (None: a single frame), or "no" when `shape` is not an image."""
    big = lambda *d: all(s >= _MIN_SIDE for s in d)  # noqa: E731
    if len(shape) == 2 and big(*shape):
        return None
    if len(shape) == 3:
        if shape[-1] in (1, 3) and big(*shape[:2]):
            return None
        if shape[0] <= _MAX_STACK and big(*shape[1:]):
            return 0
        if shape[-1] <= _MAX_STACK and big(*shape[:2]):
            return -1
    if len(shape) == 4 and shape[0] <= _MAX_STACK and shape[-1] in (1, 3) and big(*shape[1:3]):
        return 0
    return "no"


def find_image(view, name: str | None = None, stack_axis: str = "auto", layout: str = "tile") -> ImageField | None:
    """The image field of a `BufferView`: `name` if given (ViewError if it is not an image), else the first image
    field (under the observation key first); None when there is none."""
    from jaxbuffers.cli._view import ViewError

    if stack_axis not in STACK_AXES:
        raise ViewError(f"--stack-axis: expected one of {STACK_AXES}, got {stack_axis!r}")
    known = _known_stack_axes(view)
    names = [name] if name is not None else sorted(view.specs, key=lambda n: (n.split(".")[0] != _obs_key(view), view.fields.index(n)))
    if name is not None and name not in view.specs:
        raise ViewError(f"--image: expected a step field, one of {list(view.specs)}, got {name!r}")
    for n in names:
        shape, dtype = view.spec(n)
        if not is_numeric(dtype, bools=False):
            guess = "no"
        elif stack_axis == "auto":
            guess = known[n] if n in known else _guess_stack(shape)
        else:
            guess = None if stack_axis == "none" else int(stack_axis) % max(len(shape), 1)
            frame = shape if guess is None else shape[:guess] + shape[guess + 1 :]
            if not (len(frame) == 2 or (len(frame) == 3 and frame[-1] in (1, 3))):
                guess = "no"
        if guess != "no":
            return ImageField(n, shape, dtype, guess if guess is None else guess % len(shape), layout)
        if name is not None and stack_axis != "auto":
            raise ViewError(f"--stack-axis: expected an axis that leaves frames [H, W] or [H, W, C] in {n!r} of "
                            f"shape {list(shape)}, got {stack_axis}")
        if name is not None:
            raise ViewError(f"--image: expected a field of images ({IMAGE_RULE}), got {n!r} of shape {list(shape)} {dtype}")
    return None


def _obs_key(view) -> str:
    for owner in (view.buffer, getattr(view.buffer, "trajectory", None), getattr(view.buffer, "buffer", None)):
        if owner is not None and isinstance(getattr(owner, "obs_key", None), str):
            return owner.obs_key
    return "obs"


def _known_stack_axes(view) -> dict[str, int | None]:
    """Stack axes a compressed buffer recorded for its frame-deduplicated fields (others are guessed)."""
    leaves = getattr(view.buffer, "leaves", None)
    if not view.compressed or not isinstance(leaves, tuple):
        return {}
    return {n: info.stack_axis for n, info in zip(view.compressed_fields, leaves) if info.stack_axis is not None}


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one bitmap size
        return ImageFont.load_default()


def _rgb(p: np.ndarray) -> np.ndarray:
    return np.repeat(p[..., None], 3, axis=-1) if p.ndim == 2 else p


MAX_SIDE = 4096  # pixels a side of an upscaled picture (`check_scale`): a larger one is refused, not allocated
MAX_SHEET_PIXELS = 1 << 26  # pixels of a whole contact sheet (`sheet_shape`): a larger one is refused, not allocated
_GAP = 4  # pixels between the cells of a contact sheet


def check_scale(field: "ImageField | None", scale: int) -> int:
    """`scale` if it is an int in `[1, MAX_SIDE // side]`, `side` the longer side of `field`'s picture (1 without an
    image field), else `ViewError` naming `--scale`, the range and the value (before anything is drawn)."""
    from jaxbuffers.cli._view import ViewError

    h, w = field.picture(np.zeros(field.shape, field.dtype)).shape[:2] if field is not None else (1, 1)
    most = max(1, MAX_SIDE // max(h, w))
    if not 1 <= scale <= most:
        raise ViewError(f"--scale: expected an integer in [1, {most}] (a {h}x{w} picture scaled to at most {MAX_SIDE} "
                        f"pixels a side), got {scale}")
    return scale


def scaled(p: np.ndarray, scale: int) -> np.ndarray:
    """Nearest-neighbour upscaling by an integer factor (pixels stay exact)."""
    return p if scale == 1 else np.repeat(np.repeat(p, scale, axis=0), scale, axis=1)


def _text_size(scale: int) -> int:
    return max(10, 5 * scale + 2)


def label_width(lines: list[str], scale: int = 1) -> int:
    """Pixels the widest of `lines` takes in `overlay`'s band (with its margins)."""
    font = _font(_text_size(scale))
    return max((int(np.ceil(font.getlength(line))) for line in lines), default=0) + 6


def overlay(p: np.ndarray, lines: list[str], scale: int = 1, width: int = 0) -> np.ndarray:
    """Picture `p` upscaled by `scale` with a text band below it holding `lines` (the pixels are not covered), the
    whole at least `width` pixels wide (the picture padded on the right, so a label is not cut)."""
    from PIL import Image, ImageDraw

    img = _rgb(scaled(p, scale))
    if width > img.shape[1]:
        img = np.concatenate([img, np.zeros((img.shape[0], width - img.shape[1], 3), np.uint8)], axis=1)
    size = _text_size(scale)
    band = np.zeros(((size + 2) * len(lines) + 4, img.shape[1], 3), np.uint8)
    band_img = Image.fromarray(band)
    draw = ImageDraw.Draw(band_img)
    for i, line in enumerate(lines):
        draw.text((3, 2 + i * (size + 2)), line, fill=(255, 255, 255), font=_font(size))
    return np.concatenate([img, np.asarray(band_img)], axis=0)


def sheet_shape(cell: tuple[int, int], count: int, columns: int) -> tuple[int, int, int]:
    """`(height, width, columns)` of a contact sheet of `count` cells of `cell = (height, width)` pixels in at most
    `columns` columns, with `_GAP` pixels around each cell."""
    columns = max(1, min(columns, count))
    rows = -(-count // columns)
    return rows * (cell[0] + _GAP) + _GAP, columns * (cell[1] + _GAP) + _GAP, columns


def contact_sheet(pictures: list[np.ndarray], labels: list[str], columns: int, scale: int = 1) -> np.ndarray:
    """A grid of `pictures` (same shape), each with its label beneath, RGB uint8."""
    from jaxbuffers.cli._view import ViewError

    if not pictures:
        raise ViewError("sheet: no frames to show (the buffer holds no steps)")
    width = label_width(labels, scale)
    cells = [overlay(p, [lab], scale, width) for p, lab in zip(pictures, labels)]
    h, w = cells[0].shape[:2]
    height, width, columns = sheet_shape((h, w), len(cells), columns)
    sheet = np.full((height, width, 3), 40, np.uint8)
    for i, c in enumerate(cells):
        r, q = divmod(i, columns)
        top, left = _GAP + r * (h + _GAP), _GAP + q * (w + _GAP)
        sheet[top : top + h, left : left + w] = c
    return sheet
