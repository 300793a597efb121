"""Pilot data readers and generators on small files made here."""

import json
import random

import pytest

from tangram_sglang.calibration.mtbench import MTBench
from tangram_sglang.calibration.needle import insert_at_depths
from tangram_sglang.calibration.samples import SampleSpec, _split_of
from tangram_sglang.calibration.sharegpt import iter_conversations, iter_records, to_messages


def conv(i, turns):
    return {"id": f"c{i}_0", "conversations": [{"from": "human" if j % 2 == 0 else "gpt", "value": f"t{j} " * 5}
                                               for j in range(turns)]}


def test_sharegpt_reader_survives_truncation(tmp_path):
    text = json.dumps([conv(0, 4), conv(1, 2), conv(2, 6)], indent=2)
    path = tmp_path / "sg.json"
    path.write_text(text[: text.rindex("}") - 10])  # cut inside the last record, like the packaged file
    recs = list(iter_records(str(path)))
    assert [r["id"] for r in recs] == ["c0_0", "c1_0"]
    got = list(iter_conversations(str(path), min_turns=4, min_chars=10))
    assert [cid for cid, _ in got] == ["c0_0"]


def test_to_messages_alternates_and_starts_with_user():
    rec = {"conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "a"},
                             {"from": "human", "value": "b"}, {"from": "system", "value": "x"},
                             {"from": "gpt", "value": "c"}]}
    assert to_messages(rec) == [{"role": "user", "content": "a\n\nb"}, {"role": "assistant", "content": "c"}]
    assert _split_of("abc_0") == _split_of("abc_7")  # parts of one conversation share a split


def test_insert_at_depths_keeps_text_and_order():
    text = "One. Two. Three. Four. Five. Six. "
    out = insert_at_depths(text, ["FACT-A.", "FACT-B."], random.Random(0))
    assert out.replace("FACT-A. ", "").replace("FACT-B. ", "") == text
    assert out.index("FACT-A.") < out.index("FACT-B.")


def test_mtbench_chat_from_small_files(tmp_path):
    (tmp_path / "reference_answer").mkdir()
    qs = [{"question_id": i, "category": "math", "turns": [f"q{i}a", f"q{i}b"]} for i in (1, 2, 3)]
    (tmp_path / "question.jsonl").write_text("\n".join(json.dumps(q) for q in qs))
    ans = [{"question_id": i, "choices": [{"turns": [f"A{i}a", f"A{i}b"]}]} for i in (1, 2)]
    (tmp_path / "reference_answer" / "ref.jsonl").write_text("\n".join(json.dumps(a) for a in ans))
    bench = MTBench.load(str(tmp_path))
    assert bench.answered_ids() == [1, 2]
    msgs = bench.chat(random.Random(0), target_chars=1, parity=0)  # only q2 is even
    assert [m["content"] for m in msgs[:4]] == ["q2a", "A2a", "q2b", "A2b"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]


def test_sample_spec_validation():
    with pytest.raises(ValueError, match="count"):
        SampleSpec(count=0)
    with pytest.raises(ValueError, match="min_tokens"):
        SampleSpec(count=1, min_tokens=100, max_tokens=50)
    with pytest.raises(ValueError, match="sources"):
        SampleSpec(count=1, sources=("wiki",))
