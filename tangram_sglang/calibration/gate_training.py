"""Train the FastKVzip-style gates (scorers/fastkvzip.py) to predict KVzip scores.

Training rows come from calibration/kvzip_teacher.py: for sampled tokens, each layer's
input hidden states x [D] and KVzip's score [H] per KV head. A gate is fitted
per layer by Adam on the squared error of log scores (KVzip's scores span four
orders of magnitude; what serving needs is their order within a chunk).

Ranking quality on held-out samples (``gate_ranking``): per sample, layer and
head, the Spearman correlation of the gate's scores with KVzip's, and the
share of KVzip's per-head top ceil(rho n) of each chunk that the gate's top
ceil(rho n) recovers (recall; a random ranking gets rho on average).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tangram_sglang.calibration.kvzip_teacher import SINKS, KVzipSample
from tangram_sglang.calibration.stats import spearman
from tangram_sglang.scorers.fastkvzip import GateShape, LayerGate, new_gates

LOG_FLOOR = 1e-6


def training_rows(samples: list[KVzipSample], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x float32 [N, D], log target float32 [N, H]) of one layer over the samples."""
    xs = [s.hidden[layer].float() for s in samples]
    ys = [torch.log(s.scores[layer][:, s.rows].clamp(min=LOG_FLOOR)).transpose(0, 1) for s in samples]
    return torch.cat(xs), torch.cat(ys)


def fit_layer(gate: LayerGate, x: torch.Tensor, y: torch.Tensor, *, steps: int = 300, lr: float = 3e-3,
              batch: int = 1024, seed: int = 0) -> float:
    """Fit one gate in place; returns the final mean squared error of log scores."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(gate.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (min(batch, x.shape[0]),), generator=gen)
        loss = torch.mean((gate(x[idx]).transpose(0, 1) - y[idx]) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        return float(torch.mean((gate(x).transpose(0, 1) - y) ** 2))


def train_gates(samples: list[KVzipSample], shape: GateShape, *, steps: int = 300, seed: int = 0,
                progress: bool = True) -> tuple[list[LayerGate], list[float]]:
    """One gate per layer fitted on the samples' rows; returns (gates, final loss per layer)."""
    from tqdm import tqdm

    if not samples:
        raise ValueError("gate training needs at least one KVzip sample")
    gates = new_gates(shape, seed)
    losses = []
    for layer in tqdm(range(shape.num_layers), desc="gate training", unit="layer", disable=not progress):
        x, y = training_rows(samples, layer)
        losses.append(fit_layer(gates[layer], x, y, steps=steps, seed=seed + layer))
    return [g.eval() for g in gates], losses


@torch.no_grad()
def gate_scores(gates: list[LayerGate], hidden_by_layer: list[torch.Tensor]) -> list[torch.Tensor]:
    """The gates' log scores [H, n] for each layer's hidden states [n, D]."""
    return [g(x.float()) for g, x in zip(gates, hidden_by_layer)]


def topk_recall(pred: torch.Tensor, truth: torch.Tensor, chunks, ratio: float) -> float:
    """Share of truth's per-head top ceil(ratio n_c) per chunk also in pred's: pred, truth [H, n]."""
    hit = total = 0
    for s, e in chunks:
        k = math.ceil(ratio * (e - s))
        top_t = truth[:, s:e].topk(k, dim=1).indices
        top_p = pred[:, s:e].topk(k, dim=1).indices
        for h in range(truth.shape[0]):
            hit += len(set(top_t[h].tolist()) & set(top_p[h].tolist()))
        total += k * truth.shape[0]
    return hit / max(total, 1)


def gate_ranking(pred: list[list[torch.Tensor]], truth: list[KVzipSample], ratios) -> dict:
    """Held-out ranking quality of the gate against KVzip (module docstring).

    pred[i][l]: the gate's scores [H, n] of sample i in layer l; sinks are left out.
    """
    rho, recall = [], {float(r): [] for r in ratios}
    for scores, sample in zip(pred, truth):
        for layer, (p, t) in enumerate(zip(scores, sample.scores)):
            for h in range(t.shape[0]):
                rho.append(spearman(p[h, SINKS:].numpy(), t[h, SINKS:].numpy()))
            for r in recall:
                recall[r].append(topk_recall(p, t, sample.chunks, r))
    return {
        "spearman_mean": round(float(np.nanmean(rho)), 4),
        "spearman_min": round(float(np.nanmin(rho)), 4),
        "topk_recall": {str(r): round(float(np.mean(v)), 4) for r, v in recall.items()},
        "random_recall": {str(r): r for r in recall},
        "samples": len(truth),
    }
