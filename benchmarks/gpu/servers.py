"""The servers of the GPU run: one launch line for stock and Tangram on CUDA or CPU, started side by side.

On CUDA, stock SGLang runs its own Triton attention backend with the pytorch sampler (the lent GPU has
neither FlashInfer nor sgl_kernel's FA3 build), and SGLang with a profile runs the Tangram Triton data
plane; both load the same weights (``--load-format dummy`` where no weights travel), the same
``--max-total-tokens`` (the profile's pool takes the bytes stock's pool of that many tokens takes) and
the same sgl_kernel stand-in (tangram_sglang.gpu_compat). On a CPU (the rehearsal) the same servers run
in float32 with the project's CPU stand-ins, without graphs.

Several servers share one GPU: ``--mem-fraction-static`` leaves the pool to ``--max-total-tokens``
(SGLang takes the smaller), so each server holds its weights, its pool and its graphs, no more.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from tangram_sglang.sglang.server_process import ServerProcess


@dataclass(frozen=True)
class Server:
    """One server of a run: ``profile`` None is stock SGLang."""

    name: str
    model: str
    pool_tokens: int
    profile: str | None = None
    ratio: float | None = None
    graphs: bool = True
    dtype: str = "bfloat16"
    max_bs: int = 16
    load_format: str | None = None
    kv_dtype: str | None = None
    tokenizer: bool = False   # the model folder holds one: served text, the OpenAI API, bench_serving
    extra: tuple[str, ...] = field(default_factory=tuple)

    def args(self, cuda: bool) -> list[str]:
        """launch_server arguments past --model-path (ServerProcess puts its CPU defaults first; later wins)."""
        out = ["--max-total-tokens", str(self.pool_tokens), "--log-level", "warning", "--enable-cache-report"]
        if not self.tokenizer:
            out.insert(0, "--skip-tokenizer-init")
        if cuda:
            out += ["--dtype", self.dtype, "--sampling-backend", "pytorch", "--mem-fraction-static", "0.88",
                    "--cuda-graph-max-bs-decode", str(self.max_bs)]
            if self.profile is None:
                out += ["--attention-backend", "triton"]
        else:
            out += ["--dtype", "float32", "--sleep-on-idle"]
        if not self.graphs:
            out += ["--disable-cuda-graph"]
        if self.load_format:
            out += ["--load-format", self.load_format]
        if self.kv_dtype:
            out += ["--kv-cache-dtype", self.kv_dtype]
        if self.ratio is not None:
            out += ["--tangram-ratio", str(self.ratio)]
        return out + list(self.extra)


def cuda_available() -> bool:
    """Whether the GPU is visible, asked of nvidia-smi: the parent process must not take GPU memory."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


class Fleet:
    """Servers started together on consecutive ports; one that fails to start is recorded, not raised."""

    def __init__(self, servers: list[Server], port: int, log_dir: str, cuda: bool):
        self.specs = {s.name: s for s in servers}
        self.procs: dict[str, ServerProcess] = {}
        self.failed: dict[str, str] = {}
        env = {"TANGRAM_INTEGRITY_CHECK": "1"}
        for i, s in enumerate(servers):
            proc = ServerProcess(s.model, port=port + i, profile=s.profile, extra_args=s.args(cuda),
                                 log_path=os.path.join(log_dir, f"{s.name}.log"), start_timeout=420,
                                 threads=1 if not cuda else 4)
            proc.env.update(env)
            self.procs[s.name] = proc

    def start(self, timeout: float) -> dict[str, float]:
        """Launch all, wait for each; returns the seconds each took to serve (failures in self.failed)."""
        t0, ready = time.time(), {}
        for name, p in self.procs.items():
            try:
                p.launch()
            except Exception as exc:  # a busy port: the others still run
                self.failed[name] = f"{type(exc).__name__}: {exc}"
        for name, p in self.procs.items():
            if name in self.failed:
                continue
            try:
                p.wait_ready(max(5.0, timeout - (time.time() - t0)))
                ready[name] = round(time.time() - t0, 1)
            except Exception as exc:
                self.failed[name] = f"{type(exc).__name__}: {str(exc)[-3000:]}"
        return ready

    def up(self) -> dict[str, ServerProcess]:
        return {n: p for n, p in self.procs.items() if n not in self.failed}

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
