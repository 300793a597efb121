"""Served speed on the device: stock SGLang, a 1.0 profile and the reference profile at the same KV bytes.

Llama-3.1-8B-shaped dummy weights in bf16 (configs/models), stock on SGLang's Triton attention
backend, Tangram on its Triton data plane with configs/reference's SnapKV budgets (its compression
chunk set to 2,048 tokens so the tree reuses the prompts' whole chunks) and a uniform 1.0 profile of
the same head groups (the data plane alone). Every server gets the same --max-total-tokens, so the
same pool bytes; all run at once and are timed in turn, repetition by repetition.

- Decode step at (batch, context): each server prefills the batch once (its prompts then sit in the
  tree), then per repetition times the batch with 1 new token (T1) and with M + 1 (T2): the step
  is (T2 - T1) / M, prefill and the HTTP round trip cancelled out (benchmarks.timing.decode_step).
- Prefill: a fresh prompt (nothing cached) with 1 new token, per repetition a new one per server.
- Multi-turn: SGLang's own bench_serving, generated-shared-prefix in multi-turn mode
  (benchmarks.gpu.bench): 16 system prompts of 1,024 tokens x 4 conversations x 3 turns of
  1,024-token questions and 64-token replies fed back, all at once, each server alone from an empty
  tree: the histories' full KV is about 1.5x the pool, so memory binds for stock.

Every model takes the kit's tokenizer (SmolLM2's 49,152-token vocabulary; nothing the KV cache or
attention sees changes). Stock is served with ``--schedule-policy lpm``, its best policy for
multi-turn reuse on the CPU (benchmarks/results/serving/bench_serving.md); Tangram with its own
waiting-queue refresh.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from benchmarks.common.client import get_json
from benchmarks.gpu import bench
from benchmarks.gpu.bench import Workload
from benchmarks.gpu.models import (compressing_file, dummy_model, kit_tokenizer, reference_file, tiny_model,
                                   tokenizer_vocab, uniform_file)
from benchmarks.gpu.servers import Fleet, Server
from benchmarks.timing.decode_step import batch_seconds

FULL = dict(model="llama-3.1-8b-instruct", reference="llama-3.1-8b-instruct-snapkv", ratio=0.25, chunk=2048,
            pool=147_456, shapes=((1, 16_384), (16, 8_192), (64, 2_048)), prefill=16_384, steps=32, reps=3,
            max_bs=64, workload=Workload())
QUICK = dict(model="tiny-llama", reference=None, ratio=0.25, chunk=64, pool=4096, shapes=((1, 256), (4, 128)),
             prefill=256, steps=8, reps=2, max_bs=8,
             workload=Workload(groups=2, per_group=3, system_len=128, question_len=64, output_len=8, turns=2,
                               max_concurrency=6))


def plan(work: str, quick: bool, kv_dtype: str | None = None) -> tuple[dict, list[Server]]:
    """The run's sizes and its three servers (stock, Tangram 1.0, Tangram at the reference ratio)."""
    p = dict(QUICK if quick else FULL)
    tokenizer = kit_tokenizer()
    p["vocab"] = tokenizer_vocab(tokenizer)[0]
    if quick:
        tiny = tiny_model("llama", os.path.join(work, "tiny-llama"))
        model = dummy_model(os.path.join(tiny, "config.json"), os.path.join(work, "tiny-llama-tok"), tokenizer)
        comp = compressing_file(model, p["ratio"], os.path.join(work, "quick-comp.yaml"), chunk=p["chunk"])
        one = uniform_file(model, 1.0, os.path.join(work, "quick-1.0.yaml"), chunk_size=p["chunk"])
        dtype = "float32"
    else:
        model = dummy_model(p["model"], os.path.join(work, p["model"]), tokenizer)
        comp = reference_file(p["reference"], os.path.join(work, "reference.yaml"), p["chunk"])
        one = uniform_file(model, 1.0, os.path.join(work, "uniform-1.0.yaml"), heads_per_group=4,
                           parallel_capacity=132, chunk_size=p["chunk"])
        dtype = "bfloat16"
    tag = f"-{kv_dtype}" if kv_dtype else ""
    base = dict(model=model, pool_tokens=p["pool"], dtype=dtype, max_bs=p["max_bs"], load_format="dummy",
                kv_dtype=kv_dtype, tokenizer=True)
    servers = [Server(f"stock{tag}", extra=("--schedule-policy", "lpm"), **base), Server(f"t1.0{tag}", profile=one, ratio=1.0, **base),
               Server(f"t{p['ratio']}{tag}", profile=comp, ratio=p["ratio"], **base)]
    return p, servers   # FP8 too keeps the 1.0 control: the gain splits into data plane and compression


def random_prompts(rng, count: int, length: int, vocab: int) -> list[list[int]]:
    return [rng.integers(10, vocab, length).tolist() for _ in range(count)]


def decode_steps(urls: dict[str, str], batch: list[list[int]], steps: int, reps: int) -> dict:
    """Per server: the step of each repetition (ms); servers timed in turn within a repetition."""
    for url in urls.values():
        batch_seconds(url, batch, 1)  # prefill once: the prompts now sit in each tree
    out = {name: [] for name in urls}
    for _ in range(reps):
        for name, url in urls.items():
            t1 = batch_seconds(url, batch, 1)
            t2 = batch_seconds(url, batch, steps + 1)
            out[name].append(round(1000 * (t2 - t1) / steps, 3))
    return out


def prefill_seconds(urls: dict[str, str], rng, length: int, vocab: int, reps: int) -> dict:
    out = {name: [] for name in urls}
    for _ in range(reps):
        for name, url in urls.items():
            out[name].append(round(batch_seconds(url, random_prompts(rng, 1, length, vocab), 1), 4))
    return out


def summary(per_server: dict[str, list[float]], base: str) -> dict:
    """Median per server, and each server over ``base`` per repetition: median and range."""
    out = {}
    for name, xs in per_server.items():
        row = {"median": statistics.median(xs), "runs": xs}
        if base in per_server and name != base:
            ratios = [x / b for x, b in zip(xs, per_server[base]) if b > 0]
            if ratios:
                row["vs_" + base] = {"median": round(statistics.median(ratios), 3),
                                     "range": [round(min(ratios), 3), round(max(ratios), 3)]}
        out[name] = row
    return out


def pool_facts(url: str) -> dict:
    """What the server says of its pool: stock's token count, Tangram's pages and bytes."""
    info = get_json(url + "/server_info")
    state = info["internal_states"][0]
    facts = {"max_total_num_tokens": state.get("max_total_num_tokens") or info.get("max_total_num_tokens")}
    if state.get("tangram"):
        pool = state["tangram"]["pool_info"]
        facts.update({k: pool.get(k) for k in ("page_bytes", "pool_bytes", "pages_total", "pages_used", "pages_held_by_tree",
                                               "saved_vs_full_kv", "integrity", "data_plane", "kv_dtype")})
    return facts


def run(work: str, log_dir: str, port: int, cuda: bool, quick: bool, deadline: float,
        kv_dtype: str | None = None, multi: bool = True) -> dict:
    """Start the servers, then decode steps per shape, prefill and the multi-turn workload, while
    the deadline allows."""
    p, specs = plan(work, quick, kv_dtype)
    shapes = p["shapes"][1:2] if kv_dtype and not quick else p["shapes"]
    rng = np.random.default_rng(11)
    result = {"sizes": {k: (vars(v) if isinstance(v, Workload) else v) for k, v in p.items()},
              "servers": [s.name for s in specs], "decode": [], "skipped": []}
    with Fleet(specs, port, log_dir, cuda) as fleet:
        result["ready_s"] = fleet.start(min(420.0, deadline - time.time()))
        result["failed_to_start"] = fleet.failed
        urls = {n: s.url for n, s in fleet.up().items()}
        if not urls:
            return result
        base = specs[0].name
        for batch_size, context in shapes:
            if time.time() > deadline - 45:
                result["skipped"].append(f"decode {batch_size} x {context}: out of time")
                continue
            batch = random_prompts(rng, batch_size, context + 1, p["vocab"])
            steps = decode_steps(urls, batch, p["steps"], p["reps"])
            result["decode"].append({"batch": batch_size, "context": context, "step_ms": summary(steps, base)})
        if time.time() < deadline - 30:
            result["prefill_s"] = summary(prefill_seconds(urls, rng, p["prefill"], p["vocab"], p["reps"]), base)
        else:
            result["skipped"].append("prefill: out of time")
        result["pools"] = {n: pool_facts(u) for n, u in urls.items()}
        if multi and time.time() < deadline - 90:
            result["bench_serving"] = bench.run_all(urls, specs[0].model, p["workload"], deadline)
            result["pools_after_bench"] = {n: pool_facts(u) for n, u in urls.items()}
        elif multi:
            result["skipped"].append("bench_serving: out of time")
    return result
