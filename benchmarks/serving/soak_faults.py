"""Soak with faults: the shipped profile behind sglang-router, for an hour, with clients that misbehave.

Two replicas of a model's server with its shipped FastKVzip profile at the recommended ratio
(SmolLM2 at 0.4, Qwen2.5-0.5B at 0.25), a small ``--max-total-tokens`` so memory binds, behind
sglang-router (cache_aware). Client threads run multi-turn chat sessions through the router's OpenAI API
(``/v1/chat/completions``, temperature 0): each turn sends the whole history plus a new question about a
passage of the essays, after a random think time. The run ends once ``--sessions`` sessions have started
and ``--minutes`` have passed (the sessions under way then finish). Faults (the first four a share of the
sessions each: ``plan_session``, fixed by ``--seed``):

  abort       one turn sent with a short client timeout: the client gives up mid-request (no
              /abort_request: the closed connection is the abort SGLang sees), then sends the turn again
  hangup      one turn streamed and the connection closed after a few chunks; the client never comes back
  abandon     the session stops after some turn and never comes back (its history stays in the tree)
  pressure    long passages and long ``ignore_eos`` answers: the pool fills in decode, SGLang retracts
  burst       at each of ``--bursts`` (shares of ``--minutes``), ``--burst-size`` such requests at once, outside
              the sessions: the decode room SGLang reserved runs out and it retracts (``retracted``)
  replica     once, at ``--kill-at`` of ``--minutes``, one replica's process group is SIGKILLed and
              started again ``--restart-after`` seconds later (the router's health check is 5 s)

Every request has a timeout and ends as one of ``OUTCOMES``: answered, clear error (an HTTP error with a
message, or an error inside a stream), connection error, timed out, the client's own abort or hang-up; clear
and connection errors while a replica was down count as "replica killed" (a time-out never does). Every
``--sample-s`` seconds each replica's resident memory (RSS summed over its process tree) and pool pages are
sampled (plotted at the end, the kill and restart marked). After the load: the router stops (its health
check, SGLang's /health, is a one-token generate that would leave a token in the tree), the replicas go
idle, ``/flush_cache``, then the pool's integrity check and its pages (0 leaked), RSS against its level
after the warm-up, tracebacks in the logs, and a greedy replay: ``--check-sessions`` sessions that finished
without a fault are sent again, alone, turn by turn (the same messages, the cache flushed before each
session) to the replica that was not killed, and each answer compared with the soak's.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.soak_faults --model smollm2   # 1,000 sessions, >= 60 min
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.soak_faults --model qwen
    # -> benchmarks/results/serving/soak_<model>.{md,json,png}
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.soak_faults --model smollm2 --quick
    # -> soak_quick_<model>: 24 sessions, >= 3 min, the same faults, one burst (a smoke test, 8-10 minutes)
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import http.client
import json
import os
import random
import re
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common.client import HEADERS, call, log_tracebacks, pool_info, server_state
from benchmarks.common.log import logger
from benchmarks.common.paths import ROOT, result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp

log = logger("soak")

ROUTER_PORT, REPLICA_PORTS = 31881, (31882, 31883)  # the router's prometheus port is 32881
# --model -> (launch/models.py key, profile, recommended ratio, --max-total-tokens)
MODELS = {"smollm2": ("smollm2", "configs/smollm2-fastkvzip.yaml", 0.4, 3072),
          "qwen": ("qwen2.5-0.5b", "configs/qwen2.5-0.5b-fastkvzip.yaml", 0.25, 3072)}
# Router: notice a dead replica within ~10 s (refused connections) and take the restarted one back (its
# defaults: every 60 s, 3 failures); a busy replica may take over 5 s (its default) to answer /health, which
# generates a token: 30 s, so the survivor of the kill is not taken for dead under load
ROUTER_ARGS = ["--health-check-interval-secs", "5", "--health-failure-threshold", "2",
               "--health-check-timeout-secs", "30"]

FAULTS = ("abort", "hangup", "abandon", "pressure")
SHARES = {"abort": 0.08, "hangup": 0.08, "abandon": 0.12, "pressure": 0.06}  # of sessions; the rest: none
OUTCOMES = ("answered", "client abort", "client hang-up", "clear error", "connection error", "timed out",
            "replica killed")
ERRORS = ("clear error", "connection error", "timed out", "replica killed")
CLIENT_FAULTS = {"abort": "client abort", "hangup": "client hang-up"}
STATUSES = ("finished", "abandoned", "hung up", "ended by error")
SYSTEM = "You are a helpful assistant. Answer briefly."
QUESTIONS = ("Summarize the passage above in one sentence.", "What is the main claim of this passage?",
             "Name one thing the author would disagree with, and why.", "Rewrite the first sentence more simply.",
             "What question does this passage leave open?", "Give the passage a short title.")


# ---------------------------------------------------------------- the plan (pure)

@dataclasses.dataclass(frozen=True)
class Turn:
    """One request of a session: a question about corpus words [offset, offset + words)."""

    offset: int
    words: int
    question: int               # index into QUESTIONS
    max_tokens: int
    think_s: float              # pause before sending it
    stream: bool
    ignore_eos: bool = False
    fault: str | None = None    # "abort" (client timeout give_up_s) or "hangup" (closed after `chunks` chunks)
    give_up_s: float = 0.0
    chunks: int = 0


@dataclasses.dataclass(frozen=True)
class SessionPlan:
    """A session: its fault kind (None: a plain one), the turns of the whole conversation, and the
    requests it sends (an abort's turn twice: given up on, then sent again; abandon and hangup cut short)."""

    index: int
    fault: str | None
    planned_turns: int
    turns: tuple[Turn, ...]

    def conversation_turns(self) -> list[int]:
        """The conversation turn (1-based) of each request."""
        out, k = [], 0
        for t in self.turns:
            out.append(k + 1)
            k += t.fault != "abort"  # the abort's retry is the same turn
        return out


def pick_fault(x: float, shares: dict[str, float]) -> str | None:
    """The fault whose slice of [0, 1) holds x (slices in FAULTS order, sized by shares), None past them."""
    edge = 0.0
    for kind in FAULTS:
        edge += shares.get(kind, 0.0)
        if x < edge:
            return kind
    return None


def plan_session(seed: int, index: int, corpus_words: int, shares: dict[str, float] = SHARES) -> SessionPlan:
    """Session ``index`` of the run ``seed``: the same plan for the same arguments (its own RNG, seeded by
    both), whatever else the run drew. ``corpus_words``: the corpus length passages are drawn from."""
    rng = random.Random(f"soak:{seed}:{index}")
    fault = pick_fault(rng.random(), shares)
    pressure = fault == "pressure"
    planned = rng.randint(2, 3) if pressure else rng.randint(2, 4)
    base = []
    for k in range(planned):
        words = rng.randint(300, 600) if pressure else rng.randint(20, 100)
        base.append(Turn(offset=rng.randrange(corpus_words - words), words=words,
                         question=rng.randrange(len(QUESTIONS)),
                         max_tokens=rng.randint(150, 300) if pressure else rng.randint(16, 32),
                         think_s=0.0 if k == 0 else round(rng.uniform(0.0, 2.0), 2),
                         stream=not pressure and rng.random() < 0.3, ignore_eos=pressure))
    at = rng.randrange(planned)  # the turn an abort or hang-up hits
    if fault == "abort":
        cut = dataclasses.replace(base[at], fault="abort", stream=False, give_up_s=round(rng.uniform(0.2, 2.0), 2))
        retry = dataclasses.replace(base[at], think_s=round(rng.uniform(0.5, 2.0), 2))
        turns = base[:at] + [cut, retry] + base[at + 1:]
    elif fault == "hangup":
        turns = base[:at] + [dataclasses.replace(base[at], fault="hangup", stream=True, chunks=rng.randint(1, 4),
                                                 max_tokens=rng.randint(64, 128))]
    elif fault == "abandon":
        turns = base[:rng.randint(1, planned - 1)]
    else:
        turns = base
    return SessionPlan(index, fault, planned, tuple(turns))


def burst_turns(seed: int, burst: int, n: int, corpus_words: int) -> list[Turn]:
    """Burst ``burst``'s ``n`` single-turn requests: long passages, long ``ignore_eos`` answers, all at once."""
    rng = random.Random(f"burst:{seed}:{burst}")
    out = []
    for _ in range(n):
        words = rng.randint(500, 700)
        out.append(Turn(offset=rng.randrange(corpus_words - words), words=words, question=0,
                        max_tokens=rng.randint(250, 350), think_s=0.0, stream=False, ignore_eos=True))
    return out


def question_text(turn: Turn, words: list[str]) -> str:
    return " ".join(words[turn.offset:turn.offset + turn.words]) + "\n\n" + QUESTIONS[turn.question]


def chat_payload(model: str, messages: list[dict], turn: Turn) -> dict:
    payload = {"model": model, "messages": messages, "temperature": 0, "max_tokens": turn.max_tokens}
    if turn.ignore_eos:
        payload["ignore_eos"] = True
    return payload


# ---------------------------------------------------------------- outcomes (pure)

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


# ---------------------------------------------------------------- the client

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
        self.histories: dict[int, list[dict]] = {}   # finished plain sessions: each request's messages and answer

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
            if status == "finished" and plan.fault is None:
                self.histories[plan.index] = sent
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


# ---------------------------------------------------------------- servers, memory, the kill

def tree_rss_mb(pid: int | None) -> float | None:
    """Resident memory of a process and its descendants (MiB; shared pages counted in each), None if gone."""
    import psutil

    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def alive_pid(srv) -> int | None:
    return srv.proc.pid if srv.proc is not None and srv.proc.poll() is None else None


class Fleet:
    """The replicas (one slot each; a restart puts a new ServerProcess in the slot), every server started
    (for the logs and the cleanup), the memory samples and the kill's timeline."""

    def __init__(self, make, t0: float):
        self.make, self.t0 = make, t0
        self.slots = [make(i, "") for i in range(len(REPLICA_PORTS))]
        self.all = list(self.slots)
        self.samples: list[dict] = []
        self.kill: dict = {}
        self.stop_sampling = threading.Event()

    def sample(self) -> None:
        t = round(time.time() - self.t0, 1)
        for i, srv in enumerate(self.slots):
            row = {"t": t, "replica": i, "pid": alive_pid(srv), "rss_mb": None, "pages_used": None,
                   "pages_total": None, "integrity": None, "retracted": None, "running": None}
            row["rss_mb"] = tree_rss_mb(row["pid"])
            if row["rss_mb"] is not None:
                row["rss_mb"] = round(row["rss_mb"], 1)
            try:
                info = pool_info(srv.url, timeout=20)
                row.update(pages_used=info["pages_used"], pages_total=info["pages_total"],
                           integrity=info["integrity"], retracted=info["retracted"],
                           running=info["running_requests"])
            except Exception as e:  # a replica down (the kill) or too busy to answer in time
                row["error"] = f"{type(e).__name__}: {e}"[:120]
            self.samples.append(row)

    def sampler(self, every_s: float) -> None:
        while not self.stop_sampling.wait(every_s):
            self.sample()

    def kill_and_restart(self, index: int, at_s: float, after_s: float, warm) -> None:
        """At ``at_s`` into the run, SIGKILL replica ``index``'s process group; ``after_s`` later start it
        again (a new log) and warm it up. Records the times (seconds into the run)."""
        time.sleep(max(0.0, self.t0 + at_s - time.time()))
        old = self.slots[index]
        self.kill = {"replica": index, "port": REPLICA_PORTS[index], "pid": old.proc.pid,
                     "rss_mb_before": tree_rss_mb(alive_pid(old))}
        try:
            self.kill["pool_before"] = pool_info(old.url, timeout=20)
        except Exception:
            pass
        os.killpg(old.proc.pid, 9)
        old.proc.wait()
        old.stop()  # closes its log
        self.kill["killed_s"] = round(time.time() - self.t0, 1)
        log(f"killed replica {index} (port {REPLICA_PORTS[index]}, pid {old.proc.pid}) at "
            f"{self.kill['killed_s']} s")
        time.sleep(after_s)
        new = self.make(index, "-restarted")
        self.all.append(new)
        self.kill["restart_s"] = round(time.time() - self.t0, 1)
        try:
            new.start()
        except Exception as e:
            self.kill["restart_error"] = f"{type(e).__name__}: {e}"[:500]
            log(f"replica {index} did not start again: {self.kill['restart_error']}")
            return
        self.slots[index] = new
        self.kill["ready_s"] = round(time.time() - self.t0, 1)
        warm(new.url)
        self.kill["warm_s"] = round(time.time() - self.t0, 1)
        self.kill["rss_mb_after_warmup"] = tree_rss_mb(alive_pid(new))
        log(f"replica {index} serving again at {self.kill['ready_s']} s (pid {new.proc.pid})")

    def stop_all(self) -> None:
        for srv in self.all:
            srv.stop()


def wait_idle(url: str, timeout: float = 180) -> bool:
    """True once no request runs or waits on the server (aborted ones may take a step to leave)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            st = server_state(url, timeout=30)
            batch, info = st.get("batch_counters", {}), st["tangram"]["pool_info"]
            if info["running_requests"] == 0 and batch.get("running", 0) == 0 and batch.get("waiting", 0) == 0:
                return True
        except Exception:
            pass
        time.sleep(1)
    return False


def flush(url: str, timeout: float = 180) -> bool:
    """/flush_cache until it succeeds (it refuses while requests run)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if call(url + "/flush_cache", {}, timeout=60)[0] == 200:
            time.sleep(1)
            return True
        time.sleep(2)
    return False


def warm_up(url: str, model: str, words: list[str], n: int = 8) -> None:
    """``n`` chats at once, short to long passages (streamed and not): the code paths, batch shapes and
    allocations of the load are made before the memory's start level is read."""
    def one(i: int) -> None:
        turn = Turn(offset=700 * i, words=40 + 80 * i, question=i % len(QUESTIONS), max_tokens=32, think_s=0,
                    stream=bool(i % 2))
        payload = chat_payload(model, [{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": question_text(turn, words)}], turn)
        (chat_stream if turn.stream else chat_once)(url, payload, 300)

    with ThreadPoolExecutor(n) as ex:
        list(ex.map(one, range(n)))


def model_id(url: str) -> str:
    status, body = call(url + "/v1/models", None, timeout=60)
    return body["data"][0]["id"] if status == 200 else "default"


# ---------------------------------------------------------------- after the load

def replay(url: str, model: str, histories: dict[int, list[dict]], count: int, seed: int) -> dict:
    """``count`` of the finished plain sessions sent again alone, turn by turn with the soak's messages,
    the cache flushed before each; each answer compared with the soak's."""
    picked = sorted(random.Random(seed).sample(sorted(histories), min(count, len(histories))))
    turns, mismatches = [], []
    for index in picked:
        flush(url)
        for k, h in enumerate(histories[index], 1):
            raw = chat_once(url, chat_payload(model, h["messages"], h["turn"]), 600)
            alone = raw["text"] if raw["text"] is not None else f"(error: {raw['error']})"
            cached = usage_fields(raw)["cached_tokens"]
            turns.append({"same": alone == h["answer"], "same_cache": cached == h["cached_tokens"]})
            if alone == h["answer"]:
                continue
            at = next((i for i, (a, b) in enumerate(zip(alone, h["answer"])) if a != b),
                      min(len(alone), len(h["answer"])))
            mismatches.append({"session": index, "turn": k, "soak_cached_tokens": h["cached_tokens"],
                               "alone_cached_tokens": cached, "first_difference_at": at,
                               "soak": h["answer"][max(0, at - 40):at + 80], "alone": alone[max(0, at - 40):at + 80]})
    same_cache = [t for t in turns if t["same_cache"]]
    return {"sessions": len(picked), "turns": len(turns), "identical": sum(t["same"] for t in turns),
            "turns_same_cached_tokens": len(same_cache),
            "identical_same_cached_tokens": sum(t["same"] for t in same_cache),
            "mismatches": mismatches, "session_indices": picked}


def pool_after(url: str) -> dict:
    keys = ("integrity", "pages_used", "pages_reserved", "pages_held_by_tree", "pages_total", "retracted",
            "evicted_segments", "admitted", "waited", "capped", "too_large", "peak_pages_used", "running_requests")
    try:
        info = pool_info(url, timeout=60)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    return {k: info.get(k) for k in keys}


def logged_retractions(path: str) -> int:
    """Requests SGLang's log says it retracted ("KV cache pool is full. Retract requests. #retracted_reqs: N")."""
    if not os.path.exists(path):
        return 0
    with open(path, errors="replace") as f:
        return sum(int(m.group(1)) for line in f if (m := re.search(r"#retracted_reqs: (\d+)", line)))


def traceback_excerpts(path: str, lines_after: int = 12, most: int = 3) -> list[str]:
    """The first ``most`` tracebacks of a log, each with the lines after it."""
    if not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        text = f.readlines()
    return ["".join(text[i:i + lines_after]) for i, line in enumerate(text) if "Traceback" in line][:most]


def plot(samples: list[dict], kill: dict, path: str, title: str) -> str | None:
    """RSS and pool pages of each replica over time, the kill and the restart marked; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot")
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for i in range(len(REPLICA_PORTS)):
        rows = [s for s in samples if s["replica"] == i]
        t = [s["t"] / 60 for s in rows]
        top.plot(t, [s["rss_mb"] if s["rss_mb"] is not None else float("nan") for s in rows], label=f"replica {i}")
        bottom.plot(t, [s["pages_used"] if s["pages_used"] is not None else float("nan") for s in rows],
                    label=f"replica {i}")
    total = next((s["pages_total"] for s in samples if s.get("pages_total")), None)
    if total:
        bottom.axhline(total, color="grey", lw=0.8, ls=":", label="pages in the pool")
    for ax in (top, bottom):
        for key, style, name in (("killed_s", "--", "replica killed"), ("ready_s", "-.", "serving again")):
            if key in kill:
                ax.axvline(kill[key] / 60, color="red", ls=style, lw=1, label=name)
    top.set_ylabel("resident memory, MiB")
    bottom.set_ylabel("pool pages used")
    bottom.set_xlabel("minutes from the start of the load (the last points: after the flush)")
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
    top.set_title(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- report

def checks(result: dict) -> list[tuple[str, bool, str]]:
    """(check, passed, figures) of the issue's after-the-run requirements."""
    s, reps = result["summary"], result["replicas"]
    g = result["replay"]
    return [
        ("integrity holds (every sample, and after the flush)",
         result["integrity_samples_not_ok"] == 0 and all(r["after_flush"].get("integrity") == "ok" for r in reps),
         f"{result['integrity_samples_not_ok']} samples not ok of {result['integrity_samples']}; after flush: "
         + ", ".join(str(r["after_flush"].get("integrity")) for r in reps)),
        ("0 pages leaked after the flush", all(r["after_flush"].get("pages_used") == 0 for r in reps),
         ", ".join(f"{r['after_flush'].get('pages_used')} used / {r['after_flush'].get('pages_reserved')} reserved"
                   for r in reps)),
        ("resident memory back to its start level", all(r["rss"] and r["rss"]["within"] for r in reps),
         "; ".join(f"replica {r['replica']}: {r['rss']['start_mb']} -> {r['rss']['end_mb']} MiB "
                   f"({r['rss']['delta_share']:+.1%})" if r["rss"] else f"replica {r['replica']}: -" for r in reps)),
        ("every request got an answer or a clear error (none hung)", s["hung"] == 0,
         f"{s['hung']} timed out of {s['requests']}"),
        ("SGLang retracted requests (pressure reached the pool)", result["retracted"] > 0,
         f"{result['retracted']} retracted"),
        ("finished sessions answer as alone (greedy replay)", g["turns"] > 0 and g["identical"] == g["turns"],
         f"{g['identical']} of {g['turns']} turns identical ({g['sessions']} sessions); with the soak's "
         f"cached tokens: {g['identical_same_cached_tokens']} of {g['turns_same_cached_tokens']}"),
        ("no traceback in the replicas' logs", result["tracebacks_total"] == 0, f"{result['tracebacks_total']}"),
    ]


def report(result: dict, args) -> list[str]:
    s, kill = result["summary"], result["kill"]
    rows = lambda d: [f"| {k} | {v} |" for k, v in d.items()]  # noqa: E731
    lines = [f"Command: `{result['command']}`", "",
             f"Two replicas of {result['model']} with `{result['profile']}` at `--tangram-ratio {result['ratio']}`, "
             f"`--max-total-tokens {result['max_total_tokens']}` ({result['pages_total']} pool pages each), "
             f"`--sleep-on-idle --enable-cache-report`, behind sglang-router (cache_aware, "
             f"`{' '.join(ROUTER_ARGS)}`); {args.clients} client threads through `/v1/chat/completions`, "
             f"temperature 0. Load: {result['load_minutes']} min ({s['sessions']} sessions, {s['requests']} "
             f"requests, {s['sessions'] / max(result['load_minutes'], 0.1):.1f} sessions a minute); the whole run "
             f"with start-up, checks and replay {result['total_minutes']} min.", "",
             "## Checks", "", "| check | passed | figures |", "| --- | --- | --- |"]
    lines += [f"| {name} | {'yes' if ok else '**no**'} | {fig} |" for name, ok, fig in checks(result)]
    lines += ["", "## Sessions", "", "| status | sessions |", "| --- | --- |", *rows(s["sessions_by_status"]), "",
              "| planned fault | sessions |", "| --- | --- |", *rows(s["sessions_by_fault"]), "",
              "## Requests: answers and errors by kind", "",
              "| outcome | requests |", "| --- | --- |", *rows(s["outcomes"]), "",
              f"Answered: {s['answered_share'] or 0:.1%} of the requests the client did not cut itself.", "",
              "## Faults injected", "", "| fault | count |", "| --- | --- |", *rows(s["faults_injected"]),
              f"| retracted by SGLang (pool counters, both replicas, the killed process's last sample included) | "
              f"{result['retracted']} |",
              f"| retracted by SGLang (its logs: \"KV cache pool is full. Retract requests.\") | "
              f"{result['retracted_in_logs']} |", "",
              "An abort is the client's timeout (0.2-2 s) on a non-streamed turn: the closed connection is what "
              "SGLang sees; it took effect when the answer had not come back by then. A pressure burst: "
              f"{args.burst_size} single-turn requests (500-700 words, 250-350 new tokens, ignore_eos) at once, at "
              f"{', '.join(f'{b:.0%}' for b in args.bursts) or 'no point'} of the minimum duration.", "",
              "## Replica kill and restart", ""]
    if kill.get("killed_s") is not None:
        lines += [f"- replica {kill['replica']} (port {kill['port']}, pid {kill['pid']}): process group SIGKILLed "
                  f"at {kill['killed_s']} s into the run, started again at {kill.get('restart_s')} s, serving at "
                  f"{kill.get('ready_s', '- (did not start: ' + str(kill.get('restart_error')) + ')')} s",
                  f"- requests counted as \"replica killed\" (a clear or connection error while it was down, until "
                  f"{args.kill_grace:.0f} s after it served again): {s['outcomes']['replica killed']}"]
    else:
        lines.append("- no replica was killed in this run")
    lines.append("- after the load, a request through the router: "
                 + ("answered" if result["healthy_after"] else "**failed**"))
    lines += ["", "## Errors by message", ""]
    lines += [f"- {n} x `{m}`" for m, n in s["errors"].items()] or ["- none"]
    lines += ["", "## Pool and memory per replica", "",
              "| replica | integrity after flush | pages used / reserved after flush | retracted | evicted segments "
              "| RSS start MiB | RSS at half the load | RSS end MiB | delta | RSS max MiB | tracebacks |",
              "|" + " --- |" * 11]
    for r in result["replicas"]:
        a, rss = r["after_flush"], r["rss"] or {}
        lines.append(f"| {r['replica']}{' (restarted)' if r['restarted'] else ''} | {a.get('integrity')} | "
                     f"{a.get('pages_used')} / {a.get('pages_reserved')} | {r['before_flush'].get('retracted')} | "
                     f"{r['before_flush'].get('evicted_segments')} | {rss.get('start_mb', '-')} | "
                     f"{r['rss_half_load_mb']} | {rss.get('end_mb', '-')} | {rss.get('delta_mb', '-')} MiB "
                     f"({rss.get('delta_share', 0):+.1%}) | "
                     f"{r['rss_max_mb']} | {r['tracebacks']} |")
    lines += ["", "RSS: the server's process tree (each process's resident set summed), sampled every "
              f"{args.sample_s:.0f} s. Start: after the warm-up (8 chats at once) and a flush (the restarted replica: "
              "after its own warm-up, already under load); end: after the load and the flush. Tolerance: "
              f"+{args.rss_tolerance:.0%} of the start.",
              "", f"![memory and pages over time]({os.path.basename(result['plot'])})" if result["plot"]
              else "(no plot: matplotlib is not installed)", "", "## Greedy replay", ""]
    g, a = result["replay"], result["after_replay_flush"]
    lines += [f"{g['identical']} of {g['turns']} turns identical over {g['sessions']} finished plain sessions "
              "(each sent again alone with the soak's messages, the cache flushed before each session, to the "
              "replica that was not killed); of the turns that found as many history tokens cached as in the soak: "
              f"{g['identical_same_cached_tokens']} of {g['turns_same_cached_tokens']} identical.", "",
              "A turn whose history was evicted (or routed to the other replica) in the soak is prefilled and "
              "compressed whole; alone it extends the previous turn's compressed history in the tree: a different "
              "KV cache, so its greedy answer may differ. After the replay and a flush, that replica: integrity "
              f"{a.get('integrity')}, {a.get('pages_used')} pages used.", ""]
    for m in g["mismatches"]:
        lines.append(f"- session {m['session']} turn {m['turn']} (cached tokens: soak {m['soak_cached_tokens']}, "
                     f"alone {m['alone_cached_tokens']}), from character {max(0, m['first_difference_at'] - 40)}: "
                     f"soak {m['soak']!r} / alone {m['alone']!r}")
    lines += ["", "## Logs", ""]
    for path, n in result["tracebacks"].items():
        lines.append(f"- `{path}`: {n} tracebacks")
    for ex in result["traceback_excerpts"]:
        lines += ["", "```", ex.rstrip(), "```"]
    return lines


# ---------------------------------------------------------------- main

def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    ap.add_argument("--check-sessions", type=int, default=20, help="sessions replayed alone afterwards")
    ap.add_argument("--rss-tolerance", type=float, default=0.10, help="end RSS within this share of the start")
    ap.add_argument("--progress-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="24 sessions, >= 3 min, 6 clients, one burst of 8, 4 replayed")
    ap.add_argument("--name", default=None, help="results name (default soak_<model>, soak_quick_<model>)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sessions, args.minutes, args.clients, args.check_sessions = 24, 3, 6, 4
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

        survivor = fleet.slots[1 - args.kill_replica] if windows else fleet.slots[0]
        log(f"greedy replay of {args.check_sessions} sessions against {survivor.url}")
        greedy = replay(survivor.url, model, soak.histories, args.check_sessions, args.seed)
        flush(survivor.url)
        after_replay = pool_after(survivor.url)
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
