"""A cache hit equals a recompute (issue 61), on SmolLM2 with the shipped FastKVzip profile.

Two chat conversations sharing a long system prompt, three turns each, built at the token level (each
turn's prompt extends the last by its reply and the next user message), served three ways by one
Engine: turn by turn from the radix tree; with the tree flushed before every turn; and the final
prompts of both together in one batch after a flush. A fourth way, on an Engine whose scheduler
retracts a decoding request every third forward (SGLang's own SGLANG_TEST_RETRACT): every prompt of
both conversations batched, each retracted request re-prefilled from its prompt and the tokens it had
generated. The chunk rule (method/chunks.py) makes the kept KV a function of the tokens, so every turn
answers the same tokens with the same log probabilities whichever way its history arrived; and the
second conversation's first turn finds the first's system prompt in the tree (its own chunk run),
counted in ``cached_tokens``.
"""

import atexit
import os

import pytest
import sglang
from served import IDLE_KWARGS, flush_engine

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
NEW = 10
SAMPLING = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}


def _ask(engine, prompts):
    outs = engine.generate(input_ids=prompts, sampling_params=SAMPLING, return_logprob=True)
    return [(o["output_ids"], [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]],
             o["meta_info"]["cached_tokens"]) for o in outs]


@pytest.fixture(scope="module")
def served(smollm2_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    text = (REPO / "configs" / "CALIBRATION.md").read_text()
    words = text.split()
    system = " ".join(words[:450])                                  # about 600 tokens: not a multiple of 512
    users = [[" ".join(words[450 + 300 * (3 * c + t): 450 + 300 * (3 * c + t) + 300]) + " Summarize."
              for t in range(3)] for c in range(2)]
    engine = sglang.Engine(model_path=smollm2_path, dtype="float32", max_total_tokens=16384, log_level="error",
                           tangram_profile=str(REPO / "configs" / "smollm2-fastkvzip.yaml"), tangram_ratio=0.4,
                           **IDLE_KWARGS)
    try:
        turn_by_turn, prompts = [], []
        for conv in users:   # (a) turn by turn, each prompt the last one + its reply + the next message
            ids = tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": conv[0]}],
                                          tokenize=True, add_generation_prompt=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            answers, conv_prompts = [], []
            for t in range(3):
                (out,) = _ask(engine, [ids])
                answers.append(out)
                conv_prompts.append(ids)
                if t < 2:
                    ids = ids + out[0] + tok.encode(f"<|im_end|>\n<|im_start|>user\n{conv[t + 1]}<|im_end|>\n"
                                                    "<|im_start|>assistant\n")
            turn_by_turn.append(answers)
            prompts.append(conv_prompts)
        flushed = []
        for conv_prompts in prompts:   # (b) the tree flushed before every turn: each history recomputed
            row = []
            for ids in conv_prompts:
                flush_engine(engine)
                row += _ask(engine, [ids])
            flushed.append(row)
        flush_engine(engine)                 # (c) both final prompts in one batch
        batch = _ask(engine, [p[-1] for p in prompts])
        flush_engine(engine)                 # the shared system prompt: the second conversation's first turn
        first_a, first_b = _ask(engine, [prompts[0][0]])[0], _ask(engine, [prompts[1][0]])[0]
        sys_len = len(tok.apply_chat_template([{"role": "system", "content": system}], tokenize=True))
        info = engine.get_server_info()["internal_states"][0]["tangram"]["pool_info"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    return dict(turn_by_turn=turn_by_turn, flushed=flushed, batch=batch, shared=(first_a, first_b, sys_len),
                prompts=prompts, info=info)


@pytest.fixture(scope="module")
def retracted(served, smollm2_path):
    """Every prompt of both conversations in one batch on an Engine that retracts a decoding request
    every third forward (SGLang reads the variables when its scheduler process starts); its answers and
    the pool's retraction counter."""
    forced = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "3"}
    saved = {k: os.environ.get(k) for k in forced}
    os.environ.update(forced)
    try:
        engine = sglang.Engine(model_path=smollm2_path, dtype="float32", max_total_tokens=16384, log_level="error",
                               tangram_profile=str(REPO / "configs" / "smollm2-fastkvzip.yaml"), tangram_ratio=0.4,
                               **IDLE_KWARGS)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    try:
        outs = _ask(engine, [p for conv in served["prompts"] for p in conv])
        info = engine.get_server_info()["internal_states"][0]["tangram"]["pool_info"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    return dict(outs=outs, info=info)


def _same(a, b):
    assert a[0] == b[0]
    assert max(abs(x - y) for x, y in zip(a[1], b[1])) < 1e-3


def test_a_turn_answers_alike_from_the_tree_and_recomputed(served):
    for conv, (tree, flushed) in enumerate(zip(served["turn_by_turn"], served["flushed"])):
        assert [len(p) for p in served["prompts"][conv]][-1] > 1500       # long enough to compress several chunks
        prompts = served["prompts"][conv]
        for t in (1, 2):   # later turns reused the whole history before them (the last reply token has no KV)
            assert tree[t][2] == len(prompts[t - 1]) + NEW - 1
        for a, b in zip(tree, flushed):
            assert b[2] == 0                                              # flushed: nothing cached
            _same(a, b)
    assert served["info"]["integrity"] == "ok"


def test_a_batch_of_final_prompts_answers_as_each_alone(served):
    for conv, out in enumerate(served["batch"]):
        _same(out, served["flushed"][conv][-1])


def test_a_shared_system_prompt_is_reused_by_the_next_conversation(served):
    first_a, first_b, sys_len = served["shared"]
    assert first_a[2] == 0 and first_b[2] >= sys_len - 1


def test_a_retracted_request_answers_as_if_never_retracted(served, retracted):
    assert retracted["info"]["retracted"] >= 2                     # the forced retractions happened
    assert retracted["info"]["integrity"] == "ok"
    flushed = [out for row in served["flushed"] for out in row]
    assert len(retracted["outs"]) == len(flushed) == 6
    for out, alone in zip(retracted["outs"], flushed):
        _same(out, alone)
