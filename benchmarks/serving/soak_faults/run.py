"""The soak's command line and run."""

from __future__ import annotations

import argparse
import collections
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common.client import call, log_tracebacks
from benchmarks.common.log import logger
from benchmarks.serving import soak_faults
from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from benchmarks.serving.soak_faults.after_load import logged_retractions, plot, pool_after, replay, traceback_excerpts
from benchmarks.serving.soak_faults.client import Soak
from benchmarks.serving.soak_faults.fleet import (
    MODELS,
    REPLICA_PORTS,
    ROUTER_ARGS,
    ROUTER_PORT,
    Fleet,
    alive_pid,
    flush,
    model_id,
    tree_rss_mb,
    wait_idle,
    warm_up,
)
from benchmarks.serving.soak_faults.outcomes import attribute_kill, rss_check, summarize
from benchmarks.serving.soak_faults.plan import Turn, burst_turns, chat_payload
from benchmarks.serving.soak_faults.report import report

log = logger("soak")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=soak_faults.__doc__.split("\n")[0])
    ap.add_argument("--model", choices=list(MODELS), default="smollm2")
    ap.add_argument("--sessions", type=int, default=1000, help="at least this many sessions start")
    ap.add_argument("--minutes", type=float, default=60, help="and the load lasts at least this long")
    ap.add_argument("--clients", type=int, default=16, help="client threads, a session at a time each")
    ap.add_argument("--max-total-tokens", type=int, default=None, help="default: the model's (MODELS)")
    ap.add_argument("--bursts", type=float, nargs="*", default=[0.2, 0.7],
                    help="pressure bursts, as shares of --minutes (none: no burst)")
    ap.add_argument("--burst-size", type=int, default=12, help="long ignore_eos requests sent at once per burst")
    ap.add_argument("--kill-at", type=float, default=0.4, help="the kill, as a share of --minutes (<0: none)")
    ap.add_argument("--kill-replica", type=int, default=1, choices=range(len(REPLICA_PORTS)))
    ap.add_argument("--restart-after", type=float, default=30)
    ap.add_argument("--kill-grace", type=float, default=10, help="errors this long after the restart still count")
    ap.add_argument("--request-timeout", type=float, default=600, help="every request's client timeout")
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--check-sessions", type=int, default=0,
                    help="finished sessions replayed alone afterwards (0: every one)")
    ap.add_argument("--rss-tolerance", type=float, default=0.10, help="end RSS within this share of the start")
    ap.add_argument("--progress-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="24 sessions, >= 3 min, 6 clients, one burst of 8")
    ap.add_argument("--name", default=None, help="results name (default soak_<model>, soak_quick_<model>)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sessions, args.minutes, args.clients = 24, 3, 6
        args.sample_s, args.progress_every, args.bursts, args.burst_size = 5, 4, [0.2], 8
    run_stamp = stamp(argv)
    name = args.name or (f"soak_quick_{args.model}" if args.quick else f"soak_{args.model}")
    result = run(args)
    result["command"] = run_stamp["command"]
    result["plot"] = plot(result["samples"], result["kill"], result_path("serving", f"{name}.png"),
                          f"{result['model']}, {result['profile']} at {result['ratio']}: two replicas behind "
                          f"sglang-router, {result['summary']['sessions']} sessions")
    title = (f"Soak with faults: {result['model']}, FastKVzip at {result['ratio']}, two replicas behind "
             f"sglang-router, {result['summary']['sessions']} sessions over {result['load_minutes']} min")
    print(write_markdown(result_path("serving", f"{name}.md"), title, report(result, args), run_stamp))
    requests = result.pop("requests")
    write_json(result_path("serving", f"{name}.json"), {"args": vars(args), "result": result, "requests": requests},
               run_stamp, row_per_line="requests")


def run(args) -> dict:
    """Start the replicas and the router, warm up, run the load with the kill, check after it; the result."""
    from benchmarks.common.corpus import essay_texts
    from benchmarks.common.models import ensure_model
    from tangram_sglang.sglang.server_process import RouterProcess, ServerProcess, start_all

    os.environ.setdefault("TANGRAM_INTEGRITY_CHECK", "1")  # the servers check their pool on /server_info
    key, profile, ratio, max_total = MODELS[args.model]
    max_total = args.max_total_tokens or max_total
    model_path = ensure_model(key)
    words = " ".join(essay_texts()).split()
    extra = ["--tangram-ratio", str(ratio), "--max-total-tokens", str(max_total), "--sleep-on-idle",
             "--enable-cache-report"]

    def make(i: int, suffix: str):
        return ServerProcess(model_path, port=REPLICA_PORTS[i], profile=os.path.join(ROOT, profile), extra_args=extra,
                             log_path=f"/tmp/tangram-soak-{args.model}-replica{i}{suffix}.log")

    t_start = time.time()
    fleet = Fleet(make, t_start)
    router = None
    try:
        log(f"starting replicas on {REPLICA_PORTS} ({model_path})")
        start_all(fleet.slots)
        model = model_id(fleet.slots[0].url)
        for srv in fleet.slots:
            warm_up(srv.url, model, words)
            flush(srv.url)
        time.sleep(2)
        start_rss = [tree_rss_mb(alive_pid(s)) for s in fleet.slots]
        start_pool = [pool_after(s.url) for s in fleet.slots]
        log(f"warm: RSS {[round(r) for r in start_rss]} MiB, pages used {[p.get('pages_used') for p in start_pool]}")
        # After the start level: the router's health check is a one-token generate (SGLang's /health), whose
        # token stays in the tree (a page per layer and KV head) until the next flush
        router = RouterProcess([s.url for s in fleet.slots], port=ROUTER_PORT, policy="cache_aware",
                               log_path=f"/tmp/tangram-soak-{args.model}-router.log", extra_args=ROUTER_ARGS).start()

        t0 = time.time()
        fleet.t0 = t0  # sample and kill times count from the start of the load
        fleet.sample()
        sampler = threading.Thread(target=fleet.sampler, args=(args.sample_s,), daemon=True)
        sampler.start()
        chaos = None
        if args.kill_at >= 0:
            chaos = threading.Thread(target=fleet.kill_and_restart, daemon=True, args=(
                args.kill_replica, args.kill_at * args.minutes * 60, args.restart_after,
                lambda url: warm_up(url, model, words)))
            chaos.start()
        soak = Soak(router.url, model, words, args, t0)
        bursts = [threading.Thread(target=soak.burst, daemon=True, args=(
            at * args.minutes * 60, burst_turns(args.seed, b, args.burst_size, len(words))))
            for b, at in enumerate(args.bursts)]
        for b in bursts:
            b.start()
        with ThreadPoolExecutor(args.clients) as ex:
            for f in [ex.submit(soak.client) for _ in range(args.clients)]:
                f.result()
        for b in bursts:
            b.join()
        load_s = time.time() - t0
        log(f"load done: {len(soak.sessions)} sessions, {len(soak.requests)} requests in {load_s / 60:.1f} min")
        if chaos is not None:
            chaos.join()

        windows = [(fleet.kill["killed_s"], fleet.kill.get("ready_s", load_s) + args.kill_grace)] \
            if fleet.kill.get("killed_s") is not None else []
        attribute_kill(soak.requests, windows)
        healthy = call(router.url + "/v1/chat/completions", chat_payload(
            model, [{"role": "user", "content": "Hello"}], Turn(0, 0, 0, 4, 0, False)), timeout=120)[0] == 200
        router.stop()  # its health checks would put a token back in the tree between the flush and the count
        idle = [wait_idle(s.url) for s in fleet.slots]
        before = [pool_after(s.url) for s in fleet.slots]
        flushed = [flush(s.url) for s in fleet.slots]
        time.sleep(3)
        after = [pool_after(s.url) for s in fleet.slots]
        fleet.stop_sampling.set()
        sampler.join()
        fleet.sample()
        end_rss = [tree_rss_mb(alive_pid(s)) for s in fleet.slots]
        log(f"after the flush: {after}; RSS {[round(r or 0) for r in end_rss]} MiB")

        serving = [s for s in fleet.slots if alive_pid(s) is not None]   # a failed restart leaves one
        log(f"greedy replay of {args.check_sessions or len(soak.histories)} sessions on {[s.url for s in serving]}")
        greedy = replay([s.url for s in serving], model, soak.histories, args.check_sessions, args.seed)
        for s in serving:
            flush(s.url)
        after_replay = {s.url: pool_after(s.url) for s in serving}
    finally:
        fleet.stop_sampling.set()
        if router is not None:
            router.stop()
        fleet.stop_all()

    restarted = fleet.kill.get("ready_s") is not None
    replicas = []
    for i, srv in enumerate(fleet.slots):
        this = [s for s in fleet.samples if s["replica"] == i and s["rss_mb"] is not None]
        late = [s["rss_mb"] for s in this if s["t"] >= load_s / 2 and s["pid"] == srv.proc.pid]
        base = fleet.kill.get("rss_mb_after_warmup") if (restarted and i == args.kill_replica) else start_rss[i]
        replicas.append({"replica": i, "port": REPLICA_PORTS[i], "restarted": restarted and i == args.kill_replica,
                         "idle_before_flush": idle[i], "flushed": flushed[i], "start_pool": start_pool[i],
                         "before_flush": before[i], "after_flush": after[i],
                         "rss": rss_check(base, end_rss[i], args.rss_tolerance) if base and end_rss[i] else None,
                         "rss_max_mb": max(s["rss_mb"] for s in this) if this else None,
                         "rss_half_load_mb": late[0] if late else None,  # a plateau or still growing
                         "tracebacks": log_tracebacks(srv.log_path) if os.path.exists(srv.log_path) else None})
    logs = [s.log_path for s in fleet.all] + [router.log_path]
    tracebacks = {p: log_tracebacks(p) for p in logs if os.path.exists(p)}
    # Retractions: the final counters, plus the killed process's (its last sample before the kill)
    killed_retracted = (fleet.kill.get("pool_before") or {}).get("retracted", 0)
    pages_total = next((s["pages_total"] for s in fleet.samples if s.get("pages_total")), None)
    integrity = [s["integrity"] for s in fleet.samples if s.get("integrity") is not None]
    return {
        "model": os.path.basename(model_path), "profile": profile, "ratio": ratio, "max_total_tokens": max_total,
        "pages_total": pages_total, "load_minutes": round(load_s / 60, 1),
        "total_minutes": round((time.time() - t_start) / 60, 1),
        "summary": summarize(soak.sessions, soak.requests, 1 if windows else 0),
        "kill": {k: v for k, v in fleet.kill.items() if k != "pool_before"},
        "replicas": replicas, "after_replay_flush": after_replay, "healthy_after": healthy,
        "retracted": sum(int(b.get("retracted") or 0) for b in before) + int(killed_retracted or 0),
        "retracted_in_logs": sum(logged_retractions(s.log_path) for s in fleet.all),
        "integrity_samples": len(integrity), "integrity_samples_not_ok": sum(x != "ok" for x in integrity),
        "replay": greedy, "tracebacks": tracebacks, "tracebacks_total": sum(tracebacks.values()),
        "traceback_excerpts": [e for p in logs for e in traceback_excerpts(p)][:5],
        "finish_reasons": dict(collections.Counter(str(r["finish"]) for r in soak.requests)),
        "samples": fleet.samples,
        "requests": sorted(soak.requests, key=lambda r: r["t0"]),  # every request's outcome, without texts
    }


if __name__ == "__main__":
    main()
