"""The pilot runner: implicit per-head retention of non-uniform compression.

Each sample is prefilled chunk by chunk (chunk_size tokens, as chunked
prefill does) with a full KV cache. In every layer, the scorer rates the
chunk's tokens per KV head from the chunk's q, k, v, and the global top
ceil(rho * H * n) over the layer's flattened scores (paper Eq. 3) decides
which tokens each head would keep, for every target ratio at once. A head's
implicit retention on a sample is its kept count summed over the chunks
divided by the sample's tokens. With scope "model" the top
ceil(rho * L * H * n) over every layer's scores of the chunk decides instead
(selection.py), so the budgets spread across layers as well as heads.

The pilot records the selection but keeps the full KV: later chunks attend
to all earlier tokens. This is the paper's calibration (record the implicit
ratio of the method's own selection); running later chunks against the
compressed cache would change the scores the selection sees only through
the hidden states.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from tangram_sglang.calibration.capture import CAPTURE_IMPL, capturing, hidden_inputs, register_capture_attention
from tangram_sglang.calibration.samples import PilotSample
from tangram_sglang.profile import ModelShape
from tangram_sglang.scorers import Scorer, ScorerState
from tangram_sglang.scorers.selection import SCOPES, scoped_topk_counts


@dataclass(frozen=True, kw_only=True)
class PilotConfig:
    ratios: tuple[float, ...]
    chunk_size: int = 512
    scope: str = "layer"  # selection.SCOPES: the global top-k of one layer (Eq. 3) or of all layers

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"selection scope must be one of {SCOPES}, got {self.scope!r}")
        if not self.ratios:
            raise ValueError("need at least one target ratio")
        for r in self.ratios:
            if not 0.0 < r <= 1.0:
                raise ValueError(f"target ratio must be in (0, 1], got {r}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")


@dataclass(frozen=True)
class SampleRetention:
    source: str
    kind: str
    num_tokens: int
    retention: np.ndarray  # float64 [R, L, H]


def load_model(model_path: str):
    """(model, tokenizer) in float32 on CPU, attention routed through the capture hook."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    impl = register_capture_attention()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation=impl)
    return model.eval(), AutoTokenizer.from_pretrained(model_path)


class _ChunkRecorder:
    """Scores each layer's chunk; ``end_chunk`` adds the global selection's per-head counts.
    Sliding-window layers (windows[l] > 0) are not scored: they keep every token (counted as kept),
    and a model-scope selection spans the full-attention layers only."""

    def __init__(self, scorer: Scorer, ratios: tuple[float, ...], num_layers: int, num_kv: int,
                 scope: str = "layer", windows: tuple[int, ...] = ()):
        self.scorer, self.ratios, self.scope = scorer, ratios, scope
        self.full = [layer for layer in range(num_layers) if not (windows and windows[layer])]
        self.chunk_len = 0
        self.states = [ScorerState() for _ in range(num_layers)]
        self.kept = np.zeros((len(ratios), num_layers, num_kv), dtype=np.int64)
        self.hidden: dict[int, torch.Tensor] = {}
        self.pending: dict[int, torch.Tensor] = {}  # layer -> this chunk's scores [H, n]

    def take_hidden(self, layer: int, x: torch.Tensor) -> None:
        self.hidden[layer] = x

    def __call__(self, layer: int, query, key, value) -> None:
        n = self.chunk_len = query.shape[2]
        if layer not in self.full:
            self.hidden.pop(layer, None)
            return
        q = query[0].transpose(0, 1)  # [n, Hq, d]
        k = key[0, :, -n:].transpose(0, 1)  # [n, H, d]
        v = value[0, :, -n:].transpose(0, 1)
        scorer = self.scorer.for_layer(layer)
        extra = {"hidden": self.hidden.pop(layer)} if scorer.needs_hidden else {}
        self.pending[layer] = scorer.score(q, k, v, self.states[layer], **extra)

    def end_chunk(self) -> None:
        """Select over the chunk's scores (every layer must have scored it) and count."""
        if sorted(self.pending) != self.full:
            raise RuntimeError(f"chunk scored by layers {sorted(self.pending)}, expected {self.full}")
        scores = [self.pending.pop(layer) for layer in self.full]
        for i, r in enumerate(self.ratios):
            self.kept[i] += self.chunk_len   # window layers keep the chunk whole
            self.kept[i][self.full] += scoped_topk_counts(scores, r, self.scope).numpy() - self.chunk_len


def model_dims(model) -> tuple[int, int]:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(cfg.num_hidden_layers), int(cfg.num_key_value_heads or cfg.num_attention_heads)


@torch.inference_mode()
def run_sample(model, sample: PilotSample, scorer: Scorer, cfg: PilotConfig) -> SampleRetention:
    """Prefill one sample in chunks; return its per-head retention for every ratio."""
    from transformers import DynamicCache

    if model.config._attn_implementation != CAPTURE_IMPL:
        raise ValueError("model must come from pilot.load_model (capture attention)")
    num_layers, num_kv = model_dims(model)
    ids = torch.tensor([sample.token_ids], dtype=torch.long)
    recorder = _ChunkRecorder(scorer, cfg.ratios, num_layers, num_kv, cfg.scope,
                              ModelShape.from_hf_config(model.config).windows)
    cache = DynamicCache(config=model.config)
    hooks = hidden_inputs(model, recorder.take_hidden) if scorer.needs_hidden else nullcontext()
    with capturing(model, recorder), hooks:
        for start in range(0, ids.shape[1], cfg.chunk_size):
            model(input_ids=ids[:, start:start + cfg.chunk_size], past_key_values=cache,
                  use_cache=True, logits_to_keep=1)
            recorder.end_chunk()
    return SampleRetention(source=sample.source, kind=sample.kind, num_tokens=ids.shape[1],
                           retention=recorder.kept / float(ids.shape[1]))


def run_pilot(model, samples: list[PilotSample], scorer: Scorer, cfg: PilotConfig,
              desc: str = "pilot", progress: bool = True) -> list[SampleRetention]:
    from tqdm import tqdm

    return [run_sample(model, s, scorer, cfg) for s in tqdm(samples, desc=desc, unit="sample", disable=not progress)]
