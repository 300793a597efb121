"""benchmarks/serving/soak_faults: the kill's window and the greedy replay of every answered session (stand-ins,
no server)."""

import subprocess
import threading
import time

from benchmarks.serving.soak_faults import after_load
from benchmarks.serving.soak_faults.fleet import Fleet
from benchmarks.serving.soak_faults.outcomes import attribute_kill
from benchmarks.serving.soak_faults.plan import Turn


class _Proc:
    """A replica stand-in: a real process in its own group (the kill is a real SIGKILL of the group)."""

    def __init__(self, index: int, suffix: str, cut: list):
        self.url, self.cut = f"http://replica{index}{suffix}", cut
        self.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        self.restarted = bool(suffix)

    def stop(self):
        # A request on the killed replica fails now, before the kill returns (closing logs takes a while)
        self.cut.append(time.time())
        time.sleep(0.3)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def start(self):
        raise RuntimeError("not restarted in this test")


def test_a_request_cut_by_the_kill_falls_in_the_kill_window():
    cut = []
    t0 = time.time()
    fleet = Fleet(lambda i, suffix: _Proc(i, suffix, cut), t0)
    try:
        fleet.kill_and_restart(1, at_s=0.0, after_s=0.0, warm=None)
    finally:
        fleet.stop_all()
    assert "restart_error" in fleet.kill and len(cut) >= 1
    failed_at = cut[0] - t0
    request = {"kind": "connection error", "t0": 0.0, "t1": round(failed_at, 2)}
    window = (fleet.kill["killed_s"], fleet.kill["restart_s"] + 10)
    assert fleet.kill["killed_s"] <= failed_at
    assert attribute_kill([request], [window]) == 1 and request["kind"] == "replica killed"


def _session(index: int, fault: str, answers: list[str]) -> dict:
    turn = Turn(0, 0, 0, 8, 0, False)
    return {"fault": fault, "turns": [{"messages": [{"role": "user", "content": f"s{index} t{k}"}], "turn": turn,
                                       "answer": a, "cached_tokens": 10 * k} for k, a in enumerate(answers)]}


def test_the_replay_sends_every_answered_session_alone_on_the_serving_replicas(monkeypatch):
    histories = {i: _session(i, ("none", "abort", "pressure", "abandon")[i % 4], [f"a{i}.0", f"a{i}.1"])
                 for i in range(9)}
    events, lock = [], threading.Lock()

    def flush(url):
        with lock:
            events.append((url, "flush", None))

    def chat_once(url, payload, timeout):
        content = payload["messages"][-1]["content"]
        index, k = (int(x[1:]) for x in content.split())
        with lock:
            events.append((url, "chat", index))
        text = "different" if (index, k) == (5, 1) else f"a{index}.{k}"
        return {"text": text, "error": "", "status": 200, "usage": {"prompt_tokens_details": {"cached_tokens": 10 * k}}}

    monkeypatch.setattr(after_load, "flush", flush)
    monkeypatch.setattr(after_load, "chat_once", chat_once)
    out = after_load.replay(["u0", "u1"], "m", histories, 0, seed=0)
    assert out["sessions"] == 9 and out["turns"] == 18 and out["identical"] == 17
    assert out["session_indices"] == list(range(9))
    assert [(m["session"], m["turn"]) for m in out["mismatches"]] == [(5, 2)]
    assert out["by_fault"]["abort"] == {"sessions": 2, "turns": 4, "identical": 3}
    assert sum(r["sessions"] for r in out["by_fault"].values()) == 9
    for url in ("u0", "u1"):   # each replica: a flush before each of its sessions, then that session's turns
        mine = [e for e in events if e[0] == url]
        sessions = [e[2] for e in mine if e[1] == "chat"][::2]
        assert sessions == [i for i in range(9) if i % 2 == (url == "u1")]
        assert [e[1] for e in mine] == ["flush", "chat", "chat"] * len(sessions)
    none = after_load.replay([], "m", histories, 0, seed=0)   # no replica serving: nothing replayed
    assert none["turns"] == 0 and none["sessions"] == 0 and none["mismatches"] == []
    some = after_load.replay(["u0"], "m", histories, 3, seed=1)
    assert some["sessions"] == 3 and set(some["session_indices"]) <= set(histories)


def test_the_soak_serves_each_shipped_profile_at_its_recommended_ratio():
    from benchmarks.common.report_tables import recommended
    from benchmarks.serving.soak_faults.fleet import MODELS

    for key, profile, ratio, _ in MODELS.values():
        rec = recommended(key)
        assert (profile, ratio) == (rec["profile"], rec["ratio"]), key


def test_the_routers_metrics_port_is_outside_the_ephemeral_range_and_its_default():
    """sglang-router's Prometheus listener: a port a connection's own local port cannot hold (Linux hands those
    out from 32768-60999), unique per router port, never its shared default 29000."""
    from tangram_sglang.sglang.server_process import RouterProcess, router_metrics_port

    ports = [30000, 31060, 31881, 32100, 1500]
    metrics = [router_metrics_port(p) for p in ports]
    assert all(1024 <= m < 32768 and m != 29000 for m in metrics) and len(set(metrics + ports)) == 2 * len(ports)
    args = RouterProcess(["http://127.0.0.1:1"], port=31881).args
    assert args[args.index("--prometheus-port") + 1] == "21881"
