"""Static decode inputs for CUDA graphs: what forward_decode reads, at fixed addresses.

A captured decode graph replays its kernels on the tensors they read at capture.
The eager decode plan (TangramServing.decode_metadata) makes fresh tensors each
step, so under a graph each step's plan is copied into these buffers, sized for
the largest captured batch, and the batch is padded to its bucket:

    rows     int64 [max_bs]          table row of entry b (padding: the scratch row,
                                     whose lens stay 0, so its attention reads nothing)
    seq_lens int32 [L, max_bs, G]    slots per (layer, entry, group) (padding: 0)
    out_loc  int64 [L, max_bs * G]   slot each entry's new K/V goes to (padding: the
                                     pool's scratch page, never read)

The block tables themselves are DeviceBlockTables frozen at their largest size.
DecodeGraph holds both for one served pool; the attention backend and the GPU
check of benchmarks/timing/gpu_decode.py drive it the same way.
"""

from __future__ import annotations

import torch

from tangram_sglang.serving.runtime import ForwardPlan


class DecodeGraph:
    """Decode-graph state of one served pool (TangramServing): frozen tables, static buffers.

    rows: SGLang request rows to hold (0..rows-1); context_len: the longest request, in
    tokens (the tables' width is its pages, plus one)."""

    def __init__(self, serving, max_bs: int, rows: int, context_len: int, device):
        spec = serving.spec
        serving.tables.freeze(rows, -(-int(context_len) // spec.page_size) + 1)
        self.serving = serving
        self.buffers = DecodeGraphBuffers(max_bs, spec.num_layers, spec.num_groups, serving.tables.scratch_row,
                                          serving.data.scratch_page * spec.page_size, device)

    def prepare(self, rids, bs: int) -> ForwardPlan:
        """The plan of a graph batch of bs entries: the requests rids (host control plane as in
        eager decode: one slot appended per (request, layer, group)), then padding. rids
        empty: a capture (all padding, nothing appended)."""
        raw = len(rids)
        plan = self.serving.decode_metadata(rids) if raw else None
        self.buffers.load(plan, raw, bs)
        return self.buffers.plan(bs, self.serving.tables.pages)


class DecodeGraphBuffers:
    def __init__(self, max_bs: int, num_layers: int, num_groups: int, scratch_row: int, scratch_slot: int,
                 device):
        self.max_bs, self.num_layers, self.num_groups = max_bs, num_layers, num_groups
        self.scratch_row, self.scratch_slot = scratch_row, scratch_slot
        self.rows = torch.full((max_bs,), scratch_row, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(num_layers, max_bs, num_groups, dtype=torch.int32, device=device)
        self.out_loc = torch.full((num_layers, max_bs * num_groups), scratch_slot, dtype=torch.int64, device=device)

    def plan(self, bs: int, block_table: torch.Tensor) -> ForwardPlan:
        """The plan of a bs-entry graph batch: views of the buffers (fixed addresses)."""
        self._check(bs)
        G = self.num_groups
        return ForwardPlan(block_table=block_table, seq_lens=self.seq_lens[:, :bs],
                           out_loc=[self.out_loc[l, : bs * G] for l in range(self.num_layers)],
                           rows=self.rows[:bs])

    def load(self, plan: ForwardPlan | None, raw_bs: int, bs: int) -> None:
        """Copy the eager plan of the raw_bs real entries in (device copies, no sync) and pad
        entries raw_bs..bs-1. plan None: every entry is padding (capture)."""
        self._check(bs)
        if raw_bs > bs:
            raise ValueError(f"graph batch of {bs} entries given {raw_bs} requests")
        G = self.num_groups
        if raw_bs:
            self.rows[:raw_bs].copy_(plan.rows)
            self.seq_lens[:, :raw_bs].copy_(plan.seq_lens)
            self.out_loc[:, : raw_bs * G].copy_(torch.stack(plan.out_loc))
        self.rows[raw_bs:bs].fill_(self.scratch_row)
        self.seq_lens[:, raw_bs:bs].zero_()
        self.out_loc[:, raw_bs * G: bs * G].fill_(self.scratch_slot)

    def _check(self, bs: int) -> None:
        if not 0 < bs <= self.max_bs:
            raise ValueError(f"graph batch of {bs} entries: buffers hold 1..{self.max_bs}")
