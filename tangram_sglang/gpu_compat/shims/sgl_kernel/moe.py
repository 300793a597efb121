"""MoE bookkeeping with sgl_kernel.moe's signatures, in torch: block alignment and top-k sums.

All ops have fixed shapes and no host sync, so they capture in a CUDA graph.
"""

from __future__ import annotations

import torch

from ._missing import stand_in_getattr

__getattr__ = stand_in_getattr(__name__)


def _buckets(topk_ids: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Bucket of each flattened id: ``id + 1``; ids outside ``[-1, num_buckets - 2]`` (an EP-filtered
    -1 included) land in bucket 0, the "no local expert" bucket. int64 [numel]."""
    shifted = topk_ids.reshape(-1).long() + 1
    return torch.where((shifted >= 0) & (shifted < num_buckets), shifted, torch.zeros_like(shifted))


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int,
                         sorted_token_ids: torch.Tensor, experts_ids: torch.Tensor,
                         num_tokens_post_pad: torch.Tensor, cumsum_buffer: torch.Tensor,
                         pad_sorted_token_ids: bool = False, ignore_invalid_expert: bool = False) -> None:
    """Group the flattened (token, slot) indices of ``topk_ids`` by expert, each group padded to a
    multiple of ``block_size``; writes the outputs in place, returns None.

    ``num_experts`` counts buckets (SGLang passes experts + 1): bucket b holds expert ``b - 1`` and
    bucket 0 the ids of no local expert (-1). Example, topk_ids [[1, 0], [1, 2]], 4 buckets, block 2:
    buckets [2, 1, 2, 3]; padded counts [0, 2, 2, 2]; sorted_token_ids [1, P, 0, 2, 3, P] (P = numel
    = 4 padding, when ``pad_sorted_token_ids``); experts_ids [0, 1, 2]; num_tokens_post_pad [6].

    topk_ids: [tokens, top_k] int32/int64. sorted_token_ids: int32 [max_padded] (all of it set to
    numel first when ``pad_sorted_token_ids``). experts_ids: int32 [max_blocks], the first
    ``total / block_size`` entries written (-1 for bucket 0). num_tokens_post_pad: int32, [0] = total
    padded length. cumsum_buffer: int32 [>= num_experts + 1] scratch, left as the CUDA kernel leaves
    it (each bucket's end of tokens, then the total). ``ignore_invalid_expert`` changes nothing here:
    out-of-range ids always go to bucket 0. Order within a group is token order (the CUDA kernel's
    is arbitrary).
    """
    bucket = _buckets(topk_ids, num_experts)
    counts = torch.zeros(num_experts, dtype=torch.long, device=bucket.device)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    padded = (counts + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    starts = ends - padded
    total = ends[-1:]
    if pad_sorted_token_ids:
        sorted_token_ids.fill_(bucket.numel())
    order = torch.argsort(bucket, stable=True)
    grouped = bucket[order]
    rank = torch.arange(bucket.numel(), device=bucket.device) - (counts.cumsum(0) - counts)[grouped]
    sorted_token_ids.scatter_(0, starts[grouped] + rank, order.to(sorted_token_ids.dtype))
    block_start = torch.arange(experts_ids.numel(), device=bucket.device) * block_size
    expert = torch.searchsorted(ends, block_start, right=True) - 1
    experts_ids.copy_(torch.where(block_start < total, expert.to(experts_ids.dtype), experts_ids))
    num_tokens_post_pad[:1].copy_(total)
    cumsum_buffer[:num_experts].copy_(starts + counts)
    cumsum_buffer[num_experts:num_experts + 1].copy_(total)


def moe_sum_reduce(input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float = 0.0) -> None:
    """``output = input.sum(dim=1) * routed_scaling_factor`` in float32; input [tokens, top_k, hidden],
    output [tokens, hidden] written in place."""
    output.copy_(input.float().sum(dim=1) * routed_scaling_factor)


def moe_sum(input: torch.Tensor, output: torch.Tensor) -> None:
    """``output = input.sum(dim=1)`` in float32; input [tokens, top_k, hidden], output [tokens, hidden]."""
    output.copy_(input.float().sum(dim=1))
