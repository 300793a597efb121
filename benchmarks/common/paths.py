"""Where the repository and the results live."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# TANGRAM_RESULTS_DIR: write results elsewhere (benchmarks.remeasure --quick: a trial run that must not
# replace the committed figures)
RESULTS = os.environ.get("TANGRAM_RESULTS_DIR") or os.path.join(ROOT, "benchmarks", "results")
KINDS = ("fidelity", "serving", "timing", "modeled")


def result_path(kind: str, name: str) -> str:
    """benchmarks/results/<kind>/<name>: the default output of a benchmark of that kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown results kind {kind!r}; known: {KINDS}")
    return os.path.join(RESULTS, kind, name)
