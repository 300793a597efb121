"""Tokens no head ever drops: attention sinks and the newest tokens of each prompt.

Compression happens chunk by chunk while a prompt is prefilled, before the model
answers it. Two kinds of tokens must survive whatever the scorer says:

* sinks: the first ``sinks`` positions of the sequence (the chat template's
  start, where attention mass pools);
* newest: the last ``newest`` tokens of each request's prompt (the question
  about to be answered and the assistant header). In a later turn they are
  history like any other token, kept as they were.

Protected tokens are kept by every head and counted in its budget: a head of
group g keeps max(keep_count(beta_g, n), protected in the chunk) slots, and the
pool reserves exactly that (reservation.chunk_slot_counts' ``min_keep``). The scores of protected
positions are raised by attention.selection.protect_scores.

In a chunk of n tokens the protected positions are always a leading run (sinks)
and a trailing run (newest): ``chunk_protection`` returns (lead, trail) per
chunk. Worked example, sinks 4, newest 64, a prompt of 600 tokens in chunks
[512, 88] from position 0: chunk 0 -> (4, 0), chunk 1 -> (0, 64); the same
prompt after a cached prefix of 520 tokens, one chunk of 80 -> (0, 64).
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
