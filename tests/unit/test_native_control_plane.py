"""The native control-plane loops (pool/native.py) refuse what they cannot do without changing anything:
a draw past the arena's capacity or past the free pages, a run wider than its output, a table row out of
range, an array of the wrong dtype. Their answers are compared with the numpy references over random
workloads in test_prefill_chunks.py and test_device_block_tables.py (the control_plane fixture)."""

import numpy as np
import pytest

from tangram_sglang.pool import PagePool, PoolError, native
from tangram_sglang.pool.request_pages import PageArena


@pytest.fixture
def lib():
    assert native.enabled(), "the native control plane is not built: run launch/setup.sh"


def _state():
    pool, arena = PagePool(40, page_size=4), PageArena(3, slots=2, capacity=4)
    return pool, arena


def _snapshot(pool, arena):
    return [a.copy() for a in (pool._free, pool.refcount, pool.fill, arena.pages, arena.npages)] + [pool._num_free]


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def test_a_draw_hands_out_the_stacks_top_in_request_then_layer_order(lib):
    pool, arena = _state()
    native.draw(pool, arena, np.array([1, 0], np.int64), np.array([[2, 0, 1], [1, 1, 0]], np.int64))
    assert pool.num_free == 35
    assert arena.pages[1, 0, :2].tolist() == [0, 1] and arena.pages[1, 2, 0] == 2
    assert arena.pages[0, 0, 0] == 3 and arena.pages[0, 1, 0] == 4
    assert arena.npages.tolist() == [[1, 1, 0], [2, 0, 1]]
    assert pool.refcount[:5].tolist() == [1] * 5 and pool.fill[:5].tolist() == [4] * 5
    pool.reserved = 0
    pool.check_integrity()


@pytest.mark.parametrize("need", [[[5, 0, 0]], [[20, 20, 20]]])   # past the capacity (4); past the 40 free pages
def test_a_draw_that_cannot_complete_changes_nothing(lib, need):
    pool, arena = _state()
    arena.ensure_capacity(4)
    if np.max(need) > 5:
        arena.ensure_capacity(20)
    before = _snapshot(pool, arena)
    with pytest.raises(PoolError, match="nothing changed"):
        native.draw(pool, arena, np.array([0], np.int64), np.array(need, np.int64))
    assert _same(before, _snapshot(pool, arena))


def test_wrong_dtypes_are_refused_before_any_call(lib):
    pool, arena = _state()
    with pytest.raises(TypeError, match="int64"):
        native.draw(pool, arena, np.array([0], np.int32), np.array([[1, 0, 0]], np.int64))
    with pytest.raises(TypeError, match="contiguous"):
        native.draw(pool, arena, np.array([0, 9, 1, 9], np.int64)[::2], np.array([[1, 0, 0], [1, 0, 0]], np.int64))


def test_runs_wider_than_their_output_and_rows_out_of_range_are_refused(lib):
    pages = np.array([[[[7, 3]]]], np.int32)                       # B = L = G = 1, W = 2, P = 2
    assert native.chunk_slots(pages, np.array([[[1]]]), np.array([[[3]]]), 2)[0].tolist() == [15, 6, 7]
    with pytest.raises(PoolError):
        native.chunk_slots(pages, np.array([[[1]]]), np.array([[[4]]]), 2)   # needs a third page
    _, arena = _state()
    arena.npages[0] = [1, 0, 0]
    arena.pages[0, 0, 0] = 9
    table = np.zeros((1, 2, 3, 4), np.int32)                      # [L, R, G, W]
    native.new_columns(arena, np.array([0], np.int64), np.array([1], np.int64), np.zeros((1, 3), np.int64),
                       arena.npages[[0]], table.shape, table)
    assert table[0, 1, 0, 0] == 9 and np.count_nonzero(table) == 1
    with pytest.raises(PoolError):
        native.new_columns(arena, np.array([0], np.int64), np.array([2], np.int64), np.zeros((1, 3), np.int64),
                           arena.npages[[0]], table.shape, table)
    assert np.count_nonzero(table) == 1


def test_a_release_frees_in_list_order_clears_the_slot_and_refuses_a_double_free(lib):
    pool, arena = _state()
    pool.reserved = 3
    native.draw(pool, arena, np.array([0], np.int64), np.array([[2, 1, 0]], np.int64))
    pool.reserved -= 3
    pool.incref(np.array([1]))                       # a page the tree holds too
    native.release(pool, arena, 0)
    assert pool.free_ids()[-2:].tolist() == [0, 2] and pool.refcount[1] == 1 and pool.fill[[0, 2]].tolist() == [0, 0]
    assert np.all(arena.pages[0] == -1)              # free_slot(cleared=True) may take it as it is
    pool.decref(np.array([1]))
    native.draw(pool, arena, np.array([1], np.int64), np.array([[1, 2, 0]], np.int64))
    pool.decref(arena.pages[1, 1, :1])               # one of its pages dropped behind its back
    before = _snapshot(pool, arena)
    with pytest.raises(PoolError, match="double free"):
        native.release(pool, arena, 1)
    assert _same(before, _snapshot(pool, arena))
