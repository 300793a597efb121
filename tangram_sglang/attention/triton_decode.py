"""Triton decode attention over ragged groups, driven by the split map.

Same signature and result as reference.ragged_decode_torch (split cut).
Two kernels, no planning:

1. split kernel, grid (B, T), T = sum(S): CTA (b, t) takes group
   g = cta_group[t], piece s = cta_split[t] of (b, g) (split_row.py; in a
   sliding-window layer the pieces cut the newest meta.window slots) and, for
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


# Helpers shared by the kernels here and in triton_prefill.py. They live in this module,
# not a separate one, because the tests reload it after setting TRITON_INTERPRET, and an
# interpreted kernel can only call helpers decorated in interpreter mode too.


@triton.jit
def _load_tile(base, rows, stride, rmask, BLOCK_D: tl.constexpr, D: tl.constexpr):
    """Tile [R, BLOCK_D] of rows [R] (stride elements apart) of base, zero outside rmask [R] x D."""
    cols = tl.arange(0, BLOCK_D)
    return tl.load(base + rows[:, None] * stride + cols[None, :], mask=rmask[:, None] & (cols < D)[None, :], other=0.0)


@triton.jit
def _store_tile(base, rows, stride, rmask, x, BLOCK_D: tl.constexpr, D: tl.constexpr):
    """Stores x [R, BLOCK_D] to rows [R] (stride elements apart) of base, within rmask [R] x D."""
    cols = tl.arange(0, BLOCK_D)
    tl.store(base + rows[:, None] * stride + cols[None, :], x, mask=rmask[:, None] & (cols < D)[None, :])


@triton.jit
def _paged_rows(bt_row, slot, nmask, p, PAGE: tl.constexpr, HP: tl.constexpr):
    """Rows int64 [N] of head slot p in a K/V pool [pages * PAGE, HP, D] seen as [rows, D]:
    slots [N] (live where nmask) looked up in the block-table row bt_row [max_pages]."""
    page = tl.load(bt_row + slot // PAGE, mask=nmask, other=0).to(tl.int64)  # int64: pool offsets can pass 2**31
    return (page * PAGE + slot % PAGE) * HP + p


@triton.jit
def _softmax_init(BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Empty online-softmax state float32: (max [R] = -inf, sum [R] = 0, acc [R, BLOCK_D] = 0)."""
    return (tl.full([BLOCK_R], float("-inf"), tl.float32), tl.zeros([BLOCK_R], tl.float32),
            tl.zeros([BLOCK_R, BLOCK_D], tl.float32))


@triton.jit
def _attend(q, k, v, nmask, m_i, l_i, acc, sm_scale, PRECISION: tl.constexpr):
    """One online-softmax step: q [R, BLOCK_D] against k, v [N, BLOCK_D] (keys live where
    nmask [N]); returns the updated state (m_i [R], l_i [R], acc [R, BLOCK_D]) float32."""
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
    qk = tl.where(nmask[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp(m_i - m_new)
    prob = tl.exp(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(prob, 1)
    acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _finish(m, den, acc):
    """(o [R, BLOCK_D], lse [R]) of a softmax state m, den [R], acc [R, BLOCK_D]; a row that
    saw no key (den 0) gives o = acc = 0 and lse = -inf rather than 0/0."""
    has = den > 0
    den_safe = tl.where(has, den, 1.0)
    return acc / den_safe[:, None], tl.where(has, m + tl.log(den_safe), float("-inf"))


@triton.jit
def _split_kernel(Q, K, V, BT, ROWS, LENS, AHEAD, SPLITS, CTA_G, CTA_S, QH, GSIZE, MID_O, MID_LSE, sm_scale,
                  stride_qb, stride_qh, stride_btb, stride_btg, stride_lb, num_ctas, window,
                  HAS_AHEAD: tl.constexpr, PAGE: tl.constexpr, HP: tl.constexpr, GQA: tl.constexpr, D: tl.constexpr,
                  BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  PRECISION: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    g = tl.load(CTA_G + c)
    s = tl.load(CTA_S + c)
    nsplit = tl.load(SPLITS + g)
    n = tl.load(LENS + b * stride_lb + g)
    # a window layer reads the slots of its query's window: the newest window slots in decode, later
    # ones for a chunk token standing AHEAD[b] positions past them (none once the window passes n)
    last = n + tl.load(AHEAD + b) if HAS_AHEAD else n
    lo = tl.where(window > 0, tl.minimum(tl.maximum(last - window, 0), n), 0)
    piece = (n - lo + nsplit - 1) // nsplit
    start = lo + s * piece
    end = tl.minimum(start + piece, n)
    gsize = tl.load(GSIZE + g)
    offs_q = tl.arange(0, BLOCK_Q)
    qmask = offs_q < GQA
    bt_row = BT + tl.load(ROWS + b) * stride_btb + g * stride_btg
    for p in tl.static_range(HP):
        if p < gsize:
            qh = tl.load(QH + (g * HP + p) * GQA + offs_q, mask=qmask, other=0)
            q = _load_tile(Q + b * stride_qb, qh, stride_qh, qmask, BLOCK_D, D)
            m_i, l_i, acc = _softmax_init(BLOCK_Q, BLOCK_D)
            for t0 in range(start, end, BLOCK_N):
                slot = t0 + tl.arange(0, BLOCK_N)
                nmask = slot < end
                kv = _paged_rows(bt_row, slot, nmask, p, PAGE, HP)
                # FP8 pages (kv_quant.py) widen to q's type; their scales are applied by the host
                k = _load_tile(K, kv, D, nmask, BLOCK_D, D).to(Q.dtype.element_ty)
                v = _load_tile(V, kv, D, nmask, BLOCK_D, D).to(Q.dtype.element_ty)
                m_i, l_i, acc = _attend(q, k, v, nmask, m_i, l_i, acc, sm_scale, PRECISION)
            o, lse = _finish(m_i, l_i, acc)
            row = (b * num_ctas + c) * (HP * GQA) + p * GQA + offs_q
            _store_tile(MID_O, row, D, qmask, o, BLOCK_D, D)
            tl.store(MID_LSE + row, lse, mask=qmask)


@triton.jit
def _merge_kernel(MID_O, MID_LSE, SPLITS, CTA_OFF, QH, GSIZE, O, LSE, stride_ob, stride_oh, stride_lseb, num_ctas,
                  HP: tl.constexpr, GQA: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    rows = tl.arange(0, BLOCK_R)
    rmask = rows < tl.load(GSIZE + g) * GQA
    first = b * num_ctas + tl.load(CTA_OFF + g)
    m, den, acc = _softmax_init(BLOCK_R, BLOCK_D)
    for s in range(0, tl.load(SPLITS + g)):
        row = (first + s) * (HP * GQA) + rows
        lse = tl.load(MID_LSE + row, mask=rmask, other=float("-inf"))
        o = _load_tile(MID_O, row, D, rmask, BLOCK_D, D)
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        w = tl.exp(lse - m_safe)
        den = den * alpha + w
        acc = acc * alpha[:, None] + o * w[:, None]
        m = m_new
    out, lse_out = _finish(m, den, acc)
    qh = tl.load(QH + g * (HP * GQA) + rows, mask=rmask, other=0)
    _store_tile(O + b * stride_ob, qh, stride_oh, rmask, out.to(O.dtype.element_ty), BLOCK_D, D)
    tl.store(LSE + b * stride_lseb + qh, lse_out, mask=rmask)


def _pow2(x: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(int(x)))


def ragged_decode_triton(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                         block_table: torch.Tensor, seq_lens: torch.Tensor, meta: LayerMeta,
                         split: SplitRow, sm_scale: float, *, block_n: int = 32,
                         return_lse: bool = False, rows: torch.Tensor | None = None,
                         ahead: torch.Tensor | None = None):
    """Decode attention over ragged groups (see reference.ragged_decode_torch for the arguments).

    k_pages, v_pages must be contiguous; block_table [B, G, max_pages] and seq_lens
    [B, G] need a unit stride on their last dim. Returns o [B, Hq, d] in q's dtype
    (and lse float32 [B, Hq] if return_lse). rows: int64 [B] table row of each batch
    entry (block_table then [R, G, max_pages]); None reads row b. ahead: int64 [B] or None,
    as the reference's (a window layer's chunk tokens). Quantized pages
    (kv_quant.py): meta.k_scale folds into sm_scale, meta.v_scale scales the output.
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
        q, k_pages, v_pages, block_table, rows, seq_lens, rows if ahead is None else ahead, split.splits, split.cta_group, split.cta_split,
        meta.q_head, meta.group_size, mid_o, mid_lse, sm_scale * meta.k_scale,
        q.stride(0), q.stride(1), block_table.stride(0), block_table.stride(1), seq_lens.stride(0), num_ctas,
        meta.window, HAS_AHEAD=ahead is not None, PAGE=k_pages.shape[1], HP=hp, GQA=gqa, D=d, BLOCK_Q=_pow2(gqa), BLOCK_N=block_n,
        BLOCK_D=_pow2(d), PRECISION=precision)
    _merge_kernel[(batch, meta.num_groups)](
        mid_o, mid_lse, split.splits, split.cta_offset, meta.q_head, meta.group_size, o, lse,
        o.stride(0), o.stride(1), lse.stride(0), num_ctas, HP=hp, GQA=gqa, D=d, BLOCK_R=_pow2(head_rows, 1),
        BLOCK_D=_pow2(d))
    if meta.v_scale != 1.0:
        o.mul_(meta.v_scale)
    return (o, lse) if return_lse else o
