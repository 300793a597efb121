"""Soak: 200 multi-turn sessions on a small pool, with aborts, hang-ups, evictions, retractions.

Each session (SmolLM2, snapkv profile at 0.25, ``--max-total-tokens 1024`` = 5760 ragged pages)
sends up to four turns over one growing history (essay text, its own outputs re-sent), 16
sessions at a time. Per turn, at random: an ordinary request; a long ``ignore_eos`` answer
(the pool runs dry in decode and SGLang retracts); a stream the client hangs up on; a request
aborted through ``/abort_request``; or the session is abandoned (its history stays in the tree
until evicted). Every request must end answered (200), aborted (the client's doing), or
refused with a clear error (400): anything else is counted as failed.

After the run: the server's log has no traceback, ``/server_info`` says the pool's integrity
holds, and after ``/flush_cache`` no page is left used or reserved.

    .venv/bin/python -m benchmarks.serving.soak               # writes benchmarks/results/serving/soak.{md,json}
    .venv/bin/python -m benchmarks.serving.soak --sessions 24 # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common.client import call, log_tracebacks, pool_info, stream_and_hang_up
from benchmarks.common.corpus import essay_token_ids
from benchmarks.common.models import ensure_model
from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.sglang.server_process import ServerProcess

os.environ.setdefault("TANGRAM_INTEGRITY_CHECK", "1")  # the servers started here check their pool on /server_info

PORT = 31881


class Tally:
    def __init__(self):
        self.lock, self.counts, self.errors = threading.Lock(), {}, {}

    def add(self, key: str, error: str | None = None) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            if error:
                self.errors[error[:120]] = self.errors.get(error[:120], 0) + 1


def session(seed: int, essay: list[int], tally: Tally, url: str) -> None:
    rng = random.Random(seed)
    pos = rng.randrange(0, len(essay) - 3000)
    hist = essay[pos:pos + rng.randint(40, 500)]
    pos += 600
    for _ in range(rng.randint(1, 4)):
        x = rng.random()
        sp = {"temperature": 0, "max_new_tokens": rng.randint(4, 48)}
        if x < 0.08:
            tally.add("abandoned")
            return
        if x < 0.18:
            stream_and_hang_up(url, {"input_ids": hist, "sampling_params": {**sp, "max_new_tokens": 200}},
                               rng.randint(0, 4))
            tally.add("hung_up")
            return
        if x < 0.28:
            rid = f"soak-{seed}-{rng.randrange(1 << 30)}"
            threading.Timer(rng.uniform(0.05, 2.0), call, (url + "/abort_request", {"rid": rid})).start()
            status, body = call(url + "/generate", {"input_ids": hist, "rid": rid, "sampling_params": sp})
            kind = body["meta_info"]["finish_reason"]["type"] if status == 200 else None
            tally.add("aborted" if kind == "abort" or status in (400, 503) else "answered" if status == 200
                      else "failed", None if status in (200, 400, 503) else f"{status}: {body}")
            return
        if x < 0.40:  # a long answer: decode outgrows the pool, SGLang retracts and requeues
            sp = {"temperature": 0, "max_new_tokens": rng.randint(300, 700), "ignore_eos": True}
        status, body = call(url + "/generate", {"input_ids": hist, "sampling_params": sp})
        if status == 200:
            tally.add("answered")
            add = essay[pos:pos + rng.randint(10, 120)]
            pos += len(add)
            hist = hist + body["output_ids"] + add
        elif status == 400:
            tally.add("refused", body.get("error", {}).get("message", str(body)) if isinstance(body, dict) else body)
            return
        else:
            tally.add("failed", f"{status}: {body}")
            return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--max-total-tokens", type=int, default=1024)
    ap.add_argument("--ratio", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="soak")
    args = ap.parse_args()
    run_stamp = stamp()
    from transformers import AutoTokenizer

    model = ensure_model("smollm2")
    essay = essay_token_ids(AutoTokenizer.from_pretrained(model))
    srv = ServerProcess(model, port=PORT, profile=os.path.join(ROOT, "configs", "smollm2-snapkv.yaml"),
                        extra_args=["--tangram-ratio", str(args.ratio), "--max-total-tokens",
                                    str(args.max_total_tokens)], log_path=f"/tmp/tangram-soak-{PORT}.log")
    tally, t0 = Tally(), time.time()
    with srv:
        rng = random.Random(args.seed)
        seeds = [rng.randrange(1 << 30) for _ in range(args.sessions)]
        done = [0]

        def run(seed):
            session(seed, essay, tally, srv.url)
            with tally.lock:
                done[0] += 1
                if done[0] % 20 == 0:
                    print(f"{done[0]}/{args.sessions} sessions, {time.time() - t0:.0f} s: {tally.counts}", flush=True)

        with ThreadPoolExecutor(args.workers) as ex:
            list(ex.map(run, seeds))
        time.sleep(2)
        info = pool_info(srv.url)
        call(srv.url + "/flush_cache", {})
        time.sleep(1)
        after = pool_info(srv.url)
        healthy = call(srv.url + "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}})[0] == 200
    tracebacks = log_tracebacks(srv.log_path)
    row = {"sessions": args.sessions, "seconds": round(time.time() - t0), **tally.counts,
           "errors": tally.errors, "tracebacks": tracebacks, "healthy_after": healthy,
           "integrity_before_flush": info["integrity"], "integrity_after_flush": after["integrity"],
           "pages_used_after_flush": after["pages_used"], "pages_reserved_after_flush": after["pages_reserved"],
           **{k: info[k] for k in ("admitted", "waited", "retracted", "evicted_segments", "capped", "too_large",
                                   "peak_admitted", "peak_pages_used", "pages_total")}}
    print(json.dumps(row, indent=1))
    keys = ["answered", "aborted", "hung_up", "abandoned", "refused", "failed"]
    title = (f"Soak: {args.sessions} multi-turn sessions, {args.workers} at a time, on a small pool "
             f"(SmolLM2-135M, snapkv {args.ratio}, --max-total-tokens {args.max_total_tokens} = "
             f"{info['pages_total']} pages)")
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys),
             "| " + " | ".join(str(row.get(k, 0)) for k in keys) + " |", "",
             "| tracebacks | integrity (before / after flush) | pages used / reserved after flush | admitted | "
             "waited | retracted | evicted segments | capped | peak admitted | peak pages |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
             f"| {tracebacks} | {info['integrity']} / {after['integrity']} | {after['pages_used']} / "
             f"{after['pages_reserved']} | {info['admitted']} | {info['waited']} | {info['retracted']} | "
             f"{info['evicted_segments']} | {info['capped']} | {info['peak_admitted']} | {info['peak_pages_used']} |",
             "", f"Errors: {tally.errors or 'none'}", "", f"{row['seconds']} s."]
    write_markdown(result_path("serving", f"{args.name}.md"), title, lines, run_stamp)
    write_json(result_path("serving", f"{args.name}.json"), {"args": vars(args), "result": row}, run_stamp)


if __name__ == "__main__":
    main()
