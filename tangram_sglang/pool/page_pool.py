"""PagePool: one free list of page ids for every virtual layer, page refcounts, reservation.

Integers only (numpy); the page data lives in page_data.KVPageData.

State:
  free stack   ``_free[:num_free]`` (int32), pop from the end.
  refcount     int32 [num_pages]: how many holders (requests, tree segments)
               reference a page; 0 exactly for free pages.
  reserved     pages promised to admitted requests but not yet taken; the
               pool never hands them to anyone else:  available = free - reserved.
  fill         int32 [num_pages]: high-water mark of slots written or claimed
               in the page. A fresh page is claimed whole (P) by its taker; a
               request may write into a shared partial page in place only if
               fill equals the slots its prefix has there (nobody wrote past
               them), and then claims it (P). Reset to 0 when freed.

Worked example (4 pages): take(2) -> [0, 1] (refcount [1, 1, 0, 0]);
incref([1]) -> [1, 2, 0, 0]; decref([0, 1]) -> page 0 freed, [0, 1, 0, 0].
"""

from __future__ import annotations

import numpy as np

from tangram_sglang.pool.spec import PoolError


class PagePool:
    def __init__(self, num_pages: int, page_size: int = 1):
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_pages = int(num_pages)
        self.page_size = int(page_size)
        self._free = np.arange(num_pages - 1, -1, -1, dtype=np.int32)
        self._num_free = self.num_pages
        self.refcount = np.zeros(num_pages, dtype=np.int32)
        self.fill = np.zeros(num_pages, dtype=np.int32)
        self.reserved = 0

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def available(self) -> int:
        """Free pages not promised to any admitted request."""
        return self._num_free - self.reserved

    def free_ids(self) -> np.ndarray:
        return self._free[: self._num_free].copy()

    def reserve(self, n: int) -> bool:
        """Promise n pages; False (nothing changes) when fewer are available."""
        if n < 0:
            raise ValueError(f"cannot reserve a negative number of pages ({n})")
        if n > self.available:
            return False
        self.reserved += int(n)
        return True

    def unreserve(self, n: int) -> None:
        if not 0 <= n <= self.reserved:
            raise PoolError(f"unreserve({n}) but only {self.reserved} pages are reserved")
        self.reserved -= int(n)

    def take(self, n: int, *, from_reserved: int = 0) -> np.ndarray:
        """Pop n pages (refcount 1 each); ``from_reserved`` of them come out of the reservation.

        Returns int32 [n]. Raises PoolError if the unreserved part exceeds
        ``available`` (callers check first) or from_reserved exceeds the reservation.
        """
        if not 0 <= from_reserved <= min(n, self.reserved):
            raise PoolError(f"take({n}, from_reserved={from_reserved}) with {self.reserved} reserved")
        if n - from_reserved > self.available:
            raise PoolError(f"take({n}): only {self.available} unreserved free pages")
        self.reserved -= from_reserved
        top = self._num_free
        ids = self._free[top - n : top][::-1].copy()
        self._num_free = top - n
        at = ids.astype(np.intp)  # an intp index: numpy's fast path (int32 ids index 3x slower)
        self.refcount[at] = 1
        self.fill[at] = self.page_size
        return ids

    def incref(self, ids: np.ndarray) -> None:
        """One more reference on each id. Each id at most once per call (one holder's pages)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and np.any(self.refcount[ids] <= 0):
            bad = ids[self.refcount[ids] <= 0][:5].tolist()
            raise PoolError(f"incref of free pages {bad}")
        self.refcount[ids] += 1

    def decref(self, ids: np.ndarray) -> int:
        """Drop one reference per id; pages reaching 0 go back to the free list. Returns #freed.

        Each id at most once per call (one holder's pages), as SGLang's free_page_ids: no dedup.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return 0
        after = self.refcount[ids] - 1
        if np.any(after < 0):
            raise PoolError(f"double free of pages {ids[after < 0][:5].tolist()}")
        self.refcount[ids] = after
        freed = ids[after == 0].astype(np.int32)
        top = self._num_free
        self._free[top : top + freed.size] = freed
        self._num_free = top + freed.size
        self.fill[freed] = 0
        return int(freed.size)

    def check_integrity(self) -> None:
        """Free ids unique and exactly the refcount-0 pages; reservation covered by free pages."""
        free = self._free[: self._num_free]
        if np.unique(free).size != free.size:
            raise PoolError("a page appears twice in the free list")
        zero = np.flatnonzero(self.refcount == 0)
        if zero.size != free.size or not np.array_equal(zero, np.sort(free)):
            raise PoolError(f"free list ({free.size} pages) != refcount-0 pages ({zero.size})")
        if np.any(self.fill[free] != 0):
            raise PoolError("a free page has a nonzero fill mark")
        if np.any(self.refcount < 0):
            raise PoolError("negative refcount")
        if not 0 <= self.reserved <= self._num_free:
            raise PoolError(f"reserved {self.reserved} not within [0, free={self._num_free}]")
