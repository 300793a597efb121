"""A tiny random-weight Llama saved as an HF folder, and its greedy HF outputs."""

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


@torch.no_grad()
def hf_greedy(model, prompts=PROMPTS, new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    outs = []
    for p in prompts:
        out = model.generate(torch.tensor([p]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False)
        outs.append(out[0, len(p):].tolist())
    return outs
