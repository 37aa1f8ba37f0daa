"""The per-slot index of a `host_codecs.CompressedStore`, grown as slots are used (`docs/api/host_codecs.md`)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["GROWTH", "MIN_ROWS", "IndexRows", "grown_rows"]

#: Factor by which a growing index (or a buffer's per-slot versions) grows at least.
GROWTH = 1.25
#: Fewest rows a growth allocates (small stores grow once).
MIN_ROWS = 256

# name -> (dtype, value of an empty row), in the order of `CompressedStore._index()`
_COLUMNS = {
    "chunk": (np.int32, -1), "offset": (np.uint32, 0), "length": (np.uint32, 0), "codec": (np.uint8, 0),
    "meta": (np.uint8, 0), "layout": (np.uint16, 0), "check": (np.uint32, 0), "base": (np.int32, -1),
    "child": (np.int32, -1),
}


def grown_rows(rows: int, need: int, limit: int) -> int:
    """Rows to grow `rows` to so that `need` fit: `min(limit, max(need, ceil(GROWTH * rows), MIN_ROWS))`, or
    `rows` when `need <= rows`."""
    return rows if need <= rows else min(limit, max(need, math.ceil(GROWTH * rows), MIN_ROWS))


class IndexRows:
    """Index columns grown as slots are used (`docs/api/host_codecs.md`, "Slot index"). The host class sets
    `num_slots` first."""

    def _new_index(self, rows: int, columns: dict[str, np.ndarray] | None = None, kept: int = 0) -> None:
        """Empty columns of `rows` rows (plus the empty row while `rows < num_slots`), the first `kept` rows copied
        from `columns`."""
        self._rows = int(rows)
        n = self._rows + (self._rows < self.num_slots)
        for name, (dtype, empty) in _COLUMNS.items():
            col = np.full(n, empty, dtype=dtype)
            if kept:
                col[:kept] = columns[name][:kept]
            setattr(self, "_" + name, col)

    def _load_index(self, columns: dict[str, np.ndarray], rows: int, adopt: bool) -> None:
        """An index of `rows` rows holding `columns` (checked: every column, its dtype, `rows` long): with `adopt` and
        no empty row to add, columns writable and owning their C-contiguous memory serve as they are, else copied."""
        if adopt and rows == self.num_slots and all(
            a.base is None and a.flags.writeable and a.flags.c_contiguous for a in (columns[n] for n in _COLUMNS)
        ):
            self._rows = int(rows)
            for name in _COLUMNS:
                setattr(self, "_" + name, columns[name])
            return
        self._new_index(rows, columns, rows)

    def _grow_index(self, need: int) -> None:
        """Grow the columns so that slot ids below `need` have rows (`grown_rows`); under the lock."""
        rows = grown_rows(self._rows, int(need), self.num_slots)
        if rows != self._rows:
            self._new_index(rows, self._index_columns(), self._rows)

    def _at(self, slots: np.ndarray) -> np.ndarray:
        """Row of each slot id (ids at or past `rows` read the empty row); under the lock."""
        return np.minimum(slots, self._rows) if self._rows < self.num_slots else slots

    def _index(self) -> tuple[np.ndarray, ...]:
        return tuple(getattr(self, "_" + name) for name in _COLUMNS)

    def _index_columns(self) -> dict[str, np.ndarray]:
        """The index columns by name (`"chunk"`, `"offset"`, ...; empty row included): what `export_state` and
        `import_state` carry."""
        return {name: getattr(self, "_" + name) for name in _COLUMNS}

    @property
    def index_rows(self) -> int:
        """Slot ids the index holds rows for (`0 <= index_rows <= num_slots`; `docs/api/host_codecs.md`)."""
        return self._rows
