"""LeafEviction: how the segment radix tree (sglang/radix.py) makes room, as a mixin of TangramRadixCache.

Device leaves (unlocked nodes with no child on the device) are evicted by SGLang's strategy (LRU by
default; with the session radix cache, unreferenced leaves first) from a lazy heap: entries of nodes
no longer leaves are skipped, an entry whose priority changed is pushed again. Eviction for device room
(an admission, a decode step, a load) moves a leaf to the host tier when there is one (radix_host.py);
SGLang's own evict wants logical ids back, so it drops host leaves first and never offloads.
"""

from __future__ import annotations

import heapq
import time

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult

from tangram_sglang.sglang.radix_windows import drop_windows

OFFLOAD_REASONS = ("admission", "decode", "load")   # evictions for device room: to the host tier when there is one


class LeafEviction:
    def _evict_leaf(self, node, reason: str) -> int:
        """Evict one unlocked device leaf: to the host tier when it is for device room and the host
        can hold it, else dropped (its logical ids and its segment's page references, and its host
        children first); returns its tokens."""
        if reason in OFFLOAD_REASONS and self.store.has_host:
            moved = self._offload(node, reason)
            if moved:
                return moved
        for child in [k for kids in node.children.values() for k in kids]:
            self._drop_host_subtree(child)
        self.token_to_kv_pool_allocator.free(node.value)
        self.store.drop(node.seg.seg_id, evicted=reason)
        self._delete_leaf(node)
        return len(node.tokens)

    def evict(self, params: EvictParams) -> EvictResult:
        """SGLang's evict: frees logical ids, so host leaves go first, then device leaves, dropped."""
        if self.disable:
            return EvictResult()
        start, evicted = time.perf_counter(), 0
        while evicted < params.num_tokens:
            got = self._drop_one_host() or self._evict_one("sglang")
            if got == 0:
                break
            evicted += got
        self.update_eviction_metrics(evicted, start)
        return EvictResult(num_tokens_evicted=evicted)

    def _evict_one(self, reason: str) -> int:
        """Evict the lowest-priority evictable leaf (SGLang's eviction strategy, LRU by default).

        A lazy heap: entries of nodes no longer evictable are dropped, and an entry whose
        node's priority changed since (a new access) is pushed again with the new one, so
        each eviction costs O(log leaves), not a scan of every leaf."""
        node = self._pop_leaf(self._heap, self.evictable_leaves)
        return 0 if node is None else self._evict_leaf(node, reason)

    def _pop_leaf(self, heap: list, leaves: set):
        """The lowest-priority node of a lazy heap that is still in leaves (None: none): entries of nodes
        no longer there are dropped, one whose priority changed is pushed again with the new one."""
        while heap:
            prio, nid, _, node = heapq.heappop(heap)
            if node not in leaves:
                continue
            now = self._priority(node)
            if now != prio:
                heapq.heappush(heap, (now, nid, next(self._seq), node))
                continue
            return node
        return None

    def evict_pages(self, pages: int, reason: str = "admission") -> bool:
        """Evict LRU leaves until the pool has ``pages`` more available pages (reason: what asked,
        counted in PoolCounters.evicted_tokens_<reason>).

        When evicting every unlocked leaf could not make that room, evict nothing and return False:
        the caller waits (or SGLang retracts) and the cached histories stay for the requests that
        come back to them. A request that cannot be admitted yet must not flush the tree on every
        scheduling pass; stock SGLang's admission likewise counts evictable tokens before evicting."""
        goal = self.store.available_pages + pages
        if self.store.tree_pages < pages or self.freeable_pages() < pages:  # the first: O(1), no walk
            self.store.count("evictions_refused")
            return False
        if self.store.has_windows:
            drop_windows(self, goal)
        while self.store.available_pages < goal:
            if self._evict_one(reason) == 0:
                return False
        return True

    def evict_all(self, reason: str) -> None:
        """Drop every unlocked node, host tier included (reason: not one that offloads)."""
        while self._drop_one_host() or self._evict_one(reason):
            pass

    def freeable_pages(self) -> int:
        """Pages evicting every unlocked node would free (with sliding-window layers an upper
        bound: locked nodes' window columns counted too). Changes nothing; O(nodes)."""
        unlocked, locked = [], []
        for node in self._nodes():
            if not node.on_host:
                (unlocked if node.lock_ref == 0 else locked).append(node.seg.seg_id)
        return self.store.freeable_pages(unlocked, locked)

    def _delete_leaf(self, node):
        self.sessions.on_delete(node, self.root_node)
        self._remove_child(node.parent, node)
        self.evictable_size_ -= len(node.tokens)
        self.evictable_leaves.discard(node)
        self.host_leaves.discard(node)
        self._update_leaf_status(node.parent)

    def _update_leaf_status(self, node):
        """Device leaves (unlocked, no child on the device: evicted for device room) and host leaves
        (unlocked host nodes without children: dropped for host room), each with its lazy heap."""
        if node is self.root_node:
            return
        leaves, other, heap = ((self.host_leaves, self.evictable_leaves, self._host_heap) if node.on_host
                               else (self.evictable_leaves, self.host_leaves, self._heap))
        other.discard(node)
        if node.lock_ref > 0 or self._has_leaf_child(node):
            leaves.discard(node)
        elif node not in leaves:
            leaves.add(node)
            heapq.heappush(heap, (self._priority(node), node.id, next(self._seq), node))

    def _has_leaf_child(self, node) -> bool:
        """Whether a child keeps node from being a leaf: any child for a host node, a device child for a device node."""
        if node.on_host or not self.host_tokens_:
            return bool(node.children)
        return any(not k.on_host for kids in node.children.values() for k in kids)
