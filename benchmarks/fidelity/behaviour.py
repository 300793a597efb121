"""Behaviour kept across a code change, on whole conversation sets: the answers recorded for an
older code version against those run on a newer one, conversation by conversation.

    python -m benchmarks.fidelity.behaviour --model smollm2 --setting 'tangram[fastkvzip]' \
        --ratios 0.4 0.25 --old 173ed5c72be4 --new aa0374e80afa

Old answers may be read through recorded equivalences (the rows a version inherited); new ones
must have been run at the new version (``python -m benchmarks.fidelity.run --carry-from OLD
--carry-check N`` with N the set's size runs them all). Each comparison is kept, keyed by
(model, setting, ratio, old, new), in results/fidelity/behaviour.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks.common.paths import result_path
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp
from benchmarks.fidelity.settings import RUNS
from benchmarks.fidelity.store import RunStore

OUT = result_path("fidelity", "behaviour")


def compare(store: RunStore, model: str, setting: str, ratio: float, old: str, new: str) -> dict:
    """Every conversation recorded for (model, setting, ratio) at `old`, against its run at `new`."""
    head = f"{model}|{setting}|{ratio:g}|"
    olds = {k[len(head):].rsplit("|", 1)[0]: r for k, r in store.rows.items()
            if k.startswith(head) and k.endswith(f"|{old}") and r.get("conv") != "pool"}
    same, differ, missing = [], [], []
    for conv_key, row in sorted(olds.items()):
        key = f"{head}{conv_key}|{new}"
        if key not in store.run_keys:
            missing.append(row["conv"])
        elif store.rows[key]["answer_ids"] == row["answer_ids"]:
            same.append(row["conv"])
        else:
            differ.append(row["conv"])
    return dict(model=model, setting=setting, ratio=ratio, old=old, new=new, conversations=len(olds),
                identical=len(same), differing=differ, not_run=missing)


def report(rows: list[dict]) -> list[str]:
    lines = ["Answers recorded for the old code version against the new one's, every conversation of the set.", "",
             "| model | setting | ratio | old -> new | conversations | identical | differing | not run |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['setting']} | {r['ratio']:g} | {r['old']} -> {r['new']} | "
                     f"{r['conversations']} | {r['identical']} | {', '.join(r['differing']) or '-'} | "
                     f"{len(r['not_run'])} |")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--setting", required=True, help="as recorded, e.g. 'tangram[fastkvzip]'")
    ap.add_argument("--ratios", type=float, nargs="+", required=True)
    ap.add_argument("--old", required=True, help="the older code version")
    ap.add_argument("--new", required=True, help="the newer code version (its answers must have been run)")
    ap.add_argument("--runs", default=RUNS)
    args = ap.parse_args(argv)
    store = RunStore(args.runs)
    kept = {}
    if os.path.exists(OUT + ".json"):
        kept = {(r["model"], r["setting"], r["ratio"], r["old"], r["new"]): r
                for r in json.load(open(OUT + ".json"))["rows"]}
    for ratio in args.ratios:
        row = compare(store, args.model, args.setting, ratio, args.old, args.new)
        print(f"{args.model} {args.setting} {ratio:g}: {row['identical']}/{row['conversations']} identical, "
              f"differing {row['differing'] or 'none'}, not run {len(row['not_run'])}")
        kept[(row["model"], row["setting"], row["ratio"], row["old"], row["new"])] = row
    rows = list(kept.values())
    s = stamp(argv)
    write_json(OUT + ".json", {"rows": rows}, s, row_per_line="rows")
    write_markdown(OUT + ".md", "Behaviour kept across code changes", report(rows), s)


if __name__ == "__main__":
    main()
