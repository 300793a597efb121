"""Where a result came from, stamped into every results file: the code's commit, the machine, the command.

A stamp is a plain dict, taken once when a benchmark starts::

    {"commit": "0e92b81-dirty", "date": "2026-05-04 14:02:11",
     "machine": {"platform": "Linux-6.8.0-x86_64-with-glibc2.39", "python": "3.12.3", "cpus": 2,
                 "torch": "2.13.0", "cuda_device": null},
     "command": "OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.timing.cpu_decode --reps 7",
     "argv": ["/repo/benchmarks/timing/cpu_decode.py", "--reps", "7"]}

JSON results carry it as a top-level ``"stamp"`` object, Markdown results as the line under the title
(``markdown_line``). ``commit`` ends in ``-dirty`` when files outside benchmarks/results/ differ from the
commit (tracked changes or untracked files): the code that ran is not the commit's. Nothing here
imports torch: its version comes from the installed metadata, the CUDA device from torch only when the
benchmark already initialized CUDA, else from nvidia-smi (so a serving benchmark's parent process
never takes GPU memory its servers size their pools from).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import time

from benchmarks.common.paths import ROOT

ENV = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")  # set variables that change a run, written before the command


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit() -> str:
    """Short hash of HEAD, ``-dirty`` when the tree differs from it outside benchmarks/results/."""
    if os.environ.get("TANGRAM_COMMIT"):  # a copy on a lent GPU machine: its .git need not be the sender's
        return os.environ["TANGRAM_COMMIT"]
    head = _git("rev-parse", "--short", "HEAD")
    if head is None:
        return "unknown"
    changes = _git("status", "--porcelain", "--untracked-files=normal", "--", ".", ":(exclude)benchmarks/results")
    return head + ("-dirty" if changes else "")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cuda_device() -> str | None:
    """Name of the first visible CUDA device, or None without one."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.get_device_name(0)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [n.strip() for n in out.stdout.splitlines() if n.strip()] if out.returncode == 0 else []
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    if not names or first in ("", "-1"):  # no GPU, or every GPU hidden
        return None
    if first.isdigit():
        return names[int(first)] if int(first) < len(names) else None
    return names[0]  # a UUID or MIG name: the first GPU is the best guess


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": _version("torch"), "cuda_device": cuda_device()}


def command(argv: list[str] | None = None) -> str:
    """The command line that reproduces the run as the docs write it: the set ENV variables, the
    interpreter (relative to the repository when it is the project's venv), ``-m MODULE`` for a module
    run (a script keeps its path) and the arguments (``argv``, default sys.argv[1:])."""
    args = sys.argv[1:] if argv is None else list(argv)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    program = ["-m", spec.name] if spec is not None else [os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)]
    python = sys.executable
    if os.path.abspath(python).startswith(ROOT + os.sep):
        python = os.path.relpath(python, ROOT)
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in ENV if k in os.environ]
    return " ".join(env + [python] + [shlex.quote(a) for a in program + args])


def stamp(argv: list[str] | None = None) -> dict:
    """The stamp of this run (``argv``: the arguments main() parsed, when not sys.argv[1:])."""
    return {"commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(),
            "command": command(argv), "argv": list(sys.argv)}


def markdown_line(s: dict) -> str:
    """The stamp as the line under a Markdown result's title."""
    m = s["machine"]
    device = m["cuda_device"] or "no CUDA device"
    return (f"Run {s['date']} at commit {s['commit']} on {m['platform']} ({m['cpus']} CPUs, Python {m['python']}, "
            f"torch {m['torch']}, {device}): `{s['command']}`")
