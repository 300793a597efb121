"""Torch reference of chunk prefill attention over ragged groups.

A chunk's query i of request b attends, per KV head h, to the cached slots of
h's group (all of them: they precede the chunk) and to the chunk's own keys
0..i of head h (causal, uncompressed: compression writes the kept ones
afterwards). The two partial results are merged by log-sum-exp. In a
sliding-window layer (meta.window = W; it keeps every token, so slot s is
position s) query i at position c + i (c cached) reads keys c + i - W + 1 .. c + i
only, in both parts.

The batch is packed as SGLang gives it: the chunks of all requests
concatenated, request b's tokens at cu_seqlens[b] .. cu_seqlens[b + 1]. They
are padded to [B, n_max] for the batched math; a request with an empty chunk
is allowed.
"""

from __future__ import annotations

import torch

from tangram_sglang.attention.fused_cpu import chunk_self_attention_fused
from tangram_sglang.attention.layer_meta import LayerMeta
from tangram_sglang.attention.merge import merge_two
from tangram_sglang.attention.pieces import tile_pieces, window_start
from tangram_sglang.attention.reference import attend_cached

# Slots per piece of the cached part. A chunk brings hundreds of query rows, so each piece's partial
# output is large and merging pieces costs more than longer gathers; the fused path batches pieces of
# similar length (fused_cpu.attend_pieces_fused), so long pieces no longer pad short groups. At 512
# queries (SmolLM2's heads, one thread) over groups of 2,400 / 1,200 / 6,000 slots: 1,024-slot tiles
# 39.8 ms, 8,192 36.4; over 800 / 300 / 2,000: 18.5 and 16.6 ms. Decode keeps small tiles
# (sglang/backend.py CPU_TILE): one query row per request, nothing to gain there.
DEFAULT_TILE = 8192


def pad_index(cu_seqlens: torch.Tensor):
    """cu_seqlens int [B + 1] -> (req int64 [T], pos int64 [T], n_max): token t is
    query pos[t] of request req[t]."""
    cu = cu_seqlens.to(torch.int64)
    lens = cu[1:] - cu[:-1]
    req = torch.repeat_interleave(torch.arange(lens.numel(), device=cu.device), lens)
    pos = torch.arange(int(cu[-1]), device=cu.device) - cu[:-1][req]
    return req, pos, int(lens.max()) if lens.numel() else 0


def chunk_self_attention(q_pad: torch.Tensor, k_pad: torch.Tensor, v_pad: torch.Tensor,
                         lens: torch.Tensor, sm_scale: float, window: int = 0):
    """Causal attention of each padded chunk to itself, GQA aware.

    q_pad: [B, n, Hq, d]; k_pad, v_pad: [B, n, H, d]; lens: int64 [B] real tokens;
    window: 0, or a sliding window (query i reads keys i - window + 1 .. i).
    Returns (o float32 [B, n, Hq, d], lse float32 [B, n, Hq]); padding rows are finite.
    """
    b, n, hq, d = q_pad.shape
    h = k_pad.shape[2]
    gqa = hq // h
    q = q_pad.float().view(b, n, h, gqa, d).permute(0, 2, 1, 3, 4).reshape(b, h, n * gqa, d)
    k = k_pad.float().permute(0, 2, 3, 1)  # [B, H, d, n]
    s = torch.matmul(q, k) * sm_scale  # [B, H, n * gqa, n]
    row_pos = torch.arange(n, device=q.device).repeat_interleave(gqa)
    col = torch.arange(n, device=q.device)
    causal = col[None, :] <= row_pos[:, None]
    if window:
        causal &= col[None, :] > row_pos[:, None] - window
    allowed = causal[None] & (col[None, None, :] < lens[:, None, None])
    padding = row_pos[None, :, None] >= lens[:, None, None]
    allowed = allowed | ((col[None, None, :] == 0) & padding)  # padding rows see column 0: stays finite
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m)
    denom = p.sum(dim=-1)
    o = torch.matmul(p, v_pad.float().transpose(1, 2)) / denom[..., None]  # [B, H, n*gqa, d]
    lse = m.squeeze(-1) + torch.log(denom)
    o = o.view(b, h, n, gqa, d).permute(0, 2, 1, 3, 4).reshape(b, n, hq, d)
    lse = lse.view(b, h, n, gqa).permute(0, 2, 1, 3).reshape(b, n, hq)
    return o, lse


def _pad(x: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, batch: int, n: int) -> torch.Tensor:
    out = torch.zeros((batch, n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    out[req, pos] = x
    return out


def _attend_cached_window(q_pad, k_pages, v_pages, block_table, seq_lens, meta: LayerMeta, sm_scale: float,
                          tile: int):
    """The cached part in a sliding-window layer: query i of (b, g) reads slots from
    window_start(seq_lens[b, g] + i) on; only the window of the chunk's first query is gathered."""
    cached = seq_lens.to(torch.int64)
    first = window_start(cached, meta.window)
    query_pos = cached.reshape(-1, 1) + torch.arange(q_pad.shape[1], device=cached.device)
    return attend_cached(q_pad, k_pages, v_pages, block_table, seq_lens, meta, tile_pieces(seq_lens, tile, first),
                         sm_scale, min_key=window_start(query_pos, meta.window))


def ragged_prefill_chunk_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               cu_seqlens: torch.Tensor, k_pages: torch.Tensor,
                               v_pages: torch.Tensor, block_table: torch.Tensor,
                               seq_lens: torch.Tensor, meta: LayerMeta, sm_scale: float,
                               *, tile: int = DEFAULT_TILE, fused: bool = False, return_lse: bool = False):
    """Chunk prefill attention of one layer.

    Parameters
    ----------
    q : [T, Hq, d], the batch's chunk queries, concatenated.
    k, v : [T, H, d], the chunks' own keys and values (all of them, uncompressed).
    cu_seqlens : int [B + 1], request b owns tokens cu_seqlens[b] .. cu_seqlens[b+1].
    k_pages, v_pages : [num_pages, P, H_p, d]; block_table int32 [B, G, max_pages];
    seq_lens : int32 [B, G], cached slots of (b, g) before this chunk (0 allowed).
    meta : LayerMeta (a sliding-window layer, meta.window, masks both parts to the window);
        sm_scale : softmax scale; tile : piece size of the cached part.
    fused : on CPU tensors, both parts on ATen's fused flash kernel (fused_cpu.py) instead
        of this reference's matmuls (the CPU data plane's choice); ignored elsewhere.

    Returns
    -------
    o : [T, Hq, d] in q's dtype (and lse float32 [T, Hq] if return_lse).
    """
    batch = cu_seqlens.numel() - 1
    if q.shape[0] == 0:
        empty = torch.empty_like(q)
        return (empty, q.new_empty(q.shape[:-1], dtype=torch.float32)) if return_lse else empty
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    if batch == 1:   # one chunk: it is its own padded batch (no copies in, none out)
        req = pos = None
        q_pad, k_pad, v_pad = q[None], k[None], v[None]
    else:
        req, pos, n = pad_index(cu_seqlens)
        q_pad, k_pad, v_pad = _pad(q, req, pos, batch, n), _pad(k, req, pos, batch, n), _pad(v, req, pos, batch, n)
    if meta.window:  # the reference's masks (the fused kernel has no window)
        o_self, lse_self = chunk_self_attention(q_pad, k_pad, v_pad, lens, sm_scale, meta.window)
        o_old, lse_old = _attend_cached_window(q_pad, k_pages, v_pages, block_table, seq_lens, meta, sm_scale,
                                               tile)
    else:
        fused = fused and q.device.type == "cpu"
        o_self, lse_self = (chunk_self_attention_fused if fused else chunk_self_attention)(q_pad, k_pad, v_pad,
                                                                                            lens, sm_scale)
        pieces = tile_pieces(seq_lens, tile)
        if pieces.item.numel() == 0:   # nothing cached: the merge would give the chunk's own part
            o_old = None
        else:
            o_old, lse_old = attend_cached(q_pad, k_pages, v_pages, block_table, seq_lens, meta, pieces,
                                           sm_scale, fused)
    o, lse = (o_self, lse_self) if o_old is None else merge_two(o_old, lse_old, o_self, lse_self)
    o, lse = (o[0], lse[0]) if req is None else (o[req, pos], lse[req, pos])
    o = o.to(q.dtype)
    return (o, lse) if return_lse else o
