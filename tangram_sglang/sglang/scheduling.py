"""Admission by exact reservation, inside SGLang's PrefillAdder.

SGLang decides which waiting requests join a prefill batch and how much of a
long prompt goes into this pass (the chunked request always comes first with a
full ``chunked_prefill_size``, later ones share what is left). A request's
compression chunks are fixed at admission by the chunk rule (method/chunks.py:
chunks of the profile's C from each message start, a function of the tokens
alone), and the ragged pool reserves exactly its pages (prefix shared, every
chunk compressed, plus SGLang's estimated decode room). Each
extend is held to a whole run of those chunks, as many as fit what SGLang gave
the request in this pass (one, with a profile whose passes hold one chunk per
request: TangramServing.multi_chunk), and the first chunk is never cut short
to fill a pass: a request whose first chunk does not fit what is left of the
pass waits for the next one. So the chunks of a prompt (and the KV kept for
it) depend only on its tokens, never on what was cached or what SGLang
batched with it. When
the pages are not there even after evicting unlocked tree leaves, the
request waits (NO_TOKEN), exactly like SGLang's token budget.
"""

from __future__ import annotations

import logging
import math
import os

import numpy as np
from sglang.srt.environ import envs
from sglang.srt.managers.schedule_policy import (
    CLIP_MAX_NEW_TOKENS,
    WAITING_QUEUE_PREFIX_MATCH_MAX,
    AddReqResult,
    CacheAwarePolicy,
    PrefillAdder,
)
from sglang.srt.mem_cache.common import touch_waiting_prefix
from sglang.srt.mem_cache.evict_policy import LRUStrategy

from tangram_sglang.pool.spec import PoolError, RequestTooLargeError
from tangram_sglang.serving.runtime import serving_of

logger = logging.getLogger("tangram_sglang")


def _added(adder, req) -> bool:
    return bool(adder.can_run_list) and adder.can_run_list[-1] is req


def _fail_unplannable(serving, req, exc: Exception) -> AddReqResult:
    """A request whose chunk plan disagrees with its cached prefix (the prefix ends inside a compressed
    chunk, or leaves nothing to prefill), or whose admission raised: never expected, since the tree cuts
    a match by the same rule. It must not leave SGLang's scheduler loop: the request fails with the
    reason (a 1-token request next round, as SGLang fails bad input), holding no pages (a reservation
    the pool made before the error included), and the server keeps serving."""
    serving.counters.plan_errors += 1
    if req.rid in serving.requests:
        serving.release(req.rid)
    elif req.rid in serving.cache.requests:   # reserved in the pool before serving.admit raised
        serving.cache.release(req.rid)
    logger.error("Tangram: request %s failed: its chunk plan does not fit its cached prefix (%s)", req.rid, exc)
    req.set_finish_with_abort(f"Tangram: the request's cached prefix does not fit its chunk plan ({exc})")
    return AddReqResult.NO_TOKEN


class TangramPrefillAdder(PrefillAdder):
    def add_one_req(self, req, has_chunked_req, truncation_align_size):
        serving = serving_of(self.tree_cache)
        if len(req.full_untruncated_fill_ids) - req.prefix_len <= 0:
            # Nothing to prefill (SGLang always leaves one token; arrival refuses empty prompts).
            # Never let a request into a batch without its reservation: fail it as SGLang fails
            # bad input (one placeholder token), which admits below like any 1-token request.
            req.set_finish_with_abort("Tangram: the request has no token to prefill")
            req.init_next_round_input(self.tree_cache)
        # The first chunk is never cut short by what else is in the pass (the kept set of a text must
        # not depend on batching): a request whose first chunk does not fit waits for the next pass,
        # where it comes first and has the whole chunk budget.
        try:
            planned = serving.plan_chunks(req.full_untruncated_fill_ids, req.prefix_len, own_ratio(serving, req))
        except (ValueError, PoolError) as exc:
            return _fail_unplannable(serving, req, exc)
        rem = self.rem_chunk_tokens
        if rem is not None and rem < planned[0][0]:
            return AddReqResult.OTHER
        try:
            ok = self._reserve(serving, req, planned)
            if not ok and req.prefix_len > 0 and not serving.requests:
                # Nothing runs, so nothing will free pages: what keeps it out is its own cached
                # prefix (pages shared with the tree force copies of their tails). Serve it as if
                # the prefix were not cached: evict what the tree holds and match again.
                self.tree_cache.evict_all("flush")
                req.init_next_round_input(self.tree_cache)
                ok = self._reserve(serving, req, serving.plan_chunks(req.full_untruncated_fill_ids, req.prefix_len,
                                                                     own_ratio(serving, req)))
        except RequestTooLargeError as exc:
            # Arrival already refuses prompts that never fit; a chunk schedule cut by batching can
            # still tip one over. Fail it like SGLang fails bad input: it finishes with the error
            # as a 1-token request next round, and the server keeps serving.
            serving.counters.too_large += 1
            req.set_finish_with_abort(f"Tangram: {exc}")
            return AddReqResult.NO_TOKEN
        except (ValueError, PoolError) as exc:
            return _fail_unplannable(serving, req, exc)
        if not ok:
            return AddReqResult.NO_TOKEN
        res = super().add_one_req(req, has_chunked_req, truncation_align_size)
        if not _added(self, req):
            serving.release(req.rid)
            return res
        if _hold_to_plan(req, serving.planned_extend(req.rid, req.extend_end - req.prefix_len)):
            # Chunked or not is decided by the plan too.
            if req.extend_end < len(req.full_untruncated_fill_ids):
                self._end_pass_with(req)
            elif self.new_chunked_req is req:
                self.new_chunked_req = None
        return res

    def _end_pass_with(self, req) -> None:
        """req leaves this pass unfinished: it is the pass's one chunked request (SGLang continues one
        per pass) and, as after SGLang's own truncation, nothing joins the pass after it."""
        self.new_chunked_req = req
        self._close_pass()

    def _close_pass(self) -> None:
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens = 0

    def _reserve(self, serving, req, planned) -> bool:
        """serving.admit for req's planned chunks (serving.plan_chunks), its matched prefix locked against
        eviction for room (and loaded back first where it lies on the host tier)."""
        max_new = min(max(req.sampling_params.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
        tree = self.tree_cache
        lock = tree.lock(req.last_node)
        try:
            if not tree.load_back(req.last_node):   # host-tier segments of its prefix, back into pages
                return False
            return serving.admit(req.rid, prefix_chain=tree.chain(req.last_node), prefix_tokens=req.prefix_len,
                                 node=req.last_node, tokens=req.full_untruncated_fill_ids, planned=planned,
                                 decode_tokens=int(max_new * self.new_token_ratio) + 1,
                                 ratio=own_ratio(serving, req))
        finally:
            tree.unlock(lock)

    def add_chunked_req(self, req):
        out = super().add_chunked_req(req)
        serving = serving_of(self.tree_cache)
        if _added(self, req) and _hold_to_plan(req, serving.planned_extend(req.rid, req.extend_end - req.prefix_len)):
            if req.extend_end < len(req.full_untruncated_fill_ids):
                self._close_pass()   # it stays the chunked request: no other may start this pass
                return req
            return None
        return out


def _hold_to_plan(req, planned: int | None) -> bool:
    """Make SGLang's extend of req the planned run of compression chunks; True if it had sized it otherwise
    (page or alignment rounding, its token budget). The pages reserved are the plan's, and the
    kept set must depend only on the prompt and its cached prefix, never on how a pass was sized."""
    if planned is None or req.extend_end - req.prefix_len == planned:
        return False
    req.extend_end = req.prefix_len + planned
    return True


def prefill_adder_class(original, scheduler):
    return TangramPrefillAdder if serving_of(scheduler.tree_cache) is not None else original(scheduler)


def bind_rows(result, batch, *args, **kwargs):
    """AFTER ScheduleBatch.prepare_for_extend: remember which req_to_token row each request got."""
    serving = serving_of(batch.tree_cache)
    if serving is not None:
        for req in batch.reqs:
            serving.bind_row(req.rid, req.kv.req_pool_idx)
    return result


def refuse_at_arrival(scheduler, req, *args, **kwargs):
    """BEFORE Scheduler._add_request_to_queue: a prompt the pool can never hold, one with token ids
    outside the model's vocabulary, or one asking for a ratio the profile lacks, fails now with a clear
    error (HTTP 400) and the server keeps serving. A request of another ratio than the served one (its
    own, or its session's: radix_sessions.py) gets its own branch of the tree (its extra_key): a segment
    is reused only at the ratio that wrote it."""
    serving = serving_of(scheduler.tree_cache)
    if serving is None or req.finished():
        return
    why = outside_vocabulary(req.origin_input_ids, scheduler.model_config.vocab_size)
    if why is None:
        why, ratio = ratio_of_request(serving, req)
    if why is None and (sessions := getattr(scheduler.tree_cache, "sessions", None)) is not None:
        ratio = sessions.ratio(getattr(req, "session_id", None), names_ratio(req), ratio)
    if why is None:
        beta = None if ratio is None else serving.context.budgets_for(ratio)
        why = serving.admission.never_fits(np.asarray(req.origin_input_ids, np.int64), beta)
        serving.counters.too_large += why is not None
    if why is not None:
        req.set_finish_with_abort(why)
        return
    req.tangram_ratio = ratio   # the tree's match cuts the request's sequence at its ratio (radix._cut)
    if ratio is not None and not (req.extra_key or "").endswith(tag := f"{RATIO_KEY}{ratio:g}"):
        req.extra_key = f"{req.extra_key or ''}{tag}"


RATIO_PARAM = "tangram_ratio"    # sampling_params.custom_params[RATIO_PARAM]: a request's ratio of the profile
RATIO_KEY = "|tangram_ratio="    # appended to the extra_key of a request at another ratio than the served one


def ratio_of_request(serving, req) -> tuple[str | None, float | None]:
    """(why it cannot be served, or None; the ratio it asks for, None when that is the served one).
    The ratio is custom_params["tangram_ratio"] of its sampling parameters (``/generate``'s
    sampling_params, the OpenAI API's ``custom_params``), one of the profile's ratios."""
    params = getattr(req.sampling_params, "custom_params", None)
    value = params.get(RATIO_PARAM) if isinstance(params, dict) else None
    if value is None:
        return None, None
    ratios = sorted(serving.context.ratio_budgets)
    try:
        ratio = float(value)
        serving.context.budgets_for(ratio)
    except (TypeError, ValueError):
        return (f"Tangram: {RATIO_PARAM} {value!r} is not one of the served profile's ratios "
                f"({', '.join(f'{r:g}' for r in ratios)})"), None
    return None, (None if math.isclose(ratio, serving.context.entry.ratio, abs_tol=1e-9) else ratio)


def names_ratio(req) -> bool:
    """Whether the request's custom_params name a ratio (its session's is used when it names none)."""
    params = getattr(req.sampling_params, "custom_params", None)
    return isinstance(params, dict) and params.get(RATIO_PARAM) is not None


def own_ratio(serving, req) -> float | None:
    """The ratio an admitted request is compressed at (None: the served one), as set at arrival
    (refuse_at_arrival: its own or its session's)."""
    if hasattr(req, "tangram_ratio"):
        return req.tangram_ratio
    return ratio_of_request(serving, req)[1]


def outside_vocabulary(ids, vocab_size: int) -> str | None:
    """Why token ids cannot be embedded (None if they can). SGLang 0.5.23 does not check the ids a
    client sends: one past the vocabulary reaches the embedding and kills the scheduler (stock too)."""
    ids = np.asarray(ids, dtype=np.int64)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size == 0:
        return None
    return (f"Tangram: input token id {int(bad[0])} is outside the model's vocabulary [0, {vocab_size}) "
            f"({bad.size} such ids)")


def refuse_beam_search(original, coordinator, req, recv_req):
    """AROUND BeamCoordinator.validate_and_init (SGLang's own beam refusals, answered with HTTP 400):
    beams fork their prefix KV through SGLang's token-pool rows and write several rows per request in
    one decode step, which the ragged pool (one page table per request) does not hold."""
    if serving_of(coordinator.tree_cache) is not None:
        return ("Beam search (beam_width > 1) is not supported with --tangram-profile: beams fork their "
                "KV through SGLang's token-pool rows, which the ragged KV pool does not hold")
    return original(coordinator, req, recv_req)


def touch_waiting_histories(original, policy, active, waiting_queue):
    """AROUND SchedulePolicy._touch_waiting_prefixes (fcfs-like policies, LRU eviction): SGLang
    touches the waiting requests' cached prefixes, head of the queue last, on one scheduling pass
    in 32; Tangram does it on every pass where the queue changed (its head, within a token budget
    per pass). A session's next turn is queued moments after its history became the tree's newest
    entry, and admitting the turns ahead of it evicts least recently used leaves first: without
    the touch those are the histories of the turns that run next, so a pool holding most sessions'
    histories reuses few of them. The touch walks the tree only (no split, no allocation): it
    changes which histories survive pressure, never what is computed from a history found.

    Stock SGLang (no profile) gets the same touch with TANGRAM_REFRESH_WAITING=1 (stock_refresh): the
    baseline that isolates what the refresh alone gives."""
    tree = policy.tree_cache
    if ((serving_of(tree) is None and not stock_refresh(tree)) or isinstance(active, CacheAwarePolicy)
            or not waiting_queue or not envs.SGLANG_ENABLE_WAITING_PREFIX_REFRESH.get()
            or not isinstance(getattr(tree, "eviction_strategy", None), LRUStrategy)):
        return original(policy, active, waiting_queue)
    head = _touch_head(waiting_queue)
    order = tuple(r.rid for r in head)
    if order == getattr(tree, "touched_order", None):
        return None
    tree.touched_order = order
    for req in reversed(head):
        touch_waiting_prefix(req, tree)
    return None


def stock_refresh(tree) -> bool:
    """TANGRAM_REFRESH_WAITING=1 on a stock tree SGLang itself would refresh (its radix tree, prefix
    sharing, no fast-match path): Tangram's waiting-queue touch without a profile."""
    return (os.environ.get("TANGRAM_REFRESH_WAITING") == "1" and tree.supports_prefix_sharing()
            and not tree.supports_fast_match_prefix())


# A touch walks each request's whole key (~20 ns a token): this bounds one pass's walk (~5 ms).
TOUCH_TOKENS_PER_PASS = 1 << 18


def _touch_head(waiting_queue) -> list:
    """The head of the queue whose keys fit TOUCH_TOKENS_PER_PASS (at least one request): the rest
    stay untouched, older than any touched history, so they lose theirs first, as the queue's tail."""
    head, tokens = [], 0
    for req in waiting_queue[:WAITING_QUEUE_PREFIX_MATCH_MAX]:
        tokens += len(req.origin_input_ids) + len(req.output_ids)
        if head and tokens > TOUCH_TOKENS_PER_PASS:
            break
        head.append(req)
    return head


def hand_graph_batch(runner, *args, **kwargs):
    """BEFORE DecodeCudaGraphRunner.execute: hand the batch's request ids to a Tangram backend (the
    replay view it is given carries none)."""
    receive = getattr(getattr(runner, "attn_backend", None), "graph_batch", None)
    forward_batch = kwargs.get("forward_batch", args[0] if args else None)
    if receive is not None:
        receive(getattr(forward_batch, "rids", None))
