"""KV bytes per history token of the paper's models: stock SGLang 0.5.23 against the shipped profiles.

The profiles are configs/reference/*.yaml (written by ``python -m tangram_sglang.profile.reference_import
--all configs/reference`` from the authors' retention data and configs/models/*/config.json); each is
checked against its model's config here. Per history token of a conversation of ``--history`` tokens,
bf16 KV (``--kv-bytes`` per value):

- stock: every layer stores every token, except where SGLang 0.5.23 serves the model from its hybrid
  SWA pool (gpt-oss): its window layers hold their window, min(N, W) / N per token;
- Tangram, reserved: a full-attention layer's group g stores beta_g x H_p head slots per token (what
  admission reserves); a window layer reserves every new token (dense, like stock Gemma 3);
- Tangram, held: what a stored history holds once the tree's interior nodes dropped their window pages
  (docs/hybrid.md): window layers at min(N, W + chunk) / N.

Protection of sinks and each turn's newest tokens, page rounding and decode tokens add to Tangram's
figure in serving (docs/results.md measures them on the small models).

    .venv/bin/python -m benchmarks.modeled.paper_models   # -> benchmarks/results/modeled/paper_models.{md,json}
"""

from __future__ import annotations

import argparse
import os

from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.report_tables import paper_models_table
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.profile import ModelShape, load_profile
from tangram_sglang.profile.reference_import import SHIPPED, model_config

STOCK_SWA = {"GptOssForCausalLM"}  # SGLang 0.5.23's is_hybrid_swa_model among these five
SERVED = {  # with a profile today (tangram_sglang/sglang/compatibility.py, model_writes.py)
    "LlamaForCausalLM": "yes",
    "Qwen3ForCausalLM": "yes",
    "Gemma3ForConditionalGeneration": "yes, text (multimodal inputs refused)",
    "GptOssForCausalLM": "yes (learned sinks; SGLang's SWA pool off)",
    "Qwen3MoeForCausalLM": "yes (fused set-KV writes routed through the backend)",
}


def per_token(shape: ModelShape, entry, hpg: int, history: int, chunk: int, kv_bytes: int) -> dict:
    """Bytes per history token: stock, Tangram reserved, Tangram held (windows bounded)."""
    head = 2 * shape.head_dim * kv_bytes                     # K and V of one head, one token
    dense_layer = shape.num_kv_heads * head
    windows = shape.windows
    full = sum(float(entry.group_budget[layer].sum()) * hpg * head
               for layer in range(shape.num_layers) if not windows[layer])
    n_window = sum(1 for w in windows if w)
    held = (lambda w: min(history, w) / history) if windows else (lambda w: 1.0)
    stock_window = sum(dense_layer * (held(w) if shape.architecture in STOCK_SWA else 1.0) for w in windows if w)
    stock_full = dense_layer * (shape.num_layers - n_window)
    return {"stock": stock_full + stock_window, "tangram": full + n_window * dense_layer,
            "bounded": full + sum(dense_layer * held(w + chunk) for w in windows if w)}


def rows(history: int, chunk: int, kv_bytes: int) -> list[dict]:
    out = []
    for model, scorer in SHIPPED:
        config = model_config(model)
        shape = ModelShape.from_hf_config(config)
        profile = load_profile(os.path.join(ROOT, "configs", "reference", f"{model}-{scorer}.yaml"))
        profile.check_model(shape)
        for entry in profile.entries:
            b = per_token(shape, entry, profile.heads_per_group, history, chunk, kv_bytes)
            out.append({"model": model, "scorer": scorer, "architecture": shape.architecture,
                        "layers": shape.num_layers, "window_layers": len(shape.window_layers),
                        "window": shape.window, "kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
                        "ratio": entry.ratio, **{k: round(v) for k, v in b.items()},
                        "served": SERVED[shape.architecture]})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--history", type=int, default=16384, help="tokens of history (window layers' share)")
    ap.add_argument("--chunk", type=int, default=512, help="compression chunk (bounded windows hold W + chunk)")
    ap.add_argument("--kv-bytes", type=int, default=2, help="bytes per KV value (2: bf16)")
    ap.add_argument("--out", default=result_path("modeled", "paper_models.json"))
    args = ap.parse_args(argv)
    data = rows(args.history, args.chunk, args.kv_bytes)
    run = stamp(argv)
    write_json(args.out, {"history": args.history, "chunk": args.chunk, "kv_bytes": args.kv_bytes, "rows": data},
               run, row_per_line="rows")
    md = args.out.rsplit(".", 1)[0] + ".md"
    print(write_markdown(md, "KV bytes per history token of the paper's models", [
        f"History of {args.history:,} tokens, {args.kv_bytes}-byte KV values, chunk {args.chunk}; profiles "
        "configs/reference/ (the authors' retention data rescaled to each ratio, groups of 4 heads), checked "
        "against configs/models/. Modeled from the profiles' reservations: protection, page rounding and decode "
        "tokens are not counted.", "", *paper_models_table(data)], run))


if __name__ == "__main__":
    main()
