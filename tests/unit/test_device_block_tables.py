"""DeviceBlockTables against the host pool: after every load and decode step of random batches,
the device rows equal the host's pages and lens (``check``), the batch views equal the reference
``build_layer_tables`` of the host pages, and the decode write slots equal the slots computed
independently from the host pages (pool_driver.slots_from_pages)."""

import random

import numpy as np
import pytest
import torch

from tangram_sglang.pool import PoolSpec, RaggedKVCache, build_layer_tables
from tangram_sglang.serving.block_tables import DeviceBlockTables

from pool_driver import slots_from_pages


def _views_match(tables, cache, rids, rows):
    width = max(int(cache.requests[r].pages.npages.max(initial=0)) for r in rids)
    bt, sl = tables.view(rows, max(width, 1))
    host_bt, host_sl = build_layer_tables([cache.requests[r].pages for r in rids],
                                          cache.spec.num_layers, cache.spec.num_groups)  # [B, L, G, W], [B, L, G]
    assert np.array_equal(sl.permute(1, 0, 2).numpy(), host_sl)
    P = cache.spec.page_size
    used = -(-host_sl // P)
    dev = bt.permute(1, 0, 2, 3).numpy()
    cols = np.arange(host_bt.shape[-1])
    mask = cols[None, None, None, :] < used[..., None]
    assert np.array_equal(dev[..., : host_bt.shape[-1]][mask], host_bt[mask])


@pytest.mark.parametrize("page_size,seed", [(1, 0), (4, 1), (16, 2)])
def test_device_tables_follow_the_host_pool(page_size, seed):
    rng = random.Random(seed)
    L, G = 3, 2
    spec = PoolSpec(num_layers=L, num_groups=G, heads_per_group=1, head_dim=1, page_size=page_size, num_pages=4000)
    beta = np.array([[0.1, 1.0], [0.5, 0.3], [0.0, 0.8]])
    cache = RaggedKVCache(spec, beta)
    tables = DeviceBlockTables(L, G, page_size, "cpu", rows=2, width=1)  # both grow
    running: dict[str, int] = {}
    free_rows = list(range(20))
    count, steps = 0, 0
    for _ in range(400):
        x = rng.random()
        if (x < 0.2 or not running) and free_rows:
            count += 1
            rid = f"r{count}"
            chunks = [rng.randint(1, 40) for _ in range(rng.randint(1, 3))]
            if cache.admit(rid, chunk_tokens=chunks, decode_tokens=rng.randint(0, 20)) is None:
                continue
            for n in chunks:
                cache.prefill_chunk(rid, n)
            running[rid] = free_rows.pop(rng.randrange(len(free_rows)))
            tables.load([running[rid]], [rid], [cache.requests[rid].pages])
        elif x < 0.9:
            rids = rng.sample(sorted(running), rng.randint(1, len(running)))
            rows = [running[r] for r in rids]
            step = cache.decode_step(rids)
            if step is None:
                continue
            width = step.width
            rows_t, locs = tables.decode(rows, step.opened, width)
            assert rows_t.tolist() == rows
            assert np.array_equal(locs.numpy(), slots_from_pages(cache, rids))
            _views_match(tables, cache, rids, rows)
            # the decode path reads the full table through rows: same pages as the gathered view
            full = tables.pages[:, rows_t]
            gathered, lens = tables.view(rows, width)
            assert torch.equal(full[..., :width], gathered) and torch.equal(lens, tables.seq_lens(rows_t))
            steps += 1
        else:
            rid = rng.choice(sorted(running))
            cache.release(rid)
            tables.forget(running[rid], rid)
            free_rows.append(running.pop(rid))
        for rid, row in running.items():
            assert tables.mirrors(row, rid)
            tables.check(row, cache.requests[rid].pages)
    assert steps > 100 and tables.pages.shape[1] >= 16 and tables.pages.shape[3] > 1


def test_check_names_a_diverged_row():
    from tangram_sglang.pool.spec import PoolError

    spec = PoolSpec(num_layers=1, num_groups=2, heads_per_group=1, head_dim=1, page_size=2, num_pages=64)
    cache = RaggedKVCache(spec, np.array([[1.0, 0.5]]))
    cache.admit("a", chunk_tokens=[5], decode_tokens=2)
    cache.prefill_chunk("a", 5)
    tables = DeviceBlockTables(1, 2, 2, "cpu")
    tables.load([3], ["a"], [cache.requests["a"].pages])
    tables.check(3, cache.requests["a"].pages)
    tables.pages[0, 3, 0, 0] += 1
    with pytest.raises(PoolError, match="row 3: page ids"):
        tables.check(3, cache.requests["a"].pages)
    tables.lens[3, 1] += 1
    with pytest.raises(PoolError, match="row 3: lens"):
        tables.check(3, cache.requests["a"].pages)
