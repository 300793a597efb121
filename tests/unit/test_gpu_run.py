"""The GPU run's pieces that need no server: launch lines, summaries, the report (benchmarks.gpu)."""

from benchmarks.gpu import report
from benchmarks.gpu.servers import Server
from benchmarks.gpu.speed import summary


def test_stock_runs_sglangs_triton_backend_and_the_profile_its_own():
    stock = Server("stock", "/m", 1024).args(cuda=True)
    tangram = Server("t", "/m", 1024, profile="/p.yaml", ratio=0.25).args(cuda=True)
    assert stock[stock.index("--attention-backend") + 1] == "triton"
    assert "--attention-backend" not in tangram          # the profile sets the tangram backend
    for args in (stock, tangram):
        assert args[args.index("--max-total-tokens") + 1] == "1024"   # the same pool bytes
        assert args[args.index("--sampling-backend") + 1] == "pytorch"
    assert tangram[tangram.index("--tangram-ratio") + 1] == "0.25"
    cpu = Server("s", "/m", 64, graphs=False).args(cuda=False)
    assert cpu[cpu.index("--dtype") + 1] == "float32" and "--disable-cuda-graph" in cpu
    assert "--attention-backend" not in cpu


def test_summary_pairs_each_repetition_with_the_baselines():
    rows = summary({"stock": [10.0, 20.0, 30.0], "t": [5.0, 20.0, 15.0]}, "stock")
    assert rows["stock"]["median"] == 20.0 and "vs_stock" not in rows["stock"]
    assert rows["t"]["vs_stock"] == {"median": 0.5, "range": [0.5, 1.0]}


def test_report_names_failures_and_skips():
    result = {"stamp": {"date": "d", "commit": "c", "command": "x",
                        "machine": {"platform": "p", "cpus": 1, "python": "3", "torch": "t", "cuda_device": "GPU"}},
              "cuda": True,
              "correctness": {"failed_to_start": {"llama-t1.0": "RuntimeError: server exited\nImportError: boom"},
                              "archs": [{"arch": "llama", "errors": {}, "integrity": {"llama-stock": [None, None],
                                                                                   "llama-t0.4": ["ok", "bad page"]},
                                         "cached_turn2": {"llama-t0.4": 5}, "turn2_prompt_tokens": 9,
                                         "t0.4 graphs vs eager": {"turn1": {"equal": 6, "of": 7, "first_difference": [3]},
                                                                  "turn2": {"equal": 7, "of": 7, "first_difference": []}}}]},
              "speed": {"error": "Traceback: out of memory"},
              "fp8": {"skipped": "out of time"}}
    text = report.render(result)
    assert "ImportError: boom" in text and "out of memory" in text and "Skipped: out of time" in text
    assert "6/7 / 7/7" in text
    assert "llama-t0.4: ['ok', 'bad page']" in text and "llama-stock" not in text.split("| integrity |")[1]


def _parse_as_sglang(args: list[str]):
    """SGLang 0.5.23's own launch_server parser (abbreviations allowed, as `sglang serve` has it) with the
    --tangram-* flags: an unknown or ambiguous option exits."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from tangram_sglang.sglang import server_args

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    if not any("--tangram-profile" in a.option_strings for a in parser._actions):
        server_args.add_cli_args(None, parser)
    return parser.parse_args(["--model-path", "/m", *args])


def test_every_gpu_server_launch_line_parses(tmp_path):
    """The 8B plan's servers (stock, the 1.0 control, the reference profile; FP8) and the tiny correctness
    servers: each launch line parses under SGLang's own parser (an ambiguous flag stopped every server on
    the first GPU call), its profile loads with the chunk the plan set and matches the model's shape."""
    from benchmarks.gpu import correctness, speed
    from tangram_sglang.profile import ModelShape, load_profile

    _, full = speed.plan(str(tmp_path), quick=False)
    _, fp8 = speed.plan(str(tmp_path), quick=False, kv_dtype="fp8_e4m3")
    tiny = correctness.servers("llama", str(tmp_path))
    assert [s.name for s in full] == ["stock", "t1.0", "t0.25"]
    assert [s.name for s in fp8] == ["stock-fp8_e4m3", "t1.0-fp8_e4m3", "t0.25-fp8_e4m3"]
    for spec in full + fp8 + tiny:
        profile = ["--tangram-profile", spec.profile] if spec.profile else []   # as ServerProcess adds it
        parsed = _parse_as_sglang(spec.args(cuda=True) + profile)
        assert parsed.max_total_tokens == spec.pool_tokens and parsed.tangram_ratio == spec.ratio
        if spec.profile:
            assert load_profile(spec.profile).model == ModelShape.from_model_path(spec.model)
    assert load_profile(full[2].profile).calibration.chunk_size == 2048
    assert load_profile(full[1].profile).heads_per_group == load_profile(full[2].profile).heads_per_group
    stock = full[0].args(cuda=True)
    assert stock[stock.index("--schedule-policy") + 1] == "lpm"   # stock's best multi-turn policy
    for spec in full:   # the tokenizer travels: bench_serving sends text through the OpenAI API
        assert "--skip-tokenizer-init" not in spec.args(cuda=True) and "--enable-cache-report" in spec.args(cuda=True)


def test_dummy_model_takes_the_tokenizers_vocabulary_and_keeps_every_kv_shape(tmp_path):
    import json
    import os

    from benchmarks.gpu.models import dummy_model, kit_tokenizer, tokenizer_vocab

    tok = kit_tokenizer()
    assert tokenizer_vocab(tok) == (49152, {"bos": 1, "eos": 2, "pad": 2})
    path = dummy_model("llama-3.1-8b-instruct", str(tmp_path / "m"), tok)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    assert (cfg["vocab_size"], cfg["bos_token_id"], cfg["eos_token_id"]) == (49152, 1, 2)
    shape = {k: cfg[k] for k in ("num_hidden_layers", "num_key_value_heads", "head_dim", "num_attention_heads")}
    assert shape == {"num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128, "num_attention_heads": 32}
    assert os.path.exists(os.path.join(path, "tokenizer.json"))
    from transformers import AutoTokenizer   # what SGLang and bench_serving load from the folder

    assert AutoTokenizer.from_pretrained(path).encode("hello world")[-1] < cfg["vocab_size"]
    plain = dummy_model("llama-3.1-8b-instruct", str(tmp_path / "p"))
    assert not os.path.exists(os.path.join(plain, "tokenizer.json"))


def test_report_renders_bench_serving_rows_and_failures():
    m = {"workload": {"groups": 2, "per_group": 3, "system_len": 128, "question_len": 64, "output_len": 8,
                      "turns": 2, "max_concurrency": 6},
         "stock": {"request_throughput": 2.0, "median_ttft_ms": 10.0, "p99_ttft_ms": 30.0, "median_tpot_ms": 5.0,
                   "p99_tpot_ms": 9.0, "cache_hit_rate_pct": 40.0, "completed": 12, "wall_s": 6.0},
         "t0.25": {"request_throughput": 5.0, "median_ttft_ms": 8.0, "p99_ttft_ms": 20.0, "median_tpot_ms": 5.0,
                   "p99_tpot_ms": 9.0, "cache_hit_rate_pct": 70.0, "completed": 12, "wall_s": 2.4},
         "t1.0": {"error": "bench_serving rc 1: Traceback\nValueError: no tokenizer"}}
    text = "\n".join(report._bench(m))
    assert "| t0.25 | 5.000 | 2.50x | 8 / 20 | 5 / 9 | 70.0% | 12 | 2.4 |" in text
    assert "failed: `ValueError: no tokenizer`" in text
