"""Log-sum-exp merging of partial attention results.

A partial result over a key set K is (o, lse): o = softmax-weighted mean of V
over K, lse = log sum_K exp(score). Two partials over disjoint sets merge
into the result over their union:

    m = max(lse1, lse2);  w_i = exp(lse_i - m)
    o = (w1 o1 + w2 o2) / (w1 + w2);  lse = m + log(w1 + w2)

An empty set has lse = -inf and contributes nothing; a union of empty sets
gives o = 0, lse = -inf.
"""

from __future__ import annotations

import torch


def merge_two(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor):
    """o*: float32 [..., d], lse*: float32 [...] -> merged (o, lse)."""
    m = torch.maximum(lse1, lse2)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w1, w2 = torch.exp(lse1 - m_safe), torch.exp(lse2 - m_safe)
    total = w1 + w2
    o = o1 * w1[..., None]   # (o1 w1 + o2 w2) / total, the same operations in place
    o += o2 * w2[..., None]
    o /= torch.clamp(total, min=1e-30)[..., None]
    return o, m_safe + torch.log(total)


def add_sinks(o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Learned attention sinks (gpt-oss): one more logit per query head in the softmax, whose value
    is zero. A result over keys K (o, lse) becomes o * sum_K e^s / (sum_K e^s + e^sink)
    = o * sigmoid(lse - sink): o [..., Hq, d], lse float32 [..., Hq], sinks [Hq] -> o's shape and
    dtype (an empty key set stays 0)."""
    scale = torch.sigmoid(lse - sinks.to(torch.float32))
    return (o.float() * scale[..., None]).to(o.dtype)


def merge_by_item(o: torch.Tensor, lse: torch.Tensor, item: torch.Tensor, num_items: int):
    """Merge partials that share an item id.

    o: float32 [NP, *rows, d]; lse: float32 [NP, *rows]; item: int64 [NP] in [0, num_items).
    Returns (o float32 [num_items, *rows, d], lse float32 [num_items, *rows]); items
    without partials get o = 0, lse = -inf.
    """
    rows = lse.shape[1:]
    m = torch.full((num_items, *rows), float("-inf"), dtype=lse.dtype, device=lse.device)
    idx = item.view(-1, *([1] * len(rows))).expand_as(lse)
    m = m.scatter_reduce(0, idx, lse, reduce="amax", include_self=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lse - m_safe[item])
    denom = torch.zeros_like(m).index_add_(0, item, w)
    acc = torch.zeros((num_items, *o.shape[1:]), dtype=o.dtype, device=o.device)
    acc.index_add_(0, item, o * w[..., None])
    out = acc / torch.clamp(denom, min=1e-30)[..., None]
    return out, m_safe + torch.log(denom)
