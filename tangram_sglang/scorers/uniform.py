"""Uniform: every token scores the same (0).

The selection's tie rule (later position wins) then keeps the most recent
tokens, and a global selection gives every head the same share: the
calibrated budgets equal the target ratio, a control for the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tangram_sglang.scorers.base import Scorer, ScorerState
from tangram_sglang.scorers.common import advance, check_qkv


@dataclass(frozen=True)
class UniformScorer(Scorer):
    name = "uniform"

    def score(self, q, k, v, state: ScorerState | None = None):
        n, num_kv, _ = check_qkv(q, k, v)
        advance(state, n)
        return torch.zeros(num_kv, n, dtype=torch.float32, device=k.device)
