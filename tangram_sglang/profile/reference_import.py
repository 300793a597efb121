"""Import the authors' large-model retention measurements as Tangram profiles.

The files (shared/data/reference-profiles/<scorer>/<model>/profile_perlayer.npz)
hold raw_ratio [n_ratios, n_samples, L, H]: the retained share of every head
per pilot sample, measured at target 0.3 with a 4K recent window kept outside
the measured budget (so their means sit well below 0.3). For questions of
shape (spread across heads, grouping, load balance) we rescale each layer so
its mean retention equals the requested target ratio, then apply
b = min(1, mu + alpha * sigma) like our own calibration.

    python -m tangram_sglang.profile.reference_import --scorer snapkv --model llama-3.1-8b-instruct \
        --ratio 0.25 -o /tmp/llama.yaml
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from tangram_sglang.method.budgets import MIN_BUDGET, budgets_from_stats
from tangram_sglang.method.split_map import DEFAULT_PARALLEL_CAPACITY
from tangram_sglang.profile.builder import build_profile, make_entry, today, tool_version
from tangram_sglang.profile.format import CalibrationMeta, ModelShape, TangramProfile
from tangram_sglang.profile.tensor_parallel import regroup

# The served shape of each reference model (HF config values). Hybrid models
# list only their full-attention layers in the files: num_layers below is the
# number of rows, the note names the model layers they are.
REFERENCE_MODELS = {
    "llama-3.1-8b-instruct": ("LlamaForCausalLM", 128),
    "qwen3-4b-instruct-2507": ("Qwen3ForCausalLM", 128),
    "gemma-3-12b-it": ("Gemma3ForConditionalGeneration", 256),
    "gpt-oss-20b": ("GptOssForCausalLM", 64),
    "qwen3-30b-a3b-instruct-2507": ("Qwen3MoeForCausalLM", 128),
}
SCORERS = ("snapkv", "keydiff", "ea", "fastkvzip")


def default_root() -> str:
    """shared/data/reference-profiles beside the repo checkout (override: TANGRAM_REFERENCE_DIR)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # profile/ -> package -> repo
    return os.environ.get(
        "TANGRAM_REFERENCE_DIR", os.path.join(os.path.dirname(repo), "shared", "data", "reference-profiles")
    )


def available(root: str | None = None) -> list[tuple[str, str]]:
    """(scorer, model) pairs present under root."""
    root = root or default_root()
    return [(s, m) for s in SCORERS for m in REFERENCE_MODELS
            if os.path.isfile(os.path.join(root, s, m, "profile_perlayer.npz"))]


def load_retention(scorer: str, model: str, root: str | None = None) -> tuple[np.ndarray, dict]:
    """Per-sample retention float64 [n_samples, L, H] and the file's metadata."""
    if scorer not in SCORERS:
        raise ValueError(f"unknown reference scorer {scorer!r}; expected one of {SCORERS}")
    if model not in REFERENCE_MODELS:
        raise ValueError(f"unknown reference model {model!r}; expected one of {sorted(REFERENCE_MODELS)}")
    path = os.path.join(root or default_root(), scorer, model, "profile_perlayer.npz")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no reference retention file at {path}")
    data = np.load(path)
    meta = json.loads(bytes(data["meta"]).decode())
    return np.asarray(data["raw_ratio"][0], dtype=np.float64), meta


def rescale_to_target(raw: np.ndarray, ratio: float) -> np.ndarray:
    """Scale each layer so its mean retention over samples and heads is ``ratio``.

    raw: [S, L, H] in [0, 1]. Values are clipped to 1 after scaling, so a layer
    whose heads saturate ends slightly below the target.
    """
    layer_mean = raw.mean(axis=(0, 2), keepdims=True)
    scale = np.where(layer_mean > 0, ratio / np.where(layer_mean > 0, layer_mean, 1.0), 1.0)
    return np.clip(raw * scale, 0.0, 1.0)


def reference_profile(scorer: str, model: str, ratios: list[float], *, alpha: float = 2.0,
                      heads_per_group: int = 4, grouping: str = "budget_aware",
                      parallel_capacity: int = DEFAULT_PARALLEL_CAPACITY,
                      root: str | None = None, tp_size: int = 1) -> TangramProfile:
    raw, meta = load_retention(scorer, model, root)
    arch, head_dim = REFERENCE_MODELS[model]
    shape = ModelShape(architecture=arch, num_layers=raw.shape[1], num_kv_heads=raw.shape[2], head_dim=head_dim)
    entries = []
    for r in ratios:
        scaled = rescale_to_target(raw, r)
        mean, std = scaled.mean(axis=0), scaled.std(axis=0)
        entries.append(make_entry(r, budgets_from_stats(mean, std, alpha), mean, std,
                                  heads_per_group=heads_per_group, grouping=grouping,
                                  parallel_capacity=parallel_capacity))
    note = (f"imported from reference-profiles/{scorer}/{model} (aiha-lab/tangram cluster_maps, Apache-2.0); "
            f"measured at base ratio {meta.get('base_ratios')} with a {meta.get('window_size')}-token window "
            f"outside the budget, rescaled per layer to each target; layers {meta.get('static_layer_ids')}; "
            f"budgets floored at {MIN_BUDGET}")
    calib = CalibrationMeta(method=str(meta.get("scorer", scorer)), target_ratios=tuple(ratios), alpha=alpha,
                            num_samples=int(raw.shape[0]), sources=tuple(meta.get("sample_sources", ())),
                            chunk_size=int(meta.get("prefill_chunk", 0)), date=today(),
                            tool_version=tool_version(), note=note)
    profile = build_profile(shape, calib, entries, heads_per_group=heads_per_group, grouping=grouping,
                            parallel_capacity=parallel_capacity)
    return regroup(profile, tp_size) if tp_size != 1 else profile


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Import a reference retention file as a Tangram profile")
    ap.add_argument("--scorer", choices=SCORERS, required=True)
    ap.add_argument("--model", choices=sorted(REFERENCE_MODELS), required=True)
    ap.add_argument("--ratio", type=float, action="append")
    ap.add_argument("--alpha", type=float, default=2.0)
    ap.add_argument("--heads-per-group", type=int, default=4)
    ap.add_argument("--grouping", default="budget_aware")
    ap.add_argument("--parallel-capacity", type=int, default=DEFAULT_PARALLEL_CAPACITY)
    ap.add_argument("--root", default=None)
    ap.add_argument("--tp-size", type=int, default=1, help="group within each of this many TP ranks' KV heads")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    prof = reference_profile(args.scorer, args.model, args.ratio or [0.25], alpha=args.alpha,
                             heads_per_group=args.heads_per_group, grouping=args.grouping,
                             parallel_capacity=args.parallel_capacity, root=args.root, tp_size=args.tp_size)
    prof.save(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
