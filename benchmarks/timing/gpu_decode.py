"""GPU decode attention: check the kernels, then time uniform splits, the AOT split map
and FlashInfer's per-layer planning. Needs torch (CUDA), Triton, nvcc; not sglang.

    python -m benchmarks.timing.gpu_decode            # check + time, writes
        benchmarks/results/timing/gpu_decode_<device>.{md,json}
    python -m benchmarks.timing.gpu_decode --export   # (CPU side) refresh benchmarks/profiles/*.json

1. Check: Triton and CUDA decode against the torch reference on the GPU
   (fp32 and bf16, odd sizes, empty groups, page sizes 1 and 16, GQA 1 and 4),
   the Triton decode reading a larger table through rows (the served path), and
   the Triton chunk prefill against the torch reference (chunks 17 / 1 / 0 / 54),
   sliding-window layers (window_checks: Triton and CUDA decode, Triton prefill),
   and the served decode under a real CUDA graph (served_graph_check).
2. Time one decode step (all L layers) of B requests of context N per workload
   (a profile exported to benchmarks/profiles/*.json): each group holds
   ceil(beta_g N) slots. Strategies: the same kernel with uniform splits
   (FA2's heuristic) and with the split map S (Algorithm 1 for this GPU's
   N_CTA), both as CUDA-graph replays (device time only); FlashInfer's paged
   decode with one plan() per layer per step (every (request, group) is a
   request with H_p KV heads), plan and run timed apart.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch

from benchmarks.common.paths import RESULTS, ROOT
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.attention.baselines import fa2_num_splits
from tangram_sglang.attention.layer_meta import build_layer_meta
from tangram_sglang.attention.reference import ragged_decode_torch
from tangram_sglang.attention.split_row import make_split_row, uniform_split_row
from tangram_sglang.attention.testing import make_ragged_cache
from tangram_sglang.method.budgets import keep_count
from tangram_sglang.method.grouping import group_budgets
from tangram_sglang.method.split_map import profile_split_map

PROFILE_DIR = os.path.join(ROOT, "benchmarks", "profiles")
# (reference scorer, model, q heads, heads per group) exported by --export
EXPORTS = [("snapkv", "llama-3.1-8b-instruct", 32, 2), ("fastkvzip", "qwen3-4b-instruct-2507", 32, 2)]


# page storage: the model dtype, or FP8 (kv_quant.py) with per-layer scales the kernels must apply
KV_PAGES = {"model": {}, "fp8_e4m3": {"kv_dtype": torch.float8_e4m3fn, "kv_scales": (0.5, 2.0)},
            "fp8_e5m2": {"kv_dtype": torch.float8_e5m2}}
STORAGES = [(torch.float32, "model"), (torch.bfloat16, "model"), (torch.bfloat16, "fp8_e4m3"),
            (torch.bfloat16, "fp8_e5m2")]


def kernels():
    from tangram_sglang.attention.cuda_ext import ragged_decode_cuda
    from tangram_sglang.attention.triton_decode import ragged_decode_triton

    return {"triton": ragged_decode_triton, "cuda": ragged_decode_cuda}


def check(dev: str) -> list[dict]:
    """Max abs error of each kernel vs the torch reference on small ragged caches."""
    rows, rng = [], np.random.default_rng(0)
    for dtype, kv in STORAGES:
        for h, gqa, hp, page in [(4, 1, 1, 1), (6, 4, 2, 16), (5, 3, 4, 16), (8, 4, 4, 1)]:
            lens = rng.integers(0, 300, size=(3, math.ceil(h / hp)))
            lens.flat[0], lens.flat[1] = 0, 1
            c = make_ragged_cache(lens, num_kv_heads=h, gqa=gqa, heads_per_group=hp, head_dim=128,
                                  page_size=page, seed=int(lens.sum()), dtype=dtype, **KV_PAGES[kv])
            q = torch.randn(3, h * gqa, 128).to(dtype)
            split = make_split_row(rng.integers(1, 9, size=lens.shape[1]))
            args = [t.to(dev) for t in (q, c.k_pages, c.v_pages, c.block_table, c.seq_lens)]
            ref = ragged_decode_torch(*args, c.meta.to(dev), split.to(dev), 0.088).float()
            for name, fn in kernels().items():
                err = (fn(*args, c.meta.to(dev), split.to(dev), 0.088).float() - ref).abs().max().item()
                tol = 1e-4 if dtype == torch.float32 else 3e-2
                rows.append({"kernel": name, "dtype": str(dtype).split(".")[-1], "kv": kv, "H": h, "gqa": gqa,
                             "H_p": hp, "page": page, "max_abs_err": err, "ok": err <= tol})
            rows += [dict(r, kv=kv) for r in served_path_checks(c, q, split, dtype, dev, (h, gqa, hp, page))]
    return rows


def served_path_checks(c, q, split, dtype, dev: str, shape) -> list[dict]:
    """The served Triton path: decode through rows of a larger table, and chunk prefill."""
    from tangram_sglang.attention.prefill_reference import ragged_prefill_chunk_torch
    from tangram_sglang.attention.triton_decode import ragged_decode_triton
    from tangram_sglang.attention.triton_prefill import ragged_prefill_chunk_triton

    h, gqa, hp, page = shape
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    meta, sp = c.meta.to(dev), split.to(dev)
    kp, vp, bt, sl = (t.to(dev) for t in (c.k_pages, c.v_pages, c.block_table, c.seq_lens))
    rows_idx = torch.tensor([4, 0, 2], device=dev)
    full = torch.zeros(5, *bt.shape[1:], dtype=bt.dtype, device=dev)
    full[rows_idx] = bt
    ref = ragged_decode_torch(q.to(dev), kp, vp, bt, sl, meta, sp, 0.088).float()
    got = ragged_decode_triton(q.to(dev), kp, vp, full, sl, meta, sp, 0.088, rows=rows_idx).float()
    out = [{"kernel": "triton_rows", "dtype": str(dtype).split(".")[-1], "H": h, "gqa": gqa, "H_p": hp,
            "page": page, "max_abs_err": (got - ref).abs().max().item()}]
    chunks = [17, 1, 0]
    cu = torch.tensor([0, *np.cumsum(chunks).tolist()], dtype=torch.int32, device=dev)
    total = int(cu[-1])
    qc = torch.randn(total, h * gqa, 128, device=dev).to(dtype)
    kc, vc = (torch.randn(total, h, 128, device=dev).to(dtype) for _ in range(2))
    ref = ragged_prefill_chunk_torch(qc, kc, vc, cu, kp, vp, bt, sl, meta, 0.088).float()
    got = ragged_prefill_chunk_triton(qc, kc, vc, cu, kp, vp, bt, sl, meta, 0.088, split=sp).float()
    out.append({"kernel": "triton_prefill", "dtype": str(dtype).split(".")[-1], "H": h, "gqa": gqa, "H_p": hp,
                "page": page, "max_abs_err": (got - ref).abs().max().item()})
    for r in out:
        r["ok"] = r["max_abs_err"] <= tol
    return out


def window_checks(dev: str) -> list[dict]:
    """Sliding-window layers (every position kept, slot = position): Triton and CUDA decode, and the
    Triton chunk prefill, against the torch reference's window."""
    import dataclasses

    from tangram_sglang.attention.prefill_reference import ragged_prefill_chunk_torch
    from tangram_sglang.attention.triton_prefill import ragged_prefill_chunk_triton

    rows, hist = [], np.array([1, 100, 300])
    for dtype in (torch.float32, torch.bfloat16):
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        for window in (1, 37, 200):
            c = make_ragged_cache(np.repeat(hist[:, None], 2, axis=1), num_kv_heads=4, gqa=2, heads_per_group=2,
                                  head_dim=128, page_size=16, extra_hist=0, seed=window, dtype=dtype)
            meta, split = dataclasses.replace(c.meta, window=window).to(dev), make_split_row([5, 2]).to(dev)
            kp, vp, bt, sl = (t.to(dev) for t in (c.k_pages, c.v_pages, c.block_table, c.seq_lens))
            q = torch.randn(3, 8, 128, device=dev).to(dtype)
            ref = ragged_decode_torch(q, kp, vp, bt, sl, meta, split, 0.088).float()
            errs = {f"{name}_window": (fn(q, kp, vp, bt, sl, meta, split, 0.088).float() - ref).abs().max().item()
                    for name, fn in kernels().items()}
            cu = torch.tensor([0, 40, 41, 300], dtype=torch.int32, device=dev)
            qc = torch.randn(300, 8, 128, device=dev).to(dtype)
            kc, vc = (torch.randn(300, 4, 128, device=dev).to(dtype) for _ in range(2))
            ref = ragged_prefill_chunk_torch(qc, kc, vc, cu, kp, vp, bt, sl, meta, 0.088).float()
            got = ragged_prefill_chunk_triton(qc, kc, vc, cu, kp, vp, bt, sl, meta, 0.088, split=split).float()
            errs["triton_prefill_window"] = (got - ref).abs().max().item()
            rows += [{"kernel": k, "dtype": str(dtype).split(".")[-1], "window": window, "H": 4, "gqa": 2, "H_p": 2,
                      "page": 16, "max_abs_err": e, "ok": e <= tol} for k, e in errs.items()]
    return rows


class CudaGraph:
    """fn captured once (after a warm-up on a side stream, which compiles the kernels); replay()
    re-launches its kernels on the tensors they read at capture."""

    def __init__(self, fn):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            fn()

    def replay(self):
        self.graph.replay()
        torch.cuda.synchronize()


class Rerun:
    """CPU dry run of served_graph_check (Triton interpreter): replay() runs fn again."""

    def __init__(self, fn):
        self.replay = fn
        fn()


def served_graph_check(dev: str, bucket: int = 8, graph_cls=CudaGraph, kernel: str = "triton") -> list[dict]:
    """The served decode step under a CUDA graph, as the backend runs it: a TangramServing pool
    (serving/testing.py: SmolLM2's shape, smollm2-snapkv at 0.25, five requests prefilled),
    DecodeGraph's static plan, the decode K/V write and the Triton decode of every layer
    captured once for a batch of `bucket`, then replayed over changing batches with padding;
    against the same steps run eagerly on a twin pool. ok: outputs within 1e-5, padding rows
    zero, pools equal (scratch page aside), integrity checks pass. kernel: the decode kernel
    (triton, or cuda: --tangram-data-plane cuda)."""
    from tangram_sglang.attention.kv_write import write_decode_kv
    from tangram_sglang.serving.decode_graph import DecodeGraph
    from tangram_sglang.serving.observability import check_integrity
    from tangram_sglang.serving.testing import HQ, STEPS, D, served_pool, step_inputs

    profile = os.path.join(ROOT, "configs", "smollm2-snapkv.yaml")
    eager, graphed = served_pool(profile, dev), served_pool(profile, dev)
    L, decode = graphed.spec.num_layers, kernels()[kernel]

    def forward(s, plan, q, k, v):
        outs = []
        for l in range(L):
            write_decode_kv(k[l], v[l], plan.out_loc[l], s.context.metas[l], s.data.k_pages, s.data.v_pages)
            outs.append(decode(q[l], s.data.k_pages, s.data.v_pages, plan.block_table[l],
                               plan.seq_lens[l], s.context.metas[l], s.context.split_rows[l], D ** -0.5, rows=plan.rows))
        return outs

    graph = DecodeGraph(graphed, max_bs=bucket, rows=16, context_len=256, device=dev)
    static = [t.clone() for t in step_inputs(L, bucket, 99, dev)]
    out = torch.zeros(L, bucket, HQ, D, device=dev)
    plan = graph.prepare([], bucket)
    runner = graph_cls(lambda: out.copy_(torch.stack(forward(graphed, plan, *static))))
    err, pad_zero, pools_equal = 0.0, True, True
    for step, rids in enumerate(STEPS):
        n = len(rids)
        for s in (eager, graphed):
            if not s.admission.ensure_decode_room(rids):
                raise RuntimeError("served_graph_check: the pool ran out")
        real = step_inputs(L, n, step, dev)
        want = torch.stack(forward(eager, eager.decode_metadata(rids), *real))
        graph.prepare(rids, bucket)
        for buf, t in zip(static, real):
            buf[:, :n].copy_(t)
            buf[:, n:].normal_()
        runner.replay()
        err = max(err, (out[:, :n] - want).abs().max().item())
        pad_zero &= bool((out[:, n:] == 0).all())
        for s in (eager, graphed):
            check_integrity(s, None)
            s.tables.check_scratch()
        last = eager.data.scratch_page
        pools_equal &= all(torch.equal(a[:last], b[:last]) for a, b in
                           ((eager.data.k_pages, graphed.data.k_pages), (eager.data.v_pages, graphed.data.v_pages)))
    return [{"kernel": f"served_decode_graph_{kernel}", "dtype": "float32", "H": 3, "gqa": 3,
             "H_p": graphed.spec.heads_per_group, "page": 16, "max_abs_err": err, "padding_zero": pad_zero,
             "pools_equal": pools_equal, "ok": err <= 1e-5 and pad_zero and pools_equal}]


class Workload:
    """One exported profile on the device: per-layer metas, lengths, split rows, one shared pool."""

    def __init__(self, spec: dict, batch: int, ctx: int, page: int, dtype, dev: str, capacity: int,
                 kv: str = "model"):
        self.spec, self.batch, self.ctx = spec, batch, ctx
        budgets = np.asarray(spec["budgets"])
        self.beta = group_budgets(budgets, spec["groups"])
        self.split_map = profile_split_map(budgets, spec["groups"], capacity)
        hp, d = spec["heads_per_group"], spec["head_dim"]
        self.metas = [build_layer_meta(g, num_q_heads=spec["num_q_heads"], num_kv_heads=spec["num_kv_heads"],
                                       heads_per_group=hp, device=dev) for g in spec["groups"]]
        self.lens = [torch.as_tensor(keep_count(b[None, :], np.full((batch, 1), ctx)), dtype=torch.int32,
                                     device=dev) for b in self.beta]
        num_g = self.beta.shape[1]
        pages_per = -(-int(max(t.max() for t in self.lens)) // page)
        num_pages = batch * num_g * pages_per
        self.table = torch.randperm(num_pages, device=dev).to(torch.int32).view(batch, num_g, pages_per)
        page_dtype = KV_PAGES[kv].get("kv_dtype", dtype)
        self.k_pages = torch.randn(num_pages, page, hp, d, device=dev, dtype=dtype).to(page_dtype)
        self.v_pages = torch.randn(num_pages, page, hp, d, device=dev, dtype=dtype).to(page_dtype)
        self.q = torch.randn(batch, spec["num_q_heads"], d, device=dev, dtype=dtype)
        self.scale = 1.0 / math.sqrt(d)
        u = fa2_num_splits(batch * num_g, capacity, -(-ctx // 256))
        self.splits = {"uniform": [uniform_split_row(num_g, u, dev)] * len(self.metas),
                       "aot": [make_split_row(r, dev) for r in self.split_map]}
        self.uniform_splits = u

    def step(self, fn, splits):
        for layer, meta in enumerate(self.metas):
            fn(self.q, self.k_pages, self.v_pages, self.table, self.lens[layer], meta, splits[layer], self.scale)


def graph_ms(run, reps: int = 20) -> float:
    """Device time of run() as a CUDA-graph replay (falls back to eager launches)."""
    run()
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        target = g.replay
    except Exception:  # noqa: BLE001 - capture unsupported: time eagerly
        target = run
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    target()
    start.record()
    for _ in range(reps):
        target()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def flashinfer_ms(w: Workload, reps: int = 10) -> dict | None:
    """Per-layer plan() + run() of FlashInfer's paged decode; None without flashinfer."""
    try:
        import flashinfer
    except ImportError:
        return None
    dev, page = w.q.device, w.k_pages.shape[1]
    hp, d = w.spec["heads_per_group"], w.spec["head_dim"]
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout="NHD")
    qg = [w.q[:, m.q_head.reshape(-1)].reshape(-1, m.rows_per_group, d).contiguous() for m in w.metas]

    def plan(layer):
        lens = w.lens[layer].reshape(-1).to(torch.int64)
        count = torch.clamp((lens + page - 1) // page, min=1)
        indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=dev)
        indptr[1:] = torch.cumsum(count, 0)
        cols = torch.arange(w.table.shape[-1], device=dev)
        indices = w.table.reshape(lens.numel(), -1)[cols[None, :] < count[:, None]]
        last = (lens - (count - 1) * page).to(torch.int32)
        wrapper.plan(indptr, indices, last, hp * w.metas[layer].gqa, hp, d, page, q_data_type=w.q.dtype,
                     kv_data_type=w.k_pages.dtype, sm_scale=w.scale)

    def step(do_plan=True):
        for layer in range(len(w.metas)):
            if do_plan:
                plan(layer)
            wrapper.run(qg[layer], (w.k_pages, w.v_pages))

    try:
        step()
    except Exception as exc:  # noqa: BLE001 - e.g. an unsupported GQA group size
        return {"error": repr(exc)[:200]}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    torch.cuda.synchronize()
    total = (time.perf_counter() - t0) / reps * 1e3
    plan(len(w.metas) - 1)
    run_only = graph_ms(lambda: wrapper.run(qg[-1], (w.k_pages, w.v_pages))) * len(w.metas)
    return {"plan_and_run_ms": total, "run_only_ms_est": run_only}


def time_workloads(args, dev: str, capacity: int) -> list[dict]:
    rows, kern = [], kernels()
    for path in args.workload or sorted(glob.glob(os.path.join(PROFILE_DIR, "*.json"))):
        spec = json.load(open(path))
        for batch, kv in [(b, kv) for b in args.batch for kv in args.kv]:
            w = Workload(spec, batch, args.context, args.page_size, getattr(torch, args.dtype), dev, capacity, kv)
            row = {"workload": os.path.basename(path), "batch": batch, "context": args.context, "kv": kv,
                   "uniform_splits": w.uniform_splits, "aot_ctas_per_req": int(w.split_map.sum(1).mean())}
            for name, fn in kern.items():
                for strat, splits in w.splits.items():
                    row[f"{name}_{strat}_ms"] = graph_ms(lambda w=w, fn=fn, splits=splits: w.step(fn, splits))
            row["flashinfer"] = flashinfer_ms(w) if kv == "model" else None
            rows.append(row)
            print(json.dumps(row), flush=True)
            del w
            torch.cuda.empty_cache()
    return rows


def export() -> None:
    """Write benchmarks/profiles/*.json from the reference data and SmolLM2's profile (CPU side)."""
    from tangram_sglang.profile import load_profile
    from tangram_sglang.profile.reference_import import REFERENCE_MODELS, reference_profile

    os.makedirs(PROFILE_DIR, exist_ok=True)
    specs = []
    for scorer, model, hq, hp in EXPORTS:
        e = reference_profile(scorer, model, [0.25], heads_per_group=hp).entries[0]
        specs.append((f"{model}-{scorer}-0.25-hp{hp}", e, hq, REFERENCE_MODELS[model][1], hp))
    smol = os.environ.get("TANGRAM_SMOLLM2_PROFILE", "/tmp/smollm2-snapkv.yaml")
    if os.path.isfile(smol):
        prof = load_profile(smol)
        specs.append(("smollm2-135m-snapkv-0.25", prof.select(0.25), 9, 64, prof.heads_per_group))
    for name, e, hq, d, hp in specs:
        out = {"name": name, "num_layers": len(e.groups), "num_kv_heads": int(e.budgets.shape[1]),
               "num_q_heads": hq, "head_dim": d, "heads_per_group": hp, "ratio": e.ratio,
               "budgets": np.round(e.budgets, 6).tolist(), "groups": e.groups}
        with open(os.path.join(PROFILE_DIR, name + ".json"), "w") as f:
            json.dump(out, f)
        print("wrote", name)


def markdown(capacity: int, checks: list[dict], rows: list[dict]) -> list[str]:
    ok = all(c["ok"] for c in checks)
    key = lambda c: f"{c['kernel']} ({c.get('kv', 'model')} pages)"  # noqa: E731
    worst = {k: max(c["max_abs_err"] for c in checks if key(c) == k) for k in dict.fromkeys(map(key, checks))}
    lines = [f"N_CTA (split map) = {capacity}. Kernel check vs torch reference: {'all pass' if ok else 'FAILURES'} "
             f"(worst abs err: {', '.join(f'{k} {v:.2e}' for k, v in worst.items())}).", "",
             "Times: one decode step over all layers, ms. Kernel columns: CUDA-graph replay (device time). "
             "FlashInfer: plan() per layer per step + run(), wall time; run-only estimate from a graph replay.", "",
             "| workload | B | N | KV pages | U | triton uniform | triton AOT | cuda uniform | cuda AOT "
             "| FI plan+run | FI run only |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fi = r["flashinfer"] or {}
        lines.append(f"| {r['workload']} | {r['batch']} | {r['context']} | {r.get('kv', 'model')} | {r['uniform_splits']} "
                     f"| {r['triton_uniform_ms']:.3f} | {r['triton_aot_ms']:.3f} | {r['cuda_uniform_ms']:.3f} "
                     f"| {r['cuda_aot_ms']:.3f} | {fi.get('plan_and_run_ms', float('nan')):.3f} "
                     f"| {fi.get('run_only_ms_est', float('nan')):.3f} |")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", action="store_true", help="write benchmarks/profiles/*.json and stop")
    ap.add_argument("--workload", action="append", help="exported profile json (default: all)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv", nargs="+", default=["model", "fp8_e4m3"], choices=sorted(KV_PAGES),
                    help="page storage to time: the model dtype and/or FP8")
    ap.add_argument("--blocks-per-sm", type=int, default=1, help="N_CTA = SMs x this")
    ap.add_argument("--out-dir", default=os.path.join(RESULTS, "timing"))
    args = ap.parse_args(argv)
    if args.export:
        return export()
    if not torch.cuda.is_available():
        sys.exit("benchmarks.timing.gpu_decode needs a GPU (use --export on the CPU side)")
    run_stamp = stamp(argv)
    dev = "cuda"
    props = torch.cuda.get_device_properties(0)
    capacity = props.multi_processor_count * args.blocks_per_sm
    checks = check(dev) + window_checks(dev) + served_graph_check(dev) + served_graph_check(dev, kernel="cuda")
    print(json.dumps(checks), flush=True)
    rows = time_workloads(args, dev, capacity)
    stem = os.path.join(args.out_dir, "gpu_decode_" + props.name.lower().replace(" ", "-"))
    write_json(stem + ".json", {"device": props.name, "capacity": capacity, "checks": checks, "rows": rows},
               run_stamp)
    write_markdown(stem + ".md", f"GPU decode attention on {props.name}", markdown(capacity, checks, rows), run_stamp)


if __name__ == "__main__":
    main()
