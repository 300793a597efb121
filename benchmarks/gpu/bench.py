"""Multi-turn ``sglang.bench_serving`` on the GPU run's servers: SGLang's own tool, unchanged.

Its generated-shared-prefix dataset in multi-turn mode, through the OpenAI chat API: ``groups``
system prompts, ``per_group`` conversations each, ``turns`` questions per conversation with the
server's replies fed back as assistant turns (benchmarks.serving.bench_serving builds the same command
line). The servers' dummy-weight models carry the kit's tokenizer (benchmarks.gpu.models.dummy_model),
so the tool has text to send. Each server is flushed, then runs the whole workload alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace

from benchmarks.common.client import call
from benchmarks.serving.bench_serving import METRICS, bench_command


@dataclass(frozen=True)
class Workload:
    groups: int = 16
    per_group: int = 4
    system_len: int = 1024
    question_len: int = 1024
    output_len: int = 64
    turns: int = 3
    max_concurrency: int = 64
    ttft_slo_ms: float = 10_000


def run(url: str, model_path: str, w: Workload, timeout: float) -> dict:
    """One bench_serving run on a flushed server: request throughput, TTFT / TPOT / ITL median and p99,
    the cache hit rate; ``{"error": ...}`` when the tool fails or outlives ``timeout`` seconds."""
    status, body = call(url + "/flush_cache", {})
    if status != 200:
        return {"error": f"/flush_cache answered {status}: {str(body)[:300]}"}
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "out.jsonl")
        cmd = bench_command(SimpleNamespace(**asdict(w)), model_path, url, float("inf"), out_file)
        t0 = time.time()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, timeout))
        except subprocess.TimeoutExpired:
            return {"error": f"bench_serving outlived {timeout:.0f} s"}
        if done.returncode != 0 or not os.path.exists(out_file):
            return {"error": f"bench_serving rc {done.returncode}: {(done.stdout + done.stderr)[-2000:]}"}
        with open(out_file) as f:
            res = json.loads(f.read().strip().splitlines()[-1])
    row = {k: res.get(k) for k in METRICS}
    row.update(completed=res.get("completed"), wall_s=round(time.time() - t0, 1),
               cache_hit_rate_pct=(res.get("cache_report") or {}).get("cache_hit_rate_pct"),
               request_goodput=res.get("request_goodput"))
    return row


def run_all(urls: dict[str, str], model_path: str, w: Workload, deadline: float) -> dict:
    """The workload on each server in turn (the others idle meanwhile), while the deadline allows."""
    out = {"workload": asdict(w)}
    for name, url in urls.items():
        left = deadline - time.time()
        out[name] = run(url, model_path, w, left) if left > 20 else {"error": "out of time"}
    return out
