"""Write a uniform profile (every head keeps the same share) for an HF model folder.

    python -m tangram_sglang.profile.uniform --model-path M --ratio 1.0 -o p.yaml

Lets the whole pipeline run before any calibration exists; ratio 1.0 is
lossless and must serve the same tokens as stock SGLang.
"""

from __future__ import annotations

import argparse

import numpy as np

from tangram_sglang.attention.split_row import device_parallel_capacity
from tangram_sglang.method.grouping import STRATEGIES
from tangram_sglang.profile.builder import build_profile, make_entry, today, tool_version
from tangram_sglang.profile.format import CalibrationMeta, ModelShape, TangramProfile
from tangram_sglang.profile.validation import load_profile


def uniform_profile(shape: ModelShape, ratios: list[float], *, heads_per_group: int = 1,
                    grouping: str = "budget_aware", parallel_capacity: int | None = None) -> TangramProfile:
    capacity = parallel_capacity or device_parallel_capacity()
    lh = (shape.num_layers, shape.num_kv_heads)
    window = np.asarray(shape.windows)[:, None] > 0   # sliding-window layers keep every token
    entries = [
        make_entry(r, np.where(window, 1.0, np.full(lh, r)), np.where(window, 1.0, np.full(lh, r)),
                   np.zeros(lh), heads_per_group=heads_per_group, grouping=grouping, parallel_capacity=capacity)
        for r in ratios
    ]
    meta = CalibrationMeta(method="uniform", target_ratios=tuple(ratios), alpha=0.0, num_samples=0,
                           date=today(), tool_version=tool_version(), note="uniform: no calibration")
    return build_profile(shape, meta, entries, heads_per_group=heads_per_group, grouping=grouping,
                         parallel_capacity=capacity)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-path", required=True, help="HF model folder (reads config.json)")
    ap.add_argument("--ratio", type=float, action="append", help="share of tokens kept, (0, 1]; repeatable")
    ap.add_argument("--heads-per-group", type=int, default=1)
    ap.add_argument("--grouping", choices=STRATEGIES, default="budget_aware")
    ap.add_argument("--parallel-capacity", type=int, default=None, help="CTAs for the split map")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    shape = ModelShape.from_model_path(args.model_path)
    profile = uniform_profile(shape, args.ratio or [1.0], heads_per_group=args.heads_per_group,
                              grouping=args.grouping, parallel_capacity=args.parallel_capacity)
    profile.save(args.output)
    load_profile(args.output)  # what we write must read back
    print(f"wrote {args.output}: {shape.architecture} L={shape.num_layers} H={shape.num_kv_heads} "
          f"ratios={list(profile.ratios)}")


if __name__ == "__main__":
    main()
