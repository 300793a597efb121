"""Launch-configuration sweep of the Triton decode kernel on a GPU: BLOCK_N x num_warps x num_stages.

    python -m benchmarks.timing.triton_tune          # writes benchmarks/results/timing/triton_tune_<device>.{md,json}

For each configuration: the kernel against the torch reference on a small ragged cache (bf16, GQA 4,
H_p 2, page 16, FP8 pages too), then one decode step over all layers with the AOT split map (CUDA-graph
replay, as gpu_decode times it) per workload. The served defaults are the row marked `default`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import numpy as np
import torch

from benchmarks.common.paths import RESULTS
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from benchmarks.timing.gpu_decode import KV_PAGES, PROFILE_DIR, Workload, graph_ms
from tangram_sglang.attention import triton_decode
from tangram_sglang.attention.reference import ragged_decode_torch
from tangram_sglang.attention.split_row import make_split_row
from tangram_sglang.attention.testing import make_ragged_cache

DEFAULT = {"block_n": 32, "num_warps": 4, "num_stages": 3}  # what ragged_decode_triton launches today
# (exported profile, batch, page storage)
CASES = [("llama-3.1-8b-instruct-snapkv-0.25-hp2", 16, "model"), ("llama-3.1-8b-instruct-snapkv-0.25-hp2", 16, "fp8_e4m3"),
         ("qwen3-4b-instruct-2507-fastkvzip-0.25-hp2", 1, "model"), ("smollm2-135m-snapkv-0.25", 16, "model")]


class Launch:
    """The kernel object with launch options added to every launch (kernel[grid](..., **opts))."""

    def __init__(self, kernel, **opts):
        self.kernel, self.opts = kernel, opts

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel[grid](*args, **kwargs, **self.opts)


def decode_with(cfg: dict):
    """ragged_decode_triton launched with cfg (the module's kernel swapped while it runs)."""
    original = triton_decode._split_kernel

    def fn(*args, **kwargs):
        triton_decode._split_kernel = Launch(original, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        try:
            return triton_decode.ragged_decode_triton(*args, block_n=cfg["block_n"], **kwargs)
        finally:
            triton_decode._split_kernel = original
    return fn


def max_error(fn, kv: str, dev: str) -> float:
    lens = np.array([[0, 1, 250], [37, 300, 129]])
    c = make_ragged_cache(lens, num_kv_heads=6, gqa=4, heads_per_group=2, head_dim=128, page_size=16, seed=3,
                          dtype=torch.bfloat16, **KV_PAGES[kv])
    q = torch.randn(2, 24, 128).to(torch.bfloat16)
    split = make_split_row([1, 3, 5], dev)
    args = [t.to(dev) for t in (q, c.k_pages, c.v_pages, c.block_table, c.seq_lens)]
    ref = ragged_decode_torch(*args, c.meta.to(dev), split, 0.088).float()
    return (fn(*args, c.meta.to(dev), split, 0.088).float() - ref).abs().max().item()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--block-n", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--num-warps", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--num-stages", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--out-dir", default=os.path.join(RESULTS, "timing"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks.timing.triton_tune needs a GPU")
    run_stamp, dev = stamp(argv), "cuda"
    props = torch.cuda.get_device_properties(0)
    works = {case: Workload(json.load(open(os.path.join(PROFILE_DIR, case[0] + ".json"))), case[1], args.context,
                            16, torch.bfloat16, dev, props.multi_processor_count, case[2]) for case in CASES}
    rows = []
    for bn, nw, ns in itertools.product(args.block_n, args.num_warps, args.num_stages):
        cfg = {"block_n": bn, "num_warps": nw, "num_stages": ns}
        fn = decode_with(cfg)
        row = dict(cfg, default=cfg == DEFAULT)
        try:
            row["max_abs_err"] = max(max_error(fn, kv, dev) for kv in ("model", "fp8_e4m3"))
            for case, w in works.items():
                row["/".join(map(str, case))] = graph_ms(lambda w=w: w.step(fn, w.splits["aot"]))
        except Exception as e:  # noqa: BLE001 - a configuration the compiler rejects (shared memory) is a row
            row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    stem = os.path.join(args.out_dir, "triton_tune_" + props.name.lower().replace(" ", "-"))
    write_json(stem + ".json", {"device": props.name, "context": args.context, "rows": rows}, run_stamp)
    write_markdown(stem + ".md", f"Triton decode launch sweep on {props.name}", markdown(rows), run_stamp)


def markdown(rows: list[dict]) -> list[str]:
    keys = ["/".join(map(str, c)) for c in CASES]
    ok = [r for r in rows if "error" not in r]
    lines = ["One decode step over all layers with the AOT split map, ms (CUDA-graph replay), context per row's "
             "workload. max_abs_err: against the torch reference (bf16 and FP8 pages).", "",
             "| BLOCK_N | warps | stages | max abs err | " + " | ".join(keys) + " |",
             "|---|---|---|---|" + "---|" * len(keys)]
    for r in sorted(ok, key=lambda r: sum(r[k] for k in keys)):
        mark = " (default)" if r["default"] else ""
        lines.append(f"| {r['block_n']}{mark} | {r['num_warps']} | {r['num_stages']} | {r['max_abs_err']:.1e} | "
                     + " | ".join(f"{r[k]:.3f}" for k in keys) + " |")
    lines += ["", f"{len(rows) - len(ok)} configurations failed to compile or run."] if len(ok) < len(rows) else []
    return lines


if __name__ == "__main__":
    main()
