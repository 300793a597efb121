"""Print the torch and CUDA packages sglang itself pins, one requirement per line (for setup.sh).

On a machine with an NVIDIA GPU, setup.sh installs sglang with --no-deps and then
exactly these lines from sglang's own metadata (torch, its CUDA kernels, FlashInfer,
sglang-kernel, ...), instead of the CPU pin torch==2.13.0:

    python launch/gpu_pins.py            # reads the installed sglang's metadata
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, distribution

# Distributions that make up the GPU stack sglang pins (names normalized: lower case, '-').
GPU_STACK = re.compile(r"^(torch|torchaudio|torchvision|torchcodec|torch-memory-saver|triton|flashinfer-python|"
                       r"sglang-kernel|sgl-.*|nvidia-.*|cuda-python)$")


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("_", "-")


def gpu_requirements(dist: str = "sglang") -> list[str]:
    """The unconditional (no extra) requirements of dist that belong to the GPU stack."""
    reqs = distribution(dist).requires or []
    return [r for r in reqs if "extra ==" not in r and GPU_STACK.match(_name(r))]


def main() -> int:
    try:
        lines = gpu_requirements()
    except PackageNotFoundError:
        print("gpu_pins: sglang is not installed in this environment", file=sys.stderr)
        return 1
    if not any(_name(r) == "torch" for r in lines):
        print("gpu_pins: sglang's metadata pins no torch", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
