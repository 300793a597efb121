"""Top-k / top-p renormalization of probabilities with sgl_kernel.sampling's signatures, in torch.

Both return a new float32 [batch, vocab] tensor; fixed shapes and no host sync, so they capture in a
CUDA graph.
"""

from __future__ import annotations

from typing import Union

import torch

from ._missing import stand_in_getattr

__getattr__ = stand_in_getattr(__name__)


def _per_row(value: Union[torch.Tensor, int, float], probs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A per-row parameter as a [batch or 1, 1] column on probs' device."""
    if isinstance(value, torch.Tensor):
        return value.to(device=probs.device, dtype=dtype).reshape(-1, 1)
    return torch.full((1, 1), value, dtype=dtype, device=probs.device)


def _renormalized(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def top_k_renorm_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int]) -> torch.Tensor:
    """Keep each row's ``top_k`` largest probabilities (ties with the k-th are kept too), zero the rest
    and renormalize. probs [batch, vocab]; top_k an int or [batch] ints; ``k <= 0`` or ``k >= vocab``
    keeps the whole row (SGLang's "all" is 1 << 30)."""
    probs = probs.float()
    vocab = probs.shape[-1]
    k = _per_row(top_k, probs, torch.long)
    ranked = probs.sort(dim=-1, descending=True).values
    kth = ranked.gather(-1, (k.clamp(1, vocab) - 1).expand(probs.shape[0], 1))
    keep = (probs >= kth) | (k <= 0) | (k >= vocab)
    return _renormalized(probs, keep)


def top_p_renorm_probs(probs: torch.Tensor, top_p: Union[torch.Tensor, float]) -> torch.Tensor:
    """Keep each row's smallest most-probable set whose mass reaches ``top_p`` (ties with its last
    member are kept too), zero the rest and renormalize. probs [batch, vocab]; top_p a float or
    [batch] floats; ``top_p >= 1`` keeps the whole row."""
    probs = probs.float()
    p = _per_row(top_p, probs, torch.float32)
    ranked = probs.sort(dim=-1, descending=True).values
    mass_before = ranked.cumsum(dim=-1) - ranked
    kept = (mass_before < p).sum(dim=-1, keepdim=True).clamp_min(1)
    smallest_kept = ranked.gather(-1, kept - 1)
    keep = (probs >= smallest_kept) | (p >= 1.0)
    return _renormalized(probs, keep)


top_k_renorm_prob = top_k_renorm_probs
top_p_renorm_prob = top_p_renorm_probs
