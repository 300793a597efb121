"""Torch reference of the KVzip reconstruction pass of one layer, on ragged groups.

After a prefill chunk's forward, the KVzip scorer (scorers/kvzip/scorer.py) runs the
model once more on reconstruction tokens (a repeat instruction followed by the
chunk's own tokens) whose KV is never stored. In each layer the reconstruction
queries of request b attend to

* the cached slots of each KV head's group (compressed history, as the chunk did),
* the chunk's own K/V, all of it (held back, uncompressed, until scored),
* the reconstruction tokens 0 .. i themselves (causal),

merged by log-sum-exp like chunk prefill. The same logits give KVzip's score
of each chunk entry per KV head: the maximum over the reconstruction queries
and the head's GQA query heads of the softmax probability, the softmax taken
over the head's first ``sinks`` cached slots (the sequence's first tokens when
sinks are protected, as served), the chunk and the reconstruction tokens.
"""

from __future__ import annotations

import torch

from tangram_sglang.attention.kv_quant import dequantize
from tangram_sglang.attention.layer_meta import LayerMeta
from tangram_sglang.attention.merge import merge_two
from tangram_sglang.attention.pieces import tile_pieces
from tangram_sglang.attention.prefill_reference import DEFAULT_TILE, _pad, pad_index
from tangram_sglang.attention.reference import attend_cached

SINKS = 4


def sink_keys(k_pages: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, meta: LayerMeta,
              b: int, sinks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys of each KV head's first ``sinks`` cached slots of request b: ([H, S, d], valid bool [H, S])."""
    page_size = k_pages.shape[1]
    j = torch.arange(sinks, device=k_pages.device)
    g, p = meta.group_of_head, meta.slot_of_head  # [H]
    valid = j[None, :] < seq_lens[b, g].to(torch.int64)[:, None]  # [H, S]
    pages = block_table[b, g][:, (j // page_size)].to(torch.int64)  # [H, S]
    keys = dequantize(k_pages[pages.clamp(min=0), (j % page_size)[None, :], p[:, None]], meta.k_scale)  # [H, S, d]
    return keys, valid


def _own_logits(q: torch.Tensor, k_chunk: torch.Tensor, k_rec: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """Logits [Hq, m, n + m] of m reconstruction queries over chunk (all) + reconstruction (causal)."""
    m, num_q, _ = q.shape
    n, num_kv = k_chunk.shape[0], k_chunk.shape[1]
    keys = torch.cat([k_chunk, k_rec]).float().transpose(0, 1).repeat_interleave(num_q // num_kv, dim=0)
    logits = torch.matmul(q.float().transpose(0, 1), keys.transpose(1, 2)) * sm_scale
    col = torch.arange(n + m, device=q.device)
    future = (col[None, :] >= n) & ((col[None, :] - n) > torch.arange(m, device=q.device)[:, None])
    return logits.masked_fill(future[None], float("-inf"))


def reconstruction_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_rec: torch.Tensor,
                             k_chunk: torch.Tensor, v_chunk: torch.Tensor, cu_chunk: torch.Tensor,
                             k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                             seq_lens: torch.Tensor, meta: LayerMeta, sm_scale: float, *,
                             sinks: int = SINKS, tile: int = DEFAULT_TILE) -> tuple[torch.Tensor, torch.Tensor]:
    """Reconstruction attention of one layer and the chunk entries' KVzip scores.

    Parameters
    ----------
    q : [R, Hq, d]; k, v : [R, H, d], the reconstruction tokens, request b's at cu_rec[b] .. cu_rec[b+1].
    k_chunk, v_chunk : [T, H, d], the chunks' own K/V, request b's at cu_chunk[b] .. cu_chunk[b+1].
    k_pages, v_pages : [num_pages, P, H_p, d]; block_table int32 [B, G, max_pages];
    seq_lens : int32 [B, G], cached slots before the chunk. meta : LayerMeta; sm_scale : softmax scale.

    Returns
    -------
    o : [R, Hq, d] in q's dtype; scores : float32 [B, H, n_max], -inf past each chunk's length.
    """
    batch = cu_rec.numel() - 1
    req, pos, m_max = pad_index(cu_rec)
    q_pad = _pad(q, req, pos, batch, m_max)
    o_old, lse_old = attend_cached(q_pad, k_pages, v_pages, block_table, seq_lens, meta,
                                   tile_pieces(seq_lens, tile), sm_scale)
    num_q, num_kv, d = q.shape[1], k.shape[1], v.shape[2]
    o_self = torch.zeros(batch, m_max, num_q, d, device=q.device)
    lse_self = torch.full((batch, m_max, num_q), float("-inf"), device=q.device)
    n_max = int((cu_chunk[1:] - cu_chunk[:-1]).max()) if batch else 0
    scores = torch.full((batch, num_kv, n_max), float("-inf"), device=q.device)
    cr, cc = cu_rec.tolist(), cu_chunk.tolist()
    for b in range(batch):
        m, n = cr[b + 1] - cr[b], cc[b + 1] - cc[b]
        if m == 0 or n == 0:
            continue
        logits = _own_logits(q[cr[b]:cr[b + 1]], k_chunk[cc[b]:cc[b + 1]], k[cr[b]:cr[b + 1]], sm_scale)
        lse = torch.logsumexp(logits, dim=-1)  # [Hq, m]
        vals = torch.cat([v_chunk[cc[b]:cc[b + 1]], v[cr[b]:cr[b + 1]]]).float().transpose(0, 1)
        vals = vals.repeat_interleave(num_q // num_kv, dim=0)  # [Hq, n + m, d]
        o_self[b, :m] = torch.matmul(torch.exp(logits - lse[..., None]), vals).transpose(0, 1)
        lse_self[b, :m] = lse.transpose(0, 1)
        scores[b, :, :n] = _chunk_scores(q[cr[b]:cr[b + 1]], logits, n, k_pages, block_table, seq_lens,
                                         meta, b, sinks, sm_scale)
    o, _ = merge_two(o_old, lse_old, o_self, lse_self)
    return o[req, pos].to(q.dtype), scores


def _chunk_scores(q, own_logits, n, k_pages, block_table, seq_lens, meta, b, sinks, sm_scale) -> torch.Tensor:
    """KVzip scores [H, n] from one request's own logits [Hq, m, n + m] and its sink slots."""
    num_q = q.shape[1]
    num_kv = meta.num_kv_heads
    group = num_q // num_kv
    keys, valid = sink_keys(k_pages, block_table, seq_lens, meta, b, sinks)  # [H, S, d]
    keys = keys.float().repeat_interleave(group, dim=0)
    sink_logits = torch.matmul(q.float().transpose(0, 1), keys.transpose(1, 2)) * sm_scale  # [Hq, m, S]
    sink_logits = sink_logits.masked_fill(~valid.repeat_interleave(group, dim=0)[:, None, :], float("-inf"))
    probs = torch.softmax(torch.cat([sink_logits, own_logits], dim=-1), dim=-1)[..., sinks:sinks + n]
    return probs.amax(dim=1).view(num_kv, group, n).amax(dim=1)
