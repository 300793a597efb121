"""SGLang's lpm policy matches the requests in the waiting queue to sort them, with SGLang's own Req
objects, before init_next_round_input brings their full_untruncated_fill_ids up to their sequence (it is
empty there). The match must find the history the admission's match will find: otherwise lpm sorts a
returning session as a new one and never touches its history, so LRU evicts it while it waits
(issue 60: under think time later turns reused 13-17% of their prompts instead of 37%).
"""

from array import array

import numpy as np
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.mem_cache.common import match_kv_cache
from sglang.srt.sampling.sampling_params import SamplingParams

from test_serving_tree_soak import CHAT, Driver, FakeReq, as_request


def _serve(d, rid, prompt, replies):
    """Admit prompt with no prefix, prefill it, decode ``replies`` (tokens), finish into the tree;
    returns the history the tree now holds."""
    tree, row = d.tree, d.free_rows.pop()
    req = FakeReq(rid, row, prompt)
    req.session, req.last_node, req.lock = 0, tree.root_node, tree.lock(tree.root_node)
    assert d.serving.admit(rid, prefix_chain=[], prefix_tokens=0, node=tree.root_node, tokens=prompt,
                           decode_tokens=len(replies) + 1)
    d.rows.req_to_token[row, :len(prompt)] = d.alloc.alloc(len(prompt)).to(d.rows.req_to_token.dtype)
    d.serving.bind_row(rid, row)
    d.running[rid] = req
    while not d.serving.cache.requests[rid].prefill_done:
        d.step(req)
    while req.kv_len < len(prompt) + len(replies):
        d.step(req)
    req.output = list(replies[: len(req.output)])   # the reply this test scripts
    d.release(req, checkpoint=True)
    d.check()
    return req.full_untruncated_fill_ids[: req.kv_len]


def _queued(rid, tokens) -> Req:
    """A request as the scheduler's waiting queue holds it (SGLang's Req, fill ids not yet refreshed)."""
    req = Req(rid, "", array("q", tokens), SamplingParams(max_new_tokens=4))
    assert len(req.full_untruncated_fill_ids) == 0
    return req


def test_lpm_finds_and_ranks_a_waiting_sessions_history():
    d = Driver(6, markers=CHAT)
    user = [7] + [5, 1, 4, 2] * 12                  # a user message of 49 tokens: compressed chunks
    history = _serve(d, "turn1", user + [7, 6], replies=[3, 2, 1, 3])
    turn2 = history + [7] + [2, 3] * 8 + [7, 6]     # the session returns: its reply closed, a new message
    fresh = [7] + [1, 2, 3] * 9 + [7, 6]            # a first turn of another conversation
    admitted = d.tree.match_prefix(as_request(turn2)).device_prefix_len   # what its admission will match
    assert admitted == len(history)
    queue = [_queued("new", fresh), _queued("back", turn2)]
    before = {id(n): n.last_access_time for n in d.tree._nodes()}
    SchedulePolicy("lpm", d.tree, False, False, False).calc_priority(queue)
    assert [r.rid for r in queue] == ["back", "new"]
    assert queue[0].prefix_len == admitted and queue[1].prefix_len == 0
    touched = [n for n in d.tree._nodes() if n.last_access_time > before[id(n)]]
    assert len(touched) == len(before)               # every node of the history: LRU keeps it for the turn
    d.check()


def test_a_queued_match_equals_the_refreshed_one_on_random_conversations():
    """On random chat-shaped conversations, a queued request's match (fill ids empty) and the same
    request's match once SGLang has refreshed them agree token for token."""
    rng = np.random.default_rng(3)
    d = Driver(7, markers=CHAT)
    for i in range(12):
        user = [7] + rng.integers(0, 6, int(rng.integers(5, 60))).tolist() + [7, 6]
        history = _serve(d, f"t{i}", user, replies=rng.integers(0, 6, 3).tolist())
        nxt = history + [7] + rng.integers(0, 6, int(rng.integers(2, 30))).tolist() + [7, 6]
        queued = _queued(f"q{i}", nxt)
        SchedulePolicy("lpm", d.tree, False, False, False).calc_priority([queued])
        in_queue = queued.prefix_len
        queued.refresh_fill_ids()
        assert in_queue == match_kv_cache(queued, d.tree).device_prefix_len == len(history)
        d.check()
