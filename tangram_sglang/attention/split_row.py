"""One layer's row of the split map, expanded once into the decode grid.

Group g of the layer is split into S[g] pieces for every request: piece s of
request b covers slots [s * c, min((s + 1) * c, len)) with c = ceil(len / S[g])
and len = seq_lens[b, g] (pieces past the end are empty). A decode kernel
launches B x T CTAs, T = sum(S); CTA column t works on group cta_group[t],
piece cta_split[t]. The expansion depends only on the profile, so it is built
once per layer: the decode path does no planning.

Worked example: S = [3, 1, 2] -> T = 6, cta_group = [0, 0, 0, 1, 2, 2],
cta_split = [0, 1, 2, 0, 0, 1], cta_offset = [0, 3, 4].
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from tangram_sglang.method.split_map import DEFAULT_PARALLEL_CAPACITY


@dataclass(frozen=True, kw_only=True)
class SplitRow:
    """splits, cta_offset: int32 [G]; cta_group, cta_split: int32 [T]; T = sum(splits)."""

    splits: torch.Tensor
    cta_offset: torch.Tensor
    cta_group: torch.Tensor
    cta_split: torch.Tensor
    max_splits: int

    @property
    def num_ctas(self) -> int:
        """CTAs per request (T)."""
        return int(self.cta_group.shape[0])

    def to(self, device) -> "SplitRow":
        """The same tables on another device."""
        return dataclasses.replace(self, splits=self.splits.to(device), cta_offset=self.cta_offset.to(device),
                                   cta_group=self.cta_group.to(device), cta_split=self.cta_split.to(device))


def make_split_row(splits, device="cpu") -> SplitRow:
    """Expand S[l] (ints >= 1, one per group) into the decode grid tables."""
    s = np.asarray(splits, dtype=np.int64).reshape(-1)
    if s.size == 0 or (s < 1).any():
        raise ValueError(f"split factors must be >= 1 for every group, got {s.tolist()}")
    offset = np.concatenate([[0], np.cumsum(s)[:-1]])
    group = np.repeat(np.arange(s.size), s)
    split = np.arange(int(s.sum())) - np.repeat(offset, s)
    as_t = lambda a: torch.as_tensor(a, dtype=torch.int32, device=device)  # noqa: E731
    return SplitRow(splits=as_t(s), cta_offset=as_t(offset), cta_group=as_t(group),
                    cta_split=as_t(split), max_splits=int(s.max()))


def make_split_rows(split_map, device="cpu") -> list[SplitRow]:
    """One SplitRow per layer of a split map int [L, G]."""
    return [make_split_row(row, device) for row in np.asarray(split_map)]


def uniform_split_row(num_groups: int, num_splits: int, device="cpu") -> SplitRow:
    """FlashDecoding-style: the same num_splits for every group (the baseline)."""
    return make_split_row([num_splits] * num_groups, device)


def device_parallel_capacity(blocks_per_sm: int = 1) -> int:
    """CTAs the current GPU runs at once (SM count x resident blocks per SM).

    Falls back to DEFAULT_PARALLEL_CAPACITY without a GPU. The attention
    kernel's own occupancy (blocks_per_sm) is passed in by the kernel module.
    """
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(props.multi_processor_count) * blocks_per_sm
    return DEFAULT_PARALLEL_CAPACITY
