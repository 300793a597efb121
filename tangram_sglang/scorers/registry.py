"""Scorers by name: ``get_scorer("snapkv", window=64) -> Scorer``."""

from __future__ import annotations

from tangram_sglang.scorers.base import KeyNormScorer, Scorer
from tangram_sglang.scorers.expected_attention import ExpectedAttentionScorer
from tangram_sglang.scorers.fastkvzip import FastKVzipScorer
from tangram_sglang.scorers.keydiff import KeyDiffScorer
from tangram_sglang.scorers.kvzip import KVzipScorer
from tangram_sglang.scorers.snapkv import SnapKVScorer
from tangram_sglang.scorers.streaming_llm import StreamingLLMScorer
from tangram_sglang.scorers.uniform import UniformScorer

SCORERS: dict[str, type[Scorer]] = {
    "snapkv": SnapKVScorer,
    "expected_attention": ExpectedAttentionScorer,
    "keydiff": KeyDiffScorer,
    "key_norm": KeyNormScorer,
    "streaming_llm": StreamingLLMScorer,
    "uniform": UniformScorer,
    "fastkvzip": FastKVzipScorer,  # needs trained gates: see profile_scorer
    "kvzip": KVzipScorer,  # needs the repeat prompt's ids (calibration.scorer_args) and a reconstruction pass
}
ALIASES = {"ea": "expected_attention", "keynorm": "key_norm", "streamingllm": "streaming_llm"}


def scorer_names() -> tuple[str, ...]:
    return tuple(SCORERS)


def canonical_name(name: str) -> str:
    """The registry name for ``name`` or an alias; ValueError listing the known ones."""
    key = ALIASES.get(name, name)
    if key not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; known scorers: {', '.join(SCORERS)} "
                         f"(aliases: {', '.join(ALIASES)})")
    return key


def get_scorer(name: str, **options) -> Scorer:
    """A scorer instance; options go to its dataclass (e.g. window=, n_sink=)."""
    cls = SCORERS[canonical_name(name)]
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"bad options for scorer {name!r}: {exc}") from None
