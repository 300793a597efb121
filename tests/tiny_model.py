"""A tiny random-weight Llama saved as an HF folder, its greedy HF outputs, and the dense oracle's under a profile."""

from __future__ import annotations

import torch

PROMPTS = [[1, 5, 9, 200, 31], [7, 8, 9, 10, 11, 12, 13, 14], [100], list(range(40, 97))]
NEW_TOKENS = 16


def build_tiny_llama(path: str, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model


def build_tiny(arch: str, path: str, seed: int = 0):
    """A tiny random model of another architecture (same sizes as build_tiny_llama where they apply):
    qwen3 (q/k norms), qwen3_moe (4 experts, 2 per token), gemma3 (layers 0 and 2 attend to a
    WINDOW-token window, layer 1 to everything; HF's Gemma3ForCausalLM, text only), gpt_oss (a window
    layer and a full one, learned attention sinks, 4 experts)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    if arch == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(num_hidden_layers=2, head_dim=16, **common))
    elif arch == "qwen3_moe":
        model = tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(num_hidden_layers=2, head_dim=16, num_experts=4,
                                                         num_experts_per_tok=2, moe_intermediate_size=32,
                                                         **common))
    elif arch == "gemma3":
        # SGLang's Gemma 3 always reads logits through the embedding (Gemma ties them)
        cfg = tf.Gemma3TextConfig(num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=16,
                                  sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention",
                                                                      "sliding_attention"],
                                  **{**common, "tie_word_embeddings": True})
        model = tf.Gemma3ForCausalLM(cfg)
    elif arch == "gpt_oss":
        # layer 0 attends to a WINDOW-token window, layer 1 to everything; 4 experts, 2 per token; the
        # learned sinks drawn at random (they initialize to zero)
        cfg = tf.GptOssConfig(num_hidden_layers=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                              sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"], **common)
        model = tf.GptOssForCausalLM(cfg)
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.sinks)
    else:
        raise ValueError(arch)
    model = model.eval()
    model.save_pretrained(path)
    return model


WINDOW = 24  # the tiny Gemma 3's sliding window: the longest prompt (57 tokens) reaches past it


@torch.no_grad()
def hf_greedy(model, prompts=PROMPTS, new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    outs = []
    for p in prompts:
        out = model.generate(torch.tensor([p]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False)
        outs.append(out[0, len(p):].tolist())
    return outs


def oracle_tokens(model_path: str, profile: str, prompts: list[list[int]], **kwargs) -> list[list[int]]:
    """The dense oracle's greedy tokens per prompt: serving_reference.reference_generate
    with the profile's default ratio, 48-token chunks (the tests' profiles), NEW_TOKENS; kwargs: kv_dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    from tangram_sglang.oracle.serving_reference import reference_generate
    from tangram_sglang.profile import load_profile
    from tangram_sglang.scorers.profile_scorer import profile_scorer

    prof = load_profile(profile)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return [reference_generate(model, prof.select(), heads_per_group=1, method=profile_scorer(prof, profile),
                               prompt_ids=p, max_new_tokens=NEW_TOKENS, chunk_size=48, **kwargs) for p in prompts]
