"""After the load: idle, flush, the pool's pages and integrity, the greedy replay, the logs."""

from __future__ import annotations

import os
import random
import re
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common.client import pool_info
from benchmarks.common.log import logger
from benchmarks.serving.soak_faults.client import chat_once, usage_fields
from benchmarks.serving.soak_faults.fleet import REPLICA_PORTS, flush
from benchmarks.serving.soak_faults.plan import chat_payload

log = logger("soak")


def replay(urls: list[str], model: str, histories: dict[int, dict], count: int, seed: int) -> dict:
    """Finished sessions (``histories``: index -> {"fault", "turns"}; all of them when ``count`` <= 0, else
    ``count`` drawn by ``seed``) sent again alone, turn by turn with the soak's messages, the cache flushed
    before each session; the sessions dealt round-robin to ``urls``, one session at a time on each. Each
    answer is compared with the soak's: a hit keeps what a recompute keeps, so faults, evictions and the
    other replica's cache on the way must not change a greedy answer."""
    picked = sorted(histories) if count <= 0 else \
        sorted(random.Random(seed).sample(sorted(histories), min(count, len(histories))))
    if not urls:   # no replica serving after the load: nothing replayed (the report's check then fails)
        picked = []

    def one_replica(url: str, indices: list[int]) -> list[tuple[int, list[dict]]]:
        return [(index, replay_session(url, model, index, histories[index]["turns"])) for index in indices]

    with ThreadPoolExecutor(max(1, len(urls))) as ex:
        parts = list(ex.map(lambda k: one_replica(urls[k], picked[k::len(urls)]), range(len(urls))))
    by_index = dict(item for part in parts for item in part)
    turns = [dict(t, fault=histories[i]["fault"]) for i in picked for t in by_index[i]]
    same_cache = [t for t in turns if t["same_cache"]]
    by_fault = {}
    for t in turns:
        row = by_fault.setdefault(t["fault"], {"sessions": set(), "turns": 0, "identical": 0})
        row["sessions"].add(t["session"])
        row["turns"] += 1
        row["identical"] += t["same"]
    return {"sessions": len(picked), "turns": len(turns), "identical": sum(t["same"] for t in turns),
            "turns_same_cached_tokens": len(same_cache),
            "identical_same_cached_tokens": sum(t["same"] for t in same_cache),
            "by_fault": {f: dict(r, sessions=len(r["sessions"])) for f, r in sorted(by_fault.items())},
            "mismatches": [t["mismatch"] for t in turns if not t["same"]], "session_indices": picked}


def replay_session(url: str, model: str, index: int, sent: list[dict]) -> list[dict]:
    """One session's turns sent again alone after a flush: per turn {session, same, same_cache, mismatch}."""
    flush(url)
    out = []
    for k, h in enumerate(sent, 1):
        raw = chat_once(url, chat_payload(model, h["messages"], h["turn"]), 600)
        alone = raw["text"] if raw["text"] is not None else f"(error: {raw['error']})"
        cached = usage_fields(raw)["cached_tokens"]
        row = {"session": index, "same": alone == h["answer"], "same_cache": cached == h["cached_tokens"],
               "mismatch": None}
        if not row["same"]:
            at = next((i for i, (a, b) in enumerate(zip(alone, h["answer"])) if a != b),
                      min(len(alone), len(h["answer"])))
            row["mismatch"] = {"session": index, "turn": k, "soak_cached_tokens": h["cached_tokens"],
                               "alone_cached_tokens": cached, "first_difference_at": at,
                               "soak": h["answer"][max(0, at - 40):at + 80], "alone": alone[max(0, at - 40):at + 80]}
        out.append(row)
    return out


def pool_after(url: str) -> dict:
    keys = ("integrity", "pages_used", "pages_reserved", "pages_held_by_tree", "pages_total", "retracted",
            "evicted_segments", "admitted", "waited", "capped", "too_large", "peak_pages_used", "running_requests")
    try:
        info = pool_info(url, timeout=60)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    return {k: info.get(k) for k in keys}


def logged_retractions(path: str) -> int:
    """Requests SGLang's log says it retracted ("KV cache pool is full. Retract requests. #retracted_reqs: N")."""
    if not os.path.exists(path):
        return 0
    with open(path, errors="replace") as f:
        return sum(int(m.group(1)) for line in f if (m := re.search(r"#retracted_reqs: (\d+)", line)))


def traceback_excerpts(path: str, lines_after: int = 12, most: int = 3) -> list[str]:
    """The first ``most`` tracebacks of a log, each with the lines after it."""
    if not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        text = f.readlines()
    return ["".join(text[i:i + lines_after]) for i, line in enumerate(text) if "Traceback" in line][:most]


def plot(samples: list[dict], kill: dict, path: str, title: str) -> str | None:
    """RSS and pool pages of each replica over time, the kill and the restart marked; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot")
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for i in range(len(REPLICA_PORTS)):
        rows = [s for s in samples if s["replica"] == i]
        t = [s["t"] / 60 for s in rows]
        top.plot(t, [s["rss_mb"] if s["rss_mb"] is not None else float("nan") for s in rows], label=f"replica {i}")
        bottom.plot(t, [s["pages_used"] if s["pages_used"] is not None else float("nan") for s in rows],
                    label=f"replica {i}")
    total = next((s["pages_total"] for s in samples if s.get("pages_total")), None)
    if total:
        bottom.axhline(total, color="grey", lw=0.8, ls=":", label="pages in the pool")
    for ax in (top, bottom):
        for key, style, name in (("killed_s", "--", "replica killed"), ("ready_s", "-.", "serving again")):
            if key in kill:
                ax.axvline(kill[key] / 60, color="red", ls=style, lw=1, label=name)
    top.set_ylabel("resident memory, MiB")
    bottom.set_ylabel("pool pages used")
    bottom.set_xlabel("minutes from the start of the load (the last points: after the flush)")
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
    top.set_title(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
