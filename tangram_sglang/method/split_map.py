"""Ahead-of-time workload split map (paper Algorithm 1, the round() version).

S[l, g] = max(1, round(Phi[l, g] / tau_l)), tau_l = Omega_l / N_CTA, where
Phi[l, g] is the sum of the budgets of group g's heads and Omega_l the sum of
all budgets of layer l. Each group gets CTAs in proportion to its share of the
layer's work, so every CTA of a decode step does about the same work. It
depends only on the profile and the device's parallel capacity, never on a
batch: computed once, read per layer.

Worked example: layer budgets [0.9, 0.1, 0.5, 0.2] (Omega = 1.7), groups
[[1, 3], [2, 0]] (Phi = [0.3, 1.4]), N_CTA = 17 -> tau = 0.1 -> S = [3, 14].

Profiles feed Algorithm 1 the budgets as stored (``stored_budgets``): every
head of a group keeps the group's count beta_g, so a group's decode work is
|g| * beta_g, not the sum of its heads' own budgets. With the paper's raw
sums, mixed groups get too few CTAs (stragglers up to 1.69x on the reference
profiles at H_p = 4; 1.01-1.06x with stored budgets, benchmarks/modeled/load_balance.py).
"""

from __future__ import annotations

import numpy as np

from tangram_sglang.method.grouping import Groups, group_budget_sums, group_budgets

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


def stored_budgets(budgets: np.ndarray, groups: Groups) -> np.ndarray:
    """Budgets as the ragged pool stores them: every head at its group's beta. float [L, H]."""
    budgets = np.asarray(budgets, dtype=np.float64)
    beta = group_budgets(budgets, groups)
    out = budgets.copy()
    for layer, layer_groups in enumerate(groups):
        for g, heads in enumerate(layer_groups):
            out[layer, heads] = beta[layer, g]
    return out


def profile_split_map(budgets: np.ndarray, groups: Groups, num_ctas: int) -> np.ndarray:
    """The split map a profile ships: Algorithm 1 over the stored work. int64 [L, G]."""
    return compute_split_map(stored_budgets(budgets, groups), groups, num_ctas)
