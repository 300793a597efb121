"""The pool's integrity check fails on every kind of corruption it claims to catch.

A cache in a busy state (a published tree with a shared prefix, one request reading that
prefix mid-decode, one mid-prefill) passes; each test then corrupts one thing in a copy of it
(a request record, a refcount, a tree segment, a counter, the free list, the arena) and the
check must raise PoolError. A check that cannot fail would pass every one of these copies.
"""

import copy

import numpy as np
import pytest

from tangram_sglang.pool import PoolError, PoolSpec, RaggedKVCache

from pool_driver import ServedDecode, finish

BETA = np.array([[0.5, 0.25], [1.0, 0.75]])


def _busy_cache() -> RaggedKVCache:
    spec = PoolSpec(num_layers=2, num_groups=2, heads_per_group=1, head_dim=2, page_size=4, num_pages=96)
    c = RaggedKVCache(spec, BETA)
    c.admit("old", chunk_tokens=[8, 8], decode_tokens=2)
    c.prefill_chunk("old", 8)
    c.prefill_chunk("old", 8)
    dec = ServedDecode(c)
    dec.step(["old"])
    chain = finish(c, "old")                                 # the tree holds its chunks and tail
    c.admit("reader", chunk_tokens=[8], decode_tokens=4, prefix=chain[:2])   # reads the prefix in place
    c.prefill_chunk("reader", 8)
    c.publish("reader")
    dec.step(["reader"])
    c.admit("filling", chunk_tokens=[8, 8], decode_tokens=2)  # one chunk of two done
    c.prefill_chunk("filling", 8)
    c.check_integrity()
    return c


@pytest.fixture(scope="module")
def busy():
    return _busy_cache()


def _corrupt(busy, change):
    c = copy.deepcopy(busy)
    c.check_integrity()                 # the copy itself is sound
    change(c)
    return c


def _page_of(c, rid, v=0, col=0):
    return int(c.requests[rid].pages.pages[v, col])


def _other_free_page(c):
    return int(c.pool.free_ids()[0])


CORRUPTIONS = {
    # request records
    "a request's page replaced by a free page": lambda c: c.requests["filling"].pages.pages.__setitem__(
        (0, 0), _other_free_page(c)),
    "a request's page replaced by another request's": lambda c: c.requests["filling"].pages.pages.__setitem__(
        (0, 0), _page_of(c, "reader", 0, c.requests["reader"].pages.npages[0] - 1)),
    "a request's slot count past its pages": lambda c: _add_slots(c.requests["filling"].pages, v=2, n=4),
    "a request's reservation grown": lambda c: c.requests["filling"].__setattr__(
        "reserved_left", c.requests["filling"].reserved_left + 1),
    "a request's taken count shrunk": lambda c: c.requests["filling"].__setattr__(
        "taken", c.requests["filling"].taken - 1),
    "a request forgotten without its release": lambda c: c.requests.pop("filling"),
    # page refcounts and the free list
    "one refcount too high": lambda c: np.add.at(c.pool.refcount, _page_of(c, "reader"), 1),
    "one refcount too low": lambda c: c.pool.refcount.__setitem__(_page_of(c, "filling"), 0),
    "a held page pushed on the free list": lambda c: _push_free(c, _page_of(c, "filling")),
    "the pool's reservation count off": lambda c: setattr(c.pool, "reserved", c.pool.reserved + 1),
    # tree segments and the store's counters
    "a segment's page replaced by a free page": lambda c: _segment(c).page_ids.__setitem__(0, _other_free_page(c)),
    "a segment's page replaced by a request's writable page": lambda c: _segment(c).page_ids.__setitem__(
        0, _page_of(c, "filling")),
    "a segment dropped without its references": lambda c: c.store.segments.pop(next(iter(c.store.segments))),
    "the store's page-held counter off": lambda c: setattr(c.store, "pages_held", c.store.pages_held + 1),
    # page claims and the arena
    "a writable page not claimed": lambda c: c.pool.fill.__setitem__(_page_of(c, "filling"), 1),
    "two requests on one arena slot": lambda c: setattr(c.requests["filling"].pages, "slot",
                                                        c.requests["reader"].pages.slot),
    "a live request's arena slot marked free": lambda c: c.arena.free_slots.append(c.requests["reader"].pages.slot),
    "a page id past a live request's pages": lambda c: c.arena.pages.__setitem__(
        (c.requests["filling"].pages.slot, 0, int(c.requests["filling"].pages.npages[0])), _other_free_page(c)),
    "a page id left in a free arena slot": lambda c: c.arena.pages.__setitem__(
        (c.arena.free_slots[0], 1, 0), _other_free_page(c)),
}


def _add_slots(pages, v, n):
    lens = pages.lens.copy()
    lens[v] += n                        # a whole page (P = 4) more than its pages hold
    pages.lens = lens


def _push_free(c, page):
    pool = c.pool
    pool._free[pool._num_free] = page
    pool._num_free += 1


def _segment(c):
    return next(seg for seg in c.store.segments.values() if (seg.page_ids >= 0).any())


def test_the_busy_cache_passes(busy):
    busy.check_integrity()
    u = busy.usage()
    assert u.held_by_tree > 0 and u.held_by_requests_only > 0 and u.reserved > 0


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_each_corruption_fails_the_check(busy, name):
    c = _corrupt(busy, CORRUPTIONS[name])
    with pytest.raises(PoolError):
        c.check_integrity()
