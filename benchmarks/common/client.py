"""HTTP client of the benchmarks: SGLang's /generate, /server_info, /flush_cache and /abort_request.

Two ways to ask: ``post_json`` / ``get_json`` return the parsed answer and raise on an HTTP error (a
benchmark that must not see one); ``call`` never raises and returns (status, body), status -1 when the
connection failed (a benchmark that counts refusals and failures).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

HEADERS = {"Content-Type": "application/json"}


def _request(url: str, payload: dict | None) -> urllib.request.Request:
    """POST of ``payload`` as JSON; GET without one."""
    data = json.dumps(payload).encode() if payload is not None else None
    return urllib.request.Request(url, data=data, headers=HEADERS)


def post_json(url: str, payload: dict | None = None, timeout: float = 1800) -> dict:
    """Parsed JSON answer of a POST (a GET without payload); raises urllib.error.HTTPError on an error status."""
    with urllib.request.urlopen(_request(url, payload), timeout=timeout) as r:
        return json.loads(r.read())


def get_json(url: str, timeout: float = 60) -> dict:
    return post_json(url, None, timeout)


def call(url: str, payload: dict | None = None, timeout: float = 1800) -> tuple[int, object]:
    """(status, parsed JSON or raw text) of a POST (a GET without payload), error statuses included;
    (-1, the error's text) when the connection failed or broke."""
    try:
        with urllib.request.urlopen(_request(url, payload), timeout=timeout) as r:
            status, body = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read().decode()
    except (OSError, http.client.HTTPException) as e:
        return -1, str(e)
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, body


def generate(url: str, prompt: list[int] | str, max_new_tokens: int, ignore_eos: bool = False,
             timeout: float = 3600, logit_bias: dict[str, float] | None = None) -> dict:
    """Greedy /generate of token ids (or text); ``ignore_eos`` and ``logit_bias`` are sent only when set."""
    sampling = {"temperature": 0, "max_new_tokens": max_new_tokens}
    if ignore_eos:
        sampling["ignore_eos"] = True
    if logit_bias:
        sampling["logit_bias"] = logit_bias
    key = "text" if isinstance(prompt, str) else "input_ids"
    return post_json(url + "/generate", {key: prompt, "sampling_params": sampling}, timeout)


def server_state(url: str, timeout: float = 60) -> dict:
    """The first scheduler's ``internal_states`` from /server_info (batch_counters, tangram)."""
    return get_json(url + "/server_info", timeout)["internal_states"][0]


def pool_info(url: str, timeout: float = 60) -> dict:
    """Tangram's pool counters (pages, integrity, admissions, ...) from /server_info."""
    return server_state(url, timeout)["tangram"]["pool_info"]


def stream_events(url: str, path: str, body: dict, timeout: float = 3600):
    """POST ``body`` to ``path`` and yield each server-sent ``data:`` event, parsed, until ``[DONE]``; an HTTP
    status other than 200 raises RuntimeError with the start of the body."""
    where = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers=HEADERS)
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if line.startswith("data:") and line != "data: [DONE]":
                yield json.loads(line[5:])
    finally:
        conn.close()


def stream_and_hang_up(url: str, payload: dict, chunks: int, timeout: float = 600) -> tuple[int, int]:
    """Stream a /generate and close the connection after ``chunks`` data chunks (the server then
    aborts the request). Returns (HTTP status, data chunks read)."""
    where = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=timeout)
    try:
        conn.request("POST", "/generate", body=json.dumps({**payload, "stream": True}), headers=HEADERS)
        resp, got = conn.getresponse(), 0
        while got < chunks:
            line = resp.readline()
            if not line:
                break
            got += line.startswith(b"data:") and b"[DONE]" not in line
        return resp.status, got
    finally:
        conn.close()


def log_tracebacks(log_path: str) -> int:
    """Tracebacks in a server's log."""
    with open(log_path, errors="replace") as f:
        return sum("Traceback" in line for line in f)
