"""RequestPages: one request's page lists and slot counts, for all V virtual layers at once.

    pages   int32 [V, capacity]  page ids, row v valid in [:npages[v]], rest -1
    npages  int32 [V]
    lens    int32 [V]            slots written (dense: slot s -> page pages[v, s // P], offset s % P)

The arrays are slot ``slot`` of a PageArena ([S, V, capacity] / [S, V]), shared by
every request of a RaggedKVCache so that a decode step updates a whole batch with a
few array operations (RaggedKVCache.decode_step); a RequestPages made on its own
gets a private one-slot arena. The attributes are views into the arena: read them
fresh after an append (the arena may grow), and assign them (npages, lens) to write.

Invariant kept by every caller: npages == ceil(lens / P) once a write is done
(pages are appended just before the slots that need them).

A sliding-window layer's columns below its window are released while the request runs
(RaggedKVCache trims them): page id -1 inside [:npages] marks such a dead column, and
``dead[v]`` counts them (columns [0, dead[v]) of row v are -1). Slots keep their positions.

Worked example, P=2, V=2: append(counts=[2, 1], ids=[7, 3, 9]) gives
pages [[7, 3], [9, -1]]; advance([3, 1]) gives lens [3, 1];
slot_locs(counts=[3, 1]) from lens [0, 0] -> [[14, 15, 6], [18, -1, -1]]
(slot 2 of v=0 is page 3 offset 0 -> 3*2+0 = 6).
"""

from __future__ import annotations

import numpy as np

from tangram_sglang.pool.spec import PoolError


def div_mod(x: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """(x // p, x % p); shifts and masks when p is a power of two (integer division is slow)."""
    if p & (p - 1) == 0:
        return x >> (p.bit_length() - 1), x & (p - 1)
    return x // p, x % p


def fast_mod(x: np.ndarray, p: int) -> np.ndarray:
    """x % p; a mask when p is a power of two."""
    return x & (p - 1) if p & (p - 1) == 0 else x % p


def ragged_index(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For counts [V]: (row of each item, position of the item inside its row), both [sum(counts)].

    counts [2, 0, 3] -> rows [0, 0, 2, 2, 2], positions [0, 1, 0, 1, 2].
    """
    counts = np.asarray(counts, dtype=np.int64)
    rows = np.repeat(np.arange(counts.size), counts)
    starts = np.cumsum(counts) - counts
    return rows, np.arange(rows.size) - starts[rows]


def flat_slot_locs(pages: np.ndarray, offset: np.ndarray, counts: np.ndarray, page_size: int) -> np.ndarray:
    """(page, offset) runs -> flat slot ids, no per-slot division. pages [..., W], offset/counts [...].

    Returns int64 [..., max(counts)], -1 past counts. Example, P=2: pages [[7, 3]], offset [1],
    counts [3] -> [[15, 6, 7]].
    """
    counts = np.asarray(counts, dtype=np.int64)
    lead, width = pages.shape[:-1], pages.shape[-1]
    k = int(counts.max(initial=0))
    rows = pages.reshape(-1, width).astype(np.int64) * page_size
    full = (rows[:, :, None] + np.arange(page_size)[None, None, :]).reshape(rows.shape[0], -1)
    full = np.concatenate([full, np.zeros((rows.shape[0], max(0, k + page_size - full.shape[1])), np.int64)], axis=1)
    idx = np.asarray(offset, np.int64).reshape(-1, 1) + np.arange(k)[None, :]
    out = np.take_along_axis(full, idx, axis=1)
    out[np.arange(k)[None, :] >= counts.reshape(-1, 1)] = -1
    return out.reshape(*lead, k)


class PageArena:
    """Per-request arrays of many requests, one slot each: pages int32 [S, V, capacity] (-1
    padded), npages, lens, reserved_left, taken, dead int32 [S, V]. Slots are reused; S and
    capacity grow by doubling.

    A free slot's page rows hold only -1: ``free_slot`` clears the columns the slot held (or
    its caller did, ``cleared``), so ``new_slot`` clears only the small fields. Clearing a
    whole row on every admission wrote V x capacity entries (1.3 MB at 80 x 8 groups)."""

    FIELDS = ("npages", "lens", "reserved_left", "taken", "dead")

    def __init__(self, num_virtual: int, slots: int = 4, capacity: int = 4):
        self.num_virtual = num_virtual
        self.pages = np.full((slots, num_virtual, max(1, capacity)), -1, dtype=np.int32)
        for name in self.FIELDS:
            setattr(self, name, np.zeros((slots, num_virtual), dtype=np.int32))
        self.free_slots = list(range(slots - 1, -1, -1))

    @property
    def num_slots(self) -> int:
        return self.pages.shape[0]

    def new_slot(self, capacity: int) -> int:
        """A cleared slot with room for capacity pages per v."""
        if not self.free_slots:
            self._grow(2 * self.num_slots, self.pages.shape[2])
        self.ensure_capacity(capacity)
        slot = self.free_slots.pop()
        for name in self.FIELDS:
            getattr(self, name)[slot] = 0
        return slot

    def free_slot(self, slot: int, cleared: bool = False) -> None:
        """Return a slot; its columns [0, npages) become -1 unless the caller cleared them
        (cleared: native.release does, in the pass that drops their references)."""
        if not cleared:
            rows, pos = ragged_index(self.npages[slot].astype(np.int64))
            self.pages[slot, rows, pos] = -1
        self.free_slots.append(int(slot))

    def ensure_capacity(self, need: int) -> None:
        cap = self.pages.shape[2]
        if need > cap:
            self._grow(self.num_slots, max(need, 2 * cap))

    def _grow(self, slots: int, capacity: int) -> None:
        old_s, _, old_cap = self.pages.shape
        pages = np.full((slots, self.num_virtual, capacity), -1, dtype=np.int32)
        pages[:old_s, :, :old_cap] = self.pages
        self.pages = pages
        for name in self.FIELDS:
            grown = np.zeros((slots, self.num_virtual), dtype=np.int32)
            grown[:old_s] = getattr(self, name)
            setattr(self, name, grown)
        self.free_slots = list(range(slots - 1, old_s - 1, -1)) + self.free_slots


class ArenaField:
    """A field of a PageArena seen through its owner's slot: ``owner.slot_pages()`` names the
    RequestPages; reads and writes go to ``arena.<name>[slot]``, fresh on every access."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        pages = obj.slot_pages()
        return getattr(pages.arena, self.name)[pages.slot]

    def __set__(self, obj, value) -> None:
        pages = obj.slot_pages()
        getattr(pages.arena, self.name)[pages.slot] = value


class RequestPages:
    def __init__(self, num_virtual: int, page_size: int, capacity: int = 4, arena: PageArena | None = None):
        self.page_size = page_size
        self.arena = arena if arena is not None else PageArena(num_virtual, slots=1, capacity=capacity)
        self.slot = self.arena.new_slot(max(1, capacity))

    # views of the arena's slot (fresh on every access: the arena may have grown)
    pages = ArenaField()
    npages = ArenaField()
    lens = ArenaField()
    dead = ArenaField()

    def slot_pages(self) -> "RequestPages":
        return self

    @property
    def num_virtual(self) -> int:
        return self.arena.num_virtual

    def _grow(self, need: int) -> None:
        self.arena.ensure_capacity(need)

    def append(self, counts: np.ndarray, ids: np.ndarray) -> None:
        """Append ids (ordered by v) to the page lists: counts[v] of them to row v."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.sum() != len(ids):
            raise PoolError(f"append: counts sum to {counts.sum()} but {len(ids)} page ids were given")
        self._grow(int((self.npages + counts).max(initial=0)))
        pages, npages = self.pages, self.npages
        if counts.max(initial=0) <= 1:  # decode: at most one page per v
            rows = np.flatnonzero(counts)
            pages[rows, npages[rows]] = ids
        else:
            rows, pos = ragged_index(counts)
            pages[rows, npages[rows] + pos] = ids
        npages += counts

    def set_prefix(self, pages: np.ndarray, npages: np.ndarray, lens: np.ndarray) -> None:
        """Start from a prefix table (pages int [V, >=max(npages)], -1 padded)."""
        width = int(np.max(npages, initial=0))
        self._grow(width)
        self.pages[:, :width] = pages[:, :width]
        self.npages = np.asarray(npages, dtype=np.int64)
        self.lens = np.asarray(lens, dtype=np.int64)

    def pages_needed(self, new_lens: np.ndarray) -> np.ndarray:
        """Pages to append per v so slots up to new_lens fit. int64 [V]."""
        return np.maximum(0, -(-np.asarray(new_lens, np.int64) // self.page_size) - self.npages)

    def chunk_pages(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pages the next counts[v] slots fall in: (pages int32 [V, W] -1 padded, first offset int64 [V]).

        Slot j of the run in v is page pages[v, (offset[v] + j) // P], offset (offset[v] + j) % P.
        """
        counts = np.asarray(counts, dtype=np.int64)
        P = self.page_size
        first, offset = self.lens // P, self.lens % P
        ncols = np.where(counts > 0, -(-(offset + counts) // P), 0)
        width = max(1, int(ncols.max(initial=0)))
        col = first[:, None] + np.arange(width)[None, :]
        valid = np.arange(width)[None, :] < ncols[:, None]
        page = np.take_along_axis(self.pages, np.where(valid, col, 0), axis=1)
        return np.where(valid, page, -1).astype(np.int32), offset

    def slot_locs(self, counts: np.ndarray) -> np.ndarray:
        """Flat slot index (page * P + offset) of the next counts[v] slots. int64 [V, max(counts)], -1 padded."""
        pages, offset = self.chunk_pages(counts)
        return flat_slot_locs(pages, offset, counts, self.page_size)

    def next_slot_locs(self) -> np.ndarray:
        """Flat slot index of the next slot of every v (its page must be appended). int64 [V]."""
        page = self.pages[np.arange(self.num_virtual), self.lens // self.page_size].astype(np.int64)
        return page * self.page_size + self.lens % self.page_size

    def advance(self, counts: np.ndarray) -> None:
        new = self.lens + np.asarray(counts, dtype=np.int64)
        if np.any(new > self.npages * self.page_size):
            raise PoolError("advance past the pages appended for this request")
        self.lens = new

    def held(self) -> np.ndarray:
        """All live page ids in the lists (dead columns skipped), ordered by v. int32."""
        rows, pos = ragged_index(self.npages)
        ids = self.pages[rows, pos]
        return ids[ids >= 0]

    def drop_front(self, upto: np.ndarray) -> np.ndarray:
        """Mark columns [dead[v], upto[v]) dead (-1); returns their live page ids, ordered by v
        (the caller drops its references). upto int [V], never past npages."""
        counts = np.maximum(0, np.minimum(np.asarray(upto, np.int64), self.npages) - self.dead)
        rows, pos = ragged_index(counts)
        cols = self.dead[rows] + pos
        ids = self.pages[rows, cols]
        self.pages[rows, cols] = -1
        self.dead = self.dead + counts
        return ids[ids >= 0]

    def pages_from(self, first: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Page ids of columns [first[v], stop[v]) per v: (counts [V], ids ordered by v)."""
        counts = np.maximum(0, np.asarray(stop, np.int64) - np.asarray(first, np.int64))
        rows, pos = ragged_index(counts)
        return counts, self.pages[rows, np.asarray(first, np.int64)[rows] + pos]
