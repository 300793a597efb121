"""Triton decode kernel against the torch reference and the dense oracle.

Without a GPU the kernels run under TRITON_INTERPRET=1 (small shapes only).
"""

import importlib
import math
import os
import sys

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
import triton  # noqa: E402,F401  (a pinned dependency: missing, these tests fail)

from tangram_sglang.attention import make_split_row, ragged_decode_torch  # noqa: E402
from tangram_sglang.attention.dense import dense_decode  # noqa: E402
from tangram_sglang.attention.testing import make_ragged_cache  # noqa: E402

if "tangram_sglang.attention.triton_decode" in sys.modules:  # decorated before the env was set
    importlib.reload(sys.modules["tangram_sglang.attention.triton_decode"])
from tangram_sglang.attention.triton_decode import ragged_decode_triton  # noqa: E402

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _to(cache, device):
    for name in ("k_pages", "v_pages", "block_table", "seq_lens"):
        setattr(cache, name, getattr(cache, name).to(device))
    return cache


KV_STORAGE = {"model": {}, "fp8_e4m3": {"kv_dtype": torch.float8_e4m3fn, "kv_scales": (0.5, 2.0)},
              "fp8_e5m2": {"kv_dtype": torch.float8_e5m2}}


@pytest.mark.parametrize("h,gqa,hp", [(4, 1, 1), (4, 3, 2), (5, 2, 4), (3, 1, 2)])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("batch,max_len", [(2, 17), (1, 54)])
@pytest.mark.parametrize("storage", ["model", "fp8_e4m3"])
def test_triton_decode_matches_reference(h, gqa, hp, page_size, batch, max_len, storage):
    num_g = math.ceil(h / hp)
    rng = np.random.default_rng(h * 31 + page_size + max_len)
    lens = rng.integers(0, max_len + 1, size=(batch, num_g))
    lens.flat[0] = 0
    if lens.size > 1:
        lens.flat[1] = 1
    cache = make_ragged_cache(lens, num_kv_heads=h, gqa=gqa, heads_per_group=hp, head_dim=16,
                              page_size=page_size, seed=int(lens.sum()), **KV_STORAGE[storage])
    q = torch.randn(batch, h * gqa, 16)
    split = make_split_row(rng.integers(1, 5, size=num_g))
    want = dense_decode(q, cache.k_full, cache.v_full, cache.keep, 0.25)
    ref, ref_lse = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                                       cache.meta, split, 0.25, return_lse=True)
    cache, meta, split = _to(cache, DEVICE), cache.meta.to(DEVICE), split.to(DEVICE)
    out, lse = ragged_decode_triton(q.to(DEVICE), cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                                    meta, split, 0.25, block_n=16, return_lse=True)
    torch.testing.assert_close(out.cpu(), want, atol=3e-5, rtol=1e-4)
    torch.testing.assert_close(out.cpu(), ref, atol=3e-5, rtol=1e-4)
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=3e-5, rtol=1e-4)



def test_triton_decode_odd_head_dim_and_many_splits():
    lens = np.array([[54, 0, 3], [1, 17, 9]])
    cache = make_ragged_cache(lens, num_kv_heads=6, gqa=3, heads_per_group=2, head_dim=24, page_size=4, seed=9)
    q = torch.randn(2, 18, 24)
    split = make_split_row([7, 1, 60])  # more splits than slots: empty pieces
    want = dense_decode(q, cache.k_full, cache.v_full, cache.keep, 0.2)
    cache = _to(cache, DEVICE)
    out = ragged_decode_triton(q.to(DEVICE), cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                               cache.meta.to(DEVICE), split.to(DEVICE), 0.2, block_n=16)
    torch.testing.assert_close(out.cpu(), want, atol=3e-5, rtol=1e-4)


def scatter_rows(block_table, rows, num_rows):
    """The batch's tables placed at rows of a larger [R, G, W] table (garbage elsewhere)."""
    full = torch.randint(0, 3, (num_rows, *block_table.shape[1:]), dtype=block_table.dtype)
    full[rows] = block_table
    return full


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_decode_reads_the_batch_rows_of_a_larger_table(impl):
    """rows: entry b reads row rows[b] of every request row's table (the served decode path)."""
    lens = np.array([[17, 0, 5], [1, 54, 9], [3, 3, 0]])
    cache = make_ragged_cache(lens, num_kv_heads=6, gqa=2, heads_per_group=2, head_dim=16, page_size=4, seed=4)
    q = torch.randn(3, 12, 16)
    split = make_split_row([2, 1, 3])
    want = dense_decode(q, cache.k_full, cache.v_full, cache.keep, 0.25)
    rows = torch.tensor([5, 0, 3])
    full = scatter_rows(cache.block_table, rows, 7)
    if impl == "torch":
        out = ragged_decode_torch(q, cache.k_pages, cache.v_pages, full, cache.seq_lens, cache.meta, split, 0.25,
                                  tile=8, rows=rows)
    else:
        cache = _to(cache, DEVICE)
        out = ragged_decode_triton(q.to(DEVICE), cache.k_pages, cache.v_pages, full.to(DEVICE), cache.seq_lens,
                                   cache.meta.to(DEVICE), split.to(DEVICE), 0.25, block_n=16, rows=rows.to(DEVICE))
    torch.testing.assert_close(out.cpu(), want, atol=3e-5, rtol=1e-4)


def test_triton_decode_reads_fp8_e5m2_pages():
    cache = make_ragged_cache(np.array([[0, 1], [33, 9]]), num_kv_heads=4, gqa=2, heads_per_group=2, head_dim=16,
                              page_size=16, seed=5, **KV_STORAGE["fp8_e5m2"])
    q = torch.randn(2, 8, 16)
    split = make_split_row([3, 1])
    want = dense_decode(q, cache.k_full, cache.v_full, cache.keep, 0.25)
    cache, meta, split = _to(cache, DEVICE), cache.meta.to(DEVICE), split.to(DEVICE)
    out = ragged_decode_triton(q.to(DEVICE), cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                               meta, split, 0.25, block_n=16)
    torch.testing.assert_close(out.cpu(), want, atol=3e-5, rtol=1e-4)


@pytest.mark.parametrize("window", [1, 6, 40])
@pytest.mark.parametrize("hp", [1, 2])
def test_triton_decode_reads_the_window(window, hp):
    """A sliding-window layer (every position kept, slot = position): the kernel reads the newest
    window slots of each (b, g), as the reference does."""
    import dataclasses

    hist = np.array([1, 9, 33])
    lens = np.repeat(hist[:, None], math.ceil(4 / hp), axis=1)
    cache = make_ragged_cache(lens, num_kv_heads=4, gqa=2, heads_per_group=hp, head_dim=16, page_size=4,
                              extra_hist=0, seed=window)
    meta = dataclasses.replace(cache.meta, window=window)
    q = torch.randn(len(hist), 8, 16)
    split = make_split_row([3] * meta.num_groups)
    ref = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens, meta, split, 0.25)
    full = ragged_decode_torch(q, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens, cache.meta,
                               split, 0.25)
    assert window >= 33 or not torch.allclose(ref, full)   # the window changes the answer
    cache = _to(cache, DEVICE)
    out = ragged_decode_triton(q.to(DEVICE), cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                               meta.to(DEVICE), split.to(DEVICE), 0.25)
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("window", [1, 6, 40])
def test_triton_decode_ahead_matches_the_reference(window):
    """ahead (a window layer's chunk tokens): the kernel starts each row's cut at its query's window, as
    the reference does, including rows whose window has passed every cached slot."""
    import dataclasses

    hist = np.array([1, 9, 33, 33])
    cache = make_ragged_cache(np.repeat(hist[:, None], 2, axis=1), num_kv_heads=4, gqa=2, heads_per_group=2,
                              head_dim=16, page_size=4, extra_hist=0, seed=window)
    meta = dataclasses.replace(cache.meta, window=window)
    q, ahead = torch.randn(len(hist), 8, 16), torch.tensor([2, 1, 5, 45])
    split = make_split_row([3, 2])
    args = (cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens)
    ref, ref_lse = ragged_decode_torch(q, *args, meta, split, 0.25, return_lse=True, ahead=ahead)
    plain = ragged_decode_torch(q, *args, meta, split, 0.25)
    assert window >= 40 or not torch.allclose(ref, plain)   # ahead moves the window
    cache = _to(cache, DEVICE)
    out, lse = ragged_decode_triton(q.to(DEVICE), cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                                    meta.to(DEVICE), split.to(DEVICE), 0.25, return_lse=True, ahead=ahead.to(DEVICE))
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=2e-5, rtol=1e-4)
