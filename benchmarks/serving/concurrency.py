"""Concurrency benchmark: with the same KV pool bytes, how many long sessions does each server hold at once?

Stock SGLang and Tangram (--tangram-profile, one server per --ratios entry) are launched in turn with
the same --max-total-tokens T: stock gets T full-KV token slots, Tangram a ragged pool of the same
bytes. S sessions start together (one thread each), each a --turns-turn chat over /generate with
input_ids, every turn sent as soon as the previous answer arrives:

  turn 1  chat template + a real-text slice of --prompt-tokens tokens (repo docs, a different offset
          per session, so sessions share no prefix) -> --max-new-tokens generated
  turn k  turn k-1's prompt + its output + end of turn + --new-tokens more real text -> --max-new-tokens

greedy (temperature 0), ignore_eos, so every request decodes exactly --max-new-tokens tokens. After
the run the server's /server_info gives batch_counters.peak_running (the most requests ever decoding
together) and, for Tangram, pool_info (pages, bytes saved, integrity). Exits non-zero if any request
fails or returns the wrong number of tokens, or if the Tangram pool integrity is not "ok".

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.concurrency --sessions 16 --max-total-tokens 6144 \
        --ratios 0.25 0.5
    # writes benchmarks/results/serving/concurrency.{json,md}

A session's turn k reuses its history only while that history is still in the radix tree, so the
turns-per-second ratio depends on how many sessions' histories the pool holds: report it with the
workload (--turns, --sessions, --max-total-tokens) beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
import urllib.error

from benchmarks.common.client import generate, get_json, server_state
from benchmarks.common.corpus import repo_texts
from benchmarks.common.log import logger
from benchmarks.common.models import ensure_model, uniform_profile_path
from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.sglang.server_process import ServerProcess

os.environ.setdefault("TANGRAM_INTEGRITY_CHECK", "1")  # the servers started here check their pool on /server_info

CORPUS = ["README.md", "configs/CALIBRATION.md", "configs/reference-regularity.md"]
log = logger("concurrency")


def template_pieces(tok) -> tuple[str, str, str]:
    """The chat template's text before a first user message, between a user message and the reply, and
    between a reply and the next user message (ChatML: system turn + '<|im_start|>user\\n',
    '<|im_end|>\\n<|im_start|>assistant\\n', '<|im_end|>\\n<|im_start|>user\\n')."""
    a, b, c = "QQA7", "QQB7", "QQC7"
    one = tok.apply_chat_template([{"role": "user", "content": a}], tokenize=False, add_generation_prompt=True)
    two = tok.apply_chat_template([{"role": "user", "content": a}, {"role": "assistant", "content": b},
                                   {"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
    head, tail = one.split(a)
    return head, tail, two.split(b)[1].split(c)[0]


class Workload:
    """Token ids of every session's turns, from the model's tokenizer and the repo's docs."""

    def __init__(self, model_path: str, sessions: int, prompt_tokens: int, new_tokens: int, turns: int = 2):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path)
        self.corpus: list[int] = []
        for text in repo_texts(CORPUS):
            self.corpus += tok.encode(text, add_special_tokens=False)
        head, tail, next_user = template_pieces(tok)
        self.head = tok.encode(head, add_special_tokens=False)
        self.tail = tok.encode(tail, add_special_tokens=False)
        self.next_user = tok.encode(next_user, add_special_tokens=False)
        body = prompt_tokens - len(self.head) - len(self.tail)
        span = len(self.corpus) - body - (turns - 1) * new_tokens
        if body <= 0 or span <= 0:
            raise SystemExit(f"--prompt-tokens {prompt_tokens} does not fit the corpus of {len(self.corpus)} tokens")
        step = max(1, span // max(1, sessions))
        self.turn1, self.later_text = [], []
        for i in range(sessions):
            off = (i * step) % span
            self.turn1.append(self.head + self.corpus[off: off + body] + self.tail)
            # Later turns' new text: the tokens right after this session's slice (real, continuing text).
            ends = [off + body + k * new_tokens for k in range(turns)]
            self.later_text.append([self.corpus[a:b] for a, b in zip(ends, ends[1:])])
        # --plain-replies: the template's special tokens barred from replies, so an ignore_eos reply stays one
        # message (unbarred, a small model ends its answer and writes the next turn's markers itself)
        self.plain_bias = {str(t): -100.0 for t in sorted(set(tok.all_special_ids))}
        firsts = {tuple(t[len(self.head): len(self.head) + 8]) for t in self.turn1}
        if len(firsts) != sessions:
            raise SystemExit("two sessions start with the same text: pick fewer sessions or a shorter prompt")

    @property
    def turns(self) -> int:
        return 1 + len(self.later_text[0])

    def next_turn(self, i: int, prompt: list[int], output_ids: list[int], turn: int) -> list[int]:
        """Turn ``turn`` (2..turns) of session i: the previous prompt, its answer and new text."""
        return prompt + output_ids + self.next_user + self.later_text[i][turn - 2] + self.tail


def run_sessions(url: str, wl: Workload, max_new: int, poll_s: float, plain: bool = False) -> dict:
    n = len(wl.turn1)
    results: list[dict] = [dict(session=i) for i in range(n)]
    errors: list[str] = []
    barrier = threading.Barrier(n + 1)
    samples: list[dict] = []
    stop = threading.Event()

    def session(i: int) -> None:
        r = results[i]
        try:
            barrier.wait()
            ids, got = wl.turn1[i], []
            for turn in range(1, wl.turns + 1):
                if turn > 1:
                    ids = wl.next_turn(i, ids, got, turn)
                t0 = time.perf_counter()
                out = generate(url, ids, max_new, ignore_eos=True, timeout=1800,
                               logit_bias=wl.plain_bias if plain else None)
                dt = time.perf_counter() - t0
                got = list(out.get("output_ids") or [])
                meta = out.get("meta_info", {})
                r[f"turn{turn}"] = dict(prompt_tokens=len(ids), output_tokens=len(got), seconds=round(dt, 3),
                                        cached_tokens=meta.get("cached_tokens"),
                                        finish_reason=(meta.get("finish_reason") or {}).get("type"))
                if len(got) != max_new:
                    raise RuntimeError(f"turn {turn}: {len(got)} output tokens, expected {max_new}; "
                                       f"response {json.dumps(out)[:300]}")
            r["done_at"] = time.perf_counter()
        except Exception as exc:  # noqa: BLE001 - every failure is reported and fails the run
            msg = exc.read().decode(errors="replace")[:300] if isinstance(exc, urllib.error.HTTPError) else str(exc)
            errors.append(f"session {i}: {type(exc).__name__}: {msg}")

    def poller() -> None:
        t_start = time.perf_counter()
        while not stop.wait(poll_s):
            try:
                st = server_state(url)
            except Exception:  # noqa: BLE001 - a missed sample is fine
                continue
            s = dict(t=round(time.perf_counter() - t_start, 1), **st.get("batch_counters", {}))
            pool = (st.get("tangram") or {}).get("pool_info")
            if pool:
                s["pages_used"] = pool["pages_used"]
            samples.append(s)

    threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    poll = threading.Thread(target=poller, daemon=True) if poll_s > 0 else None
    barrier.wait()
    t0 = time.perf_counter()
    if poll:
        poll.start()
    last_report = t0
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        if time.perf_counter() - last_report >= 30:
            done = sum("done_at" in r for r in results)
            last = samples[-1] if samples else {}
            log(f"  {time.perf_counter() - t0:.0f} s: {done}/{n} sessions done, {len(errors)} errors; "
                f"server running={last.get('running')} waiting={last.get('waiting')} "
                f"peak_running={last.get('peak_running')}")
            last_report = time.perf_counter()
    wall = time.perf_counter() - t0
    stop.set()
    if poll:
        poll.join()
    for r in results:
        if "done_at" in r:
            r["done_at"] = round(r["done_at"] - t0, 3)
    return dict(wall_s=wall, sessions=results, errors=errors, samples=samples)


def log_findings(path: str) -> dict:
    """Lines of the server log worth reporting: retractions, errors, tracebacks, Tangram warnings
    (not the server_args dump, nor the import / platform warnings every CPU launch prints)."""
    with open(path, errors="replace") as f:
        lines = [ln.rstrip() for ln in f if "server_args=" not in ln]
    noise = re.compile(r"Ignore import error|UserWarning: Only|warnings\.warn")
    pat = re.compile(r"retract|error|traceback|exception|out of memory|tangram:", re.I)
    hits = [ln[:300] for ln in lines if pat.search(ln) and not noise.search(ln)]
    retract = [ln for ln in lines if "Retract requests" in ln]
    return dict(retract_lines=len(retract), retract=retract[-5:], notable=hits[-20:])


KV_BYTES = {"fp8_e4m3": 1, "fp8_e5m2": 1}  # per value; "auto": --model-kv-bytes (the model's KV type)
# stock SGLang as a user could run it (--stock-variants): (extra server arguments, extra environment)
STOCK_VARIANTS = {
    "fcfs": ([], {}),                                             # SGLang's default
    "lpm": (["--schedule-policy", "lpm"], {}),                    # longest prefix match first
    "refresh": ([], {"TANGRAM_REFRESH_WAITING": "1"}),             # Tangram's waiting-queue refresh, no profile
    "lpm-refresh": (["--schedule-policy", "lpm"], {"TANGRAM_REFRESH_WAITING": "1"}),
}


def is_plain_stock(m: dict) -> bool:
    """The reference of 'vs stock': stock SGLang as launched by default (fcfs), the model's KV type."""
    return m["ratio"] is None and m.get("kv_cache_dtype", "auto") == "auto" and m.get("stock_variant", "fcfs") == "fcfs"


def run_mode(name: str, model_path: str, port: int, args, wl: Workload, ratio: float | None,
             total_tokens: int, kv_dtype: str = "auto", variant: str = "fcfs", control: bool = False,
             replies: str = "whole") -> dict:
    """One server's run. total_tokens: full-KV tokens of the pool bytes at float32; with an FP8 kv_dtype
    the server gets the tokens those bytes hold at one byte a value (the same bytes). variant: a
    STOCK_VARIANTS key (stock servers only). control: serve a uniform ratio-1.0 profile of the model
    (ratio must be 1.0): Tangram's data plane and scheduling without compression. replies: the profile's
    --tangram-replies."""
    group = total_tokens
    total_tokens = total_tokens * args.model_kv_bytes // KV_BYTES.get(kv_dtype, args.model_kv_bytes)
    extra = ["--max-total-tokens", str(total_tokens)] + (["--kv-cache-dtype", kv_dtype] if kv_dtype != "auto" else [])
    variant_args, variant_env = STOCK_VARIANTS[variant]
    extra += variant_args
    profile = None
    if control:
        profile = uniform_profile_path(model_path)
    elif ratio is not None:
        profile = os.path.join(ROOT, args.profile)
        extra += ["--tangram-ratio", str(ratio)] + (["--tangram-replies", replies] if replies != "whole" else [])
    log(f"[{name}] starting server on port {port} (--max-total-tokens {total_tokens}"
        + (f", profile {profile} ratio {ratio})" if profile else ")"))
    t_launch = time.perf_counter()
    server = ServerProcess(model_path, port=port, profile=profile, extra_args=extra)
    server.env.update(variant_env)
    with server as srv:
        log(f"[{name}] server ready in {time.perf_counter() - t_launch:.0f} s; log {srv.log_path}")
        info0 = get_json(srv.url + "/server_info")
        served_T = info0.get("max_total_num_tokens")
        if ratio is None and served_T is not None and served_T != total_tokens:
            raise SystemExit(f"[{name}] server reports max_total_num_tokens={served_T}, asked "
                             f"{total_tokens}: the override did not take")
        log(f"[{name}] running {len(wl.turn1)} sessions x {wl.turns} turns")
        run = run_sessions(srv.url, wl, args.max_new_tokens, args.poll, args.plain_replies)
        log(f"[{name}] done in {run['wall_s']:.1f} s, {len(run['errors'])} errors; reading /server_info")
        st = server_state(srv.url, timeout=120)
        findings = log_findings(srv.log_path)
    counters = st.get("batch_counters", {})
    tangram = st.get("tangram") or {}
    pool = tangram.get("pool_info")
    out = dict(mode=name, ratio=ratio, control=control, replies=replies, max_total_tokens=total_tokens, bytes_of_tokens=group, kv_cache_dtype=kv_dtype,
               stock_variant=variant if ratio is None else None,
               server_max_total_num_tokens=served_T, batch_counters=counters,
               peak_running=counters.get("peak_running"),
               peak_running_polled=max((s.get("running") or 0 for s in run["samples"]), default=None),
               wall_s=round(run["wall_s"], 2), errors=run["errors"], log=findings,
               sessions=run["sessions"], samples=run["samples"])
    if pool is not None:
        out["pool_info"] = pool
        out["pool_bytes"] = pool["pool_bytes"]
        out["peak_pages_used_polled"] = max((s.get("pages_used") or 0 for s in run["samples"]), default=None)
    log(f"[{name}] peak_running={out['peak_running']} (polled max {out['peak_running_polled']}), "
        f"retract log lines={findings['retract_lines']}"
        + (f", pages peak {pool['peak_pages_used']}/{pool['pages_total']}, integrity {pool['integrity']}"
           if pool else ""))
    return out


def launch_refused(name: str, model_path: str, port: int, args, wl: Workload, ratio, total: int, kv_dtype: str,
                   variant: str = "fcfs", control: bool = False, replies: str = "whole"):
    """run_mode, or None with the reason logged when the server does not start (stock SGLang 0.5.23
    refuses FP8 KV on a CPU without Intel AMX)."""
    try:
        return run_mode(name, model_path, port, args, wl, ratio, total, kv_dtype, variant, control, replies)
    except (RuntimeError, TimeoutError, OSError, SystemExit) as exc:
        log(f"[{name}] did not start: {str(exc)[-300:]}")
        return None


def summary(modes: list[dict]) -> list[str]:
    """Per mode and pool bytes over the repeats: turns/s and peak sessions, median [min, max], against the
    plain stock server (fcfs, model KV type) and the best stock server (any variant and KV type that ran)
    of the same bytes in the same repeat."""
    import statistics

    key = lambda m: (m["bytes_of_tokens"], m.get("repeat", 0))  # noqa: E731
    stock = {key(m): m for m in modes if is_plain_stock(m)}
    best: dict = {}
    for m in modes:
        if m["ratio"] is None and turns_per_s(m) > best.get(key(m), 0.0):
            best[key(m)] = turns_per_s(m)
    rows: dict = {}
    for m in modes:
        ref = stock.get(key(m))
        r = rows.setdefault((m["mode"], m["bytes_of_tokens"]), {"tps": [], "vs": [], "best": [], "peak": []})
        r["tps"].append(turns_per_s(m))
        r["peak"].append(m["peak_running"] or 0)
        if ref:
            r["vs"].append(turns_per_s(m) / turns_per_s(ref))
        if key(m) in best:
            r["best"].append(turns_per_s(m) / best[key(m)])
    med = lambda xs: f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]" if xs else "-"  # noqa: E731
    lines = ["| mode | bytes of T model-type tokens | runs | turns / s, median [min, max] | vs stock | vs best stock | "
             "peak concurrent sessions |", "|---|---|---|---|---|---|---|"]
    for (mode, group), r in rows.items():
        lines.append(f"| {mode} | {group} | {len(r['tps'])} | {med(r['tps'])} | {med(r['vs'])} | {med(r['best'])} "
                     f"| {med(r['peak'])} |")
    return lines


def full_kv_token_bytes(model_path: str, dtype_bytes: int = 4) -> int:
    with open(os.path.join(model_path, "config.json")) as f:
        cfg = json.load(f)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * dtype_bytes


def turns_per_s(mode: dict) -> float:
    """Completed turns (every session's) per second of the mode's wall time."""
    turns = sum(k.startswith("turn") for s in mode["sessions"] for k in s)
    return turns / max(mode["wall_s"], 1e-9)


def later_reuse(mode: dict) -> tuple[int, int]:
    """(cached prompt tokens, prompt tokens) over every session's turns 2+."""
    later = [v for s in mode["sessions"] for k, v in s.items() if k.startswith("turn") and k != "turn1"]
    return sum(t["cached_tokens"] or 0 for t in later), sum(t["prompt_tokens"] for t in later)


def fmt_md(res: dict) -> str:
    a = res["args"]
    lines = [f"Workload: {a['sessions']} sessions started together, {a.get('turns', 2)} turns each over /generate "
             f"(input_ids), each turn sent when the previous answer arrives: turn 1 = {a['prompt_tokens']}-token "
             f"prompt (repo docs, a different offset per session), turn k = turn k-1 + its output + "
             f"{a['new_tokens']} new tokens (+ chat markers); {a['max_new_tokens']} tokens "
             f"generated per turn (greedy, ignore_eos). {os.path.basename(res.get('model_path', 'SmolLM2-135M-Instruct'))}, float32 KV, CPU, "
             f"OMP_NUM_THREADS=1. Each stock server and the Tangram servers after it get the same "
             f"`--max-total-tokens` T (the KV bytes of T full-KV tokens); 'vs stock' compares with the stock "
             f"server of the same T.", "",
             "| mode | T | pool MiB | peak concurrent sessions | vs stock | pool pages used peak | "
             "saved vs full KV (end) | turn-2+ reuse | wall s | wall vs stock | turns / s | turns / s vs stock |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    stocks = {(m.get("bytes_of_tokens", m["max_total_tokens"]), m.get("repeat", 0)): m for m in res["modes"]
              if is_plain_stock(m)}
    for m in res["modes"]:
        stock = stocks[(m.get("bytes_of_tokens", m["max_total_tokens"]), m.get("repeat", 0))]
        pool = m.get("pool_info")
        pages = f"{pool['peak_pages_used']} / {pool['pages_total']}" if pool else "-"
        saved = f"{100 * pool['saved_vs_full_kv']:.1f}%" if pool else "-"
        hit, total = later_reuse(m)
        lines.append(f"| {m['mode']} | {m['max_total_tokens']} | {m['pool_bytes'] / 2**20:.1f} | {m['peak_running']} | "
                     f"{m['peak_running'] / stock['peak_running']:.2f}x | {pages} | {saved} | "
                     f"{100 * hit / max(1, total):.0f}% | {m['wall_s']:.1f} | "
                     f"{m['wall_s'] / stock['wall_s']:.2f} | {turns_per_s(m):.3f} | "
                     f"{turns_per_s(m) / turns_per_s(stock):.2f}x |")
    lines += ["", "Over the repeats (alternating servers):", "", *summary(res["modes"])]
    if res.get("refused"):
        lines += ["", "Did not start: " + "; ".join(res["refused"])]
    lines += ["", "Peak concurrent sessions = `batch_counters.peak_running` from `/server_info` after the run: the "
              "most requests ever in one decode batch. Pool MiB: stock = T x full-KV bytes per token; Tangram = "
              "`pool_info.pool_bytes` (the ragged pool sized from the same bytes). Saved vs full KV: "
              "`pool_info.saved_vs_full_kv` at the end of the run (the radix tree's cached sessions). Wall times "
              "are from the same run on a shared 2-core machine: compare them only as ratios.", ""]
    for m in res["modes"]:
        t2, p2 = later_reuse(m)
        computed = sum(t["prompt_tokens"] - (t["cached_tokens"] or 0)
                       for s in m["sessions"] for k, t in s.items() if k.startswith("turn"))
        lines.append(f"- {m['mode']}: " + ("" if m["memory_bound"] else "NOT pool-bound (all sessions ran "
                     "together: the peak is a lower bound); ") + f"turn-2+ prompt cache hits {t2} of {p2} "
                     f"tokens ({100 * t2 / max(1, p2):.0f}%); prompt tokens prefilled (all turns) {computed}; "
                     f"retraction lines in the server log: {m['log']['retract_lines']}"
                     + (f"; pool integrity: {m['pool_info']['integrity']}" if m.get("pool_info") else ""))
    lines += ["", "Turn-2+ cache hits: a session's next turn reuses its history only if that history is still "
              "in the radix tree when the turn is admitted. SGLang admits in arrival order (fcfs); with the pool "
              "full, admitting other sessions' turns evicts finished histories, least recently used first, after "
              "the waiting turns' histories are touched head of the queue last (stock: on one scheduling pass in "
              "32; Tangram: on every pass where the queue changed), so a server that holds more sessions' "
              "histories re-prefills less (the shared system prompt is what every server keeps)."]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--max-total-tokens", type=int, nargs="+", default=[6144],
                    help="KV bytes of T full-KV tokens per server; several: one stock + Tangram set each")
    ap.add_argument("--ratios", type=float, nargs="*", default=[0.25], help="Tangram ratios (one server each)")
    ap.add_argument("--profile", default="configs/smollm2-snapkv.yaml")
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "qwen2.5-0.5b", "gemma3-270m"],
                    help="launch/models.py name; its profile is --profile")
    ap.add_argument("--prompt-tokens", type=int, default=1400)
    ap.add_argument("--new-tokens", type=int, default=60, help="new user text per later turn")
    ap.add_argument("--turns", type=int, default=2, help="turns per session (>= 1)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--stock-port", type=int, default=31811)
    ap.add_argument("--tangram-port", type=int, default=31812)
    ap.add_argument("--poll", type=float, default=2.0, help="seconds between /server_info samples (0: none)")
    ap.add_argument("--no-stock", action="store_true", help="skip the stock server (debugging only)")
    ap.add_argument("--out", default=result_path("serving", "concurrency.json"))
    ap.add_argument("--kv-cache-dtype", nargs="+", default=["auto"], choices=["auto", *sorted(KV_BYTES)],
                    help="KV types to serve at the same bytes (an FP8 server gets model-kv-bytes x the tokens)")
    ap.add_argument("--model-kv-bytes", type=int, default=4, help="bytes per KV value of the model's type "
                    "(4: float32 on CPU; 2: bfloat16 on a GPU)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of every server, alternating")
    ap.add_argument("--stock-variants", nargs="+", default=["fcfs"], choices=list(STOCK_VARIANTS),
                    help="stock servers to run (the first must be fcfs, the reference of 'vs stock'): lpm = "
                    "--schedule-policy lpm; refresh = Tangram's waiting-queue refresh without a profile")
    ap.add_argument("--plain-replies", action="store_true", help="bar the tokenizer's special tokens from replies "
                    "(logit_bias): each reply one assistant message of --max-new-tokens, none ending early")
    ap.add_argument("--replies", nargs="+", default=["whole"], choices=["whole", "compressed"],
                    help="each Tangram ratio served once per --tangram-replies value (compressed: mode +replies)")
    ap.add_argument("--control", action="store_true", help="also serve a uniform ratio-1.0 profile of the model "
                    "(tangram-1.0): the gain over stock splits into data plane and compression")
    args = ap.parse_args(argv)
    if "fcfs" not in args.stock_variants:
        ap.error("--stock-variants needs fcfs: the reference of 'vs stock'")
    run_stamp = stamp(argv)
    model_path = ensure_model(args.model)
    t_all = time.perf_counter()
    log(f"tokenizing the workload: {args.sessions} sessions, {args.prompt_tokens}-token prompts")
    if args.turns < 1:
        raise SystemExit("--turns must be at least 1")
    wl = Workload(model_path, args.sessions, args.prompt_tokens, args.new_tokens, args.turns)
    from tangram_sglang.profile import load_profile

    method = load_profile(args.profile).calibration.method
    modes, refused = [], []
    for repeat in range(args.repeats):
        for total in args.max_total_tokens:
            for kv in args.kv_cache_dtype:
                tag = "" if kv == "auto" else f"+{kv}"
                variants = [] if args.no_stock else args.stock_variants if kv == "auto" else ["fcfs"]
                runs = [("stock" + ("" if v == "fcfs" else f"-{v}") + tag, args.stock_port, None, v, False, "whole")
                        for v in variants]
                runs += [(f"tangram-{method}@{ratio}{tag}" + ("" if rp == "whole" else "+replies"), args.tangram_port,
                          ratio, "fcfs", False, rp) for ratio in args.ratios for rp in args.replies]
                if args.control:
                    runs.append((f"tangram-1.0{tag}", args.tangram_port, 1.0, "fcfs", True, "whole"))
                for name, port, ratio, variant, control, replies in runs:
                    m = launch_refused(name, model_path, port, args, wl, ratio, total, kv, variant, control, replies)
                    if m is None:
                        refused.append(f"{name} (T={total})")
                        continue
                    m["repeat"] = repeat
                    if ratio is None:
                        m["pool_bytes"] = total * full_kv_token_bytes(model_path)
                    modes.append(m)

    res = dict(args=vars(args), model_path=model_path, full_kv_token_bytes=full_kv_token_bytes(model_path),
               total_s=round(time.perf_counter() - t_all, 1), modes=modes, refused=sorted(set(refused)))
    problems = []
    for m in modes:
        problems += [f"{m['mode']}: {e}" for e in m["errors"]]
        pool = m.get("pool_info")
        if pool is not None and pool.get("integrity") != "ok":
            problems.append(f"{m['mode']}: pool integrity {pool.get('integrity')}")
    res["problems"] = problems
    for m in modes:
        m["memory_bound"] = bool(m["peak_running"] and m["peak_running"] < args.sessions)
        if not m["memory_bound"]:
            log(f"WARNING {m['mode']}: peak {m['peak_running']} = all {args.sessions} sessions: the pool did not "
                "bind, so this is only a lower bound (run with more --sessions)")
    stocks = {(m["bytes_of_tokens"], m["repeat"]): m for m in modes if is_plain_stock(m)}
    for m in modes:
        stock = stocks.get((m["bytes_of_tokens"], m["repeat"]))
        if m["ratio"] is not None and stock and stock["peak_running"]:
            log(f"T={m['max_total_tokens']} {m['mode']}: {m['peak_running']} concurrent sessions vs stock "
                f"{stock['peak_running']}, turns/s {turns_per_s(m) / turns_per_s(stock):.2f}x stock")
    write_json(args.out, res, run_stamp)
    if not args.no_stock:
        title = f"Concurrency: {args.sessions} sessions x {args.turns} turns at the same KV bytes"
        write_markdown(os.path.splitext(args.out)[0] + ".md", title, fmt_md(res), run_stamp)
    log(f"wrote {args.out} ({res['total_s']} s in all)")
    if problems:
        for p in problems:
            log(f"PROBLEM {p}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
