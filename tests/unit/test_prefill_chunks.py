"""RaggedKVCache.prefill_chunks (one [B, V] draw for a wave of chunks) against prefill_chunk
called request by request: two caches driven through the same random workloads (admissions with
and without a cached prefix, waves over random subsets of the requests, decode steps, finishes
and aborts) must hand out the same page ids, return the same writes (values and dtypes) and end
every operation in the same state, each passing its integrity check; chunk_slots_reference gives
the same write slots from the stacked writes as from the list. Decode steps (with and without
SGLang's capacity check first), finishes and aborts run the numpy reference on the first cache and,
where the library is built, the native loops on the second. Each workload runs with the native loops (pool/native.py) and
with the numpy references."""

import numpy as np
import pytest

from tangram_sglang.pool.block_table import chunk_slots_host, chunk_slots_reference
from tangram_sglang.pool import PoolError, PoolSpec, RaggedKVCache, RequestTooLargeError, native
from tangram_sglang.pool.chunk_draw import stack_writes
from tangram_sglang.pool.records import ChunkWrite, ChunkWrites

from pool_driver import finish

pytestmark = pytest.mark.unit


def _caches(rng):
    L, G = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    P = int(rng.choice([1, 2, 4, 16]))
    spec = PoolSpec(num_layers=L, num_groups=G, heads_per_group=1, head_dim=2, page_size=P,
                    num_pages=int(rng.integers(200, 600)))
    beta = rng.uniform(0.05, 1.0, size=(L, G))
    return RaggedKVCache(spec, beta), RaggedKVCache(spec, beta)


def _same_write(a: ChunkWrite, b: ChunkWrite) -> None:
    for name in ("pages", "offset", "counts"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert a.page_size == b.page_size


def _same_state(old: RaggedKVCache, new: RaggedKVCache) -> None:
    assert old.requests.keys() == new.requests.keys()
    np.testing.assert_array_equal(old.pool.refcount, new.pool.refcount)
    np.testing.assert_array_equal(old.pool.fill, new.pool.fill)
    assert (old.pool.num_free, old.pool.reserved) == (new.pool.num_free, new.pool.reserved)
    np.testing.assert_array_equal(old.pool.free_ids(), new.pool.free_ids())   # the order pages come out next
    for rid, r_old in old.requests.items():
        r_new = new.requests[rid]
        for name in ("npages", "lens", "dead"):
            np.testing.assert_array_equal(getattr(r_old.pages, name), getattr(r_new.pages, name), err_msg=name)
        for name in ("reserved_left", "taken"):
            np.testing.assert_array_equal(getattr(r_old, name), getattr(r_new, name), err_msg=name)
        w = int(r_old.pages.npages.max(initial=0))
        np.testing.assert_array_equal(r_old.pages.pages[:, :w], r_new.pages.pages[:, :w])
        assert len(r_old.chunk_ends) == len(r_new.chunk_ends)
        for e_old, e_new in zip(r_old.chunk_ends, r_new.chunk_ends):
            np.testing.assert_array_equal(e_old, e_new)
    for cache in (old, new):
        cache.check_integrity()


def reference(fn, *args):
    """fn(*args) with the numpy references, whatever the control_plane fixture chose."""
    saved, native._LIB = native._LIB, None
    try:
        return fn(*args)
    finally:
        native._LIB = saved


def _workload(seed: int, steps: int = 60) -> None:
    rng = np.random.default_rng(seed)
    old, new = _caches(rng)
    chains: list = []  # published chains (a finished request's prefix and segments), prefixes for later admissions
    prefixes: dict = {}
    next_id = 0
    for _ in range(steps):
        op = rng.choice(["admit", "wave", "wave", "decode", "finish", "abort", "evict"])
        live = list(old.requests)
        if op == "admit":
            prefix = chains[int(rng.integers(len(chains)))] if chains and rng.random() < 0.5 else ()
            chunks = [int(x) for x in rng.integers(1, 40, size=int(rng.integers(1, 5)))]
            kw = dict(chunk_tokens=chunks, decode_tokens=int(rng.integers(0, 6)), prefix=prefix)
            try:
                a_old = old.admit(next_id, **kw)
            except RequestTooLargeError:
                with pytest.raises(RequestTooLargeError):
                    new.admit(next_id, **kw)
                continue
            a_new = new.admit(next_id, **kw)
            assert (a_old is None) == (a_new is None)
            if a_old is not None:
                np.testing.assert_array_equal(a_old.copy_dst, a_new.copy_dst)
                prefixes[next_id] = prefix
            next_id += 1
        elif op == "wave":
            todo = [r for r in live if not old.requests[r].prefill_done]
            batch = [r for r in todo if rng.random() < 0.7]
            rng.shuffle(batch)
            sizes = [old.requests[r].plan.chunk_tokens[len(old.requests[r].chunk_ends)] for r in batch]
            writes_old = [old.prefill_chunk(r, n) for r, n in zip(batch, sizes)]
            if rng.random() < 0.3:   # as a GPU draws: no host pages, the rest the same
                writes_new = new.prefill_chunks(batch, sizes, host_pages=False)
                stacked = stack_writes(writes_old, old.spec)
                assert writes_new.pages is None and len(writes_new) == len(batch)
                for name in ("offset", "counts", "widths"):
                    np.testing.assert_array_equal(getattr(stacked, name), getattr(writes_new, name), err_msg=name)
                if batch:
                    with pytest.raises(ValueError, match="without host pages"):
                        writes_new[0]
                _same_state(old, new)
                continue
            writes_new = new.prefill_chunks(batch, sizes)
            assert isinstance(writes_new, ChunkWrites) and len(writes_new) == len(batch)
            for w_old, w_new in zip(writes_old, writes_new):
                _same_write(w_old, w_new)
            if batch:  # the wave's write slots, from the stacked writes (native where built) and from the list
                for s_old, s_new, s_host in zip(chunk_slots_reference(writes_old), chunk_slots_reference(writes_new),
                                                chunk_slots_host(writes_new)):
                    np.testing.assert_array_equal(s_old, s_new)
                    np.testing.assert_array_equal(s_old, s_host)
        elif op == "decode":   # the reference pool decodes with numpy; the other with the native loops
            ready = [r for r in live if old.requests[r].prefill_done]
            if ready:
                if rng.random() < 0.5:   # SGLang's capacity check first (a step it reserved), or not
                    assert reference(old.reserve_decode_step, ready) == new.reserve_decode_step(ready)
                    _same_state(old, new)
                s_old, s_new = reference(old.decode_step, ready), new.decode_step(ready)
                assert (s_old is None) == (s_new is None)
                if s_old is not None:
                    np.testing.assert_array_equal(s_old.opened, s_new.opened)
                    assert s_old.width == s_new.width
        elif op == "evict":
            if old.store.segments:
                seg = int(rng.choice(list(old.store.segments)))
                assert old.evict(seg) == new.evict(seg)
        elif live:
            rid = live[int(rng.integers(len(live)))]
            if op == "finish" and old.requests[rid].prefill_done:
                segs_old, _ = reference(finish, old, rid), finish(new, rid)
                if segs_old:
                    chains.append(tuple(prefixes[rid]) + tuple(segs_old))
            else:
                reference(old.release, rid)
                new.release(rid)
        chains = [c for c in chains if all(s.seg_id in old.store.segments for s in c)]
        _same_state(old, new)


@pytest.mark.parametrize("seed", range(24))
def test_prefill_chunks_equals_prefill_chunk_request_by_request(seed, control_plane):
    _workload(seed)


def test_prefill_chunks_refuses_a_chunk_off_the_plan_and_a_repeated_request():
    rng = np.random.default_rng(0)
    _, cache = _caches(rng)
    cache.admit("a", chunk_tokens=[8, 6])
    cache.admit("b", chunk_tokens=[5])
    with pytest.raises(PoolError, match="planned next chunk is 8"):
        cache.prefill_chunks(["a", "b"], [7, 5])
    with pytest.raises(PoolError, match="appears twice"):
        cache.prefill_chunks(["b", "b"], [5, 5])
    cache.check_integrity()
    assert cache.prefill_chunks([], []).counts.shape[0] == 0
