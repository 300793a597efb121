"""Torch stand-in for sgl_kernel on SGLang 0.5.23's CUDA path (tangram_sglang.gpu_compat).

What SGLang imports from sgl_kernel when serving Llama, Qwen2/3, Qwen3-MoE and Gemma 3 with the triton
attention backend, and what this package gives it:

implemented (torch, any device, float32 inside):
  rmsnorm, fused_add_rmsnorm, gemma_rmsnorm, gemma_fused_add_rmsnorm   layers/layernorm.py
  silu_and_mul, gelu_and_mul, gelu_tanh_and_mul                       layers/activation.py
  top_k_renorm_prob, top_p_renorm_prob                                layers/sampler.py
  weak_ref_tensor                                                     runner_backend_utils/weak_ref_tensor.py
  moe_align_block_size, moe_sum_reduce, moe_sum                       triton MoE runner, gguf.py
  utils.is_arch_support_pdl                                           layers/attention/triton_backend.py
placeholders (imported at module level, raise NotImplementedError if called; never on that path):
  int8_scaled_mm; merge_state_v2; cutlass MoE (fp8_blockwise_scaled_grouped_mm, es_*, shuffle_rows,
  cutlass_w4a8_moe_mm, get_cutlass_w4a8_moe_mm_data); MiniCPM (infllmv2_attn_stage1,
  max_pooling_1d_varlen); quantization.ggml_*; kvcacheio.transfer_* (HiCache, embedding cache);
  any other name
absent (ImportError, so SGLang's own fallback runs):
  scalar_type (get_scalar_types' mock), allreduce (custom all-reduce off, NCCL instead),
  kvcacheio.get_device_accessible_ptr (raw host addresses), flash_attn (the FA3 backend, unused)
  and every other submodule
"""

from . import elementwise, kvcacheio, memory, moe, quantization, sampling, sm100_only, utils  # noqa: F401
from ._missing import stand_in_getattr
from .elementwise import (
    fused_add_rmsnorm,
    gelu_and_mul,
    gelu_tanh_and_mul,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    rmsnorm,
    silu_and_mul,
)
from .memory import weak_ref_tensor
from .moe import moe_align_block_size, moe_sum, moe_sum_reduce
from .sampling import top_k_renorm_prob, top_k_renorm_probs, top_p_renorm_prob, top_p_renorm_probs

__version__ = "0.0.0+tangram.gpu.compat"
sm100_only.install()  # SM100-only modules SGLang imports unguarded on CUDA (Llama/Qwen MLPs' dual GEMM)
# Submodules are imported above: a package __getattr__ would otherwise answer ``from sgl_kernel import
# utils`` with a placeholder. The absent submodules are absent as attributes too.
__getattr__ = stand_in_getattr(__name__, absent=frozenset({"scalar_type", "allreduce", "flash_attn"}))

__all__ = [
    "fused_add_rmsnorm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "moe_align_block_size",
    "moe_sum",
    "moe_sum_reduce",
    "rmsnorm",
    "silu_and_mul",
    "top_k_renorm_prob",
    "top_k_renorm_probs",
    "top_p_renorm_prob",
    "top_p_renorm_probs",
    "weak_ref_tensor",
]
