"""Decode-attention load balance: uniform splits vs per-step planning vs the AOT split map.

For every profile (SmolLM2 from our calibration, the large models from the
reference retention data) and one decode step of B requests of context N, the
per-CTA work of each layer is computed under three strategies. A CTA works on
one piece of one (request, group); its work is (heads in the group) x (slots
in the piece), each head of group g holding k_g(N) = ceil(beta_g N) slots.

- uniform: FlashDecoding, the same num_splits U for every group, chosen by
  FlashAttention-2's num_splits heuristic from B x G and the CTA capacity;
- planned: FlashInfer-style, every step and layer a binary search for the
  smallest chunk size that fits the pieces into the CTA capacity (work
  equalized; its cost is the planning work);
- aot: the profile's split map S[l][g] (Algorithm 1, group weight Phi = sum of
  its heads' budgets), no planning;
- aot_beta: Algorithm 1 with the weight of the work actually stored,
  Phi = |g| * beta_g (every head of a group keeps the group's count).

Reported per strategy: max/mean CTA work (the straggler factor, mean over
layers and worst layer), the modeled attention latency (CTAs scheduled in
launch order on N_CTA slots, sum over layers of the makespan, divided by the
perfectly balanced total / N_CTA), and the planning work per step.

    .venv/bin/python -m benchmarks.modeled.load_balance --profile configs/smollm2-snapkv.yaml --batch 1 --batch 16
    # writes benchmarks/results/modeled/load_balance.{json,md}
"""

from __future__ import annotations

import argparse
import heapq
import os
import time

import numpy as np

from benchmarks.common.paths import result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.attention.baselines import fa2_num_splits, planned_chunk
from tangram_sglang.method.budgets import keep_count
from tangram_sglang.method.split_map import DEFAULT_PARALLEL_CAPACITY, compute_split_map, profile_split_map
from tangram_sglang.profile import load_profile
from tangram_sglang.profile.reference_import import available, reference_profile


def pieces_work(lens: np.ndarray, sizes: np.ndarray, splits: np.ndarray) -> np.ndarray:
    """Work of every CTA when (b, g) is cut into splits[g] pieces of ceil(len / S) slots.

    lens int [B, G]; sizes int [G] heads per group; splits int [G] or [B, G]. Empty pieces
    are CTAs too (they launch and find nothing).
    """
    s = np.broadcast_to(splits, lens.shape)
    piece = -(-lens // s)
    out = []
    for (b, g), n in np.ndenumerate(lens):
        starts = np.arange(s[b, g]) * piece[b, g]
        out.append(np.clip(n - starts, 0, piece[b, g]) * sizes[g])
    return np.concatenate(out)


def makespan(work: np.ndarray, capacity: int) -> float:
    """CTAs start in launch order on the first free of ``capacity`` slots."""
    slots = [0.0] * min(capacity, len(work))
    heapq.heapify(slots)
    for w in work:
        heapq.heappush(slots, heapq.heappop(slots) + float(w))
    return max(slots)


def layer_lens(beta: np.ndarray, contexts: np.ndarray) -> np.ndarray:
    """k_g(N_b) for each request and group: int [B, G]."""
    return keep_count(beta[None, :], contexts[:, None]).astype(np.int64)


def evaluate(entry, contexts: np.ndarray, capacity: int) -> dict:
    """Per-strategy straggler factor, modeled latency and planning work for one step."""
    names = ("uniform", "planned", "aot", "aot_beta")
    stats = {k: {"ratio": [], "span": 0.0, "ideal": 0.0, "ctas": 0} for k in names}
    split_map = compute_split_map(entry.budgets, entry.groups, capacity)
    split_beta = profile_split_map(entry.budgets, entry.groups, capacity)
    evals, plan_s = 0, 0.0
    for layer, groups in enumerate(entry.groups):
        sizes = np.array([len(g) for g in groups])
        lens = layer_lens(entry.group_budget[layer], contexts)
        total = float((lens * sizes).sum())
        u = fa2_num_splits(lens.size, capacity, int(-(-contexts.max() // 256)))
        t0 = time.perf_counter()
        chunk, e = planned_chunk(lens, capacity)
        plan_s += time.perf_counter() - t0
        evals += e
        works = {"uniform": pieces_work(lens, sizes, np.full(len(groups), u)),
                 "planned": pieces_work(lens, sizes, np.maximum(1, -(-lens // chunk))),
                 "aot": pieces_work(lens, sizes, split_map[layer]),
                 "aot_beta": pieces_work(lens, sizes, split_beta[layer])}
        for k, w in works.items():
            nz = w[w > 0]
            stats[k]["ratio"].append(float(nz.max() / nz.mean()))
            stats[k]["span"] += makespan(w, capacity)
            stats[k]["ideal"] += total / capacity
            stats[k]["ctas"] += len(w)
    out = {}
    for k, s in stats.items():
        out[k] = {"max_over_mean": float(np.mean(s["ratio"])), "worst_layer": float(np.max(s["ratio"])),
                  "latency_vs_balanced": s["span"] / s["ideal"], "ctas_per_layer": s["ctas"] / len(entry.groups)}
    out["planned"]["planning_evals_per_step"] = evals
    out["planned"]["planning_us_per_step_numpy"] = plan_s * 1e6
    out["aot"]["planning_evals_per_step"] = out["aot_beta"]["planning_evals_per_step"] = 0
    return out


def profiles(args) -> list[tuple[str, object]]:
    out = [(f"{os.path.basename(p)}", load_profile(p)) for p in args.profile]
    for scorer, model in available():
        if scorer in args.scorers:
            out.append((f"{scorer}/{model}", reference_profile(scorer, model, args.ratio,
                                                                heads_per_group=args.heads_per_group,
                                                                parallel_capacity=args.capacity)))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", action="append", default=[], help="profile yaml (e.g. SmolLM2's)")
    ap.add_argument("--scorers", default="snapkv,fastkvzip", help="reference scorers to include")
    ap.add_argument("--ratio", type=float, action="append", help="ratios of the reference profiles")
    ap.add_argument("--heads-per-group", type=int, default=4)
    ap.add_argument("--capacity", type=int, default=DEFAULT_PARALLEL_CAPACITY, help="N_CTA")
    ap.add_argument("--batch", type=int, action="append", help="requests per step")
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--out", default=result_path("modeled", "load_balance"), help="writes OUT.json and OUT.md")
    ap.add_argument("--no-write", action="store_true", help="print the rows only")
    args = ap.parse_args(argv)
    run_stamp = stamp(argv)
    args.ratio = args.ratio or [0.25, 0.5]
    args.scorers = args.scorers.split(",")
    rng = np.random.default_rng(0)
    rows = []
    for name, prof in profiles(args):
        for entry in prof.entries:
            for batch in args.batch or [1, 16]:
                for mix in ("same", "mixed") if batch > 1 else ("same",):
                    ctx = np.full(batch, args.context) if mix == "same" else rng.integers(
                        args.context // 4, args.context + 1, size=batch)
                    res = evaluate(entry, ctx, args.capacity)
                    rows.append({"profile": name, "ratio": entry.ratio, "batch": batch, "contexts": mix,
                                 "groups": entry.num_groups, **{k: v for k, v in res.items()}})
                    print(_line(rows[-1]), flush=True)
    if not args.no_write:
        meta = {"capacity": args.capacity, "context": args.context, "heads_per_group_reference": args.heads_per_group}
        write_json(args.out + ".json", {"meta": meta, "rows": rows}, run_stamp)
        write_markdown(args.out + ".md", f"Decode load balance (N_CTA = {meta['capacity']}, context {meta['context']})",
                       _markdown(rows, meta), run_stamp)


def _line(r) -> str:
    f = lambda k: f"{r[k]['max_over_mean']:.2f}/{r[k]['latency_vs_balanced']:.2f}"  # noqa: E731
    return (f"{r['profile']:<40} r={r['ratio']:<5} B={r['batch']:<3} {r['contexts']:<6} "
            f"uniform {f('uniform')}  planned {f('planned')}  aot {f('aot')}  aot_beta {f('aot_beta')}")


def _markdown(rows, meta) -> list[str]:
    head = ("| profile | ratio | B | contexts | G | uniform max/mean | planned max/mean | AOT max/mean "
            "| AOT-beta max/mean | uniform latency | planned latency | AOT latency | AOT-beta latency "
            "| planning evals/step | planning us/step |\n" + "|---" * 15 + "|\n")
    body = "".join(
        f"| {r['profile']} | {r['ratio']} | {r['batch']} | {r['contexts']} | {r['groups']} "
        f"| {r['uniform']['max_over_mean']:.2f} | {r['planned']['max_over_mean']:.2f} | {r['aot']['max_over_mean']:.2f} "
        f"| {r['aot_beta']['max_over_mean']:.2f} "
        f"| {r['uniform']['latency_vs_balanced']:.2f} | {r['planned']['latency_vs_balanced']:.2f} "
        f"| {r['aot']['latency_vs_balanced']:.2f} | {r['aot_beta']['latency_vs_balanced']:.2f} "
        f"| {r['planned']['planning_evals_per_step']} "
        f"| {r['planned']['planning_us_per_step_numpy']:.0f} |\n" for r in rows)
    return ["max/mean: CTA work straggler factor (mean over layers); latency: modeled attention time "
            "(launch-order scheduling on N_CTA slots, summed over layers) over the perfectly balanced time; "
            "planning: per decode step, all layers (AOT: 0).", "", head + body]


if __name__ == "__main__":
    main()
