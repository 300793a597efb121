"""Models whose SGLang code writes K/V itself (the fused set-KV path) write through the Tangram backend
under a profile; models with learned attention sinks are found (and refused when the backend is built)."""

from types import SimpleNamespace

import torch
from torch import nn

from tangram_sglang.sglang.model_writes import (
    FUSED_CHECK, fused_set_kv_architectures, learned_sinks, route_kv_writes_through_backend)


def _module_of(name: str):
    """A layer class that says it lives in SGLang's model file ``name`` (what route_* looks at)."""
    return type("Layer", (nn.Module,), {"__module__": name})


def test_qwen3_moe_fused_check_answers_no_even_where_it_would_fuse(monkeypatch):
    """Forcing the check's CUDA branch on this CPU (a bf16 token pool on CUDA): SGLang's own check
    chooses the fused write; after routing, the model file's check answers False."""
    import sglang.srt.models.qwen3_moe as qwen3_moe
    import sglang.srt.models.utils as model_utils

    assert "Qwen3MoeForCausalLM" in fused_set_kv_architectures()
    assert "LlamaForCausalLM" not in fused_set_kv_architectures()
    monkeypatch.setattr(model_utils, "_is_cuda", True)
    monkeypatch.setattr(model_utils, "get_token_to_kv_pool", lambda: SimpleNamespace(dtype=torch.bfloat16))
    monkeypatch.setattr(qwen3_moe, FUSED_CHECK, qwen3_moe.enable_fused_set_kv_buffer)  # restored after
    batch = SimpleNamespace(dcp_kv_mask=None)
    monkeypatch.setattr(model_utils, "is_cp_active", lambda fb: False)
    assert qwen3_moe.enable_fused_set_kv_buffer(batch) is True

    model = nn.Sequential(_module_of("sglang.srt.models.qwen3_moe")(), _module_of("sglang.srt.models.llama")())
    assert route_kv_writes_through_backend(model) == ["sglang.srt.models.qwen3_moe"]
    assert qwen3_moe.enable_fused_set_kv_buffer(batch) is False
    assert model_utils.enable_fused_set_kv_buffer(batch) is True   # SGLang's own function is untouched


def test_modules_outside_sglang_models_are_left_alone():
    model = nn.Sequential(_module_of("torch.nn.modules.linear")(), _module_of(__name__)())
    assert route_kv_writes_through_backend(model) == []


def test_learned_sinks_are_found():
    attn = nn.Module()
    attn.sinks = nn.Parameter(torch.zeros(4))
    plain = nn.Module()
    plain.sinks = None   # SGLang's Granite sets None when the config has no sinks
    model = nn.Sequential(plain, attn)
    assert learned_sinks(model) == ["1"]
    assert learned_sinks(nn.Sequential(plain)) == []
