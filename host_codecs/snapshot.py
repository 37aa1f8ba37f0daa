"""Snapshots of a `host_codecs.CompressedStore`: its whole state as JSON-able metadata and numpy arrays, what a
checkpoint of a compressed buffer saves. `Snapshots` is the part of `CompressedStore` that takes and loads them.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ._base import ceil_align, dtype_code, dtype_from_code
from ._checksum import CHECKSUMS, XXH3
from .registry import CODECS
from .zstd import ZstdDictionary

__all__ = ["PayloadRuns", "Snapshots", "saved_checksum"]


def saved_checksum(meta: dict[str, Any], what: str) -> str:
    """The checksum an exported snapshot or a written index records (`meta["checksum"]`; XXH3 where it records none).

    Raises:
      ValueError: a name not in `host_codecs._checksum.CHECKSUMS` (the message names `what`'s `checksum`).
    """
    got = meta.get("checksum", XXH3)
    if got not in CHECKSUMS:
        raise ValueError(f"{what} checksum: expected one of {list(CHECKSUMS)}, got {got!r}")
    return got


class PayloadRuns:
    """An exported payload as the runs of arena bytes it joins, not copied; `packed()` (or `np.asarray`) joins them
    into the packed payload (shape `(nbytes,)`, dtype uint8).

    Attributes:
      runs: list of uint8 1-d arrays (views of arena chunks).
      shape, dtype, size, nbytes: those of the packed payload.
    """

    def __init__(self, runs: list[np.ndarray]):
        self.runs = runs
        self.nbytes = self.size = sum(r.shape[0] for r in runs)
        self.shape, self.dtype = (self.nbytes,), np.dtype(np.uint8)

    def packed(self) -> np.ndarray:
        """The payload as one new uint8 array."""
        return np.concatenate(self.runs) if self.runs else np.zeros(0, np.uint8)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.packed() if dtype is None else self.packed().astype(dtype)


class Snapshots:
    """`export_state` / `import_state` of `CompressedStore` (module doc)."""

    def export_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """A snapshot of the whole store as JSON-able metadata and numpy arrays (`docs/api/host_codecs.md`,
        "Snapshots"); thread-safe."""
        meta, arrays = self.export_later()()
        return meta, {**arrays, "payload": arrays["payload"].packed()}

    def export_later(self) -> Callable[[], tuple[dict[str, Any], dict[str, Any]]]:
        """Take the store's state now (the index columns copied, the arena chunks referenced, under the lock); the
        returned function gives `export_state`'s snapshot of that state later, from any thread, whatever is put
        meanwhile, its `payload` a `PayloadRuns` of the arena's bytes (no payload byte copied)."""
        with self._lock:
            cols = {k: v[: self._rows].copy() for k, v in self._index_columns().items()}
            chunks = {c: ch.data for c, ch in self._arena.chunks.items()}
            tags, layouts, d = self._tags.copy(), [[dtype_from_code(c).name, list(s)] for c, s in self._layouts], self._dictionary
            meta = {
                "config": self.config(), "layouts": layouts, "dictionary_level": None if d is None else d.level,
                "rows_seen": self._rows_seen, "trained": self._trained, "dictionary_error": self.dictionary_error,
                "compactions": self._compactions, "checksum": self.checksum,
            }

        def export() -> tuple[dict[str, Any], dict[str, Any]]:
            live = np.flatnonzero(cols["chunk"] >= 0)
            # by chunk, then offset: one key, sorted stably (in a ring the slots are nearly in this order already)
            key = cols["chunk"][live].astype(np.int64) << 32 | cols["offset"][live]
            order = np.argsort(key, kind="stable")
            live, key = live[order], key[order]
            src_chunk, src = key >> 32, key & 0xFFFFFFFF
            padded = ceil_align(cols["length"][live].astype(np.int64))
            dst = np.zeros(live.size, np.int64)
            np.cumsum(padded[:-1], out=dst[1:])
            # one run per stretch of payloads that lie back to back in one chunk
            breaks = np.flatnonzero((np.diff(src_chunk) != 0) | (np.diff(src) != padded[:-1])) + 1
            runs = [chunks[int(src_chunk[a])][src[a] : src[a] + int(dst[b - 1] + padded[b - 1] - dst[a])]
                    for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), live.size])] if live.size else []
            chunk, offset = cols["chunk"].copy(), cols["offset"].copy()  # the taken columns stay as taken
            chunk[live], offset[live] = 0, dst
            arrays = {**cols, "chunk": chunk, "offset": offset, "payload": PayloadRuns(runs), "tags": tags,
                      "dictionary": np.frombuffer(d.data, np.uint8).copy() if d is not None else np.zeros(0, np.uint8)}
            return dict(meta), arrays

        return export

    def import_state(self, meta: dict[str, Any], arrays: dict[str, Any], *, adopt: bool = False) -> None:
        """Load an `export_state` snapshot into this empty store of the same configuration.

        Everything is checked before anything changes. The index takes as many rows as the index columns have (at
        most `num_slots`). `arrays["payload"]`: the uint8 payload, or a payload source (`docs/api/host_codecs.md`).

        Args:
          meta, arrays: what `export_state` returned (or the same read back).
          adopt: the caller hands `arrays` over: index columns of `num_slots` rows and a payload of one chunk that own
            their (writable) memory are taken as they are instead of being copied.

        Raises:
          ValueError: the store holds entries, or the snapshot does not match it or is inconsistent (configuration,
            column names, shapes and dtypes, a live entry's codec tag, layout or payload range).
        """
        config = self.config()
        for k, v in config.items():
            if meta["config"].get(k) != v:
                raise ValueError(f"store config {k}: expected {v!r} (this store), got {meta['config'].get(k)!r}")
        checksum = saved_checksum(meta, "store meta")
        cols = self._index_columns()
        chunk = arrays.get("chunk")
        rows = chunk.shape[0] if isinstance(chunk, np.ndarray) and chunk.ndim == 1 and chunk.shape[0] <= self.num_slots else self.num_slots
        expected = {**{k: ((rows,), c.dtype) for k, c in cols.items()}, "tags": (self._tags.shape, self._tags.dtype)}
        for k, (shape, dtype) in expected.items():
            a = arrays.get(k)
            if a is None or a.shape != shape or a.dtype != dtype:
                got = "nothing" if a is None else f"shape {a.shape}, dtype {a.dtype}"
                raise ValueError(f"store array {k!r}: expected shape {shape}, dtype {dtype}, got {got}")
        extra = set(arrays) - set(expected) - {"payload", "dictionary"}
        if extra:
            raise ValueError(f"store arrays: unknown arrays {sorted(extra)} (this store has {sorted(expected)})")
        payload = arrays["payload"]
        source = callable(getattr(payload, "read_pieces", None))
        if not source:
            payload = np.ascontiguousarray(payload, np.uint8)
            payload = payload if payload.ndim == 1 else payload.reshape(-1)
        size = int(payload.nbytes)
        live = np.flatnonzero(arrays["chunk"] >= 0)
        # by offset, an empty payload before the one starting where it does (the order `export` packs them in)
        live = live[np.lexsort((arrays["length"][live] > 0, arrays["offset"][live]))]
        off, length = arrays["offset"][live].astype(np.int64), arrays["length"][live].astype(np.int64)
        ends = off + ceil_align(length)
        if (ends[-1] if live.size else 0) != size or (live.size and (off[0] != 0 or np.any(off[1:] != ends[:-1]))):
            raise ValueError(f"store array 'offset': live payloads must be packed back to back over the {size} payload bytes")
        known = np.isin(arrays["codec"][live], [c.tag for c in CODECS.values()])
        layouts = [(dtype_code(np.dtype(dt), field="layouts"), tuple(int(x) for x in shp)) for dt, shp in meta["layouts"]]
        if not known.all() or (live.size and int(arrays["layout"][live].max()) >= len(layouts)):
            raise ValueError("store arrays 'codec' / 'layout': a live entry has an unknown codec tag or layout id")
        level, dictionary = meta.get("dictionary_level"), arrays.get("dictionary")
        if (self._chunk >= 0).any() or self._layouts:
            raise ValueError("import_state: expected an empty store, this one holds entries")
        cuts = self._arena.cuts(off, length)
        pieces = None
        if source:
            pieces = [np.empty(n, np.uint8) for n in np.diff(cuts, prepend=0).tolist()]
            payload.read_pieces(pieces)
        elif adopt and cuts.size == 1 and payload.base is None:
            pieces = [payload]
        with self._lock:
            if (self._chunk >= 0).any() or self._layouts:
                raise ValueError("import_state: expected an empty store, this one holds entries")
            for code, shape in layouts:
                self._layout_id(code, shape)
            self._load_index({k: arrays[k] for k in cols}, rows, adopt)
            if live.size:
                at = self._arena.take(pieces, off, length) if pieces is not None else self._arena.place(payload, off, length)
                self._chunk[live], self._offset[live] = at
            self._tags[...] = arrays["tags"]
            self._dictionary = None if level is None else ZstdDictionary(dictionary.tobytes(), level)
            self._rows_seen, self._trained = int(meta["rows_seen"]), bool(meta["trained"])
            self.dictionary_error, self._compactions = meta["dictionary_error"], int(meta["compactions"])
            self.checksum = checksum
