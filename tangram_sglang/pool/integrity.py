"""check_cache_integrity: every invariant of a RaggedKVCache, recomputed from scratch.

1. PagePool: free list unique and equal to the refcount-0 pages; reserved <= free.
2. Conservation: refcount of every page == references held by live requests + tree segments,
   so free + held-by-requests-only + held-by-tree == total and nothing leaks.
3. No page owned twice: no page twice in one request's lists or one segment; the pages a
   request may write (columns from its prefix's end on) belong to no other live request,
   and each of them is claimed (fill == P) so no newcomer writes into it.
4. Reservations: per request reserved_left >= 0, taken + reserved_left == plan pages while
   inside the plan and at most 1 (the next decode step's page, reserve_decode_step) past it,
   sum of reserved_left == pool.reserved; npages == ceil(lens / P).
5. Windows: a request's columns [0, dead[v]) are -1 and [dead[v], npages[v]) live, dead[v] == 0
   outside sliding-window layers; a segment's dead columns (-1) lie in window layers only.
6. Arena: every live request has its own slot of the cache's PageArena, none of them free; its
   columns past npages and every column of a free slot are -1 (new_slot does not clear them).
7. Counters: the segment store's per-page references and pages held match its segments.
"""

from __future__ import annotations

import numpy as np

from tangram_sglang.pool.request_pages import ragged_index
from tangram_sglang.pool.spec import PoolError


def _check_request(rid, req, P: int, window: np.ndarray) -> np.ndarray:
    """Checks one request (window bool [V]: sliding-window rows); returns the page ids it may write."""
    pages = req.pages
    held = pages.held()
    if np.unique(held).size != held.size:
        raise PoolError(f"request {rid!r}: a page appears twice in its page lists")
    if np.any(pages.npages != -(-pages.lens // P)):
        raise PoolError(f"request {rid!r}: npages != ceil(lens / P)")
    if np.any(req.reserved_left < 0):
        raise PoolError(f"request {rid!r}: negative reservation left")
    inside = req.taken < req.plan.pages
    if not np.array_equal((req.taken + req.reserved_left)[inside], req.plan.pages[inside]):
        raise PoolError(f"request {rid!r}: taken + reserved_left != reserved pages")
    if np.any(req.reserved_left[~inside] > 1):  # past its plan: at most the next decode step's page
        raise PoolError(f"request {rid!r}: more than one page reserved past its plan")
    rows, pos = ragged_index(pages.npages)
    if np.any((pages.pages[rows, pos] < 0) != (pos < pages.dead[rows])) or np.any(pages.dead[~window] != 0):
        raise PoolError(f"request {rid!r}: dead columns are not exactly its window columns [0, dead)")
    first = req.plan.prefix_slots // P
    counts = np.maximum(pages.npages - first, 0)
    rows, pos = ragged_index(counts)
    ids = pages.pages[rows, first[rows] + pos].astype(np.int64)
    return ids[ids >= 0]


def _check_arena_padding(arena, live_slots: list[int]) -> None:
    """Columns a slot does not hold are -1: past npages in the live slots, all of a free slot's."""
    cols = np.arange(arena.pages.shape[2])
    if live_slots:
        live = np.asarray(live_slots, np.int64)
        past = cols[None, None, :] >= arena.npages[live][:, :, None]
        if np.any(arena.pages[live][past] != -1):
            raise PoolError("a live request's page row holds a page id past its npages")
    if arena.free_slots and np.any(arena.pages[np.asarray(arena.free_slots, np.int64)] != -1):
        raise PoolError("a free arena slot still holds page ids (a new request would inherit them)")


def check_cache_integrity(cache) -> None:
    pool, P = cache.pool, cache.spec.page_size
    pool.check_integrity()
    writable, refs = [], [cache.store.held().astype(np.int64)]
    window = cache.window > 0
    for seg in cache.store.segments.values():
        live = seg.page_ids[seg.page_ids >= 0]
        if np.unique(live).size != live.size:
            raise PoolError(f"segment {seg.seg_id}: a page appears twice")
        rows, _ = ragged_index(seg.page_counts)
        if np.any((seg.page_ids < 0) & ~window[rows]):
            raise PoolError(f"segment {seg.seg_id}: a dead column outside the sliding-window layers")
    slots = [req.pages.slot for req in cache.requests.values()]
    if len(set(slots)) != len(slots) or set(slots) & set(cache.arena.free_slots):
        raise PoolError("two live requests share an arena slot, or a live request's slot is free")
    if any(req.pages.arena is not cache.arena for req in cache.requests.values()):
        raise PoolError("a request's pages live outside the cache's arena")
    _check_arena_padding(cache.arena, slots)
    reserved = 0
    for rid, req in cache.requests.items():
        writable.append(_check_request(rid, req, P, window))
        refs.append(req.pages.held().astype(np.int64))
        reserved += int(req.reserved_left.sum())
    tree_refs = np.bincount(refs[0], minlength=pool.num_pages)
    if not np.array_equal(tree_refs, cache.store.refs) or cache.store.pages_held != int((tree_refs > 0).sum()):
        raise PoolError("the segment store's page counters disagree with its segments")
    expected = np.bincount(np.concatenate(refs), minlength=pool.num_pages)
    if not np.array_equal(expected, pool.refcount):
        bad = np.flatnonzero(expected != pool.refcount)[:5]
        raise PoolError(f"refcount != references held (pages {bad.tolist()}): a leak or a double count")
    if reserved != pool.reserved:
        raise PoolError(f"requests hold {reserved} reserved pages, the pool counts {pool.reserved}")
    w = np.concatenate(writable) if writable else np.zeros(0, np.int64)
    if np.unique(w).size != w.size:
        raise PoolError("a page is writable by two live requests")
    if np.any(pool.fill[w] != P):
        raise PoolError("a page a live request writes is not claimed (fill != P)")
    # the O(1) usage counters against the references counted here: free + requests only + tree == total
    tree_held = tree_refs > 0
    counted = dict(free=int((expected == 0).sum()), held_by_requests_only=int(((expected > 0) & ~tree_held).sum()),
                   held_by_tree=int(tree_held.sum()))
    usage = cache.usage()
    if {k: getattr(usage, k) for k in counted} != counted or usage.total != pool.num_pages:
        raise PoolError(f"usage counters {usage} disagree with the references held {counted}")
