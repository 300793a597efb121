"""PagePool: free list, refcounts, reservation, and detection of misuse."""

import pytest

from tangram_sglang.pool import PagePool, PoolError, PoolSpec


def test_take_incref_decref_worked_example():
    pool = PagePool(4, page_size=2)
    ids = pool.take(2)
    assert ids.tolist() == [0, 1]
    pool.incref([1])
    assert pool.refcount.tolist() == [1, 2, 0, 0]
    assert pool.decref(ids) == 1
    assert pool.refcount.tolist() == [0, 1, 0, 0]
    assert pool.num_free == 3 and pool.fill.tolist() == [0, 2, 0, 0]
    pool.check_integrity()


def test_reservation_limits_available_and_refuses_without_change():
    pool = PagePool(10)
    assert pool.reserve(7)
    assert pool.available == 3
    assert not pool.reserve(4)
    assert pool.reserved == 7
    ids = pool.take(5, from_reserved=5)
    assert pool.reserved == 2 and pool.available == 3 and ids.size == 5
    with pytest.raises(PoolError, match="unreserved free pages"):
        pool.take(4)
    pool.unreserve(2)
    pool.check_integrity()


def test_double_free_and_incref_of_free_page_raise():
    pool = PagePool(3)
    ids = pool.take(1)
    pool.decref(ids)
    with pytest.raises(PoolError, match="double free"):
        pool.decref(ids)
    with pytest.raises(PoolError, match="incref of free"):
        pool.incref(ids)
    pool.check_integrity()


def test_integrity_detects_corruption():
    pool = PagePool(4)
    pool.take(2)
    pool.refcount[3] = 1  # held but still in the free list
    with pytest.raises(PoolError, match="free list"):
        pool.check_integrity()


def test_spec_derived_sizes_and_validation():
    spec = PoolSpec(num_layers=32, num_groups=2, heads_per_group=4, head_dim=128, page_size=16,
                    num_pages=100, dtype="float16")
    assert spec.page_size_bytes == 2 * 16 * 4 * 128 * 2 == 32768
    assert spec.num_virtual == 64 and spec.pool_bytes == 100 * 32768
    assert PoolSpec.for_bytes(10 * 32768 + 5, num_layers=1, num_groups=1, heads_per_group=4, head_dim=128,
                              page_size=16, dtype="float16").num_pages == 10
    with pytest.raises(ValueError, match="page_size"):
        PoolSpec(num_layers=1, num_groups=1, heads_per_group=1, head_dim=1, page_size=0, num_pages=1)
    with pytest.raises(ValueError, match="dtype"):
        PoolSpec(num_layers=1, num_groups=1, heads_per_group=1, head_dim=1, page_size=1, num_pages=1, dtype="int3")
