"""Real SGLang Engines on a tiny random Llama: stock greedy == HF, and so does a 1.0 profile on the ragged pool."""

import atexit

import pytest

import sglang

from tangram_sglang.uniform_profile import main as write_uniform

pytestmark = pytest.mark.slow

SAMPLING = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


def run_engine(model_path, prompts, **kwargs):
    engine = sglang.Engine(model_path=model_path, skip_tokenizer_init=True, dtype="float32",
                           max_total_tokens=2048, log_level="error", **kwargs)
    try:
        outs = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=SAMPLING)]
        info = engine.get_server_info()["internal_states"][0].get("tangram")
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)  # already down: no second shutdown logging at exit
    return outs, info


def test_stock_sglang_matches_hf_greedy(tiny_llama):
    path, prompts, hf = tiny_llama
    outs, info = run_engine(path, prompts)
    assert outs == hf
    assert info is None


def test_profile_reaches_spawned_scheduler(tiny_llama, tmp_path):
    path, prompts, hf = tiny_llama
    profile = tmp_path / "u.yaml"
    write_uniform(["--model-path", path, "--ratio", "1.0", "-o", str(profile)])
    outs, info = run_engine(path, prompts, tangram_profile=str(profile))
    assert info["profile"] == str(profile) and info["ratio"] == 1.0
    assert info["virtual_layers"] == 2 * 2 and info["pool"] == "ragged"
    pool = info["pool_info"]
    assert pool["integrity"] == "ok" and pool["pages_total"] == 2048 * (2 * 2 * 2 * 16 * 4) // pool["page_bytes"]  # stock bytes
    assert outs == hf  # a 1.0 profile on the ragged pool is lossless
