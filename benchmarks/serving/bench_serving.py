"""SGLang's own serving benchmark, multi-turn, stock SGLang against Tangram at the same KV bytes.

Runs ``python -m sglang.bench_serving`` (SGLang 0.5.23's tool, unchanged) in its multi-turn mode:
``--backend sglang-oai-chat --dataset-name generated-shared-prefix --gsp-num-turns N``. Each
conversation is a group's shared system prompt plus a question, then N - 1 more questions, the
server's own replies fed back as assistant turns, so every turn after the first re-sends a history
the server may hold in its radix tree. Every server gets the same ``--max-total-tokens`` T: stock T
full-KV token slots, Tangram a ragged pool of the same bytes (its /server_info ``pool_bytes``).

Settings, run in turn for every repeat (alternating, so drift on a shared machine hits all alike):
``stock-<policy>`` for each ``--stock-policies`` entry (SGLang's --schedule-policy; ``refresh`` and
``lpm-refresh``: with Tangram's waiting-queue refresh, TANGRAM_REFRESH_WAITING=1, no profile) and
``tangram@<ratio>`` for each ``--ratios`` entry. For each setting and each ``--rates`` entry (requests
per second; ``inf`` sends all at once) a fresh server's cache is flushed and bench_serving runs; its
JSON line gives request and token throughput, TTFT / TPOT / ITL medians and p99, the cache hit rate
(``--cache-report``) and goodput under ``--ttft-slo-ms``.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.bench_serving --quick   # minutes: a smoke run
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.bench_serving --model smollm2 \\
        --profile configs/smollm2-fastkvzip.yaml --ratios 0.4 --max-total-tokens 4096 --rates 0.25 0.5 inf \\
        --repeats 3
    # -> benchmarks/results/serving/bench_serving.{json,md}
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks.common.client import call, server_state
from benchmarks.common.log import logger
from benchmarks.common.models import ensure_model
from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.report_tables import bench_serving_table
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from benchmarks.serving.concurrency import STOCK_VARIANTS, full_kv_token_bytes
from tangram_sglang.sglang.server_process import ServerProcess

log = logger("bench_serving")
METRICS = ("request_throughput", "output_throughput", "total_throughput", "median_ttft_ms", "p99_ttft_ms",
           "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2e_latency_ms", "duration")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", help="a model launch/models.py installs")
    ap.add_argument("--profile", default="configs/smollm2-fastkvzip.yaml")
    ap.add_argument("--ratios", nargs="+", type=float, default=[0.4])
    ap.add_argument("--stock-policies", nargs="+", default=["fcfs", "lpm", "refresh"], choices=list(STOCK_VARIANTS),
                    help="stock servers: SGLang --schedule-policy values, and refresh (fcfs with Tangram's "
                    "waiting-queue refresh)")
    ap.add_argument("--max-total-tokens", type=int, default=4096, help="stock KV tokens (Tangram: the same bytes)")
    ap.add_argument("--rates", nargs="+", type=float, default=[0.5, math.inf], help="requests per second (inf: all at once)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--groups", type=int, default=4, help="--gsp-num-groups (system prompts)")
    ap.add_argument("--per-group", type=int, default=4, help="--gsp-prompts-per-group (conversations per prompt)")
    ap.add_argument("--system-len", type=int, default=512)
    ap.add_argument("--question-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-concurrency", type=int, default=16)
    ap.add_argument("--ttft-slo-ms", type=float, default=20000, help="goodput: a request is good if its TTFT is under this")
    ap.add_argument("--port", type=int, default=32100)
    ap.add_argument("--quick", action="store_true", help="one repeat, one rate, small workload: a smoke run")
    ap.add_argument("--out", default=result_path("serving", "bench_serving.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.rates, args.groups, args.per_group, args.turns = 1, [math.inf], 2, 2, 2
        args.system_len, args.question_len, args.output_len, args.stock_policies = 128, 32, 16, ["fcfs"]
    return args


def settings(args) -> list[tuple[str, list[str], str | None]]:
    """(name, extra server args, profile) of every setting, in the order each repeat runs them."""
    out = [(f"stock-{p}", STOCK_VARIANTS[p][0], None) for p in args.stock_policies]
    profile = os.path.join(ROOT, args.profile)
    return out + [(f"tangram@{r:g}", ["--tangram-ratio", str(r)], profile) for r in args.ratios]


def bench_command(args, model_path: str, url: str, rate: float, out_file: str) -> list[str]:
    """The bench_serving command line of one run."""
    return [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang-oai-chat", "--base-url", url,
            "--model", model_path, "--tokenizer", model_path, "--dataset-name", "generated-shared-prefix",
            "--gsp-num-groups", str(args.groups), "--gsp-prompts-per-group", str(args.per_group),
            "--gsp-system-prompt-len", str(args.system_len), "--gsp-question-len", str(args.question_len),
            "--gsp-output-len", str(args.output_len), "--gsp-num-turns", str(args.turns),
            "--request-rate", "inf" if math.isinf(rate) else str(rate),
            "--max-concurrency", str(args.max_concurrency), "--cache-report", "--seed", "1",
            "--goodput", f"ttft:{args.ttft_slo_ms:g}", "--disable-tqdm", "--output-file", out_file]


def run_one(args, model_path: str, srv: ServerProcess, rate: float) -> dict:
    """One bench_serving run on a flushed server: its result line (METRICS, cache report, goodput)."""
    status, body = call(srv.url + "/flush_cache", {})
    if status != 200:
        raise SystemExit(f"/flush_cache answered {status}: {body}")
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "out.jsonl")
        cmd = bench_command(args, model_path, srv.url, rate, out_file)
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0 or not os.path.exists(out_file):
            raise SystemExit(f"bench_serving failed (rc {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        with open(out_file) as f:
            res = json.loads(f.read().strip().splitlines()[-1])
    row = {k: res.get(k) for k in METRICS}
    row["completed"] = res.get("completed")
    row["cache_hit_rate_pct"] = (res.get("cache_report") or {}).get("cache_hit_rate_pct")
    row["request_goodput"] = res.get("request_goodput")
    return row


def run_setting(args, model_path: str, name: str, extra: list[str], profile: str | None, repeat: int) -> list[dict]:
    rows = []
    srv = ServerProcess(model_path, port=args.port, profile=profile,
                        extra_args=["--max-total-tokens", str(args.max_total_tokens), "--enable-cache-report", *extra])
    if profile is None:
        srv.env.update(STOCK_VARIANTS[name.removeprefix("stock-")][1])   # refresh: TANGRAM_REFRESH_WAITING=1
    with srv:
        info = server_state(srv.url)
        pool = (info.get("tangram") or {}).get("pool_info") or {}
        for rate in args.rates:
            log(f"[{name}] repeat {repeat + 1}/{args.repeats}, rate {rate:g}/s")
            row = run_one(args, model_path, srv, rate)
            row.update(setting=name, repeat=repeat, rate=rate, pool_bytes=pool.get("pool_bytes"))
            log(f"[{name}] {row['request_throughput']:.3f} req/s, TTFT p99 {row['p99_ttft_ms']:.0f} ms, "
                f"cache hits {row['cache_hit_rate_pct']}%")
            rows.append(row)
    return rows


def summarize(rows: list[dict], names: list[str], rates: list[float], baseline: str) -> list[dict]:
    """Median [min, max] over repeats of each (setting, rate), and its request throughput over the
    baseline setting's of the same repeat and rate."""
    out = []
    for rate in rates:
        base = {r["repeat"]: r["request_throughput"] for r in rows if r["setting"] == baseline and r["rate"] == rate}
        for name in names:
            mine = [r for r in rows if r["setting"] == name and r["rate"] == rate]
            if not mine:
                continue
            s = {"setting": name, "rate": rate, "runs": len(mine)}
            for key in (*METRICS, "cache_hit_rate_pct", "request_goodput"):
                vals = [r[key] for r in mine if r.get(key) is not None]
                s[key] = [statistics.median(vals), min(vals), max(vals)] if vals else None
            ratios = [r["request_throughput"] / base[r["repeat"]] for r in mine if base.get(r["repeat"])]
            s["vs_baseline"] = [statistics.median(ratios), min(ratios), max(ratios)] if ratios else None
            s["pool_bytes"] = mine[0].get("pool_bytes")
            out.append(s)
    return out


def fmt_md(res: dict) -> list[str]:
    a = res["args"]
    lines = [f"Workload: bench_serving generated-shared-prefix, {a['groups']} system prompts of {a['system_len']} "
             f"tokens x {a['per_group']} conversations, {a['turns']} turns of {a['question_len']}-token questions, "
             f"{a['output_len']} tokens per reply (the server's replies fed back), at most {a['max_concurrency']} "
             f"in flight; every server --max-total-tokens {a['max_total_tokens']} ({res['stock_bytes'] / 2**20:.1f} "
             f"MiB of full KV). Median [min, max] over {a['repeats']} alternating repeats; 'vs {res['baseline']}' "
             f"is request throughput over that setting's in the same repeat. Goodput: requests per second with "
             f"TTFT under {a['ttft_slo_ms']:g} ms.", ""]
    return lines + bench_serving_table(res)


def _jsonable(rate: float) -> float | str:
    return "inf" if math.isinf(rate) else rate


def main(argv=None) -> int:
    args = parse(argv)
    run_stamp = stamp(argv)
    model_path = ensure_model(args.model)
    plan = settings(args)
    rows = []
    for repeat in range(args.repeats):
        for name, extra, profile in plan:
            rows += run_setting(args, model_path, name, extra, profile, repeat)
    names = [n for n, _, _ in plan]
    res = {"args": {**vars(args), "rates": [_jsonable(r) for r in args.rates]}, "baseline": names[0],
           "stock_bytes": args.max_total_tokens * full_kv_token_bytes(model_path),
           "summary": summarize(rows, names, args.rates, names[0]), "rows": rows}
    md = write_markdown(args.out[: -len(".json")] + ".md", "SGLang's bench_serving, multi-turn, at the same KV bytes",
                        fmt_md(res), run_stamp)
    for r in rows + res["summary"]:
        r["rate"] = _jsonable(r["rate"])
    write_json(args.out, res, run_stamp)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
