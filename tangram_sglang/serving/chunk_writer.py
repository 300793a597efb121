"""ChunkWriter: compresses one extend batch's chunks into their reserved slots, layer by layer.

The one place the served path calls ``compress_and_write``; the scorer's forward pass
(scorers/forward_pass.py) decides when, with what extra input (hidden states) or with scores
it computed itself (KVzip's reconstruction pass).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tangram_sglang.attention import compress_and_write
from tangram_sglang.attention.page_data import KVPageData


@dataclass(frozen=True)
class ChunkWriter:
    """plan: the batch's ForwardPlan (serving/runtime.py); cu_seqlens int64 [B + 1] over the
    batch's chunk tokens; metas[l] the layer's LayerMeta."""

    plan: object
    cu_seqlens: torch.Tensor
    data: KVPageData
    metas: list

    def write(self, layer_id: int, scorer, q3: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor, *,
              hidden: torch.Tensor | None = None, scores: torch.Tensor | None = None) -> None:
        """Score (unless scores are given), keep each head's share, write the kept K/V.
        q3 [T, Hq, d]; k3, v3 [T, H, d]; hidden [T, D]; scores float32 [B, H, n_max]."""
        plan = self.plan
        compress_and_write(q3, k3, v3, self.cu_seqlens, scorer, plan.states[layer_id], self.metas[layer_id],
                           plan.keep[:, layer_id], plan.out_loc[layer_id], self.data.k_pages, self.data.v_pages,
                           protect=plan.protect, hidden=hidden, scores=scores, chunk_plan=plan.chunks[layer_id])

    def cached(self, layer_id: int) -> tuple:
        """(k_pages, v_pages, block_table [B, G, W], seq_lens [B, G], meta) of the layer's history."""
        return (self.data.k_pages, self.data.v_pages, self.plan.block_table[layer_id],
                self.plan.seq_lens[layer_id], self.metas[layer_id])
