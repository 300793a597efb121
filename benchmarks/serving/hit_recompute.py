"""A cache hit against a recompute (issue 61): the same conversations served three ways by one Engine.

N chat conversations (the essays of the calibration data as user messages, one system prompt shared by
all, of ``--system-tokens`` tokens), each of ``--turns`` turns built at the token level (ChatML, both
shipped models' template): a turn's prompt is the last one, its greedy reply and the next user message,
so every way sees the same tokens.

* ``tree``: turn by turn, conversations one after another, histories read from the radix tree;
* ``recompute``: the tree flushed before every turn (each history prefilled whole): the reference;
* ``batch``: after a flush, every conversation's final prompt in one batch;
* ``retract``: every final prompt in one batch on a second Engine whose scheduler retracts a decoding
  request every third forward (SGLang's own SGLANG_TEST_RETRACT): each retracted request is prefilled
  again from its prompt and the tokens it had generated.

For each way: turns whose greedy tokens equal the recompute's, the largest log-probability gap, and the
cached tokens; for the shared system prompt, the cached tokens of each conversation's first turn with
the others' in the tree. Usage:

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.serving.hit_recompute --model smollm2 --ratio 0.4 \\
        --conversations 16 --turns 4 --out benchmarks/results/serving/hit_recompute_smollm2.json
"""

from __future__ import annotations

import argparse
import atexit
import os
import time

from benchmarks.common.corpus import essay_texts
from benchmarks.common.log import logger
from benchmarks.common.models import ensure_model
from benchmarks.common.paths import ROOT
from benchmarks.common.results import write_json, write_markdown
from benchmarks.common.stamp import stamp

log = logger("hit_recompute")
PROFILES = {"smollm2": "configs/smollm2-fastkvzip.yaml", "qwen2.5-0.5b": "configs/qwen2.5-0.5b-fastkvzip.yaml"}


def conversations(tok, n: int, turns: int, system_tokens: int, user_tokens: int):
    """(system prompt, [[user message] * turns] * n) from the essays: disjoint spans of words."""
    words = " ".join(essay_texts()).split()
    system = tok.decode(tok.encode(" ".join(words[:system_tokens]), add_special_tokens=False)[:system_tokens])
    per = max(1, int(user_tokens * 0.75))   # about 4 words in 3 tokens
    users, at = [], system_tokens
    for _ in range(n):
        users.append([" ".join(words[at + per * t: at + per * (t + 1)]) for t in range(turns)])
        at = (at + per * turns) % max(1, len(words) - per * turns)
    return system, users


def _flush(engine):
    for _ in range(120):
        if engine.flush_cache().success:
            return
        time.sleep(0.5)
    raise RuntimeError("flush_cache never succeeded")


def _ask(engine, prompts, new):
    outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": new,
                                                               "ignore_eos": True}, return_logprob=True)
    return [{"ids": o["output_ids"], "lp": [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]],
             "cached": o["meta_info"]["cached_tokens"]} for o in outs]


def _engine(model_path, profile, ratio, pool, env=None):
    """An Engine with the profile and the pool's integrity check on every get_server_info; env: more
    variables its scheduler process starts with (all restored after)."""
    import sglang

    env = {"TANGRAM_INTEGRITY_CHECK": "1", **(env or {})}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return sglang.Engine(model_path=model_path, dtype="float32", max_total_tokens=pool, log_level="error",
                             tangram_profile=profile, tangram_ratio=ratio, sleep_on_idle=True)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def serve_retracting(model_path, profile, ratio, prompts, new, pool) -> dict:
    """Every prompt in one batch on an Engine that retracts a decoding request every third forward."""
    engine = _engine(model_path, profile, ratio, pool, {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "3"})
    try:
        outs = _ask(engine, prompts, new)
        info = engine.get_server_info()["internal_states"][0]["tangram"]["pool_info"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    return dict(outs=outs, retracted=info["retracted"], integrity=info.get("integrity"))


def serve(model_path, profile, ratio, tok, system, users, new, pool):
    engine = _engine(model_path, profile, ratio, pool)
    try:
        tree, prompts = [], []
        for c, conv in enumerate(users):
            ids = tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": conv[0]}],
                                          tokenize=True, add_generation_prompt=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            row, conv_prompts = [], []
            for t in range(len(conv)):
                (out,) = _ask(engine, [ids], new)
                row.append(out)
                conv_prompts.append(ids)
                if t + 1 < len(conv):
                    ids = ids + out["ids"] + tok.encode(f"<|im_end|>\n<|im_start|>user\n{conv[t + 1]}<|im_end|>\n"
                                                        "<|im_start|>assistant\n", add_special_tokens=False)
            tree.append(row)
            prompts.append(conv_prompts)
            log(f"tree: conversation {c + 1}/{len(users)}, {len(ids)} tokens")
        recompute = []
        for c, conv_prompts in enumerate(prompts):
            row = []
            for ids in conv_prompts:
                _flush(engine)
                row += _ask(engine, [ids], new)
            recompute.append(row)
            log(f"recompute: conversation {c + 1}/{len(users)}")
        _flush(engine)
        batch = _ask(engine, [p[-1] for p in prompts], new)
        _flush(engine)
        firsts = [_ask(engine, [p[0]], new)[0]["cached"] for p in prompts]
        info = engine.get_server_info()["internal_states"][0]["tangram"]["pool_info"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    return dict(tree=tree, recompute=recompute, batch=batch, firsts=firsts, prompts=prompts, pool_info=info)


def compare(got, want) -> dict:
    same = got["ids"] == want["ids"]
    gap = max((abs(a - b) for a, b in zip(got["lp"], want["lp"])), default=0.0)
    return {"same": same, "gap": gap}


def summarize(res: dict, system_len: int) -> dict:
    tree = [compare(a, b) for ra, rb in zip(res["tree"], res["recompute"]) for a, b in zip(ra, rb)]
    batch = [compare(a, rb[-1]) for a, rb in zip(res["batch"], res["recompute"])]
    retract = [compare(a, rb[-1]) for a, rb in zip(res["retract"]["outs"], res["recompute"])]
    # a later turn's history: the turn before's prompt and its reply but the last token (no KV yet)
    later = [(row[i]["cached"], len(prompts[i - 1]) + len(row[i - 1]["ids"]) - 1)
             for row, prompts in zip(res["tree"], res["prompts"]) for i in range(1, len(row))]
    return {"tree_same": sum(x["same"] for x in tree), "tree_turns": len(tree),
            "tree_gap": max(x["gap"] for x in tree), "batch_same": sum(x["same"] for x in batch),
            "batch_turns": len(batch), "batch_gap": max(x["gap"] for x in batch),
            "retract_same": sum(x["same"] for x in retract), "retract_turns": len(retract),
            "retract_gap": max(x["gap"] for x in retract), "retractions": res["retract"]["retracted"],
            "retract_integrity": res["retract"]["integrity"], "integrity": res["pool_info"].get("integrity"),
            "history_reused": sum(c for c, _ in later), "history_tokens": sum(h for _, h in later),
            "system_tokens": system_len, "first_turn_cached": res["firsts"]}


def report(s: dict, args) -> list[str]:
    shared = s["first_turn_cached"][1:]
    return [
        f"{args.conversations} conversations x {args.turns} turns, {args.model} at {args.ratio} "
        f"(`{PROFILES[args.model]}`), a {s['system_tokens']}-token system prompt shared by all, user messages of "
        f"about {args.user_tokens} tokens, {args.new_tokens}-token greedy replies fed back at the token level.", "",
        "| way | turns answering as the recompute | largest log-prob gap |", "|---|---|---|",
        f"| turn by turn from the tree | {s['tree_same']}/{s['tree_turns']} | {s['tree_gap']:.2e} |",
        f"| final prompts in one batch | {s['batch_same']}/{s['batch_turns']} | {s['batch_gap']:.2e} |",
        f"| final prompts in one batch, a request retracted every third forward ({s['retractions']} retractions, "
        f"integrity {s['retract_integrity']}) | {s['retract_same']}/{s['retract_turns']} | {s['retract_gap']:.2e} |", "",
        f"The pool's integrity check after the three ways on the first Engine: {s['integrity']}.",
        f"Later turns read {s['history_reused']:,} of their {s['history_tokens']:,} history tokens from the tree. "
        f"First turns with the other conversations in the tree read {min(shared) if shared else 0}-"
        f"{max(shared) if shared else 0} tokens from it (the system prompt: {s['system_tokens']}).",
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(PROFILES), default="smollm2")
    ap.add_argument("--ratio", type=float, default=0.4)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=600)
    ap.add_argument("--user-tokens", type=int, default=400)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--max-total-tokens", type=int, default=65536)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    st = stamp(argv)
    from transformers import AutoTokenizer

    path = ensure_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    system, users = conversations(tok, args.conversations, args.turns, args.system_tokens, args.user_tokens)
    res = serve(path, os.path.join(ROOT, PROFILES[args.model]), args.ratio, tok, system, users, args.new_tokens,
                args.max_total_tokens)
    res["retract"] = serve_retracting(path, os.path.join(ROOT, PROFILES[args.model]), args.ratio,
                                      [p[-1] for p in res["prompts"]], args.new_tokens, args.max_total_tokens)
    sys_ids = tok.apply_chat_template([{"role": "system", "content": system}], tokenize=True)
    s = summarize(res, len(list(sys_ids["input_ids"] if hasattr(sys_ids, "keys") else sys_ids)))
    lines = report(s, args)
    print("\n".join(lines))
    if args.out:
        write_json(args.out, {"args": vars(args), "summary": s, "pool_info": res["pool_info"],
                              "tree": res["tree"], "recompute": res["recompute"], "batch": res["batch"],
                              "retract": res["retract"]["outs"]}, st)
        write_markdown(os.path.splitext(args.out)[0] + ".md", "A cache hit against a recompute", lines, st)


if __name__ == "__main__":
    main()
