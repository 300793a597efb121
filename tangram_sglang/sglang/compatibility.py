"""SGLang options and model paths a profile cannot be served with: refused at launch, one line each.

Checked in the launching process (server_args.attach_profile) once SGLang has
built its ServerArgs, so nothing is spawned. Each entry says why; what is not
listed runs with a profile (the tests say which are exercised).
"""

from __future__ import annotations

import os

from tangram_sglang.profile import ProfileError
from tangram_sglang.profile.format import SLIDING, layer_kinds

# SGLang's hybrid-SWA models served under a profile (their window layers in the ragged pool, SGLang's
# SWA pool off: server_args.serving_overrides); gpt-oss's learned sinks: attention/merge.py add_sinks
HYBRID_SERVED = {"GptOssForCausalLM"}

OPTIONS = [  # (ServerArgs field, unsupported when, why)
    ("pp_size", lambda v: (v or 1) > 1, "pipeline parallelism: the pool is built for every layer in one process"),
    ("dp_size", lambda v: (v or 1) > 1, "data parallelism inside one server: run replicas behind sglang-router"),
    ("enable_dp_attention", bool, "DP attention: one pool per scheduler process is not coordinated across ranks"),
    ("attn_dp_size", lambda v: (v or 1) > 1, "DP attention: one pool per scheduler process is not coordinated across ranks"),
    ("attn_cp_size", lambda v: (v or 1) > 1,
     "attention context parallelism: splits a request's KV across ranks, the ragged pool holds a request in one"),
    ("decoupled_spec_role", lambda v: v not in (None, "", "null"),
     "decoupled speculative decoding: draft and verify passes write KV outside the compression chunk schedule"),
    ("dllm_algorithm", bool, "diffusion LLMs: they rewrite KV of positions already decoded, compressed segments are fixed"),
    ("enable_lmcache", bool, "LMCache: it offloads SGLang's token-pool KV, the ragged pool has none"),
    ("speculative_algorithm", lambda v: v not in (None, "", "NONE"),
     "speculative decoding: draft and verify passes write KV outside the compression chunk schedule"),
    ("enable_hierarchical_cache", bool, "HiCache: it moves SGLang's token pool pages, the ragged pool has none; "
     "--tangram-host-ratio R keeps evicted history compressed in host memory instead"),
    ("disaggregation_mode", lambda v: v not in (None, "null"),
     "prefill/decode disaggregation: transfers SGLang's token pool KV, not the ragged pool"),
    ("enable_streaming_session", bool, "streaming sessions: SGLang keeps a session's KV row outside the radix tree "
     "(claim_kv_row) and extends it turn by turn, outside the compression chunk schedule; serve multi-turn "
     "sessions with --enable-session-radix-cache and a session_id per request"),
    ("radix_eviction_policy", lambda v: v not in (None, "lru"),
     "the segment radix tree evicts least recently used segments; the other policies rank SGLang's own tree "
     "nodes"),
    ("enable_lora", bool, "LoRA: adapters change K/V per request, compressed segments are not keyed by adapter"),
    ("lora_paths", bool, "LoRA: adapters change K/V per request, compressed segments are not keyed by adapter"),
    ("kv_cache_dtype", lambda v: v in ("mxfp8", "nvfp4", "fp4_mx_block16"),
     "block-scaled KV (mxfp8, FP4): SGLang keeps a scale per block of values in its own pool layout and "
     "kernels; the ragged pool stores FP8 with one scale per layer: use fp8_e4m3 or fp8_e5m2"),
    ("enable_mixed_chunk", bool, "mixed chunked prefill: decode tokens would ride in an extend batch, outside "
     "the compression chunk schedule"),
    ("enable_two_batch_overlap", bool, "two-batch overlap: splits a batch's forward metadata in two"),
    ("enable_pdmux", bool, "PD multiplexing: runs prefill and decode on separate streams over SGLang's pool"),
    ("enable_torch_compile", bool, "torch.compile: traces the attention backend's host-side planning"),
    ("enable_multimodal", bool, "multimodal inputs: image/audio tokens are not calibrated"),
    ("cuda_graph_backend_decode", lambda v: v not in (None, "full", "disabled"),
     "breakable decode CUDA graphs: the Tangram backend captures full decode graphs only"),
    ("cuda_graph_backend_prefill", lambda v: v not in (None, "disabled"),
     "prefill CUDA graphs: compression plans each chunk on the host"),
]


class UnsupportedOption(ProfileError):
    def __init__(self, option: str, why: str):
        ValueError.__init__(self, f"{option}: not supported with --tangram-profile ({why})")
        self.field, self.problem = option, why


def check_tensor_parallel(server_args, profile) -> None:
    """--tp-size t: the KV heads must shard evenly (the rank views regroup otherwise), and the
    scorer must score a rank's heads on their own (KVzip's reconstruction pass re-runs SGLang's
    layers inside the backend, which is not done across ranks)."""
    from tangram_sglang.profile.tensor_parallel import check_tp_size

    tp = getattr(server_args, "tp_size", 1) or 1
    if tp == 1:
        return
    check_tp_size(profile.model.num_kv_heads, tp, profile.tp_size)
    if profile.calibration.method == "kvzip":
        raise UnsupportedOption(f"--tp-size {tp}", "a KVzip profile's reconstruction pass runs on one rank's "
                                "layers only; serve its FastKVzip gate (calibrate --method fastkvzip) with TP")


def check_server_args(server_args) -> None:
    """Raise UnsupportedOption naming the first option a profile cannot be served with."""
    for field, bad, why in OPTIONS:
        value = getattr(server_args, field, None)
        if value is not None and bad(value):
            flag = f"--{field.replace('_', '-')}"
            raise UnsupportedOption(flag if value is True else f"{flag} {value}", why)
    config = _model_config(getattr(server_args, "model_path", None))
    if _serves_multimodal(config.get("architectures") or [], getattr(server_args, "enable_multimodal", None)):
        raise UnsupportedOption(f"model {config['architectures'][0]} (multimodal)",
                                "SGLang serves its image / audio / video inputs, whose tokens are not calibrated")
    arch = set(config.get("architectures") or [])
    other = other_attention_layers(config)
    if other:
        kinds = ", ".join(sorted(set(other.values())))
        raise UnsupportedOption(
            f"model {sorted(arch)[0] if arch else ''} ({len(other)} of {_num_layers(config)} layers: {kinds})",
            "the ragged pool serves full-attention and sliding-window layers only")
    if arch and SLIDING in _window_kinds(config).values() and _sglang_hybrid_swa(arch) and not arch & HYBRID_SERVED:
        raise UnsupportedOption(
            f"model {sorted(arch)[0]}", "SGLang serves it from its hybrid SWA pool; with a profile Tangram serves "
            f"the window layers of Gemma 2 / 3 and {', '.join(sorted(HYBRID_SERVED))} only")


def _window_kinds(config: dict) -> dict[int, str]:
    return layer_kinds(config.get("layer_types"), config.get("sliding_window_pattern"),
                       config.get("sliding_window"), _num_layers(config))


def _sglang_hybrid_swa(arch: set[str]) -> bool:
    from sglang.srt.configs.model_config import is_hybrid_swa_model

    return bool(is_hybrid_swa_model(sorted(arch)))


# SGLang 0.5.23 leaves multimodal off for these unless --enable-multimodal (ModelConfig's mm_disabled_models)
MULTIMODAL_OFF_BY_DEFAULT = {"Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration",
                             "Step3VLForConditionalGeneration", "InklingForConditionalGeneration"}


def _serves_multimodal(arch: list[str], enable_multimodal: bool | None) -> bool:
    """Whether SGLang would serve this model's multimodal inputs: it turns them on by default for every
    multimodal architecture but a few (and never for a text model, whatever the flag)."""
    from sglang.srt.configs.model_config import is_multimodal_model

    if not arch or not is_multimodal_model(list(arch)):
        return False
    return arch[0] not in MULTIMODAL_OFF_BY_DEFAULT if enable_multimodal is None else bool(enable_multimodal)


def _model_config(model_path: str | None) -> dict:
    """config.json of a model folder, its text model's (with the top level's architectures) for a multimodal
    one ({} without one: a hub name)."""
    path = os.path.join(model_path or "", "config.json")
    if not model_path or not os.path.isfile(path):
        return {}
    import json

    with open(path) as f:
        config = json.load(f)
    text = config.get("text_config")
    return {**text, "architectures": config.get("architectures")} if isinstance(text, dict) else config


def _num_layers(config: dict) -> int:
    return int(config.get("num_hidden_layers") or len(config.get("layer_types") or ()))


def other_attention_layers(config: dict) -> dict[int, str]:
    """{layer: its kind} of the layers that neither attend to the whole history nor to a sliding window
    (chunked, linear attention, ...: profile/format.layer_kinds)."""
    return {i: kind for i, kind in _window_kinds(config).items() if kind != SLIDING}
