"""Dense oracle for the ragged attention: full K/V plus a per-head keep mask.

Deliberately simple (no pages, no groups, no pieces): every query head h*gqa+j
attends to the tokens that KV head h keeps. Tests compare every ragged
implementation against it.
"""

from __future__ import annotations

import torch


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      sm_scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [Mq, Hq, d], k/v [N, H, d], mask bool [Mq, H, N] -> float32 [Mq, Hq, d] (0 where nothing is kept).
    sinks: float [Hq], a learned logit per query head in each softmax whose value is zero (gpt-oss)."""
    gqa = q.shape[1] // k.shape[1]
    kq = k.float().repeat_interleave(gqa, dim=1)  # [N, Hq, d]
    vq = v.float().repeat_interleave(gqa, dim=1)
    mq = mask.repeat_interleave(gqa, dim=1)  # [Mq, Hq, N]
    s = torch.einsum("mhd,nhd->mhn", q.float(), kq) * sm_scale
    s = s.masked_fill(~mq, float("-inf"))
    if sinks is not None:  # one more column, dropped after the softmax
        sink = sinks.float().view(1, -1, 1).expand(s.shape[0], -1, 1)
        s = torch.cat([s, sink], dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with nothing kept -> 0
    p = p[..., : kq.shape[0]]
    return torch.einsum("mhn,nhd->mhd", p, vq)


def dense_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
                 sm_scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, Hq, d]; k, v [B, N, H, d]; keep bool [B, H, N] -> float32 [B, Hq, d]."""
    return torch.stack([
        _masked_attention(q[b : b + 1], k[b], v[b], keep[b][None], sm_scale, sinks)[0] for b in range(q.shape[0])
    ])


def dense_prefill(q: torch.Tensor, k_hist: torch.Tensor, v_hist: torch.Tensor, keep_hist: torch.Tensor,
                  k_chunk: torch.Tensor, v_chunk: torch.Tensor, sm_scale: float,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One request's chunk: q [n, Hq, d] attends to kept history + causal chunk.

    k_hist, v_hist [N, H, d]; keep_hist bool [H, N]; k_chunk, v_chunk [n, H, d].
    Returns float32 [n, Hq, d].
    """
    n, num_kv = k_chunk.shape[0], k_chunk.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()  # [query, key]
    mask = torch.cat([keep_hist[None].expand(n, -1, -1), causal[:, None, :].expand(n, num_kv, n)], dim=2)
    k = torch.cat([k_hist, k_chunk]).float()
    v = torch.cat([v_hist, v_chunk]).float()
    return _masked_attention(q, k, v, mask, sm_scale, sinks)
