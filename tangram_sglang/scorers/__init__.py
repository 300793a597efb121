"""KV-token scorers (see base.py for the contract).

Every scorer advances ``state.tokens_seen`` by the chunk length when given a
state, so one ScorerState per (request, layer) passed to every chunk is all a
caller keeps; callers must not advance it themselves.
"""

from .base import KeyNormScorer, Scorer, ScorerState
from .expected_attention import ExpectedAttentionScorer
from .fastkvzip import FastKVzipScorer
from .keydiff import KeyDiffScorer
from .kvzip import KVzipScorer
from .registry import SCORERS, canonical_name, get_scorer, scorer_names
from .snapkv import SnapKVScorer
from .streaming_llm import StreamingLLMScorer
from .uniform import UniformScorer

__all__ = [
    "ExpectedAttentionScorer", "FastKVzipScorer", "KVzipScorer", "KeyDiffScorer", "KeyNormScorer", "SCORERS", "Scorer", "ScorerState",
    "SnapKVScorer", "StreamingLLMScorer", "UniformScorer", "canonical_name", "get_scorer", "scorer_names",
]
