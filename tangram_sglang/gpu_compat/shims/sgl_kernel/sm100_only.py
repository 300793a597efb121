"""SGLang modules that exist for Blackwell (SM100) alone and import CuTe DSL (``cutlass``) unguarded.

``sglang.srt.layers.dual_gemm`` imports ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` while building
every Llama / Qwen MLP on CUDA, only to learn that its kernel needs SM100 (``can_use_dual_gemm`` checks
``is_sm100_supported``). Without the CuTe DSL package (not on the lent Hopper GPU) that import fails.
Where ``cutlass`` cannot be imported, the module is replaced by one with the same names whose
``can_use_dual_gemm`` answers False, which is what the real one answers on any GPU before SM100.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from enum import IntEnum

DUAL_GEMM = "sglang.kernels.ops.gemm.cutedsl_dual_gemm"


class DualGemmQuantMode(IntEnum):
    """The real module's enum (same members and properties)."""

    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4

    @property
    def is_quantized(self) -> bool:
        return self is not self.UNQUANT

    @property
    def is_dynamic(self) -> bool:
        return self in (self.DYNAMIC_PER_TENSOR, self.DYNAMIC_PER_TOKEN)

    @property
    def is_per_token(self) -> bool:
        return self in (self.STATIC_PER_TOKEN, self.DYNAMIC_PER_TOKEN)


def can_use_dual_gemm(*args, **kwargs) -> bool:
    return False


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        return importlib.machinery.ModuleSpec(fullname, self) if fullname == DUAL_GEMM else None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__doc__ = __doc__
        module.MAX_DUAL_GEMM_DECODE_TOKENS = 16
        module.DualGemmQuantMode = DualGemmQuantMode
        module.can_use_dual_gemm = can_use_dual_gemm
        return module

    def exec_module(self, module):
        pass


def install() -> bool:
    """Substitute the dual-GEMM module where CuTe DSL is missing (idempotent); True when substituted."""
    if importlib.util.find_spec("cutlass") is not None:
        return False
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return True
