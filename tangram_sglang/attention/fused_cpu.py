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

from tangram_sglang.attention.kv_quant import dequantize
from tangram_sglang.attention.pieces import Pieces, piece_slots

# Gathered K (or V) of one batch of pieces stays below this; the two gather buffers are allocated
# once per call and reused by every batch: gathering batches into fresh tensors made malloc return
# and re-map the memory, ~180k page faults per 30-layer step (40% of the time at 8x2048). With
# reuse, 1-4 MiB all run within 10% of each other on one core (2 MiB L2).
GATHER_BYTES = 2 << 20

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def chunk_self_attention_fused(q_pad: torch.Tensor, k_pad: torch.Tensor, v_pad: torch.Tensor,
                               lens: torch.Tensor, sm_scale: float):
    """q_pad: [B, n, Hq, d]; k_pad, v_pad: [B, n, H, d]; lens: int64 [B] (unused: padding rows
    see only keys at or before their own position, so the causal mask keeps real rows exact).

    Returns (o float32 [B, n, Hq, d], lse float32 [B, n, Hq]), every row finite.
    """
    # The kernel reads query head i against K/V head i // gqa itself (bit-identical to repeating K/V).
    q, k, v = (x.float().transpose(1, 2) for x in (q_pad, k_pad, v_pad))
    o, lse = _flash(q, k, v, 0.0, True, scale=sm_scale)
    return o.transpose(1, 2), lse.transpose(1, 2)


def attend_block_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, invalid: torch.Tensor | None):
    """One batch of pieces: q float32 [n, H_p, Mg, d] (already scaled), k, v float32 [n, W, H_p, d],
    invalid bool [n, W] (True: slot not read; every piece has a valid slot), or None: every slot
    read (no mask: a zero mask gives the same bits, at a fifth more time).

    Returns (o float32 [n, H_p, Mg, d], lse float32 [n, H_p, Mg]).
    """
    if invalid is None:
        return _flash(q, k.transpose(1, 2), v.transpose(1, 2), 0.0, False, scale=1.0)
    mask = torch.zeros(invalid.shape, dtype=q.dtype).masked_fill_(invalid, float("-inf"))
    return _flash(q, k.transpose(1, 2), v.transpose(1, 2), 0.0, False, attn_mask=mask[:, None, None, :], scale=1.0)


def _batches(order: list, lengths: list, cap: int):
    """Consecutive runs of ``order`` (pieces, longest first): at most ``cap`` slots gathered each
    (width x pieces; one piece alone may exceed it), none shorter than 3/4 of its run's first."""
    batch: list = []
    for i in order:
        if batch and ((len(batch) + 1) * lengths[batch[0]] > cap or 4 * lengths[i] < 3 * lengths[batch[0]]):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def attend_pieces_fused(qg: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                        block_table: torch.Tensor, pieces: Pieces, sm_scale: float,
                        rows: torch.Tensor | None = None, scales: tuple[float, float] = (1.0, 1.0)):
    """reference.attend_pieces (no min_key) on the fused kernel. Pieces go longest first, and each
    batch is gathered to its own longest piece: a chunk's groups hold unequal histories, and padding
    every piece to the longest of the layer computed and masked up to a third more slots; a batch
    holds pieces of at least 3/4 of its width. A batch whose pieces all have its width runs unmasked.

    qg: float32 [B * G, H_p, Mg, d]; k_pages, v_pages: [num_pages, P, H_p, d].
    Returns (o float32 [NP, H_p, Mg, d], lse float32 [NP, H_p, Mg]) in the pieces' order.
    """
    _, page_size, hp, d = k_pages.shape
    lengths = pieces.length.tolist()
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    o = qg.new_empty((len(lengths), *qg.shape[1:]))
    lse = qg.new_empty(o.shape[:-1])
    slot_bytes = hp * d * k_pages.element_size()
    cap = max(GATHER_BYTES // slot_bytes, max(lengths, default=0))   # gathered slots per batch, at most
    k_buf, v_buf = k_pages.new_empty(cap, hp * d), v_pages.new_empty(cap, hp * d)
    kf, vf = k_pages.reshape(-1, hp * d), v_pages.reshape(-1, hp * d)
    for batch in _batches(order, lengths, cap):
        width = lengths[batch[0]]
        idx = torch.tensor(batch, device=pieces.item.device)
        sub = Pieces(pieces.item[idx], pieces.start[idx], pieces.length[idx], pieces.num_items)
        loc, valid = piece_slots(sub, block_table, page_size, rows)
        flat, n = loc.view(-1), len(batch) * width
        k = dequantize(torch.index_select(kf, 0, flat, out=k_buf[:n]).view(len(batch), width, hp, d), scales[0])
        v = dequantize(torch.index_select(vf, 0, flat, out=v_buf[:n]).view(len(batch), width, hp, d), scales[1])
        q = qg.index_select(0, sub.item).mul_(sm_scale)
        ob, lb = attend_block_fused(q, k, v, None if lengths[batch[-1]] == width else ~valid)
        o.index_copy_(0, idx, ob)
        lse.index_copy_(0, idx, lb)
    return o, lse
