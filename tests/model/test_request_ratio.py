"""A ratio per request: custom_params["tangram_ratio"] picks another ratio of the served profile.

On a real SGLang Engine with a two-ratio profile of the tiny Llama: requests of both ratios in one
batch get the dense oracle's tokens at their own ratio; a ratio the profile lacks fails that request
with an error naming the profile's ratios, and the server keeps serving; a history is reused only
by a request of the ratio that wrote it; integrity holds.
"""

import atexit

import numpy as np
import pytest
import sglang
import torch
from served import IDLE_KWARGS
from tiny_model import NEW_TOKENS

from tangram_sglang.method.chunks import cut_tokens, reusable_prefix
from tangram_sglang.method.protection import Protection

SAMPLING = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
LOW, HIGH = 0.3, 0.6


def _two_ratio_profile(tmp_path, model_path) -> str:
    """SnapKV budgets at 0.3 and 0.6 (0.6 served by default), one head per group; the heads rank
    differently at the two ratios, so 0.3's budgets are regrouped into 0.6's groups when served."""
    import dataclasses

    from tangram_sglang.profile import ModelShape
    from tangram_sglang.profile.builder import make_entry
    from tangram_sglang.profile.uniform import uniform_profile

    prof = uniform_profile(ModelShape.from_model_path(model_path), [HIGH], parallel_capacity=8)
    budgets = {LOW: np.array([[0.2, 0.45], [0.35, 0.2]]), HIGH: np.array([[0.9, 0.5], [0.6, 0.7]])}
    entries = tuple(make_entry(r, b, b, np.zeros_like(b), heads_per_group=1, grouping="budget_aware",
                               parallel_capacity=8) for r, b in budgets.items())
    meta = dataclasses.replace(prof.calibration, method="snapkv", chunk_size=48)
    prof = dataclasses.replace(prof, calibration=meta, entries=entries, default_ratio=HIGH)
    path = tmp_path / "two.yaml"
    prof.save(str(path))
    return str(path)


def _oracle(model_path, profile, prompts, ratio) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    from tangram_sglang.oracle.serving_reference import reference_generate
    from tangram_sglang.profile import load_profile
    from tangram_sglang.scorers.profile_scorer import profile_scorer

    prof = load_profile(profile)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return [reference_generate(model, prof.select(ratio), heads_per_group=1, method=profile_scorer(prof, profile),
                               prompt_ids=p, max_new_tokens=NEW_TOKENS, chunk_size=48) for p in prompts]


def _at(ratio):
    return {**SAMPLING, "custom_params": {"tangram_ratio": ratio}}


def test_requests_of_two_ratios_share_a_batch_and_the_pool(tiny_llama, tmp_path):
    path, _, _ = tiny_llama
    profile = _two_ratio_profile(tmp_path, path)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(2, 500, (n,), generator=g).tolist() for n in (130, 60, 110, 75)]
    ratios = [LOW, None, LOW, HIGH]   # None: the served ratio, asked for by no parameter
    engine = sglang.Engine(model_path=path, skip_tokenizer_init=True, dtype="float32", max_total_tokens=2048,
                           log_level="error", tangram_profile=profile, **IDLE_KWARGS)
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=[SAMPLING if r is None else _at(r) for r in ratios])
        with pytest.raises(ValueError, match=r"tangram_ratio 0\.5 is not one of the served profile's ratios "
                                             r"\(0\.3, 0\.6\)"):
            engine.generate(input_ids=prompts[1], sampling_params=_at(0.5))
        # a history is reused by its own ratio only: prompt 0 was served at 0.3
        turn2 = prompts[0] + outs[0]["output_ids"] + [5, 6, 7]
        same = engine.generate(input_ids=turn2, sampling_params=_at(LOW))
        other = engine.generate(input_ids=turn2, sampling_params=SAMPLING)
        info = engine.get_server_info()["internal_states"][0]["tangram"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    low = _oracle(path, profile, [prompts[0], prompts[2]], LOW)
    high = _oracle(path, profile, [prompts[1], prompts[3]], HIGH)
    assert low != _oracle(path, profile, [prompts[0], prompts[2]], HIGH)   # the ratios keep different KV
    assert [o["output_ids"] for o in outs] == [low[0], high[0], low[1], high[1]]
    # turn 2 reuses its history at the ratio that wrote it, as far as the chunk rule lets it (no chat markers:
    # the open 48-token chunk its prompt and reply ran into is complete in turn 2, so it is recomputed)
    want = reusable_prefix(cut_tokens(prompts[0], 48, Protection()), cut_tokens(turn2, 48, Protection()),
                           len(prompts[0]))
    assert same["meta_info"]["cached_tokens"] == want == 96
    assert other["meta_info"]["cached_tokens"] == 0
    assert info["pool_info"]["integrity"] == "ok"


def test_ratio_budgets_follow_the_served_groups(tiny_llama, tmp_path):
    """Every ratio's group budgets in the served entry's groups (one head per group: that ratio's own
    budgets, reordered); an unknown ratio names the profile's."""
    from tangram_sglang.profile import ProfileError, load_profile
    from tangram_sglang.serving.context import ratio_budgets

    prof = load_profile(_two_ratio_profile(tmp_path, tiny_llama[0]))
    served = prof.select()
    table = ratio_budgets(prof, served)
    assert sorted(table) == [LOW, HIGH]
    np.testing.assert_array_equal(table[HIGH], served.group_budget)
    low = prof.select(LOW).budgets
    for layer, groups in enumerate(served.groups):
        assert [table[LOW][layer][g] for g in range(len(groups))] == [low[layer][h[0]] for h in groups]
    assert prof.select(LOW).groups != served.groups   # the regrouping is exercised
    with pytest.raises(ProfileError, match=r"holds \[0\.3, 0\.6\]"):
        prof.select(0.5)


def test_a_session_keeps_the_ratio_its_request_named(tiny_llama, tmp_path):
    """With the session radix cache, SGLang's session calls: a turn naming a ratio sets it for its session, so
    the next turn, naming none, is served at it and reads its history from that ratio's branch of the tree;
    the same prompt without the session is served at the profile's ratio (its branch, where turn 2 already
    is); integrity (session references included) holds."""
    path, _, _ = tiny_llama
    profile = _two_ratio_profile(tmp_path, path)
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(2, 500, (130,), generator=g).tolist()
    engine = sglang.Engine(model_path=path, skip_tokenizer_init=True, dtype="float32", max_total_tokens=2048,
                           log_level="error", tangram_profile=profile, enable_session_radix_cache=True,
                           **IDLE_KWARGS)
    try:
        sid = engine.open_session(capacity_of_str_len=4096, session_id="s")
        first = engine.generate(input_ids=prompt, sampling_params=_at(LOW), session_id=sid)
        turn2 = prompt + first["output_ids"] + [5, 6, 7]
        served = engine.generate(input_ids=turn2, sampling_params=SAMPLING)   # no session: 0.6's branch
        second = engine.generate(input_ids=turn2, sampling_params=SAMPLING, session_id=sid)
        info = engine.get_server_info()["internal_states"][0]["tangram"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    assert first["output_ids"] == _oracle(path, profile, [prompt], LOW)[0]
    assert served["meta_info"]["cached_tokens"] == 0
    # at 0.3 turn 2 finds turn 1's complete chunks (the open chunk it completes is recomputed); at the served
    # 0.6 it would have found all of itself but its last token, which the request without a session left there
    want = reusable_prefix(cut_tokens(prompt, 48, Protection()), cut_tokens(turn2, 48, Protection()), len(prompt))
    assert second["meta_info"]["cached_tokens"] == want == 96
    assert info["pool_info"]["integrity"] == "ok"
