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
- Multi-turn (benchmarks.gpu.multiturn): 48 sessions x 3 turns (4,096 tokens, then 1,024 more per
  turn, 64-token answers) on each server in turn, from an empty tree: the pool holds about half of
  the histories' full KV, so memory binds for stock.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from benchmarks.common.client import call, get_json
from benchmarks.gpu import multiturn
from benchmarks.gpu.models import compressing_file, dummy_model, reference_file, tiny_model, uniform_file
from benchmarks.gpu.multiturn import Workload
from benchmarks.gpu.servers import Fleet, Server
from benchmarks.timing.decode_step import batch_seconds

FULL = dict(model="llama-3.1-8b-instruct", reference="llama-3.1-8b-instruct-snapkv", ratio=0.25, chunk=2048,
            pool=147_456, shapes=((1, 16_384), (16, 8_192), (64, 2_048)), prefill=16_384, steps=32, reps=3,
            vocab=128_000, max_bs=64, workload=Workload())
QUICK = dict(model="tiny-llama", reference=None, ratio=0.25, chunk=64, pool=4096, shapes=((1, 256), (4, 128)),
             prefill=256, steps=8, reps=2, vocab=500, max_bs=8,
             workload=Workload(sessions=6, turns=2, first=128, user=64, answer=8, vocab=500))


def plan(work: str, quick: bool, kv_dtype: str | None = None) -> tuple[dict, list[Server]]:
    """The run's sizes and its three servers (stock, Tangram 1.0, Tangram at the reference ratio)."""
    p = QUICK if quick else FULL
    if quick:
        model = tiny_model("llama", os.path.join(work, "tiny-llama"))
        comp = compressing_file(model, p["ratio"], os.path.join(work, "quick-comp.yaml"), chunk=p["chunk"])
        one = uniform_file(model, 1.0, os.path.join(work, "quick-1.0.yaml"), chunk_size=p["chunk"])
        dtype, fmt = "float32", None
    else:
        model = dummy_model(p["model"], os.path.join(work, p["model"]))
        comp = reference_file(p["reference"], os.path.join(work, "reference.yaml"), p["chunk"])
        one = uniform_file(model, 1.0, os.path.join(work, "uniform-1.0.yaml"), heads_per_group=4,
                           parallel_capacity=132, chunk_size=p["chunk"])
        dtype, fmt = "bfloat16", "dummy"
    tag = f"-{kv_dtype}" if kv_dtype else ""
    base = dict(model=model, pool_tokens=p["pool"], dtype=dtype, max_bs=p["max_bs"], load_format=fmt, kv_dtype=kv_dtype)
    servers = [Server(f"stock{tag}", **base), Server(f"t1.0{tag}", profile=one, ratio=1.0, **base),
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
    result = {"sizes": {k: (vars(v) if isinstance(v, Workload) else v) for k, v in p.items()}, "servers": [s.name for s in specs], "decode": [], "skipped": []}
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
        if multi and time.time() < deadline - 120:
            result["multiturn"] = multi_turn(urls, p["workload"])
        elif multi:
            result["skipped"].append("multi-turn: out of time")
    return result


def multi_turn(urls: dict[str, str], w: Workload) -> dict:
    """The workload on each server in turn, from an empty tree (the others idle meanwhile)."""
    out = {"workload": vars(w)}
    for name, url in urls.items():
        call(url + "/flush_cache")
        out[name] = multiturn.run(url, w)
        out[name]["pool_after"] = pool_facts(url)
    return out
