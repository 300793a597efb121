"""Tables of the fidelity benchmark, from recorded answers only: accuracy per setting and ratio,
degenerate answers, paired comparisons (benchmarks/fidelity/paired.py) and the plot."""

from __future__ import annotations

import os

from benchmarks.common.paths import ROOT
from benchmarks.common.results import write_json, write_markdown
from benchmarks.fidelity.paired import paired_lines
from benchmarks.fidelity.plot import plot
from benchmarks.fidelity.score import score, wilson
from benchmarks.fidelity.settings import PROFILES
from benchmarks.fidelity.store import RunStore


def _rows_for(store, model, setting, ratio, convs, version):
    out = {}
    for c in convs:
        row = store.rows.get(RunStore.key(model, setting, ratio, c, version))
        if row is not None:
            out[c.id] = row
    return out


def _held(profile: str, setting: str, ratio: float, convs, answers: dict, tok) -> float | None:
    """Served settings: the mean share of full KV the pool holds per conversation (held.py), cut at the
    chat template's markers as the server cuts (tok: the model's tokenizer); else None."""
    from benchmarks.fidelity.held import mean_held_share
    from benchmarks.fidelity.settings import base_setting, chunk_markers, chunking, kv_cache_dtype
    from tangram_sglang.profile import load_profile

    if base_setting(setting) != "tangram" or not os.path.exists(profile):
        return None
    dtype = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}.get(kv_cache_dtype(setting), "float32")
    return mean_held_share(load_profile(profile), ratio, convs, answers, kv_dtype=dtype,
                           markers=chunk_markers(chunking(setting), tok))


def _profile_info(path: str) -> tuple[dict, str]:
    """(kept share of the served profile per ratio: the mean per-head group budget, chunk rounding
    aside; the profile's scoring method), or ({}, "") without a profile."""
    from tangram_sglang.profile import load_profile

    if not os.path.exists(path):
        return {}, ""
    prof = load_profile(path)
    out = {}
    for e in prof.entries:
        per_head = [e.group_budget[l][g] for l, groups in enumerate(e.groups) for g, hs in enumerate(groups)
                    for _ in hs]
        out[round(e.ratio, 4)] = float(sum(per_head) / len(per_head))
    return out, prof.calibration.method


def _answer(row: dict, eos: int) -> list[int]:
    """Answer ids without the end-of-sequence token the server returns (the oracle and kvpress drop it)."""
    ids = list(row["answer_ids"])
    return ids[:-1] if ids and ids[-1] == eos else ids


def summarize(store, model, convs, versions, ratios, settings, tok, profile: str) -> list[dict]:
    full_rows = _rows_for(store, model, "full", 1.0, convs, versions.get("full", ""))
    full_ids = {cid: _answer(r, tok.eos_token_id) for cid, r in full_rows.items()}
    prof_kept, method = _profile_info(profile)
    by_conv = {c.id: c.to_json() for c in convs}
    out = []
    for setting in settings:
        for ratio in ([1.0] if setting == "full" else ratios):
            rows = _rows_for(store, model, setting, ratio, convs, versions[setting])
            if not rows:
                continue
            scored = []
            for cid, r in rows.items():
                ids = _answer(r, tok.eos_token_id)
                text = tok.decode(ids, skip_special_tokens=True)
                scored.append({**score(by_conv[cid], ids, text, full_ids.get(cid)),
                               "retrieval": bool(by_conv[cid]["expect"])})
            judged = [s for s in scored if s["correct"] is not None]
            ret = [s for s in judged if s["retrieval"]]
            rep = [s for s in judged if not s["retrieval"]]
            k = sum(s["correct"] for s in judged)
            kept = [r["kept"] for r in rows.values() if r.get("kept") is not None]
            facts = [r["fact_kept"] for r in rows.values() if r.get("fact_kept") is not None]
            pool = store.rows.get(f"{model}|{setting}|{ratio:g}|pool|{versions[setting]}")
            held = _held(profile, setting, ratio, [c for c in convs if c.id in rows],
                         {cid: len(r["answer_ids"]) for cid, r in rows.items()}, tok)
            if setting == "full":
                kept_share = 1.0
            elif kept:
                kept_share = sum(kept) / len(kept)
            else:
                kept_share = prof_kept.get(round(ratio, 4))
            out.append(dict(
                model=model, setting=setting, ratio=ratio, n=len(scored), judged=len(judged), correct=k, held_share=held,
                accuracy=k / len(judged) if judged else None, ci95=wilson(k, len(judged)),
                retrieval_correct=sum(s["correct"] for s in ret), retrieval_n=len(ret),
                replay_agree=sum(s["correct"] for s in rep), replay_n=len(rep),
                degenerate=sum(s["degenerate"] for s in scored), kept_share=kept_share,
                degenerate_ids=sorted(cid for cid, sc in zip(rows, scored) if sc["degenerate"]),
                fact_kept=(sum(facts) / len(facts)) if facts else None,
                saved_vs_full_kv=pool["pool_info"]["saved_vs_full_kv"] if pool else None,
                method=method, version=versions[setting], outcomes={cid: [sc["correct"], sc["degenerate"]] for cid, sc in zip(rows, scored)}))
    return out


def markdown(summary: list[dict]) -> list[str]:
    lines = ["| model | setting | ratio | kept share | KV held | accuracy [95% CI] | retrieval | replay agreement "
             "| degenerate | fact tokens kept | pool saved vs full KV |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        acc = "-" if s["accuracy"] is None else \
            f"{100 * s['accuracy']:.0f}% [{100 * s['ci95'][0]:.0f}, {100 * s['ci95'][1]:.0f}] ({s['correct']}/{s['judged']})"
        fact = "-" if s["fact_kept"] is None else f"{100 * s['fact_kept']:.0f}%"
        saved = "-" if s["saved_vs_full_kv"] is None else f"{100 * s['saved_vs_full_kv']:.0f}%"
        kept = "-" if s["kept_share"] is None else f"{100 * s['kept_share']:.0f}%"
        held = "-" if s.get("held_share") is None else f"{100 * s['held_share']:.0f}%"
        lines.append(f"| {s['model']} | {s['setting']} | {s['ratio']:g} | {kept} | {held} | {acc} "
                     f"| {s['retrieval_correct']}/{s['retrieval_n']} | {s['replay_agree']}/{s['replay_n']} "
                     f"| {s['degenerate']}/{s['n']} | {fact} | {saved} |")
    return lines + degenerate_lines(summary) + paired_lines(summary)


def degenerate_lines(summary: list[dict]) -> list[str]:
    """Which conversations degenerate, and whether full KV or the dynamic method (same scorer and
    ratio) degenerate on the same one: what is left is what Tangram's system itself adds."""
    def ids(model, setting, ratio):
        return next((set(s["degenerate_ids"]) for s in summary if (s["model"], s["setting"]) == (model, setting)
                     and s["ratio"] == ratio), None)

    rows = [s for s in summary if s.get("degenerate_ids")]
    if not rows:
        return []
    out = ["", "Degenerate answers by conversation (a block of 1 to 8 tokens repeated back to back over "
           ">= max(12, 3 x block) tokens, `benchmarks/fidelity/score.py: is_degenerate`); F: full KV degenerates on it "
           "too, D: the dynamic method of the same scorer at the same ratio too:", ""]
    for s in rows:
        full = set() if s["setting"] == "full" else ids(s["model"], "full", 1.0) or set()
        dyn = ids(s["model"], s["setting"].replace("tangram", "dynamic", 1), s["ratio"]) \
            if s["setting"].startswith("tangram") else None
        tags = {cid: ",".join(m for m, group in (("F", full), ("D", dyn or set())) if cid in group)
                for cid in s["degenerate_ids"]}
        marks = [f"{cid} ({t})" if t else cid for cid, t in tags.items()]
        own = "" if dyn is None else \
            f"; neither full KV nor dynamic: {sum(c not in full and c not in dyn for c in s['degenerate_ids'])}"
        out.append(f"- {s['model']} {s['setting']} {s['ratio']:g}: {', '.join(marks)}{own}")
    return out


def write_report(store, tables, args, tok_of, run_stamp: dict) -> None:
    """--out-dir/<name>.{json,md,png}: the summary rows, their tables, the plot."""
    summary = []
    for model, convs, versions in tables:
        profile = args.profile or os.path.join(ROOT, PROFILES[model])
        summary += summarize(store, model, convs, versions, args.ratios, args.settings, tok_of[model], profile)
    stem = os.path.join(args.out_dir, args.name or ("fidelity_quick" if args.quick else "fidelity"))
    write_json(stem + ".json", {"rows": summary}, run_stamp, row_per_line="rows")
    print(write_markdown(stem + ".md", f"Multi-turn fidelity: {', '.join(args.models)}", markdown(summary),
                         run_stamp))
    plot(summary, stem + ".png")
