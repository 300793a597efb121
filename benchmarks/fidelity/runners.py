"""How each fidelity setting answers: the real server (full KV, Tangram), the dense oracle (static,
dynamic, uniform) and the kvpress peer in its own venv. Every runner takes the same arguments and
records one row per conversation in the RunStore."""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common.client import generate, server_state
from benchmarks.common.log import logger
from benchmarks.common.paths import ROOT
from benchmarks.fidelity.settings import (CHUNK, KVPRESS, ORACLE, PROFILES, base_setting, chunk_markers, chunking,
                                         kv_cache_dtype)
from benchmarks.fidelity.store import RunStore, digest
from benchmarks.fidelity.tasks import Conversation
from benchmarks.fidelity.versions import KVPRESS_FILES

KVPRESS_RUNNER = KVPRESS_FILES[0]
log = logger("fidelity")


# -- servers ----------------------------------------------------------------------------------------
def run_session(url: str, conv: Conversation, max_new: int) -> dict:
    cached = []
    for i, ids in enumerate(conv.turns):
        last = i == len(conv.turns) - 1
        out = generate(url, ids, max_new if last else 1)
        cached.append(out.get("meta_info", {}).get("cached_tokens"))
    return {"answer_ids": list(out.get("output_ids") or []), "cached_tokens": cached}


def run_server(setting, ratio, convs, args, store, model, model_path, version, session=run_session) -> None:
    """session(url, conv, max_new) -> the row's answer fields (the long tier answers several turns)."""
    from tangram_sglang.sglang.server_process import ServerProcess

    profile = os.path.join(ROOT, PROFILES[model]) if setting.startswith("tangram") else None
    extra = ["--max-total-tokens", str(args.max_total_tokens)] + (["--tangram-ratio", str(ratio)] if profile else [])
    if kv_cache_dtype(setting):
        extra += ["--kv-cache-dtype", kv_cache_dtype(setting)]
    if chunking(setting) == "replies":
        extra += ["--tangram-replies", "compressed"]
    with ServerProcess(model_path, port=args.port, profile=profile, extra_args=extra,
                       log_path=f"/tmp/fidelity-{args.port}-{setting}-{ratio:g}.log") as srv:
        log(f"{setting} {ratio:g}: server up, {len(convs)} sessions, {args.concurrency} at a time")
        done = [0]

        def one(conv):
            t0 = time.perf_counter()
            res = session(srv.url, conv, args.max_new_tokens)
            store.add(dict(key=RunStore.key(model, setting, ratio, conv, version), model=model, setting=setting,
                           ratio=ratio, conv=conv.id, seconds=round(time.perf_counter() - t0, 2), **res))
            done[0] += 1
            log(f"  {setting} {ratio:g}: {done[0]}/{len(convs)} ({conv.id})")

        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(one, convs))
        pool_info = (server_state(srv.url, timeout=120).get("tangram") or {}).get("pool_info")
        if pool_info and not args.carry_from:   # a carry check's few conversations do not fill the pool
            store.add(dict(key=f"{model}|{setting}|{ratio:g}|pool|{version}", model=model, setting=setting,
                           ratio=ratio, conv="pool", pool_info=pool_info))


# -- dense oracle -----------------------------------------------------------------------------------
def run_oracle(setting, ratio, convs, args, store, model, model_path, version) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tangram_sglang.method.protection import Protection
    from tangram_sglang.oracle.serving_reference import (
        DynamicSelection,
        ProfileSelection,
        UniformSelection,
        reference_run,
    )
    from tangram_sglang.profile import load_profile
    from tangram_sglang.scorers.profile_scorer import profile_scorer

    torch.set_num_threads(1)
    prof = load_profile(os.path.join(ROOT, PROFILES[model]))
    scorer = profile_scorer(prof, os.path.join(ROOT, PROFILES[model]))
    base = base_setting(setting)
    # the dynamic method reads only the entry's head groups (its keep set comes from the ratio),
    # so it also runs at ratios the profile was not calibrated for (e.g. Tangram's kept share)
    entry = min(prof.entries, key=lambda e: abs(e.ratio - ratio)) if base == "dynamic" else prof.select(ratio)
    if base == "static":
        selection = ProfileSelection(entry)
    elif base == "dynamic":
        selection = DynamicSelection(ratio, prof.calibration.scope)
    else:  # equal memory: the mean per-head budget the profile actually keeps
        per_head = [entry.group_budget[l][g] for l, groups in enumerate(entry.groups) for g, hs in enumerate(groups)
                    for _ in hs]
        selection = UniformSelection(float(sum(per_head) / len(per_head)))
    kv_dtype = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}.get(kv_cache_dtype(setting))
    lm = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    stop = {int(t) for t in ([lm.config.eos_token_id] if isinstance(lm.config.eos_token_id, int)
                             else lm.config.eos_token_id or [])}
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    stop |= {int(tokenizer.eos_token_id)}
    # cut as the server cuts (method/chunks.py): at the chat template's message starts, or, with
    # --chunking position, as one message (aligned chunks from 0, the tail kept whole)
    markers = chunk_markers(args.chunking, tokenizer)
    for i, conv in enumerate(convs):
        t0 = time.perf_counter()
        run = reference_run(lm, entry, heads_per_group=prof.heads_per_group, method=scorer,
                            prompt_ids=conv.prompt, max_new_tokens=args.max_new_tokens, chunk_size=CHUNK,
                            stop_ids=stop, selection=selection, protection=Protection(*args.protect),
                            kv_dtype=kv_dtype, markers=markers)
        ids = run.tokens[:-1] if run.tokens and run.tokens[-1] in stop else run.tokens
        hist = conv.history_len
        kept = float(torch.stack([k[:, :hist].float().mean() for k in run.kept]).mean())
        fact = [float(k[:, a:b].float().mean()) for k in run.kept for a, b in conv.fact_spans]
        store.add(dict(key=RunStore.key(model, setting, ratio, conv, version), model=model, setting=setting,
                       ratio=ratio, conv=conv.id, seconds=round(time.perf_counter() - t0, 2), answer_ids=ids,
                       kept=kept, fact_kept=(sum(fact) / len(fact)) if fact else None))
        log(f"  {setting} {ratio:g}: {i + 1}/{len(convs)} ({conv.id}, {time.perf_counter() - t0:.0f} s)")


# -- kvpress ----------------------------------------------------------------------------------------
def kvpress_answers(setting: str, ratio: float, items: dict[str, dict], model: str, model_path: str,
                    version: str) -> dict[str, dict]:
    """The kvpress runner (its own venv) over items (id -> its input record: history_ids, question_ids,
    max_new_tokens, stop_ids, fact_spans); returns its output rows by id. The runner resumes by id, so an
    id must name its content (its ids' digest)."""
    from benchmarks.fidelity.kvpress_env import ensure_kvpress_env

    python = ensure_kvpress_env()
    work = f"/tmp/fidelity-kvpress-{model}"
    os.makedirs(work, exist_ok=True)
    inp, out = os.path.join(work, "in.jsonl"), os.path.join(work, f"{setting}-{ratio:g}-{version}.jsonl")
    with open(inp, "w") as f:
        for item_id, item in items.items():
            f.write(json.dumps({"id": item_id, **item}) + "\n")
    press = setting[len("kvpress-"):]
    subprocess.run([python, KVPRESS_RUNNER, "--model-path", model_path,
                    "--conversations", inp, "--setting", f"{press}:{ratio:g}", "--out", out, "--threads", "1"],
                   check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    with open(out) as f:
        return {row["id"]: row for row in map(json.loads, f) if row["id"] in items}


def run_kvpress(setting, ratio, convs, args, store, model, model_path, version) -> None:
    """One item per conversation: the history before the final user turn compressed, that turn answered."""
    from transformers import AutoTokenizer

    eos = int(AutoTokenizer.from_pretrained(model_path).eos_token_id)
    by_id = {f"{c.id}#{digest(json.dumps(c.prompt))}": c for c in convs}
    items = {cid: {"history_ids": c.prompt[:c.history_len], "question_ids": c.prompt[c.history_len:],
                   "max_new_tokens": args.max_new_tokens, "stop_ids": [eos], "fact_spans": c.fact_spans}
             for cid, c in by_id.items()}
    for cid, row in kvpress_answers(setting, ratio, items, model, model_path, version).items():
        conv = by_id[cid]
        store.add(dict(key=RunStore.key(model, setting, ratio, conv, version), model=model,
                       setting=setting, ratio=ratio, conv=conv.id, seconds=row["seconds"],
                       answer_ids=row["answer_ids"], kept=row["kept"], fact_kept=row.get("fact_kept_share")))


RUNNERS = {"full": run_server, "tangram": run_server, **{k: run_oracle for k in ORACLE},
           **{k: run_kvpress for k in KVPRESS}}
