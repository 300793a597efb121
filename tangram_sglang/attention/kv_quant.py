"""Quantized KV pages: K/V stored as x / scale in an FP8 type, read back as float * scale.

One scale per layer for K and one for V (LayerMeta.k_scale / v_scale): SGLang's ``k_scale`` /
``v_scale`` from the checkpoint, 1.0 when it has none (as SGLang does). Values past the type's
largest finite value are clamped to it (an FP8 cast would turn them into NaN: e4m3fn has no inf).
Scores are always computed on the unquantized chunk before the write, so what a head keeps does
not depend on the storage type.
"""

from __future__ import annotations

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def quantize(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """x in the pages' dtype: divided by scale and clamped to the finite range for FP8."""
    if not is_quantized(dtype):
        return x.to(dtype)
    y = x.float() if scale == 1.0 else x.float() / scale
    top = torch.finfo(dtype).max
    return y.clamp_(-top, top).to(dtype)


def dequantize(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """float32 values of gathered page entries (x itself when float32 and unscaled)."""
    y = x.float()
    return y if scale == 1.0 else y * scale
