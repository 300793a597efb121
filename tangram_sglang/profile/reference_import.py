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

With ``--config`` (a model's config.json; configs/models/ holds the paper's five) the profile has
the served model's shape: a hybrid file's rows are placed at its full-attention layers
(``static_layer_ids``), every other layer must be a sliding-window layer of the config and keeps
every token, and a file measured on one of t tensor-parallel ranks (``tensor_parallel_size``)
stands for every rank's heads.
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
# What configs/reference/ ships (--all): the paper's four models with SnapKV (the one scorer measured on
# all four) and Qwen3-30B-A3B with Expected Attention (its only file), at 0.5 and 0.25, in groups of 4 heads.
SHIPPED = (("llama-3.1-8b-instruct", "snapkv"), ("qwen3-4b-instruct-2507", "snapkv"), ("gemma-3-12b-it", "snapkv"),
           ("gpt-oss-20b", "snapkv"), ("qwen3-30b-a3b-instruct-2507", "ea"))
SHIPPED_RATIOS = (0.5, 0.25)


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


def served_retention(scaled: np.ndarray, meta: dict, shape: ModelShape) -> np.ndarray:
    """[S, rows, h] of a file -> [S, L, H] of the served model (see the module docstring)."""
    rows = [int(i) for i in meta.get("static_layer_ids") or range(scaled.shape[1])]
    others = sorted(set(range(shape.num_layers)) - set(rows))
    if len(rows) != scaled.shape[1] or others != sorted(shape.window_layers):
        raise ValueError(f"the file's {scaled.shape[1]} rows are layers {rows}; the config's window layers are "
                         f"{list(shape.window_layers)}, the rest of its {shape.num_layers} layers must be the rows")
    tp = shape.num_kv_heads // scaled.shape[2]
    if scaled.shape[2] * tp != shape.num_kv_heads or tp != int(meta.get("tensor_parallel_size") or 1):
        raise ValueError(f"the file holds {scaled.shape[2]} KV heads (tensor_parallel_size "
                         f"{meta.get('tensor_parallel_size', 1)}); the config has {shape.num_kv_heads}")
    out = np.ones((scaled.shape[0], shape.num_layers, shape.num_kv_heads))
    out[:, rows] = np.tile(scaled, (1, 1, tp))
    return out


def reference_profile(scorer: str, model: str, ratios: list[float], *, alpha: float = 2.0,
                      heads_per_group: int = 4, grouping: str = "budget_aware",
                      parallel_capacity: int = DEFAULT_PARALLEL_CAPACITY,
                      root: str | None = None, tp_size: int = 1, config: dict | None = None) -> TangramProfile:
    """config: the model's config.json (a dict): the profile then has the served shape."""
    raw, meta = load_retention(scorer, model, root)
    arch, head_dim = REFERENCE_MODELS[model]
    shape = ModelShape(architecture=arch, num_layers=raw.shape[1], num_kv_heads=raw.shape[2], head_dim=head_dim)
    if config is not None:
        shape = ModelShape.from_hf_config(config)
    entries = []
    for r in ratios:
        scaled = rescale_to_target(raw, r)
        if config is not None:
            scaled = served_retention(scaled, meta, shape)
        mean, std = scaled.mean(axis=0), scaled.std(axis=0)
        entries.append(make_entry(r, budgets_from_stats(mean, std, alpha), mean, std,
                                  heads_per_group=heads_per_group, grouping=grouping,
                                  parallel_capacity=parallel_capacity))
    note = (f"imported from reference-profiles/{scorer}/{model} (aiha-lab/tangram cluster_maps, Apache-2.0); "
            f"measured at base ratio {meta.get('base_ratios')} with a {meta.get('window_size')}-token window "
            f"outside the budget, rescaled per layer to each target; layers {meta.get('static_layer_ids')}; "
            f"budgets floored at {MIN_BUDGET}"
            + ("; one TP rank's heads measured, every rank given them"
               if config is not None and meta.get("tensor_parallel_size", 1) != 1 else ""))
    calib = CalibrationMeta(method=str(meta.get("scorer", scorer)), target_ratios=tuple(ratios), alpha=alpha,
                            num_samples=int(raw.shape[0]), sources=tuple(meta.get("sample_sources", ())),
                            chunk_size=int(meta.get("prefill_chunk", 0)), date=today(),
                            tool_version=tool_version(), note=note)
    profile = build_profile(shape, calib, entries, heads_per_group=heads_per_group, grouping=grouping,
                            parallel_capacity=parallel_capacity)
    return regroup(profile, tp_size) if tp_size != 1 else profile


def model_config(model: str) -> dict:
    """configs/models/<model>/config.json of the repo (the reference model's HF config, no weights)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "configs", "models", model, "config.json")) as f:
        return json.load(f)


def write_shipped(out_dir: str, root: str | None = None) -> list[str]:
    """Write SHIPPED as <out_dir>/<model>-<scorer>.yaml, each checked against its config; returns the paths."""
    from tangram_sglang.profile.validation import load_profile

    paths = []
    for model, scorer in SHIPPED:
        config = model_config(model)
        path = os.path.join(out_dir, f"{model}-{scorer}.yaml")
        reference_profile(scorer, model, list(SHIPPED_RATIOS), root=root, config=config).save(path)
        load_profile(path).check_model(ModelShape.from_hf_config(config))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Import a reference retention file as a Tangram profile")
    ap.add_argument("--all", metavar="DIR", help="write the shipped profiles (SHIPPED) into DIR and exit")
    ap.add_argument("--scorer", choices=SCORERS)
    ap.add_argument("--model", choices=sorted(REFERENCE_MODELS))
    ap.add_argument("--ratio", type=float, action="append")
    ap.add_argument("--alpha", type=float, default=2.0)
    ap.add_argument("--heads-per-group", type=int, default=4)
    ap.add_argument("--grouping", default="budget_aware")
    ap.add_argument("--parallel-capacity", type=int, default=DEFAULT_PARALLEL_CAPACITY)
    ap.add_argument("--root", default=None)
    ap.add_argument("--tp-size", type=int, default=1, help="group within each of this many TP ranks' KV heads")
    ap.add_argument("--config", help="the model's config.json: the profile gets the served model's shape")
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    if args.all:
        for path in write_shipped(args.all, args.root):
            print(f"wrote {path}")
        return
    if not (args.scorer and args.model and args.output):
        ap.error("--scorer, --model and -o are required (or --all DIR)")
    config = None
    if args.config:
        with open(args.config) as f:
            config = json.load(f)
    prof = reference_profile(args.scorer, args.model, args.ratio or [0.25], alpha=args.alpha,
                             heads_per_group=args.heads_per_group, grouping=args.grouping,
                             parallel_capacity=args.parallel_capacity, root=args.root, tp_size=args.tp_size,
                             config=config)
    prof.save(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
