"""The chunk rule: how a token sequence is cut into the compression chunks a profile's budgets were
measured on, and which of its tokens every head keeps. Every chunk of n tokens keeps
max(ceil(beta_v * n), protected) slots per virtual layer, so the cut fixes the KV a text keeps;
serving, the oracle and the fidelity benchmark all cut through ``cut_tokens``.

The cut is a function of the tokens alone (issue 61: a cache hit equals a recompute): the same
tokens keep the same slots whether they arrived in one prompt, turn by turn, after an eviction,
a retraction or a host-tier round trip, and a prefix shared by many sequences is cut alike in all.

* Messages. With a chat template's markers (``Markers``: the token that opens a message, and the
  role tokens that name the assistant's) the sequence is a run of messages, each starting at a
  start token (the first also at 0). A message is closed once the next start token follows it.
* Chunks restart at every message start: [m, m + C), [m + 2C), ..., the message end.
* Kinds. A closed message (not the assistant's) is compressed whole, its last partial chunk too,
  and its last ``newest`` tokens protected (the question a turn asked; sinks: the sequence's first
  tokens). An open message (the sequence's last, not yet closed) compresses only its complete
  chunks: its partial last chunk is kept whole ("full": every token protected) until a later
  sequence fills or closes it. The assistant's messages are kept whole (a reply read back from the
  tree is what a recompute keeps). Without markers the whole sequence is one open message:
  aligned chunks of C from 0, the tail kept whole.

Worked example, C = 4, newest = 1, sinks = 1, markers start S, assistant role A, tokens
``S u u u u u S A r r S u u`` (a user message of 6, the assistant's of 4, an open one of 3):
chunks [0,4) [4,6) compressed (protected (1, 0) and (0, 1)), [6,10) full, [10,13) full (the open tail).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tangram_sglang.method.protection import Protection


def split_tokens(num_tokens: int, chunk: int) -> list[int]:
    """[chunk, chunk, ..., rest] covering num_tokens (empty for num_tokens <= 0)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return [min(chunk, num_tokens - s) for s in range(0, num_tokens, chunk)]


@dataclass(frozen=True)
class Markers:
    """A chat template's message markers: start_ids open a message; a message whose start is followed
    by one of the ``assistant`` token runs is the assistant's."""

    start_ids: tuple[int, ...]
    assistant: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        if not self.start_ids or any(len(a) == 0 for a in self.assistant):
            raise ValueError(f"markers need start ids and non-empty assistant runs, got {self}")


@dataclass(frozen=True)
class Cut:
    """Chunks covering [0, T): starts, ends, lead, trail int64 [C] (lead / trail: the protected runs at
    the chunk's start and end). A chunk is ``full`` when every token is protected (kept whole, in order)."""

    starts: np.ndarray
    ends: np.ndarray
    lead: np.ndarray
    trail: np.ndarray
    stable: int | None = None   # tokens whose cut no continuation changes (None: all; the sequence is whole)

    @property
    def full(self) -> np.ndarray:
        return self.lead + self.trail == self.ends - self.starts

    @property
    def num_tokens(self) -> int:
        return int(self.ends[-1]) if self.ends.size else 0

    @property
    def _end(self) -> int:
        return self.num_tokens if self.stable is None else min(self.stable, self.num_tokens)

    def _at(self, pos: int) -> int:
        return int(np.searchsorted(self.ends, pos, side="right"))

    def after(self, pos: int) -> tuple[list[int], list[tuple[int, int]]]:
        """(sizes, protected (lead, trail)) of the chunks covering [pos, T). pos must start a chunk or
        lie inside a full one (a cached prefix ends only there: ``usable``)."""
        i = self._at(pos)
        if i >= self.starts.size:
            return [], []
        if pos != self.starts[i] and not self.full[i]:
            raise ValueError(f"position {pos} is inside the compressed chunk [{self.starts[i]}, {self.ends[i]})")
        sizes = (self.ends[i:] - np.maximum(self.starts[i:], pos)).tolist()
        lead = np.maximum(0, self.lead[i:] - np.maximum(0, pos - self.starts[i:]))
        trail = np.asarray(sizes, np.int64) - lead
        trail = np.where(self.full[i:], trail, self.trail[i:])
        return sizes, list(zip(lead.tolist(), trail.tolist()))

    def usable(self, start: int, end: int, compressed: bool, protected: int = 0) -> bool:
        """Whether a cached segment of tokens [start, end) keeps what this cut keeps there: a compressed
        segment must be exactly one compressed chunk with as many protected tokens (a closed message
        protects its newest tokens, an open one does not), an uncompressed one must lie in full chunks."""
        if end > self._end or end <= start:
            return False
        i = self._at(start)
        if compressed:
            return bool(self.starts[i] == start and self.ends[i] == end and not self.full[i]
                        and self.lead[i] + self.trail[i] == protected)
        j = self._at(end - 1)
        return bool(self.full[i:j + 1].all())

    def usable_tokens(self, start: int, end: int) -> int:
        """How many tokens of an uncompressed segment at [start, end) this cut keeps whole (from start)."""
        end = min(end, self._end)
        if end <= start:
            return 0
        i, j = self._at(start), self._at(end - 1)
        bad = np.flatnonzero(~self.full[i:j + 1])
        return end - start if bad.size == 0 else max(0, int(self.starts[i + bad[0]]) - start)


def message_starts(tokens: np.ndarray, markers: Markers | None) -> np.ndarray:
    """Start positions of the messages (0 first): int64 [M]."""
    if markers is None or tokens.size == 0:
        return np.zeros(min(1, tokens.size), np.int64)
    at = np.flatnonzero(np.isin(tokens, np.asarray(markers.start_ids, np.int64)))
    return np.concatenate([[0], at[at > 0]]).astype(np.int64)


def _assistant(tokens: np.ndarray, starts: np.ndarray, markers: Markers | None) -> np.ndarray:
    out = np.zeros(starts.size, bool)
    if markers is None:
        return out
    opened = np.isin(tokens[starts], np.asarray(markers.start_ids, np.int64))
    for run in markers.assistant:
        k = len(run)
        ok = opened & (starts + 1 + k <= tokens.size)
        for i in np.flatnonzero(ok):
            out[i] |= bool(np.array_equal(tokens[starts[i] + 1: starts[i] + 1 + k], run))
    return out


def cut_tokens(tokens, chunk: int, protection: Protection, markers: Markers | None = None, *,
               whole: bool = True, keep_all: bool = False) -> Cut:
    """The chunks the sequence ``tokens`` (int [T]) is kept in (module docstring). whole=False: ``tokens``
    may be the start of a longer sequence (a radix key without its request); the Cut then marks as
    ``stable`` only the tokens every continuation cuts alike (before the last message if it is open and not
    the assistant's: a later start token would close it; without markers, the complete chunks), and
    ``usable`` answers for those only. keep_all: budgets that keep every token (a 1.0 profile): every chunk
    is kept whole, as compression would keep it, so no form is ever recomputed."""
    tokens = np.asarray(tokens, dtype=np.int64).ravel()
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    T = tokens.size
    if T == 0:
        empty = np.zeros(0, np.int64)
        return Cut(starts=empty, ends=empty, lead=empty, trail=empty)
    m_start = message_starts(tokens, markers)
    m_end = np.append(m_start[1:], T).astype(np.int64)
    closed = np.arange(m_start.size) < m_start.size - 1
    assistant = _assistant(tokens, m_start, markers)
    counts = -(-(m_end - m_start) // chunk)
    msg = np.repeat(np.arange(m_start.size), counts)
    k = np.arange(msg.size) - np.repeat(np.cumsum(counts) - counts, counts)
    starts = m_start[msg] + k * chunk
    ends = np.minimum(starts + chunk, m_end[msg])
    n = ends - starts
    lead = np.clip(protection.sinks - starts, 0, n)
    newest = np.clip(ends - np.maximum(starts, m_end[msg] - protection.newest), 0, None)
    trail = np.where(closed[msg], np.minimum(newest, n - lead), 0)
    keep_whole = assistant[msg] | (~closed[msg] & (n < chunk)) | keep_all
    trail = np.where(keep_whole, n - lead, trail)
    stable = None
    if not whole:   # the last message is open: a start token after it would close it (its newest protected)
        stable = T if assistant[-1] else int(m_start[-1])
        if markers is None:   # nothing ever closes it: only its open tail may change
            stable = T - T % chunk
    return Cut(starts=starts, ends=ends, lead=lead, trail=trail, stable=stable)


def reusable_prefix(cached: Cut, new: Cut, limit: int) -> int:
    """Tokens of a sequence kept as ``cached`` cuts it that another sequence, cut as ``new`` and sharing
    its first ``limit`` tokens, can reuse: its chunks in order while each keeps what ``new`` keeps there
    (a compressed chunk whole, a full one token by token), as the radix tree's match takes them."""
    pos = 0
    for s, e, full, prot in zip(cached.starts.tolist(), cached.ends.tolist(), cached.full.tolist(),
                                (cached.lead + cached.trail).tolist()):
        e = min(e, limit)
        if e <= s:
            break
        if not full:
            if e != cached.ends[cached._at(s)] or not new.usable(s, e, compressed=True, protected=prot):
                break
            pos = e
            continue
        pos = s + new.usable_tokens(s, e)
        if pos < e:
            break
    return pos
