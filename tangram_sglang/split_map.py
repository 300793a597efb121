"""Ahead-of-time workload split map (paper Algorithm 1, the round() version).

S[l, g] = max(1, round(Phi[l, g] / tau_l)), tau_l = Omega_l / N_CTA, where
Phi[l, g] is the sum of the budgets of group g's heads and Omega_l the sum of
all budgets of layer l. Each group gets CTAs in proportion to its share of the
layer's work, so every CTA of a decode step does about the same work. It
depends only on the profile and the device's parallel capacity, never on a
batch: computed once, read per layer.

Worked example: layer budgets [0.9, 0.1, 0.5, 0.2] (Omega = 1.7), groups
[[1, 3], [2, 0]] (Phi = [0.3, 1.4]), N_CTA = 17 -> tau = 0.1 -> S = [3, 14].
"""

from __future__ import annotations

import numpy as np

from .grouping import Groups, group_budget_sums

# Used when no GPU is present to ask (CPU calibration, tests): the CTA count
# one H100 runs at once for a 1-CTA-per-SM attention kernel.
DEFAULT_PARALLEL_CAPACITY = 132


def compute_split_map(budgets: np.ndarray, groups: Groups, num_ctas: int) -> np.ndarray:
    """Split factors per virtual layer. budgets float [L, H] -> int64 [L, G]."""
    if num_ctas < 1:
        raise ValueError(f"parallel capacity (num_ctas) must be >= 1, got {num_ctas}")
    phi = group_budget_sums(np.asarray(budgets, dtype=np.float64), groups)
    omega = phi.sum(axis=1, keepdims=True)
    tau = omega / num_ctas
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(tau > 0, phi / np.where(tau > 0, tau, 1.0), 0.0)
    # np.round is half-to-even; Python's round() in the paper's pseudo code too.
    return np.maximum(1, np.round(share)).astype(np.int64)


def device_parallel_capacity(blocks_per_sm: int = 1) -> int:
    """CTAs the current GPU runs at once (SM count x resident blocks per SM).

    Falls back to DEFAULT_PARALLEL_CAPACITY without a GPU. The attention
    kernel's own occupancy (blocks_per_sm) is passed in by the kernel module.
    """
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            return int(props.multi_processor_count) * blocks_per_sm
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    return DEFAULT_PARALLEL_CAPACITY
