"""One prefill chunk of each of several requests, drawn in a few [B, V] array operations.

RaggedKVCache.prefill_chunk draws one request's chunk; a pass of B requests called it B times,
each call a dozen small numpy operations over V = L x G virtual layers. ``draw_chunks`` does
the same work over the batch at once: it hands out the same page ids in the same places (the
pool gives pages out in one sequence either way, in (request, v) order) and returns the same
writes, as ChunkWrites (the writes stacked, one entry per request). Window layers release
pages request by request (RaggedKVCache._trim), so a model with any keeps the per-request path.
"""

from __future__ import annotations

import numpy as np

from tangram_sglang.pool import native
from tangram_sglang.pool.records import ChunkWrite, ChunkWrites
from tangram_sglang.pool.request_pages import div_mod
from tangram_sglang.pool.spec import PoolError, PoolSpec


def chunk_pages(arena, slots: np.ndarray, lens: np.ndarray, counts: np.ndarray, page_size: int, gather: bool = True):
    """RequestPages.chunk_pages over a batch of arena slots: arena a PageArena, slots int64 [B],
    lens int32 / counts int64 [B, V] -> (pages the runs fall in int32 [B, V, W] -1 padded, first
    offset [B, V] int32, each request's own W int64 [B]); pages None without ``gather``."""
    first, offset = div_mod(lens, page_size)
    ncols = np.where(counts > 0, -(-(offset + counts) // page_size), 0)
    widths = np.maximum(1, ncols.max(axis=1, initial=0))
    width = int(widths.max(initial=1))
    if not gather:
        return None, offset, widths
    if native.enabled():
        return native.chunk_pages(arena, slots, lens, counts, page_size, width), offset, widths
    return chunk_pages_reference(arena.pages, slots, first, ncols, width), offset, widths


def chunk_pages_reference(arena_pages: np.ndarray, slots: np.ndarray, first: np.ndarray, ncols: np.ndarray,
                          width: int) -> np.ndarray:
    """The numpy form of chunk_pages' pages: the ncols [B, V] columns of each arena row (slots[b], v)
    from column first [B, V], int32 [B, V, width] -1 padded. Reads only the B x V x width entries it
    returns, through flat indices (numpy's fast path)."""
    _, V, cap = arena_pages.shape
    row = (slots[:, None] * V + np.arange(V)) * cap + first                  # [B, V] flat id of column first
    valid = np.arange(width) < ncols[..., None]
    at = np.where(valid, row[..., None] + np.arange(width), 0)
    return np.where(valid, arena_pages.reshape(-1).take(at), -1).astype(np.int32)


def stack_writes(writes: list[ChunkWrite], spec: PoolSpec) -> ChunkWrites:
    """ChunkWrite list -> ChunkWrites (pages padded with -1 to the widest)."""
    L, G = spec.num_layers, spec.num_groups
    if not writes:
        return ChunkWrites(pages=np.full((0, L, G, 1), -1, np.int32), offset=np.zeros((0, L, G), np.int32),
                           counts=np.zeros((0, L, G), np.int64), widths=np.zeros(0, np.int64),
                           page_size=spec.page_size)
    widths = np.asarray([w.pages.shape[-1] for w in writes], np.int64)
    pages = np.full((len(writes), L, G, int(widths.max(initial=1))), -1, np.int32)
    for i, w in enumerate(writes):
        pages[i, :, :, : widths[i]] = w.pages
    return ChunkWrites(pages=pages, offset=np.stack([w.offset for w in writes]),
                       counts=np.stack([w.counts for w in writes]), widths=widths, page_size=spec.page_size)


def check_planned(rids, reqs, sizes) -> None:
    """PoolError unless each request appears once and sizes[i] is its planned next chunk."""
    if len(set(map(id, reqs))) != len(reqs):
        raise PoolError(f"prefill_chunks: a request appears twice in {rids}")
    for rid, req, n in zip(rids, reqs, sizes):
        k, planned = len(req.chunk_ends), req.plan.chunk_tokens
        if k >= len(planned) or planned[k] != n:
            nxt = planned[k] if k < len(planned) else "none (prefill is complete)"
            raise PoolError(f"request {rid!r}: prefill chunk of {n} tokens, but the planned next chunk is {nxt}")


def _draw(pool, arena, slots: np.ndarray, need: np.ndarray, npages: np.ndarray) -> None:
    """need [B, V] pages per (b, v) from the reservation, appended to the arena rows of slots (npages
    [B, V] before), handed out in (b, v) order: as prefill_chunk request by request."""
    total = int(need.sum())
    if native.enabled():
        if total > pool.reserved:
            raise PoolError(f"take({total}, from_reserved={total}) with {pool.reserved} reserved")
        pool.reserved -= total
        native.draw(pool, arena, slots, need)
        return
    ids = pool.take(total, from_reserved=total)
    V, cap = arena.num_virtual, arena.pages.shape[2]
    n = need.reshape(-1)
    start = ((slots[:, None] * V + np.arange(V)) * cap + npages).reshape(-1) - (np.cumsum(n) - n)
    arena.pages.reshape(-1)[np.repeat(start, n) + np.arange(total)] = ids
    arena.npages[slots] = npages + need


def draw_chunks(cache, rids: list, sizes, host_pages: bool = True) -> ChunkWrites:
    """cache.prefill_chunk(rid, n) for each (rid, n) in order, for a RaggedKVCache without window
    layers: the planned next chunk of each request, its pages drawn from its reservation. Without
    host_pages the writes carry no pages (None): the device block tables compute the slots."""
    reqs = [cache._req(r) for r in rids]
    check_planned(rids, reqs, sizes)
    P, A = cache.spec.page_size, cache.arena
    slots = np.asarray([req.pages.slot for req in reqs], np.int64)
    counts = np.stack([req.plan.chunk_slots[len(req.chunk_ends)] for req in reqs])  # [B, V]
    held = A.lens[slots]                                    # int32, as the arena keeps them
    lens, npages = held.astype(np.int64), A.npages[slots].astype(np.int64)
    need = np.maximum(0, -(-(lens + counts) // P) - npages)
    if np.any(need > A.reserved_left[slots]):
        raise PoolError("a prefill draw exceeded the request's reservation (plan and writes disagree)")
    A.ensure_capacity(int((npages + need).max(initial=0)))
    _draw(cache.pool, A, slots, need, npages)
    A.reserved_left[slots] -= need.astype(np.int32)
    A.taken[slots] += need.astype(np.int32)
    pages, offset, widths = chunk_pages(A, slots, held, counts, P, gather=host_pages)
    A.lens[slots] = lens + counts
    for rid, req, end in zip(rids, reqs, A.lens[slots]):
        req.chunk_ends.append(end)
        if req.prefill_done and not np.array_equal(req.taken, req.plan.prefill_pages):
            raise PoolError(f"request {rid!r}: reserved != used after prefill")
    B, L, G = len(rids), cache.spec.num_layers, cache.spec.num_groups
    return ChunkWrites(pages=None if pages is None else pages.reshape(B, L, G, -1), offset=offset.reshape(B, L, G),
                       counts=counts.reshape(B, L, G), widths=widths, page_size=P)
