"""How the baselines split decode work: FlashDecoding's uniform num_splits and a
FlashInfer-style per-step planner. Used by the load-balance and GPU benchmarks.

- fa2_num_splits: FlashAttention-2's num_splits_heuristic (flash_api.cpp): one
  split count for every (request, head), chosen so the waves fill the GPU.
- planned_chunk: FlashInfer's decode planner in spirit (binary search on the
  KV chunk size so the pieces fit the CTA capacity), redone for every layer at
  every step because each layer's group lengths differ.
"""

from __future__ import annotations

import math

import numpy as np


def fa2_num_splits(batch_heads: int, capacity: int, num_blocks: int, max_splits: int = 128) -> int:
    """Uniform split count for batch_heads (request, head-or-group) pairs on ``capacity`` CTAs."""
    if batch_heads >= 0.8 * capacity:
        return 1
    max_splits = max(1, min(max_splits, capacity, num_blocks))
    eff = []
    for s in range(1, max_splits + 1):
        waves = batch_heads * s / capacity
        eff.append(waves / math.ceil(waves))
    best = max(eff)
    return next(s for s, e in enumerate(eff, start=1) if e >= 0.85 * best)


def planned_chunk(lens: np.ndarray, capacity: int) -> tuple[int, int]:
    """Smallest chunk c with sum(ceil(lens / c)) <= capacity, by binary search.

    lens: int [...] slots per work item. Returns (c, item evaluations done).
    """
    lens = np.asarray(lens, dtype=np.int64)
    lo, hi, evals = 1, max(int(lens.max()), 1), 0
    while lo < hi:
        mid = (lo + hi) // 2
        evals += lens.size
        if int((-(-lens // mid)).sum()) <= capacity:
            hi = mid
        else:
            lo = mid + 1
    return lo, evals
