"""Outcomes (pure): each request classified, sessions' statuses, the summary counts."""

from __future__ import annotations

import collections
import json

from benchmarks.serving.soak_faults.plan import FAULTS, SessionPlan

STATUSES = ("finished", "abandoned", "hung up", "ended by error")

CLIENT_FAULTS = {"abort": "client abort", "hangup": "client hang-up"}

ERRORS = ("clear error", "connection error", "timed out", "replica killed")

OUTCOMES = ("answered", "client abort", "client hang-up", "clear error", "connection error", "timed out",
            "replica killed")


def error_message(body) -> str:
    """The message of an error body: SGLang's {"message": ...} or {"error": {"message": ...}}, the router's
    text; '' when there is none."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or "")
        return str(err or "")
    return str(body or "").strip()


def classify(raw: dict) -> str:
    """The outcome of one request from what the client saw (``raw``: status, HTTP status or -1 without one;
    text, the whole answer or None; error, a message; gave_up, the injected fault that cut it; stream_error,
    the error came inside a 200 stream; timed_out)."""
    if raw.get("gave_up"):
        return CLIENT_FAULTS[raw["gave_up"]]
    status = raw["status"]
    if status == 200 and raw.get("text") is not None and not raw.get("error"):
        return "answered"
    if raw.get("timed_out"):
        return "timed out"
    if (status >= 400 or (status == 200 and raw.get("stream_error"))) and raw.get("error"):
        return "clear error"
    return "connection error"


def attribute_kill(requests: list[dict], windows: list[tuple[float, float]]) -> int:
    """Clear and connection errors of requests that overlapped a window [kill, serving again + grace] become
    "replica killed" (``requests``: dicts with kind, t0, t1; changed in place); a request that timed out
    stays "timed out" (no answer, whatever the cause). Returns how many."""
    n = 0
    for r in requests:
        if r["kind"] in ("clear error", "connection error") and \
                any(r["t0"] <= end and r["t1"] >= start for start, end in windows):
            r["kind"], n = "replica killed", n + 1
    return n


def session_status(plan: SessionPlan, kinds: list[str]) -> str:
    """How a session ended, from its plan and its requests' outcomes in order."""
    for turn, kind in zip(plan.turns, kinds):
        if turn.fault == "abort":
            continue  # the retry follows whatever happened
        if turn.fault == "hangup":
            return "hung up"
        if kind != "answered":
            return "ended by error"
    if len(kinds) < len(plan.turns):
        return "ended by error"
    return "abandoned" if plan.fault == "abandon" else "finished"


def summarize(sessions: list[dict], requests: list[dict], kills: int) -> dict:
    """Counts of a run: ``sessions`` (dicts with fault, status), ``requests`` (dicts with fault, kind, error)."""
    outcomes = collections.Counter(r["kind"] for r in requests)
    injected = collections.Counter(r["fault"] for r in requests if r["fault"])
    planned = collections.Counter(s["fault"] for s in sessions if s["fault"])
    errors = collections.Counter(f"{r['kind']}: {(r.get('error') or '')[:120]}" for r in requests
                                 if r["kind"] in ERRORS)
    served = len(requests) - outcomes["client abort"] - outcomes["client hang-up"]
    return {
        "sessions": len(sessions),
        "sessions_by_status": {k: sum(s["status"] == k for s in sessions) for k in STATUSES},
        "sessions_by_fault": {k: planned[k] for k in FAULTS} | {"none": sum(not s["fault"] for s in sessions)},
        "requests": len(requests),
        "outcomes": {k: outcomes[k] for k in OUTCOMES},
        "faults_injected": {"abort (requests)": injected["abort"], "abort took effect": outcomes["client abort"],
                            "hangup (requests)": injected["hangup"], "hangup took effect": outcomes["client hang-up"],
                            "abandon (sessions)": planned["abandon"], "pressure (sessions)": planned["pressure"],
                            "pressure burst (requests)": injected["burst"], "replica kill": kills},
        "answered_share": round(outcomes["answered"] / served, 4) if served else None,
        "hung": outcomes["timed out"],  # the only outcome that is neither an answer nor a clear error
        "errors": dict(errors.most_common()),
    }


def rss_check(start_mb: float, end_mb: float, tolerance: float) -> dict:
    """End against start resident memory: within ``tolerance`` (a fraction of the start) or not."""
    delta = end_mb - start_mb
    return {"start_mb": round(start_mb, 1), "end_mb": round(end_mb, 1), "delta_mb": round(delta, 1),
            "delta_share": round(delta / start_mb, 4), "within": delta <= tolerance * start_mb}


def read_stream(lines, hang_up_after: int | None = None) -> dict:
    """A chat completion's SSE ``lines`` (bytes, with their newlines) read into text, finish reason and
    usage; stops after ``hang_up_after`` data chunks (gave_up "hangup"), at an error chunk
    (stream_error) or at a stream that ends without [DONE] (error, not stream_error)."""
    out = {"text": None, "error": "", "gave_up": None, "stream_error": False, "usage": None, "finish": None}
    parts, chunks = [], 0
    for line in lines:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            out["text"] = "".join(parts)
            return out
        obj = json.loads(data)
        if "error" in obj:
            out["error"], out["stream_error"] = error_message(obj) or "error chunk without a message", True
            return out
        for choice in obj.get("choices") or []:
            parts.append((choice.get("delta") or {}).get("content") or "")
            out["finish"] = choice.get("finish_reason") or out["finish"]
        out["usage"] = obj.get("usage") or out["usage"]
        chunks += 1
        if hang_up_after is not None and chunks >= hang_up_after:
            out["gave_up"] = "hangup"
            return out
    out["error"] = "the stream ended without [DONE]"
    return out
