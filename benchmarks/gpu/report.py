"""The GPU run's Markdown report, from its JSON result (benchmarks.gpu.run writes both)."""

from __future__ import annotations

from benchmarks.common.stamp import markdown_line

CPU_NOTE = ("A rehearsal on the CPU: stock SGLang on its torch_native backend, the profile on the torch data "
            "plane, float32, no graphs (the graphs-against-eager pairs compare two eager servers).")
NOTE = ("Stock SGLang runs its own Triton attention backend and the pytorch sampler; SGLang with a profile runs "
        "the Tangram Triton data plane; both use the project's torch stand-in for sgl_kernel (norms, "
        "activations; tangram_sglang.gpu_compat) since the lent GPU has neither sgl_kernel nor FlashInfer. "
        "A fair comparison of the KV and attention path, not of FlashInfer or FA3.")


def render(result: dict) -> str:
    lines = ["# SGLang with a profile on a GPU", "", markdown_line(result["stamp"]), "",
             f"Environment: {_env(result.get('environment', {}))}", "", NOTE if result.get("cuda") else CPU_NOTE, ""]
    if result.get("notes"):
        lines += [f"- {note}" for note in result["notes"]] + [""]
    if "correctness" in result:
        lines += _correctness(result["correctness"])
    for stage in ("speed", "fp8"):
        if stage in result:
            lines += _speed(stage, result[stage])
    if result.get("wall_s") is not None:
        lines.append(f"Whole run: {result['wall_s']} s.")
    return "\n".join(lines) + "\n"


def _env(env: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in env.items() if v)


def _failures(stage: dict) -> list[str]:
    out = []
    if stage.get("error"):
        out += ["Stage failed:", "", "```", stage["error"].strip()[-1500:], "```", ""]
    if stage.get("skipped") and isinstance(stage["skipped"], str):
        out += [f"Skipped: {stage['skipped']}.", ""]
    for name, why in (stage.get("failed_to_start") or {}).items():
        out += [f"- `{name}` did not start: `{why.strip().splitlines()[-1][:300] if why.strip() else why}`"]
    return out + ([""] if stage.get("failed_to_start") else [])


def _agree(a: dict | None) -> str:
    if not a:
        return "-"
    if "turn1" in a:
        return " / ".join(_agree(a[t]) for t in ("turn1", "turn2"))
    return f"{a['equal']}/{a['of']}"


def _correctness(c: dict) -> list[str]:
    lines = ["## Correctness (tiny random models, float32, greedy, 16 tokens, 7 prompts)", ""] + _failures(c)
    if not c.get("archs"):
        return lines
    cols = ["t1.0 vs stock", "t1.0 eager vs stock", "t1.0 graphs vs eager", "t0.4 graphs vs eager",
            "stock vs HF (CPU)", "t1.0 vs HF (CPU)", "t0.4 vs oracle (CPU)"]
    lines += ["| model | " + " | ".join(cols) + " | turn-2 tokens from the tree | integrity | errors |",
              "|---" * (len(cols) + 4) + "|"]
    for row in c["archs"]:
        cached = ", ".join(f"{k.split('-', 1)[1]} {v}" for k, v in row.get("cached_turn2", {}).items())
        bad = {k: v for k, v in row.get("integrity", {}).items() if any(x not in (None, "ok") for x in v)}
        integrity = "ok" if not bad else "; ".join(f"{k}: {v}" for k, v in bad.items())
        errors = "; ".join(f"{k}: {v[:160]}" for k, v in row.get("errors", {}).items()) or "-"
        lines.append(f"| {row['arch']} | " + " | ".join(_agree(row.get(k)) for k in cols)
                     + f" | {cached} (of {row.get('turn2_prompt_tokens')}) | {integrity} | {errors} |")
    return lines + ["", "Pairs: sequences equal in turn 1 / turn 2. Ready after (s): "
                    + ", ".join(f"{k} {v}" for k, v in c.get("ready_s", {}).items()), ""]


def _speed(stage: str, s: dict) -> list[str]:
    title = "Served speed" if stage == "speed" else "FP8 KV at the same bytes"
    lines = [f"## {title}", ""] + _failures(s)
    sizes = s.get("sizes", {})
    if sizes:
        lines += [f"Model {sizes.get('model')}, profile {sizes.get('reference') or 'tiny compressing'} at "
                  f"{sizes.get('ratio')} (chunk {sizes.get('chunk')}), pool {sizes.get('pool')} tokens' bytes "
                  f"for every server; {sizes.get('reps')} alternating repetitions, {sizes.get('steps')} decode steps.", ""]
    for row in s.get("decode", []):
        lines += [f"Decode step, batch {row['batch']} x {row['context']} tokens of history (ms):", ""]
        lines += _table(row["step_ms"])
    if s.get("prefill_s"):
        lines += [f"Prefill of a fresh {sizes.get('prefill')}-token prompt (s):", ""] + _table(s["prefill_s"])
    if s.get("bench_serving"):
        lines += _bench(s["bench_serving"])
    for why in s.get("skipped", []) if isinstance(s.get("skipped"), list) else []:
        lines.append(f"- skipped: {why}")
    if s.get("pools"):
        lines += ["", "Pools: " + "; ".join(f"{n}: {_pool(p)}" for n, p in s["pools"].items()), ""]
    return lines


def _bench(m: dict) -> list[str]:
    w = m["workload"]
    lines = [f"Multi-turn sglang.bench_serving (generated-shared-prefix): {w['groups']} system prompts of "
             f"{w['system_len']} tokens x {w['per_group']} conversations x {w['turns']} turns of {w['question_len']}-token "
             f"questions, {w['output_len']}-token replies fed back, at most {w['max_concurrency']} in flight; each "
             "server alone from an empty tree, one run:", "",
             "| server | requests/s | vs stock | TTFT median / p99 (ms) | TPOT median / p99 (ms) | cache hits | "
             "completed | wall (s) |", "|---|---|---|---|---|---|---|---|"]
    base = next((v for k, v in m.items() if k.startswith("stock") and isinstance(v, dict)), None)
    for name, r in m.items():
        if name == "workload":
            continue
        if r.get("error"):
            lines.append(f"| {name} | failed: `{r['error'].strip().splitlines()[-1][:200]}` |||||||")
            continue
        rel = (f"{r['request_throughput'] / base['request_throughput']:.2f}x"
               if base and base.get("request_throughput") else "-")
        lines.append(f"| {name} | {r['request_throughput']:.3f} | {rel} | {_ms(r, 'ttft')} | {_ms(r, 'tpot')} "
                     f"| {r.get('cache_hit_rate_pct')}% | {r.get('completed')} | {r.get('wall_s')} |")
    return lines + [""]


def _ms(r: dict, key: str) -> str:
    med, p99 = r.get(f"median_{key}_ms"), r.get(f"p99_{key}_ms")
    return f"{med:.0f} / {p99:.0f}" if med is not None and p99 is not None else "-"


def _table(rows: dict) -> list[str]:
    base = next((k for k in rows if not any(x.startswith("vs_") for x in rows[k])), None)
    out = [f"| server | median | runs | vs {base} (median, range) |", "|---|---|---|---|"]
    for name, r in rows.items():
        vs = r.get(f"vs_{base}")
        rel = f"{vs['median']:.2f}x ({vs['range'][0]:.2f}-{vs['range'][1]:.2f}x)" if vs else "1.00x"
        out.append(f"| {name} | {r['median']:.4g} | {', '.join(f'{x:.4g}' for x in r['runs'])} | {rel} |")
    return out + [""]


def _pool(p: dict) -> str:
    if p.get("page_bytes"):
        gib = p["page_bytes"] * p["pages_total"] / 2**30
        return (f"{p['pages_total']} pages, {gib:.2f} GiB, {p.get('kv_dtype')}, saved {p.get('saved_vs_full_kv')}, "
                f"integrity {p.get('integrity')}")
    return f"{p.get('max_total_num_tokens')} tokens"


def main(argv: list[str] | None = None) -> int:
    """Render a GPU run's JSON (e.g. benchmarks/results/serving/gpu_served_*.json) to the Markdown beside it."""
    import argparse
    import json
    import pathlib

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("json", nargs="+")
    for path in map(pathlib.Path, ap.parse_args(argv).json):
        path.with_suffix(".md").write_text(render(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
