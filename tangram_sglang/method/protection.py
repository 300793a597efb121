"""Tokens no head ever drops: attention sinks and the newest tokens of each closed message.

Compression happens chunk by chunk while a prompt is prefilled, before the model
answers it. Two kinds of tokens must survive whatever the scorer says:

* sinks: the first ``sinks`` positions of the sequence (the chat template's
  start, where attention mass pools);
* newest: the last ``newest`` tokens of each closed message (method/chunks.py: the
  question a turn asked, with its end marker). In later turns they stay kept.

Protected tokens are kept by every head and counted in its budget: a head of
group g keeps max(keep_count(beta_g, n), protected in the chunk) slots, and the
pool reserves exactly that (reservation.chunk_slot_counts' ``min_keep``). The scores of protected
positions are raised by attention.selection.protect_scores. A chunk whose every token is
protected is kept whole (the chunk rule's full chunks: an assistant's message, an open tail).

In a chunk of n tokens the protected positions are always a leading run (sinks)
and a trailing run (newest): (lead, trail) per chunk. ``chunk_protection`` gives
them for chunks of one prompt whose newest tokens end at prompt_end (the oracle's
explicit-chunk mode); the served cut is method/chunks.cut_tokens. Worked example,
sinks 4, newest 64, a prompt of 600 tokens in chunks [512, 88] from position 0:
chunk 0 -> (4, 0), chunk 1 -> (0, 64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Protection:
    sinks: int = 4
    newest: int = 64

    def __post_init__(self):
        if self.sinks < 0 or self.newest < 0:
            raise ValueError(f"protected token counts must be >= 0, got sinks={self.sinks} newest={self.newest}")


NONE = Protection(0, 0)


def chunk_protection(prot: Protection, start: int, chunk_tokens, prompt_end: int) -> list[tuple[int, int]]:
    """(lead, trail) protected runs of each chunk; chunks cover [start, start + sum) of a prompt of
    prompt_end tokens (absolute positions)."""
    out, pos = [], int(start)
    newest_from = max(0, int(prompt_end) - prot.newest)
    for n in chunk_tokens:
        end = pos + int(n)
        lead = max(0, min(end, prot.sinks) - pos)
        trail = max(0, end - max(pos, newest_from))
        out.append((lead, min(trail, int(n) - lead)))
        pos = end
    return out


def min_keep(protect: list[tuple[int, int]]) -> np.ndarray:
    """Protected tokens per chunk: int64 [C]."""
    return np.asarray([a + b for a, b in protect], dtype=np.int64).reshape(-1)
