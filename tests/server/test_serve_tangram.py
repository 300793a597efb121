"""End to end: SGLang serves SmolLM2 with Tangram compression (SnapKV profile, rho = 0.25).

One server (port 31741, the default pool) for the API, metrics, frontend,
multi-turn reuse and concurrency tests; then a second one with a small pool (port 31742,
``--max-total-tokens 1024`` = 5760 ragged pages) for the soak, where the
segment tree must evict, and for a prompt that can never fit. The main server
is stopped before the small one starts: an idle SGLang scheduler busy-polls a
core, and this machine has two.

Prefix reuse (cached_tokens) follows stock SGLang: a request that re-sends
prompt + output of an earlier one reuses len(prompt) + len(output) - 1 tokens,
the last generated token never having had its KV computed. Checked by hand
against a stock server (same flags, no profile): 300-token prompt, 12 tokens
out -> 311 cached on both; 700-token prompt -> 711 on both.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from served import (
    IDLE_ARGS,
    essay_token_ids,
    flush,
    generate,
    get_status,
    log_tracebacks,
    post,
    state,
    stream_and_hang_up,
    wait_idle,
)

from tangram_sglang.sglang.server_process import ServerProcess

PORT = 31741
SOAK_PORT = 31742
REPO = pathlib.Path(__file__).resolve().parents[2]
PROFILE = str(REPO / "configs" / "smollm2-snapkv.yaml")
RATIO = 0.25
SOAK_SESSIONS = 20  # on 8 client threads: the pool evicts after a few; the soak tier runs thousands of operations
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
_LIVE: list[ServerProcess] = []  # this module's running servers


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def essay_ids(tokenizer):
    return essay_token_ids(tokenizer)


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, port=PORT, profile=PROFILE,
                       extra_args=["--tangram-ratio", str(RATIO), "--enable-cache-report", "--enable-metrics",
                                   *IDLE_ARGS]) as srv:
        _LIVE.append(srv)
        yield srv
        _LIVE.remove(srv)


@pytest.fixture(scope="module")
def small_server(smollm2_path):
    for other in _LIVE:  # the tests before this one are done with it
        other.stop()
    with ServerProcess(smollm2_path, port=SOAK_PORT, profile=PROFILE,
                       extra_args=["--tangram-ratio", str(RATIO), "--max-total-tokens", "1024", *IDLE_ARGS]) as srv:
        yield srv


def openai_client(srv: ServerProcess):
    from openai import OpenAI

    return OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=180)


# -- the main server ------------------------------------------------------------------------------
def test_chat_streaming_and_generate(server):
    client = openai_client(server)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 8 and reply.choices[0].finish_reason == "length"
    assert isinstance(reply.choices[0].message.content, str) and reply.choices[0].message.content

    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    chunks = [c for c in stream if c.choices]
    pieces = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert len(pieces) >= 2 and "".join(pieces)
    assert chunks[-1].choices[0].finish_reason == "length"
    # Same greedy request, same tokens, streamed or not.
    assert "".join(pieces) == reply.choices[0].message.content

    out = generate(server.url, {"text": "The capital of France is",
                                "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}})
    assert len(out["output_ids"]) == 6 and out["meta_info"]["completion_tokens"] == 6 and out["text"]

    with urllib.request.urlopen(server.url + "/server_info", timeout=30) as r:
        tangram = json.loads(r.read())["internal_states"][0]["tangram"]
    assert tangram["ratio"] == RATIO and tangram["method"] == "snapkv" and tangram["profile"] == PROFILE
    assert tangram["pool_info"]["integrity"] == "ok"


def test_chat_completion_multi_turn(server):
    """A short conversation (all within the protected newest tokens: nothing to compress) answers
    like the model; turn 2 re-sends turn 1, which the radix tree serves from cache."""
    client = openai_client(server)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0)
    assert "Paris" in first.choices[0].message.content
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And of Italy?"}]
    second = client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0)
    assert second.choices[0].message.content.strip()
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_a_request_asks_for_another_ratio_of_the_profile(server, essay_ids):
    """custom_params {"tangram_ratio": r} (OpenAI extra_body, /generate's sampling_params) serves a request at
    another ratio of the profile; its history is reused at that ratio only; a ratio the profile lacks is an
    HTTP 400 naming the profile's ratios, and the server keeps serving."""
    import openai

    client = openai_client(server)
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0,
                                           extra_body={"custom_params": {"tangram_ratio": 0.5}})
    assert reply.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match=r"tangram_ratio 0\.4 is not one of the served profile's "
                                                     r"ratios \(0\.25, 0\.5, 0\.7\)"):
        client.chat.completions.create(model="m", messages=messages, max_tokens=4,
                                       extra_body={"custom_params": {"tangram_ratio": 0.4}})
    ids = essay_ids[3000:3600]
    params = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
    first = generate(server.url, {"input_ids": ids, "sampling_params": {**params, "custom_params": {"tangram_ratio": 0.7}}})
    again = generate(server.url, {"input_ids": ids, "sampling_params": {**params, "custom_params": {"tangram_ratio": 0.7}}})
    served = generate(server.url, {"input_ids": ids, "sampling_params": params})
    assert len(first["output_ids"]) == 4 and again["output_ids"] == first["output_ids"]
    # the same prompt again reads all of it from the tree but the last token (SGLang prefills at least that
    # one): its first 512-token chunk compressed, the open rest kept whole; at the served ratio nothing
    assert again["meta_info"]["cached_tokens"] == len(ids) - 1 and served["meta_info"]["cached_tokens"] == 0
    assert state(server)[0]["integrity"] == "ok"


def scrape(url: str) -> dict[str, float]:
    """{metric name with labels: value} of a Prometheus text page."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def _one(metrics: dict[str, float], name: str) -> float:
    (value,) = [v for k, v in metrics.items() if k.split("{")[0] == name]
    return value


def test_pool_gauges_on_sglang_metrics_endpoint(server):
    generate(server.url, {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 4}})
    metrics = scrape(server.url)
    info, _ = state(server)
    assert _one(metrics, "tangram:pages_total") == info["pages_total"] > 0
    assert _one(metrics, "sglang:num_running_reqs") >= 0  # beside stock SGLang's own gauges
    # Set at the last prefill log: at least this request was admitted, none refused.
    assert 1 <= _one(metrics, "tangram:admitted") <= info["admitted"]
    assert _one(metrics, "tangram:too_large") == info["too_large"] == 0
    assert 0 < _one(metrics, "tangram:pages_used") <= info["pages_total"]
    labels = [k for k in metrics if k.startswith("tangram:pages_total")][0]
    assert 'model_name="' in labels  # SGLang's labels


def test_frontend_program_three_turns(server):
    import sglang as sgl

    @sgl.function
    def chat(s, questions):
        s += sgl.system(SYSTEM)
        for i, q in enumerate(questions):
            s += sgl.user(q)
            s += sgl.assistant(sgl.gen(f"a{i + 1}", max_tokens=16, temperature=0))

    flush(server)
    sgl.set_default_backend(sgl.RuntimeEndpoint(server.url, chat_template_name="chatml"))  # SmolLM2 is ChatML
    st = chat.run(questions=["What is the capital of France?", "And the capital of Italy?",
                             "Name a river that flows through one of them."])
    assert st.error() is None
    metas = [st.get_meta_info(f"a{i}") for i in (1, 2, 3)]
    for i, meta in enumerate(metas, 1):
        assert isinstance(st[f"a{i}"], str) and 1 <= meta["completion_tokens"] <= 16
    assert st.text().count("<|im_start|>assistant") == 3
    # Turn k re-sends turn k-1's prompt: its compressed chunk is matched whole.
    assert metas[0]["cached_tokens"] == 0
    assert metas[1]["cached_tokens"] >= metas[0]["prompt_tokens"]
    assert metas[2]["cached_tokens"] >= metas[1]["prompt_tokens"]
    info, _ = state(server)
    assert info["pages_held_by_tree"] > 0 and info["tokens_held"] >= metas[2]["prompt_tokens"]
    assert info["integrity"] == "ok" and info["running_requests"] == 0
    # The whole conversation sent again: everything up to the last turn's prompt comes from the tree.
    again = generate(server.url, {"text": st.text(), "sampling_params": {"temperature": 0, "max_new_tokens": 1}})
    assert again["meta_info"]["cached_tokens"] >= metas[2]["prompt_tokens"]


@pytest.mark.parametrize("prompt_len", [300, 700])  # 700 > the 512-token compression chunk
def test_multi_turn_reuses_prompt_and_output(server, essay_ids, prompt_len):
    flush(server)
    start = 2000 if prompt_len == 300 else 6000
    prompt = essay_ids[start:start + prompt_len]
    fresh = iter(range(start + 3000, len(essay_ids), 40))
    sp = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    turns = []
    for _ in range(3):
        out = generate(server.url, {"input_ids": prompt, "sampling_params": sp})
        assert len(out["output_ids"]) == 12 and out["meta_info"]["prompt_tokens"] == len(prompt)
        turns.append((len(prompt), out["meta_info"]["cached_tokens"]))
        nxt = next(fresh)
        prompt = prompt + out["output_ids"] + essay_ids[nxt:nxt + 40]
    assert turns[0][1] == 0
    for (prev_len, _), (_, cached) in zip(turns, turns[1:]):
        # Everything but the last generated token of the previous turn (stock SGLang: the same).
        assert cached == prev_len + 12 - 1
    info, _ = state(server)
    assert info["integrity"] == "ok" and info["running_requests"] == 0
    assert info["pages_used"] == info["pages_held_by_tree"] > 0
    if prompt_len == 700:
        # ~800 tokens held, mostly in rho = 0.25 compressed chunks (page rounding and the uncompressed
        # generated tails eat part of it).
        assert info["saved_vs_full_kv"] > 0.4, info


def test_concurrent_chat_sessions(server):
    flush(server)
    client = openai_client(server)
    topics = ["France", "Italy", "Spain", "Japan", "Brazil", "Canada", "Egypt", "India",
              "Kenya", "Norway", "Peru", "Chile", "Greece", "Mexico", "Turkey", "Vietnam"]

    def session(topic: str) -> list:
        messages = [{"role": "system", "content": SYSTEM}]
        usages = []
        for q in (f"Tell me about {topic}.", "What is its capital?", "Name one famous dish from there."):
            messages.append({"role": "user", "content": q})
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0,
                                                   extra_body={"ignore_eos": True})
            text = reply.choices[0].message.content
            assert isinstance(text, str) and reply.usage.completion_tokens == 16
            usages.append(reply.usage)
            messages.append({"role": "assistant", "content": text})
        return usages

    with ThreadPoolExecutor(len(topics)) as ex:
        results = list(ex.map(session, topics))
    assert len(results) == 16
    for usages in results:
        # Turn k's prompt holds turn k-1's prompt: that compressed chunk is matched whole.
        for prev, cur in zip(usages, usages[1:]):
            assert cur.prompt_tokens > prev.prompt_tokens + 8  # answer + next question + template
            assert cur.prompt_tokens_details.cached_tokens >= prev.prompt_tokens
    assert get_status(server.url + "/health") == 200
    info, batch = wait_idle(server)
    assert info["integrity"] == "ok" and info["running_requests"] == 0
    assert batch["peak_running"] >= 8, batch  # the sessions really ran side by side
    assert info["pages_used"] == info["pages_held_by_tree"] > 0
    assert log_tracebacks(server) == []


def test_stream_hang_up_aborts_request(server, essay_ids):
    """A client that closes a stream mid-way: SGLang aborts the request (2 s later), its pages go back."""
    flush(server)
    prompt = essay_ids[12000:12200]
    sp = {"temperature": 0, "max_new_tokens": 1000, "ignore_eos": True}
    assert stream_and_hang_up(PORT, {"input_ids": prompt, "sampling_params": sp}, 2) == 2
    info, batch = wait_idle(server, timeout=30)
    # 1000 tokens take minutes on this CPU (about 5-20 decode steps a second): idle within the wait means
    # it was aborted.
    assert info["running_requests"] == 0 and batch["running"] == 0, (info, batch)
    assert info["integrity"] == "ok" and info["pages_used"] == info["pages_held_by_tree"], info
    # What it computed before the abort stays reusable: its prompt chunk is in the tree.
    out = generate(server.url, {"input_ids": prompt + essay_ids[13000:13020],
                                "sampling_params": {"temperature": 0, "max_new_tokens": 2}})
    assert out["meta_info"]["cached_tokens"] >= len(prompt)
    assert get_status(server.url + "/health") == 200


# -- the small pool -------------------------------------------------------------------------------
def test_soak_small_pool(small_server, essay_ids, tokenizer):
    url, rng0 = small_server.url, random.Random(0)

    def user(ids, first=False):   # a chat turn's tokens (the chunk rule compresses a closed user message)
        text = tokenizer.decode(ids)
        if first:
            return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                      add_generation_prompt=True, return_dict=False))
        return tokenizer.encode(f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                                add_special_tokens=False)

    seeds = [rng0.randrange(1 << 30) for _ in range(SOAK_SESSIONS)]
    tally = {"completed": 0, "aborted": 0, "abandoned": 0, "cached": 0}
    lock = threading.Lock()

    def count(key: str, n: int = 1) -> None:
        with lock:
            tally[key] += n

    def session(seed: int) -> None:
        rng = random.Random(seed)
        pos = rng.randrange(0, len(essay_ids) - 2500)
        hist = user(essay_ids[pos:pos + rng.randint(50, 400)], first=True)
        pos += 1000
        for turn in range(3):
            if turn > 0 and rng.random() < 0.3:
                count("abandoned")  # leaves its segments in the tree
                return
            sp = {"temperature": 0, "max_new_tokens": rng.randint(4, 40), "ignore_eos": True}
            if rng.random() < 0.15:
                sp["max_new_tokens"] = 40
                got = stream_and_hang_up(SOAK_PORT, {"input_ids": hist, "sampling_params": sp}, rng.randint(1, 3))
                assert got >= 1
                count("aborted")
                return
            out = generate(url, {"input_ids": hist, "sampling_params": sp})
            meta = out["meta_info"]
            assert len(out["output_ids"]) == sp["max_new_tokens"] and meta["prompt_tokens"] == len(hist)
            assert 0 <= meta["cached_tokens"] < len(hist)
            count("completed")
            count("cached", meta["cached_tokens"])
            n = rng.randint(10, 50)
            hist = hist + out["output_ids"] + user(essay_ids[pos:pos + n])
            pos += n

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(session, seeds))
    assert tally["completed"] >= SOAK_SESSIONS and tally["aborted"] >= 2 and tally["abandoned"] >= 2, tally
    assert tally["cached"] > 0, tally  # later turns still found their history despite eviction

    assert get_status(url + "/health") == 200
    info, batch = wait_idle(small_server)
    print("soak:", tally, {k: info[k] for k in ("admitted", "waited", "evicted_segments", "retracted",
                                                "peak_admitted", "peak_pages_used", "pages_used")})
    assert info["integrity"] == "ok", info
    assert info["running_requests"] == 0 and batch["running"] == 0 and batch["waiting"] == 0
    assert info["evicted_segments"] > 0, info  # the pool was too small to keep every turn
    assert info["peak_pages_used"] <= info["pages_total"] == 5760
    assert info["pages_used"] == info["pages_held_by_tree"] > 0
    info = flush(small_server)
    assert info["pages_free"] == info["pages_total"] and info["integrity"] == "ok"
    assert log_tracebacks(small_server) == []
    out = generate(url, {"input_ids": essay_ids[:200],
                         "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}})
    assert len(out["output_ids"]) == 4


def test_prompt_that_never_fits_is_refused(small_server, essay_ids, smollm2_path):
    with open(os.path.join(smollm2_path, "config.json")) as f:
        assert json.load(f)["max_position_embeddings"] > 6000  # the model could read it; the pool cannot
    before, _ = state(small_server)
    status, body = post(small_server.url + "/generate",
                        {"input_ids": essay_ids[:6000], "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
    assert status == 400, body
    message = body["error"]["message"]
    assert "prompt of 6000 tokens" in message and "ragged KV pool" in message, message
    assert "whole pool has 5760" in message and "can never be served" in message, message

    assert get_status(small_server.url + "/health") == 200
    out = generate(small_server.url, {"input_ids": essay_ids[100:400],
                                      "sampling_params": {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}})
    assert len(out["output_ids"]) == 5
    after, _ = wait_idle(small_server)
    assert after["too_large"] == before["too_large"] + 1
    assert after["integrity"] == "ok" and after["running_requests"] == 0
