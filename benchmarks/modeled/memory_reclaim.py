"""Memory benchmark: KV bytes per request and requests that fit a fixed pool (paper 3.1.1, 4.2).

Methods, for one request of N prompt tokens prefilled in chunks of C and D generated tokens:
  full         uncompressed KV, monolithic pages (all L x H heads per page)
  monolithic   non-uniform compression on monolithic pages: every head of every layer padded
               to the longest-retaining head of each chunk (what a stock engine would have to do)
  adjacent     ragged pages, groups of H_p adjacent heads        (measured on RaggedKVCache)
  budget_aware ragged pages, groups of H_p budget-sorted heads   (measured on RaggedKVCache)
  ideal        exact per-head keep_count(b, n) slots, no page or group padding
reclaim = 1 - bytes / full bytes. The ragged rows come from the real allocator: admit, every
prefill chunk, D decode steps, then the pages held; they are checked against the reservation.

Multi-turn table: T turns of U new tokens + D generated, the whole history cached in the tree;
pages held with this package's dense layout (prefix tail extended in place, or copied when a
branch already wrote there) against fresh pages per segment (every chunk starts a new page).

    .venv/bin/python -m benchmarks.modeled.memory_reclaim          # -> benchmarks/results/modeled/memory_reclaim.*
    .venv/bin/python -m benchmarks.modeled.memory_reclaim --quick  # one reference profile, for a smoke run
"""

from __future__ import annotations

import argparse
import glob
import os
import time

import numpy as np

from benchmarks.common.paths import RESULTS, ROOT
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from tangram_sglang.method.grouping import group_budgets, group_heads
from tangram_sglang.pool import PoolSpec, RaggedKVCache, chunk_slot_counts, plan_reservation
from tangram_sglang.profile import reference_import

HP_SWEEP, P_SWEEP = (1, 2, 4, 8), (1, 16, 64)
ITEMSIZE = 2  # bf16 / fp16 KV, as served on GPU


def load_profiles(ratio: float, quick: bool) -> list[dict]:
    """[{name, budgets [L, H], head_dim}] : configs/smollm2-*.yaml (if present) + reference profiles."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "smollm2-*.yaml"))):
        from tangram_sglang.profile import load_profile

        prof = load_profile(path)
        entry = min(prof.entries, key=lambda e: abs(e.ratio - ratio))
        out.append(dict(name=f"{os.path.basename(path)[:-5]}@{entry.ratio}", budgets=entry.budgets,
                        head_dim=prof.model.head_dim))
    pairs = reference_import.available()
    if quick:
        pairs = [p for p in pairs if p == ("snapkv", "llama-3.1-8b-instruct")]
    for scorer, model in pairs:
        prof = reference_import.reference_profile(scorer, model, [ratio], heads_per_group=1)
        out.append(dict(name=f"{model}/{scorer}@{ratio}", budgets=prof.entries[0].budgets,
                        head_dim=prof.model.head_dim))
    return out


def chunks_of(n: int, c: int) -> list[int]:
    return [c] * (n // c) + ([n % c] if n % c else [])


def ragged_measured(budgets, hp, strategy, page_size, chunks, decode, head_dim) -> dict:
    """Run one request through RaggedKVCache; pages held after prefill + decode, in bytes."""
    beta = group_budgets(budgets, group_heads(budgets, hp, strategy))
    plan = plan_reservation(beta.ravel(), chunks, page_size=page_size, decode_tokens=decode)
    spec = PoolSpec(num_layers=beta.shape[0], num_groups=beta.shape[1], heads_per_group=hp, head_dim=head_dim,
                    page_size=page_size, num_pages=plan.total_pages + 1, dtype="float16")
    cache = RaggedKVCache(spec, beta)
    cache.admit("r", chunk_tokens=chunks, decode_tokens=decode)
    for n in chunks:
        cache.prefill_chunk("r", n)
    for _ in range(decode):
        if cache.decode_step(["r"]) is None:
            raise AssertionError("a decode step ran out of pages inside the reservation")
    held = spec.num_pages - cache.pool.num_free
    if held != plan.total_pages:
        raise AssertionError(f"pool holds {held} pages, the reservation said {plan.total_pages}")
    cache.check_integrity()
    return dict(pages=held, page_bytes=spec.page_size_bytes, bytes=held * spec.page_size_bytes)


def request_bytes(budgets, head_dim, page_size, hp, chunks, decode, measure: bool) -> dict:
    L, H = budgets.shape
    per_slot_head = 2 * head_dim * ITEMSIZE
    mono_page = L * H * per_slot_head * page_size
    ntok = sum(chunks) + decode
    kept = chunk_slot_counts(budgets.ravel(), chunks)  # [C, L*H]
    out = {
        "full": -(-ntok // page_size) * mono_page,
        "monolithic": -(-(int(kept.max(axis=1).sum()) + decode) // page_size) * mono_page,
        "ideal": int(kept.sum() + decode * L * H) * per_slot_head,
    }
    for strategy in ("adjacent", "budget_aware"):
        if measure:
            out[strategy] = ragged_measured(budgets, hp, strategy, page_size, chunks, decode, head_dim)["bytes"]
        else:
            beta = group_budgets(budgets, group_heads(budgets, hp, strategy)).ravel()
            slots = chunk_slot_counts(beta, chunks).sum(axis=0) + decode
            out[strategy] = int((-(-slots // page_size)).sum()) * hp * per_slot_head * page_size
    return out


def multi_turn(budgets, hp, page_size, turns, new_tokens, chunk, decode) -> dict:
    """Pages per v summed: dense in place / dense with a copy per turn / fresh page per segment."""
    beta = group_budgets(budgets, group_heads(budgets, hp, "budget_aware")).ravel()
    prefix = np.zeros(beta.size, np.int64)
    pages = {"dense_in_place": 0, "dense_copy": 0, "fresh_page_per_segment": 0}
    for _ in range(turns):
        chunks = chunks_of(new_tokens, chunk)
        for name, in_place in (("dense_in_place", True), ("dense_copy", False)):
            pl = plan_reservation(beta, chunks, page_size=page_size, decode_tokens=decode, prefix_slots=prefix,
                                  extend_in_place=np.full(beta.size, in_place))
            pages[name] += pl.total_pages
        segs = np.vstack([chunk_slot_counts(beta, chunks), np.full((1, beta.size), decode)])
        pages["fresh_page_per_segment"] += int((-(-segs // page_size)).sum())
        prefix = pl.prefill_slots + decode
    ideal_slots = int(prefix.sum())
    return {k: v * page_size / ideal_slots - 1.0 for k, v in pages.items()}  # padding overhead vs dense slots


def sweep(profiles, args) -> list[dict]:
    rows, chunks = [], chunks_of(args.tokens, args.chunk)
    for prof in profiles:
        L, H = prof["budgets"].shape
        for hp_asked in HP_SWEEP:
            hp = min(hp_asked, H)
            for page_size in P_SWEEP:
                measure = page_size > 1 or args.measure_p1
                b = request_bytes(prof["budgets"], prof["head_dim"], page_size, hp, chunks, args.decode, measure)
                pool_bytes = args.pool_requests * b["full"]
                row = dict(profile=prof["name"], L=L, H=H, hp_asked=hp_asked, hp=hp, page_size=page_size,
                           bytes=b, measured=measure,
                           reclaim={k: 1.0 - v / b["full"] for k, v in b.items()},
                           fit={k: int(pool_bytes // v) for k, v in b.items()})
                rows.append(row)
    return rows


def fmt_tables(rows, mt_rows, args) -> list[str]:
    ratio = args.ratio
    lines = [f"Workload: {args.tokens} prompt tokens in chunks of {args.chunk}, {args.decode} generated, "
             f"target ratio {ratio}, fp16 KV. Reclaim = share of the full cache freed.", ""]
    lines += ["### Reclaim at H_p = 4, P = 16 (H_p clamped to H where H < 4)", "",
              "| profile | H_p | full MiB | monolithic | adjacent | budget-aware | ideal | BA/adj reclaim | BA-adj (pp) | fit full / mono / adj / BA / ideal |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["hp_asked"] != 4 or r["page_size"] != 16:
            continue
        rc, f = r["reclaim"], r["fit"]
        ratio_ba = rc["budget_aware"] / rc["adjacent"] if rc["adjacent"] > 0 else float("nan")
        lines.append(f"| {r['profile']} | {r['hp']} | {r['bytes']['full'] / 2**20:.0f} | {rc['monolithic']:.1%} | "
                     f"{rc['adjacent']:.1%} | {rc['budget_aware']:.1%} | {rc['ideal']:.1%} | {ratio_ba:.3f} | "
                     f"{100 * (rc['budget_aware'] - rc['adjacent']):.1f} | "
                     f"{f['full']} / {f['monolithic']} / {f['adjacent']} / {f['budget_aware']} / {f['ideal']} |")
    lines += ["", f"Fit = requests of this workload in a pool that holds {args.pool_requests} full-KV requests. "
              "BA/adj = budget-aware reclaim / adjacent reclaim; BA-adj = the difference in points of the full cache.",
              "Monolithic is 0% wherever any head of any layer keeps its whole chunk (budget 1 after "
              "mu + 2 sigma): one page spans all heads, so every head is padded to it.",
              "Reference profiles: budgets rescaled per layer to the target ratio (reference_import); "
              "gemma-3-12b-it and gpt-oss-20b list only their full-attention layers (8 and 12), so their "
              "bytes are those layers'. Where H < H_p (qwen3-30b-a3b: H=2; SmolLM2: H=3), H_p is clamped "
              "to H: one group per layer, so both groupings are the same.", ""]
    for name in sorted({r["profile"] for r in rows}):
        if not (name.startswith("smollm2") or name.startswith("llama-3.1-8b-instruct/snapkv")
                or name.startswith("qwen3-4b-instruct-2507/snapkv")):
            continue
        lines += [f"### Sweep: {name} (reclaim adjacent / budget-aware)", "",
                  "| H_p \\ P | " + " | ".join(str(p) for p in P_SWEEP) + " |", "|---|" + "---|" * len(P_SWEEP)]
        for hp in HP_SWEEP:
            cells = [r for r in rows if r["profile"] == name and r["hp_asked"] == hp]
            label = f"{hp}" if cells[0]["hp"] == hp else f"{hp} (clamped to {cells[0]['hp']})"
            lines.append(f"| {label} | " + " | ".join(
                f"{c['reclaim']['adjacent']:.1%} / {c['reclaim']['budget_aware']:.1%}" for c in cells) + " |")
        lines.append("")
    lines += [f"### Multi-turn page padding ({args.turns} turns of {args.turn_tokens} tokens + {args.decode} "
              "generated, budget-aware): extra slots held over the dense slot count", "",
              "| profile | H_p | P | dense, extend in place | dense, copy tail each turn | fresh page per segment |",
              "|---|---|---|---|---|---|"]
    for m in mt_rows:
        o = m["overhead"]
        lines.append(f"| {m['profile']} | {m['hp']} | {m['page_size']} | {o['dense_in_place']:.2%} | "
                     f"{o['dense_copy']:.2%} | {o['fresh_page_per_segment']:.2%} |")
    return lines


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = [r for r in rows if r["hp_asked"] == 4 and r["page_size"] == 16]
    names = [r["profile"].replace("-instruct", "").replace("-2507", "") for r in sel]
    methods = ["monolithic", "adjacent", "budget_aware", "ideal"]
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(sel)), 4.5))
    x = np.arange(len(sel))
    for i, m in enumerate(methods):
        ax.bar(x + (i - 1.5) * 0.2, [100 * r["reclaim"][m] for r in sel], 0.2, label=m)
    ax.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("KV cache reclaimed vs full (%)")
    ax.set_title("Reclaim per method, H_p = 4, P = 16")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ratio", type=float, default=0.25)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=256)
    ap.add_argument("--pool-requests", type=int, default=32, help="pool size in full-KV requests")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=1000)
    ap.add_argument("--measure-p1", action="store_true", help="also run P=1 through the allocator (slow)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(RESULTS, "modeled"), help="folder of the results files")
    args = ap.parse_args(argv)
    run_stamp = stamp(argv)
    t0 = time.perf_counter()
    profiles = load_profiles(args.ratio, args.quick)
    rows = sweep(profiles, args)
    mt_rows = []
    for prof in profiles:
        if prof["name"].startswith(("smollm2", "llama-3.1-8b-instruct/snapkv")):
            for page_size in P_SWEEP:
                hp = min(4, prof["budgets"].shape[1])
                mt_rows.append(dict(profile=prof["name"], hp=hp, page_size=page_size,
                                    overhead=multi_turn(prof["budgets"], hp, page_size, args.turns,
                                                        args.turn_tokens, args.chunk, args.decode)))
    stem = os.path.join(args.out, "memory_reclaim" + ("_quick" if args.quick else ""))
    text = write_markdown(stem + ".md", "KV memory reclaimed by ragged paging", fmt_tables(rows, mt_rows, args),
                          run_stamp)
    write_json(stem + ".json", dict(args=vars(args), rows=rows, multi_turn=mt_rows), run_stamp)
    plot(rows, stem + ".png")
    if not any(p["name"].startswith("smollm2") for p in profiles):
        print("note: no configs/smollm2-*.yaml yet; reference profiles only")
    print(text)
    print(f"done in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
