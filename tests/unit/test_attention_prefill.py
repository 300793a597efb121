"""Chunk prefill attention over ragged groups against the dense oracle."""

import math

import numpy as np
import pytest
import torch

from tangram_sglang.attention import ragged_prefill_chunk_torch
from tangram_sglang.attention.dense import dense_prefill
from tangram_sglang.attention import fused_cpu
from tangram_sglang.attention.fused_cpu import _batches, chunk_self_attention_fused
from tangram_sglang.attention.prefill_reference import chunk_self_attention
from tangram_sglang.attention.testing import make_ragged_cache

SHAPES = [(4, 1, 1), (4, 3, 2), (5, 2, 4), (3, 3, 2)]  # (H, gqa, H_p)


def _dense(cache, q, k, v, cu, scale, sinks=None):
    outs = []
    for b in range(len(cu) - 1):
        a, e = cu[b], cu[b + 1]
        n_hist = int(cache.hist_lens[b])
        outs.append(dense_prefill(q[a:e], cache.k_full[b, :n_hist], cache.v_full[b, :n_hist],
                                  cache.keep[b, :, :n_hist], k[a:e], v[a:e], scale, sinks))
    return torch.cat(outs)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("chunk_lens,max_len", [([17], 54), ([1, 5, 17], 17), ([3, 1], 1), ([54, 2], 0)])
@pytest.mark.parametrize("tile", [4, 128])
@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["model", "fp8_e4m3"])
def test_prefill_matches_dense(shape, page_size, chunk_lens, max_len, tile, fused, kv_dtype):
    h, gqa, hp = shape
    num_g, batch, d = math.ceil(h / hp), len(chunk_lens), 16
    rng = np.random.default_rng(len(chunk_lens) * 7 + max_len)
    lens = rng.integers(0, max_len + 1, size=(batch, num_g))
    lens.flat[0] = 0
    cache = make_ragged_cache(lens, num_kv_heads=h, gqa=gqa, heads_per_group=hp, head_dim=d,
                              page_size=page_size, seed=int(lens.sum()), kv_dtype=kv_dtype,
                              kv_scales=(2.0, 0.5) if kv_dtype else (1.0, 1.0))
    cu = [0, *np.cumsum(chunk_lens).tolist()]
    total = cu[-1]
    q, k, v = torch.randn(total, h * gqa, d), torch.randn(total, h, d), torch.randn(total, h, d)
    out = ragged_prefill_chunk_torch(q, k, v, torch.tensor(cu, dtype=torch.int32), cache.k_pages,
                                     cache.v_pages, cache.block_table, cache.seq_lens, cache.meta, 0.25,
                                     tile=tile, fused=fused)
    torch.testing.assert_close(out, _dense(cache, q, k, v, cu, 0.25), atol=3e-5, rtol=1e-4)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_learned_sinks_enter_through_the_log_sum_exp(fused):
    """gpt-oss: a sink logit per query head (value zero) in every softmax: add_sinks on the data plane's
    (o, lse) equals the dense softmax with the sink as one more column; no sinks, the same o."""
    from tangram_sglang.attention.merge import add_sinks

    h, gqa, hp, d = 4, 3, 2, 16
    lens = np.array([[5, 0], [19, 7]])
    cache = make_ragged_cache(lens, num_kv_heads=h, gqa=gqa, heads_per_group=hp, head_dim=d, page_size=4, seed=3)
    cu = [0, 6, 23]
    q, k, v = torch.randn(23, h * gqa, d), torch.randn(23, h, d), torch.randn(23, h, d)
    sinks = torch.randn(h * gqa) * 2
    args = (q, k, v, torch.tensor(cu, dtype=torch.int32), cache.k_pages, cache.v_pages, cache.block_table,
            cache.seq_lens, cache.meta, 0.25)
    o, lse = ragged_prefill_chunk_torch(*args, tile=4, fused=fused, return_lse=True)
    torch.testing.assert_close(o, ragged_prefill_chunk_torch(*args, tile=4, fused=fused))
    torch.testing.assert_close(add_sinks(o, lse, sinks), _dense(cache, q, k, v, cu, 0.25, sinks), atol=3e-5, rtol=1e-4)
    assert not torch.allclose(add_sinks(o, lse, sinks), o, atol=1e-3)


@pytest.mark.parametrize("lens,hq,h", [([17, 5, 1], 6, 2), ([54], 9, 3), ([1], 4, 4), ([16, 0], 2, 1)])
def test_fused_self_attention_matches_reference(lens, hq, h):
    """The fused CPU kernel equals the reference on every real row (padding rows are ignored)."""
    n, d = max(lens), 16
    gen = torch.Generator().manual_seed(sum(lens) + hq)
    q, k, v = (torch.randn(len(lens), n, x, d, generator=gen) for x in (hq, h, h))
    t = torch.tensor(lens, dtype=torch.int64)
    o_ref, lse_ref = chunk_self_attention(q, k, v, t, 0.3)
    o, lse = chunk_self_attention_fused(q, k, v, t, 0.3)
    assert o.shape == o_ref.shape and lse.shape == lse_ref.shape
    for b, m in enumerate(lens):
        torch.testing.assert_close(o[b, :m], o_ref[b, :m], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[b, :m], lse_ref[b, :m], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()


def test_fused_piece_batches_bound_gather_and_padding():
    """Pieces go longest first; a batch gathers at most cap slots (a longer piece alone) and holds
    no piece under 3/4 of its width; every piece lands in exactly one batch."""
    lengths = [5, 40, 31, 30, 8, 40, 7, 130]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches = list(_batches(order, lengths, cap=100))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert [[lengths[i] for i in b] for b in batches] == [[130], [40, 40], [31, 30], [8, 7], [5]]


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["model", "fp8_e4m3"])
def test_fused_prefill_in_small_gathers_matches_dense(monkeypatch, kv_dtype):
    """With a gather budget of a few pieces, the fused path runs many batches through its reused
    buffers (some masked, some not) and still equals the dense oracle, groups of unequal length."""
    monkeypatch.setattr(fused_cpu, "GATHER_BYTES", 24 * 2 * 16 * 4)   # 24 slots of H_p = 2, d = 16
    h, gqa, hp, d = 4, 3, 2, 16
    lens = np.array([[40, 23], [0, 17], [9, 40]])
    cache = make_ragged_cache(lens, num_kv_heads=h, gqa=gqa, heads_per_group=hp, head_dim=d, page_size=4,
                              seed=3, kv_dtype=kv_dtype, kv_scales=(2.0, 0.5) if kv_dtype else (1.0, 1.0))
    cu = [0, 7, 8, 20]
    q, k, v = torch.randn(20, h * gqa, d), torch.randn(20, h, d), torch.randn(20, h, d)
    out = ragged_prefill_chunk_torch(q, k, v, torch.tensor(cu), cache.k_pages, cache.v_pages, cache.block_table,
                                     cache.seq_lens, cache.meta, 0.25, tile=16, fused=True)
    torch.testing.assert_close(out, _dense(cache, q, k, v, cu, 0.25), atol=3e-5, rtol=1e-4)
