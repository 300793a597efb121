"""Exact reservation: the pages a request will hold, computed before it runs (paper 4.1).

Every chunk of n new tokens leaves keep_count(beta_v, n) = ceil(beta_v * n)
slots in virtual layer v (the same count the attention side keeps, from
tangram_sglang.method.budgets), or more where the chunk holds protected tokens
(sinks, the prompt's newest tokens: tangram_sglang.method.protection): then
max(keep_count(beta_v, n), min_keep_c) slots. Generated tokens are not
compressed: one slot per token per v. Slots of a request are dense (prefix, then chunks, then decode),
so after all chunks virtual layer v holds

    prefill_slots[v] = prefix_slots[v] + sum_c max(keep_count(beta_v, n_c), min_keep_c)

and the request needs, besides the prefix pages it shares,

    prefill_pages[v] = ceil(prefill_slots[v] / P) - shared_pages[v]
    decode_pages[v]  = ceil((prefill_slots[v] + D) / P) - ceil(prefill_slots[v] / P)

where shared_pages[v] = ceil(prefix/P) if the prefix's partial last page can
be extended in place, else floor(prefix/P) (the partial page is copied to a
fresh page first; that copy is counted in prefill_pages).

Worked example: P=4, beta=[0.5, 0.25], prefix=[0, 0], chunks [8, 6], D=3:
  chunk slots [[4, 2], [3, 2]], prefill_slots [7, 4],
  prefill_pages [2, 1], decode_pages [ceil(10/4)-2, ceil(7/4)-1] = [1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tangram_sglang.method.budgets import keep_count


def _ceil_div(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


@dataclass(frozen=True, kw_only=True)
class ReservationPlan:
    """Pages and slots of one request, per virtual layer (int64 vectors of length V)."""

    page_size: int
    chunk_tokens: tuple[int, ...]
    decode_tokens: int
    prefix_slots: np.ndarray      # [V]
    shared_pages: np.ndarray      # [V] prefix pages used in place
    chunk_slots: np.ndarray       # [C, V]
    prefill_slots: np.ndarray     # [V]
    prefill_pages: np.ndarray     # [V]
    decode_pages: np.ndarray      # [V]
    min_keep: np.ndarray          # int64 [C] protected tokens of each chunk

    @property
    def full(self) -> np.ndarray:
        """bool [C]: every token of the chunk protected (kept whole, in order)."""
        return self.min_keep == np.asarray(self.chunk_tokens, np.int64)

    @property
    def pages(self) -> np.ndarray:
        return self.prefill_pages + self.decode_pages

    @property
    def total_pages(self) -> int:
        return int(self.prefill_pages.sum() + self.decode_pages.sum())


def chunk_slot_counts(beta: np.ndarray, chunk_tokens, min_keep=None) -> np.ndarray:
    """Slots every (chunk, v) keeps. beta float [V]; min_keep int [C] protected tokens per chunk
    (default none) -> int64 [C, V] = max(keep_count(beta_v, n_c), min_keep_c)."""
    chunks = np.asarray(chunk_tokens, dtype=np.int64).reshape(-1, 1)
    if chunks.size == 0:
        return np.zeros((0, np.asarray(beta).size), dtype=np.int64)
    counts = keep_count(np.asarray(beta, dtype=np.float64).reshape(1, -1), chunks)
    if min_keep is None:
        return counts
    floor = np.asarray(min_keep, dtype=np.int64).reshape(-1, 1)
    if floor.shape[0] != chunks.shape[0] or np.any(floor < 0) or np.any(floor > chunks):
        raise ValueError(f"min_keep {floor.ravel().tolist()} must give 0..n for each chunk {chunks.ravel().tolist()}")
    return np.maximum(counts, floor)


def plan_reservation(beta: np.ndarray, chunk_tokens, *, page_size: int, decode_tokens: int = 0,
                     prefix_slots: np.ndarray | None = None,
                     extend_in_place: np.ndarray | None = None, min_keep=None) -> ReservationPlan:
    """Plan one request in one vectorized step.

    beta: float [V] group budgets (RatioEntry.group_budget.ravel()).
    chunk_tokens: new tokens per prefill chunk, each >= 1.
    prefix_slots: int [V] slots of the cached prefix (default 0).
    extend_in_place: bool [V], True where the prefix's partial last page may be
    written in place (default: no).
    min_keep: int [C], protected tokens of each chunk (default none).
    """
    beta = np.asarray(beta, dtype=np.float64).ravel()
    chunk_tokens = tuple(int(n) for n in chunk_tokens)
    if any(n < 1 for n in chunk_tokens):
        raise ValueError(f"every prefill chunk needs >= 1 token, got {chunk_tokens}")
    if decode_tokens < 0:
        raise ValueError(f"decode_tokens must be >= 0, got {decode_tokens}")
    num_v = beta.size
    prefix = np.zeros(num_v, np.int64) if prefix_slots is None else np.asarray(prefix_slots, np.int64)
    if prefix.shape != (num_v,):
        raise ValueError(f"prefix_slots has shape {prefix.shape}, expected ({num_v},)")
    in_place = np.zeros(num_v, bool) if extend_in_place is None else np.asarray(extend_in_place, bool)
    shared = np.where(in_place, _ceil_div(prefix, page_size), prefix // page_size)
    slots = chunk_slot_counts(beta, chunk_tokens, min_keep)
    floor = np.zeros(len(chunk_tokens), np.int64) if min_keep is None else np.asarray(min_keep, np.int64).reshape(-1)
    prefill = prefix + slots.sum(axis=0)
    prefill_pages = _ceil_div(prefill, page_size) - shared
    decode_pages = _ceil_div(prefill + decode_tokens, page_size) - _ceil_div(prefill, page_size)
    return ReservationPlan(page_size=page_size, chunk_tokens=chunk_tokens, decode_tokens=int(decode_tokens),
                           prefix_slots=prefix, shared_pages=shared, chunk_slots=slots,
                           prefill_slots=prefill, prefill_pages=prefill_pages, decode_pages=decode_pages,
                           min_keep=floor)
