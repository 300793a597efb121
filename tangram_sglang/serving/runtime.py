"""TangramServing: the serving state of one scheduler process (the model runner lives in it too).

Built whole when SGLang sizes its KV cache (``TangramServing.build``, from sglang/process.py) and
passed to what SGLang builds next: Tangram's allocator holds it (the one handle: SGLang's hooks
reach it through the tree cache's allocator, ``serving_of(tree_cache)``, the attention backend
through the runner's), the radix tree gets only its narrow TreeStore (tree_store.py). It never
refers back to the tree: admission is handed the tree's evictor.

Owners: the frozen ServingContext (profile entry, pool spec, scorer, per-layer metadata); the
ragged pool's control plane (RaggedKVCache) and page data (KVPageData); admission by exact
reservation (admission.py); the device block tables; and here, the request table. A request's
progress has one owner, the pool's request record (plan, chunks done, pages, its Publication);
RequestState keeps only what the pool does not know (scorer state, SGLang row, pending prefix
copies, protected runs).

Requests are keyed by SGLang's ``Req.rid``. Life of one request:
  admit (PrefillAdder) -> bind_rows (prepare_for_extend) -> extend / decode
  metadata (attention backend) -> publish (radix checkpoint) -> release.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tangram_sglang.attention.compression import ChunkPlan
from tangram_sglang.attention.page_data import KVPageData
from tangram_sglang.pool import RaggedKVCache
from tangram_sglang.pool.batch_memo import BatchMemo
from tangram_sglang.pool.block_table import chunk_slots_host
from tangram_sglang.pool.spec import PoolError, PoolSpec
from tangram_sglang.scorers import ScorerState
from tangram_sglang.serving.admission import AdmissionControl, PoolCounters
from tangram_sglang.serving.block_tables import DeviceBlockTables
from tangram_sglang.serving.context import LoadedProfile, ServingContext, build_context
from tangram_sglang.serving.host_tier import HostTier
from tangram_sglang.serving.tree_store import TreeStore


def serving_of(tree_cache) -> "TangramServing | None":
    """The serving state behind SGLang's tree cache, held by Tangram's allocator (None without a profile)."""
    return getattr(getattr(tree_cache, "token_to_kv_pool_allocator", None), "serving", None)


@dataclass
class RequestState:
    rid: str
    scorer_states: list[ScorerState]       # per layer, while prefilling; [] once the last chunk is planned
    row: int | None = None                  # SGLang req_pool_idx
    copy_src: np.ndarray | None = None      # prefix pages to copy before the first write
    copy_dst: np.ndarray | None = None
    prefix_tokens: int = 0                  # tokens of the matched prefix
    protect: list[tuple[int, int]] = field(default_factory=list)  # (lead, trail) protected per chunk


class TangramServing:
    """The serving state of one scheduler process: built whole by ``build`` (nothing in it is
    ever None), its context frozen; it owns the request table and the forward planning."""

    def __init__(self, context: ServingContext, host_ratio: float = 0.0):
        """host_ratio: a compressed host tier of that many times the pool's pages (0: none)."""
        self.context = context
        spec = context.spec
        self.cache = RaggedKVCache(spec, context.entry.group_budget, windows=context.profile.model.windows)
        self.data = KVPageData(spec, device=context.device)
        host_pages = int(host_ratio * spec.num_pages)
        if host_pages and self.cache.window_rows.size:   # refused at launch (server_args._check_host_ratio)
            raise ValueError("a host tier keeps whole segments; sliding-window layers drop window pages from the tree")
        self.host = HostTier(host_pages, self.data) if host_pages > 0 else None
        self.tables = DeviceBlockTables(spec.num_layers, spec.num_groups, spec.page_size, context.device)
        self.counters = PoolCounters()
        self.admission = AdmissionControl(context, self.cache, self.counters)
        self.tree_store = TreeStore(self.cache, self.counters, self.release, self.host, cut=context.cut,
                                    data=self.data)
        self.requests: dict[str, RequestState] = {}
        self.row_to_rid: dict[int, str] = {}
        self.decode_rows = BatchMemo()  # SGLang rows of the last decode batch; changed() at any (re)binding

    @classmethod
    def build(cls, loaded: LoadedProfile, hf_config, host_ratio: float = 0.0, **sizes) -> "TangramServing":
        """The serving state for the pool sized from stock SGLang's KV bytes (context.build_context)."""
        return cls(build_context(loaded, hf_config, **sizes), host_ratio=host_ratio)

    @property
    def spec(self) -> PoolSpec:
        return self.context.spec

    @property
    def chunk(self) -> int:
        return self.context.chunk

    # -- requests -------------------------------------------------------------------------------
    def plan_chunks(self, tokens, prefix_tokens: int, ratio: float | None = None) -> tuple[list[int], list]:
        """(sizes, protected (lead, trail)) of the compression chunks after a cached prefix of
        ``prefix_tokens`` tokens of the sequence ``tokens`` at ``ratio``: the chunk rule's (method/chunks.py),
        so the kept set depends on the tokens alone. The prefix must end where the tree's match may end."""
        return self.context.cut(tokens, ratio=ratio).after(prefix_tokens)

    def admit(self, rid: str, *, prefix_chain, prefix_tokens: int, node, tokens, decode_tokens: int,
              ratio: float | None = None, planned=None) -> bool:
        """Reserve exactly the pages of this request (evicting unlocked tree leaves if needed): the
        sequence ``tokens`` (prefix and new tokens, int [T]) after its cached prefix, cut by the chunk
        rule (``planned``: plan_chunks' answer, if the caller has it), compressed at ``ratio`` of the
        profile (None: the served one; context.budgets_for).

        Returns False when the pages are not there even after eviction (the request waits).
        Raises RequestTooLargeError when its prefill can never fit.
        """
        sched, protect = planned if planned is not None else self.plan_chunks(tokens, prefix_tokens, ratio)
        if not sched:
            raise PoolError(f"request {rid!r}: nothing after its prefix of {prefix_tokens} tokens to prefill")
        beta = None if ratio is None else self.context.budgets_for(ratio)
        adm = self.admission.reserve(rid, sched, decode_tokens, prefix_chain, protect, prefix_node=node, beta=beta)
        if adm is None:
            self.counters.waited += 1
            return False
        state = RequestState(rid=rid, scorer_states=[ScorerState(tokens_seen=prefix_tokens)
                                                     for _ in range(self.spec.num_layers)],
                             prefix_tokens=prefix_tokens, protect=protect)
        if adm.copy_src.size:
            state.copy_src, state.copy_dst = adm.copy_src, adm.copy_dst
        self.requests[rid] = state
        self.counters.admitted += 1
        self.counters.matched_tokens += prefix_tokens
        self.counters.peak_admitted = max(self.counters.peak_admitted, len(self.requests))
        return True

    def planned_extend(self, rid: str, limit: int | None = None) -> int | None:
        """Tokens of the request's next prefill pass (None: prefill done, or not admitted): the
        longest run of its next planned compression chunks within ``limit`` tokens (what SGLang
        sized the pass to; None: one chunk), and never less than one chunk.

        The schedule is fixed at admission; the prefill adder makes SGLang's extend this long, so
        the kept set never depends on how SGLang sized a pass (and nothing is re-planned). A pass
        holds one chunk per request when ``multi_chunk`` is off."""
        req = self.cache.requests.get(rid)
        if req is None:
            return None
        planned = req.plan.chunk_tokens[len(req.chunk_ends):]
        if not planned:
            return None
        if limit is None or not self.multi_chunk:
            return planned[0]
        ends = np.cumsum(planned)
        return int(ends[max(int(np.searchsorted(ends, limit, side="right")) - 1, 0)])

    @property
    def multi_chunk(self) -> bool:
        """Whether one prefill pass may hold several compression chunks of a request (processed in
        order inside each layer, extend_waves). Not for a scorer that scores after the model's
        forward (KVzip: a chunk's scores would come too late for the next chunk's attention), nor
        for window layers (a later chunk's draw releases window pages an earlier one still reads)."""
        return not self.context.scorer.needs_reconstruction and not self.cache.window_rows.size

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

    # -- forward metadata (attention backend) ---------------------------------------------------
    def extend_metadata(self, rids, ext_lens) -> "ForwardPlan":
        """The plan of an extend holding one compression chunk per request (extend_waves' one wave)."""
        waves = self.extend_waves(rids, ext_lens)
        if len(waves) != 1:
            raise PoolError(f"extend of {list(ext_lens)} tokens is not one planned chunk per request")
        return waves[0].plan

    def extend_waves(self, rids, ext_lens) -> list["ExtendWave"]:
        """Draw the pages of every compression chunk of the batch's extends; one ExtendWave per
        chunk index: wave w holds the w-th chunk of each request that has one, and its tables are
        those after the waves before it (the attention backend runs the waves in order inside each
        layer, so a chunk reads the compressed KV of the request's earlier chunks exactly as if
        each had been its own pass). ext_lens[b] must be a run of request b's planned chunks."""
        for rid in rids:
            st = self.requests[rid]
            if st.copy_src is not None:
                self.data.copy_pages(st.copy_src, st.copy_dst)
                st.copy_src = st.copy_dst = None
        pieces = [self._pass_chunks(rid, int(n)) for rid, n in zip(rids, ext_lens)]
        host = [self.cache.requests[rid].pages for rid in rids]
        npages_before, dead_before = np.stack([p.npages for p in host]), np.stack([p.dead for p in host])
        drawn = []   # per wave: (members, lens before [b, V], protect, writes)
        on_host = self.data.k_pages.device.type == "cpu"   # else the device computes the slots (_wave_plan)
        for w in range(max(len(p) for p in pieces)):
            members = [i for i, p in enumerate(pieces) if len(p) > w]
            before = np.stack([host[i].lens for i in members]).astype(np.int32)
            protect = [self.requests[rids[i]].protect[len(self.cache.requests[rids[i]].chunk_ends)] for i in members]
            writes = self.cache.prefill_chunks([rids[i] for i in members], [pieces[i][w] for i in members],
                                               host_pages=on_host)
            drawn.append((members, before, protect, writes))
        self.counters.prefill_passes += 1
        self.counters.prefill_chunks += sum(len(p) for p in pieces)
        rows = self._rows(rids)
        self.tables.extend(rows, rids, host, npages_before, dead_before)
        self.decode_rows.changed()
        self._note_peak()
        width = max(max(int(p.npages.max(initial=0)) for p in host), 1)
        starts = np.concatenate([[0], np.cumsum(np.asarray(ext_lens, np.int64))])
        waves = []
        for w, (members, before, protect, writes) in enumerate(drawn):
            sizes = [pieces[i][w] for i in members]
            offs = [int(starts[i]) + sum(pieces[i][:w]) for i in members]
            tokens = None if len(drawn) == 1 else torch.from_numpy(np.concatenate(
                [np.arange(o, o + n) for o, n in zip(offs, sizes)])).to(self.data.k_pages.device)
            plan = self._wave_plan([rids[i] for i in members], [rows[i] for i in members], width, before,
                                   protect, writes, sizes)
            waves.append(ExtendWave(plan=plan, sizes=sizes, tokens=tokens))
        for rid in rids:  # the last chunk: its states live only as long as this forward's plan
            if self.cache.requests[rid].prefill_done:
                self.requests[rid].scorer_states = []
        return waves

    def _pass_chunks(self, rid: str, num_tokens: int) -> list[int]:
        """The planned chunks an extend of num_tokens covers (a run of the request's next chunks)."""
        req = self.cache.requests[rid]
        planned = req.plan.chunk_tokens[len(req.chunk_ends):]
        ends = np.cumsum(planned)
        k = int(np.searchsorted(ends, num_tokens)) + 1
        if k > len(planned) or ends[k - 1] != num_tokens or (k > 1 and not self.multi_chunk):
            raise PoolError(f"request {rid!r}: an extend of {num_tokens} tokens is not a run of its planned "
                            f"chunks {planned[:4]}{'...' if len(planned) > 4 else ''}"
                            + ("" if self.multi_chunk else " (one chunk per pass with this profile)"))
        return list(planned[:k])

    def _wave_plan(self, rids, rows, width: int, before: np.ndarray, protect, writes, sizes) -> "ForwardPlan":
        """One wave's ForwardPlan: tables gathered for its rows, read up to ``before`` [b, V]."""
        keep = writes.counts                                            # [b, L, G]
        dev = self.data.k_pages.device
        before_t = torch.from_numpy(before).to(dev)
        table, lens = self.tables.view(rows, width, before_t)
        if dev.type == "cpu":   # the host's own arrays: no device round trip to save
            out = [torch.from_numpy(x) for x in chunk_slots_host(writes)]
        else:
            out = self.tables.chunk_slots(torch.as_tensor(rows, dtype=torch.int64).to(dev), before_t, keep)
        chunks = [ChunkPlan.build(sizes, keep[:, layer], dev) for layer in range(self.spec.num_layers)]
        states = [[self.requests[r].scorer_states[l] for r in rids] for l in range(self.spec.num_layers)]
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
        step = self.cache.decode_step(rids)
        if step is None and self.admission.ensure_decode_room(rids):  # SGLang's capacity check reserved this
            step = self.cache.decode_step(rids)  # step's pages: only a caller that skipped it
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


@dataclass
class ExtendWave:
    """One wave of an extend batch: plan (ForwardPlan over the wave's requests, one chunk each),
    sizes [b] its chunks' tokens, tokens int64 [sum(sizes)] the wave's rows in the batch's token
    order (None: the wave is the whole batch, as when every request brings one chunk)."""

    plan: "ForwardPlan"
    sizes: list
    tokens: torch.Tensor | None = None


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
