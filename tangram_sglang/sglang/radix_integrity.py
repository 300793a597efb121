"""The segment radix tree's integrity check (sglang/radix.py TangramRadixCache.check_integrity)."""

from __future__ import annotations

import numpy as np


def check_tree(tree) -> None:
    """Every node's segment is alive (in device pages or the host tier's) and continues its parent's
    chain; a host node's children are host nodes; sizes, host pages and session references add up.
    Raises AssertionError (or the pool's PoolError) naming the first broken rule."""
    total = protected = host_tokens = 0
    held_host = []
    for node in tree._nodes():
        if node.on_host:
            if node.seg is not None:
                raise AssertionError(f"node {node.id}: on the host tier and the device at once")
            seg = node.host
            held_host.append(seg)
            host_tokens += len(node.tokens)
        else:
            seg = tree.store.segment(node.seg.seg_id)
            if node.parent is not tree.root_node and node.parent.on_host:
                raise AssertionError(f"node {node.id}: on the device below a host node")
        if not (len(node.tokens) == node.value.numel() == seg.num_tokens):
            raise AssertionError(f"node {node.id}: {len(node.tokens)} tokens, {node.value.numel()} ids, "
                                 f"segment of {seg.num_tokens}")
        start = node.parent.geom.end_slots if node.parent is not tree.root_node else np.zeros_like(seg.start_slots)
        if not np.array_equal(seg.start_slots, start):
            raise AssertionError(f"node {node.id}: segment does not continue its parent's chain")
        if node.lock_ref < 0:
            raise AssertionError(f"node {node.id}: negative lock_ref")
        total += len(node.tokens)
        protected += len(node.tokens) if node.lock_ref > 0 else 0
    if total != tree.evictable_size_ + tree.protected_size_ or protected != tree.protected_size_:
        raise AssertionError(f"tree sizes: {total} tokens ({protected} locked) but evictable="
                             f"{tree.evictable_size_} protected={tree.protected_size_}")
    if host_tokens != tree.host_tokens_:
        raise AssertionError(f"host tier: {host_tokens} tokens in host nodes, {tree.host_tokens_} counted")
    tree.store.check_host(held_host)
    tree.sessions.check(list(tree._nodes()), tree.root_node)
    tree_segs = {n.seg.seg_id for n in tree._nodes() if not n.on_host}
    if tree_segs != tree.store.segment_ids():
        raise AssertionError(f"segments outside the tree: {sorted(tree.store.segment_ids() - tree_segs)[:5]}")
