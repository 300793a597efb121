"""RequestPages and the batch block-table builders: the worked examples of their docstrings."""

import numpy as np

from tangram_sglang.pool import ChunkWrite, RequestPages, build_layer_tables, stack_chunk_writes
from tangram_sglang.pool.request_pages import flat_slot_locs, ragged_index


def test_ragged_index():
    rows, pos = ragged_index(np.array([2, 0, 3]))
    assert rows.tolist() == [0, 0, 2, 2, 2] and pos.tolist() == [0, 1, 0, 1, 2]


def _example() -> RequestPages:
    r = RequestPages(2, page_size=2, capacity=1)
    r.append(np.array([2, 1]), np.array([7, 3, 9]))
    return r


def test_request_pages_worked_example():
    r = _example()
    assert r.pages.tolist() == [[7, 3], [9, -1]]
    locs = r.slot_locs(np.array([3, 1]))
    assert locs.tolist() == [[14, 15, 6], [18, -1, -1]]
    r.advance(np.array([3, 1]))
    assert r.lens.tolist() == [3, 1]
    assert r.pages_needed(np.array([5, 2])).tolist() == [1, 0]
    assert sorted(r.held().tolist()) == [3, 7, 9]
    counts, ids = r.pages_from(np.array([1, 0]), np.array([2, 1]))
    assert counts.tolist() == [1, 1] and ids.tolist() == [3, 9]


def test_build_layer_tables_worked_example():
    r = _example()
    r.advance(np.array([3, 1]))
    table, lens = build_layer_tables([r], num_layers=1, num_groups=2)
    assert table.dtype == np.int32 and lens.dtype == np.int32
    assert table.tolist() == [[[[7, 3], [9, 0]]]]
    assert lens.tolist() == [[[3, 1]]]
    # slot 2 of g=0: page table[0, 0, 0, 1] offset 0 -> flat 6
    assert table[0, 0, 0, 2 // 2] * 2 + 2 % 2 == 6


def test_build_layer_tables_pads_across_requests():
    a, b = _example(), RequestPages(2, page_size=2)
    b.append(np.array([1, 3]), np.array([1, 2, 4, 5]))
    b.advance(np.array([1, 6]))
    table, lens = build_layer_tables([a, b], num_layers=2, num_groups=1)
    assert table.shape == (2, 2, 1, 3)
    assert table[1].reshape(2, 3).tolist() == [[1, 0, 0], [2, 4, 5]]
    assert lens.reshape(2, 2).tolist() == [[0, 0], [1, 6]]


def test_flat_slot_locs_worked_example():
    assert flat_slot_locs(np.array([[7, 3]]), np.array([1]), np.array([3]), 2).tolist() == [[15, 6, 7]]
    # a run that fits its first page; a run of 0 slots
    got = flat_slot_locs(np.array([[5, -1], [-1, -1]]), np.array([0, 3]), np.array([2, 0]), 4)
    assert got.tolist() == [[20, 21], [-1, -1]]


def test_chunk_pages_matches_slot_by_slot():
    rng = np.random.default_rng(1)
    r = RequestPages(5, page_size=3)
    for _ in range(6):
        counts = rng.integers(0, 9, 5)
        r.append(r.pages_needed(r.lens + counts), rng.permutation(1000)[: int(r.pages_needed(r.lens + counts).sum())])
        pages, offset = r.chunk_pages(counts)
        got = flat_slot_locs(pages, offset, counts, 3)
        for v in range(5):
            want = [int(r.pages[v, s // 3]) * 3 + s % 3 for s in range(r.lens[v], r.lens[v] + counts[v])]
            assert got[v, : counts[v]].tolist() == want and (got[v, counts[v]:] == -1).all()
        assert np.array_equal(r.slot_locs(counts), got)
        r.advance(counts)


def test_stack_chunk_writes():
    w1 = ChunkWrite(pages=np.array([[[2], [4]]]), offset=np.array([[0, 0]]), counts=np.array([[2, 1]]), page_size=4)
    w2 = ChunkWrite(pages=np.array([[[0], [0]]]), offset=np.array([[1, 2]]), counts=np.array([[1, 1]]), page_size=4)
    assert w1.slot_locs.tolist() == [[[8, 9], [16, -1]]]
    locs, counts = stack_chunk_writes([w1, w2])
    assert locs.shape == (2, 1, 2, 2)
    assert locs[1].tolist() == [[[1, -1], [2, -1]]]
    assert counts.tolist() == [[[2, 1]], [[1, 1]]]
