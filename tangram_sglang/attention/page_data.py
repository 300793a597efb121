"""KVPageData: the K and V page tensors of the whole pool, on the serving device.

    k_pages, v_pages: [num_pages + 1, P, H_p, d] (spec.dtype), one pair for all virtual layers.

Page ``scratch_page`` (= num_pages, the last) is never handed out by the pool:
padded entries of a CUDA-graph decode batch write their K/V there and nothing
reads it.

Head slot p of a page of virtual layer (l, g) holds KV head groups[l][g][p]; a
group with fewer than H_p heads leaves its trailing head slots unused. A flat
slot id (what RaggedKVCache returns) is page * P + offset, an index into
``k_pages.view(-1, H_p, d)``.
"""

from __future__ import annotations

import numpy as np
import torch

from tangram_sglang.pool.spec import PoolSpec


class KVPageData:
    def __init__(self, spec: PoolSpec, device: str | torch.device = "cpu"):
        shape = (spec.num_pages + 1, spec.page_size, spec.heads_per_group, spec.head_dim)
        dtype = getattr(torch, spec.dtype)
        self.spec = spec
        self.scratch_page = spec.num_pages
        self.k_pages = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pages = torch.zeros(shape, dtype=dtype, device=device)

    def _flat(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(-1, self.spec.heads_per_group, self.spec.head_dim)

    def write(self, slot_locs, k: torch.Tensor, v: torch.Tensor) -> None:
        """slot_locs int [N] flat slot ids (no -1); k, v [N, H_p, d]."""
        idx = torch.as_tensor(np.asarray(slot_locs), dtype=torch.int64, device=self.k_pages.device)
        self._flat(self.k_pages)[idx] = k.to(self.k_pages.dtype)
        self._flat(self.v_pages)[idx] = v.to(self.v_pages.dtype)

    def read(self, slot_locs) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(np.asarray(slot_locs), dtype=torch.int64, device=self.k_pages.device)
        return self._flat(self.k_pages)[idx], self._flat(self.v_pages)[idx]

    def copy_pages(self, src, dst) -> None:
        """Copy whole pages src[i] -> dst[i] (Admission.copy_src / copy_dst); one op for all of them."""
        if len(src) == 0:
            return
        s = torch.as_tensor(np.asarray(src), dtype=torch.int64, device=self.k_pages.device)
        d = torch.as_tensor(np.asarray(dst), dtype=torch.int64, device=self.k_pages.device)
        self.k_pages[d] = self.k_pages[s]
        self.v_pages[d] = self.v_pages[s]
