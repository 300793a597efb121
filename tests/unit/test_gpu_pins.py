"""launch/gpu_pins.py: the GPU stack setup.sh installs is sglang's own pins, read from its metadata."""

import importlib.util
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("gpu_pins", Path(__file__).resolve().parents[2] / "launch" / "gpu_pins.py")
gpu_pins = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_pins)


def test_gpu_pins_are_sglangs_torch_and_cuda_packages():
    lines = gpu_pins.gpu_requirements()
    names = {gpu_pins._name(r): r for r in lines}
    assert names["torch"] == "torch==2.14.1"                       # not the CPU pin 2.13.0
    assert names["flashinfer-python"].endswith("==0.7.2") and names["sglang-kernel"] == "sglang-kernel==0.4.10"
    assert not any("extra ==" in r for r in lines)
    assert "fastapi" not in names and "numpy" not in names      # the rest comes from requirements-cpu.txt
