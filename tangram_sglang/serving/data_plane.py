"""Which attention kernels the backend serves with (--tangram-data-plane).

* torch: the reference data plane (tangram_sglang.attention), the CPU path.
* triton: the split-map decode kernel and the Triton chunk prefill, with no host
  sync (attention/triton_decode.py, triton_prefill.py). On a CPU it runs only
  under TRITON_INTERPRET=1 (the end-to-end test); the reconstruction pass of
  KVzip-class scorers and the compression step stay on torch ops.
* cuda: the CUDA split-map decode kernel (cuda/ragged_decode.cu, compiled by torch's
  extension loader when the server starts; needs nvcc) with the Triton chunk prefill.
  A GPU only: never chosen by auto.
* auto: triton on CUDA when Triton imports, torch elsewhere.
"""

from __future__ import annotations

import os
import shutil


class DataPlaneError(ValueError):
    pass


def choose_data_plane(requested: str, device) -> str:
    """'torch', 'triton' or 'cuda' for this device; raises DataPlaneError for a choice it cannot run."""
    on_cuda = str(device).startswith("cuda")
    if requested == "torch":
        return "torch"
    if requested == "auto":
        return "triton" if on_cuda and _triton_imports() else "torch"
    if requested not in ("triton", "cuda"):
        raise DataPlaneError(f"--tangram-data-plane {requested!r}: expected auto, torch, triton or cuda")
    if not _triton_imports():
        raise DataPlaneError(f"--tangram-data-plane {requested}: Triton does not import here")
    if requested == "cuda":
        if not on_cuda:
            raise DataPlaneError(f"--tangram-data-plane cuda on {device}: the CUDA decode kernel needs a GPU")
        if shutil.which("nvcc") is None:
            raise DataPlaneError("--tangram-data-plane cuda: nvcc is not on the PATH (the kernel is compiled "
                                 "at start)")
        return "cuda"
    if not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise DataPlaneError(f"--tangram-data-plane triton on {device}: Triton kernels need a GPU "
                             "(or TRITON_INTERPRET=1, for tests)")
    return "triton"


def _triton_imports() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means: not usable here
        return False
    return True
