"""TreeStore: all the radix tree (sglang/radix.py) may see of the serving state.

The tree links pool segments into SGLang's radix structure. It needs the segments (look up,
split, drop), each request's publication (the segments finished since the tree last linked it,
and where its chain ends), how many pages are free after its evictions, and a way to say a
request left; for sliding-window layers, where a match may end and a way to drop the window
pages of a segment no match will end at; with a host tier (serving/host_tier.py), moving a segment
to the host and back; and the chunk rule (``cut``: which cached segments a sequence may reuse).
Nothing else of the pool or the serving state reaches it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tangram_sglang.pool import RaggedKVCache
from tangram_sglang.pool.host_pages import HostSegment
from tangram_sglang.pool.records import Publication
from tangram_sglang.pool.segments import Segment


class TreeStore:
    def __init__(self, cache: RaggedKVCache, counters, release: Callable[[str], None], host=None,
                 cut: Callable | None = None, data=None):
        self._cache, self._counters, self._release = cache, counters, release
        self._host = host   # HostTier, or None: no host tier
        self.cut = cut      # tokens -> method.chunks.Cut: the chunk rule of the served context
        self._data = data   # KVPageData: the page contents (adopt_boundary)

    # -- publication ------------------------------------------------------------------------------
    def publish(self, rid: str, include_tail: bool) -> tuple[list[Segment], Publication] | None:
        """The request's segments finished since the tree last linked it (with include_tail, its
        generated tokens too) and its Publication, whose node / tokens / detached still say where
        its tree chain ended before them: the tree links the segments there and records the new
        end with ``Publication.link``. None for a request the pool does not hold."""
        req = self._cache.requests.get(rid)
        if req is None:
            return None
        return self._cache.publish(rid, include_tail=include_tail), req.published

    def left(self, rid: str, *, retracted: bool) -> None:
        """The request left SGLang (finished, aborted, or retracted for lack of decode pages)."""
        if retracted:
            self._counters.retracted += 1
        self._release(rid)

    def adopt_boundary(self, parent: Segment, seg: Segment) -> None:
        """``seg`` is linked under ``parent``: where its first page column is the column ``parent`` ends in
        (not page-aligned) but another page (a request that computed its own copy of ``parent``, a twin,
        or copied a cached partial page), overwrite that page's leading slots with ``parent``'s, so a
        reader of the chain reads the tree's copy of ``parent`` throughout."""
        P = self._cache.spec.page_size
        lead = seg.start_slots % P
        if self._data is None or not np.any(lead) or not np.array_equal(seg.start_slots, parent.end_slots):
            return
        last = np.cumsum(parent.page_counts) - 1
        first = np.cumsum(seg.page_counts) - seg.page_counts
        rows = np.flatnonzero((lead > 0) & (parent.page_counts > 0) & (seg.page_counts > 0))
        src, dst = parent.page_ids[last[rows]].astype(np.int64), seg.page_ids[first[rows]].astype(np.int64)
        moved = src != dst
        if not moved.any():
            return
        src, dst, n = src[moved], dst[moved], lead[rows][moved]
        offs = np.arange(P)[None, :]
        keep = offs < n[:, None]
        k, v = self._data.read((src[:, None] * P + offs)[keep])
        self._data.write((dst[:, None] * P + offs)[keep], k, v)

    # -- segments ---------------------------------------------------------------------------------
    def segment(self, seg_id: int) -> Segment:
        return self._cache.store.get(seg_id)

    def segment_ids(self) -> set[int]:
        return set(self._cache.store.segments)

    def split(self, seg_id: int, num_tokens: int) -> tuple[Segment, Segment]:
        """Split an uncompressed segment after num_tokens tokens: (upper part, lower part)."""
        return self._cache.store.split(seg_id, num_tokens)

    def drop(self, seg_id: int, *, evicted: str | None = None) -> None:
        """Drop a segment's page references: evicted from the tree (``evicted``: why, as in
        PoolCounters.evicted_tokens_<why>), or never linked into it."""
        tokens = self._cache.store.get(seg_id).num_tokens
        self._cache.evict(seg_id)
        if evicted:
            self._counters.evicted_segments += 1
            self.count(f"evicted_tokens_{evicted}", tokens)

    # -- the host tier --------------------------------------------------------------------------------
    @property
    def has_host(self) -> bool:
        return self._host is not None

    @property
    def host_free_pages(self) -> int:
        return self._host.pages.num_free if self._host is not None else 0

    @property
    def host_total_pages(self) -> int:
        return self._host.pages.num_pages if self._host is not None else 0

    def offload(self, seg_id: int, reason: str) -> HostSegment | None:
        """Move a segment to host pages (its device pages dropped); None (nothing changed) when the
        host has no room for it. Counted in offloaded_tokens (and offloaded_tokens_<reason>)."""
        seg = self._cache.store.get(seg_id)
        hseg = self._host.offload(seg)
        if hseg is None:
            return None
        self._cache.evict(seg_id)
        self.count("offloaded_segments")
        self.count("offloaded_tokens", seg.num_tokens)
        return hseg

    def load(self, hseg: HostSegment) -> Segment | None:
        """Bring a host segment back into fresh device pages (host pages released); None (nothing
        changed) when the pool lacks hseg.num_pages available pages."""
        seg = self._host.load(hseg, self._cache)
        if seg is not None:
            self.count("loaded_segments")
            self.count("loaded_tokens", seg.num_tokens)
        return seg

    def drop_host(self, hseg: HostSegment, *, evicted: bool = True) -> None:
        """Release a host segment's pages (evicted: dropped from the host tier for room, counted)."""
        self._host.pages.release(hseg)
        if evicted:
            self.count("host_evicted_tokens", hseg.num_tokens)

    def split_host(self, hseg: HostSegment, num_tokens: int) -> tuple[HostSegment, HostSegment]:
        return self._host.pages.split(hseg, num_tokens, self._cache.spec.page_size)

    def check_host(self, held: list[HostSegment]) -> None:
        if self._host is not None:
            self._host.pages.check_integrity(held)
        elif held:
            raise AssertionError("host segments in the tree without a host tier")

    @property
    def tree_pages(self) -> int:
        """Pages some segment holds: a bound on what any eviction can free (O(1))."""
        return self._cache.store.pages_held

    def freeable_pages(self, unlocked: list[int], locked: list[int]) -> int:
        """Pages evicting every unlocked segment would free; with sliding-window layers, also those
        locked segments' window columns could (an upper bound: some of those stay)."""
        if not self.has_windows:
            return self._cache.store.freeable(unlocked)
        return self._cache.store.freeable(unlocked, locked, self._cache.window)

    def count(self, outcome: str, n: int = 1) -> None:
        """A tree event worth reporting (PoolCounters: publish outcomes, refused evictions)."""
        setattr(self._counters, outcome, getattr(self._counters, outcome) + n)

    # -- sliding-window layers ----------------------------------------------------------------------
    @property
    def has_windows(self) -> bool:
        return bool(self._cache.window_rows.size)

    def window_ready(self, chain: list[Segment]) -> bool:
        """Whether a match may end where the chain ends (its window pages are all held)."""
        return self._cache.window_ready(chain)

    def drop_window_columns(self, seg_id: int, later_end) -> int:
        """Give up matches ending at this segment: drop its window pages no query at or after
        slots later_end [V] reads. Returns the pages freed (counted in window_drops when it dropped any column)."""
        dropped, freed = self._cache.drop_window_columns(seg_id, later_end)
        self._counters.window_drops += dropped > 0
        return freed

    @property
    def available_pages(self) -> int:
        """Free pages not reserved by any request (what admission and decode can take)."""
        return self._cache.pool.available
