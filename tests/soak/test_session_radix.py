"""The session radix cache over the segment tree (--enable-session-radix-cache with a profile): sessions'
histories are referenced, unreferenced leaves are evicted first, a closed session's segments stay cached
but lose their rank, a frontier evicted under pressure hands its reference to its parent, and a request
of an older incarnation registers nothing. Integrity (pool, tree, session references) after every step."""

import random

import pytest
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from test_serving_tree_soak import Driver, as_request

from tangram_sglang.serving.observability import check_integrity


def _finish(d, sid: str, tokens: list[int], seed: int):
    """One turn of session sid (a one-turn history of tokens) finished into the tree; returns its history."""
    d.rng = random.Random(seed)
    d.sessions = [list(tokens)]
    d.new_request()
    (req,) = d.running.values()
    req.session_id, req.session_generation = sid, d.tree.ensure_session_generation(sid)
    while not d.serving.cache.requests[req.rid].prefill_done or req.kv_len < len(req.prompt) + 2:
        d.step(req)
    d.release(req, checkpoint=True)
    d.check()
    return req.full_untruncated_fill_ids[: req.kv_len]


def _hit(d, history) -> int:
    return d.tree.match_prefix(as_request(history + [7])).device_prefix_len


def test_a_closed_sessions_history_is_evicted_before_open_ones_even_when_newest():
    d = Driver(1, sessions=True)
    a = _finish(d, "a", [1] * 30, 10)
    b = _finish(d, "b", [2] * 30, 11)
    c = _finish(d, "c", [3] * 30, 12)       # the most recently used
    assert [_hit(d, h) == len(h) for h in (a, b, c)] == [True] * 3
    d.tree.release_radix_session("c")        # closed: still cached, no longer referenced
    check_integrity(d.serving, d.tree)
    assert _hit(d, c) == len(c)
    d.tree.evict(EvictParams(num_tokens=1))
    assert _hit(d, c) < len(c) and _hit(d, a) == len(a) and _hit(d, b) == len(b)   # LRU alone takes a's tail
    d.check()


def test_without_the_flag_eviction_stays_lru():
    d = Driver(1, sessions=False)
    a = _finish(d, "a", [1] * 30, 10)
    _finish(d, "b", [2] * 30, 11)
    c = _finish(d, "c", [3] * 30, 12)
    d.tree.release_radix_session("c")
    d.tree.evict(EvictParams(num_tokens=1))
    assert _hit(d, a) < len(a) and _hit(d, c) == len(c)


def test_an_evicted_frontier_hands_its_reference_to_its_parent_and_a_stale_incarnation_registers_nothing():
    d = Driver(1, sessions=True)
    a = _finish(d, "a", [1] * 60, 10)
    frontier = next(iter(d.tree.sessions.frontiers["a"]))
    d.tree.evict(EvictParams(num_tokens=1))  # every leaf is referenced: the frontier goes anyway
    assert frontier not in set(d.tree._nodes()) and _hit(d, a) < len(a)
    (parent,) = d.tree.sessions.frontiers["a"]
    assert parent is frontier.parent and parent.sessions == {"a": 1}
    d.tree.open_radix_session("a")           # a new incarnation: the old one's late finish is ignored
    d.sessions = [[5] * 20]
    d.new_request()
    (req,) = d.running.values()
    req.session_id, req.session_generation = "a", 1
    while not d.serving.cache.requests[req.rid].prefill_done or req.kv_len < len(req.prompt) + 2:
        d.step(req)
    d.release(req, checkpoint=True)
    assert d.tree.sessions.frontiers["a"] == {parent}
    d.check()


def test_the_check_sees_a_wrong_session_count():
    d = Driver(1, sessions=True)
    _finish(d, "a", [1] * 30, 10)
    node = next(iter(d.tree.sessions.frontiers["a"]))
    node.sessions["a"] += 1
    with pytest.raises(AssertionError, match="session references"):
        d.tree.check_integrity()


@pytest.mark.parametrize("seed,host_ratio", [(0, 0.0), (1, 0.0), (2, 0.5)])
def test_session_soak_integrity_and_full_release(seed, host_ratio):
    """Random turns of 6 sessions with ids, closes and re-opens, aborts, retractions and evictions (with
    host_ratio, a compressed host tier too): integrity (session references included) after every operation,
    every page back after a flush."""
    d = Driver(seed, sessions=True, host_ratio=host_ratio)
    rng = random.Random(100 + seed)
    closed, referenced_on_host = 0, False
    for _ in range(8):
        d.run(150)
        referenced_on_host |= any(n.sessions for n in d.tree._nodes() if n.on_host)
        for _ in range(2):
            sid = f"s{rng.randrange(6)}"
            d.tree.release_radix_session(sid)
            closed += 1
            d.check()
            if rng.random() < 0.5:
                d.tree.open_radix_session(sid)
    assert d.stats["finished"] > 20 and closed == 16
    assert any(n.sessions for n in d.tree._nodes()) or not d.tree.sessions.frontiers
    for req in list(d.running.values()):
        d.release(req, checkpoint=False)
    if host_ratio:
        assert d.serving.counters.loaded_tokens > 0 and referenced_on_host   # session references reached the host
    d.tree.evict(EvictParams(num_tokens=10**9))
    d.check()
    assert d.serving.cache.usage().free == d.serving.cache.spec.num_pages
    if host_ratio:
        assert d.serving.host.pages.num_free == d.serving.host.pages.num_pages
