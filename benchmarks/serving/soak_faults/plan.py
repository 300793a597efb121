"""The session plan (pure): each session's turns and fault, fixed by the seed."""

from __future__ import annotations

import dataclasses
import random

QUESTIONS = ("Summarize the passage above in one sentence.", "What is the main claim of this passage?",
             "Name one thing the author would disagree with, and why.", "Rewrite the first sentence more simply.",
             "What question does this passage leave open?", "Give the passage a short title.")

SYSTEM = "You are a helpful assistant. Answer briefly."

SHARES = {"abort": 0.08, "hangup": 0.08, "abandon": 0.12, "pressure": 0.06}  # of sessions; the rest: none

FAULTS = ("abort", "hangup", "abandon", "pressure")


@dataclasses.dataclass(frozen=True)
class Turn:
    """One request of a session: a question about corpus words [offset, offset + words)."""

    offset: int
    words: int
    question: int               # index into QUESTIONS
    max_tokens: int
    think_s: float              # pause before sending it
    stream: bool
    ignore_eos: bool = False
    fault: str | None = None    # "abort" (client timeout give_up_s) or "hangup" (closed after `chunks` chunks)
    give_up_s: float = 0.0
    chunks: int = 0


@dataclasses.dataclass(frozen=True)
class SessionPlan:
    """A session: its fault kind (None: a plain one), the turns of the whole conversation, and the
    requests it sends (an abort's turn twice: given up on, then sent again; abandon and hangup cut short)."""

    index: int
    fault: str | None
    planned_turns: int
    turns: tuple[Turn, ...]

    def conversation_turns(self) -> list[int]:
        """The conversation turn (1-based) of each request."""
        out, k = [], 0
        for t in self.turns:
            out.append(k + 1)
            k += t.fault != "abort"  # the abort's retry is the same turn
        return out


def pick_fault(x: float, shares: dict[str, float]) -> str | None:
    """The fault whose slice of [0, 1) holds x (slices in FAULTS order, sized by shares), None past them."""
    edge = 0.0
    for kind in FAULTS:
        edge += shares.get(kind, 0.0)
        if x < edge:
            return kind
    return None


def plan_session(seed: int, index: int, corpus_words: int, shares: dict[str, float] = SHARES) -> SessionPlan:
    """Session ``index`` of the run ``seed``: the same plan for the same arguments (its own RNG, seeded by
    both), whatever else the run drew. ``corpus_words``: the corpus length passages are drawn from."""
    rng = random.Random(f"soak:{seed}:{index}")
    fault = pick_fault(rng.random(), shares)
    pressure = fault == "pressure"
    planned = rng.randint(2, 3) if pressure else rng.randint(2, 4)
    base = []
    for k in range(planned):
        words = rng.randint(300, 600) if pressure else rng.randint(20, 100)
        base.append(Turn(offset=rng.randrange(corpus_words - words), words=words,
                         question=rng.randrange(len(QUESTIONS)),
                         max_tokens=rng.randint(150, 300) if pressure else rng.randint(16, 32),
                         think_s=0.0 if k == 0 else round(rng.uniform(0.0, 2.0), 2),
                         stream=not pressure and rng.random() < 0.3, ignore_eos=pressure))
    at = rng.randrange(planned)  # the turn an abort or hang-up hits
    if fault == "abort":
        cut = dataclasses.replace(base[at], fault="abort", stream=False, give_up_s=round(rng.uniform(0.2, 2.0), 2))
        retry = dataclasses.replace(base[at], think_s=round(rng.uniform(0.5, 2.0), 2))
        turns = base[:at] + [cut, retry] + base[at + 1:]
    elif fault == "hangup":
        turns = base[:at] + [dataclasses.replace(base[at], fault="hangup", stream=True, chunks=rng.randint(1, 4),
                                                 max_tokens=rng.randint(64, 128))]
    elif fault == "abandon":
        turns = base[:rng.randint(1, planned - 1)]
    else:
        turns = base
    return SessionPlan(index, fault, planned, tuple(turns))


def burst_turns(seed: int, burst: int, n: int, corpus_words: int) -> list[Turn]:
    """Burst ``burst``'s ``n`` single-turn requests: long passages, long ``ignore_eos`` answers, all at once."""
    rng = random.Random(f"burst:{seed}:{burst}")
    out = []
    for _ in range(n):
        words = rng.randint(500, 700)
        out.append(Turn(offset=rng.randrange(corpus_words - words), words=words, question=0,
                        max_tokens=rng.randint(250, 350), think_s=0.0, stream=False, ignore_eos=True))
    return out


def question_text(turn: Turn, words: list[str]) -> str:
    return " ".join(words[turn.offset:turn.offset + turn.words]) + "\n\n" + QUESTIONS[turn.question]


def chat_payload(model: str, messages: list[dict], turn: Turn) -> dict:
    payload = {"model": model, "messages": messages, "temperature": 0, "max_tokens": turn.max_tokens}
    if turn.ignore_eos:
        payload["ignore_eos"] = True
    return payload
