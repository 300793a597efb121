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
attention backend takes (out_loc).
"""

from __future__ import annotations

import numpy as np

from tangram_sglang.pool.request_pages import RequestPages, div_mod, ragged_index


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


def chunk_slots_reference(writes) -> list[np.ndarray]:
    """The flat slots each layer writes for a batch's chunks (ChunkWrite per request): per layer
    int64 [sum over (b, g) of counts[b, l, g]], in (b, g, j) order. O(slots written), no per-page
    expansion. DeviceBlockTables.chunk_slots computes the same from the device tables.

    Example, P=2, B=1, L=1, G=2: pages [[[7, 3], [9, -1]]], offset [[1, 0]], counts [[3, 1]]
    -> [[15, 6, 7, 18]]."""
    counts = np.stack([w.counts for w in writes]).astype(np.int64)          # [B, L, G]
    offset = np.stack([w.offset for w in writes]).astype(np.int64)
    B, L, G = counts.shape
    P = writes[0].page_size
    pages = np.full((B, L, G, max(w.pages.shape[-1] for w in writes)), -1, np.int64)
    for i, w in enumerate(writes):
        pages[i, ..., : w.pages.shape[-1]] = w.pages
    order = counts.transpose(1, 0, 2)                                     # [L, B, G]: per layer, (b, g, j)
    run, j = ragged_index(order.reshape(-1))
    layer, rest = div_mod(run, B * G)
    b, g = rest // G, rest % G
    col, off = div_mod(offset[b, layer, g] + j, P)
    flat = pages[b, layer, g, col] * P + off
    return np.split(flat, np.cumsum(order.reshape(L, -1).sum(1))[:-1])
