"""A request whose cached prefix ends inside a compressed chunk cannot be planned (Cut.after raises).
The tree cuts every match by the same chunk rule, so this is never expected; if it happens it must not
leave SGLang's scheduler loop: the prefill adder fails the request with the reason, counts it, holds
no pages for it, and the pool and tree stay whole."""

from types import SimpleNamespace

import pytest
from sglang.srt.managers.schedule_policy import AddReqResult

from tangram_sglang.serving.observability import pool_info
from tangram_sglang.sglang.scheduling import TangramPrefillAdder

from test_serving_tree_soak import Driver


class QueuedReq:
    """What add_one_req reads of SGLang's Req, and the abort it calls."""

    def __init__(self, rid, tokens, prefix_len):
        self.rid, self.full_untruncated_fill_ids, self.prefix_len = rid, list(tokens), prefix_len
        self.origin_input_ids, self.output_ids = list(tokens), []
        self.sampling_params = SimpleNamespace(max_new_tokens=4, custom_params=None)
        self.last_node, self.aborted = None, None

    def set_finish_with_abort(self, error_msg):
        self.aborted = error_msg


def _adder(tree) -> TangramPrefillAdder:
    adder = object.__new__(TangramPrefillAdder)   # only what add_one_req reads before SGLang's own add
    adder.tree_cache, adder.rem_chunk_tokens, adder.can_run_list, adder.new_token_ratio = tree, None, [], 0.5
    return adder


@pytest.mark.parametrize("prefix_len", [5, 23, 30])
def test_a_prefix_inside_a_compressed_chunk_fails_the_request_not_the_scheduler(prefix_len):
    d = Driver(7)   # chunks of 24 tokens from the sequence's start
    tokens = [3, 1, 4, 1, 5, 9, 2, 6] * 8                   # 64 tokens: [0, 24) and [24, 48) compressed
    with pytest.raises(ValueError, match="inside the compressed chunk"):
        d.serving.plan_chunks(tokens, prefix_len)          # the mismatch is real, not staged
    free, info = d.serving.cache.pool.num_free, pool_info(d.serving, d.tree)
    req = QueuedReq("r0", tokens, prefix_len)
    req.last_node = d.tree.root_node
    assert _adder(d.tree).add_one_req(req, has_chunked_req=False, truncation_align_size=None) == AddReqResult.NO_TOKEN
    assert req.aborted is not None and "inside the compressed chunk" in req.aborted
    after = pool_info(d.serving, d.tree)
    assert after["plan_errors"] == info["plan_errors"] + 1 and after["admitted"] == info["admitted"]
    assert "r0" not in d.serving.requests and "r0" not in d.serving.cache.requests
    assert d.serving.cache.pool.num_free == free
    d.check()


def test_an_admission_that_raises_after_reserving_leaves_no_pages(monkeypatch):
    """The same guard when the pool reserved the request's pages and serving.admit raised after: the
    reservation is released with the request's failure."""
    from tangram_sglang.serving import runtime

    d = Driver(7)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6] * 8
    free, reserved = d.serving.cache.pool.num_free, d.serving.cache.pool.reserved

    def broken(**kw):
        raise ValueError("a state that cannot be built")

    monkeypatch.setattr(runtime, "RequestState", broken)
    req = QueuedReq("r1", tokens, 0)
    req.last_node = d.tree.root_node
    assert _adder(d.tree).add_one_req(req, has_chunked_req=False, truncation_align_size=None) == AddReqResult.NO_TOKEN
    assert "cannot be built" in req.aborted and pool_info(d.serving, d.tree)["plan_errors"] == 1
    assert "r1" not in d.serving.cache.requests
    assert (d.serving.cache.pool.num_free, d.serving.cache.pool.reserved) == (free, reserved)
    d.check()
