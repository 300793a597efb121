"""The KV a served conversation holds, against full KV: what "equal memory" is measured in.

A profile's ratio is nominal: the pool holds more (each turn's protected sinks and newest tokens, the
generated tokens uncompressed, partial pages). This drives the server's own control plane
(tangram_sglang.pool.RaggedKVCache, the code the server runs) through one conversation as the
fidelity runner serves it: every turn a request whose prefix is the conversation's history so far,
its new tokens in the profile's chunks with the served protection, one generated token per
intermediate turn (the runner asks for one), the answer's tokens at the last. The server reserves
exactly what a request uses (checked after every prefill), so the pages the pool holds at the end
are the pages the server held for the conversation on its own; times the page bytes, over the
full-KV bytes of the same tokens (every layer and KV head), that is the held share. Sliding-window
layers (Gemma 3, gpt-oss) count as the radix tree keeps them under pressure: interior nodes without
the window pages no later query reads (the tree drops those before it evicts a history).
"""

from __future__ import annotations

import numpy as np

from tangram_sglang.method.chunks import Markers, cut_tokens, reusable_prefix
from tangram_sglang.method.protection import Protection, min_keep
from tangram_sglang.pool import RaggedKVCache
from tangram_sglang.serving.context import chunk_size_of

PAGE_SIZE = 16   # the ragged pool's page (tangram_sglang/sglang/memory.py)


def held_share(profile, ratio: float, turns: list, answer_tokens: int, *, page_size: int = PAGE_SIZE,
               protection: Protection = Protection(), chunk: int | None = None, kv_dtype: str = "float32",
               model_value_bytes: int = 4, markers: Markers | None = None) -> float:
    """Pool bytes held for the conversation over full-KV bytes of the tokens whose KV it holds.

    turns: each turn's prompt (token ids; each extends the one before by the previous turn's
    generated token and the next user message), cut by the served chunk rule (``markers``: the chat
    template's, method/chunks.py); a turn reuses what the tree's match would (reusable_prefix).
    answer_tokens: tokens generated at the last. kv_dtype: the pool's storage type (PoolSpec dtype);
    full KV is in the model's type (model_value_bytes per value: float32 on a CPU).
    """
    chunk = chunk or chunk_size_of(profile)
    turn_ends = [len(t) for t in turns]
    total = turn_ends[-1] + max(0, answer_tokens - 1)
    virtual = profile.model.num_layers * profile.select(ratio).num_groups
    cache = RaggedKVCache.from_profile(profile, page_size=page_size, ratio=ratio, dtype=kv_dtype,  # room for any layout
                                       num_pages=virtual * (-(-total // page_size) + 4 * len(turn_ends) + 8))
    chain, cached, before = [], 0, None
    for turn, ids in enumerate(turns):
        generated = answer_tokens if turn == len(turns) - 1 else 1
        cut = cut_tokens(ids, chunk, protection, markers)
        if before is not None:   # the tree keeps the previous prompt's segments (its generated token is not in ids)
            cached = reusable_prefix(before, cut, min(cached, len(ids) - 1))
            chain = _chain_up_to(cache, chain, cached)
        sched, protect = cut.after(cached)
        rid = f"turn{turn}"
        if cache.admit(rid, chunk_tokens=sched, decode_tokens=generated, prefix=chain,
                       min_keep=min_keep(protect)) is None:
            raise RuntimeError("the simulated pool is too small (a sizing bug)")
        for n in sched:
            cache.prefill_chunk(rid, n)
            chain += cache.publish(rid)
        for _ in range(generated - 1):   # the first token comes from prefill; each later step stores one
            if cache.decode_step([rid]) is None:
                raise RuntimeError("the simulated pool is too small (a sizing bug)")
        chain += cache.publish(rid, include_tail=True)
        cache.release(rid)
        cache.check_integrity()
        cached, before = len(ids), cut
    for seg in chain[:-1]:   # sliding-window layers: what the tree keeps under pressure (the leaf: the match end)
        cache.drop_window_columns(seg.seg_id, chain[-1].end_slots)
    cache.check_integrity()
    pages = cache.spec.num_pages - cache.pool.num_free
    full = 2 * profile.model.num_layers * profile.model.num_kv_heads * profile.model.head_dim * model_value_bytes
    return pages * cache.spec.page_size_bytes / (total * full)


def _chain_up_to(cache, chain: list, tokens: int) -> list:
    """The chain's segments covering its first ``tokens`` tokens (an uncompressed one split where they end);
    the rest, which this conversation never reads again, evicted (as the tree's LRU would)."""
    out, pos = [], 0
    for i, seg in enumerate(chain):
        if pos + seg.num_tokens > tokens:
            if pos < tokens:
                upper, lower = cache.store.split(seg.seg_id, tokens - pos)
                out.append(upper)
                cache.evict(lower.seg_id)
            else:
                cache.evict(seg.seg_id)
            for rest in chain[i + 1:]:
                cache.evict(rest.seg_id)
            break
        out.append(seg)
        pos += seg.num_tokens
    return out


def mean_held_share(profile, ratio: float, conversations, answers: dict[str, int], **kw) -> float | None:
    """Mean over the conversations with a recorded answer (answers: id -> answer tokens)."""
    shares = [held_share(profile, ratio, list(c.turns), answers[c.id], **kw)
              for c in conversations if c.id in answers]
    return float(np.mean(shares)) if shares else None
