"""TangramServing: everything one scheduler process holds to serve with a profile.

One object per scheduler process (the model runner lives in the same process),
created before SGLang builds its memory pools and held by the process's
TangramProcess (sglang/process.py). It is passed to what SGLang builds (the
allocator, the radix tree) and reached through them: SGLang's hooks through the
tree it threads everywhere (``serving_of(tree_cache)``), the attention backend
through the runner's allocator.

A request's progress has one owner: the pool's request record (its plan,
chunks done, pages); RequestState keeps only what the pool does not know
(scorer state, SGLang row, pending prefix copies, protected runs, where its
published chain ends).

It owns the ragged pool's control plane (RaggedKVCache), its page data
(KVPageData), the per-layer attention metadata (groups, split map), the
method's scorer, and the per-request state SGLang does not know about: scorer
state per layer, the planned chunk schedule, the SGLang row (req_pool_idx).

Requests are keyed by SGLang's ``Req.rid``. Life of one request:
  admit (PrefillAdder) -> bind_rows (prepare_for_extend) -> extend / decode
  metadata (attention backend) -> publish (radix checkpoint) -> release.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from tangram_sglang.attention import build_layer_metas, make_split_rows
from tangram_sglang.attention.compression import ChunkPlan
from tangram_sglang.attention.page_data import KVPageData
from tangram_sglang.method.chunks import extend_schedule
from tangram_sglang.method.protection import Protection, chunk_protection, min_keep
from tangram_sglang.pool import RaggedKVCache
from tangram_sglang.pool.batch_memo import BatchMemo
from tangram_sglang.pool.spec import PoolError, PoolSpec, RequestTooLargeError
from tangram_sglang.profile import ModelShape, TangramProfile, load_profile
from tangram_sglang.profile.tensor_parallel import rank_view, shard_of_rank, shards
from tangram_sglang.scorers import ScorerState
from tangram_sglang.scorers.base import HeadShard
from tangram_sglang.scorers.profile_scorer import profile_scorer
from tangram_sglang.serving.block_tables import DeviceBlockTables

DEFAULT_CHUNK = 512
logger = logging.getLogger("tangram_sglang")
def serving_of(tree_cache) -> "TangramServing | None":
    """The serving state behind SGLang's tree cache (None for a stock tree: no profile)."""
    return getattr(tree_cache, "serving", None)


def chunk_size_of(profile: TangramProfile) -> int:
    """The compression chunk: the calibration's chunk size (the budgets were measured on it)."""
    return int(profile.calibration.chunk_size) or DEFAULT_CHUNK


@dataclass
class RequestState:
    rid: str
    scorer_states: list[ScorerState]       # per layer, while prefilling; [] once the last chunk is planned
    row: int | None = None                  # SGLang req_pool_idx
    copy_src: np.ndarray | None = None      # prefix pages to copy before the first write
    copy_dst: np.ndarray | None = None
    prefix_tokens: int = 0                  # tokens of the matched prefix
    node: object = None                     # tree node where its published chain ends
    published_tokens: int = 0               # tokens covered by the tree chain (incl. prefix)
    detached: bool = False                  # later segments stay out of the tree (radix.checkpoint)
    protect: list[tuple[int, int]] = field(default_factory=list)  # (lead, trail) protected per chunk


@dataclass
class PoolCounters:
    """Monotone counters for /server_info (read by the benchmarks)."""

    admitted: int = 0
    waited: int = 0
    too_large: int = 0
    capped: int = 0
    retracted: int = 0
    evicted_segments: int = 0
    peak_admitted: int = 0  # most requests ever holding pages at once (admitted, not yet released)
    peak_pages_used: int = 0


class TangramServing:
    def __init__(self, path: str, profile: TangramProfile, ratio: float | None,
                 protection: Protection = Protection()):
        self.path = path
        self.protection = protection
        self.profile = profile
        self.ratio = ratio
        self.entry = profile.select(ratio)  # replaced by this rank's view when the pool is built
        self.tp = (1, 0)                    # (tp size, rank), set by build_pool
        self.chunk = chunk_size_of(profile)
        self.scorer = profile_scorer(profile, path)
        self.requests: dict[str, RequestState] = {}
        self.row_to_rid: dict[int, str] = {}
        self.decode_rows = BatchMemo()  # SGLang rows of the last decode batch; changed() at any (re)binding
        self.counters = PoolCounters()
        self.cache: RaggedKVCache | None = None
        self.data: KVPageData | None = None
        self.tree = None  # TangramRadixCache, set when SGLang builds it
        self.stock_tokens = 0
        self.full_kv_token_bytes = 0
        self.data_plane: str | None = None  # set by the attention backend: "torch", "triton" or "cuda"
        self._max_prompt: int | None = None
        self.gauges = None  # serving.metrics.TangramGauges, made at the first report with --enable-metrics

    @classmethod
    def load(cls, path: str, ratio: float | None) -> "TangramServing":
        return cls(path, load_profile(path), ratio)

    # -- pool construction ----------------------------------------------------------------------
    def build_pool(self, hf_config, *, stock_tokens: int, dtype: torch.dtype, device, page_size: int,
                   num_q_heads: int, tp_size: int = 1, tp_rank: int = 0) -> int:
        """Size the ragged pool from the bytes stock SGLang would give its KV cache (one rank's:
        num_q_heads and the KV heads are the rank's share; tensor_parallel.rank_view).

        Returns the logical token capacity SGLang's allocator should get: enough ids for
        every token the pages could ever hold, so pages (not ids) are what binds.
        """
        self.profile.check_model(ModelShape.from_hf_config(hf_config))
        view = rank_view(self.profile, tp_size, tp_rank)
        self.entry, self.tp, shape = view.select(self.ratio), (tp_size, tp_rank), view.model
        if tp_size > 1 and self.scorer.needs_hidden:  # gates rate all heads: keep this rank's
            H = self.profile.model.num_kv_heads
            self.scorer = HeadShard(self.scorer, shards(H, tp_size)[shard_of_rank(H, tp_size, tp_rank)])
        itemsize = torch.empty((), dtype=dtype).element_size()
        dtype_name = str(dtype).replace("torch.", "")
        self.full_kv_token_bytes = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * itemsize
        self.stock_tokens = int(stock_tokens)
        spec = PoolSpec.for_bytes(self.stock_tokens * self.full_kv_token_bytes,
                                  num_layers=shape.num_layers, num_groups=self.entry.num_groups,
                                  heads_per_group=view.heads_per_group, head_dim=shape.head_dim,
                                  page_size=page_size, dtype=dtype_name)
        self.cache = RaggedKVCache(spec, self.entry.group_budget)
        self.data = KVPageData(spec, device=device)
        self.metas = build_layer_metas(self.entry, num_q_heads=num_q_heads, num_kv_heads=shape.num_kv_heads,
                                       heads_per_group=view.heads_per_group, device=device)
        self.split_rows = make_split_rows(self.entry.split_map, device=device)
        self.tables = DeviceBlockTables(shape.num_layers, self.entry.num_groups, page_size, device)
        slots_per_token = float(self.entry.group_budget.sum())
        # Generous: SGLang's token budget (decode estimates of running requests included) must
        # never bind before the pages do; an id costs 8 bytes of free list.
        logical = int(spec.num_pages * page_size / max(slots_per_token, 1e-6)) * 4
        return max(logical, 16 * self.stock_tokens)

    @property
    def spec(self) -> PoolSpec:
        return self.cache.spec

    # -- admission ------------------------------------------------------------------------------
    def _pages_alone(self, prompt_tokens: int, decode_tokens: int) -> int:
        """Pages a request needs with the pool to itself: no prefix, its prompt compressed."""
        from tangram_sglang.pool.reservation import plan_reservation

        V = self.spec.num_virtual
        sched = extend_schedule(min(prompt_tokens, self.chunk), prompt_tokens, self.chunk)
        floor = min_keep(chunk_protection(self.protection, 0, sched, prompt_tokens))
        plan = plan_reservation(self.cache.beta, sched, page_size=self.spec.page_size, decode_tokens=decode_tokens,
                                prefix_slots=np.zeros(V, np.int64), extend_in_place=np.zeros(V, bool),
                                min_keep=floor)
        return plan.total_pages

    def never_fits(self, prompt_tokens: int) -> str | None:
        """Why a prompt can never be served by this pool (None if it can): no prefix, one decode token."""
        if prompt_tokens <= 0:  # stock SGLang crashes its scheduler on it (0.5.23, CPU): refuse it
            return "Tangram: the prompt is empty; send at least one token"
        need = self._pages_alone(prompt_tokens, 1)
        if need > self.spec.num_pages:
            return (f"Tangram: the prompt of {prompt_tokens} tokens needs {need} pages of the "
                    f"ragged KV pool after compression, but the whole pool has {self.spec.num_pages}; "
                    "it can never be served (shorten it or serve with a larger pool)")
        return None

    def max_prompt_tokens(self) -> int:
        """The longest prompt the pool can ever serve (alone, no prefix, one generated token);
        computed once (binary search over exact plans)."""
        if self._max_prompt is None:
            fits = lambda n: self._pages_alone(n, 1) <= self.spec.num_pages  # noqa: E731
            hi = 1
            while fits(hi):
                hi *= 2
            self._max_prompt = _largest_fitting(fits, hi // 2, hi)
        return self._max_prompt

    def max_decode_tokens(self, prompt_tokens: int, wanted: int) -> int:
        """The largest d <= wanted the pool can hold for this prompt plus d generated tokens with
        nothing else in it (binary search over exact plans); counted in counters.capped when it is
        below wanted. A prompt that never fits keeps wanted: the arrival hook
        (scheduling.refuse_never_fitting) refuses it next, naming the pool's pages."""
        if prompt_tokens <= 0 or self._pages_alone(prompt_tokens, 1) > self.spec.num_pages:
            return max(0, wanted)
        fits = lambda d: self._pages_alone(prompt_tokens, d) <= self.spec.num_pages  # noqa: E731
        if fits(max(1, wanted)):
            return max(0, wanted)
        lo = _largest_fitting(fits, 1, max(1, wanted))
        self.counters.capped += 1
        logger.warning("Tangram: max_new_tokens capped from %d to %d: the ragged pool (%d pages) can hold no more "
                       "for a %d-token prompt", wanted, lo, self.spec.num_pages, prompt_tokens)
        return lo

    def _reserve(self, rid: str, sched: list[int], decode_tokens: int, prefix_chain, protect):
        """cache.admit, evicting unlocked tree leaves until it fits; None if it cannot now.

        Evicts the pages the refused plan lacked in one pass (not a page per retry).

        Decode room is SGLang's estimate, not a need: if it alone makes the request larger than
        the whole pool, reserve one decode token and let decode grow (or retract) on demand.
        Raises RequestTooLargeError only when the prefill itself can never fit.
        """
        while True:
            try:
                adm = self.cache.admit(rid, chunk_tokens=sched, decode_tokens=decode_tokens, prefix=prefix_chain,
                                       min_keep=min_keep(protect))
            except RequestTooLargeError:  # raised before anything is reserved
                if decode_tokens <= 1:
                    raise
                decode_tokens = 1
                continue
            if adm is not None:
                return adm
            if self.tree is None or not self.tree.evict_pages(max(1, self.cache.last_shortfall)):
                return None

    def admit(self, rid: str, *, prefix_chain, prefix_tokens: int, node, first: int, total: int,
              decode_tokens: int) -> bool:
        """Reserve exactly the pages of this request (evicting unlocked tree leaves if needed).

        Returns False when the pages are not there even after eviction (the request waits).
        Raises RequestTooLargeError when its prefill can never fit.
        """
        sched = extend_schedule(first, total, self.chunk)
        protect = chunk_protection(self.protection, prefix_tokens, sched, prefix_tokens + total)
        adm = self._reserve(rid, sched, decode_tokens, prefix_chain, protect)
        if adm is None:
            self.counters.waited += 1
            return False
        state = RequestState(rid=rid, scorer_states=[ScorerState(tokens_seen=prefix_tokens)
                                                     for _ in range(self.spec.num_layers)],
                             prefix_tokens=prefix_tokens, node=node, published_tokens=prefix_tokens,
                             protect=protect)
        if adm.copy_src.size:
            state.copy_src, state.copy_dst = adm.copy_src, adm.copy_dst
        self.requests[rid] = state
        self.counters.admitted += 1
        self.counters.peak_admitted = max(self.counters.peak_admitted, len(self.requests))
        return True

    def planned_extend(self, rid: str) -> int | None:
        """Tokens of the request's next compression chunk (None: prefill done, or not admitted).

        The schedule is fixed at admission; the prefill adder makes SGLang's extend this long, so
        the kept set never depends on how SGLang sized a pass (and nothing is re-planned)."""
        req = self.cache.requests.get(rid)
        if req is None:
            return None
        planned = req.plan.chunk_tokens[len(req.chunk_ends):]
        return planned[0] if planned else None

    def publication(self, rid: str):
        """(tree node, tokens covered, detached) where the request's published chain ends; None if unknown."""
        st = self.requests.get(rid)
        return None if st is None else (st.node, st.published_tokens, st.detached)

    def published(self, rid: str, node, tokens: int, detached: bool) -> None:
        """The tree published the request's segments up to node (tokens covered from position 0)."""
        st = self.requests[rid]
        st.node, st.published_tokens, st.detached = node, tokens, detached

    def bind_row(self, rid: str, row: int) -> None:
        state = self.requests.get(rid)
        if state is not None:
            state.row = int(row)
            self.row_to_rid[int(row)] = rid
            self.decode_rows.changed()

    def release(self, rid: str) -> None:
        """The request left (finished, aborted or retracted): drop its references."""
        state = self.requests.pop(rid, None)
        if state is None:
            return
        self.decode_rows.changed()
        self.cache.release(rid)
        if state.row is not None:
            self.tables.forget(state.row, rid)
            if self.row_to_rid.get(state.row) == rid:
                del self.row_to_rid[state.row]

    def rids_of_rows(self, rows) -> list[str]:
        return [self.row_to_rid[int(r)] for r in rows]

    # -- decode capacity ------------------------------------------------------------------------
    def ensure_decode_room(self, rids) -> bool:
        """SGLang's decode capacity check: evict tree leaves until the next decode step of rids
        fits, then reserve its pages (nothing can take them before the step runs: a decode
        step never lacks pages); False if it cannot fit (SGLang retracts)."""
        while (short := self.cache.reserve_decode_step(rids)) > 0:
            if self.tree is None or not self.tree.evict_pages(short):
                return False
        return True

    # -- observability --------------------------------------------------------------------------
    def pool_info(self) -> dict:
        u = self.cache.usage()
        spec = self.spec
        used = u.total - u.free
        tokens_held = self.tokens_held()
        full_bytes = tokens_held * self.full_kv_token_bytes
        held_bytes = used * spec.page_size_bytes
        return {
            "pages_total": u.total, "pages_used": used, "pages_free": u.free, "pages_reserved": u.reserved,
            "pages_held_by_tree": u.held_by_tree, "page_size": spec.page_size,
            "page_bytes": spec.page_size_bytes, "pool_bytes": spec.pool_bytes,
            "bytes_held": held_bytes, "tokens_held": tokens_held, "full_kv_bytes_for_tokens_held": full_bytes,
            "saved_vs_full_kv": (1.0 - held_bytes / full_bytes) if full_bytes else 0.0,
            "stock_kv_tokens_same_bytes": self.stock_tokens, "chunk_tokens": self.chunk,
            "max_prompt_tokens": self.max_prompt_tokens(),
            "data_plane": self.data_plane, "tp_size": self.tp[0], "tp_rank": self.tp[1],
            "running_requests": len(self.requests), "scorer_state_bytes": self.scorer_state_bytes(),
            **self.counters.__dict__,
        }

    def scorer_state_bytes(self) -> int:
        """Bytes scorers keep across chunks for requests still prefilling (freed at the last chunk)."""
        return sum(t.numel() * t.element_size() for st in self.requests.values() for ss in st.scorer_states
                   for t in ss.tensors.values())

    def tokens_held(self) -> int:
        """Tokens whose KV the pool holds: requests' own tokens plus the tree's (prefixes counted once)."""
        tree_tokens = self.tree.total_tokens() if self.tree is not None else 0
        own = sum(max(0, self._request_tokens(s)) for s in self.requests.values())
        return tree_tokens + own

    def _request_tokens(self, state: RequestState) -> int:
        req = self.cache.requests.get(state.rid)
        if req is None:
            return 0
        done = sum(req.plan.chunk_tokens[: len(req.chunk_ends)])
        decoded = int((req.pages.lens - (req.chunk_ends[-1] if req.chunk_ends else req.plan.prefix_slots)).max(initial=0)) \
            if req.prefill_done else 0
        return state.prefix_tokens + done + decoded - state.published_tokens

    def log_line(self, info: dict | None = None) -> str:
        i = self.pool_info() if info is None else info
        return (f"tangram pages: {i['pages_used']}/{i['pages_total']} used "
                f"({i['pages_held_by_tree']} in tree), saved {100 * i['saved_vs_full_kv']:.1f}% of full KV")

    def check_integrity(self) -> None:
        self.cache.check_integrity()
        if self.tree is not None:
            self.tree.check_integrity()
        for rid, state in self.requests.items():
            if state.row is not None and self.tables.mirrors(state.row, rid):
                self.tables.check(state.row, self.cache.requests[rid].pages)

    # -- forward metadata (attention backend) ---------------------------------------------------
    def extend_metadata(self, rids, ext_lens) -> "ForwardPlan":
        """Draw the pages of each request's next chunk; tables are those BEFORE the chunk."""
        for rid in rids:
            st = self.requests[rid]
            if st.copy_src is not None:
                self.data.copy_pages(st.copy_src, st.copy_dst)
                st.copy_src = st.copy_dst = None
        before = np.stack([self.cache.requests[rid].pages.lens for rid in rids]).astype(np.int32)  # [B, V]
        protect = [self.requests[rid].protect[len(self.cache.requests[rid].chunk_ends)] for rid in rids]
        writes = [self.cache.prefill_chunk(rid, int(n)) for rid, n in zip(rids, ext_lens)]
        keep = np.stack([w.counts for w in writes])                     # [B, L, G]
        locs = [w.slot_locs for w in writes]                            # [L, G, k_b] each
        dev = self.data.k_pages.device
        out = []
        for layer in range(self.spec.num_layers):
            parts = [loc[layer][np.arange(loc.shape[-1])[None, :] < kb[layer][:, None]]
                     for loc, kb in zip(locs, keep)]
            out.append(torch.from_numpy(np.concatenate(parts)).to(dev))
        # The tables after the chunk's pages were drawn, read only up to the slots cached before it.
        rows, host = self._rows(rids), [self.cache.requests[rid].pages for rid in rids]
        self.tables.load(rows, rids, host)
        self.decode_rows.changed()
        width = max(int(p.npages.max(initial=0)) for p in host)
        table, lens = self.tables.view(rows, max(width, 1), torch.from_numpy(before).to(dev))
        self._note_peak()
        chunks = [ChunkPlan.build(ext_lens, keep[:, layer], dev) for layer in range(self.spec.num_layers)]
        states = [[self.requests[r].scorer_states[l] for r in rids] for l in range(self.spec.num_layers)]
        for rid in rids:  # the last chunk: its states live only as long as this forward's plan
            if self.cache.requests[rid].prefill_done:
                self.requests[rid].scorer_states = []
        return ForwardPlan(block_table=table, seq_lens=lens, out_loc=out, keep=torch.from_numpy(keep).to(dev),
                           protect=protect, states=states, chunks=chunks)

    def _rows(self, rids) -> list[int]:
        rows = [self.requests[rid].row for rid in rids]
        if any(r is None for r in rows):
            raise RuntimeError("Tangram: a request reached the attention backend without its SGLang row")
        return rows

    def _decode_rows(self, rids) -> list[int]:
        """Rows of a new decode batch; rows whose device tables are stale are loaded first."""
        rows = self._rows(rids)
        stale = [i for i, (row, rid) in enumerate(zip(rows, rids)) if not self.tables.mirrors(row, rid)]
        if stale:  # a row not loaded since its pages changed (never after an extend of the same request)
            self.tables.load([rows[i] for i in stale], [rids[i] for i in stale],
                             [self.cache.requests[rids[i]].pages for i in stale])
        return rows

    def decode_metadata(self, rids) -> "ForwardPlan":
        """One new slot per (request, layer, group); tables are those AFTER the append.

        Host work is O(batch x virtual layers): the pool appends the pages this step opens,
        and only those cross to the device tables, which compute the write slots there."""
        rows = self.decode_rows.get(rids, self._decode_rows)
        step = self.cache.decode_step(rids, locs=False)
        if step is None and self.ensure_decode_room(rids):  # SGLang's capacity check reserved this
            step = self.cache.decode_step(rids, locs=False)  # step's pages: only a caller that skipped it
        if step is None:
            raise PoolError("decode step without pages: the batch skipped SGLang's capacity check")
        rows_t, locs = self.tables.decode(rows, step.opened, step.width)   # on the device
        L, G = self.spec.num_layers, self.spec.num_groups
        per_layer = locs.view(len(rids), L, G).transpose(0, 1).reshape(L, -1)
        self._note_peak()
        return ForwardPlan(block_table=self.tables.pages, seq_lens=self.tables.seq_lens(rows_t),
                           out_loc=list(per_layer.unbind(0)), rows=rows_t)

    def _note_peak(self) -> None:
        used = self.spec.num_pages - self.cache.pool.num_free
        self.counters.peak_pages_used = max(self.counters.peak_pages_used, used)


def _largest_fitting(fits, lo: int, hi: int) -> int:
    """The largest n in [lo, hi) with fits(n), given fits is monotone, fits(lo) (or lo == 0) and not fits(hi)."""
    while lo < hi - 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@dataclass
class ForwardPlan:
    """Per-layer views of one forward batch (device tensors from DeviceBlockTables):
    block_table[l] int32 [B, G, W] (extend) or, with rows int64 [B] (decode), [R, G, W] of every
    request row, entry b reading row rows[b]; seq_lens[l] int32 [B, G],
    out_loc[l] int64 flat slots to write, keep int64 [B, L, G] (extend only), states[l] scorer states,
    protect [(lead, trail)] * B protected runs of each request's chunk (extend only), chunks[l] the
    layer's ChunkPlan (extend only: host-known sizes, so compression needs no device sync)."""

    block_table: torch.Tensor   # [L, B, G, W], or [L, R, G, W] with rows
    seq_lens: torch.Tensor      # [L, B, G]
    out_loc: list
    rows: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    states: list | None = None
    protect: list | None = None
    chunks: list | None = None
