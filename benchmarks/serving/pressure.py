"""Memory pressure: what stock SGLang serves, a profile must serve too (issue 14, item 1).

The issue's scenario, as a new user would try it: 24 mixed ``/generate`` requests
(prompts of 300-1,100 words of real English, 16-600 new tokens, ``ignore_eos``,
12 at a time) against SmolLM2 with ``--max-total-tokens 1024``: once on stock
SGLang, once per setting at the same KV bytes (by default the shipped FastKVzip profile at its
recommended 0.4 and its lowest 0.25; ``--settings`` also takes the earlier figures' SnapKV ones).
Each request ends as

  completed   200 with every token asked for
  capped      200 with fewer tokens: max_new_tokens capped to what the pool can ever hold
              (stock SGLang does the same and says so in its log)
  refused     400 up front, naming the pool / the input length
  failed      anything else (500 mid-decode, connection lost, ...)

After the run: the server's health, its log's tracebacks, and (with a profile) the
pool's integrity check and the pages left after ``/flush_cache``.

    .venv/bin/python -m benchmarks.serving.pressure          # writes benchmarks/results/serving/pressure.{md,json}
    .venv/bin/python -m benchmarks.serving.pressure --quick  # 8 requests, 4 at a time, short outputs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common.client import call, log_tracebacks, pool_info
from benchmarks.common.corpus import essay_texts
from benchmarks.common.models import ensure_model
from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.sglang.server_process import ServerProcess

os.environ.setdefault("TANGRAM_INTEGRITY_CHECK", "1")  # the servers started here check their pool on /server_info

PORT = 31861
SETTINGS = {  # label -> (profile, ratio)
    "stock SGLang": (None, None),
    "smollm2-fastkvzip 0.4": ("configs/smollm2-fastkvzip.yaml", 0.4),     # shipped, its recommended ratio
    "smollm2-fastkvzip 0.25": ("configs/smollm2-fastkvzip.yaml", 0.25),   # shipped, its lowest ratio
    "smollm2-snapkv 0.7": ("configs/smollm2-snapkv.yaml", 0.7),           # the earlier figures' profiles
    "smollm2-snapkv 0.25": ("configs/smollm2-snapkv.yaml", 0.25),
}
DEFAULT_SETTINGS = ["stock SGLang", "smollm2-fastkvzip 0.4", "smollm2-fastkvzip 0.25"]


def workload(n: int, seed: int, max_new: int) -> list[dict]:
    """n requests: a passage of 300-1100 words of the essays, 16..max_new new tokens, ignore_eos."""
    words = " ".join(essay_texts()).split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k, start = rng.randint(300, 1100), rng.randrange(0, len(words) - 1200)
        out.append({"text": " ".join(words[start:start + k]) + "\n\nSummarize the passage above.",
                    "sampling_params": {"temperature": 0, "max_new_tokens": rng.randint(16, max_new),
                                        "ignore_eos": True}})
    return out


def classify(status: int, body, wanted: int) -> tuple[str, str]:
    if status == 200 and isinstance(body, dict):
        got = body["meta_info"]["completion_tokens"]
        return ("completed" if got >= wanted else "capped"), ""
    msg = body.get("error", {}).get("message", "") if isinstance(body, dict) else str(body)
    return ("refused" if status == 400 else "failed"), f"{status}: {msg[:160]}"


def run_setting(model: str, label: str, profile, ratio, reqs: list[dict], workers: int, max_total: int) -> dict:
    extra = ["--max-total-tokens", str(max_total)]
    if profile:
        extra += ["--tangram-ratio", str(ratio)]
    srv = ServerProcess(model, port=PORT, profile=os.path.join(ROOT, profile) if profile else None,
                        extra_args=extra, log_path=f"/tmp/tangram-pressure-{PORT}.log")
    t0 = time.time()
    with srv:
        with ThreadPoolExecutor(workers) as ex:
            answers = list(ex.map(lambda r: call(srv.url + "/generate", r), reqs))
        outcomes = [classify(s, b, r["sampling_params"]["max_new_tokens"]) for (s, b), r in zip(answers, reqs)]
        healthy = call(srv.url + "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2}})[0] == 200
        row = {"setting": label, "seconds": round(time.time() - t0, 1), "healthy_after": healthy}
        for kind in ("completed", "capped", "refused", "failed"):
            row[kind] = sum(o == kind for o, _ in outcomes)
        row["errors"] = sorted({m for o, m in outcomes if m})
        row["tokens_generated"] = sum(b["meta_info"]["completion_tokens"] for s, b in answers if s == 200)
        if profile:
            time.sleep(1)
            call(srv.url + "/flush_cache", {})
            info = pool_info(srv.url)
            row.update(integrity=info["integrity"], pages_left_after_flush=info["pages_used"],
                       capped_by_pool=info["capped"], retracted=info["retracted"], refused_by_pool=info["too_large"])
        row["tracebacks"] = log_tracebacks(srv.log_path)
    print(json.dumps(row), flush=True)
    return row


def write(rows: list[dict], args, name: str, run_stamp: dict) -> None:
    cols = ["setting", "completed", "capped", "refused", "failed", "tokens_generated", "tracebacks",
            "healthy_after", "integrity", "pages_left_after_flush", "retracted", "seconds"]
    title = (f"Memory pressure: {args.requests} mixed /generate requests, {args.workers} at a time, "
             f"--max-total-tokens {args.max_total_tokens} (SmolLM2-135M)")
    lines = ["Prompts of 300-1,100 words, 16-%d new tokens, ignore_eos; the profiles get the same KV bytes. "
             "completed = every token asked for; capped = max_new_tokens cut to what the KV memory can ever "
             "hold; refused = HTTP 400 up front; failed = anything else." % args.max_new, "",
             "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |")
    lines += ["", "Errors seen:", ""]
    for r in rows:
        for e in r["errors"]:
            lines.append(f"- {r['setting']}: `{e}`")
    write_markdown(result_path("serving", f"{name}.md"), title, lines, run_stamp)
    write_json(result_path("serving", f"{name}.json"), {"args": vars(args), "rows": rows}, run_stamp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--max-new", type=int, default=600)
    ap.add_argument("--max-total-tokens", type=int, default=1024)
    ap.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS, choices=list(SETTINGS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="8 requests, 4 at a time, at most 64 new tokens")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    run_stamp = stamp()
    if args.quick:
        args.requests, args.workers, args.max_new = 8, 4, 64
    model = ensure_model("smollm2")
    reqs = workload(args.requests, args.seed, args.max_new)
    rows = [run_setting(model, s, *SETTINGS[s], reqs, args.workers, args.max_total_tokens) for s in args.settings]
    write(rows, args, args.name or ("pressure_quick" if args.quick else "pressure"), run_stamp)


if __name__ == "__main__":
    main()
