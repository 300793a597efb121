"""Build, load and call the CUDA decode kernel in cuda/ (a torch extension; shipped as cuda_src/).

    ragged_decode_cuda(q, k_pages, v_pages, block_table, seq_lens, meta, split, sm_scale)

has the signature and result of reference.ragged_decode_torch. The extension
is compiled on first use with torch.utils.cpp_extension.load (needs a CUDA
build of torch and nvcc); ``nvcc_compile_command`` compiles the kernels alone
to an object file, which the tests do on machines without a GPU.
"""

from __future__ import annotations

import functools
import os
import shutil

import torch

from tangram_sglang.attention.layer_meta import LayerMeta
from tangram_sglang.attention.split_row import SplitRow

# the repository's cuda/, linked into the package (cuda_src) so that a wheel ships the sources too
CUDA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_src")
KERNEL_SOURCE = os.path.join(CUDA_DIR, "ragged_decode.cu")
BINDING_SOURCE = os.path.join(CUDA_DIR, "binding.cpp")


def nvcc_compile_command(output: str, arch: str = "sm_90") -> list[str] | None:
    """nvcc command compiling the kernels (no torch) to ``output``; None without nvcc."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    return [nvcc, "-std=c++17", "-O3", f"-arch={arch}", "-I", CUDA_DIR, "-c", KERNEL_SOURCE, "-o", output]


@functools.lru_cache(maxsize=1)
def load_extension(verbose: bool = False):
    """Compile (cached by torch in its extensions dir) and import the extension."""
    if not torch.cuda.is_available():
        raise RuntimeError("the CUDA decode kernel needs a GPU and a CUDA build of torch")
    from torch.utils.cpp_extension import load

    return load(name="tangram_ragged_decode", sources=[BINDING_SOURCE, KERNEL_SOURCE],
                extra_include_paths=[CUDA_DIR], extra_cuda_cflags=["-O3", "-std=c++17"],
                verbose=verbose)


def ragged_decode_cuda(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                       block_table: torch.Tensor, seq_lens: torch.Tensor, meta: LayerMeta,
                       split: SplitRow, sm_scale: float, *, return_lse: bool = False,
                       rows: torch.Tensor | None = None):
    """Decode attention over ragged groups on the GPU (see reference.ragged_decode_torch).

    block_table, seq_lens: int32 with a unit last stride; k_pages, v_pages contiguous,
    in q's dtype (float32, float16 or bfloat16) or FP8 (kv_quant.py: meta.k_scale folds into
    sm_scale, meta.v_scale scales the output). Returns o [B, Hq, d] (and lse
    float32 [B, Hq] if return_lse). rows (see the reference): the kernel reads a [B, G, W]
    table, so the batch's rows are gathered first (the Triton kernel reads them in place).
    A sliding-window layer (meta.window) reads the newest window slots, as the reference does.
    """
    if rows is not None:
        block_table = block_table.index_select(0, rows)
    ext = load_extension()
    o, lse = ext.ragged_decode(q, k_pages, v_pages, block_table, seq_lens, meta.q_head, meta.group_size,
                               split.splits, split.cta_offset, split.cta_group, split.cta_split, meta.gqa,
                               float(sm_scale) * meta.k_scale, int(meta.window))
    if meta.v_scale != 1.0:
        o.mul_(meta.v_scale)
    return (o, lse) if return_lse else o
