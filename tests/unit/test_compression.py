"""Fused compression: per-head top-k_g(n) selection, writes to reserved slots, and the
whole data plane (compress chunk 1, prefill + compress chunk 2, decode) against the
dense oracle with the same per-head selection."""

import math

import numpy as np
import pytest
import torch

from tangram_sglang.attention import (
    build_layer_meta,
    compress_and_write,
    group_keep_counts,
    make_split_row,
    ragged_decode_torch,
    ragged_prefill_chunk_torch,
    select_kept,
    slot_locs,
    write_decode_kv,
)
from tangram_sglang.attention.dense import dense_decode, dense_prefill
from tangram_sglang.attention.testing import random_groups
from tangram_sglang.method.budgets import keep_count
from tangram_sglang.scorers import selection
from tangram_sglang.scorers import KeyNormScorer


def test_select_kept_matches_selection_module_with_ties():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (3, 5, 19), generator=gen).float()  # many ties
    counts = torch.randint(0, 20, (3, 5), generator=gen)
    kept = select_kept(scores, counts)
    for b in range(3):
        want = selection.per_head_topk_indices(scores[b], counts[b])
        for h in range(5):
            c = int(counts[b, h])
            assert kept[b, h, :c].tolist() == sorted(want[h].tolist())
            assert bool((kept[b, h, c:] == 19).all())


class _MinusInf:
    def score(self, q, k, v, state=None):
        return torch.full((k.shape[1], k.shape[0]), float("-inf"))


def test_real_minus_inf_scores_still_beat_padding():
    from tangram_sglang.attention.compression import score_chunks

    x = torch.randn(4, 1, 2)
    scores = score_chunks(_MinusInf(), x, x, x, torch.tensor([0, 1, 4]))  # request 0: 1 token, padded to 3
    assert select_kept(scores, torch.tensor([[1], [3]])).tolist() == [[[0, 3, 3]], [[0, 1, 2]]]  # 3: sentinel


class _Plane:
    """A tiny pool (numpy page allocator) for one layer of B requests."""

    def __init__(self, meta, batch, cap, page_size, d, seed):
        pages = math.ceil(cap / page_size)
        rng = np.random.default_rng(seed)
        num_pages = batch * meta.num_groups * pages + 2
        ids = rng.permutation(num_pages)[: batch * meta.num_groups * pages]
        self.table = torch.as_tensor(ids.reshape(batch, meta.num_groups, pages), dtype=torch.int32)
        shape = (num_pages, page_size, meta.heads_per_group, d)
        self.k_pages, self.v_pages = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
        self.seq_lens = torch.zeros(batch, meta.num_groups, dtype=torch.int32)
        self.page_size = page_size


def _chunk(lens, hq, h, d, gen):
    total = int(sum(lens))
    return (torch.randn(total, hq, d, generator=gen), torch.randn(total, h, d, generator=gen),
            torch.randn(total, h, d, generator=gen), torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32))


def _mask(kept, n_max_b, b):
    """Keep mask [H, n_b] of request b from compress_and_write's kept (sentinel >= n_b)."""
    m = torch.zeros(kept.shape[1], n_max_b, dtype=torch.bool)
    for h in range(kept.shape[1]):
        pos = kept[b, h]
        m[h, pos[pos < n_max_b]] = True
    return m


@pytest.mark.parametrize("h,gqa,hp", [(4, 1, 1), (4, 3, 2), (5, 2, 4), (3, 3, 2)])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("lens1,lens2", [([17, 5], [9, 1]), ([54], [17]), ([1, 1, 3], [1, 2, 1])])
@pytest.mark.parametrize("host_plan", [False, True], ids=["device-sizes", "chunk-plan"])
def test_data_plane_flow_matches_dense(h, gqa, hp, page_size, lens1, lens2, host_plan):
    """host_plan: sizes from the host's ChunkPlan (the served path, no device sync)."""
    from tangram_sglang.attention.compression import ChunkPlan

    def plan(lens, keep):
        return ChunkPlan.build(lens, keep.numpy(), "cpu") if host_plan else None

    d, hq, batch = 16, h * gqa, len(lens1)
    rng = np.random.default_rng(h * 10 + hp)
    groups = random_groups(h, hp, rng)
    beta = rng.uniform(0.05, 1.0, size=len(groups))
    beta[0] = 1.0
    meta = build_layer_meta(groups, num_q_heads=hq, num_kv_heads=h, heads_per_group=hp, group_budget=beta)
    plane = _Plane(meta, batch, max(lens1) + max(lens2) + 1, page_size, d, seed=1)
    gen = torch.Generator().manual_seed(2)
    scorer, scale = KeyNormScorer(), 0.3

    q1, k1, v1, cu1 = _chunk(lens1, hq, h, d, gen)
    keep1 = group_keep_counts(meta, lens1)
    loc1 = slot_locs(plane.table, plane.seq_lens, keep1, page_size)
    kept1 = compress_and_write(q1, k1, v1, cu1, scorer, None, meta, keep1, loc1, plane.k_pages, plane.v_pages,
                               chunk_plan=plan(lens1, keep1))
    # realized per-head counts equal the declared group counts
    want_counts = keep_count(beta[None, :], np.asarray(lens1)[:, None])[:, meta.group_of_head.numpy()]
    assert ((kept1 < max(lens1)).sum(-1).numpy() == want_counts).all()
    plane.seq_lens += keep1.to(torch.int32)

    q2, k2, v2, cu2 = _chunk(lens2, hq, h, d, gen)
    out2 = ragged_prefill_chunk_torch(q2, k2, v2, cu2, plane.k_pages, plane.v_pages, plane.table,
                                      plane.seq_lens, meta, scale, tile=8)
    keep2 = group_keep_counts(meta, lens2)
    loc2 = slot_locs(plane.table, plane.seq_lens, keep2, page_size)
    kept2 = compress_and_write(q2, k2, v2, cu2, scorer, None, meta, keep2, loc2, plane.k_pages, plane.v_pages,
                               chunk_plan=plan(lens2, keep2))
    plane.seq_lens += keep2.to(torch.int32)

    q3, k3, v3 = torch.randn(batch, hq, d), torch.randn(batch, h, d), torch.randn(batch, h, d)
    loc3 = slot_locs(plane.table, plane.seq_lens, torch.ones_like(plane.seq_lens), page_size)
    write_decode_kv(k3, v3, loc3, meta, plane.k_pages, plane.v_pages)
    plane.seq_lens += 1
    out3 = ragged_decode_torch(q3, plane.k_pages, plane.v_pages, plane.table, plane.seq_lens, meta,
                               make_split_row([2] * meta.num_groups), scale)

    n_full = max(lens1) + max(lens2) + 1
    k_full, v_full = torch.zeros(batch, n_full, h, d), torch.zeros(batch, n_full, h, d)
    keep_full = torch.zeros(batch, h, n_full, dtype=torch.bool)
    for b in range(batch):
        a1, e1, a2, e2 = int(cu1[b]), int(cu1[b + 1]), int(cu2[b]), int(cu2[b + 1])
        m1 = _mask(kept1, e1 - a1, b)
        want2 = dense_prefill(q2[a2:e2], k1[a1:e1], v1[a1:e1], m1, k2[a2:e2], v2[a2:e2], scale)
        torch.testing.assert_close(out2[a2:e2], want2, atol=3e-5, rtol=1e-4)
        n1, n2 = e1 - a1, e2 - a2
        k_full[b, :n1 + n2 + 1] = torch.cat([k1[a1:e1], k2[a2:e2], k3[b : b + 1]])
        v_full[b, :n1 + n2 + 1] = torch.cat([v1[a1:e1], v2[a2:e2], v3[b : b + 1]])
        keep_full[b, :, : n1 + n2 + 1] = torch.cat([m1, _mask(kept2, n2, b), torch.ones(h, 1, dtype=torch.bool)], 1)
    torch.testing.assert_close(out3, dense_decode(q3, k_full, v_full, keep_full, scale), atol=3e-5, rtol=1e-4)
    # unused head slots of short groups were written as zeros, never left NaN
    used = plane.k_pages.view(-1, hp, d)[torch.cat([loc1, loc2, loc3])]
    assert not bool(torch.isnan(used).any())


def test_keep_counts_use_budgets_keep_count():
    meta = build_layer_meta([[0], [1]], num_q_heads=2, num_kv_heads=2, heads_per_group=1,
                            group_budget=[0.1, 0.5])
    assert group_keep_counts(meta, [10, 3, 1]).tolist() == [[1, 5], [1, 2], [1, 1]]


def test_out_loc_size_checked():
    meta = build_layer_meta([[0]], num_q_heads=1, num_kv_heads=1, heads_per_group=1, group_budget=[1.0])
    x = torch.randn(3, 1, 4)
    with pytest.raises(ValueError):
        compress_and_write(x, x, x, torch.tensor([0, 3]), KeyNormScorer(), None, meta, torch.tensor([[3]]),
                           torch.arange(2), torch.zeros(4, 1, 1, 4), torch.zeros(4, 1, 1, 4))


def test_protected_runs_are_kept_by_every_head():
    """Leading (sinks) and trailing (newest) runs survive whatever the scorer says."""
    meta = build_layer_meta([[0, 1], [2]], num_q_heads=3, num_kv_heads=3, heads_per_group=2,
                            group_budget=[0.2, 0.1])
    lens, d = [20, 9], 8
    gen = torch.Generator().manual_seed(5)
    q, k, v, cu = _chunk(lens, 3, 3, d, gen)
    protect = [(3, 5), (0, 9)]
    floor = torch.tensor([[a + b] for a, b in protect])
    keep = torch.maximum(group_keep_counts(meta, lens), floor)
    plane = _Plane(meta, 2, 20, 4, d, seed=3)
    loc = slot_locs(plane.table, plane.seq_lens, keep, 4)
    kept = compress_and_write(q, k, v, cu, KeyNormScorer(), None, meta, keep, loc, plane.k_pages, plane.v_pages,
                              protect=protect)
    for h in range(3):
        assert set(range(3)) | set(range(15, 20)) <= set(kept[0, h].tolist())
        assert kept[1, h, :9].tolist() == list(range(9))
