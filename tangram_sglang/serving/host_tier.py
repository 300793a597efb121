"""HostTier: the compressed host tier of one serving process (``--tangram-host-ratio R``).

The radix tree's segments evicted for device room (admission, decode, a load) are copied here
whole, still compressed, instead of being dropped; a later match that reaches one loads it back
into fresh device pages before the request is admitted, so its turn prefills only its new tokens.
The host holds R times the device pool's pages (every page the same size), so at a ratio that
keeps 40% of the tokens a host GB holds 2.5x the sessions a full-KV host tier would.

Owners: HostPages (pool/host_pages.py) the host pages' integers; here the host K/V tensors
[num_pages, P, H_p, d] (pinned on CUDA) and the copies. Copies are synchronous: on a CPU both
tiers are RAM; on a GPU an offload first waits for the device (a forward on another stream may still
be writing pages of the segment's chain) and a load's copy completes before the request's first prefill.
"""

from __future__ import annotations

import numpy as np
import torch

from tangram_sglang.attention.page_data import KVPageData
from tangram_sglang.pool import RaggedKVCache
from tangram_sglang.pool.host_pages import HostPages, HostSegment
from tangram_sglang.pool.segments import Segment


class HostTier:
    def __init__(self, num_pages: int, data: KVPageData):
        self.pages = HostPages(num_pages)
        self.data = data
        pin = data.k_pages.device.type == "cuda"
        shape = (num_pages,) + tuple(data.k_pages.shape[1:])
        self.k = torch.zeros(shape, dtype=data.k_pages.dtype, pin_memory=pin)
        self.v = torch.zeros(shape, dtype=data.v_pages.dtype, pin_memory=pin)

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def offload(self, seg: Segment) -> HostSegment | None:
        """Copy a device segment's pages to host pages; None (nothing copied) when the host lacks room.
        The caller drops the device segment after."""
        if np.any(seg.page_ids < 0):  # dead window columns: never kept here (refused at launch)
            return None
        host_ids = self.pages.take(seg.num_pages)
        if host_ids is None:
            return None
        src = torch.as_tensor(seg.page_ids.astype(np.int64), device=self.data.k_pages.device)
        dst = torch.from_numpy(host_ids.astype(np.int64))
        if src.device.type == "cuda":   # a forward on another stream (overlap scheduling) may still write them
            torch.cuda.synchronize(src.device)
        self.k[dst] = self.data.k_pages[src].to("cpu")
        self.v[dst] = self.data.v_pages[src].to("cpu")
        return self.pages.keep(seg, host_ids)

    def load(self, hseg: HostSegment, cache: RaggedKVCache) -> Segment | None:
        """Copy a host segment into fresh device pages and register it as a device segment (the
        host copy released); None (nothing changed) when the pool has fewer available pages."""
        n = hseg.num_pages
        if n > cache.pool.available:
            return None
        dev_ids = cache.pool.take(n)
        src = torch.from_numpy(hseg.page_ids.astype(np.int64))
        dst = torch.as_tensor(dev_ids.astype(np.int64), device=self.data.k_pages.device)
        self.data.k_pages[dst] = self.k[src].to(self.data.k_pages.device)
        self.data.v_pages[dst] = self.v[src].to(self.data.v_pages.device)
        seg = cache.store.add(num_tokens=hseg.num_tokens, compressed=hseg.compressed, start=hseg.start_slots,
                              end=hseg.end_slots, page_counts=hseg.page_counts, page_ids=dev_ids,
                              protected=hseg.protected)
        cache.pool.decref(dev_ids)   # the segment's reference is now the only one
        self.pages.release(hseg)
        return seg
