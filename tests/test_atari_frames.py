"""The generated Atari frames the real-data tests use: deterministic and consistent."""

import numpy as np

from atari_frames import rollout


def test_rollout_is_deterministic_and_its_indices_are_consistent():
    a, b = rollout("breakout", 300), rollout("breakout", 300)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    frames, obs_idx, next_idx = a["breakout_frames"], a["breakout_obs_idx"], a["breakout_next_idx"]
    ends = a["breakout_terminated"] | a["breakout_truncated"]
    assert frames.shape == (300 + 1 + int(ends.sum()), 84, 84) and frames.dtype == np.uint8
    assert ends.any(), "300 random Breakout steps end at least one game"
    within = ~ends[:-1]  # the step after a non-final step starts from the observation it returned
    np.testing.assert_array_equal(obs_idx[1:][within], next_idx[:-1][within])
    assert frames.std() > 0  # real pictures, not blank frames
