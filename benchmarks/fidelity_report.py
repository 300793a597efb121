"""Tables and the Figure-9-style plot of the fidelity benchmark (from recorded answers only)."""

from __future__ import annotations

import json
import math
import os
import re

from fidelity_score import score, wilson

# the kvpress setting that runs the same scoring method as a profile's scorer
PEER = {"snapkv": "kvpress-snapkv", "kvzip": "kvpress-kvzip", "fastkvzip": "kvpress-kvzip"}


def base_setting(setting: str) -> str:
    """'dynamic' of 'dynamic@0,0', 'dynamic~position', 'dynamic[fastkvzip]' (the tags of --protect,
    --chunking and --profile)."""
    return re.split(r"[@~\[]", setting)[0]


def _rows_for(store, model, setting, ratio, convs, version):
    from fidelity import RunStore

    out = {}
    for c in convs:
        row = store.rows.get(RunStore.key(model, setting, ratio, c, version))
        if row is not None:
            out[c.id] = row
    return out


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
            if setting == "full":
                kept_share = 1.0
            elif kept:
                kept_share = sum(kept) / len(kept)
            else:
                kept_share = prof_kept.get(round(ratio, 4))
            out.append(dict(
                model=model, setting=setting, ratio=ratio, n=len(scored), judged=len(judged), correct=k,
                accuracy=k / len(judged) if judged else None, ci95=wilson(k, len(judged)),
                retrieval_correct=sum(s["correct"] for s in ret), retrieval_n=len(ret),
                replay_agree=sum(s["correct"] for s in rep), replay_n=len(rep),
                degenerate=sum(s["degenerate"] for s in scored), kept_share=kept_share,
                degenerate_ids=sorted(cid for cid, sc in zip(rows, scored) if sc["degenerate"]),
                fact_kept=(sum(facts) / len(facts)) if facts else None,
                saved_vs_full_kv=pool["pool_info"]["saved_vs_full_kv"] if pool else None,
                method=method, outcomes={cid: [sc["correct"], sc["degenerate"]] for cid, sc in zip(rows, scored)}))
    return out


def markdown(summary: list[dict], cmd: str) -> str:
    lines = [f"`{cmd}`", "",
             "| model | setting | ratio | kept share | accuracy [95% CI] | retrieval | replay agreement "
             "| degenerate | fact tokens kept | pool saved vs full KV |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        acc = "-" if s["accuracy"] is None else \
            f"{100 * s['accuracy']:.0f}% [{100 * s['ci95'][0]:.0f}, {100 * s['ci95'][1]:.0f}] ({s['correct']}/{s['judged']})"
        fact = "-" if s["fact_kept"] is None else f"{100 * s['fact_kept']:.0f}%"
        saved = "-" if s["saved_vs_full_kv"] is None else f"{100 * s['saved_vs_full_kv']:.0f}%"
        kept = "-" if s["kept_share"] is None else f"{100 * s['kept_share']:.0f}%"
        lines.append(f"| {s['model']} | {s['setting']} | {s['ratio']:g} | {kept} | {acc} "
                     f"| {s['retrieval_correct']}/{s['retrieval_n']} | {s['replay_agree']}/{s['replay_n']} "
                     f"| {s['degenerate']}/{s['n']} | {fact} | {saved} |")
    return "\n".join(lines + degenerate_lines(summary) + paired_lines(summary)) + "\n"


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
           ">= max(12, 3 x block) tokens, `fidelity_score.is_degenerate`); F: full KV degenerates on it "
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
    method run at Tangram's kept share (within 2 points of it, when such a row exists), vs
    kvpress's same method at the nearest kept share (degenerate answers), and vs the oracle with
    chunks fixed by position (--chunking position, both measures), when that experiment was run."""
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
        dyn = find(t["model"], t["setting"].replace("tangram", "dynamic", 1))
        if dyn and t["kept_share"] is not None:  # the dynamic method given Tangram's KV, when it was run
            near = min(dyn, key=lambda s: abs(s["kept_share"] - t["kept_share"]))
            if near["ratio"] != t["ratio"] and abs(near["kept_share"] - t["kept_share"]) < 0.02:
                out.append((t, near, "within 2 points at equal KV", 0))
        for o in find(t["model"], t["setting"].replace("tangram", "static~position", 1), t["ratio"]):
            out += [(t, o, "experiment: chunks by position", 0), (t, o, "experiment: chunks by position", 1)]
        peers = find(t["model"], PEER.get(t.get("method", ""), ""))
        if peers and t["kept_share"] is not None:
            near = min(peers, key=lambda s: abs(s["kept_share"] - t["kept_share"]))
            out.append((t, near, "degenerate no more often", 1))
    return out


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
        out.append(f"| {a['model']} | {a['setting']} {a['ratio']:g} ({100 * a['kept_share']:.0f}% kept) "
                   f"| {b['setting']} {b['ratio']:g} ({100 * b['kept_share']:.0f}%) | {want} | {measure} "
                   f"| {x}/{n} | {y}/{n} | {only_a} / {only_b} | {_p(sign_test(only_a, only_b))} |")
    return out


# overlapping lines (the server and its oracle agree exactly) stay visible through markers and dashes
STYLES = {"tangram": ("o", "-"), "static": ("x", ":"), "dynamic": ("^", "-"), "uniform": ("s", "--"),
          "kvpress-snapkv": ("v", "-"), "kvpress-adakv-snapkv": ("D", ":"), "kvpress-kvzip": ("P", "-")}


def plot(summary: list[dict], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = sorted({s["model"] for s in summary})
    if not models:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = [s for s in summary if s["model"] == model and s["accuracy"] is not None]
        for setting in dict.fromkeys(s["setting"] for s in rows):
            pts = sorted((s["kept_share"], s["accuracy"], s) for s in rows
                         if s["setting"] == setting and s["kept_share"] is not None)
            if setting == "full" and pts:
                ax.axhline(100 * pts[0][1], color="black", ls="--", lw=1, label="full KV (stock SGLang)")
                ax.plot([100], [100 * pts[0][1]], marker="*", color="black", ms=10)
                continue
            xs, ys = [100 * p[0] for p in pts], [100 * p[1] for p in pts]
            marker, ls = STYLES.get(base_setting(setting), ("o", "-"))
            ax.plot(xs, ys, marker=marker, ls=ls, label=setting, alpha=0.85)
            for x, y, (_, _, s) in zip(xs, ys, pts):
                if s["degenerate"]:
                    ax.annotate(f"{s['degenerate']} deg.", (x, y), fontsize=7, xytext=(3, -9),
                                textcoords="offset points")
                if s["saved_vs_full_kv"] is not None:
                    ax.annotate(f"saves {100 * s['saved_vs_full_kv']:.0f}%", (x, y), fontsize=7,
                                xytext=(3, 4), textcoords="offset points")
        ax.set_xlabel("KV kept (% of full)")
        ax.set_ylabel("multi-turn accuracy (%)")
        ax.set_title(f"{model}: accuracy vs kept share")
        ax.set_ylim(-2, 102)
        ax.set_xlim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(store, tables, args, tok_of) -> None:
    import sys

    from fidelity import PROFILES, ROOT

    summary = []
    for model, convs, versions in tables:
        profile = args.profile or os.path.join(ROOT, PROFILES[model])
        summary += summarize(store, model, convs, versions, args.ratios, args.settings, tok_of[model], profile)
    cmd = "python benchmarks/fidelity.py " + " ".join(sys.argv[1:])
    stem = args.name or ("fidelity_quick" if args.quick else "fidelity")
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, stem + ".json"), "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(s) for s in summary) + "\n]\n")  # one row per line
    md = markdown(summary, cmd.strip())
    with open(os.path.join(args.out_dir, stem + ".md"), "w") as f:
        f.write(md)
    plot(summary, os.path.join(args.out_dir, stem + ".png"))
    print(md)
