"""The bench_serving wrapper: the command it gives SGLang's tool, and its medians and paired ratios."""

import math

from benchmarks.serving.bench_serving import METRICS, bench_command, parse, settings, summarize


def _row(setting, repeat, rps, ttft=100.0, rate=1.0):
    row = {k: 1.0 for k in METRICS}
    row.update(setting=setting, repeat=repeat, rate=rate, request_throughput=rps, p99_ttft_ms=ttft,
               cache_hit_rate_pct=50.0, request_goodput=rps, pool_bytes=None)
    return row


def test_command_runs_the_multi_turn_mode_with_cache_report_and_goodput():
    args = parse(["--turns", "4", "--ttft-slo-ms", "500"])
    cmd = bench_command(args, "/m", "http://x:1", math.inf, "/tmp/o.jsonl")
    assert cmd[1:3] == ["-m", "sglang.bench_serving"]
    flags = {a: b for a, b in zip(cmd, cmd[1:]) if a.startswith("--") and not b.startswith("--")}
    assert flags["--backend"] == "sglang-oai-chat" and flags["--dataset-name"] == "generated-shared-prefix"
    assert flags["--gsp-num-turns"] == "4" and flags["--request-rate"] == "inf" and flags["--goodput"] == "ttft:500"
    assert "--cache-report" in cmd
    assert bench_command(args, "/m", "u", 0.5, "o")[cmd.index("--request-rate") + 1] == "0.5"


def test_settings_are_each_stock_policy_then_each_ratio():
    args = parse(["--stock-policies", "fcfs", "lpm", "refresh", "--ratios", "0.4", "0.25"])
    names = [(n, extra) for n, extra, _ in settings(args)]
    assert names == [("stock-fcfs", []), ("stock-lpm", ["--schedule-policy", "lpm"]), ("stock-refresh", []),
                     ("tangram@0.4", ["--tangram-ratio", "0.4"]), ("tangram@0.25", ["--tangram-ratio", "0.25"])]


def test_summary_medians_and_ratios_pair_runs_of_the_same_repeat():
    rows = [_row("stock", 0, 1.0, 100), _row("stock", 1, 2.0, 300), _row("stock", 2, 4.0, 200),
            _row("t", 0, 2.0), _row("t", 1, 2.0), _row("t", 2, 6.0)]
    stock, t = summarize(rows, ["stock", "t"], [1.0], "stock")
    assert stock["request_throughput"] == [2.0, 1.0, 4.0] and stock["p99_ttft_ms"] == [200, 100, 300]
    assert stock["vs_baseline"] == [1.0, 1.0, 1.0]
    assert t["vs_baseline"] == [1.5, 1.0, 2.0]         # 2/1, 2/2, 6/4: paired by repeat, not by rank
    assert t["runs"] == 3 and summarize(rows, ["stock", "t"], [0.5], "stock") == []
