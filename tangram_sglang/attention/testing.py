"""Random ragged caches with their dense twin, for tests and benchmarks.

make_ragged_cache builds, for B requests with N_b history tokens each, full
K/V [B, N, H, d], a per-head keep mask (head h of group g keeps a random
subset of lens[b, g] tokens) and the paged pool holding exactly the kept
tokens, in position order, on shuffled pages. Unused pool memory and unused
head slots are NaN, so a kernel that reads them fails loudly. With an FP8 kv_dtype the
pages hold the quantized K/V (kv_quant.py, with the given scales, recorded in meta) and the
dense twin holds what they decode to, so a kernel reading them right matches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import dataclasses

import numpy as np
import torch

from tangram_sglang.attention.kv_quant import dequantize, quantize
from tangram_sglang.attention.layer_meta import LayerMeta, build_layer_meta


@dataclass
class RaggedCache:
    """meta; k_full, v_full [B, N, H, d]; keep bool [B, H, N]; hist_lens int64 [B];
    k_pages, v_pages [num_pages, P, H_p, d]; block_table int32 [B, G, max_pages];
    seq_lens int32 [B, G]."""

    meta: LayerMeta
    k_full: torch.Tensor
    v_full: torch.Tensor
    keep: torch.Tensor
    hist_lens: torch.Tensor
    k_pages: torch.Tensor
    v_pages: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor

    @property
    def page_size(self) -> int:
        return int(self.k_pages.shape[1])


def random_groups(num_kv_heads: int, heads_per_group: int, rng: np.random.Generator) -> list[list[int]]:
    """A random partition of the heads into groups of heads_per_group (last may be short)."""
    perm = [int(h) for h in rng.permutation(num_kv_heads)]
    return [perm[i : i + heads_per_group] for i in range(0, num_kv_heads, heads_per_group)]


def make_ragged_cache(lens: np.ndarray, *, num_kv_heads: int, gqa: int, heads_per_group: int,
                      head_dim: int, page_size: int, extra_hist: int = 3, spare_pages: int = 3,
                      seed: int = 0, dtype=torch.float32, groups=None, fill=float("nan"),
                      kv_dtype=None, kv_scales: tuple[float, float] = (1.0, 1.0)) -> RaggedCache:
    """lens: int [B, G] slots per (request, group); groups default: random_groups; kv_dtype: the
    pages' dtype when not dtype (FP8), stored with kv_scales (k_scale, v_scale)."""
    rng = np.random.default_rng(seed)
    lens = np.asarray(lens, dtype=np.int64)
    batch, num_g = lens.shape
    groups = groups or random_groups(num_kv_heads, heads_per_group, rng)
    if len(groups) != num_g:
        raise ValueError(f"lens has {num_g} groups, the grouping has {len(groups)}")
    meta = build_layer_meta(groups, num_q_heads=num_kv_heads * gqa, num_kv_heads=num_kv_heads,
                            heads_per_group=heads_per_group)
    meta = dataclasses.replace(meta, k_scale=float(kv_scales[0]), v_scale=float(kv_scales[1]))
    hist = lens.max(axis=1) + rng.integers(0, extra_hist + 1, size=batch)
    n_max = max(int(hist.max()), 1)
    gen = torch.Generator().manual_seed(seed)
    k_full = torch.randn(batch, n_max, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_full = torch.randn(batch, n_max, num_kv_heads, head_dim, generator=gen).to(dtype)
    page_dtype = kv_dtype or dtype
    k_store, v_store = quantize(k_full, page_dtype, meta.k_scale), quantize(v_full, page_dtype, meta.v_scale)
    if kv_dtype is not None:  # the dense twin holds what the pages decode to
        k_full = (dequantize(k_store) * meta.k_scale).to(dtype)
        v_full = (dequantize(v_store) * meta.v_scale).to(dtype)
    pages_per = (lens + page_size - 1) // page_size
    num_pages = int(pages_per.sum()) + spare_pages
    page_ids = rng.permutation(num_pages)
    max_pages = max(int(pages_per.max()), 1)
    table = np.zeros((batch, num_g, max_pages), dtype=np.int32)
    k_pages = torch.full((num_pages, page_size, heads_per_group, head_dim), fill, dtype=page_dtype)
    v_pages = torch.full_like(k_pages, fill)
    keep = torch.zeros(batch, num_kv_heads, n_max, dtype=torch.bool)
    nxt = 0
    for b in range(batch):
        for g, heads in enumerate(groups):
            table[b, g, : pages_per[b, g]] = page_ids[nxt : nxt + pages_per[b, g]]
            nxt += pages_per[b, g]
            slots = np.arange(lens[b, g])
            loc = torch.as_tensor(table[b, g, slots // page_size].astype(np.int64) * page_size + slots % page_size)
            for p, h in enumerate(heads):
                pos = torch.as_tensor(np.sort(rng.choice(hist[b], size=lens[b, g], replace=False)))
                keep[b, h, pos] = True
                k_pages.view(-1, heads_per_group, head_dim)[loc, p] = k_store[b, pos, h]
                v_pages.view(-1, heads_per_group, head_dim)[loc, p] = v_store[b, pos, h]
    return RaggedCache(meta, k_full, v_full, keep, torch.as_tensor(hist), k_pages, v_pages,
                       torch.as_tensor(table), torch.as_tensor(lens, dtype=torch.int32))
