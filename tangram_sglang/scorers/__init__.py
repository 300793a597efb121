"""KV-token scorers (see base.py for the contract).

Every scorer advances ``state.tokens_seen`` by the chunk length when given a
state, so one ScorerState per (request, layer) passed to every chunk is all a
caller keeps; callers must not advance it themselves.
"""

from tangram_sglang.scorers.base import KeyNormScorer, Scorer, ScorerState
from tangram_sglang.scorers.expected_attention import ExpectedAttentionScorer
from tangram_sglang.scorers.fastkvzip import FastKVzipScorer
from tangram_sglang.scorers.keydiff import KeyDiffScorer
from tangram_sglang.scorers.kvzip import KVzipScorer
from tangram_sglang.scorers.registry import SCORERS, canonical_name, get_scorer, scorer_names
from tangram_sglang.scorers.snapkv import SnapKVScorer
from tangram_sglang.scorers.streaming_llm import StreamingLLMScorer
from tangram_sglang.scorers.uniform import UniformScorer

__all__ = [
    "ExpectedAttentionScorer", "FastKVzipScorer", "KVzipScorer", "KeyDiffScorer", "KeyNormScorer", "SCORERS", "Scorer", "ScorerState",
    "SnapKVScorer", "StreamingLLMScorer", "UniformScorer", "canonical_name", "get_scorer", "scorer_names",
]
