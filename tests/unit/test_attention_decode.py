"""Ragged decode (torch data plane) against the dense oracle with per-head keep masks."""

import math

import numpy as np
import pytest
import torch

from tangram_sglang.attention import make_split_row, ragged_decode_torch
from tangram_sglang.attention.dense import dense_decode
from tangram_sglang.attention.testing import make_ragged_cache

SHAPES = [  # (H, gqa, H_p)
    (4, 1, 1), (4, 3, 2), (5, 2, 4), (3, 3, 2), (8, 1, 4),
]


def _lens(batch, num_g, max_len, seed, with_edges=True):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, max_len + 1, size=(batch, num_g))
    if with_edges and lens.size >= 2:
        lens.flat[0], lens.flat[1] = 0, 1  # an empty group and a group of one slot
    return lens


def _case(shape, page_size, batch, max_len, seed, d=16, **storage):
    h, gqa, hp = shape
    num_g = math.ceil(h / hp)
    lens = _lens(batch, num_g, max_len, seed)
    return make_ragged_cache(lens, num_kv_heads=h, gqa=gqa, heads_per_group=hp, head_dim=d,
                             page_size=page_size, seed=seed, **storage)


def _expected(cache, q, scale):
    return dense_decode(q, cache.k_full, cache.v_full, cache.keep, scale)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("batch,max_len", [(1, 17), (3, 54), (2, 1)])
@pytest.mark.parametrize("tile", [None, 5, 128])
def test_decode_matches_dense(shape, page_size, batch, max_len, tile):
    cache = _case(shape, page_size, batch, max_len, seed=batch * 100 + max_len)
    hq = shape[0] * shape[1]
    q = torch.randn(batch, hq, 16)
    rng = np.random.default_rng(1)
    split = make_split_row(rng.integers(1, 6, size=cache.meta.num_groups))
    out = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                              cache.meta, split, 0.25, tile=tile)
    torch.testing.assert_close(out, _expected(cache, q, 0.25), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("num_splits", [1, 2, 7, 60])
def test_result_independent_of_split_map(num_splits):
    cache = _case((6, 2, 2), 4, 2, 54, seed=3)
    q = torch.randn(2, 12, 16)
    split = make_split_row([num_splits] * cache.meta.num_groups)
    out = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                              cache.meta, split, 0.3)
    torch.testing.assert_close(out, _expected(cache, q, 0.3), atol=2e-5, rtol=1e-4)


def test_all_groups_empty_gives_zero_and_neg_inf_lse():
    cache = make_ragged_cache(np.zeros((2, 2), dtype=np.int64), num_kv_heads=4, gqa=2, heads_per_group=2,
                              head_dim=8, page_size=1)
    q = torch.randn(2, 8, 8)
    o, lse = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                                 cache.meta, make_split_row([2, 2]), 1.0, return_lse=True)
    assert torch.equal(o, torch.zeros_like(o)) and bool(torch.isneginf(lse).all())


def test_lse_matches_dense_logsumexp():
    cache = _case((4, 2, 2), 1, 2, 17, seed=5)
    q = torch.randn(2, 8, 16)
    _, lse = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                                 cache.meta, make_split_row([3, 1]), 0.5, return_lse=True)
    kq = cache.k_full.repeat_interleave(2, dim=2)  # [B, N, Hq, d]
    s = torch.einsum("bhd,bnhd->bhn", q, kq) * 0.5
    s = s.masked_fill(~cache.keep.repeat_interleave(2, dim=1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1), atol=1e-5, rtol=1e-5)


def test_bfloat16_pages():
    cache = make_ragged_cache(_lens(2, 2, 30, 7), num_kv_heads=4, gqa=2, heads_per_group=2, head_dim=16,
                              page_size=16, seed=7, dtype=torch.bfloat16)
    q = torch.randn(2, 8, 16).to(torch.bfloat16)
    out = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                              cache.meta, make_split_row([2, 2]), 0.25)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _expected(cache, q, 0.25), atol=2e-2, rtol=2e-2)


def test_batched_gather_gives_the_same_result(monkeypatch):
    import tangram_sglang.attention.reference as reference

    cache = _case((4, 3, 2), 16, 3, 54, seed=11)
    q = torch.randn(3, 12, 16)
    split = make_split_row([3, 2])
    want = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens, cache.meta,
                               split, 0.25, tile=4)
    monkeypatch.setattr(reference, "GATHER_BYTES", 1)  # one piece per batch
    got = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens, cache.meta,
                              split, 0.25, tile=4)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("batch,max_len", [(1, 17), (3, 54), (2, 1)])
@pytest.mark.parametrize("kv_dtype,scales", [(torch.float8_e4m3fn, (0.5, 2.0)), (torch.float8_e5m2, (1.0, 1.0))],
                         ids=["e4m3", "e5m2"])
def test_fp8_pages_decode_matches_dense(shape, page_size, batch, max_len, kv_dtype, scales):
    """Pages hold quantized K/V; the dense twin holds what they decode to (scales applied)."""
    cache = _case(shape, page_size, batch, max_len, seed=batch * 7 + max_len, kv_dtype=kv_dtype, kv_scales=scales)
    assert cache.k_pages.dtype == kv_dtype
    q = torch.randn(batch, shape[0] * shape[1], 16)
    split = make_split_row([2] * cache.meta.num_groups)
    for tile in (None, 5):
        out = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens, cache.meta,
                                  split, 0.25, tile=tile)
        torch.testing.assert_close(out, _expected(cache, q, 0.25), atol=3e-5, rtol=1e-4)


def test_learned_sinks_from_the_lse_equal_a_sink_column():
    """gpt-oss's sinks: add_sinks(o, lse) equals the dense softmax with a zero-valued sink column; a query
    whose groups hold nothing stays 0."""
    from tangram_sglang.attention.dense import dense_decode
    from tangram_sglang.attention.merge import add_sinks

    cache = _case((4, 2, 2), 4, 2, 33, seed=8)
    q, sinks = torch.randn(2, 8, 16), torch.randn(8) * 2
    o, lse = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                                 cache.meta, make_split_row([3, 1]), 0.5, tile=4, return_lse=True)
    want = dense_decode(q, cache.k_full, cache.v_full, cache.keep, 0.5, sinks)
    torch.testing.assert_close(add_sinks(o, lse, sinks), want, atol=2e-5, rtol=1e-4)
    empty = torch.full((2, 8), float("-inf"))
    assert torch.equal(add_sinks(torch.zeros(2, 8, 16), empty, sinks), torch.zeros(2, 8, 16))
