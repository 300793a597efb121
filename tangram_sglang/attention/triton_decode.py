"""Triton decode attention over ragged groups, driven by the split map.

Same signature and result as reference.ragged_decode_torch (split cut).
Two kernels, no planning:

1. split kernel, grid (B, T), T = sum(S): CTA (b, t) takes group
   g = cta_group[t], piece s = cta_split[t] of (b, g) (split_row.py) and, for
   each head slot p < group_size[g], attends the gqa query heads of KV head
   groups[g][p] to the piece's slots (online softmax, BLOCK_N slots a step),
   writing a partial (o, lse) per row.
2. merge kernel, grid (B, G): log-sum-exp merge of the S[g] partials of each
   row, written to the row's query head.

Runs on CPU under TRITON_INTERPRET=1 (tests) and on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tangram_sglang.attention.layer_meta import LayerMeta
from tangram_sglang.attention.split_row import SplitRow


@triton.jit
def _split_kernel(Q, K, V, BT, ROWS, LENS, SPLITS, CTA_G, CTA_S, QH, GSIZE, MID_O, MID_LSE, sm_scale,
                  stride_qb, stride_qh, stride_btb, stride_btg, stride_lb, num_ctas,
                  PAGE: tl.constexpr, HP: tl.constexpr, GQA: tl.constexpr, D: tl.constexpr,
                  BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  PRECISION: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    g = tl.load(CTA_G + c)
    s = tl.load(CTA_S + c)
    nsplit = tl.load(SPLITS + g)
    n = tl.load(LENS + b * stride_lb + g)
    piece = (n + nsplit - 1) // nsplit
    start = s * piece
    end = tl.minimum(start + piece, n)
    gsize = tl.load(GSIZE + g)
    offs_q = tl.arange(0, BLOCK_Q)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    qmask = offs_q < GQA
    dmask = offs_d < D
    bt_row = BT + tl.load(ROWS + b) * stride_btb + g * stride_btg
    for p in tl.static_range(HP):
        if p < gsize:
            qh = tl.load(QH + (g * HP + p) * GQA + offs_q, mask=qmask, other=0)
            q = tl.load(Q + b * stride_qb + qh[:, None] * stride_qh + offs_d[None, :],
                        mask=qmask[:, None] & dmask[None, :], other=0.0)
            m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_Q], tl.float32)
            acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
            for t0 in range(start, end, BLOCK_N):
                slot = t0 + offs_n
                nmask = slot < end
                page = tl.load(bt_row + slot // PAGE, mask=nmask, other=0).to(tl.int64)
                loc = page * PAGE + slot % PAGE
                kv = (loc * HP + p)[:, None] * D + offs_d[None, :]
                kvmask = nmask[:, None] & dmask[None, :]
                k = tl.load(K + kv, mask=kvmask, other=0.0)
                qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
                qk = tl.where(nmask[None, :], qk, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(qk, 1))
                alpha = tl.exp(m_i - m_new)
                prob = tl.exp(qk - m_new[:, None])
                l_i = l_i * alpha + tl.sum(prob, 1)
                v = tl.load(V + kv, mask=kvmask, other=0.0)
                acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v, input_precision=PRECISION)
                m_i = m_new
            has = l_i > 0
            lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
            o = acc / tl.where(has, l_i, 1.0)[:, None]
            row = (b * num_ctas + c) * (HP * GQA) + p * GQA + offs_q
            tl.store(MID_O + row[:, None] * D + offs_d[None, :], o, mask=qmask[:, None] & dmask[None, :])
            tl.store(MID_LSE + row, lse, mask=qmask)


@triton.jit
def _merge_kernel(MID_O, MID_LSE, SPLITS, CTA_OFF, QH, GSIZE, O, LSE, stride_ob, stride_oh, stride_lseb, num_ctas,
                  HP: tl.constexpr, GQA: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    nsplit = tl.load(SPLITS + g)
    off = tl.load(CTA_OFF + g)
    gsize = tl.load(GSIZE + g)
    rows = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    rmask = rows < gsize * GQA
    dmask = offs_d < D
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for s in range(0, nsplit):
        row = (b * num_ctas + off + s) * (HP * GQA) + rows
        lse = tl.load(MID_LSE + row, mask=rmask, other=float("-inf"))
        o = tl.load(MID_O + row[:, None] * D + offs_d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        w = tl.exp(lse - m_safe)
        den = den * alpha + w
        acc = acc * alpha[:, None] + o * w[:, None]
        m = m_new
    has = den > 0
    out = acc / tl.where(has, den, 1.0)[:, None]
    qh = tl.load(QH + g * (HP * GQA) + rows, mask=rmask, other=0)
    tl.store(O + b * stride_ob + qh[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=rmask[:, None] & dmask[None, :])
    lse_out = tl.where(has, m + tl.log(tl.where(has, den, 1.0)), float("-inf"))
    tl.store(LSE + b * stride_lseb + qh, lse_out, mask=rmask)


def _pow2(x: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(int(x)))


def ragged_decode_triton(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                         block_table: torch.Tensor, seq_lens: torch.Tensor, meta: LayerMeta,
                         split: SplitRow, sm_scale: float, *, block_n: int = 32,
                         return_lse: bool = False, rows: torch.Tensor | None = None):
    """Decode attention over ragged groups (see reference.ragged_decode_torch for the arguments).

    k_pages, v_pages must be contiguous; block_table [B, G, max_pages] and seq_lens
    [B, G] need a unit stride on their last dim. Returns o [B, Hq, d] in q's dtype
    (and lse float32 [B, Hq] if return_lse). rows: int64 [B] table row of each batch
    entry (block_table then [R, G, max_pages]); None reads row b.
    """
    batch, hq, d = q.shape
    hp, gqa = meta.heads_per_group, meta.gqa
    if not (k_pages.is_contiguous() and v_pages.is_contiguous()):
        raise ValueError("k_pages and v_pages must be contiguous")
    if block_table.stride(-1) != 1 or seq_lens.stride(-1) != 1:
        raise ValueError("block_table and seq_lens need a unit stride on their last dimension")
    if rows is None:
        rows = torch.arange(batch, dtype=torch.int64, device=q.device)
    num_ctas = split.num_ctas
    head_rows = hp * gqa
    mid_o = torch.empty(batch, num_ctas, head_rows, d, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(batch, num_ctas, head_rows, dtype=torch.float32, device=q.device)
    o = torch.empty_like(q)
    lse = torch.empty(batch, hq, dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _split_kernel[(batch, num_ctas)](
        q, k_pages, v_pages, block_table, rows, seq_lens, split.splits, split.cta_group, split.cta_split,
        meta.q_head, meta.group_size, mid_o, mid_lse, sm_scale,
        q.stride(0), q.stride(1), block_table.stride(0), block_table.stride(1), seq_lens.stride(0), num_ctas,
        PAGE=k_pages.shape[1], HP=hp, GQA=gqa, D=d, BLOCK_Q=_pow2(gqa), BLOCK_N=block_n,
        BLOCK_D=_pow2(d), PRECISION=precision)
    _merge_kernel[(batch, meta.num_groups)](
        mid_o, mid_lse, split.splits, split.cta_offset, meta.q_head, meta.group_size, o, lse,
        o.stride(0), o.stride(1), lse.stride(0), num_ctas, HP=hp, GQA=gqa, D=d, BLOCK_R=_pow2(head_rows, 1),
        BLOCK_D=_pow2(d))
    return (o, lse) if return_lse else o
