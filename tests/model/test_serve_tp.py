"""Tensor parallelism through SGLang's real scheduler on CPU (two ranks over gloo, the tiny Llama:
2 KV heads, one per rank): each rank serves its own pool of its heads, admission stays identical."""

import atexit
import dataclasses

import numpy as np
import pytest
import sglang
import torch
from served import IDLE_KWARGS
from tiny_model import oracle_tokens

from tangram_sglang.profile import ModelShape
from tangram_sglang.profile.builder import make_entry
from tangram_sglang.profile.uniform import main as write_uniform
from tangram_sglang.profile.uniform import uniform_profile

SAMPLING = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


@pytest.fixture
def two_ranks(monkeypatch):
    # SGLang binds each CPU rank to its own cores (one NUMA node here: name them).
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "0|1")


def run_engine(model_path, prompts, tp_size, sampling=SAMPLING, **kwargs):
    engine = sglang.Engine(model_path=model_path, skip_tokenizer_init=True, dtype="float32", tp_size=tp_size,
                           max_total_tokens=kwargs.pop("max_total_tokens", 2048), log_level="error", **IDLE_KWARGS, **kwargs)
    try:
        outs = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=sampling)]
        info = engine.get_server_info()["internal_states"][0].get("tangram")
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    return outs, info


def snapkv_profile(tmp_path, model_path, budgets, ratio=0.4, chunk=48):
    """A non-uniform SnapKV profile of the tiny model with the given budgets [L, H]."""
    prof = uniform_profile(ModelShape.from_model_path(model_path), [ratio], parallel_capacity=8)
    b = np.asarray(budgets, dtype=np.float64)
    entry = make_entry(ratio, b, b, np.zeros_like(b), heads_per_group=1, grouping="budget_aware",
                       parallel_capacity=8)
    meta = dataclasses.replace(prof.calibration, method="snapkv", chunk_size=chunk)
    prof = dataclasses.replace(prof, calibration=meta, entries=(entry,), default_ratio=ratio)
    path = tmp_path / "snapkv.yaml"
    prof.save(str(path))
    return str(path)


def test_tp2_with_a_lossless_profile_serves_hf_greedy(tiny_llama, tmp_path, two_ranks):
    path, prompts, hf = tiny_llama
    profile = tmp_path / "u.yaml"
    write_uniform(["--model-path", path, "--ratio", "1.0", "-o", str(profile)])
    outs, info = run_engine(path, prompts, 2, tangram_profile=str(profile))
    assert info["virtual_layers"] == 2 * 1  # rank 0's view: its one KV head per layer
    assert info["pool_info"]["integrity"] == "ok" and info["pool_info"]["tp_size"] == 2
    assert outs == hf


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_tp2_compressing_serves_the_oracle_tokens_when_ranks_need_equal_budgets(tiny_llama, tmp_path, two_ranks,
                                                                               kv_cache_dtype):
    """Budgets whose ranks already hold the same multiset (no raise): TP=2 keeps exactly what one
    process keeps (each rank scores its own heads with their own query heads) and serves the dense
    oracle's tokens (which TP=1 serves: test_engine_tiny), with the model's KV type and with FP8 pages."""
    path, _, _ = tiny_llama
    profile = snapkv_profile(tmp_path, path, [[0.4, 0.8], [0.8, 0.4]])
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(2, 500, (n,), generator=g).tolist() for n in (150, 97, 230)]
    got, info = run_engine(path, prompts, 2, tangram_profile=profile, kv_cache_dtype=kv_cache_dtype)
    assert info["pool_info"]["integrity"] == "ok" and info["pool_info"]["saved_vs_full_kv"] > 0
    assert info["pool_info"]["kv_dtype"] == {"auto": "float32", "fp8_e4m3": "float8_e4m3fn"}[kv_cache_dtype]
    kv = {"kv_dtype": torch.float8_e4m3fn} if kv_cache_dtype == "fp8_e4m3" else {}
    assert got == oracle_tokens(path, profile, prompts, **kv)


def test_tp2_under_pressure_ranks_admit_alike(tiny_llama, tmp_path, two_ranks):
    """Unequal budgets (rank 1's raised to rank 0's multiset), a pool far smaller than the load:
    requests wait, are retracted and re-admitted; had the ranks decided differently the forward
    collectives would hang or the pools disagree. Every request completes with its tokens."""
    path, _, _ = tiny_llama
    profile = snapkv_profile(tmp_path, path, [[0.3, 0.9], [0.6, 0.3]])
    g = torch.Generator().manual_seed(12)
    prompts = [torch.randint(2, 500, (int(n),), generator=g).tolist()
               for n in torch.randint(40, 200, (16,), generator=g)]
    sampling = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    outs, info = run_engine(path, prompts, 2, sampling=sampling, tangram_profile=profile, max_total_tokens=400)
    assert [len(o) for o in outs] == [40] * len(prompts)
    pool = info["pool_info"]
    assert pool["integrity"] == "ok" and pool["tp_size"] == 2 and pool["waited"] > 0
