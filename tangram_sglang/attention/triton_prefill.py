"""Triton chunk prefill attention over ragged groups, no host sync.

Same contract as prefill_reference.ragged_prefill_chunk_torch (the chunk's
queries attend to each group's cached slots and, causally, to the chunk's own
keys; the two parts merged by log-sum-exp), in three device steps:

1. cached part: every chunk token is one row of the split-map decode kernel
   (triton_decode.py), reading its request's block table and lengths, cut by
   the static split map; gives (o, lse) per token and query head.
2. own part: ``_chunk_self_kernel``, grid (T, H): token t's gqa query heads of
   KV head h attend to keys cu[b] .. t of its request (online softmax).

A sliding-window layer (meta.window) masks both parts to each token's window:
step 1 starts its cut at the token's window (``ahead``), step 2 at t - window + 1.
3. merge.merge_two.

Token -> request comes from cu_seqlens on the device (searchsorted), so nothing
is read back to the host. Runs on CPU under TRITON_INTERPRET=1 (tests) and on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tangram_sglang.attention.layer_meta import LayerMeta
from tangram_sglang.attention.merge import merge_two
from tangram_sglang.attention.split_row import SplitRow
from tangram_sglang.attention.triton_decode import (_attend, _load_tile, _pow2, _softmax_init, _store_tile,
                                                    ragged_decode_triton)


@triton.jit
def _chunk_self_kernel(Q, K, V, START, O, LSE, sm_scale, stride_qt, stride_qh, stride_kt, stride_kh,
                       stride_vt, stride_vh, stride_ot, stride_oh, stride_lt, window, GQA: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_q = tl.arange(0, BLOCK_Q)
    qmask = offs_q < GQA
    qh = h * GQA + offs_q
    q = _load_tile(Q + t * stride_qt, qh, stride_qh, qmask, BLOCK_D, D)
    m_i, l_i, acc = _softmax_init(BLOCK_Q, BLOCK_D)
    lo = tl.load(START + t)
    lo = tl.where(window > 0, tl.maximum(lo, t - window + 1), lo)   # a window layer: its window's keys only
    for s0 in range(lo, t + 1, BLOCK_N):
        tok = s0 + tl.arange(0, BLOCK_N)
        nmask = tok <= t
        k = _load_tile(K + h * stride_kh, tok, stride_kt, nmask, BLOCK_D, D)
        v = _load_tile(V + h * stride_vh, tok, stride_vt, nmask, BLOCK_D, D)
        m_i, l_i, acc = _attend(q, k, v, nmask, m_i, l_i, acc, sm_scale, PRECISION)
    o = acc / l_i[:, None]  # a token always sees itself: l_i > 0
    _store_tile(O + t * stride_ot, qh, stride_oh, qmask, o, BLOCK_D, D)
    tl.store(LSE + t * stride_lt + qh, m_i + tl.log(l_i), mask=qmask)


def chunk_self_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                                sm_scale: float, *, window: int = 0, block_n: int = 32):
    """Causal attention of each token to its own request's chunk keys start[t] .. t (a window layer's
    token: from max(start[t], t - window + 1) on).

    q [T, Hq, d]; k, v [T, H, d] (any strides but a unit one on d: SGLang's v is often a
    view of the fused qkv projection, k a fresh tensor); start int64 [T]. Returns
    (o float32 [T, Hq, d], lse float32 [T, Hq]).
    """
    t, hq, d = q.shape
    h = k.shape[1]
    gqa = hq // h
    o = torch.empty(t, hq, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(t, hq, dtype=torch.float32, device=q.device)
    if t == 0:
        return o, lse
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _chunk_self_kernel[(t, h)](q, k, v, start, o, lse, sm_scale, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                               v.stride(0), v.stride(1), o.stride(0), o.stride(1), lse.stride(0), window, GQA=gqa, D=d, BLOCK_Q=_pow2(gqa), BLOCK_N=block_n,
                               BLOCK_D=_pow2(d), PRECISION=precision)
    return o, lse


def token_requests(cu_seqlens: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(request of each token int64 [T], first token of that request int64 [T]), on the device."""
    cu = cu_seqlens.to(torch.int64)
    tok = torch.arange(num_tokens, device=cu.device)
    req = torch.searchsorted(cu[1:], tok, right=True)
    return req, cu.index_select(0, req)


def ragged_prefill_chunk_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                cu_seqlens: torch.Tensor, k_pages: torch.Tensor,
                                v_pages: torch.Tensor, block_table: torch.Tensor,
                                seq_lens: torch.Tensor, meta: LayerMeta, sm_scale: float,
                                *, split: SplitRow, block_n: int = 32, return_lse: bool = False):
    """Chunk prefill attention of one layer (arguments as ragged_prefill_chunk_torch).

    split: the layer's SplitRow, which cuts the cached part like decode. block_table
    [B, G, max_pages] and seq_lens [B, G] need a unit last stride. Returns o [T, Hq, d]
    in q's dtype (and lse float32 [T, Hq] if return_lse).
    """
    num_tokens = q.shape[0]
    if num_tokens == 0:
        empty = torch.empty_like(q)
        return (empty, q.new_empty(q.shape[:-1], dtype=torch.float32)) if return_lse else empty
    req, start = token_requests(cu_seqlens, num_tokens)
    # a window layer's token i of its chunk stands i + 1 positions past the cached slots
    ahead = torch.arange(num_tokens, device=q.device) - start + 1 if meta.window else None
    o_old, lse_old = ragged_decode_triton(q, k_pages, v_pages, block_table, seq_lens.index_select(0, req), meta,
                                          split, sm_scale, block_n=block_n, return_lse=True, rows=req, ahead=ahead)
    o_self, lse_self = chunk_self_attention_triton(q, k, v, start, sm_scale, window=meta.window, block_n=block_n)
    o, lse = merge_two(o_old.float(), lse_old, o_self, lse_self)
    return (o.to(q.dtype), lse) if return_lse else o.to(q.dtype)
