"""Bad requests over HTTP against a small pool: each one ends as stock SGLang would end it (or
better: stock 0.5.23 crashes its scheduler on an empty prompt), and after each the server is up,
the pool's integrity check holds and nothing is left running.

The server: SmolLM2, snapkv profile at 0.25, ``--max-total-tokens 384`` (2160 ragged pages; the
longest prompt it can ever serve is reported in /server_info as max_prompt_tokens, ~1260 tokens).
Stock answers, checked by hand on the same flags without a profile: max_new_tokens 0 -> 200 with
no token; -1 -> 400 "max_new_tokens must be at least 0"; no prompt -> 400; malformed JSON -> 400.
"""

from __future__ import annotations

import http.client
import json
import pathlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from served import IDLE_ARGS, essay_token_ids, flush, generate, get_status, log_tracebacks, post, wait_idle

from tangram_sglang.sglang.server_process import ServerProcess

PORT = 31751
PROFILE = str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "smollm2-snapkv.yaml")


@pytest.fixture(scope="module")
def essay_ids(smollm2_path):
    from transformers import AutoTokenizer

    return essay_token_ids(AutoTokenizer.from_pretrained(smollm2_path))


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, port=PORT, profile=PROFILE,
                       extra_args=["--tangram-ratio", "0.25", "--max-total-tokens", "384", *IDLE_ARGS]) as srv:
        yield srv
        assert log_tracebacks(srv) == []


def sound(srv) -> dict:
    """The server answers, nothing runs, the pool is intact; returns its pool_info."""
    assert get_status(srv.url + "/health") == 200
    info, batch = wait_idle(srv)
    assert info["integrity"] == "ok", info
    assert info["running_requests"] == 0 and batch["running"] == 0 and batch["waiting"] == 0, (info, batch)
    return info


def gen(srv, payload) -> tuple[int, object]:
    return post(srv.url + "/generate", payload)


def message(body) -> str:
    return body["error"]["message"] if isinstance(body, dict) and "error" in body else str(body)


def test_empty_prompts_are_refused(server):
    status, body = gen(server, {"text": "", "sampling_params": {"max_new_tokens": 4}})
    assert status == 400 and "prompt is empty" in message(body), body
    status, body = gen(server, {"input_ids": [], "sampling_params": {"max_new_tokens": 4}})
    assert status == 400, body
    status, body = gen(server, {"sampling_params": {"max_new_tokens": 4}})
    assert status == 400, body
    sound(server)


def test_token_ids_outside_the_vocabulary_are_refused(server):
    """Stock SGLang 0.5.23 embeds whatever ids a client sends: one past the vocabulary kills its
    scheduler (found by the fuzz benchmark, both servers). With a profile: a 400 naming the id."""
    for bad in (49152, 10**6, -1):  # SmolLM2's vocabulary is [0, 49152)
        status, body = gen(server, {"input_ids": [1, 2, bad, 3], "sampling_params": {"max_new_tokens": 4}})
        assert status == 400 and "outside the model's vocabulary" in message(body) and str(bad) in message(body), body
        sound(server)
    status, body = gen(server, {"input_ids": [1, 2, 49151, 3], "sampling_params": {"max_new_tokens": 4}})
    assert status == 200, body  # the last id of the vocabulary is fine
    sound(server)


def test_prompt_at_the_pool_limit_and_one_past_it(server, essay_ids):
    info = sound(server)
    limit = info["max_prompt_tokens"]
    assert 500 < limit < 8192, info  # the pool binds, not the model's context
    flush(server)  # the whole pool for the request at the limit
    status, body = gen(server, {"input_ids": essay_ids[:limit], "sampling_params": {"max_new_tokens": 4}})
    assert status == 200, body
    assert 1 <= body["meta_info"]["completion_tokens"] <= 4
    status, body = gen(server, {"input_ids": essay_ids[:limit + 1], "sampling_params": {"max_new_tokens": 4}})
    assert status == 400, body
    assert f"prompt of {limit + 1} tokens" in message(body) and "ragged KV pool" in message(body), body
    after = sound(server)
    assert after["too_large"] == info["too_large"] + 1


def test_max_new_tokens_zero_negative_and_beyond_the_pool(server, essay_ids):
    status, body = gen(server, {"text": "Hello there", "sampling_params": {"max_new_tokens": 0}})
    assert status == 200 and body["meta_info"]["completion_tokens"] == 0, body  # as stock
    status, body = gen(server, {"text": "Hello there", "sampling_params": {"max_new_tokens": -1}})
    assert status == 400 and "at least 0" in message(body), body  # SGLang's own check
    before = sound(server)
    # Within the model's context (8192), beyond what the pool can ever hold next to this prompt:
    # capped as stock caps to its KV memory, finishing by length, never a 500 mid-decode. Its first
    # 1024 tokens are cached from the test before: with that prefix it cannot fit (the shared tail
    # pages would be copied), so the adder serves it as uncached rather than let it wait forever.
    status, body = gen(server, {"input_ids": essay_ids[:before["max_prompt_tokens"] - 60],
                                "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}})
    assert status == 200, body
    got = body["meta_info"]["completion_tokens"]
    assert 1 <= got < 4000 and body["meta_info"]["finish_reason"]["type"] == "length", body["meta_info"]
    after = sound(server)
    assert after["capped"] == before["capped"] + 1 and after["retracted"] == before["retracted"]


def test_beam_search_is_refused(server):
    """Beams fork KV through SGLang's token-pool rows (a profile's server crashed on it before)."""
    status, body = gen(server, {"text": "The capital of France is",
                                "sampling_params": {"max_new_tokens": 8, "beam_width": 2, "temperature": 0}})
    assert status == 400 and "Beam search" in message(body) and "--tangram-profile" in message(body), body
    status, body = gen(server, {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4}})
    assert status == 200, body
    sound(server)


def test_malformed_json(server):
    for path in ("/generate", "/v1/chat/completions"):
        status, body = _raw(server, path, b"{bad json")
        assert status == 400, body
    sound(server)


def _raw(srv, path: str, body: bytes) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def _abort_after(srv, rid: str, delay: float) -> None:
    time.sleep(delay)
    post(srv.url + "/abort_request", {"rid": rid})


@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_abort_mid_prefill_and_mid_decode(server, essay_ids, where):
    before = sound(server)
    if where == "prefill":  # three 512-token chunks: the abort lands while they are computed
        payload = {"input_ids": essay_ids[2000:3200], "sampling_params": {"max_new_tokens": 8}}
        delay = 0.3
    else:  # a short prompt and a long answer: the abort lands in decode
        payload = {"input_ids": essay_ids[100:160], "sampling_params": {"max_new_tokens": 600, "ignore_eos": True}}
        delay = 3.0
    rid = f"abort-{where}"
    threading.Thread(target=_abort_after, args=(server, rid, delay)).start()
    status, body = gen(server, {**payload, "rid": rid})
    assert status in (200, 400, 503), body  # SGLang's abort answer; never a 500
    if status == 200:
        assert body["meta_info"]["finish_reason"]["type"] == "abort", body["meta_info"]
    after = sound(server)
    assert after["pages_reserved"] == 0 and after["pages_used"] == after["pages_held_by_tree"]
    assert after["admitted"] >= before["admitted"]


def test_client_hang_up_mid_chunk(server, essay_ids):
    """The connection closes while the first of three chunks is prefilled: SGLang aborts it."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/generate", body=json.dumps({"input_ids": essay_ids[4000:5200], "stream": True,
                                                       "sampling_params": {"max_new_tokens": 50}}),
                 headers={"Content-Type": "application/json"})
    time.sleep(0.2)
    conn.close()
    time.sleep(1)
    info = sound(server)
    assert info["pages_reserved"] == 0 and info["pages_used"] == info["pages_held_by_tree"]
    out = generate(server.url, {"input_ids": essay_ids[:50], "sampling_params": {"max_new_tokens": 3}})
    assert len(out["output_ids"]) == 3


def test_64_concurrent_requests_on_a_pool_that_holds_a_few(server, essay_ids):
    flush(server)
    before = sound(server)

    def one(i: int):
        start = 300 * i % (len(essay_ids) - 400)
        return gen(server, {"input_ids": essay_ids[start:start + 120],
                            "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})

    with ThreadPoolExecutor(64) as ex:
        answers = list(ex.map(one, range(64)))
    assert [s for s, _ in answers] == [200] * 64, [b for s, b in answers if s != 200][:2]
    assert all(b["meta_info"]["completion_tokens"] == 8 for _, b in answers)
    after = sound(server)
    assert after["admitted"] - before["admitted"] >= 64
    assert after["waited"] > before["waited"]  # the pool did bind: requests waited for pages
    assert after["peak_pages_used"] <= after["pages_total"]


def test_identical_prompts_racing(server, essay_ids):
    """Twins: eight identical prompts at once get the same greedy answer; the tree keeps one copy
    of the prompt. (The pool is short: a request retracted and re-admitted with its first outputs
    as prompt may add those few tokens again as a compressed chunk beside the decode segment.)"""
    flush(server)
    payload = {"input_ids": essay_ids[7000:7700], "sampling_params": {"temperature": 0, "max_new_tokens": 6}}
    with ThreadPoolExecutor(8) as ex:
        answers = list(ex.map(lambda _: gen(server, payload), range(8)))
    assert all(s == 200 for s, _ in answers), answers
    outs = {tuple(b["output_ids"]) for _, b in answers}
    assert len(outs) == 1, outs
    twins = sound(server)
    flush(server)
    status, _ = gen(server, payload)
    assert status == 200
    single = sound(server)
    # prompt + the 5 outputs with KV (+ the 1-token prompt /health may have sent)
    assert single["tokens_held"] in (705, 706), single
    assert 705 <= twins["tokens_held"] <= 706 + 2 * 6, twins
    assert twins["pages_held_by_tree"] < 1.5 * single["pages_held_by_tree"], (twins, single)
    info = flush(server)
    assert info["pages_free"] == info["pages_total"]
