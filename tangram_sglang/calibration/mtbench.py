"""MT-Bench multi-turn chats built from the packaged questions and reference answers.

question.jsonl holds 80 two-turn questions; reference answers (two sets:
gpt-4 and gpt-4-0125-preview) exist for the 30 math, reasoning and coding
ones. A pilot chat strings answered questions together (user turn 1,
reference answer, user turn 2, reference answer, next question ...) and ends
with the first turn of any MT-Bench question, left for the model to answer.
"""

from __future__ import annotations

import glob
import json
import os
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class MTBench:
    questions: dict  # question_id -> {"category", "turns"}
    answers: tuple  # of dicts: question_id -> [answer turn 1, answer turn 2]

    @classmethod
    def load(cls, folder: str) -> "MTBench":
        with open(os.path.join(folder, "question.jsonl")) as f:
            questions = {q["question_id"]: q for q in map(json.loads, f) if q.get("turns")}
        answers = []
        for path in sorted(glob.glob(os.path.join(folder, "reference_answer", "*.jsonl"))):
            with open(path) as f:
                answers.append({a["question_id"]: a["choices"][0]["turns"] for a in map(json.loads, f)})
        if not questions or not answers:
            raise FileNotFoundError(f"no MT-Bench questions or reference answers under {folder}")
        return cls(questions=questions, answers=tuple(answers))

    def answered_ids(self) -> list[int]:
        return sorted(set.union(*(set(a) for a in self.answers)) & set(self.questions))

    def chat(self, rng: random.Random, target_chars: int, parity: int | None = None) -> list[dict]:
        """Answered questions in random order until ~target_chars, then one open question.

        parity 0 / 1 restricts the answered questions to even / odd ids (disjoint splits).
        """
        ids = [q for q in self.answered_ids() if parity is None or q % 2 == parity]
        rng.shuffle(ids)
        messages: list[dict] = []
        for qid in ids:
            if sum(len(m["content"]) for m in messages) >= target_chars:
                break
            answer_set = [a for a in self.answers if qid in a]
            replies = rng.choice(answer_set)[qid]
            for question, reply in zip(self.questions[qid]["turns"], replies):
                messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        last = rng.choice(sorted(self.questions))
        messages.append({"role": "user", "content": self.questions[last]["turns"][0]})
        return messages
