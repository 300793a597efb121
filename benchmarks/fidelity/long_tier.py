"""Long tier of the multi-turn fidelity benchmark: histories near the model's context, the model's own replies.

A long conversation is a *script* of user turns: document turns (essay filler, facts planted inside at
random depths, as `tasks.retrieval` does) and question turns, several of them scored. One kind per script:

    multihop   two chains of variable assignments, each hop in a different document turn
               ("VAR QXKZT = 52817." ... "VAR BFNRA = VAR QXKZT." ... "VAR MLOPW = VAR BFNRA."), distractor
               variables with other numbers in every document; chain B is asked midway (once complete),
               chain A at the end. Answer: the number the chain's last variable holds.
    two_facts  a pass key in an early document, a special magic number for a word in a middle one (and
               distractor numbers for other words); the magic number is asked in a later turn, the pass
               key at the end: two facts from different turns, asked in different turns.
    newest     a pass key in an early document and a magic number in the newest document: the magic
               number is asked in the turn right after it (compression must not hurt the fresh turn),
               the pass key at the end.

Histories reach about ``history_tokens`` (HISTORY_TOKENS per model). Intermediate assistant replies are
the full-KV model's own: `pass_one` walks a script turn by turn with a generator (the stock server,
greedy, up to REPLY_TOKENS tokens per turn) and `build` turns the script and those replies into the
token ids every setting then sees (teacher forcing: one history for all settings).

Scoring by the exact fact (`exact_fact`): the answer is the text generated after the answer prefix; its
first integer (a run of digits; digit groups joined by commas, "52,817", count as one number) must equal
the expected number exactly: "The value is 52817." and "52,817" are right, "5281", "528170" and an answer
without a number are wrong. A conversation counts as right when all its scored questions are.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
from dataclasses import asdict, dataclass, field

from benchmarks.fidelity.tasks import WORDS, ChatBuilder, Conversation, needle_fact, passkey_fact
from tangram_sglang.calibration.needle import EssayCorpus, insert_at_depths

KINDS = ("multihop", "two_facts", "newest")
HISTORY_TOKENS = {"smollm2": 7000, "qwen2.5-0.5b": 16000, "gemma3-270m": 7000}
REPLY_TOKENS = 48     # pass 1: the longest reply to a non-final turn
DOC_TOKENS = 800      # about the size of one document turn; the count of turns follows from the target
HOPS = 2              # assignments after the first in each multihop chain
# per-turn tokens besides the document: template, opener, an average reply (half the cap)
TURN_OVERHEAD = 30 + REPLY_TOKENS // 2
QUESTION_OVERHEAD = 60 + REPLY_TOKENS // 2
NUMBER = re.compile(r"\d+(?:,\d{3}(?!\d))*")  # "52,817" is one number, "52,8170" starts with 52


@dataclass(frozen=True)
class Ask:
    """A scored question: the user's text, the answer prefix that opens the reply, the exact number,
    the planted sentences it needs (all of them in earlier turns)."""

    question: str
    prefix: str
    expect: str
    facts: tuple[str, ...]


@dataclass(frozen=True)
class UserTurn:
    """One user message; marks are the facts planted in it (their token spans are recorded)."""

    text: str
    marks: tuple[str, ...] = ()
    ask: Ask | None = None


@dataclass(frozen=True)
class Script:
    """A long conversation before pass 1: its user turns in order (the assistant's replies come later)."""

    id: str
    kind: str
    turns: tuple[UserTurn, ...]

    def digest(self) -> str:
        """Hash of the whole script: part of the key under which its replies are cached."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class LongConversation(Conversation):
    """A Conversation whose scored turns are several: scored[i] is a turn index, expect[i] its number,
    sources[i] the turns that hold the facts it needs. history_len: tokens before the final user turn
    (a partial build, pass 1's, has no final turn yet: its whole last prompt). asked_at[i]: where scored
    turn i's user message begins (question_starts only)."""

    scored: list[int] = field(default_factory=list)
    sources: list[list[int]] = field(default_factory=list)
    asked_at: list[int] = field(default_factory=list)


# -- scoring ------------------------------------------------------------------------------------------
def first_number(text: str) -> str | None:
    """The first integer of text, comma-grouped digits joined ("52,817" -> "52817"); None without one."""
    m = NUMBER.search(text)
    return m.group(0).replace(",", "") if m else None


def exact_fact(text: str, expect: str) -> bool:
    """The module's rule: the answer's first integer equals the expected number exactly."""
    return first_number(text) == expect


# -- scripts ------------------------------------------------------------------------------------------
def _names(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
        out += [name] if name not in out else []
    return out


def _numbers(rng: random.Random, n: int, lo: int, hi: int) -> list[str]:
    return [str(v) for v in rng.sample(range(lo, hi), n)]


def _spread(first: int, last: int, n: int) -> list[int]:
    """n distinct document indices spread evenly over [first, last] (needs last - first >= n - 1)."""
    return [first + round(i * (last - first) / (n - 1)) for i in range(n)]


def _passkey(key: str) -> tuple[str, Ask]:
    fact = passkey_fact(key)
    return fact, Ask("What is the pass key written in one of the earlier documents? Answer with the number only.",
                     "The pass key is", key, (fact,))


def _needle(word: str, num: str) -> tuple[str, Ask]:
    fact = needle_fact(word, num)
    return fact, Ask(f"What is the special magic number for {word}? Answer with the number only.",
                     f"The special magic number for {word} is", num, (fact,))


def _chain_ask(chain: list[str], value: str, hops: list[str]) -> Ask:
    last = chain[-1]
    return Ask(f"VAR {last} was set through a chain of assignments in the documents. What is the numeric value "
               f"of VAR {last}? Answer with the number only.", f"The numeric value of VAR {last} is", value,
               tuple(hops))


def _multihop(rng: random.Random, docs: int) -> tuple[dict[int, list[str]], dict[int, Ask], Ask]:
    """Facts per document, questions asked after a document, the final question."""
    names, values = _names(rng, 2 * (HOPS + 1) + docs), _numbers(rng, 2 + docs, 10000, 99999)
    facts: dict[int, list[str]] = {d: [f"VAR {names[2 * HOPS + 2 + d]} = {values[2 + d]}."] for d in range(docs)}
    mid = docs // 2
    asks = {}
    for c, (first, last) in enumerate(((0, docs - 1), (0, mid))):
        chain = names[c * (HOPS + 1):(c + 1) * (HOPS + 1)]
        hops = [f"VAR {chain[0]} = {values[c]}."] + [f"VAR {chain[h]} = VAR {chain[h - 1]}." for h in range(1, HOPS + 1)]
        for hop, d in zip(hops, _spread(first, last, HOPS + 1)):
            facts[d].append(hop)
        asks[c] = _chain_ask(chain, values[c], hops)
    return facts, {mid: asks[1]}, asks[0]


def _two_facts(rng: random.Random, docs: int) -> tuple[dict[int, list[str]], dict[int, Ask], Ask]:
    words = rng.sample(WORDS, 3)
    key, nums = _numbers(rng, 1, 10000, 99999)[0], _numbers(rng, 3, 1000000, 9999999)
    mid, asked = docs // 2, min(docs - 2, max(docs // 2 + 1, 2 * docs // 3))
    (pk, final), (needle, ask) = _passkey(key), _needle(words[0], nums[0])
    facts = {d: [] for d in range(docs)}
    facts[1].append(pk)
    facts[mid].append(needle)
    for w, n in zip(words[1:], nums[1:]):   # the same sentence for other words: the exact word must be found
        facts[rng.randrange(docs)].append(_needle(w, n)[0])
    return facts, {asked: ask}, final


def _newest(rng: random.Random, docs: int) -> tuple[dict[int, list[str]], dict[int, Ask], Ask]:
    words = rng.sample(WORDS, 2)
    key, nums = _numbers(rng, 1, 10000, 99999)[0], _numbers(rng, 2, 1000000, 9999999)
    (pk, final), (needle, ask) = _passkey(key), _needle(words[0], nums[0])
    facts = {d: [] for d in range(docs)}
    facts[1].append(pk)
    facts[docs - 1].append(needle)
    facts[rng.randrange(1, docs - 1)].append(_needle(words[1], nums[1])[0])
    return facts, {docs - 1: ask}, final


PLANTERS = {"multihop": _multihop, "two_facts": _two_facts, "newest": _newest}
# What a document turn asks, after the text, in rotation: one fixed request ("reply with one sentence
# about it", before the text) had small models repeat their first reply for every part (trial, SmolLM2).
DOC_ASKS = ("In one sentence, what is part {part} about?",
            "Name one topic part {part} discusses, in one sentence.",
            "What does the author argue in part {part}? One sentence.",
            "Give part {part} a short title.")  # none invites quoting, so a planted fact is not repeated


def layout(history_tokens: int, doc_tokens: int = DOC_TOKENS) -> tuple[int, int]:
    """(document turns, tokens per document) whose history, replies and one midway question included,
    comes to about history_tokens."""
    docs = max(2 * HOPS + 1, round(history_tokens / (doc_tokens + TURN_OVERHEAD)))
    return docs, (history_tokens - QUESTION_OVERHEAD) // docs - TURN_OVERHEAD


def make_script(kind: str, idx: int, corpus: EssayCorpus, tok, history_tokens: int, seed: int = 0) -> Script:
    """The idx-th script of a kind: deterministic in (seed, kind, idx, history_tokens) and the corpus."""
    if kind not in PLANTERS:
        raise ValueError(f"unknown long-tier kind {kind!r}; expected one of {KINDS}")
    rng = random.Random(f"long-{seed}-{kind}-{idx}-{history_tokens}")
    docs, doc_tokens = layout(history_tokens)
    facts, asks, final = PLANTERS[kind](rng, docs)
    turns = []
    for d in range(docs):
        marks = list(facts[d])
        rng.shuffle(marks)
        text = insert_at_depths(corpus.haystack(tok, rng, doc_tokens), marks, rng).strip()
        turns.append(UserTurn(f"Here is part {d + 1} of a long document.\n\n{text}\n\n"
                              f"{DOC_ASKS[d % len(DOC_ASKS)].format(part=d + 1)}", tuple(marks)))
        if d in asks:
            turns.append(UserTurn(asks[d].question, ask=asks[d]))
    turns.append(UserTurn(final.question, ask=final))
    script = Script(f"long-{kind}-{idx:03d}", kind, tuple(turns))
    _check_sources(script)
    return script


def _check_sources(script: Script) -> None:
    """Every scored question's facts are planted in user turns before it, its number in one of them
    (else the script is broken)."""
    for t, turn in enumerate(script.turns):
        if not turn.ask:
            continue
        earlier = {m for u in script.turns[:t] for m in u.marks}
        if not set(turn.ask.facts) <= earlier or not any(turn.ask.expect in f for f in turn.ask.facts):
            raise ValueError(f"{script.id}: turn {t} asks for {turn.ask.expect}, which no earlier turn holds")


def make_scripts(tok, corpus: EssayCorpus, per_kind: int, history_tokens: int, seed: int = 0) -> list[Script]:
    """per_kind scripts of each kind, in a fixed order (a larger count extends a smaller one)."""
    return [make_script(k, i, corpus, tok, history_tokens, seed) for i in range(per_kind) for k in KINDS]


# -- token ids ----------------------------------------------------------------------------------------
def reply_text(reply: str | list[int], tok) -> str:
    """A pass-1 reply as the assistant's message text (ids are decoded without special tokens)."""
    return reply if isinstance(reply, str) else tok.decode(reply, skip_special_tokens=True)


def build(script: Script, tok, replies: list, split_asks: bool = False) -> LongConversation:
    """Prompt ids of the script's first len(replies) + 1 turns (all of them once replies holds one per
    non-final turn), each request extending the previous one: user turn t, then reply t as the assistant's
    message (a question turn's reply follows its answer prefix). Deterministic in (script, tokenizer,
    replies), so a partial build is a prefix of the complete one. split_asks: the history is also closed
    (tokenized up to the end of the last reply) before every scored turn, recorded in asked_at."""
    if len(replies) >= len(script.turns):
        raise ValueError(f"{script.id}: {len(replies)} replies for {len(script.turns)} turns (the last has none)")
    chat, messages, turns, history_len = ChatBuilder(tok), [], [], 0
    scored, expect, sources, fact_turn, asked_at = [], [], [], {}, []
    for t, turn in enumerate(script.turns[:len(replies) + 1]):
        if t == len(script.turns) - 1 or (split_asks and turn.ask):
            asked_at.append(chat.history(messages))
            history_len = asked_at[-1]
        messages.append({"role": "user", "content": turn.text})
        ids = chat.request(messages, turn.marks)
        fact_turn.update({m: t for m in turn.marks})
        if turn.ask:
            ids = chat.append_text(_content_lead(tok, messages) + turn.ask.prefix)
            scored.append(t)
            expect.append(turn.ask.expect)
            sources.append(sorted({fact_turn[m] for m in turn.ask.facts}))
        turns.append(ids)
        if t < len(replies):
            text = reply_text(replies[t], tok)
            messages.append({"role": "assistant", "content": (turn.ask.prefix + text.rstrip()) if turn.ask
                             else text.strip()})
    history_len = history_len if len(turns) == len(script.turns) else 0
    return LongConversation(script.id, script.kind, turns, expect, history_len or len(turns[-1]), chat.spans,
                            scored=scored, sources=sources, asked_at=asked_at if split_asks else [])


def question_starts(script: Script, tok, replies: list) -> list[int]:
    """Where each scored turn's user message begins in build(script, tok, replies): a one-question peer
    (kvpress) compresses turns[t][:start] and reads the rest uncompressed. Raises when closing the history
    there re-tokenizes the conversation (its ids must be the ones every other setting answered)."""
    plain, split = build(script, tok, replies), build(script, tok, replies, split_asks=True)
    if split.turns != plain.turns or len(split.asked_at) != len(plain.scored):
        raise ValueError(f"{script.id}: the history does not end on a token boundary before every question")
    return split.asked_at


def _content_lead(tok, messages: list[dict]) -> str:
    """What the chat template writes between the generation prompt and an assistant message's text: ""
    for chat models, " " for the plain template of a base model ("Assistant:" then "Assistant: text").
    The answer prefix starts with it, so the turn holding the reply extends the prompt that asked."""
    asked = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    answered = tok.apply_chat_template(messages + [{"role": "assistant", "content": "@@REPLY@@"}], tokenize=False)
    at = answered.find("@@REPLY@@")
    return answered[len(asked):at] if answered.startswith(asked) and at >= len(asked) else ""


def pass_one(script: Script, tok, generate, reply_tokens: int = REPLY_TOKENS, replies=()) -> list[str]:
    """The full-KV model's replies to every non-final turn, turn by turn: turn t's prompt is built from
    the replies before it. generate(prompt_ids, max_new) -> (ids, text) answers greedily."""
    replies = list(replies)
    while len(replies) < len(script.turns) - 1:
        _, text = generate(build(script, tok, replies).turns[-1], reply_tokens)
        # a base model (plain template) goes on with the dialogue itself: its reply ends where it does
        replies.append(text.split("\n\nUser:")[0])
    return replies
