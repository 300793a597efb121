"""Two Tangram replicas behind sglang-router (the pinned registry package): the cache-aware policy
keeps a conversation on the replica that holds its compressed history; round-robin does not."""

import os

import pytest
from served import IDLE_ARGS, generate, get_status

from tangram_sglang.sglang.server_process import RouterProcess, ServerProcess, start_all

PORT = 31771
PROFILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "smollm2-fastkvzip.yaml")
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
QUESTIONS = ["Name three rivers of Europe and one fact about each of them.",
             "Which of them is the longest, and which countries does it cross?",
             "Write one sentence about its delta."]


@pytest.fixture(scope="module")
def replicas(smollm2_path):
    servers = [ServerProcess(smollm2_path, port=PORT + 1 + i, profile=PROFILE,
                             extra_args=["--max-total-tokens", "4096", "--tangram-ratio", "0.5", *IDLE_ARGS],
                             log_path=f"/tmp/tangram-test-replica-{i}.log") for i in range(2)]
    try:
        yield start_all(servers)
    finally:
        for s in servers:
            s.stop()


def conversation(url: str, tag: str) -> list[dict]:
    """Three turns; each prompt extends the previous prompt and answer. Returns the meta_infos."""
    history, metas = SYSTEM, []
    for q in QUESTIONS:
        prompt = f"{history}<|im_start|>user\n{tag} {q}<|im_end|>\n<|im_start|>assistant\n"
        out = generate(url, {"text": prompt, "sampling_params": {
            "temperature": 0, "max_new_tokens": 16, "ignore_eos": True}})
        metas.append(out["meta_info"])
        history = prompt + out["text"] + "<|im_end|>\n"
    return metas


@pytest.mark.parametrize("policy", ["cache_aware", "round_robin"])
def test_router_in_front_of_two_replicas(replicas, policy):
    with RouterProcess([s.url for s in replicas], port=PORT, policy=policy,
                       log_path=f"/tmp/tangram-test-router-{policy}.log") as router:
        metas = conversation(router.url, f"[{policy}]")
        assert all(m["completion_tokens"] == 16 for m in metas)
        later = [m["cached_tokens"] / m["prompt_tokens"] for m in metas[1:]]
        if policy == "cache_aware":  # later turns go where the history is: most of the prompt is cached
            assert min(later) > 0.5, later
        else:  # turn 2 alternates to the replica that never saw this conversation
            assert later[0] < 0.5, later
    assert all(get_status(s.url + "/health") == 200 for s in replicas)
