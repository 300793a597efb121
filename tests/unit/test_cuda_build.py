"""The CUDA decode kernel compiles with the local nvcc; where a GPU is present the
extension is built and checked against the torch reference."""

import os
import shutil
import subprocess
import sysconfig

import numpy as np
import pytest
import torch

from tangram_sglang.attention import make_split_row, ragged_decode_torch
from tangram_sglang.attention.cuda_ext import BINDING_SOURCE, CUDA_DIR, nvcc_compile_command
from tangram_sglang.attention.testing import make_ragged_cache


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_kernels_compile_with_nvcc(tmp_path):
    out = tmp_path / "ragged_decode.o"
    proc = subprocess.run(nvcc_compile_command(str(out)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0
    assert "warning" not in proc.stderr.lower(), proc.stderr


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nvcc") is None, reason="g++ or nvcc missing")
def test_binding_parses_against_torch_headers(tmp_path):
    from torch.utils.cpp_extension import include_paths

    # A CPU build of torch ships c10/cuda headers but not the generated
    # cuda_cmake_macros.h; an empty stand-in is enough to parse the binding.
    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")

    cuda_home = os.path.dirname(os.path.dirname(os.path.realpath(shutil.which("nvcc"))))
    cuda_inc = os.path.join(cuda_home, "include")
    if not os.path.isfile(os.path.join(cuda_inc, "cuda_runtime.h")):
        cuda_inc = "/usr/local/cuda/include"
    incs = [f"-I{tmp_path}"] + [f"-I{p}" for p in include_paths()] + [f"-I{CUDA_DIR}", f"-I{cuda_inc}",
                                                 f"-I{sysconfig.get_paths()['include']}"]
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=tangram_ragged_decode", *incs, BINDING_SOURCE]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype,kv_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                            (torch.bfloat16, torch.float8_e4m3fn), (torch.float32, torch.float8_e5m2)])
def test_cuda_decode_matches_reference(dtype, kv_dtype):
    from tangram_sglang.attention.cuda_ext import ragged_decode_cuda

    lens = np.array([[54, 0, 3], [1, 17, 9]])
    cache = make_ragged_cache(lens, num_kv_heads=6, gqa=3, heads_per_group=2, head_dim=64, page_size=16,
                              seed=4, dtype=dtype, kv_dtype=kv_dtype, kv_scales=(0.5, 2.0) if kv_dtype else (1.0, 1.0))
    q = torch.randn(2, 18, 64).to(dtype)
    split = make_split_row([7, 1, 60])
    want = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens, cache.meta,
                               split, 0.125).float()
    out = ragged_decode_cuda(q.cuda(), cache.k_pages.cuda(), cache.v_pages.cuda(), cache.block_table.cuda(),
                             cache.seq_lens.cuda(), cache.meta.to("cuda"), split.to("cuda"), 0.125)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float().cpu(), want, atol=tol, rtol=tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("window", [1, 7, 40])
def test_cuda_decode_reads_the_window(window):
    """A sliding-window layer (every position kept, slot = position): the kernel reads the newest window
    slots of each (b, g), as the reference does."""
    import dataclasses

    from tangram_sglang.attention.cuda_ext import ragged_decode_cuda

    hist = np.array([1, 9, 33, 70])
    cache = make_ragged_cache(np.repeat(hist[:, None], 2, axis=1), num_kv_heads=4, gqa=2, heads_per_group=2,
                              head_dim=64, page_size=16, extra_hist=0, seed=window)
    meta = dataclasses.replace(cache.meta, window=window)
    q = torch.randn(len(hist), 8, 64)
    split = make_split_row([3, 1])
    want = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens, meta, split, 0.125)
    out = ragged_decode_cuda(q.cuda(), cache.k_pages.cuda(), cache.v_pages.cuda(), cache.block_table.cuda(),
                             cache.seq_lens.cuda(), meta.to("cuda"), split.to("cuda"), 0.125)
    torch.testing.assert_close(out.cpu(), want, atol=2e-5, rtol=2e-5)
