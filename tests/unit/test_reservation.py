"""Exact reservation plan: matches the docstring example and a token-by-token simulation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram_sglang.method.budgets import keep_count
from tangram_sglang.pool import chunk_slot_counts, plan_reservation


def test_worked_example():
    plan = plan_reservation(np.array([0.5, 0.25]), [8, 6], page_size=4, decode_tokens=3)
    assert plan.chunk_slots.tolist() == [[4, 2], [3, 2]]
    assert plan.prefill_slots.tolist() == [7, 4]
    assert plan.prefill_pages.tolist() == [2, 1]
    assert plan.decode_pages.tolist() == [1, 1]
    assert plan.total_pages == 5


def test_chunk_slots_use_keep_count():
    beta = np.array([0.1, 0.3, 0.7, 1.0, 1e-3])
    chunks = [10, 7, 512, 1]
    got = chunk_slot_counts(beta, chunks)
    assert got.tolist() == [keep_count(beta, n).tolist() for n in chunks]
    assert got[0].tolist() == [1, 3, 7, 10, 1]  # 0.3 * 10 == 3 exactly, not 4


def test_protected_tokens_raise_the_counts():
    beta = np.array([0.1, 0.5])
    got = chunk_slot_counts(beta, [100, 40], min_keep=[4, 30])
    assert got.tolist() == [[10, 50], [30, 30]]
    plan = plan_reservation(beta, [100, 40], page_size=16, min_keep=[4, 30])
    assert plan.prefill_slots.tolist() == [40, 80]
    with pytest.raises(ValueError):
        chunk_slot_counts(beta, [10], min_keep=[11])
    with pytest.raises(ValueError):
        chunk_slot_counts(beta, [10, 5], min_keep=[1])


def test_protected_tokens_reserved_equals_used():
    from tangram_sglang.pool import PoolSpec, RaggedKVCache

    spec = PoolSpec(num_layers=2, num_groups=2, heads_per_group=1, head_dim=4, page_size=4, num_pages=64,
                    dtype="float32")
    cache = RaggedKVCache(spec, np.array([[0.1, 0.5], [0.25, 1.0]]))
    adm = cache.admit("a", chunk_tokens=[20, 9], decode_tokens=2, min_keep=[4, 9])
    for n in adm.plan.chunk_tokens:
        w = cache.prefill_chunk("a", n)
    assert w.counts.ravel().tolist() == [9, 9, 9, 9]
    assert cache.requests["a"].taken.tolist() == adm.plan.prefill_pages.tolist()
    cache.check_integrity()


def test_prefix_copy_vs_in_place():
    beta = np.array([0.5, 0.5])
    kw = dict(page_size=4, prefix_slots=np.array([6, 6]))
    copy = plan_reservation(beta, [4], **kw)
    in_place = plan_reservation(beta, [4], extend_in_place=np.array([True, True]), **kw)
    # 6 + 2 = 8 slots = 2 pages; copy: page 1 is a fresh copy -> 1 page; in place -> 0 pages
    assert copy.prefill_pages.tolist() == [1, 1]
    assert in_place.prefill_pages.tolist() == [0, 0]


def test_bad_input_raises():
    with pytest.raises(ValueError, match="chunk"):
        plan_reservation(np.array([0.5]), [4, 0], page_size=4)
    with pytest.raises(ValueError, match="decode_tokens"):
        plan_reservation(np.array([0.5]), [4], page_size=4, decode_tokens=-1)
    with pytest.raises(ValueError, match="prefix_slots"):
        plan_reservation(np.array([0.5]), [4], page_size=4, prefix_slots=np.array([1, 2]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(1e-3, 1.0), min_size=1, max_size=6), st.lists(st.integers(1, 40), max_size=5),
       st.integers(0, 30), st.integers(1, 9), st.integers(0, 50), st.booleans())
def test_matches_slot_by_slot_simulation(betas, chunks, decode, page_size, prefix, in_place):
    beta = np.array(betas)
    v = beta.size
    plan = plan_reservation(beta, chunks, page_size=page_size, decode_tokens=decode,
                            prefix_slots=np.full(v, prefix), extend_in_place=np.full(v, in_place))
    for j in range(v):
        slots = prefix + sum(int(keep_count(beta[j], n)) for n in chunks)
        # pages the request itself must own: every page holding one of its new slots, plus the
        # prefix's partial page when it is copied, minus the prefix pages it uses in place
        partial = prefix % page_size != 0
        shared = -(-prefix // page_size) if (partial and in_place) else prefix // page_size
        own = {s // page_size for s in range(prefix, slots)} | ({prefix // page_size} if partial else set())
        prefill_own = len({c for c in own if c >= shared})
        pages_at = lambda n: len({s // page_size for s in range(n)})
        assert plan.prefill_slots[j] == slots
        assert plan.prefill_pages[j] == prefill_own
        assert plan.decode_pages[j] == pages_at(slots + decode) - pages_at(slots)
