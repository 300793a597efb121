"""Admission by exact reservation, and the questions SGLang asks about room.

Admission owns the rule "reserve exactly what a request will use, or wait": the pages of a
request's whole chunk schedule (prefix shared, every chunk compressed, protected tokens kept,
plus decode room) are reserved at once, evicting unlocked tree leaves first through the
evictor it was handed (``evict(pages, reason) -> bool``, the radix tree's; it evicts nothing
when it cannot make the room, so a request that cannot be admitted yet leaves the cached
histories alone). It also answers SGLang's arrival questions (can this prompt ever fit, how
many tokens may it generate) and its decode capacity check, all from exact plans over the
pool's integers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tangram_sglang.method.chunks import cut_tokens
from tangram_sglang.method.protection import min_keep
from tangram_sglang.pool import RaggedKVCache
from tangram_sglang.pool.reservation import plan_reservation
from tangram_sglang.pool.spec import RequestTooLargeError
from tangram_sglang.serving.context import ServingContext

logger = logging.getLogger("tangram_sglang")


@dataclass
class PoolCounters:
    """Monotone counters for /server_info (read by the benchmarks)."""

    admitted: int = 0
    waited: int = 0
    too_large: int = 0
    plan_errors: int = 0   # requests failed: their chunk plan did not fit their cached prefix (expected 0)
    capped: int = 0
    retracted: int = 0
    evicted_segments: int = 0
    # Tokens of tree segments evicted, by what asked for the room: a request's admission, a decode
    # step's pages, the flush that serves a request as if its prefix were not cached (nothing runs),
    # and SGLang's own evict calls (its logical token ids).
    evicted_tokens_admission: int = 0
    evicted_tokens_decode: int = 0
    evicted_tokens_flush: int = 0
    evicted_tokens_sglang: int = 0
    evicted_tokens_load: int = 0   # for the pages of a host segment loaded back
    # The host tier (--tangram-host-ratio): segments moved there for device room, loaded back on a
    # match, dropped from it for host room; admissions that waited because a load found no pages.
    offloaded_segments: int = 0
    offloaded_tokens: int = 0
    loaded_segments: int = 0
    loaded_tokens: int = 0
    host_evicted_tokens: int = 0
    load_waits: int = 0
    evictions_refused: int = 0  # times room was asked that evicting every unlocked leaf could not make: nothing evicted
    # What publishing a finished chunk or reply did with each segment: linked into the tree, freed
    # for a twin already there (same tokens, same slots), or freed because its chain continues a twin.
    published_segments: int = 0
    twin_segments: int = 0
    detached_segments: int = 0
    matched_tokens: int = 0     # prefix tokens admitted requests found in the tree (sum)
    prefill_passes: int = 0   # extend forwards run (one per SGLang prefill batch)
    prefill_chunks: int = 0   # compression chunks they computed: several per pass where requests bring several
    window_drops: int = 0   # times a tree node dropped sliding-window columns for room (again only for a later end below it)
    peak_admitted: int = 0  # most requests ever holding pages at once (admitted, not yet released)
    peak_pages_used: int = 0


def _never_evicts(pages: int, reason: str) -> bool:
    return False


class AdmissionControl:
    def __init__(self, context: ServingContext, cache: RaggedKVCache, counters: PoolCounters):
        self.context, self.cache, self.counters = context, cache, counters
        self.evict: Callable[[int, str], bool] = _never_evicts  # the radix tree's evict_pages, once it exists
        self._max_prompt: int | None = None

    def pages_alone(self, prompt, decode_tokens: int, beta: np.ndarray | None = None) -> int:
        """Pages a request needs with the pool to itself: no prefix, its prompt cut by the chunk rule and
        compressed (at beta [L, G], a request's own ratio; default the served one). prompt: its tokens
        (int [T]), or a length (then cut as one message: complete chunks compressed, the tail kept whole)."""
        ctx = self.context
        V = ctx.spec.num_virtual
        tokens = np.zeros(int(prompt), np.int64) if np.ndim(prompt) == 0 else np.asarray(prompt, np.int64)
        beta = self.cache.beta if beta is None else np.ravel(beta)
        cut = cut_tokens(tokens, ctx.chunk, ctx.protection, None if np.ndim(prompt) == 0 else ctx.markers,
                         keep_all=bool(np.all(beta >= 1.0)))
        sched, protect = cut.after(0)
        plan = plan_reservation(beta, sched, page_size=ctx.spec.page_size, decode_tokens=decode_tokens,
                                prefix_slots=np.zeros(V, np.int64), extend_in_place=np.zeros(V, bool),
                                min_keep=min_keep(protect))
        return plan.total_pages

    def never_fits(self, prompt, beta: np.ndarray | None = None) -> str | None:
        """Why a prompt (its tokens) can never be served by this pool (None if it can): no prefix, one decode token."""
        num_tokens = int(np.size(prompt))
        if num_tokens <= 0:  # stock SGLang crashes its scheduler on it (0.5.23, CPU): refuse it
            return "Tangram: the prompt is empty; send at least one token"
        pages = self.context.spec.num_pages
        need = self.pages_alone(prompt, 1, beta)
        if need > pages:
            return (f"Tangram: the prompt of {num_tokens} tokens needs {need} pages of the "
                    f"ragged KV pool after compression, but the whole pool has {pages}; "
                    "it can never be served (shorten it or serve with a larger pool)")
        return None

    def max_prompt_tokens(self) -> int:
        """The longest prompt the pool can ever serve (alone, no prefix, one generated token);
        computed once (binary search over exact plans)."""
        if self._max_prompt is None:
            fits = lambda n: self.pages_alone(n, 1) <= self.context.spec.num_pages  # noqa: E731
            hi = 1
            while fits(hi):
                hi *= 2
            self._max_prompt = _largest_fitting(fits, hi // 2, hi)
        return self._max_prompt

    def max_decode_tokens(self, prompt_tokens: int, wanted: int) -> int:
        """The largest d <= wanted the pool can hold for this prompt plus d generated tokens with
        nothing else in it (binary search over exact plans); counted in counters.capped when it is
        below wanted. A prompt that never fits keeps wanted: the arrival hook
        (scheduling.refuse_at_arrival) refuses it next, naming the pool's pages. The generated tokens
        leave a page per virtual layer free: a cached prefix it matches may end inside a page, which it
        then copies while the tree keeps the original (both are held until it finishes)."""
        pages = self.context.spec.num_pages
        if prompt_tokens <= 0 or self.pages_alone(prompt_tokens, 1) > pages:
            return max(0, wanted)
        room = pages - self.context.spec.num_virtual
        fits = lambda d: self.pages_alone(prompt_tokens, d) <= room  # noqa: E731
        if fits(max(1, wanted)):
            return max(0, wanted)
        lo = _largest_fitting(fits, 1, max(1, wanted))
        self.counters.capped += 1
        logger.warning("Tangram: max_new_tokens capped from %d to %d: the ragged pool (%d pages) can hold no more "
                       "for a %d-token prompt", wanted, lo, pages, prompt_tokens)
        return lo

    def reserve(self, rid: str, sched: list[int], decode_tokens: int, prefix_chain, protect, prefix_node=None,
                beta: np.ndarray | None = None):
        """cache.admit (prefix_node: the tree's node where prefix_chain ends; beta: the request's group
        budgets, None for the served ones), evicting unlocked tree leaves until it fits; None if it cannot now.

        Evicts the pages the refused plan lacked in one pass (not a page per retry).

        Decode room is SGLang's estimate, not a need: if it alone makes the request larger than
        the whole pool, reserve one decode token and let decode grow (or retract) on demand.
        Raises RequestTooLargeError only when the prefill itself can never fit.
        """
        while True:
            try:
                adm = self.cache.admit(rid, chunk_tokens=sched, decode_tokens=decode_tokens, prefix=prefix_chain,
                                       min_keep=min_keep(protect), prefix_node=prefix_node, beta=beta)
            except RequestTooLargeError:  # raised before anything is reserved
                if decode_tokens <= 1:
                    raise
                decode_tokens = 1
                continue
            if adm is not None:
                return adm
            if not self.evict(max(1, self.cache.last_shortfall), "admission"):
                return None

    def ensure_decode_room(self, rids) -> bool:
        """SGLang's decode capacity check: evict tree leaves until the next decode step of rids
        fits, then reserve its pages (nothing can take them before the step runs: a decode
        step never lacks pages); False if it cannot fit (SGLang retracts)."""
        while (short := self.cache.reserve_decode_step(rids)) > 0:
            if not self.evict(short, "decode"):
                return False
        return True


def _largest_fitting(fits, lo: int, hi: int) -> int:
    """The largest n in [lo, hi) with fits(n), given fits is monotone, fits(lo) (or lo == 0) and not fits(hi)."""
    while lo < hi - 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
