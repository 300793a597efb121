"""Tensor-parallel profiles: SGLang's head sharding, grouping within a rank, regrouping from the
stored budgets, rank views with equal page needs, and ranks' pools that stay in lockstep."""

import random

import numpy as np
import pytest

from tangram_sglang.pool import PoolSpec, RaggedKVCache, RequestTooLargeError
from tangram_sglang.profile import CalibrationMeta, ModelShape, ProfileError
from tangram_sglang.profile.builder import build_profile, make_entry
from tangram_sglang.profile.tensor_parallel import (
    check_tp_size,
    equalized_betas,
    rank_view,
    regroup,
    shard_of_rank,
    shards,
)
from tangram_sglang.profile.validation import parse_profile

from pool_driver import finish


def random_profile(num_kv_heads=8, num_layers=5, heads_per_group=2, seed=0, ratios=(0.5, 0.25)):
    rng = np.random.default_rng(seed)
    shape = ModelShape(architecture="LlamaForCausalLM", num_layers=num_layers, num_kv_heads=num_kv_heads,
                       head_dim=16)
    entries = []
    for r in ratios:
        b = np.clip(rng.beta(2, 2 / r, size=(num_layers, num_kv_heads)) + 0.01, 0.01, 1.0)
        entries.append(make_entry(r, b, b, np.zeros_like(b), heads_per_group=heads_per_group,
                                  grouping="budget_aware", parallel_capacity=17))
    meta = CalibrationMeta(method="snapkv", target_ratios=tuple(ratios), alpha=2.0, num_samples=4)
    return build_profile(shape, meta, entries, heads_per_group=heads_per_group, grouping="budget_aware",
                         parallel_capacity=17)


def test_shards_follow_sglang_layout():
    assert shards(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert shards(8, 8) == [[h] for h in range(8)]
    assert shards(2, 4) == [[0], [1]]                       # t > H: heads replicated
    assert [shard_of_rank(2, 4, r) for r in range(4)] == [0, 0, 1, 1]
    assert [shard_of_rank(8, 4, r) for r in range(4)] == [0, 1, 2, 3]


def test_uneven_tp_size_is_a_clear_error_naming_both_sizes():
    with pytest.raises(ProfileError, match=r"TP=1.*--tp-size 2.*3 KV heads"):
        check_tp_size(3, 2, profile_tp=1)
    with pytest.raises(ProfileError, match="tp-size 2"):
        rank_view(random_profile(num_kv_heads=3, heads_per_group=1), 2, 0)


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("hpg", [1, 2, 4])
def test_regroup_keeps_every_budget_and_groups_within_ranks(t, hpg):
    prof = parse_profile(random_profile(heads_per_group=hpg, seed=t * 10 + hpg).to_dict())  # as stored
    tp = regroup(prof, t)
    again = parse_profile(tp.to_dict())                     # the file validates, tp_size round-trips
    assert again.tp_size == t and again.heads_per_group == min(hpg, 8 // t)
    for e0, e in zip(prof.entries, again.entries):
        assert np.array_equal(e0.budgets, e.budgets)        # calibrated budgets untouched
        for layer in e.groups:
            for g in layer:
                assert len({h // (8 // t) for h in g}) == 1   # one rank's heads
    assert ("tp_size" in prof.to_dict()) is False           # TP=1 files unchanged


def test_profile_with_a_group_spanning_ranks_is_refused():
    raw = random_profile(heads_per_group=4).to_dict()
    raw["tp_size"] = 4                                      # groups of 4 heads cannot live on 2-head ranks
    with pytest.raises(ProfileError, match="heads_per_group"):
        parse_profile(raw)
    raw = regroup(random_profile(heads_per_group=2), 2).to_dict()
    raw["tp_size"] = 4
    raw["entries"][0]["groups"][0] = [[0, 2], [1, 3], [4, 5], [6, 7]]
    with pytest.raises(ProfileError, match="spans TP ranks"):
        parse_profile(raw)


@pytest.mark.parametrize("t,hpg", [(2, 1), (2, 2), (4, 2), (8, 1), (16, 1)])
def test_rank_views_need_the_same_slots_and_keep_each_heads_budget(t, hpg):
    prof = random_profile(heads_per_group=hpg, seed=t)
    views = [rank_view(prof, t, r) for r in range(t)]
    for i, e in enumerate(prof.entries):
        multisets = [np.sort(v.entries[i].group_budget.ravel()) for v in views]
        assert all(np.array_equal(multisets[0], m) for m in multisets)
        for r, v in enumerate(views):
            heads = shards(8, t)[shard_of_rank(8, t, r)]
            assert v.model.num_kv_heads == len(heads)
            local = v.entries[i]
            for layer, groups in enumerate(local.groups):
                for g, members in enumerate(groups):  # every head keeps at least its calibrated budget
                    assert local.group_budget[layer, g] >= max(e.budgets[layer, heads[h]] for h in members)
            assert local.split_map.shape == local.group_budget.shape and local.split_map.min() >= 1
    grouped = regroup(prof, t).entries[0]
    assert all(len(b) for b in equalized_betas(grouped.budgets, grouped.groups, 8, t))


def test_tp1_view_is_the_profile():
    prof = random_profile()
    assert rank_view(prof, 1, 0) is prof


class Ranks:
    """One RaggedKVCache per TP rank, driven with the same operations."""

    def __init__(self, prof, t, num_pages=60, page_size=4):
        self.caches = []
        for r in range(t):
            v = rank_view(prof, t, r)
            e = v.entries[0]
            spec = PoolSpec(num_layers=v.model.num_layers, num_groups=e.num_groups, heads_per_group=v.heads_per_group,
                            head_dim=1, page_size=page_size, num_pages=num_pages)
            self.caches.append(RaggedKVCache(spec, e.group_budget))

    def all(self, op):
        """Apply op to every rank's cache; every rank must give the same answer shape."""
        out = []
        for c in self.caches:
            try:
                out.append(("ok", op(c)))
            except RequestTooLargeError:
                out.append(("too large", None))
        kinds = {(k, None if v is None else type(v).__name__) for k, v in out}
        assert len(kinds) == 1, f"ranks diverged: {kinds}"
        free = {c.pool.num_free for c in self.caches}
        avail = {c.pool.available for c in self.caches}
        assert len(free) == 1 and len(avail) == 1, f"pages diverged: free {free}, available {avail}"
        for c in self.caches:
            c.check_integrity()
        return [v for _, v in out]


@pytest.mark.parametrize("t,hpg", [(2, 2), (4, 1), (8, 1)])
def test_rank_pools_stay_in_lockstep_under_random_operations(t, hpg):
    """Admission, prefill chunks, decode, publish, abort and eviction: every rank refuses or admits
    the same requests and holds the same number of free pages after every operation."""
    rng = random.Random(t * 7 + hpg)
    ranks = Ranks(random_profile(heads_per_group=hpg, seed=3 * t), t)
    live, parent, prefix_of, next_rid = {}, {}, {}, 0
    for _ in range(1500):
        op = rng.random()
        if op < 0.25:
            leaves = [s for s in parent if s not in set(parent.values()) and
                      s not in {x for p in prefix_of.values() for x in p}]
            chain = []
            if leaves and rng.random() < 0.5:
                s = rng.choice(leaves)
                while s is not None:
                    chain.append(s)
                    s = parent[s]
                chain.reverse()
            chunks = [rng.randint(1, 12)] + [8] * rng.randint(0, 3)
            dec = rng.randint(0, 10)
            got = ranks.all(lambda c: c.admit(next_rid, chunk_tokens=chunks, decode_tokens=dec,
                                              prefix=[c.store.get(s) for s in chain]))
            if got[0] is not None:
                live[next_rid], prefix_of[next_rid] = chunks, tuple(chain)
            next_rid += 1
        elif op < 0.5 and live:
            rid = rng.choice(list(live))
            req = ranks.caches[0].requests[rid]
            k = len(req.chunk_ends)
            if k < len(live[rid]):
                ranks.all(lambda c: c.prefill_chunk(rid, live[rid][k]))
        elif op < 0.75 and live:
            done = [r for r in live if ranks.caches[0].requests[r].prefill_done]
            if done:
                batch = rng.sample(done, rng.randint(1, len(done)))
                ranks.all(lambda c: c.decode_step(batch))
        elif op < 0.9 and live:
            rid = rng.choice(list(live))
            if ranks.caches[0].requests[rid].prefill_done and rng.random() < 0.7:
                segs = ranks.all(lambda c: [s.seg_id for s in finish(c, rid)])
                assert all(s == segs[0] for s in segs)      # the tree sees the same segments on every rank
                prev = prefix_of[rid][-1] if prefix_of[rid] else None
                for s in segs[0]:
                    parent[s], prev = prev, s
            else:
                ranks.all(lambda c: c.release(rid))
            del live[rid], prefix_of[rid]
        else:
            leaves = [s for s in parent if s not in set(parent.values()) and
                      s not in {x for p in prefix_of.values() for x in p}]
            if leaves:
                s = rng.choice(leaves)
                ranks.all(lambda c: c.evict(s))
                del parent[s]
    assert next_rid > 100
