"""Multi-replica serving: two Tangram servers behind sglang-router, cache-aware vs round-robin,
against one server with the same total KV bytes.

S multi-turn sessions (C at a time) are replayed as text over /generate; turn k of a session is
its turn k-1 prompt + answer + a new user message (real text from the repo's docs), so a server
that still holds the session's history serves turn k from cache (``cached_tokens``). Settings,
each on fresh servers:

  cache_aware   router --policy cache_aware, 2 replicas of --max-total-tokens T each
  round_robin   router --policy round_robin, the same 2 replicas
  single        one server of 2T (the same KV bytes in total), no router

Reported per setting: wall time and turns per second (same machine, one run: compare as ratios),
turn-2+ reuse (cached / prompt tokens of turns 2+), requests each replica admitted
(its pool's counter), and every turn's answer length (a wrong count fails the run).

    .venv/bin/python -m benchmarks.serving.replicas --sessions 16 --turns 4
    # -> benchmarks/results/serving/replicas.{md,json}
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common.client import generate, pool_info
from benchmarks.common.corpus import repo_texts
from benchmarks.common.log import logger
from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.sglang.server_process import RouterProcess, ServerProcess, start_all

CORPUS = ("README.md",)
log = logger("replicas")


def user_messages(sessions: int, turns: int, words: int) -> list[list[str]]:
    """Each session's user messages: consecutive slices of the docs (distinct per session)."""
    text = [word for t in repo_texts(CORPUS) for word in t.split()]
    need = sessions * turns * words
    text = (text * (need // max(1, len(text)) + 1))[:need]
    return [[" ".join(text[(s * turns + t) * words:(s * turns + t + 1) * words]) for t in range(turns)]
            for s in range(sessions)]


def chatml(history: str, user: str) -> str:
    return f"{history}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def replay(url: str, messages: list[list[str]], concurrency: int, max_new: int) -> dict:
    """All sessions through ``url``; returns per-turn records and the wall time."""
    system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"

    def session(s: int) -> list[dict]:
        history, out = system, []
        for t, msg in enumerate(messages[s]):
            prompt = chatml(history, msg)
            r = generate(url, prompt, max_new, ignore_eos=True, timeout=1800)
            m = r["meta_info"]
            if m["completion_tokens"] != max_new:
                raise RuntimeError(f"session {s} turn {t + 1}: {m['completion_tokens']} tokens, expected {max_new}")
            out.append({"turn": t + 1, "prompt_tokens": m["prompt_tokens"], "cached_tokens": m["cached_tokens"]})
            history = prompt + r["text"] + "<|im_end|>\n"
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        records = list(pool.map(session, range(len(messages))))
    return {"wall_s": time.perf_counter() - t0, "sessions": records}


def admitted(url: str) -> int:
    return int(pool_info(url)["admitted"])


def summarize(name: str, run: dict, replica_load: list[int]) -> dict:
    turns = [t for s in run["sessions"] for t in s]
    later = [t for t in turns if t["turn"] > 1]
    prompt, cached = sum(t["prompt_tokens"] for t in later), sum(t["cached_tokens"] for t in later)
    return {"setting": name, "turns": len(turns), "wall_s": round(run["wall_s"], 1),
            "turns_per_s": round(len(turns) / run["wall_s"], 3), "turn2_reuse": round(cached / max(prompt, 1), 3),
            "turn2_prompt_tokens": prompt, "turn2_cached_tokens": cached, "replica_admitted": replica_load}


def run_setting(name: str, args, messages) -> dict:
    port0 = args.port
    extra = ["--max-total-tokens", str(args.max_total_tokens * (2 if name == "single" else 1))]
    n = 1 if name == "single" else 2
    servers = [ServerProcess(args.model, port=port0 + 1 + i, profile=args.profile,
                             extra_args=extra + (["--tangram-ratio", str(args.ratio)] if args.ratio else []),
                             log_path=f"/tmp/replicas-{name}-{i}.log") for i in range(n)]
    try:
        start_all(servers)
        before = [admitted(s.url) for s in servers]  # start-up health checks generate too
        if name == "single":
            run = replay(servers[0].url, messages, args.concurrency, args.max_new_tokens)
        else:
            with RouterProcess([s.url for s in servers], port=port0, policy=name, log_path=f"/tmp/replicas-router-{name}.log"):
                run = replay(f"http://127.0.0.1:{port0}", messages, args.concurrency, args.max_new_tokens)
        load = [admitted(s.url) - b for s, b in zip(servers, before)]
    finally:
        for s in servers:
            s.stop()
    out = summarize(name, run, load)
    log(json.dumps(out))
    return out


def report(rows: list[dict], args) -> list[str]:
    base = next((r for r in rows if r["setting"] == "single"), None)
    lines = [f"{args.sessions} sessions x {args.turns} turns ({args.words} words per user message, "
             f"{args.max_new_tokens} tokens per answer, {args.concurrency} sessions at a time), "
             f"profile {os.path.relpath(args.profile, ROOT)} at ratio {args.ratio}; replicas of {args.max_total_tokens} stock KV tokens' "
             f"bytes each, single server {2 * args.max_total_tokens}. Wall times from one run on a shared machine: "
             "compare as ratios.", "",
             "| setting | turns | wall s | turns / s | vs single | turn-2+ reuse | admissions per replica |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        rel = f"{r['turns_per_s'] / base['turns_per_s']:.2f}x" if base else "-"
        lines.append(f"| {r['setting']} | {r['turns']} | {r['wall_s']} | {r['turns_per_s']} | {rel} | "
                     f"{r['turn2_reuse']:.0%} ({r['turn2_cached_tokens']} / {r['turn2_prompt_tokens']}) | "
                     f"{' / '.join(map(str, r['replica_admitted']))} |")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/tangram_sglang/models/SmolLM2-135M-Instruct"))
    ap.add_argument("--profile", default=os.path.join(ROOT, "configs/smollm2-fastkvzip.yaml"))
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--words", type=int, default=120)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-total-tokens", type=int, default=4096)
    ap.add_argument("--settings", nargs="+", default=["cache_aware", "round_robin", "single"])
    ap.add_argument("--port", type=int, default=31800)
    ap.add_argument("--out", default=result_path("serving", "replicas"), help="writes OUT.md and OUT.json")
    ap.add_argument("--report-only", action="store_true", help="rewrite OUT.md from OUT.json (and its stamp)")
    args = ap.parse_args(argv)
    title = "Replicas behind sglang-router against one server of the same KV bytes"
    if args.report_only:
        with open(args.out + ".json") as f:
            recorded = json.load(f)
        if "stamp" not in recorded:
            raise SystemExit(f"{args.out}.json has no stamp (it predates them): its .md stays as written")
        write_markdown(args.out + ".md", title, report(recorded["rows"], args), recorded["stamp"])
        return
    run_stamp = stamp(argv)
    messages = user_messages(args.sessions, args.turns, args.words)
    rows = [run_setting(name, args, messages) for name in args.settings]
    write_json(args.out + ".json", {"args": vars(args), "rows": rows}, run_stamp)
    print(write_markdown(args.out + ".md", title, report(rows, args), run_stamp))


if __name__ == "__main__":
    main()
