"""--kv-cache-dtype with a profile: the ragged pool stores FP8 pages (attention/kv_quant.py).

SGLang resolves the flag in ModelRunner.configure_kv_cache_dtype and sizes its cache at that
type. On a GPU nothing changes: the pool stores the type SGLang resolved. On a CPU SGLang 0.5.23
refuses FP8 for its own pool (fp8_e5m2 always, fp8_e4m3 without Intel AMX: its CPU kernels), which
a profile shrinks to a stub nobody reads; there the hook lets SGLang size its cache for a one-byte
type (e5m2, the type its CPU checks let pass: the same bytes per token) and the ragged pool stores
the type asked for, read by the torch data plane.
"""

from __future__ import annotations

import torch

from tangram_sglang.sglang.server_args import served_profile

FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def pool_dtype(configurator) -> torch.dtype:
    """The ragged pool's page type: the FP8 type asked for, else the one SGLang resolved."""
    return FP8.get(getattr(configurator.server_args, "kv_cache_dtype", None), configurator.kv_cache_dtype)


def configure_kv_cache_dtype(original, runner, *args, **kwargs):
    """AROUND ModelRunner.configure_kv_cache_dtype (see the module docstring)."""
    asked = getattr(runner.server_args, "kv_cache_dtype", None)
    if asked not in FP8 or served_profile(runner.server_args) is None or not str(runner.device).startswith("cpu"):
        return original(runner, *args, **kwargs)
    runner.kv_cache_dtype, runner.kv_cache_dtype_str = torch.float8_e5m2, asked
    return None
