"""Helpers shared by the scorers: shape checks, GQA head folding, state upkeep."""

from __future__ import annotations

import torch

from tangram_sglang.scorers.base import ScorerState


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int]:
    """Validate chunk tensors; returns (n, num_kv_heads, group) with group = Hq // H.

    q: [n, Hq, d]; k, v: [n, H, d] with Hq a multiple of H.
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [n, heads, d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    n, num_q, d = q.shape
    if k.shape[0] != n or v.shape[0] != n or k.shape[2] != d or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not agree")
    num_kv = k.shape[1]
    if num_q % num_kv:
        raise ValueError(f"query heads {num_q} are not a multiple of KV heads {num_kv}")
    return n, num_kv, num_q // num_kv


def repeat_kv_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """[n, H, d] -> [Hq, n, d]: KV head h serves query heads h*group ... h*group+group-1."""
    return x.transpose(0, 1).repeat_interleave(group, dim=0)


def fold_query_heads(scores: torch.Tensor, num_kv: int, reduce: str = "sum") -> torch.Tensor:
    """[Hq, n] -> [H, n], summing (or averaging) over the query heads of each KV head."""
    folded = scores.view(num_kv, scores.shape[0] // num_kv, scores.shape[1])
    return folded.sum(dim=1) if reduce == "sum" else folded.mean(dim=1)


def chunk_start(state: ScorerState | None) -> int:
    """Sequence position of the chunk's first token (0 without state)."""
    return 0 if state is None else int(state.tokens_seen)


def advance(state: ScorerState | None, n: int) -> None:
    """Every scorer calls this last: tokens_seen counts the tokens scored so far."""
    if state is not None:
        state.tokens_seen += n


def sink_mask(start: int, n: int, n_sink: int, device) -> torch.Tensor:
    """Bool [n]: True for chunk tokens whose sequence position is < n_sink."""
    return (torch.arange(n, device=device) + start) < n_sink
