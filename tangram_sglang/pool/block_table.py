"""Batch views of the ragged block table, for the attention data plane.

Per request the table is a RequestPages ([V, capacity] page ids, lens [V]).
A batch of B requests becomes dense arrays, vectorized over V = L * G:

    block_table  int32 [B, L, G, W]   page ids, W = max pages of any (b, v);
                                      padded with page 0 (a valid id, never read
                                      when reads stop at seq_lens)
    seq_lens     int32 [B, L, G]      slots per (b, l, g)

Worked example, P=2, B=1, L=1, G=2, pages [[7, 3], [9]], lens [3, 1]:
    block_table [[[[7, 3], [9, 0]]]], seq_lens [[[3, 1]]]
    slot 2 of g=0 -> page block_table[0, 0, 0, 2 // 2] = 3, offset 0 -> flat 6.

Prefill writes come as ChunkWrite per request (slot_locs [L, G, max_k], -1
padded); stack_chunk_writes pads them to one [B, L, G, K] array, and
chunk_slots_reference lists the flat slots each layer writes, the form the
attention backend takes (out_loc); chunk_slots_host gives the same from the native loop.
"""

from __future__ import annotations

import numpy as np

from tangram_sglang.pool import native
from tangram_sglang.pool.records import ChunkWrites
from tangram_sglang.pool.request_pages import RequestPages, ragged_index


def build_layer_tables(rows: list[RequestPages], num_layers: int, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    width = max([int(r.npages.max(initial=0)) for r in rows] + [1])
    table = np.zeros((len(rows), num_layers * num_groups, width), dtype=np.int32)
    lens = np.zeros((len(rows), num_layers * num_groups), dtype=np.int32)
    for i, r in enumerate(rows):
        w = min(width, r.pages.shape[1])
        table[i, :, :w] = np.maximum(r.pages[:, :w], 0)
        lens[i] = r.lens
    return table.reshape(len(rows), num_layers, num_groups, width), lens.reshape(len(rows), num_layers, num_groups)


def stack_chunk_writes(writes) -> tuple[np.ndarray, np.ndarray]:
    """ChunkWrite list -> (slot_locs int64 [B, L, G, K] -1 padded, counts int64 [B, L, G])."""
    k = max([w.slot_locs.shape[-1] for w in writes] + [0])
    L, G = writes[0].counts.shape
    locs = np.full((len(writes), L, G, k), -1, dtype=np.int64)
    for i, w in enumerate(writes):
        locs[i, :, :, : w.slot_locs.shape[-1]] = w.slot_locs
    return locs, np.stack([w.counts for w in writes])


def chunk_slots_host(writes) -> list[np.ndarray]:
    """chunk_slots_reference's answer, from the native loop where it is built (pool/native.py)."""
    if native.enabled() and isinstance(writes, ChunkWrites):
        return native.chunk_slots(writes.pages, writes.offset, writes.counts, writes.page_size)
    return chunk_slots_reference(writes)


def chunk_slots_reference(writes) -> list[np.ndarray]:
    """The flat slots each layer writes for a batch's chunks (ChunkWrites, or a list of one
    ChunkWrite per request): per layer int64 [sum over (b, g) of counts[b, l, g]], in (b, g, j)
    order. DeviceBlockTables.chunk_slots computes the same from the device tables.

    A run's slots are consecutive within each page, so the work is one piece per page touched
    (page id and where the piece starts) and one pass over the slots (repeat + arange), no
    per-slot division or gather.

    Example, P=2, B=1, L=1, G=2: pages [[[7, 3], [9, -1]]], offset [[1, 0]], counts [[3, 1]]
    -> [[15, 6, 7, 18]]."""
    if isinstance(writes, ChunkWrites):
        counts, offset, stacked = writes.counts, writes.offset, writes.pages          # [B, L, G(, W)]
        P = writes.page_size
    else:
        counts, offset = np.stack([w.counts for w in writes]), np.stack([w.offset for w in writes])
        P = writes[0].page_size
        stacked = np.zeros((*counts.shape, max(w.pages.shape[-1] for w in writes)), np.int32)
        for i, w in enumerate(writes):
            stacked[i, :, :, : w.pages.shape[-1]] = w.pages
    counts = counts.astype(np.int64).transpose(1, 0, 2)                              # [L, B, G]
    offset = offset.astype(np.int64).transpose(1, 0, 2)
    L, B, G = counts.shape
    pages = stacked.astype(np.int64).transpose(1, 0, 2, 3)
    c, o, pages = counts.reshape(-1), offset.reshape(-1), pages.reshape(L * B * G, -1)
    run, k = ragged_index(np.where(c > 0, -(-(o + c) // P), 0))             # one piece per page touched
    lo = np.maximum(k * P - o[run], 0)                                      # the piece's slots [lo, hi) of its run
    hi = np.minimum((k + 1) * P - o[run], c[run])
    first = pages[run, k] * P + np.where(k == 0, o[run], 0)                 # flat id of the piece's first slot
    length = hi - lo
    starts = np.cumsum(length) - length
    flat = np.repeat(first - starts, length) + np.arange(int(length.sum()))
    return np.split(flat, np.cumsum(counts.reshape(L, -1).sum(1))[:-1])
