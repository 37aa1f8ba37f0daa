"""host_codecs._checksum: the compiled loop over a batch gives exactly the checks of one `xxhash.xxh3_64_intdigest`
call per entry, for payloads in one buffer or several chunks, past a chunk's end, in a missing chunk, and empty."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host_codecs import _checksum

pytestmark = pytest.mark.skipif(_checksum._load() is False, reason="no compiled loop here: the per-entry path is the only one")

CHUNKS = {0: np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8), 3: bytes(range(256)) * 4, 7: np.zeros(0, np.uint8)}


def per_entry(*args) -> np.ndarray:
    kernels = _checksum._kernels
    _checksum._kernels = False
    try:
        return _checksum.payload_sums(*args)
    finally:
        _checksum._kernels = kernels


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(st.tuples(st.sampled_from([0, 3, 7, 9]), st.integers(0, 5100), st.integers(0, 3000), st.integers(0, 2**31)),
                        max_size=12), big=st.booleans())
def test_compiled_loop_equals_one_call_per_entry(entries, big, monkeypatch):
    """Chunk 9 is missing (hashed as empty), offsets and lengths may run past a chunk's end (hashed as far as it goes);
    `big` splits the batch over the pool's threads."""
    monkeypatch.setattr(_checksum, "_SHARD_BYTES", 1 if big else 1 << 40)
    ids, offs, lens, slots = (np.array([e[i] for e in entries], np.int64) for i in range(4))
    got = _checksum.payload_sums(CHUNKS, ids, offs, lens, slots)
    assert got.dtype == np.uint32 and got.shape == (len(entries),)
    np.testing.assert_array_equal(got, per_entry(CHUNKS, ids, offs, lens, slots))
