"""Prefill cost of each scorer in the served path, against stock SGLang's full-KV prefill.

All servers run at once (stock, then one per --profiles entry, same --max-total-tokens, one thread
each) but only one works at a time: each of --prompts distinct real-text prompts of --prompt-tokens
tokens goes to every server in turn (max_new_tokens 1: the request time is its prefill plus one
sampling step), so each prompt's timings share the machine's load of that moment. Prompts share no
prefix (different offsets of the repo's docs): nothing is reused from the radix tree. A warm-up
request first. Reported: median seconds per request, and the median over prompts of each server's
time over stock's on the same prompt.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.timing.prefill_cost \\
        --profiles configs/smollm2-snapkv.yaml configs/smollm2-fastkvzip.yaml
    # writes benchmarks/results/timing/prefill_cost.{json,md}
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.common.client import generate
from benchmarks.common.corpus import distinct_prompts
from benchmarks.common.models import ensure_model
from benchmarks.common.paths import result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.sglang.server_process import ServerProcess

# real text for the prompts (the repository's docs; missing files are skipped)
CORPUS = ["README.md", "configs/CALIBRATION.md", "configs/reference-regularity.md", "DESIGN.md"]


def prompts(tok, count: int, tokens: int) -> list[list[int]]:
    """count + 1 prompts of ``tokens`` ids sharing no prefix (the first is a warm-up)."""
    return distinct_prompts(tok, CORPUS, count, tokens)


def prefill_seconds(url: str, ids: list[int]) -> float:
    """Wall time of one request of ``ids`` with max_new_tokens 1: its prefill and one sampling step."""
    t0 = time.perf_counter()
    generate(url, ids, 1)
    return time.perf_counter() - t0


def measure(model_path: str, profiles: list[str | None], reqs: list[list[int]], args) -> list[dict]:
    """Start every server, then time each prompt on each server in turn."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        servers = []
        for i, profile in enumerate(profiles):
            # idle SGLang schedulers poll: with every server up on 2 cores they would steal the working one's CPU
            extra = ["--max-total-tokens", str(args.max_total_tokens), "--sleep-on-idle"]
            if profile and args.ratio:
                extra += ["--tangram-ratio", str(args.ratio)]
            servers.append(stack.enter_context(ServerProcess(model_path, port=args.port + i, profile=profile,
                                                             extra_args=extra, start_timeout=900)))
        for server in servers:
            prefill_seconds(server.url, reqs[0])  # warm-up
        times = [[] for _ in servers]
        for ids in reqs[1:]:
            for i, server in enumerate(servers):
                times[i].append(prefill_seconds(server.url, ids))
    rows = []
    for profile, t in zip(profiles, times):
        rows.append({"server": "stock SGLang (full KV)" if profile is None else os.path.basename(profile),
                     "profile": profile, "median_s": round(statistics.median(t), 4), "times_s": [round(x, 4) for x in t],
                     "vs_stock": round(statistics.median(a / b for a, b in zip(t, times[0])), 3)})
    return rows


def uniform_profile_file(model_path: str, ratio: float) -> str:
    """A uniform-scorer profile of the model at ratio, in a temporary folder (named by its ratio)."""
    import tempfile

    from tangram_sglang.profile import ModelShape
    from tangram_sglang.profile.uniform import uniform_profile

    path = os.path.join(tempfile.mkdtemp(prefix="prefill-cost-"), f"uniform-{ratio:g}.yaml")
    uniform_profile(ModelShape.from_model_path(model_path), [ratio]).save(path)
    return path


def write_report(out: str, title: str, result: dict, lines: list[str], run_stamp: dict) -> None:
    """OUT.json (the result) and OUT.md (the lines), both stamped, and the Markdown on stdout."""
    write_json(out + ".json", result, run_stamp)
    print(write_markdown(out + ".md", title, lines, run_stamp))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--profiles", nargs="+", required=True)
    ap.add_argument("--ratio", type=float, default=None, help="profile entry to serve (default: its default)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--max-total-tokens", type=int, default=32768)
    ap.add_argument("--port", type=int, default=31700)
    ap.add_argument("--uniform", action="store_true", help="also serve a uniform-scorer profile at --ratio "
                    "(tokens ranked by nothing: the data plane's and compression's cost without a scorer)")
    ap.add_argument("--out", default=result_path("timing", "prefill_cost"), help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    run_stamp = stamp(argv)
    from transformers import AutoTokenizer

    model_path = ensure_model(args.model)
    reqs = prompts(AutoTokenizer.from_pretrained(model_path), args.prompts, args.prompt_tokens)
    profiles = [os.path.abspath(p) for p in args.profiles]
    if args.uniform:
        profiles.insert(0, uniform_profile_file(model_path, args.ratio or 1.0))
    rows = measure(model_path, [None] + profiles, reqs, args)
    result = {"model": args.model, "prompt_tokens": args.prompt_tokens, "prompts": args.prompts,
              "ratio": args.ratio, "rows": rows}
    lines = [f"{args.model}, {args.prompts} prompts of {args.prompt_tokens} tokens, one at a time, "
             "max_new_tokens 1, float32 CPU (one thread per server); every prompt goes to each server in "
             "turn (one busy at a time).", "",
             "| server | median s per prefill | vs stock (median of per-prompt ratios) |", "|---|---|---|"]
    lines += [f"| {r['server']} | {r['median_s']} | {r['vs_stock']} |" for r in rows]
    write_report(args.out, "Served prefill cost per scorer against stock SGLang", result, lines, run_stamp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
