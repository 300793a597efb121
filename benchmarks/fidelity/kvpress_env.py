"""Build the isolated virtual environment that runs NVIDIA kvpress 0.5.5 as a peer.

kvpress 0.5.5 needs transformers < 5.3, which the project's own .venv cannot hold,
so the peer lives in its own venv and is driven as a subprocess
(``benchmarks/fidelity/kvpress_runner.py``). Standard library only; run it with the project's
python.

Contract of ``ensure_kvpress_env() -> str``:

* the venv is ``$TANGRAM_CACHE/venvs/kvpress-0.5.5`` (TANGRAM_CACHE defaults to
  ``~/.cache/tangram_sglang``), created with ``python3 -m venv``;
* it holds exactly the pins of ``benchmarks/fidelity/kvpress-requirements.txt``, installed
  with the same file as a pip constraint file, so nothing can pull another torch
  (the pinned torch is the CPU wheel found through ``--find-links /opt/wheels``);
* after the install it checks that torch is a ``+cpu`` build, that no ``nvidia-*``
  distribution got in and that kvpress imports; only then it writes a marker holding
  the requirements file's sha256;
* idempotent: a venv whose marker matches the requirements is returned untouched; a
  missing or stale one is rebuilt from scratch. A file lock serializes builders;
* returns the venv's python path.

Command line: ``.venv/bin/python -m benchmarks.fidelity.kvpress_env`` builds (if needed) and
prints that path.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

KVPRESS_VERSION = "0.5.5"
REQUIREMENTS = Path(__file__).resolve().parent / "kvpress-requirements.txt"
WHEELS = Path("/opt/wheels")
MARKER = "tangram-requirements.sha256"
CHECK = """
import importlib.metadata as md, torch, kvpress
bad = sorted(d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia"))
assert "+cpu" in torch.__version__, f"torch {torch.__version__} is not the CPU build"
assert not bad, f"CUDA packages got installed: {bad}"
assert md.version("kvpress") == "%s", md.version("kvpress")
"""


def venv_dir() -> Path:
    """Where the kvpress venv lives: $TANGRAM_CACHE/venvs/kvpress-<version>."""
    cache = Path(os.environ.get("TANGRAM_CACHE", Path.home() / ".cache" / "tangram_sglang"))
    return cache / "venvs" / f"kvpress-{KVPRESS_VERSION}"


def requirements_hash() -> str:
    """sha256 of the pinned requirements file; the marker records it."""
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _is_current(venv: Path, digest: str) -> bool:
    marker = venv / MARKER
    return _python(venv).exists() and marker.exists() and marker.read_text().strip() == digest


def _run(cmd: list[str]) -> None:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def _build(venv: Path, digest: str) -> None:
    """Recreate the venv, install the pins under their own constraints, verify, mark."""
    _run(["python3", "-m", "venv", "--clear", str(venv)])
    pip = [str(_python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if WHEELS.is_dir():
        pip += ["--find-links", str(WHEELS)]
    _run(pip + ["-r", str(REQUIREMENTS), "-c", str(REQUIREMENTS)])
    subprocess.run([str(_python(venv)), "-c", CHECK % KVPRESS_VERSION], check=True)
    (venv / MARKER).write_text(digest + "\n")


def ensure_kvpress_env() -> str:
    """Build the kvpress venv if it is missing or stale; return its python path."""
    venv = venv_dir()
    digest = requirements_hash()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_current(venv, digest):
            _build(venv, digest)
    return str(_python(venv))


if __name__ == "__main__":
    print(ensure_kvpress_env())
