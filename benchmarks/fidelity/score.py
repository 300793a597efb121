"""Scoring for the fidelity benchmark: correctness, agreement, degeneration, intervals.

Degenerate answer (one rule for every setting): some block of p tokens
(1 <= p <= 8) repeats back to back over at least max(12, 3p) tokens, e.g.
"TheTheThe..." or a phrase loop. A 5-digit number never trips it.

Replay conversations have no gold answer: an answer counts as correct when its
ROUGE-L F1 against the full-KV answer (over token ids) is at least
AGREEMENT_OK.
"""

from __future__ import annotations

import math

AGREEMENT_OK = 0.5
MAX_PERIOD = 8


def is_degenerate(ids: list[int]) -> bool:
    """True when a block of 1..8 tokens repeats back to back over >= max(12, 3p) tokens."""
    for p in range(1, MAX_PERIOD + 1):
        run = 0
        for i in range(p, len(ids)):
            run = run + 1 if ids[i] == ids[i - p] else 0
            if run + p >= max(12, 3 * p):
                return True
    return False


def contains_all(text: str, expect: list[str]) -> bool:
    low = text.lower()
    return all(e.lower() in low for e in expect)


def rouge_l(a: list[int], b: list[int]) -> float:
    """ROUGE-L F1 of two token sequences (1.0 when both are empty)."""
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(a), lcs / len(b)
    return 2 * p * r / (p + r)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k / n (0, 0 for n = 0)."""
    if n == 0:
        return 0.0, 0.0
    ph = k / n
    den = 1 + z * z / n
    mid = (ph + z * z / (2 * n)) / den
    half = z * math.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def score(conv: dict, answer_ids: list[int], answer_text: str, full_ids: list[int] | None) -> dict:
    """{"correct": bool | None, "agreement": float | None, "degenerate": bool} of one answer.

    Retrieval: correct = every expected string is in the answer. Replay: agreement with the
    full-KV answer (None until the full-KV answer exists).
    """
    out = {"degenerate": is_degenerate(answer_ids), "agreement": None, "correct": None}
    if conv["expect"]:
        out["correct"] = contains_all(answer_text, conv["expect"])
    elif full_ids is not None:
        out["agreement"] = rouge_l(answer_ids, full_ids)
        out["correct"] = out["agreement"] >= AGREEMENT_OK
    return out
