"""The fidelity benchmark's long tier (benchmarks/fidelity/long_tier.py): scripts, their token ids,
pass 1 with a fake generator, and the exact-fact rule. No server; SmolLM2's tokenizer and the essays."""

import re

import pytest

from benchmarks.fidelity.long_tier import (
    KINDS,
    build,
    exact_fact,
    first_number,
    make_script,
    pass_one,
    question_starts,
)

HISTORY = 7000


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from benchmarks.common.models import ensure_model

    return AutoTokenizer.from_pretrained(ensure_model("smollm2"))


@pytest.fixture(scope="module")
def corpus(tok):
    from tangram_sglang.calibration.datasets import essays_dir
    from tangram_sglang.calibration.needle import EssayCorpus

    return EssayCorpus.load(essays_dir(), tok)


def fake_generator(log):
    """Replies of about 24 tokens that name the turn they answer (so each is traceable in later turns)."""
    def gen(ids, max_new):
        log.append(list(ids))
        return [], f"Reply number {len(log)} " + "and so on " * 5
    return gen


@pytest.fixture(scope="module")
def finished(tok, corpus):
    """{kind: (script, replies, conversation, prompts pass 1 saw)} for one script of each kind."""
    out = {}
    for kind in KINDS:
        script, seen = make_script(kind, 0, corpus, tok, HISTORY), []
        replies = pass_one(script, tok, fake_generator(seen))
        out[kind] = (script, replies, build(script, tok, replies), seen)
    return out


def test_scripts_are_deterministic_per_seed(tok, corpus):
    a, b = (make_script("multihop", 1, corpus, tok, HISTORY, seed=0) for _ in range(2))
    assert a == b and a.digest() == b.digest()
    assert make_script("multihop", 1, corpus, tok, HISTORY, seed=1).digest() != a.digest()
    assert make_script("multihop", 2, corpus, tok, HISTORY, seed=0).digest() != a.digest()


@pytest.mark.parametrize("kind", KINDS)
def test_every_turn_extends_the_previous_one(finished, kind):
    _, _, conv, _ = finished[kind]
    for a, b in zip(conv.turns, conv.turns[1:]):
        assert b[:len(a)] == a
    assert len(conv.turns[-2]) < conv.history_len < len(conv.prompt)   # the last reply is history


@pytest.mark.parametrize("kind", KINDS)
def test_history_lands_near_the_target(finished, kind):
    _, _, conv, _ = finished[kind]
    assert abs(conv.history_len - HISTORY) <= 0.1 * HISTORY


@pytest.mark.parametrize("kind", KINDS)
def test_several_questions_are_scored(finished, kind):
    script, _, conv, _ = finished[kind]
    assert len(conv.scored) >= 2 and conv.scored[-1] == len(script.turns) - 1
    assert len(set(conv.expect)) == len(conv.expect)   # different facts, asked in different turns
    assert conv.scored == [t for t, u in enumerate(script.turns) if u.ask]


@pytest.mark.parametrize("kind", KINDS)
def test_planted_facts_lie_in_their_turns(tok, finished, kind):
    script, _, conv, _ = finished[kind]
    marks = [(t, m) for t, u in enumerate(script.turns) for m in u.marks]
    assert len(conv.fact_spans) == len(marks)
    for (t, mark), (a, b) in zip(marks, conv.fact_spans):
        start = len(conv.turns[t - 1]) if t else 0
        assert start <= a < b <= len(conv.turns[t])
        assert mark.rstrip(".") in tok.decode(conv.prompt[a:b]) or tok.decode(conv.prompt[a:b]).strip() in mark


@pytest.mark.parametrize("kind", KINDS)
def test_each_expected_fact_is_in_the_history_before_its_question(tok, finished, kind):
    _, _, conv, _ = finished[kind]
    for s, expect, sources in zip(conv.scored, conv.expect, conv.sources):
        before = tok.decode(conv.turns[s][:len(conv.turns[s - 1])])
        assert expect in before, f"turn {s} asks for {expect}, absent from the history before it"
        assert sources and max(sources) < s


def test_the_source_check_refuses_a_fact_asked_too_early(tok, corpus):
    from dataclasses import replace

    from benchmarks.fidelity.long_tier import _check_sources

    script = make_script("newest", 0, corpus, tok, HISTORY)
    turns = list(script.turns)
    early = [t for t, u in enumerate(turns) if u.ask][0]
    turns.insert(0, turns.pop(early))   # the question about the newest document asked first
    with pytest.raises(ValueError, match="no earlier turn holds"):
        _check_sources(replace(script, turns=tuple(turns)))


def _resolve(texts: list[str], var: str) -> str:
    """The number a variable holds, following 'VAR X = VAR Y.' back to 'VAR Z = 123.'."""
    assign = dict(re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d+)\.", "\n".join(texts)))
    seen = []
    while assign[var].startswith("VAR "):
        seen.append(var)
        var = assign[var][4:]
    assert len(seen) >= 2, "at least two hops"
    return assign[var]


def test_multihop_chains_resolve_and_distractors_differ(finished):
    script, _, conv, _ = finished["multihop"]
    texts = [u.text for u in script.turns]
    for t, expect in zip(conv.scored, conv.expect):
        var = re.search(r"VAR ([A-Z]{5})", script.turns[t].ask.question).group(1)
        assert _resolve(texts[:t], var) == expect
    numbers = re.findall(r"VAR [A-Z]{5} = (\d+)\.", "\n".join(texts))
    assert len(numbers) == len(set(numbers)) > len(conv.expect)
    names = re.findall(r"VAR ([A-Z]{5}) = ", "\n".join(texts))
    assert len(names) == len(set(names))
    hops = [t for t, u in enumerate(script.turns) for m in u.marks if "= VAR" in m]
    assert len(set(hops)) >= 2   # hops in different turns


def test_pass_one_feeds_replies_into_later_turns(tok, finished):
    script, replies, conv, seen = finished["two_facts"]
    assert len(replies) == len(script.turns) - 1 == len(seen)
    assert seen == conv.turns[:-1]   # pass 1 saw exactly the prompts pass 2 sends
    for t in range(1, len(conv.turns)):
        assert f"Reply number {t} " in tok.decode(conv.turns[t][len(conv.turns[t - 1]):])
    asked = conv.scored[0]   # a scored turn's reply follows its answer prefix
    assert tok.decode(conv.turns[asked + 1]).count(script.turns[asked].ask.prefix + "Reply number") == 1


def test_partial_builds_are_prefixes_of_the_complete_one(tok, finished):
    script, replies, conv, _ = finished["newest"]
    part = build(script, tok, replies[:3])
    assert part.turns == conv.turns[:4]
    with pytest.raises(ValueError):
        build(script, tok, replies + ["one too many"])


def test_replies_may_be_token_ids(tok, finished):
    script, replies, conv, _ = finished["multihop"]
    ids = [tok(r, add_special_tokens=False)["input_ids"] for r in replies]
    assert build(script, tok, ids).turns == conv.turns


@pytest.mark.parametrize("kind", KINDS)
def test_question_starts_split_each_scored_turn_at_its_user_message(tok, finished, kind):
    """kvpress's history for a scored turn ends with the reply before it; its question is that user turn."""
    script, replies, conv, _ = finished[kind]
    starts = question_starts(script, tok, replies)
    assert len(starts) == len(conv.scored) and starts[-1] == conv.history_len
    for t, start in zip(conv.scored, starts):
        history, question = tok.decode(conv.turns[t][:start]), tok.decode(conv.turns[t][start:])
        assert len(conv.turns[t - 1]) < start < len(conv.turns[t])
        assert history.endswith("<|im_end|>\n") and f"Reply number {t} " in history
        assert question.startswith("<|im_start|>user\n" + script.turns[t].text)
        assert question.endswith(script.turns[t].ask.prefix)


def test_kvpress_answers_each_question_over_its_own_history(tok, finished, tmp_path, monkeypatch):
    """long_run.run_kvpress_long: one runner item per scored turn, a row per conversation with the answers
    in order and each question's visible KV share; the report reads that share as KV held."""
    from types import SimpleNamespace

    from benchmarks.common.models import ensure_model
    from benchmarks.fidelity import long_run
    from benchmarks.fidelity.store import RunStore

    script, replies, conv, _ = finished["newest"]
    conv.asked_at = question_starts(script, tok, replies)
    seen = {}

    def fake_answers(setting, ratio, items, model, model_path, version):
        seen.update(items)
        return {k: {"id": k, "kept": ratio, "seconds": 1.0, "fact_kept_share": None,
                    "answer_ids": tok(f" {conv.expect[i]}", add_special_tokens=False)["input_ids"]}
                for i, k in enumerate(items)}

    monkeypatch.setattr(long_run, "kvpress_answers", fake_answers)
    store = RunStore(str(tmp_path / "runs.jsonl"))
    args = SimpleNamespace(max_new_tokens=16, ratios=[0.4], peer_ratios=[0.5])
    assert long_run.ratios_of("kvpress-kvzip", args) == [0.5] and long_run.ratios_of("tangram", args) == [0.4]
    long_run.run_kvpress_long("kvpress-kvzip", 0.5, [conv], args, store, "m", ensure_model("smollm2"), "v")
    assert [it["history_ids"] + it["question_ids"] for it in seen.values()] == [conv.turns[t] for t in conv.scored]
    assert all(b <= len(it["history_ids"]) for it in seen.values() for _, b in it["fact_spans"])
    (row,) = store.rows.values()
    assert len(row["answers"]) == len(conv.scored) and all(0.5 < h < 0.52 for h in row["held"])
    (s,) = long_run.summarize(store, "m", [conv], {"kvpress-kvzip": "v"}, args, ["kvpress-kvzip"], tok,
                              str(tmp_path / "none"))
    assert (s["correct"], s["questions"]) == (2, 2) and s["held_share"] == pytest.approx(sum(row["held"]) / 2)


@pytest.mark.parametrize("text, right", [
    ("The value is 52817.", True), (" 52817", True), ("52,817", True), ("5281", False), ("no number", False),
    ("528170", False), ("1528171 and 52817", False), ("52817.5", True), ("52,8170", False),
])
def test_exact_fact_rule(text, right):
    assert exact_fact(text, "52817") is right


def test_first_number():
    assert first_number("VAR ABCDE is 12,345,678 or so") == "12345678"
    assert first_number("none") is None


def test_session_answers_scored_turns_and_the_report_scores_them(tok, finished, tmp_path, monkeypatch):
    """long_run: one server session (a fake /generate) and the per-kind summary of what it recorded."""
    from types import SimpleNamespace

    from benchmarks.fidelity import long_run
    from benchmarks.fidelity.store import RunStore

    _, _, conv, _ = finished["two_facts"]
    sent, answers = [], {conv.scored[0]: conv.expect[0], conv.scored[1]: conv.expect[1][:-1]}  # right, then cut

    def fake_generate(url, ids, max_new):
        assert ids == conv.turns[len(sent)]
        text = answers.get(len(sent), "0")
        sent.append(max_new)
        return {"output_ids": tok(f" {text}.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]}

    monkeypatch.setattr(long_run, "generate", fake_generate)
    row = long_run.long_session("http://x", conv, 32)
    assert sent == [32 if t in conv.scored else 1 for t in range(len(conv.turns))]
    assert len(row["answers"]) == len(conv.scored) and row["answer_ids"] == row["answers"][-1]
    store = RunStore(str(tmp_path / "runs.jsonl"))
    store.add(dict(key=RunStore.key("m", "full", 1.0, conv, "v"), **row))
    summary = long_run.summarize(store, "m", [conv], {"full": "v"}, SimpleNamespace(ratios=[0.5], peer_ratios=None),
                                 ["full"], tok, str(tmp_path / "none"))
    (s,) = summary
    assert (s["correct"], s["questions"], s["conversations_correct"]) == (1, 2, 0)
    assert s["per_kind"]["two_facts"] == {"questions": [1, 2], "conversations": [0, 1]}
    assert "| m | full | 1 | - | 50% " in long_run.markdown(summary)[2]


def test_a_base_models_plain_template_extends_across_answered_questions(corpus):
    """launch/models.py's plain template writes "Assistant: text" after the prompt "Assistant:": the answer
    prefix takes the space, so the turn after a scored question still extends it."""
    from transformers import AutoTokenizer

    from benchmarks.common.models import _launch_models, ensure_model

    plain = AutoTokenizer.from_pretrained(ensure_model("smollm2"))
    plain.chat_template = _launch_models().PLAIN_TEMPLATE
    script = make_script("two_facts", 0, corpus, plain, 3000)
    replies = pass_one(script, plain, lambda ids, n: ([], " It is 5.\n\nUser: a turn the model made up"))
    conv = build(script, plain, replies)
    for a, b in zip(conv.turns, conv.turns[1:]):
        assert b[:len(a)] == a
    assert "made up" not in plain.decode(conv.prompt)
    assert plain.decode(conv.turns[conv.scored[0]]).endswith("Assistant: " + script.turns[conv.scored[0]].ask.prefix)


def test_scripts_past_the_context_are_refused_before_pass_one(tok, finished):
    from types import SimpleNamespace

    from benchmarks.common.models import ensure_model
    from benchmarks.fidelity.long_run import check_context

    scripts = [finished[k][0] for k in KINDS]
    check_context(ensure_model("smollm2"), scripts, tok, SimpleNamespace(reply_tokens=48, max_new_tokens=32))
    with pytest.raises(SystemExit, match="past the context"):
        check_context(ensure_model("smollm2"), scripts, tok, SimpleNamespace(reply_tokens=200, max_new_tokens=32))
