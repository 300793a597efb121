"""Random sequences of admit / prefill chunk / decode / finish / retract / share / evict / split,
through the production calls (pool_driver): decode writes go to the slots the device block
tables compute from the step's opened pages; finish is publish(include_tail) then release,
retract (or abort) is release.

After every operation: check_integrity(), the device table rows equal the host pages, and every
live request and every cached segment reads back exactly the values written into its slots
(a numpy shadow of the page data), so copies, in-place extension and sharing never corrupt
anyone. After every complete prefill: pages taken == pages reserved for prefill.

With sliding-window layers (``windows``) the pool releases each request's window pages as its
queries move on and the tree drops interior segments' window pages (``drop_window``): then
every live request and every chain a match may end at (window_ready) still reads back its
window exactly, a request holds at most its window's pages, and admission only ever gets a
ready prefix.
"""

import random

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tangram_sglang.pool import PoolSpec, RaggedKVCache, RequestTooLargeError, assemble

from pool_driver import ServedDecode, finish


class PoolModel:
    def __init__(self, page_size: int, num_pages: int, beta: np.ndarray, windows=None):
        spec = PoolSpec(num_layers=beta.shape[0], num_groups=beta.shape[1], heads_per_group=1, head_dim=1,
                        page_size=page_size, num_pages=num_pages)
        self.cache = RaggedKVCache(spec, beta, windows=windows)
        self.window = self.cache.window
        self.dec = ServedDecode(self.cache)  # the served decode step (device block tables on CPU)
        self.V, self.P = spec.num_virtual, page_size
        self.mem = np.full(num_pages * page_size, np.nan)
        self.expect = {}      # rid -> list of V lists of slot values
        self.prefix_of = {}   # rid -> tuple of seg ids
        self.values = {}      # seg id -> V lists (values of the whole chain up to its end)
        self.parent = {}      # seg id -> parent seg id or None
        self.next_value, self.next_rid = 1.0, 0
        self.ops = 0
        self.checked = None   # the batch of the last capacity check (its step pages are reserved)

    # -- helpers ------------------------------------------------------------------------------
    def chain(self, seg_id):
        out = []
        while seg_id is not None:
            out.append(seg_id)
            seg_id = self.parent[seg_id]
        return out[::-1]

    def locked(self):
        return {s for p in self.prefix_of.values() for s in p}

    def leaves(self):
        inner = {p for p in self.parent.values() if p is not None}
        return [s for s in self.parent if s not in inner and s not in self.locked()]

    def ready(self):
        """Segments a match may end at (the tree's rule: their window pages are all there)."""
        return [s for s in self.parent
                if self.cache.window_ready([self.cache.store.get(x) for x in self.chain(s)])]

    def interior(self):
        return sorted({p for p in self.parent.values() if p is not None})

    def _write(self, rid, locs_by_v, counts):
        for v in range(self.V):
            k = int(counts[v])
            vals = self.next_value + np.arange(k)
            self.next_value += k
            self.mem[locs_by_v[v, :k]] = vals
            self.expect[rid][v] += vals.tolist()

    # -- operations -----------------------------------------------------------------------------
    def admit(self, chunks, decode, prefix_leaf):
        rid = self.next_rid
        self.next_rid += 1
        ids = tuple(self.chain(prefix_leaf)) if prefix_leaf is not None else ()
        segs = [self.cache.store.get(s) for s in ids]
        try:
            adm = self.cache.admit(rid, chunk_tokens=chunks, decode_tokens=decode, prefix=segs)
        except RequestTooLargeError:
            return None
        if adm is None:
            return None
        for src, dst in zip(adm.copy_src, adm.copy_dst):
            self.mem[dst * self.P : (dst + 1) * self.P] = self.mem[src * self.P : (src + 1) * self.P]
        self.expect[rid] = [list(x) for x in self.values[ids[-1]]] if ids else [[] for _ in range(self.V)]
        self.prefix_of[rid] = ids
        return rid

    def prefill(self, rid):
        req = self.cache.requests[rid]
        n = req.plan.chunk_tokens[len(req.chunk_ends)]
        w = self.cache.prefill_chunk(rid, n)
        self._write(rid, w.slot_locs.reshape(self.V, -1), w.counts.reshape(-1))
        if req.prefill_done:
            assert np.array_equal(req.taken, req.plan.prefill_pages)
            assert np.array_equal(req.reserved_left, req.plan.decode_pages)

    def capacity_check(self, rids) -> bool:
        """SGLang's capacity check: reserve the step's pages (a failed check retracts)."""
        if self.cache.reserve_decode_step(rids) > 0:
            self.retract(rids[0])
            return False
        self.checked = list(rids)
        return True

    def decode(self, rids, checked=False):
        """checked: as served, SGLang's capacity check reserves the step's pages first (then the
        step cannot fail, whatever ran between the check and the step)."""
        if checked and self.checked != list(rids) and not self.capacity_check(rids):
            return
        self.checked = None
        self.check()
        out = self.dec.step(rids)
        assert out is not None or not checked, "a checked decode step ran out of pages"
        if out is None:
            self.retract(rids[0])
            return
        for rid, locs in zip(rids, out.reshape(len(rids), self.V)):
            self._write(rid, locs[:, None], np.ones(self.V, np.int64))

    def finish_request(self, rid):
        if self.checked is not None and rid in self.checked:
            self.checked = None
        ids = self.prefix_of.pop(rid)
        expect = self.expect.pop(rid)
        parent = ids[-1] if ids else None
        for seg in finish(self.cache, rid):
            self.parent[seg.seg_id] = parent
            self.values[seg.seg_id] = [e[: seg.end_slots[v]] for v, e in enumerate(expect)]
            parent = seg.seg_id

    def retract(self, rid):
        if self.checked is not None and rid in self.checked:
            self.checked = None
        self.cache.release(rid)
        del self.prefix_of[rid], self.expect[rid]

    def evict(self, seg_id):
        self.cache.evict(seg_id)
        del self.parent[seg_id], self.values[seg_id]

    def split(self, seg_id, at):
        head, tail = self.cache.store.split(seg_id, at)
        vals = self.values.pop(seg_id)
        for s, p in list(self.parent.items()):
            if p == seg_id:
                self.parent[s] = tail.seg_id
        self.parent[head.seg_id] = self.parent.pop(seg_id)
        self.parent[tail.seg_id] = head.seg_id
        self.values[tail.seg_id] = vals
        self.values[head.seg_id] = [e[: head.end_slots[v]] for v, e in enumerate(vals)]

    def drop_window(self, seg_id):
        """The tree gives up matches ending at an interior segment: its window columns that its
        children's earliest end no longer reads are dropped."""
        kids = [self.cache.store.get(s) for s, p in self.parent.items() if p == seg_id]
        self.cache.drop_window_columns(seg_id, np.min([k.end_slots for k in kids], axis=0))

    def splittable(self):
        locked = self.locked()
        return [s for s in self.parent if s not in locked
                and not self.cache.store.get(s).compressed and self.cache.store.get(s).num_tokens > 1]

    # -- checks ---------------------------------------------------------------------------------
    def check(self):
        self.ops += 1
        self.cache.check_integrity()
        for rid, req in self.cache.requests.items():
            self._check_read(req.pages.pages, req.pages.lens, self.expect[rid], ready=True)
            self._check_window_held(req)
        for rid, (row, rec) in self.dec.rows.items():
            if self.cache.requests.get(rid) is rec:
                self.dec.tables.check(row, rec.pages)
        for seg_id in self.parent:
            segs = [self.cache.store.get(s) for s in self.chain(seg_id)]
            table, _, lens = assemble(segs, self.V, self.P)
            self._check_read(table, lens, self.values[seg_id], ready=self.cache.window_ready(segs))

    def _check_read(self, table, lens, expect, ready: bool):
        """Every live slot reads what was written there; full layers have every slot live, and
        where a query may come next (ready) window layers have their whole window live."""
        for v in range(self.V):
            s = np.arange(lens[v])
            page = table[v, s // self.P].astype(np.int64)
            need = s >= lens[v] - self.window[v] + 1 if self.window[v] and ready else self.window[v] == 0
            assert np.all(page[need] >= 0), f"v={v}: slots it reads were released"
            live = page >= 0
            got = self.mem[page[live] * self.P + s[live] % self.P]
            want = np.asarray(expect[v], dtype=np.float64)[live]
            assert got.tolist() == want.tolist(), f"v={v}: read {got.tolist()} expected {want.tolist()}"

    def _check_window_held(self, req):
        """A request holds at most the pages of its window and of one chunk in a window layer."""
        pages, W, P = req.pages, self.window, self.P
        chunk = max(req.plan.chunk_tokens, default=1)
        for v in np.flatnonzero(W):
            held = int(np.count_nonzero(pages.pages[v, : pages.npages[v]] >= 0))
            assert held <= -(-(W[v] - 1 + chunk) // P) + 1, f"v={v} holds {held} pages, window {W[v]}"


def random_op(model: PoolModel, rng: random.Random) -> None:
    """One random operation (used by the seeded soak loop)."""
    reqs = list(model.cache.requests.items())
    pending = [r for r, q in reqs if not q.prefill_done]
    ready = [r for r, q in reqs if q.prefill_done]
    choice = rng.random()
    if choice < 0.25 or not reqs:
        leaves = model.ready()
        prefix = rng.choice(leaves) if leaves and rng.random() < 0.7 else None
        chunks = [rng.randint(1, 12) for _ in range(rng.randint(0, 3))]
        if model.admit(chunks, rng.randint(0, 6), prefix) is None and model.leaves():
            model.evict(rng.choice(model.leaves()))  # as a scheduler would: evict, retry later
    elif choice < 0.5 and pending:
        model.prefill(rng.choice(pending))
    elif choice < 0.7 and ready:
        pick = rng.random()
        if pick < 0.25:   # check now, decode later: other operations may run in between
            model.capacity_check(rng.sample(ready, rng.randint(1, len(ready))))
        elif pick < 0.5 and model.checked is not None:
            model.decode(model.checked, checked=True)
        else:
            model.decode(rng.sample(ready, rng.randint(1, len(ready))), checked=rng.random() < 0.5)
    elif choice < 0.8:
        model.finish_request(rng.choice([r for r, _ in reqs]))
    elif choice < 0.85:
        model.retract(rng.choice([r for r, _ in reqs]))
    elif choice < 0.92 and model.leaves():
        model.evict(rng.choice(model.leaves()))
    elif choice < 0.95 and model.interior():
        model.drop_window(rng.choice(model.interior()))
    elif model.splittable():
        seg_id = rng.choice(model.splittable())
        model.split(seg_id, rng.randint(1, model.cache.store.get(seg_id).num_tokens - 1))
    model.check()


def soak(model: PoolModel, rng: random.Random, ops: int = 700) -> int:
    """ops random operations, then every request leaves and the tree empties: every page must be
    free again (nothing leaked). Returns the operations checked."""
    for _ in range(ops):
        random_op(model, rng)
    for rid in list(model.cache.requests):
        model.retract(rid)
    while model.leaves():
        model.evict(model.leaves()[0])
    model.check()
    assert model.cache.pool.num_free == model.cache.spec.num_pages
    return model.ops


def test_seeded_soak_thousands_of_operations():
    total = 0
    for seed in range(6):
        rng = random.Random(seed)
        page_size = [1, 2, 3, 4, 8, 5][seed]
        beta = np.array([[rng.choice([1e-3, 0.1, 0.25, 0.5, 0.9, 1.0]) for _ in range(2)] for _ in range(2)])
        total += soak(PoolModel(page_size, rng.randint(12, 80), beta), rng)
    assert total > 4000


def test_seeded_soak_with_window_layers():
    """Window layers (kept whole, released as the queries move on) beside compressed full layers."""
    total = 0
    for seed in range(4):
        rng = random.Random(100 + seed)
        page_size = [1, 2, 3, 4][seed]
        windows = [rng.randint(1, 9), 0, rng.randint(1, 9)]
        beta = np.array([[1.0, 1.0] if w else [rng.choice([0.1, 0.5, 1.0]) for _ in range(2)] for w in windows])
        total += soak(PoolModel(page_size, rng.randint(20, 80), beta, windows=windows), rng)
    assert total > 2000


class PoolMachine(RuleBasedStateMachine):
    @initialize(page_size=st.integers(1, 5), num_pages=st.integers(6, 60),
                beta=st.lists(st.sampled_from([1e-3, 0.1, 0.3, 0.5, 0.75, 1.0]), min_size=4, max_size=4),
                window=st.sampled_from([0, 0, 1, 2, 5]))
    def setup(self, page_size, num_pages, beta, window):
        beta = np.array(beta).reshape(2, 2)
        if window:  # layer 0 becomes a sliding-window layer (kept whole)
            beta[0] = 1.0
        self.model = PoolModel(page_size, num_pages, beta, windows=[window, 0])

    @rule(chunks=st.lists(st.integers(1, 10), max_size=3), decode=st.integers(0, 5), data=st.data())
    def admit(self, chunks, decode, data):
        leaves = self.model.ready()
        prefix = data.draw(st.sampled_from([None, *leaves]))
        self.model.admit(chunks, decode, prefix)

    @precondition(lambda self: any(not q.prefill_done for q in self.model.cache.requests.values()))
    @rule(data=st.data())
    def prefill(self, data):
        pending = [r for r, q in self.model.cache.requests.items() if not q.prefill_done]
        self.model.prefill(data.draw(st.sampled_from(pending)))

    @precondition(lambda self: any(q.prefill_done for q in self.model.cache.requests.values()))
    @rule(data=st.data(), checked=st.booleans())
    def decode(self, data, checked):
        ready = [r for r, q in self.model.cache.requests.items() if q.prefill_done]
        self.model.decode(data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True)), checked)

    @precondition(lambda self: any(q.prefill_done for q in self.model.cache.requests.values()))
    @rule(data=st.data())
    def capacity_check(self, data):
        ready = [r for r, q in self.model.cache.requests.items() if q.prefill_done]
        self.model.capacity_check(data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True)))

    @precondition(lambda self: self.model.checked is not None)
    @rule()
    def decode_checked(self):
        """The step SGLang runs after its check; other rules may have run in between."""
        self.model.decode(self.model.checked, checked=True)

    @precondition(lambda self: self.model.cache.requests)
    @rule(data=st.data(), cache=st.booleans())
    def release(self, data, cache):
        rid = data.draw(st.sampled_from(sorted(self.model.cache.requests)))
        self.model.finish_request(rid) if cache else self.model.retract(rid)

    @precondition(lambda self: self.model.leaves())
    @rule(data=st.data())
    def evict(self, data):
        self.model.evict(data.draw(st.sampled_from(self.model.leaves())))

    @precondition(lambda self: self.model.splittable())
    @rule(data=st.data())
    def split(self, data):
        seg_id = data.draw(st.sampled_from(self.model.splittable()))
        at = data.draw(st.integers(1, self.model.cache.store.get(seg_id).num_tokens - 1))
        self.model.split(seg_id, at)

    @precondition(lambda self: self.model.interior())
    @rule(data=st.data())
    def drop_window(self, data):
        self.model.drop_window(data.draw(st.sampled_from(self.model.interior())))

    @invariant()
    def integrity(self):
        if hasattr(self, "model"):
            self.model.check()


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
