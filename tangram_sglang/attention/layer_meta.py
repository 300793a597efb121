"""Per-layer index tables from the profile's groups, built once, read every step.

A layer's H KV heads are split into G groups of at most H_p heads; head slot
p of group g holds KV head ``groups[g][p]`` (slots past the group's size are
padding). KV head h serves query heads h*gqa .. h*gqa+gqa-1 (GQA).

Attention works on "rows": group g owns R = H_p * gqa query rows, row
r = p * gqa + j is query head ``groups[g][p] * gqa + j``. Kernels gather the
rows of a group from q with ``q_head`` and scatter results back with
``q_row`` (the flat row g * R + r of every query head).

Worked example: H = 3, gqa = 2 (Hq = 6), H_p = 2, groups [[2, 0], [1]]:
  kv_head    = [[2, 0], [1, 0]]        head_valid = [[T, T], [T, F]]
  q_head     = [[4, 5, 0, 1], [2, 3, 0, 0]]   (rows of padded slot -> 0)
  q_row      = [2, 3, 4, 5, 0, 1]      (query head 0 is row 2 of group 0, ...)
  group_of_head = [0, 1, 0]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, kw_only=True)
class LayerMeta:
    """Index tables of one layer's groups (all tensors on the attention device).

    kv_head: int64 [G, H_p], KV head in each head slot (padding -> 0).
    head_valid: bool [G, H_p], False on padding slots.
    group_size: int32 [G], heads in each group.
    q_head: int64 [G, R], query head of each row (padding -> 0), R = H_p * gqa.
    row_valid: bool [G, R].
    q_row: int64 [Hq], flat row (g * R + r) serving each query head.
    group_of_head, slot_of_head: int64 [H], where each KV head lives.
    group_budget: float64 [G] numpy, beta of each group (None when unknown).
    k_scale, v_scale: the layer's KV quantization scales (pages hold x / scale; 1.0 unquantized).
    window: 0, or a sliding-window layer's window: a query at position p reads the slots of positions
        p - window + 1 .. p only (such a layer keeps every token, so slot s holds position s).
    """

    num_kv_heads: int
    num_q_heads: int
    heads_per_group: int
    kv_head: torch.Tensor
    head_valid: torch.Tensor
    group_size: torch.Tensor
    q_head: torch.Tensor
    row_valid: torch.Tensor
    q_row: torch.Tensor
    group_of_head: torch.Tensor
    slot_of_head: torch.Tensor
    group_budget: np.ndarray | None = None
    k_scale: float = 1.0
    v_scale: float = 1.0
    window: int = 0

    @property
    def num_groups(self) -> int:
        return int(self.kv_head.shape[0])

    @property
    def gqa(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def rows_per_group(self) -> int:
        return self.heads_per_group * self.gqa

    def to(self, device) -> "LayerMeta":
        """The same tables on another device."""
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **moved)


def build_layer_meta(groups: list[list[int]], *, num_q_heads: int, num_kv_heads: int,
                     heads_per_group: int, group_budget=None, device="cpu") -> LayerMeta:
    """Index tables of one layer. groups: [G] lists of KV head ids (a partition of range(H))."""
    _check_groups(groups, num_q_heads, num_kv_heads, heads_per_group)
    gqa = num_q_heads // num_kv_heads
    num_g = len(groups)
    kv_head = np.zeros((num_g, heads_per_group), dtype=np.int64)
    valid = np.zeros((num_g, heads_per_group), dtype=bool)
    group_of_head = np.zeros(num_kv_heads, dtype=np.int64)
    slot_of_head = np.zeros(num_kv_heads, dtype=np.int64)
    for g, heads in enumerate(groups):
        for p, h in enumerate(heads):
            kv_head[g, p], valid[g, p] = h, True
            group_of_head[h], slot_of_head[h] = g, p
    j = np.arange(gqa)
    q_head = np.where(valid[:, :, None], kv_head[:, :, None] * gqa + j, 0).reshape(num_g, -1)
    row_valid = np.repeat(valid, gqa, axis=1)
    rows = heads_per_group * gqa
    q_row = (group_of_head * rows + slot_of_head * gqa)[:, None] + j
    as_t = lambda a, dt=torch.int64: torch.as_tensor(a, dtype=dt, device=device)  # noqa: E731
    return LayerMeta(
        num_kv_heads=num_kv_heads, num_q_heads=num_q_heads, heads_per_group=heads_per_group,
        kv_head=as_t(kv_head), head_valid=as_t(valid, torch.bool),
        group_size=as_t(valid.sum(axis=1), torch.int32), q_head=as_t(q_head),
        row_valid=as_t(row_valid, torch.bool), q_row=as_t(q_row.reshape(-1)),
        group_of_head=as_t(group_of_head), slot_of_head=as_t(slot_of_head),
        group_budget=None if group_budget is None else np.asarray(group_budget, dtype=np.float64),
    )


def build_layer_metas(entry, *, num_q_heads: int, num_kv_heads: int, heads_per_group: int,
                      device="cpu", kv_scales=None, windows=None) -> list[LayerMeta]:
    """One LayerMeta per layer of a profile RatioEntry (groups and group budgets); kv_scales:
    per layer (k_scale, v_scale) of quantized pages, None for 1.0 everywhere; windows: per layer
    (ModelShape.windows), None for full attention everywhere."""
    scales = kv_scales or [(1.0, 1.0)] * len(entry.groups)
    windows = windows or [0] * len(entry.groups)
    return [
        dataclasses.replace(
            build_layer_meta(entry.groups[layer], num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                             heads_per_group=heads_per_group, group_budget=entry.group_budget[layer],
                             device=device),
            k_scale=float(scales[layer][0]), v_scale=float(scales[layer][1]), window=int(windows[layer]))
        for layer in range(len(entry.groups))
    ]


def _check_groups(groups, num_q_heads: int, num_kv_heads: int, heads_per_group: int) -> None:
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    flat = sorted(h for g in groups for h in g)
    if flat != list(range(num_kv_heads)):
        raise ValueError(f"groups {groups} are not a partition of the {num_kv_heads} KV heads")
    if any(len(g) > heads_per_group for g in groups):
        raise ValueError(f"a group of {groups} has more than heads_per_group={heads_per_group} heads")
