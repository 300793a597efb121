"""Where new K/V go in the pages, and writing them there.

New slots of (b, g) are appended after its seq_lens[b, g] held slots; slot s
lives at flat index page * P + s % P of ``k_pages.view(-1, H_p, d)`` with
page = block_table[b, g, s // P] (pages reserved by the pool beforehand).
Flat slot lists are ordered request-major, then group, then slot:
(b=0, g=0, j=0..), (b=0, g=1, ...), ..., (b=1, g=0, ...).

Worked example, P = 2, block_table[0] = [[7, 3], [5, 0]], start [[1, 0]],
count [[2, 1]] -> slots (0,0): 1, 2 -> pages 7, 3 -> locs [15, 6]; (0,1): 0 ->
[10]; returns [15, 6, 10].
"""

from __future__ import annotations

import torch

from tangram_sglang.attention.kv_quant import quantize
from tangram_sglang.attention.layer_meta import LayerMeta


def slot_locs(block_table: torch.Tensor, start: torch.Tensor, count: torch.Tensor,
              page_size: int) -> torch.Tensor:
    """Flat pool indices of count[b, g] new slots of (b, g) from slot start[b, g].

    block_table: int [B, G, max_pages]; start, count: int [B, G].
    Returns int64 [sum(count)] in (b, g, j) order.
    """
    cnt = count.reshape(-1).to(torch.int64)
    item = torch.repeat_interleave(torch.arange(cnt.numel(), device=cnt.device), cnt)
    first = torch.cumsum(cnt, 0) - cnt
    slot = start.reshape(-1).to(torch.int64)[item] + torch.arange(item.numel(), device=cnt.device) - first[item]
    max_pages = block_table.shape[-1]
    page = block_table.reshape(-1).to(torch.int64)[item * max_pages + torch.div(slot, page_size, rounding_mode="floor")]
    return page * page_size + slot % page_size


def group_heads_of(x: torch.Tensor, meta: LayerMeta) -> torch.Tensor:
    """Per-head tensor [..., H, d] -> per-group head slots [..., G, H_p, d]; padding slots zero."""
    out = x[..., meta.kv_head, :]
    return out.masked_fill(~meta.head_valid[..., None], 0)


def write_decode_kv(k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, meta: LayerMeta,
                    k_pages: torch.Tensor, v_pages: torch.Tensor) -> None:
    """Append one decode token's K/V to every group of every request.

    k, v: [B, H, d]; out_loc: int64 [B * G], the new slot of (b, g) (slot_locs with count 1).
    """
    hp, d = k_pages.shape[2], k_pages.shape[3]
    k_pages.view(-1, hp, d)[out_loc] = quantize(group_heads_of(k, meta).reshape(-1, hp, d), k_pages.dtype, meta.k_scale)
    v_pages.view(-1, hp, d)[out_loc] = quantize(group_heads_of(v, meta).reshape(-1, hp, d), v_pages.dtype, meta.v_scale)


def write_kept_kv(k: torch.Tensor, v: torch.Tensor, token: torch.Tensor, keep: torch.Tensor,
                  out_loc: torch.Tensor, meta: LayerMeta, k_pages: torch.Tensor,
                  v_pages: torch.Tensor, take: torch.Tensor | None = None) -> None:
    """Write the kept tokens of a prefill chunk into their reserved slots.

    k, v: [T, H, d] the chunk's K/V (packed batch); token: int64 [B, H, kmax], row of
    k/v that head h of request b keeps as its j-th slot (j < keep of its group);
    keep: int [B, G]; out_loc: int64 [sum(keep)] from slot_locs, (b, g, j) order.
    take: int64 [sum(keep)] flat positions (b, g, j) of [B, G, kmax] with j < keep[b, g]
    (compression.ChunkPlan), when the host knows them: no boolean mask (a device sync).
    """
    hp, d = k_pages.shape[2], k_pages.shape[3]
    kmax = token.shape[-1]
    src = token[:, meta.kv_head]  # [B, G, H_p, kmax]
    head = meta.kv_head[None, :, :, None].expand_as(src)
    j = torch.arange(kmax, device=token.device)
    mask = None if take is not None else j[None, None, :] < keep[:, :, None].to(torch.int64)  # [B, G, kmax]
    for src_t, pages, scale in ((k, k_pages, meta.k_scale), (v, v_pages, meta.v_scale)):
        vals = src_t[src, head]  # [B, G, H_p, kmax, d]
        vals = vals.masked_fill(~meta.head_valid[None, :, :, None, None], 0)
        vals = vals.permute(0, 1, 3, 2, 4)  # [B, G, kmax, H_p, d]
        vals = vals[mask] if take is None else vals.reshape(-1, hp, d).index_select(0, take)  # [sum(keep), H_p, d]
        pages.view(-1, hp, d)[out_loc] = quantize(vals, pages.dtype, scale)
