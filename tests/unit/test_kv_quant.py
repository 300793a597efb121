"""FP8 KV pages: what the writes store and what the reads give back."""

import dataclasses

import pytest
import torch

from tangram_sglang.attention import build_layer_meta, write_decode_kv
from tangram_sglang.attention.kv_quant import dequantize, is_quantized, quantize


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_quantize_scales_and_clamps(dtype):
    top = torch.finfo(dtype).max
    x = torch.tensor([0.0, 1.0, -3.0, 4 * top, -4 * top, 100.0])
    q = quantize(x, dtype, 2.0)
    assert q.dtype == dtype and is_quantized(q.dtype)
    back = dequantize(q, 2.0)
    assert torch.isfinite(back).all()                              # past the range: clamped, not NaN
    assert back[3] == 2 * top and back[4] == -2 * top
    assert torch.allclose(back[:3], x[:3]) and abs(back[5] - 100.0) / 100.0 < 0.13  # e5m2: 2 mantissa bits


def test_model_dtype_is_a_plain_cast():
    x = torch.randn(5)
    assert not is_quantized(torch.bfloat16)
    assert torch.equal(quantize(x, torch.bfloat16, 3.0), x.to(torch.bfloat16))  # scales only apply to FP8


def test_decode_write_stores_x_over_scale_in_fp8_pages():
    meta = dataclasses.replace(build_layer_meta([[1, 0], [2]], num_q_heads=6, num_kv_heads=3, heads_per_group=2),
                               k_scale=0.5, v_scale=4.0)
    k_pages = torch.zeros(4, 2, 2, 8, dtype=torch.float8_e4m3fn)
    v_pages = torch.zeros_like(k_pages)
    k, v = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    loc = torch.tensor([1, 4, 5, 7])                                 # (b, g) slots, b-major
    write_decode_kv(k, v, loc, meta, k_pages, v_pages)
    flat_k, flat_v = k_pages.view(-1, 2, 8), v_pages.view(-1, 2, 8)
    # request 1, group 0 (slot 5): heads [1, 0]; group 1 (slot 7): head 2 then an empty slot
    assert torch.equal(flat_k[5, 0], quantize(k[1, 1], torch.float8_e4m3fn, 0.5))
    assert torch.equal(flat_v[5, 1], quantize(v[1, 0], torch.float8_e4m3fn, 4.0))
    assert torch.equal(flat_k[7, 0], quantize(k[1, 2], torch.float8_e4m3fn, 0.5))
    assert torch.equal(flat_k[7, 1].float(), torch.zeros(8))
    torch.testing.assert_close(dequantize(flat_k[1, 1], 0.5), k[0, 0], atol=0.07, rtol=0.07)
