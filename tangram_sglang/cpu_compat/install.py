"""Install (or remove) the CPU compatibility .pth file; see the package docstring.

    python -m tangram_sglang.cpu_compat.install [--uninstall] [--force]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sysconfig

PTH_NAME = "tangram_cpu_compat.pth"
SHIMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shims")


def pth_path() -> str:
    return os.path.join(sysconfig.get_paths()["purelib"], PTH_NAME)


def pth_text() -> str:
    return (
        "# tangram_sglang CPU compatibility (python -m tangram_sglang.cpu_compat.install --uninstall removes it)\n"
        "import os; os.environ.setdefault('SGLANG_USE_CPU_ENGINE', '1')\n"
        f"{SHIMS}\n"
    )


def is_stand_in(origin: str) -> bool:
    """Whether a module file is one of our stand-ins, from this checkout or another one (a venv whose .pth
    names a moved or second checkout must not read as a real sgl_kernel: setup would then drop the .pth)."""
    return os.path.join("tangram_sglang", "cpu_compat", "shims", "") in os.path.abspath(origin)


def gpu_build_present() -> tuple[bool, str]:
    """True when torch is a CUDA/ROCm build or a real sgl_kernel is installed."""
    import torch

    if torch.version.cuda or getattr(torch.version, "hip", None):
        return True, f"torch {torch.__version__} is a GPU build"
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is not None and spec.origin and not is_stand_in(spec.origin):
        return True, f"a real sgl_kernel is installed at {spec.origin}"
    return False, f"torch {torch.__version__} is a CPU build and no sgl_kernel is installed"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--uninstall", action="store_true")
    ap.add_argument("--force", action="store_true", help="install even where a GPU build is present")
    args = ap.parse_args(argv)
    path = pth_path()
    gpu, why = gpu_build_present()
    if args.uninstall or (gpu and not args.force):
        if os.path.exists(path):
            os.remove(path)
            print(f"[cpu_compat] removed {path}")
        print(f"[cpu_compat] not installed: {'--uninstall' if args.uninstall else why}")
        return
    with open(path, "w") as f:
        f.write(pth_text())
    print(f"[cpu_compat] installed {path} ({why}): SGLANG_USE_CPU_ENGINE=1, stand-ins from {SHIMS}")


if __name__ == "__main__":
    main()
