"""Multi-turn fidelity: accuracy vs kept share for full KV, Tangram, the dynamic method, uniform and kvpress.

    .venv/bin/python benchmarks/fidelity.py --quick          # a laptop's hour: SmolLM2, 4 per kind
    .venv/bin/python benchmarks/fidelity.py                  # the README's figures (resumable)
    .venv/bin/python benchmarks/fidelity.py --report-only    # tables and plot from what is recorded

Same conversations (benchmarks/fidelity_tasks.py) and token ids for every setting:
  full        stock SGLang (no profile), sessions concurrent, each turn a /generate request
  tangram     the real server with --tangram-profile P --tangram-ratio r, sessions concurrent
  static      the dense oracle (tangram_sglang.oracle.serving_reference) with the profile's static budgets: what
              the server must compute, one conversation at a time (a check of the served path)
  dynamic     the same oracle with per-chunk global top-k over the heads of each layer at ratio r (the
              paper's "w/o Tangram"), same chunk schedule as served
  uniform     the same oracle, every head keeping the profile's mean per-head budget (equal memory)
  kvpress-X   NVIDIA kvpress 0.5.5 in its own venv (benchmarks/kvpress_env.py): history compressed at
              prefill, the final question and answer uncompressed; X in snapkv, adakv-snapkv, kvzip, ...
  X~position  (--chunking position, an experiment on the oracle settings) chunks fixed by sequence
              position over the whole prompt, each partial chunk kept whole until later turns complete it,
              instead of each turn's new tokens chunked as they arrive (what serving does)
Intermediate turns are sent with max_new_tokens=1 (their reply is the task's fixed text, so the next
prompt extends this one and the server reuses it); the last turn is answered greedily.

Every answer is recorded in --runs (JSON lines, committed) under a key of model, setting, ratio,
conversation, the conversation's token ids and the code version of the setting, so a run can stop
and resume, and a code change re-runs only what it affects. Outputs: --out-dir/fidelity.{md,json,png}.
"""

from __future__ import annotations

import argparse
import functools
import glob
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "launch")]

from fidelity_report import base_setting, write_report  # noqa: E402
from fidelity_tasks import Conversation, build_conversations  # noqa: E402

from tangram_sglang.method.chunks import split_tokens, turn_schedule  # noqa: E402

PROFILES = {"smollm2": "configs/smollm2-snapkv.yaml", "qwen2.5-0.5b": "configs/qwen2.5-0.5b-snapkv.yaml"}
ORACLE = ("static", "dynamic", "uniform")
KVPRESS = ("kvpress-snapkv", "kvpress-adakv-snapkv", "kvpress-kvzip")
CHUNK = 512
# package files that cannot change an answer (offline tools, process helpers): not part of the version
NOT_SERVED = ("/calibration/", "/cpu_compat/", "calibrate.py", "reference_import.py", "uniform_profile.py", "compatibility.py",
              "server_process.py")


def log(msg: str) -> None:
    print(f"[fidelity {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
    return h.hexdigest()[:12]


def code_version(setting: str, profile: str) -> str:
    """What a setting's answers depend on (besides the token ids): the served package for Tangram,
    only the modules the dense oracle imports for the oracle settings (a data-plane change in
    attention/ or serving/ cannot change them), the runner for kvpress, SGLang's version for full KV."""
    if setting == "full":
        import sglang

        return digest("sglang", sglang.__version__)
    if setting.startswith("kvpress"):
        files = [os.path.join(ROOT, "benchmarks", f) for f in ("kvpress_runner.py", "kvpress-requirements.txt")]
    else:
        package = oracle_files() if base_setting(setting) in ORACLE else sorted(
            glob.glob(os.path.join(ROOT, "tangram_sglang", "**", "*.py"), recursive=True))
        files = [f for f in package if not any(part in f for part in NOT_SERVED)] + [profile] + weight_files(profile)
    return digest(*(open(f, "rb").read() if os.path.exists(f) else f for f in files))


ORACLE_MODULES = ("tangram_sglang.oracle.serving_reference", "tangram_sglang.scorers.profile_scorer", "tangram_sglang.profile",
                  "tangram_sglang.method.protection")


@functools.lru_cache(maxsize=1)
def oracle_files() -> list[str]:
    """The package files the oracle settings load: imported in a fresh process from ROOT (so a
    snapshot's own files), listed from its sys.modules."""
    code = ("import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n"
            "print('\\n'.join(sorted(m.__file__ for n, m in list(sys.modules.items())\n"
            "      if n.startswith('tangram_sglang') and getattr(m, '__file__', None))))")
    out = subprocess.run([sys.executable, "-c", code, *ORACLE_MODULES], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    outside = [f for f in out if not os.path.abspath(f).startswith(os.path.join(ROOT, "tangram_sglang"))]
    if outside or not out:
        raise SystemExit(f"the oracle's modules were not loaded from {ROOT}: {outside or 'none found'}")
    return out


def weight_files(profile: str) -> list[str]:
    """The scorer weights a profile names (fastkvzip gates): they change answers too."""
    if not os.path.exists(profile):
        return []
    from tangram_sglang.profile import load_profile
    from tangram_sglang.scorers.profile_scorer import weights_path

    path = weights_path(load_profile(profile), profile)
    return [path] if path else []


class RunStore:
    """Recorded answers, one JSON line each, keyed by (model, setting, ratio, conversation, ids, version).

    ``equivalent`` (a JSON file beside the runs) records code versions checked to give the same
    answers as an older one (``--carry-from``): rows of the older version also answer for the newer.
    """

    def __init__(self, path: str):
        self.path, self.lock, self.rows = path, threading.Lock(), {}
        self.run_keys: set[str] = set()  # keys of rows actually run (not aliased through an equivalence)
        self.equiv_path = os.path.join(os.path.dirname(path), "fidelity_versions.json")
        self.equivalent = json.load(open(self.equiv_path)) if os.path.exists(self.equiv_path) else {}
        newer: dict[str, list[str]] = {}
        for new, info in self.equivalent.items():
            newer.setdefault(info["same_as"], []).append(new)
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    if line.strip():
                        row = json.loads(line)
                        self.rows[row["key"]] = row
                        self.run_keys.add(row["key"])
                        self._alias(row, newer)

    def _alias(self, row: dict, newer: dict) -> None:
        """Rows answer for every equivalent newer version; the latest recorded row wins over older
        aliases (a pool row reads the last full run), never over a row run at that version."""
        base, version = row["key"].rsplit("|", 1)
        for new in newer.get(version, ()):
            if f"{base}|{new}" not in self.run_keys:
                self.rows[f"{base}|{new}"] = row
            self._alias({"key": f"{base}|{new}", **{k: v for k, v in row.items() if k != "key"}}, newer)

    def record_equivalence(self, new: str, old: str, evidence: str) -> None:
        self.equivalent[new] = {"same_as": old, "evidence": evidence, "date": time.strftime("%Y-%m-%d")}
        with open(self.equiv_path, "w") as f:
            json.dump(self.equivalent, f, indent=1)

    @staticmethod
    def key(model, setting, ratio, conv: Conversation, version) -> str:
        return "|".join([model, setting, f"{ratio:g}", conv.id, digest(json.dumps(conv.prompt)), version])

    def add(self, row: dict) -> None:
        with self.lock:
            self.rows[row["key"]] = row
            self.run_keys.add(row["key"])
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")


def position_schedule(conv: Conversation, chunk: int = CHUNK) -> tuple[list[int], int]:
    """--chunking position (an oracle experiment, not what the server does): chunks fixed by sequence
    position over the final prompt, [C, C, ..., rest], as if each turn's partial chunk waited uncompressed
    until later turns completed it. Returns (chunk sizes, length of the trailing partial chunk: the tokens
    kept whole, 0 when the prompt ends on a chunk boundary)."""
    return split_tokens(len(conv.prompt), chunk), len(conv.prompt) % chunk


def chunk_schedule(conv: Conversation, chunk: int = CHUNK) -> list[int]:
    """Compression chunks as served one request at a time: each turn's new tokens in [C, C, ..., rest]."""
    return turn_schedule([len(ids) for ids in conv.turns], chunk)


# -- servers ----------------------------------------------------------------------------------------
def post(url: str, payload: dict, timeout: float = 3600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run_session(url: str, conv: Conversation, max_new: int) -> dict:
    cached = []
    for i, ids in enumerate(conv.turns):
        last = i == len(conv.turns) - 1
        out = post(url + "/generate", {"input_ids": ids, "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new if last else 1}})
        cached.append(out.get("meta_info", {}).get("cached_tokens"))
    return {"answer_ids": list(out.get("output_ids") or []), "cached_tokens": cached}


def run_server(setting, ratio, convs, args, store, model, model_path, version) -> None:
    from tangram_sglang.sglang.server_process import ServerProcess

    profile = os.path.join(ROOT, PROFILES[model]) if setting.startswith("tangram") else None
    extra = ["--max-total-tokens", str(args.max_total_tokens)] + (["--tangram-ratio", str(ratio)] if profile else [])
    with ServerProcess(model_path, port=args.port, profile=profile, extra_args=extra,
                       log_path=f"/tmp/fidelity-{args.port}-{setting}-{ratio:g}.log") as srv:
        log(f"{setting} {ratio:g}: server up, {len(convs)} sessions, {args.concurrency} at a time")
        done = [0]

        def one(conv):
            t0 = time.perf_counter()
            res = run_session(srv.url, conv, args.max_new_tokens)
            store.add(dict(key=RunStore.key(model, setting, ratio, conv, version), model=model, setting=setting,
                           ratio=ratio, conv=conv.id, seconds=round(time.perf_counter() - t0, 2), **res))
            done[0] += 1
            log(f"  {setting} {ratio:g}: {done[0]}/{len(convs)} ({conv.id})")

        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(one, convs))
        info = json.loads(urllib.request.urlopen(srv.url + "/server_info", timeout=120).read())
        pool_info = (info["internal_states"][0].get("tangram") or {}).get("pool_info")
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
    lm = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    stop = {int(t) for t in ([lm.config.eos_token_id] if isinstance(lm.config.eos_token_id, int)
                             else lm.config.eos_token_id or [])}
    stop |= {int(AutoTokenizer.from_pretrained(model_path).eos_token_id)}
    for i, conv in enumerate(convs):
        t0 = time.perf_counter()
        chunks, ends, protect = chunk_schedule(conv), [len(t) for t in conv.turns], Protection(*args.protect)
        if args.chunking == "position":
            chunks, partial = position_schedule(conv)
            ends, protect = [], Protection(protect.sinks, max(protect.newest, partial))
        run = reference_run(lm, entry, heads_per_group=prof.heads_per_group, method=scorer,
                            prompt_ids=conv.prompt, max_new_tokens=args.max_new_tokens,
                            chunk_tokens=chunks, stop_ids=stop, selection=selection,
                            turn_ends=ends, protection=protect)
        ids = run.tokens[:-1] if run.tokens and run.tokens[-1] in stop else run.tokens
        hist = conv.history_len
        kept = float(torch.stack([k[:, :hist].float().mean() for k in run.kept]).mean())
        fact = [float(k[:, a:b].float().mean()) for k in run.kept for a, b in conv.fact_spans]
        store.add(dict(key=RunStore.key(model, setting, ratio, conv, version), model=model, setting=setting,
                       ratio=ratio, conv=conv.id, seconds=round(time.perf_counter() - t0, 2), answer_ids=ids,
                       kept=kept, fact_kept=(sum(fact) / len(fact)) if fact else None))
        log(f"  {setting} {ratio:g}: {i + 1}/{len(convs)} ({conv.id}, {time.perf_counter() - t0:.0f} s)")


# -- kvpress ----------------------------------------------------------------------------------------
def run_kvpress(setting, ratio, convs, args, store, model, model_path, version) -> None:
    import subprocess

    from kvpress_env import ensure_kvpress_env
    from transformers import AutoTokenizer

    python = ensure_kvpress_env()
    tok = AutoTokenizer.from_pretrained(model_path)
    work = f"/tmp/fidelity-kvpress-{model}"
    os.makedirs(work, exist_ok=True)
    inp, out = os.path.join(work, "in.jsonl"), os.path.join(work, f"{setting}-{ratio:g}-{version}.jsonl")
    # the runner resumes by id: name each conversation by its content, not its (reused) task id
    by_id = {f"{c.id}#{digest(json.dumps(c.prompt))}": c for c in convs}
    with open(inp, "w") as f:
        for cid, c in by_id.items():
            f.write(json.dumps({"id": cid, "history_ids": c.prompt[:c.history_len],
                                "question_ids": c.prompt[c.history_len:], "max_new_tokens": args.max_new_tokens,
                                "stop_ids": [int(tok.eos_token_id)], "fact_spans": c.fact_spans}) + "\n")
    press = setting[len("kvpress-"):]
    subprocess.run([python, os.path.join(ROOT, "benchmarks", "kvpress_runner.py"), "--model-path", model_path,
                    "--conversations", inp, "--setting", f"{press}:{ratio:g}", "--out", out, "--threads", "1"],
                   check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    with open(out) as f:
        for row in map(json.loads, f):
            conv = by_id.get(row["id"])
            if conv is not None:
                store.add(dict(key=RunStore.key(model, setting, ratio, conv, version), model=model,
                               setting=setting, ratio=ratio, conv=conv.id, seconds=row["seconds"],
                               answer_ids=row["answer_ids"], kept=row["kept"], fact_kept=row.get("fact_kept_share")))


RUNNERS = {"full": run_server, "tangram": run_server, **{k: run_oracle for k in ORACLE},
           **{k: run_kvpress for k in KVPRESS}}
DEFAULT_PROTECT = (4, 64)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="SmolLM2, 4 retrieval per kind, 2 replays, short docs")
    ap.add_argument("--models", nargs="+", default=["smollm2", "qwen2.5-0.5b"], choices=sorted(PROFILES))
    ap.add_argument("--settings", nargs="+", default=["full", "tangram", *ORACLE, *KVPRESS],
                    choices=sorted(RUNNERS))
    ap.add_argument("--ratios", nargs="+", type=float, default=[0.7, 0.5, 0.25])
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
    ap.add_argument("--chunking", choices=("turn", "position"), default="turn",
                    help="oracle settings: turn = each turn's new tokens chunked as served; position = an "
                    "experiment: chunks fixed by position over the whole prompt, the trailing partial chunk kept "
                    "whole (recorded as setting~position)")
    ap.add_argument("--runs", default=os.path.join(ROOT, "benchmarks", "results", "fidelity_runs.jsonl"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--name", default="", help="file stem of the report (default fidelity / fidelity_quick)")
    ap.add_argument("--carry-from", metavar="VERSION", help="re-run --carry-check recorded conversations of "
                    "this older code version per setting and ratio; if every answer is identical, its rows "
                    "count for the current version (recorded in fidelity_versions.json)")
    ap.add_argument("--carry-check", type=int, default=6)
    args = ap.parse_args(argv)
    args.protect = tuple(int(x) for x in args.protect.split(","))
    if args.protect != DEFAULT_PROTECT:
        tag = "@" + ",".join(map(str, args.protect))
        args.settings = [s + tag if s in ORACLE else s for s in args.settings]
        RUNNERS.update({s: run_oracle for s in args.settings if s.endswith(tag)})
    if args.chunking != "turn":
        args.settings = [s + "~" + args.chunking if base_setting(s) in ORACLE else s for s in args.settings]
        RUNNERS.update({s: run_oracle for s in args.settings if s.endswith("~" + args.chunking)})
    if args.profile:
        from tangram_sglang.profile import load_profile

        tag = f"[{load_profile(args.profile).calibration.method}]"
        PROFILES.update({m: os.path.abspath(args.profile) for m in args.models})
        renamed = [s + tag if s not in ("full", *KVPRESS) else s for s in args.settings]
        RUNNERS.update({n: RUNNERS[s] for s, n in zip(args.settings, renamed)})
        args.settings = renamed
    if args.quick:
        args.models, args.retrieval_per_kind, args.replays_per_kind, args.doc_tokens = ["smollm2"], 4, 2, 350
    return args


def main(argv=None) -> None:
    args = parse(argv)
    from models import ensure_model
    from transformers import AutoTokenizer

    from tangram_sglang.profile import load_profile

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
    write_report(store, tables, args, tok_of={m: AutoTokenizer.from_pretrained(ensure_model(m)) for m in args.models})


def carry_over(store: RunStore, args) -> None:
    """--carry-from: re-run a few recorded conversations on the current code; equal answers carry the rest."""
    from models import ensure_model
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
