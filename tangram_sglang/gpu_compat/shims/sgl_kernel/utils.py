"""sgl_kernel.utils: the one helper SGLang imports from it (the triton attention backend)."""

from __future__ import annotations

import functools

import torch

from ._missing import stand_in_getattr

__getattr__ = stand_in_getattr(__name__)


@functools.lru_cache(maxsize=1)
def is_arch_support_pdl() -> bool:
    """Whether the current CUDA device can use programmatic dependent launch: compute capability 9.0
    or newer, as the real helper answers (False without CUDA and on ROCm)."""
    if torch.version.hip is not None or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability()[0] >= 9
