"""Calibrate per-head budgets on a Hugging Face model and write a Tangram profile.

    python -m tangram_sglang.calibrate --model-path M --method snapkv \\
        --ratio 0.7 --ratio 0.5 --ratio 0.25 --samples 50 --alpha 2 --heads-per-group 1 -o p.yaml

Runs the pilot (calibration/pilot.py) on ``--samples`` samples and
``--heldout`` more from disjoint material, writes the profile (budgets
b = min(1, mu + alpha sigma), groups, split map, statistics) and beside it
``<profile stem>.report/`` with report.md, report.json and retention.png.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tangram_sglang.attention.split_row import device_parallel_capacity
from tangram_sglang.calibration.gate_calibration import calibrate_gates, reuse_gates
from tangram_sglang.calibration.kvzip_teacher import kvzip_pilot, repeat_prefix_ids
from tangram_sglang.calibration.pilot import PilotConfig, load_model, run_pilot
from tangram_sglang.calibration.report import regularity_report, write_report
from tangram_sglang.calibration.samples import SOURCES, SampleSpec, build_samples
from tangram_sglang.calibration.stats import ratio_stats
from tangram_sglang.method.budgets import MIN_BUDGET, SCOPES
from tangram_sglang.method.grouping import STRATEGIES
from tangram_sglang.profile import CalibrationMeta, ModelShape
from tangram_sglang.profile.builder import build_profile, make_entry, today, tool_version
from tangram_sglang.profile.tensor_parallel import check_tp_size, regroup
from tangram_sglang.scorers import canonical_name, get_scorer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tangram_sglang.calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("--model-path", required=True, help="Hugging Face model folder")
    ap.add_argument("--method", required=True,
                    help="scorer: snapkv, expected_attention, keydiff, ..., kvzip (context reconstruction), "
                         "or fastkvzip (trains gates that predict KVzip)")
    ap.add_argument("--ratio", type=float, action="append", required=True, help="target ratio; repeatable")
    ap.add_argument("--default-ratio", type=float, default=None,
                    help="ratio served by default (default: the first --ratio)")
    ap.add_argument("--samples", type=int, default=50, help="calibration samples")
    ap.add_argument("--heldout", type=int, default=30, help="held-out samples for the report (0: none)")
    ap.add_argument("--alpha", type=float, default=2.0, help="safety margin: b = min(1, mu + alpha sigma)")
    ap.add_argument("--heads-per-group", type=int, default=1)
    ap.add_argument("--grouping", choices=STRATEGIES, default="budget_aware")
    ap.add_argument("--parallel-capacity", type=int, default=None,
                    help="CTAs for the split map (default: from the GPU, else a configured default)")
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--min-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--sources", default=",".join(SOURCES), help="comma list of " + ", ".join(SOURCES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gate-steps", type=int, default=300, help="fastkvzip: Adam steps per layer's gate")
    ap.add_argument("--gate", default=None, help="fastkvzip: a gate file trained before (copied beside the "
                    "profile) instead of training one")
    ap.add_argument("--tp-size", type=int, default=1,
                    help="group heads within each of this many tensor-parallel ranks (the server's --tp-size)")
    ap.add_argument("--scope", choices=SCOPES, default="layer",
                    help="what the pilot's global top-k spans: one layer (paper Eq. 3) or all layers (as KVzip; "
                    "budgets then differ across layers too)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("-o", "--output", required=True, help="profile path (.yaml)")
    args = ap.parse_args(argv)
    args.method = canonical_name(args.method)
    if args.alpha < 0:
        raise ValueError(f"--alpha must be >= 0, got {args.alpha}")
    if args.default_ratio is not None and args.default_ratio not in args.ratio:
        raise ValueError(f"--default-ratio {args.default_ratio} is not one of the --ratio values {args.ratio}")
    if args.heldout < 0:
        raise ValueError(f"--heldout must be >= 0, got {args.heldout}")
    if args.gate and args.method != "fastkvzip":
        raise ValueError(f"--gate is for --method fastkvzip, not {args.method}")
    return args


def report_dir(output: str) -> str:
    return os.path.splitext(output)[0] + ".report"


def calibrate(args: argparse.Namespace) -> dict:
    """Run everything; returns the report dict."""
    t0 = time.perf_counter()
    shape = ModelShape.from_model_path(args.model_path)
    check_tp_size(shape.num_kv_heads, args.tp_size)  # before hours of calibration, not after
    if not 1 <= args.heads_per_group <= shape.num_kv_heads:
        raise ValueError(f"--heads-per-group must be in [1, {shape.num_kv_heads}], got {args.heads_per_group}")
    ratios = tuple(dict.fromkeys(args.ratio))
    cfg = PilotConfig(ratios=ratios, chunk_size=args.chunk_size, scope=args.scope)
    sources = tuple(s for s in args.sources.split(",") if s)
    spec = SampleSpec(count=args.samples, min_tokens=args.min_tokens, max_tokens=args.max_tokens,
                      sources=sources, seed=args.seed)
    model, tok = load_model(args.model_path)
    cal_samples = build_samples(tok, spec, "calibration")
    held_samples = []
    if args.heldout:
        held_spec = SampleSpec(count=args.heldout, min_tokens=args.min_tokens, max_tokens=args.max_tokens,
                               sources=sources, seed=args.seed)
        held_samples = build_samples(tok, held_spec, "heldout")
    t1 = time.perf_counter()
    gate = None
    if args.method == "fastkvzip" and args.gate:
        gate = reuse_gates(model, args.gate, profile_path=args.output)
    elif args.method == "fastkvzip":
        gate = calibrate_gates(model, tok, cal_samples, held_samples, profile_path=args.output,
                               chunk_size=args.chunk_size, ratios=ratios, steps=args.gate_steps, seed=args.seed,
                               progress=not args.no_progress)
    scorer_args = {}
    if args.method == "kvzip":  # scores need a reconstruction pass: the pilot is kvzip_sample's
        scorer_args = {"prefix_ids": repeat_prefix_ids(tok)}
        cal = kvzip_pilot(model, tok, cal_samples, cfg, "calibration", not args.no_progress)
        t_cal = time.perf_counter() - t1
        held = kvzip_pilot(model, tok, held_samples, cfg, "held-out", not args.no_progress)
    else:
        scorer = gate.scorer if gate else get_scorer(args.method)
        cal = run_pilot(model, cal_samples, scorer, cfg, "calibration", not args.no_progress)
        t_cal = time.perf_counter() - t1
        held = run_pilot(model, held_samples, scorer, cfg, "held-out", not args.no_progress) if held_samples else []
    capacity = args.parallel_capacity or device_parallel_capacity()
    stats = [ratio_stats([r.retention[i] for r in cal], ratio, args.alpha) for i, ratio in enumerate(ratios)]
    window_layers = list(shape.window_layers)
    for s in stats:  # sliding-window layers keep every token (the pilot counts them so; KVzip's pass scores all)
        s.budgets[window_layers] = 1.0
    entries = [make_entry(s.ratio, s.budgets, s.mean, s.std, heads_per_group=args.heads_per_group,
                          grouping=args.grouping, parallel_capacity=capacity) for s in stats]
    note = (f"pilot on {os.path.basename(os.path.normpath(args.model_path))}, float32 CPU, full KV kept, "
            f"implicit retention of the global top ceil(rho*{'L*' if args.scope == 'model' else ''}H*n) per chunk; "
            f"samples "
            f"{args.min_tokens}-{args.max_tokens} tokens, seed {args.seed}; budgets floored at {MIN_BUDGET}")
    meta = CalibrationMeta(method=args.method, target_ratios=ratios, alpha=args.alpha, num_samples=len(cal),
                           sources=sources, chunk_size=args.chunk_size, date=today(), tool_version=tool_version(),
                           note=note, weights=gate.weights if gate else "", weights_sha256=gate.sha256 if gate else "",
                           scorer_args=scorer_args, scope=args.scope)
    profile = build_profile(shape, meta, entries, heads_per_group=args.heads_per_group, grouping=args.grouping,
                            parallel_capacity=capacity, default_ratio=args.default_ratio)
    if args.tp_size != 1:
        profile = regroup(profile, args.tp_size)
    profile.save(args.output)
    report = regularity_report(cal, held, ratios, args.alpha, {
        "model": os.path.basename(os.path.normpath(args.model_path)), "method": args.method, "alpha": args.alpha,
        "chunk_size": args.chunk_size, "scope": args.scope, "heads_per_group": args.heads_per_group, "profile": args.output,
        "seconds_calibration": round(t_cal, 1), "seconds_total": round(time.perf_counter() - t0, 1)},
        gate=gate.report if gate else None)
    write_report(report_dir(args.output), report, cal, held, {s.ratio: s.budgets for s in stats})
    return report


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        args = parse_args(argv)
        report = calibrate(args)
    except ValueError as exc:
        print(f"calibrate: error: {exc}", file=sys.stderr)
        return 2
    for r in report["ratios"]:
        cov = r.get("heldout", {}).get("coverage", {}).get("share_covered")
        print(f"rho {r['ratio']}: sum_h b / (rho H) = {r['spend']['mean']}, held-out coverage {cov}")
    print(f"wrote {args.output} and {report_dir(args.output)}/ in {report['meta']['seconds_total']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
