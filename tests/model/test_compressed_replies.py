"""--tangram-replies compressed: the assistant's messages kept at the profile's budgets once closed.

On SmolLM2 with the shipped FastKVzip profile, one chat conversation of two turns, the first reply fed
back as tokens: the second turn reads its history from the tree up to the reply's message start (that
message, open when it was generated, is closed now, so it is recomputed and compressed with the new
turn), and answers as it does with the tree flushed (a hit equals a recompute under this rule too).
Integrity holds.
"""

import atexit

import pytest
import sglang
from served import IDLE_KWARGS, flush_engine

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
NEW = 96   # a reply longer than the 64 newest tokens a closed message protects: compressed in part
SAMPLING = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}


def _ask(engine, ids):
    (o,) = engine.generate(input_ids=[ids], sampling_params=SAMPLING, return_logprob=True)
    return o["output_ids"], [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]], o["meta_info"]["cached_tokens"]


@pytest.fixture(scope="module")
def served(smollm2_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    words = (REPO / "configs" / "CALIBRATION.md").read_text().split()
    users = [" ".join(words[400 * t: 400 * t + 400]) + " Summarize." for t in range(2)]
    engine = sglang.Engine(model_path=smollm2_path, dtype="float32", max_total_tokens=16384, log_level="error",
                           tangram_profile=str(REPO / "configs" / "smollm2-fastkvzip.yaml"), tangram_ratio=0.4,
                           tangram_replies="compressed", **IDLE_KWARGS)
    try:
        ids = list(tok.apply_chat_template([{"role": "user", "content": users[0]}], tokenize=True,
                                           add_generation_prompt=True, return_dict=True)["input_ids"])
        first = _ask(engine, ids)
        prompts = [ids, ids + first[0] + tok.encode(f"<|im_end|>\n<|im_start|>user\n{users[1]}<|im_end|>\n"
                                                    "<|im_start|>assistant\n")]
        second = _ask(engine, prompts[1])
        flush_engine(engine)
        flushed = _ask(engine, prompts[1])
        info = engine.get_server_info()["internal_states"][0]["tangram"]["pool_info"]
    finally:
        engine.shutdown()
        atexit.unregister(engine.shutdown)
    return dict(prompts=prompts, second=second, flushed=flushed, info=info,
                header=len(tok.encode("<|im_start|>assistant\n")))


def test_a_later_turn_reads_its_history_up_to_the_reply_it_recomputes(served):
    assert served["second"][2] == len(served["prompts"][0]) - served["header"]
    assert served["info"]["integrity"] == "ok"


def test_a_turn_answers_alike_from_the_tree_and_recomputed(served):
    tree, flushed = served["second"], served["flushed"]
    assert flushed[2] == 0 and tree[0] == flushed[0]
    assert max(abs(a - b) for a, b in zip(tree[1], flushed[1])) < 1e-3
