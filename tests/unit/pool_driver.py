"""Drive a RaggedKVCache through the calls serving makes, for the pool tests (not a test module).

The pool has only its production calls. A finished request is ``publish(rid,
include_tail=True)`` then ``release(rid)`` (sglang/radix.py); an aborted or retracted one
is ``release(rid)``. The slots a decode step writes come from the device block tables
(serving/block_tables.py, here on CPU) fed with the step's opened pages and width, as
serving/runtime.py does; ``slots_from_pages`` computes them independently from the
request's host pages, only to check them.
"""

from __future__ import annotations

import numpy as np

from tangram_sglang.serving.block_tables import DeviceBlockTables


def finish(cache, rid) -> list:
    """The request finished: its chunks and generated tokens become tree segments, then it leaves."""
    segs = cache.publish(rid, include_tail=True)
    cache.release(rid)
    return segs


def slots_from_pages(cache, rids) -> np.ndarray:
    """int64 [B, V]: flat id of the last slot (lens - 1) of every v of each request, from its host
    pages (slot s of v lives in page pages[v, s // P] at offset s % P: id page * P + s % P)."""
    P = cache.spec.page_size
    out = np.zeros((len(rids), cache.spec.num_virtual), np.int64)
    for i, rid in enumerate(rids):
        pages = cache.requests[rid].pages
        s = pages.lens.astype(np.int64) - 1
        assert (s >= 0).all()
        page = pages.pages[np.arange(s.size), s // P].astype(np.int64)
        assert (page >= 0).all(), "a slot past the request's pages"
        out[i] = page * P + s % P
    return out


class ServedDecode:
    """The served decode step on CPU: ``cache.decode_step`` appends the pages the step opens,
    then ``DeviceBlockTables.decode`` computes the slots to write (serving/runtime.py
    decode_metadata). A request gets a table row at its first step once its prefill is done,
    loaded from its host pages (as after its extend); the row of a request that left the pool,
    or was admitted again under the same rid, is given up. Every step's slots are checked
    against ``slots_from_pages`` and the batch's rows against the host pages."""

    def __init__(self, cache):
        s = cache.spec
        self.cache = cache
        self.tables = DeviceBlockTables(s.num_layers, s.num_groups, s.page_size, "cpu", rows=2, width=1)
        self.rows: dict = {}          # rid -> (row, the RequestRecord it mirrors)
        self.free_rows: list[int] = []
        self.next_row = 0

    def _sync(self, rids) -> None:
        for rid, (row, rec) in list(self.rows.items()):
            if self.cache.requests.get(rid) is not rec:
                self.tables.forget(row, rid)
                del self.rows[rid]
                self.free_rows.append(row)
        for rid in rids:
            rec = self.cache.requests.get(rid)
            if rid in self.rows or rec is None or not rec.prefill_done:
                continue
            if self.free_rows:
                row = self.free_rows.pop()
            else:
                row, self.next_row = self.next_row, self.next_row + 1
            self.tables.load([row], [rid], [rec.pages])
            self.rows[rid] = (row, rec)

    def step(self, rids) -> np.ndarray | None:
        """One decode step of rids: int64 [B, L, G] slots to write, or None (the pool had no
        pages for it; nothing changed). Raises PoolError as decode_step does."""
        rids = list(rids)
        self._sync(rids)
        step = self.cache.decode_step(rids)
        if step is None:
            return None
        rows = [self.rows[r][0] for r in rids]
        rows_t, locs = self.tables.decode(rows, step.opened, step.width)
        assert rows_t.tolist() == rows
        got = locs.numpy()
        assert np.array_equal(got, slots_from_pages(self.cache, rids)), "device write slots differ from the pages"
        for rid, row in zip(rids, rows):
            self.tables.check(row, self.cache.requests[rid].pages)
        s = self.cache.spec
        return got.reshape(len(rids), s.num_layers, s.num_groups)
