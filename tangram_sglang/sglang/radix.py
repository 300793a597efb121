"""TangramRadixCache: SGLang's radix tree over compressed segments (``--radix-cache-backend tangram``).

Every node is one pool segment: a compressed prompt chunk (atomic: its kept
slots are not token positions, so a match takes it whole or not at all) or a
run of uncompressed generated tokens (splittable at any token). Because
chunking depends on where a request's cached prefix ended, two requests can
compress the same tokens into differently cut segments; so, unlike a plain
radix tree, a node may have several children starting with the same token,
and a match takes the longest child that is fully usable.

SGLang still sees what it expects: node.value holds one logical token id per
token (ids from the Tangram allocator, with no KV behind them), lock
references and evictable / protected token counts work as in RadixCache, and
checkpoint() repoints the request's req_to_token row onto the tree's ids.
Evicting a node frees its logical ids and drops its segment's page references.

Sliding-window layers (Gemma 2 / 3): a match may only end where every window layer still
holds the pages its next query reads (``TreeStore.window_ready``; a match backs up to the
deepest such node). When admission needs pages, interior nodes give up being match ends,
least recently used first, and drop the window pages no query at or after the earliest match end
below them reads (SGLang's SWA radix tree's tombstones); leaves are evicted after that.

Host tier (``--tangram-host-ratio``): a leaf evicted for device room (admission, decode, a load) moves
to host pages whole, still compressed, and stays in the tree (its logical ids too, so SGLang counts
its tokens as cached); a host node's children are host nodes. A match walks into host nodes like
any other; the admission of the request that matched them loads them back (``load_back``) before
reserving its chunks. Host leaves are dropped, least recently used first, when the host needs room
(or SGLang asks for logical ids back).

Worked example: request A = [sys, a] (one chunk) finished; request B = [sys, b]
matches nothing (sys sits inside A's atomic chunk), compresses [sys, b] itself
and becomes root's second child starting with sys's first token. B's turn 2,
[sys, b, out_b, c], matches B's chunk and its uncompressed tail.
"""

from __future__ import annotations

import heapq
import itertools
import time

import numpy as np
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult, MatchPrefixParams, MatchResult
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey, TreeNode

from tangram_sglang.serving.tree_store import TreeStore
from tangram_sglang.sglang.radix_sessions import SessionRefs
from tangram_sglang.sglang.radix_windows import drop_windows


OFFLOAD_REASONS = ("admission", "decode", "load")   # evictions for device room: to the host tier when there is one


class SegNode(TreeNode):
    def __init__(self, *, tokens: np.ndarray, value: torch.Tensor, seg, extra_key=None):
        super().__init__()
        self.children: dict = {}          # (extra_key, first token) -> list[SegNode]
        self.tokens = tokens              # int64 [n]
        self.key = RadixKey(token_ids=tokens.tolist(), extra_key=extra_key)
        self.value = value                # int64 [n] logical ids
        self.seg = seg                    # pool Segment (None for the root and while on the host tier)
        self.host = None                  # HostSegment while on the host tier
        self.extra_key = extra_key
        self.window_end = None            # int [V]: the latest match end below it it dropped window pages for
        self.sessions: dict = {}          # session id -> its frontiers at or below (radix_sessions.py)

    @property
    def on_host(self) -> bool:
        return self.host is not None

    @property
    def geom(self):
        """The node's segment wherever it lies: its device Segment or its HostSegment (None: root)."""
        return self.seg if self.seg is not None else self.host

    @property
    def compressed(self) -> bool:
        return self.geom is not None and self.geom.compressed


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _tokens(ids) -> np.ndarray:
    return np.asarray(ids, dtype=np.int64)


class TangramRadixCache(RadixCache):
    def __init__(self, params, store: TreeStore):
        self.store = store                       # the serving state's narrow interface (its only link)
        self.touched_order: tuple | None = None  # the waiting queue's head last touched (scheduling.py)
        self.sessions = SessionRefs(bool(getattr(params, "enable_session_radix_cache", False)))
        self.enable_session_radix_cache = self.sessions.enabled   # what SGLang's cache registry checks
        super().__init__(params)

    # -- structure -------------------------------------------------------------------------------
    def reset(self):
        if getattr(self, "root_node", None) is not None:
            for node in self._nodes():
                if node.on_host:
                    self.store.drop_host(node.host, evicted=False)
                else:
                    self.store.drop(node.seg.seg_id)
        super().reset()
        self.sessions.reset()
        self._heap: list = []  # (priority, id, seq, node) of evictable leaves; stale entries skipped
        self._host_heap: list = []     # the same for host leaves
        self.host_leaves: set = set()  # unlocked host nodes without children
        self.host_tokens_ = 0          # tokens of the nodes on the host tier
        self._seq = itertools.count()
        root = SegNode(tokens=np.zeros(0, np.int64), value=[], seg=None)
        root.lock_ref = 1
        self.root_node = root
        self._empty_match_result = self._empty_match_result._replace(
            last_device_node=root, last_host_node=root, best_match_node=root)

    def _nodes(self):
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            for kids in node.children.values():
                stack.extend(kids)
            if node is not self.root_node:
                yield node

    @staticmethod
    def _child_key(extra_key, token) -> tuple:
        return (extra_key, int(token))

    def _add_child(self, parent: SegNode, child: SegNode) -> None:
        child.parent = parent
        parent.children.setdefault(self._child_key(child.extra_key, child.tokens[0]), []).append(child)

    def _remove_child(self, parent: SegNode, child: SegNode) -> None:
        key = self._child_key(child.extra_key, child.tokens[0])
        kids = parent.children[key]
        kids.remove(child)
        if not kids:
            del parent.children[key]

    # -- match -----------------------------------------------------------------------------------
    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        key = params.key
        if self.disable or len(key) == 0:
            return self._empty_match_result
        node, pos = self._walk(key, split=True)
        if self.store.has_windows:
            while node is not self.root_node and not self.store.window_ready(self.chain(node)):
                pos -= len(node.tokens)
                node = node.parent
        return MatchResult(device_prefix_len=pos, last_device_node=node, last_host_node=node,
                           best_match_node=node)

    def touch_prefix(self, key: RadixKey) -> None:
        """Bump the recency of every node a match of ``key`` would use (SGLang's waiting-prefix
        refresh calls it head of the queue last, so LRU evicts the histories needed last first).
        Unlike a match it never splits: a partly matched uncompressed node is touched whole."""
        if not self.disable and len(key) > 0:
            self._walk(key, split=False)

    def _walk(self, key: RadixKey, *, split: bool) -> tuple:
        """Follow ``key`` down the tree, touching each node used; returns (last node, tokens matched).
        With ``split``, a partly matched uncompressed node is split and its upper part counts;
        without, it is touched but not counted."""
        tokens = _tokens(key.token_ids[: len(key)])
        node, pos, now = self.root_node, 0, time.monotonic()
        node.last_access_time = now
        while pos < tokens.size:
            best, best_len = None, 0
            for child in node.children.get(self._child_key(key.extra_key, tokens[pos]), ()):
                m = _common_prefix(child.tokens, tokens[pos:])
                if child.compressed and m < child.tokens.size:
                    continue
                if m > best_len:
                    best, best_len = child, m
            if best is None:
                break
            best.last_access_time = now
            if best_len < best.tokens.size:
                if split:
                    node, pos = self._split(best, best_len), pos + best_len
                break
            node, pos = best, pos + best_len
        return node, pos

    def _split(self, node: SegNode, n: int) -> SegNode:
        """Split an uncompressed node after n tokens (on the device or the host tier); returns the new upper node."""
        if node.on_host:
            part0, part1 = self.store.split_host(node.host, n)
        else:
            part0, part1 = self.store.split(node.seg.seg_id, n)
        upper = SegNode(tokens=node.tokens[:n], value=node.value[:n].clone(), seg=None, extra_key=node.extra_key)
        if node.on_host:
            upper.host, node.host = part0, part1
        else:
            upper.seg, node.seg = part0, part1
        upper.lock_ref, upper.last_access_time, upper.priority = node.lock_ref, node.last_access_time, node.priority
        parent = node.parent
        self._remove_child(parent, node)
        self._add_child(parent, upper)
        node.tokens, node.value = node.tokens[n:], node.value[n:].clone()
        node.key = RadixKey(token_ids=node.tokens.tolist(), extra_key=node.extra_key)
        self._add_child(upper, node)
        SessionRefs.on_split(upper, node)
        return upper

    def chain(self, node: SegNode) -> list:
        """Pool segments on the path root -> node, in order (all on the device: load_back first)."""
        segs = []
        while node is not self.root_node:
            if node.on_host:
                raise AssertionError(f"node {node.id} is on the host tier: load it back before reading its chain")
            segs.append(node.seg)
            node = node.parent
        return segs[::-1]

    # -- the host tier ----------------------------------------------------------------------------
    def load_back(self, node: SegNode) -> bool:
        """Load the host segments on the path root -> node into device pages, top down, evicting
        (offloading) unlocked leaves for their room; the caller holds a lock on node. False when
        the room is not there: what was loaded stays loaded, and the request waits."""
        path = []
        while node is not self.root_node and node.on_host:
            path.append(node)
            node = node.parent
        for n in reversed(path):
            seg = self.store.load(n.host)
            if seg is None and self.evict_pages(n.host.num_pages, "load"):
                seg = self.store.load(n.host)
            if seg is None:
                self.store.count("load_waits")
                return False
            self.host_tokens_ -= len(n.tokens)
            n.host, n.seg = None, seg
            self._update_leaf_status(n)
            self._update_leaf_status(n.parent)
        return True

    def _offload(self, node: SegNode, reason: str) -> int:
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

    def _drop_host_node(self, node: SegNode) -> int:
        self.token_to_kv_pool_allocator.free(node.value)
        self.store.drop_host(node.host)
        self.host_tokens_ -= len(node.tokens)
        self._delete_leaf(node)
        return len(node.tokens)

    def device_tokens(self) -> int:
        """Tokens of the nodes whose segments are in device pages."""
        return self.total_tokens() - self.host_tokens_

    # -- insert ----------------------------------------------------------------------------------
    def checkpoint(self, req, *, up_to: int, **kwargs):
        """Publish the request's finished chunks (and, once finished, its generated tokens)."""
        if self.disable:
            return
        published = self.store.publish(req.rid, include_tail=req.finished())
        if published is None:
            return
        segs, pub = published  # the pool's record owns where the chain ends; the tree links and reports
        parent, pos, detached = pub.node, pub.tokens, pub.detached
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        fill = req.full_untruncated_fill_ids
        for seg in segs:
            end = pos + seg.num_tokens
            if detached or end > up_to or seg.num_tokens == 0:
                # Out of the tree, and so is every later segment of this request (its chain runs
                # through this one): the pool ran ahead of what SGLang keeps (should not happen),
                # or the request's history now continues a twin (below).
                detached = True
                self.store.drop(seg.seg_id)
                self.store.count("detached_segments")
                continue
            tokens = _tokens(fill[pos:end])
            ids = row[pos:end].to(torch.int64)
            twin = self._twin(parent, tokens, seg, req.extra_key)
            if twin is not None and twin.on_host:
                # The host tier holds these tokens in this layout: our device copy takes its place
                # (a load for free); our later segments continue it, so nothing detaches.
                self.token_to_kv_pool_allocator.free(ids.clone())
                self.req_to_token_pool.write((req.kv.req_pool_idx, slice(pos, end)), twin.value.to(row.dtype))
                self.store.drop_host(twin.host, evicted=False)
                self.host_tokens_ -= len(twin.tokens)
                twin.host, twin.seg = None, seg
                twin.last_access_time = time.monotonic()
                self._update_leaf_status(twin)
                self._update_leaf_status(parent)
                self.store.count("published_segments")
                parent = twin
            elif twin is not None:
                # Same tokens after the same chain: keep the tree's copy, free ours (stock dedup).
                # Our later segments start on pages holding OUR copy of this segment's tail slots;
                # under the twin a reader would mix two requests' KV (equal only if compression is
                # bit-deterministic, which batched GPU kernels are not): they are not published.
                self.token_to_kv_pool_allocator.free(ids.clone())
                self.req_to_token_pool.write((req.kv.req_pool_idx, slice(pos, end)), twin.value.to(row.dtype))
                self.store.drop(seg.seg_id)
                self.store.count("twin_segments")
                twin.last_access_time = time.monotonic()
                parent, detached = twin, True
            else:
                node = SegNode(tokens=tokens, value=ids.clone(), seg=seg, extra_key=req.extra_key)
                self._add_child(parent, node)
                self.evictable_size_ += seg.num_tokens
                self._update_leaf_status(parent)
                self._update_leaf_status(node)
                self.store.count("published_segments")
                parent = node
            pos = end
        pub.link(parent, pos, detached)
        req.kv.cache_protected_len = pos
        self.unlock(req.lock)
        req.lock = self.lock(parent)
        req.last_node = parent  # SGLang's mirror of pub.node
        if self.sessions.enabled and req.finished():
            from sglang.srt.managers.schedule_batch import FINISH_ABORT

            if not isinstance(req.finished_reason, FINISH_ABORT):
                self.sessions.register(req, parent, self.root_node)

    # -- sessions (SGLang's session radix cache contract) ---------------------------------------------
    def open_radix_session(self, session_id: str) -> int:
        return self.sessions.open(session_id)

    def ensure_session_generation(self, session_id: str) -> int:
        return self.sessions.ensure_generation(session_id)

    def release_radix_session(self, session_id: str) -> int:
        """Close: the session's segments stay cached, unreferenced (evicted before referenced ones)."""
        for node in self.sessions.release(session_id, self.root_node):
            if node in self.evictable_leaves:   # its heap entry ranks it as referenced: rank it again
                heapq.heappush(self._heap, (self._priority(node), node.id, next(self._seq), node))
        return 0

    def _priority(self, node: SegNode) -> tuple:
        """Eviction rank: leaves no open session references first, then SGLang's strategy (LRU)."""
        return (1 if node.sessions else 0, self.eviction_strategy.get_priority(node))

    def _twin(self, parent: SegNode, tokens: np.ndarray, seg, extra_key):
        """A child holding the same tokens in the same slot layout (a chunk kept with another count,
        e.g. once as a prompt's last chunk with its newest tokens protected, is not a twin)."""
        for child in parent.children.get(self._child_key(extra_key, tokens[0]), ()):
            if (child.compressed == seg.compressed and np.array_equal(child.tokens, tokens)
                    and np.array_equal(child.geom.end_slots, seg.end_slots)):
                return child
        return None

    def on_release(self, req, *, checkpointed: bool) -> None:
        # Not checkpointed and not finished: decode ran out of pages and SGLang requeues it.
        self.store.left(req.rid, retracted=not checkpointed and not req.finished())

    # -- eviction --------------------------------------------------------------------------------
    def _evict_leaf(self, node: SegNode, reason: str) -> int:
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

    def _drop_host_subtree(self, node: SegNode) -> None:
        """Drop a host node and everything below it (all on the host tier), leaves first."""
        for child in [k for kids in node.children.values() for k in kids]:
            self._drop_host_subtree(child)
        self._drop_host_node(node)

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

    # -- views -----------------------------------------------------------------------------------
    def total_tokens(self) -> int:
        return self.evictable_size_ + self.protected_size_

    def _total_size_helper(self):
        return sum(len(n.tokens) for n in self._nodes())

    def all_values_flatten(self):
        vals = [n.value for n in self._nodes()]
        return torch.cat(vals) if vals else torch.zeros(0, dtype=torch.int64)

    def _print_helper(self, node, indent: int):
        stack = [(node, indent)]
        while stack:
            cur, ind = stack.pop()
            kind = "root" if cur is self.root_node else ("chunk" if cur.compressed else "tail")
            print(" " * ind, kind, len(cur.tokens), cur.tokens[:8].tolist(), f"r={cur.lock_ref}")
            for kids in cur.children.values():
                stack.extend((k, ind + 2) for k in kids)

    def check_integrity(self) -> None:
        """Every node's segment is alive (in device pages or the host tier's) and continues its
        parent's chain; a host node's children are host nodes; sizes and host pages add up."""
        total = protected = host_tokens = 0
        held_host = []
        for node in self._nodes():
            if node.on_host:
                if node.seg is not None:
                    raise AssertionError(f"node {node.id}: on the host tier and the device at once")
                seg = node.host
                held_host.append(seg)
                host_tokens += len(node.tokens)
            else:
                seg = self.store.segment(node.seg.seg_id)
                if node.parent is not self.root_node and node.parent.on_host:
                    raise AssertionError(f"node {node.id}: on the device below a host node")
            if not (len(node.tokens) == node.value.numel() == seg.num_tokens):
                raise AssertionError(f"node {node.id}: {len(node.tokens)} tokens, {node.value.numel()} ids, "
                                     f"segment of {seg.num_tokens}")
            start = node.parent.geom.end_slots if node.parent is not self.root_node else np.zeros_like(seg.start_slots)
            if not np.array_equal(seg.start_slots, start):
                raise AssertionError(f"node {node.id}: segment does not continue its parent's chain")
            if node.lock_ref < 0:
                raise AssertionError(f"node {node.id}: negative lock_ref")
            total += len(node.tokens)
            protected += len(node.tokens) if node.lock_ref > 0 else 0
        if total != self.evictable_size_ + self.protected_size_ or protected != self.protected_size_:
            raise AssertionError(f"tree sizes: {total} tokens ({protected} locked) but evictable="
                                 f"{self.evictable_size_} protected={self.protected_size_}")
        if host_tokens != self.host_tokens_:
            raise AssertionError(f"host tier: {host_tokens} tokens in host nodes, {self.host_tokens_} counted")
        self.store.check_host(held_host)
        self.sessions.check(list(self._nodes()), self.root_node)
        tree_segs = {n.seg.seg_id for n in self._nodes() if not n.on_host}
        if tree_segs != self.store.segment_ids():
            raise AssertionError(f"segments outside the tree: {sorted(self.store.segment_ids() - tree_segs)[:5]}")
