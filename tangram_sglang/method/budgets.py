"""Per-head budgets from calibration statistics (paper Eq. 5).

b[l, h] = min(1, mu[l, h] + alpha * sigma[l, h]), floored at MIN_BUDGET so a
head that kept nothing in the pilot samples still keeps ceil(b * n) >= 1 slot
per chunk (budgets live in (0, 1]).
"""

from __future__ import annotations

import numpy as np

MIN_BUDGET = 1e-3
# what the calibration's global top-k spans: one layer (paper Eq. 3) or every layer of the model
SCOPES = ("layer", "model")


def budgets_from_stats(mean: np.ndarray, std: np.ndarray, alpha: float = 2.0) -> np.ndarray:
    """mean, std: float [L, H] of per-sample retention ratios -> budgets float64 [L, H]."""
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    b = np.asarray(mean, dtype=np.float64) + alpha * np.asarray(std, dtype=np.float64)
    return np.clip(b, MIN_BUDGET, 1.0)


def keep_count(budget: np.ndarray | float, num_tokens: int) -> np.ndarray:
    """Slots kept per head (or group) for a chunk of num_tokens: ceil(b * n), int64.

    A tiny epsilon keeps float noise (0.5 * 10 = 5.000000001) from adding a slot.
    """
    b = np.asarray(budget, dtype=np.float64)
    return np.minimum(num_tokens, np.ceil(b * num_tokens - 1e-9)).astype(np.int64)
