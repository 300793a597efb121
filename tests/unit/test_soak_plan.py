"""benchmarks/serving/soak_faults: the session plan, the outcome of a request, the run's counts (no server)."""

import collections
import json

import pytest

from benchmarks.serving.soak_faults.after_load import logged_retractions
from benchmarks.serving.soak_faults.client import usage_fields
from benchmarks.serving.soak_faults.outcomes import (
    attribute_kill,
    classify,
    error_message,
    read_stream,
    rss_check,
    session_status,
    summarize,
)
from benchmarks.serving.soak_faults.plan import (
    FAULTS,
    QUESTIONS,
    SHARES,
    Turn,
    burst_turns,
    chat_payload,
    pick_fault,
    plan_session,
    question_text,
)

WORDS = 17000  # about the essays' length


def test_a_plan_is_fixed_by_seed_and_index_alone():
    assert plan_session(0, 7, WORDS) == plan_session(0, 7, WORDS)
    assert plan_session(0, 7, WORDS) != plan_session(1, 7, WORDS)
    assert [plan_session(3, i, WORDS) for i in range(50)] == [plan_session(3, i, WORDS) for i in range(50)]
    assert len({plan_session(0, i, WORDS).turns for i in range(50)}) == 50


def test_fault_slices_follow_the_shares():
    assert pick_fault(0.0, SHARES) == "abort" and pick_fault(0.079, SHARES) == "abort"
    assert pick_fault(0.08, SHARES) == "hangup" and pick_fault(0.159, SHARES) == "hangup"
    assert pick_fault(0.16, SHARES) == "abandon" and pick_fault(0.28, SHARES) == "pressure"
    assert pick_fault(0.34, SHARES) is None and pick_fault(0.999, SHARES) is None
    assert pick_fault(0.5, {"pressure": 1.0}) == "pressure"


def test_shares_are_respected_over_many_sessions_and_every_fault_occurs():
    n = 4000
    faults = collections.Counter(plan_session(0, i, WORDS).fault for i in range(n))
    for kind in FAULTS:
        assert abs(faults[kind] / n - SHARES[kind]) < 0.015, (kind, faults)
    assert abs(faults[None] / n - (1 - sum(SHARES.values()))) < 0.03, faults
    small = {plan_session(0, i, WORDS).fault for i in range(100)}
    assert set(FAULTS) <= small, small


def test_each_fault_shapes_its_session():
    plans = [plan_session(0, i, WORDS) for i in range(600)]
    for p in plans:
        assert 2 <= p.planned_turns <= 4
        assert all(0 <= t.offset and t.offset + t.words <= WORDS for t in p.turns)
        assert p.turns[0].think_s == 0 and all(0 <= t.think_s <= 2 for t in p.turns)
        if p.fault is None:
            assert len(p.turns) == p.planned_turns and not any(t.fault for t in p.turns)
            assert all(16 <= t.max_tokens <= 32 and t.words <= 100 and not t.ignore_eos for t in p.turns)
        elif p.fault == "abort":  # given up on, then the same question again, then the rest
            i = next(k for k, t in enumerate(p.turns) if t.fault == "abort")
            cut, retry = p.turns[i], p.turns[i + 1]
            assert not cut.stream and 0.2 <= cut.give_up_s <= 2.0
            assert (retry.offset, retry.words, retry.question) == (cut.offset, cut.words, cut.question)
            assert retry.fault is None
            assert len(p.turns) == p.planned_turns + 1
            assert p.conversation_turns() == list(range(1, i + 2)) + list(range(i + 1, p.planned_turns + 1))
        elif p.fault == "hangup":  # the last request: streamed, closed after 1-4 chunks
            assert p.turns[-1].fault == "hangup" and p.turns[-1].stream and 1 <= p.turns[-1].chunks <= 4
            assert len(p.turns) <= p.planned_turns and not any(t.fault for t in p.turns[:-1])
        elif p.fault == "abandon":
            assert 1 <= len(p.turns) < p.planned_turns
        else:  # pressure: long passages, long answers that ignore EOS
            assert p.planned_turns <= 3
            assert all(t.ignore_eos and t.words >= 300 and t.max_tokens >= 150 for t in p.turns)


def test_a_burst_is_fixed_by_seed_and_number_and_asks_long_answers():
    one = burst_turns(0, 0, 12, WORDS)
    assert one == burst_turns(0, 0, 12, WORDS) and one != burst_turns(0, 1, 12, WORDS)
    assert len(one) == 12 and len({t.offset for t in one}) == 12
    assert all(t.ignore_eos and 500 <= t.words <= 700 and 250 <= t.max_tokens <= 350 and not t.fault for t in one)
    assert all(t.offset + t.words <= WORDS for t in one)


def test_payload_asks_greedy_and_ignore_eos_only_when_planned():
    p = next(plan_session(0, i, WORDS) for i in range(200) if plan_session(0, i, WORDS).fault == "pressure")
    payload = chat_payload("m", [{"role": "user", "content": "x"}], p.turns[0])
    assert payload["temperature"] == 0 and payload["ignore_eos"] is True
    assert payload["max_tokens"] == p.turns[0].max_tokens
    plain = Turn(offset=2, words=3, question=1, max_tokens=30, think_s=0, stream=False)
    assert "ignore_eos" not in chat_payload("m", [], plain)
    words = "a b c d e f".split()
    assert question_text(plain, words) == "c d e\n\n" + QUESTIONS[1]


def raw(status=200, text=None, error="", **kw):
    return {"status": status, "text": text, "error": error, **kw}


@pytest.mark.parametrize("r, kind", [
    (raw(text="Paris."), "answered"),
    (raw(text=""), "answered"),                                             # an empty reply is a reply
    (raw(400, error="prompt too long"), "clear error"),
    (raw(503, error="No available workers"), "clear error"),
    (raw(500, error=""), "connection error"),                               # no message: not a clear error
    (raw(200, error="Out of memory", stream_error=True), "clear error"),    # an error chunk in the stream
    (raw(200, error="the stream ended without [DONE]"), "connection error"),
    (raw(-1, error="[Errno 111] Connection refused"), "connection error"),
    (raw(-1, error="timed out", timed_out=True), "timed out"),
    (raw(-1, error="timed out", gave_up="abort"), "client abort"),
    (raw(200, gave_up="hangup"), "client hang-up"),
])
def test_classify(r, kind):
    assert classify(r) == kind


def test_error_messages_of_sglang_and_the_router():
    assert error_message({"object": "error", "message": "bad", "code": 400}) == "bad"
    assert error_message({"error": {"message": "oom", "code": 400}}) == "oom"
    assert error_message({"error": "no worker"}) == "no worker"
    assert error_message(" Service Unavailable \n") == "Service Unavailable"
    assert error_message("") == "" and error_message({}) == ""


def sse(*objs, done=True):
    lines = [b"data: " + json.dumps(o).encode() + b"\n" for o in objs] + [b"\n"]
    return lines + ([b"data: [DONE]\n"] if done else [])


CHUNKS = [{"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
          {"choices": [{"delta": {"content": "Hel"}, "finish_reason": None}]},
          {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]},
          {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
                                    "prompt_tokens_details": {"cached_tokens": 4}}}]


def test_a_stream_is_read_to_its_end_or_hung_up_on():
    out = read_stream(sse(*CHUNKS))
    assert out["text"] == "Hello" and out["finish"] == "stop" and not out["error"] and out["gave_up"] is None
    assert usage_fields(out) == {"prompt_tokens": 9, "completion_tokens": 2, "cached_tokens": 4}
    cut = read_stream(sse(*CHUNKS), hang_up_after=2)
    assert cut["gave_up"] == "hangup" and cut["text"] is None and classify({"status": 200, **cut}) == "client hang-up"
    late = read_stream(sse(*CHUNKS), hang_up_after=9)  # the answer ended first: an answer
    assert late["gave_up"] is None and classify({"status": 200, **late}) == "answered"
    broken = read_stream(sse(*CHUNKS[:2], done=False))
    assert broken["text"] is None and classify({"status": 200, **broken}) == "connection error"
    err = read_stream(sse(CHUNKS[0], {"error": {"message": "KV pool exhausted", "code": 500}}))
    assert err["error"] == "KV pool exhausted" and classify({"status": 200, **err}) == "clear error"


def test_errors_while_a_replica_was_down_are_the_kills():
    reqs = [{"kind": "connection error", "t0": 95.0, "t1": 101.0},    # running at the kill
            {"kind": "clear error", "t0": 120.0, "t1": 120.5},        # while it was down
            {"kind": "connection error", "t0": 150.0, "t1": 170.0},   # within the grace after the restart
            {"kind": "clear error", "t0": 200.0, "t1": 201.0},        # after the grace: its own kind
            {"kind": "answered", "t0": 110.0, "t1": 112.0},
            {"kind": "client abort", "t0": 110.0, "t1": 111.0},
            {"kind": "timed out", "t0": 10.0, "t1": 130.0}]           # no answer: never excused by the kill
    assert attribute_kill(reqs, [(100.0, 160.0)]) == 3
    assert [r["kind"] for r in reqs] == ["replica killed"] * 3 + ["clear error", "answered", "client abort",
                                                                  "timed out"]
    assert attribute_kill(reqs, []) == 0


def test_session_status():
    plain = plan_session(0, next(i for i in range(100) if plan_session(0, i, WORDS).fault is None), WORDS)
    n = len(plain.turns)
    assert session_status(plain, ["answered"] * n) == "finished"
    assert session_status(plain, ["answered", "replica killed"]) == "ended by error"
    abort = next(p for p in (plan_session(0, i, WORDS) for i in range(200)) if p.fault == "abort")
    kinds = ["client abort" if t.fault else "answered" for t in abort.turns]
    assert session_status(abort, kinds) == "finished"
    hang = next(p for p in (plan_session(0, i, WORDS) for i in range(200)) if p.fault == "hangup")
    assert session_status(hang, ["answered"] * (len(hang.turns) - 1) + ["client hang-up"]) == "hung up"
    gone = next(p for p in (plan_session(0, i, WORDS) for i in range(200)) if p.fault == "abandon")
    assert session_status(gone, ["answered"] * len(gone.turns)) == "abandoned"


def test_summary_counts():
    sessions = [{"fault": None, "status": "finished"}, {"fault": None, "status": "ended by error"},
                {"fault": "abort", "status": "finished"}, {"fault": "hangup", "status": "hung up"},
                {"fault": "abandon", "status": "abandoned"}, {"fault": "pressure", "status": "finished"}]
    reqs = ([{"fault": None, "kind": "answered"}] * 10
            + [{"fault": "abort", "kind": "client abort"}, {"fault": "abort", "kind": "answered"},
               {"fault": "hangup", "kind": "client hang-up"},
               {"fault": None, "kind": "replica killed", "error": "connection refused"},
               {"fault": None, "kind": "replica killed", "error": "connection refused"},
               {"fault": None, "kind": "timed out", "error": "timed out"},
               {"fault": "burst", "kind": "answered"}, {"fault": "burst", "kind": "clear error", "error": "oom"}])
    s = summarize(sessions, reqs, kills=1)
    assert s["sessions"] == 6 and s["requests"] == 18
    assert s["sessions_by_status"] == {"finished": 3, "abandoned": 1, "hung up": 1, "ended by error": 1}
    assert s["sessions_by_fault"] == {"abort": 1, "hangup": 1, "abandon": 1, "pressure": 1, "none": 2}
    assert s["outcomes"]["answered"] == 12 and s["outcomes"]["replica killed"] == 2
    assert s["outcomes"]["clear error"] == 1
    assert sum(s["outcomes"].values()) == 18
    assert s["faults_injected"] == {"abort (requests)": 2, "abort took effect": 1, "hangup (requests)": 1,
                                    "hangup took effect": 1, "abandon (sessions)": 1, "pressure (sessions)": 1,
                                    "pressure burst (requests)": 2, "replica kill": 1}
    assert s["answered_share"] == round(12 / 16, 4) and s["hung"] == 1
    assert s["errors"] == {"replica killed: connection refused": 2, "timed out: timed out": 1, "clear error: oom": 1}


def test_rss_check():
    assert rss_check(1000, 1080, 0.10) == {"start_mb": 1000, "end_mb": 1080, "delta_mb": 80, "delta_share": 0.08,
                                           "within": True}
    assert not rss_check(1000, 1150, 0.10)["within"]
    assert rss_check(1000, 900, 0.10)["within"]  # below the start is back to it


def test_retractions_are_read_from_sglangs_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[12:00:01] Decode batch, #running-req: 3\n"
                   "[12:00:02] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 52\n"
                   "[12:00:09] KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: 10\n")
    assert logged_retractions(str(log)) == 3
    assert logged_retractions(str(tmp_path / "missing.log")) == 0
