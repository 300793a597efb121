"""The soak's HTTP client: chat turns through the router, plain or streamed, given up on or hung up."""

from __future__ import annotations

import collections
import http.client
import json
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common.client import HEADERS, call
from benchmarks.common.log import logger
from benchmarks.serving.soak_faults.outcomes import classify, error_message, read_stream, session_status
from benchmarks.serving.soak_faults.plan import SYSTEM, SessionPlan, Turn, chat_payload, plan_session, question_text

log = logger("soak")


def chat_once(url: str, payload: dict, timeout: float, give_up: bool = False) -> dict:
    """A non-streamed chat completion; ``give_up``: the timeout is the client's injected abort."""
    status, body = call(url + "/v1/chat/completions", payload, timeout)
    raw = {"status": status, "text": None, "error": "", "gave_up": None, "usage": None, "finish": None}
    if status == 200 and isinstance(body, dict) and body.get("choices"):
        choice = body["choices"][0]
        raw.update(text=(choice.get("message") or {}).get("content") or "", usage=body.get("usage"),
                   finish=choice.get("finish_reason"))
        if raw["finish"] == "abort":
            raw.update(text=None, error="finish_reason abort", stream_error=True)
        return raw
    raw["error"] = error_message(body) or f"HTTP {status} without a message"
    if status == -1 and "timed out" in raw["error"]:
        if give_up:
            raw["gave_up"] = "abort"
        else:
            raw["timed_out"] = True
    return raw


def chat_stream(url: str, payload: dict, timeout: float, hang_up_after: int | None = None) -> dict:
    """A streamed chat completion read to its end (``timeout``: per read and for the whole stream), or
    closed after ``hang_up_after`` chunks."""
    where = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=timeout)
    deadline = time.time() + timeout
    body = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    raw = {"status": -1, "text": None, "error": "", "gave_up": None, "usage": None, "finish": None}
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=HEADERS)
        resp = conn.getresponse()
        raw["status"] = resp.status
        if resp.status != 200:
            text = resp.read().decode(errors="replace")
            try:
                text = json.loads(text)
            except ValueError:
                pass
            raw["error"] = error_message(text) or f"HTTP {resp.status} without a message"
            return raw

        def lines():
            while time.time() < deadline:
                line = resp.readline()
                if not line:
                    return
                yield line
            raw["timed_out"] = True

        raw.update(read_stream(lines(), hang_up_after))
        if raw.get("timed_out"):
            raw["error"] = "timed out reading the stream"
    except (OSError, http.client.HTTPException, ValueError) as e:
        raw["error"] = str(e) or type(e).__name__
        raw["timed_out"] = "timed out" in raw["error"]
    finally:
        conn.close()
    return raw


def usage_fields(raw: dict) -> dict:
    u = raw.get("usage") or {}
    details = u.get("prompt_tokens_details") or {}
    return {"prompt_tokens": u.get("prompt_tokens"), "completion_tokens": u.get("completion_tokens"),
            "cached_tokens": details.get("cached_tokens")}


class Soak:
    """The client side of the run: sessions from a shared counter, their requests, the stop condition."""

    def __init__(self, url: str, model: str, words: list[str], args, t0: float):
        self.url, self.model, self.words, self.args, self.t0 = url, model, words, args, t0
        self.lock = threading.Lock()
        self.started, self.sessions, self.requests = 0, [], []
        self.histories: dict[int, dict] = {}   # finished sessions: fault, each answered request's messages and answer

    def next_plan(self) -> SessionPlan | None:
        """The next session, until --sessions have started and --minutes have passed."""
        with self.lock:
            if self.started >= self.args.sessions and time.time() - self.t0 >= self.args.minutes * 60:
                return None
            self.started += 1
            index = self.started - 1
        return plan_session(self.args.seed, index, len(self.words))

    def send(self, messages: list[dict], turn: Turn) -> dict:
        payload = chat_payload(self.model, messages, turn)
        if turn.fault == "abort":
            return chat_once(self.url, payload, turn.give_up_s, give_up=True)
        if turn.stream:
            return chat_stream(self.url, payload, self.args.request_timeout,
                               turn.chunks if turn.fault == "hangup" else None)
        return chat_once(self.url, payload, self.args.request_timeout)

    def run_session(self, plan: SessionPlan) -> None:
        history = [{"role": "system", "content": SYSTEM}]
        records, kinds, sent = [], [], []
        for turn, k in zip(plan.turns, plan.conversation_turns()):
            time.sleep(turn.think_s)
            messages = history + [{"role": "user", "content": question_text(turn, self.words)}]
            t0 = time.time() - self.t0
            raw = self.send(messages, turn)
            kind = classify(raw)
            records.append({"session": plan.index, "turn": k, "fault": turn.fault, "stream": turn.stream,
                            "t0": round(t0, 2), "t1": round(time.time() - self.t0, 2), "kind": kind,
                            "status": raw["status"], "error": raw["error"][:300], "finish": raw.get("finish"),
                            **usage_fields(raw)})
            kinds.append(kind)
            if turn.fault == "abort":
                continue
            if turn.fault == "hangup" or kind != "answered":
                break
            sent.append({"messages": messages, "turn": turn, "answer": raw["text"],
                         "cached_tokens": records[-1]["cached_tokens"]})
            history = messages + [{"role": "assistant", "content": raw["text"]}]
        status = session_status(plan, kinds)
        with self.lock:
            self.requests += records
            self.sessions.append({"index": plan.index, "fault": plan.fault, "status": status,
                                  "requests": len(records), "planned_turns": plan.planned_turns})
            if status in ("finished", "abandoned"):   # every turn answered: the replay checks them all
                self.histories[plan.index] = {"fault": plan.fault or "none", "turns": sent}
            done = len(self.sessions)
        if done % self.args.progress_every == 0:
            with self.lock:
                counts = collections.Counter(r["kind"] for r in self.requests)
            minutes = (time.time() - self.t0) / 60
            eta = max(self.args.minutes, self.args.sessions * minutes / done)
            log(f"{done} sessions done ({self.args.sessions} wanted), {minutes:.1f} min ({self.args.minutes} "
                f"wanted, at this rate the load ends near {eta:.0f} min): {dict(counts)}")

    def client(self) -> None:
        while (plan := self.next_plan()) is not None:
            self.run_session(plan)

    def burst(self, at_s: float, turns: list[Turn]) -> None:
        """At ``at_s`` into the load, ``turns`` sent together, each alone in its conversation (fault "burst")."""
        time.sleep(max(0.0, self.t0 + at_s - time.time()))
        log(f"pressure burst: {len(turns)} long ignore_eos requests at once")

        def one(turn: Turn) -> dict:
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": question_text(turn, self.words)}]
            t0 = time.time() - self.t0
            raw = self.send(messages, turn)
            return {"session": -1, "turn": 1, "fault": "burst", "stream": False, "t0": round(t0, 2),
                    "t1": round(time.time() - self.t0, 2), "kind": classify(raw), "status": raw["status"],
                    "error": raw["error"][:300], "finish": raw.get("finish"), **usage_fields(raw)}

        with ThreadPoolExecutor(len(turns)) as ex:
            records = list(ex.map(one, turns))
        with self.lock:
            self.requests += records
        log(f"pressure burst done: {dict(collections.Counter(r['kind'] for r in records))}")
