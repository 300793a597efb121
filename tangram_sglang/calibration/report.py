"""The regularity report: does the pilot's per-head retention hold on new inputs?

``regularity_report`` computes, for every target ratio, from the calibration
samples' retention (which made the budgets) and held-out samples' retention:
  rank stability   per-layer Spearman of per-head means, calibration vs
                   held-out, per held-out sample vs the budgets, and between
                   sources (needle / sharegpt / mtbench)
  coverage         share of held-out (sample, layer, head) retentions the
                   budget covers, and the mean overflow when it does not
  spend            per layer sum_h b / (rho * H)
  grouping         reserved share of full KV, budget-aware vs adjacent
``write_report`` saves report.json, report.md and retention.png in a folder.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from tangram_sglang.calibration.pilot import SampleRetention
from tangram_sglang.calibration.stats import (
    across_sources,
    budget_spend,
    coverage,
    grouping_comparison,
    layer_spearman,
    per_sample_spearman,
    ratio_stats,
    spearman,
)


def stack(results: list[SampleRetention]) -> np.ndarray:
    """[S, R, L, H] retention of a list of samples."""
    return np.stack([r.retention for r in results])


def ratio_report(cal: np.ndarray, held: np.ndarray, cal_src: list[str], held_src: list[str],
                 ratio: float, alpha: float) -> dict:
    """Figures of one ratio. cal, held: [S, L, H] retention."""
    st = ratio_stats(cal, ratio, alpha)
    out = {"ratio": ratio, "spend": budget_spend(st), "grouping": grouping_comparison(st.budgets),
           "coverage_calibration": coverage(cal, st.budgets),
           "head_spread": {"mean_layer_range_of_mu": round(float(np.ptp(st.mean, axis=1).mean()), 4),
                           "mean_sigma": round(float(st.std.mean()), 4)}}
    if len(held):
        held_mean = held.mean(axis=0)
        out["heldout"] = {
            "rank_layer_means": layer_spearman(st.mean, held_mean),
            "rank_all_heads": round(spearman(st.mean.ravel(), held_mean.ravel()), 4),
            "rank_per_sample_vs_budget": per_sample_spearman(held, st.budgets),
            "coverage": coverage(held, st.budgets),
            "coverage_by_source": {s: coverage(held[np.asarray(held_src) == s], st.budgets)
                                   for s in dict.fromkeys(held_src)},
        }
    both = np.concatenate([cal, held]) if len(held) else cal
    out["across_sources"] = across_sources(both, list(cal_src) + list(held_src))
    return out


def regularity_report(cal: list[SampleRetention], held: list[SampleRetention], ratios: tuple[float, ...],
                      alpha: float, meta: dict, gate: dict | None = None) -> dict:
    cal_arr = stack(cal)
    held_arr = stack(held) if held else np.zeros((0, *cal_arr.shape[1:]))
    cal_src, held_src = [r.source for r in cal], [r.source for r in held]
    out = {
        "meta": meta,
        "samples": {"calibration": _counts(cal), "heldout": _counts(held)},
        "ratios": [ratio_report(cal_arr[:, i], held_arr[:, i], cal_src, held_src, r, alpha)
                   for i, r in enumerate(ratios)],
    }
    if gate is not None:
        out["gate"] = gate
    return out


def _counts(results: list[SampleRetention]) -> dict:
    by_source: dict[str, int] = {}
    for r in results:
        by_source[r.source] = by_source.get(r.source, 0) + 1
    tokens = [r.num_tokens for r in results]
    return {"count": len(results), "by_source": by_source,
            "tokens_mean": round(float(np.mean(tokens)), 1) if tokens else 0,
            "tokens_min": int(min(tokens)) if tokens else 0, "tokens_max": int(max(tokens)) if tokens else 0}


def _describe(counts: dict) -> str:
    if not counts["count"]:
        return "none"
    parts = ", ".join(f"{k} {v}" for k, v in counts["by_source"].items())
    return (f"{counts['count']} samples ({parts}), {counts['tokens_min']}-{counts['tokens_max']} tokens "
            f"(mean {counts['tokens_mean']:.0f})")


def markdown(report: dict) -> str:
    """A short human-readable summary of ``report``."""
    m = report["meta"]
    lines = [f"# Regularity report: {m.get('model')} / {m.get('method')}", "",
             f"- Calibration: {_describe(report['samples']['calibration'])}.",
             f"- Held-out (disjoint material): {_describe(report['samples']['heldout'])}.",
             f"- alpha = {m.get('alpha')}, chunk size {m.get('chunk_size')}; the pilot keeps the full KV and "
             + ("records, per chunk, the global top ceil(rho*L*H*n) selection over every layer's heads "
                "(scope model: layers get different shares)." if m.get("scope") == "model" else
                "records, per chunk and layer, the global top ceil(rho*H*n) selection (paper Eq. 3)."),
             f"- Time: {m.get('seconds_calibration')} s for the calibration samples, "
             f"{m.get('seconds_total')} s in all (model load, held-out, report).", "",
             "| rho | sum_h b / (rho H) mean [min, max] | held-out coverage | mean overflow | "
             "Spearman layer means (cal vs held) | Spearman per held-out sample vs b | "
             "Spearman across sources | mu range across heads | mean sigma |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["ratios"]:
        h = r.get("heldout", {})
        sp, cov = r["spend"], h.get("coverage", {})
        lines.append(
            f"| {r['ratio']} | {sp['mean']} [{sp['min']}, {sp['max']}] | {cov.get('share_covered')} | "
            f"{cov.get('mean_overflow')} | {h.get('rank_layer_means', {}).get('mean')} | "
            f"{h.get('rank_per_sample_vs_budget', {}).get('mean')} | {r['across_sources']['mean']} | "
            f"{r['head_spread']['mean_layer_range_of_mu']} | {r['head_spread']['mean_sigma']} |")
    lines += ["", "Held-out coverage by source: " + "; ".join(
        f"rho {r['ratio']}: " + ", ".join(f"{s} {c['share_covered']}" for s, c in
                                          r.get("heldout", {}).get("coverage_by_source", {}).items())
        for r in report["ratios"]), "",
        "Pool memory / full KV (each group keeps its max budget beta in slots H_p heads wide: "
        "sum_g H_p beta / H):", ""]
    for r in report["ratios"]:
        cells = ", ".join(f"H_p={g['heads_per_group']}: budget-aware {g['budget_aware']} / adjacent "
                          f"{g['adjacent']}" for g in r["grouping"])
        lines.append(f"- rho {r['ratio']}: {cells}")
    lines += ["", "Columns: coverage = share of held-out (sample, layer, head) retentions <= the budget; "
              "overflow = mean of max(0, retention - b); Spearman values are per layer over its heads, "
              "averaged over layers (layer means: calibration mean vs held-out mean; per sample: each "
              "held-out sample vs b; across sources: between the per-source means of every pair of sources); "
              "mu range = mean over layers of max_h mu - min_h mu (how different heads are), against the "
              "mean per-head sigma (how much one head varies).",
              "", "All figures in report.json; per-head boxes in retention.png (like the paper's Figure 5)."]
    if "gate" in report:
        lines += gate_markdown(report["gate"])
    return "\n".join(lines) + "\n"


def gate_markdown(gate: dict) -> list[str]:
    """The FastKVzip gate section: training and held-out ranking against KVzip."""
    lines = ["", "## FastKVzip gate", ""]
    if gate.get("reused_from"):
        lines += [f"- Reused, not retrained: `{gate['reused_from']}` (its training report below).", ""]
    lines += [f"- File `{gate['file']}` (sha256 {gate['sha256'][:16]}...), {gate['train_rows_per_layer']} "
             f"training rows per layer (KVzip scores of the calibration samples), {gate['steps']} Adam steps "
             f"per layer; KVzip pass {gate['seconds_kvzip']} s, training {gate['seconds_training']} s.",
             f"- Final log-score MSE per layer: min {min(gate['final_log_mse'])}, max {max(gate['final_log_mse'])}."]
    held = gate.get("heldout")
    if held:
        lines += ["", f"Held-out ranking against KVzip ({held['samples']} samples, every (sample, layer, head), "
                  "sinks left out):", "",
                  "| measure | gate | random ranking |", "|---|---|---|",
                  f"| Spearman with KVzip, mean [min] | {held['spearman_mean']} [{held['spearman_min']}] | 0 |"]
        for r, v in held["topk_recall"].items():
            lines.append(f"| recall of KVzip's per-head top {r} per chunk | {v} | {held['random_recall'][r]} |")
    return lines


def write_report(folder: str, report: dict, cal: list[SampleRetention], held: list[SampleRetention],
                 budgets_by_ratio: dict[float, np.ndarray]) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(folder, "report.md"), "w") as f:
        f.write(markdown(report))
    try:
        from tangram_sglang.calibration.plot import retention_figure
    except ImportError:  # matplotlib is a dev extra
        print("calibrate: matplotlib not installed, retention.png skipped", file=sys.stderr)
        return
    ratio = min(budgets_by_ratio, key=lambda r: abs(r - 0.5))
    idx = list(budgets_by_ratio).index(ratio)
    retention_figure(os.path.join(folder, "retention.png"), stack(cal)[:, idx], [r.source for r in cal],
                     stack(held)[:, idx] if held else None, [r.source for r in held], budgets_by_ratio[ratio],
                     title=f"{report['meta'].get('model')} / {report['meta'].get('method')}, rho = {ratio}")
