"""SGLang's own multi-turn benchmark shape (benchmark/hicache/bench_multiturn.py in SGLang's repository), served
by stock and by a profile at the same KV bytes.

bench_multiturn is not in the SGLang wheel; this client follows its arguments and its loop: --num-clients
clients, each --num-rounds rounds; every client's next request waits in one ready queue, popped at random
(--ready-queue-policy) by a sender that starts one request per interval (Poisson or uniform at
--request-rate, bench_multiturn's --distribution) while fewer than --max-parallel are in flight; a request is
the client's whole history, its answer of --output-length tokens (greedy, ignore_eos) and a new input of
--request-length tokens are appended for its next round. So a client "thinks" while its next round waits
for the sender, and more clients are open than the pool holds. Differences, on purpose: the inputs are
token-exact slices of the repository's documents (real text, which compression scores as it would score
chat; bench_multiturn samples ShareGPT or random tokens), sent as input_ids to /generate, so a history is
re-sent token for token and every server sees the same ids; one request rate per run (no auto sweep).

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.multiturn_rounds --num-clients 12 --num-rounds 4 \\
        --request-length 512 --output-length 64 --request-rate 1 --max-parallel 8 --max-total-tokens 8192 \\
        --servers tangram stock-lpm tangram-1.0 --repeats 3
    # writes benchmarks/results/serving/multiturn_rounds.{json,md,png}

Servers are think_time's (stock-lpm: stock's best for multi-turn here; tangram: the profile as launched;
tangram-1.0: the uniform ratio-1.0 control). Per server: requests/s (bench_multiturn's throughput), the share
of later rounds' prompts read from the cache (meta_info.cached_tokens), per round, TTFT p50 / p99 (streamed),
prompt tokens prefilled, the profile's reuse counters.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

from benchmarks.common.client import post_json, stream_events
from benchmarks.common.corpus import repo_texts
from benchmarks.common.log import logger
from benchmarks.common.models import ensure_model
from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.report_tables import rounds_table, think_figures
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from benchmarks.serving.think_time import CORPUS, PROFILES, SERVERS, close_session, plot, report_problems, run_server

os.environ.setdefault("TANGRAM_INTEGRITY_CHECK", "1")
log = logger("multiturn_rounds")


class Inputs:
    """Every client's first input and the new input of each later round: --request-length tokens of the
    corpus each, consecutive slices from a seeded offset, so no two clients share a first input."""

    def __init__(self, model_path: str, args):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path)
        corpus = tok.encode("\n\n".join(repo_texts(CORPUS)), add_special_tokens=False)
        n, length = args.num_clients * args.num_rounds, args.request_length
        if args.num_clients * length > len(corpus):
            raise SystemExit(f"--num-clients x --request-length exceed the corpus ({len(corpus)} tokens)")
        start = random.Random(args.seed).randrange(len(corpus))
        self.slices = [[corpus[(start + k * length + j) % len(corpus)] for j in range(length)] for k in range(n)]
        self.num_clients = args.num_clients

    def piece(self, client: int, round_: int) -> list[int]:
        """Round round_'s (0-based) new input of a client: first inputs are slices 0..C-1."""
        return self.slices[round_ * self.num_clients + client]


def generate_stream(url: str, ids: list[int], output_length: int, timeout: float = 3600,
                    session: dict | None = None) -> dict:
    """One streamed /generate of token ids (greedy, ignore_eos): output_ids, ttft_s, seconds, meta_info.
    session: extra top-level fields ({"session_id": ...} or {"session_params": {"id": ...}}). A server silent
    for timeout seconds raises TimeoutError (the connection closes: the server aborts the request)."""
    body = {"input_ids": ids, "stream": True, **(session or {}),
            "sampling_params": {"temperature": 0, "max_new_tokens": output_length, "ignore_eos": True}}
    t0, ttft, last = time.perf_counter(), None, None
    for last in stream_events(url, "/generate", body, timeout):
        if last.get("output_ids") and ttft is None:
            ttft = time.perf_counter() - t0
    if last is None:
        raise RuntimeError("the stream ended with no data")
    return dict(output_ids=list(last.get("output_ids") or []), meta=last.get("meta_info") or {},
                ttft_s=ttft if ttft is not None else time.perf_counter() - t0, seconds=time.perf_counter() - t0)


class Sessions:
    """How a client names its session (think_time.SERVERS' third field): False, none (the whole history every
    round); True, a session_id per client for SGLang's session radix cache (the whole history every round,
    /close_session after the last); "streaming", a streaming session (/open_session with streaming: each round
    sends only its new input, the session holds the history's KV; closed after the last round or a stall)."""

    def __init__(self, url: str, mode, tag: str):
        self.url, self.mode, self.tag, self.ids = url, mode, tag, {}

    def fields(self, client: int) -> dict:
        if not self.mode:
            return {}
        if client not in self.ids:
            self.ids[client] = (post_json(self.url + "/open_session", {"capacity_of_str_len": 1 << 24,
                                                                       "streaming": True})
                                if self.mode == "streaming" else f"rounds-{client}-{self.tag}")
        sid = self.ids[client]
        return {"session_params": {"id": sid}} if self.mode == "streaming" else {"session_id": sid}

    def sent(self, history: list[int], new: list[int]) -> list[int]:
        """The ids a round sends: a streaming session's history is the server's."""
        return new if self.mode == "streaming" else history + new

    def close(self, client: int) -> None:
        if client in self.ids:
            close_session(self.url, self.ids.pop(client))


def run_clients(url: str, inputs: Inputs, args, mode=False) -> dict:
    """bench_multiturn's loop (see the module docstring); returns per-round records per client. mode: how
    clients name their sessions (Sessions). A round the server leaves silent for --request-timeout seconds is
    a stall: recorded, the client gives up (its later rounds are not sent) and its session is closed."""
    rng = random.Random(args.seed)
    sessions = Sessions(url, mode, f"{time.time():.0f}")
    results = [dict(session=c, turns=[]) for c in range(args.num_clients)]
    ready = [(c, [], list(inputs.piece(c, 0))) for c in range(args.num_clients)]
    lock, errors, stalled = threading.Lock(), [], []
    state = dict(in_flight=0, pending=args.num_clients * args.num_rounds)
    t_start = time.perf_counter()

    def request(client: int, history: list[int], new: list[int]) -> None:
        round_ = len(results[client]["turns"])
        nxt, ids = None, history + new
        try:
            out = generate_stream(url, sessions.sent(history, new), args.output_length, args.request_timeout,
                                  sessions.fields(client))
            results[client]["turns"].append(dict(
                turn=round_ + 1, prompt_tokens=out["meta"].get("prompt_tokens", len(ids)),
                cached_tokens=out["meta"].get("cached_tokens", 0), ttft_s=round(out["ttft_s"], 3),
                seconds=round(out["seconds"], 3)))
            if round_ + 1 < args.num_rounds:
                nxt = (client, ids + out["output_ids"], inputs.piece(client, round_ + 1))
            else:
                results[client]["done_at"] = round(time.perf_counter() - t_start, 2)
                sessions.close(client)
        except TimeoutError:
            stalled.append(dict(client=client, round=round_ + 1, at_s=round(time.perf_counter() - t_start, 2)))
            _close_quietly(sessions, client, errors)
        except Exception as exc:  # noqa: BLE001 - every failure is reported and fails the run
            errors.append(f"client {client} round {round_ + 1}: {type(exc).__name__}: {str(exc)[:300]}")
        with lock:
            state["in_flight"] -= 1
            state["pending"] -= 1 if nxt else args.num_rounds - round_
            if nxt:
                ready.append(nxt)

    def pop():
        with lock:
            if not ready or state["in_flight"] >= args.max_parallel:
                return None
            state["in_flight"] += 1
            return ready.pop(rng.randrange(len(ready)) if args.ready_queue_policy == "random" else 0)

    last_log = time.perf_counter()
    while True:
        with lock:
            if state["pending"] <= 0:
                break
            full = state["in_flight"] >= args.max_parallel
        if full:
            time.sleep(0.05)
            continue
        item = pop()
        if item is not None:
            threading.Thread(target=request, args=item, daemon=True).start()
        time.sleep(rng.expovariate(args.request_rate) if args.distribution == "poisson"
                   else rng.uniform(0, 2 / args.request_rate))
        if time.perf_counter() - last_log >= 30:
            done = sum(len(r["turns"]) for r in results)
            log(f"  {time.perf_counter() - t_start:.0f} s: {done} requests done, {len(stalled)} stalled, "
                f"{len(errors)} errors")
            last_log = time.perf_counter()
    return dict(wall_s=round(time.perf_counter() - t_start, 2), sessions=results, errors=errors, stalled=stalled)


def _close_quietly(sessions: Sessions, client: int, errors: list) -> None:
    """Close a stalled client's session; a server that cannot is an error of the run, not of the stall."""
    try:
        sessions.close(client)
    except Exception as exc:  # noqa: BLE001 - reported with the run's errors
        errors.append(f"client {client}: closing its session after a stall: {type(exc).__name__}: {str(exc)[:200]}")


def summarize(run: dict) -> str:
    f = think_figures(run)
    return (f"{f['turns']} requests, {f['turns_per_s']:.3f} requests/s, later rounds reused {100 * f['reuse']:.1f}%, "
            f"TTFT p50 {f['ttft_p50']:.1f} s p99 {f['ttft_p99']:.1f} s, prefilled {f['prefilled']}, "
            f"{len(run.get('stalled', []))} stalled, {len(run['errors'])} errors")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # bench_multiturn's arguments (its defaults are sized for a GPU: 256 clients, 128 in parallel, 5 rounds)
    ap.add_argument("--num-clients", type=int, default=12)
    ap.add_argument("--max-parallel", type=int, default=8)
    ap.add_argument("--request-length", type=int, default=512)
    ap.add_argument("--output-length", type=int, default=64)
    ap.add_argument("--num-rounds", type=int, default=4)
    ap.add_argument("--distribution", choices=["poisson", "uniform"], default="poisson")
    ap.add_argument("--request-rate", type=float, default=1.0)
    ap.add_argument("--ready-queue-policy", choices=["random", "fifo"], default="random")
    ap.add_argument("--seed", type=int, default=1)
    # the servers compared, at the same KV bytes
    ap.add_argument("--model", default="smollm2", choices=sorted(PROFILES))
    ap.add_argument("--profile", default=None, help="default: the model's shipped FastKVzip profile")
    ap.add_argument("--ratio", type=float, default=None, help="default: the profile's default ratio")
    ap.add_argument("--servers", nargs="+", default=["tangram", "stock-lpm", "tangram-1.0"], choices=list(SERVERS))
    ap.add_argument("--max-total-tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--request-timeout", type=float, default=3600,
                    help="seconds a round may wait for the server's first data before it counts as stalled")
    ap.add_argument("--port", type=int, default=31881)   # fuzz serves on 31871-31872
    ap.add_argument("--out", default=result_path("serving", "multiturn_rounds.json"))
    args = ap.parse_args(argv)
    if min(args.num_clients, args.num_rounds, args.max_parallel, args.request_length) < 1 or args.request_rate <= 0:
        ap.error("clients, rounds, --max-parallel and --request-length must be positive, --request-rate above 0")
    args.profile = args.profile or PROFILES[args.model]
    if args.ratio is None:
        from tangram_sglang.profile import load_profile

        args.ratio = load_profile(os.path.join(ROOT, args.profile)).default_ratio
    return args


def main(argv=None) -> int:
    args = parse(argv)
    run_stamp, model_path = stamp(argv), ensure_model(args.model)
    inputs = Inputs(model_path, args)
    runs = []
    for repeat in range(args.repeats):
        for name in args.servers:
            mode = SERVERS[name][2]
            run = run_server(name, model_path, args, None, summary=summarize,
                             client=lambda url, mode=mode: run_clients(url, inputs, args, mode))
            runs.append({**run, "repeat": repeat})
    res = dict(args=vars(args), model_path=model_path, runs=runs)
    write_json(args.out, res, run_stamp)
    write_markdown(os.path.splitext(args.out)[0] + ".md", "SGLang's multi-turn benchmark shape at the same KV bytes",
                   rounds_table(res), run_stamp)
    plot(res, os.path.splitext(args.out)[0] + ".png", "round", f"History reused, {args.num_clients} clients at "
         f"{args.request_rate:g} requests/s, same KV bytes")
    return report_problems(runs, args.out)


if __name__ == "__main__":
    sys.exit(main())
