"""The compressed host tier (--tangram-host-ratio) under the serving soak's driver: segments evicted
for device room move to host pages and come back on a match, with their KV.

Every slot a request writes gets a stamp of (the tokens through what it encodes, virtual layer,
chain slot); after operations, every device node's slots must hold their stamps when read the way
a later request reads them (its chain's page table), so a load that copied the wrong page, a split
host segment that lost its boundary page, or a page freed while the host still needed it fails.
"""

import random

import numpy as np
import pytest
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from tangram_sglang.pool.host_pages import HostPages
from tangram_sglang.pool.segments import assemble
from tangram_sglang.pool.spec import PoolError
from test_serving_tree_soak import Driver, FakeReq, as_request


def _path_hash(tokens) -> int:
    h = 17
    for t in tokens:
        h = (h * 1_000_003 + int(t) + 1) % 2_147_483_647
    return h


def _stamp(path_hash: int, v: int, slots: np.ndarray) -> np.ndarray:
    """float32-exact stamps (< 2**24)."""
    return ((path_hash % 65_521) * 257 + v * 131 + slots) % (2**24 - 1)


class StampedDriver(Driver):
    """The soak driver writing stamps where the data plane would write K."""

    def _flat(self):
        data = self.serving.data
        return data.k_pages.view(-1, data.spec.heads_per_group, data.spec.head_dim)

    def _write(self, rid, before, tokens_through, whole: bool):
        """Stamp the slots written since ``before``: a compressed chunk's with the hash of the tokens
        through its end; tokens kept whole (a full chunk, a decode step) one by one, each with the hash
        of the tokens through it (so a split of an uncompressed node keeps matching)."""
        pages = self.serving.cache.requests[rid].pages
        P, h = pages.page_size, _path_hash(tokens_through)
        flat = self._flat()
        start = len(tokens_through) - int((pages.lens - before).max(initial=0))
        for v in range(pages.num_virtual):
            s = np.arange(before[v], pages.lens[v])
            idx = pages.pages[v, s // P].astype(np.int64) * P + s % P
            flat[idx] = float("nan")  # replaced below: a stamp never written reads as NaN
            for j, (i, slot) in enumerate(zip(idx, s)):
                stamp = _path_hash(tokens_through[: start + j + 1]) if whole else h
                flat[int(i)] = float(_stamp(stamp, v, np.int64(slot)))

    def step(self, req):
        pool_req = self.serving.cache.requests.get(req.rid)
        if pool_req is None:
            return super().step(req)
        before, kv_len = pool_req.pages.lens.copy(), req.kv_len
        prefilling = not pool_req.prefill_done
        n = pool_req.plan.chunk_tokens[len(pool_req.chunk_ends)] if prefilling else 1
        whole = not prefilling or bool(pool_req.plan.full[len(pool_req.chunk_ends)])
        super().step(req)
        if req.rid in self.running and req.kv_len == kv_len + n:
            self._write(req.rid, before, req.full_untruncated_fill_ids[: kv_len + n], whole)

    def check_data(self):
        """Every device node's slots, read through its chain's page table, hold their stamps."""
        tree, spec = self.tree, self.serving.spec
        flat = self._flat()
        for node in tree._nodes():
            if node.on_host:
                continue
            path, up = [], node
            while up is not tree.root_node:
                path.append(up)
                up = up.parent
            tokens = np.concatenate([n.tokens for n in reversed(path)])
            start_pos = tokens.size - len(node.tokens)
            pages, _, _ = assemble(tree.chain(node), spec.num_virtual, spec.page_size)
            seg = node.seg
            for v in range(spec.num_virtual):
                slots = np.arange(seg.start_slots[v], seg.end_slots[v])
                if node.compressed:
                    want = _stamp(_path_hash(tokens), v, slots)
                else:
                    want = np.array([_stamp(_path_hash(tokens[: start_pos + i + 1]), v, np.int64(s))
                                     for i, s in enumerate(slots)])
                idx = pages[v, slots // spec.page_size].astype(np.int64) * spec.page_size + slots % spec.page_size
                got = flat[idx][:, 0, 0].numpy()
                assert np.array_equal(got, want.astype(np.float32)), (node.id, v, node.compressed)


@pytest.mark.parametrize("seed,host_ratio", [(0, 0.5), (1, 2.0)])
def test_host_tier_soak_keeps_kv_and_integrity(seed, host_ratio):
    """Thousands of SGLang-like operations over a small pool: histories go to the host and come back
    (loads, host evictions when the host is full), integrity after each, every device node's KV stamped
    right, and everything returns at the end."""
    d = StampedDriver(seed, host_ratio=host_ratio)
    for i in range(700):
        d.run(1)
        if i % 4 == 0:
            d.check_data()
    c = d.serving.counters
    assert c.offloaded_tokens > 0 and c.loaded_tokens > 0 and d.stats["finished"] > 20
    if host_ratio < 1:
        assert c.host_evicted_tokens > 0   # the small host ran full and dropped its oldest
    for req in list(d.running.values()):
        d.release(req, checkpoint=False)
    d.check()
    d.tree.reset()
    d.alloc.clear()
    d.check()
    host = d.serving.host.pages
    assert host.num_free == host.num_pages and d.serving.cache.pool.num_free == d.serving.spec.num_pages


def test_host_tier_reuses_more_than_dropping():
    """The same operations with and without a host tier: with one, more prefix tokens are matched."""
    reused = {}
    for host_ratio in (0.0, 2.0):
        d = Driver(5, host_ratio=host_ratio)
        d.run(1200)
        reused[host_ratio] = d.stats["reused"]
    assert reused[2.0] > reused[0.0]


def _start(d, rid, row, prompt):
    """Admit a request for prompt with no prefix (as a miss would), its row bound."""
    tree = d.tree
    req = FakeReq(rid, row, prompt)
    req.session, req.last_node, req.lock = 0, tree.root_node, tree.lock(tree.root_node)
    n = len(prompt)
    assert d.serving.admit(rid, prefix_chain=[], prefix_tokens=0, node=tree.root_node,
                           tokens=np.zeros(n, np.int64), decode_tokens=4)
    d.rows.req_to_token[row, :n] = d.alloc.alloc(n).to(d.rows.req_to_token.dtype)
    d.serving.bind_row(rid, row)
    d.running[rid] = req
    return req


def _finish(d, prompt, decode=3, rid="first", row=1):
    """Prefill prompt alone, decode a few tokens, finish into the tree; returns the history."""
    req = _start(d, rid, row, prompt)
    while not d.serving.cache.requests[rid].prefill_done or req.kv_len < len(prompt) + decode:
        d.step(req)
    d.release(req, checkpoint=True)
    return req.full_untruncated_fill_ids[: req.kv_len]


def test_offloaded_history_is_matched_loaded_and_split_on_the_host():
    """A finished history pushed to the host by eviction is still matched whole; a match ending
    inside its uncompressed reply splits the host segment (sharing the page of the cut); loading it
    back gives device pages holding the same KV."""
    d = StampedDriver(2, host_ratio=1.0)
    history = _finish(d, [3, 1, 4, 1, 5] * 10)
    d.check_data()
    tree = d.tree
    while tree.evictable_leaves:                 # admission-like eviction: everything to the host
        tree._evict_one("admission")
    d.check()
    assert tree.host_tokens_ == tree.total_tokens() == len(history) and d.serving.cache.store.pages_held == 0
    m = tree.match_prefix(as_request(history + [7]))
    assert m.device_prefix_len == len(history) and m.last_device_node.on_host
    cut = history[:-2] + [6]                     # ends inside the uncompressed reply
    m = tree.match_prefix(as_request(cut))
    assert m.device_prefix_len == len(history) - 2 and m.last_device_node.on_host
    d.check()
    lock = tree.lock(m.last_device_node)
    assert tree.load_back(m.last_device_node)
    tree.unlock(lock)
    d.check()
    d.check_data()
    assert not m.last_device_node.on_host and m.last_device_node.parent is not tree.root_node
    c = d.serving.counters
    assert c.loaded_tokens == len(history) - 2 and c.offloaded_tokens == len(history)
    from tangram_sglang.serving.observability import log_line, pool_info

    info = pool_info(d.serving, tree)
    assert info["host_tokens"] == tree.host_tokens_ == 2 and info["tokens_held"] == len(history) - 2
    assert log_line(info).endswith(f"host tier {info['host_pages_used']}/{info['host_pages_total']} pages, "
                                   f"tokens offloaded {len(history)}, loaded {len(history) - 2}")


def test_twin_on_the_host_is_replaced_by_the_device_copy():
    """A history recomputed while the tree holds it on the host: the new device copy takes the host
    node's place (nothing detaches), and the host pages are released."""
    d = StampedDriver(4, host_ratio=1.0)
    prompt = [2, 7, 1, 8] * 5
    _finish(d, prompt)
    tree = d.tree
    while tree.evictable_leaves:
        tree._evict_one("admission")
    host_before = d.serving.host.pages.num_free
    # a request that does not match (as after SGLang's RADIX_FORCE_MISS): it computes the prompt again
    req = _start(d, "again", 5, prompt)
    d.step(req)
    d.release(req, checkpoint=True)
    d.check()
    d.check_data()
    first = tree.root_node.children[(None, prompt[0])]
    assert len(first) == 1 and not first[0].on_host          # one node, on the device now
    assert d.serving.counters.detached_segments == 0
    assert d.serving.host.pages.num_free > host_before


def test_sglang_evict_drops_host_leaves_first_and_frees_their_ids():
    d = Driver(3, host_ratio=1.0)
    _finish(d, [1, 2, 3] * 9)
    tree = d.tree
    while tree.evictable_leaves:
        tree._evict_one("decode")
    free = d.alloc.available_size()
    tree.evict(EvictParams(num_tokens=1))
    d.check()
    assert d.alloc.available_size() > free and d.serving.counters.host_evicted_tokens > 0


def test_host_pages_integrity_fails_on_a_lost_reference():
    host = HostPages(6)
    ids = host.take(3)

    class Seg:
        num_tokens, compressed, num_pages = 40, False, 3
        start_slots, end_slots = np.array([0]), np.array([40])
        page_counts, protected = np.array([3]), 0

    hseg = host.keep(Seg, ids)
    host.check_integrity([hseg])
    upper, lower = host.split(hseg, 20, 16)      # the cut's column (page 1) shared
    host.check_integrity([upper, lower])
    assert host.refcount[ids[1]] == 2
    with pytest.raises(PoolError, match="references differ"):
        host.check_integrity([upper])            # a segment the tree forgot
    host.release(upper)
    host.release(lower)
    host.check_integrity([])
    assert host.num_free == 6 and host.take(7) is None
    with pytest.raises(PoolError, match="double release"):
        host.release(lower)


# The soak driver's decisions without a host tier (what each operation matched, admitted, evicted,
# published; the tree's tokens and the free pages after it), digested per seed. First recorded on
# 6ab6d59, the code before the host tier (the host tier left them as they were); recorded again with
# the chunk rule (method/chunks.py) and a twin's later segments published under it, which change what
# is cut, matched and published: without --tangram-host-ratio the tree must keep deciding exactly so.
BEFORE_HOST_TIER = {0: "f3ef7a5adef5442c", 1: "7f47efec0412e9b0", 2: "c0ee192111f40afe"}
OLD_FIELDS = ("admitted", "waited", "retracted", "evicted_segments", "evicted_tokens_admission",
              "evicted_tokens_decode", "evicted_tokens_flush", "evicted_tokens_sglang", "evictions_refused",
              "published_segments", "twin_segments", "detached_segments", "matched_tokens", "prefill_passes",
              "prefill_chunks")


def _trace_digest(seed, ops=600):
    import hashlib

    d = Driver(seed)
    h = hashlib.sha256()
    for _ in range(ops):
        d.run(1)
        c = d.serving.counters
        h.update(repr((sorted(d.stats.items()), [getattr(c, f) for f in OLD_FIELDS], d.tree.total_tokens(),
                       d.serving.cache.pool.num_free)).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("seed", sorted(BEFORE_HOST_TIER))
def test_without_a_host_tier_the_tree_decides_as_before(seed):
    assert _trace_digest(seed) == BEFORE_HOST_TIER[seed]
