"""Multi-turn fidelity: accuracy vs kept share for full KV, Tangram, the dynamic method, uniform and kvpress.

    .venv/bin/python -m benchmarks.fidelity.run --quick          # a laptop's hour: SmolLM2, 4 per kind
    .venv/bin/python -m benchmarks.fidelity.run                  # the README's figures (resumable)
    .venv/bin/python -m benchmarks.fidelity.run --report-only    # tables and plot from what is recorded
    .venv/bin/python -m benchmarks.fidelity.run --tier long --models smollm2 --settings full tangram
                                                                 # the long tier (benchmarks/fidelity/long_run.py)

Same conversations (benchmarks/fidelity/tasks.py) and token ids for every setting:
  full        stock SGLang (no profile), sessions concurrent, each turn a /generate request
  tangram     the real server with --tangram-profile P --tangram-ratio r, sessions concurrent
  static      the dense oracle (tangram_sglang.oracle.serving_reference) with the profile's static budgets: what
              the server must compute, one conversation at a time (a check of the served path)
  dynamic     the same oracle with per-chunk global top-k over the heads of each layer at ratio r (the
              paper's "w/o Tangram"), same chunk schedule as served
  uniform     the same oracle, every head keeping the profile's mean per-head budget (equal memory)
  kvpress-X   NVIDIA kvpress 0.5.5 in its own venv (benchmarks/fidelity/kvpress_env.py): history compressed at
              prefill, the final question and answer uncompressed; X in snapkv, adakv-snapkv, kvzip, ...
  X+fp8_e4m3  (--kv-cache-dtype) the setting with its KV stored in that type: the server's flag, the
              oracle storing its cache so (stock SGLang 0.5.23 refuses FP8 KV on a CPU without Intel AMX)
  X~position  (--chunking position, an experiment on the oracle settings) the chunk rule without the chat
              template's message markers: chunks fixed by position over the whole prompt, the trailing
              partial chunk kept whole, instead of chunks restarting at each message (what serving does)
  X~replies   (--chunking replies; served: --tangram-replies compressed) the assistant's messages compressed
              once closed, like the user's, instead of kept whole
Intermediate turns are sent with max_new_tokens=1 (their reply is the task's fixed text, so the next
prompt extends this one and the server reuses it); the last turn is answered greedily.

Every answer is recorded in --runs (JSON lines, committed; default
benchmarks/results/fidelity/fidelity_runs.jsonl, with fidelity_versions.json beside it) under a key of
model, setting, ratio, conversation, the conversation's token ids and the code version of the setting
(benchmarks/fidelity/versions.py), so a run can stop and resume, and a code change re-runs only what it
affects. Outputs: --out-dir/fidelity.{md,json,png}, stamped (benchmarks/common/stamp.py).
"""

from __future__ import annotations

import argparse
import os

from benchmarks.common.models import ensure_model
from benchmarks.common.paths import ROOT, RESULTS
from benchmarks.common.stamp import stamp
from benchmarks.fidelity.report import write_report
from benchmarks.fidelity.runners import RUNNERS, log, run_oracle
from benchmarks.fidelity.settings import DEFAULT_PROTECT, KVPRESS, ORACLE, PROFILES, RUNS, base_setting
from benchmarks.fidelity.store import RunStore
from benchmarks.fidelity.tasks import build_conversations
from benchmarks.fidelity.versions import code_version


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="SmolLM2, 4 retrieval per kind, 2 replays, short docs")
    ap.add_argument("--tier", choices=("default", "long"), default="default",
                    help="long: histories near the context, the model's own replies, several scored questions "
                    "(benchmarks/fidelity/long_tier.py; served settings only; runs default to fidelity_long_runs.jsonl)")
    ap.add_argument("--long-per-kind", type=int, default=8, help="long tier: scripts per multihop/two_facts/newest")
    ap.add_argument("--history-tokens", type=int, default=0,
                    help="long tier: history length (default per model: long_tier.HISTORY_TOKENS)")
    ap.add_argument("--reply-tokens", type=int, default=48, help="long tier: cap of the full-KV model's replies")
    ap.add_argument("--models", nargs="+", default=["smollm2", "qwen2.5-0.5b"], choices=sorted(PROFILES))
    ap.add_argument("--settings", nargs="+", default=["full", "tangram", *ORACLE, *KVPRESS],
                    choices=sorted(RUNNERS))
    ap.add_argument("--ratios", nargs="+", type=float, default=[0.7, 0.5, 0.25])
    ap.add_argument("--peer-ratios", nargs="+", type=float, default=None,
                    help="long tier: kvpress's kept shares (default --ratios), e.g. Tangram's measured KV held")
    ap.add_argument("--retrieval-per-kind", type=int, default=22, help="per passkey/needle/variable_tracking")
    ap.add_argument("--replays-per-kind", type=int, default=8, help="per ShareGPT / MT-Bench")
    ap.add_argument("--doc-tokens", type=int, default=600, help="tokens of each document (3 per conversation)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4, help="sessions in flight per server")
    ap.add_argument("--max-total-tokens", type=int, default=32768, help="stock KV tokens (Tangram: same bytes)")
    ap.add_argument("--port", type=int, default=31200)
    ap.add_argument("--limit", type=int, default=0, help="run at most this many new conversations per setting")
    ap.add_argument("--profile", help="serve/score with this profile instead of the model's default "
                    "(settings are then recorded as setting[method])")
    ap.add_argument("--protect", default="4,64", help="oracle settings: SINKS,NEWEST protected tokens (a "
                    "candidate other than the served 4,64 is recorded as setting@SINKS,NEWEST)")
    ap.add_argument("--chunking", choices=("turn", "position", "replies"), default="turn",
                    help="oracle settings: turn = the served chunk rule (chunks from each message start of the chat "
                    "template); position = an experiment: the rule without message markers; replies = the "
                    "assistant's messages compressed once closed (--tangram-replies compressed). Recorded as "
                    "setting~position / setting~replies")
    ap.add_argument("--runs", default=RUNS, help="recorded answers (fidelity_versions.json is read beside them)")
    ap.add_argument("--out-dir", default=os.path.join(RESULTS, "fidelity"))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--name", default="", help="file stem of the report (default fidelity / fidelity_quick)")
    ap.add_argument("--carry-from", metavar="VERSION", help="re-run --carry-check recorded conversations of "
                    "this older code version per setting and ratio; if every answer is identical, its rows "
                    "count for the current version (recorded in fidelity_versions.json)")
    ap.add_argument("--carry-check", type=int, default=6)
    ap.add_argument("--kv-cache-dtype", nargs="+", choices=("auto", "fp8_e4m3", "fp8_e5m2"), default=["auto"],
                    help="store KV in these types (an FP8 type records the settings as setting+TYPE; kvpress and "
                    "full KV run with auto only)")
    args = ap.parse_args(argv)
    args.protect = tuple(int(x) for x in args.protect.split(","))
    if args.protect != DEFAULT_PROTECT:
        tag = "@" + ",".join(map(str, args.protect))
        args.settings = [s + tag if s in ORACLE else s for s in args.settings]
        RUNNERS.update({s: run_oracle for s in args.settings if s.endswith(tag)})
    if args.chunking != "turn":
        tagged = (*ORACLE, "tangram") if args.chunking == "replies" else ORACLE   # a server flag serves it
        args.settings = [s + "~" + args.chunking if base_setting(s) in tagged else s for s in args.settings]
        RUNNERS.update({s: RUNNERS[base_setting(s)] for s in args.settings if s.endswith("~" + args.chunking)})
    if args.profile:
        from tangram_sglang.profile import load_profile

        tag = f"[{load_profile(args.profile).calibration.method}]"
        PROFILES.update({m: os.path.abspath(args.profile) for m in args.models})
        renamed = [s + tag if s not in ("full", *KVPRESS) else s for s in args.settings]
        RUNNERS.update({n: RUNNERS[s] for s, n in zip(args.settings, renamed)})
        args.settings = renamed
    if args.kv_cache_dtype != ["auto"]:
        tagged = [s if kv == "auto" else s + "+" + kv for kv in args.kv_cache_dtype for s in args.settings
                  if kv == "auto" or s not in (*KVPRESS, "full")]
        RUNNERS.update({n: RUNNERS[base_setting(n)] for n in tagged})
        args.settings = tagged
    if args.quick:
        args.models, args.retrieval_per_kind, args.replays_per_kind, args.doc_tokens = ["smollm2"], 4, 2, 350
        args.long_per_kind = min(args.long_per_kind, 2)
    return args


def main(argv=None) -> None:
    args = parse(argv)
    run_stamp = stamp(argv)
    from transformers import AutoTokenizer

    from tangram_sglang.profile import load_profile

    if args.tier == "long":
        from benchmarks.fidelity.long_run import main_long

        return main_long(args, run_stamp)
    store = RunStore(args.runs)
    if args.carry_from:
        return carry_over(store, args)
    tables = []
    for model in args.models:
        model_path = ensure_model(model)
        tok = AutoTokenizer.from_pretrained(model_path)
        convs = build_conversations(tok, retrieval_per_kind=args.retrieval_per_kind,
                                    replay_per_kind=args.replays_per_kind, doc_tokens=args.doc_tokens)
        log(f"{model}: {len(convs)} conversations, {min(len(c.prompt) for c in convs)}-"
            f"{max(len(c.prompt) for c in convs)} tokens")
        profile = os.path.join(ROOT, PROFILES[model])
        if not os.path.exists(profile):
            log(f"{model}: no profile {PROFILES[model]}: only full KV and kvpress run")
        held = load_profile(profile).ratios if os.path.exists(profile) else ()
        for setting in args.settings:
            if setting not in ("full", *KVPRESS) and not os.path.exists(profile):
                continue
            version, base = code_version(setting, profile), base_setting(setting)
            for ratio in ([1.0] if setting == "full" else args.ratios):
                if base in ("tangram", "static", "uniform") and not any(abs(r - ratio) < 1e-9 for r in held):
                    # served and static settings need the profile's own entry; the dynamic method and kvpress don't
                    log(f"{model} {setting} {ratio:g}: skipped, the profile holds only {list(held)}")
                    continue
                todo = [c for c in convs if RunStore.key(model, setting, ratio, c, version) not in store.rows]
                if args.limit:
                    todo = todo[: args.limit]
                if todo and not args.report_only:
                    log(f"{model} {setting} {ratio:g}: {len(todo)} to run")
                    RUNNERS[setting](setting, ratio, todo, args, store, model, model_path, version)
        tables.append((model, convs, {s: code_version(s, profile) for s in {"full", *args.settings}}))
    write_report(store, tables, args, tok_of={m: AutoTokenizer.from_pretrained(ensure_model(m)) for m in args.models},
                 run_stamp=run_stamp)


def carry_over(store: RunStore, args) -> None:
    """--carry-from: re-run a few recorded conversations on the current code; equal answers carry the rest."""
    from transformers import AutoTokenizer

    checked, versions = 0, set()
    for model in args.models:
        model_path = ensure_model(model)
        convs = build_conversations(AutoTokenizer.from_pretrained(model_path), retrieval_per_kind=args.retrieval_per_kind,
                                    replay_per_kind=args.replays_per_kind, doc_tokens=args.doc_tokens)
        profile = os.path.join(ROOT, PROFILES[model])
        for setting in [s for s in args.settings if s != "full" and not s.startswith("kvpress")]:
            version = code_version(setting, profile)
            versions.add(version)
            for ratio in args.ratios:
                old = [c for c in convs if RunStore.key(model, setting, ratio, c, args.carry_from) in store.rows]
                pick = old[:: max(1, len(old) // args.carry_check)][: args.carry_check]
                # re-run unless run at this version already: an aliased row would compare with itself
                todo = [c for c in pick if RunStore.key(model, setting, ratio, c, version) not in store.run_keys]
                if todo:
                    log(f"carry check {model} {setting} {ratio:g}: {len(todo)} to run")
                    RUNNERS[setting](setting, ratio, todo, args, store, model, model_path, version)
                for c in pick:
                    a = store.rows[RunStore.key(model, setting, ratio, c, args.carry_from)]["answer_ids"]
                    b = store.rows[RunStore.key(model, setting, ratio, c, version)]["answer_ids"]
                    if a != b:
                        log(f"carry check failed: {model} {setting} {ratio:g} {c.id} answers differ; nothing carried")
                        return
                    checked += 1
    if checked == 0:
        log(f"carry check: no recorded conversations of version {args.carry_from} among the settings asked")
        return
    for version in sorted(versions - {args.carry_from}):
        store.record_equivalence(version, args.carry_from, f"{checked} conversations re-run with identical answers "
                                 f"({', '.join(args.settings)}; ratios {args.ratios})")
    log(f"carry check passed on {checked} conversations: {args.carry_from} answers count for "
        f"{', '.join(sorted(versions))}")


if __name__ == "__main__":
    main()
