"""Served tokens of SmolLM2 through sglang.Engine with a Tangram profile.

* every budget 1.0 (ragged pool, Tangram backend, segment tree): the same greedy
  tokens as stock SGLang;
* ratio < 1: the same greedy tokens as serving_reference.reference_generate, the
  dense torch oracle applying the same per-head compression chunk by chunk
  (schedule [512, 512, ..., rest], sinks and newest tokens protected), whether
  the prompts arrive one at a time or together in one batch: what is kept for a
  prompt does not depend on what SGLang batched with it.
"""

import atexit
import time

import pytest
import sglang
from served import IDLE_KWARGS

from tangram_sglang.profile.uniform import main as write_uniform

REPO_CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[2] / "configs"
NEW_TOKENS = 12


def _prompts(model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    ids = tok.encode((REPO_CONFIGS / "CALIBRATION.md").read_text() * 3)
    return [tok.encode("The capital of France is"), ids[100:600], ids[2000:3100]]


def _flush(engine, tries=60):
    """flush_cache refuses while the scheduler still holds finished requests: retry briefly."""
    for _ in range(tries):
        if engine.flush_cache().success:
            return
        time.sleep(0.5)
    raise AssertionError("flush_cache never succeeded")


def _serve(model_path, prompts, batched=False, **kwargs):
    """Greedy outputs of the prompts sent one at a time (and, with batched, then all at once
    after a cache flush), and the Tangram info."""
    engine = sglang.Engine(model_path=model_path, skip_tokenizer_init=True, dtype="float32",
                           max_total_tokens=8192, log_level="error", **IDLE_KWARGS, **kwargs)
    try:
        params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
        outs = [engine.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]
        if batched:
            _flush(engine)
            outs = (outs, [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)])
        info = engine.get_server_info()["internal_states"][0].get("tangram")
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    return outs, info


@pytest.fixture(scope="module")
def prompts(smollm2_path):
    return _prompts(smollm2_path)


def test_full_budget_profile_matches_stock_sglang(smollm2_path, prompts, tmp_path):
    profile = tmp_path / "smollm2-1.0.yaml"
    write_uniform(["--model-path", smollm2_path, "--ratio", "1.0", "-o", str(profile)])
    stock, _ = _serve(smollm2_path, prompts)
    served, info = _serve(smollm2_path, prompts, tangram_profile=str(profile))
    assert info["pool"] == "ragged" and info["pool_info"]["integrity"] == "ok"
    assert served == stock


@pytest.mark.parametrize("method,ratio", [("snapkv", 0.25), ("keydiff", 0.5), ("fastkvzip", 0.4)])
def test_compressed_serving_matches_torch_reference(smollm2_path, prompts, method, ratio):
    import torch
    from transformers import AutoModelForCausalLM

    from tangram_sglang.oracle.serving_reference import reference_generate
    from tangram_sglang.profile import load_profile
    from tangram_sglang.scorers.profile_scorer import profile_scorer

    path = REPO_CONFIGS / f"smollm2-{method}.yaml"
    (served, batched), info = _serve(smollm2_path, prompts, batched=True, tangram_profile=str(path),
                                     tangram_ratio=ratio)
    pool = info["pool_info"]
    assert info["ratio"] == ratio and pool["integrity"] == "ok" and pool["saved_vs_full_kv"] > 0
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    profile = load_profile(str(path))
    entry, scorer = profile.select(ratio), profile_scorer(profile, str(path))  # fastkvzip: its trained gates
    for prompt, out, out_batched in zip(prompts, served, batched):
        ref = reference_generate(model, entry, heads_per_group=1, method=scorer, prompt_ids=prompt,
                                 max_new_tokens=NEW_TOKENS)
        assert out == ref, f"{len(prompt)}-token prompt"
        assert out_batched == ref, f"{len(prompt)}-token prompt, batched"
