"""RaggedKVCache scenarios: exact reservation, refusal, errors, sharing, copies, data layout.

Driven through the production calls only: decode write slots from the device block tables
(pool_driver.ServedDecode), a finished request published with its tail then released."""

import numpy as np
import pytest
import torch

from tangram_sglang.attention.page_data import KVPageData
from tangram_sglang.method.budgets import keep_count
from tangram_sglang.pool import PoolError, PoolSpec, RaggedKVCache, RequestTooLargeError

from pool_driver import ServedDecode, finish

BETA = np.array([[0.5, 0.25], [1.0, 0.1]])


def _cache(num_pages=64, page_size=4, beta=BETA):
    spec = PoolSpec(num_layers=beta.shape[0], num_groups=beta.shape[1], heads_per_group=2, head_dim=3,
                    page_size=page_size, num_pages=num_pages)
    return RaggedKVCache(spec, beta)


def test_reserved_equals_used_and_release():
    c = _cache()
    adm = c.admit("a", chunk_tokens=[8, 6], decode_tokens=3)
    assert adm.plan.prefill_pages.tolist() == [2, 1, 4, 1]
    assert c.pool.reserved == adm.plan.total_pages == 12
    w = c.prefill_chunk("a", 8)
    assert w.counts.tolist() == [[4, 2], [8, 1]]
    c.prefill_chunk("a", 6)
    assert c.requests["a"].taken.tolist() == adm.plan.prefill_pages.tolist()
    assert c.pool.reserved == adm.plan.decode_pages.sum() == 4
    dec = ServedDecode(c)
    for _ in range(3):
        assert dec.step(["a"]) is not None
    assert c.pool.reserved == 0
    c.check_integrity()
    c.release("a")
    assert c.pool.num_free == 64 and c.usage().held_by_tree == 0
    c.check_integrity()


def test_refusal_is_a_return_value_and_too_large_raises():
    c = _cache(num_pages=10)
    # slots [4, 2, 8, 1] -> pages [1, 1, 2, 1]; +2 decode -> [6, 4, 10, 3] -> [2, 1, 3, 1]: 7 pages
    assert c.admit("a", chunk_tokens=[8], decode_tokens=2).plan.total_pages == 7
    c.check_integrity()
    assert c.admit("b", chunk_tokens=[8], decode_tokens=2) is None
    assert "b" not in c.requests
    c.check_integrity()
    with pytest.raises(RequestTooLargeError, match="can never fit"):
        c.admit("c", chunk_tokens=[100])
    with pytest.raises(PoolError, match="already admitted"):
        c.admit("a", chunk_tokens=[1])


def test_chunk_schedule_mismatch_and_unknown_request():
    c = _cache()
    c.admit("a", chunk_tokens=[8, 6])
    with pytest.raises(PoolError, match="planned next chunk is 8"):
        c.prefill_chunk("a", 7)
    with pytest.raises(PoolError, match="decode before its prefill"):
        c.decode_step(["a"])
    with pytest.raises(PoolError, match="unknown request"):
        c.prefill_chunk("zzz", 8)


def test_decode_past_reservation_uses_free_pages_then_refuses():
    c = _cache(num_pages=8, page_size=1, beta=np.array([[1.0]]))
    c.admit("a", chunk_tokens=[2], decode_tokens=1)
    c.prefill_chunk("a", 2)
    dec = ServedDecode(c)
    for _ in range(6):
        assert dec.step(["a"]) is not None
    assert c.pool.num_free == 0
    assert c.decode_step(["a"]) is None  # caller retracts
    c.check_integrity()
    c.release("a")
    assert c.pool.num_free == 8


def test_repeated_decode_batch_follows_a_readmitted_request():
    """The decode batch's slots are remembered while the batch repeats; a request retracted and
    admitted again under the same rid (another arena slot) must not reuse the stale ones, and a
    batch with a request still in prefill is refused every time (not remembered by the check)."""
    beta = np.array([[1.0, 0.5]])
    c = _cache(num_pages=64, page_size=2, beta=beta)
    for rid in ("a", "b"):
        c.admit(rid, chunk_tokens=[3], decode_tokens=4)
        c.prefill_chunk(rid, 3)
    dec = ServedDecode(c)
    assert dec.step(["a", "b"]) is not None
    c.release("a")                                    # retracted
    c.admit("c", chunk_tokens=[5], decode_tokens=4)   # takes a's old arena slot
    c.admit("a", chunk_tokens=[3], decode_tokens=4)
    assert c.reserve_decode_step(["a", "b"]) == 0     # the check may see a before its prefill...
    for _ in range(2):
        with pytest.raises(PoolError, match="before its prefill"):
            c.decode_step(["a", "b"])                 # ...the step refuses it, every time
    c.prefill_chunk("a", 3)
    c.prefill_chunk("c", 5)
    for _ in range(3):
        assert dec.step(["a", "b"]) is not None       # slots checked against a's new pages
        c.check_integrity()
    assert c.requests["a"].pages.lens.tolist() == (keep_count(beta.ravel(), 3) + 3).tolist()  # 3 decoded
    assert c.requests["c"].pages.lens.tolist() == keep_count(beta.ravel(), 5).tolist()  # untouched by a's steps
    c.check_integrity()


def test_reserved_decode_step_cannot_be_taken_by_a_later_admission():
    """SGLang's capacity check reserves the next step's pages; an admission between the check
    and the step cannot take them, so the step never runs out."""
    c = _cache(num_pages=8, page_size=1, beta=np.array([[1.0]]))
    c.admit("a", chunk_tokens=[2], decode_tokens=1)
    c.prefill_chunk("a", 2)
    dec = ServedDecode(c)
    assert dec.step(["a"]) is not None          # uses the planned decode page
    assert c.reserve_decode_step(["a"]) == 0 and c.pool.reserved == 1
    assert c.reserve_decode_step(["a"]) == 0 and c.pool.reserved == 1  # idempotent
    c.check_integrity()
    assert c.admit("b", chunk_tokens=[5], decode_tokens=0) is None  # 5 free, 1 of them reserved
    c.admit("b", chunk_tokens=[4], decode_tokens=0)
    c.prefill_chunk("b", 4)
    assert c.pool.available == 0
    assert dec.step(["a"]) is not None          # the reserved page
    c.check_integrity()
    assert c.reserve_decode_step(["a"]) == 1 and c.pool.reserved == 0  # 1 page short: SGLang evicts or retracts
    c.release("b")
    assert c.reserve_decode_step(["a", "gone"]) == 0  # unknown rids are skipped
    c.release("a")                               # the step's page goes back with the request
    assert c.pool.reserved == 0 and c.pool.num_free == 8
    c.check_integrity()


def _run(dec, data, rid, chunks, decode, prefix=(), values=None):
    """Admit, copy, prefill and decode (served: dec, a ServedDecode) a request writing value
    (tag) into every slot.

    Returns the expected per-v slot values (a list of V lists)."""
    c = dec.cache
    adm = c.admit(rid, chunk_tokens=chunks, decode_tokens=decode, prefix=prefix)
    data.copy_pages(adm.copy_src, adm.copy_dst)
    V = c.spec.num_virtual
    expect = [list(values[v]) if values else [] for v in range(V)]
    tag = 1000.0 * (1 + len(c.requests))
    for n in chunks:
        w = c.prefill_chunk(rid, n)
        locs = w.slot_locs.reshape(V, -1)
        for v in range(V):
            k = int(w.counts.reshape(-1)[v])
            vals = tag + np.arange(k) + 100 * v
            data.write(locs[v, :k], torch.tensor(vals).view(-1, 1, 1).expand(-1, 2, 3), torch.tensor(-vals).view(-1, 1, 1).expand(-1, 2, 3))
            expect[v] += vals.tolist()
            tag += 10000
    for _ in range(decode):
        locs = dec.step([rid]).reshape(V)
        vals = tag + 100 * np.arange(V)
        data.write(locs, torch.tensor(vals).view(-1, 1, 1).expand(-1, 2, 3), torch.tensor(-vals).view(-1, 1, 1).expand(-1, 2, 3))
        for v in range(V):
            expect[v].append(float(vals[v]))
        tag += 7
    return expect


def _read(c, data, rid):
    """The request's slot values per v, read through its host pages."""
    P, V = c.spec.page_size, c.spec.num_virtual
    table, lens = c.requests[rid].pages.pages, c.requests[rid].pages.lens
    out = []
    for v in range(V):
        s = np.arange(lens[v])
        k, val = data.read(table[v, s // P].astype(np.int64) * P + s % P)
        assert torch.equal(k, -val)
        out.append(k[:, 0, 0].tolist())
    return out


@pytest.mark.parametrize("page_size", [1, 3, 4])
def test_multi_turn_sharing_keeps_data_dense_and_intact(page_size):
    c = _cache(num_pages=200, page_size=page_size)
    data, dec = KVPageData(c.spec), ServedDecode(c)
    e1 = _run(dec, data, "t1", [8, 5], 2)
    assert _read(c, data, "t1") == e1
    segs = finish(c, "t1")
    assert [s.num_tokens for s in segs] == [8, 5, 2] and [s.compressed for s in segs] == [True, True, False]
    # two branches extend the same history; the first may extend in place, the second copies
    e2 = _run(dec, data, "t2a", [7], 1, prefix=segs, values=e1)
    e3 = _run(dec, data, "t2b", [3], 2, prefix=segs, values=e1)
    assert _read(c, data, "t2a") == e2 and _read(c, data, "t2b") == e3
    c.check_integrity()
    s2 = finish(c, "t2a")
    c.release("t2b")
    e4 = _run(dec, data, "t3", [2, 3], 3, prefix=[*segs, *s2], values=e2)
    assert _read(c, data, "t3") == e4
    c.release("t3")
    c.check_integrity()
    for s in [*s2, *segs]:  # leaf first, as a radix tree evicts
        c.evict(s.seg_id)
        c.check_integrity()
    assert c.pool.num_free == 200
    c.check_integrity()


def test_in_place_extension_saves_the_copy():
    c = _cache(num_pages=100, page_size=4, beta=np.array([[1.0]]))
    c.admit("a", chunk_tokens=[5])
    c.prefill_chunk("a", 5)
    segs = finish(c, "a")
    adm1 = c.admit("b", chunk_tokens=[2], prefix=segs)   # page 1 holds slot 4 only: extend in place
    adm2 = c.admit("c", chunk_tokens=[2], prefix=segs)   # b claimed it: copy
    assert adm1.copy_src.size == 0 and adm1.plan.prefill_pages.tolist() == [0]
    assert adm2.copy_src.size == 1 and adm2.plan.prefill_pages.tolist() == [1]
    c.check_integrity()
    c.release("b")  # b's claim ends: the next newcomer may extend in place again
    adm3 = c.admit("d", chunk_tokens=[2], prefix=segs)
    assert adm3.copy_src.size == 0
    c.check_integrity()
    c.evict(segs[0].seg_id)
    with pytest.raises(PoolError, match="evicted"):
        c.admit("e", chunk_tokens=[2], prefix=segs)
    assert "e" not in c.requests
    c.check_integrity()


def test_split_uncompressed_segment():
    c = _cache(num_pages=100, page_size=4, beta=np.array([[0.5]]))
    c.admit("a", chunk_tokens=[8], decode_tokens=6)
    c.prefill_chunk("a", 8)
    dec = ServedDecode(c)
    for _ in range(6):
        assert dec.step(["a"]) is not None
    segs = finish(c, "a")
    with pytest.raises(PoolError, match="compressed"):
        c.store.split(segs[0].seg_id, 2)
    head, tail = c.store.split(segs[1].seg_id, 3)
    assert head.end_slots.tolist() == [7] and tail.start_slots.tolist() == [7]
    c.check_integrity()
    adm = c.admit("b", chunk_tokens=[2], prefix=[segs[0], head])  # a match ending inside the decode run
    assert adm.copy_src.size == 1  # the tail segment wrote past slot 7 in that page: copy
    c.check_integrity()


def test_keep_count_is_what_the_pool_reserves():
    beta = np.array([[0.3, 0.7]])
    c = _cache(beta=beta)
    w = c.admit("a", chunk_tokens=[10])
    assert w.plan.chunk_slots[0].tolist() == keep_count(beta.ravel(), 10).tolist() == [3, 7]


def test_a_request_at_its_own_budgets_draws_what_a_pool_of_them_draws():
    """admit(beta=...): a request of another ratio plans, reserves and draws exactly what it would in a
    pool built with its budgets, beside a request at the pool's own, in one pool; budgets of another shape refused."""
    other = np.array([[0.25, 0.5], [0.5, 0.75]])
    mixed, alone = _cache(), _cache(beta=other)
    got = mixed.admit("b", chunk_tokens=[8, 6], decode_tokens=2, beta=other)
    want = alone.admit("b", chunk_tokens=[8, 6], decode_tokens=2)
    mixed.admit("a", chunk_tokens=[8], decode_tokens=1)
    assert np.array_equal(got.plan.chunk_slots, want.plan.chunk_slots) and got.plan.total_pages == want.plan.total_pages
    for n in (8, 6):
        assert np.array_equal(mixed.prefill_chunk("b", n).counts, alone.prefill_chunk("b", n).counts)
        mixed.check_integrity()
    assert mixed.prefill_chunk("a", 8).counts.tolist() == [[4, 2], [8, 1]]   # the pool's own budgets
    with pytest.raises(ValueError, match=r"group_budget has shape \(2, 3\), the pool is \[2, 2\]"):
        mixed.admit("c", chunk_tokens=[4], beta=np.full((2, 3), 0.5))
    assert "c" not in mixed.requests
    mixed.check_integrity()
