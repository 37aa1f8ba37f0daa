"""`jaxbuffers.compressed.trajectory_slots.chunk_frames`: the host (numpy) and device (jax.numpy) placements agree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbuffers.compressed.trajectory_slots import chunk_frames


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_truncated", [False, True])
def test_numpy_and_jax_placements_are_equal(seed, with_truncated):
    rng = np.random.default_rng(seed)
    e, t = int(rng.integers(1, 4)), int(rng.integers(1, 9))
    k, kk, fcap = int(rng.integers(1, 5)), int(rng.integers(1, 9)), int(rng.integers(1, 6))
    ring = 10 + k - 1 + kk - 1
    term = rng.random((e, t)) < 0.3
    trunc = (rng.random((e, t)) < 0.3) if with_truncated else None
    cursors = (np.int32(rng.integers(0, ring)), rng.integers(0, k, e).astype(np.int32), rng.integers(0, kk, e).astype(np.int32),
               rng.integers(0, fcap, e).astype(np.int32))
    sizes = dict(ring=ring, frame_stack=k, keyframe_interval=kk, final_capacity=fcap)
    host = chunk_frames(np, term, trunc, *cursors, **sizes)
    dev = jax.jit(lambda *a: chunk_frames(jnp, *a, **sizes))(term, trunc, *cursors)
    for name, h, d in zip(host._fields, host, dev):
        assert (h is None) == (d is None), name
        if h is not None:
            assert np.asarray(h).dtype == np.asarray(d).dtype, name
            np.testing.assert_array_equal(h, d, err_msg=name)
