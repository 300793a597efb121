"""A fuzzed HTTP surface: SGLang's own request schemas against a profile's server and stock's (issue 50, item 5).

Two servers at the same settings, SmolLM2 with the shipped FastKVzip profile at 0.4 and stock SGLang,
receive the same cases: a few fixed ones per endpoint (fuzz_schema.EXAMPLES: inputs that once took a
server down), then each endpoint's small valid request with a few fields replaced by values drawn from
SGLang's OpenAPI schema and its SamplingParams (benchmarks/serving/fuzz_schema.py; hypothesis, a fixed
seed). A case that runs past ``--timeout`` is hung up on (SGLang then aborts it). After every
case both servers get a one-token request. What counts against the profile:

  5xx         a server error (or an error inside a 200 stream) where stock answered otherwise
  traceback   a traceback in the profile server's log where stock logged none for the case
  unhealthy   the one-token request after the case failed (the server is restarted, its log kept);
              "unhealthy, as stock" when stock's failed too (a fault of SGLang's the profile inherits)
  lost        the connection broke where stock answered

Statuses that differ otherwise (say 400 against 200: a refusal) are listed for reading, not counted.
At the end: the pool's integrity check and its pages after /flush_cache.

    .venv/bin/python -m benchmarks.serving.fuzz                 # 60 cases per endpoint: serving/fuzz.{md,json}
    .venv/bin/python -m benchmarks.serving.fuzz --cases 5 --name fuzz_quick
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

from hypothesis import HealthCheck, Phase, example, given, seed, settings

from benchmarks.common.client import call, log_tracebacks, pool_info
from benchmarks.common.models import ensure_model
from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from benchmarks.serving.fuzz_schema import BASES, EXAMPLES, Schemas, case
from tangram_sglang.sglang.server_process import ServerProcess

os.environ.setdefault("TANGRAM_INTEGRITY_CHECK", "1")  # the profile's server checks its pool on /server_info

PORT, STOCK_PORT = 31871, 31872
PROFILE, RATIO = "configs/smollm2-fastkvzip.yaml", "0.4"
SERVER_ARGS = ["--max-total-tokens", "4096", "--enable-cache-report", "--sleep-on-idle"]
KINDS = ("5xx", "traceback", "unhealthy", "unhealthy, as stock", "lost")  # what a case can count against the profile
PROBE = {"text": "Hello", "sampling_params": {"temperature": 0, "max_new_tokens": 1}}


def status_class(status: int, body) -> str:
    """2xx / 4xx / 5xx, stream-error (a 200 stream carrying an error), timeout, or lost (no answer)."""
    if status == -1:
        return "timeout" if "timed out" in str(body) else "lost"
    if 200 <= status < 300 and isinstance(body, str) and '"error"' in body:
        return "stream-error"
    return f"{status // 100}xx"


def message(body) -> str:
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message", "")))
        text = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    else:
        text = str(body)
    return " ".join(text.split())[:200]


class Side:
    """One server under fuzz: sends cases, probes its health, restarts it when it stops answering (its log
    kept beside as LOG.crashN, the crash's last line recorded)."""

    def __init__(self, name: str, server: ServerProcess):
        self.name, self.server, self.crashes = name, server, []

    def send(self, path: str, body: dict, timeout: float) -> dict:
        status, answer = call(self.server.url + path, body, timeout)
        return {"status": status, "class": status_class(status, answer), "message": message(answer)}

    def settle(self, result: dict, tracebacks_before: int) -> None:
        """After a case: probe (restarting a server that stopped answering), then the case's new tracebacks,
        counted after the probe since a server may log one after it answered."""
        crashes = len(self.crashes)
        self.healthy()
        crashed = self.crashes[crashes:]
        log = crashed[0]["log"] if crashed else self.server.log_path
        result.update(healthy_after=not crashed, crash=crashed[0]["error"] if crashed else "",
                      tracebacks=log_tracebacks(log) - tracebacks_before)

    def healthy(self) -> bool:
        """The one-token request succeeds; otherwise the server is restarted and False returned."""
        if self.server.proc.poll() is None and call(self.server.url + "/generate", PROBE, 180)[0] == 200:
            return True
        kept = f"{self.server.log_path}.crash{len(self.crashes) + 1}"
        self.server.stop()
        shutil.copy(self.server.log_path, kept)
        self.crashes.append({"log": kept, "error": last_error(kept)})
        self.server.start()
        return False


def last_error(log_path: str) -> str:
    """The last exception line of a log (``SomeError: ...`` after a traceback), or ''."""
    with open(log_path, errors="replace") as f:
        lines = [ln.strip() for ln in f if re.match(r"^\s*[\w.]+(Error|Exception)\b", ln)]
    return lines[-1][:300] if lines else ""


def verdicts(prof: dict, stock: dict) -> list[str]:
    """What counts against the profile in one case (module docstring); a crash stock shares is its own kind."""
    out = []
    if prof["class"] in ("5xx", "stream-error") and stock["class"] not in ("5xx", "stream-error"):
        out.append("5xx")
    if prof["tracebacks"] and not stock["tracebacks"]:
        out.append("traceback")
    if not prof["healthy_after"]:
        out.append("unhealthy" if stock["healthy_after"] else "unhealthy, as stock")
    if prof["class"] == "lost" and stock["class"] != "lost":
        out.append("lost")
    return out


def fuzz_path(path: str, schemas: Schemas, sides: tuple[Side, Side], n: int, rng_seed: int,
              timeout: float) -> list[dict]:
    """``n`` cases on ``path``, each sent to both servers at once; one record per case."""
    records = []

    @seed(rng_seed)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case(schemas, path))
    def run(body):
        before = [log_tracebacks(side.server.log_path) for side in sides]
        with ThreadPoolExecutor(2) as ex:
            prof, stock = ex.map(lambda s: s.send(path, body, timeout), sides)
        for side, res, n in zip(sides, (prof, stock), before):
            side.settle(res, n)
        rec = {"path": path, "body": json.dumps(body)[:400], "profile": prof, "stock": stock,
               "verdicts": verdicts(prof, stock)}
        records.append(rec)
        print(f"{path} #{len(records)}: profile {prof['class']} stock {stock['class']}"
              + (f"  !! {rec['verdicts']}" if rec["verdicts"] else ""), flush=True)

    for body in reversed(EXAMPLES[path]):  # sent first, in order
        run = example(body)(run)
    run()
    return records


def end_state(side: Side) -> dict:
    """Integrity and pages held after /flush_cache (a flush waits for running requests to leave)."""
    for _ in range(60):
        if call(side.server.url + "/flush_cache", {})[0] == 200:
            break
        time.sleep(1)
    info = pool_info(side.server.url)
    return {"integrity": info["integrity"], "pages_used_after_flush": info["pages_used"],
            "running_requests": info["running_requests"], "restarts": len(side.crashes),
            "tracebacks_in_log": log_tracebacks(side.server.log_path)}


def summarize(records: list[dict]) -> dict:
    by_path = collections.defaultdict(collections.Counter)
    for r in records:
        by_path[r["path"]][f"stock {r['stock']['class']} / profile {r['profile']['class']}"] += 1
    counted = collections.Counter(v for r in records for v in r["verdicts"])
    return {"cases": len(records), "by_path": {p: dict(c) for p, c in by_path.items()},
            "against_profile": dict(counted)}


def write(records: list[dict], summary: dict, state: dict, args, run_stamp: dict) -> None:
    lines = [f"{summary['cases']} cases ({args.cases} per endpoint, seed {args.seed}), each sent to SmolLM2 "
             f"with `{PROFILE}` at {RATIO} and to stock SGLang, same flags (`{' '.join(SERVER_ARGS)}`); "
             f"cases past {args.timeout:.0f} s hung up on. Command: `{run_stamp['command']}`.", "",
             "## Against the profile", ""]
    lines += [f"- {k}: {summary['against_profile'].get(k, 0)}" for k in KINDS]
    lines += ["", f"End state of the profile's server: {json.dumps(state)}", "",
              "## Status classes (stock / profile)", "", "| endpoint | outcome | cases |", "| --- | --- | --- |"]
    for path, counts in summary["by_path"].items():
        lines += [f"| `{path}` | {k} | {v} |" for k, v in sorted(counts.items())]
    flagged = [r for r in records if r["verdicts"]]
    differ = [r for r in records if not r["verdicts"] and r["profile"]["class"] != r["stock"]["class"]]
    for title, rows in (("Cases counted against the profile", flagged),
                        ("Cases answered differently (not counted)", differ)):
        lines += ["", f"## {title}", ""] + (["none"] if not rows else [])
        for r in rows[:40]:
            lines.append(f"- `{r['path']}` {r['verdicts'] or ''} profile {r['profile']['status']} "
                         f"({r['profile']['message'][:120]!r}), stock {r['stock']['status']} "
                         f"({r['stock']['message'][:120]!r}): `{r['body'][:200]}`")
    title = "Fuzzed HTTP surface: SGLang's request schemas, a profile's server against stock's"
    write_markdown(result_path("serving", f"{args.name}.md"), title, lines, run_stamp)
    write_json(result_path("serving", f"{args.name}.json"),
               {"args": vars(args), "summary": summary, "end_state": state, "cases": records}, run_stamp,
               row_per_line="cases")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=60, help="cases per endpoint")
    ap.add_argument("--paths", nargs="+", default=list(BASES), choices=list(BASES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=30, help="seconds before a case is hung up on")
    ap.add_argument("--name", default="fuzz")
    args = ap.parse_args()
    run_stamp = stamp()
    model = ensure_model("smollm2")
    prof = ServerProcess(model, port=PORT, profile=os.path.join(ROOT, PROFILE),
                         extra_args=[*SERVER_ARGS, "--tangram-ratio", RATIO], log_path=f"/tmp/tangram-fuzz-{PORT}.log")
    stock = ServerProcess(model, port=STOCK_PORT, extra_args=SERVER_ARGS, log_path=f"/tmp/tangram-fuzz-{STOCK_PORT}.log")
    with prof, stock:
        openapi = call(stock.url + "/openapi.json")[1]
        schemas = Schemas(openapi)
        sides = (Side("profile", prof), Side("stock", stock))
        records = []
        for i, path in enumerate(args.paths):
            records += fuzz_path(path, schemas, sides, args.cases, args.seed + i, args.timeout)
        state = {"profile": end_state(sides[0]),
                 "stock_restarts": len(sides[1].crashes), "crashes": {s.name: s.crashes for s in sides}}
    summary = summarize(records)
    print(json.dumps(summary, indent=1))
    write(records, summary, state, args, run_stamp)


if __name__ == "__main__":
    main()
