"""benchmarks/serving/multiturn_rounds.py's client (SGLang's bench_multiturn loop) against a stand-in /generate:
every client's rounds are sent in order, each the previous request plus its answer plus the next input, never
more than --max-parallel at once, and a failed request ends its client's rounds without stalling the run."""

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
                distribution="poisson", ready_queue_policy="random", seed=1)
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
