"""KV-token scorers (see base.py for the contract)."""

from .base import KeyNormScorer, Scorer, ScorerState

__all__ = ["KeyNormScorer", "Scorer", "ScorerState"]
