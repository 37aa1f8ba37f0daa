"""host_codecs: host-side codecs and a thread-safe compressed store (no JAX import).

Importing it needs numpy only; each codec imports its optional package when it is created (the `codecs` extra). The
codecs (`"none"`, `"rle"`, `"igzip:L"`, `"zstd:L"`), the checksums, the thread pool and the public API in brief:
`docs/api/host_codecs.md`.

Example:
  >>> import numpy as np, host_codecs
  >>> store = host_codecs.CompressedStore(8, codec="none")
  >>> store[[0, 1]] = np.arange(6, dtype=np.float32).reshape(2, 3)
  >>> store[1]
  array([3., 4., 5.], dtype=float32)
"""

from ._base import DTYPES, Codec, CorruptEntryError, EncodedBatch, dtype_from_code
from ._pool import num_threads, parallel_for, set_num_threads
from .gzip import IgzipCodec
from .raw import NoneCodec
from .registry import available_codecs, codec_for_tag, get_codec, known_codecs
from .rle import RLECodec
from .store import CompressedStore
from .zstd import ZstdCodec, ZstdDictionary

__all__ = [
    "DTYPES", "Codec", "CompressedStore", "CorruptEntryError", "EncodedBatch", "IgzipCodec", "NoneCodec", "RLECodec", "ZstdCodec",
    "ZstdDictionary", "available_codecs", "codec_for_tag", "dtype_from_code", "get_codec", "known_codecs",
    "num_threads", "parallel_for", "set_num_threads",
]
