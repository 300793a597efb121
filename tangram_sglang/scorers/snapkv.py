"""SnapKV (Li et al. 2024) inside one prefill chunk.

The observation window is the chunk's last ``window`` queries (clamped to the
chunk length). Each earlier token is scored by the attention those queries
pay to it (softmax over the chunk's keys, causal, averaged over the window),
summed over the query heads of its KV head (GQA), then smoothed by 1-D
pooling along the sequence. Window tokens are always kept: their score is
offset above every non-window score (offset = group size + 1, an upper bound
of a pooled, group-summed probability), keeping their own attention as order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tangram_sglang.scorers.base import Scorer, ScorerState
from tangram_sglang.scorers.common import advance, check_qkv, fold_query_heads, repeat_kv_heads


def window_attention(q: torch.Tensor, k: torch.Tensor, window: int) -> torch.Tensor:
    """Mean attention the last ``window`` queries pay to each key, causal. -> float32 [Hq, n].

    q: [n, Hq, d]; k: [n, H, d].
    """
    n, num_q, d = q.shape
    group = num_q // k.shape[1]
    qw = q[n - window:].float().transpose(0, 1)  # [Hq, w, d]
    keys = repeat_kv_heads(k.float(), group)  # [Hq, n, d]
    logits = torch.matmul(qw, keys.transpose(1, 2)) / math.sqrt(d)  # [Hq, w, n]
    q_pos = torch.arange(n - window, n, device=q.device).unsqueeze(1)
    k_pos = torch.arange(n, device=q.device).unsqueeze(0)
    logits = logits.masked_fill(k_pos > q_pos, float("-inf"))
    return torch.softmax(logits, dim=-1).mean(dim=1)


@dataclass(frozen=True)
class SnapKVScorer(Scorer):
    window: int = 32
    kernel: int = 5
    pooling: str = "avg"  # "avg" or "max"

    name = "snapkv"

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"SnapKV window must be >= 1, got {self.window}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"SnapKV pooling kernel must be odd and >= 1, got {self.kernel}")
        if self.pooling not in ("avg", "max"):
            raise ValueError(f"SnapKV pooling must be 'avg' or 'max', got {self.pooling!r}")

    def _pool(self, scores: torch.Tensor) -> torch.Tensor:
        """Smooth [H, m] along m with the configured kernel (stride 1, same length)."""
        if self.kernel == 1 or scores.shape[1] == 0:
            return scores
        pad = self.kernel // 2
        x = scores.unsqueeze(0)
        if self.pooling == "max":
            return F.max_pool1d(x, self.kernel, stride=1, padding=pad).squeeze(0)
        return F.avg_pool1d(x, self.kernel, stride=1, padding=pad, count_include_pad=False).squeeze(0)

    def score(self, q, k, v, state: ScorerState | None = None):
        n, num_kv, group = check_qkv(q, k, v)
        w = min(self.window, n)
        attn = fold_query_heads(window_attention(q, k, w), num_kv)  # [H, n]
        out = torch.empty_like(attn)
        out[:, : n - w] = self._pool(attn[:, : n - w])
        out[:, n - w:] = attn[:, n - w:] + float(group + 1)
        advance(state, n)
        return out
