"""What a scorer takes from the serving forward pass: each scorer owns it, as kvpress's presses
own their hooks, so the attention backend (sglang/backend.py) knows no scorer. Per extend batch:

    scoring = scorer.forward_pass()                # once per backend
    scoring.prepare(model, max_positions)         # before each extend: installs its hooks once
    scoring.begin(forward_batch, writers, tokens) # one ChunkWriter per wave (serving/chunk_writer.py) and
                                                  # the wave's rows of the batch (None: all of them)
    o = scoring.attention(layer, q3, k3, v3)      # per layer: None, or the answer of the scorer's own pass
    scoring.chunk(layer_id, q3, k3, v3, wave=w)   # after the wave's attention: score, keep, write (or hold)

A wave is every request's w-th compression chunk of the pass (serving/runtime.py extend_waves):
waves run in order inside each layer, so q3, k3, v3 given to ``chunk`` are the wave's rows.

Three kinds: scores from the chunk's q, k, v (ScoringPass: SnapKV, key norm, ...), from the
layer's input hidden states too (HiddenStatePass: the FastKVzip gates), and from an extra forward
pass after the model's (KVzip: scorers/kvzip/serving_pass.py).
"""

from __future__ import annotations

import torch


class ScoringPass:
    """Scores each layer's chunk from its own q, k, v, right after the layer's attention."""

    def __init__(self, scorer):
        self.scorer = scorer
        self.writers: list = []
        self.tokens: list = []

    @property
    def writer(self):
        """The writer of a one-wave pass (the only kind a scorer that scores after the forward gets)."""
        if len(self.writers) != 1:
            raise RuntimeError(f"tangram: {type(self).__name__} holds one chunk per request, got "
                               f"{len(self.writers)} waves")
        return self.writers[0]

    def prepare(self, model, max_positions: int) -> None:
        pass

    def begin(self, forward_batch, writers, tokens) -> None:
        self.writers, self.tokens = list(writers), list(tokens)

    def attention(self, layer, q3: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor) -> torch.Tensor | None:
        return None

    def chunk(self, layer_id: int, q3: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor, wave: int = 0) -> None:
        self.writers[wave].write(layer_id, self.scorer.for_layer(layer_id), q3, k3, v3)


class HiddenStatePass(ScoringPass):
    """For scorers that read the layer's input hidden states [T, D]: a forward pre-hook on each
    attention module keeps them until the layer's chunk is scored."""

    def __init__(self, scorer):
        super().__init__(scorer)
        self.hidden: dict[int, torch.Tensor] = {}
        self.hooked = False

    def prepare(self, model, max_positions: int) -> None:
        if not self.hooked:
            self.hooked = hook_hidden_inputs(model, self.hidden)

    def chunk(self, layer_id, q3, k3, v3, wave: int = 0) -> None:
        last = wave == len(self.writers) - 1
        hidden = self.hidden.pop(layer_id, None) if last else self.hidden.get(layer_id)
        rows = self.tokens[wave]
        if hidden is not None and rows is not None:
            hidden = hidden.index_select(0, rows)
        self.writers[wave].write(layer_id, self.scorer.for_layer(layer_id), q3, k3, v3, hidden=hidden)


def hook_hidden_inputs(model, store: dict) -> bool:
    """Keep each attention module's input hidden states [T, D] in store[layer_id] (forward
    pre-hooks on the modules holding an SGLang attention layer as ``attn``)."""
    count = 0
    for mod in model.modules():
        attn = getattr(mod, "attn", None)
        if attn is None or not hasattr(attn, "layer_id") or not hasattr(attn, "tp_k_head_num"):
            continue

        def keep(m, args, kwargs, lid=attn.layer_id):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[1]
            store[lid] = x[0] if isinstance(x, tuple) else x

        mod.register_forward_pre_hook(keep, with_kwargs=True)
        count += 1
    if count == 0:
        raise RuntimeError(f"tangram: no attention modules found in {type(model).__name__} to read hidden states")
    return True
