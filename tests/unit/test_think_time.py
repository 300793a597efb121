"""The think-time benchmark's figures and pauses (benchmarks/serving/think_time.py), without a server."""

import random
import statistics

from benchmarks.serving.think_time import _think, figures, fmt_md


def _run(server, cached):
    """Two sessions of three turns; turn k of session s reads cached[s][k-2] of its 1,000-token prompt."""
    sessions = [dict(session=s, right=s == 0, done_at=10.0,
                     turns=[dict(turn=1, prompt_tokens=1000, cached_tokens=0, ttft_s=1.0 + s, seconds=2.0)]
                     + [dict(turn=k, prompt_tokens=1000, cached_tokens=c, ttft_s=0.5, seconds=1.0)
                        for k, c in zip((2, 3), cached[s])]) for s in range(2)]
    return dict(server=server, wall_s=12.0, sessions=sessions, errors=[], repeat=0)


def test_figures_count_reuse_per_turn_and_prefill():
    f = figures(_run("tangram", [[1000, 500], [0, 500]]))
    assert f["right"] == 1 and f["turns"] == 6 and f["turns_per_s"] == 0.5
    assert f["reuse_per_turn"] == {2: 0.5, 3: 0.5} and f["reuse"] == 0.5
    assert f["prefilled"] == 6000 - 2000 and f["ttft_p50"] == 0.5 and f["ttft_p99"] == 2.0


def test_report_divides_by_the_fastest_stock():
    args = dict(sessions=2, arrival_window=1.0, turns=3, doc_tokens=100, think="exponential", think_mean=1.0,
                max_total_tokens=1024, profile="p.yaml", ratio=0.4, repeats=1)
    res = dict(args=args, model_path="/m/SmolLM2", runs=[_run("stock-lpm", [[0, 0], [0, 0]]),
                                                         _run("tangram", [[1000, 1000], [1000, 1000]])])
    res["runs"][0]["wall_s"] = 24.0
    text = "\n".join(fmt_md(res))
    assert "(stock-lpm)" in text and "| tangram | 1 |" in text and "2.00x" in text and "100.0%" in text


def test_think_times_have_the_asked_mean():
    rng = random.Random(0)
    for kind in ("exponential", "pareto"):
        draws = [_think(rng, kind, 8.0) for _ in range(40000)]
        assert min(draws) >= 0 and abs(statistics.mean(draws) - 8.0) < 1.0, kind
    assert _think(rng, "pareto", 0.0) == 0.0


def test_host_tier_rows_name_the_host_server_its_control_and_bytes_per_token():
    from benchmarks.common.report_tables import think_time_row
    from benchmarks.serving.think_time import BYTES_SCALE, SERVERS

    args = dict(sessions=2, arrival_window=1.0, turns=3, doc_tokens=100, think="exponential", think_mean=1.0,
                max_total_tokens=1024, profile="configs/p.yaml", ratio=0.4, repeats=1)
    runs = [_run("stock-lpm-host-bytes", [[500, 500], [500, 500]]), _run("tangram-host", [[1000, 1000], [1000, 1000]]),
            _run("tangram-1.0-host", [[0, 0], [0, 0]])]
    runs[0]["wall_s"], runs[2]["wall_s"] = 18.0, 24.0
    runs[1]["pool_info"] = dict(host_tokens=1000, host_pages_used=25, host_pages_total=100, page_bytes=4096,
                                full_kv_bytes_for_tokens_held=230_400, tokens_held=10)
    res = dict(args=args, model_path="/m/SmolLM2", runs=runs)
    row = think_time_row(res, "link", "tangram-host")
    assert "--tangram-host-ratio 2" in row[0] and row[1].startswith("**1.50x**")
    assert "(lpm-host-bytes)" in row[2] and "ratio-1.0 control 0.75x" in row[2]
    text = "\n".join(fmt_md(res))
    assert "1,000 tokens in 25 of 100 pages, 102 B a token against full KV's 23,040 (225.00x" in text
    assert BYTES_SCALE["stock-lpm-host-bytes"] == 3 and "--tangram-host-ratio" in SERVERS["tangram-host"][1]


def test_stock_servers_pass_sglangs_parser_and_tlru_is_not_plain_lru():
    """Each stock server's options parse through SGLang's own CLI (lpm where named); T-LRU's config names a
    threshold above its next-prompt estimate (else SGLang refuses it at launch: no token is ever tail-safe)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from benchmarks.serving.think_time import SERVERS

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    stock = {name: extra for name, (kind, extra, _) in SERVERS.items() if kind is None}
    assert "stock-lpm-tlru" in stock
    for name, extra in stock.items():
        args = parser.parse_args(["--model-path", "m", *extra])
        assert (args.schedule_policy == "lpm") == name.startswith("stock-lpm"), name   # else SGLang's default
    tlru = parser.parse_args(["--model-path", "m", *stock["stock-lpm-tlru"]])
    assert tlru.radix_eviction_policy == "tlru"
    assert tlru.radix_eviction_policy_config["threshold"] > tlru.radix_eviction_policy_config["next_prompt_estimate"]
