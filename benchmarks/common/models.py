"""The models the benchmarks serve, installed and converted by launch/models.py (loaded by path:
launch/ is a folder of scripts, not a package)."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

from benchmarks.common.paths import ROOT

MODULE = "tangram_launch_models"  # the name tests/conftest.py loads it under: one module either way


@functools.cache
def _launch_models():
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    spec = importlib.util.spec_from_file_location(MODULE, os.path.join(ROOT, "launch", "models.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def ensure_model(key: str) -> str:
    """The converted model folder of ``key`` (a launch/models.py name: smollm2, qwen2.5-0.5b, ...)."""
    return _launch_models().ensure_model(key)


def uniform_profile_path(model_path: str) -> str:
    """A uniform ratio-1.0 profile of the model (no compression: the data-plane control of a throughput
    comparison), written once under /tmp."""
    path = f"/tmp/tangram-think-time/{os.path.basename(model_path)}-uniform-1.0.yaml"
    if not os.path.exists(path):
        from tangram_sglang.profile.uniform import main as uniform

        os.makedirs(os.path.dirname(path), exist_ok=True)
        uniform(["--model-path", model_path, "--ratio", "1.0", "-o", path])
    return path
