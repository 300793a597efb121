"""DeviceBlockTables against the host pool: after every load, extend and decode step of random batches,
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
    W = host_bt.shape[-1]
    live = np.stack([np.pad(cache.requests[r].pages.pages[:, :W] >= 0, ((0, 0), (0, max(0, W - cache.requests[r].pages.pages.shape[1]))))
                     for r in rids])   # [B, V, W]
    mask &= live.reshape(mask.shape)   # a window layer's released columns are not mirrored (never read)
    assert np.array_equal(dev[..., : host_bt.shape[-1]][mask], host_bt[mask])


def _extend(cache, tables, rids, rows, pending) -> None:
    """One prefill chunk of each of rids, the device rows brought up to date as the served path does."""
    before = [cache.requests[r].pages.npages.copy() for r in rids]
    for rid in rids:
        cache.prefill_chunk(rid, pending[rid].pop(0))
    tables.extend(rows, rids, [cache.requests[r].pages for r in rids], before)


@pytest.mark.parametrize("page_size,seed,windows", [(1, 0, None), (4, 1, None), (16, 2, None), (4, 3, [0, 6, 0])])
def test_device_tables_follow_the_host_pool(page_size, seed, windows):
    """Requests prefill chunk by chunk in random batches (the device rows extended incrementally;
    a window layer releases columns as it goes), decode in random batches and leave; every mirrored
    row equals the host after every operation."""
    rng = random.Random(seed)
    L, G = 3, 2
    spec = PoolSpec(num_layers=L, num_groups=G, heads_per_group=1, head_dim=1, page_size=page_size, num_pages=4000)
    beta = np.array([[0.1, 1.0], [0.5, 0.3], [0.0, 0.8]])
    if windows:
        beta[np.asarray(windows) > 0] = 1.0   # a window layer keeps every token
    cache = RaggedKVCache(spec, beta, windows=windows)
    tables = DeviceBlockTables(L, G, page_size, "cpu", rows=2, width=1)  # both grow
    running: dict[str, int] = {}   # rid -> row, prefill complete
    pending: dict[str, list] = {}  # rid -> chunks left, for requests still prefilling
    rows_of: dict[str, int] = {}
    free_rows = list(range(20))
    count, steps, extends = 0, 0, 0
    for _ in range(500):
        x = rng.random()
        if (x < 0.2 or not (running or pending)) and free_rows:
            count += 1
            rid = f"r{count}"
            chunks = [rng.randint(1, 40) for _ in range(rng.randint(1, 4))]
            if cache.admit(rid, chunk_tokens=chunks, decode_tokens=rng.randint(0, 20)) is None:
                continue
            pending[rid], rows_of[rid] = list(chunks), free_rows.pop(rng.randrange(len(free_rows)))
        elif x < 0.45 and pending:
            rids = rng.sample(sorted(pending), rng.randint(1, len(pending)))
            _extend(cache, tables, rids, [rows_of[r] for r in rids], pending)
            extends += 1
            for rid in rids:
                if not pending[rid]:
                    del pending[rid]
                    running[rid] = rows_of[rid]
        elif x < 0.9 and running:
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
            if not running:
                continue
            rid = rng.choice(sorted(running))
            cache.release(rid)
            tables.forget(running[rid], rid)
            free_rows.append(running.pop(rid))
            del rows_of[rid]
        for rid, row in rows_of.items():
            if rid in running or len(cache.requests[rid].chunk_ends):
                assert tables.mirrors(row, rid)
                tables.check(row, cache.requests[rid].pages)
    assert steps > 100 and extends > 50 and tables.pages.shape[1] >= 16 and tables.pages.shape[3] > 1


def test_extend_sends_only_the_new_pages_and_loads_a_row_it_does_not_mirror():
    """A stale mirror of a row (another request held it) is loaded whole; a mirrored row gets only the
    chunk's new pages: a page id planted past them survives the extend (it was not rewritten)."""
    spec = PoolSpec(num_layers=1, num_groups=2, heads_per_group=1, head_dim=1, page_size=2, num_pages=100)
    cache = RaggedKVCache(spec, np.array([[1.0, 0.5]]))
    tables = DeviceBlockTables(1, 2, 2, "cpu")
    for rid in ("old", "new"):
        cache.admit(rid, chunk_tokens=[4, 4], decode_tokens=0)
    _extend(cache, tables, ["old"], [3], {"old": [4]})
    tables.pages[0, 3, 0, 0] = 77                   # what "old" left on row 3
    _extend(cache, tables, ["new"], [3], {"new": [4]})   # row 3 now "new": loaded whole, 77 gone
    tables.check(3, cache.requests["new"].pages)
    tables.pages[0, 3, 0, 0] = 77                   # a column the next chunk does not touch
    _extend(cache, tables, ["new"], [3], {"new": [4]})
    assert int(tables.pages[0, 3, 0, 0]) == 77 and int(tables.pages[0, 3, 0, 2]) == cache.requests["new"].pages.pages[0, 2]
    assert tables.lens[3].tolist() == cache.requests["new"].pages.lens.tolist()


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
