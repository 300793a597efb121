"""SGLang sessions (``/open_session``, ``session_params``) with a profile. Ours, not a kit: the
wheel ships no session test for non-streaming sessions (SGLang's test_session_control lives in
its repository). Streaming sessions (``--enable-streaming-session``) are refused at launch
(tangram_sglang/sglang/compatibility.py; tests/unit/test_compatibility.py).

A session request continues a previous request of the session: its prompt is that request's
prompt + output + the new tokens, so its history comes back through the segment radix tree.
The session answers exactly what the same tokens sent without a session get (both read the same tree).
"""

from __future__ import annotations

import requests

SP = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def _post(server, path: str, payload: dict) -> dict:
    resp = requests.post(server.url + path, json=payload, timeout=180)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _ids(server, text: str) -> list[int]:
    return _post(server, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]


def test_session_turns_match_the_same_tokens_without_a_session(upstream_server):
    srv = upstream_server
    sid = _post(srv, "/open_session", {"capacity_of_str_len": 8192})
    turns = [_ids(srv, "The history of the printing press begins in the fifteenth century, when"),
             _ids(srv, " Meanwhile, in a different part of the world,"),
             _ids(srv, " To summarize the two paragraphs above:")]
    history, rid = [], None
    for i, turn in enumerate(turns):
        out = _post(srv, "/generate", {"input_ids": turn, "sampling_params": SP,
                                       "session_params": {"id": sid, "rid": rid}})
        rid = out["meta_info"]["id"]
        history = history + turn
        # The same tokens sent on their own: the session prepended exactly its history.
        alone = _post(srv, "/generate", {"input_ids": history, "sampling_params": SP})
        assert out["meta_info"]["prompt_tokens"] == len(history)
        assert out["output_ids"] == alone["output_ids"], i
        if i > 0:  # the history came back from the tree
            assert out["meta_info"]["cached_tokens"] >= len(history) - len(turn) - 1
        history = history + out["output_ids"]
    requests.post(srv.url + "/close_session", json={"session_id": sid}, timeout=60)
    late = requests.post(srv.url + "/generate", json={"input_ids": turns[0], "sampling_params": SP,
                                                      "session_params": {"id": sid, "rid": rid}}, timeout=60)
    assert late.status_code == 400 or late.json()["meta_info"]["finish_reason"]["type"] == "abort", late.text
    _pool_sound(srv)


def test_session_branches_from_an_earlier_turn(upstream_server):
    srv = upstream_server
    sid = _post(srv, "/open_session", {"capacity_of_str_len": 8192})
    first = _post(srv, "/generate", {"input_ids": _ids(srv, "A short story about a lighthouse keeper:"),
                                     "sampling_params": SP, "session_params": {"id": sid}})
    rid1, done = first["meta_info"]["id"], first["meta_info"]["prompt_tokens"] + len(first["output_ids"])
    for text in (" Then a storm came.", " Then a ship arrived."):
        turn = _ids(srv, text)
        out = _post(srv, "/generate", {"input_ids": turn, "sampling_params": SP,
                                       "session_params": {"id": sid, "rid": rid1}})
        # Each continues turn one (not the other branch), whose prompt and output come from the tree.
        assert out["meta_info"]["prompt_tokens"] == done + len(turn)
        assert out["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"]
    requests.post(srv.url + "/close_session", json={"session_id": sid}, timeout=60)
    _pool_sound(srv)


def _pool_sound(srv) -> None:
    info = requests.get(srv.url + "/server_info", timeout=30).json()["internal_states"][0]
    pool = (info.get("tangram") or {}).get("pool_info")
    if pool is not None:  # stock SGLang has none
        assert pool["integrity"] == "ok", pool
        assert pool["running_requests"] == 0, pool
