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
