"""Multi-turn conversations for the fidelity benchmark, generated from installed data.

Every conversation is a list of requests a chat client sends one after the
other (turn t's prompt = turn t-1's prompt + a fixed assistant reply + the
next user message), already tokenized with the model's chat template so every
setting sees exactly the same token ids. Two families:

* retrieval (scored by a checker): a fact in the middle of the first document,
  filler documents in later turns, the question in the last turn, asked with an
  answer prefix ("The pass key is"):
    passkey            "The pass key is 71432. Remember it."
    needle             "One of the special magic numbers for <word> is: 4819273."
    variable_tracking  "VAR QXKZT = 52817." in the first document, "VAR BFNRA = VAR QXKZT."
                       in the second; which variables hold 52817?
* replay (scored by agreement with the full-KV answer): a ShareGPT or MT-Bench
  conversation cut to a token budget, whose final user turn the model answers.

Intermediate assistant replies are fixed text (retrieval: "I have read it.";
replay: the dataset's own reply), so history is identical across settings.
"""

from __future__ import annotations

import hashlib
import json
import random
import string
import zlib
from dataclasses import asdict, dataclass, field

from tangram_sglang.calibration.datasets import essays_dir, mtbench_dir, sharegpt_json
from tangram_sglang.calibration.mtbench import MTBench
from tangram_sglang.calibration.needle import EssayCorpus, insert_at_depths
from tangram_sglang.calibration.sharegpt import iter_conversations

RETRIEVAL = ("passkey", "needle", "variable_tracking")
REPLAY = ("sharegpt", "mtbench")
ACK = "I have read it."
WORDS = ("amber", "falcon", "granite", "harbor", "juniper", "lantern", "meadow", "nickel", "orchid", "quartz",
         "saffron", "thistle", "walnut", "zephyr", "cobalt", "ember")


@dataclass
class Conversation:
    """One multi-turn conversation, tokenized.

    turns: prompt ids of each request, each a prefix-extension of the one before;
    answer_prefix_len: tokens of the last prompt that open the assistant's answer;
    fact_spans: [start, end) token positions of the fact(s) (retrieval only);
    expect: strings the answer must contain (retrieval) or [] (replay: agreement);
    history_len: tokens before the final user turn (kvpress compresses these).
    """

    id: str
    kind: str
    turns: list[list[int]]
    expect: list[str]
    history_len: int
    fact_spans: list[list[int]] = field(default_factory=list)

    @property
    def prompt(self) -> list[int]:
        return self.turns[-1]

    def to_json(self) -> dict:
        return asdict(self)


class ChatBuilder:
    """Token ids of a chat built turn by turn: each request extends the previous one exactly."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.text, self.ids, self.spans = "", [], []

    def _extend(self, messages: list[dict], generation: bool, marks: list[str]) -> None:
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        if not text.startswith(self.text):
            raise ValueError("the chat template does not extend the previous turn's prompt")
        new = text[len(self.text):]
        enc = self.tok(new, add_special_tokens=False, return_offsets_mapping=True)
        base = len(self.ids)
        for mark in marks:
            at = new.find(mark)
            if at < 0:
                raise ValueError(f"fact {mark!r} not found in the turn text")
            toks = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < at + len(mark) and b > at]
            self.spans.append([base + toks[0], base + toks[-1] + 1])
        self.text, self.ids = text, self.ids + list(enc["input_ids"])

    def request(self, messages: list[dict], marks: list[str] = ()) -> list[int]:
        """Prompt ids for messages (ending with a user turn) plus the assistant generation prompt."""
        self._extend(messages, True, list(marks))
        return list(self.ids)

    def history(self, messages: list[dict]) -> int:
        """Extend with messages ending in an assistant turn (no generation prompt); returns the length."""
        self._extend(messages, False, [])
        return len(self.ids)

    def append_text(self, text: str) -> list[int]:
        """Extend the current prompt with raw assistant text (an answer prefix)."""
        self.text += text
        self.ids += list(self.tok(text, add_special_tokens=False)["input_ids"])
        return list(self.ids)


def passkey_fact(key: str) -> str:
    """The planted pass-key sentence (also the long tier's)."""
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def needle_fact(word: str, num: str) -> str:
    """The planted magic-number sentence (also the long tier's)."""
    return f"One of the special magic numbers for {word} is: {num}."


def _fact(kind: str, rng: random.Random) -> tuple[list[str], str, str, list[str]]:
    """(facts for doc 1 and doc 2, question, answer prefix, expected strings)."""
    if kind == "passkey":
        key = str(rng.randrange(10000, 99999))
        return ([passkey_fact(key)],
                "What is the pass key written in the first document? Answer with the number only.",
                "The pass key is", [key])
    if kind == "needle":
        word, num = rng.choice(WORDS), str(rng.randrange(1000000, 9999999))
        return ([needle_fact(word, num)],
                f"What is the special magic number for {word}?", f"The special magic number for {word} is", [num])
    if kind == "variable_tracking":
        value = str(rng.randrange(10000, 99999))
        a, b = ("".join(rng.choice(string.ascii_uppercase) for _ in range(5)) for _ in range(2))
        return ([f"VAR {a} = {value}.", f"VAR {b} = VAR {a}."],
                f"VAR {b} was set to VAR {a}. What number is VAR {a} equal to?", f"VAR {a} =", [value])
    raise ValueError(f"unknown retrieval task {kind!r}; expected one of {RETRIEVAL}")


def retrieval(kind: str, idx: int, corpus: EssayCorpus, tok, doc_tokens: int, docs: int, seed: int) -> Conversation:
    rng = random.Random(f"{seed}-{kind}-{idx}")
    facts, question, prefix, expect = _fact(kind, rng)
    chat, messages, turns = ChatBuilder(tok), [], []
    for d in range(docs):
        doc = corpus.haystack(tok, rng, doc_tokens)
        marks = facts[:1] if d == 0 else facts[1:2] if d == 1 else []
        doc = insert_at_depths(doc, marks, rng) if marks else doc
        opener = "Please read this document." if d == 0 else "Here is another document."
        messages.append({"role": "user", "content": f"{opener}\n\n{doc.strip()}"})
        turns.append(chat.request(messages, marks))
        messages.append({"role": "assistant", "content": ACK})
    history_len = chat.history(messages)
    messages.append({"role": "user", "content": f"{question} Answer briefly."})
    chat.request(messages)
    turns.append(chat.append_text(prefix))
    return Conversation(f"{kind}-{idx:03d}", kind, turns, expect, history_len, chat.spans)


def replay(kind: str, idx: int, source: list[dict], tok, max_tokens: int) -> Conversation | None:
    """The longest prefix of a chat (ending with a user turn) under max_tokens, or None."""
    msgs = [{"role": m["role"], "content": m["content"][:1500]} for m in source]
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    probe, fits = ChatBuilder(tok), []
    for i in users:
        if len(probe.request(msgs[: i + 1])) > max_tokens:
            break
        fits.append(i)
    if len(fits) < 2:
        return None
    chat, turns = ChatBuilder(tok), []
    for i in fits[:-1]:
        turns.append(chat.request(msgs[: i + 1]))
    history_len = chat.history(msgs[: fits[-1]])
    turns.append(chat.request(msgs[: fits[-1] + 1]))
    return Conversation(f"{kind}-{idx:03d}", kind, turns, [], history_len)


def _replay_sources(kind: str, seed: int, target_chars: int):
    """Source chats in a fixed order (a larger count extends a smaller one: results stay reusable)."""
    rng = random.Random(f"{seed}-{kind}")
    if kind == "mtbench":
        bench = MTBench.load(mtbench_dir())
        while True:
            yield bench.chat(rng, target_chars)
    for cid, messages in iter_conversations(sharegpt_json(), min_turns=6, min_chars=target_chars):
        if zlib.crc32(f"{seed}-{cid}".encode()) % 4 == 0:  # a seeded, order-stable sample of the file
            yield messages


def build_conversations(tok, *, retrieval_per_kind: int, replay_per_kind: int, doc_tokens: int, docs: int = 3,
                        seed: int = 0) -> list[Conversation]:
    """The benchmark's conversations: retrieval_per_kind of each RETRIEVAL kind, replay_per_kind of each REPLAY."""
    convs: list[Conversation] = []
    if retrieval_per_kind:
        corpus = EssayCorpus.load(essays_dir(), tok)
        for i in range(retrieval_per_kind):
            convs += [retrieval(k, i, corpus, tok, doc_tokens, docs, seed) for k in RETRIEVAL]
    budget = docs * doc_tokens + 200
    for kind in REPLAY if replay_per_kind else ():
        made = 0
        for source in _replay_sources(kind, seed, target_chars=3 * budget):
            conv = replay(kind, made, source, tok, budget)
            if conv is not None:
                convs.append(conv)
                made += 1
            if made == replay_per_kind:
                break
    return convs


def conversations_digest(convs: list[Conversation]) -> str:
    """A short hash of the exact token ids: part of every cached result's key."""
    h = hashlib.sha256()
    for c in convs:
        h.update(json.dumps([c.id, c.turns[-1]]).encode())
    return h.hexdigest()[:12]
