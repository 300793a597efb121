"""Compression fused into chunk prefill: score, keep per head, write.

For each request's chunk of n tokens the method's scorer rates every token
per KV head (float32 [H, n], higher = more important, scorers/base.py). Each
head of group g keeps its top k_g(n) = keep_count(beta_g, n) tokens (every
head of a group keeps the group's count, so the pool's reservation and the
written slots agree), and only those K/V are written, in position order, into
the slots reserved for them.

Protected tokens (sinks, a prompt's newest tokens: tangram_sglang.method.protection)
score above everything, so they are kept first. Tie rule (as
tangram_sglang.scorers.selection): among equal scores the later position wins. Selection is vectorized over the batch; the scorer is called once per
request (its contract is one sequence at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tangram_sglang.attention.kv_write import write_kept_kv
from tangram_sglang.attention.layer_meta import LayerMeta
from tangram_sglang.method.budgets import keep_count
from tangram_sglang.scorers.selection import protect_scores


@dataclass(frozen=True)
class ChunkPlan:
    """Host-known sizes of one layer's compression in a forward batch, so the device work needs
    no sync: cu (request b's tokens cu[b] .. cu[b + 1]), n_max (longest chunk), kmax (largest
    keep count of any (b, g)), take (int64 [sum(keep)] on the device: flat (b, g, j) positions
    of [B, G, kmax] with j < keep[b, g], in order)."""

    cu: list
    n_max: int
    kmax: int
    take: torch.Tensor

    @classmethod
    def build(cls, ext_lens, keep: np.ndarray, device) -> "ChunkPlan":
        """ext_lens: int [B] chunk tokens; keep: int [B, G] this layer's keep counts."""
        cu = [0, *np.cumsum(np.asarray(ext_lens, np.int64)).tolist()]
        n_max = int(max(ext_lens, default=0))
        keep = np.asarray(keep, np.int64)
        kmax = int(keep.max(initial=0))
        take = np.flatnonzero(np.arange(kmax)[None, None, :] < keep[:, :, None])
        return cls(cu=cu, n_max=n_max, kmax=kmax, take=torch.from_numpy(take).to(device))


def group_keep_counts(meta: LayerMeta, chunk_lens) -> torch.Tensor:
    """k_g(n_b) = ceil(beta_g * n_b) for every request and group: int64 [B, G].

    chunk_lens: int [B], tokens of each request's chunk.
    """
    if meta.group_budget is None:
        raise ValueError("LayerMeta has no group_budget; build it from a profile entry")
    n = np.asarray(torch.as_tensor(chunk_lens).cpu(), dtype=np.int64)
    counts = keep_count(meta.group_budget[None, :], n[:, None])
    return torch.as_tensor(counts, dtype=torch.int64, device=meta.kv_head.device)


def score_chunks(scorer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cu_seqlens: torch.Tensor, states=None, hidden: torch.Tensor | None = None,
                 cu: list | None = None) -> torch.Tensor:
    """Scores of every request's chunk, padded: float32 [B, H, n_max].

    Padding positions get -inf; real scores are clamped to >= -max_float so a
    real token always outranks padding. states: per-request ScorerState or None.
    hidden: [T, D] the layer's input hidden states, for scorers with needs_hidden.
    cu: cu_seqlens as host ints, when known (no read-back).
    """
    needs_hidden = getattr(scorer, "needs_hidden", False)
    if needs_hidden and hidden is None:
        raise ValueError(f"scorer {scorer.name!r} needs the layer's hidden states")
    cu = [int(x) for x in cu_seqlens.tolist()] if cu is None else cu
    batch, n_max = len(cu) - 1, max((b - a for a, b in zip(cu, cu[1:])), default=0)
    out = torch.full((batch, k.shape[1], n_max), float("-inf"), device=k.device)
    lowest = torch.finfo(torch.float32).min
    for b in range(batch):
        a, e = cu[b], cu[b + 1]
        if e > a:
            state = None if states is None else states[b]
            extra = {"hidden": hidden[a:e]} if needs_hidden else {}
            out[b, :, : e - a] = torch.clamp(scorer.score(q[a:e], k[a:e], v[a:e], state, **extra).float(),
                                             min=lowest)
    return out


def select_kept(scores: torch.Tensor, counts: torch.Tensor, kmax: int | None = None) -> torch.Tensor:
    """Per-head top-k positions, returned in ascending position order.

    scores: float32 [B, H, n]; counts: int [B, H], each <= real tokens of b; kmax: max(counts)
    when the host knows it (no read-back).
    Returns int64 [B, H, kmax], kmax = max(counts); entry j of (b, h) is valid for
    j < counts[b, h] (later entries are n, a sentinel).
    """
    n = scores.shape[-1]
    order = (n - 1) - torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices
    if kmax is None:
        kmax = int(counts.max()) if counts.numel() else 0
    chosen = order[..., :kmax]
    j = torch.arange(kmax, device=scores.device)
    chosen = torch.where(j < counts[..., None].to(torch.int64), chosen, n)
    return torch.sort(chosen, dim=-1).values


def compress_and_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                       scorer, states, meta: LayerMeta, keep: torch.Tensor, out_loc: torch.Tensor,
                       k_pages: torch.Tensor, v_pages: torch.Tensor, protect=None,
                       hidden: torch.Tensor | None = None, scores: torch.Tensor | None = None,
                       chunk_plan: ChunkPlan | None = None) -> torch.Tensor:
    """Score each chunk, keep each head's top k_g(n) tokens, write them to out_loc.

    Parameters
    ----------
    q : [T, Hq, d]; k, v : [T, H, d], the batch's chunks, concatenated (after RoPE).
    cu_seqlens : int [B + 1]; scorer : a Scorer (for this layer); states : per-request ScorerState or None.
    meta : LayerMeta; keep : int64 [B, G], slots per head of (b, g) (group_keep_counts).
    out_loc : int64 [sum(keep)], the reserved flat slots in (b, g, j) order (slot_locs).
    k_pages, v_pages : [num_pages, P, H_p, d], written in place.
    protect : [(lead, trail)] * B or None: each chunk's leading and trailing runs every head
        keeps (tangram_sglang.method.protection); keep must already count them.
    hidden : [T, D] or None, the layer's input hidden states (scorers with needs_hidden).
    scores : float32 [B, H, n_max] or None: scores already computed (a reconstruction pass,
        -inf past each chunk); the scorer is then not called.
    chunk_plan : the layer's ChunkPlan (served path): the sizes come from the host, so nothing
        here reads a device tensor back (scorers may).

    Returns
    -------
    kept : int64 [B, H, kmax], kept chunk positions per head (ascending; sentinel n_max
        past the head's count), for tests and debugging.
    """
    host = chunk_plan
    expected = int(host.take.numel()) if host is not None else int(keep.sum())
    if out_loc.numel() != expected:
        raise ValueError(f"out_loc has {out_loc.numel()} slots, keep counts need {expected}")
    cu = host.cu if host is not None else [int(x) for x in cu_seqlens.tolist()]
    lens = [b - a for a, b in zip(cu, cu[1:])]
    if scores is None:
        scores = score_chunks(scorer, q, k, v, cu_seqlens, states, hidden, cu=cu)
    else:
        scores = torch.clamp(scores.float(), min=torch.finfo(torch.float32).min)
        n_dev = (cu_seqlens[1:] - cu_seqlens[:-1]).to(scores.device)
        pad = torch.arange(scores.shape[-1], device=scores.device)[None, None, :] >= n_dev[:, None, None]
        scores = scores.masked_fill(pad, float("-inf"))
        for b, state in enumerate(states or ()):
            if state is not None:
                state.tokens_seen += lens[b]
    if protect is not None:
        protect_scores(scores, lens, protect)
    per_head = keep[:, meta.group_of_head]  # [B, H]
    kept = select_kept(scores, per_head, None if host is None else host.kmax)
    n_max = max(lens, default=0)
    start = cu_seqlens[:-1].to(torch.int64)[:, None, None]
    token = torch.where(kept < n_max, start + kept, 0)
    write_kept_kv(k, v, token, keep, out_loc, meta, k_pages, v_pages, take=None if host is None else host.take)
    return kept
