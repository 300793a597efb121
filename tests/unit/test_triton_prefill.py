"""Triton chunk prefill against the torch reference and the dense oracle (TRITON_INTERPRET=1 on CPU)."""

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

from tangram_sglang.attention import make_split_row, ragged_prefill_chunk_torch  # noqa: E402
from tangram_sglang.attention.testing import make_ragged_cache  # noqa: E402

for _mod in ("tangram_sglang.attention.triton_decode", "tangram_sglang.attention.triton_prefill"):
    if _mod in sys.modules:  # decorated before the env was set
        importlib.reload(sys.modules[_mod])
from test_attention_prefill import _dense  # noqa: E402

from tangram_sglang.attention.triton_prefill import ragged_prefill_chunk_triton  # noqa: E402

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


SHAPES = [((4, 1, 1), 1), ((4, 3, 2), 16), ((5, 2, 4), 1), ((2, 2, 1), 16), ((3, 1, 2), 4)]  # ((H, gqa, H_p), P)
CHUNKS = [([17], 54), ([1, 5, 17], 17), ([3, 0, 1], 1), ([54, 2], 0)]  # (chunk lengths, longest history)
DTYPES = [pytest.param(None, id="model"), pytest.param(torch.float8_e4m3fn, id="fp8_e4m3")]


def _kept(i: int, j: int, k: int) -> bool:
    """Case (i, j, k) of a three-factor grid runs here: all on a GPU; on the CPU interpreter one k per (i, j),
    alternating, so every pair of factors still meets (a covering design of strength 2 for two k values)."""
    return DEVICE == "cuda" or k == (i + j) % 2


def _cases():
    """On a GPU every (shape, chunks, dtype); in the CPU interpreter (about 20 s a case) every pair of
    shape and chunks once, the dtype alternating so each shape and each chunk list meets both dtypes."""
    for i, (shape, page_size) in enumerate(SHAPES):
        for j, (chunk_lens, max_len) in enumerate(CHUNKS):
            for k, dtype in enumerate(DTYPES):
                if _kept(i, j, k):
                    yield pytest.param(shape, page_size, chunk_lens, max_len, *dtype.values, id=f"{i}-{j}-{dtype.id}")


@pytest.mark.parametrize("shape,page_size,chunk_lens,max_len,kv_dtype", list(_cases()))
def test_triton_prefill_matches_reference_and_dense(shape, page_size, chunk_lens, max_len, kv_dtype):
    h, gqa, hp = shape
    num_g, batch, d = math.ceil(h / hp), len(chunk_lens), 16
    rng = np.random.default_rng(len(chunk_lens) * 7 + max_len + page_size)
    lens = rng.integers(0, max_len + 1, size=(batch, num_g))
    lens.flat[0] = 0
    if lens.size > 1:
        lens.flat[1] = min(1, max_len)
    cache = make_ragged_cache(lens, num_kv_heads=h, gqa=gqa, heads_per_group=hp, head_dim=d,
                              page_size=page_size, seed=int(lens.sum()), kv_dtype=kv_dtype,
                              kv_scales=(2.0, 0.5) if kv_dtype else (1.0, 1.0))
    cu = torch.tensor([0, *np.cumsum(chunk_lens).tolist()], dtype=torch.int32)
    total = int(cu[-1])
    q, k = torch.randn(total, h * gqa, d), torch.randn(total, h, d)
    v = torch.randn(total, h * gqa + 2 * h, d)[:, h * gqa + h:]  # a view of a fused qkv, as SGLang's v
    ref = ragged_prefill_chunk_torch(q, k, v, cu, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens,
                                     cache.meta, 0.25)
    split = make_split_row(rng.integers(1, 4, size=num_g))
    dev = lambda x: x if DEVICE == "cpu" else x.to(DEVICE)  # noqa: E731 - keeps v's strides on CPU
    out = ragged_prefill_chunk_triton(dev(q), dev(k), dev(v), dev(cu), dev(cache.k_pages), dev(cache.v_pages),
                                      dev(cache.block_table), dev(cache.seq_lens), cache.meta.to(DEVICE), 0.25,
                                      split=split.to(DEVICE), block_n=16)
    torch.testing.assert_close(out.cpu(), ref, atol=3e-5, rtol=1e-4)
    torch.testing.assert_close(out.cpu(), _dense(cache, q, k, v, cu.tolist(), 0.25), atol=3e-5, rtol=1e-4)


def test_triton_prefill_lse_gives_the_sinks_of_the_reference():
    """return_lse: the Triton chunk prefill's (o, lse) give gpt-oss's sinks (add_sinks) as the torch reference's do."""
    from tangram_sglang.attention.merge import add_sinks

    h, gqa, hp, d = 4, 2, 2, 16
    cache = make_ragged_cache(np.array([[9, 0], [3, 12]]), num_kv_heads=h, gqa=gqa, heads_per_group=hp, head_dim=d,
                              page_size=4, seed=5)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = torch.randn(12, h * gqa, d), torch.randn(12, h, d), torch.randn(12, h, d)
    sinks = torch.randn(h * gqa)
    args = (q, k, v, cu, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens)
    ref = add_sinks(*ragged_prefill_chunk_torch(*args, cache.meta, 0.25, return_lse=True), sinks)
    dev = lambda x: x if DEVICE == "cpu" else x.to(DEVICE)  # noqa: E731
    o, lse = ragged_prefill_chunk_triton(*map(dev, args), cache.meta.to(DEVICE), 0.25,
                                         split=make_split_row([2, 1]).to(DEVICE), block_n=16, return_lse=True)
    torch.testing.assert_close(add_sinks(o, lse, dev(sinks)).cpu(), ref, atol=3e-5, rtol=1e-4)


def _window_cases():
    """Every window with every history; on the CPU the shape alternating so each meets every window and history."""
    shapes, histories = [(4, 1, 1), (4, 3, 2)], [([0, 40], [30, 9]), ([13, 2, 70], [1, 40, 5])]
    for i, window in enumerate([1, 6, 24]):
        for j, (hist, chunks) in enumerate(histories):
            for k, shape in enumerate(shapes):
                if _kept(i, j, k):
                    yield pytest.param(shape, window, hist, chunks, id=f"H{shape[0]}gqa{shape[1]}-W{window}-{j}")


@pytest.mark.parametrize("shape,window,hist,chunks", list(_window_cases()))
def test_triton_prefill_reads_the_window(shape, window, hist, chunks):
    """A sliding-window layer: chunk query i at position c + i reads cached and chunk keys
    c + i - W + 1 .. c + i, as the torch reference's masks and a dense window mask do."""
    from test_attention_window import _full_cache, _window_mask

    from tangram_sglang.attention.dense import _masked_attention

    h, gqa, _ = shape
    cache = _full_cache(hist, shape, window, page_size=16, seed=sum(hist) + window)
    cu = torch.tensor([0, *np.cumsum(chunks).tolist()], dtype=torch.int32)
    q, k, v = torch.randn(int(cu[-1]), h * gqa, 16), torch.randn(int(cu[-1]), h, 16), torch.randn(int(cu[-1]), h, 16)
    args = (q, k, v, cu, cache.k_pages, cache.v_pages, cache.block_table, cache.seq_lens)
    ref = ragged_prefill_chunk_torch(*args, cache.meta, 0.3)
    dev = lambda x: x if DEVICE == "cpu" else x.to(DEVICE)  # noqa: E731
    out = ragged_prefill_chunk_triton(*map(dev, args), cache.meta.to(DEVICE), 0.3,
                                      split=make_split_row([3] * cache.meta.num_groups).to(DEVICE), block_n=16)
    torch.testing.assert_close(out.cpu(), ref, atol=3e-5, rtol=1e-4)
    b, c = len(hist) - 1, hist[-1]   # the last request against a dense mask of its window
    keys, vals = torch.cat([cache.k_full[b, :c], k[cu[b]:]]), torch.cat([cache.v_full[b, :c], v[cu[b]:]])
    mask = torch.stack([_window_mask(c + i, len(keys), h, window) for i in range(chunks[b])])
    torch.testing.assert_close(out[cu[b]:].cpu(), _masked_attention(q[cu[b]:], keys, vals, mask, 0.3),
                               atol=3e-5, rtol=1e-4)
