"""Dense end-to-end oracle of what the Tangram server computes for one request.

Independent of ``tangram_sglang.attention``: pure torch on a Hugging Face
Llama / Qwen2 / Qwen3 / Gemma 3 model (``architecture.DenseDecoder``), full K/V stored densely and compression expressed as a
boolean ``kept`` mask per (layer, KV head) over absolute positions. The served
path (paged, ragged, fused kernels) must produce the same greedy tokens.

Semantics for one request, greedy, float32:

* The prompt runs in compression chunks [s, e). In layer l, query position i
  of query head j (KV head h = j // (Hq // H)) attends to
  {p < s : kept[l][h][p]}  ∪  {s <= p <= i}: earlier chunks compressed,
  the current chunk causal and uncompressed. A sliding-window layer (Gemma 3) keeps every
  position and limits each query at i to keys i - window + 1 .. i; selection skips it (and a
  model-scope selection spans the full-attention layers only, as calibration does). Learned
  sinks (gpt-oss) add one logit per query head to every softmax, with a zero value.
* After the chunk's attention in layer l, the method's scorer rates the chunk
  (one ScorerState per layer for the whole request) and a selection policy
  marks what each head keeps. The served policy (``ProfileSelection``): each
  KV head h of group g keeps its own top keep_count(beta[l][g], n) chunk
  positions (ties: the later position wins); all heads of a group keep the same
  count. Benchmarks also run the dynamic method the profile freezes
  (``DynamicSelection``: per-chunk global top-k over the layer's heads, paper
  Eq. 3, or with scope "model" over every layer's heads once the chunk has
  run through all layers) and a uniform budget (``UniformSelection``) through
  the same oracle.
* A reconstruction scorer (KVzip, scorers/kvzip/scorer.py) scores the chunk after it
  has run through every layer: prefix + chunk tokens run once more after it,
  attending to the kept history, the whole chunk and themselves (not stored).
* The first generated token is the argmax at the last prompt position. Every
  decode token at position p attends to all kept positions plus itself and
  earlier decode tokens; decode tokens are never compressed.
* Quantized storage (``kv_dtype``, an FP8 type, scale 1): what the cache holds is stored in it
  and read back as float32. A chunk attends to its own K/V unquantized and its scorer sees them
  so (the served chunk is written after it is scored); a decode token's K/V are stored first,
  then read (as served: written to the pages, then attended).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from tangram_sglang.method.chunks import Cut, Markers, cut_tokens, split_tokens
from tangram_sglang.method.protection import Protection, chunk_protection
from tangram_sglang.oracle.architecture import DenseDecoder
from tangram_sglang.oracle.selection import (  # noqa: F401  (re-exported: the oracle's public names)
    DynamicSelection,
    ProfileSelection,
    UniformSelection,
    head_keep_counts,
    top_positions,
)
from tangram_sglang.scorers import Scorer, ScorerState, get_scorer
from tangram_sglang.scorers.selection import protect_scores


@dataclass
class LayerKV:
    """Dense cache of one layer: k, v float32 [P, H, d] (post-RoPE K), kept bool [H, P]."""

    k: torch.Tensor
    v: torch.Tensor
    kept: torch.Tensor

    @classmethod
    def empty(cls, num_kv_heads: int, head_dim: int) -> "LayerKV":
        return cls(torch.zeros(0, num_kv_heads, head_dim), torch.zeros(0, num_kv_heads, head_dim),
                   torch.zeros(num_kv_heads, 0, dtype=torch.bool))

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store a chunk's k, v [n, H, d]; its positions start not kept (set by the caller)."""
        self.k = torch.cat([self.k, k])
        self.v = torch.cat([self.v, v])
        self.kept = torch.cat([self.kept, torch.zeros(k.shape[1], k.shape[0], dtype=torch.bool)], dim=1)


@dataclass
class ReferenceRun:
    """What reference_run computed.

    tokens: generated ids; chunks: the prompt's (start, end) compression chunks;
    kept: per layer, bool [H, P] over every position of the request (P = prompt
    + fed decode tokens); prompt_logits: float32 [V] at the last prompt position.
    """

    tokens: list[int]
    chunks: list[tuple[int, int]]
    kept: list[torch.Tensor]
    prompt_logits: torch.Tensor
    states: list[ScorerState] = field(default_factory=list)


def chunk_bounds(num_tokens: int, chunk_tokens: list[int] | None = None,
                 chunk_size: int = 512) -> list[tuple[int, int]]:
    """[(start, end)] compression chunks covering [0, num_tokens).

    chunk_tokens, if given, are the chunk lengths (each >= 1, summing to
    num_tokens); otherwise consecutive chunks of chunk_size, the remainder last.
    """
    if chunk_tokens is None:
        chunk_tokens = split_tokens(num_tokens, chunk_size)
    if any(int(n) < 1 for n in chunk_tokens) or sum(chunk_tokens) != num_tokens:
        raise ValueError(f"chunk_tokens {list(chunk_tokens)} must be >= 1 each and sum to {num_tokens}")
    ends = np.cumsum([0] + [int(n) for n in chunk_tokens]).tolist()
    return list(zip(ends[:-1], ends[1:]))


def allowed_keys(kept_before: torch.Tensor, n: int) -> torch.Tensor:
    """Keys each chunk query may see: bool [H, n, s + n].

    kept_before: bool [H, s], the kept mask of the positions before the chunk.
    Row i (chunk position s + i) allows kept earlier positions and chunk
    positions s .. s + i.
    """
    num_heads, s = kept_before.shape
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.cat([kept_before[:, None, :].expand(num_heads, n, s),
                      causal[None].expand(num_heads, n, n)], dim=2)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                     scale: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention over the allowed keys only: [n, Hq, d].

    q: [n, Hq, d]; k, v: [T, H, d]; allowed: bool [H, n, T], shared by the
    Hq // H query heads of each KV head. Scale: 1 / sqrt(d) unless given. sinks: float [Hq],
    one more logit per query head in each softmax, whose value is zero (gpt-oss).
    """
    n, num_q, d = q.shape
    group = num_q // k.shape[1]
    keys = k.transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, T, d]
    vals = v.transpose(0, 1).repeat_interleave(group, dim=0)
    logits = torch.matmul(q.transpose(0, 1), keys.transpose(1, 2))  # [Hq, n, T]
    logits = logits / math.sqrt(d) if scale is None else logits * scale
    mask = allowed.repeat_interleave(group, dim=0)
    logits = logits.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.view(num_q, 1, 1).expand(num_q, n, 1)
        probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        return torch.matmul(probs, vals).transpose(0, 1)
    probs = torch.softmax(logits, dim=-1)
    return torch.matmul(probs, vals).transpose(0, 1)


def check_entry(entry, heads_per_group: int, num_layers: int, num_kv_heads: int) -> None:
    """ValueError unless the entry fits the model and every layer's groups partition its heads."""
    budgets = np.asarray(entry.budgets)
    if budgets.shape != (num_layers, num_kv_heads):
        raise ValueError(f"entry budgets {budgets.shape} do not fit the model ({num_layers}, {num_kv_heads})")
    for layer, groups in enumerate(entry.groups):
        heads = sorted(h for g in groups for h in g)
        if heads != list(range(num_kv_heads)) or any(not 1 <= len(g) <= heads_per_group for g in groups):
            raise ValueError(f"layer {layer}: groups {groups} are not a partition into <= {heads_per_group} heads")


class _DenseTangram:
    """The model run layer by layer with per-head kept masks (see module docstring)."""

    def __init__(self, model, entry, heads_per_group: int, method: str, selection=None,
                 protection: Protection = Protection(), turn_ends: tuple[int, ...] = (), kv_dtype=None,
                 cut: Cut | None = None):
        self.model = model
        self.arch = DenseDecoder(model)
        self.num_q, self.num_kv, self.head_dim = self.arch.num_q, self.arch.num_kv, self.arch.head_dim
        num_layers = self.arch.num_layers
        check_entry(entry, heads_per_group, num_layers, self.num_kv)
        self.entry = entry
        self.selection = selection or ProfileSelection(entry)
        self.protection, self.turn_ends = protection, sorted(turn_ends)
        # the rule's protected runs by chunk start (None: the legacy turn_ends rule, for explicit chunk_tokens)
        self.cut_protect = None if cut is None else dict(zip(cut.starts.tolist(), zip(cut.lead.tolist(),
                                                                                     cut.trail.tolist())))
        self.scorer = method if isinstance(method, Scorer) else get_scorer(method)
        if self.scorer.needs_reconstruction and any(self.arch.windows):
            raise ValueError("a reconstruction scorer reads every cached slot: not with sliding-window layers")
        self.full_layers = [layer for layer, w in enumerate(self.arch.windows) if not w]
        self.cache = [LayerKV.empty(self.num_kv, self.head_dim) for _ in range(num_layers)]
        self.states = [ScorerState() for _ in range(num_layers)]
        self.pending: dict[int, torch.Tensor] = {}  # model scope: layer -> the chunk's protected scores
        self.kv_dtype = kv_dtype

    def _store(self, cache: LayerKV, start: int, end: int) -> None:
        """Positions [start, end) of the cache as the storage type holds them (clamped, rounded)."""
        if self.kv_dtype is None:
            return
        top = torch.finfo(self.kv_dtype).max
        for t in (cache.k, cache.v):
            t[start:end] = t[start:end].clamp(-top, top).to(self.kv_dtype).float()

    def _compress(self, layer: int, q, k, v, start: int, hidden: torch.Tensor) -> None:
        """Score this chunk in this layer and mark what the selection policy keeps (a window
        layer keeps all of it)."""
        if self.arch.windows[layer]:
            self.cache[layer].kept[:, start:start + q.shape[0]] = True
            return
        state = self.states[layer]
        if state.tokens_seen != start:
            raise RuntimeError(f"scorer state at {state.tokens_seen}, chunk starts at {start}")
        scorer = self.scorer.for_layer(layer)
        extra = {"hidden": hidden} if scorer.needs_hidden else {}
        self._select(layer, scorer.score(q, k, v, state, **extra), start)

    def _select(self, layer: int, scores: torch.Tensor, start: int) -> None:
        """Mark the positions of the chunk at start (scores float [H, n]) the selection policy keeps."""
        if torch.isnan(scores).any():
            raise ValueError("scorer returned NaN")
        n = scores.shape[1]
        if self.cut_protect is not None:
            protect = [self.cut_protect[start]]
        else:
            prompt_end = next((t for t in self.turn_ends if t >= start + n), start + n)
            protect = chunk_protection(self.protection, start, [n], prompt_end)
        scores = protect_scores(scores.float().clone()[None], [n], protect)[0]
        if getattr(self.selection, "scope", "layer") == "model":
            self.pending[layer] = scores
            return
        self.cache[layer].kept[:, start:start + n] = self.selection.kept_mask(layer, scores, sum(protect[0]))

    def _select_model(self, start: int) -> None:
        """Model scope: once every layer has scored the chunk at start, select over all of them."""
        if not self.pending:
            return
        if sorted(self.pending) != self.full_layers:
            raise RuntimeError(f"chunk at {start} scored by layers {sorted(self.pending)} only")
        scores = [self.pending.pop(layer) for layer in self.full_layers]
        for layer, mask in zip(self.full_layers, self.selection.kept_masks(scores)):
            self.cache[layer].kept[:, start:start + mask.shape[1]] = mask

    def _reconstruct(self, ids: list[int], start: int) -> None:
        """KVzip: run prefix + chunk after the chunk at start, score the chunk, select (scorers/kvzip/scorer.py).

        The reconstruction tokens attend to the kept history, the whole chunk and themselves; their
        K/V is not stored."""
        n = len(ids)
        rec = list(self.scorer.prefix_ids) + list(ids)
        m = len(rec)
        x = self.arch.embed(rec)
        first = min(start + n, int(self.model.config.max_position_embeddings) - m)  # as the server does
        rope = self.arch.rope(x, torch.arange(first, first + m))
        scores = []
        for layer in range(self.arch.num_layers):
            q, k, v = self.arch.qkv(layer, self.arch.attention_input(layer, x), rope[layer])
            cache = self.cache[layer]
            before = cache.kept[:, :start]
            allowed = torch.cat([before[:, None, :].expand(-1, m, -1), torch.ones(self.num_kv, m, n, dtype=torch.bool),
                                 torch.ones(m, m, dtype=torch.bool).tril()[None].expand(self.num_kv, -1, -1)], dim=2)
            out = masked_attention(q, torch.cat([cache.k, k]), torch.cat([cache.v, v]), allowed, self.arch.scale)
            scores.append(self._kvzip_scores(q, cache.k, k, before, start, n))
            x = self.arch.after_attention(layer, x, out)
        for layer, sc in enumerate(scores):
            self.states[layer].tokens_seen += n
            self._select(layer, sc, start)
        self._select_model(start)

    def _kvzip_scores(self, q, cache_k, k_rec, before, start: int, n: int) -> torch.Tensor:
        """Max softmax probability over reconstruction queries and GQA heads, per chunk entry: [H, n].

        Softmax over the head's first ``sinks`` kept positions, the chunk and the causal reconstruction."""
        m, group = q.shape[0], self.num_q // self.num_kv
        out = torch.zeros(self.num_kv, n)
        for h in range(self.num_kv):
            sinks = torch.nonzero(before[h]).flatten()[: self.scorer.sinks]
            keys = torch.cat([cache_k[sinks, h], cache_k[start:start + n, h], k_rec[:, h]])  # [S + n + m, d]
            logits = torch.einsum("mgd,cd->gmc", q[:, h * group:(h + 1) * group], keys) / math.sqrt(q.shape[-1])
            col = torch.arange(keys.shape[0]) - len(sinks) - n
            logits = logits.masked_fill(col[None, None, :] > torch.arange(m)[None, :, None], float("-inf"))
            probs = torch.softmax(logits, dim=-1)[..., len(sinks):len(sinks) + n]
            out[h] = probs.amax(dim=(0, 1))
        return out

    def forward(self, ids: list[int], start: int, compress: bool) -> torch.Tensor:
        """Run tokens at positions start .. start + n - 1; returns logits float32 [V] of the last.

        compress: score and select this chunk (prefill); else keep it whole (decode).
        """
        n, arch = len(ids), self.arch
        x = arch.embed(ids)  # [n, D]
        rope = arch.rope(x, torch.arange(start, start + n))
        for layer in range(arch.num_layers):
            hidden = arch.attention_input(layer, x)
            q, k, v = arch.qkv(layer, hidden, rope[layer])
            cache = self.cache[layer]
            allowed = arch.window_mask(layer, allowed_keys(cache.kept, n), start)
            cache.append(k, v)
            if not compress:
                self._store(cache, start, start + n)  # decode: written, then read
            out = masked_attention(q, cache.k, cache.v, allowed, arch.scale, arch.sinks(layer))
            x = arch.after_attention(layer, x, out)
            if compress and not self.scorer.needs_reconstruction:
                self._compress(layer, q, k, v, start, hidden)
            elif not compress:
                cache.kept[:, start:] = True
        logits = arch.logits(x[-1:])
        if compress and self.scorer.needs_reconstruction:
            self._reconstruct(ids, start)
        elif compress:
            self._select_model(start)
        if compress:  # the chunk is stored once scored
            for cache in self.cache:
                self._store(cache, start, start + n)
        return logits


@torch.no_grad()
def reference_run(model, entry, *, heads_per_group: int, method: str, prompt_ids: list[int],
                  max_new_tokens: int, chunk_tokens: list[int] | None = None, chunk_size: int = 512,
                  stop_ids: set[int] | frozenset = frozenset(), selection=None,
                  protection: Protection = Protection(), turn_ends=None, kv_dtype=None,
                  markers: Markers | None = None) -> ReferenceRun:
    """reference_generate, also returning the kept masks and chunk bounds (see ReferenceRun).

    Chunks and protected tokens: the served rule (method/chunks.cut_tokens over prompt_ids with
    chunk_size, protection and a chat template's markers) unless chunk_tokens are given; then those
    chunks, with the newest tokens of each turn protected (turn_ends below).

    selection: ProfileSelection(entry) (the default: what the server does), DynamicSelection
    or UniformSelection. protection: sinks and newest prompt tokens every head keeps (as served).
    turn_ends: for a multi-turn prompt, where each turn's request ended (the newest tokens of each
    are protected, as the server did when it served that turn); default [len(prompt_ids)].
    kv_dtype: the KV storage type (an FP8 type: --kv-cache-dtype), None for float32.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    cut = None if chunk_tokens is not None else cut_tokens(prompt_ids, chunk_size, protection, markers)
    chunks = chunk_bounds(len(prompt_ids), chunk_tokens if cut is None else (cut.ends - cut.starts).tolist())
    ends = tuple(turn_ends or ()) + (len(prompt_ids),)
    run = _DenseTangram(model, entry, heads_per_group, method, selection, protection, ends, kv_dtype, cut)
    for s, e in chunks:
        logits = run.forward(prompt_ids[s:e], s, compress=True)
    prompt_logits, tokens = logits, []
    pos = len(prompt_ids)
    while len(tokens) < max_new_tokens:
        tokens.append(int(torch.argmax(logits)))
        if tokens[-1] in stop_ids or len(tokens) == max_new_tokens:
            break
        logits = run.forward(tokens[-1:], pos, compress=False)
        pos += 1
    return ReferenceRun(tokens, chunks, [c.kept.clone() for c in run.cache], prompt_logits, run.states)


def reference_generate(model, entry, *, heads_per_group: int, method: str, prompt_ids: list[int],
                       max_new_tokens: int, chunk_tokens: list[int] | None = None,
                       chunk_size: int = 512, stop_ids: set[int] | frozenset = frozenset(),
                       protection: Protection = Protection(), turn_ends=None, kv_dtype=None,
                       markers: Markers | None = None) -> list[int]:
    """Greedy tokens the server must produce for this prompt (float32).

    model: HF LlamaForCausalLM / Qwen2ForCausalLM, float32, eval. entry: a
    profile RatioEntry (budgets [L, H], groups, group_budget beta [L, G]).
    method: scorer name (scorers.get_scorer) or a Scorer (e.g. profile_scorer's). The prompt is compressed in
    chunks of chunk_tokens (summing to len(prompt_ids)) or as the server cuts it (chunk_size,
    markers), keeping the protected tokens (reference_run). Stops after max_new_tokens
    or at a token in stop_ids (included).
    """
    return reference_run(model, entry, heads_per_group=heads_per_group, method=method, prompt_ids=prompt_ids,
                         max_new_tokens=max_new_tokens, chunk_tokens=chunk_tokens, chunk_size=chunk_size,
                         stop_ids=stop_ids, protection=protection, turn_ends=turn_ends, kv_dtype=kv_dtype,
                         markers=markers).tokens
