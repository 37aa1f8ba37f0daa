"""Episodes of frame stacks as a frame stacker makes them from each episode's start (Gymnasium's
`FrameStackObservation`): what a frame-deduplicating compressed episode buffer stores exactly."""

from __future__ import annotations

import numpy as np


def stacked_episodes(frames: np.ndarray, lengths, k: int, padding: str = "reset") -> tuple[np.ndarray, np.ndarray]:
    """`(stacks, finals)` of episodes whose frames are `frames` `[B, T + 1, *frame]` (frame `T` of a row: the newest
    frame of its final observation).

    Stack position `j` (oldest `0` to newest `k - 1`) of step `t` holds frame `t - (k - 1 - j)`; before the
    episode's start, frame 0 (`padding="reset"`) or zeros (`"zero"`). The final observation of an episode of length
    `n` stacks frames `n - k + 1, ..., n - 1` and frame `T`. Returns stacks `[B, T, k, *frame]` and finals
    `[B, k, *frame]`."""
    frames = np.asarray(frames)
    b, t = frames.shape[0], frames.shape[1] - 1
    back = (k - 1) - np.arange(k)
    rows = np.arange(b)[:, None, None]

    def gather(src: np.ndarray) -> np.ndarray:  # src int [B, P, k] -> [B, P, k, *frame]
        got = frames[rows, np.clip(src, 0, None)]
        if padding == "zero":
            got[src < 0] = 0
        return got

    stacks = gather(np.broadcast_to(np.arange(t)[:, None] - back, (b, t, k)))
    finals = gather((np.asarray(lengths).reshape(b, 1, 1) - back))[:, 0]
    finals[:, k - 1] = frames[:, t]
    return stacks, finals


def stacked_chunk(newest: np.ndarray, ends: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """`(stacks, finals)` of one trajectory add `[E, t]` whose lanes' newest frames are `newest` `[E, t, *frame]`, as a
    reset-padding frame stacker makes them: every lane starts an episode at step 0 and after each step where `ends`
    (bool `[E, t]`). Stacks `[E, t, k, *frame]`; `finals` `[E, t, k, *frame]`: each step's stack shifted by one frame,
    its newest frame reversed along the last axis standing for the observation after the step."""
    newest = np.asarray(newest)
    e, t = newest.shape[:2]
    start = np.zeros(e, np.int64)
    stacks = np.empty((e, t, k, *newest.shape[2:]), newest.dtype)
    for j in range(t):
        for i in range(k):
            stacks[:, j, i] = newest[np.arange(e), np.maximum(start, j - (k - 1 - i))]
        start = np.where(np.asarray(ends)[:, j], j + 1, start)
    finals = np.concatenate([stacks[:, :, 1:], newest[:, :, None, ..., ::-1]], axis=2)
    return stacks, finals
