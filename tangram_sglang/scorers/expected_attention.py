"""Expected Attention (Devoto et al. 2025, kvpress) on chunk tensors.

Future queries are modelled as a Gaussian with the mean mu and covariance
Sigma of the queries seen so far in this sequence (every chunk up to and
including this one, sink positions excluded), kept per query head as running
sums in the ScorerState. For a Gaussian query the expected unnormalised
attention to key k is exp(mu.k / sqrt(d) + k^T Sigma k / (2 d)); the scores
are its softmax over the chunk's keys, averaged over the query heads of each
KV head, times ||v|| (kvpress's use_vnorm). Sink tokens score above all.

Difference to kvpress: kvpress takes pre-RoPE query statistics and applies
the mean RoPE rotation of the next 512 positions; a scorer here sees only
post-RoPE tensors (no rotary parameters), so the statistics are those of
post-RoPE queries. Both average out the fast-rotating dimensions; the slow
ones differ by the rotation between past and future positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tangram_sglang.scorers.base import Scorer, ScorerState
from tangram_sglang.scorers.common import advance, check_qkv, chunk_start, fold_query_heads, repeat_kv_heads, sink_mask


def update_query_stats(state: ScorerState | None, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Add queries q [m, Hq, d] to the running sums; return (mu [Hq, d], Sigma [Hq, d, d]) float64."""
    x = q.double()
    count = torch.tensor(float(x.shape[0]), dtype=torch.float64)
    s1, s2 = x.sum(dim=0), torch.einsum("mhi,mhj->hij", x, x)
    if state is not None:
        if "ea_count" in state.tensors:
            count = count + state.tensors["ea_count"]
            s1 = s1 + state.tensors["ea_sum"]
            s2 = s2 + state.tensors["ea_outer"]
        state.tensors.update(ea_count=count, ea_sum=s1, ea_outer=s2)
    if float(count) == 0.0:
        return s1, s2  # zeros: no query yet -> uniform expected attention
    mu = s1 / count
    return mu, s2 / count - torch.einsum("hi,hj->hij", mu, mu)


@dataclass(frozen=True)
class ExpectedAttentionScorer(Scorer):
    n_sink: int = 4
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = 0.0

    name = "expected_attention"

    def score(self, q, k, v, state: ScorerState | None = None):
        n, num_kv, group = check_qkv(q, k, v)
        d = q.shape[2]
        start = chunk_start(state)
        sinks = sink_mask(start, n, self.n_sink, q.device)
        mu, cov = update_query_stats(state, q[~sinks])
        keys = repeat_kv_heads(k, group).double()  # [Hq, n, d]
        logits = torch.einsum("hnd,hd->hn", keys, mu) / math.sqrt(d)
        if self.use_covariance:
            logits = logits + torch.einsum("hnd,hde,hne->hn", keys, cov, keys) / (2.0 * d)
        scores = fold_query_heads(torch.softmax(logits, dim=-1), num_kv, "mean").float()  # [H, n]
        if self.use_vnorm:
            scores = (scores + self.epsilon) * v.float().norm(dim=-1).transpose(0, 1)
        if bool(sinks.any()):
            scores[:, sinks] = scores.max() + 1.0
        advance(state, n)
        return scores
