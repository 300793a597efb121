"""A small served pool for the decode-graph checks (tests/model/test_decode_graph.py on CPU through the
backend's graph protocol, benchmarks/timing/gpu_decode.py on a GPU with a real CUDA graph).

SmolLM2-135M's shape (30 layers, 9 query / 3 KV heads, d 64) with a shipped profile, five requests
admitted and prefilled through the host control plane (24-token chunks), the pages filled with
seeded K/V (the same on every call, so two pools driven alike stay equal) and the scratch page
with NaN (whatever reads it shows).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from tangram_sglang.method.protection import Protection
from tangram_sglang.serving.context import LoadedProfile
from tangram_sglang.serving.runtime import TangramServing

HQ, HKV, D, NUM_LAYERS = 9, 3, 64, 30
PROMPTS = {"a": (3, 30), "b": (1, 47), "c": (7, 5), "d": (2, 64), "e": (5, 33)}   # rid: (SGLang row, tokens)
STEPS = [["a", "b", "c"], ["d"], ["a", "b", "c", "d", "e"], ["e", "a"]]         # decode batches, in order


def served_pool(profile_path: str, device, ratio: float = 0.25, data_plane: str = "torch") -> TangramServing:
    shape = SimpleNamespace(num_hidden_layers=NUM_LAYERS, num_attention_heads=HQ, num_key_value_heads=HKV,
                            hidden_size=HQ * D, architectures=["LlamaForCausalLM"])
    serving = TangramServing.build(LoadedProfile.load(profile_path, ratio), shape, stock_tokens=900,
                                   dtype=torch.float32, device=device, page_size=16, num_q_heads=HQ,
                                   data_plane=data_plane, chunk=24, protection=Protection(sinks=2, newest=6))
    for rid, (row, n) in PROMPTS.items():
        if not serving.admit(rid, prefix_chain=[], prefix_tokens=0, node=None, tokens=np.zeros(n, np.int64),
                             decode_tokens=8):
            raise RuntimeError(f"served_pool: request {rid} does not fit")
        serving.bind_row(rid, row)
        while not serving.cache.requests[rid].prefill_done:
            req = serving.cache.requests[rid]
            serving.extend_metadata([rid], [req.plan.chunk_tokens[len(req.chunk_ends)]])
    gen = torch.Generator().manual_seed(0)
    data = serving.data
    for pages in (data.k_pages, data.v_pages):
        pages.copy_(torch.randn(pages.shape, generator=gen).to(pages.device))
        pages[data.scratch_page] = float("nan")
    return serving


def step_inputs(num_layers: int, bs: int, seed: int, device) -> list[torch.Tensor]:
    """q [L, bs, HQ, D], k and v [L, bs, HKV, D] of one decode step (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(num_layers, bs, h, D, generator=gen).to(device) for h in (HQ, HKV, HKV)]
