"""The multi-turn throughput benchmark's summary: Tangram against plain stock and against the best stock."""

from benchmarks.serving.concurrency import STOCK_VARIANTS, is_plain_stock, summary


def _mode(name, ratio, variant, wall, repeat=0, kv="auto"):
    turns = [{"turn1": {}, "turn2": {}}] * 4                        # 8 turns
    return dict(mode=name, ratio=ratio, stock_variant=variant, kv_cache_dtype=kv, bytes_of_tokens=1024,
                repeat=repeat, wall_s=wall, peak_running=2, sessions=turns)


def test_vs_stock_is_plain_fcfs_and_vs_best_is_the_fastest_stock_variant():
    modes = [_mode("stock", None, "fcfs", 8.0), _mode("stock-refresh", None, "refresh", 4.0),
             _mode("stock-lpm", None, "lpm", 5.0), _mode("tangram@0.4", 0.4, None, 2.0)]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in summary(modes)[2:]}
    assert rows["tangram@0.4"][4] == "4.000 [4.000, 4.000]"        # 4.0 turns/s against stock's 1.0
    assert rows["tangram@0.4"][5] == "2.000 [2.000, 2.000]"        # against stock with the refresh, 2.0
    assert rows["stock-refresh"][5] == "1.000 [1.000, 1.000]"
    assert is_plain_stock(modes[0]) and not is_plain_stock(modes[1]) and not is_plain_stock(modes[3])


def test_stock_variants_launch_as_a_user_would():
    assert STOCK_VARIANTS["lpm"] == (["--schedule-policy", "lpm"], {})
    assert STOCK_VARIANTS["refresh"] == ([], {"TANGRAM_REFRESH_WAITING": "1"})
    assert STOCK_VARIANTS["fcfs"] == ([], {})


def test_readme_row_keeps_the_ratio_1_control_out_of_tangrams_figure(monkeypatch):
    from benchmarks.common import report_tables

    def mode(name, ratio, wall, control=False, variant=None):
        m = _mode(name, ratio, variant, wall)
        m.update(control=control, max_total_tokens=1024,
                 sessions=[{"turn1": {"cached_tokens": 0, "prompt_tokens": 10},
                            "turn2": {"cached_tokens": 5 if ratio else 1, "prompt_tokens": 10}}] * 4)
        return m

    modes = [mode("stock", None, 8.0, variant="fcfs"), mode("stock-lpm", None, 4.0, variant="lpm"),
             mode("tangram-fastkvzip@0.4", 0.4, 2.0), mode("tangram-1.0", 1.0, 8.0, control=True)]
    data = dict(modes=modes, args=dict(profile="configs/smollm2-fastkvzip.yaml", stock_variants=["fcfs", "lpm"],
                                       sessions=4, turns=2, prompt_tokens=1000))
    monkeypatch.setattr(report_tables, "load", lambda name: data)
    row = report_tables.repeats_row("serving/x.json", "SmolLM2")
    assert "FastKVzip" in row[0] and " 0.4," in row[0] and "1 alternating runs" in row[0]
    assert row[1].startswith("**2.00x** the best stock's turns/s (4.00x plain stock's)")   # the control is not in it
    assert "the ratio-1.0 control 0.50x the best stock's, reusing 50%" in row[1]
