"""Multi-turn sessions that pause between turns: does a server keep the histories that come back?

Users read and type between turns, and more sessions are open than the KV pool holds. S sessions
arrive over --arrival-window seconds; each is --turns turns over the OpenAI chat API (streamed,
greedy): turns 1..turns-1 each bring a new document of about --doc-tokens tokens (real text, the
first one carrying a fact) and ask for a one-sentence summary, the last turn asks for the fact.
Between turns a session pauses for a think time drawn per session and turn (--think: exponential,
or pareto: a Lomax of shape 1.5, heavy-tailed, with the same --think-mean).

Servers (--servers, each launched in turn with the same --max-total-tokens, i.e. the same KV bytes;
--repeats alternates them):
  stock-fcfs, stock-lpm            stock SGLang, default policy / longest prefix match first
  stock-lpm-sessions               stock lpm with --enable-session-radix-cache, requests carry session_id,
                                   each session closed after its last turn (/close_session)
  stock-lpm-tlru                   stock lpm with --radix-eviction-policy tlru (Tail-Optimized LRU)
  tangram-sessions                 the profile (lpm) with --enable-session-radix-cache, the same clients
  stock-lpm-pdi, tangram-pdi, ...  with SGLang's --prefill-decode-interval 1 (decode rounds between prefills)
  tangram, tangram-fcfs            --tangram-profile at --ratio, its default policy (lpm) / SGLang's fcfs
  tangram-1.0, tangram-1.0-fcfs    a uniform ratio-1.0 profile (no compression): the data-plane control
  tangram-replies                  the profile with --tangram-replies compressed (long replies compressed)
  tangram-host, tangram-1.0-host   with a compressed host tier of 2 pools' bytes (--tangram-host-ratio 2)
  stock-lpm-host-bytes             stock lpm given 3x the KV bytes on the device: the bound on stock HiCache
                                   with the same device and host bytes (which does not run on a CPU)
  tangram-host-sessions, stock-lpm-sessions-host-bytes   the two above with session ids and
                                   --enable-session-radix-cache

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.think_time --sessions 16 --max-total-tokens 8192
    # writes benchmarks/results/serving/think_time.{json,md}

Per server: answers right (the fact's digits in the last turn's reply), turns/s, the share of later
turns' prompts read from the cache (usage.prompt_tokens_details.cached_tokens, --enable-cache-report),
per turn, streamed TTFT p50 / p99, prompt tokens prefilled, and the profile's reuse counters.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time

from benchmarks.common.client import HEADERS, server_state, stream_events
from benchmarks.common.report_tables import think_by_server as _by_server
from benchmarks.common.report_tables import think_figures as figures
from benchmarks.common.report_tables import think_time_table as fmt_md
from benchmarks.common.corpus import repo_texts
from benchmarks.common.log import logger
from benchmarks.common.models import ensure_model, uniform_profile_path
from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.sglang.server_process import ServerProcess

os.environ.setdefault("TANGRAM_INTEGRITY_CHECK", "1")
log = logger("think_time")
CORPUS = ["README.md", "configs/CALIBRATION.md", "configs/reference-regularity.md", "docs/architecture.md",
          "docs/results.md", "docs/calibration.md", "docs/cpu.md", "docs/gpu.md"]
PROFILES = {"smollm2": "configs/smollm2-fastkvzip.yaml", "qwen2.5-0.5b": "configs/qwen2.5-0.5b-fastkvzip.yaml"}
# name -> (profile kind: None / "shipped" / "uniform", extra args, session ids: False, True or "streaming")
SERVERS = {
    "stock-fcfs": (None, [], False),
    "stock-lpm": (None, ["--schedule-policy", "lpm"], False),
    "stock-lpm-sessions": (None, ["--schedule-policy", "lpm", "--enable-session-radix-cache"], True),
    # SGLang's Tail-Optimized LRU (arXiv:2510.15152): a history's tail past what a 2,048-token prefill
    # budget needs for the next turn (a document of ~800 tokens) goes first, then LRU; the profile refuses it
    "stock-lpm-tlru": (None, ["--schedule-policy", "lpm", "--radix-eviction-policy", "tlru",
                              "--radix-eviction-policy-config", '{"threshold": 2048, "next_prompt_estimate": 800}'],
                       False),
    "tangram": ("shipped", [], False),
    "tangram-fcfs": ("shipped", ["--schedule-policy", "fcfs"], False),
    "tangram-1.0": ("uniform", [], False),
    # the assistant's replies compressed once the next turn closes them (kept whole by default)
    "tangram-replies": ("shipped", ["--tangram-replies", "compressed"], False),
    "tangram-1.0-fcfs": ("uniform", ["--schedule-policy", "fcfs"], False),
    "tangram-sessions": ("shipped", ["--enable-session-radix-cache"], True),
    # SGLang's --prefill-decode-interval: a decode round after each prefill batch, so a turn's reply is not
    # held back by the prefills queued behind it (its next turn waits on the whole reply, not the first token)
    "stock-lpm-pdi": (None, ["--schedule-policy", "lpm", "--prefill-decode-interval", "1"], False),
    "tangram-pdi": ("shipped", ["--prefill-decode-interval", "1"], False),
    "tangram-1.0-pdi": ("uniform", ["--prefill-decode-interval", "1"], False),
    # The compressed host tier: evicted history kept in host memory of HOST_RATIO pools, loaded back on a
    # match; stock HiCache cannot run on this CPU (its host pool's transfers are sgl_kernel CUDA ops), so
    # its bound is stock given the device and host bytes together as device KV (no transfer cost at all).
    "tangram-host": ("shipped", ["--tangram-host-ratio", "2"], False),
    "tangram-1.0-host": ("uniform", ["--tangram-host-ratio", "2"], False),
    "stock-lpm-host-bytes": (None, ["--schedule-policy", "lpm"], False),
    # the same with session ids and SGLang's session radix cache on both sides
    "tangram-host-sessions": ("shipped", ["--tangram-host-ratio", "2", "--enable-session-radix-cache"], True),
    "stock-lpm-sessions-host-bytes": (None, ["--schedule-policy", "lpm", "--enable-session-radix-cache"], True),
    # SGLang's streaming sessions (/open_session with streaming, each request only the new tokens): the session
    # keeps its KV row between turns, outside the tree's eviction; the profile refuses them (multiturn_rounds only)
    "stock-lpm-streaming": (None, ["--schedule-policy", "lpm", "--enable-streaming-session"], "streaming"),
}
HOST_RATIO = 2
BYTES_SCALE = {"stock-lpm-host-bytes": 1 + HOST_RATIO,   # servers given more device bytes than the others
               "stock-lpm-sessions-host-bytes": 1 + HOST_RATIO}


# -- workload -------------------------------------------------------------------------------------
class Workload:
    """Each session's documents (token-exact slices of the repo's docs, decoded to text), its fact and
    its arrival time and think times, all from --seed."""

    def __init__(self, model_path: str, args):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path)
        corpus = tok.encode("\n\n".join(repo_texts(CORPUS)), add_special_tokens=False)
        docs = args.turns - 1
        need = args.doc_tokens * docs
        if need >= len(corpus):
            raise SystemExit(f"--doc-tokens {args.doc_tokens} x {docs} documents exceed the corpus ({len(corpus)} tokens)")
        rng = random.Random(args.seed)
        step = max(1, (len(corpus) - need) // max(1, args.sessions))
        self.sessions = []
        for i in range(args.sessions):
            off = i * step
            texts = [tok.decode(corpus[off + k * args.doc_tokens: off + (k + 1) * args.doc_tokens]) for k in range(docs)]
            code = rng.randrange(10000, 99999)
            half = len(texts[0]) // 2
            texts[0] = texts[0][:half] + f"\n\nThe access code of archive {i + 1} is {code}.\n\n" + texts[0][half:]
            think = [_think(rng, args.think, args.think_mean) for _ in range(args.turns - 1)]
            self.sessions.append(dict(index=i, docs=texts, code=str(code), think=think,
                                      arrival=i * args.arrival_window / max(1, args.sessions - 1)))
        self.max_tokens = args.max_tokens

    def user_turn(self, s: dict, turn: int) -> str:
        if turn <= len(s["docs"]):
            return f"Document {turn}:\n{s['docs'][turn - 1]}\n\nSummarize document {turn} in one sentence."
        return f"What is the access code of archive {s['index'] + 1}? Reply with the number only."


def _think(rng: random.Random, kind: str, mean: float) -> float:
    if mean <= 0:
        return 0.0
    if kind == "exponential":
        return rng.expovariate(1.0 / mean)
    shape = 1.5  # Lomax: mean = scale / (shape - 1)
    return mean * (shape - 1) * (rng.paretovariate(shape) - 1)


# -- one streamed chat turn -----------------------------------------------------------------------
def close_session(url: str, session_id: str) -> None:
    """POST /close_session: the user left (with the session radix cache its history loses its references)."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/close_session", body=json.dumps({"session_id": session_id}), headers=HEADERS)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/close_session: HTTP {resp.status}")
    finally:
        conn.close()


def chat_turn(url: str, messages: list[dict], max_tokens: int, session_id: str | None,
              timeout: float = 3600) -> dict:
    """One streamed /v1/chat/completions (greedy); returns text, ttft_s, seconds, usage."""
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if session_id is not None:
        body["session_id"] = session_id
    t0, ttft, text, usage = time.perf_counter(), None, [], None
    for chunk in stream_events(url, "/v1/chat/completions", body, timeout):
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                text.append(piece)
    return dict(text="".join(text), ttft_s=ttft if ttft is not None else time.perf_counter() - t0,
                seconds=time.perf_counter() - t0, usage=usage or {})


def run_sessions(url: str, wl: Workload, with_session_ids: bool) -> dict:
    """Every session in its own thread, arriving and pausing on its schedule; returns per-turn records."""
    results, errors = [dict(session=s["index"], turns=[]) for s in wl.sessions], []
    t_start = time.perf_counter()

    def session(s: dict) -> None:
        time.sleep(s["arrival"])
        messages, sid = [], f"think-{s['index']}-{t_start}" if with_session_ids else None
        try:
            for turn in range(1, len(s["docs"]) + 2):
                if turn > 1:
                    time.sleep(s["think"][turn - 2])
                messages.append({"role": "user", "content": wl.user_turn(s, turn)})
                out = chat_turn(url, messages, wl.max_tokens if turn <= len(s["docs"]) else 16, sid)
                messages.append({"role": "assistant", "content": out["text"]})
                usage = out["usage"]
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                results[s["index"]]["turns"].append(dict(
                    turn=turn, prompt_tokens=usage.get("prompt_tokens", 0), cached_tokens=cached,
                    ttft_s=round(out["ttft_s"], 3), seconds=round(out["seconds"], 3)))
            results[s["index"]]["right"] = s["code"] in "".join(out["text"].split())
            if sid is not None:
                close_session(url, sid)
            results[s["index"]]["done_at"] = round(time.perf_counter() - t_start, 2)
        except Exception as exc:  # noqa: BLE001 - every failure is reported and fails the run
            errors.append(f"session {s['index']}: {type(exc).__name__}: {str(exc)[:300]}")

    threads = [threading.Thread(target=session, args=(s,), daemon=True) for s in wl.sessions]
    for t in threads:
        t.start()
    last = time.perf_counter()
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        if time.perf_counter() - last >= 30:
            done = sum("done_at" in r for r in results)
            turns = sum(len(r["turns"]) for r in results)
            log(f"  {time.perf_counter() - t_start:.0f} s: {turns} turns, {done}/{len(results)} sessions done, "
                f"{len(errors)} errors")
            last = time.perf_counter()
    return dict(wall_s=round(time.perf_counter() - t_start, 2), sessions=results, errors=errors)


# -- servers --------------------------------------------------------------------------------------
def run_server(name: str, model_path: str, args, wl: Workload | None, client=None, summary=None) -> dict:
    """One of SERVERS at --max-total-tokens (its BYTES_SCALE) with the benchmark's flags; client(url) -> the
    run's records (default: wl's think-time sessions), then the server's counters; logs summary(run)."""
    kind, extra, sessions = SERVERS[name]
    tokens = args.max_total_tokens * BYTES_SCALE.get(name, 1)
    extra = ["--max-total-tokens", str(tokens), "--enable-cache-report", "--sleep-on-idle", *extra]
    profile = None
    if kind == "shipped":
        profile, extra = os.path.join(ROOT, args.profile), extra + ["--tangram-ratio", str(args.ratio)]
    elif kind == "uniform":
        profile = uniform_profile_path(model_path)
    log(f"[{name}] starting on port {args.port}")
    with ServerProcess(model_path, port=args.port, profile=profile, extra_args=extra) as srv:
        run = client(srv.url) if client else run_sessions(srv.url, wl, sessions)
        state = server_state(srv.url, timeout=120)
    pool = (state.get("tangram") or {}).get("pool_info")
    out = dict(server=name, **run, batch_counters=state.get("batch_counters", {}))
    if pool is not None:
        out["pool_info"] = pool
    log(f"[{name}] {(summary or summarize)(out)}")
    return out


# -- figures (the tables are report_tables', stdlib only, so the docs check needs no venv) ----------------
def summarize(run: dict) -> str:
    f = figures(run)
    return (f"right {f['right']}/{f['sessions']}, {f['turns_per_s']:.3f} turns/s, later turns reused "
            f"{100 * f['reuse']:.1f}%, TTFT p50 {f['ttft_p50']:.1f} s p99 {f['ttft_p99']:.1f} s, "
            f"prefilled {f['prefilled']}, {len(run['errors'])} errors")


def plot(res: dict, path: str, axis: str = "turn", title: str | None = None) -> None:
    """Share of each later turn's (round's) prompt read from the cache, per server (median over the runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name: [figures(r)["reuse_per_turn"] for r in rs] for name, rs in _by_server(res).items()}
    turns = sorted({k for rs in runs.values() for per in rs for k in per})
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / max(1, len(runs))
    for i, (name, rs) in enumerate(runs.items()):
        ys = [100 * statistics.median(per.get(k, 0.0) for per in rs) for k in turns]
        ax.bar([t + (i - (len(runs) - 1) / 2) * width for t in turns], ys, width, label=name)
    ax.set_xticks(turns)
    ax.set_xlabel(axis)
    ax.set_ylabel("prompt read from the cache (%)")
    ax.set_title(title or f"History reused under think time (mean {res['args']['think_mean']} s), same KV bytes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_problems(runs: list[dict], out: str) -> int:
    """Log each request's error, each stall of a profile's server and each pool whose integrity check failed: 1
    (the run fails) if any, else 0."""
    problems = [f"{r['server']}: {e}" for r in runs for e in r["errors"]]
    # a stall of stock's (a streaming session's pinned KV) is what the run measures; one of the profile's fails it
    problems += [f"{r['server']}: round {s['round']} of client {s['client']} stalled" for r in runs
                 if not r["server"].startswith("stock") for s in r.get("stalled", [])]
    problems += [f"{r['server']}: pool integrity {r['pool_info'].get('integrity')}" for r in runs
                 if r.get("pool_info") and r["pool_info"].get("integrity") != "ok"]
    for p in problems:
        log(f"PROBLEM {p}")
    log(f"wrote {out}")
    return 1 if problems else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=sorted(PROFILES))
    ap.add_argument("--profile", default=None, help="default: the model's shipped FastKVzip profile")
    ap.add_argument("--ratio", type=float, default=None, help="default: the profile's default ratio")
    ap.add_argument("--servers", nargs="+", default=["tangram", "tangram-fcfs", "stock-lpm", "tangram-1.0"],
                    choices=[n for n, (_, _, ids) in SERVERS.items() if ids != "streaming"])
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4, help="documents + the final question")
    ap.add_argument("--doc-tokens", type=int, default=700)
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens of each summary")
    ap.add_argument("--arrival-window", type=float, default=30.0)
    ap.add_argument("--think", choices=["exponential", "pareto"], default="exponential")
    ap.add_argument("--think-mean", type=float, default=8.0)
    ap.add_argument("--max-total-tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=31851)
    ap.add_argument("--out", default=result_path("serving", "think_time.json"))
    args = ap.parse_args(argv)
    args.profile = args.profile or PROFILES[args.model]
    if args.ratio is None:
        from tangram_sglang.profile import load_profile

        args.ratio = load_profile(os.path.join(ROOT, args.profile)).default_ratio
    run_stamp, model_path = stamp(argv), ensure_model(args.model)
    wl = Workload(model_path, args)
    runs = []
    for repeat in range(args.repeats):
        for name in args.servers:
            runs.append({**run_server(name, model_path, args, wl), "repeat": repeat})
    res = dict(args=vars(args), model_path=model_path, runs=runs)
    write_json(args.out, res, run_stamp)
    write_markdown(os.path.splitext(args.out)[0] + ".md", "Multi-turn sessions with think time at the same KV bytes",
                   fmt_md(res), run_stamp)
    plot(res, os.path.splitext(args.out)[0] + ".png")
    return report_problems(runs, args.out)


if __name__ == "__main__":
    sys.exit(main())
