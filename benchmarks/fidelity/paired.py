"""Paired comparisons of the fidelity report: Tangram against the settings its targets name, on the
conversations both answered, with an exact sign test."""

from __future__ import annotations

import math

# the kvpress setting that runs the same scoring method as a profile's scorer
PEER = {"snapkv": "kvpress-snapkv", "kvzip": "kvpress-kvzip", "fastkvzip": "kvpress-kvzip"}


def sign_test(b: int, c: int) -> float:
    """Two-sided exact p-value of b against c discordant pairs (McNemar's exact test)."""
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)


def paired(a: dict, b: dict, field: int) -> tuple[int, int, int, int, int]:
    """(a's count, b's count, only a, only b, n) of outcome `field` (0 correct, 1 degenerate) over
    the conversations both rows judged."""
    both = [c for c in a["outcomes"] if c in b["outcomes"] and a["outcomes"][c][field] is not None
            and b["outcomes"][c][field] is not None]
    x = [bool(a["outcomes"][c][field]) for c in both]
    y = [bool(b["outcomes"][c][field]) for c in both]
    return (sum(x), sum(y), sum(p and not q for p, q in zip(x, y)), sum(q and not p for p, q in zip(x, y)),
            len(both))


def comparisons(summary: list[dict]) -> list[tuple[dict, dict, str, int]]:
    """(Tangram row, other row, what the issue asks, field) for every comparison the targets name:
    Tangram vs the dynamic method and vs uniform at the same ratio (accuracy), vs the dynamic
    method run at Tangram's KV (within 2 points of it, when such a row exists), vs kvpress's same
    method at the nearest kept share to Tangram's KV (accuracy: not below it; degenerate answers),
    and vs the oracle with chunks fixed by position (--chunking position, both measures), when that
    experiment was run. Tangram's KV is the share of full KV its pool held (pages, protected and
    generated tokens: equal measured bytes) where the report measured it, else its kept share."""
    def find(model, setting, ratio=None):
        return [s for s in summary if s["model"] == model and s["setting"] == setting
                and (ratio is None or s["ratio"] == ratio) and s["kept_share"] is not None]

    out = []
    for t in summary:
        if not t["setting"].startswith("tangram") or t.get("outcomes") is None:
            continue
        for name, want in (("dynamic", "within 2 points"), ("uniform", "at least as good")):
            for o in find(t["model"], t["setting"].replace("tangram", name, 1), t["ratio"]):
                out.append((t, o, want, 0))
        kv, equal = tangram_kv(t)
        dyn = find(t["model"], t["setting"].replace("tangram", "dynamic", 1))
        if dyn and kv is not None:  # the dynamic method given Tangram's KV, when it was run
            near = min(dyn, key=lambda s: abs(s["kept_share"] - kv))
            if near["ratio"] != t["ratio"] and abs(near["kept_share"] - kv) < 0.02:
                out.append((t, near, f"within 2 points at {equal}", 0))
        for o in find(t["model"], t["setting"].replace("tangram", "static~position", 1), t["ratio"]):
            out += [(t, o, "experiment: chunks by position", 0), (t, o, "experiment: chunks by position", 1)]
        peers = find(t["model"], PEER.get(t.get("method", ""), ""))
        if peers and kv is not None:
            near = min(peers, key=lambda s: abs(s["kept_share"] - kv))
            out += [(t, near, f"not below at {equal}", 0), (t, near, "degenerate no more often", 1)]
    return out


def tangram_kv(t: dict) -> tuple[float | None, str]:
    """(share of full KV a Tangram row is compared at, what that share is): the KV its pool held where
    measured, else the share of history tokens its heads kept."""
    if t.get("held_share") is not None:
        return t["held_share"], "equal KV held"
    return t["kept_share"], "equal KV"


def _share(a: dict) -> str:
    held = "" if a.get("held_share") is None else f", {100 * a['held_share']:.0f}% held"
    return f"{100 * a['kept_share']:.0f}% kept{held}"


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}" if p < 0.01 else f"{p:.2f}"


def paired_lines(summary: list[dict]) -> list[str]:
    rows = comparisons(summary)
    if not rows:
        return []
    out = ["", "Paired on the same conversations (only A / only B: conversations where one is right, or "
           "degenerates, and the other not; p: exact two-sided sign test on those, so p > 0.05 means the "
           "two cannot be told apart at this many conversations):", "",
           "| model | A | B | target (A vs B) | measure | A | B | only A / only B | p |",
           "|---|---|---|---|---|---|---|---|---|"]
    for a, b, want, field in rows:
        x, y, only_a, only_b, n = paired(a, b, field)
        measure = "right" if field == 0 else "degenerate"
        out.append(f"| {a['model']} | {a['setting']} {a['ratio']:g} ({_share(a)}) "
                   f"| {b['setting']} {b['ratio']:g} ({100 * b['kept_share']:.0f}%) | {want} | {measure} "
                   f"| {x}/{n} | {y}/{n} | {only_a} / {only_b} | {_p(sign_test(only_a, only_b))} |")
    return out
