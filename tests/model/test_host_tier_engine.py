"""The compressed host tier on a real SGLang Engine (tiny random Llama, a compressing profile).

Six conversations through a pool that holds about three of them: the first one's history is evicted
to the host tier, and its second turn finds all of it (loaded back, not prefilled) and answers with
the tokens it gets from an Engine whose pool never evicted it. Integrity holds.
"""

import atexit

import sglang
import torch
from served import IDLE_KWARGS
from test_engine_tiny import _scorer_profile
from tiny_model import NEW_TOKENS

SAMPLING = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def _conversations(engine, prompts):
    """Turn 1 of every prompt, in order, then turn 2 of the first; returns (turn-1 outputs, turn 2's
    output, turn 2's cached tokens, the history's length)."""
    first = [engine.generate(input_ids=p, sampling_params=SAMPLING)["output_ids"] for p in prompts]
    history = prompts[0] + first[0]
    turn2 = engine.generate(input_ids=history + [5, 6, 7, 8], sampling_params=SAMPLING)
    return first, turn2["output_ids"], turn2["meta_info"]["cached_tokens"], len(history)


def _serve(path, profile, prompts, **kwargs):
    engine = sglang.Engine(model_path=path, skip_tokenizer_init=True, dtype="float32", log_level="error",
                           tangram_profile=profile, **IDLE_KWARGS, **kwargs)
    try:
        out = _conversations(engine, prompts)
        info = engine.get_server_info()["internal_states"][0]["tangram"]["pool_info"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    return out, info


def test_an_evicted_history_comes_back_from_the_host_with_the_same_answer(tiny_llama, tmp_path):
    path, _, _ = tiny_llama
    profile = _scorer_profile(tmp_path, path, "snapkv")
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(2, 500, (200,), generator=g).tolist() for _ in range(6)]
    (first, turn2, cached, hist), info = _serve(path, profile, prompts, max_total_tokens=512,
                                                tangram_host_ratio=2.0)
    (ref_first, ref_turn2, ref_cached, _), ref_info = _serve(path, profile, prompts, max_total_tokens=8192)
    assert info["offloaded_tokens"] > 0 and info["loaded_tokens"] >= hist - NEW_TOKENS
    assert ref_info["offloaded_tokens"] == ref_info["evicted_segments"] == 0   # the reference kept everything
    assert cached == ref_cached == hist - 1          # the whole history matched (its last token has no KV yet)
    assert first == ref_first and turn2 == ref_turn2
    assert info["host_pages_total"] == 2 * info["pages_total"] and info["integrity"] == "ok"
