"""benchmarks.timing.prefill_history's pieces that need no server: the summary pairs each repeat with
stock's, the report renders it, and py-spy's samples are split by where the scheduler spent them."""

from benchmarks.timing import prefill_history as ph


def _row(server, rep, h, d, ms):
    return {"server": server, "repeat": rep, "history": h, "decoding": d, "ms_per_token": ms, "new_tokens": 100}


def test_summary_pairs_repeats_with_stock_and_the_report_shows_it():
    rows = [_row("stock", 0, 2048, 0, 10.0), _row("t", 0, 2048, 0, 5.0),
            _row("stock", 1, 2048, 0, 20.0), _row("t", 1, 2048, 0, 30.0)]
    s = ph.summarize(rows, ["stock", "t"])
    t = next(r for r in s if r["server"] == "t")
    assert t["ms_per_token"] == [17.5, 5.0, 30.0] and t["vs_stock"] == [1.0, 0.5, 1.5]
    res = {"args": {"model": "m", "profile": "p", "new_tokens": 100, "max_total_tokens": 4096, "repeats": 2,
                    "histories": [2048]}, "summary": s, "where": {}}
    assert "| 2048 | 0 | t | 100 | 17.50 [5.00, 30.00] | 1.00x [0.50, 1.50] |" in "\n".join(ph.markdown(res))


def test_where_time_goes_counts_only_the_scheduler_by_innermost_frame(tmp_path):
    raw = tmp_path / "spy.txt"
    raw.write_text(
        "event_loop (s.py:1);forward (m.py:2);attend_pieces (tangram_sglang/attention/reference.py:84) 6\n"
        "event_loop (s.py:1);forward (m.py:2);apply (quantization/unquant.py:614) 3\n"
        "event_loop (s.py:1);prefill_chunk (tangram_sglang/pool/ragged_cache.py:9) 1\n"
        "tokenizer_loop (t.py:1);encode (x.py:2) 50\n")
    w = ph.where_time_goes(str(raw))
    assert w["samples"] == 10
    assert w["shares"] == {"Tangram attention (ragged history)": 0.6, "linear layers": 0.3, "Tangram control plane": 0.1}
