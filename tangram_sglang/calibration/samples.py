"""The pilot sample set: real text from three sources, rendered as the server would.

Sources (round-robin, so every source gets a third of the samples):
  needle    needle / passkey / variable-tracking tasks over the essays
  sharegpt  real multi-turn ShareGPT conversations
  mtbench   MT-Bench multi-turn chats with reference answers
Every sample is rendered with the model's chat template (generation prompt
added) and cut to a target length drawn from [min_tokens, max_tokens].

Calibration and held-out splits draw from disjoint material: essays from the
first / last part of the corpus, ShareGPT conversations by a hash of their id, even /
odd MT-Bench question ids (the open final question may repeat).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from tangram_sglang.calibration import datasets
from tangram_sglang.calibration.mtbench import MTBench
from tangram_sglang.calibration.needle import KINDS, EssayCorpus, task_messages
from tangram_sglang.calibration.sharegpt import iter_conversations

SOURCES = ("needle", "sharegpt", "mtbench")
SPLITS = ("calibration", "heldout")
CHARS_PER_TOKEN = 3.5  # enough text for the target length, English chat text


@dataclass(frozen=True)
class PilotSample:
    source: str  # one of SOURCES
    kind: str  # needle kind, "conversation" or "chat"
    label: str  # where it came from (conversation id, seed ...)
    token_ids: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class SampleSpec:
    count: int
    min_tokens: int = 1024
    max_tokens: int = 2048
    sources: tuple[str, ...] = SOURCES
    seed: int = 0

    def __post_init__(self):
        if self.count < 1:
            raise ValueError(f"sample count must be >= 1, got {self.count}")
        if not 16 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"need 16 <= min_tokens <= max_tokens, got {self.min_tokens}, {self.max_tokens}")
        bad = [s for s in self.sources if s not in SOURCES]
        if bad or not self.sources:
            raise ValueError(f"unknown pilot sources {bad or self.sources}; expected some of {SOURCES}")


def render(tokenizer, messages: list[dict], max_tokens: int) -> tuple[int, ...]:
    """Chat-template token ids (generation prompt added), cut to max_tokens."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens])


def _split_of(conversation_id: str) -> int:
    """0 or 1 from the conversation's base id, so all parts (id_0, id_1 ...) share a split."""
    return zlib.crc32(conversation_id.rsplit("_", 1)[0].encode()) % 2


class _Builder:
    """Draws samples of one split; holds the loaded sources for the run."""

    def __init__(self, tokenizer, spec: SampleSpec, split: str):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        self.tok, self.spec, self.parity = tokenizer, spec, SPLITS.index(split)
        self.rng = random.Random(f"{spec.seed}-{split}")
        self.corpus = EssayCorpus.load(datasets.essays_dir(), tokenizer) if "needle" in spec.sources else None
        self.chats = iter_conversations(datasets.sharegpt_json()) if "sharegpt" in spec.sources else None
        self.mtbench = MTBench.load(datasets.mtbench_dir()) if "mtbench" in spec.sources else None
        self.n_needle = 0

    def target(self) -> int:
        return self.rng.randint(self.spec.min_tokens, self.spec.max_tokens)

    def needle(self) -> PilotSample:
        kind, n = KINDS[self.n_needle % len(KINDS)], self.target()
        self.n_needle += 1
        half = len(self.corpus.tokens) * 7 // 10  # calibration: first 70 %, held-out: the rest
        region = self.corpus.tokens[:half] if self.parity == 0 else self.corpus.tokens[half:]
        msgs = task_messages(kind, EssayCorpus(tokens=region), self.tok, self.rng, max(8, n - 60))
        return PilotSample(source="needle", kind=kind, label=f"{kind}-{self.n_needle}",
                           token_ids=render(self.tok, msgs, n))

    def sharegpt(self) -> PilotSample:
        n = self.target()
        for cid, msgs in self.chats:
            if _split_of(cid) != self.parity or sum(len(m["content"]) for m in msgs) < CHARS_PER_TOKEN * n:
                continue
            ids = render(self.tok, msgs, n)
            if len(ids) >= self.spec.min_tokens:
                return PilotSample(source="sharegpt", kind="conversation", label=cid, token_ids=ids)
        raise RuntimeError("ran out of ShareGPT conversations long enough for the requested lengths")

    def mtbench_chat(self) -> PilotSample:
        n = self.target()
        msgs = self.mtbench.chat(self.rng, int(CHARS_PER_TOKEN * n * 1.2), parity=self.parity)
        return PilotSample(source="mtbench", kind="chat", label=f"mtbench-{len(msgs)}msgs",
                           token_ids=render(self.tok, msgs, n))

    def draw(self, source: str) -> PilotSample:
        return {"needle": self.needle, "sharegpt": self.sharegpt, "mtbench": self.mtbench_chat}[source]()


def build_samples(tokenizer, spec: SampleSpec, split: str = "calibration") -> list[PilotSample]:
    """spec.count samples of one split, sources round-robin, deterministic in spec.seed."""
    builder = _Builder(tokenizer, spec, split)
    return [builder.draw(spec.sources[i % len(spec.sources)]) for i in range(spec.count)]
