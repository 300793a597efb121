"""Sliding-window layers (meta.window = W; every token kept, slot s = position s): decode and chunk
prefill on the torch data plane against a dense oracle whose mask is the window itself."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from tangram_sglang.attention import make_split_row, ragged_decode_torch, ragged_prefill_chunk_torch
from tangram_sglang.attention.dense import _masked_attention
from tangram_sglang.attention.pieces import window_start
from tangram_sglang.attention.testing import make_ragged_cache


def _full_cache(hist, shape, window, page_size, seed):
    """Every group of request b holds all hist[b] positions in order (a window layer's slots)."""
    h, gqa, hp = shape
    lens = np.repeat(np.asarray(hist)[:, None], math.ceil(h / hp), axis=1)
    cache = make_ragged_cache(lens, num_kv_heads=h, gqa=gqa, heads_per_group=hp, head_dim=16,
                              page_size=page_size, extra_hist=0, seed=seed)
    return dataclasses.replace(cache, meta=dataclasses.replace(cache.meta, window=window))


def _window_mask(query_pos: int, num_keys: int, num_kv: int, window: int) -> torch.Tensor:
    """bool [H, num_keys]: keys query_pos - window + 1 .. query_pos."""
    pos = torch.arange(num_keys)
    return ((pos <= query_pos) & (pos > query_pos - window))[None].expand(num_kv, -1)


def test_window_start():
    assert window_start(torch.tensor([0, 3, 4, 10]), 4).tolist() == [0, 0, 1, 7]


@pytest.mark.parametrize("shape", [(4, 1, 1), (4, 3, 2), (3, 2, 2)])
@pytest.mark.parametrize("window", [1, 5, 24, 1000])
@pytest.mark.parametrize("tile", [None, 4, 256])
def test_decode_reads_the_window(shape, window, tile):
    hist = [1, 7, 30, 61]
    cache = _full_cache(hist, shape, window, page_size=4, seed=window)
    q = torch.randn(len(hist), shape[0] * shape[1], 16)
    split = make_split_row(np.arange(1, cache.meta.num_groups + 1) * 3)
    out = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                              cache.meta, split, 0.3, tile=tile)
    want = torch.stack([
        _masked_attention(q[b:b + 1], cache.k_full[b, :n], cache.v_full[b, :n],
                          _window_mask(n - 1, n, shape[0], window)[None], 0.3)[0] for b, n in enumerate(hist)])
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [(4, 1, 1), (4, 3, 2)])
@pytest.mark.parametrize("window", [1, 6, 24])
@pytest.mark.parametrize("hist,chunks", [([0, 40], [30, 9]), ([13, 2, 70], [1, 40, 5])])
def test_prefill_reads_the_window(shape, window, hist, chunks):
    """Chunk query i at position c + i reads cached and chunk keys c + i - W + 1 .. c + i."""
    h, gqa, _ = shape
    cache = _full_cache(hist, shape, window, page_size=16, seed=sum(hist) + window)
    cu = [0, *np.cumsum(chunks).tolist()]
    q, k, v = torch.randn(cu[-1], h * gqa, 16), torch.randn(cu[-1], h, 16), torch.randn(cu[-1], h, 16)
    out = ragged_prefill_chunk_torch(q, k, v, torch.tensor(cu, dtype=torch.int32), cache.k_pages, cache.v_pages,
                                     cache.block_table, cache.seq_lens, cache.meta, 0.3, tile=8, fused=True)
    want = []
    for b, c in enumerate(hist):
        keys = torch.cat([cache.k_full[b, :c], k[cu[b]:cu[b + 1]]])
        vals = torch.cat([cache.v_full[b, :c], v[cu[b]:cu[b + 1]]])
        mask = torch.stack([_window_mask(c + i, len(keys), h, window) for i in range(chunks[b])])
        want.append(_masked_attention(q[cu[b]:cu[b + 1]], keys, vals, mask, 0.3))
    torch.testing.assert_close(out, torch.cat(want), atol=3e-5, rtol=1e-4)


@pytest.mark.parametrize("window", [1, 5, 24])
@pytest.mark.parametrize("tile", [None, 4])
def test_decode_ahead_reads_a_later_window_of_the_cache(window, tile):
    """ahead[b] = a: the query stands at position n - 1 + a and reads the cached slots of its own window
    (none once the window has passed them): the cached part of a window layer's chunk token."""
    shape, hist, ahead = (4, 2, 2), [1, 7, 30, 61], [3, 1, 30, 10]
    cache = _full_cache(hist, shape, window, page_size=4, seed=window + 1)
    q = torch.randn(len(hist), shape[0] * shape[1], 16)
    split = make_split_row([2, 3])
    o, lse = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens, cache.meta,
                                 split, 0.3, tile=tile, return_lse=True, ahead=torch.tensor(ahead))
    for b, (n, a) in enumerate(zip(hist, ahead)):
        mask = _window_mask(n - 1 + a, n, shape[0], window)
        if not mask.any():   # nothing of the cache in the window: an empty part of the merge
            assert torch.all(lse[b] == float("-inf")) and torch.all(o[b] == 0)
            continue
        want = _masked_attention(q[b:b + 1], cache.k_full[b, :n], cache.v_full[b, :n], mask[None], 0.3)[0]
        torch.testing.assert_close(o[b], want, atol=2e-5, rtol=1e-4)
