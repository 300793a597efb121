"""Architectures beyond Llama / Qwen2 on CPU: stock SGLang's greedy tokens equal HF's for a tiny random
model of each; Qwen3 (q/k norms) and Qwen3-MoE (whose SGLang code would write K/V itself through the
fused set-KV path on a GPU: under a profile it writes through the Tangram backend, sglang/model_writes.py)
with a 1.0 profile give them too, a second turn read from the tree included; so do the hybrids Gemma 3
(two layers attend to a 24-token window, which the prompts and the second turn reach past) and gpt-oss
(a window layer, learned attention sinks, experts: stock SGLang 0.5.23 cannot run it on a CPU, its
torch_native backend has no sinks)."""

import atexit

import pytest
import sglang
from served import IDLE_KWARGS
from tiny_model import PROMPTS, build_tiny, hf_greedy

from tangram_sglang.profile.uniform import main as write_uniform

SAMPLING = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = build_tiny(request.param, str(path))
    return str(path), model, hf_greedy(model)


def serve(path, prompts, turns=1, sampling=SAMPLING, max_total_tokens=2048, **kwargs):
    engine = sglang.Engine(model_path=path, skip_tokenizer_init=True, dtype="float32", max_total_tokens=max_total_tokens,
                           log_level="error", **IDLE_KWARGS, **kwargs)
    try:
        outs = [[r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=sampling)]]
        if turns == 2:
            outs.append(engine.generate(input_ids=[p + o + [5, 6, 7] for p, o in zip(prompts, outs[0])],
                                        sampling_params=sampling))
        info = engine.get_server_info()["internal_states"][0].get("tangram")
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    return outs, info


@pytest.mark.parametrize("tiny", ["qwen3", "qwen3_moe", "gemma3"], indirect=True)
def test_stock_matches_hf(tiny):
    path, _, hf = tiny
    (outs,), info = serve(path, PROMPTS)
    assert outs == hf and info is None


@pytest.mark.parametrize("tiny", ["qwen3", "qwen3_moe"], indirect=True)  # the hybrids: the window test's 1.0 half
def test_full_profile_matches_hf_across_turns(tiny, tmp_path):
    path, model, hf = tiny
    profile = tmp_path / "u.yaml"
    write_uniform(["--model-path", path, "--ratio", "1.0", "-o", str(profile)])
    (outs, second), info = serve(path, PROMPTS, turns=2, tangram_profile=str(profile))
    assert info["pool"] == "ragged" and info["pool_info"]["integrity"] == "ok"
    assert outs == hf
    turn2 = [p + o + [5, 6, 7] for p, o in zip(PROMPTS, hf)]
    assert [r["meta_info"]["cached_tokens"] for r in second] == [len(p) + len(o) - 1 for p, o in zip(PROMPTS, hf)]
    assert [r["output_ids"] for r in second] == hf_greedy(model, turn2)


def _chunk16(profile, method: str | None = None) -> None:
    """Compress in 16-token chunks (the profile's chunk size), scored by method if given."""
    import yaml

    raw = yaml.safe_load(profile.read_text())
    raw["calibration"]["chunk_size"] = 16
    if method:
        raw["calibration"]["method"] = method
    profile.write_text(yaml.safe_dump(raw, sort_keys=False))


LONG = [list(range(3, 153)), [(7 * i) % 500 + 2 for i in range(97)]]  # past the window and the protected newest 64


@pytest.mark.parametrize("tiny", ["gemma3", "gpt_oss"], indirect=True)
def test_window_layers_across_compression_chunks(tiny, tmp_path):
    """Gemma 3 and gpt-oss (learned sinks too) in 16-token compression chunks: the 57-token prompt's window (24) spans chunks, so
    chunk queries read their window from the pages too. At 1.0: HF's tokens, both turns, the second
    turn's history read from the tree (what test_full_profile_matches_hf_across_turns checks of the
    others, in smaller chunks). At 0.5 the
    full-attention layer is compressed (SnapKV) and the window layers keep every token: the dense
    oracle's tokens on prompts longer than the protected newest 64, a second turn served, pool intact."""
    import torch

    from tangram_sglang.oracle.serving_reference import reference_generate
    from tangram_sglang.profile import load_profile
    from tangram_sglang.scorers.profile_scorer import profile_scorer

    path, model, hf = tiny
    profile = tmp_path / "u.yaml"
    write_uniform(["--model-path", path, "--ratio", "1.0", "--ratio", "0.5", "-o", str(profile)])
    _chunk16(profile, "snapkv")
    (outs, second), info = serve(path, PROMPTS, turns=2, tangram_profile=str(profile))
    assert info["pool"] == "ragged" and info["pool_info"]["integrity"] == "ok" and outs == hf
    assert [r["meta_info"]["cached_tokens"] for r in second] == [len(p) + len(o) - 1 for p, o in zip(PROMPTS, hf)]
    assert [r["output_ids"] for r in second] == hf_greedy(model, [p + o + [5, 6, 7] for p, o in zip(PROMPTS, hf)])
    (outs, second), info = serve(path, LONG, turns=2, tangram_profile=str(profile), tangram_ratio=0.5)
    assert info["pool_info"]["integrity"] == "ok" and info["ratio"] == 0.5
    assert info["pool_info"]["saved_vs_full_kv"] > 0
    prof = load_profile(str(profile))
    with torch.no_grad():
        want = [reference_generate(model.float(), prof.select(0.5), heads_per_group=prof.heads_per_group,
                                   method=profile_scorer(prof, str(profile)), prompt_ids=p, max_new_tokens=16,
                                   chunk_size=16) for p in LONG]
    assert outs == want
    assert all(len(r["output_ids"]) == len(hf[0]) for r in second)



@pytest.mark.parametrize("tiny", ["gemma3"], indirect=True)
def test_window_pages_dropped_under_pressure(tiny, tmp_path):
    """A pool too small for every history: requests release the window pages their queries
    passed and the tree's interior nodes drop theirs for room; matches end only where the window
    pages are held, so both turns still give HF's tokens."""
    path, model, hf = tiny
    profile = tmp_path / "u.yaml"
    write_uniform(["--model-path", path, "--ratio", "1.0", "-o", str(profile)])
    _chunk16(profile)
    (outs, second), info = serve(path, PROMPTS, turns=2, tangram_profile=str(profile), max_running_requests=1,
                                 max_total_tokens=160)
    assert info["pool_info"]["integrity"] == "ok" and info["pool_info"]["window_drops"] > 0, info["pool_info"]
    assert outs == hf
    assert sum(r["meta_info"]["cached_tokens"] for r in second) > 0  # the second turns still read the tree
    assert [r["output_ids"] for r in second] == hf_greedy(model, [p + o + [5, 6, 7] for p, o in zip(PROMPTS, hf)])
