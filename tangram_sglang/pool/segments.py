"""Segments: cached KV ranges the radix tree shares, holding page references.

A segment is one prefill chunk of one request (compressed: keep_count(beta_v, n)
slots per v) or a run of generated tokens (uncompressed: 1 slot per token per
v). It covers slot range [start[v], end[v]) of its chain (the path from the
tree root), i.e. chain page columns [start // P, ceil(end / P)). Consecutive
segments may share the boundary page column; when they do, the LATER segment's
page is the one a reader uses (it holds the earlier segment's tail too: either
the same page written in place, or a copy of it).

Every segment holds one reference per page (PagePool refcount), so evicting a
segment frees exactly the pages nothing else holds, and a request reading a
prefix holds its own references: eviction never pulls pages from under it.

A sliding-window layer's columns that no reader can need any more are dead: page id -1
in page_ids (the segment holds no reference on them). A segment is published without the
window columns that lie wholly before its own end's window, and the tree can drop more of
them (drop_columns) once no match may end at the segment itself.

Worked example, P=4, one v: segment A slots [0, 6) pages [5, 8]; segment B
(extends A in place) slots [6, 9) columns [1, 3) pages [8, 2]. assemble([A, B])
-> pages [5, 8, 2], lens 9. Page 8 has refcount 2 (A and B).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from tangram_sglang.pool.page_pool import PagePool
from tangram_sglang.pool.request_pages import ragged_index
from tangram_sglang.pool.spec import PoolError


@dataclass(frozen=True, kw_only=True)
class Segment:
    seg_id: int
    num_tokens: int
    compressed: bool
    start_slots: np.ndarray   # int64 [V]
    end_slots: np.ndarray     # int64 [V]
    page_counts: np.ndarray   # int64 [V]
    page_ids: np.ndarray      # int32 [sum(page_counts)], ordered by v
    protected: int = 0        # tokens every head keeps (a compressed chunk's sinks and newest: the chunk rule's)

    def first_columns(self, page_size: int) -> np.ndarray:
        return self.start_slots // page_size

    @property
    def num_pages(self) -> int:
        return int(self.page_counts.sum())


def page_columns(start: np.ndarray, end: np.ndarray, page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Chain page columns [first, stop) covering slots [start, end) per v (empty range -> none)."""
    first = start // page_size
    stop = np.where(end > start, -(-end // page_size), first)
    return first, stop


def assemble(chain: list[Segment], num_virtual: int, page_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Page table of a chain: (pages int32 [V, W] -1 padded, npages [V], lens [V])."""
    lens = np.zeros(num_virtual, dtype=np.int64)
    for seg in chain:
        if not np.array_equal(seg.start_slots, lens):
            raise PoolError(f"segment {seg.seg_id} does not start where the chain before it ends")
        lens = seg.end_slots
    npages = -(-lens // page_size)
    pages = np.full((num_virtual, max(1, int(npages.max(initial=0)))), -1, dtype=np.int32)
    for seg in chain:
        rows, pos = ragged_index(seg.page_counts)
        pages[rows, seg.first_columns(page_size)[rows] + pos] = seg.page_ids
    return pages, npages, lens.copy()


def split_parts(seg, num_tokens: int, page_size: int) -> list[tuple]:
    """The two parts of an uncompressed segment (device or host: any record with its fields) cut after
    num_tokens tokens: [(start [V], end [V], tokens, page_counts [V], page_ids)] * 2. The column holding
    the cut is in both parts (the same page id: each part takes its own reference)."""
    mid = seg.start_slots + num_tokens
    src_starts = np.cumsum(seg.page_counts) - seg.page_counts
    parts = []
    for start, end, n in ((seg.start_slots, mid, num_tokens), (mid, seg.end_slots, seg.num_tokens - num_tokens)):
        first, stop = page_columns(start, end, page_size)
        counts = stop - first
        rows, pos = ragged_index(counts)
        offset = first - seg.start_slots // page_size
        parts.append((start, end, n, counts, seg.page_ids[src_starts[rows] + offset[rows] + pos]))
    return parts


class SegmentStore:
    """The segments alive in the tree, by id; each holds references on its pages.

    refs int32 [num_pages] counts the segments holding each page and pages_held the pages
    with refs > 0, kept up to date by add/evict (O(pages of the segment)) so usage figures
    are O(1); check_integrity recomputes both."""

    def __init__(self, pool: PagePool, page_size: int):
        self.pool = pool
        self.page_size = page_size
        self.segments: dict[int, Segment] = {}
        self._ids = itertools.count()
        self.refs = np.zeros(pool.num_pages, dtype=np.int32)
        self.pages_held = 0

    def add(self, *, num_tokens: int, compressed: bool, start: np.ndarray, end: np.ndarray,
            page_counts: np.ndarray, page_ids: np.ndarray, protected: int = 0) -> Segment:
        """Register a segment over pages someone already holds; takes its own references."""
        seg = Segment(seg_id=next(self._ids), num_tokens=int(num_tokens), compressed=compressed,
                      start_slots=np.asarray(start, np.int64).copy(), end_slots=np.asarray(end, np.int64).copy(),
                      page_counts=np.asarray(page_counts, np.int64).copy(),
                      page_ids=np.asarray(page_ids, np.int32).copy(), protected=int(protected))
        live = seg.page_ids[seg.page_ids >= 0]
        self.pool.incref(live)
        self.segments[seg.seg_id] = seg
        self.refs[live] += 1  # ids are unique within a segment
        self.pages_held += int((self.refs[live] == 1).sum())
        return seg

    def get(self, seg_id: int) -> Segment:
        if seg_id not in self.segments:
            raise PoolError(f"no live segment {seg_id} (evicted or never created)")
        return self.segments[seg_id]

    def evict(self, seg_id: int) -> int:
        """Drop the segment; returns the number of pages this freed (held by nothing else)."""
        seg = self.get(seg_id)
        del self.segments[seg_id]
        return self._unref(seg.page_ids[seg.page_ids >= 0])

    def _unref(self, live: np.ndarray) -> int:
        self.refs[live] -= 1
        self.pages_held -= int((self.refs[live] == 0).sum())
        return self.pool.decref(live)

    def drop_columns(self, seg_id: int, dead: np.ndarray) -> tuple[int, int]:
        """Drop the segment's references on its columns below dead[v] (chain columns, int [V]);
        those become -1. Returns (columns dropped, pages this freed: others may hold the rest)."""
        seg = self.get(seg_id)
        rows, pos = ragged_index(seg.page_counts)
        hit = (seg.first_columns(self.page_size)[rows] + pos < np.asarray(dead, np.int64)[rows]) & (seg.page_ids >= 0)
        if not hit.any():
            return 0, 0
        live = seg.page_ids[hit].copy()
        seg.page_ids[hit] = -1  # the frozen record's array: every holder of this segment sees it
        return int(live.size), self._unref(live)

    def split(self, seg_id: int, num_tokens: int) -> tuple[Segment, Segment]:
        """Split an uncompressed segment after num_tokens tokens (for a match ending inside it).

        Compressed segments cannot be split: their slots are not token positions.
        """
        seg = self.get(seg_id)
        if seg.compressed:
            raise PoolError(f"segment {seg_id} is compressed: a match cannot end inside it")
        if not 0 < num_tokens < seg.num_tokens:
            raise PoolError(f"split of segment {seg_id} at {num_tokens}: must be in (0, {seg.num_tokens})")
        parts = [self.add(num_tokens=n, compressed=False, start=start, end=end, page_counts=counts, page_ids=ids)
                 for start, end, n, counts, ids in split_parts(seg, num_tokens, self.page_size)]
        self.evict(seg_id)
        return parts[0], parts[1]

    def freeable(self, whole: list[int], window_rows_of: list[int] = (), window: np.ndarray | None = None) -> int:
        """Pages that dropping segments ``whole`` entirely, and the sliding-window columns (rows with
        window[v] > 0) of segments ``window_rows_of``, would return to the free list: the pages every
        reference of which (pool refcount: segments and requests) is among those dropped. Nothing
        changes. O(pages of those segments)."""
        parts = [self.get(i).page_ids for i in whole]
        for i in window_rows_of:
            seg = self.get(i)
            rows, _ = ragged_index(seg.page_counts)
            parts.append(seg.page_ids[window[rows] > 0])
        if not parts:
            return 0
        ids = np.concatenate(parts)
        ids = ids[ids >= 0].astype(np.int64)
        if ids.size == 0:
            return 0
        dropped = np.bincount(ids, minlength=self.pool.num_pages)
        return int(np.count_nonzero((dropped > 0) & (dropped == self.pool.refcount)))

    def held(self) -> np.ndarray:
        """Page ids referenced by segments, one entry per reference (dead columns skipped). int32."""
        if not self.segments:
            return np.zeros(0, dtype=np.int32)
        ids = np.concatenate([s.page_ids for s in self.segments.values()])
        return ids[ids >= 0]
