"""DeviceBlockTables: every SGLang request row's ragged block table, resident on the device.

The host pool (RequestPages per request) stays the truth; this is its mirror in
the layout the attention kernels read, kept in step incrementally so that a
decode step costs the host O(batch x virtual layers) integer work and the
device no copy of any table, whatever the context length (the paper's
vectorized block table, 4.2.3):

    pages  int32 [L, R, G, W]  page ids of (layer l, row r, group g); 0 past the
                               row's pages (a valid id, never read past lens)
    lens   int32 [R, V]        slots held, v = l * G + g

R (SGLang req_pool_idx rows) and W (pages of the longest (row, v)) grow by
doubling when a larger row or page count shows up, until ``freeze``: CUDA-graph
decode reads the tables at captured addresses, so they are then allocated once at
their largest size (every SGLang row, the longest context) plus a scratch row
whose lens stay 0 (the rows of a graph batch's padding entries).

* ``load``: whole rows copied from the host (a request's first extend, a stale row).
* ``extend``: a row that already mirrors the request gets only the columns its chunk opened
  (and its newly released window columns zeroed): O(chunk), where a reload is O(context).
* ``chunk_slots``: the flat slots an extend batch writes, per layer, computed on the device
  from the tables and the host-known counts (no sync).
* ``decode``: one new slot per (row, v). The host sends only the rows and the pages
  this step opened, in one host-to-device copy; the slots to write and the new
  lengths are computed on the device, with no sync. Decode attention then reads
  ``pages[l]`` ([R, G, W], every row) through the batch's ``rows`` (no gather).

``check`` compares a row with the host truth (the integrity check).
"""

from __future__ import annotations

import numpy as np
import torch

from tangram_sglang.pool import native
from tangram_sglang.pool.block_table import build_layer_tables
from tangram_sglang.pool.request_pages import RequestPages, ragged_index
from tangram_sglang.pool.spec import PoolError


class DeviceBlockTables:
    def __init__(self, num_layers: int, num_groups: int, page_size: int, device, rows: int = 8, width: int = 8):
        self.num_layers, self.num_groups, self.page_size = num_layers, num_groups, page_size
        self.device = torch.device(device)
        self.pages = torch.zeros(num_layers, rows, num_groups, width, dtype=torch.int32, device=self.device)
        self.lens = torch.zeros(rows, num_layers * num_groups, dtype=torch.int32, device=self.device)
        v = torch.arange(num_layers * num_groups, device=self.device)
        self._layer, self._group = (v // num_groups)[None, :], (v % num_groups)[None, :]   # [1, V]
        self.owner: dict[int, object] = {}   # row -> rid whose pages it mirrors
        self.scratch_row: int | None = None  # set by freeze

    def freeze(self, rows: int, width: int) -> None:
        """Allocate room for rows 0..rows-1 and width pages per (row, v) once, plus the scratch
        row (index rows); no growth after (a larger row or width raises PoolError). Rows
        already mirrored are kept."""
        L, old_rows, G, cap = self.pages.shape
        if rows < old_rows or width < cap:
            raise PoolError(f"device block tables: cannot freeze at {rows} rows x {width} pages, "
                            f"below the {old_rows} x {cap} already held")
        self._ensure(rows, width, exact=True)
        self.scratch_row = rows

    def nbytes(self) -> int:
        return self.pages.numel() * self.pages.element_size() + self.lens.numel() * self.lens.element_size()

    @property
    def num_virtual(self) -> int:
        return self.num_layers * self.num_groups

    def _ensure(self, max_row: int, width: int, exact: bool = False) -> None:
        L, rows, G, cap = self.pages.shape
        if max_row < rows and width <= cap:
            if self.scratch_row is not None and max_row == self.scratch_row:
                raise PoolError(f"device block tables: row {max_row} is the graph scratch row")
            return
        if self.scratch_row is not None:
            raise PoolError(f"device block tables frozen at {self.scratch_row} rows x {cap} pages for CUDA "
                            f"graphs: row {max_row} with {width} pages does not fit")
        new_rows = max_row + 1 if exact else (rows if max_row < rows else max(2 * rows, max_row + 1))
        new_cap = width if exact else (cap if width <= cap else max(2 * cap, width))
        pages = torch.zeros(L, new_rows, G, new_cap, dtype=torch.int32, device=self.device)
        pages[:, :rows, :, :cap] = self.pages
        lens = torch.zeros(new_rows, L * G, dtype=torch.int32, device=self.device)
        lens[:rows] = self.lens
        self.pages, self.lens = pages, lens

    def _rows(self, rows) -> torch.Tensor:
        return torch.as_tensor(rows, dtype=torch.int64).to(self.device)

    def load(self, rows: list[int], rids: list, host: list[RequestPages]) -> None:
        """Copy whole rows from the host pool (pages and lens as they are now); zeros past each row's
        pages up to the batch's widest."""
        arena = host[0].arena
        if self.device.type == "cpu" and native.enabled() and all(h.arena is arena for h in host):
            return self._load_in_place(rows, rids, host, arena)
        table, lens = build_layer_tables(host, self.num_layers, self.num_groups)   # [B, L, G, W], [B, L, G]
        width = table.shape[-1]
        self._ensure(max(rows), width)
        idx = self._rows(rows)
        self.pages[:, idx, :, :width] = torch.from_numpy(table).to(self.device).transpose(0, 1)
        self.lens[idx] = torch.from_numpy(lens).to(self.device).view(len(rows), -1)
        for r, rid in zip(rows, rids):
            self.owner[int(r)] = rid

    def _load_in_place(self, rows, rids, host, arena) -> None:
        """load for tables in host memory, by the native loop: every column of each row written in place."""
        slots = np.asarray([h.slot for h in host], np.int64)
        npages = arena.npages[slots]
        width = max(int(npages.max(initial=0)), 1)
        self._ensure(max(rows), width)
        native.new_columns(arena, slots, np.asarray(rows, np.int64), np.zeros(npages.shape, np.int64), npages,
                           tuple(self.pages.shape), self.pages.numpy(), zero_to=width)
        self.lens[self._rows(rows)] = torch.from_numpy(arena.lens[slots])
        for r, rid in zip(rows, rids):
            self.owner[int(r)] = rid

    def extend(self, rows: list[int], rids: list, host: list[RequestPages], npages_before: np.ndarray,
               dead_before: np.ndarray) -> None:
        """Bring rows up to date after each request drew its chunk's pages: rows that mirror
        their request get the new columns [npages_before, npages) and zeros over the window
        columns released since ([dead_before, dead)); the others are loaded whole.
        npages_before, dead_before: int [B, V], the host's counts before the chunk."""
        fresh = [i for i, (r, rid) in enumerate(zip(rows, rids)) if not self.mirrors(r, rid)]
        if fresh:
            self.load([rows[i] for i in fresh], [rids[i] for i in fresh], [host[i] for i in fresh])
        keep = sorted(set(range(len(rows))) - set(fresh))
        if not keep:
            return
        arena = host[keep[0]].arena
        whole = all(host[i].arena is arena for i in keep) and np.array_equal(
            dead_before[keep], arena.dead[[host[i].slot for i in keep]])
        self._ensure(max(rows[i] for i in keep), max(int(host[i].npages.max(initial=1)) for i in keep))
        if whole and native.enabled():
            slots = np.asarray([host[i].slot for i in keep], np.int64)
            npages = arena.npages[slots]
            on_host = self.pages.numpy() if self.device.type == "cpu" else None   # written in place there
            cols = native.new_columns(arena, slots, np.asarray(rows, np.int64)[keep],
                                      np.minimum(npages_before[keep], npages).astype(np.int64), npages,
                                      tuple(self.pages.shape), on_host)
            lens = arena.lens[slots]
            if cols is None:
                self.lens[self._rows([rows[i] for i in keep])] = torch.from_numpy(lens.astype(np.int32))
                return
            at, val = cols
        else:
            if whole:
                r, v, col, val, lens = self._new_columns(rows, host, keep, npages_before)
            else:   # window columns released (or pages of several arenas): row by row
                r, v, col, val, lens = self._new_columns_by_row(rows, host, keep, npages_before, dead_before)
            _, R, G, W = self.pages.shape
            layer, g = np.divmod(v, G)
            at = ((layer * R + r) * G + g) * W + col                         # flat: one index, fast
        self.pages.view(-1)[torch.from_numpy(at).to(self.device)] = torch.from_numpy(val.astype(np.int32)).to(self.device)
        self.lens[self._rows([rows[i] for i in keep])] = torch.from_numpy(lens.astype(np.int32)).to(self.device)

    @staticmethod
    def _new_columns(rows, host, keep, npages_before):
        """The entries the kept rows' chunks opened, over (kept row x v) at once: (row, v, column,
        page id) int64 [n] each, in the order _new_columns_by_row lists them, and lens [K, V]."""
        arena = host[keep[0]].arena
        slots = np.asarray([host[i].slot for i in keep], np.int64)
        npages = arena.npages[slots].astype(np.int64)                        # [K, V]
        first = np.minimum(npages_before[keep], npages).astype(np.int64)
        K, V = npages.shape
        flat, col = ragged_index((npages - first).reshape(-1))
        k, v = np.divmod(flat, V)
        col = col + first.reshape(-1)[flat]
        cap = arena.pages.shape[2]
        val = np.maximum(arena.pages.reshape(-1).take((np.repeat(slots, V)[flat] * V + v) * cap + col), 0)
        return np.asarray(rows, np.int64)[np.asarray(keep)[k]], v, col, val, arena.lens[slots]

    @staticmethod
    def _new_columns_by_row(rows, host, keep, npages_before, dead_before):
        """_new_columns one kept row at a time, with the window columns each released since
        (zeros over [dead_before, dead)) after its new columns."""
        parts = []   # (row, v, column, page id) of each entry to set, per kept row
        for i in keep:
            h = host[i]
            first = np.minimum(npages_before[i], h.npages).astype(np.int64)
            v, col = ragged_index(h.npages - first)
            col = col + first[v]
            gone = np.minimum(dead_before[i], h.dead).astype(np.int64)
            vd, cd = ragged_index(h.dead - gone)
            parts.append((np.full(v.size + vd.size, rows[i], np.int64), np.concatenate([v, vd]),
                          np.concatenate([col, cd + gone[vd]]),
                          np.concatenate([np.maximum(h.pages[v, col], 0), np.zeros(vd.size, np.int32)])))
        r, v, col, val = (np.concatenate(x) for x in zip(*parts))
        return r, v, col, val, np.stack([host[i].lens for i in keep])

    def chunk_slots(self, rows: torch.Tensor, before: torch.Tensor, counts: np.ndarray) -> list[torch.Tensor]:
        """The flat slots an extend batch writes, per layer: int64 [sum over (b, g) of counts[b, l, g]]
        in (b, g, j) order (pool/block_table.chunk_slots_reference computes the same on the host).
        rows int64 [B] and before int32 [B, V] (slots cached before the chunk) on the device; counts
        int [B, L, G] on the host, so every size is known without a sync. The rows' tables must
        already hold the chunk's pages (extend / load)."""
        B, L, G = counts.shape
        P = self.page_size
        order = np.ascontiguousarray(counts.transpose(1, 0, 2), dtype=np.int64).reshape(-1)   # [L * B * G]
        per_layer = order.reshape(L, -1).sum(1)
        total = int(per_layer.sum())
        n = torch.from_numpy(order).to(self.device)
        run = torch.repeat_interleave(torch.arange(order.size, device=self.device), n, output_size=total)
        j = torch.arange(total, device=self.device) - (torch.cumsum(n, 0) - n)[run]
        layer, b, g = run // (B * G), (run // G) % B, run % G
        slot = before[b, layer * G + g].to(torch.int64) + j
        page = self.pages[layer, rows[b], g, slot // P].to(torch.int64)
        return list(torch.split(page * P + slot % P, per_layer.tolist()))

    def mirrors(self, row: int, rid) -> bool:
        return self.owner.get(int(row)) == rid

    def forget(self, row: int, rid) -> None:
        if self.owner.get(int(row)) == rid:
            del self.owner[int(row)]

    def decode(self, rows: list[int], opened: np.ndarray, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one slot to every v of every row. Returns (the batch's rows int64 [B] on the
        device, the slots to write int64 [B, V]).

        opened: int64 [n, 3] (batch index, v, page id) of the pages this step opened (the
        host appended them; their column is the row's lens // P before the step). width: the
        largest page count of the batch after the step.
        """
        P, B = self.page_size, len(rows)
        self._ensure(max(rows), width)
        packed = np.concatenate([np.asarray(rows, np.int64), np.asarray(opened, np.int64).reshape(-1)])
        dev = torch.from_numpy(packed).to(self.device, non_blocking=True)
        r, new = dev[:B], dev[B:].view(-1, 3)
        lens = self.lens.index_select(0, r)                                   # [B, V]
        col = (lens // P).to(torch.int64)
        if new.shape[0]:
            b, v = new[:, 0], new[:, 1]
            self.pages[self._layer[0, v], r[b], self._group[0, v], col[b, v]] = new[:, 2].to(torch.int32)
        page = self.pages[self._layer, r[:, None], self._group, col].to(torch.int64)   # [B, V]
        self.lens.index_copy_(0, r, lens + 1)
        return r, page * P + (lens % P).to(torch.int64)

    def seq_lens(self, rows: torch.Tensor) -> torch.Tensor:
        """int32 [L, B, G]: slots held by each (layer, batch entry, group)."""
        lens = self.lens.index_select(0, rows)
        return lens.view(len(rows), self.num_layers, self.num_groups).permute(1, 0, 2).contiguous()

    def view(self, rows: list[int], width: int, lens: torch.Tensor | None = None):
        """(block_table int32 [L, B, G, width], seq_lens int32 [L, B, G]) of rows, gathered.

        lens: int32 [B, V] to report instead of the rows' own (an extend reads the slots
        cached before its chunk)."""
        r = self._rows(rows)
        table = self.pages[:, r, :, :width]
        if lens is None:
            return table, self.seq_lens(r)
        return table, lens.view(len(rows), self.num_layers, self.num_groups).permute(1, 0, 2).contiguous()

    def check_scratch(self) -> None:
        """Raise PoolError if a graph padding entry ever grew the scratch row."""
        if self.scratch_row is not None and bool((self.lens[self.scratch_row] != 0).any()):
            raise PoolError("device block tables: the graph scratch row holds slots")

    def check(self, row: int, host: RequestPages) -> None:
        """Raise PoolError if the device row differs from the host pool's pages or lens. A window
        layer's released columns (-1 on the host) are not mirrored: no query reads them."""
        n = host.npages
        width = int(n.max(initial=0))
        lens = self.lens[row].cpu().numpy()
        if not np.array_equal(lens, host.lens):
            raise PoolError(f"device block table row {row}: lens differ from the host pool")
        if width > self.pages.shape[3]:
            raise PoolError(f"device block table row {row}: {width} pages on the host, room for {self.pages.shape[3]}")
        dev = self.pages[:, row, :, :width].reshape(self.num_virtual, width).cpu().numpy()
        held = (np.arange(width)[None, :] < n[:, None]) & (host.pages[:, :width] >= 0)
        if not np.array_equal(dev[held], host.pages[:, :width][held]):
            raise PoolError(f"device block table row {row}: page ids differ from the host pool")

