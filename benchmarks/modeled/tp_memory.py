"""What tensor parallelism costs a profile in KV memory.

With TP = t a page table can only span one rank's KV heads (groups formed
within each shard), and every rank must need the same pages for every request
(ranks decide admission alone, on the same requests): each rank's group
budgets are raised to the same multiset (tangram_sglang/tensor_parallel.py).
For each reference profile, ratio, heads per group H_p and t, the KV slots
stored per token (summed over ranks), as a share of full KV (L x H slots):

- TP=1: the profile grouped over all heads of a layer at the same H_p;
- shard groups: groups within shards, each rank at its own budgets (what an
  unconstrained admission would need);
- busiest rank: t x the slots of the rank that needs most (what pools of equal
  size would hold if every rank tracked every rank's pages: the bound an
  admission that talks across ranks could reach);
- TP=t: shard groups with the equalized budgets (what is served).

Budgets are computed once per (model, scorer, ratio) from the reference
retention data; H_p is capped at the heads one rank holds.

    .venv/bin/python -m benchmarks.modeled.tp_memory   # -> benchmarks/results/modeled/tp_memory.{md,json}
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common.paths import result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.method.grouping import group_budgets, group_heads
from tangram_sglang.profile.reference_import import available, reference_profile
from tangram_sglang.profile.tensor_parallel import (
    equalized_betas,
    group_for_tp,
    heads_per_group_for,
    rank_view,
    regroup,
    shards,
)

MODELS = ("llama-3.1-8b-instruct", "qwen3-4b-instruct-2507")


def slots(budgets: np.ndarray, groups, hpg: int) -> float:
    """KV slots per token of a layer grid: every group stores H_p heads x beta."""
    return float(hpg * group_budgets(budgets, groups).sum())


def row(profile, entry, hpg: int, t: int) -> dict:
    L, H = profile.model.num_layers, profile.model.num_kv_heads
    hp = heads_per_group_for(H, t, hpg)
    full = float(L * H)
    tp1 = slots(entry.budgets, group_heads(entry.budgets, hp, profile.grouping), hp)
    shard_groups = group_for_tp(entry.budgets, hp, profile.grouping, t)
    own = slots(entry.budgets, shard_groups, hp)
    per_shard = [slots(entry.budgets, [[g for g in layer if g[0] in heads] for layer in shard_groups], hp)
                 for heads in shards(H, t)]
    grouped = regroup(profile, t).entries[profile.entries.index(entry)]
    replicas = max(1, t // H)  # t > H: each shard is held by t / H ranks
    served = float(sum(hp * b.sum() for b in equalized_betas(grouped.budgets, grouped.groups, H, t))) * replicas
    views = [rank_view(profile, t, r).entries[profile.entries.index(entry)] for r in range(t)]
    per_rank = {round(float(hp * v.group_budget.sum()), 9) for v in views}
    assert len(per_rank) == 1, "ranks must need the same slots"  # the invariant the design rests on
    return {"ratio": entry.ratio, "H_p": hp, "tp_size": t, "tp1": tp1 / full, "shard_groups": own * replicas / full,
            "busiest_rank": t * max(per_shard) / full,
            "served": served / full, "cost_vs_tp1": served / tp1 - 1}


def table(rows: list[dict]) -> list[str]:
    out = ["| model | scorer | ratio | H_p | TP | TP=1 slots | shard groups | busiest rank x TP | TP=t served | "
           "cost vs TP=1 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['scorer']} | {r['ratio']} | {r['H_p']} | {r['tp_size']} | "
                   f"{r['tp1']:.1%} | {r['shard_groups']:.1%} | {r['busiest_rank']:.1%} | {r['served']:.1%} | {r['cost_vs_tp1']:+.1%} |")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scorers", nargs="+", default=["snapkv", "fastkvzip"])
    ap.add_argument("--ratios", nargs="+", type=float, default=[0.25, 0.5])
    ap.add_argument("--heads-per-group", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--tp", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--out", default=result_path("modeled", "tp_memory"), help="writes OUT.md and OUT.json")
    args = ap.parse_args(argv)
    run_stamp = stamp(argv)
    rows = []
    for model in MODELS:
        for scorer in args.scorers:
            if (scorer, model) not in available():
                print(f"skip {scorer}/{model}: no reference data")
                continue
            for hpg in args.heads_per_group:
                prof = reference_profile(scorer, model, args.ratios, heads_per_group=hpg)
                for entry in prof.entries:
                    for t in args.tp:
                        if heads_per_group_for(prof.model.num_kv_heads, t, hpg) != hpg:
                            continue  # H_p larger than a rank's heads: that row is the smaller H_p's
                        rows.append({"model": model, "scorer": scorer, **row(prof, entry, hpg, t)})
    lines = ["KV slots stored per token, summed over all ranks, as a share of full KV (L x H). "
             "TP=1: groups over all heads of a layer; shard groups: within each rank's heads, each rank at its own "
             "budgets; TP=t served: shard groups with every rank's budgets raised to the same multiset, so "
             "ranks admit alike without talking (tangram_sglang/tensor_parallel.py).", "", *table(rows)]
    write_json(args.out + ".json", {"rows": rows}, run_stamp)
    print(write_markdown(args.out + ".md", "What tensor parallelism costs a profile in KV memory", lines, run_stamp))


if __name__ == "__main__":
    main()
