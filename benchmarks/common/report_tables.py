"""Tables of measured results, generated from the JSON files in benchmarks/results/<kind>/.

    .venv/bin/python -m benchmarks.common.report_tables          # rewrite every generated table
    .venv/bin/python -m benchmarks.common.report_tables --check  # exit 1 with a diff if any is stale

Writes README.md's key-results table (between ``<!-- results:begin -->`` and ``<!-- results:end -->``),
benchmarks/results/README.md (an index of every results file, by kind) and the tables of docs/results.md
(between ``<!-- results:NAME:begin -->`` and ``<!-- results:NAME:end -->``); text outside the markers
is left alone. Standard library only (json, math, pathlib, argparse) and no import of the benchmarks
package: launch/chat.py and tests/unit/test_docs.py load this file by path, and chat.py calls
``recommended()`` for the demo's ratio and the figures it prints.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
WITHIN_POINTS = 5  # a recommended ratio answers within this many points of full KV

# Shipped models: the profile a user should serve and the results files that measured it.
SHIPPED = {
    "smollm2": dict(name="SmolLM2-135M-Instruct", folder="SmolLM2", profile="configs/smollm2-fastkvzip.yaml",
                    fidelity="fidelity/fidelity_fastkvzip.json", throughput="serving/concurrency_multiturn_r04.json"),
    "qwen2.5-0.5b": dict(name="Qwen2.5-0.5B", folder="Qwen2.5-Coder-0.5B",
                         profile="configs/qwen2.5-0.5b-fastkvzip.yaml",
                         fidelity="fidelity/fidelity_qwen_fastkvzip.json",
                         throughput="serving/concurrency_multiturn_qwen.json"),
}
SCORERS = {"snapkv": "SnapKV", "fastkvzip": "FastKVzip gate", "kvzip": "KVzip", "keydiff": "KeyDiff",
           "expected_attention": "Expected Attention", "ea": "Expected Attention", "adakv-snapkv": "AdaKV-SnapKV"}


def scorer_name(profile_stem: str) -> str:
    """'qwen2.5-0.5b-fastkvzip' -> 'FastKVzip gate'."""
    method = profile_stem.rsplit("-", 1)[-1]
    return SCORERS.get(method, method)


def load(name: str):
    """A results file by its path under benchmarks/results/ (``kind/file.json``)."""
    return json.loads((RESULTS / name).read_text())


def rows_of(name: str) -> list[dict]:
    """The rows of a results file that is a table: ``{"stamp": ..., "rows": [...]}``, or a bare list of rows
    (files written before stamps)."""
    data = load(name)
    return data["rows"] if isinstance(data, dict) else data


def table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
           ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def times(x: float) -> str:
    return f"{x:.2f}x"


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}x"


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95% Wilson score interval of k / n."""
    if n == 0:
        return 0.0, 1.0
    p, den = k / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


# ---------------------------------------------------------------- fidelity

def with_interval(k: int, n: int) -> str:
    """k/n, its share and 95% Wilson interval: '41/64 (64% [52, 75])'."""
    lo, hi = wilson(k, n)
    return f"{k}/{n} ({100 * k / n:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}])"


def answered(row: dict, interval: bool = True) -> str:
    k, n = row["correct"], row["judged"]
    return with_interval(k, n) if interval else f"{k}/{n}"


def setting_label(setting: str) -> str:
    stored = setting.rpartition("+")[2] if "+" in setting else None  # --kv-cache-dtype tag
    label = _label(setting.split("+")[0])
    return f"{label}, {stored.replace('_', ' ').upper().replace(' ', '-')} KV" if stored else label


def _label(setting: str) -> str:
    base = setting.split("[")[0]
    names = {"full": "full KV (stock SGLang)", "tangram": "Tangram, served", "static": "oracle, static budgets",
             "static~position": "oracle, chunks by position", "dynamic": "dynamic method",
             "uniform": "uniform budgets (equal memory)"}
    if base.startswith("kvpress-"):
        return "kvpress " + SCORERS.get(base[len("kvpress-"):], base[len("kvpress-"):])
    return names.get(base, base)


def fidelity_rows(name: str, setting: str) -> dict[float, dict]:
    return {r["ratio"]: r for r in rows_of(name) if r["setting"].split("[")[0] == setting}


def fidelity_table(name: str, keep=None) -> list[str]:
    """The rows of one fidelity file, settings in the file's order and each setting's ratios from the highest
    (the file keeps the order of the command's ratios); ``keep`` (base setting names) drops rows another
    table shows."""
    found = rows_of(name)
    order = {s: i for i, s in enumerate(dict.fromkeys(r["setting"] for r in found))}
    rows = [[setting_label(r["setting"]), f"{r['ratio']:g}", pct(r["kept_share"]), pct(r.get("held_share")), answered(r),
             f"{r['retrieval_correct']}/{r['retrieval_n']}", f"{r['replay_agree']}/{r['replay_n']}",
             f"{r['degenerate']}/{r['n']}", pct(r["saved_vs_full_kv"])]
            for r in sorted(found, key=lambda r: (order[r["setting"]], -r["ratio"]))
            if keep is None or r["setting"].split("[")[0] in keep]
    return table(["setting", "ratio", "kept share", "KV held", "answered right [95% CI]", "retrieval",
                  "replay agreement", "degenerate", "pool saved"], rows)


def recommended(model: str) -> dict:
    """The shipped profile's recommended ratio for ``model`` (a key of SHIPPED): the lowest ratio whose
    served answers are within WITHIN_POINTS points of full KV on the multi-turn fidelity benchmark."""
    spec = SHIPPED[model]
    full = fidelity_rows(spec["fidelity"], "full")[1.0]
    served = fidelity_rows(spec["fidelity"], "tangram")
    close = [r for r in served.values()
             if 100 * (full["correct"] / full["judged"] - r["correct"] / r["judged"]) <= WITHIN_POINTS + 1e-9]
    best = min(close, key=lambda r: r["ratio"])
    scorer = SCORERS.get(best.get("method") or "", best.get("method") or "")
    md = spec["fidelity"].replace(".json", ".md")
    why = (f"{scorer} at {best['ratio']:g}, the lowest ratio measured within {WITHIN_POINTS} points of full KV: "
           f"{answered(best, False)} multi-turn conversations answered right against {answered(full, False)} with "
           f"full KV, {pct(best['kept_share'])} of the history kept, {pct(best['saved_vs_full_kv'])} of the KV pool "
           f"saved (benchmarks/results/{md})")
    return dict(spec, key=model, ratio=best["ratio"], served=best, full=full, why=why, scorer=scorer,
                uniform=fidelity_rows(spec["fidelity"], "uniform").get(best["ratio"]),
                peer=peer_at_held(spec["fidelity"], best))


# benchmarks/fidelity/paired.py's PEER (this file imports nothing of the benchmarks package; a test keeps the two equal)
KVPRESS_PEER = {"snapkv": "kvpress-snapkv", "kvzip": "kvpress-kvzip", "fastkvzip": "kvpress-kvzip"}


def peer_at_held(name: str, served: dict) -> dict | None:
    """The kvpress row of the served row's scoring method whose kept share is nearest the KV the served
    pool held, else its kept share (the row benchmarks/fidelity/paired.py pairs it with), or None."""
    kv = served["held_share"] if served.get("held_share") is not None else served["kept_share"]  # paired.tangram_kv
    peers = [r for r in rows_of(name) if r["setting"] == KVPRESS_PEER.get(served.get("method") or "")]
    return min(peers, key=lambda r: abs(r["kept_share"] - kv)) if peers and kv is not None else None


# ---------------------------------------------------------------- throughput

def turns_per_s(mode: dict) -> float:
    return sum(k.startswith("turn") for s in mode["sessions"] for k in s) / max(mode["wall_s"], 1e-9)


def later_reuse(mode: dict) -> float:
    later = [v for s in mode["sessions"] for k, v in s.items() if k.startswith("turn") and k != "turn1"]
    return sum(t["cached_tokens"] or 0 for t in later) / max(1, sum(t["prompt_tokens"] for t in later))


def pairs(name: str) -> list[tuple[dict, dict]]:
    """(stock, Tangram) modes of one concurrency run, by pool size."""
    modes = load(name)["modes"]
    stock = {m["max_total_tokens"]: m for m in modes if m["ratio"] is None}
    return [(stock[m["max_total_tokens"]], m) for m in modes if m["ratio"] is not None]


def throughput_table(name: str) -> list[str]:
    rows = []
    for s, t in pairs(name):
        rows.append([f"{s['max_total_tokens']:,} ({s['pool_bytes'] / 2**20:.0f} MiB)",
                     f"{s['peak_running']} / {pct(later_reuse(s))} / {turns_per_s(s):.3f}",
                     f"{t['peak_running']} / {pct(later_reuse(t))} / {turns_per_s(t):.3f}",
                     f"**{times(turns_per_s(t) / turns_per_s(s))}**", pct(t["pool_info"]["saved_vs_full_kv"])])
    ratio = pairs(name)[0][1]["ratio"]
    return table(["pool: KV bytes of N full-KV tokens", "stock: sessions at once / turn-2+ reuse / turns/s",
                  f"Tangram {ratio:g}: sessions at once / reuse / turns/s", "turns/s vs stock",
                  "pool saved (end)"], rows)


def throughput_or_repeats(name: str) -> list[str]:
    """A one-run sweep of pool sizes (throughput_table) or repeated runs (repeats_table)."""
    return repeats_table([name]) if repeated(name) else throughput_table(name)


def repeats_table(names: list[str]) -> list[str]:
    """Every server of repeated, alternating concurrency runs (one or more files), per pool size: turns/s
    and the ratio to plain stock (fcfs) and to the best stock server of the same repeat, median (range)."""
    rows = []
    for name in names:
        modes = load(name)["modes"]
        for total in dict.fromkeys(m["max_total_tokens"] for m in modes):
            at = [m for m in modes if m["max_total_tokens"] == total]
            by_repeat = {r: [m for m in at if m.get("repeat", 0) == r] for r in {m.get("repeat", 0) for m in at}}
            plain = {r: turns_per_s(next(m for m in ms if m["mode"] == "stock")) for r, ms in by_repeat.items()}
            best = {r: turns_per_s(m) for r, m in best_stock(at).items()}
            for mode in dict.fromkeys(m["mode"] for m in at):
                runs = [m for m in at if m["mode"] == mode]
                tps = [turns_per_s(m) for m in runs]
                rows.append([f"{total:,} ({runs[0]['pool_bytes'] / 2**20:.0f} MiB)", mode, len(runs),
                             median_range(tps), median_range([t / plain[m.get("repeat", 0)] for t, m in zip(tps, runs)],
                                                             "{:.2f}x"),
                             median_range([t / best[m.get("repeat", 0)] for t, m in zip(tps, runs)], "{:.2f}x"),
                             median_range([m["peak_running"] for m in runs], "{:.0f}"),
                             pct(median([later_reuse(m) for m in runs]))])
    return table(["pool: KV bytes of N full-KV tokens", "server", "runs", "turns/s, median (range)", "vs stock",
                  "vs best stock", "sessions at once", "turn-2+ reuse"], rows)


def _mmm(v, fmt: str = "{:.3g}") -> str:
    """'median [min, max]' of a bench_serving summary value ([median, min, max] or None)."""
    return "-" if v is None else f"{fmt.format(v[0])} [{fmt.format(v[1])}, {fmt.format(v[2])}]"


BENCH_SERVING_HEADER = ["setting", "request rate", "runs", "pool MiB", "requests / s", "vs {baseline}",
                        "output tok / s", "TTFT median ms", "TTFT p99 ms", "TPOT median ms", "TPOT p99 ms",
                        "cache hit %", "goodput req / s"]


def bench_serving_table(res: dict | None = None, name: str = "serving/bench_serving.json") -> list[str]:
    """SGLang's bench_serving runs (benchmarks/serving/bench_serving.py's results, default the file NAME): each
    setting and request rate, median [min, max] over the repeats."""
    res = load(name) if res is None else res
    rows = [[s["setting"], "all at once" if s["rate"] in ("inf", math.inf) else f"{s['rate']:g}/s", str(s["runs"]),
             "-" if not s["pool_bytes"] else f"{s['pool_bytes'] / 2**20:.1f}",
             _mmm(s["request_throughput"]), _mmm(s["vs_baseline"], "{:.2f}"), _mmm(s["output_throughput"]),
             _mmm(s["median_ttft_ms"], "{:.0f}"), _mmm(s["p99_ttft_ms"], "{:.0f}"), _mmm(s["median_tpot_ms"], "{:.0f}"),
             _mmm(s["p99_tpot_ms"], "{:.0f}"), _mmm(s["cache_hit_rate_pct"], "{:.0f}"), _mmm(s["request_goodput"])]
            for s in res["summary"]]
    return table([h.format(baseline=res["baseline"]) for h in BENCH_SERVING_HEADER], rows)


def mode_label(mode: dict) -> str:
    """'stock SGLang' or 'Tangram, <scorer> <ratio>' for one server of a concurrency run."""
    if mode["ratio"] is None:
        return "stock SGLang"
    return f"Tangram, {scorer_name(mode['mode'].split('@')[0].removeprefix('tangram-'))} {mode['ratio']:g}"


def median(xs: list[float]) -> float:
    """The median (statistics is not among the modules this file may import: tests/unit/test_docs.py)."""
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def median_range(xs: list[float], fmt: str = "{:.3f}") -> str:
    """'median (min-max)' of repeated runs; the median alone for one run."""
    return fmt.format(median(xs)) + (f" ({fmt.format(min(xs))}-{fmt.format(max(xs))})" if len(xs) > 1 else "")


FP8_HEADER = ["server", "KV pages", "KV MiB", "runs", "turns/s, median (range)", "vs stock, same run",
              "vs best stock, same run", "sessions held at once", "pool saved (end)"]


def fp8_throughput_table(name: str = "serving/concurrency_fp8.json") -> list[str]:
    return table(FP8_HEADER, fp8_throughput_rows(name))


def fp8_throughput_rows(name: str = "serving/concurrency_fp8.json") -> list[list]:
    """Each server of one run over its repeats (alternating): turns/s and sessions held, median (range),
    turns/s against plain stock's (fcfs, float32) and the best stock server's of the same repeat; servers
    that did not start, named (0 runs)."""
    data = load(name)
    modes = data["modes"]
    plain = {m["repeat"]: m for m in modes if m["mode"] == "stock"}
    best = best_stock(modes)
    by_mode: dict[str, list[dict]] = {}
    for m in modes:
        by_mode.setdefault(m["mode"], []).append(m)
    rows = []
    for mode, runs in by_mode.items():
        kv = "float32" if runs[0]["kv_cache_dtype"] == "auto" else runs[0]["kv_cache_dtype"]
        held = [r["peak_running"] for r in runs]
        label = mode_label(runs[0]) + (f" ({mode.removeprefix('stock-')})" if mode.startswith("stock-") else "")
        rows.append([label, kv, f"{runs[0]['pool_bytes'] / 2**20:.0f}", len(runs),
                     median_range([turns_per_s(r) for r in runs]),
                     "1.00x" if mode == "stock" else
                     median_range([turns_per_s(r) / turns_per_s(plain[r["repeat"]]) for r in runs], "{:.2f}x"),
                     median_range([turns_per_s(r) / turns_per_s(best[r["repeat"]]) for r in runs], "{:.2f}x"),
                     median_range(held, "{:.0f}") + ("" if max(held) < data["args"]["sessions"] else " (all: not bound)"),
                     pct(median([r["pool_info"]["saved_vs_full_kv"] for r in runs]))
                     if "pool_info" in runs[0] else "-"])
    rows += [["stock SGLang" if r.startswith("stock") else r.split(" ")[0],
              r.split(" ")[0].split("+")[1] if "+" in r else "float32", "-", 0,
              "did not start (no Intel AMX: SGLang refuses FP8 KV on this CPU)", "-", "-", "-", "-"]
             for r in data.get("refused", [])]
    return rows


def throughput_cell(name: str) -> tuple[str, str, str, str]:
    """(pool sizes, Tangram's cell, stock's cell, the profile's label) of one multi-turn run."""
    ps = pairs(name)
    sizes = " / ".join(f"{s['max_total_tokens']:,}" for s, _ in ps)
    gain = " / ".join(times(turns_per_s(t) / turns_per_s(s)) for s, t in ps)
    stem = pathlib.Path(load(name)["args"]["profile"]).stem
    label = f"{scorer_name(stem)} {ps[0][1]['ratio']:g}"
    return sizes, f"**{gain}** stock's turns/s; history reused {' / '.join(pct(later_reuse(t)) for _, t in ps)}", \
        f"stock reuses {' / '.join(pct(later_reuse(s)) for s, _ in ps)}", label


def concurrency_table() -> list[str]:
    ps = pairs("serving/concurrency.json")
    s = ps[0][0]
    rows = [["stock SGLang", f"{s['pool_bytes'] / 2**20:.0f}", s["peak_running"], "1.00x", "-", pct(later_reuse(s)),
             "1.00"]]
    rows += [[f"Tangram, SnapKV {t['ratio']:g}", f"{t['pool_bytes'] / 2**20:.0f}", t["peak_running"],
              times(t["peak_running"] / s["peak_running"]), pct(t["pool_info"]["saved_vs_full_kv"]),
              pct(later_reuse(t)), f"{t['wall_s'] / s['wall_s']:.2f}"] for _, t in ps]
    return table(["server", "KV MiB", "peak sessions decoding together", "vs stock", "pool saved (end)",
                  "turn-2 reuse", "wall time vs stock (one run)"], rows)


def replicas_table() -> list[str]:
    d = load("serving/replicas.json")
    single = next(r for r in d["rows"] if r["setting"] == "single")
    names = {"cache_aware": "router, cache-aware, 2 replicas", "round_robin": "router, round-robin, 2 replicas",
             "single": "one server, twice the KV bytes"}
    rows = [[names.get(r["setting"], r["setting"]), f"{r['turns_per_s']:.2f}",
             times(r["turns_per_s"] / single["turns_per_s"]), pct(r["turn2_reuse"]),
             " / ".join(str(a) for a in r["replica_admitted"])] for r in d["rows"]]
    return table(["setting", "turns/s", "vs one server", "turn-2+ reuse", "admissions per replica"], rows)


# ---------------------------------------------------------------- robustness

def pressure_label(setting: str) -> str:
    """'smollm2-snapkv 0.7' -> 'Tangram, SnapKV 0.7'."""
    if " " not in setting or setting.startswith("stock"):
        return setting
    stem, ratio = setting.rsplit(" ", 1)
    return f"Tangram, {scorer_name(stem)} {ratio}"


def pressure_table() -> list[str]:
    rows = [[pressure_label(r["setting"]), r["completed"], r["capped"], r["refused"], r["failed"],
             f"{r['tokens_generated']:,}",
             r.get("retracted", "-"), r["tracebacks"],
             f"{r['integrity']}, {r['pages_left_after_flush']}" if "integrity" in r else "-"]
            for r in load("serving/pressure.json")["rows"]]
    return table(["server (same KV bytes)", "completed", "capped", "refused (400)", "failed", "tokens generated",
                  "retracted, requeued", "tracebacks", "integrity, pages left after flush"], rows)


def soak_table() -> list[str]:
    r = load("serving/soak.json")["result"]
    return table(["answered", "aborted", "hung up", "abandoned", "refused", "failed", "tracebacks",
                  "integrity before / after flush", "pages used / reserved after flush", "retracted",
                  "evicted segments", "admissions that waited", "minutes"],
                 [[r["answered"], r["aborted"], r["hung_up"], r["abandoned"], r["too_large"], len(r["errors"]),
                   r["tracebacks"], f"{r['integrity_before_flush']} / {r['integrity_after_flush']}",
                   f"{r['pages_used_after_flush']} / {r['pages_reserved_after_flush']}", r["retracted"],
                   r["evicted_segments"], r["waited"], round(r["seconds"] / 60)]])


def soak_faults_table() -> list[str]:
    """The soak with faults, a row per model run: load, faults injected, outcomes and the checks after it."""
    rows = []
    for name in ("soak_smollm2", "soak_qwen"):
        if not (RESULTS / "serving" / f"{name}.json").exists():
            continue
        d = load(f"serving/{name}.json")
        r, s, g = d["result"], d["result"]["summary"], d["result"]["replay"]
        o, f = s["outcomes"], s["faults_injected"]
        rss = "; ".join(f"{x['rss']['start_mb']:.0f} -> {x['rss']['end_mb']:.0f} MiB" if x["rss"] else "-"
                        for x in r["replicas"])
        rows.append([f"{r['model']} at {r['ratio']} ({d['stamp']['commit']})",
                     f"{s['sessions']:,} / {s['requests']:,} / {r['load_minutes']:.0f}", f"{o.get('answered', 0):,}",
                     o.get("clear error", 0), s["hung"], f"{f['abort took effect']} / {f['hangup took effect']}",
                     r["retracted"], o.get("replica killed", 0),
                     f"{r['integrity_samples'] - r['integrity_samples_not_ok']} of {r['integrity_samples']}",
                     ", ".join(str(x["after_flush"].get("pages_used")) for x in r["replicas"]), rss,
                     r["tracebacks_total"], f"{g['identical']} of {g['turns']} turns"])
    if not rows:
        return ["(not run yet)"]
    return table(["model (commit)", "sessions / requests / minutes", "answered", "clear errors", "hung",
                  "aborts / hang-ups took effect", "retracted", "replica killed (requests)", "integrity samples ok",
                  "pages after flush", "RSS start -> end", "tracebacks", "greedy replay identical"], rows)


def fuzz_table() -> list[str]:
    """Per endpoint: cases, outcomes alike on both servers, outcomes that differ, and what counts against the
    profile (5xx where stock answered otherwise, tracebacks, failed health probes, lost connections)."""
    cases = load("serving/fuzz.json")["cases"]
    rows = []
    for path in dict.fromkeys(c["path"] for c in cases):
        mine = [c for c in cases if c["path"] == path]
        same = sum(c["profile"]["class"] == c["stock"]["class"] for c in mine)
        kinds = [sum(k in c["verdicts"] for c in mine) for k in ("5xx", "traceback", "unhealthy", "unhealthy, as stock",
                                                                 "lost")]
        rows.append([f"`{path}`", len(mine), same, len(mine) - same, *kinds])
    return table(["endpoint", "cases", "same outcome as stock", "different outcome", "5xx where stock did not",
                  "tracebacks", "unhealthy after (stock not)", "unhealthy after, as stock", "connection lost"], rows)


# ---------------------------------------------------------------- components

def server_label(row: dict, ratio) -> str:
    if row["profile"] is None:
        return "stock SGLang (full KV)"
    stem = pathlib.Path(row["profile"]).stem
    if stem.startswith("uniform"):
        return f"Tangram, uniform {row.get('ratio') or ratio:g} (no scorer)"
    scorer = scorer_name(stem)
    return f"Tangram, {scorer} {row.get('ratio') or ratio:g}"


def per_run_ratios(rows: list[dict], key: str) -> list[list[float]]:
    stock = rows[0][key]
    return [[a / b for a, b in zip(r[key], stock)] for r in rows]


def prefill_table() -> list[str]:
    d = load("timing/prefill_cost.json")
    ratios = per_run_ratios(d["rows"], "times_s")
    return table(["server", "median s per prefill", "vs stock, median per prompt", "range per prompt"],
                 [[server_label(r, d["ratio"]), f"{r['median_s']:.2f}", times(r["vs_stock"]), spread(q) if i else "-"]
                  for i, (r, q) in enumerate(zip(d["rows"], ratios))])


def prefill_history_table(name: str = "prefill_history_smollm2") -> list[str]:
    """ms per new token after a cached history, each server against stock in the same repeat."""
    rows = load(f"timing/{name}.json")["summary"]
    return table(["history", "decoding beside", "server", "ms per new token, median [min, max]", "vs stock, median [range]"],
                 [[f"{r['history']:,}", r["decoding"], r["server"],
                   f"{r['ms_per_token'][0]:.2f} [{r['ms_per_token'][1]:.2f}, {r['ms_per_token'][2]:.2f}]",
                   "-" if r["server"] == "stock" else f"{times(r['vs_stock'][0])} [{spread(r['vs_stock'][1:])}]"]
                  for r in rows])


def decode_step_table() -> list[str]:
    d = load("timing/decode_step.json")
    ratios = per_run_ratios(d["rows"], "steps_ms")
    return table(["server", "median ms per step", "vs stock, median per repetition", "range"],
                 [[server_label(r, None), f"{r['step_ms']:.0f}", times(r["vs_stock"]), spread(q) if i else "-"]
                  for i, (r, q) in enumerate(zip(d["rows"], ratios))])


def cpu_decode_table() -> list[str]:
    rows = [[r["config"].replace("x", " x "), f"{r['method']} {r['ratio']:g}", f"{r['kv_read_tile']:.2f}",
             f"{r['torch_native_ms']:.1f}", f"{r['tangram_tile_ms']:.1f}",
             times(r["torch_native_ms"] / r["tangram_tile_ms"])] for r in load("timing/cpu_decode.json")["rows"]]
    return table(["batch x context", "profile", "KV read", "torch_native ms", "Tangram ms", "speed-up"], rows)


def kv_read_bytes(workload: str, batch: int, ctx: int, elem: int) -> int:
    """Bytes of K and V one decode step reads over all layers: each head of a group reads its group's
    ceil(beta_g * N) slots (beta_g: the group's largest head budget), as gpu_decode's Workload lays them out."""
    spec = json.loads((REPO / "benchmarks" / "profiles" / workload).read_text())
    slots = sum(len(g) * min(ctx, math.ceil(max(spec["budgets"][layer][h] for h in g) * ctx - 1e-9))
                for layer, groups in enumerate(spec["groups"]) for g in groups)
    return batch * slots * spec["head_dim"] * 2 * elem


GEMMA_THROUGHPUT = ("concurrency_gemma_long", "concurrency_gemma_long_6k")   # Gemma-3-270m at two pool sizes
def gpu_served_headline(name: str) -> str:
    """Per model, the sequences a 1.0 profile shares with stock and a compressing one with its eager run and
    the dense oracle, and whether the speed stages ran."""
    data = load(name)
    cell = lambda a: "-" if not a else f"{a['turn1']['equal']}/{a['turn1']['of']}" if "turn1" in a else f"{a['equal']}/{a['of']}"
    parts = [f"{r['arch']}: 1.0 = stock {cell(r.get('t1.0 vs stock'))}, graphs = eager {cell(r.get('t0.4 graphs vs eager'))}"
             + (f", oracle {cell(r['t0.4 vs oracle (CPU)'])}" if r.get("t0.4 vs oracle (CPU)") else "")
             for r in data.get("correctness", {}).get("archs", [])]
    ran = [s for s in ("speed", "fp8") if data.get(s, {}).get("decode")]
    return "; ".join(parts) + ("; speed measured" if ran else "; served speed not measured yet")


GPU_DECODE = "timing/gpu_decode_nvidia-h100-80gb-hbm3.json"   # the newest GPU run (the current kernels)


def gpu_decode_table(path: str = GPU_DECODE) -> list[str]:
    data = load(path)
    rows = []
    for r in data["rows"]:
        gb = kv_read_bytes(r["workload"], r["batch"], r["context"], 1 if r["kv"].startswith("fp8") else 2) / 1e9
        rows.append([r["workload"].removesuffix(".json"), r["batch"], f"{r['context']:,}",
                     "bf16" if r["kv"] == "model" else r["kv"], r["uniform_splits"], f"{r['triton_uniform_ms']:.2f}",
                     f"{r['triton_aot_ms']:.2f}", times(r["triton_uniform_ms"] / r["triton_aot_ms"]),
                     f"{r['cuda_aot_ms']:.1f}", f"{gb:.2f}", f"{gb / r['triton_aot_ms']:.2f}"])
    return table(["workload (0.25 kept)", "B", "N", "pages", "uniform splits", "Triton uniform ms",
                  "Triton split map ms", "split map gain", "CUDA split map ms", "KV read GB",
                  "Triton split map TB/s"], rows)


def triton_launch_table() -> list[str]:
    runs = sum("error" not in r for r in load("timing/triton_tune_nvidia-h200.json")["rows"])
    return table(["workload", "B", "pages", "served launch ms (BLOCK_N 32, 4 warps, 3 stages)",
                  f"best of {runs} launches, ms", "served / best"], triton_launch_rows())


def triton_launch_rows() -> list[list]:
    """Per workload of the sweep: the served launch's time, the best launch, served / best."""
    rows = [r for r in load("timing/triton_tune_nvidia-h200.json")["rows"] if "error" not in r]
    keys = [k for k in rows[0] if k.count("/") == 2]
    default = next(r for r in rows if r["default"])
    out = []
    for k in keys:
        best = min(rows, key=lambda r: r[k])
        name, batch, kv = k.split("/")
        out.append([name, batch, "bf16" if kv == "model" else kv, f"{default[k]:.2f}",
                    f"{best[k]:.2f} (BLOCK_N {best['block_n']}, {best['num_warps']} warps, {best['num_stages']} stages)",
                    times(default[k] / best[k])])
    return out


def control_plane_table() -> list[str]:
    data = load("timing/control_plane.json")["rows"]
    if "write_slots" not in data[0]:   # recorded before the device tables were timed apart
        rows = [[r["L"], r["G"], f"{r['tangram'][0]:,.0f}", f"{r['compress_reclaim'][0]:,.0f}",
                 f"{r['sglang_paged'][0]:,.0f}"] for r in data]
        return table(["layers", "groups", "exact reservation", "compress-then-reclaim", "SGLang's token allocator"],
                     rows)
    rows = [[r["L"], r["G"], f"{r['tangram'][0]:,.0f} ({times(r['tangram'][0] / r['sglang_paged'][0])})",
             f"{r['tangram_tables'][0]:,.0f} ({times(r['tangram_tables'][0] / r['sglang_paged'][0])})",
             f"{r['write_slots'][0]:,.0f}", f"{r['compress_reclaim'][0]:,.0f}", f"{r['sglang_paged'][0]:,.0f}"]
            for r in data]
    return table(["layers", "groups", "exact reservation (vs SGLang)", "with the device tables (vs SGLang)",
                  "write slots (device work on a GPU)", "compress-then-reclaim", "SGLang's token allocator"], rows)


def control_decode_table() -> list[str]:
    rows = [[f"{r['context']:,}", f"{r['rebuild']:,.0f}", f"{r['host']:.0f} / {r['host_median']:.0f}",
             f"{r['check_median']:.0f}",
             f"{r['host_and_check_median']:.0f} ({times(r['host_and_check_median'] / r['sglang_median'])})",
             f"{r['device_tables']:.0f}", f"{r['sglang']:.0f} / {r['sglang_median']:.0f}"]
            for r in load("timing/control_plane_decode.json")["rows"]]
    return table(["context", "tables rebuilt on the host", "step, best / median", "capacity check, median",
                  "step + check, median (vs SGLang)", "device-table ops (CPU here)", "SGLang, best / median"], rows)


def load_balance_table() -> list[str]:
    rows = load("modeled/load_balance.json")["rows"]
    loads = [(1, "same"), (16, "same"), (16, "mixed")]
    out = []
    for key, label in [("uniform", "uniform splits (FlashDecoding)"), ("planned", "per-step planning (FlashInfer)"),
                       ("aot", "split map, paper weights"), ("aot_beta", "split map, shipped weights")]:
        evals = [r[key].get("planning_evals_per_step", 0) for r in rows]
        out.append([label, f"{min(evals):,}-{max(evals):,}" if max(evals) else "0"] + [
            spread([r[key]["latency_vs_balanced"] for r in rows if (r["batch"], r["contexts"]) == w]) for w in loads])
    return table(["strategy", "planner evaluations per step", "latency vs balanced: 1 request",
                  "16 requests, same context", "16 requests, mixed contexts"], out)


def reclaim_rows() -> list[dict]:
    return [r for r in load("modeled/memory_reclaim.json")["rows"] if r["hp_asked"] == 4 and r["page_size"] == 16]


def reclaim_table() -> list[str]:
    rows = [[r["profile"].replace("@0.25", ""), r["hp"]] + [pct(r["reclaim"][k]) for k in
            ("monolithic", "adjacent", "budget_aware", "ideal")] +
            [" / ".join(str(r["fit"][k]) for k in ("full", "monolithic", "adjacent", "budget_aware", "ideal"))]
            for r in reclaim_rows()]
    return table(["profile (ratio 0.25)", "H_p", "monolithic", "adjacent", "budget-aware", "ideal",
                  "requests that fit: full / mono / adj / BA / ideal"], rows)


def tp_table() -> list[str]:
    table_rows, keys = rows_of("modeled/tp_memory.json"), []
    for r in table_rows:
        k = (r["model"], r["scorer"], r["H_p"])
        if r["ratio"] == 0.25 and k not in keys:
            keys.append(k)
    out = []
    for model, scorer, hp in keys:
        mine = {r["tp_size"]: r for r in table_rows if (r["model"], r["scorer"], r["H_p"], r["ratio"]) ==
                (model, scorer, hp, 0.25)}
        tp1 = next(iter(mine.values()))["tp1"]
        out.append([f"{model}, {SCORERS.get(scorer, scorer)}", hp, f"{100 * tp1:.1f}%"] +
                   [f"{100 * mine[t]['served']:.1f}% (+{100 * mine[t]['cost_vs_tp1']:.1f}%)" if t in mine else "-"
                    for t in (2, 4, 8)])
    return table(["model, scorer (ratio 0.25)", "H_p", "TP=1", "TP=2", "TP=4", "TP=8"], out)


def paper_models_table(data: list[dict] | None = None) -> list[str]:
    """The rows of benchmarks/modeled/paper_models (default: its results file)."""
    out = []
    for r in rows_of("modeled/paper_models.json") if data is None else data:
        layers = f"{r['layers']} ({r['window_layers']} x {r['window']})" if r["window_layers"] else str(r["layers"])
        out.append([f"{r['model']} ({r['scorer']})", layers, f"{r['kv_heads']} x {r['head_dim']}", f"{r['stock']:,}",
                    f"{r['ratio']:g}", f"{r['tangram']:,}", times(r["tangram"] / r["stock"]), f"{r['bounded']:,}",
                    times(r["bounded"] / r["stock"]), r["served"]])
    return table(["model (profile)", "layers (window)", "KV heads x d", "stock B/token", "ratio",
                  "Tangram, reserved", "vs stock", "Tangram, held (windows bounded)", "vs stock",
                  "served with a profile"], out)


# ---------------------------------------------------------------- README's key results

def link(name: str) -> str:
    """README's link to the Markdown beside a results file: [stem](benchmarks/results/kind/stem.md)."""
    stem = name.rsplit(".", 1)[0]
    return f"[{stem.rsplit('/', 1)[-1]}](benchmarks/results/{stem}.md)"


def repeated(name: str) -> bool:
    """Whether a concurrency run has repeats or more than one stock server (read by repeats_row)."""
    modes = load(name)["modes"]
    return any(m.get("repeat", 0) for m in modes) or sum(m["ratio"] is None for m in modes) > len(
        {m["max_total_tokens"] for m in modes})


def best_stock(modes: list[dict]) -> dict[int, dict]:
    """The fastest stock server of each repeat (key: repeat)."""
    out: dict[int, dict] = {}
    for m in modes:
        r = m.get("repeat", 0)
        if m["ratio"] is None and (r not in out or turns_per_s(m) > turns_per_s(out[r])):
            out[r] = m
    return out


def repeats_row(name: str, model: str) -> list:
    """README's row for repeated, alternating runs at one pool size: Tangram's turns/s against the best stock
    server of the same repeat and against plain stock (fcfs), median (range); the ratio-1.0 control's
    against the best stock where the run has one."""
    data = load(name)
    modes = data["modes"]
    best = best_stock(modes)
    plain = {m.get("repeat", 0): m for m in modes if m["mode"] == "stock"}
    tg = [m for m in modes if m["ratio"] is not None and not m.get("control")]
    ctl = [m for m in modes if m.get("control")]
    vs_best = [turns_per_s(m) / turns_per_s(best[m.get("repeat", 0)]) for m in tg]
    vs_plain = [turns_per_s(m) / turns_per_s(plain[m.get("repeat", 0)]) for m in tg]
    control = "" if not ctl else (
        f"; the ratio-1.0 control {median_range([turns_per_s(m) / turns_per_s(best[m.get('repeat', 0)]) for m in ctl], '{:.2f}x')}"
        f" the best stock's, reusing {pct(median([later_reuse(m) for m in ctl]))}")
    stem = pathlib.Path(data["args"]["profile"]).stem
    winners = dict.fromkeys(b["mode"].replace("stock-", "") for b in best.values())
    variants = " / ".join(v if v != "stock" else "fcfs" for v in data["args"].get("stock_variants", ["fcfs"]))
    a = data["args"]
    return [f"Multi-turn turns/s at the same KV bytes, {model}, {scorer_name(stem)} {tg[0]['ratio']:g}, a pool "
            f"of {tg[0]['max_total_tokens']:,} full-KV tokens, {a['sessions']} sessions x {a['turns']} turns of "
            f"{a['prompt_tokens']:,}-token prompts ({len(tg)} alternating runs)",
            f"**{median_range(vs_best, '{:.2f}x')}** the best stock's turns/s ({median_range(vs_plain, '{:.2f}x')} "
            f"plain stock's); history reused {pct(median([later_reuse(m) for m in tg]))}{control}",
            f"best stock per run (of {variants}): {', '.join(w if w != 'stock' else 'fcfs' for w in winners)}; it reuses "
            f"{pct(median([later_reuse(b) for b in best.values()]))}",
            link(name)]


def per_mode_headline(name: str) -> str:
    """Each Tangram server's turns/s over the best stock's of its repeat (median) and its later-turn reuse,
    one server at a time (a run with several Tangram modes at one ratio, e.g. --replies whole compressed)."""
    modes = load(name)["modes"]
    best = best_stock(modes)
    out = []
    for mode in dict.fromkeys(m["mode"] for m in modes if m["ratio"] is not None):
        ms = [m for m in modes if m["mode"] == mode]
        vs = median([turns_per_s(m) / turns_per_s(best[m.get("repeat", 0)]) for m in ms])
        out.append(f"{mode} {vs:.2f}x the best stock's turns/s, reusing {pct(median([later_reuse(m) for m in ms]))}")
    return "; ".join(out) + f" ({len(best)} run{'s' if len(best) > 1 else ''})"


BENCH_LOW = "serving/bench_serving_low_rate.json"


def bench_serving_row(name: str = "serving/bench_serving.json") -> list:
    """SGLang's bench_serving at the first Tangram setting and the first rate: request throughput against
    the best stock setting and plain stock, and p99 TTFT against the best stock's (medians over repeats).
    bench_serving's multi-turn --request-rate starts conversations; each one's turns follow its replies."""
    res = load(name)
    a = res["args"]
    rate = res["summary"][0]["rate"]
    at = [x for x in res["summary"] if x["rate"] == rate]
    stock = [x for x in at if x["setting"].startswith("stock")]
    best = max(stock, key=lambda x: x["request_throughput"][0])
    tg = next(x for x in at if x["setting"].startswith("tangram"))
    rps = lambda x: x["request_throughput"][0]   # noqa: E731
    ttft = lambda x: f"{x['p99_ttft_ms'][0] / 1000:.{1 if x['p99_ttft_ms'][0] < 10_000 else 0}f}"  # noqa: E731
    hits = lambda x: x["cache_hit_rate_pct"][0]  # noqa: E731
    rate_s = "all at once" if rate in ("inf", math.inf) else f"{rate:g} conversations/s started"
    fastest = min(stock, key=lambda x: x["p99_ttft_ms"][0])   # the best stock by throughput may queue longest
    low_p99 = "" if fastest is best else (f"; lowest stock p99 TTFT {ttft(fastest)} s "
                                          f"({fastest['setting'].removeprefix('stock-')})")
    return [f"`sglang.bench_serving`, multi-turn (generated-shared-prefix, {a['groups'] * a['per_group']} conversations "
            f"x {a['turns']} turns, replies fed back), {SHIPPED.get(a['model'], {}).get('name', a['model'])}, "
            f"{scorer_name(pathlib.Path(a['profile']).stem)} {tg['setting'].split('@')[1]}, "
            f"{a['max_total_tokens']:,} full-KV tokens' bytes, {rate_s} ({tg['runs']} alternating runs)",
            f"**{rps(tg) / rps(best):.2f}x** the best stock's requests/s ({rps(tg) / rps(stock[0]):.2f}x plain "
            f"stock's); p99 TTFT {ttft(tg)} s; cache hits {hits(tg):.0f}%",
            f"best stock ({best['setting'].removeprefix('stock-')}): p99 TTFT {ttft(best)} s, cache hits "
            f"{hits(best):.0f}%{low_p99}", link(name)]


def gemma_throughput_row() -> list:
    """Gemma-3-270m at its shipped 0.5 over repeated runs: turns/s against the best stock of each repeat."""
    return repeats_row(f"serving/{GEMMA_THROUGHPUT[-1]}.json", "Gemma-3-270m (a hybrid)")


THINK_TIME = "serving/think_time.json"  # benchmarks.serving.think_time
THINK_TIME_PARETO = "serving/think_time_pareto.json"  # the same with heavy-tailed (Lomax) pauses
THINK_TIME_HOST = "serving/think_time_host.json"  # the profile with its compressed host tier, stock given its bytes
THINK_TIME_HOST_SESSIONS = "serving/think_time_host_sessions.json"  # the same with session ids, session radix cache
MULTITURN_ROUNDS = "serving/multiturn_rounds.json"  # SGLang's bench_multiturn shape (benchmarks.serving.multiturn_rounds)
MULTITURN_STREAMING = "serving/multiturn_streaming.json"  # the same rounds: SGLang's streaming sessions, session ids
THINK_TIME_TLRU = "serving/think_time_tlru.json"  # stock lpm with SGLang's T-LRU eviction against plain lpm
THINK_TIME_QWEN = "serving/think_time_qwen.json"  # the think-time workload on Qwen2.5-0.5B, scaled to this CPU
THINK_TIME_QWEN_R025 = "serving/think_time_qwen_r025.json"  # the same at 0.25
THINK_COUNTERS = ("matched_tokens", "evicted_tokens_admission", "evicted_tokens_decode", "evicted_tokens_flush",
                  "evicted_tokens_sglang", "evictions_refused", "published_segments", "twin_segments",
                  "detached_segments", "waited", "retracted", "prefill_passes", "prefill_chunks", "offloaded_tokens",
                  "loaded_tokens", "host_evicted_tokens", "load_waits")


def median(xs) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def think_figures(run: dict) -> dict:
    """One server's run of the think-time benchmark: answers right, turns/s, the share of later turns' prompts
    read from the cache (in all, and per turn), TTFT p50 / p99, prompt tokens prefilled."""
    turns = [t for s in run["sessions"] for t in s["turns"]]
    later = [t for t in turns if t["turn"] > 1]
    per_turn: dict = {}
    for t in later:
        c, p = per_turn.get(t["turn"], (0, 0))
        per_turn[t["turn"]] = (c + t["cached_tokens"], p + t["prompt_tokens"])
    ttft = sorted(t["ttft_s"] for t in turns) or [0.0]
    return dict(right=sum(bool(s.get("right")) for s in run["sessions"]), sessions=len(run["sessions"]),
                turns=len(turns), turns_per_s=len(turns) / max(run["wall_s"], 1e-9),
                reuse=sum(t["cached_tokens"] for t in later) / max(1, sum(t["prompt_tokens"] for t in later)),
                reuse_per_turn={k: c / max(1, p) for k, (c, p) in sorted(per_turn.items())},
                ttft_p50=median(ttft), ttft_p99=ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
                prefilled=sum(t["prompt_tokens"] - t["cached_tokens"] for t in turns))


def think_by_server(res: dict) -> dict:
    out: dict = {}
    for r in res["runs"]:
        out.setdefault(r["server"], []).append(r)
    return out


def _think_medians(res: dict) -> dict:
    keys = ("turns_per_s", "reuse", "ttft_p50", "ttft_p99", "right")
    return {name: {k: median(think_figures(r)[k] for r in rs) for k in keys} for name, rs in think_by_server(res).items()}


def _paired_ratios(res: dict, name: str, stock: str) -> list[float]:
    """turns/s of server name over stock's, per repeat (the runs alternate, so each pair shares its host)."""
    tps = {(r["server"], r.get("repeat", 0)): think_figures(r)["turns_per_s"] for r in res["runs"]}
    return [v / tps[(stock, k)] for (n, k), v in sorted(tps.items()) if n == name and (stock, k) in tps]


def _ratio_cell(res: dict, name: str, stock: str) -> str:
    xs = _paired_ratios(res, name, stock)
    if not xs:
        return "-"
    return f"{median(xs):.2f}x" + (f" [{min(xs):.2f}, {max(xs):.2f}]" if len(xs) > 1 else "")


def _best_stock(meds: dict) -> str | None:
    stock = [n for n in meds if n.startswith("stock")]
    return max(stock, key=lambda n: meds[n]["turns_per_s"]) if stock else None


def think_time_table(res: dict) -> list[str]:
    """The think-time benchmark's Markdown: the workload, a row per server (median [min, max] over the runs),
    the profile's reuse counters."""
    a = res["args"]
    best = _best_stock(_think_medians(res))
    return [f"{a['sessions']} sessions arriving over {a['arrival_window']:g} s, {a['turns']} turns each over the "
            f"OpenAI chat API (streamed, greedy): {a['turns'] - 1} documents of about {a['doc_tokens']} tokens "
            f"(the first carries an access code), then the question for the code; think time between turns "
            f"{a['think']} with mean {a['think_mean']:g} s; every server gets `--max-total-tokens "
            f"{a['max_total_tokens']}` (the same KV bytes). {res['model_path'].rstrip('/').split('/')[-1]}, profile "
            f"`{a['profile']}` at {a['ratio']:g}. Median [min, max] over {a['repeats']} alternating run(s); "
            f"'vs best stock' divides by the stock server with the highest median turns/s ({best}), per repeat "
            f"(median [min, max] of the paired ratios).", "", *_server_rows(res, right=True)]


def rounds_table(res: dict) -> list[str]:
    """benchmarks/serving/multiturn_rounds.py's Markdown (SGLang's bench_multiturn shape): the workload, a row
    per server, the profile's reuse counters."""
    a = res["args"]
    best = _best_stock(_think_medians(res))
    rate = ("Poisson" if a["distribution"] == "poisson" else "uniform") + f" at {a['request_rate']:g} requests/s"
    return [f"SGLang's bench_multiturn shape: {a['num_clients']} clients x {a['num_rounds']} rounds, each round "
            f"{a['request_length']} new tokens of text (input_ids to `/generate`, streamed) and {a['output_length']} "
            f"generated (greedy, ignore_eos) appended to the client's history; the next rounds wait in one ready "
            f"queue ({a['ready_queue_policy']} pop) sent {rate}, at most {a['max_parallel']} in flight; every server "
            f"gets `--max-total-tokens {a['max_total_tokens']}` (the same KV bytes). "
            f"{res['model_path'].rstrip('/').split('/')[-1]}, profile `{a['profile']}` at {a['ratio']:g}. Median "
            f"[min, max] over {a['repeats']} alternating run(s); 'turns/s' is bench_multiturn's throughput (requests "
            f"per second); 'vs best stock' divides by the stock server with the highest median ({best}), per repeat.",
            "", *_server_rows(res, right=False), *_stall_lines(res)]


def _stall_lines(res: dict) -> list[str]:
    """Where a run stalled (a round without data for --request-timeout s; its client gave up the rest): the
    requests each server answered of those planned, and its stalls, per run."""
    runs = think_by_server(res)
    if not any(r.get("stalled") for rs in runs.values() for r in rs):
        return []
    a = res["args"]
    planned = a["num_clients"] * a["num_rounds"]
    cells = [f"{name}: answered {', '.join(str(think_figures(r)['turns']) for r in rs)} of {planned}, stalled "
             f"{', '.join(str(len(r.get('stalled', []))) for r in rs)} (rounds " + ", ".join(
                 "/".join(str(s["round"]) for s in r.get("stalled", [])) or "-" for r in rs) + ")"
             for name, rs in runs.items()]
    return ["", f"Stalls (no data for {a.get('request_timeout', 0):g} s; the client then closes its session and "
            "sends no more rounds), per run: " + "; ".join(cells) + "."]


def _server_rows(res: dict, right: bool) -> list[str]:
    """A row per server (median [min, max] over the runs), the profile's counters, the host tier's bytes."""
    rng = lambda xs, f: f"{f(median(xs))} [{f(min(xs))}, {f(max(xs))}]"  # noqa: E731
    runs, best = think_by_server(res), _best_stock(_think_medians(res))
    lines = ["| server | runs | " + "right | " * right + "turns/s | vs best stock | later turns reused | reuse per "
             "turn (2, 3, ...) | TTFT p50 s | TTFT p99 s | prompt tokens prefilled |",
             "|---|---|" + "---|" * right + "---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        fs = [think_figures(r) for r in rs]
        per_turn = ", ".join(f"{100 * median(f['reuse_per_turn'].get(k, 0) for f in fs):.0f}%"
                             for k in sorted(fs[0]["reuse_per_turn"]))
        vs = _ratio_cell(res, name, best) if best else "-"
        answered = f"{rng([f['right'] for f in fs], lambda x: f'{x:g}')}/{fs[0]['sessions']} | " if right else ""
        lines.append(f"| {name} | {len(rs)} | {answered}"
                     f"{rng([f['turns_per_s'] for f in fs], lambda x: f'{x:.3f}')} | {vs} | "
                     f"{rng([100 * f['reuse'] for f in fs], lambda x: f'{x:.1f}%')} | {per_turn} | "
                     f"{rng([f['ttft_p50'] for f in fs], lambda x: f'{x:.1f}')} | "
                     f"{rng([f['ttft_p99'] for f in fs], lambda x: f'{x:.1f}')} | "
                     f"{rng([f['prefilled'] for f in fs], lambda x: f'{x:.0f}')} |")
    last = {r["server"]: r for r in res["runs"] if r.get("pool_info")}
    if last:
        lines += ["", "The profile's counters (`pool_info`, the last run of each server): " + "; ".join(
            f"{name}: " + ", ".join(f"{k} {r['pool_info'][k]:,}" for k in THINK_COUNTERS if k in r["pool_info"])
            for name, r in last.items())]
    hosts = [f"{name}: {p['host_tokens']:,} tokens in {p['host_pages_used']:,} of {p['host_pages_total']:,} pages, "
             f"{host_bytes_per_token(p):,.0f} B a token against full KV's {full_kv_token_bytes(p):,.0f} "
             f"({full_kv_token_bytes(p) / host_bytes_per_token(p):.2f}x the tokens per host byte)"
             for name, p in ((n, r["pool_info"]) for n, r in last.items()) if p.get("host_tokens")]
    if hosts:
        lines += ["", "Host tier at the end of the last run: " + "; ".join(hosts)]
    return lines


def full_kv_token_bytes(pool: dict) -> float:
    return pool["full_kv_bytes_for_tokens_held"] / max(1, pool["tokens_held"])


def host_bytes_per_token(pool: dict) -> float:
    """Bytes of host pages per token the host tier holds (page padding included)."""
    return pool["host_pages_used"] * pool["page_bytes"] / max(1, pool["host_tokens"])


def streaming_headline(res: dict) -> str:
    """SGLang's streaming sessions against the session radix cache on the same rounds: requests answered of those
    planned and stalls per server (medians over the runs), requests/s of those that stalled in no run."""
    a = res["args"]
    planned, parts = a["num_clients"] * a["num_rounds"], []
    for name, rs in think_by_server(res).items():
        answered = median(think_figures(r)["turns"] for r in rs)
        stalls = median(len(r.get("stalled", [])) for r in rs)
        rate = "" if stalls else f", {median(think_figures(r)['turns_per_s'] for r in rs):.3f} requests/s"
        parts.append(f"{name} answered {answered:g} of {planned} ({stalls:g} stalled{rate})")
    return "; ".join(parts)


def tlru_headline(res: dict) -> str:
    """Stock lpm with T-LRU eviction against plain lpm: turns/s (paired ratio) and later turns' reuse."""
    meds = _think_medians(res)
    t, plain = meds["stock-lpm-tlru"], meds["stock-lpm"]
    return (f"stock lpm with T-LRU eviction {t['turns_per_s']:.3f} turns/s, "
            f"{_ratio_cell(res, 'stock-lpm-tlru', 'stock-lpm')} plain lpm's {plain['turns_per_s']:.3f}; later turns "
            f"reused {100 * t['reuse']:.1f}% against {100 * plain['reuse']:.1f}%")


def default_ratio(profile: str) -> float | None:
    """The profile file's default_ratio (its top-level line; this file reads no YAML library), or None."""
    path = REPO / profile
    lines = path.read_text().splitlines() if path.is_file() else []
    return next((float(x.split(":", 1)[1]) for x in lines if x.startswith("default_ratio:")), None)


def think_time_row(res: dict, link_to: str, server: str = "tangram") -> list[str]:
    """The README's row: the profile as launched (server: with no other option, its default policy; or
    tangram-host, with its host tier) against the fastest stock server (median turns/s over the runs), the
    ratio-1.0 control (launched alike) beside."""
    a, meds = res["args"], _think_medians(res)
    control = server.replace("tangram", "tangram-1.0", 1)
    stock, tg, ctl = _best_stock(meds), meds[server], meds.get(control)
    runs = len(think_by_server(res)[server])
    cell = lambda m: (f"later turns reused {100 * m['reuse']:.0f}%, TTFT p50 / p99 {m['ttft_p50']:.0f} / "  # noqa: E731
                      f"{m['ttft_p99']:.0f} s, {m['right']:g}/{a['sessions']} right")
    profile = a["profile"].rsplit("/", 1)[-1].split(".yaml")[0]
    alone = ("launched with the profile alone (its default ratio and policy, lpm)"
             if default_ratio(a["profile"]) == a["ratio"]
             else "launched with the profile and the ratio alone (no policy flag: the profile's default, lpm)")
    how = ("with a compressed host tier of twice the pool's bytes (`--tangram-host-ratio 2`)" if "host" in server
           else alone)
    how += ", session ids and the session radix cache on both sides" if server.endswith("sessions") else ""
    return [f"Multi-turn sessions that pause between turns, {res['model_path'].rstrip('/').split('/')[-1]}, {profile} "
            f"{a['ratio']:g} {how}, {a['sessions']} sessions arriving over "
            f"{a['arrival_window']:g} s x {a['turns']} turns, pauses {a['think']} mean {a['think_mean']:g} s, "
            f"{a['max_total_tokens']:,} full-KV tokens' bytes ({runs} run{'s' * (runs > 1)})",
            f"**{_ratio_cell(res, server, stock)}** the best stock's turns/s; {cell(tg)}",
            f"best stock ({stock.removeprefix('stock-')}): {cell(meds[stock])}"
            + (f"; ratio-1.0 control {_ratio_cell(res, control, stock)}, reused "
               f"{100 * ctl['reuse']:.0f}%" if ctl else ""), link_to]


def rounds_row(res: dict, link_to: str) -> list[str]:
    """The README's row for SGLang's bench_multiturn shape: the profile against the fastest stock server
    (paired per repeat), the ratio-1.0 control beside."""
    a, meds = res["args"], _think_medians(res)
    stock, ctl = _best_stock(meds), meds.get("tangram-1.0")
    runs = len(think_by_server(res)["tangram"])
    cell = lambda m: (f"later rounds reused {100 * m['reuse']:.0f}%, TTFT p50 / p99 {m['ttft_p50']:.1f} / "  # noqa: E731
                      f"{m['ttft_p99']:.1f} s")
    profile = a["profile"].rsplit("/", 1)[-1].split(".yaml")[0]
    return [f"SGLang's bench_multiturn shape (raw text to `/generate`, no chat template), "
            f"{res['model_path'].rstrip('/').split('/')[-1]}, {profile} {a['ratio']:g}, {a['num_clients']} clients x "
            f"{a['num_rounds']} rounds of {a['request_length']} new + {a['output_length']} generated tokens, "
            f"{a['request_rate']:g} requests/s, {a['max_parallel']} in flight, {a['max_total_tokens']:,} full-KV "
            f"tokens' bytes ({runs} alternating runs)",
            f"**{_ratio_cell(res, 'tangram', stock)}** the best stock's requests/s; {cell(meds['tangram'])}",
            f"best stock ({stock.removeprefix('stock-')}): {cell(meds[stock])}"
            + (f"; ratio-1.0 control {_ratio_cell(res, 'tangram-1.0', stock)}, reused {100 * ctl['reuse']:.0f}%"
               if ctl else ""), link_to]


def key_results() -> list[str]:
    rows = []
    for key in SHIPPED:
        rec = recommended(key)
        served, peer, uni = rec["served"], rec["peer"], rec["uniform"]
        held = (f"{pct(served['held_share'])} of full KV held" if served.get("held_share") is not None
                else f"{pct(served['saved_vs_full_kv'])} of the pool saved")
        peer = (f"; {setting_label(peer['setting'])} {answered(peer, False)} at {pct(peer['kept_share'])}"
                if peer else "")
        uni = f"; uniform budgets {answered(uni, False)} at {pct(uni['kept_share'])}" if uni else ""
        rows.append([f"Multi-turn answers right, {rec['name']}, {rec['scorer']} {rec['ratio']:g}",
                     f"**{answered(served)}**; {pct(served['kept_share'])} of the history kept, {held}",
                     f"full KV {answered(rec['full'])}{peer}{uni}",
                     link(rec["fidelity"])])
    for key, spec in SHIPPED.items():
        if repeated(spec["throughput"]):
            rows.append(repeats_row(spec["throughput"], spec["name"]))
            continue
        sizes, gain, base, label = throughput_cell(spec["throughput"])
        rows.append([f"Multi-turn turns/s at the same KV bytes, {spec['name']}, {label}, pools of {sizes} "
                     f"full-KV tokens (one run each)", gain, base,
                     link(spec["throughput"])])
    rows.append(gemma_throughput_row())
    rows.append(bench_serving_row())
    rows.append(bench_serving_row(BENCH_LOW))
    if (RESULTS / THINK_TIME).exists():
        rows.append(think_time_row(load(THINK_TIME), link(THINK_TIME)))
    runs = [q for q in (THINK_TIME_QWEN_R025, THINK_TIME_QWEN) if (RESULTS / q).exists()]
    rec = recommended("qwen2.5-0.5b")["ratio"] if runs else None
    qwen = next((q for q in runs if load(q)["args"]["ratio"] == rec), runs[0] if runs else None)
    if qwen:  # the recommended ratio's run where there is one
        rows.append(think_time_row(load(qwen), link(qwen)))
    if (RESULTS / THINK_TIME_HOST).exists():
        rows.append(think_time_row(load(THINK_TIME_HOST), link(THINK_TIME_HOST), "tangram-host"))
    if (RESULTS / MULTITURN_ROUNDS).exists():
        rows.append(rounds_row(load(MULTITURN_ROUNDS), link(MULTITURN_ROUNDS)))
    rows.append(long_row())
    p = {r["setting"]: r for r in load("serving/pressure.json")["rows"]}
    st = p.pop("stock SGLang")
    tg = "; ".join(f"{pressure_label(k)}: {r['completed']} completed, {r['capped']} capped, {r['refused']} refused, "
                   f"{r['failed']} failed" for k, r in p.items())
    a = load("serving/pressure.json")["args"]
    rows.append([f"Memory pressure: {a['requests']} requests, {a['workers']} at a time, a "
                 f"{a['max_total_tokens']:,}-token pool", tg,
                 f"stock: {st['completed']} completed, {st['capped']} capped, {st['refused']} refused, "
                 f"{st['failed']} failed", link("serving/pressure.json")])
    rows.append(soak_faults_row("soak_smollm2"))
    rows.append(fuzz_row())
    rows.append(prefill_history_row("prefill_history_smollm2"))
    d = load("timing/prefill_cost.json")
    gate = next(x for x, q in zip(d["rows"], per_run_ratios(d["rows"], "times_s")) if "fastkvzip" in
                str(x["profile"]))
    q = per_run_ratios(d["rows"], "times_s")[d["rows"].index(gate)]
    rows.append([f"Prefill of {d['prompt_tokens']:,}-token prompts, {server_label(gate, d['ratio'])}",
                 f"{times(gate['vs_stock'])} stock's time (median of {len(q)} prompts, {spread(q)})", "stock 1.00x",
                 link("timing/prefill_cost.json")])
    rows.append(control_plane_row())
    d = load("timing/decode_step.json")
    q = per_run_ratios(d["rows"], "steps_ms")
    rows.append([f"Decode step, batch {d['batch']} x {d['context']:,} tokens, {server_label(d['rows'][-1], None)}",
                 f"{times(d['rows'][-1]['vs_stock'])} stock's time (median of {d['reps']}, {spread(q[-1])})",
                 "stock 1.00x" + "".join(f"; ratio-1.0 control {times(r['vs_stock'])} ({spread(qr)})"
                                         for r, qr in zip(d["rows"], q) if r.get("ratio") == 1.0),
                 link("timing/decode_step.json")])
    return table(["result (CPU, float32)", "Tangram", "baseline", "file"], rows)


# ---------------------------------------------------------------- docs/results.md blocks

def hit_recompute_table() -> list[str]:
    """The hit-against-recompute runs (benchmarks/serving/hit_recompute.py): SmolLM2 on the code before the
    chunk rule and the current one, and Qwen, a row each (the retraction way where the run had it)."""
    out = ["| model, code | turns from the tree answering as recomputed (largest log-prob gap) | final prompts batched "
           "| batched, a request retracted every third forward (integrity: first Engine / retracting one) "
           "| later turns' history read from the tree | first turns' system prompt read from the tree |",
           "|---|---|---|---|---|---|"]
    for label, name in (("SmolLM2, before the chunk rule", "hit_recompute_smollm2_before"),
                        ("SmolLM2, the chunk rule", "hit_recompute_smollm2"), ("Qwen2.5-0.5B", "hit_recompute_qwen")):
        if not (RESULTS / "serving" / f"{name}.json").exists():
            continue
        d = load(f"serving/{name}.json")
        s, shared = d["summary"], d["summary"]["first_turn_cached"][1:]
        retract = (f"{s['retract_same']}/{s['retract_turns']} ({s['retract_gap']:.1e}; {s['retractions']} retractions)"
                   if "retract_same" in s else "not run")
        if "integrity" in s:  # the pool's check on both Engines (runs since 11c76cb)
            retract += f"; integrity {s['integrity']} / {s['retract_integrity']}"
        out.append(f"| {label} ({d['stamp']['commit']}) | {s['tree_same']}/{s['tree_turns']} ({s['tree_gap']:.1e}) "
                   f"| {s['batch_same']}/{s['batch_turns']} ({s['batch_gap']:.1e}) | {retract} "
                   f"| {s['history_reused']:,} of {s['history_tokens']:,} "
                   f"| {min(shared, default=0)}-{max(shared, default=0)} of {s['system_tokens']} |")
    return out


def hit_recompute_headline(d: dict) -> str:
    s = d["summary"]
    retract = (f", {s['retract_same']}/{s['retract_turns']} batched with {s['retractions']} forced retractions"
               if "retract_same" in s else "")
    return (f"{s['tree_same']}/{s['tree_turns']} turns from the tree answer as recomputed (log-prob gap "
            f"{s['tree_gap']:.0e}), {s['batch_same']}/{s['batch_turns']} batched{retract}; history reused "
            f"{s['history_reused']:,}/{s['history_tokens']:,}")


NOT_FULL_OR_KVZIP = {"tangram", "dynamic", "uniform", "kvpress-snapkv"}  # those two are in the FastKVzip table
DOC_BLOCKS = {
    "fidelity-smollm2-fastkvzip": lambda: fidelity_table("fidelity/fidelity_fastkvzip.json"),
    "fidelity-smollm2-kvzip": lambda: fidelity_table("fidelity/fidelity_kvzip.json", {"tangram"}),
    "fidelity-smollm2-layer-scope": lambda: fidelity_table("fidelity/fidelity_fastkvzip_layer_scope.json",
                                                           {"tangram", "dynamic"}),
    "fidelity-smollm2-snapkv": lambda: fidelity_table("fidelity/fidelity.json", NOT_FULL_OR_KVZIP),
    "fidelity-qwen-fastkvzip": lambda: fidelity_table("fidelity/fidelity_qwen_fastkvzip.json"),
    "fidelity-smollm2-fp8": lambda: fidelity_table("fidelity/fidelity_fp8.json"),
    "fidelity-qwen-fp8": lambda: fidelity_table("fidelity/fidelity_qwen_fp8.json"),
    "fidelity-qwen-kvzip": lambda: fidelity_table("fidelity/fidelity_qwen_kvzip.json", {"tangram"}),
    "fidelity-qwen-snapkv": lambda: fidelity_table("fidelity/fidelity_qwen.json", NOT_FULL_OR_KVZIP),
    "fidelity-position": lambda: fidelity_table("fidelity/fidelity_position.json", {"static~position"}),
    "fidelity-quick": lambda: fidelity_table("fidelity/fidelity_quick.json"),
    "throughput-smollm2": lambda: throughput_or_repeats("serving/concurrency_multiturn_r04.json"),
    "throughput-qwen": lambda: throughput_or_repeats("serving/concurrency_multiturn_qwen.json"),
    "throughput-fp8": fp8_throughput_table,
    "concurrency": concurrency_table,
    "replicas": replicas_table,
    "pressure": pressure_table,
    "soak": soak_table,
    "soak-faults": soak_faults_table,
    "fuzz": fuzz_table,
    "prefill-cost": prefill_table,
    "prefill-history": prefill_history_table,
    "prefill-history-qwen": lambda: prefill_history_table("prefill_history_qwen25-05b"),
    "decode-step": decode_step_table,
    "cpu-decode": cpu_decode_table,
    "gpu-decode": gpu_decode_table,
    "triton-launch": triton_launch_table,
    "control-plane": control_plane_table,
    "control-plane-decode": control_decode_table,
    "load-balance": load_balance_table,
    "memory-reclaim": reclaim_table,
    "tp-memory": tp_table,
    "fidelity-gemma": lambda: fidelity_table("fidelity/fidelity_gemma.json"),
    "throughput-gemma": lambda: repeats_table([f"serving/{n}.json" for n in GEMMA_THROUGHPUT
                                               if (RESULTS / "serving" / f"{n}.json").exists()]),
    "paper-models": paper_models_table,
    "bench-serving": bench_serving_table,
    "bench-serving-low-rate": lambda: bench_serving_table(name=BENCH_LOW),
    "fidelity-long": lambda: long_table(),  # defined below
    "think-time": lambda: think_time_table(load(THINK_TIME)),
    "think-time-pareto": lambda: think_time_table(load(THINK_TIME_PARETO)),
    "think-time-tlru": lambda: think_time_table(load(THINK_TIME_TLRU)),
    "think-time-qwen": lambda: think_time_table(load(THINK_TIME_QWEN)),
    "think-time-qwen-r025": lambda: think_time_table(load(THINK_TIME_QWEN_R025)),
    "think-time-host": lambda: think_time_table(load(THINK_TIME_HOST)),
    "think-time-host-sessions": lambda: think_time_table(load(THINK_TIME_HOST_SESSIONS)),
    "multiturn-rounds": lambda: rounds_table(load(MULTITURN_ROUNDS)),
    "multiturn-streaming": lambda: rounds_table(load(MULTITURN_STREAMING)),
    "hit-recompute": hit_recompute_table,
}


# ---------------------------------------------------------------- benchmarks/results/README.md

def fidelity_headline(name: str) -> str:
    """Full KV's answers (where the report ran it), then each served row's, its kept share and, where measured,
    the share of full KV its pool held."""
    table_rows = rows_of(name)
    full = [f"full KV {answered(r, False)}" for r in table_rows if r["setting"] == "full"]
    served = [r for r in table_rows if r["setting"].split("[")[0] in ("tangram", "static~position")]
    return "; ".join(full + [
        f"{setting_label(r['setting'])} {r['ratio']:g}: {answered(r, False)} ({pct(r['kept_share'])} kept"
        + (f", {pct(r['held_share'])} held)" if r.get("held_share") is not None else ")") for r in served])


LONG = "fidelity/fidelity_long.json"


def questions_right(row: dict) -> str:
    """k/n questions right by the exact fact, with the 95% interval."""
    return with_interval(row["correct"], row["questions"])


def long_table() -> list[str]:
    """The long tier's rows: questions and conversations right, per kind, the KV each held."""
    rows = rows_of(LONG)
    kinds = list(rows[0]["per_kind"]) if rows else []
    return table(["setting", "ratio", "KV held", "questions right [95% CI]", "conversations all right",
                  *kinds, "degenerate answers", "answers as full KV's"],
                 [[setting_label(r["setting"]), f"{r['ratio']:g}", pct(r.get("held_share")) if r["setting"] != "full"
                   else "100%", questions_right(r), f"{r['conversations_correct']}/{r['n']}",
                   *("{}/{}".format(*r["per_kind"][k]["questions"]) for k in kinds),
                   f"{r['degenerate']}/{r['questions']}", same_as_full(r)] for r in rows])


def same_as_full(row: dict) -> str:
    """Scored answers token for token equal to full KV's ("-" for full KV itself)."""
    return "-" if row.get("same_as_full") is None else "{}/{}".format(*row["same_as_full"])


def long_row() -> list[str]:
    """README row: Tangram against full KV and kvpress (the peers' column) on the long tier."""
    rows = rows_of(LONG)
    full = next(r for r in rows if r["setting"] == "full")
    served = [r for r in rows if r["setting"].startswith("tangram")]
    peers = [r for r in rows if r["setting"].startswith("kvpress")]
    command = (load(LONG).get("stamp") or {}).get("command", "")
    profile = next((a for a in command.split() if a.startswith("configs/")), "")
    scorer = f", {scorer_name(pathlib.Path(profile).stem)}" if profile else ""
    return ([f"Long multi-turn questions right (histories near the context, the model's own replies), "
             f"{SHIPPED.get(full['model'], {}).get('name', full['model'])}{scorer}, {full['n']} conversations, "
             f"scored by the exact fact",
             "; ".join(f"**{questions_right(r)}** at {r['ratio']:g}, {pct(r.get('held_share'))} of full KV held; "
                       f"{same_as_full(r)} answers token for token full KV's" for r in served),
             "; ".join([f"full KV {questions_right(full)}"]
                       + [f"{setting_label(r['setting'])} {questions_right(r)} at {pct(r.get('held_share'))} held"
                          + ("" if r["n"] == full["n"] else f" ({r['n']} conversations: {same_conversations(r, rows)})")
                          for r in peers]),
             link(LONG)])


def same_conversations(peer: dict, rows: list[dict]) -> str:
    """Questions right of the other settings over the conversations a partly run peer answered."""
    def right(r):
        return sum(ok for cid in peer["outcomes"] for ok, _ in r["outcomes"].get(cid, []))

    return ", ".join(f"{'full KV' if r['setting'] == 'full' else setting_label(r['setting'])} {right(r)}"
                     for r in rows if r is not peer and not r["setting"].startswith("kvpress")) + " on them"


def long_headline(name: str = LONG) -> str:
    """Questions right by the exact fact per setting of the long tier, with the KV each held."""
    return "; ".join(f"{setting_label(r['setting'])}{'' if r['setting'] == 'full' else ' ' + format(r['ratio'], 'g')}: "
                     f"{r['correct']}/{r['questions']} questions over {r['n']} conversations"
                     + ("" if r.get("held_share") is None else f" ({pct(r['held_share'])} of full KV held)")
                     for r in rows_of(name))


def concurrency_headline(name: str) -> str:
    if repeated(name):
        row = repeats_row(name, "")
        return f"{row[1].replace('**', '')}; {row[2]}"
    return "; ".join(f"{t['mode']} at {s['max_total_tokens']:,} full-KV tokens: "
                     f"{times(turns_per_s(t) / turns_per_s(s))} stock's turns/s, sessions at once "
                     f"{t['peak_running']} against {s['peak_running']}" for s, t in pairs(name))


def reclaim_headline() -> str:
    gain = [100 * (r["reclaim"]["budget_aware"] - r["reclaim"]["adjacent"]) for r in reclaim_rows() if r["hp"] == 4]
    return (f"budget-aware grouping frees {min(gain):.1f} to {max(gain):.1f} points more of the full cache than "
            f"adjacent grouping over the {len(gain)} profiles with 4 or more KV heads (H_p = 4, P = 16, ratio 0.25)")


def prefill_history_headline(name: str) -> str:
    """ms per new token over stock's (medians) for each Tangram server, over histories > 0 and every load."""
    rows = [r for r in load(f"timing/{name}.json")["summary"] if r["history"] > 0 and r["server"] != "stock"]
    names = sorted({r["server"] for r in rows}, key=lambda n: -float(n.split("@")[-1]) if "@" in n else 0)
    return "time per new token over stock's with a cached history: " + "; ".join(
        f"{n} {spread([r['vs_stock'][0] for r in rows if r['server'] == n])}" for n in names)


def prefill_history_row(name: str) -> list[str]:
    """README row: ms per new token over stock's with nothing decoding beside, per history, for the profile
    and its 1.0 control (medians of the paired ratios)."""
    d = load(f"timing/{name}.json")
    rows = [r for r in d["summary"] if r["decoding"] == 0 and r["server"] != "stock"]
    hist = sorted({r["history"] for r in rows})
    servers = sorted({r["server"] for r in rows}, key=lambda n: float(n.split("@")[-1]))
    at = {(r["server"], r["history"]): r["vs_stock"][0] for r in rows}

    def cell(server):
        return " / ".join(times(at[(server, h)]) for h in hist if h > 0) + f" ({times(at[(server, 0)])} with none)"
    a = d["args"]
    tangram, control = servers[0], servers[-1]
    model = SHIPPED.get(a["model"], {}).get("name", a["model"])
    return [f"Prefill over a cached history, {model}, {scorer_name(pathlib.Path(a['profile']).stem)} "
            f"{a['ratio']:g}, {a['new_tokens']:,} new tokens after " + " / ".join(f"{h:,}" for h in hist if h > 0)
            + f" tokens of history ({a['repeats']} alternating runs)",
            f"**{cell(tangram)}** stock's time per new token",
            f"stock 1.00x; ratio-1.0 control {cell(control)}", link(f"timing/{name}.json")]


def soak_headline() -> str:
    r = load("serving/soak.json")["result"]
    return (f"{r['answered']} answered, {len(r['errors'])} failed, {r['tracebacks']} tracebacks, integrity "
            f"{r['integrity_after_flush']}, {r['pages_used_after_flush']} pages left after flush")


def fuzz_headline() -> str:
    data = load("serving/fuzz.json")
    against, state = data["summary"]["against_profile"], data["end_state"]["profile"]
    counted = ", ".join(f"{against.get(k, 0)} {k}" for k in ("5xx", "traceback", "unhealthy", "unhealthy, as stock",
                                                             "lost"))
    return (f"{data['summary']['cases']} cases; against the profile: {counted}; integrity {state['integrity']}, "
            f"{state['pages_used_after_flush']} pages left after flush")


def soak_faults_headline(name: str) -> str:
    """The soak with faults in a line: load, faults, and the checks after it."""
    d = load(f"serving/{name}.json")
    r, a = d["result"], d["args"]
    s, g = r["summary"], r["replay"]
    after = r["replicas"]
    return (f"{s['sessions']:,} sessions ({s['requests']:,} requests) over {r['load_minutes']:.0f} min, "
            f"{a['clients']} clients, 2 replicas behind sglang-router, one killed and restarted; "
            f"{s['outcomes'].get('answered', 0):,} answered, {s['hung']} hung, {r['retracted']} retracted, "
            f"{r['tracebacks_total']} tracebacks; integrity "
            f"{'ok' if r['integrity_samples_not_ok'] == 0 else 'NOT ok'} in {r['integrity_samples']} samples, "
            f"{sum(x['after_flush'].get('pages_used') or 0 for x in after)} pages left after the flush; "
            f"greedy replay {g['identical']}/{g['turns']} turns identical")


def soak_faults_row(name: str) -> list:
    """The README row of the soak with faults (benchmarks/serving/soak_faults)."""
    d = load(f"serving/{name}.json")
    r = d["result"]
    return [f"Soak with faults: {r['model']}, its shipped profile at {r['ratio']}, aborts, hang-ups, abandoned "
            "sessions, forced retractions, a replica killed mid-run", soak_faults_headline(name), "-",
            link(f"serving/{name}.json")]


def fuzz_row() -> list:
    """The README row of the fuzzed HTTP surface: what counts against the profile, and stock's crashes."""
    data = load("serving/fuzz.json")
    against, cases = data["summary"]["against_profile"], data["cases"]
    paths = len({c["path"] for c in cases})
    shared = against.get("unhealthy, as stock", 0)
    stock_only = sum(not c["stock"]["healthy_after"] and c["profile"]["healthy_after"] for c in cases)
    own = ", ".join(f"{against.get(k, 0)} {label}" for k, label in
                    (("5xx", "5xx where stock did not"), ("traceback", "tracebacks"), ("unhealthy", "crashes"),
                     ("lost", "lost connections")))
    return [f"Fuzzed requests: {len(cases)} cases of SGLang's request schemas on {paths} endpoints, "
            "the shipped FastKVzip 0.4 against stock at the same flags", f"{own}; {shared} crashes stock shares",
            f"stock crashed on {stock_only + shared} cases ({stock_only} the profile refuses)",
            link("serving/fuzz.json")]


def control_plane_headline() -> str:
    rows = load("timing/control_plane.json")["rows"]
    head = (f"exact reservation {spread([r['compress_reclaim'][0] / r['tangram'][0] for r in rows])} faster than "
            f"compress-then-reclaim, up to {max(r['tangram'][0] / r['sglang_paged'][0] for r in rows):.1f}x "
            f"SGLang's token allocator (prefill phase)")
    if "write_slots" not in rows[0]:
        return head
    at = {(r["L"], r["G"]): r["tangram_tables"][0] / r["sglang_paged"][0] for r in rows}
    return head + (f"; with the device tables {times(at[(32, 8)])} at 32 x 8 and {times(at[(80, 8)])} at 80 x 8"
                   if (32, 8) in at and (80, 8) in at else "")


def control_plane_row() -> list[str]:
    """README row: host time of admission and prefill allocation with the device tables (as a GPU serves), over
    SGLang's token allocator, at 32 x 8 and 80 x 8; a decode step with its capacity check over SGLang's."""
    d = load("timing/control_plane.json")
    at = {(r["L"], r["G"]): r["tangram_tables"][0] / r["sglang_paged"][0] for r in d["rows"]}
    a = d["args"]
    dec_data = load("timing/control_plane_decode.json")
    dec = dec_data["rows"]
    step = " / ".join(times(r["host_and_check_median"] / r["sglang_median"]) for r in dec)
    ctx = " / ".join(f"{r['context']:,}" for r in dec)
    batch = dec_data["args"]["batch"]
    return [f"Host control plane: admission and page allocation of a prefill ({a['batch']} requests x "
            f"{a['tokens']:,} tokens, with the device block tables, as a GPU serves), 32 / 80 layers x 8 KV-head groups; "
            f"a decode step with its capacity check (batch {batch}, {ctx} tokens)",
            f"**{times(at[(32, 8)])} / {times(at[(80, 8)])}** SGLang's token allocator's time; decode step {step} SGLang's",
            "SGLang's `PagedTokenToKVPoolAllocator` (the same tokens, uncompressed) 1.00x",
            link("timing/control_plane.json")]


def load_balance_headline() -> str:
    rows = load("modeled/load_balance.json")["rows"]
    return (f"modeled decode latency over the balanced one: uniform splits "
            f"{spread([r['uniform']['latency_vs_balanced'] for r in rows])}, the shipped split map "
            f"{spread([r['aot_beta']['latency_vs_balanced'] for r in rows])} with no planning")


def tp_headline() -> str:
    cost = [r["cost_vs_tp1"] for r in rows_of("modeled/tp_memory.json") if r["ratio"] == 0.25 and r["H_p"] == 1]
    return f"served KV cost over TP=1 at ratio 0.25, H_p = 1: +{100 * min(cost):.1f}% to +{100 * max(cost):.1f}%"


def conversations_recorded(name: str) -> int:
    """Lines of a run store that record a conversation (not a run's pool report, keyed model|setting|ratio|pool)."""
    with open(RESULTS / name) as f:
        return sum(json.loads(line)["key"].split("|")[3] != "pool" for line in f if line.strip())


def line_count(name: str) -> int:
    with open(RESULTS / name, "rb") as f:
        return sum(1 for _ in f)


INDEX = {  # stem -> (what it measures, headline, command when the files do not carry one)
    "fidelity_fastkvzip": ("Multi-turn fidelity of the SmolLM2 FastKVzip profile (64 conversations) against full "
                           "KV, the dynamic method, uniform budgets and kvpress KVzip",
                           lambda: fidelity_headline("fidelity/fidelity_fastkvzip.json"), None),
    "fidelity_kvzip": ("Multi-turn fidelity of the SmolLM2 KVzip profile (reconstruction pass)",
                       lambda: fidelity_headline("fidelity/fidelity_kvzip.json"), None),
    "fidelity_fastkvzip_layer_scope": ("The FastKVzip gate with per-layer budgets (paper Eq. 3) instead of "
                                       "model-wide ones", lambda: fidelity_headline(
                                           "fidelity/fidelity_fastkvzip_layer_scope.json"), None),
    "fidelity": ("Multi-turn fidelity of the SmolLM2 SnapKV profile (64 conversations)",
                 lambda: fidelity_headline("fidelity/fidelity.json"), None),
    "fidelity_quick": ("The quick set (16 conversations): served Tangram against the oracle and the peers",
                       lambda: fidelity_headline("fidelity/fidelity_quick.json"), None),
    "fidelity_position": ("Chunks cut by turn (served) against chunks fixed by position (oracle)",
                          lambda: fidelity_headline("fidelity/fidelity_position.json"), None),
    "fidelity_qwen": ("Multi-turn fidelity of the Qwen2.5-0.5B SnapKV profile (32 conversations)",
                      lambda: fidelity_headline("fidelity/fidelity_qwen.json"), None),
    "fidelity_qwen_fastkvzip": ("Multi-turn fidelity of the Qwen2.5-0.5B FastKVzip profile (32 conversations)",
                                lambda: fidelity_headline("fidelity/fidelity_qwen_fastkvzip.json"), None),
    "fidelity_qwen_kvzip": ("Multi-turn fidelity of the Qwen2.5-0.5B KVzip profile",
                            lambda: fidelity_headline("fidelity/fidelity_qwen_kvzip.json"), None),
    "fidelity_fp8": ("The SmolLM2 FastKVzip profile with FP8 KV pages against float32 pages (64 conversations)",
                     lambda: fidelity_headline("fidelity/fidelity_fp8.json"), None),
    "fidelity_qwen_fp8": ("The Qwen2.5-0.5B FastKVzip profile with FP8 KV pages against float32 pages "
                          "(32 conversations)", lambda: fidelity_headline("fidelity/fidelity_qwen_fp8.json"), None),
    "fidelity_replies": ("SmolLM2 FastKVzip at 0.4 with --tangram-replies compressed (the assistant's long replies "
                         "at the budgets once closed), against full KV (64 conversations)",
                         lambda: fidelity_headline("fidelity/fidelity_replies.json"), None),
    "fidelity_qwen_replies": ("Qwen2.5-0.5B FastKVzip at 0.5 with --tangram-replies compressed, against full KV "
                              "(32 conversations)", lambda: fidelity_headline("fidelity/fidelity_qwen_replies.json"),
                              None),
    "fidelity_gemma": ("Multi-turn fidelity of Gemma-3-270m, a hybrid with window layers, with its FastKVzip "
                       "profile, against full KV and the dynamic method (64 conversations)",
                       lambda: fidelity_headline("fidelity/fidelity_gemma.json"), None),
    "fidelity_gemma_layer": ("Gemma-3-270m with per-layer budgets (paper Eq. 3) instead of model-wide ones",
                             lambda: fidelity_headline("fidelity/fidelity_gemma_layer.json"), None),
    "fidelity_fastkvzip_before_chunk_rule": ("SmolLM2 FastKVzip fidelity on the code before the chunk rule (12-05): "
                                             "every setting and ratio; the current report re-ran the served 0.4 only",
                                             lambda: fidelity_headline("fidelity/fidelity_fastkvzip_before_chunk_rule.json"),
                                             None),
    "fidelity_qwen_fastkvzip_before_chunk_rule": ("Qwen2.5-0.5B FastKVzip fidelity on the code before the chunk rule "
                                                  "(12-05): every setting and ratio; the current report re-ran the "
                                                  "served rows only",
                                                  lambda: fidelity_headline(
                                                      "fidelity/fidelity_qwen_fastkvzip_before_chunk_rule.json"), None),
    "fidelity_before": ("Fidelity answers recorded before two serving fixes (first chunk independent of batching; "
                        "sinks and newest tokens protected), kept for comparison", lambda: "see the file",
                        "the benchmark's first version (its answers stay in fidelity_runs.jsonl)"),
    "fidelity_runs": ("Every answer the fidelity benchmark recorded, keyed by model, setting, ratio, conversation, "
                      "token ids and code version (runs resume from it)",
                      lambda: f"{line_count('fidelity/fidelity_runs.jsonl'):,} recorded answers",
                      "written by `.venv/bin/python -m benchmarks.fidelity.run`, which appends every answer"),
    "fidelity_long": ("The long tier: histories near SmolLM2's context (about 7K tokens), the full-KV model's own "
                      "replies as intermediate turns, several questions per conversation scored by the exact fact",
                      lambda: long_headline(), None),
    "fidelity_long_runs": ("Every answer of the long tier, keyed like fidelity_runs (runs resume from it)",
                           lambda: f"{conversations_recorded('fidelity/fidelity_long_runs.jsonl'):,} recorded conversations",
                           "written by `.venv/bin/python -m benchmarks.fidelity.run --tier long`"),
    "fidelity_long_replies": ("The long tier's pass 1: the full-KV model's greedy replies that fix each script's "
                              "intermediate turns, keyed by model, script digest, SGLang version and reply cap",
                              lambda: f"{len(load('fidelity/fidelity_long_replies.json'))} scripts' replies",
                              "written by `.venv/bin/python -m benchmarks.fidelity.run --tier long` (pass 1)"),
    "behaviour": ("Answers of the served profiles before and after a code change, every conversation of the set "
                  "(the evidence that a restructuring kept behaviour)", lambda: behaviour_headline(), None),
    "fidelity_versions": ("Code versions of fidelity settings shown to give identical answers, with the evidence",
                          lambda: f"{len(load('fidelity/fidelity_versions.json'))} version links",
                          "written by `.venv/bin/python -m benchmarks.fidelity.run --carry-from VERSION`"),
    "concurrency_multiturn_r04": ("Multi-turn throughput (12 sessions x 4 turns) at the same KV bytes, SmolLM2 "
                                  "FastKVzip 0.4, the 8,192-token pool, against four stock configurations, 3 runs",
                                  lambda: concurrency_headline("serving/concurrency_multiturn_r04.json"), None),
    "concurrency_long_replies": ("Multi-turn throughput with long replies (192 tokens, 12 sessions x 3 turns, "
                                 "a 6,144-token pool), SmolLM2 FastKVzip 0.4 with replies whole and compressed "
                                 "(--tangram-replies), stock fcfs / lpm, the 1.0 control, one run (a trial)",
                                 lambda: per_mode_headline("serving/concurrency_long_replies.json"), None),
    "bench_serving": ("SGLang's own bench_serving, multi-turn (generated-shared-prefix, replies fed back), stock "
                      "against Tangram at the same KV bytes, 3 alternating runs",
                      lambda: " ".join(bench_serving_row()[1:3]).replace("**", ""), None),
    "think_time": ("Multi-turn sessions that pause between turns (exponential think time), more open sessions than "
                   "the pool holds: the profile under its default policy (lpm) and fcfs, stock lpm, the 1.0 control",
                   lambda: " ".join(think_time_row(load(THINK_TIME), "")[1:3]).replace("**", ""), None),
    "think_time_pareto": ("The think-time workload with heavy-tailed pauses (a Lomax of shape 1.5, the same mean): "
                          "the profile as launched against stock lpm",
                          lambda: " ".join(think_time_row(load(THINK_TIME_PARETO), "")[1:3]).replace("**", ""), None),
    "think_time_qwen": ("The think-time workload on Qwen2.5-0.5B launched with its FastKVzip profile alone (its "
                        "default ratio, 0.5: the recommended one under the chunk rule), scaled to this CPU "
                        "(6 sessions of 500-token documents, a 2,560-token pool): the profile as launched, stock lpm, "
                        "the 1.0 control",
                        lambda: " ".join(think_time_row(load(THINK_TIME_QWEN), "")[1:3]).replace("**", ""), None),
    "think_time_qwen_r025": ("The same Qwen workload at 0.25 (`--ratio 0.25`; the recommended ratio before the "
                             "chunk rule, 5 answers in 32 under full KV's since)",
                             lambda: " ".join(think_time_row(load(THINK_TIME_QWEN_R025), "")[1:3]).replace("**", ""),
                             None),
    "multiturn_rounds": ("SGLang's bench_multiturn shape (clients x rounds of raw text to `/generate`, one ready "
                         "queue at a Poisson rate, a bound in flight) at the same KV bytes: the profile, stock lpm, "
                         "the 1.0 control, 3 alternating runs",
                         lambda: " ".join(rounds_row(load(MULTITURN_ROUNDS), "")[1:3]).replace("**", ""), None),
    "multiturn_streaming": ("The same rounds with sessions: SGLang's streaming sessions (refused with a profile) "
                            "against SGLang's session radix cache on stock and with the profile, a round left without "
                            "data for 300 s counted a stall, one run each",
                            lambda: streaming_headline(load(MULTITURN_STREAMING)), None),
    "think_time_tlru": ("The think-time workload on stock lpm with SGLang's Tail-Optimized LRU eviction "
                        "(`--radix-eviction-policy tlru`) against plain lpm, a trial",
                        lambda: tlru_headline(load(THINK_TIME_TLRU)), None),
    "think_time_host": ("The think-time workload with the profile's compressed host tier (2x the pool's bytes in host "
                        "memory), against stock lpm given the device and host bytes on the device (the bound on stock "
                        "HiCache, which does not run on a CPU) and stock lpm, with the 1.0 control's host tier",
                        lambda: " ".join(think_time_row(load(THINK_TIME_HOST), "", "tangram-host")[1:3]).replace("**", ""),
                        None),
    "hit_recompute_smollm2_before": ("The same on the code before the chunk rule (da0c2e9): chunks cut where each "
                                     "request's cached prefix ended",
                                     lambda: hit_recompute_headline(load("serving/hit_recompute_smollm2_before.json")),
                                     None),
    "hit_recompute_smollm2": ("A cache hit against a recompute: 16 chat conversations x 4 turns sharing a system "
                              "prompt, served turn by turn from the tree, with the tree flushed before every turn, "
                              "batched, and batched with a forced retraction every third forward: turns answering alike, log-prob gaps, "
                              "history and system prompt reused",
                              lambda: hit_recompute_headline(load("serving/hit_recompute_smollm2.json")), None),
    "hit_recompute_qwen": ("The same with Qwen2.5-0.5B at its shipped FastKVzip 0.25",
                           lambda: hit_recompute_headline(load("serving/hit_recompute_qwen.json")), None),
    "think_time_host_sessions": ("The host tier's workload with session ids and SGLang's session radix cache on both "
                                 "sides: the profile with its host tier against stock lpm given the host's bytes",
                                 lambda: " ".join(think_time_row(load(THINK_TIME_HOST_SESSIONS), "",
                                                                 "tangram-host-sessions")[1:3]).replace("**", ""),
                                 None),
    "bench_serving_low_rate": ("The same bench_serving workload at a tenth of the rate: 0.05 conversations started "
                               "per second, 3 alternating runs",
                               lambda: " ".join(bench_serving_row(BENCH_LOW)[1:3]).replace("**", ""), None),
    "concurrency_multiturn_qwen": ("The same workload on Qwen2.5-0.5B, FastKVzip 0.25, three pool sizes",
                                   lambda: concurrency_headline("serving/concurrency_multiturn_qwen.json"), None),
    "concurrency_multiturn": ("The same workload at SmolLM2 FastKVzip 0.5, before waiting turns refreshed their "
                              "histories in the tree",
                              lambda: concurrency_headline("serving/concurrency_multiturn.json"),
                              None),
    "concurrency_fp8": ("Multi-turn throughput with FP8 KV pages at the same bytes (16 sessions x 4 turns, 3 runs), "
                        "SmolLM2, FastKVzip 0.4",
                        lambda: "; ".join(f"{r[0]} {r[1]}: {r[5]} plain stock's turns/s, {r[6]} the best stock's, {r[7]} sessions"
                                          for r in fp8_throughput_rows() if r[3]), None),
    "concurrency_gemma": ("Multi-turn throughput of Gemma-3-270m (8 sessions x 3 turns of 800-token prompts, a "
                          "2,048-token pool, 3 runs), FastKVzip 0.25, on the code before window layers held only "
                          "their window (kept for comparison)",
                          lambda: concurrency_headline("serving/concurrency_gemma.json"), None),
    "concurrency_gemma_windows": ("The same Gemma-3-270m workload once window layers hold only their "
                                  "window (admission still reserves them dense)",
                                  lambda: concurrency_headline("serving/concurrency_gemma_windows.json"), None),
    "concurrency_gemma_long": ("Gemma-3-270m with histories of 2.5-3.5 windows (6 sessions x 3 turns of 1,300-token "
                               "prompts), a 3,072-token pool, FastKVzip 0.5 and 0.25, against stock fcfs and refresh, "
                               "3 runs", lambda: concurrency_headline("serving/concurrency_gemma_long.json"), None),
    "concurrency_gemma_long_6k": ("The same Gemma-3-270m long workload in a 6,144-token pool, FastKVzip 0.5",
                                  lambda: concurrency_headline("serving/concurrency_gemma_long_6k.json"), None),
    "concurrency": ("Two-turn sessions started together: peak sessions decoding together at the same KV bytes, "
                    "SnapKV 0.25 and 0.5", lambda: concurrency_headline("serving/concurrency.json"), None),
    "concurrency_fastkvzip": ("The two-turn workload with the FastKVzip gate at 0.5 (torch-matmul prefill of "
                              "the time)", lambda: concurrency_headline("serving/concurrency_fastkvzip.json"), None),
    "replicas": ("Two replicas behind sglang-router (cache-aware, round-robin) against one server of the same "
                 "total KV bytes", lambda: "; ".join(
                     f"{r['setting'].replace('_', '-')}: {r['turns_per_s']:.2f} turns/s, turn-2+ reuse "
                     f"{pct(r['turn2_reuse'])}" for r in load("serving/replicas.json")["rows"]), None),
    "pressure": ("24 mixed requests, 12 at a time, on a 1,024-token pool: stock against two profiles at the same "
                 "KV bytes", lambda: "; ".join(
                     f"{pressure_label(r['setting'])}: {r['completed']} completed, {r['capped']} capped, "
                     f"{r['refused']} refused, {r['failed']} failed"
                     for r in load("serving/pressure.json")["rows"]), None),
    "soak": ("200 multi-turn sessions with aborts, hang-ups and retractions on a small pool", soak_headline, None),
    "soak_smollm2": ("The soak with faults: SmolLM2's shipped FastKVzip profile on two replicas behind sglang-router "
                     "for an hour, with aborts, hang-ups, abandoned sessions, bursts that force retraction and a "
                     "replica killed and restarted; integrity, pages, memory and a greedy replay after it",
                     lambda: soak_faults_headline("soak_smollm2"), None),
    "fuzz": ("SGLang's request schemas fuzzed (hypothesis) against the shipped FastKVzip profile's server and "
             "stock's at the same flags: /generate, OpenAI completions and chat, sessions", fuzz_headline, None),
    "prefill_history_smollm2": ("Prefill over a cached history (0 / 2,048 / 6,000 tokens, 0 or 4 requests decoding "
                                "beside), SmolLM2, FastKVzip 0.4 and a 1.0 control against stock, 3 alternating runs",
                                lambda: prefill_history_headline("prefill_history_smollm2"), None),
    "prefill_history_qwen25-05b": ("Prefill over a cached history (0 / 2,048 / 8,192 tokens, 0 or 4 decoding beside), "
                                   "Qwen2.5-0.5B, FastKVzip 0.25 and a 1.0 control against stock, 3 alternating runs",
                                   lambda: prefill_history_headline("prefill_history_qwen25-05b"), None),
    "prefill_cost": ("Served prefill time per 2,048-token prompt for each scorer against stock SGLang",
                     lambda: ", ".join(f"{server_label(r, 0.5)} {times(r['vs_stock'])}"
                                       for r in load("timing/prefill_cost.json")["rows"][1:]), None),
    "decode_step": ("Served decode step of a batch of 8 x 2,048 cached tokens against stock SGLang",
                    lambda: ", ".join(f"{server_label(r, None)} {times(r['vs_stock'])}"
                                      for r in load("timing/decode_step.json")["rows"][1:]), None),
    "cpu_decode": ("Decode attention alone: the torch data plane against SGLang's torch_native backend",
                   lambda: "SnapKV 0.25 attends " + ", ".join(
                       f"{times(r['torch_native_ms'] / r['tangram_tile_ms'])} faster at {r['config']}"
                       for r in load("timing/cpu_decode.json")["rows"]
                       if (r["method"], r["ratio"]) == ("snapkv", 0.25)),
                   None),
    "gpu_decode_nvidia-h100-80gb-hbm3": ("Decode attention kernels on an NVIDIA H100, window layers included: checks against "
                                         "the torch reference, then one step of all layers with uniform splits and with "
                                         "the split map",
                                         lambda: "split map at B = 16: " + ", ".join(
                                             f"{times(r['triton_uniform_ms'] / r['triton_aot_ms'])} faster "
                                             f"({r['workload'].split('-')[0]}, {r['kv']} pages)"
                                             for r in load(GPU_DECODE)["rows"] if r["batch"] == 16),
                                         None),
    "gpu_decode_nvidia-h200": ("Decode attention kernels on an NVIDIA H200 (earlier kernels, no window layers): checks against the torch reference, then one "
                               "step of all layers with uniform splits and with the split map",
                               lambda: "split map at B = 16: " + ", ".join(
                                   f"{times(r['triton_uniform_ms'] / r['triton_aot_ms'])} faster "
                                   f"({r['workload'].split('-')[0]}, {r['kv']} pages)"
                                   for r in load("timing/gpu_decode_nvidia-h200.json")["rows"] if r["batch"] == 16),
                               None),
    "gpu_served_nvidia-h200": ("SGLang with a profile served on an NVIDIA H200 (the GPU kit, stock on its Triton backend): "
                               "tiny random Llama / Qwen3 / Gemma 3, greedy tokens against stock, HF, eager and the "
                               "dense oracle", lambda: gpu_served_headline("serving/gpu_served_nvidia-h200.json"), None),
    "triton_tune_nvidia-h200": ("Launch options of the Triton decode kernel on an NVIDIA H200 (BLOCK_N, warps, stages)",
                                lambda: "served launch / best launch: " + ", ".join(
                                    r[-1] for r in triton_launch_rows()), None),
    "paper_models": ("KV bytes per history token of the paper's models under the authors' retention data, "
                     "reserved and held, against stock", lambda: "; ".join(
                         f"{r['model']} ({r['scorer']}) {r['ratio']:g}: {times(r['bounded'] / r['stock'])} stock's bytes"
                         for r in rows_of("modeled/paper_models.json") if r["ratio"] == 0.25), None),
    "control_plane": ("Host time of admission and allocation per request as layers x groups grow",
                      control_plane_headline, None),
    "control_plane_decode": ("Host time per decode step (batch 64, 32 layers x 4 groups) against SGLang's",
                             lambda: ", ".join(f"{r['context']:,} context: "
                                               f"{times(r['host_and_check_median'] / r['sglang_median'])} SGLang"
                                               for r in load("timing/control_plane_decode.json")["rows"]), None),
    "load_balance": ("Decode load balance: uniform splits, per-step planning and the split map (modeled, "
                     "132 CTAs)", load_balance_headline, None),
    "memory_reclaim": ("KV memory freed by ragged paging for each grouping, on SmolLM2 and the authors' large-model "
                       "profiles", reclaim_headline, None),
    "tp_memory": ("KV slots per token summed over tensor-parallel ranks, as a share of full KV", tp_headline,
                  None),
}


KINDS = {  # results folder -> what its benchmarks measure (the package of the same name)
    "fidelity": "Multi-turn answers against full KV, the dense oracle and kvpress (`benchmarks/fidelity/`)",
    "serving": "Real servers under load: throughput, replicas, memory pressure, soak (`benchmarks/serving/`)",
    "timing": "What each piece costs in time: prefill, decode step, decode attention, host control plane "
              "(`benchmarks/timing/`)",
    "modeled": "Computed from profiles, no timing: memory reclaimed, tensor-parallel memory, decode load balance "
               "(`benchmarks/modeled/`)",
}
# each benchmark's module by its file name in the flat benchmarks/ folder of older results' commands
MOVED = {"fidelity": "fidelity.run", "concurrency": "serving.concurrency", "replicas": "serving.replicas",
         "pressure": "serving.pressure", "soak": "serving.soak", "prefill_cost": "timing.prefill_cost",
         "decode_step": "timing.decode_step", "cpu_decode": "timing.cpu_decode", "gpu_decode": "timing.gpu_decode",
         "control_plane": "timing.control_plane", "memory_reclaim": "modeled.memory_reclaim",
         "tp_memory": "modeled.tp_memory", "load_balance": "modeled.load_balance"}


def clean_command(cmd: str, kind: str) -> str:
    """A recorded command as it runs today: repository-relative paths, the project's python, a script of
    the flat benchmarks/ folder as its module (``-m benchmarks.KIND.NAME``), a results path in its kind's
    folder."""
    words, skip = [], False
    for w in cmd.split():
        if skip or w == "--out-dir":  # a device run's output folder: the default path locally
            skip = not skip
            continue
        for root in ("benchmarks/", "configs/"):
            if w.startswith("/") and root in w:
                w = w[w.index(root):]
        script = w[len("benchmarks/"):-len(".py")] if w.startswith("benchmarks/") and w.endswith(".py") else ""
        if script in MOVED:
            words += ["-m", f"benchmarks.{MOVED[script]}"]
            continue
        name = w[len("benchmarks/results/"):] if w.startswith("benchmarks/results/") else ""
        if name and "/" not in name:
            w = f"benchmarks/results/{kind}/{name}"
        words.append(".venv/bin/python" if w.rsplit("/", 1)[-1] in ("python", "python3") else w)
    if "-m" in words:
        i = words.index("-m")
        if i == 0 or not words[i - 1].endswith("python"):
            words.insert(i, ".venv/bin/python")
    return " ".join(words)


def behaviour_headline() -> str:
    """How many comparisons the file holds, how many kept every answer, and the newest per model."""
    rows = load("fidelity/behaviour.json")["rows"]
    kept = sum(r["identical"] == r["conversations"] for r in rows)
    newest = {r["model"]: r for r in rows}     # rows are appended: the last of each model is its newest
    return (f"{len(rows)} comparisons, {kept} with every answer identical; newest: " +
            "; ".join(f"{m} {r['setting']} {r['old']} -> {r['new']}, "
                      + ", ".join(f"{q['ratio']:g}: {q['identical']}/{q['conversations']}" for q in rows
                                  if (q['model'], q['old'], q['new']) == (m, r['old'], r['new']))
                      for m, r in newest.items()))


def command_of(kind: str, files: list[str]) -> str | None:
    """The command that wrote a stem's files: the stamp's, else the command an older file recorded."""
    for f in files:
        if f.endswith(".json") and f != "fidelity_versions.json":
            d = load(f"{kind}/{f}")
            if not isinstance(d, dict):
                continue
            recorded = (d.get("stamp") or {}).get("command") or d.get("command") or d.get("meta", {}).get("command")
            if recorded:
                return clean_command(recorded, kind)
    for f in files:
        if f.endswith(".md"):
            parts = (RESULTS / kind / f).read_text().split("`")
            for span in parts[1::2]:
                if "-m benchmarks." in span or (".py" in span and "benchmarks/" in span):
                    return clean_command(span, kind)
    return None


def results_index() -> str:
    stray = [p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md"]
    if stray:
        raise SystemExit(f"benchmarks/results/{stray[0]}: results files belong in a kind's folder {sorted(KINDS)}")
    lines = ["# Results files", "",
             "Generated by `benchmarks/common/report_tables.py` from the files in these folders; do not edit by "
             "hand. Timings come from a CPU (2 shared cores, float32) unless a file names a device. Each `.md` is "
             "written by the benchmark beside its `.json`; files written since stamps began carry the commit, "
             "machine and command that made them (a `\"stamp\"` object in the JSON, the line under the Markdown's "
             "title). Commands are given as they run today. Explanations: [docs/results.md](../../docs/results.md).",
             ""]
    for kind, about in KINDS.items():
        folder = RESULTS / kind
        stems: dict[str, list[str]] = {}
        for p in sorted(folder.iterdir()) if folder.is_dir() else []:
            if p.is_file():
                stems.setdefault(p.name.split(".")[0], []).append(p.name)
        lines += [f"## {kind}", "", about + ".", ""]
        for stem, files in stems.items():
            what, headline, fallback = INDEX.get(stem, ("not described in benchmarks/common/report_tables.py",
                                                        lambda: "-", None))
            command = command_of(kind, files)
            lines += [f"### {stem}", "", "Files: " + ", ".join(f"[{f}]({kind}/{f})" for f in files), "",
                      f"- Measures: {what}.",
                      f"- Command: `{command}`" if command else f"- Command: {fallback or '-'}.",
                      f"- Headline: {headline()}.", ""]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- writing and checking

def fill(text: str, begin: str, end: str, body: list[str], where: str) -> str:
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"{where}: needs exactly one {begin} ... {end}")
    head, rest = text.split(begin)
    tail = rest.split(end)[1]
    return head + begin + "\n" + "\n".join(body) + "\n" + end + tail


def doc_names(text: str) -> list[str]:
    return [part.split(":begin -->")[0] for part in text.split("<!-- results:")[1:] if ":begin -->" in
            part.split("\n")[0]]


def expected() -> dict[pathlib.Path, str]:
    readme = REPO / "README.md"
    out = {readme: fill(readme.read_text(), "<!-- results:begin -->", "<!-- results:end -->", key_results(),
                        "README.md"),
           RESULTS / "README.md": results_index()}
    doc = REPO / "docs" / "results.md"
    if doc.exists():
        text = doc.read_text()
        unknown = [n for n in doc_names(text) if n not in DOC_BLOCKS]
        if unknown:
            raise SystemExit(f"docs/results.md: unknown table(s) {unknown}; known: {sorted(DOC_BLOCKS)}")
        for name in doc_names(text):
            text = fill(text, f"<!-- results:{name}:begin -->", f"<!-- results:{name}:end -->",
                        DOC_BLOCKS[name](), "docs/results.md")
        out[doc] = text
    return out


def diff(path: pathlib.Path, old: str, new: str) -> str:
    """One hunk: the lines between the common head and the common tail."""
    a, b = old.splitlines(), new.splitlines()
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
        j += 1
    lines = [f"--- {path.relative_to(REPO)} (on disk)", f"+++ {path.relative_to(REPO)} (generated)",
             f"@@ line {i + 1} @@"]
    return "\n".join(lines + ["-" + x for x in a[i:len(a) - j]] + ["+" + x for x in b[i:len(b) - j]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff if a file is stale")
    args = ap.parse_args(argv)
    stale = 0
    for path, text in expected().items():
        old = path.read_text() if path.exists() else ""
        if old == text:
            continue
        if args.check:
            print(diff(path, old, text))
            stale += 1
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print(f"{stale} file(s) differ from what benchmarks/common/report_tables.py writes: run "
              ".venv/bin/python -m benchmarks.common.report_tables and commit the result")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
