"""The chunk schedule: how a prompt is cut into the compression chunks a profile's budgets were
measured on. Every chunk of n tokens keeps ceil(beta_v * n) slots per virtual layer, so the
schedule fixes the KV a text keeps; serving, the oracle and the fidelity benchmark all cut
through these functions.

Example with chunk 512: 1300 new tokens -> [512, 512, 276]; an extend that SGLang started with
700 tokens of a 2000-token prompt -> [700, 512, 512, 276]."""

from __future__ import annotations


def split_tokens(num_tokens: int, chunk: int) -> list[int]:
    """[chunk, chunk, ..., rest] covering num_tokens (empty for num_tokens <= 0)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return [min(chunk, num_tokens - s) for s in range(0, num_tokens, chunk)]


def extend_schedule(first: int, total: int, chunk: int) -> list[int]:
    """[first, chunk, ..., rest]: SGLang gives the first extend, later ones are full chunks."""
    return [first] + split_tokens(total - first, chunk)


def turn_schedule(turn_lengths: list[int], chunk: int) -> list[int]:
    """Chunks as served one turn at a time: each turn's new tokens split on their own.
    turn_lengths are the cumulative prompt lengths after each turn."""
    sizes, prev = [], 0
    for length in turn_lengths:
        sizes += split_tokens(length - prev, chunk)
        prev = max(prev, length)
    return sizes
