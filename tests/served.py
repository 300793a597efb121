"""HTTP helpers of the end-to-end tests: requests, the pool's counters, hang-ups, log checks.
(The essay corpus the tests send is the benchmarks' own: benchmarks.common.corpus.)"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

from benchmarks.common.corpus import essay_token_ids  # noqa: F401  (re-exported for the tests)
from tangram_sglang.sglang.server_process import ServerProcess

# An idle SGLang scheduler polls its sockets in a busy loop, a whole core each; the tests' servers and
# engines sleep when idle instead, so a server waiting on its client leaves the other test lane its core.
IDLE_ARGS = ["--sleep-on-idle"]
IDLE_KWARGS = {"sleep_on_idle": True}


def flush_engine(engine, tries: int = 60) -> None:
    """Flush an Engine's radix cache (it refuses while requests run: retried every 0.5 s)."""
    for _ in range(tries):
        if engine.flush_cache().success:
            return
        time.sleep(0.5)
    raise AssertionError("flush_cache never succeeded")


def post(url: str, payload: dict | None = None, timeout: float = 180) -> tuple[int, object]:
    """(status, parsed JSON or raw text) of a POST, HTTP errors included."""
    data = json.dumps(payload).encode() if payload is not None else b""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, body = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read().decode()
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, body


def generate(url: str, payload: dict) -> dict:
    status, out = post(url + "/generate", payload)
    assert status == 200, out
    return out


def get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def state(srv: ServerProcess) -> tuple[dict, dict]:
    """(tangram pool_info, batch_counters) from /server_info."""
    with urllib.request.urlopen(srv.url + "/server_info", timeout=30) as r:
        internal = json.loads(r.read())["internal_states"][0]
    return internal["tangram"]["pool_info"], internal["batch_counters"]


def wait_idle(srv: ServerProcess, timeout: float = 60) -> tuple[dict, dict]:
    """Counters once no request runs or waits (aborted streams may take a step to leave)."""
    deadline = time.time() + timeout
    while True:
        info, batch = state(srv)
        if (info["running_requests"] == 0 and batch["running"] == 0 and batch["waiting"] == 0) \
                or time.time() > deadline:
            return info, batch
        time.sleep(0.5)


def flush(srv: ServerProcess) -> dict:
    status, _ = post(srv.url + "/flush_cache")
    assert status == 200
    info, _ = state(srv)
    assert info["pages_used"] == 0 and info["pages_held_by_tree"] == 0, info
    return info


def log_tracebacks(srv: ServerProcess) -> list[str]:
    with open(srv.log_path, errors="replace") as f:
        return [line for line in f if "Traceback" in line]


def stream_and_hang_up(port: int, payload: dict, chunks: int) -> int:
    """Stream a /generate and close the connection after `chunks` data chunks: the server aborts it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
    try:
        conn.request("POST", "/generate", body=json.dumps({**payload, "stream": True}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        got = 0
        while got < chunks:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data:") and b"[DONE]" not in line:
                got += 1
        return got
    finally:
        conn.close()
