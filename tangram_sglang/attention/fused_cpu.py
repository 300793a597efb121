"""Chunk-prefill attention pieces on ATen's fused CPU flash kernel.

Same contracts as the torch reference (``prefill_reference.chunk_self_attention``
and the piece loop of ``reference.attend_pieces``), which tests compare
against. The reference materializes each score matrix ([B, H, n * gqa, n] for
the chunk's own part, [pieces, H_p, n * gqa, W] for the cached part): about a
third of a prefill step on CPU. The fused kernel tiles it in cache and returns
the log-sum-exp that the merges need; 2-4x faster on prefill shapes, no gain on
decode's few query rows (memory bound), so decode keeps the reference.
CPU tensors only: callers choose (``fused=`` of ragged_prefill_chunk_torch).
"""

from __future__ import annotations

import torch

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def chunk_self_attention_fused(q_pad: torch.Tensor, k_pad: torch.Tensor, v_pad: torch.Tensor,
                               lens: torch.Tensor, sm_scale: float):
    """q_pad: [B, n, Hq, d]; k_pad, v_pad: [B, n, H, d]; lens: int64 [B] (unused: padding rows
    see only keys at or before their own position, so the causal mask keeps real rows exact).

    Returns (o float32 [B, n, Hq, d], lse float32 [B, n, Hq]), every row finite.
    """
    gqa = q_pad.shape[2] // k_pad.shape[2]
    q = q_pad.float().transpose(1, 2)
    k = k_pad.float().transpose(1, 2).repeat_interleave(gqa, dim=1)
    v = v_pad.float().transpose(1, 2).repeat_interleave(gqa, dim=1)
    o, lse = _flash(q, k, v, 0.0, True, scale=sm_scale)
    return o.transpose(1, 2), lse.transpose(1, 2)


def attend_block_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, invalid: torch.Tensor):
    """One batch of pieces: q float32 [n, H_p, Mg, d] (already scaled), k, v float32 [n, W, H_p, d],
    invalid bool [n, W] (True: slot not read; every piece has a valid slot).

    Returns (o float32 [n, H_p, Mg, d], lse float32 [n, H_p, Mg]).
    """
    mask = torch.zeros(invalid.shape, dtype=q.dtype).masked_fill_(invalid, float("-inf"))
    return _flash(q, k.transpose(1, 2), v.transpose(1, 2), 0.0, False, attn_mask=mask[:, None, None, :], scale=1.0)
