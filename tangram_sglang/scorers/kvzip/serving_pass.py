"""The KVzip reconstruction pass inside SGLang's prefill forward (scorers/kvzip/scorer.py).

KVzipPass (the scorer's forward pass, scorers/forward_pass.py) holds each layer's chunk K/V
back instead of compressing it. When the model's forward returns (logits already computed from
the chunk), ``run_reconstruction`` feeds every request's reconstruction tokens (the scorer's
prefix ids, then the chunk's own ids, at the positions after the chunk) through the model's
layer stack with a shallow copy of the forward batch; the pass answers those attention calls
with ``reconstruction_attention`` (cached pages + held-back chunk + causal reconstruction,
nothing stored) and keeps the scores. Then every layer's chunk is compressed with its scores
into the reserved slots, exactly as the other scorers' chunks are.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from tangram_sglang.scorers.forward_pass import ScoringPass
from tangram_sglang.scorers.kvzip.attention import reconstruction_attention


@dataclass
class ReconstructionPass:
    """State of one forward batch's reconstruction: held-back chunk K/V and the scores per layer."""

    cu_rec: torch.Tensor | None = None  # int64 [B + 1] over the reconstruction tokens
    held: dict[int, tuple] = field(default_factory=dict)  # layer -> (q3, k3, v3) of the chunks
    scores: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> float32 [B, H, n_max]
    active: bool = False  # the layer stack is running the reconstruction tokens

    def hold(self, layer: int, q3, k3, v3) -> None:
        self.held[layer] = (q3, k3, v3)

    def reset(self) -> None:
        self.cu_rec, self.active = None, False
        self.held.clear()
        self.scores.clear()


def reconstruction_inputs(forward_batch, cu_seqlens: torch.Tensor, prefix_ids, max_positions: int) -> tuple:
    """(input_ids [R], positions [R], cu_rec [B + 1]): per request prefix + chunk ids after the chunk.

    Positions continue after the chunk, shifted back where they would pass ``max_positions``
    (the model's context length: RoPE tables end there); the dense oracle applies the same rule."""
    ids, pos = forward_batch.input_ids, forward_batch.positions
    prefix = torch.tensor(prefix_ids, dtype=ids.dtype, device=ids.device)
    cu = cu_seqlens.tolist()
    rec_ids, rec_pos, lens = [], [], []
    for a, e in zip(cu, cu[1:]):
        chunk = ids[a:e]
        rec_ids.append(torch.cat([prefix, chunk]))
        start = min(int(pos[e - 1]) + 1, max_positions - len(prefix) - (e - a))
        rec_pos.append(torch.arange(start, start + len(prefix) + (e - a), dtype=pos.dtype, device=pos.device))
        lens.append(len(prefix) + (e - a))
    cu_rec = torch.zeros(len(lens) + 1, dtype=torch.int64, device=ids.device)
    cu_rec[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0).to(ids.device)
    return torch.cat(rec_ids), torch.cat(rec_pos), cu_rec


def layer_stack(model):
    """The model's decoder stack (``model.model`` for Llama / Qwen2-style models)."""
    stack = getattr(model, "model", None)
    if stack is None or not hasattr(stack, "layers"):
        raise RuntimeError(f"tangram kvzip: {type(model).__name__} has no .model layer stack to run the "
                           "reconstruction pass through")
    return stack


def run_reconstruction(model, forward_batch, cu_seqlens: torch.Tensor, prefix_ids, state: ReconstructionPass,
                       max_positions: int):
    """Run the reconstruction tokens through the layer stack; state.scores fills per layer."""
    ids, pos, cu_rec = reconstruction_inputs(forward_batch, cu_seqlens, prefix_ids, max_positions)
    fb = copy.copy(forward_batch)
    fb.input_ids, fb.positions = ids, pos
    rows = int(ids.shape[0])
    # counts SGLang's layers read to trim padded rows: the reconstruction batch has no padding
    for name, value in (("extend_num_tokens", rows), ("global_num_token_non_padded_cpu", rows),
                        ("residual_stream", None)):
        if hasattr(fb, name):
            setattr(fb, name, value)
    if getattr(fb, "global_num_token_non_padded", None) is not None:
        fb.global_num_token_non_padded = torch.tensor(rows, dtype=fb.global_num_token_non_padded.dtype,
                                                      device=ids.device)
    state.cu_rec, state.active = cu_rec, True
    try:
        layer_stack(model)(ids, pos, fb)
    finally:
        state.active = False


class KVzipPass(ScoringPass):
    """Holds each layer's chunk; after the model's forward, runs the reconstruction pass (the
    wrapped ``model.forward``), then writes every held chunk with its scores."""

    def __init__(self, scorer):
        super().__init__(scorer)
        self.recon = ReconstructionPass()
        self.max_positions: int | None = None

    def prepare(self, model, max_positions: int) -> None:
        if self.max_positions is not None:
            return
        self.max_positions = max_positions
        inner = model.forward

        def forward(*args, **kwargs):
            out = inner(*args, **kwargs)
            if self.recon.held:
                fb = kwargs.get("forward_batch", args[2] if len(args) > 2 else None)
                self._reconstruct_and_write(model, fb)
            return out

        model.forward = forward

    def begin(self, forward_batch, writers, tokens) -> None:
        if len(writers) != 1:   # TangramServing.multi_chunk is off for this scorer
            raise RuntimeError(f"tangram kvzip: a pass holds one chunk per request, got {len(writers)} waves")
        super().begin(forward_batch, writers, tokens)
        self.recon.reset()

    def attention(self, layer, q3, k3, v3):
        if not self.recon.active:
            return None
        lid = layer.layer_id
        _, k_chunk, v_chunk = self.recon.held[lid]
        k_pages, v_pages, table, lens, meta = self.writer.cached(lid)
        o, scores = reconstruction_attention(q3, k3, v3, self.recon.cu_rec, k_chunk, v_chunk, self.writer.cu_seqlens,
                                             k_pages, v_pages, table, lens, meta, layer.scaling,
                                             sinks=self.scorer.sinks)
        self.recon.scores[lid] = scores
        return o

    def chunk(self, layer_id, q3, k3, v3, wave: int = 0) -> None:
        self.recon.hold(layer_id, q3, k3, v3)  # compressed once the reconstruction pass has scored it

    def _reconstruct_and_write(self, model, forward_batch) -> None:
        run_reconstruction(model, forward_batch, self.writer.cu_seqlens, self.scorer.prefix_ids, self.recon,
                           max_positions=self.max_positions)
        for lid, (q3, k3, v3) in sorted(self.recon.held.items()):
            self.writer.write(lid, self.scorer, q3, k3, v3, scores=self.recon.scores[lid])
        self.recon.reset()
