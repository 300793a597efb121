"""HostTierTree: the radix tree's side of the compressed host tier (``--tangram-host-ratio``), a mixin of
TangramRadixCache (sglang/radix.py).

A leaf evicted for device room moves to host pages (TreeStore.offload) and stays in the tree with its
logical ids; a host node's children are host nodes. ``load_back`` brings the host part of a matched
path into device pages before the request that matched it is admitted. Host leaves (unlocked host
nodes without children) are dropped least recently used first when the host needs room.
"""

from __future__ import annotations

import time


class HostTierTree:
    def load_back(self, node) -> bool:
        """Load the host segments on the path root -> node into device pages, top down, evicting
        (offloading) unlocked leaves for the pages they lack, in one pass; the caller holds a lock on
        node. False (nothing loaded) when that room is not there: the request waits."""
        path = []
        while node is not self.root_node and node.on_host:
            path.append(node)
            node = node.parent
        short = sum(n.host.num_pages for n in path) - self.store.available_pages
        if short > 0 and not self.evict_pages(short, "load"):
            self.store.count("load_waits")
            return False
        for n in reversed(path):
            seg = self.store.load(n.host)
            if seg is None:   # the room was made above and nothing took it: a broken invariant
                raise AssertionError(f"host node {n.id}: {n.host.num_pages} pages not available after eviction")
            self.host_tokens_ -= len(n.tokens)
            n.host, n.seg = None, seg
            self._update_leaf_status(n)
            self._update_leaf_status(n.parent)
        return True

    def _offload(self, node, reason: str) -> int:
        """Move an unlocked device leaf to the host tier, dropping host leaves (LRU) for its room;
        returns its tokens, or 0 (nothing moved) when the host cannot hold it."""
        need = node.seg.num_pages
        if need > self.store.host_total_pages:
            return 0
        while self.store.host_free_pages < need:
            if self._drop_one_host() == 0:
                return 0
        hseg = self.store.offload(node.seg.seg_id, reason)
        if hseg is None:
            return 0
        node.seg, node.host = None, hseg
        self.host_tokens_ += len(node.tokens)
        self.evictable_leaves.discard(node)
        self._update_leaf_status(node)
        self._update_leaf_status(node.parent)
        return len(node.tokens)

    def _drop_one_host(self) -> int:
        """Drop the least recently used host leaf (its logical ids and host pages); returns its tokens (0: none)."""
        node = self._pop_leaf(self._host_heap, self.host_leaves)
        return 0 if node is None else self._drop_host_node(node)

    def _drop_host_node(self, node) -> int:
        self.token_to_kv_pool_allocator.free(node.value)
        self.store.drop_host(node.host)
        self.host_tokens_ -= len(node.tokens)
        self._delete_leaf(node)
        return len(node.tokens)

    def device_tokens(self) -> int:
        """Tokens of the nodes whose segments are in device pages."""
        return self.total_tokens() - self.host_tokens_

    def _drop_host_subtree(self, node) -> None:
        """Drop a host node and everything below it (all on the host tier), leaves first."""
        for child in [k for kids in node.children.values() for k in kids]:
            self._drop_host_subtree(child)
        self._drop_host_node(node)

    def _replace_host_twin(self, twin, seg) -> None:
        """A published device segment takes the place of its twin on the host tier (a load for free)."""
        self.store.drop_host(twin.host, evicted=False)
        self.host_tokens_ -= len(twin.tokens)
        twin.host, twin.seg = None, seg
        twin.last_access_time = time.monotonic()
        self._update_leaf_status(twin)
        self._update_leaf_status(twin.parent)
        self.store.count("published_segments")
