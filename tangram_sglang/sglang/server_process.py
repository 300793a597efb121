"""Start `python -m sglang.launch_server` as a child process and wait until it serves.

Used by the demo (launch/chat.py) and the end-to-end tests. The child's output
goes to a log file; a launch that exits early raises with the log's tail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

# A CPU-friendly default KV size: SGLang's default is sized for a GPU.
CPU_DEFAULT_ARGS = ["--dtype", "float32", "--max-total-tokens", "16384"]


class ServerProcess:
    """Context manager around an SGLang HTTP server on 127.0.0.1."""

    def __init__(self, model_path: str, *, port: int = 30000, profile: str | None = None,
                 extra_args: list[str] | None = None, log_path: str | None = None, threads: int = 1,
                 start_timeout: float = 300):
        self.port, self.start_timeout = port, start_timeout
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path or os.path.join("/tmp", f"tangram-server-{port}.log")
        self.args = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
                     "--host", "127.0.0.1", "--port", str(port), *CPU_DEFAULT_ARGS, *(extra_args or [])]
        if profile:
            self.args += ["--tangram-profile", profile]
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float | None = None) -> "ServerProcess":
        return self.launch().wait_ready(timeout)

    def launch(self) -> "ServerProcess":
        """Start the process without waiting (start several, then wait_ready each)."""
        if self._healthy() or not self._port_free():
            # Another server there would answer our health check and our requests.
            raise RuntimeError(f"port {self.port} on 127.0.0.1 is already in use; pick another port")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        return self

    def wait_ready(self, timeout: float | None = None) -> "ServerProcess":
        return _wait_healthy(self, "server", self.start_timeout if timeout is None else timeout, poll_s=1.0)

    def _port_free(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is fine
            try:
                sock.bind(("127.0.0.1", self.port))
            except OSError:
                return False
        return True

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health_generate", timeout=30) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def log_tail(self, n: int = 40) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_healthy(child, what: str, timeout: float, poll_s: float):
    """Poll child._healthy() until it answers; an exit or the timeout raises with the log's tail."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if child.proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {child.proc.returncode}:\n{child.log_tail()}")
        if child._healthy():
            return child
        time.sleep(poll_s)
    child.stop()
    raise TimeoutError(f"{what} not ready after {timeout} s:\n{child.log_tail()}")


def start_all(servers: list[ServerProcess]) -> list[ServerProcess]:
    """Launch every server, then wait for each (they load side by side); on a failure stop them all."""
    try:
        for s in servers:
            s.launch()
        return [s.wait_ready() for s in servers]
    except BaseException:
        for s in servers:
            s.stop()
        raise


def router_metrics_port(port: int) -> int:
    """The router's Prometheus port for a router on port: not its shared default 29000, and under Linux's
    ephemeral range (32768-60999), where a connection's own local port can already hold it (port + 1000 = 32881
    once stopped the soak's router from starting)."""
    return port - 10000 if port - 10000 >= 1024 else port + 1000


class RouterProcess:
    """sglang-router (``python -m sglang_router.launch_router``) in front of running servers.

    policy: cache_aware (a request goes to the worker whose request history shares the longest
    prefix with it, unless the load is unbalanced), round_robin, random, power_of_two."""

    def __init__(self, worker_urls: list[str], *, port: int = 30000, policy: str = "cache_aware",
                 log_path: str | None = None, start_timeout: float = 120, extra_args: list[str] | None = None):
        self.port, self.start_timeout = port, start_timeout
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path or os.path.join("/tmp", f"tangram-router-{port}.log")
        self.args = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
                     str(port), "--policy", policy, "--worker-urls", *worker_urls, "--log-level", "warn",
                     "--prometheus-host", "127.0.0.1", "--prometheus-port", str(router_metrics_port(port)),
                     *(extra_args or [])]
        self.num_workers = len(worker_urls)
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RouterProcess":
        try:
            import sglang_router  # noqa: F401
        except ImportError:
            raise RuntimeError("sglang-router is not installed: run `bash launch/setup.sh` (it pins "
                               "sglang-router==0.3.2)") from None
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return _wait_healthy(self, "router", self.start_timeout, poll_s=0.5)

    def _healthy(self) -> bool:
        """Ready once the router counts every worker healthy (before that it answers 503)."""
        try:
            with urllib.request.urlopen(self.url + "/readiness", timeout=5) as r:
                return r.status == 200 and json.loads(r.read()).get("healthy_workers") == self.num_workers
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
            return False

    log_tail = ServerProcess.log_tail
    stop = ServerProcess.stop
    __exit__ = ServerProcess.__exit__

    def __enter__(self) -> "RouterProcess":
        return self.start()
