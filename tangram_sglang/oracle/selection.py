"""The dense oracle's selection policies: which chunk positions each KV head keeps, given scores.

ProfileSelection is what the server does (each head of group g keeps its own top
keep_count(beta[l][g], n)); DynamicSelection and UniformSelection are the methods the fidelity
benchmark compares with (the paper's per-chunk global top-k, and equal per-head budgets).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tangram_sglang.method.budgets import SCOPES, keep_count
from tangram_sglang.scorers.selection import PROTECTED_SCORE, global_topk_mask, model_topk_masks


def top_positions(row: torch.Tensor, count: int) -> list[int]:
    """The ``count`` best positions of one head's scores row [n] (ties: later position first).

    Like the served path, -inf is clamped to the lowest float first, so such
    tokens tie among themselves and fall to the same later-first rule.
    """
    values = torch.clamp(row.float(), min=torch.finfo(torch.float32).min).tolist()
    if any(math.isnan(x) for x in values):
        raise ValueError("scorer returned NaN")
    return sorted(range(len(values)), key=lambda p: (values[p], p), reverse=True)[:count]


def head_keep_counts(group_budget: np.ndarray, groups: list[list[int]], num_kv_heads: int, n: int) -> list[int]:
    """Tokens each KV head keeps from an n-token chunk: keep_count(beta_g, n) of its group."""
    counts = [-1] * num_kv_heads
    for beta, group in zip(group_budget, groups):
        for h in group:
            counts[h] = int(keep_count(float(beta), n))
    return counts


class ProfileSelection:
    """The served policy: head h of group g keeps its top keep_count(beta[l][g], n) positions."""

    def __init__(self, entry):
        self.entry = entry

    def kept_mask(self, layer: int, scores: torch.Tensor, floor: int = 0) -> torch.Tensor:
        """scores float [H, n] (protected positions already raised), floor: protected tokens -> bool [H, n]."""
        num_heads, n = scores.shape
        counts = head_keep_counts(self.entry.group_budget[layer], self.entry.groups[layer], num_heads, n)
        return _mask_of_counts(scores, [max(c, floor) for c in counts])


class DynamicSelection:
    """Per-chunk global top ceil(ratio * H * n) of the layer's scores (the paper's "w/o Tangram").

    scope "model" (a profile calibrated that way): the top ceil(ratio * L * H * n) of every layer's
    scores of the chunk (``kept_masks``, called once all layers have scored it)."""

    def __init__(self, ratio: float, scope: str = "layer"):
        if scope not in SCOPES:
            raise ValueError(f"selection scope must be one of {SCOPES}, got {scope!r}")
        self.ratio, self.scope = float(ratio), scope

    def kept_mask(self, layer: int, scores: torch.Tensor, floor: int = 0) -> torch.Tensor:
        mask = global_topk_mask(_finite(scores), self.ratio)
        return mask | (scores >= PROTECTED_SCORE)

    def kept_masks(self, scores: list[torch.Tensor]) -> list[torch.Tensor]:
        """Model scope: scores L x float [H, n] (protected raised) -> L x bool [H, n]."""
        masks = model_topk_masks([_finite(sc) for sc in scores], self.ratio)
        return [m | (sc >= PROTECTED_SCORE) for m, sc in zip(masks, scores)]


def _finite(scores: torch.Tensor) -> torch.Tensor:
    return torch.clamp(scores.float(), min=torch.finfo(torch.float32).min)


class UniformSelection:
    """Every head keeps its own top keep_count(ratio, n) positions."""

    def __init__(self, ratio: float):
        self.ratio = float(ratio)

    def kept_mask(self, layer: int, scores: torch.Tensor, floor: int = 0) -> torch.Tensor:
        num_heads, n = scores.shape
        return _mask_of_counts(scores, [max(int(keep_count(self.ratio, n)), floor)] * num_heads)


def _mask_of_counts(scores: torch.Tensor, counts: list[int]) -> torch.Tensor:
    mask = torch.zeros(scores.shape, dtype=torch.bool)
    for h, count in enumerate(counts):
        mask[h, top_positions(scores[h], count)] = True
    return mask
