"""Synthetic long-context tasks over the Paul Graham essays (RULER-style).

Three kinds, each a single user message: a haystack of essay text of a given
token length with facts hidden at random depths, then a question about them.
  needle            one sentence about a city, "what is the best thing to do in X?"
  passkey           "The pass key is 71432. Remember it." -> "what is the pass key?"
  variable_tracking a chain VAR A = 12345, VAR B = VAR A, ... spread over the
                    text -> "which variables are assigned 12345?"
"""

from __future__ import annotations

import glob
import os
import random
import string
from dataclasses import dataclass

KINDS = ("needle", "passkey", "variable_tracking")
CITIES = ("San Francisco", "Lisbon", "Kyoto", "Nairobi", "Montreal", "Oslo", "Lima", "Hanoi")
ACTIVITIES = ("eat a sandwich in the park on a sunny day", "walk along the old harbour at dawn",
              "visit the tiny museum of maps", "take the night ferry and watch the lights",
              "climb the hill behind the station for the view")


@dataclass(frozen=True)
class EssayCorpus:
    """All essays as one token stream; slices of it are haystacks."""

    tokens: tuple[int, ...]

    @classmethod
    def load(cls, folder: str, tokenizer) -> "EssayCorpus":
        paths = sorted(glob.glob(os.path.join(folder, "*.txt")))
        if not paths:
            raise FileNotFoundError(f"no essays (*.txt) in {folder}")
        text = "\n\n".join(open(p, encoding="utf-8", errors="replace").read().strip() for p in paths)
        return cls(tokens=tuple(tokenizer(text, add_special_tokens=False)["input_ids"]))

    def haystack(self, tokenizer, rng: random.Random, n_tokens: int) -> str:
        if n_tokens >= len(self.tokens):
            raise ValueError(f"haystack of {n_tokens} tokens exceeds the corpus ({len(self.tokens)})")
        start = rng.randrange(0, len(self.tokens) - n_tokens)
        return tokenizer.decode(list(self.tokens[start:start + n_tokens]))


def insert_at_depths(text: str, facts: list[str], rng: random.Random) -> str:
    """Put each fact after a sentence end at a random depth, in order of the list."""
    depths = sorted(rng.uniform(0.05, 0.95) for _ in facts)
    pieces, last = [], 0
    for depth, fact in zip(depths, facts):
        cut = text.find(". ", max(last, int(depth * len(text))))
        cut = len(text) if cut < 0 else cut + 2
        pieces += [text[last:cut], fact + " "]
        last = cut
    pieces.append(text[last:])
    return "".join(pieces)


def _needle(rng: random.Random) -> tuple[list[str], str]:
    city, act = rng.choice(CITIES), rng.choice(ACTIVITIES)
    return [f"The best thing to do in {city} is to {act}."], f"What is the best thing to do in {city}?"


def _passkey(rng: random.Random) -> tuple[list[str], str]:
    key = rng.randrange(10000, 99999)
    return [f"The pass key is {key}. Remember it. {key} is the pass key."], "What is the pass key?"


def _variable_tracking(rng: random.Random) -> tuple[list[str], str]:
    value = rng.randrange(10000, 99999)
    names = ["".join(rng.choice(string.ascii_uppercase) for _ in range(5)) for _ in range(rng.randint(3, 5))]
    facts = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]
    return facts, f"Find all variables that are assigned the value {value} in the text above."


GENERATORS = {"needle": _needle, "passkey": _passkey, "variable_tracking": _variable_tracking}


def task_messages(kind: str, corpus: EssayCorpus, tokenizer, rng: random.Random, n_tokens: int) -> list[dict]:
    """One user message of about n_tokens tokens: haystack with facts, then the question."""
    if kind not in GENERATORS:
        raise ValueError(f"unknown needle task {kind!r}; expected one of {KINDS}")
    facts, question = GENERATORS[kind](rng)
    text = insert_at_depths(corpus.haystack(tokenizer, rng, n_tokens), facts, rng)
    prompt = ("Read the text below and answer the question at the end.\n\n"
              f"{text}\n\nQuestion: {question} Answer briefly.")
    return [{"role": "user", "content": prompt}]
