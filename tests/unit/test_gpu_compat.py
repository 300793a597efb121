"""The torch stand-in for sgl_kernel (tangram_sglang.gpu_compat) against SGLang's own torch references.

The stand-in is loaded by file path under another name: the CPU stand-in the suite runs with stays
the ``sgl_kernel`` on sys.path. One test imports SGLang's CUDA path in a subprocess (torch.cuda
patched to report a GPU, the stand-in first on sys.path) and drives SGLang's call sites on CPU tensors.
"""

import importlib
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.layers.activation import GeluAndMul, SiluAndMul  # noqa: E402
from sglang.srt.layers.layernorm import Gemma3RMSNorm, GemmaRMSNorm, RMSNorm  # noqa: E402
from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
SHIMS = REPO / "tangram_sglang" / "gpu_compat" / "shims"
NAME = "tangram_gpu_sgl_kernel"


def _load_stand_in():
    folder = SHIMS / "sgl_kernel"
    spec = importlib.util.spec_from_file_location(NAME, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module  # its submodules import relatively, under this name
    spec.loader.exec_module(module)
    return module


sk = _load_stand_in()
HIDDEN = [17, 54, 97]
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _with_weight(module, hidden, dtype, seed=1):
    module.weight.data = _rand(hidden, dtype=dtype, seed=seed)
    return module


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rmsnorm_matches_forward_native(hidden, dtype):
    norm = _with_weight(RMSNorm(hidden, eps=1e-6), hidden, dtype)
    x = _rand(5, hidden, dtype=dtype)
    torch.testing.assert_close(sk.rmsnorm(x, norm.weight.data, 1e-6), norm.forward_native(x), **TOL[dtype])
    out = torch.empty_like(x)
    assert sk.rmsnorm(x, norm.weight.data, 1e-6, out=out) is out
    torch.testing.assert_close(out, norm.forward_native(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_fused_add_rmsnorm_updates_input_and_residual(hidden, dtype):
    norm = _with_weight(RMSNorm(hidden, eps=1e-5), hidden, dtype)
    x, residual = _rand(4, hidden, dtype=dtype), _rand(4, hidden, dtype=dtype, seed=2)
    want_out, want_residual = norm.forward_native(x.clone(), residual.clone())
    assert sk.fused_add_rmsnorm(x, residual, norm.weight.data, 1e-5) is None
    torch.testing.assert_close(x, want_out, **TOL[dtype])
    torch.testing.assert_close(residual, want_residual, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("module", [GemmaRMSNorm, Gemma3RMSNorm])
def test_gemma_norms_use_one_plus_weight(module, hidden, dtype):
    norm = _with_weight(module(hidden, eps=1e-6), hidden, torch.float32)
    x, residual = _rand(3, hidden, dtype=dtype), _rand(3, hidden, dtype=dtype, seed=2)
    weight = norm.weight.data.to(dtype)
    torch.testing.assert_close(sk.gemma_rmsnorm(x, weight, 1e-6), norm.forward_native(x), **TOL[dtype])
    want_out, want_residual = norm.forward_native(x.clone(), residual.clone())
    sk.gemma_fused_add_rmsnorm(x, residual, weight, 1e-6)
    torch.testing.assert_close(x, want_out, **TOL[dtype])
    torch.testing.assert_close(residual, want_residual, **TOL[dtype])


ACTIVATIONS = [("silu_and_mul", SiluAndMul), ("gelu_and_mul", lambda: GeluAndMul("none")),
               ("gelu_tanh_and_mul", lambda: GeluAndMul("tanh"))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HIDDEN)
@pytest.mark.parametrize("name,reference", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activations_match_forward_native(name, reference, d, dtype):
    op, x = getattr(sk, name), _rand(2, 3, 2 * d, dtype=dtype)
    want = reference().forward_native(x)
    torch.testing.assert_close(op(x), want, **TOL[dtype])
    out = torch.empty(2, 3, d, dtype=dtype)
    assert op(x, out) is out
    torch.testing.assert_close(out, want, **TOL[dtype])
    with pytest.raises(ValueError, match="does not match"):
        op(x, torch.empty(2, 3, d + 1, dtype=dtype))


def _sglang_filtered(probs, top_ks, top_ps):
    """SGLang's pytorch-sampler filtering, renormalized and put back in vocabulary order."""
    rows = probs.shape[0]
    _, ranked, order, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), top_ks, top_ps, torch.zeros(rows), False, None, None, return_filtered_probs=True)
    kept = torch.zeros_like(probs).scatter_(1, order.long(), ranked)
    return kept / kept.sum(dim=-1, keepdim=True)


def _probs(rows, vocab, dtype=torch.float32):
    return torch.softmax(_rand(rows, vocab, seed=3) * 3, dim=-1).to(dtype)


@pytest.mark.parametrize("vocab", [17, 97])
def test_top_k_renorm_matches_the_pytorch_sampler(vocab):
    probs = _probs(4, vocab)
    ks = torch.tensor([1, 5, vocab, 1 << 30], dtype=torch.int32)
    want = _sglang_filtered(probs, ks, torch.ones(4))
    got = sk.top_k_renorm_prob(probs, ks)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)
    want_5 = _sglang_filtered(probs, torch.full((4,), 5), torch.ones(4))
    torch.testing.assert_close(sk.top_k_renorm_prob(probs, 5), want_5)
    torch.testing.assert_close(sk.top_k_renorm_prob(probs, 0), probs)  # k <= 0: the whole row


@pytest.mark.parametrize("vocab", [17, 97])
def test_top_p_renorm_matches_the_pytorch_sampler(vocab):
    probs = _probs(4, vocab)
    ps = torch.tensor([0.1, 0.5, 0.9, 1.0])
    want = _sglang_filtered(probs, torch.full((4,), vocab), ps)
    torch.testing.assert_close(sk.top_p_renorm_prob(probs, ps), want)
    half = probs.bfloat16()
    want_half = _sglang_filtered(half.float(), torch.full((4,), vocab), torch.full((4,), 0.5))
    torch.testing.assert_close(sk.top_p_renorm_prob(half, 0.5), want_half)


def test_renorm_keeps_ties_with_the_cut():
    probs = torch.tensor([[0.4, 0.2, 0.2, 0.2]])
    torch.testing.assert_close(sk.top_k_renorm_prob(probs, 2), probs)
    torch.testing.assert_close(sk.top_p_renorm_prob(probs, 0.5), probs)


def _reference_align(ids, buckets, block):
    """Python loop: (sorted ids with numel padding, block experts, total), token order within a bucket."""
    flat = [b + 1 if 0 <= b + 1 < buckets else 0 for b in ids.reshape(-1).tolist()]
    sorted_ids, experts = [], []
    for bucket in range(buckets):
        members = [i for i, b in enumerate(flat) if b == bucket]
        padded = -(-len(members) // block) * block
        sorted_ids += members + [len(flat)] * (padded - len(members))
        experts += [bucket - 1] * (padded // block)
    return sorted_ids, experts, len(sorted_ids)


@pytest.mark.parametrize("block", [1, 4, 16])
@pytest.mark.parametrize("tokens", [1, 7, 33])
def test_moe_align_block_size_matches_a_loop(tokens, block):
    buckets, top_k = 9, 3  # 8 experts + the "no local expert" bucket, as SGLang calls it
    ids = torch.randint(-1, buckets - 1, (tokens, top_k), generator=torch.Generator().manual_seed(tokens))
    ids = ids.to(torch.int32)
    capacity = ids.numel() + buckets * (block - 1) + 4
    sorted_ids = torch.full((capacity,), -7, dtype=torch.int32)
    experts = torch.full((-(-capacity // block),), 12345, dtype=torch.int32)
    total, cumsum = torch.empty(1, dtype=torch.int32), torch.empty(buckets + 1, dtype=torch.int32)
    sk.moe_align_block_size(ids, buckets, block, sorted_ids, experts, total, cumsum, True)
    want_ids, want_experts, want_total = _reference_align(ids, buckets, block)
    assert total.tolist() == [want_total]
    assert sorted_ids[:want_total].tolist() == want_ids
    assert (sorted_ids[want_total:] == ids.numel()).all()
    assert experts[:len(want_experts)].tolist() == want_experts
    assert (experts[len(want_experts):] == 12345).all()  # blocks past the total are left alone
    assert cumsum[-1].item() == want_total


def test_moe_sums():
    x, out = _rand(5, 3, 17, dtype=torch.bfloat16), torch.empty(5, 17, dtype=torch.bfloat16)
    sk.moe_sum_reduce(x, out, 0.5)
    torch.testing.assert_close(out, (x.float().sum(1) * 0.5).bfloat16())
    sk.moe_sum(x, out)
    torch.testing.assert_close(out, x.float().sum(1).bfloat16())


def test_weak_ref_tensor_and_pdl():
    x = torch.ones(3)
    assert sk.weak_ref_tensor(x) is x
    sk.utils.is_arch_support_pdl.cache_clear()
    assert sk.utils.is_arch_support_pdl() is (torch.cuda.is_available()
                                               and torch.cuda.get_device_capability()[0] >= 9)


@pytest.mark.parametrize("module,name", [("", "int8_scaled_mm"), ("", "merge_state_v2"),
                                         ("quantization", "ggml_dequantize"),
                                         ("kvcacheio", "transfer_kv_per_layer"), ("elementwise", "copy_to_gpu_no_ce")])
def test_placeholders_raise_naming_the_op(module, name):
    op = getattr(importlib.import_module(f"{NAME}.{module}" if module else NAME), name)
    with pytest.raises(NotImplementedError, match=name):
        op(torch.ones(1))


def test_absent_names_let_sglang_fall_back():
    with pytest.raises(ImportError):
        exec(f"from {NAME}.kvcacheio import get_device_accessible_ptr")
    for sub in ("scalar_type", "allreduce", "flash_attn"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"{NAME}.{sub}")
        assert not hasattr(sk, sub)
    assert sk.utils.__name__ == f"{NAME}.utils"  # a real submodule, not a placeholder


def test_the_cpu_stand_in_is_undisturbed():
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is not None:
        assert "gpu_compat" not in (spec.origin or "")
    assert str(SHIMS) not in sys.path


CUDA_PATH = textwrap.dedent("""
    import os, sys
    os.environ["SGLANG_USE_CPU_ENGINE"] = "0"
    sys.path.insert(0, sys.argv[1])
    import torch
    torch.cuda.is_available = lambda: True
    torch.version.cuda = "13.0"
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H100 (patched)"
    torch.cuda.device_count = lambda: 1
    import sgl_kernel
    assert "gpu_compat" in sgl_kernel.__file__, sgl_kernel.__file__
    import sglang.launch_server, sglang.srt.model_executor.model_runner, sglang.srt.managers.scheduler
    import sglang.srt.compilation.cuda_piecewise_backend
    from sglang.srt.models import llama, qwen2, qwen3, qwen3_moe, gemma3_causal
    from sglang.srt.layers import activation, layernorm, sampler
    from sglang.srt.layers.attention import triton_backend
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe
    from sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size import moe_align_block_size
    from sglang.srt.layers.quantization.utils import get_scalar_types
    from sglang.srt.distributed.device_communicators import custom_all_reduce_ops
    from sglang.srt.model_executor.runner_backend_utils import weak_ref_tensor
    sk = sgl_kernel
    assert layernorm.rmsnorm is sk.rmsnorm and layernorm.gemma_fused_add_rmsnorm is sk.gemma_fused_add_rmsnorm
    assert activation._sgl_silu_and_mul is sk.silu_and_mul and sampler.top_p_renorm_prob is sk.top_p_renorm_prob
    assert fused_moe.moe_sum_reduce is sk.moe_sum_reduce and weak_ref_tensor.weak_ref_tensor is sk.weak_ref_tensor
    assert triton_backend.is_arch_support_pdl() is True
    assert get_scalar_types()[0].__name__ == "MockScalarType"
    assert custom_all_reduce_ops.IS_CUSTOM_AR_AVAILABLE is False
    # Llama / Qwen MLPs import the SM100 dual GEMM unguarded (it imports CuTe DSL, absent here): the stand-in's
    # module answers as the real one does on a GPU before SM100 (this import failed on an H200)
    from sglang.kernels.ops.gemm.cutedsl_dual_gemm import DualGemmQuantMode, can_use_dual_gemm
    assert not can_use_dual_gemm(1, 4096, 14336, DualGemmQuantMode.UNQUANT)
    assert DualGemmQuantMode.UNQUANT.is_quantized is False and DualGemmQuantMode.DYNAMIC_PER_TOKEN.is_dynamic
    x, r = torch.randn(4, 54), torch.randn(4, 54)
    for norm in (layernorm.RMSNorm(54), layernorm.GemmaRMSNorm(54), layernorm.Gemma3RMSNorm(54)):
        norm.weight.data.normal_()
        torch.testing.assert_close(norm.forward_cuda(x.clone()), norm.forward_native(x.clone()))
        got, want = norm.forward_cuda(x.clone(), r.clone()), norm.forward_native(x.clone(), r.clone())
        torch.testing.assert_close(got, want)
    y = torch.randn(3, 34)  # d = 17 floats: not a vector width, so the sgl_kernel path, not the JIT one
    torch.testing.assert_close(activation.SiluAndMul().forward_cuda(y), activation.SiluAndMul().forward_native(y))
    gelu = activation.GeluAndMul("tanh")
    torch.testing.assert_close(gelu.forward_cuda(y), gelu.forward_native(y))
    ids = torch.randint(0, 8, (5, 2), dtype=torch.int32)
    sorted_ids, experts, total = moe_align_block_size(ids, 4, 8)  # via sglang.kernels' AOT registry entry
    kept = sorted_ids[: total.item()]
    assert sorted(kept[kept < ids.numel()].tolist()) == list(range(ids.numel()))
    print("CUDA PATH OK")
""")


def test_sglang_cuda_path_imports_and_calls_the_stand_in():
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="0")
    done = subprocess.run([sys.executable, "-c", CUDA_PATH, str(SHIMS)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=str(REPO))
    assert done.returncode == 0 and "CUDA PATH OK" in done.stdout, done.stdout[-3000:] + done.stderr[-6000:]
