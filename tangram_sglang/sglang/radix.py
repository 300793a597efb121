"""TangramRadixCache: SGLang's radix tree over compressed segments (``--radix-cache-backend tangram``).

Every node is one pool segment: a compressed chunk (atomic: its kept slots are not token
positions, so a match takes it whole or not at all) or a run of tokens kept whole (an assistant's
message, an open message's tail, generated tokens: splittable at any token). Chunks are cut by the
chunk rule (method/chunks.py), a function of the tokens alone, and a match takes a node only where
it keeps what the rule keeps for the matching sequence (``Cut.usable``, over the whole sequence of
the request that asks): so a hit is what a recompute would keep. The same tokens can still be held
in two forms: an open message's tail kept whole, and, once a later sequence completed or closed
that chunk, its compressed form; so, unlike a plain radix tree, a node may have several children
starting with the same token, and a match takes the longest usable one.

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

Eviction lives in radix_eviction.py, the host tier's side in radix_host.py, the integrity check in
radix_integrity.py (mixins and a function over this tree).

Host tier (``--tangram-host-ratio``): a leaf evicted for device room (admission, decode, a load) moves
to host pages whole, still compressed, and stays in the tree (its logical ids too, so SGLang counts
its tokens as cached); a host node's children are host nodes. A match walks into host nodes like
any other; the admission of the request that matched them loads them back (``load_back``) before
reserving its chunks. Host leaves are dropped, least recently used first, when the host needs room
(or SGLang asks for logical ids back).

Worked example (chat markers): A = [sys, user a, header] publishes sys's chunks, a's chunks and the
header kept whole; B = [sys, user b, header] matches sys's chunks (a message is its own chunk run)
and computes only b's; A's turn 2, [sys, a, header, reply, user c, header], matches all of A's
nodes (the header and its reply kept whole, as the rule keeps an assistant's message) and
computes only c's.
"""

from __future__ import annotations

import heapq
import itertools
import time

import numpy as np
import torch
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams, MatchResult
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey, TreeNode

from tangram_sglang.serving.tree_store import TreeStore
from tangram_sglang.sglang.radix_eviction import LeafEviction
from tangram_sglang.sglang.radix_host import HostTierTree
from tangram_sglang.sglang.radix_integrity import check_tree
from tangram_sglang.sglang.radix_sessions import SessionRefs


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


def request_sequence(req):
    """The request's whole sequence, origin_input_ids + output_ids, as its admission will cut it.
    SGLang brings full_untruncated_fill_ids up to it only in init_next_round_input: a request still in
    the waiting queue, which the lpm policy matches to sort it, has it empty (or short of its new
    output after a retraction), and a cut of that keeps nothing usable, so the match found nothing
    and touched nothing."""
    fill = req.full_untruncated_fill_ids
    if len(fill) == len(req.origin_input_ids) + len(req.output_ids):
        return fill
    return req.origin_input_ids + req.output_ids


class TangramRadixCache(LeafEviction, HostTierTree, RadixCache):
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
        node, pos = self._walk(key, split=True, cut=self._cut(params))
        if self.store.has_windows:
            while node is not self.root_node and not self.store.window_ready(self.chain(node)):
                pos -= len(node.tokens)
                node = node.parent
        return MatchResult(device_prefix_len=pos, last_device_node=node, last_host_node=node,
                           best_match_node=node)

    def _cut(self, params: MatchPrefixParams):
        """The chunk rule's cut of the sequence a match serves: the asking request's whole sequence (a
        message closes after the key's last token), or, without a request, the key as the start of an
        unknown one (only what every continuation cuts alike is usable)."""
        if self.store.cut is None:
            return None
        req = getattr(params, "req", None)
        if req is not None:
            return self.store.cut(request_sequence(req), ratio=getattr(req, "tangram_ratio", None))
        return self.store.cut(params.key.token_ids[: len(params.key)], whole=False)

    def touch_prefix(self, key: RadixKey) -> None:
        """Bump the recency of every node a match of ``key`` would use (SGLang's waiting-prefix
        refresh calls it head of the queue last, so LRU evicts the histories needed last first).
        Unlike a match it never splits: a partly matched uncompressed node is touched whole."""
        if not self.disable and len(key) > 0:
            self._walk(key, split=False)

    def _walk(self, key: RadixKey, *, split: bool, cut=None) -> tuple:
        """Follow ``key`` down the tree, touching each node used; returns (last node, tokens matched).
        With ``split``, a partly matched uncompressed node is split and its upper part counts;
        without, it is touched but not counted. With ``cut`` (method.chunks.Cut of the sequence) a node
        counts only where it keeps what that cut keeps (``Cut.usable``): a hit is then what a recompute
        of the sequence would keep."""
        tokens = _tokens(key.token_ids[: len(key)])
        node, pos, now = self.root_node, 0, time.monotonic()
        node.last_access_time = now
        while pos < tokens.size:
            best, best_len = None, 0
            for child in node.children.get(self._child_key(key.extra_key, tokens[pos]), ()):
                m = _common_prefix(child.tokens, tokens[pos:])
                if child.compressed and (m < child.tokens.size or (cut is not None and not cut.usable(
                        pos, pos + m, compressed=True, protected=child.geom.protected))):
                    continue
                if cut is not None and not child.compressed:
                    m = cut.usable_tokens(pos, pos + m)
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
                if parent is not self.root_node:
                    self.store.adopt_boundary(parent.seg, seg)
                self._replace_host_twin(twin, seg)
                parent = twin
            elif twin is not None:
                # Same tokens after the same chain: keep the tree's copy, free ours (stock dedup). Our
                # later segments continue it: the first one's page holding our copy's tail slots gets the
                # twin's (adopt_boundary), so a reader never mixes two requests' KV.
                self.token_to_kv_pool_allocator.free(ids.clone())
                self.req_to_token_pool.write((req.kv.req_pool_idx, slice(pos, end)), twin.value.to(row.dtype))
                self.store.drop(seg.seg_id)
                self.store.count("twin_segments")
                twin.last_access_time = time.monotonic()
                parent = twin
            else:
                if parent is not self.root_node:
                    self.store.adopt_boundary(parent.seg, seg)
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
            if (child.compressed == seg.compressed and child.geom.protected == seg.protected
                    and np.array_equal(child.tokens, tokens) and np.array_equal(child.geom.end_slots, seg.end_slots)):
                return child
        return None

    def on_release(self, req, *, checkpointed: bool) -> None:
        # Not checkpointed and not finished: decode ran out of pages and SGLang requeues it.
        self.store.left(req.rid, retracted=not checkpointed and not req.finished())

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
        check_tree(self)
