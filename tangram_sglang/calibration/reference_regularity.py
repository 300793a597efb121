"""The regularity figures on the authors' large-model retention files.

For every (scorer, model) in shared/data/reference-profiles: 2-fold split of
the pilot samples (even / odd within each source), budgets b = min(1, mu +
alpha sigma) from one half, tested on the other, both ways, averaged:
per-layer Spearman of per-head means, per held-out sample Spearman against
the budgets, coverage of held-out retentions; plus the per-layer Spearman
between the two SCBench sources of the files (kv vs many-shot). Raw retention
is used (the files' recent window sits outside the measured budget), so
coverage and ranks are as measured; only the sum-vs-target spend is skipped.

    python -m tangram_sglang.calibration.reference_regularity -o configs/reference-regularity
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from tangram_sglang.calibration.stats import across_sources, coverage, layer_spearman, per_sample_spearman, ratio_stats
from tangram_sglang.profile.reference_import import available, load_retention


def sample_sources(meta: dict, count: int) -> list[str]:
    """Per-sample source names from the file's dataset_mix ("name:count,..."), in order."""
    names: list[str] = []
    for part in str(meta.get("dataset_mix", "")).split(","):
        if ":" in part:
            name, n = part.rsplit(":", 1)
            names += [name.replace("scbench_", "")] * int(n)
    return names if len(names) == count else ["all"] * count


def two_fold(raw: np.ndarray, sources: list[str], alpha: float) -> dict:
    """Figures averaged over the two halves. raw: [S, L, H]."""
    src = np.asarray(sources)
    half = np.zeros(len(src), dtype=int)
    for s in set(sources):
        idx = np.flatnonzero(src == s)
        half[idx[1::2]] = 1
    folds = []
    for h in (0, 1):
        cal, held = raw[half == h], raw[half != h]
        st = ratio_stats(cal, 0.3, alpha)
        folds.append({"rank_layer_means": layer_spearman(st.mean, held.mean(axis=0))["mean"],
                      "rank_per_sample": per_sample_spearman(held, st.budgets)["mean"],
                      "coverage": coverage(held, st.budgets)["share_covered"],
                      "mean_overflow": coverage(held, st.budgets)["mean_overflow"]})
    out = {k: round(float(np.mean([f[k] for f in folds])), 4) for k in folds[0]}
    out["across_sources"] = across_sources(raw, sources)["mean"]
    out["samples"] = int(raw.shape[0])
    out["shape"] = list(raw.shape[1:])
    return out


def reference_regularity(alpha: float = 2.0, root: str | None = None) -> dict:
    results = {}
    for scorer, model in available(root):
        raw, meta = load_retention(scorer, model, root)
        results[f"{scorer}/{model}"] = two_fold(raw, sample_sources(meta, raw.shape[0]), alpha)
    return {"alpha": alpha, "results": results}


def markdown(rep: dict) -> str:
    lines = ["# Regularity on the authors' large-model retention files", "",
             "2-fold (even/odd samples per source) budgets mu + alpha sigma, alpha = "
             f"{rep['alpha']}, tested on the other half; raw retention at target 0.3.", "",
             "| scorer/model | L x H | samples | Spearman layer means | Spearman per held-out sample | "
             "held-out coverage | mean overflow | Spearman across sources |", "|---|---|---|---|---|---|---|---|"]
    for key, r in rep["results"].items():
        lines.append(f"| {key} | {r['shape'][0]} x {r['shape'][1]} | {r['samples']} | {r['rank_layer_means']} | "
                     f"{r['rank_per_sample']} | {r['coverage']} | {r['mean_overflow']} | {r['across_sources']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--alpha", type=float, default=2.0)
    ap.add_argument("--root", default=None)
    ap.add_argument("-o", "--output", required=True, help="path stem: writes .md and .json")
    args = ap.parse_args(argv)
    rep = reference_regularity(args.alpha, args.root)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output + ".json", "w") as f:
        json.dump(rep, f, indent=1)
    with open(args.output + ".md", "w") as f:
        f.write(markdown(rep))
    print(markdown(rep))


if __name__ == "__main__":
    main()
