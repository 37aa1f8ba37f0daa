"""host_codecs: host-side codecs and a thread-safe compressed store (no JAX import).

The host half of jaxbuffers' compressed buffers, usable on its own. Importing it needs numpy only; each codec
imports its optional package when it is created (install them all with the `codecs` extra:
`pip install 'jaxbuffers[codecs]'`); a codec missing its package raises ImportError naming the extra. A
`CompressedStore` checksums every entry (CRC-32: isa-l's through `isal` where installed, else `zlib`), and a read
raises `CorruptEntryError` naming the slots whose bytes changed.

* `NoneCodec` (`"none"`, numpy only): raw bytes.
* `RLECodec` (`"rle"`, numba): run-length coding of the raw words of any numeric dtype,
  bit-exact, count width chosen per entry, runs split so counts never overflow.
* `IgzipCodec` (`"igzip:0"`..`"igzip:3"`, isal): raw DEFLATE via ISA-L.
* `ZstdCodec` (`"zstd:1"`..`"zstd:22"`, `"zstd:-7"`..`"zstd:-1"`, zstandard): checksummed zstd frames, optionally
  with a `ZstdDictionary` the store builds from its first entries (`CompressedStore(..., dictionary_bytes=32768)`).

Batches are split over a shared thread pool (`set_num_threads`, or the `HOST_CODECS_THREADS`
environment variable; default: the CPUs this process may use).

Public API: `get_codec` (`"igzip:1"` -> codec object), `available_codecs`, `known_codecs`, `codec_for_tag`, and
`CompressedStore`: `put(slots, arrays, codec=None)`, `get(slots, missing=...)`, `get_many`, `store[slots]`, and its
accounting (`nbytes`, `payload_nbytes`, `compression_ratio`, `stats()`). Every entry records its codec tag, dtype
and shape.

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
