"""host_codecs: host-side codecs and a thread-safe compressed store (no JAX import).

The host half of jaxbuffers' compressed buffers, usable on its own. Importing it needs numpy
only; each codec imports its optional package when it is created (install them all with the
``codecs`` extra: ``pip install 'jaxbuffers[codecs]'``):

* :class:`NoneCodec` (``"none"``, numpy only) -- raw bytes.
* :class:`RLECodec` (``"rle"``, numba) -- run-length coding of the raw words of any numeric
  dtype, bit-exact, count width chosen per entry, runs split so counts never overflow; encode
  and decode are numba kernels parallel over the batch (``prange``, GIL released).
* :class:`IgzipCodec` (``"igzip:0".."igzip:3"``, isal) -- raw DEFLATE via ISA-L.
* :class:`ZstdCodec` (``"zstd:1".."zstd:22"``, ``"zstd:-7".."zstd:-1"``, zstandard) -- Zstandard
  frames, optionally with a :class:`ZstdDictionary` the store builds from its first entries
  (``CompressedStore(..., dictionary_bytes=16384)``).

Batches are split over a shared thread pool (:func:`set_num_threads`, or the
``HOST_CODECS_THREADS`` variable; default: the CPUs this process may use). A codec missing its package raises ImportError naming the extra.

Public API:

* :func:`get_codec` (``"igzip:1"`` -> codec object), :func:`available_codecs`,
  :func:`known_codecs`.
* :class:`CompressedStore` -- ``put(slots, arrays, codec=None)``, ``get(slots, missing=...)``,
  ``store[slots]``, accounting (``nbytes``, ``payload_nbytes``, ``compression_ratio``,
  ``stats()``). Every entry records its codec tag, dtype and shape.

Example:
  >>> import numpy as np, host_codecs
  >>> store = host_codecs.CompressedStore(8, codec="none")
  >>> store[[0, 1]] = np.arange(6, dtype=np.float32).reshape(2, 3)
  >>> store[1]
  array([3., 4., 5.], dtype=float32)
"""

from ._base import Codec, EncodedBatch, num_threads, set_num_threads
from .gzip import IgzipCodec
from .raw import NoneCodec
from .registry import available_codecs, codec_for_tag, get_codec, known_codecs
from .rle import RLECodec
from .store import CompressedStore
from .zstd import ZstdCodec, ZstdDictionary

__all__ = [
    "Codec",
    "CompressedStore",
    "EncodedBatch",
    "IgzipCodec",
    "NoneCodec",
    "RLECodec",
    "ZstdCodec",
    "ZstdDictionary",
    "available_codecs",
    "codec_for_tag",
    "get_codec",
    "known_codecs",
    "num_threads",
    "set_num_threads",
]
