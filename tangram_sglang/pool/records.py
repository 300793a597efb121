"""The records of the ragged pool: what admission returns (Admission), where a chunk's kept KV
goes (ChunkWrite), what a decode step did (DecodeStep), the page counts (PoolUsage), and the
pool's record of one request (RequestRecord: its plan, pages, chunks done and its Publication:
how far it is published to the tree; the one owner of a request's progress)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tangram_sglang.pool.request_pages import ArenaField, RequestPages, flat_slot_locs
from tangram_sglang.pool.reservation import ReservationPlan
from tangram_sglang.pool.segments import Segment


@dataclass(frozen=True, kw_only=True)
class Admission:
    plan: ReservationPlan
    copy_src: np.ndarray  # int64 page ids whose contents must be copied ...
    copy_dst: np.ndarray  # ... into these pages before the first write


@dataclass(frozen=True, kw_only=True)
class ChunkWrite:
    """Where one prefill chunk's kept KV goes, in (page, offset) form:

    pages int32 [L, G, W] (-1 padded) the pages the chunk's slots fall in, in order;
    offset int32 [L, G] offset of its first slot in pages[..., 0]; counts int64 [L, G] kept slots.
    Kept slot j of (l, g) lives in page pages[l, g, (offset + j) // P] at (offset + j) % P.
    ``slot_locs`` gives the flat ids page * P + offset, int64 [L, G, max(counts)], -1 padded.
    """

    pages: np.ndarray
    offset: np.ndarray
    counts: np.ndarray
    page_size: int

    @property
    def slot_locs(self) -> np.ndarray:
        return flat_slot_locs(self.pages, self.offset, self.counts, self.page_size)


@dataclass(frozen=True, kw_only=True)
class ChunkWrites:
    """One prefill chunk of each of B requests, drawn together (RaggedKVCache.prefill_chunks):
    pages int32 [B, L, G, W] (-1 padded; None when drawn without host pages, for a device that
    computes the slots from its tables), offset int32 [B, L, G], counts int64 [B, L, G], as
    ChunkWrite's per request; widths int64 [B] each request's own W. ``writes[i]`` is request i's
    ChunkWrite, exactly what prefill_chunk would have returned."""

    pages: np.ndarray | None
    offset: np.ndarray
    counts: np.ndarray
    widths: np.ndarray
    page_size: int

    def __len__(self) -> int:
        return self.counts.shape[0]

    def __getitem__(self, i: int) -> ChunkWrite:
        if self.pages is None:
            raise ValueError("these writes were drawn without host pages (host_pages=False)")
        return ChunkWrite(pages=self.pages[i, :, :, : int(self.widths[i])], offset=self.offset[i],
                          counts=self.counts[i], page_size=self.page_size)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


@dataclass(frozen=True, kw_only=True)
class DecodeStep:
    """One decode step of a batch: opened int64 [n, 3] (batch index, v, page id) of the pages the
    step appended; width the batch's largest page count after the step. The slots to write are
    computed from these by the device block tables (serving/block_tables.py)."""
    opened: np.ndarray
    width: int


@dataclass(frozen=True, kw_only=True)
class PoolUsage:
    total: int
    free: int
    reserved: int
    held_by_requests_only: int
    held_by_tree: int


@dataclass(kw_only=True)
class Publication:
    """How far a request's KV is published to the tree, the one record of it. The pool's side:
    chunks handed over and the slot end of the chain, int64 [V]; the tree's side: tokens the chain
    covers from position 0, the tree's handle of its last node (opaque here), and whether later
    segments stay out of the tree (sglang/radix.py: once a segment was dropped or matched a twin,
    the rest of the request's chain does not continue the tree's). SGLang's ``req.last_node`` is
    only its mirror, set by the tree."""

    chunks: int
    end: np.ndarray
    tokens: int
    node: object
    detached: bool = False

    def link(self, node, tokens: int, detached: bool) -> None:
        """The tree linked the segments handed over so far: the chain now ends at node."""
        self.node, self.tokens, self.detached = node, int(tokens), bool(detached)


class RequestRecord:
    def __init__(self, pages: RequestPages, plan: ReservationPlan, prefix: tuple[Segment, ...], prefix_node=None):
        self.pages = pages
        self.plan = plan
        self.prefix = prefix
        self.reserved_left = plan.pages
        self.chunk_ends: list[np.ndarray] = []
        self.published = Publication(chunks=0, end=plan.prefix_slots.copy(),
                                     tokens=sum(seg.num_tokens for seg in prefix), node=prefix_node)

    # reserved_left, taken int32 [V]: views of the arena slot of the request's pages
    reserved_left = ArenaField()
    taken = ArenaField()

    def slot_pages(self) -> RequestPages:
        return self.pages

    @property
    def prefill_done(self) -> bool:
        return len(self.chunk_ends) == len(self.plan.chunk_tokens)


@dataclass(frozen=True, kw_only=True)
class StepPages:
    """The (request, v) pairs a decode step opens a page for: lens int32 [B, V] before the step,
    opens int64 [n] flat indices into it, b / v their request and virtual layer, at their flat
    index into the arena's [slots * V] fields."""

    lens: np.ndarray
    opens: np.ndarray
    b: np.ndarray
    v: np.ndarray
    at: np.ndarray
