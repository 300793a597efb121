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


def _old_out_loc(writes, num_layers):
    """The extend path's write slots before chunk_slots (the per-layer mask and concatenation of
    each request's padded slot_locs): the reference the new paths must equal."""
    out = []
    for layer in range(num_layers):
        parts = [w.slot_locs[layer][np.arange(w.slot_locs.shape[-1])[None, :] < w.counts[layer][:, None]]
                 for w in writes]
        out.append(np.concatenate(parts))
    return out


def test_chunk_slots_reference_worked_example():
    from tangram_sglang.pool.block_table import chunk_slots_reference
    from tangram_sglang.pool.records import ChunkWrite

    w = ChunkWrite(pages=np.array([[[7, 3], [9, -1]]]), offset=np.array([[1, 0]]), counts=np.array([[3, 1]]),
                   page_size=2)
    assert [x.tolist() for x in chunk_slots_reference([w])] == [[15, 6, 7, 18]]


@pytest.mark.parametrize("page_size,windows,seed", [(1, None, 0), (4, [0, 6, 0], 1), (16, None, 2), (4, [0, 3, 0], 3)])
def test_extend_batches_write_the_old_slots_and_tables_follow_incrementally(page_size, windows, seed, control_plane):
    """Random extend batches of several requests (chunks, windows, releases, re-used rows): the write
    slots of chunk_slots_reference and of DeviceBlockTables.chunk_slots equal the old path's, the new
    columns listed over all kept rows at once equal the row-by-row listing (where no window column was
    released), and after each incremental extend every row still equals the host pool (check) and the
    reference views. Run with the native loops (the write slots and the new columns' flat indices equal
    the numpy references') and with the references alone."""
    from tangram_sglang.pool import native
    from tangram_sglang.pool.block_table import chunk_slots_host, chunk_slots_reference
    from tangram_sglang.pool.chunk_draw import stack_writes

    rng = random.Random(seed)
    L, G = 3, 2
    spec = PoolSpec(num_layers=L, num_groups=G, heads_per_group=1, head_dim=1, page_size=page_size, num_pages=6000)
    beta = np.array([[0.1, 1.0], [1.0, 1.0], [0.0, 0.8]]) if windows else np.array([[0.1, 1.0], [0.5, 0.3], [0.0, 0.8]])
    cache = RaggedKVCache(spec, beta, windows=windows)
    tables = DeviceBlockTables(L, G, page_size, "cpu", rows=2, width=1)
    pending: dict[str, list[int]] = {}   # rid -> chunks left
    rows: dict[str, int] = {}
    free_rows, count, batches, incremental, vectorized = list(range(12)), 0, 0, 0, 0
    for _ in range(300):
        if (rng.random() < 0.35 or not pending) and free_rows:
            count += 1
            rid = f"r{count}"
            chunks = [rng.randint(1, 50) for _ in range(rng.randint(1, 5))]
            if cache.admit(rid, chunk_tokens=chunks, decode_tokens=4) is None:
                continue
            pending[rid], rows[rid] = chunks, free_rows.pop(rng.randrange(len(free_rows)))
            continue
        rids = rng.sample(sorted(pending), rng.randint(1, len(pending)))
        host = [cache.requests[r].pages for r in rids]
        before = np.stack([p.lens for p in host]).astype(np.int32)
        np0, dead0 = np.stack([p.npages for p in host]), np.stack([p.dead for p in host])
        incremental += sum(tables.mirrors(rows[r], r) for r in rids)
        writes = [cache.prefill_chunk(r, pending[r].pop(0)) for r in rids]
        old = _old_out_loc(writes, L)
        assert all(np.array_equal(a, b) for a, b in zip(chunk_slots_reference(writes), old))
        assert all(np.array_equal(a, b) for a, b in zip(chunk_slots_host(stack_writes(writes, spec)), old))
        row_list, host = [rows[r] for r in rids], [cache.requests[r].pages for r in rids]
        kept = [i for i, r in enumerate(rids) if tables.mirrors(rows[r], r)]
        if kept and np.array_equal(dead0[kept], np.stack([host[i].dead for i in kept])):
            whole = DeviceBlockTables._new_columns(row_list, host, kept, np0)   # the served path then
            by_row = DeviceBlockTables._new_columns_by_row(row_list, host, kept, np0, dead0)
            assert all(np.array_equal(a, b) for a, b in zip(whole, by_row))
            vectorized += 1
            if native.enabled():   # the flat indices extend writes through, as the reference computes them
                tables._ensure(max(row_list), max(int(h.npages.max(initial=1)) for h in host))
                r, v, col, val, _ = whole
                _, R, G_, W = tables.pages.shape
                slots = np.asarray([host[i].slot for i in kept], np.int64)
                npg = host[0].arena.npages[slots]
                at, nval = native.new_columns(host[0].arena, slots, np.asarray(row_list, np.int64)[kept],
                                              np.minimum(np0[kept], npg).astype(np.int64), npg, tuple(tables.pages.shape))
                assert np.array_equal(at, ((v // G_ * R + r) * G_ + v % G_) * W + col) and np.array_equal(nval, val)
        tables.extend(row_list, rids, host, np0, dead0)
        dev = tables.chunk_slots(torch.tensor(row_list), torch.from_numpy(before), np.stack([w.counts for w in writes]))
        assert all(np.array_equal(a.numpy(), b) for a, b in zip(dev, old))
        for r in rids:
            tables.check(rows[r], cache.requests[r].pages)
        _views_match(tables, cache, rids, row_list)
        batches += 1
        for r in [r for r in rids if not pending[r]]:          # prefill done: release, the row is re-used
            del pending[r]
            cache.release(r)
            tables.forget(rows[r], r)
            free_rows.append(rows.pop(r))
    assert batches > 100 and incremental > 100 and vectorized > 5


def test_an_incremental_extend_zeroes_released_window_columns():
    spec = PoolSpec(num_layers=1, num_groups=1, heads_per_group=1, head_dim=1, page_size=2, num_pages=64)
    cache = RaggedKVCache(spec, np.array([[1.0]]), windows=[3])
    cache.admit("b", chunk_tokens=[4], decode_tokens=0)
    cache.prefill_chunk("b", 4)                       # so that "a"'s first page is not page 0
    cache.admit("a", chunk_tokens=[4, 6], decode_tokens=0)
    tables = DeviceBlockTables(1, 1, 2, "cpu")
    cache.prefill_chunk("a", 4)
    pages = cache.requests["a"].pages
    tables.load([0], ["a"], [pages])
    first = int(tables.pages[0, 0, 0, 0])
    n0, d0 = pages.npages.copy()[None], pages.dead.copy()[None]
    cache.prefill_chunk("a", 6)
    pages = cache.requests["a"].pages
    assert pages.dead[0] > 0 and first > 0
    tables.extend([0], ["a"], [pages], n0, d0)
    assert tables.pages[0, 0, 0, : pages.dead[0]].tolist() == [0] * int(pages.dead[0])   # as a reload leaves them
    tables.check(0, pages)


def test_a_row_loaded_again_holds_zeros_past_its_pages(control_plane):
    """A reused row loaded whole (a request's first extend) holds 0 past its own pages up to the batch's
    widest row, natively as with the numpy load, not the pages of the row's previous request."""
    spec = PoolSpec(num_layers=2, num_groups=2, heads_per_group=1, head_dim=1, page_size=2, num_pages=200)
    cache = RaggedKVCache(spec, np.full((2, 2), 1.0))
    tables = DeviceBlockTables(2, 2, 2, "cpu", rows=2, width=1)
    cache.admit("long", chunk_tokens=[20])
    cache.prefill_chunk("long", 20)
    tables.load([0], ["long"], [cache.requests["long"].pages])
    assert int((tables.pages[:, 0] != 0).sum()) > 0
    cache.release("long")
    tables.forget(0, "long")
    for rid, n in (("short", 3), ("wide", 16)):
        cache.admit(rid, chunk_tokens=[n])
        cache.prefill_chunk(rid, n)
    tables.load([0, 1], ["short", "wide"], [cache.requests[r].pages for r in ("short", "wide")])
    width = int(cache.requests["wide"].pages.npages.max())
    short = tables.pages[:, 0, :, :width].numpy()
    assert (short[..., 2:] == 0).all()   # its own two pages per (layer, group): check() below
    tables.check(0, cache.requests["short"].pages)
    tables.check(1, cache.requests["wide"].pages)
