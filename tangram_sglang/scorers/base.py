"""The scorer interface: rate every token of a prefill chunk for every KV head.

One small contract shared by calibration (offline, on a Hugging Face model)
and serving (inside chunked prefill): a scorer sees only tensors.

    scores = scorer.score(q, k, v, state)   # float32 [num_kv_heads, n]

q: [n, num_q_heads, d] the chunk's queries (after RoPE), query head j belongs
   to KV head j // (num_q_heads // num_kv_heads) (GQA);
k, v: [n, num_kv_heads, d] the chunk's keys (after RoPE) and values;
state: a ScorerState for this (request, layer), or None. Scorers that need
   history across chunks (e.g. running query statistics) read and update it;
   every scorer advances state.tokens_seen by n (the caller does not), so
   tokens_seen is the sequence position of the next chunk's first token.
Scorers with ``needs_hidden`` also take ``hidden`` [n, D], the layer's input
hidden states (after its input norm); ``for_layer(l)`` returns the scorer for
layer l's chunks (the same object unless the scorer has per-layer weights).
Higher score = more important. Ties are broken by position (later wins) in
the selection code, not here. Scorers must not modify q, k, v.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ScorerState:
    """Per-(request, layer) memory a scorer may keep across chunks."""

    tokens_seen: int = 0
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


class Scorer:
    """Base class. Subclasses set ``name`` and implement ``score``."""

    name: str = ""
    needs_hidden: bool = False
    needs_reconstruction: bool = False  # scores come from an extra forward pass (scorers/kvzip/)

    def for_layer(self, layer: int) -> "Scorer":
        return self

    def forward_pass(self):
        """How this scorer gets its inputs in the serving forward pass (scorers/forward_pass.py)."""
        from tangram_sglang.scorers.forward_pass import HiddenStatePass, ScoringPass

        return HiddenStatePass(self) if self.needs_hidden else ScoringPass(self)

    def score(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              state: ScorerState | None = None) -> torch.Tensor:
        raise NotImplementedError


class KeyNormScorer(Scorer):
    """Tokens with a small key norm draw attention (Devoto et al. 2024): score = -||k||."""

    name = "key_norm"

    def score(self, q, k, v, state=None):
        if state is not None:
            state.tokens_seen += k.shape[0]
        return -k.float().norm(dim=-1).transpose(0, 1).contiguous()


class HeadShard(Scorer):
    """A scorer of all H KV heads restricted to one tensor-parallel rank's heads.

    For scorers that read the layer's input hidden states (replicated on every rank), so they
    rate every head; the rank keeps the rows of its own heads: float32 [len(heads), n]."""

    def __init__(self, inner: Scorer, heads: list[int]):
        heads = list(heads)
        if heads != list(range(heads[0], heads[0] + len(heads))):
            raise ValueError(f"a rank holds contiguous KV heads, got {heads}")
        self.inner, self.heads = inner, heads
        self.rows = slice(heads[0], heads[0] + len(heads))  # a view, no copy per layer and chunk
        self.name, self.needs_hidden = inner.name, inner.needs_hidden
        self.needs_reconstruction = inner.needs_reconstruction

    def for_layer(self, layer: int) -> "Scorer":
        return HeadShard(self.inner.for_layer(layer), self.heads)

    def score(self, q, k, v, state=None, **kwargs):
        return self.inner.score(q, k, v, state, **kwargs)[self.rows]
