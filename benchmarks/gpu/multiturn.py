"""A multi-turn workload in token ids, for servers with dummy weights (no tokenizer travels).

S sessions start together, one thread each; turn 1 sends ``first`` random tokens, turn k the
previous prompt, its answer and ``user`` new tokens; every answer is ``answer`` greedy tokens
(ignore_eos), streamed so the time to the first token is seen. A session's history is reused only
while the server's tree still holds it, so where the pool cannot hold every session's history,
the server that keeps more of them prefills less.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
import urllib.parse
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    sessions: int = 48
    turns: int = 3
    first: int = 4096
    user: int = 1024
    answer: int = 64
    vocab: int = 128_000


def stream_generate(url: str, ids: list[int], new_tokens: int, timeout: float = 600) -> dict:
    """One streamed greedy /generate: output ids, cached tokens, time to first token and in all (s)."""
    parts = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}
    t0 = time.perf_counter()
    conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"/generate answered {resp.status}: {resp.read()[:300]!r}")
    first, last = None, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        first = first or time.perf_counter() - t0
        last = json.loads(line[5:])
    conn.close()
    if last is None:
        raise RuntimeError("the stream ended without an answer")
    return {"ids": last["output_ids"], "cached": int(last["meta_info"].get("cached_tokens", 0)),
            "prompt": len(ids), "ttft": first, "latency": time.perf_counter() - t0}


def session(url: str, w: Workload, seed: int, out: list, errors: list) -> None:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(10, w.vocab, w.first).tolist()
    for _ in range(w.turns):
        try:
            r = stream_generate(url, prompt, w.answer)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            return
        if len(r["ids"]) != w.answer:
            errors.append(f"{len(r['ids'])} tokens answered, {w.answer} asked")
        out.append(r)
        prompt = prompt + r["ids"] + rng.integers(10, w.vocab, w.user).tolist()


def run(url: str, w: Workload) -> dict:
    """Every session at once; turns/s, TTFT and latency (median, p99), history reused."""
    out, errors, threads = [], [], []
    t0 = time.perf_counter()
    for s in range(w.sessions):
        threads.append(threading.Thread(target=session, args=(url, w, 1000 + s, out, errors)))
        threads[-1].start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"turns": len(out), "errors": errors[:5], "error_count": len(errors), "wall_s": round(wall, 2),
            "turns_per_s": round(len(out) / wall, 3), "ttft_s": _quantiles([r["ttft"] for r in out]),
            "latency_s": _quantiles([r["latency"] for r in out]),
            "prompt_tokens": sum(r["prompt"] for r in out), "cached_tokens": sum(r["cached"] for r in out),
            "prefilled_tokens": sum(r["prompt"] - r["cached"] for r in out)}


def _quantiles(xs: list[float]) -> dict:
    if not xs:
        return {}
    return {"median": round(statistics.median(xs), 4), "p99": round(float(np.percentile(xs, 99)), 4)}
