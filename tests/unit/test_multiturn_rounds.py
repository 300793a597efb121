"""benchmarks/serving/multiturn_rounds.py's client (SGLang's bench_multiturn loop) against a stand-in /generate:
every client's rounds are sent in order, each the previous request plus its answer plus the next input, never
more than --max-parallel at once, and a failed request ends its client's rounds without stalling the run; with
session ids or streaming sessions, each client's requests name its session, a streaming session's rounds send
only their new input, every session is closed, and a round the server leaves silent is a stall."""

import json
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.common.report_tables import rounds_table
from benchmarks.serving.multiturn_rounds import run_clients

ANSWER = [7, 8]


class Inputs:
    """Round r's new input of client c: three ids naming both."""

    def piece(self, client, round_):
        return [100 * client + round_] * 3


@pytest.fixture
def server():
    seen, lock, state = [], threading.Lock(), dict(in_flight=0, peak=0, fail=set())

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids = body["input_ids"]
            with lock:
                seen.append(ids)
                state["in_flight"] += 1
                state["peak"] = max(state["peak"], state["in_flight"])
            try:
                if tuple(ids[:3]) in state["fail"] and len(ids) > 3:   # the client's second round
                    self.send_response(500)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                threading.Event().wait(0.02)
                for out in (ANSWER[:1], ANSWER):
                    chunk = {"output_ids": out, "meta_info": {"prompt_tokens": len(ids), "cached_tokens": len(ids) - 3}}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
            finally:
                with lock:
                    state["in_flight"] -= 1

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen, state
    httpd.shutdown()


def _args(**kw):
    base = dict(num_clients=3, num_rounds=3, max_parallel=2, output_length=2, request_rate=500.0,
                distribution="poisson", ready_queue_policy="random", seed=1, request_timeout=30.0)
    return types.SimpleNamespace(**{**base, **kw})


def test_every_round_extends_its_history_by_the_answer_and_the_next_input(server):
    url, seen, state = server
    run = run_clients(url, Inputs(), _args())
    assert run["errors"] == [] and len(seen) == 9
    for c, client in enumerate(run["sessions"]):
        assert [t["turn"] for t in client["turns"]] == [1, 2, 3] and "done_at" in client
        mine = sorted((ids for ids in seen if ids[:3] == Inputs().piece(c, 0)), key=len)
        assert mine[0] == Inputs().piece(c, 0)
        for r in (1, 2):
            assert mine[r] == mine[r - 1] + ANSWER + Inputs().piece(c, r)
        assert [t["prompt_tokens"] for t in client["turns"]] == [len(ids) for ids in mine]
    assert 1 <= state["peak"] <= 2


def test_a_failed_request_ends_its_clients_rounds_and_the_run_still_ends(server):
    url, seen, state = server
    state["fail"].add(tuple(Inputs().piece(1, 0)))
    run = run_clients(url, Inputs(), _args(ready_queue_policy="fifo"))
    assert len(run["errors"]) == 1 and run["errors"][0].startswith("client 1 round 2")
    assert [len(c["turns"]) for c in run["sessions"]] == [3, 1, 3]
    assert "done_at" not in run["sessions"][1]


def test_the_table_has_a_row_per_server_and_no_answers_column(server):
    url, _, _ = server
    args = _args()
    runs = [{**run_clients(url, Inputs(), args), "server": name, "repeat": 0} for name in ("stock-lpm", "tangram")]
    res = dict(args={**vars(args), "request_length": 3, "max_total_tokens": 4096, "profile": "p.yaml", "ratio": 0.4, "repeats": 1},
               model_path="/m/SmolLM2", runs=runs)
    lines = rounds_table(res)
    header = next(line for line in lines if line.startswith("| server"))
    rows = [line for line in lines if line.startswith(("| stock-lpm", "| tangram"))]
    assert "right" not in header and len(rows) == 2
    assert all(len(r.split("|")) == len(header.split("|")) for r in rows)
    assert "1.00x" in rows[0]


def test_think_time_servers_launch_with_the_same_flags_and_take_a_client(monkeypatch):
    """think_time.run_server, shared with multiturn_rounds: each server's model, profile and flags as before the
    client became a parameter (what the think-time figures ran), and a given client replaces the sessions."""
    from benchmarks.serving import think_time

    launched, ran = [], []

    class FakeServer:
        def __init__(self, model_path, port, profile, extra_args):
            launched.append((profile, list(extra_args)))
            self.url = f"http://127.0.0.1:{port}"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(think_time, "ServerProcess", FakeServer)
    monkeypatch.setattr(think_time, "server_state", lambda url, timeout: {})
    monkeypatch.setattr(think_time, "uniform_profile_path", lambda model_path: "/u.yaml")
    monkeypatch.setattr(think_time, "run_sessions", lambda url, wl, ids: ran.append(ids) or
                        dict(wall_s=1.0, sessions=[], errors=[]))
    args = types.SimpleNamespace(max_total_tokens=8192, profile="configs/p.yaml", ratio=0.4, port=1)
    base = ["--enable-cache-report", "--sleep-on-idle"]
    expect = {
        "tangram": (think_time.ROOT + "/configs/p.yaml", ["--max-total-tokens", "8192", *base, "--tangram-ratio", "0.4"]),
        "stock-lpm": (None, ["--max-total-tokens", "8192", *base, "--schedule-policy", "lpm"]),
        "tangram-1.0": ("/u.yaml", ["--max-total-tokens", "8192", *base]),
        "stock-lpm-host-bytes": (None, ["--max-total-tokens", "24576", *base, "--schedule-policy", "lpm"]),
        "tangram-host-sessions": (think_time.ROOT + "/configs/p.yaml", ["--max-total-tokens", "8192", *base,
                                  "--tangram-host-ratio", "2", "--enable-session-radix-cache", "--tangram-ratio", "0.4"]),
    }
    for name, (profile, flags) in expect.items():
        out = think_time.run_server(name, "/m", args, object())
        assert launched[-1] == (profile, flags) and out["server"] == name
    assert ran == [False, False, False, False, True]
    out = think_time.run_server("stock-lpm", "/m", args, None, client=lambda url: dict(wall_s=2.0, sessions=[], errors=[]))
    assert out["wall_s"] == 2.0 and len(ran) == 5


def test_a_streamed_chat_turn_reads_text_usage_and_first_token():
    """think_time.chat_turn over client.stream_events: the deltas joined, the usage chunk, a TTFT no later than the
    whole turn; an HTTP error raises with its status."""
    from benchmarks.serving.think_time import chat_turn

    events = [{"choices": [{"delta": {"role": "assistant"}}]}, {"choices": [{"delta": {"content": "The code"}}]},
              {"choices": [{"delta": {"content": " is 42."}}]}, {"choices": [], "usage": {"prompt_tokens": 9}}]
    status = [200]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert self.path == "/v1/chat/completions" and body["stream"] and body["session_id"] == "s1"
            self.send_response(status[0])
            self.end_headers()
            if status[0] == 200:
                for e in events:
                    self.wfile.write(f"data: {json.dumps(e)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        out = chat_turn(url, [{"role": "user", "content": "?"}], 8, "s1")
        assert out["text"] == "The code is 42." and out["usage"] == {"prompt_tokens": 9}
        assert 0 <= out["ttft_s"] <= out["seconds"]
        status[0] = 503
        with pytest.raises(RuntimeError, match="HTTP 503"):
            chat_turn(url, [{"role": "user", "content": "?"}], 8, "s1")
    finally:
        httpd.shutdown()


class SessionServer:
    """A stand-in for SGLang's session endpoints and /generate: a streaming session (/open_session with
    streaming) holds its history, so a round's prompt is the history plus the ids sent; a session_id request
    sends it whole. Requests whose ids start with a piece in ``hang`` get no data for ``hang_s`` seconds."""

    def __init__(self):
        self.lock, self.opened, self.closed, self.requests = threading.Lock(), [], [], []
        self.history, self.hang, self.hang_s = {}, set(), 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                reply = outer.handle(self.path, body)
                if self.path == "/generate":
                    if tuple(body["input_ids"][:3]) in outer.hang:
                        threading.Event().wait(outer.hang_s)
                        return
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(f"data: {json.dumps(reply)}\n\ndata: [DONE]\n\n".encode())
                    return
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def handle(self, path, body):
        with self.lock:
            if path == "/open_session":
                assert body["streaming"] is True
                self.opened.append(f"sid-{len(self.opened)}")
                return self.opened[-1]
            if path == "/close_session":
                self.closed.append(body["session_id"])
                return None
            self.requests.append(body)
            sid = (body.get("session_params") or {}).get("id")
            prompt = self.history.get(sid, []) + body["input_ids"] if sid else body["input_ids"]
            if sid:
                self.history[sid] = prompt + ANSWER
            return {"output_ids": ANSWER, "meta_info": {"prompt_tokens": len(prompt), "cached_tokens": 0}}


@pytest.fixture
def sessions_server():
    srv = SessionServer()
    yield srv
    srv.httpd.shutdown()


def test_streaming_session_rounds_send_only_their_new_input_and_every_session_is_closed(sessions_server):
    srv = sessions_server
    run = run_clients(srv.url, Inputs(), _args(), "streaming")
    assert run["errors"] == [] and run["stalled"] == [] and len(srv.requests) == 9
    assert sorted(srv.opened) == sorted(srv.closed) and len(srv.opened) == 3
    for c, client in enumerate(run["sessions"]):
        mine = [b for b in srv.requests if b["input_ids"] == Inputs().piece(c, 0)]
        sid = mine[0]["session_params"]["id"]
        sent = [b["input_ids"] for b in srv.requests if b["session_params"]["id"] == sid]
        assert sent == [Inputs().piece(c, r) for r in range(3)] and "session_id" not in mine[0]
        # the prompt the session restores: what the whole-history clients send
        assert [t["prompt_tokens"] for t in client["turns"]] == [3, 8, 13]


def test_session_id_rounds_send_the_whole_history_under_one_id_per_client(sessions_server):
    srv = sessions_server
    run = run_clients(srv.url, Inputs(), _args(), True)
    assert run["errors"] == [] and srv.opened == [] and len(srv.requests) == 9
    ids = {b["session_id"] for b in srv.requests}
    assert len(ids) == 3 and sorted(srv.closed) == sorted(ids)
    for sid in ids:
        sent = [b["input_ids"] for b in srv.requests if b["session_id"] == sid]
        assert [len(x) for x in sent] == [3, 8, 13] and sent[1][:3] == sent[0]
    run = run_clients(srv.url, Inputs(), _args(), False)
    assert all("session_id" not in b for b in srv.requests[9:]) and len(srv.closed) == 3


def test_a_silent_round_is_a_stall_that_ends_its_client_and_fails_only_a_profiles_run(sessions_server):
    from benchmarks.serving.think_time import report_problems

    srv = sessions_server
    srv.hang, srv.hang_s = {tuple(Inputs().piece(1, 1))}, 2.0
    run = run_clients(srv.url, Inputs(), _args(request_timeout=0.5, ready_queue_policy="fifo"), "streaming")
    assert run["errors"] == [] and [(s["client"], s["round"]) for s in run["stalled"]] == [(1, 2)]
    assert [len(c["turns"]) for c in run["sessions"]] == [3, 1, 3] and len(srv.requests) == 8   # 7 answered
    assert sorted(srv.closed) == sorted(srv.opened)   # the stalled client's session too
    assert report_problems([{**run, "server": "stock-lpm-streaming"}], "out.json") == 0
    assert report_problems([{**run, "server": "tangram-sessions"}], "out.json") == 1
    args = _args(request_timeout=0.5)
    res = dict(args={**vars(args), "request_length": 3, "max_total_tokens": 4096, "profile": "p.yaml",
                     "ratio": 0.4, "repeats": 1}, model_path="/m/SmolLM2",
               runs=[{**run, "server": "stock-lpm-streaming", "repeat": 0}])
    stalls = [line for line in rounds_table(res) if line.startswith("Stalls")]
    assert stalls and "stock-lpm-streaming: answered 7 of 9, stalled 1 (rounds 2)" in stalls[0]
