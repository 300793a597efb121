"""The KVzip reconstruction pass of one layer on ragged groups, against a dense per-head computation."""

import math

import numpy as np
import pytest
import torch

from tangram_sglang.scorers.kvzip.attention import reconstruction_attention
from tangram_sglang.attention.testing import make_ragged_cache
from tangram_sglang.scorers import KVzipScorer, get_scorer


def dense(q, k, v, k_chunk, v_chunk, cache, b, sinks):
    """Per KV head: attention output [m, Hq, d] and KVzip scores [H, n] of request b."""
    m, num_q, d = q.shape
    num_kv = k.shape[1]
    group = num_q // num_kv
    n = k_chunk.shape[0]
    out = torch.zeros(m, num_q, d)
    scores = torch.zeros(num_kv, n)
    causal = torch.ones(m, m, dtype=torch.bool).tril()
    for h in range(num_kv):
        hist = torch.nonzero(cache.keep[b, h]).flatten()
        kh = torch.cat([cache.k_full[b, hist, h], k_chunk[:, h], k[:, h]])
        vh = torch.cat([cache.v_full[b, hist, h], v_chunk[:, h], v[:, h]])
        allowed = torch.cat([torch.ones(m, len(hist) + n, dtype=torch.bool), causal], dim=1)
        qh = q[:, h * group:(h + 1) * group].transpose(0, 1)  # [group, m, d]
        logits = (qh @ kh.T) / math.sqrt(d)
        p = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
        out[:, h * group:(h + 1) * group] = (p @ vh).transpose(0, 1)
        s = min(sinks, len(hist))  # softmax over the first kept positions, the chunk, the reconstruction
        cols = torch.cat([torch.arange(s), torch.arange(len(hist), len(hist) + n + m)])
        ps = torch.softmax(logits[:, :, cols].masked_fill(~allowed[:, cols], float("-inf")), dim=-1)
        scores[h] = ps[:, :, s:s + n].amax(dim=(0, 1))
    return out, scores


@pytest.mark.parametrize("num_kv,gqa,hp,page", [(2, 2, 1, 4), (3, 1, 2, 1), (4, 3, 4, 16)])
@pytest.mark.parametrize("chunk_lens,rec_lens", [([5, 17], [9, 23]), ([1], [3])])
def test_reconstruction_matches_dense(num_kv, gqa, hp, page, chunk_lens, rec_lens):
    num_g = -(-num_kv // hp)
    rng = np.random.default_rng(len(chunk_lens) + num_kv)
    lens = rng.integers(0, 12, size=(len(chunk_lens), num_g))
    lens[0, 0] = 0  # a group with nothing cached (the first chunk of a request)
    cache = make_ragged_cache(lens, num_kv_heads=num_kv, gqa=gqa, heads_per_group=hp, head_dim=8, page_size=page)
    g = torch.Generator().manual_seed(5)
    nq = num_kv * gqa
    cu_c = torch.tensor(np.concatenate([[0], np.cumsum(chunk_lens)]))
    cu_r = torch.tensor(np.concatenate([[0], np.cumsum(rec_lens)]))
    kc, vc = torch.randn(int(cu_c[-1]), num_kv, 8, generator=g), torch.randn(int(cu_c[-1]), num_kv, 8, generator=g)
    q, k, v = (torch.randn(int(cu_r[-1]), nq, 8, generator=g), torch.randn(int(cu_r[-1]), num_kv, 8, generator=g),
               torch.randn(int(cu_r[-1]), num_kv, 8, generator=g))
    o, scores = reconstruction_attention(q, k, v, cu_r, kc, vc, cu_c, cache.k_pages, cache.v_pages,
                                         cache.block_table, cache.seq_lens, cache.meta, 1 / math.sqrt(8), tile=5)
    assert scores.shape == (len(chunk_lens), num_kv, max(chunk_lens))
    for b in range(len(chunk_lens)):
        r, c = slice(int(cu_r[b]), int(cu_r[b + 1])), slice(int(cu_c[b]), int(cu_c[b + 1]))
        want_o, want_s = dense(q[r], k[r], v[r], kc[c], vc[c], cache, b, sinks=4)
        torch.testing.assert_close(o[r], want_o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(scores[b, :, :chunk_lens[b]], want_s, rtol=1e-5, atol=1e-6)
        assert torch.isinf(scores[b, :, chunk_lens[b]:]).all()


def test_kvzip_scorer_needs_its_prefix_and_the_pass():
    s = get_scorer("kvzip", prefix_ids=[3, 4, 5])
    assert isinstance(s, KVzipScorer) and s.needs_reconstruction and s.prefix_ids == (3, 4, 5)
    with pytest.raises(ValueError, match="calibrate --method kvzip"):
        get_scorer("kvzip")
    with pytest.raises(ValueError, match="reconstruction pass"):
        s.score(torch.zeros(2, 2, 4), torch.zeros(2, 1, 4), torch.zeros(2, 1, 4))
