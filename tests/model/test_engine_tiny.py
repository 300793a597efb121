"""Real SGLang Engines on a tiny random Llama: stock greedy == HF, and so does a 1.0 profile on the ragged pool."""

import atexit

import pytest
import sglang
from served import IDLE_KWARGS
from tiny_model import oracle_tokens

from tangram_sglang.profile.uniform import main as write_uniform

SAMPLING = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


def run_engine(model_path, prompts, **kwargs):
    engine = sglang.Engine(model_path=model_path, skip_tokenizer_init=True, dtype="float32",
                           max_total_tokens=2048, log_level="error", **IDLE_KWARGS, **kwargs)
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
    """A 1.0 profile is lossless under SGLang's overlap scheduler (on by default): the HF tokens,
    and a second turn that continues each first turn reads its whole history from the tree
    (the finished request's extra overlap step leaves nothing behind) and still gets the HF tokens."""
    from tiny_model import hf_greedy
    from transformers import LlamaForCausalLM

    path, prompts, hf = tiny_llama
    profile = tmp_path / "u.yaml"
    write_uniform(["--model-path", path, "--ratio", "1.0", "-o", str(profile)])
    turn2 = [p + o + [5, 6, 7] for p, o in zip(prompts, hf)]
    engine = sglang.Engine(model_path=path, skip_tokenizer_init=True, dtype="float32", max_total_tokens=2048,
                           log_level="error", tangram_profile=str(profile), **IDLE_KWARGS)
    try:
        outs = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=SAMPLING)]
        second = engine.generate(input_ids=turn2, sampling_params=SAMPLING)
        state = engine.get_server_info()["internal_states"][0]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    info = state["tangram"]
    assert state["overlap_schedule"] is True
    assert info["profile"] == str(profile) and info["ratio"] == 1.0
    assert info["virtual_layers"] == 2 * 2 and info["pool"] == "ragged"
    pool = info["pool_info"]
    assert pool["integrity"] == "ok" and pool["pages_total"] == 2048 * (2 * 2 * 2 * 16 * 4) // pool["page_bytes"]  # stock bytes
    assert outs == hf  # a 1.0 profile on the ragged pool is lossless
    assert [r["meta_info"]["cached_tokens"] for r in second] == [len(p) + len(o) - 1 for p, o in zip(prompts, hf)]
    assert [r["output_ids"] for r in second] == hf_greedy(LlamaForCausalLM.from_pretrained(path).eval(), turn2)


def _scorer_profile(tmp_path, model_path, method, ratio=0.4, chunk=48, **calibration):
    """A non-uniform profile for the tiny model served with ``method`` (scorer_args etc. in calibration)."""
    import dataclasses

    import numpy as np

    from tangram_sglang.profile import ModelShape
    from tangram_sglang.profile.builder import make_entry
    from tangram_sglang.profile.uniform import uniform_profile

    prof = uniform_profile(ModelShape.from_model_path(model_path), [ratio], parallel_capacity=8)
    budgets = np.array([[ratio, min(1.0, 2 * ratio)], [min(1.0, 1.5 * ratio), ratio]])
    entry = make_entry(ratio, budgets, budgets, np.zeros_like(budgets), heads_per_group=1,
                       grouping="budget_aware", parallel_capacity=8)
    meta = dataclasses.replace(prof.calibration, method=method, chunk_size=chunk, **calibration)
    prof = dataclasses.replace(prof, calibration=meta, entries=(entry,), default_ratio=ratio)
    path = tmp_path / f"{method}.yaml"
    prof.save(str(path))
    return str(path)


def test_kvzip_reconstruction_served_equals_the_oracle(tiny_llama, tmp_path):
    """KVzip in the server (reconstruction pass inside each prefill, its KV never stored) serves the
    tokens of the dense oracle that runs the same pass; pool integrity and reserved == used hold."""
    import torch

    path, _, _ = tiny_llama
    profile = _scorer_profile(tmp_path, path, "kvzip", scorer_args={"prefix_ids": [1, 17, 23, 5, 9]})
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 500, (n,), generator=g).tolist() for n in (150, 230, 97)]
    outs, info = run_engine(path, prompts, tangram_profile=profile)
    pool = info["pool_info"]
    assert pool["integrity"] == "ok" and pool["saved_vs_full_kv"] > 0
    assert outs == oracle_tokens(path, profile, prompts)


def test_fp8_pages_serve_the_oracle_tokens(tiny_llama, tmp_path):
    """--kv-cache-dtype fp8_e4m3 with a compressing profile, on a CPU (where stock SGLang refuses it): the
    ragged pool holds FP8 pages in the bytes stock SGLang gives its FP8 cache, the server gives the
    greedy tokens of the dense oracle storing its cache in FP8 (chunks scored unquantized), and a
    second turn reads its FP8 history from the tree; pool integrity holds."""
    import torch

    path, _, _ = tiny_llama
    profile = _scorer_profile(tmp_path, path, "snapkv")
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(2, 500, (n,), generator=g).tolist() for n in (150, 97)]
    engine = sglang.Engine(model_path=path, skip_tokenizer_init=True, dtype="float32", max_total_tokens=2048,
                           log_level="error", tangram_profile=profile, kv_cache_dtype="fp8_e4m3", **IDLE_KWARGS)
    try:
        outs = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=SAMPLING)]
        turn2 = [p + o + [5, 6, 7] for p, o in zip(prompts, outs)]
        second = engine.generate(input_ids=turn2, sampling_params=SAMPLING)  # FP8 history from the tree
        info = engine.get_server_info()["internal_states"][0]["tangram"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    assert all(r["meta_info"]["cached_tokens"] >= len(p) for r, p in zip(second, prompts))
    assert all(len(r["output_ids"]) == 16 for r in second)
    pool = info["pool_info"]
    assert pool["integrity"] == "ok" and pool["saved_vs_full_kv"] > 0 and pool["kv_dtype"] == "float8_e4m3fn"
    assert pool["page_bytes"] == 2 * 16 * 1 * 16 * 1                                 # K+V, P, H_p, d, 1 byte
    assert pool["pages_total"] == 2048 * (2 * 2 * 2 * 16 * 1) // pool["page_bytes"]  # stock FP8 bytes
    assert outs == oracle_tokens(path, profile, prompts, kv_dtype=torch.float8_e4m3fn)


def test_triton_data_plane_serves_the_oracle_tokens(tiny_llama, tmp_path, monkeypatch):
    """The whole served path with the Triton kernels (TRITON_INTERPRET=1 on CPU: decode split-map
    kernel reading the device block tables in place, Triton chunk prefill) gives the dense oracle's
    greedy tokens (which the torch data plane gives in the tests above), with a non-uniform profile
    compressing; pool integrity holds."""
    path, _, _ = tiny_llama
    profile = _scorer_profile(tmp_path, path, "snapkv")
    import torch

    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, 500, (n,), generator=g).tolist() for n in (121, 33)]   # 3 chunks of 48; one
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    got, info = run_engine(path, prompts, tangram_profile=profile, tangram_data_plane="triton")
    pool = info["pool_info"]
    assert pool["data_plane"] == "triton" and pool["integrity"] == "ok" and pool["saved_vs_full_kv"] > 0
    assert got == oracle_tokens(path, profile, prompts)


def test_decode_rounds_between_prefill_chunks_serve_the_oracle_tokens(tiny_llama, tmp_path):
    """--prefill-decode-interval (SGLang runs decode rounds after each prefill batch, so a long prompt's
    chunks interleave with other requests' decode steps; the profile's default with think time): the
    dense oracle's greedy tokens, pool integrity, with a profile compressing."""
    import torch

    path, _, _ = tiny_llama
    profile = _scorer_profile(tmp_path, path, "snapkv")
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(2, 500, (n,), generator=g).tolist() for n in (20, 230, 150, 12)]
    outs, info = run_engine(path, prompts, tangram_profile=profile, prefill_decode_interval=1)
    pool = info["pool_info"]
    assert pool["integrity"] == "ok" and pool["saved_vs_full_kv"] > 0
    assert outs == oracle_tokens(path, profile, prompts)


def test_several_chunks_per_prefill_pass_serve_the_oracle_tokens(tiny_llama, tmp_path):
    """A prefill pass of SGLang's default size holds several 48-token compression chunks of several
    requests (waves run in order inside each layer): the oracle's tokens, as with one chunk per pass
    (--chunked-prefill-size 48), in fewer passes for the same chunks. Expected Attention carries its
    statistics across a request's chunks, so a wave reading a stale state would change them."""
    import torch

    path, _, _ = tiny_llama
    profile = _scorer_profile(tmp_path, path, "expected_attention")
    g = torch.Generator().manual_seed(13)
    prompts = [torch.randint(2, 500, (n,), generator=g).tolist() for n in (230, 20, 150, 97)]
    many, info_many = run_engine(path, prompts, tangram_profile=profile)
    one, info_one = run_engine(path, prompts, tangram_profile=profile, chunked_prefill_size=48)
    pm, po = info_many["pool_info"], info_one["pool_info"]
    assert pm["integrity"] == "ok" and po["integrity"] == "ok" and pm["saved_vs_full_kv"] > 0
    assert pm["prefill_chunks"] == po["prefill_chunks"] == 5 + 1 + 4 + 3
    assert pm["prefill_passes"] < pm["prefill_chunks"] and po["prefill_passes"] >= 5
    assert many == one == oracle_tokens(path, profile, prompts)


def _two_turns(path, profile, prompts, sessions: bool):
    """Two turns of each prompt (the second continues the first) on one Engine, with session ids and
    the session radix cache or without; closes the first session. Returns (first, second results, info)."""
    engine = sglang.Engine(model_path=path, skip_tokenizer_init=True, dtype="float32", max_total_tokens=2048,
                           log_level="error", tangram_profile=profile, enable_session_radix_cache=sessions,
                           **IDLE_KWARGS)
    try:
        sids = [engine.open_session(capacity_of_str_len=4096, session_id=f"s{i}") if sessions else None
                for i in range(len(prompts))]
        first = [engine.generate(input_ids=p, sampling_params=SAMPLING, session_id=s)["output_ids"]
                 for p, s in zip(prompts, sids)]
        turn2 = [p + o + [5, 6, 7] for p, o in zip(prompts, first)]
        second = [engine.generate(input_ids=t, sampling_params=SAMPLING, session_id=s) for t, s in zip(turn2, sids)]
        if sessions:
            engine.close_session(sids[0])
        info = engine.get_server_info()["internal_states"][0]["tangram"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    return first, second, info


def test_session_radix_cache_through_sglangs_session_calls(tiny_llama, tmp_path):
    """--enable-session-radix-cache with a profile, driven by SGLang's own open_session / session_id /
    close_session: each session's second turn reads its first turn from the tree; every token equals
    the same server's without sessions (the first turn the oracle's); after one close, one session holds
    references; pool and tree integrity (session references included) hold."""
    import torch

    path, _, _ = tiny_llama
    profile = _scorer_profile(tmp_path, path, "snapkv")
    g = torch.Generator().manual_seed(13)
    prompts = [torch.randint(2, 500, (n,), generator=g).tolist() for n in (120, 75)]
    first, second, info = _two_turns(path, profile, prompts, sessions=True)
    plain_first, plain_second, plain_info = _two_turns(path, profile, prompts, sessions=False)
    assert info["pool_info"]["integrity"] == "ok" and info["sessions"] == {"open_referenced": 1}
    assert plain_info["sessions"] is None
    assert [r["meta_info"]["cached_tokens"] for r in second] == [len(p) + len(o) - 1 for p, o in zip(prompts, first)]
    assert first == plain_first == oracle_tokens(path, profile, prompts)
    assert [r["output_ids"] for r in second] == [r["output_ids"] for r in plain_second]


def test_max_new_tokens_capped_to_what_the_pool_can_hold(tiny_llama, tmp_path):
    """Like stock SGLang, a request asking for more tokens than the pool could ever hold is capped at
    arrival (in pages) and completes, instead of failing mid-decode; a prompt that can never fit is
    refused up front. The server keeps serving and the pool stays intact."""
    path, _, _ = tiny_llama
    profile = tmp_path / "u.yaml"
    write_uniform(["--model-path", path, "--ratio", "1.0", "-o", str(profile)])
    engine = sglang.Engine(model_path=path, skip_tokenizer_init=True, dtype="float32", max_total_tokens=200,
                           log_level="error", tangram_profile=str(profile), **IDLE_KWARGS)
    try:
        prompt = list(range(5, 105))
        long = engine.generate(input_ids=[prompt], sampling_params={"temperature": 0, "max_new_tokens": 400,
                                                                     "ignore_eos": True})[0]
        with pytest.raises(ValueError, match="can never be served"):  # refused up front, naming the pool
            engine.generate(input_ids=[list(range(5, 305))], sampling_params={"temperature": 0, "max_new_tokens": 4})
        after = engine.generate(input_ids=[prompt], sampling_params=SAMPLING)[0]
        info = engine.get_server_info()["internal_states"][0]["tangram"]["pool_info"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    n = len(long["output_ids"])
    assert 10 < n < 200 and long["meta_info"]["finish_reason"]["type"] == "length"
    assert len(after["output_ids"]) == 16
    assert info["integrity"] == "ok" and info["capped"] >= 1
