"""A FastKVzip-style gate: predict KVzip's score of each entry from the layer's input.

KVzip rates a cached entry by the attention a reconstruction of the context
pays to it (tangram_sglang.calibration.kvzip_teacher). That needs a second pass over
the context; the gate (Kim, Han, Yun 2026; kvpress ``FastKVzipPress``) learns
to predict the score from the hidden state that produced the entry, one token
at a time, so scoring costs two small matmuls beside the prefill.

One layer's gate, for hidden states x [n, D] (the attention's input, after the
layer's input norm), H KV heads, G = Hq / H query heads per KV head:

    q = rmsnorm(W_q x + b_q)  -> [n, H, G, r]     k = rmsnorm(W_k x + b_k) -> [n, H, r]
    e = <q, k> / sqrt(r) + bias[h, g]             (the entry's own logit)
    c_j = <q, base[h, j]> / sqrt(r), j < B        (B learned base keys per head)
    p = exp(e) / (exp(e) + sum_j exp(c_j))        (as a softmax probability, like KVzip's)
    score[h, t] = mean over g of p                -> float32 [H, n]

The scorer returns log(score): the same order, and a scale where the
calibration statistics and the training loss behave.

Gates for all layers are stored in one safetensors file beside the profile
(projection matrices int8 with a scale per row, the rest float16: 3.4 MB for SmolLM2);
the profile names it and its sha256 (``load_gates`` checks both).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import lzma
import math
import os
import shutil
import tempfile
from dataclasses import dataclass

import torch
from torch import nn

from tangram_sglang.scorers.base import Scorer, ScorerState
from tangram_sglang.scorers.common import advance

GATE_FORMAT = "tangram-fastkvzip-gate-v1"


@dataclass(frozen=True)
class GateShape:
    num_layers: int
    hidden_size: int
    num_kv_heads: int
    group: int  # query heads per KV head
    dim: int = 16
    num_base: int = 16


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LayerGate(nn.Module):
    """One layer's gate: hidden [n, D] -> log score float32 [H, n] (see module docstring)."""

    def __init__(self, shape: GateShape):
        super().__init__()
        h, g, r = shape.num_kv_heads, shape.group, shape.dim
        self.shape = shape
        self.q_proj = nn.Linear(shape.hidden_size, h * g * r)
        self.k_proj = nn.Linear(shape.hidden_size, h * r)
        self.q_norm, self.k_norm = _RMSNorm(r), _RMSNorm(r)
        self.base = nn.Parameter(torch.randn(h, shape.num_base, r) * 0.5)
        self.bias = nn.Parameter(torch.zeros(h, g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.shape
        n = x.shape[0]
        x = x.to(self.q_proj.weight.dtype)
        q = self.q_norm(self.q_proj(x).view(n, s.num_kv_heads, s.group, s.dim))
        k = self.k_norm(self.k_proj(x).view(n, s.num_kv_heads, s.dim))
        scale = 1.0 / math.sqrt(s.dim)
        entry = (q * k[:, :, None, :]).sum(-1) * scale + self.bias  # [n, H, G]
        base = torch.einsum("nhgr,hbr->nhgb", q, self.base) * scale  # [n, H, G, B]
        log_p = entry - torch.logsumexp(torch.cat([entry[..., None], base], dim=-1), dim=-1)
        score = torch.logsumexp(log_p, dim=-1) - math.log(s.group)  # log of the mean over G
        return score.transpose(0, 1).float()  # [H, n]


@dataclass(frozen=True, eq=False)
class _BoundGate(Scorer):
    """The gate scorer of one layer (what FastKVzipScorer.for_layer returns)."""

    gate: LayerGate

    name = "fastkvzip"
    needs_hidden = True

    def score(self, q, k, v, state: ScorerState | None = None, hidden: torch.Tensor | None = None):
        if hidden is None:
            raise ValueError("the fastkvzip scorer needs the layer's hidden states (hidden=[n, D])")
        if hidden.shape[0] != k.shape[0]:
            raise ValueError(f"hidden has {hidden.shape[0]} rows, the chunk has {k.shape[0]} tokens")
        if self.gate.q_proj.weight.device != hidden.device:
            self.gate.to(hidden.device)
        with torch.no_grad():
            out = self.gate(hidden)
        advance(state, k.shape[0])
        return out


class FastKVzipScorer(Scorer):
    """Per-layer gates; ``for_layer(l)`` gives the scorer a layer's chunks are scored with."""

    name = "fastkvzip"
    needs_hidden = True

    def __init__(self, gates: list[LayerGate] | None = None):
        if not gates:
            raise ValueError("the fastkvzip scorer needs trained gates: make them with "
                             "`python -m tangram_sglang.calibrate --method fastkvzip` and serve that profile")
        self.gates = gates
        self._bound = [_BoundGate(g) for g in gates]

    def for_layer(self, layer: int) -> Scorer:
        return self._bound[layer]

    def score(self, q, k, v, state=None, hidden=None):
        raise ValueError("the fastkvzip scorer scores per layer: call for_layer(layer).score(...)")


def new_gates(shape: GateShape, seed: int = 0) -> list[LayerGate]:
    torch.manual_seed(seed)
    return [LayerGate(shape) for _ in range(shape.num_layers)]


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pack(name: str, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """Projection matrices as int8 with a float16 scale per output row (a quarter of float32's bytes:
    the file stays small enough to ship beside the profile); everything else float16."""
    v = v.detach().float().cpu()
    if v.dim() != 2:
        return {name: v.to(torch.float16).contiguous()}
    scale = (v.abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(torch.float16)
    q = torch.round(v / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return {name: q.contiguous(), name + ".scale": scale.contiguous()}


def _unpack(f, name: str) -> torch.Tensor:
    v = f.get_tensor(name).float()
    if name + ".scale" in f.keys():
        v = v * f.get_tensor(name + ".scale").float()[:, None]
    return v


def save_gates(gates: list[LayerGate], path: str) -> str:
    """Write every layer's gate to ``path`` (safetensors; matrices int8 per-row scaled, the rest float16;
    load_gates returns float32 modules); returns the file's sha256."""
    from safetensors.torch import save_file

    shape = gates[0].shape
    tensors = {}
    for i, g in enumerate(gates):
        for k, v in g.state_dict().items():
            tensors.update(_pack(f"layers.{i}.{k}", v))
    meta = {"format": GATE_FORMAT, "shape": json.dumps(shape.__dict__)}
    save_file(tensors, path, metadata=meta)
    return file_sha256(path)


@contextlib.contextmanager
def _plain_file(path: str):
    """The gate file itself, or for ``*.xz`` (a shipped gate kept small in the repo; the sha256 is the
    compressed file's) a temporary decompressed copy."""
    if not path.endswith(".xz"):
        yield path
        return
    with lzma.open(path) as src, tempfile.NamedTemporaryFile(suffix=".safetensors") as tmp:
        shutil.copyfileobj(src, tmp)
        tmp.flush()
        yield tmp.name


def load_gates(path: str, sha256: str = "") -> list[LayerGate]:
    """Read a gate file (.safetensors, or .safetensors.xz); ValueError naming the file if it is
    missing, altered or not a gate file."""
    from safetensors import safe_open

    if not os.path.isfile(path):
        raise ValueError(f"fastkvzip gate file {path} does not exist")
    if sha256 and file_sha256(path) != sha256:
        raise ValueError(f"fastkvzip gate file {path} does not match the profile's sha256 {sha256[:12]}... "
                         f"(altered or from another calibration)")
    try:
        with _plain_file(path) as plain, safe_open(plain, framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != GATE_FORMAT:
                raise ValueError(f"fastkvzip gate file {path} is not a {GATE_FORMAT} file")
            gates = new_gates(GateShape(**json.loads(meta["shape"])))
            for i, g in enumerate(gates):
                g.load_state_dict({k: _unpack(f, f"layers.{i}.{k}") for k in g.state_dict()})
    except ValueError:
        raise
    except Exception as exc:  # safetensors' own error types vary by version
        raise ValueError(f"fastkvzip gate file {path} cannot be read: {exc}") from None
    return [g.eval() for g in gates]
