"""Re-measure the figures the README and docs/results.md show, on the code as it is: one command.

    python -m benchmarks.remeasure --status            # which figures measured the current code, and why not
    python -m benchmarks.remeasure                     # the full run: every figure not current, in order
    python -m benchmarks.remeasure --only soak pressure
    python -m benchmarks.remeasure --quick             # a laptop's trial: small sizes, results under /tmp

The full run is resumable: run it again (in another session) and it skips every figure whose results
already measured the current code. A figure is current when

* fidelity (answers): every row of its report was answered by the current code version of its setting,
  or by a version shown to give the same answers (benchmarks/fidelity/versions.py, fidelity_versions.json),
  and every setting its command asks for has rows (missing_rows); its command is itself resumable (it runs only the conversations not recorded at the current version);
* every other figure: its results file is stamped with a commit (no uncommitted changes) whose served
  files (tangram_sglang/ less what the server never loads, ``NOT_SERVED``), benchmark code (the module and
  what it imports from benchmarks/, less the files that only write and render results), launch flags (the
  package modules it imports: sglang/server_process.py) and profiles equal the working tree's, or differ
  only by commits recorded in benchmarks/neutral_changes.json (a log line, a refusal, a refactor: changes
  that leave its inputs the same, each with the test that shows it).

Results files the README or docs/results.md cite that no command here re-measures (a lent GPU's runs, the
historical records) are listed in OTHER_RESULTS with the reason; ``--status`` names them too.

--quick writes under TANGRAM_RESULTS_DIR (default /tmp/tangram-quick-results), never over the committed
results; its figures are trials of the commands, not figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from benchmarks.common.paths import KINDS, ROOT
from benchmarks.fidelity.versions import NOT_SERVED, loaded_files

QUICK_DIR = "/tmp/tangram-quick-results"
S = ("--retrieval-per-kind", "16", "--replays-per-kind", "8")   # SmolLM2 / Gemma: 64 conversations
Q = ("--retrieval-per-kind", "8", "--replays-per-kind", "4")    # Qwen2.5-0.5B: 32
BENCH = ("--model", "smollm2", "--profile", "configs/smollm2-fastkvzip.yaml", "--ratios", "0.4", "--stock-policies",
         "fcfs", "lpm-refresh", "--max-total-tokens", "4096")   # bench_serving: plain stock, best stock, Tangram
CONC = ("--sessions", "4", "--turns", "2", "--prompt-tokens", "300", "--new-tokens", "40", "--max-new-tokens", "12",
        "--max-total-tokens", "1024")  # a quick multi-turn run


@dataclass(frozen=True)
class Figure:
    """One results file and the command that measures it (a module of benchmarks/ and its arguments)."""

    name: str
    kind: str                     # fidelity, serving, timing, modeled: its folder under benchmarks/results
    module: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    results: str = ""             # file under the kind's folder (default: NAME.json)

    @property
    def path(self) -> str:
        return os.path.join(self.kind, self.results or f"{self.name}.json")

    def argv(self, quick: bool) -> list[str]:
        return [sys.executable, "-m", self.module, *(self.quick if quick else self.full)]


def _fidelity(name: str, model: str, profile: str | None, settings: str, ratios: str, sizes, port: int,
              extra: tuple[str, ...] = ()) -> Figure:
    """A fidelity report; quick: 4 conversations of the --quick set, full KV and Tangram at the first ratio.
    profile None: the model's own (settings recorded untagged), else --profile (recorded as setting[method])."""
    common = ("--models", model, *(("--profile", profile) if profile else ()), "--port", str(port), *extra)
    return Figure(name, "fidelity", "benchmarks.fidelity.run",
                  (*common, "--settings", *settings.split(), "--ratios", *ratios.split(), *sizes, "--name", name),
                  (*common, "--settings", "full", "tangram", "--ratios", ratios.split()[0], "--quick", "--limit", "4",
                   "--name", name))


def _opt(args: list[str], name: str, count: int = 1) -> list[str]:
    """name and its first count values, if args has it."""
    return args[args.index(name):args.index(name) + 1 + count] if name in args else []


def _concurrency(name: str, args: str) -> Figure:
    """A multi-turn throughput run; quick: 4 sessions x 2 short turns, one run, the same model and profile."""
    full = args.split()
    quick = [*_opt(full, "--model"), *_opt(full, "--profile"), *_opt(full, "--ratios"), *_opt(full, "--kv-cache-dtype", 2),
             *CONC, "--repeats", "1",
             "--out", os.path.join(QUICK_DIR, "serving", f"{name}.json")]
    return Figure(name, "serving", "benchmarks.serving.concurrency",
                  (*full, "--out", f"benchmarks/results/serving/{name}.json"), tuple(quick))


FIGURES: tuple[Figure, ...] = (
    # modeled and timing: minutes
    Figure("paper_models", "modeled", "benchmarks.modeled.paper_models", (), ("--out", f"{QUICK_DIR}/modeled/paper_models.json")),
    Figure("load_balance", "modeled", "benchmarks.modeled.load_balance",
           ("--profile", "configs/smollm2-snapkv.yaml", "--batch", "1", "--batch", "16"),
           ("--profile", "configs/smollm2-snapkv.yaml", "--batch", "1", "--out", f"{QUICK_DIR}/modeled/load_balance")),
    Figure("memory_reclaim", "modeled", "benchmarks.modeled.memory_reclaim", (),
           ("--quick", "--out", f"{QUICK_DIR}/modeled")),
    Figure("tp_memory", "modeled", "benchmarks.modeled.tp_memory", (),
           ("--ratios", "0.25", "--tp", "2", "--out", f"{QUICK_DIR}/modeled/tp_memory")),
    Figure("control_plane", "timing", "benchmarks.timing.control_plane", (),
           ("--layers", "16", "--groups", "1", "2", "--repeat", "1", "--no-loop", "--out", f"{QUICK_DIR}/timing")),
    Figure("control_plane_decode", "timing", "benchmarks.timing.control_plane",
           ("--decode-step", "--batch", "64", "--layers", "32", "--groups", "4", "--contexts", "2048", "32768"),
           ("--decode-step", "--batch", "8", "--layers", "16", "--groups", "1", "--contexts", "2048", "--steps", "4",
            "--out", f"{QUICK_DIR}/timing")),
    Figure("cpu_decode", "timing", "benchmarks.timing.cpu_decode", ("--profile", "configs/smollm2-snapkv.yaml", "--reps", "7"),
           ("--profile", "configs/smollm2-snapkv.yaml", "--reps", "1", "--config", "2x512",
            "--out", f"{QUICK_DIR}/timing/cpu_decode")),
    Figure("decode_step", "timing", "benchmarks.timing.decode_step",
           ("--profiles", "configs/smollm2-snapkv.yaml", "--ratio", "0.25", "--uniform-1"),
           ("--profiles", "configs/smollm2-snapkv.yaml", "--ratio", "0.25", "--batch", "2", "--context", "512",
            "--reps", "1", "--out", f"{QUICK_DIR}/timing/decode_step")),
    Figure("prefill_cost", "timing", "benchmarks.timing.prefill_cost",
           ("--uniform", "--profiles", "configs/smollm2-snapkv.yaml", "configs/smollm2-fastkvzip.yaml",
            "configs/smollm2-kvzip.yaml", "--ratio", "0.5"),
           ("--profiles", "configs/smollm2-fastkvzip.yaml", "--ratio", "0.5", "--prompts", "2", "--prompt-tokens", "512",
            "--out", f"{QUICK_DIR}/timing/prefill_cost")),
    Figure("prefill_history_smollm2", "timing", "benchmarks.timing.prefill_history",
           ("--model", "smollm2", "--profile", "configs/smollm2-fastkvzip.yaml", "--ratio", "0.4", "--histories", "0",
            "2048", "6000", "--decoding", "0", "4", "--new-tokens", "1024", "--repeats", "3"),
           ("--model", "smollm2", "--profile", "configs/smollm2-fastkvzip.yaml", "--ratio", "0.4", "--histories", "0",
            "512", "--decoding", "0", "1", "--new-tokens", "256", "--repeats", "1",
            "--out", f"{QUICK_DIR}/timing/prefill_history_smollm2")),
    Figure("prefill_history_qwen25-05b", "timing", "benchmarks.timing.prefill_history",
           ("--model", "qwen2.5-0.5b", "--profile", "configs/qwen2.5-0.5b-fastkvzip.yaml", "--ratio", "0.5",
            "--histories", "0", "2048", "8192", "--decoding", "0", "4", "--new-tokens", "1024", "--repeats", "3"),
           ("--model", "qwen2.5-0.5b", "--profile", "configs/qwen2.5-0.5b-fastkvzip.yaml", "--ratio", "0.5",
            "--histories", "512", "--decoding", "0", "--new-tokens", "256", "--repeats", "1",
            "--out", f"{QUICK_DIR}/timing/prefill_history_qwen25-05b")),
    # serving: tens of minutes each
    Figure("pressure", "serving", "benchmarks.serving.pressure", (), ("--quick",)),
    Figure("soak", "serving", "benchmarks.serving.soak", ("--sessions", "200"), ("--sessions", "12", "--workers", "4")),
    Figure("fuzz", "serving", "benchmarks.serving.fuzz", (), ("--cases", "3")),
    # the soak with faults (an hour and more each): two replicas behind sglang-router, a replica killed mid-run
    # the replay: 400 of the ~900 sessions answered whole (replaying them all adds 40 min to the 90-min load)
    Figure("soak_smollm2", "serving", "benchmarks.serving.soak_faults", ("--model", "smollm2", "--check-sessions", "400"),
           ("--model", "smollm2", "--quick", "--name", "soak_smollm2")),
    Figure("soak_qwen", "serving", "benchmarks.serving.soak_faults", ("--model", "qwen"),
           ("--model", "qwen", "--quick", "--name", "soak_qwen")),
    # the pool where memory binds hardest (stock reused 2% of the history there, one run, 2026-09): stock as a
    # user runs it (fcfs, lpm; lpm-refresh is lpm, the refresh skips cache-aware policies), the profile under its
    # default policy (lpm) and its ratio-1.0 control, 3 alternating runs
    _concurrency("concurrency_multiturn_r04", "--sessions 12 --turns 4 --prompt-tokens 1000 --new-tokens 150 "
                 "--max-total-tokens 8192 --ratios 0.4 --profile configs/smollm2-fastkvzip.yaml "
                 "--repeats 3 --stock-variants fcfs lpm --control"),
    # the same on Qwen, at its recommended ratio (0.5 under the chunk rule; 0.25 before it)
    _concurrency("concurrency_multiturn_qwen", "--model qwen2.5-0.5b --sessions 12 --turns 4 --prompt-tokens 1000 "
                 "--new-tokens 150 --max-total-tokens 8192 --ratios 0.5 "
                 "--profile configs/qwen2.5-0.5b-fastkvzip.yaml --repeats 3 --stock-variants fcfs lpm --control"),
    # chat with long replies (192 tokens, over the 64 a closed message protects): the profile with replies kept
    # whole (the default) and compressed once closed (--tangram-replies compressed, recomputed with the next
    # turn); one run, a trial (about 40 min: stock decodes 7 sessions at a time here)
    _concurrency("concurrency_long_replies", "--sessions 12 --turns 3 --prompt-tokens 600 --new-tokens 80 "
                 "--max-new-tokens 192 --max-total-tokens 6144 --ratios 0.4 --profile configs/smollm2-fastkvzip.yaml "
                 "--plain-replies --replies whole compressed --repeats 1 --stock-variants fcfs lpm --control"),
    _concurrency("concurrency_fp8", "--sessions 16 --turns 4 --prompt-tokens 1000 --new-tokens 150 --max-new-tokens 48 "
                 "--max-total-tokens 3072 --ratios 0.4 --profile configs/smollm2-fastkvzip.yaml "
                 "--kv-cache-dtype auto fp8_e4m3 --repeats 3 --stock-variants fcfs lpm"),
    # Gemma 3 (a hybrid): stock under fcfs and lpm (issue 50: its best policy); the ratio-1.0 control keeps every
    # token of the full layers but releases the window layers' passed pages as the profile does, so the profile's
    # gain splits into window release (the control over stock) and per-head compression (the profile over the control)
    _concurrency("concurrency_gemma_long", "--model gemma3-270m --profile configs/gemma3-270m-fastkvzip.yaml "
                 "--ratios 0.5 0.25 --sessions 6 --turns 3 --prompt-tokens 1300 --new-tokens 200 --max-new-tokens 32 "
                 "--max-total-tokens 3072 --repeats 3 --stock-variants fcfs lpm --control"),
    _concurrency("concurrency_gemma_long_6k", "--model gemma3-270m --profile configs/gemma3-270m-fastkvzip.yaml "
                 "--ratios 0.5 --sessions 6 --turns 3 --prompt-tokens 1300 --new-tokens 200 --max-new-tokens 32 "
                 "--max-total-tokens 6144 --repeats 3 --stock-variants fcfs lpm --control"),
    # sessions that pause between turns (issue 60): more open sessions than the pool holds, the profile under its
    # default policy (lpm) against stock lpm (its best here) and the ratio-1.0 control: docs/results.md's command
    Figure("think_time", "serving", "benchmarks.serving.think_time",
           ("--sessions", "12", "--turns", "4", "--doc-tokens", "800", "--arrival-window", "30", "--think-mean", "8",
            "--max-total-tokens", "8192", "--ratio", "0.4", "--servers", "tangram", "stock-lpm", "tangram-1.0",
            "--repeats", "3"),
           ("--sessions", "3", "--turns", "2", "--doc-tokens", "300", "--arrival-window", "2", "--think-mean", "1",
            "--max-total-tokens", "4096", "--ratio", "0.4", "--servers", "tangram", "stock-lpm",
            "--out", f"{QUICK_DIR}/serving/think_time.json")),
    # the same on Qwen2.5-0.5B at 0.5 (issue 60's second model; its default_ratio and, under the chunk rule, its
    # recommended ratio: measured launched with the profile alone, so the stamped command has no --ratio), scaled
    # to this CPU: half the sessions, shorter documents, the pool at the same share of the sessions' tokens
    Figure("think_time_qwen", "serving", "benchmarks.serving.think_time",
           ("--model", "qwen2.5-0.5b", "--ratio", "0.5", "--sessions", "6", "--turns", "4", "--doc-tokens", "500",
            "--arrival-window", "30", "--think-mean", "8", "--max-total-tokens", "2560", "--servers", "tangram",
            "stock-lpm", "tangram-1.0", "--repeats", "3", "--out", "benchmarks/results/serving/think_time_qwen.json"),
           ("--model", "qwen2.5-0.5b", "--ratio", "0.5", "--sessions", "3", "--turns", "2", "--doc-tokens", "300",
            "--arrival-window", "2", "--think-mean", "1", "--max-total-tokens", "2048", "--servers", "tangram",
            "stock-lpm", "--out", f"{QUICK_DIR}/serving/think_time_qwen.json")),
    # the same at 0.25 (the recommended ratio before the chunk rule; 25 of 32 answers against full KV's 30 after it)
    Figure("think_time_qwen_r025", "serving", "benchmarks.serving.think_time",
           ("--model", "qwen2.5-0.5b", "--ratio", "0.25", "--sessions", "6", "--turns", "4", "--doc-tokens", "500",
            "--arrival-window", "30", "--think-mean", "8", "--max-total-tokens", "2560", "--servers", "tangram",
            "stock-lpm", "tangram-1.0", "--repeats", "3", "--out", "benchmarks/results/serving/think_time_qwen_r025.json"),
           ("--model", "qwen2.5-0.5b", "--ratio", "0.25", "--sessions", "3", "--turns", "2", "--doc-tokens", "300",
            "--arrival-window", "2", "--think-mean", "1", "--max-total-tokens", "2048", "--servers", "tangram",
            "stock-lpm", "--out", f"{QUICK_DIR}/serving/think_time_qwen_r025.json")),
    # the same with heavy-tailed pauses (issue 60): a trial of 2 alternating runs, the profile and stock lpm
    Figure("think_time_pareto", "serving", "benchmarks.serving.think_time",
           ("--sessions", "12", "--turns", "4", "--doc-tokens", "800", "--arrival-window", "30", "--think", "pareto",
            "--think-mean", "8", "--max-total-tokens", "8192", "--ratio", "0.4", "--servers", "tangram", "stock-lpm",
            "--repeats", "2", "--out", "benchmarks/results/serving/think_time_pareto.json"),
           ("--sessions", "3", "--turns", "2", "--doc-tokens", "300", "--arrival-window", "2", "--think", "pareto",
            "--think-mean", "1", "--max-total-tokens", "4096", "--ratio", "0.4", "--servers", "tangram", "stock-lpm",
            "--out", f"{QUICK_DIR}/serving/think_time_pareto.json")),
    # stock's eviction at its best for the workload (issue 60 item 1): T-LRU against plain LRU, lpm on both, a trial
    Figure("think_time_tlru", "serving", "benchmarks.serving.think_time",
           ("--sessions", "12", "--turns", "4", "--doc-tokens", "800", "--arrival-window", "30", "--think-mean", "8",
            "--max-total-tokens", "8192", "--ratio", "0.4", "--servers", "stock-lpm-tlru", "stock-lpm",
            "--repeats", "1", "--out", "benchmarks/results/serving/think_time_tlru.json"),
           ("--sessions", "3", "--turns", "2", "--doc-tokens", "300", "--arrival-window", "2", "--think-mean", "1",
            "--max-total-tokens", "4096", "--ratio", "0.4", "--servers", "stock-lpm-tlru", "stock-lpm",
            "--out", f"{QUICK_DIR}/serving/think_time_tlru.json")),
    # SGLang's own multi-turn benchmark shape (bench_multiturn: clients, rounds, a request rate over one ready queue;
    # issue 60 item 1), memory binding (12 clients' histories reach 27K tokens), the profile, stock lpm, the 1.0 control
    Figure("multiturn_rounds", "serving", "benchmarks.serving.multiturn_rounds",
           ("--num-clients", "12", "--num-rounds", "4", "--request-length", "512", "--output-length", "64",
            "--request-rate", "1", "--max-parallel", "8", "--max-total-tokens", "8192", "--ratio", "0.4",
            "--servers", "tangram", "stock-lpm", "tangram-1.0", "--repeats", "3"),
           ("--num-clients", "3", "--num-rounds", "2", "--request-length", "512", "--output-length", "16",
            "--request-rate", "4", "--max-parallel", "2", "--max-total-tokens", "4096", "--ratio", "0.4",
            "--servers", "tangram", "stock-lpm", "--out", f"{QUICK_DIR}/serving/multiturn_rounds.json")),
    # SGLang's streaming sessions (issue 51 item 2: refused with a profile) against the session radix cache, stock's and
    # the profile's, on the same rounds: a streaming session keeps its KV between rounds, so 12 clients' sessions
    # outgrow the pool; a round left without data for 300 s is a stall (its client gives up)
    Figure("multiturn_streaming", "serving", "benchmarks.serving.multiturn_rounds",
           ("--num-clients", "12", "--num-rounds", "4", "--request-length", "512", "--output-length", "64",
            "--request-rate", "1", "--max-parallel", "8", "--max-total-tokens", "8192", "--ratio", "0.4",
            "--servers", "stock-lpm-streaming", "stock-lpm-sessions", "tangram-sessions", "--request-timeout", "300",
            "--out", "benchmarks/results/serving/multiturn_streaming.json"),
           ("--num-clients", "3", "--num-rounds", "2", "--request-length", "512", "--output-length", "16",
            "--request-rate", "4", "--max-parallel", "2", "--max-total-tokens", "4096", "--ratio", "0.4",
            "--servers", "stock-lpm-streaming", "tangram-sessions", "--request-timeout", "300",
            "--out", f"{QUICK_DIR}/serving/multiturn_streaming.json")),
    # the compressed host tier (issue 51 item 3, issue 60's lever): the profile with 2 pools' bytes of host memory,
    # stock lpm given those bytes on the device (the bound on stock HiCache) and at the same device bytes, the 1.0
    # control with the same host tier
    Figure("think_time_host", "serving", "benchmarks.serving.think_time",
           ("--sessions", "12", "--turns", "4", "--doc-tokens", "800", "--arrival-window", "30", "--think-mean", "8",
            "--max-total-tokens", "8192", "--ratio", "0.4", "--servers", "tangram-host", "stock-lpm-host-bytes",
            "stock-lpm", "tangram-1.0-host", "--repeats", "3", "--out", "benchmarks/results/serving/think_time_host.json"),
           ("--sessions", "3", "--turns", "2", "--doc-tokens", "300", "--arrival-window", "2", "--think-mean", "1",
            "--max-total-tokens", "4096", "--ratio", "0.4", "--servers", "tangram-host", "stock-lpm-host-bytes",
            "--out", f"{QUICK_DIR}/serving/think_time_host.json")),
    # the same with session ids and the session radix cache on both sides (issue 51's comparison), 2 runs
    Figure("think_time_host_sessions", "serving", "benchmarks.serving.think_time",
           ("--sessions", "12", "--turns", "4", "--doc-tokens", "800", "--arrival-window", "30", "--think-mean", "8",
            "--max-total-tokens", "8192", "--ratio", "0.4", "--servers", "tangram-host-sessions",
            "stock-lpm-sessions-host-bytes", "--repeats", "2",
            "--out", "benchmarks/results/serving/think_time_host_sessions.json"),
           ("--sessions", "3", "--turns", "2", "--doc-tokens", "300", "--arrival-window", "2", "--think-mean", "1",
            "--max-total-tokens", "4096", "--ratio", "0.4", "--servers", "tangram-host-sessions",
            "stock-lpm-sessions-host-bytes", "--out", f"{QUICK_DIR}/serving/think_time_host_sessions.json")),
    # a cache hit against a recompute (issue 61): 16 chat conversations x 4 turns sharing a system prompt, served
    # turn by turn from the tree, recomputed with the tree flushed before every turn, batched, and batched with
    # a forced retraction every third forward
    Figure("hit_recompute_smollm2", "serving", "benchmarks.serving.hit_recompute",
           ("--model", "smollm2", "--ratio", "0.4", "--conversations", "16", "--turns", "4",
            "--out", "benchmarks/results/serving/hit_recompute_smollm2.json"),
           ("--model", "smollm2", "--ratio", "0.4", "--conversations", "2", "--turns", "2", "--user-tokens", "200",
            "--out", f"{QUICK_DIR}/serving/hit_recompute_smollm2.json")),
    Figure("hit_recompute_qwen", "serving", "benchmarks.serving.hit_recompute",
           ("--model", "qwen2.5-0.5b", "--ratio", "0.25", "--conversations", "16", "--turns", "4",
            "--out", "benchmarks/results/serving/hit_recompute_qwen.json"),
           ("--model", "qwen2.5-0.5b", "--ratio", "0.25", "--conversations", "2", "--turns", "2", "--user-tokens",
            "200", "--out", f"{QUICK_DIR}/serving/hit_recompute_qwen.json")),
    # SGLang's own benchmark, multi-turn: plain stock, the strongest stock of the throughput run, Tangram
    Figure("bench_serving", "serving", "benchmarks.serving.bench_serving", (*BENCH, "--rates", "0.5", "--repeats", "3"),
           ("--quick", "--out", f"{QUICK_DIR}/serving/bench_serving.json")),
    # the same at a tenth of the rate: seed 1 starts the 16 conversations over about 170 s (their turns follow
    # the replies), about what each setting finishes at 0.5, so queues form in bursts only
    Figure("bench_serving_low_rate", "serving", "benchmarks.serving.bench_serving",
           (*BENCH, "--rates", "0.05", "--repeats", "3", "--out", "benchmarks/results/serving/bench_serving_low_rate.json"),
           ("--quick", "--out", f"{QUICK_DIR}/serving/bench_serving_low_rate.json")),
    # fidelity: hours (resumable by conversation). 0.55 / 0.63 / 0.47 / 0.4 run the dynamic method and kvpress
    # at the share of full KV the served 0.4 / 0.5 / 0.33 / 0.25 hold (pages, protected and generated tokens)
    _fidelity("fidelity_fastkvzip", "smollm2", "configs/smollm2-fastkvzip.yaml", "full tangram dynamic uniform "
              "kvpress-kvzip", "0.4 0.55 0.63 0.47 0.6 0.5 0.33 0.32 0.27 0.25", S, 31200),
    _fidelity("fidelity_qwen_fastkvzip", "qwen2.5-0.5b", "configs/qwen2.5-0.5b-fastkvzip.yaml",
              # 0.4 / 0.64 / 0.79: the shares of full KV the served 0.25 / 0.5 / 0.7 hold (measured 2026-11-27)
              "full tangram dynamic uniform kvpress-kvzip", "0.25 0.7 0.5 0.31 0.4 0.64 0.79", Q, 31210),
    # --tangram-replies compressed (the assistant's messages kept at the budgets once closed) at the shipped
    # ratios; the same conversations' rows with replies whole are in the two reports above
    _fidelity("fidelity_replies", "smollm2", "configs/smollm2-fastkvzip.yaml", "full tangram", "0.4", S, 31220,
              ("--chunking", "replies")),
    _fidelity("fidelity_qwen_replies", "qwen2.5-0.5b", "configs/qwen2.5-0.5b-fastkvzip.yaml", "full tangram", "0.5",
              Q, 31230, ("--chunking", "replies")),
    _fidelity("fidelity_gemma", "gemma3-270m", None, "full tangram dynamic",
              "0.5 0.25", S, 31500),
    # the long tier (histories near the context, the model's own replies), kvpress at Tangram's measured KV
    # held (51% at 0.4); Qwen's 16K-token tier is not listed (about 4x the parameters and 2.3x the history:
    # many hours on this CPU)
    _fidelity("fidelity_long", "smollm2", "configs/smollm2-fastkvzip.yaml", "full tangram kvpress-kvzip", "0.4", (),
              31600, ("--tier", "long", "--peer-ratios", "0.51")),
    _fidelity("fidelity_fp8", "smollm2", "configs/smollm2-fastkvzip.yaml", "tangram", "0.4 0.25", S, 31300,
              ("--kv-cache-dtype", "auto", "fp8_e4m3")),
    _fidelity("fidelity_qwen_fp8", "qwen2.5-0.5b", "configs/qwen2.5-0.5b-fastkvzip.yaml", "tangram", "0.5 0.25", Q,
              31400, ("--kv-cache-dtype", "auto", "fp8_e4m3")),
)


# Results files the README or docs/results.md show (or the results index names) that no command above
# re-measures, each with the reason; `--status` lists them, a test keeps every shown file in FIGURES or here.
_GPU = "measured on a lent GPU (benchmarks/gpu/, launch/gpu_run.sh); re-measured when a task is lent one"
_STUDY = ("a study beside the shipped profiles' tracked reports (an earlier profile, method or scope); not "
          "re-measured (hours on this CPU)")
_EARLIER_RUN = "an earlier throughput run, superseded by the tracked concurrency_* figures; kept as recorded"
OTHER_RESULTS: dict[str, str] = {
    "README.md": "the results index (what each file is), not a measurement",
    "fidelity/behaviour.json": "records: old against new answers per code change (benchmarks.fidelity.behaviour)",
    "fidelity/fidelity_runs.jsonl": "records: every conversation's answers, by code version (the fidelity store)",
    "fidelity/fidelity_versions.json": "records: code versions shown to answer alike (the carry check)",
    "fidelity/fidelity_before.md": "the answers from before two serving fixes, kept as the record of them",
    "fidelity/fidelity_fastkvzip_before_chunk_rule.json": ("the SmolLM2 report on the code before the chunk rule (12-05): "
                                                         "every setting and ratio, kept as the record of it"),
    "fidelity/fidelity_qwen_fastkvzip_before_chunk_rule.json": ("the Qwen report on the code before the chunk rule "
                                                              "(12-05): every setting and ratio, kept as the record of it"),
    "fidelity/fidelity.json": _STUDY,
    "fidelity/fidelity_kvzip.json": _STUDY,
    "fidelity/fidelity_fastkvzip_layer_scope.json": _STUDY,
    "fidelity/fidelity_gemma_layer.json": _STUDY,
    "fidelity/fidelity_position.json": _STUDY,
    "fidelity/fidelity_quick.json": _STUDY,
    "fidelity/fidelity_qwen.json": _STUDY,
    "fidelity/fidelity_qwen_kvzip.json": _STUDY,
    "serving/concurrency.json": _EARLIER_RUN,
    "serving/concurrency_fastkvzip.json": _EARLIER_RUN,
    "serving/concurrency_gemma.json": _EARLIER_RUN,
    "serving/concurrency_gemma_windows.json": _EARLIER_RUN,
    "serving/concurrency_multiturn.json": _EARLIER_RUN,
    "serving/hit_recompute_smollm2_before.json": ("the hit-against-recompute run on the code before the chunk rule "
                                                  "(da0c2e9, the benchmark module added), kept as the record of it"),
    "serving/replicas.json": "two replicas behind sglang-router (benchmarks.serving.replicas); not re-measured since",
    "serving/gpu_served_nvidia-h200.json": _GPU,
    "timing/gpu_decode_nvidia-h200.json": _GPU,
    "timing/gpu_decode_nvidia-h100-80gb-hbm3.json": _GPU,
    "timing/triton_tune_nvidia-h200.json": _GPU,
}


def other_status(path: str, results_dir: str) -> str:
    """How a results file of OTHER_RESULTS was recorded: its stamp's commit, when it has one."""
    full = os.path.join(results_dir, os.path.splitext(path)[0] + ".json")
    try:
        data = json.load(open(full))
    except (OSError, ValueError):
        return "no stamp"
    commit = data.get("stamp", {}).get("commit") if isinstance(data, dict) else None
    return f"recorded at {commit}" if commit else "recorded before stamps"


# -- which figures measured the current code ---------------------------------------------------------
def _git(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, input=stdin, capture_output=True, text=True, check=True).stdout


# benchmark modules that name, stamp, write and render results: no figure's numbers depend on them
REPORTING = ("benchmarks/common/log.py", "benchmarks/common/paths.py", "benchmarks/common/report_tables.py",
             "benchmarks/common/results.py", "benchmarks/common/stamp.py")


@functools.lru_cache(maxsize=None)
def module_files(module: str) -> frozenset[str]:
    """The repository files a benchmark module loads (itself, the benchmark code it imports, and the
    package modules it imports, such as sglang/server_process.py, which writes every server's launch
    flags), found by importing it in a fresh process (versions.loaded_files); less REPORTING."""
    rel = (os.path.relpath(os.path.abspath(f), ROOT) for f in loaded_files((module,)))
    return frozenset(p for p in rel if p.startswith(("benchmarks/", "tangram_sglang/")) and p not in REPORTING)


def _counted(path: str, fig: Figure) -> bool:
    """Files a non-fidelity figure depends on: served package files, the benchmark code and launch flags its
    module loads (module_files), the profiles it names and their gates."""
    served = path.startswith("tangram_sglang/") and path.endswith((".py", ".c"))   # .c: the native control plane
    if served and not any(part in "/" + path for part in NOT_SERVED):
        return True
    profiles = {a for a in fig.full if a.startswith("configs/")}
    return path in module_files(fig.module) or path in profiles or any(
        path == a.removesuffix(".yaml") + ".gate.safetensors" for a in profiles)


def files_at(commit: str | None, fig: Figure) -> dict[str, str]:
    """{path: git blob id} of the counted files at a commit, or in the working tree (commit None)."""
    if commit is not None:
        rows = _git("ls-tree", "-r", commit).splitlines()
        return {p: line.split()[2] for line in rows for p in [line.split("\t", 1)[1]] if _counted(p, fig)}
    paths = [p for p in _git("ls-files", "--cached", "--others", "--exclude-standard").splitlines()
             if _counted(p, fig) and os.path.exists(os.path.join(ROOT, p))]
    return dict(zip(paths, _git("hash-object", "--stdin-paths", stdin="\n".join(paths)).split()))


def stamp_status(fig: Figure, results_dir: str) -> tuple[bool, str]:
    path = os.path.join(results_dir, fig.path)
    if not os.path.exists(path):
        return False, "no results file"
    data = json.load(open(path))
    stamp = data.get("stamp") if isinstance(data, dict) else None
    if not stamp:
        return False, "results not stamped (measured before stamps)"
    commit = stamp.get("commit", "unknown")
    if commit.endswith("-dirty") or commit == "unknown":
        return False, f"measured on uncommitted code ({commit})"
    try:
        then = files_at(commit, fig)
    except subprocess.CalledProcessError:
        return False, f"commit {commit} is not in this repository"
    now = files_at(None, fig)
    changed = sorted(p for p in then.keys() | now.keys() if then.get(p) != now.get(p))
    if not changed:
        return True, f"measured at {commit}"
    carried = carried_over(commit, changed, now, fig)
    if carried:
        return True, f"measured at {commit}, carried over {', '.join(carried)} (NEUTRAL_CHANGES: inputs unchanged)"
    return False, f"{len(changed)} counted files changed since {commit} ({', '.join(changed[:3])}...)"


NEUTRAL_CHANGES = os.path.join(ROOT, "benchmarks", "neutral_changes.json")


def neutral_commits() -> dict[str, frozenset]:
    """{commit: the files it vouches for} of the commits recorded as leaving every figure's inputs the same
    (a refusal, a guard, a log line, a refactor), each with the test that shows it (the guide's rule: such
    changes keep their figures)."""
    try:
        rows = json.load(open(NEUTRAL_CHANGES))["commits"]
    except (OSError, ValueError, KeyError):
        return {}
    return {r["commit"]: frozenset(r.get("files", ())) for r in rows}


def carried_over(commit: str, changed: list[str], now: dict[str, str], fig: Figure) -> list[str]:
    """The commits a stamped figure is carried over, when every commit since it that touched a changed
    counted file is recorded neutral for each such file it touched, and the working tree holds those files
    as committed; else []."""
    head = files_at("HEAD", fig)
    if any(now.get(p) != head.get(p) for p in changed):
        return []
    touched = _git("log", "--format=%H", f"{commit}..HEAD", "--", *changed).split()
    neutral, short = neutral_commits(), []
    for full in touched:
        c = next((c for c in neutral if full.startswith(c)), None)
        mine = set(_git("show", "--name-only", "--format=", full).split()) & set(changed)
        if c is None or not mine <= neutral[c]:
            return []
        short.append(c)
    return short


def fidelity_status(fig: Figure, results_dir: str) -> tuple[bool, str]:
    """Current when every report row's version is the setting's current version or an older one shown
    to give the same answers."""
    from benchmarks.fidelity.versions import code_version

    path = os.path.join(results_dir, fig.path)
    if not os.path.exists(path):
        return False, "no results file"
    data = json.load(open(path))
    rows = data["rows"] if isinstance(data, dict) else data
    links_path = os.path.join(results_dir, "fidelity", "fidelity_versions.json")
    links = json.load(open(links_path)) if os.path.exists(links_path) else {}
    from benchmarks.fidelity.settings import PROFILES

    model = fig.full[fig.full.index("--models") + 1]
    profile = os.path.join(ROOT, _opt(list(fig.full), "--profile")[1] if "--profile" in fig.full else PROFILES[model])
    stale = []
    for row in rows:
        now = code_version(row["setting"], profile)
        same = _same_as(now, links)
        if row.get("version") not in same:
            stale.append(f"{row['setting']} {row['ratio']:g}")
    if stale:
        return False, f"{len(stale)} of {len(rows)} rows not from the current code ({', '.join(stale[:4])}...)"
    missing = missing_rows(fig, rows)
    if missing:
        return False, f"no rows for {', '.join(missing[:4])}{'...' if len(missing) > 4 else ''} (asked, never run)"
    most = max((r.get("n", 0) for r in rows), default=0)
    partial = [f"{r['setting']} {r['ratio']:g} ({r['n']} of {most})" for r in rows if r.get("n", most) < most]
    if partial:
        return False, f"rows run on part of the conversations: {', '.join(partial[:4])}"
    return True, f"all {len(rows)} rows from the current code"


def missing_rows(fig: Figure, rows: list[dict]) -> list[str]:
    """Settings (and ratios) the figure's command asks for that its report has no row of: full KV at 1, the
    dynamic method and kvpress at each of their ratios (kvpress: --peer-ratios on the long tier), a setting
    bound to the profile's entries (tangram, static, uniform) at one ratio at least."""
    from benchmarks.fidelity.settings import KVPRESS, base_setting

    args = list(fig.full)
    settings, ratios = _values(args, "--settings"), [float(r) for r in _values(args, "--ratios")]
    peer = [float(r) for r in _values(args, "--peer-ratios")] or ratios
    have = {(base_setting(r["setting"]), round(r["ratio"], 4)) for r in rows}
    out = []
    for s in settings:
        want = [1.0] if s == "full" else peer if s in KVPRESS else ratios if s == "dynamic" else None
        if want is None:
            out += [] if any(b == s for b, _ in have) else [s]
        else:
            out += [f"{s} {r:g}" for r in want if (s, round(r, 4)) not in have]
    return out


def _values(args: list[str], name: str) -> list[str]:
    """The values after name in args, up to the next option."""
    if name not in args:
        return []
    rest = args[args.index(name) + 1:]
    return rest[:next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))]


def _same_as(version: str, links: dict) -> set[str]:
    """The version and every older version it was shown to answer like (fidelity_versions.json)."""
    out = {version}
    while version in links and links[version]["same_as"] not in out:
        version = links[version]["same_as"]
        out.add(version)
    return out


def status(fig: Figure, results_dir: str) -> tuple[bool, str]:
    return (fidelity_status if fig.kind == "fidelity" else stamp_status)(fig, results_dir)


# -- running -----------------------------------------------------------------------------------------
def run(figs: list[Figure], quick: bool, dry_run: bool) -> int:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if quick:
        env["TANGRAM_RESULTS_DIR"] = env.get("TANGRAM_RESULTS_DIR") or QUICK_DIR
        for kind in KINDS:
            os.makedirs(os.path.join(env["TANGRAM_RESULTS_DIR"], kind), exist_ok=True)
    failed = []
    for i, fig in enumerate(figs, 1):
        cmd = fig.argv(quick)
        print(f"[{time.strftime('%H:%M:%S')}] ({i}/{len(figs)}) {fig.name}: {' '.join(cmd[1:])}", flush=True)
        if dry_run:
            continue
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        print(f"[{time.strftime('%H:%M:%S')}] {fig.name}: exit {rc} after {(time.perf_counter() - t0) / 60:.1f} min",
              flush=True)
        if rc:
            failed.append(fig.name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--status", action="store_true", help="list each figure: current or not, and why; run nothing")
    ap.add_argument("--only", nargs="+", metavar="NAME", help=f"these figures only ({', '.join(f.name for f in FIGURES)})")
    ap.add_argument("--quick", action="store_true", help="small sizes, results under TANGRAM_RESULTS_DIR (a trial)")
    ap.add_argument("--all", action="store_true", help="run current figures too (fidelity still skips recorded answers)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)
    names = {f.name for f in FIGURES}
    if args.only and (unknown := sorted(set(args.only) - names)):
        ap.error(f"unknown figures {unknown}; known: {sorted(names)}")
    figs = [f for f in FIGURES if not args.only or f.name in args.only]
    results_dir = os.path.join(ROOT, "benchmarks", "results")
    if args.status:
        for fig in figs:
            ok, why = status(fig, results_dir)
            print(f"{'current' if ok else 'STALE  '}  {fig.name:28s} {why}")
        if not args.only:
            for path, why in OTHER_RESULTS.items():
                print(f"other    {path:28s} {other_status(path, results_dir)}: {why}")
        return 0
    if not args.quick and not args.all:
        figs = [f for f in figs if f.kind == "fidelity" or not status(f, results_dir)[0]]
    return run(figs, args.quick, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
