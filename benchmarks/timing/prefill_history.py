"""Prefill over a cached history: time per new token, stock SGLang against Tangram at the same KV bytes.

A multi-turn turn re-sends a history the radix tree holds and prefills only what is new. Here each
measurement first puts a history of H tokens in every server's tree (one request, not timed), then
times a request of that history plus N new tokens (max_new_tokens 1) while D other requests decode
beside it (short prompts, long greedy answers, streamed and hung up after): time per new token =
request wall / (prompt - cached tokens). Servers: stock (SGLang's defaults), Tangram at the profile's
ratio, and a uniform Tangram 1.0 profile of the same compression chunk (the data plane alone, nothing
compressed); all get the same --max-total-tokens, so the same pool bytes. All run at once, one
thread each, idle ones asleep; for every repeat, history and load, each server is timed in turn
(alternating, so the machine's drift hits all alike). A history is put in once per (repeat, H) and
serves every D (each D sends different new tokens after it).

With ``--spy PY_SPY``, py-spy samples each server's processes during the last repeat's largest
history with no load, and the report splits the scheduler's time by where it was spent.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.timing.prefill_history --model smollm2 \\
        --profile configs/smollm2-fastkvzip.yaml --histories 0 2048 6000 --decoding 0 4 --repeats 3
    # writes benchmarks/results/timing/prefill_history_<model>.{json,md}
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import threading
import time
from contextlib import ExitStack

from benchmarks.common.client import generate
from benchmarks.common.corpus import essay_token_ids
from benchmarks.common.log import logger
from benchmarks.common.models import ensure_model
from benchmarks.common.paths import result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.sglang.server_process import ServerProcess

log = logger("prefill_history")

# where the scheduler's samples land, first match wins (module path fragments of the innermost frame)
CATEGORIES = (
    ("Tangram attention (ragged history)", ("tangram_sglang/attention/reference", "tangram_sglang/attention/merge",
                                           "tangram_sglang/attention/pieces", "tangram_sglang/attention/prefill_reference",
                                           "tangram_sglang/attention/fused_cpu", "tangram_sglang/attention/split_row",
                                           "tangram_sglang/attention/dense")),
    ("Tangram scoring and compression", ("tangram_sglang/scorers", "tangram_sglang/attention/compression",
                                         "tangram_sglang/attention/kv_write", "tangram_sglang/method")),
    ("Tangram control plane", ("tangram_sglang/pool", "tangram_sglang/serving", "tangram_sglang/sglang")),
    ("stock attention", ("torch_native_backend",)),
    ("linear layers", ("quantization/unquant", "linear.py")),
)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--profile", default="configs/smollm2-fastkvzip.yaml")
    ap.add_argument("--ratio", type=float, default=None, help="the profile's entry (default: its default ratio)")
    ap.add_argument("--histories", nargs="+", type=int, default=[0, 2048, 6000])
    ap.add_argument("--decoding", nargs="+", type=int, default=[0, 4], help="requests decoding beside")
    ap.add_argument("--new-tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-total-tokens", type=int, default=32768)
    ap.add_argument("--context-length", type=int, default=None, help="raise the model's (timing only)")
    ap.add_argument("--no-control", action="store_true", help="leave out the Tangram 1.0 control")
    ap.add_argument("--spy", default=None, metavar="PY_SPY", help="py-spy binary: profile where the time goes")
    ap.add_argument("--port", type=int, default=31960)
    ap.add_argument("--out", default=None, help="OUT.json and OUT.md (default results/timing/prefill_history_<model>)")
    return ap.parse_args(argv)


def servers(args, model_path: str) -> list[tuple[str, str | None, list[str]]]:
    """(name, profile, extra launch args) of stock, Tangram at the ratio and the 1.0 control."""
    from tangram_sglang.profile import load_profile

    prof_path = os.path.abspath(args.profile)
    prof = load_profile(prof_path)
    ratio = args.ratio if args.ratio is not None else prof.default_ratio
    out = [("stock", None, []), (f"tangram@{ratio:g}", prof_path, ["--tangram-ratio", str(ratio)])]
    if not args.no_control:
        out.append(("tangram@1.0", uniform_one(model_path, prof.calibration.chunk_size), []))
    return out


def uniform_one(model_path: str, chunk: int) -> str:
    """A uniform 1.0 profile of the model with the compression chunk ``chunk`` (a temporary file)."""
    import dataclasses
    import tempfile

    from tangram_sglang.profile import ModelShape
    from tangram_sglang.profile.uniform import uniform_profile

    prof = uniform_profile(ModelShape.from_model_path(model_path), [1.0])
    prof = dataclasses.replace(prof, calibration=dataclasses.replace(prof.calibration, chunk_size=chunk))
    path = os.path.join(tempfile.mkdtemp(prefix="prefill-history-"), "uniform-1.0.yaml")
    prof.save(path)
    return path


class Decoders:
    """``n`` requests decoding on a server until closed: each streams a long greedy answer and hangs up."""

    def __init__(self, url: str, ids: list[int], n: int):
        self.url, self.threads, self.started = url, [], threading.Semaphore(0)
        self.stop = threading.Event()
        self.payloads = [{"input_ids": ids[i * 211: i * 211 + 128],
                          "sampling_params": {"temperature": 0, "max_new_tokens": 4000, "ignore_eos": True}}
                         for i in range(n)]

    def _one(self, payload: dict) -> None:
        import http.client
        import json
        import urllib.parse

        where = urllib.parse.urlsplit(self.url)
        conn, got = http.client.HTTPConnection(where.hostname, where.port, timeout=1800), 0
        try:
            conn.request("POST", "/generate", body=json.dumps({**payload, "stream": True}),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            while not self.stop.is_set():
                line = resp.readline()
                if not line:
                    break
                got += line.startswith(b"data:")
                if got == 2:
                    self.started.release()   # decoding (its first tokens are out)
        finally:
            conn.close()
            if got < 2:
                self.started.release()

    def __enter__(self) -> "Decoders":
        for p in self.payloads:
            self.threads.append(threading.Thread(target=self._one, args=(p,), daemon=True))
            self.threads[-1].start()
        for _ in self.payloads:
            self.started.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        time.sleep(0.5)   # the server sees the hang-ups and aborts them


def time_turn(url: str, ids: list[int], decoding: int, side: list[int]) -> dict:
    """One timed request of ``ids`` (max_new_tokens 1) with ``decoding`` requests decoding beside."""
    with Decoders(url, side, decoding):
        t0 = time.perf_counter()
        out = generate(url, ids, 1)
        wall = time.perf_counter() - t0
    new = len(ids) - int(out["meta_info"].get("cached_tokens", 0))
    return {"wall_s": round(wall, 3), "new_tokens": new, "ms_per_token": round(1000 * wall / max(1, new), 3)}


class Spy:
    """py-spy sampling one server's processes (raw collapsed stacks) while in a with block."""

    def __init__(self, binary: str | None, pid: int, path: str):
        self.cmd = None if not binary else [binary, "record", "--pid", str(pid), "--subprocesses", "-r", "100",
                                            "-f", "raw", "-o", path, "--nonblocking"]
        self.path = path

    def __enter__(self) -> "Spy":
        if self.cmd:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.5)
        return self

    def __exit__(self, *exc) -> None:
        if self.cmd:
            self.proc.send_signal(2)
            self.proc.wait(timeout=60)


def where_time_goes(path: str) -> dict:
    """Shares of the scheduler's samples by CATEGORIES (innermost frame), from py-spy's raw output."""
    counts, total = collections.Counter(), 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            if not any("event_loop" in fr for fr in frames):
                continue   # tokenizer / detokenizer / HTTP processes
            total += int(n)
            inner = frames[-1]
            name = next((c for c, keys in CATEGORIES if any(k in inner for k in keys)), None)
            if name is None and any("tangram_sglang/attention" in fr for fr in frames[-6:]):
                name = "Tangram attention (ragged history)"   # torch ops called from our attention
            counts[name or "other (model, SGLang, torch)"] += int(n)
    return {"samples": total, "shares": {k: round(v / total, 3) for k, v in counts.most_common()} if total else {}}


def run(args) -> dict:
    model_path = ensure_model(args.model)
    from transformers import AutoTokenizer

    ids = essay_token_ids(AutoTokenizer.from_pretrained(model_path))
    plan = servers(args, model_path)
    extra = ["--max-total-tokens", str(args.max_total_tokens), "--sleep-on-idle"]
    env = {}
    if args.context_length:
        extra += ["--context-length", str(args.context_length)]
        env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    rows, spied = [], {}
    span = max(args.histories) + args.new_tokens * len(args.decoding)
    side = ids[-4000:]
    with ExitStack() as stack:
        procs = []
        for i, (name, profile, more) in enumerate(plan):
            srv = ServerProcess(model_path, port=args.port + i, profile=profile, extra_args=extra + more,
                                start_timeout=900)
            srv.env.update(env)
            procs.append(stack.enter_context(srv))
        for srv in procs:
            generate(srv.url, side[-300:], 1)   # warm-up (tokens no timed request starts with)
        for rep in range(args.repeats):
            for h in args.histories:
                start = (rep * len(args.histories) + args.histories.index(h)) * 97 % max(1, len(ids) - span - 4000)
                text = ids[start: start + span]
                for (name, _, _), srv in zip(plan, procs):
                    if h:
                        generate(srv.url, text[:h], 1)   # the history, now in the tree
                for j, d in enumerate(args.decoding):
                    turn = text[:h] + text[h + j * args.new_tokens: h + (j + 1) * args.new_tokens]
                    for (name, _, _), srv in zip(plan, procs):
                        spy_it = args.spy and rep == args.repeats - 1 and h == max(args.histories) and d == 0
                        path = f"/tmp/prefill-history-{args.port}-{name}.spy.txt"
                        with Spy(args.spy if spy_it else None, srv.proc.pid, path):
                            r = time_turn(srv.url, turn, d, side)
                        if spy_it:
                            spied[name] = where_time_goes(path)
                        r.update(server=name, repeat=rep, history=h, decoding=d)
                        log(f"[{name}] repeat {rep + 1}: history {h}, {d} decoding: {r['ms_per_token']} ms/token "
                            f"({r['new_tokens']} new)")
                        rows.append(r)
    names = [n for n, _, _ in plan]
    return {"args": vars(args), "servers": names, "rows": rows, "summary": summarize(rows, names), "where": spied}


def summarize(rows: list[dict], names: list[str]) -> list[dict]:
    """Per (history, decoding, server): ms per new token, median [min, max] over repeats, and its ratio to
    stock's in the same repeat."""
    out = []
    keys = sorted({(r["history"], r["decoding"]) for r in rows})
    for h, d in keys:
        base = {r["repeat"]: r["ms_per_token"] for r in rows if (r["history"], r["decoding"], r["server"]) == (h, d, names[0])}
        for name in names:
            mine = [r for r in rows if (r["history"], r["decoding"], r["server"]) == (h, d, name)]
            ms = [r["ms_per_token"] for r in mine]
            ratio = [r["ms_per_token"] / base[r["repeat"]] for r in mine if base.get(r["repeat"])]
            out.append({"history": h, "decoding": d, "server": name, "new_tokens": mine[0]["new_tokens"],
                        "ms_per_token": [statistics.median(ms), min(ms), max(ms)],
                        "vs_stock": [round(statistics.median(ratio), 3), round(min(ratio), 3), round(max(ratio), 3)]})
    return out


def markdown(res: dict) -> list[str]:
    a = res["args"]
    lines = [f"{a['model']}, profile `{a['profile']}`; a history of H tokens in the tree, then H + {a['new_tokens']} "
             f"new tokens (max_new_tokens 1) while D requests decode beside; every server --max-total-tokens "
             f"{a['max_total_tokens']} (the same bytes), one thread each, float32 CPU. Milliseconds per new token, "
             f"median [min, max] over {a['repeats']} alternating repeats; 'vs stock' pairs each repeat with stock's.", "",
             "| history H | decoding D | server | new tokens prefilled | ms / new token | vs stock |", "|---|---|---|---|---|---|"]
    for s in res["summary"]:
        m, v = s["ms_per_token"], s["vs_stock"]
        lines.append(f"| {s['history']} | {s['decoding']} | {s['server']} | {s['new_tokens']} | {m[0]:.2f} [{m[1]:.2f}, "
                     f"{m[2]:.2f}] | {v[0]:.2f}x [{v[1]:.2f}, {v[2]:.2f}] |")
    if res["where"]:
        h = max(a["histories"])
        lines += ["", f"Where the scheduler's time goes (py-spy, last repeat, history {h}, nothing decoding beside; "
                  "share of samples by innermost frame):", ""]
        cats = sorted({c for w in res["where"].values() for c in w["shares"]})
        lines += ["| server | samples | " + " | ".join(cats) + " |", "|---" * (len(cats) + 2) + "|"]
        for name, w in res["where"].items():
            lines.append(f"| {name} | {w['samples']} | " + " | ".join(f"{100 * w['shares'].get(c, 0):.0f}%" for c in cats) + " |")
    return lines


def main(argv=None) -> int:
    args = parse(argv)
    run_stamp = stamp(argv)
    out = args.out or result_path("timing", f"prefill_history_{args.model.replace('.', '')}")
    res = run(args)
    write_json(out + ".json", res, run_stamp)
    print(write_markdown(out + ".md", "Prefill over a cached history, at the same KV bytes", markdown(res), run_stamp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
