"""The long tier on servers (`python -m benchmarks.fidelity.run --tier long`): pass 1, pass 2, report.

Pass 1: stock SGLang (the `full` setting) answers every non-final turn of each script greedily, turn by
turn (benchmarks/fidelity/long_tier.py: pass_one); the replies are cached in fidelity_long_replies.json
beside the runs under model | script digest | SGLang version | reply cap, so they are generated once.
Pass 2: every served setting (full KV, Tangram) runs the conversations those replies fix: scored turns
answered greedily (--max-new-tokens), the others with one token so the server reuses the prefix; the
answers go to the run store (default fidelity_long_runs.jsonl) like the default tier's. kvpress (its own
venv) answers one question over one compressed history: each scored turn is its own item, the history
before that turn's user message compressed at once, the question read uncompressed (the same token ids:
benchmarks/fidelity/long_tier.py question_starts). The dense oracle answers only a conversation's last
turn and is not run on this tier.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common.client import generate
from benchmarks.common.models import ensure_model
from benchmarks.common.paths import ROOT
from benchmarks.common.results import write_json, write_markdown
from benchmarks.fidelity.long_tier import HISTORY_TOKENS, KINDS, LongConversation, build, exact_fact, \
    make_scripts, pass_one, question_starts
from benchmarks.fidelity.runners import kvpress_answers, log, run_server
from benchmarks.fidelity.score import is_degenerate, wilson
from benchmarks.fidelity.settings import KVPRESS, PROFILES, RUNS, base_setting
from benchmarks.fidelity.store import RunStore, digest
from benchmarks.fidelity.versions import code_version

SERVED = ("full", "tangram")
RUN_HERE = (*SERVED, *KVPRESS)   # the settings this tier runs


class ReplyCache:
    """Pass-1 replies, one JSON file: key -> list of reply texts. Thread-safe; written on every put."""

    def __init__(self, path: str):
        self.path, self.lock = path, threading.Lock()
        self.data = json.load(open(path)) if os.path.exists(path) else {}

    @staticmethod
    def key(model: str, script, reply_tokens: int) -> str:
        import sglang

        return f"{model}|{script.digest()}|sglang {sglang.__version__}|{reply_tokens}"

    def put(self, key: str, replies: list[str]) -> None:
        with self.lock:
            self.data[key] = replies
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(self.path, "w") as f:
                json.dump(self.data, f, indent=1)


def server_generator(url: str, tok):
    """generate(prompt_ids, max_new) -> (ids, text) on a server: greedy, the end-of-sequence token dropped."""
    def gen(ids, max_new):
        out = list(generate(url, ids, max_new).get("output_ids") or [])
        out = out[:-1] if out and out[-1] == tok.eos_token_id else out
        return out, tok.decode(out, skip_special_tokens=True)
    return gen


def run_pass_one(scripts, tok, model, model_path, args, cache: ReplyCache) -> None:
    """Replies of the scripts the cache lacks, from one stock server, args.concurrency scripts at a time."""
    from tangram_sglang.sglang.server_process import ServerProcess

    todo = [s for s in scripts if ReplyCache.key(model, s, args.reply_tokens) not in cache.data]
    if not todo or args.report_only:
        return
    extra = ["--max-total-tokens", str(args.max_total_tokens)]
    with ServerProcess(model_path, port=args.port, extra_args=extra,
                       log_path=f"/tmp/fidelity-{args.port}-long-pass1.log") as srv:
        gen = server_generator(srv.url, tok)
        log(f"{model} long pass 1: {len(todo)} scripts")

        def one(script):
            cache.put(ReplyCache.key(model, script, args.reply_tokens), pass_one(script, tok, gen, args.reply_tokens))
            log(f"  pass 1: {script.id} done")

        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(one, todo))


def long_session(url: str, conv: LongConversation, max_new: int) -> dict:
    """One conversation on a server: scored turns answered with max_new tokens, the rest with one."""
    answers, cached = [], []
    for t, ids in enumerate(conv.turns):
        out = generate(url, ids, max_new if t in conv.scored else 1)
        cached.append(out.get("meta_info", {}).get("cached_tokens"))
        if t in conv.scored:
            answers.append(list(out.get("output_ids") or []))
    return {"answers": answers, "answer_ids": answers[-1], "cached_tokens": cached}


def kvpress_items(conv: LongConversation, max_new: int, eos: int) -> dict[str, dict]:
    """The kvpress runner's items of a conversation (needs asked_at): one per scored turn, named by the
    conversation, the question's index and its ids' digest."""
    items = {}
    for i, (t, start) in enumerate(zip(conv.scored, conv.asked_at)):
        ids = conv.turns[t]
        items[f"{conv.id}#{i}#{digest(json.dumps(ids))}"] = dict(
            history_ids=ids[:start], question_ids=ids[start:], max_new_tokens=max_new, stop_ids=[eos],
            fact_spans=[s for s in conv.fact_spans if s[1] <= start])
    return items


def run_kvpress_long(setting, ratio, convs, args, store, model, model_path, version) -> None:
    """kvpress on the long tier: a runner call per conversation (its row is stored as soon as it is
    answered, so a stopped run keeps what it finished), the answers in order and, per question, the share
    of its KV attention still sees: (kept x history + question + answer) / all of them (kvpress's KVzip
    masks evicted entries and frees nothing; this is the share a pool of the same policy would hold)."""
    from transformers import AutoTokenizer

    eos = int(AutoTokenizer.from_pretrained(model_path).eos_token_id)
    for n, conv in enumerate(convs, 1):
        items = kvpress_items(conv, args.max_new_tokens, eos)
        out = kvpress_answers(setting, ratio, items, model, model_path, version)
        rows = [out[k] for k in items]
        held = [(r["kept"] * len(it["history_ids"]) + len(it["question_ids"]) + len(r["answer_ids"]))
                / (len(it["history_ids"]) + len(it["question_ids"]) + len(r["answer_ids"]))
                for r, it in zip(rows, items.values())]
        store.add(dict(key=RunStore.key(model, setting, ratio, conv, version), model=model, setting=setting,
                       ratio=ratio, conv=conv.id, seconds=round(sum(r["seconds"] for r in rows), 2),
                       answers=[r["answer_ids"] for r in rows], answer_ids=rows[-1]["answer_ids"], held=held,
                       fact_kept=[r.get("fact_kept_share") for r in rows]))
        log(f"  {setting} {ratio:g}: {n}/{len(convs)} ({conv.id}, {sum(r['seconds'] for r in rows):.0f} s)")


# -- report -------------------------------------------------------------------------------------------
def score_row(conv: LongConversation, row: dict, tok) -> list[tuple[bool, bool]]:
    """(right by the exact fact, degenerate) of each scored question of a recorded conversation."""
    out = []
    for ids, expect in zip(row["answers"], conv.expect):
        ids = ids[:-1] if ids and ids[-1] == tok.eos_token_id else ids
        out.append((exact_fact(tok.decode(ids, skip_special_tokens=True), expect), is_degenerate(ids)))
    return out


def ratios_of(setting: str, args) -> list[float]:
    """The ratios a setting runs at: 1.0 for full KV, --peer-ratios (if given) for kvpress, else --ratios."""
    if setting == "full":
        return [1.0]
    return args.peer_ratios if setting in KVPRESS and args.peer_ratios else args.ratios


def summarize(store, model, convs, versions, args, settings, tok, profile) -> list[dict]:
    """A report row per (setting, ratio) with recorded answers (args: its ratios and peer_ratios)."""
    from benchmarks.fidelity.report import _held

    out, full = [], {}
    for setting in settings:
        for ratio in ratios_of(setting, args):
            rows = {c.id: store.rows[k] for c in convs
                    if (k := RunStore.key(model, setting, ratio, c, versions[setting])) in store.rows}
            if not rows:
                continue
            full = rows if setting == "full" else full
            # scored answers token for token equal to full KV's, over the conversations both answered
            same = None if setting == "full" else [a == b for cid in rows.keys() & full.keys()
                                                   for a, b in zip(rows[cid]["answers"], full[cid]["answers"])]
            scored = {c.id: score_row(c, rows[c.id], tok) for c in convs if c.id in rows}
            per_kind = {}
            for kind in KINDS:
                qs = [q for c in convs if c.kind == kind and c.id in scored for q in scored[c.id]]
                cs = [all(r for r, _ in scored[c.id]) for c in convs if c.kind == kind and c.id in scored]
                per_kind[kind] = dict(questions=[sum(r for r, _ in qs), len(qs)], conversations=[sum(cs), len(cs)])
            k, n = (sum(v["questions"][i] for v in per_kind.values()) for i in (0, 1))
            held = _held(profile, setting, ratio, [c for c in convs if c.id in rows],
                         {cid: len(r["answer_ids"]) for cid, r in rows.items()}, tok)
            if "held" in next(iter(rows.values())):   # kvpress: its per-question shares
                held = sum(h for r in rows.values() for h in r["held"]) / sum(len(r["held"]) for r in rows.values())
            out.append(dict(model=model, setting=setting, ratio=ratio, n=len(rows), correct=k, questions=n,
                            accuracy=k / n if n else None, ci95=wilson(k, n), held_share=held,
                            conversations_correct=sum(v["conversations"][0] for v in per_kind.values()),
                            degenerate=sum(d for qs in scored.values() for _, d in qs), per_kind=per_kind,
                            same_as_full=None if same is None else [sum(same), len(same)],
                            version=versions[setting],
                            outcomes={cid: [[r, d] for r, d in qs] for cid, qs in scored.items()}))
    return out


def markdown(summary: list[dict]) -> list[str]:
    lines = ["| model | setting | ratio | KV held | questions [95% CI] | conversations all right | "
             + " | ".join(KINDS) + " | degenerate answers | answers as full KV's |", "|---" * (8 + len(KINDS)) + "|"]
    for s in summary:
        acc = "-" if s["accuracy"] is None else \
            f"{100 * s['accuracy']:.0f}% [{100 * s['ci95'][0]:.0f}, {100 * s['ci95'][1]:.0f}] ({s['correct']}/{s['questions']})"
        held = "-" if s.get("held_share") is None else f"{100 * s['held_share']:.0f}%"
        kinds = " | ".join("{}/{}".format(*s["per_kind"][k]["questions"]) for k in KINDS)
        lines.append(f"| {s['model']} | {s['setting']} | {s['ratio']:g} | {held} | {acc} "
                     f"| {s['conversations_correct']}/{s['n']} | {kinds} | {s['degenerate']}/{s['questions']} "
                     f"| {'-' if s['same_as_full'] is None else '{}/{}'.format(*s['same_as_full'])} |")
    return lines + ["", "Per kind: questions right by the exact fact (benchmarks/fidelity/long_tier.py). KV held "
                    "of a served row counts each intermediate turn's answer as one generated token (held.py), as the "
                    "tree keeps the history's chain and drops the answers' branches first under pressure; of a kvpress "
                    "row, each question's kept history plus its question and answer over all of them (KVzip masks "
                    "what it evicts: the share a pool of the same policy would hold)."]


def conversations(model: str, tok, args, split: bool = False) -> list[LongConversation]:
    """The model's long conversations, pass 1 run (or read from the cache) first; split: each with
    asked_at (where its scored turns' user messages begin), for kvpress."""
    from tangram_sglang.calibration.datasets import essays_dir
    from tangram_sglang.calibration.needle import EssayCorpus

    history = args.history_tokens or HISTORY_TOKENS.get(model, 7000)
    scripts = make_scripts(tok, EssayCorpus.load(essays_dir(), tok), args.long_per_kind, history)
    check_context(ensure_model(model), scripts, tok, args)
    cache = ReplyCache(os.path.join(os.path.dirname(os.path.abspath(args.runs)), "fidelity_long_replies.json"))
    run_pass_one(scripts, tok, model, ensure_model(model), args, cache)
    keys = [ReplyCache.key(model, s, args.reply_tokens) for s in scripts]
    replied = [(s, cache.data[k]) for s, k in zip(scripts, keys) if k in cache.data]
    convs = [build(s, tok, replies) for s, replies in replied]
    for conv, (s, replies) in zip(convs, replied):
        conv.asked_at = question_starts(s, tok, replies) if split else []
    return convs


def check_context(model_path: str, scripts, tok, args) -> None:
    """Refuse scripts the model cannot hold before pass 1 runs: the prompt with empty replies, plus every
    reply at its cap and the last answer, must fit the context (near it is the point, past it an error)."""
    from transformers import AutoConfig

    limit = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    for s in scripts:
        bare = len(build(s, tok, [""] * (len(s.turns) - 1)).prompt)
        longest = bare + args.reply_tokens * (len(s.turns) - 1) + args.max_new_tokens
        if limit and longest > limit:
            raise SystemExit(f"{model_path}: {s.id} may reach {longest} tokens, past the context ({limit}); "
                             "lower --history-tokens or --reply-tokens")


def main_long(args, run_stamp: dict) -> None:
    from transformers import AutoTokenizer

    from tangram_sglang.profile import load_profile

    if args.runs == RUNS:
        args.runs = os.path.join(os.path.dirname(RUNS), "fidelity_long_runs.jsonl")
    skipped = [s for s in args.settings if base_setting(s) not in RUN_HERE]
    if skipped:
        log(f"long tier: full, tangram and kvpress only; skipped {', '.join(skipped)}")
    settings = [s for s in args.settings if base_setting(s) in RUN_HERE]
    store, summary = RunStore(args.runs), []
    for model in args.models:
        model_path, tok = ensure_model(model), AutoTokenizer.from_pretrained(ensure_model(model))
        convs = conversations(model, tok, args, split=any(s in KVPRESS for s in settings))
        log(f"{model}: {len(convs)} long conversations, {min((len(c.prompt) for c in convs), default=0)}-"
            f"{max((len(c.prompt) for c in convs), default=0)} tokens")
        profile = args.profile or os.path.join(ROOT, PROFILES[model])
        versions = {s: code_version(s, profile) for s in {"full", *settings}}
        held = load_profile(profile).ratios if os.path.exists(profile) else ()
        for setting in settings:
            if base_setting(setting) == "tangram" and not os.path.exists(profile):
                log(f"{model}: no profile {profile}: {setting} skipped")
                continue
            for ratio in ratios_of(setting, args):
                if base_setting(setting) == "tangram" and not any(abs(r - ratio) < 1e-9 for r in held):
                    log(f"{model} {setting} {ratio:g}: skipped, the profile holds only {list(held)}")
                    continue
                todo = [c for c in convs if RunStore.key(model, setting, ratio, c, versions[setting]) not in store.rows]
                todo = todo[: args.limit] if args.limit else todo
                if todo and not args.report_only:
                    log(f"{model} {setting} {ratio:g}: {len(todo)} long conversations to run")
                    if setting in KVPRESS:
                        run_kvpress_long(setting, ratio, todo, args, store, model, model_path, versions[setting])
                    else:
                        run_server(setting, ratio, todo, args, store, model, model_path, versions[setting],
                                   session=long_session)
        summary += summarize(store, model, convs, versions, args, ["full", *[s for s in settings if s != "full"]],
                             tok, profile)
    stem = os.path.join(args.out_dir, args.name or ("fidelity_long_quick" if args.quick else "fidelity_long"))
    write_json(stem + ".json", {"rows": summary}, run_stamp, row_per_line="rows")
    print(write_markdown(stem + ".md", f"Multi-turn fidelity, long tier: {', '.join(args.models)}", markdown(summary),
                         run_stamp))
