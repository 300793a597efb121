"""KVzip scores of a sample's entries, chunk by chunk, on a Hugging Face model.

KVzip (Kim et al. 2025, kvpress ``KVzipPress``) rates a cached entry by how
much the model needs it to reproduce its own context. Here, as chunked
prefill would: after chunk [s, e) is prefilled (full KV of everything
before), a reconstruction pass feeds

    repeat instruction (chat template) + the 8 tokens before s + tokens [s, e)

attending to the whole cache; its own KV is then dropped (the cache is cropped
back to e). In layer l the score of chunk entry t for KV head h is the
maximum, over the reconstruction queries and the query heads of h's GQA
group, of the softmax attention paid to t, the softmax taken over the sinks
(positions < 4), the chunk and the reconstruction tokens themselves (causal),
as KVzip does. Scores are float32 [H, n] per layer, in (0, 1].

The same pass records, for gate training, the layer's input hidden states
(after its input norm) of a random subset of the chunk's tokens. A sliding-window
layer (hybrid models) keeps every token: it is not scored (its scores are 1; HF's
cache holds only its window) and the retention's selection spans the full-attention
layers only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from tangram_sglang.calibration.capture import CAPTURE_IMPL, attention_modules, capturing, hidden_inputs
from tangram_sglang.profile import ModelShape
from tangram_sglang.scorers.selection import scoped_topk_counts

REPEAT_PROMPT = "Repeat the previous context exactly."
SINKS = 4
RESUME_TOKENS = 8


@dataclass
class KVzipSample:
    """One sample's KVzip scores and gate-training rows.

    scores: per layer float32 [H, n]; chunks: [(s, e)];
    rows: int64 [k] token positions whose hidden states were kept;
    hidden: float16 [L, k, D]; retention: float64 [R, L, H] of the global top-k per chunk (Eq. 3);
    gate_scores: per layer [H, n], the given gates' scores of every token (empty without gates).
    """

    source: str
    kind: str
    num_tokens: int
    scores: list[torch.Tensor]
    chunks: list[tuple[int, int]]
    rows: torch.Tensor
    hidden: torch.Tensor
    retention: np.ndarray
    gate_scores: list[torch.Tensor]


def repeat_prefix_ids(tokenizer) -> list[int]:
    """The reconstruction instruction as a user turn plus the assistant header."""
    msgs = [{"role": "user", "content": REPEAT_PROMPT}]
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def chunk_scores(query: torch.Tensor, key: torch.Tensor, s: int, e: int) -> torch.Tensor:
    """KVzip scores of the chunk [s, e) from one layer's reconstruction pass: float32 [H, e - s].

    query: [1, Hq, m, d] the reconstruction queries; key: [1, H, e + m, d] the cache
    after the pass (positions 0 .. e - 1, then the m reconstruction tokens).
    """
    _, num_q, m, d = query.shape
    num_kv = key.shape[1]
    group = num_q // num_kv
    sinks = torch.arange(min(SINKS, s))
    cols = torch.cat([sinks, torch.arange(s, e + m)])  # sinks, chunk, reconstruction
    keys = key[0][:, cols].float().repeat_interleave(group, dim=0)  # [Hq, c, d]
    logits = torch.matmul(query[0].float(), keys.transpose(1, 2)) / math.sqrt(d)  # [Hq, m, c]
    own = torch.arange(m)
    future = (cols[None, :] >= e) & ((cols[None, :] - e) > own[:, None])  # causal inside the pass
    probs = torch.softmax(logits.masked_fill(future[None], float("-inf")), dim=-1)
    n_sink = len(sinks)
    chunk = probs[:, :, n_sink:n_sink + (e - s)]  # [Hq, m, n]
    return chunk.amax(dim=1).view(num_kv, group, e - s).amax(dim=1)


@torch.inference_mode()
def kvzip_sample(model, tokenizer, sample, *, chunk_size: int = 512, ratios: tuple[float, ...] = (),
                 gate_rows: int = 256, seed: int = 0, gates=None,
                 resume_tokens: int = RESUME_TOKENS, scope: str = "layer") -> KVzipSample:
    """KVzip scores of one PilotSample (see module docstring); model from pilot.load_model.

    gates: optional per-layer FastKVzip gates, run on every token's hidden states (held-out checks).
    resume_tokens: tokens before the chunk repeated after the instruction (kvpress uses 8; the served
    KVzip scorer uses 0: it knows only the chunk's own ids). scope: of the retention's global top-k
    (selection.SCOPES).
    """
    from transformers import DynamicCache

    if model.config._attn_implementation != CAPTURE_IMPL:
        raise ValueError("model must come from pilot.load_model (capture attention)")
    ids = list(sample.token_ids)
    n = len(ids)
    prefix = repeat_prefix_ids(tokenizer)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(np.arange(SINKS, n), size=max(0, min(gate_rows, n - SINKS)), replace=False))
    num_layers = len(attention_modules(model))
    hidden_rows: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
    layer_scores: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
    predicted: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()   # window layers' caches can then drop the reconstruction tokens
    windows = ModelShape.from_hf_config(model.config).windows
    chunks = [(s, min(n, s + chunk_size)) for s in range(0, n, chunk_size)]
    for s, e in chunks:
        keep = torch.as_tensor(rows[(rows >= s) & (rows < e)] - s)

        def take_hidden(layer, x, keep=keep):
            hidden_rows[layer].append(x[keep].to(torch.float16))
            if gates is not None:
                predicted[layer].append(gates[layer](x.float()))

        with hidden_inputs(model, take_hidden):
            model(input_ids=torch.tensor([ids[s:e]]), past_key_values=cache, use_cache=True, logits_to_keep=1)

        def score(layer, query, key, value, s=s, e=e):
            whole = windows[layer] > 0   # a window layer keeps every token
            layer_scores[layer].append(torch.ones(key.shape[1], e - s) if whole else chunk_scores(query, key, s, e))

        recon = prefix + (ids[max(0, s - resume_tokens):s] if resume_tokens else []) + ids[s:e]
        with capturing(model, score):
            model(input_ids=torch.tensor([recon]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.crop(-len(recon))  # drop the reconstruction tokens: back to e entries
    scores = [torch.cat(per_layer, dim=1) for per_layer in layer_scores]
    retention = _retention(scores, chunks, ratios, n, scope, windows)
    return KVzipSample(source=sample.source, kind=sample.kind, num_tokens=n, scores=scores, chunks=chunks,
                       rows=torch.as_tensor(rows, dtype=torch.int64),
                       hidden=torch.stack([torch.cat(h) for h in hidden_rows]),
                       retention=retention, gate_scores=[torch.cat(p, dim=1) for p in predicted if p])


def _retention(scores: list[torch.Tensor], chunks, ratios, n: int, scope: str = "layer",
               windows: tuple[int, ...] = ()) -> np.ndarray:
    """Per-head share kept by the global top-k of each chunk (of this scope, over the full-attention
    layers; window layers keep everything): float64 [R, L, H]."""
    full = [layer for layer in range(len(scores)) if not (windows and windows[layer])]
    out = np.full((len(ratios), len(scores), scores[0].shape[0]), float(n))
    out[:, full] = 0.0
    for s, e in chunks:
        for i, r in enumerate(ratios):
            out[i][full] += scoped_topk_counts([scores[layer][:, s:e] for layer in full], r, scope).numpy()
    return out / float(n)


def kvzip_pilot(model, tokenizer, samples, cfg, desc: str = "KVzip pilot", progress: bool = True) -> list:
    """The pilot (calibration/pilot.py) for the served KVzip scorer: retention of the global top-k of
    each chunk's KVzip scores, reconstruction as served (no resume tokens). -> [SampleRetention]."""
    from tqdm import tqdm

    from tangram_sglang.calibration.pilot import SampleRetention

    out = []
    for s in tqdm(samples, desc=desc, unit="sample", disable=not progress):
        r = kvzip_sample(model, tokenizer, s, chunk_size=cfg.chunk_size, ratios=cfg.ratios, gate_rows=0,
                         resume_tokens=0, scope=cfg.scope)
        out.append(SampleRetention(source=s.source, kind=s.kind, num_tokens=r.num_tokens, retention=r.retention))
    return out
