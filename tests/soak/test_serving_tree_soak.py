"""Soak of the serving control plane without a model: TangramServing + TangramRadixCache + the
logical-id allocator, driven the way SGLang drives them (match, admit, chunk by chunk with a
checkpoint after each, decode with capacity checks and retraction, finish into the tree, abort,
evict). Integrity (pool, tree, logical ids) is checked after every operation, and a flush at the
end must return every page.
"""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from transformers import LlamaConfig

from tangram_sglang.method.chunks import Markers, reusable_prefix
from tangram_sglang.method.protection import Protection
from tangram_sglang.serving.context import LoadedProfile
from tangram_sglang.serving.observability import check_integrity
from tangram_sglang.serving.runtime import TangramServing
from tangram_sglang.sglang.memory import TangramAllocator
from tangram_sglang.sglang.radix import TangramRadixCache
from tangram_sglang.sglang.radix_windows import drop_windows

PROFILE = __import__("pathlib").Path(__file__).resolve().parents[2] / "configs" / "smollm2-snapkv.yaml"
MAX_LEN = 400


class Row:
    """ReqToTokenPool stand-in: the row tensor and the write() SGLang's tree calls."""

    def __init__(self, rows: int):
        self.req_to_token = torch.zeros((rows, MAX_LEN), dtype=torch.int32)

    def write(self, index, values):
        self.req_to_token[index] = values


def assert_plan_matches_host(serving, rid, plan, lens):
    """The device tables of a one-request plan hold the host pool's pages up to lens (int [V]);
    a window layer's released columns (-1 on the host) are not mirrored (nothing reads them)."""
    pages = serving.cache.requests[rid].pages
    P = pages.page_size
    sl = plan.seq_lens.permute(1, 0, 2).reshape(-1).numpy()
    assert np.array_equal(sl, lens)
    table = plan.block_table if plan.rows is None else plan.block_table[:, plan.rows]
    table = table.permute(1, 0, 2, 3).reshape(pages.num_virtual, -1).numpy()
    used = -(-np.asarray(lens) // P)
    for v in range(pages.num_virtual):
        host = pages.pages[v, : used[v]]
        assert np.array_equal(table[v, : used[v]][host >= 0], host[host >= 0])


def as_request(key) -> MatchPrefixParams:
    """SGLang's match for a request whose sequence is ``key`` and one more token (SGLang never matches a
    prompt's last token): the chunk rule cuts the request's whole sequence."""
    key = list(key)
    seq = key + [0]
    return MatchPrefixParams(key=RadixKey(token_ids=key, extra_key=None),
                             req=SimpleNamespace(origin_input_ids=seq, output_ids=[], full_untruncated_fill_ids=seq))


class FakeReq:
    def __init__(self, rid, row, prompt):
        self.rid, self.prompt, self.output = rid, list(prompt), []
        self.kv = SimpleNamespace(req_pool_idx=row, cache_protected_len=0)
        self.extra_key, self.lock, self.last_node, self.done = None, None, None, False
        self.session_id = self.session_generation = self.finished_reason = None
        self.kv_len = 0  # tokens whose KV exists

    def finished(self):
        return self.done

    @property
    def full_untruncated_fill_ids(self):
        return self.prompt + self.output

    @property
    def origin_input_ids(self):
        return self.prompt

    @property
    def output_ids(self):
        return self.output


def window_profile(tmp_dir) -> tuple[str, object]:
    """A Gemma-3-shaped model (layers 0, 1 and 3 attend to a 20-token window) and a uniform 0.25
    profile of it (window layers keep every token)."""
    from transformers import Gemma3TextConfig

    from tangram_sglang.profile.format import ModelShape
    from tangram_sglang.profile.uniform import uniform_profile

    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           num_hidden_layers=4, intermediate_size=64, sliding_window=WINDOW,
                           layer_types=["sliding_attention"] * 2 + ["full_attention", "sliding_attention"],
                           architectures=["Gemma3ForCausalLM"])
    path = str(tmp_dir / "window.yaml")
    uniform_profile(ModelShape.from_hf_config(cfg), [0.25]).save(path)
    return path, cfg


WINDOW = 20


def build(stock_tokens=700, chunk=24, seed=0, windows_in=None, sessions=False, host_ratio=0.0, markers=None):
    """The serving state of SmolLM2's SnapKV profile on a Llama config or, with windows_in (a
    folder), of a uniform profile of a Gemma-3-shaped config with sliding-window layers; with
    host_ratio, a compressed host tier of that many pools."""
    if windows_in is None:
        cfg = LlamaConfig(vocab_size=64, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                          num_hidden_layers=30, intermediate_size=64, architectures=["LlamaForCausalLM"])
        path, q_heads = str(PROFILE), 9
    else:
        (path, cfg), q_heads = window_profile(windows_in), 4
    serving = TangramServing.build(LoadedProfile.load(path, 0.25), cfg, host_ratio=host_ratio, stock_tokens=stock_tokens,
                                   dtype=torch.float32, device="cpu", page_size=16, num_q_heads=q_heads, chunk=chunk,
                                   protection=Protection(sinks=2, newest=6),  # to scale with the 24-token chunks
                                   markers=markers)
    rows = Row(64)
    alloc = TangramAllocator(serving.context.logical_tokens, dtype=torch.float32, device="cpu", kvcache=None, serving=serving)
    tree = TangramRadixCache(CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=alloc,
                                             page_size=1, enable_session_radix_cache=sessions), serving.tree_store)
    serving.admission.evict = tree.evict_pages
    return serving, tree, alloc, rows


class Driver:
    def __init__(self, seed, windows_in=None, chunk=24, sessions=False, host_ratio=0.0, markers=None):
        self.rng = random.Random(seed)
        self.serving, self.tree, self.alloc, self.rows = build(chunk=chunk, windows_in=windows_in, sessions=sessions,
                                                               host_ratio=host_ratio, markers=markers)
        self.free_rows = list(range(1, 64))
        self.running: dict[str, FakeReq] = {}
        self.sessions: list[list[int]] = [[] for _ in range(6)]
        self.count = 0
        self.stats = {"admitted": 0, "waited": 0, "finished": 0, "aborted": 0, "retracted": 0, "reused": 0}

    # -- SGLang's flows ---------------------------------------------------------------------------
    def new_request(self):
        s = self.rng.randrange(len(self.sessions))
        prompt = self.sessions[s] + [self.rng.randrange(8) for _ in range(self.rng.randint(1, 60))]
        if len(prompt) + 40 > MAX_LEN or not self.free_rows:
            self.sessions[s] = []
            return
        self.count += 1
        req = FakeReq(f"r{self.count}", self.free_rows.pop(), prompt)
        req.session = s
        if self.tree.sessions.enabled:   # SGLang's scheduler, a request with a top-level session_id
            req.session_id = f"s{s}"
            req.session_generation = self.tree.ensure_session_generation(req.session_id)
        # SGLang matches all but the last token (Req._compute_max_prefix_len): one token is always computed
        m = self.tree.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=prompt[:-1], extra_key=None), req=req))
        node, prefix = m.last_device_node, m.device_prefix_len
        self.stats["reused"] += prefix
        lock = self.tree.lock(node)
        ok = self.tree.load_back(node) and self.serving.admit(req.rid, prefix_chain=self.tree.chain(node), prefix_tokens=prefix, node=node,
                                tokens=prompt,
                                decode_tokens=self.rng.randint(1, 8))
        if not ok:
            self.tree.unlock(lock)
            self.free_rows.append(req.kv.req_pool_idx)
            self.stats["waited"] += 1
            return
        req.lock, req.last_node = lock, node
        row = self.rows.req_to_token[req.kv.req_pool_idx]
        row[:prefix] = self.tree.path_device_indices(node)[:prefix].to(torch.int32)
        row[prefix:len(prompt)] = self.alloc.alloc(len(prompt) - prefix).to(torch.int32)
        req.kv.cache_protected_len = req.kv_len = prefix
        self.serving.bind_row(req.rid, req.kv.req_pool_idx)
        self.running[req.rid] = req
        self.stats["admitted"] += 1

    def step(self, req):
        pool_req = self.serving.cache.requests[req.rid]
        if not pool_req.prefill_done:
            n = pool_req.plan.chunk_tokens[len(pool_req.chunk_ends)]
            before = pool_req.pages.lens.copy()
            plan = self.serving.extend_metadata([req.rid], [n])
            assert_plan_matches_host(self.serving, req.rid, plan, before)
            req.kv_len += n
            if pool_req.prefill_done:
                req.output.append(self.rng.randrange(8))  # sampled after the last chunk
            else:
                self.tree.checkpoint(req, up_to=req.kv_len)  # Scheduler.stash_chunked_request
            return
        if not self.serving.admission.ensure_decode_room([req.rid]):
            self.release(req, checkpoint=False)
            self.stats["retracted"] += 1
            return
        ids = self.alloc.alloc(1)
        self.rows.req_to_token[req.kv.req_pool_idx, req.kv_len] = ids.to(torch.int32)
        plan = self.serving.decode_metadata([req.rid])
        pages = pool_req.pages
        assert_plan_matches_host(self.serving, req.rid, plan, pages.lens)
        slot, P = pages.lens - 1, pages.page_size
        host_loc = pages.pages[np.arange(slot.size), slot // P].astype(np.int64) * P + slot % P
        assert np.array_equal(torch.stack(plan.out_loc).numpy().reshape(-1), host_loc)
        req.kv_len += 1
        req.output.append(self.rng.randrange(8))

    def release(self, req, *, checkpoint):
        """release_kv_cache: checkpoint into the tree, free the row's own ids, unlock, drop the request."""
        if checkpoint:
            req.done = True
            self.tree.checkpoint(req, up_to=req.kv_len)
            self.sessions[req.session] = req.full_untruncated_fill_ids[: req.kv_len]
        row = self.rows.req_to_token[req.kv.req_pool_idx]
        self.alloc.free(row[req.kv.cache_protected_len: max(req.kv_len, len(req.prompt))].to(torch.int64))
        self.tree.unlock(req.lock)
        self.tree.on_release(req, checkpointed=checkpoint)
        self.free_rows.append(req.kv.req_pool_idx)
        del self.running[req.rid]

    # -- checks -----------------------------------------------------------------------------------
    def check(self):
        check_integrity(self.serving, self.tree)
        own = sum(max(r.kv_len, len(r.prompt)) - r.kv.cache_protected_len for r in self.running.values())
        assert self.alloc.available_size() + self.tree.total_tokens() + own == self.alloc.size
        assert set(self.serving.requests) == set(self.running)

    def run(self, ops):
        for _ in range(ops):
            x = self.rng.random()
            if x < 0.25 or not self.running:
                self.new_request()
            else:
                req = self.rng.choice(list(self.running.values()))
                done = self.serving.cache.requests[req.rid].prefill_done
                if x < 0.80:
                    self.step(req)
                elif x < 0.92 and done and req.kv_len > len(req.prompt):
                    self.release(req, checkpoint=True)
                    self.stats["finished"] += 1
                elif x < 0.96:
                    self.release(req, checkpoint=False)
                    self.stats["aborted"] += 1
                else:
                    self.tree.evict(EvictParams(num_tokens=self.rng.randint(1, 80)))
            self.check()


# token 7 opens a message, 7 then 6 the assistant's: the random prompts are runs of short messages
CHAT = Markers(start_ids=(7,), assistant=((6,),))


@pytest.mark.parametrize("seed,markers", [(0, None), (1, None), (0, CHAT), (4, CHAT)])
def test_serving_soak_integrity_and_full_release(seed, markers):
    d = Driver(seed, markers=markers)
    d.run(1500)
    assert d.stats["finished"] > 20 and d.stats["reused"] > 0 and d.serving.counters.evicted_segments > 0
    assert d.stats["waited"] > 0 and d.stats["retracted"] > 0  # the pool ran full: waits and retractions
    for req in list(d.running.values()):
        d.release(req, checkpoint=False)
        d.check()
    d.check()
    assert d.alloc.available_size() + d.tree.total_tokens() == d.alloc.size
    d.tree.reset()  # Scheduler.flush_cache: tree reset, then the allocator is cleared
    d.alloc.clear()
    d.check()
    assert d.serving.cache.pool.num_free == d.serving.spec.num_pages and not d.serving.cache.store.segments
    assert d.tree.total_tokens() == 0 and d.alloc.available_size() == d.alloc.size


def test_serving_soak_with_window_layers(tmp_path):
    """Sliding-window layers: requests release the window pages their queries passed, admission
    under pressure makes interior nodes drop theirs, matches end only where the window is held;
    every plan's tables equal the host pages and everything returns at the end."""
    d = Driver(3, windows_in=tmp_path)
    cache = d.serving.cache
    released, asked = {"tree": 0, "drops": 0}, []
    drop = cache.drop_window_columns

    def counted(seg_id, end):
        asked.append((seg_id, tuple(end)))
        dropped, freed = drop(seg_id, end)
        released["tree"] += freed
        released["drops"] += dropped > 0
        return dropped, freed

    cache.drop_window_columns = counted
    peak = 0
    for _ in range(1500):
        d.run(1)
        for req in cache.requests.values():
            live = [(req.pages.pages[v, : req.pages.npages[v]] >= 0).sum() for v in cache.window_rows]
            peak = max(peak, max(live, default=0))
    assert d.stats["finished"] > 20 and d.stats["reused"] > 0 and d.stats["waited"] > 0
    assert released["tree"] > 0                              # interior nodes gave pages back
    for i, (seg, end) in enumerate(asked):                   # never asked again for no later end
        assert not any(s == seg and all(a <= b for a, b in zip(end, e)) for s, e in asked[:i])
    assert d.serving.counters.window_drops == released["drops"] > 0
    assert 0 < peak <= -(-(WINDOW - 1 + d.serving.chunk) // 16) + 1  # a request holds its window, one chunk
    for req in list(d.running.values()):
        d.release(req, checkpoint=False)
    d.tree.reset()
    d.alloc.clear()
    d.check()
    assert cache.pool.num_free == d.serving.spec.num_pages and not cache.store.segments


def test_a_chain_of_short_chunks_keeps_about_one_window(tmp_path):
    """Chunks shorter than the window (8 against 20): an interior node drops up to the earliest match end
    below it, past children that dropped theirs, so a finished history keeps about one window of pages
    per window layer, and a second turn still matches where the window is held."""
    d = Driver(7, windows_in=tmp_path, chunk=8)
    d.sessions = [[1, 2, 3] * 40]
    d.new_request()
    (req,) = d.running.values()
    while not d.serving.cache.requests[req.rid].prefill_done or req.kv_len < len(req.prompt) + 3:
        d.step(req)
    d.release(req, checkpoint=True)
    d.tree.evict_pages(0)                           # nothing short: no drop
    cache = d.serving.cache
    segs = [cache.store.get(n.seg.seg_id) for n in d.tree._nodes()]

    def window_pages():
        rows = {}
        for seg in segs:
            starts = np.concatenate([[0], np.cumsum(seg.page_counts)])
            for v in cache.window_rows:
                ids = seg.page_ids[starts[v]:starts[v + 1]]
                rows.setdefault(v, set()).update(ids[ids >= 0].tolist())
        return max(len(p) for p in rows.values())

    dense = window_pages()
    drop_windows(d.tree, goal=10**9)                # as under pressure, nothing evicted yet
    d.check()
    assert dense >= 8 and window_pages() <= -(-(WINDOW - 1) // 16) + 2
    history = d.sessions[0]
    m = d.tree.match_prefix(as_request(history + [4]))
    assert m.device_prefix_len > len(history) - 8 and cache.window_ready(d.tree.chain(m.last_device_node))


def test_reconstruction_scorer_refused_with_window_layers(tmp_path):
    """KVzip's reconstruction pass reads every cached slot; window layers release theirs."""
    import dataclasses

    from tangram_sglang.profile import ProfileError
    from tangram_sglang.scorers import get_scorer
    from tangram_sglang.serving.context import build_context

    path, cfg = window_profile(tmp_path)
    loaded = dataclasses.replace(LoadedProfile.load(path, 0.25), scorer=get_scorer("kvzip", prefix_ids=(1, 2)))
    with pytest.raises(ProfileError, match="reconstruction pass has no sliding window"):
        build_context(loaded, cfg, stock_tokens=700, dtype=torch.float32, device="cpu", page_size=16, num_q_heads=4)


def test_turn_two_reuses_turn_one_prompt_and_output():
    d = Driver(3)
    d.sessions = [[]]
    d.rng = random.Random(5)
    d.new_request()
    (req,) = d.running.values()
    while not d.serving.cache.requests[req.rid].prefill_done or req.kv_len < len(req.prompt) + 5:
        d.step(req)
    d.release(req, checkpoint=True)
    history = req.full_untruncated_fill_ids[: req.kv_len]
    m = d.tree.match_prefix(as_request(history + [1, 2, 3]))
    assert m.device_prefix_len == len(history)
    # a match that would end inside a compressed chunk stops at the chunk's start
    m = d.tree.match_prefix(as_request(req.prompt[:5] + [99]))
    assert m.device_prefix_len == 0
    d.check()


def test_shortened_chunk_is_held_to_the_plan():
    """SGLang may size a chunked request's next extend otherwise (rounding, its token budget): the
    adder makes it the planned compression chunk, so the kept set never depends on batching."""
    from tangram_sglang.sglang.scheduling import _hold_to_plan

    d = Driver(4)
    d.sessions = [[3] * 60]  # prompt >= 61 tokens: at least 3 chunks of 24
    d.new_request()
    (req,) = d.running.values()
    d.step(req)  # first chunk, checkpointed into the tree
    planned = d.serving.cache.requests[req.rid].plan.chunk_tokens
    assert len(planned) >= 3 and d.serving.planned_extend(req.rid) == planned[1]
    req.prefix_len = req.kv_len
    req.extend_end = req.prefix_len + 7  # what SGLang chose
    assert _hold_to_plan(req, d.serving.planned_extend(req.rid))
    assert req.extend_end - req.prefix_len == planned[1]
    assert not _hold_to_plan(req, d.serving.planned_extend(req.rid))  # already the plan: untouched
    while not d.serving.cache.requests[req.rid].prefill_done or req.kv_len < len(req.prompt) + 3:
        d.step(req)
        d.check()
    assert d.serving.planned_extend(req.rid) is None
    assert d.serving.requests[req.rid].scorer_states == []  # freed with the last chunk's plan
    d.release(req, checkpoint=True)
    d.check()


def test_decode_estimate_larger_than_the_pool_is_capped_not_fatal():
    """SGLang's decode estimate (max_new_tokens x ratio) may exceed the whole pool: the request is
    admitted with one decode token reserved; a prefill that can never fit still raises."""
    from tangram_sglang.pool.spec import RequestTooLargeError

    serving, tree, _, _ = build()
    root = tree.root_node
    assert serving.admit("big-decode", prefix_chain=[], prefix_tokens=0, node=root, tokens=np.zeros(100, np.int64),
                         decode_tokens=10**7)
    assert serving.cache.requests["big-decode"].plan.decode_tokens == 1
    serving.release("big-decode")
    with pytest.raises(RequestTooLargeError):
        serving.admit("huge", prefix_chain=[], prefix_tokens=0, node=root, tokens=np.zeros(10**6, np.int64),
                      decode_tokens=1)
    check_integrity(serving, tree)
    assert serving.cache.pool.num_free == serving.spec.num_pages and not serving.requests


def _finish_sessions(d, n):
    """n one-turn sessions finished into the tree, oldest first; returns their histories."""
    finished = []
    for s in range(n):
        d.rng = random.Random(10 + s)
        d.sessions = [[s + 1] * 30]
        d.new_request()
        (req,) = d.running.values()
        while not d.serving.cache.requests[req.rid].prefill_done or req.kv_len < len(req.prompt) + 2:
            d.step(req)
        d.release(req, checkpoint=True)
        finished.append(req.full_untruncated_fill_ids[: req.kv_len])
    return finished


def _hits(d, histories):
    return [d.tree.match_prefix(as_request(h + [7])).device_prefix_len
            for h in histories]


def test_eviction_takes_the_least_recently_used_leaf_first():
    """The lazy heap evicts by SGLang's strategy (LRU): a session matched again outlives older ones."""
    d = Driver(6)
    finished = _finish_sessions(d, 3)
    # touch the oldest session again: it becomes the most recently used
    d.tree.match_prefix(as_request(finished[0] + [7]))
    before = d.serving.counters.evicted_segments
    d.tree.evict(EvictParams(num_tokens=1))
    assert d.serving.counters.evicted_segments == before + 1
    hits = _hits(d, finished)
    assert hits[0] == len(finished[0]) and hits[2] == len(finished[2])  # the second one lost its tail
    assert hits[1] < len(finished[1])
    d.check()


def test_a_twin_keeps_the_tree_copy_and_later_segments_continue_it():
    """Two identical prompts prefilled side by side: the second's prompt segment is a twin of the
    first's, freed for the tree's copy. Its reply is published under the twin, the page it shares with
    the prompt's tail getting the twin's slots there (adopt_boundary): a reader of [twin, reply] reads
    the tree's copy of the prompt and the second request's own reply, never a mix."""
    d = Driver(6, markers=CHAT)
    prompt = [7] + [5, 1, 4] * 6 + [7, 6]  # a user message (compressed), the assistant's header (kept whole)
    reqs = []
    for rid, row in (("A", 1), ("B", 2)):
        req = FakeReq(rid, row, prompt)
        req.session, req.last_node, req.lock = 0, d.tree.root_node, d.tree.lock(d.tree.root_node)
        assert d.serving.admit(rid, prefix_chain=[], prefix_tokens=0, node=d.tree.root_node, tokens=prompt,
                               decode_tokens=4)
        d.rows.req_to_token[row, :len(prompt)] = d.alloc.alloc(len(prompt)).to(torch.int32)
        d.serving.bind_row(rid, row)
        d.running[rid] = req
        reqs.append(req)
    for req in reqs:
        d.step(req)  # the prompt, then three decode steps
        for _ in range(3):
            d.step(req)
        d.check()
    a, b = reqs
    k = d.serving.data.k_pages
    for req, mark in ((a, 3.0), (b, 7.0)):   # each request's pages marked as its own
        pages = d.serving.cache.requests[req.rid].pages
        k[torch.from_numpy(pages.held().astype(np.int64))] = mark
    b.output = [7, 7, 7, 7]  # B answered otherwise
    d.release(a, checkpoint=True)
    d.check()
    twins = d.serving.counters.twin_segments
    d.release(b, checkpoint=True)
    d.check()
    assert d.serving.counters.twin_segments == twins + 1 and d.serving.counters.detached_segments == 0
    m = d.tree.match_prefix(as_request(prompt + b.output[:2]))   # the assistant's message: usable whole
    assert m.device_prefix_len == len(prompt) + 2
    reply = m.last_device_node
    assert reply.parent.seg.page_ids[0] != reply.seg.page_ids[0]   # the twin's pages, B's reply pages
    P = d.serving.spec.page_size
    first = np.cumsum(reply.seg.page_counts) - reply.seg.page_counts
    for v in range(d.serving.spec.num_virtual):
        page = k[int(reply.seg.page_ids[first[v]])][:, 0, 0]
        lead = int(reply.seg.start_slots[v] % P)
        assert 0 < lead <= P - 3 and bool((page[:lead] == 3.0).all()) and bool((page[lead:lead + 3] == 7.0).all())
    m = d.tree.match_prefix(as_request(prompt + a.output[:3]))
    assert m.device_prefix_len > len(prompt) and m.last_device_node is not reply   # A's own reply


def test_decode_step_evicts_when_the_tree_grew_after_the_capacity_check():
    """SGLang checks decode room before a step; if the tree took pages since, the step evicts
    unlocked leaves itself instead of raising in the scheduler."""
    d = Driver(8)
    d.sessions = [[]]
    d.new_request()
    (a,) = d.running.values()
    while not d.serving.cache.requests[a.rid].prefill_done:
        d.step(a)
    rng, n = random.Random(3), 0
    while d.serving.cache.pool.available > 0:  # finished requests fill the tree
        d.sessions = [[rng.randrange(8) for _ in range(30)]]
        before = set(d.running)
        d.new_request()
        new = [d.running[r] for r in set(d.running) - before]
        if not new:
            break
        (b,) = new
        while not d.serving.cache.requests[b.rid].prefill_done:
            d.step(b)
        d.release(b, checkpoint=True)
        n += 1
    assert n > 0 and d.serving.cache.usage().held_by_tree > 0
    evicted = d.serving.counters.evicted_segments
    for _ in range(40):  # a.'s reservation runs out: new pages must come from the tree
        ids = d.alloc.alloc(1)
        d.rows.req_to_token[a.kv.req_pool_idx, a.kv_len] = ids.to(torch.int32)
        d.serving.decode_metadata([a.rid])
        a.kv_len += 1
        d.check()
    assert d.serving.counters.evicted_segments > evicted


def test_touch_prefix_bumps_recency_without_splitting():
    """touch_prefix (SGLang's waiting-prefix refresh) makes a history the most recently used, and a
    key ending inside an uncompressed node touches it whole, splitting nothing."""
    d = Driver(6)
    finished = _finish_sessions(d, 3)
    nodes = sum(1 for _ in d.tree._nodes())
    d.tree.touch_prefix(RadixKey(token_ids=finished[0][:-1], extra_key=None))  # ends inside the output
    assert sum(1 for _ in d.tree._nodes()) == nodes
    d.tree.evict(EvictParams(num_tokens=1))
    hits = _hits(d, finished)
    assert hits[0] == len(finished[0]) and hits[2] == len(finished[2]) and hits[1] < len(finished[1])
    d.check()


def _eviction_order(d):
    """Evict the whole tree leaf by leaf; the session (its prompt's first token - 1) of each leaf."""
    order, evict_leaf = [], d.tree._evict_leaf

    def spy(node, reason):
        top = node
        while top.parent is not d.tree.root_node:
            top = top.parent
        order.append(int(top.tokens[0]) - 1)
        return evict_leaf(node, reason)

    d.tree._evict_leaf = spy
    d.tree.evict(EvictParams(num_tokens=10**6))
    d.check()
    return [s for i, s in enumerate(order) if s not in order[:i]]


def test_waiting_queue_touch_evicts_the_turn_queued_last_first():
    """The scheduler hook touches the waiting turns' histories head last, on every pass where the
    queue changed: under pressure the history nobody waits for goes first, then the queue's tail;
    the head's history, finished first and so least recently used, goes last."""
    from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy, CacheAwarePolicy

    from tangram_sglang.sglang.scheduling import touch_waiting_histories

    d = Driver(6)
    finished = _finish_sessions(d, 3)
    assert _eviction_order(Driver(6)) == [] and len(finished) == 3
    queue = [SimpleNamespace(rid=f"w{i}", origin_input_ids=finished[i] + [7], output_ids=[], extra_key=None,
                             cache_salt=None) for i in (0, 1)]   # session 2's next turn is not queued
    policy, stock = SimpleNamespace(tree_cache=d.tree), []
    touch_waiting_histories(lambda *a: stock.append(a), policy, CacheAgnosticPolicy.FCFS, queue)
    assert not stock and d.tree.touched_order == ("w0", "w1")  # a Tangram tree: touched on this pass
    touch_waiting_histories(lambda *a: stock.append(a), policy, CacheAwarePolicy.LPM, queue)
    assert len(stock) == 1  # cache-aware policies touch while matching: SGLang's own path
    assert _eviction_order(d) == [2, 1, 0]

    d = Driver(6)
    finished = _finish_sessions(d, 3)
    assert _eviction_order(d) == [0, 1, 2]  # plain LRU, no queue: oldest first


def test_touch_is_bounded_by_tokens_per_pass(monkeypatch):
    """Only the queue's head within the token budget is touched (the rest, untouched, are older and
    lose their histories first, as the tail); the first request always is."""
    from tangram_sglang.sglang import scheduling

    queue = [SimpleNamespace(rid=f"w{i}", origin_input_ids=[1] * 100, output_ids=[2] * 20) for i in range(5)]
    monkeypatch.setattr(scheduling, "TOUCH_TOKENS_PER_PASS", 250)
    assert [r.rid for r in scheduling._touch_head(queue)] == ["w0", "w1"]
    monkeypatch.setattr(scheduling, "TOUCH_TOKENS_PER_PASS", 10)
    assert [r.rid for r in scheduling._touch_head(queue)] == ["w0"]


def test_stock_tree_gets_the_touch_with_tangram_refresh_waiting(monkeypatch):
    """No profile: SGLang's own refresh, unless TANGRAM_REFRESH_WAITING=1 (the baseline that isolates
    the refresh): then the waiting heads are touched head last, once per change of the queue."""
    from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy
    from sglang.srt.mem_cache.evict_policy import LRUStrategy

    from tangram_sglang.sglang import scheduling

    touched, stock = [], []
    monkeypatch.setattr(scheduling, "touch_waiting_prefix", lambda req, tree: touched.append(req.rid))
    tree = SimpleNamespace(eviction_strategy=LRUStrategy(), supports_prefix_sharing=lambda: True,
                           supports_fast_match_prefix=lambda: False)
    policy = SimpleNamespace(tree_cache=tree)
    queue = [SimpleNamespace(rid=f"w{i}", origin_input_ids=[1] * 10, output_ids=[]) for i in range(3)]
    original = lambda *a: stock.append(a)  # noqa: E731
    scheduling.touch_waiting_histories(original, policy, CacheAgnosticPolicy.FCFS, queue)
    assert len(stock) == 1 and not touched
    monkeypatch.setenv("TANGRAM_REFRESH_WAITING", "1")
    scheduling.touch_waiting_histories(original, policy, CacheAgnosticPolicy.FCFS, queue)
    scheduling.touch_waiting_histories(original, policy, CacheAgnosticPolicy.FCFS, queue)  # unchanged: no walk
    assert len(stock) == 1 and touched == ["w2", "w1", "w0"]
    tree.supports_fast_match_prefix = lambda: True        # a tree SGLang itself does not refresh
    scheduling.touch_waiting_histories(original, policy, CacheAgnosticPolicy.FCFS, queue[1:])
    assert len(stock) == 2


def _fill_pages(d, rid, tokens):
    """Admit request rid with ``tokens`` fresh prompt tokens (no prefix) and run its prefill: it holds
    its pages until released."""
    d.serving.admit(rid, prefix_chain=[], prefix_tokens=0, node=d.tree.root_node,
                    tokens=np.zeros(tokens, np.int64), decode_tokens=1)
    d.serving.bind_row(rid, d.free_rows.pop())
    while not d.serving.cache.requests[rid].prefill_done:
        d.serving.extend_metadata([rid], [d.serving.planned_extend(rid)])


def _most_tokens(d, pages):
    """The longest prompt (no prefix, one decode token) whose reservation is at most ``pages``."""
    lo, hi = 1, 1
    while d.serving.admission.pages_alone(hi, 1) <= pages:
        lo, hi = hi, hi * 2
    while lo < hi - 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if d.serving.admission.pages_alone(mid, 1) <= pages else (lo, mid)
    return lo


def test_a_request_that_cannot_fit_yet_evicts_nothing():
    """Head-of-line blocking under fcfs: a request that would not fit even with every unlocked leaf
    evicted waits WITHOUT evicting (asked again every scheduling pass, it would otherwise flush each
    history the moment it is published); one that fits evicts least recently used leaves, only as
    many as it needs."""
    d = Driver(6)
    finished = _finish_sessions(d, 4)
    tree_pages = d.serving.cache.usage().held_by_tree
    running = d.serving.cache.pool.available - tree_pages // 2  # leaves less room than the tree holds
    tokens = _most_tokens(d, running)
    _fill_pages(d, "running", tokens)
    check_integrity(d.serving, d.tree)
    room = d.serving.cache.pool.available + d.tree.freeable_pages()
    too_big = _most_tokens(d, room) + 1
    assert d.serving.admission.pages_alone(too_big, 1) <= d.serving.spec.num_pages  # fits an idle pool
    hits, counters = _hits(d, finished), d.serving.counters
    assert not d.serving.admit("blocked", prefix_chain=[], prefix_tokens=0, node=d.tree.root_node,
                               tokens=np.zeros(too_big, np.int64), decode_tokens=1)
    check_integrity(d.serving, d.tree)
    assert _hits(d, finished) == hits and counters.evictions_refused == 1 and counters.evicted_tokens_admission == 0
    # one that fits once some leaves go: the oldest sessions lose their histories, the newest keep them
    fits = too_big - 1
    assert d.serving.admission.pages_alone(fits, 1) > d.serving.cache.pool.available  # it must evict
    assert d.serving.admit("fits", prefix_chain=[], prefix_tokens=0, node=d.tree.root_node,
                           tokens=np.zeros(fits, np.int64), decode_tokens=1)
    check_integrity(d.serving, d.tree)
    after = _hits(d, finished)
    assert counters.evicted_tokens_admission > 0 and after[0] < hits[0]
    lost = [i for i, (a, b) in enumerate(zip(after, hits)) if a < b]
    assert lost == list(range(len(lost)))  # oldest first


@pytest.mark.parametrize("windows", [False, True])
def test_freeable_pages_are_what_evicting_every_unlocked_node_frees(windows, tmp_path):
    """freeable_pages (what the room check trusts) equals the pages evict_all frees on random busy
    states; with sliding-window layers it is an upper bound (locked nodes may drop window columns)."""
    import copy

    d = Driver(4, windows_in=tmp_path if windows else None)
    checked = 0
    for _ in range(30):
        d.run(40)
        twin = copy.deepcopy(d)
        predicted, before = twin.tree.freeable_pages(), twin.serving.cache.pool.available
        twin.tree.evict_all("flush")
        twin.check()
        if windows:
            drop_windows(twin.tree, twin.serving.spec.num_pages + 1)
        freed = twin.serving.cache.pool.available - before
        assert predicted >= freed if windows else predicted == freed
        checked += predicted > 0
    assert checked > 5


def test_publish_and_eviction_counters():
    """The counters that explain reuse: segments published, matched prefix tokens, evicted tokens by reason."""
    d = Driver(6)
    c = d.serving.counters
    finished = _finish_sessions(d, 2)
    assert c.published_segments >= 4 and c.twin_segments == c.detached_segments == 0
    d.sessions = [finished[0]]
    before = c.matched_tokens
    d.new_request()
    (req,) = [r for r in d.running.values()]
    # all of the history the chunk rule lets the new prompt reuse: its open tail only if still open
    cut = d.serving.context.cut
    want = reusable_prefix(cut(finished[0]), cut(req.prompt), len(finished[0]))
    assert c.matched_tokens - before == want >= 24
    d.tree.evict(EvictParams(num_tokens=1))
    assert c.evicted_tokens_sglang > 0 and c.evicted_segments > 0
    from tangram_sglang.serving.observability import log_line, pool_info

    info = pool_info(d.serving, d.tree)
    assert info["matched_tokens"] == c.matched_tokens and info["evicted_tokens_sglang"] == c.evicted_tokens_sglang
    assert log_line(info).endswith(f"tokens matched {c.matched_tokens}, evicted {c.evicted_tokens_sglang}")
