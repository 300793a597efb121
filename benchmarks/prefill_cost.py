"""Prefill cost of each scorer in the served path, against stock SGLang's full-KV prefill.

One server at a time (stock, then one per --profiles entry, same --max-total-tokens), each sent the
same --prompts distinct real-text prompts of --prompt-tokens tokens, one at a time, max_new_tokens 1
(so the request time is its prefill plus one sampling step). Prompts share no prefix (different
offsets of the repo's docs), so nothing is reused from the radix tree. A warm-up request first.
Reported: median seconds per request and the ratio to stock, measured in one run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prefill_cost.py \\
        --profiles configs/smollm2-snapkv.yaml configs/smollm2-fastkvzip.yaml
    # writes benchmarks/results/prefill_cost.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "launch"))

from tangram_sglang.server_process import ServerProcess  # noqa: E402

CORPUS = ["README.md", "configs/CALIBRATION.md", "configs/reference-regularity.md", "DESIGN.md"]


def prompts(tok, count: int, tokens: int) -> list[list[int]]:
    text = "\n".join(open(os.path.join(ROOT, f)).read() for f in CORPUS if os.path.exists(os.path.join(ROOT, f)))
    ids = tok.encode(text)
    while len(ids) < tokens * (count + 1):
        ids = ids + ids[::-1]  # enough distinct material; reversed copies share no prefix with the original
    step = (len(ids) - tokens) // (count + 1)
    return [ids[i * step + 1:i * step + 1 + tokens] for i in range(count + 1)]


def generate(url: str, ids: list[int]) -> float:
    body = json.dumps({"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 1}}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        json.loads(r.read())
    return time.perf_counter() - t0


def measure(model_path: str, profile: str | None, reqs: list[list[int]], args) -> dict:
    extra = ["--max-total-tokens", str(args.max_total_tokens)]
    if profile and args.ratio:
        extra += ["--tangram-ratio", str(args.ratio)]
    with ServerProcess(model_path, port=args.port, profile=profile, extra_args=extra) as server:
        generate(server.url, reqs[0])  # warm-up
        times = [generate(server.url, ids) for ids in reqs[1:]]
    name = "stock SGLang (full KV)" if profile is None else os.path.basename(profile)
    return {"server": name, "profile": profile, "median_s": round(statistics.median(times), 4),
            "times_s": [round(t, 4) for t in times]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--profiles", nargs="+", required=True)
    ap.add_argument("--ratio", type=float, default=None, help="profile entry to serve (default: its default)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--max-total-tokens", type=int, default=32768)
    ap.add_argument("--port", type=int, default=31700)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "prefill_cost"))
    args = ap.parse_args(argv)
    from models import ensure_model
    from transformers import AutoTokenizer

    model_path = ensure_model(args.model)
    reqs = prompts(AutoTokenizer.from_pretrained(model_path), args.prompts, args.prompt_tokens)
    rows = [measure(model_path, None, reqs, args)]
    for p in args.profiles:
        rows.append(measure(model_path, os.path.abspath(p), reqs, args))
    base = rows[0]["median_s"]
    for r in rows:
        r["vs_stock"] = round(r["median_s"] / base, 3)
    result = {"model": args.model, "prompt_tokens": args.prompt_tokens, "prompts": args.prompts,
              "ratio": args.ratio, "rows": rows, "command": "python benchmarks/prefill_cost.py " +
              " ".join(sys.argv[1:] if argv is None else argv)}
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"`{result['command']}`", "",
             f"{args.model}, {args.prompts} prompts of {args.prompt_tokens} tokens, one at a time, "
             "max_new_tokens 1, float32 CPU (one thread per server), servers in turn in one run.", "",
             "| server | median s per prefill | vs stock |", "|---|---|---|"]
    lines += [f"| {r['server']} | {r['median_s']} | {r['vs_stock']} |" for r in rows]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
