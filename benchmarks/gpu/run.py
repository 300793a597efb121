"""SGLang with a profile on a GPU, in one call of a lent machine: correctness, then served speed.

On the lent machine (the GPU kit installed first, launch/gpu_kit/):

    source launch/gpu_kit/install.sh && python3 -m benchmarks.gpu.run --out $OUT --budget-s 480

Here, as a rehearsal on the CPU with tiny shapes (the same code path, float32, no graphs):

    .venv/bin/python -m benchmarks.gpu.run --out /tmp/gpu-rehearsal --quick --archs llama

Stages, each within what is left of --budget-s (a stage that fails is recorded and the next runs):
correctness (benchmarks.gpu.correctness), speed (benchmarks.gpu.speed), fp8 (stock FP8 KV against
Tangram FP8 pages at the same bytes; CUDA only). Writes gpu_served_<device>.json and .md and the
servers' logs (logs.tar.gz) into --out (models and logs live in --work); copy the first two into benchmarks/results/serving/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tarfile
import time
import traceback

from benchmarks.common.stamp import stamp
from benchmarks.gpu import correctness, report, speed
from benchmarks.gpu.servers import cuda_available

STAGES = ("correctness", "speed", "fp8")


def environment() -> dict:
    """Versions and the device, read without initializing CUDA in this process."""
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "triton", "transformers", "sglang", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    try:
        out["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                            "--format=csv,noheader"], capture_output=True, text=True,
                                           timeout=30).stdout.strip()
    except OSError:
        out["nvidia_smi"] = None
    return out


def run_stage(name: str, fn, result: dict) -> None:
    t0 = time.time()
    print(f"[gpu] stage {name} ...", flush=True)
    try:
        result[name] = fn()
    except Exception:
        result[name] = {"error": traceback.format_exc()[-4000:]}
    result[name]["wall_s"] = round(time.time() - t0, 1)
    print(f"[gpu] stage {name} done in {result[name]['wall_s']} s", flush=True)


def slug(device: str | None) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (device or "cpu").lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for the results and the logs")
    ap.add_argument("--budget-s", type=float, default=480, help="wall time the stages may take in all")
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the CPU rehearsal)")
    ap.add_argument("--archs", nargs="+", choices=correctness.ARCHS, default=list(correctness.ARCHS))
    ap.add_argument("--work", default="/tmp/tangram-gpu-work", help="models, profiles and server logs")
    ap.add_argument("--port", type=int, default=32000)
    args = ap.parse_args(argv)
    t0 = time.time()
    deadline = t0 + args.budget_s
    work, logs = args.work, os.path.join(args.work, "logs")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    cuda = cuda_available()
    result = {"stamp": stamp(argv), "environment": environment(), "cuda": cuda, "quick": args.quick}
    device = result["stamp"]["machine"]["cuda_device"]
    stages = {
        "correctness": lambda: correctness.run(work, logs, args.port, cuda, args.archs,
                                               timeout=min(300.0, deadline - time.time())),
        "speed": lambda: speed.run(work, logs, args.port + 40, cuda, args.quick, deadline - 60),
        "fp8": lambda: speed.run(work, logs, args.port + 80, cuda, args.quick, deadline, kv_dtype="fp8_e4m3",
                                 multi=False),
    }
    for name in args.stages:
        if name == "fp8" and not cuda:
            result[name] = {"skipped": "stock SGLang runs FP8 KV on a GPU only"}
        elif time.time() > deadline - 60:
            result[name] = {"skipped": "out of time"}
        else:
            run_stage(name, stages[name], result)
        write(args.out, slug(device), result)   # after every stage: a killed run keeps what it measured
    with tarfile.open(os.path.join(args.out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(logs, arcname="logs")
    result["wall_s"] = round(time.time() - t0, 1)
    write(args.out, slug(device), result)
    print(report.render(result))
    return 0


def write(out: str, name: str, result: dict) -> None:
    with open(os.path.join(out, f"gpu_served_{name}.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(os.path.join(out, f"gpu_served_{name}.md"), "w") as f:
        f.write(report.render(result))


if __name__ == "__main__":
    raise SystemExit(main())
