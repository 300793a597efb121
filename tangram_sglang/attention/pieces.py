"""Cut every (request, group) slot range into pieces and gather their K/V.

A piece is a contiguous run of slots of one item (b, g): (item, start, length)
with length >= 1 (empty pieces are never made, so every gathered row of a
piece points at written, finite K/V). Two cuts, both vectorized:

- split_pieces: the split map's cut, S[g] pieces per item (what the GPU
  kernels do; the torch path uses it to mirror them exactly);
- tile_pieces: fixed tiles of ``tile`` slots, the CPU data plane's cut (reads
  the KV it needs plus less than one tile per item).

Worked example, seq_lens [[5, 0]], S = [2, 1]: split_pieces -> item [0, 0],
start [0, 3], length [3, 2]; tile_pieces(tile=4) -> item [0, 0], start [0, 4],
length [4, 1]. Item ids are b * G + g. Both take ``first`` (int [B, G], a sliding-window
layer's first slot to read, window_start): the cut then covers slots first .. seq_len - 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Pieces:
    """item, start, length: int64 [NP] (length >= 1); num_items = B * G."""

    item: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    num_items: int

    @property
    def width(self) -> int:
        """Longest piece (0 when there are none): the padded gather width."""
        return int(self.length.max()) if self.length.numel() else 0


def _cut(lens: torch.Tensor, piece_len: torch.Tensor, offset: torch.Tensor | None = None) -> Pieces:
    """lens, piece_len: int64 [NI] (piece_len >= 1). Consecutive pieces of piece_len slots, from slot
    offset (int64 [NI], default 0) on: lens counts the slots from offset."""
    count = torch.div(lens + piece_len - 1, piece_len, rounding_mode="floor")
    item = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), count)
    first = torch.cumsum(count, 0) - count
    index = torch.arange(item.numel(), device=lens.device) - first[item]
    start = index * piece_len[item]
    length = torch.minimum(piece_len[item], lens[item] - start)
    if offset is not None:
        start = start + offset[item]
    return Pieces(item, start, length, lens.numel())


def window_start(query_pos: torch.Tensor, window: int) -> torch.Tensor:
    """First slot a query at position query_pos (int, any shape) reads in a layer of window
    ``window`` (it sees itself and window - 1 positions before it); int64, >= 0."""
    return torch.clamp(query_pos.to(torch.int64) - (window - 1), min=0)


def _from_first(seq_lens: torch.Tensor, first: torch.Tensor | None):
    lens = seq_lens.to(torch.int64).reshape(-1)
    if first is None:
        return lens, None
    first = first.to(torch.int64).reshape(-1)
    return torch.clamp(lens - first, min=0), first


def split_pieces(seq_lens: torch.Tensor, splits: torch.Tensor, first: torch.Tensor | None = None) -> Pieces:
    """seq_lens int [B, G]; splits int [G]; first int [B, G] or None -> the non-empty pieces of the
    split map's cut."""
    lens, first = _from_first(seq_lens, first)
    s = splits.to(torch.int64).to(lens.device).expand(seq_lens.shape).reshape(-1)
    piece_len = torch.clamp(torch.div(lens + s - 1, s, rounding_mode="floor"), min=1)
    return _cut(lens, piece_len, first)


def tile_pieces(seq_lens: torch.Tensor, tile: int, first: torch.Tensor | None = None) -> Pieces:
    """seq_lens int [B, G]; first int [B, G] or None -> pieces of at most ``tile`` slots."""
    lens, first = _from_first(seq_lens, first)
    return _cut(lens, torch.full_like(lens, tile), first)


def piece_slots(pieces: Pieces, block_table: torch.Tensor, page_size: int, rows: torch.Tensor | None = None):
    """Flat pool slots of every piece, padded to the longest.

    block_table: int [B, G, max_pages], contiguous; or, with rows (int64 [B]), [R, G, max_pages]
    where batch entry b reads row rows[b]. Returns (loc int64 [NP, W], valid bool [NP, W]);
    padding columns repeat the piece's first slot (written data, never garbage).
    """
    col = torch.arange(pieces.width, device=pieces.start.device)
    valid = col < pieces.length[:, None]
    pos = torch.where(valid, col, 0).add_(pieces.start[:, None])
    page_of, offset = _page_and_offset(pos, page_size)
    item = pieces.item
    if rows is not None:
        groups = block_table.shape[1]
        item = rows.index_select(0, torch.div(item, groups, rounding_mode="floor")) * groups + item % groups
    page_of.add_((item * block_table.shape[-1])[:, None])
    page = block_table.reshape(-1).index_select(0, page_of.view(-1)).view(pos.shape).to(torch.int64)
    return page.mul_(page_size).add_(offset), valid


def _page_and_offset(pos: torch.Tensor, page_size: int):
    """(pos // page_size, pos % page_size); shifts when page_size is a power of two (int64 div is slow)."""
    if page_size & (page_size - 1) == 0:
        return pos >> (page_size.bit_length() - 1), pos & (page_size - 1)
    return torch.div(pos, page_size, rounding_mode="floor"), pos % page_size
