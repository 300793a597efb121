"""Torch reference of ragged-group attention: the CPU data plane.

Vectorized across the batch and the layer's groups: every (request, group)
slot range is cut into pieces (pieces.py), the pieces are gathered from the
pages into one padded batch, attended with two batched matmuls and merged
per (request, group) by log-sum-exp (merge.py). No Python loop per request
or group. The Triton and CUDA decode kernels have the same signature as
``ragged_decode_torch`` and are tested against it.
"""

from __future__ import annotations

import torch

from tangram_sglang.attention.fused_cpu import GATHER_BYTES, attend_pieces_fused
from tangram_sglang.attention.kv_quant import dequantize
from tangram_sglang.attention.layer_meta import LayerMeta
from tangram_sglang.attention.merge import merge_by_item
from tangram_sglang.attention.pieces import Pieces, piece_slots, split_pieces, tile_pieces, window_start
from tangram_sglang.attention.split_row import SplitRow


def group_rows(q_rows: torch.Tensor, meta: LayerMeta) -> torch.Tensor:
    """Query rows of every (request, group), float32.

    q_rows: [B, M, Hq, d] (M queries per request) -> [B * G, H_p, M * gqa, d];
    row m * gqa + j of head slot p is query m of head groups[g][p] * gqa + j.
    """
    b, m, _, d = q_rows.shape
    g, hp, gqa = meta.num_groups, meta.heads_per_group, meta.gqa
    qg = q_rows.float()[:, :, meta.q_head.reshape(-1)]
    return qg.view(b, m, g, hp, gqa, d).permute(0, 2, 3, 1, 4, 5).reshape(b * g, hp, m * gqa, d)


def ungroup_rows(x: torch.Tensor, meta: LayerMeta, batch: int, num_q: int) -> torch.Tensor:
    """Inverse of group_rows: [B * G, H_p, M * gqa, *tail] -> [B, M, Hq, *tail]."""
    g, hp, gqa = meta.num_groups, meta.heads_per_group, meta.gqa
    tail = x.shape[3:]
    x = x.reshape(batch, g, hp, num_q, gqa, *tail).transpose(1, 3).transpose(2, 3)
    return x.reshape(batch, num_q, g * hp * gqa, *tail)[:, :, meta.q_row]


def attend_pieces(qg: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                  block_table: torch.Tensor, pieces: Pieces, sm_scale: float, fused: bool = False,
                  rows: torch.Tensor | None = None, scales: tuple[float, float] = (1.0, 1.0),
                  min_key: torch.Tensor | None = None):
    """Partial attention of every piece, in batches of pieces (a loop over work, not requests).

    qg: float32 [B * G, H_p, Mg, d] (group_rows); k_pages, v_pages: [num_pages, P, H_p, d].
    Returns (o float32 [NP, H_p, Mg, d], lse float32 [NP, H_p, Mg]).
    Slot indices, queries and outputs are built once for all pieces; each batch
    gathers its K and V into two buffers reused by every batch (see GATHER_BYTES).
    fused: on ATen's fused CPU kernel (fused_cpu.attend_pieces_fused) instead of the two
    matmuls below (CPU tensors only; min_key None). rows: see ragged_decode_torch.
    scales: (k_scale, v_scale) of quantized pages (kv_quant.py); gathered K/V are dequantized.
    min_key: None, or int64 [B * G, M]: query m of item i reads slots >= min_key[i, m] only (a
    sliding-window layer's chunk prefill; matmul path; a row with no slot in a piece gets o = 0,
    lse = -inf).
    """
    if fused and min_key is None:
        return attend_pieces_fused(qg, k_pages, v_pages, block_table, pieces, sm_scale, rows, scales)
    _, page_size, hp, d = k_pages.shape
    loc, valid = piece_slots(pieces, block_table, page_size, rows)
    num_p, width = loc.shape
    q = qg.index_select(0, pieces.item).mul_(sm_scale)
    o = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:-1])
    step = max(1, GATHER_BYTES // max(1, width * hp * d * k_pages.element_size()))
    rows = min(step, num_p) * width
    k_buf, v_buf = k_pages.new_empty(rows, hp * d), v_pages.new_empty(rows, hp * d)
    kf, vf, invalid = k_pages.reshape(-1, hp * d), v_pages.reshape(-1, hp * d), ~valid
    if min_key is not None:  # [NP, Mg, W]: row m * gqa + j is query m
        lo = min_key.index_select(0, pieces.item).repeat_interleave(q.shape[2] // min_key.shape[1], dim=1)
        key_pos = pieces.start[:, None] + torch.arange(width, device=loc.device)
        invalid = invalid[:, None, :] | (key_pos[:, None, :] < lo[:, :, None])
    for i in range(0, num_p, step):
        j = min(i + step, num_p)
        flat, n = loc[i:j].reshape(-1), (j - i) * width
        k = dequantize(torch.index_select(kf, 0, flat, out=k_buf[:n]).view(j - i, width, hp, d), scales[0])
        if min_key is not None:
            v = dequantize(torch.index_select(vf, 0, flat, out=v_buf[:n]).view(j - i, width, hp, d), scales[1])
            o[i:j], lse[i:j] = _attend_masked(q[i:j], k, v, invalid[i:j])
            continue
        s = torch.matmul(q[i:j], k.permute(0, 2, 3, 1))  # [n, H_p, Mg, W]
        s.masked_fill_(invalid[i:j, None, None, :], float("-inf"))
        m = s.amax(dim=-1, keepdim=True)  # finite: every piece has >= 1 slot
        p = s.sub_(m).exp_()
        denom = p.sum(dim=-1)
        v = dequantize(torch.index_select(vf, 0, flat, out=v_buf[:n]).view(j - i, width, hp, d), scales[1])
        torch.matmul(p, v.transpose(1, 2), out=o[i:j]).div_(denom[..., None])
        torch.log(denom, out=lse[i:j]).add_(m.squeeze(-1))
    return o, lse


def _attend_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocked: torch.Tensor):
    """q [n, H_p, Mg, d] (scaled), k, v [n, W, H_p, d], blocked bool [n, Mg, W] -> (o, lse); a row
    with every slot blocked gets o = 0, lse = -inf."""
    s = torch.matmul(q, k.permute(0, 2, 3, 1)).masked_fill_(blocked[:, None], float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = s.sub_(m).exp_()
    denom = p.sum(dim=-1)
    o = torch.matmul(p, v.transpose(1, 2)).div_(torch.clamp(denom, min=1e-30)[..., None])
    return o, torch.log(denom).add_(m.squeeze(-1))


def attend_cached(q_rows: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                  block_table: torch.Tensor, seq_lens: torch.Tensor, meta: LayerMeta,
                  pieces: Pieces, sm_scale: float, fused: bool = False, rows: torch.Tensor | None = None,
                  min_key: torch.Tensor | None = None):
    """Every query row attends to the cached slots of its group in ``pieces`` (no causal mask;
    min_key: see attend_pieces).

    q_rows: [B, M, Hq, d]; block_table: int32 [B, G, max_pages]; seq_lens: int32 [B, G].
    Returns (o float32 [B, M, Hq, d], lse float32 [B, M, Hq]); a query whose group
    holds no slot gets o = 0, lse = -inf.
    """
    batch, num_q, _, d = q_rows.shape
    qg = group_rows(q_rows, meta)
    if pieces.item.numel() == 0:
        o = torch.zeros(qg.shape, dtype=torch.float32, device=qg.device)
        lse = torch.full(qg.shape[:-1], float("-inf"), device=qg.device)
    else:
        o, lse = attend_pieces(qg, k_pages, v_pages, block_table, pieces, sm_scale, fused, rows,
                               (meta.k_scale, meta.v_scale), min_key)
        if not _one_piece_per_item(pieces):   # else the merge is the identity, bit for bit
            o, lse = merge_by_item(o, lse, pieces.item, pieces.num_items)
    return ungroup_rows(o, meta, batch, num_q), ungroup_rows(lse, meta, batch, num_q)


def _one_piece_per_item(pieces: Pieces) -> bool:
    """Every item has exactly one piece, in item order: merging it alone gives it back bit for bit."""
    n = pieces.num_items
    return pieces.item.numel() == n and bool((pieces.item == torch.arange(n, device=pieces.item.device)).all())


def decode_pieces(seq_lens: torch.Tensor, split: SplitRow, tile: int | None, window: int = 0,
                  ahead: torch.Tensor | None = None) -> Pieces:
    """The split map's cut (tile None), or fixed tiles of ``tile`` slots (CPU data plane); a
    sliding-window layer's cut starts at its query's window (the query is the newest slot, or
    ahead[b] positions past it)."""
    first = None
    if window:
        query_pos = seq_lens.to(torch.int64) - 1
        if ahead is not None:
            query_pos = query_pos + ahead.to(torch.int64).reshape(-1, 1)
        first = torch.minimum(window_start(query_pos, window), seq_lens.to(torch.int64))
    return split_pieces(seq_lens, split.splits, first) if tile is None else tile_pieces(seq_lens, tile, first)


def ragged_decode_torch(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                        block_table: torch.Tensor, seq_lens: torch.Tensor, meta: LayerMeta,
                        split: SplitRow, sm_scale: float, *, tile: int | None = None,
                        return_lse: bool = False, rows: torch.Tensor | None = None,
                        ahead: torch.Tensor | None = None):
    """Decode attention of one layer over ragged groups.

    Parameters
    ----------
    q : [B, Hq, d], one query per request.
    k_pages, v_pages : [num_pages, P, H_p, d], the pool's pages.
    block_table : int32 [B, G, max_pages], pages of (b, g); slot s is page
        block_table[b, g, s // P], offset s % P. Entries past seq_lens are never read.
    seq_lens : int32 [B, G], slots held by (b, g) (0 allowed).
    meta : LayerMeta of the layer; a sliding-window layer (meta.window) reads the newest
        meta.window slots of each (b, g).
    split : SplitRow of the layer (S[l]); the result does not depend on it.
    sm_scale : softmax scale.
    tile : None cuts each (b, g) into S[g] pieces like the kernels; an int cuts
        into tiles of that many slots (the CPU data plane's choice).
    rows : None, or int64 [B]: block_table is then [R, G, max_pages] (every request row of
        the serving process) and batch entry b reads row rows[b] (no per-step gather).
    ahead : None, or int64 [B] >= 0: query b stands ahead[b] positions past the newest cached
        slot (a chunk token's cached part, prefill); only a window layer reads it (its window
        then starts later). None: 0, decode.

    Returns
    -------
    o : [B, Hq, d] in q's dtype (and lse float32 [B, Hq] if return_lse).
    """
    pieces = decode_pieces(seq_lens, split, tile, meta.window, ahead)
    o, lse = attend_cached(q[:, None], k_pages, v_pages, block_table, seq_lens, meta, pieces, sm_scale,
                           rows=rows)
    o = o[:, 0].to(q.dtype)
    return (o, lse[:, 0]) if return_lse else o
