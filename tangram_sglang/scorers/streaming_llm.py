"""StreamingLLM (Xiao et al. 2024): attention sinks plus the most recent tokens.

Scores depend only on position: the first ``n_sink`` tokens of the sequence
score above everything, every other token scores its sequence position + 1
(later = higher). Any per-head top-k therefore keeps the sinks and the most
recent tokens of the chunk: the recent window is whatever the budget leaves.
All heads score alike, so a global selection spreads the budget evenly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tangram_sglang.scorers.base import Scorer, ScorerState
from tangram_sglang.scorers.common import advance, check_qkv, chunk_start, sink_mask


@dataclass(frozen=True)
class StreamingLLMScorer(Scorer):
    n_sink: int = 4

    name = "streaming_llm"

    def __post_init__(self):
        if self.n_sink < 0:
            raise ValueError(f"n_sink must be >= 0, got {self.n_sink}")

    def score(self, q, k, v, state: ScorerState | None = None):
        n, num_kv, _ = check_qkv(q, k, v)
        start = chunk_start(state)
        pos = torch.arange(start, start + n, device=k.device, dtype=torch.float32) + 1.0
        pos = torch.where(sink_mask(start, n, self.n_sink, k.device), float(start + n + 1), pos)
        advance(state, n)
        return pos.unsqueeze(0).expand(num_kv, n).contiguous()
