"""HostPages: the compressed host tier's pages (``--tangram-host-ratio``), on integers.

When the tree evicts a segment for room on the device, it may keep it here instead: its pages,
compressed as they were, copied to host pages of the same size, and the segment's geometry kept
as a HostSegment. A later match that reaches it loads it back into fresh device pages (a copy,
not a prefill). Host pages are counted like device pages: a free list and one reference per
holder (the two parts of a split host segment share the page holding the cut).

Worked example, 4 host pages: keep a segment of 3 pages -> host pages [0, 1, 2] (refs 1 each);
split it inside column 1 -> parts [0, 1] and [1, 2] (page 1 has refs 2); release the upper part
-> page 0 free; release the lower -> all free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tangram_sglang.pool.segments import split_parts
from tangram_sglang.pool.spec import PoolError


@dataclass(frozen=True, kw_only=True)
class HostSegment:
    """A tree segment held in host pages: the device Segment's geometry, page_ids the host pages
    (int32 [sum(page_counts)], ordered by v, as Segment.page_ids)."""

    num_tokens: int
    compressed: bool
    start_slots: np.ndarray   # int64 [V]
    end_slots: np.ndarray     # int64 [V]
    page_counts: np.ndarray   # int64 [V]
    page_ids: np.ndarray      # int32 host page ids
    protected: int = 0        # as Segment.protected

    @property
    def num_pages(self) -> int:
        return int(self.page_counts.sum())


class HostPages:
    """Free list and references of num_pages host pages. take() hands out pages with one
    reference each; release() drops a segment's references and frees what reaches zero."""

    def __init__(self, num_pages: int):
        if num_pages < 1:
            raise ValueError(f"a host tier needs at least one page, got {num_pages}")
        self.num_pages = int(num_pages)
        self.refcount = np.zeros(self.num_pages, dtype=np.int32)
        self._free = np.arange(self.num_pages - 1, -1, -1, dtype=np.int32)
        self.num_free = self.num_pages

    def take(self, n: int) -> np.ndarray | None:
        """n free pages (one reference each), int32 [n]; None (nothing taken) when fewer are free."""
        if n > self.num_free:
            return None
        top = self.num_free
        ids = self._free[top - n: top][::-1].copy()
        self.num_free = top - n
        self.refcount[ids] = 1
        return ids

    def keep(self, seg, host_ids: np.ndarray) -> HostSegment:
        """The HostSegment of a device segment whose pages were copied to host_ids (taken, in its order)."""
        if host_ids.size != seg.num_pages:
            raise PoolError(f"a segment of {seg.num_pages} pages kept in {host_ids.size} host pages")
        return HostSegment(num_tokens=seg.num_tokens, compressed=seg.compressed,
                           start_slots=seg.start_slots.copy(), end_slots=seg.end_slots.copy(),
                           page_counts=seg.page_counts.copy(), page_ids=np.asarray(host_ids, np.int32).copy(),
                           protected=seg.protected)

    def release(self, hseg: HostSegment) -> int:
        """Drop the segment's references; returns the pages this freed."""
        ids = hseg.page_ids.astype(np.int64)
        after = self.refcount[ids] - 1
        if np.any(after < 0):
            raise PoolError(f"double release of host pages {ids[after < 0][:5].tolist()}")
        self.refcount[ids] = after
        freed = ids[after == 0].astype(np.int32)
        self._free[self.num_free: self.num_free + freed.size] = freed
        self.num_free += int(freed.size)
        return int(freed.size)

    def split(self, hseg: HostSegment, num_tokens: int, page_size: int) -> tuple[HostSegment, HostSegment]:
        """Split an uncompressed host segment after num_tokens tokens (a match ending inside it):
        (upper, lower), sharing the host page of the cut's column (one reference each)."""
        if hseg.compressed or not 0 < num_tokens < hseg.num_tokens:
            raise PoolError(f"host segment of {hseg.num_tokens} tokens (compressed={hseg.compressed}) "
                            f"cannot be split at {num_tokens}")
        parts = [HostSegment(num_tokens=n, compressed=False, start_slots=np.asarray(start, np.int64).copy(),
                             end_slots=np.asarray(end, np.int64).copy(), page_counts=np.asarray(counts, np.int64),
                             page_ids=np.asarray(ids, np.int32).copy())
                 for start, end, n, counts, ids in split_parts(hseg, num_tokens, page_size)]
        for part in parts:
            self.refcount[part.page_ids.astype(np.int64)] += 1
        self.release(hseg)
        return parts[0], parts[1]

    def check_integrity(self, held: list[HostSegment]) -> None:
        """Each page's references are exactly the held segments naming it; the free list is exactly
        the unreferenced pages, each once. Raises PoolError."""
        free = self._free[: self.num_free]
        if np.unique(free).size != free.size:
            raise PoolError("a host page appears twice in the free list")
        counts = np.zeros(self.num_pages, dtype=np.int64)
        for hseg in held:
            if hseg.page_ids.size != hseg.num_pages or np.unique(hseg.page_ids).size != hseg.page_ids.size:
                raise PoolError("a host segment's pages do not match its page counts")
            counts[hseg.page_ids.astype(np.int64)] += 1
        if not np.array_equal(counts, self.refcount):
            bad = np.flatnonzero(counts != self.refcount)[:5].tolist()
            raise PoolError(f"host page references differ from the segments holding them at pages {bad}")
        if not np.array_equal(np.sort(free), np.flatnonzero(self.refcount == 0)):
            raise PoolError(f"host free list ({free.size} pages) != unreferenced pages "
                            f"({int((self.refcount == 0).sum())})")
