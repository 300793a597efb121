"""Code versions of the fidelity settings: what a setting's recorded answers depend on, hashed, so a
code change re-runs only the settings it can affect."""

from __future__ import annotations

import functools
import glob
import os
import subprocess
import sys

from benchmarks.common.paths import ROOT
from benchmarks.fidelity.settings import ORACLE, base_setting
from benchmarks.fidelity.store import digest

# package files that cannot change an answer (offline tools, process helpers, the stand-ins only a lent
# GPU machine puts on the path): not part of any version
OFFLINE = ("/calibration/", "/cpu_compat/", "/gpu_compat/", "calibrate.py", "reference_import.py", "uniform_profile.py", "compatibility.py",
           "server_process.py")
NOT_SERVED = OFFLINE + ("/oracle/",)  # the dense oracle is a reference the server never imports
# the kvpress peer's version: these two files' contents (their place in the tree does not count)
KVPRESS_FILES = [os.path.join(os.path.dirname(os.path.abspath(__file__)), f)
                 for f in ("kvpress_runner.py", "kvpress-requirements.txt")]


def code_version(setting: str, profile: str) -> str:
    """What a setting's answers depend on (besides the token ids): the served package for Tangram,
    only the modules the dense oracle imports for the oracle settings (a data-plane change in
    attention/ or serving/ cannot change them), the runner for kvpress, SGLang's version for full KV."""
    if base_setting(setting) == "full":
        import sglang

        return digest("sglang", sglang.__version__)
    if setting.startswith("kvpress"):
        files = KVPRESS_FILES
    else:
        oracle = base_setting(setting) in ORACLE
        package = oracle_files() if oracle else sorted(   # served: the package's Python and its native loops
            glob.glob(os.path.join(ROOT, "tangram_sglang", "**", "*.py"), recursive=True)
            + glob.glob(os.path.join(ROOT, "tangram_sglang", "**", "*.c"), recursive=True))
        skip = OFFLINE if oracle else NOT_SERVED
        files = [f for f in package if not any(part in f for part in skip)] + [profile] + weight_files(profile)
    return digest(*(open(f, "rb").read() if os.path.exists(f) else f for f in files))


ORACLE_MODULES = ("tangram_sglang.oracle.serving_reference", "tangram_sglang.scorers.profile_scorer", "tangram_sglang.profile",
                  "tangram_sglang.method.protection")


def loaded_files(modules, prefix: str = "") -> list[str]:
    """The files of the modules a fresh process started from ROOT loads when it imports ``modules`` (so a
    snapshot's own files), those whose module names start with prefix: sorted, as the modules name them."""
    code = ("import importlib, sys\nfor m in sys.argv[2:]: importlib.import_module(m)\n"
            "print('\\n'.join(sorted(m.__file__ for n, m in list(sys.modules.items())\n"
            "      if n.startswith(sys.argv[1]) and getattr(m, '__file__', None))))")
    return subprocess.run([sys.executable, "-c", code, prefix, *modules], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split()


@functools.lru_cache(maxsize=1)
def oracle_files() -> list[str]:
    """The package files the oracle settings load (loaded_files of ORACLE_MODULES)."""
    out = loaded_files(ORACLE_MODULES, "tangram_sglang")
    outside = [f for f in out if not os.path.abspath(f).startswith(os.path.join(ROOT, "tangram_sglang"))]
    if outside or not out:
        raise SystemExit(f"the oracle's modules were not loaded from {ROOT}: {outside or 'none found'}")
    return out


def weight_files(profile: str) -> list[str]:
    """The scorer weights a profile names (fastkvzip gates): they change answers too."""
    if not os.path.exists(profile):
        return []
    from tangram_sglang.profile import load_profile
    from tangram_sglang.scorers.profile_scorer import weights_path

    path = weights_path(load_profile(profile), profile)
    return [path] if path else []
