"""Which attention kernels the backend serves with (--tangram-data-plane).

* torch: the reference data plane (tangram_sglang.attention), the CPU path.
* triton: the split-map decode kernel and the Triton chunk prefill, with no host
  sync (attention/triton_decode.py, triton_prefill.py). On a CPU it runs only
  under TRITON_INTERPRET=1 (the end-to-end test); the reconstruction pass of
  KVzip-class scorers and the compression step stay on torch ops.
* auto: triton on CUDA when Triton imports, torch elsewhere.
"""

from __future__ import annotations

import os


class DataPlaneError(ValueError):
    pass


def choose_data_plane(requested: str, device) -> str:
    """'torch' or 'triton' for this device; raises DataPlaneError for a choice it cannot run."""
    on_cuda = str(device).startswith("cuda")
    if requested == "torch":
        return "torch"
    if requested == "auto":
        return "triton" if on_cuda and _triton_imports() else "torch"
    if requested != "triton":
        raise DataPlaneError(f"--tangram-data-plane {requested!r}: expected auto, torch or triton")
    if not _triton_imports():
        raise DataPlaneError("--tangram-data-plane triton: Triton does not import here")
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
