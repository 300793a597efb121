"""RaggedKVCache: the control plane of the ragged page pool, one object per served model.

Life of a request (all per-v work is vectorized over the V = L * G virtual layers):

    adm = cache.admit(rid, chunk_tokens=[512, 512, 100], decode_tokens=64, prefix=chain,
                      min_keep=[4, 0, 64])             # protected tokens per chunk (optional)
    # None -> not enough free pages now: evict cache.last_shortfall pages, or wait.
    # RequestTooLargeError -> never fits.
    data.copy_pages(adm.copy_src, adm.copy_dst)       # prefix tails copied, if any
    for n in adm.plan.chunk_tokens:
        w = cache.prefill_chunk(rid, n)               # w.pages/offset or w.slot_locs [L, G, max_k]
        # (cache.prefill_chunks(rids, sizes): one chunk of each request of a pass, drawn together)
        segs = cache.publish(rid)                     # the completed chunks become tree segments
    # each decode step of a batch rids (serving/runtime.py, serving/admission.py):
    short = cache.reserve_decode_step(rids)          # SGLang's capacity check: 0, or pages short
                                                      # (evict that many, or retract a request)
    step = cache.decode_step(rids)                    # appends the pages the step opens (None: none free)
    rows_t, locs = tables.decode(rows, step.opened, step.width)  # write slots, on the device
                                                      # (serving/block_tables.py DeviceBlockTables)
    segs = cache.publish(rid, include_tail=True)      # finished: the generated tokens too
    cache.release(rid)                                # drop its references (finish, abort, retract)
    cache.evict(seg.seg_id)                           # tree eviction

Admission reserves exactly plan.total_pages (reservation.py). Prefill draws
only from the reservation and, after the last chunk, the request holds exactly
plan.prefill_pages per v (checked: PoolError otherwise). Decode draws from the
reservation's decode room first, then from unreserved free pages.

A prefix (chain of Segments) is read in place: the request takes its own
reference on every prefix page it uses. If the prefix ends inside a page of v
and nobody wrote past that point (pool.fill), the request claims the page and
appends in place; otherwise it appends to a fresh copy of that page
(Admission.copy_src -> copy_dst, which the data plane copies before the first
write). Both keep slots dense: slot s of v is page pages[v, s // P], offset s % P.

Sliding-window layers (``windows``: per layer its window W, 0 for full attention) keep every
token, so a slot is a position, and a query at position q reads slots q - W + 1 .. q. Their
pages that lie wholly before the window of every query still to come are released as the
request runs (at each prefill chunk and decode step: ``window_dead``), published segments
leave out the columns before their own end's window, and the tree drops more of them with
``drop_window_columns``, checking ``window_ready`` before it lets a match end somewhere.
The reservation still counts every page the request takes (a released page may still be
held by the tree, so it cannot be promised again); what is bounded is what is held.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tangram_sglang.pool import native
from tangram_sglang.pool.batch_memo import BatchMemo
from tangram_sglang.pool.chunk_draw import check_planned, draw_chunks, stack_writes
from tangram_sglang.pool.page_pool import PagePool
from tangram_sglang.pool.records import Admission, ChunkWrite, ChunkWrites, DecodeStep, PoolUsage, RequestRecord, StepPages
from tangram_sglang.pool.request_pages import PageArena, RequestPages, div_mod, fast_mod, ragged_index
from tangram_sglang.pool.reservation import plan_reservation
from tangram_sglang.pool.segments import Segment, SegmentStore, assemble, page_columns
from tangram_sglang.pool.spec import PoolError, PoolSpec, RequestTooLargeError


def window_dead(lens: np.ndarray, window: np.ndarray, page_size: int) -> np.ndarray:
    """Columns no query at position >= lens reads in a layer of the given window (0: full
    attention, none): those wholly before slot lens - window + 1. int64, lens' shape."""
    lens, window = np.asarray(lens, np.int64), np.asarray(window, np.int64)
    return np.where(window > 0, np.maximum(0, (lens - window + 1) // page_size), 0)


class RaggedKVCache:
    def __init__(self, spec: PoolSpec, group_budget: np.ndarray, windows=None):
        """windows: per layer its sliding window, 0 for full attention (default: all full)."""
        windows = np.zeros(spec.num_layers, np.int64) if windows is None else np.asarray(windows, np.int64)
        if windows.shape != (spec.num_layers,) or np.any(windows < 0):
            raise ValueError(f"windows must give each of the {spec.num_layers} layers a window >= 0, got {windows}")
        self.spec = spec
        self.window = np.repeat(windows, spec.num_groups)  # int64 [V]
        self.beta = self._budgets(group_budget)
        self.window_rows = np.flatnonzero(self.window)
        self.pool = PagePool(spec.num_pages, spec.page_size)
        self.store = SegmentStore(self.pool, spec.page_size)
        self.requests: dict[object, RequestRecord] = {}
        self.arena = PageArena(spec.num_virtual)
        self.last_shortfall = 0  # pages the last refused admit lacked (evict that many, in one pass)
        self._slots = BatchMemo()  # arena slots of the last decode batch; changed() at every release
        self._pending = None       # (epoch, rids, StepPages) found by the last capacity check

    @classmethod
    def from_profile(cls, profile, *, page_size: int, num_pages: int, ratio: float | None = None,
                     dtype: str = "float32") -> "RaggedKVCache":
        spec = PoolSpec.from_profile(profile, page_size=page_size, num_pages=num_pages, dtype=dtype)
        return cls(spec, profile.select(ratio).group_budget, windows=profile.model.windows)

    def _req(self, rid) -> RequestRecord:
        if rid not in self.requests:
            raise PoolError(f"unknown request {rid!r} (never admitted, or already released)")
        return self.requests[rid]

    # -- admission -------------------------------------------------------------------------------
    def admit(self, rid, *, chunk_tokens, decode_tokens: int = 0, prefix=(), min_keep=None,
              prefix_node=None, beta: np.ndarray | None = None) -> Admission | None:
        """Reserve the request's pages (see the module docstring); prefix_node is the caller's handle
        of where the prefix chain ends (the tree's node), kept in the record's Publication. beta: the
        request's own group budgets (float [L, G], another ratio of the profile; default the pool's):
        its chunks keep what its plan says, in the same virtual layers and pages as every other."""
        if rid in self.requests:
            raise PoolError(f"request {rid!r} is already admitted")
        P, V = self.spec.page_size, self.spec.num_virtual
        prefix = tuple(prefix)
        for seg in prefix:
            self.store.get(seg.seg_id)  # raises PoolError if it was evicted
        table, npages, lens = assemble(list(prefix), V, P)
        dead = self._prefix_window(rid, table, npages, lens)
        last = np.take_along_axis(table, np.maximum(npages - 1, 0)[:, None], axis=1)[:, 0].astype(np.int64)
        partial = lens % P != 0
        in_place = partial & (self.pool.fill[last] == lens % P)
        beta = self.beta if beta is None else self._budgets(beta)
        plan = plan_reservation(beta, chunk_tokens, page_size=P, decode_tokens=decode_tokens,
                                prefix_slots=lens, extend_in_place=in_place, min_keep=min_keep)
        if plan.total_pages > self.spec.num_pages:
            raise RequestTooLargeError(
                f"request {rid!r} needs {plan.total_pages} pages ({len(plan.chunk_tokens)} chunks, "
                f"{decode_tokens} decode tokens) but the whole pool has {self.spec.num_pages}: it can never fit")
        if not self.pool.reserve(plan.total_pages):
            self.last_shortfall = plan.total_pages - self.pool.available
            return None
        copy = partial & ~in_place
        pages = RequestPages(V, P, capacity=int(plan.prefill_slots.max(initial=0) // P + 2), arena=self.arena)
        pages.set_prefix(table, np.where(copy, npages - 1, npages), lens)
        pages.dead = dead
        self.pool.incref(pages.held())
        self.pool.fill[last[in_place]] = P
        req = RequestRecord(pages, plan, prefix, prefix_node)
        self.requests[rid] = req
        dst = self._take(req, copy.astype(np.int64))
        return Admission(plan=plan, copy_src=last[copy], copy_dst=dst.astype(np.int64))

    def _budgets(self, group_budget) -> np.ndarray:
        """Group budgets [L, G] (the pool's, or a request's), checked: float64 [V]."""
        beta = np.asarray(group_budget, dtype=np.float64)
        if beta.shape != (self.spec.num_layers, self.spec.num_groups):
            raise ValueError(f"group_budget has shape {beta.shape}, the pool is "
                             f"[{self.spec.num_layers}, {self.spec.num_groups}]")
        if np.any(beta.ravel()[self.window > 0] < 1.0):
            raise ValueError("a sliding-window layer must keep every token (group budget 1.0)")
        return beta.ravel()

    def _prefix_window(self, rid, table: np.ndarray, npages: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """Window rows of a prefix table: columns before the window of the request's first query
        become -1 (it holds no reference on them); the rest must be live. Returns dead [V]."""
        dead = window_dead(lens, self.window, self.spec.page_size)
        if not self.window_rows.size:
            return dead
        cols = np.arange(table.shape[1])[None, :]
        table[cols < dead[:, None]] = -1
        if np.any((table < 0) & (cols >= dead[:, None]) & (cols < npages[:, None])):
            raise PoolError(f"request {rid!r}: its prefix lacks window pages it reads (check window_ready first)")
        return dead

    def window_ready(self, chain) -> bool:
        """Whether a match may end where the chain (segments, root first) ends: every window
        layer still holds the pages the next query reads."""
        if not self.window_rows.size or not chain:
            return True
        table, npages, lens = assemble(list(chain), self.spec.num_virtual, self.spec.page_size)
        dead = window_dead(lens, self.window, self.spec.page_size)
        cols = np.arange(table.shape[1])[None, :]
        return not np.any((table < 0) & (cols >= dead[:, None]) & (cols < npages[:, None]))

    def drop_window_columns(self, seg_id: int, later_end: np.ndarray) -> tuple[int, int]:
        """Drop a tree segment's window columns that no query at or after slot later_end [V]
        reads (the tree passes the earliest end below the segment where a match may still end: none
        will end at the segment itself any more). Returns (columns dropped, pages this freed)."""
        if not self.window_rows.size:
            return 0, 0
        return self.store.drop_columns(seg_id, window_dead(later_end, self.window, self.spec.page_size))

    def _trim(self, req: RequestRecord) -> None:
        """Release the request's window columns its next query (at lens) no longer reads."""
        if self.window_rows.size:
            pages = req.pages
            self.pool.decref(pages.drop_front(window_dead(pages.lens, self.window, self.spec.page_size)))

    def _take(self, req: RequestRecord, counts: np.ndarray, unreserved_ok: bool = False) -> np.ndarray:
        """Take counts[v] pages for req (from its reservation first) and append them."""
        from_res = np.minimum(counts, req.reserved_left)
        if not unreserved_ok and np.any(from_res < counts):
            raise PoolError("a prefill draw exceeded the request's reservation (plan and writes disagree)")
        ids = self.pool.take(int(counts.sum()), from_reserved=int(from_res.sum()))
        req.reserved_left -= from_res
        req.taken += counts
        req.pages.append(counts, ids)
        return ids

    # -- prefill and decode ----------------------------------------------------------------------
    def prefill_chunk(self, rid, num_tokens: int) -> ChunkWrite:
        """Draw the pages of the next planned chunk and return where its kept slots go."""
        req = self._req(rid)
        check_planned([rid], [req], [num_tokens])
        counts = req.plan.chunk_slots[len(req.chunk_ends)]
        self._trim(req)
        self._take(req, req.pages.pages_needed(req.pages.lens + counts))
        pages, offset = req.pages.chunk_pages(counts)
        req.pages.advance(counts)
        req.chunk_ends.append(req.pages.lens.copy())
        if req.prefill_done and not np.array_equal(req.taken, req.plan.prefill_pages):
            raise PoolError(f"request {rid!r}: reserved != used after prefill")
        shape = (self.spec.num_layers, self.spec.num_groups)
        return ChunkWrite(pages=pages.reshape(*shape, -1), offset=offset.reshape(shape), counts=counts.reshape(shape),
                          page_size=self.spec.page_size)

    def prefill_chunks(self, rids, sizes, host_pages: bool = True) -> ChunkWrites:
        """prefill_chunk for each request (sizes: its next planned chunk), drawn together: the same pages and
        writes as one by one (pool/chunk_draw.py). host_pages False: pages None (the device computes the slots)."""
        if self.window_rows.size or len(rids := list(rids)) < 2:   # window layers release pages request by request
            writes = stack_writes([self.prefill_chunk(r, int(n)) for r, n in zip(rids, sizes)], self.spec)
            return writes if host_pages else replace(writes, pages=None)
        return draw_chunks(self, rids, sizes, host_pages)

    def reserve_decode_step(self, rids) -> int:
        """Reserve the pages the next decode step of rids opens beyond their reservations (one per
        (request, v) whose plan is used up and whose last page is full), so that step cannot run
        out whatever happens before it. Returns 0 when they are reserved, else how many more free
        pages they need (nothing changes). Idempotent: reserved pages count as room. Rids no
        longer admitted are skipped (SGLang's capacity check may still list them); each at most once.
        The pages found are remembered for the step (only a release or a decode step can change them)."""
        rids = rids if isinstance(rids, list) else list(rids)
        slots, ready = self._batch_slots(rids, live_only=True)
        flat_left = self.arena.reserved_left.reshape(-1)
        if self._native():   # the same search in one loop (the step finds its pages as cheaply)
            step, need = None, native.step_need(self.arena, slots, self.spec.page_size)
        else:
            step = self._step_pages(slots)
            need = step.at[flat_left.take(step.at) == 0]        # reserved_left >= 0 (integrity)
        short = need.size - self.pool.available
        if short > 0:
            return short
        self.pool.reserve(need.size)
        flat_left.put(need, 1)                                  # now every page the step opens is reserved
        self._pending = (self._slots.epoch, rids.copy(), step) if ready and step is not None else None
        return 0

    def _native(self) -> bool:
        """Whether decode steps run the native loops (pool/native.py): built, and no window layers."""
        return not self.window_rows.size and native.enabled()

    def _step_pages(self, slots: np.ndarray) -> "StepPages":
        """Where the next decode step of the batch at arena slots [B] opens pages."""
        P, V = self.spec.page_size, self.spec.num_virtual
        lens = self.arena.lens[slots]                            # [B, V]
        opens = np.flatnonzero(fast_mod(lens, P) == 0)
        b, v = div_mod(opens, V)                               # ordered by request, then v
        return StepPages(lens=lens, opens=opens, b=b, v=v, at=slots[b] * V + v)

    def decode_step(self, rids) -> DecodeStep | None:
        """One new slot per v for each request of the batch, in a few [B, V] array operations (no
        loop over requests or virtual layers): appends the pages the step opens and returns them
        (DecodeStep.opened, for the device block tables, which compute the slots to write), or
        None (nothing changes) when the pages needed beyond the requests' reservations are not
        available. Work past the [B, V] length update is O(pages opened); the pages found by
        the capacity check just before (reserve_decode_step of the same rids) are reused."""
        rids = rids if isinstance(rids, list) else list(rids)
        slots = self._batch_slots(rids, live_only=False)[0]   # PoolError unless all admitted and prefilled
        pending, self._pending = self._pending, None
        if self._native():
            return native.decode(self.pool, self.arena, slots)
        checked = pending is not None and pending[0] == self._slots.epoch and pending[1] == rids
        step = pending[2] if checked else self._step_pages(slots)
        P, A = self.spec.page_size, self.arena
        lens, opens, b, v, at = step.lens, step.opens, step.b, step.v, step.at
        left = A.reserved_left.reshape(-1).take(at)
        from_res = True if checked else left > 0                # checked: all reserved, nothing changed them
        n = opens.size
        n_res = n if checked else int(np.count_nonzero(from_res))
        if n - n_res > self.pool.available:
            return None
        new_col = A.npages.reshape(-1).take(at)                 # == lens / P at a page boundary
        A.ensure_capacity(int(new_col.max(initial=-1)) + 1)     # (may reallocate every arena field)
        ids = self.pool.take(n, from_reserved=n_res)
        A.pages.reshape(-1).put(at * A.pages.shape[2] + new_col, ids)
        A.npages.reshape(-1).put(at, new_col + 1)               # (b, v) pairs are unique
        taken = A.taken.reshape(-1)
        taken.put(at, taken.take(at) + 1)
        A.reserved_left.reshape(-1).put(at, left - from_res)
        lens += 1
        A.lens[slots] = lens
        if self.window_rows.size:
            self._trim_batch(slots, lens - 1)
        opened = np.stack([b, v, ids.astype(np.int64)], axis=1)
        width = -(-int(lens.max(initial=0)) // P)               # npages == ceil(lens / P)
        return DecodeStep(opened=opened, width=max(1, width))

    def _trim_batch(self, slots: np.ndarray, query_pos: np.ndarray) -> None:
        """Release the window columns the batch's queries (at query_pos [B, V]) read no more."""
        A, rows = self.arena, self.window_rows
        upto = window_dead(query_pos[:, rows], self.window[rows], self.spec.page_size)
        dead = A.dead[slots][:, rows]
        b, r = np.nonzero(upto > dead)
        if not b.size:
            return
        counts = (upto - dead)[b, r]
        which, pos = ragged_index(counts)
        sb, sv = slots[b][which], rows[r][which]
        cols = dead[b, r][which] + pos
        ids = A.pages[sb, sv, cols]
        A.pages[sb, sv, cols] = -1
        A.dead[slots[b], rows[r]] = upto[b, r]
        ids, refs = np.unique(ids[ids >= 0], return_counts=True)  # requests sharing a prefix page
        for k in range(int(refs.max(initial=0))):               # each drop their reference on it
            self.pool.decref(ids[refs > k])

    def _batch_slots(self, rids, *, live_only: bool) -> tuple[np.ndarray, bool]:
        """(slots of the admitted rids, whether every rid is admitted and done with prefill);
        looked up once per batch composition (a decode batch usually repeats step after step),
        again after any request left. live_only: skip rids no longer admitted instead of raising."""
        rids = rids if isinstance(rids, list) else list(rids)
        return self._slots.get(rids, lambda r: self._resolve_slots(r, live_only), keep=lambda s: s[1])

    def _resolve_slots(self, rids: list, live_only: bool) -> tuple[np.ndarray, bool]:
        """(slots of the admitted rids, whether every rid is admitted and done with prefill)."""
        reqs = [self.requests.get(r) for r in rids]
        ready = all(req is not None and req.prefill_done for req in reqs)
        if not ready and not live_only:
            for r, req in zip(rids, reqs):
                if not self._req(r).prefill_done:
                    raise PoolError(f"request {r!r}: decode before its prefill is complete")
        live = [req.pages.slot for req in reqs if req is not None]
        return np.asarray(live, dtype=np.int64), ready

    # -- release ---------------------------------------------------------------------------------
    def publish(self, rid, *, include_tail: bool = False) -> list[Segment]:
        """Register the request's chunks completed since the last publish as tree segments
        (and, with include_tail once prefill is done, the generated tokens since then as one
        uncompressed segment). The request keeps running and keeps its own references."""
        req = self._req(rid)
        pub = req.published
        # a chunk kept whole (every token protected: the chunk rule's full chunks) is uncompressed:
        # one slot per token in order, so the tree may split it like generated tokens
        spans = [(req.chunk_ends[i], req.plan.chunk_tokens[i], not req.plan.full[i], int(req.plan.min_keep[i]))
                 for i in range(pub.chunks, len(req.chunk_ends))]
        if include_tail and req.prefill_done:
            tail_start = spans[-1][0] if spans else pub.end
            decoded = req.pages.lens - tail_start  # one slot per generated token in every v
            if decoded.max(initial=0) > 0:
                spans.append((req.pages.lens.copy(), int(decoded.max()), False, 0))
        segs, start = [], pub.end
        for end, ntok, compressed, protected in spans:
            first, stop = page_columns(start, end, self.spec.page_size)
            counts, ids = req.pages.pages_from(first, stop)
            if self.window_rows.size:  # leave out window columns no match at or after end reads
                ids = self._before_window(ids, counts, first, end)
            segs.append(self.store.add(num_tokens=ntok, compressed=compressed, start=start, end=end,
                                       page_counts=counts, page_ids=ids, protected=protected if compressed else 0))
            start = end
        pub.chunks, pub.end = len(req.chunk_ends), np.asarray(start, dtype=np.int64).copy()
        return segs

    def _before_window(self, ids: np.ndarray, counts: np.ndarray, first: np.ndarray, end: np.ndarray) -> np.ndarray:
        """ids (ordered by v, counts [V] from column first [V]) with the window columns wholly
        before end's window set to -1."""
        rows, pos = ragged_index(counts)
        dead = window_dead(end, self.window, self.spec.page_size)
        return np.where(first[rows] + pos < dead[rows], -1, ids).astype(np.int32)

    def release(self, rid) -> None:
        """Drop the request's references and leftover reservation; published segments stay."""
        self._release(rid, data_end=self._req(rid).published.end)

    def _release(self, rid, data_end: np.ndarray) -> None:
        req = self.requests.pop(rid)
        self._slots.changed()
        P = self.spec.page_size
        col = data_end // P
        mine = (data_end % P != 0) & (col >= req.plan.prefix_slots // P) & (col < req.pages.npages)
        mine &= col >= req.pages.dead  # a released window column is no longer the request's to mark
        rows = np.flatnonzero(mine)
        self.pool.fill[req.pages.pages[rows, col[rows]]] = (data_end % P)[rows]
        self.pool.unreserve(int(req.reserved_left.sum()))
        if native.enabled():
            native.release(self.pool, self.arena, req.pages.slot)   # clears the slot's columns too
        else:
            self.pool.decref(req.pages.held())
        self.arena.free_slot(req.pages.slot, cleared=native.enabled())

    def evict(self, seg_id: int) -> int:
        """Drop a tree segment; returns how many pages this freed (pages others hold stay)."""
        return self.store.evict(seg_id)

    # -- accounting -------------------------------------------------------------------------------
    def usage(self) -> PoolUsage:
        """Page counts from running counters: O(1) (the log line and /server_info read it)."""
        used = self.spec.num_pages - self.pool.num_free
        tree = self.store.pages_held
        return PoolUsage(total=self.spec.num_pages, free=self.pool.num_free, reserved=self.pool.reserved,
                         held_by_requests_only=used - tree, held_by_tree=tree)

    def check_integrity(self) -> None:
        from tangram_sglang.pool.integrity import check_cache_integrity

        check_cache_integrity(self)
