"""The replicas and the router: launch, resident memory, the kill and restart."""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common.client import call, pool_info, server_state
from benchmarks.common.log import logger
from benchmarks.serving.soak_faults.client import chat_once, chat_stream
from benchmarks.serving.soak_faults.plan import QUESTIONS, SYSTEM, Turn, chat_payload, question_text

log = logger("soak")

# Router: notice a dead replica within ~10 s (refused connections) and take the restarted one back (its
# defaults: every 60 s, 3 failures); a busy replica may take over 5 s (its default) to answer /health, which
# generates a token: 30 s, so the survivor of the kill is not taken for dead under load
ROUTER_ARGS = ["--health-check-interval-secs", "5", "--health-failure-threshold", "2",
               "--health-check-timeout-secs", "30"]

# --model -> (launch/models.py key, profile, recommended ratio, --max-total-tokens)
MODELS = {"smollm2": ("smollm2", "configs/smollm2-fastkvzip.yaml", 0.4, 3072),
          "qwen": ("qwen2.5-0.5b", "configs/qwen2.5-0.5b-fastkvzip.yaml", 0.5, 3072)}

ROUTER_PORT, REPLICA_PORTS = 31881, (31882, 31883)  # the router's prometheus port is 21881


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
        # Stamped before the signal: a request the kill cuts may end before wait() and stop() return, and
        # must still fall inside the kill's window (outcomes.attribute_kill)
        self.kill["killed_s"] = math.floor(10 * (time.time() - self.t0)) / 10
        os.killpg(old.proc.pid, 9)
        old.proc.wait()
        old.stop()  # closes its log
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
