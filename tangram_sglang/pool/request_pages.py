"""RequestPages: one request's page lists and slot counts, for all V virtual layers at once.

    pages   int32 [V, capacity]  page ids, row v valid in [:npages[v]], rest -1
    npages  int64 [V]
    lens    int64 [V]            slots written (dense: slot s -> page pages[v, s // P], offset s % P)

Invariant kept by every caller: npages == ceil(lens / P) once a write is done
(pages are appended just before the slots that need them).

Worked example, P=2, V=2: append(counts=[2, 1], ids=[7, 3, 9]) gives
pages [[7, 3], [9, -1]]; advance([3, 1]) gives lens [3, 1];
slot_locs(lens_before=[0, 0], counts=[3, 1]) -> [[14, 15, 6], [18, -1, -1]]
(slot 2 of v=0 is page 3 offset 0 -> 3*2+0 = 6).
"""

from __future__ import annotations

import numpy as np

from .spec import PoolError


def ragged_index(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For counts [V]: (row of each item, position of the item inside its row), both [sum(counts)].

    counts [2, 0, 3] -> rows [0, 0, 2, 2, 2], positions [0, 1, 0, 1, 2].
    """
    counts = np.asarray(counts, dtype=np.int64)
    rows = np.repeat(np.arange(counts.size), counts)
    starts = np.cumsum(counts) - counts
    return rows, np.arange(rows.size) - starts[rows]


class RequestPages:
    def __init__(self, num_virtual: int, page_size: int, capacity: int = 4):
        self.page_size = page_size
        self.pages = np.full((num_virtual, max(1, capacity)), -1, dtype=np.int32)
        self.npages = np.zeros(num_virtual, dtype=np.int64)
        self.lens = np.zeros(num_virtual, dtype=np.int64)

    @property
    def num_virtual(self) -> int:
        return self.npages.size

    def _grow(self, need: int) -> None:
        cap = self.pages.shape[1]
        if need <= cap:
            return
        new_cap = max(need, 2 * cap)
        grown = np.full((self.num_virtual, new_cap), -1, dtype=np.int32)
        grown[:, :cap] = self.pages
        self.pages = grown

    def append(self, counts: np.ndarray, ids: np.ndarray) -> None:
        """Append ids (ordered by v) to the page lists: counts[v] of them to row v."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.sum() != len(ids):
            raise PoolError(f"append: counts sum to {counts.sum()} but {len(ids)} page ids were given")
        self._grow(int((self.npages + counts).max(initial=0)))
        rows, pos = ragged_index(counts)
        self.pages[rows, self.npages[rows] + pos] = ids
        self.npages += counts

    def set_prefix(self, pages: np.ndarray, npages: np.ndarray, lens: np.ndarray) -> None:
        """Start from a prefix table (pages int [V, >=max(npages)], -1 padded)."""
        width = int(np.max(npages, initial=0))
        self._grow(width)
        self.pages[:, :width] = pages[:, :width]
        self.npages = np.asarray(npages, dtype=np.int64).copy()
        self.lens = np.asarray(lens, dtype=np.int64).copy()

    def pages_needed(self, new_lens: np.ndarray) -> np.ndarray:
        """Pages to append per v so slots up to new_lens fit. int64 [V]."""
        return np.maximum(0, -(-np.asarray(new_lens, np.int64) // self.page_size) - self.npages)

    def slot_locs(self, counts: np.ndarray) -> np.ndarray:
        """Flat slot index (page * P + offset) of the next counts[v] slots. int64 [V, max(counts)], -1 padded."""
        counts = np.asarray(counts, dtype=np.int64)
        width = int(counts.max(initial=0))
        s = self.lens[:, None] + np.arange(width)[None, :]
        valid = np.arange(width)[None, :] < counts[:, None]
        col = np.where(valid, s // self.page_size, 0)
        page = np.take_along_axis(self.pages, col, axis=1).astype(np.int64)
        return np.where(valid, page * self.page_size + s % self.page_size, -1)

    def advance(self, counts: np.ndarray) -> None:
        new = self.lens + np.asarray(counts, dtype=np.int64)
        if np.any(new > self.npages * self.page_size):
            raise PoolError("advance past the pages appended for this request")
        self.lens = new

    def held(self) -> np.ndarray:
        """All page ids in the lists, ordered by v. int32 [sum(npages)]."""
        rows, pos = ragged_index(self.npages)
        return self.pages[rows, pos]

    def pages_from(self, first: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Page ids of columns [first[v], stop[v]) per v: (counts [V], ids ordered by v)."""
        counts = np.maximum(0, np.asarray(stop, np.int64) - np.asarray(first, np.int64))
        rows, pos = ragged_index(counts)
        return counts, self.pages[rows, np.asarray(first, np.int64)[rows] + pos]
