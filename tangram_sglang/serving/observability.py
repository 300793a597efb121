"""What the pool reports (/server_info, the log line, the gauges) and its integrity check.

Read-only views over the serving state and the radix tree, from running counters: O(running
requests), never a walk of the pool, except ``check_integrity`` (O(pool), on demand).
"""

from __future__ import annotations

from tangram_sglang.serving.runtime import RequestState, TangramServing


def pool_info(serving: TangramServing, tree) -> dict:
    """The pool's figures; tree: the radix tree holding published segments (None: not built)."""
    ctx, u = serving.context, serving.cache.usage()
    spec = ctx.spec
    used = u.total - u.free
    held = tokens_held(serving, tree)
    full_bytes = held * ctx.full_kv_token_bytes
    held_bytes = used * spec.page_size_bytes
    return {
        "pages_total": u.total, "pages_used": used, "pages_free": u.free, "pages_reserved": u.reserved,
        "pages_held_by_tree": u.held_by_tree, "page_size": spec.page_size,
        "page_bytes": spec.page_size_bytes, "pool_bytes": spec.pool_bytes, "kv_dtype": spec.dtype,
        "bytes_held": held_bytes, "tokens_held": held, "full_kv_bytes_for_tokens_held": full_bytes,
        "saved_vs_full_kv": (1.0 - held_bytes / full_bytes) if full_bytes else 0.0,
        "stock_kv_tokens_same_bytes": ctx.stock_tokens, "chunk_tokens": ctx.chunk,
        "max_prompt_tokens": serving.admission.max_prompt_tokens(),
        "data_plane": ctx.data_plane, "tp_size": ctx.tp[0], "tp_rank": ctx.tp[1],
        "host_pages_total": serving.tree_store.host_total_pages,
        "host_pages_used": serving.tree_store.host_total_pages - serving.tree_store.host_free_pages,
        "host_bytes": serving.host.bytes if serving.host is not None else 0,
        "host_tokens": tree.host_tokens_ if tree is not None else 0,
        "running_requests": len(serving.requests), "scorer_state_bytes": scorer_state_bytes(serving),
        **serving.counters.__dict__,
    }


def scorer_state_bytes(serving: TangramServing) -> int:
    """Bytes scorers keep across chunks for requests still prefilling (freed at the last chunk)."""
    return sum(t.numel() * t.element_size() for st in serving.requests.values() for ss in st.scorer_states
               for t in ss.tensors.values())


def tokens_held(serving: TangramServing, tree) -> int:
    """Tokens whose KV the pool holds: requests' own tokens plus the tree's (prefixes counted once)."""
    tree_tokens = tree.device_tokens() if tree is not None else 0   # the host tier's are not in the pool
    own = sum(max(0, _request_tokens(serving, s)) for s in serving.requests.values())
    return tree_tokens + own


def _request_tokens(serving: TangramServing, state: RequestState) -> int:
    req = serving.cache.requests.get(state.rid)
    if req is None:
        return 0
    done = sum(req.plan.chunk_tokens[: len(req.chunk_ends)])
    decoded = int((req.pages.lens - (req.chunk_ends[-1] if req.chunk_ends else req.plan.prefix_slots)).max(initial=0)) \
        if req.prefill_done else 0
    return state.prefix_tokens + done + decoded - req.published.tokens


def log_line(info: dict) -> str:
    evicted = sum(info[f"evicted_tokens_{why}"] for why in ("admission", "decode", "flush", "sglang", "load"))
    return (f"tangram pages: {info['pages_used']}/{info['pages_total']} used "
            f"({info['pages_held_by_tree']} in tree), saved {100 * info['saved_vs_full_kv']:.1f}% of full KV; "
            f"tokens matched {info['matched_tokens']}, evicted {evicted}"
            + (f"; host tier {info['host_pages_used']}/{info['host_pages_total']} pages, tokens offloaded "
               f"{info['offloaded_tokens']}, loaded {info['loaded_tokens']}" if info["host_pages_total"] else ""))


def check_integrity(serving: TangramServing, tree) -> None:
    """Raise PoolError (or the tree's error) on any broken invariant of the pool, the tree and the
    device block tables."""
    serving.cache.check_integrity()
    if tree is not None:
        tree.check_integrity()
    for rid, state in serving.requests.items():
        if state.row is not None and serving.tables.mirrors(state.row, rid):
            serving.tables.check(state.row, serving.cache.requests[rid].pages)
