"""Token selection from scores: per-head top-k (Eq. 2/4) and global top-k (Eq. 3).

Both work on one layer's scores ``[H, n]`` (H KV heads, n tokens of a chunk,
higher = more important) and share one deterministic tie rule: among equal
scores the LATER position wins; among equal scores at the same position (only
possible in the global selection) the higher head id wins.

The global selection has a scope (``SCOPES``): "layer" is Eq. 3, the top
ceil(rho H n) of one layer; "model" is the top ceil(rho L H n) of every
layer's scores of the chunk at once (as KVzip and kvpress's KVzipPress do),
so layers get different shares too. Its ties: later position, then the
higher (layer, head).

Worked example, scores of H = 2 heads over n = 4 tokens, ratio 0.5:
    [[0.9, 0.8, 0.1, 0.1],
     [0.2, 0.1, 0.3, 0.7]]
  global: keep ceil(0.5 * 2 * 4) = 4 of the 8 -> 0.9, 0.8, 0.7, 0.3
          -> kept per head [2, 2], retention [0.5, 0.5]
  per head, k = [1, 3]: head 0 keeps token 0; head 1 keeps tokens 3, 2, 0.
With ratio 0.25 the global selection keeps 2: 0.9 and 0.8 -> counts [2, 0].
"""

from __future__ import annotations

import torch

PROTECTED_SCORE = torch.finfo(torch.float32).max  # a protected token outranks every scored one

from tangram_sglang.method.budgets import SCOPES, keep_count


def _check_scores(scores: torch.Tensor) -> None:
    if scores.dim() != 2:
        raise ValueError(f"scores must be [num_kv_heads, n], got shape {tuple(scores.shape)}")


def _rank_later_first(flat: torch.Tensor) -> torch.Tensor:
    """Indices of ``flat`` [m] from best to worst; equal values: higher index first."""
    m = flat.numel()
    order = torch.sort(flat.flip(0), descending=True, stable=True).indices
    return (m - 1) - order


def global_keep_total(ratio: float, num_heads: int, num_tokens: int) -> int:
    """ceil(rho * H * n), the layer's token budget for one chunk (paper Eq. 3)."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")
    return int(keep_count(ratio, num_heads * num_tokens))


def global_topk_mask(scores: torch.Tensor, ratio: float) -> torch.Tensor:
    """Non-uniform selection: the global top ceil(rho * H * n) of the flattened scores.

    scores: float [H, n]. Returns bool [H, n], True = kept.
    """
    _check_scores(scores)
    num_heads, n = scores.shape
    total = global_keep_total(ratio, num_heads, n)
    # Position-major flattening: flat index = pos * H + head, so "higher flat
    # index first" is exactly the tie rule (later position, then higher head).
    flat = scores.float().transpose(0, 1).reshape(-1)
    chosen = _rank_later_first(flat)[:total]
    mask = torch.zeros(n * num_heads, dtype=torch.bool, device=scores.device)
    mask[chosen] = True
    return mask.view(n, num_heads).transpose(0, 1)


def global_topk_counts(scores: torch.Tensor, ratio: float) -> torch.Tensor:
    """Tokens each head keeps under the global selection: int64 [H], sums to ceil(rho*H*n)."""
    return global_topk_mask(scores, ratio).sum(dim=1).to(torch.int64)


def model_topk_masks(scores: list[torch.Tensor], ratio: float) -> torch.Tensor:
    """Model-scope selection: the top ceil(rho * L * H * n) of all layers' scores of one chunk.

    scores: L float tensors [H, n] (comparable across layers, e.g. attention probabilities).
    Returns bool [L, H, n], True = kept.
    """
    if not scores:
        raise ValueError("need the scores of at least one layer")
    for sc in scores:
        _check_scores(sc)
    num_layers, (num_heads, n) = len(scores), scores[0].shape
    if any(sc.shape != (num_heads, n) for sc in scores):
        raise ValueError(f"every layer's scores must be [{num_heads}, {n}], got {[tuple(s.shape) for s in scores]}")
    # rows ordered (layer, head): the flat tie rule "higher row wins" is the higher (layer, head)
    return global_topk_mask(torch.cat([sc.float() for sc in scores]), ratio).view(num_layers, num_heads, n)


def scoped_topk_counts(scores: list[torch.Tensor], ratio: float, scope: str) -> torch.Tensor:
    """Tokens each (layer, head) keeps under the global selection of this scope: int64 [L, H]."""
    if scope == "layer":
        return torch.stack([global_topk_counts(sc, ratio) for sc in scores])
    if scope == "model":
        return model_topk_masks(scores, ratio).sum(dim=2).to(torch.int64)
    raise ValueError(f"selection scope must be one of {SCOPES}, got {scope!r}")


def per_head_topk_indices(scores: torch.Tensor, counts) -> list[torch.Tensor]:
    """Per-head selection (paper Eq. 4): head h keeps its top counts[h] tokens.

    scores: float [H, n]; counts: int or int sequence/tensor [H], each in [0, n].
    Returns H int64 tensors of kept positions, best first (ties: later wins).
    """
    _check_scores(scores)
    num_heads, n = scores.shape
    counts_t = torch.as_tensor(counts, dtype=torch.int64).cpu()
    if counts_t.dim() == 0:
        counts_t = counts_t.expand(num_heads)
    if counts_t.shape != (num_heads,):
        raise ValueError(f"counts must be an int or [{num_heads}], got shape {tuple(counts_t.shape)}")
    if bool((counts_t < 0).any()) or bool((counts_t > n).any()):
        raise ValueError(f"per-head counts must be in [0, {n}], got {counts_t.tolist()}")
    order = (n - 1) - torch.sort(scores.float().flip(1), dim=1, descending=True, stable=True).indices
    return [order[h, : int(counts_t[h])] for h in range(num_heads)]


def per_head_topk_mask(scores: torch.Tensor, counts) -> torch.Tensor:
    """Bool [H, n] form of per_head_topk_indices."""
    mask = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    for h, idx in enumerate(per_head_topk_indices(scores, counts)):
        mask[h, idx] = True
    return mask


def protect_scores(scores: torch.Tensor, lengths, protect) -> torch.Tensor:
    """Raise the protected positions of each request's chunk to PROTECTED_SCORE (in place).

    scores: float32 [B, H, n_max]; lengths: int [B] real tokens per chunk; protect: [(lead, trail)] * B.
    """
    for b, ((lead, trail), n) in enumerate(zip(protect, lengths)):
        n = int(n)
        if lead:
            scores[b, :, :lead] = PROTECTED_SCORE
        if trail:
            scores[b, :, n - trail:n] = PROTECTED_SCORE
    return scores
