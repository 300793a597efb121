"""From per-sample retention to budgets, and the figures that test the regularity.

Arrays: retention float [S, L, H] of one target ratio (S samples), budgets
float [L, H]. Spearman correlations are computed per layer over its H heads
(the ranking that grouping uses) and averaged; a layer whose heads are all
equal on one side (no ranking) is left out and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tangram_sglang.method.budgets import budgets_from_stats
from tangram_sglang.method.grouping import group_budgets, group_heads


@dataclass(frozen=True)
class RatioStats:
    ratio: float
    mean: np.ndarray  # [L, H]
    std: np.ndarray  # [L, H]
    budgets: np.ndarray  # [L, H]


def ratio_stats(retention: np.ndarray, ratio: float, alpha: float) -> RatioStats:
    """mu, sigma over samples (population std) and b = min(1, mu + alpha * sigma)."""
    retention = np.asarray(retention, dtype=np.float64)
    if retention.ndim != 3 or retention.shape[0] < 1:
        raise ValueError(f"retention must be [samples >= 1, L, H], got shape {retention.shape}")
    mean, std = retention.mean(axis=0), retention.std(axis=0)
    return RatioStats(ratio=ratio, mean=mean, std=std, budgets=budgets_from_stats(mean, std, alpha))


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 of a 1-D array, ties sharing their mean rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.arange(x.size)
    _, inverse = np.unique(x, return_inverse=True)
    return (np.bincount(inverse, ranks) / np.bincount(inverse))[inverse]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rho (Pearson of average ranks) of two 1-D arrays; nan when either is constant."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / np.sqrt((ra * ra).sum() * (rb * rb).sum()))


def layer_spearman(x: np.ndarray, y: np.ndarray) -> dict:
    """Per-layer Spearman of two [L, H] arrays: mean, min, layers used, share equal to 1."""
    rhos = np.array([spearman(x[l], y[l]) for l in range(x.shape[0])])
    ok = rhos[~np.isnan(rhos)]
    return {"mean": _f(ok.mean()) if ok.size else None, "min": _f(ok.min()) if ok.size else None,
            "layers": int(ok.size), "layers_skipped": int(rhos.size - ok.size),
            "share_perfect": _f(np.mean(ok > 1 - 1e-9)) if ok.size else None}


def per_sample_spearman(retention: np.ndarray, budgets: np.ndarray) -> dict:
    """Spearman of each (sample, layer)'s head retention against the budget ranking."""
    rhos = np.array([spearman(s[l], budgets[l]) for s in retention for l in range(budgets.shape[0])])
    ok = rhos[~np.isnan(rhos)]
    return {"mean": _f(ok.mean()) if ok.size else None, "median": _f(np.median(ok)) if ok.size else None,
            "pairs": int(ok.size), "pairs_skipped": int(rhos.size - ok.size)}


def coverage(retention: np.ndarray, budgets: np.ndarray) -> dict:
    """Share of (sample, layer, head) retentions <= budget, and the mean overflow."""
    over = np.maximum(0.0, np.asarray(retention) - budgets[None] - 1e-9)
    return {"share_covered": _f(np.mean(over == 0)), "mean_overflow": _f(over.mean()),
            "max_overflow": _f(over.max()), "cases": int(over.size)}


def budget_spend(stats: RatioStats) -> dict:
    """Per layer sum_h b / (rho * H) (and the same for mu): the reserve's cost over the target."""
    num_heads = stats.budgets.shape[1]
    spend = stats.budgets.sum(axis=1) / (stats.ratio * num_heads)
    mean_sum = stats.mean.sum(axis=1) / (stats.ratio * num_heads)
    return {"per_layer": [round(float(s), 4) for s in spend], "mean": _f(spend.mean()),
            "min": _f(spend.min()), "max": _f(spend.max()), "mu_sum_over_target_mean": _f(mean_sum.mean())}


def reserved_fraction(budgets: np.ndarray, heads_per_group: int, strategy: str) -> float:
    """Pool memory under a grouping / full KV.

    Every group keeps beta (its max budget) of the tokens in slots H_p heads
    wide (a short group's missing heads are padding): sum_g H_p * beta / H.
    """
    beta = group_budgets(budgets, group_heads(budgets, heads_per_group, strategy))
    return float(heads_per_group * beta.sum() / budgets.size)


def grouping_comparison(budgets: np.ndarray) -> list[dict]:
    """Reserved fraction of full KV, budget-aware vs adjacent, for every H_p."""
    rows = []
    for hp in range(1, budgets.shape[1] + 1):
        rows.append({"heads_per_group": hp,
                     "budget_aware": round(reserved_fraction(budgets, hp, "budget_aware"), 4),
                     "adjacent": round(reserved_fraction(budgets, hp, "adjacent"), 4)})
    return rows


def source_means(retention: np.ndarray, sources: list[str]) -> dict[str, np.ndarray]:
    """Per-source mean retention [L, H] for every source present."""
    src = np.asarray(sources)
    return {s: retention[src == s].mean(axis=0) for s in dict.fromkeys(sources)}


def across_sources(retention: np.ndarray, sources: list[str]) -> dict:
    """Per-layer Spearman between the per-head means of every pair of sources."""
    means = source_means(retention, sources)
    names = list(means)
    pairs = {f"{a}~{b}": layer_spearman(means[a], means[b])
             for i, a in enumerate(names) for b in names[i + 1:]}
    means_of = [p["mean"] for p in pairs.values() if p["mean"] is not None]
    return {"pairs": pairs, "mean": _f(np.mean(means_of)) if means_of else None}


def _f(x) -> float:
    return round(float(x), 4)
