"""KeyDiff (Park et al. 2025): keep keys that differ from the typical key.

score = -cos(k, anchor), anchor = the mean of the L2-normalised keys seen so
far in this sequence (all earlier chunks and this one), kept per KV head in
the ScorerState as a running sum. Scores lie in [-1, 1], so heads compare
directly in a global selection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from tangram_sglang.scorers.base import Scorer, ScorerState
from tangram_sglang.scorers.common import advance, check_qkv


@dataclass(frozen=True)
class KeyDiffScorer(Scorer):
    name = "keydiff"

    def score(self, q, k, v, state: ScorerState | None = None):
        n, num_kv, _ = check_qkv(q, k, v)
        unit = F.normalize(k.float(), dim=-1)  # [n, H, d]
        total = unit.sum(dim=0)  # [H, d]
        if state is not None:
            prev = state.tensors.get("keydiff_sum")
            total = total if prev is None else prev + total
            state.tensors["keydiff_sum"] = total
        anchor = F.normalize(total, dim=-1)  # the mean's direction
        cos = (unit * anchor.unsqueeze(0)).sum(dim=-1)  # [n, H]
        advance(state, n)
        return (-cos).transpose(0, 1).contiguous()
