"""How the dense oracle runs one Hugging Face decoder layer by layer, whatever its family.

Llama / Qwen2: pre-norm blocks, one RoPE, scale 1 / sqrt(d). Qwen3 adds q/k RMS norms. Gemma 3 adds
q/k norms, sandwich norms (each sub-block's output normed before the residual add), scaled
embeddings (inside its embedding module), a query scale of query_pre_attn_scalar ** -0.5, a RoPE per
layer type and sliding-window layers (a query at position i sees keys i - window + 1 .. i).
gpt-oss: window layers, learned attention sinks (one logit per query head in the softmax, value
zero), a mixture-of-experts MLP returning (hidden, router scores), its own RoPE application.
Everything here reads the model's own modules: the oracle stays independent of the served data plane.
"""

from __future__ import annotations

import sys

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from tangram_sglang.profile.format import ModelShape


class DenseDecoder:
    """A float32 HF causal LM seen as: embed -> per layer (norm, q/k/v, attention, residuals) -> logits."""

    def __init__(self, model):
        self.model, self.inner = model, model.model
        cfg = model.config
        self.num_q, self.num_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = self.inner.layers[0].self_attn.head_dim
        self.windows = ModelShape.from_hf_config(cfg).windows  # per layer, 0: full attention
        pre_attn = getattr(cfg, "query_pre_attn_scalar", None)  # Gemma; others: 1 / sqrt(d) (scale None)
        self.scale = float(pre_attn) ** -0.5 if pre_attn else None
        self.layer_types = getattr(cfg, "layer_types", None) if hasattr(self.inner.rotary_emb, "layer_types") else None
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.sandwich = hasattr(self.inner.layers[0], "pre_feedforward_layernorm")
        self.rotate = getattr(sys.modules[type(model).__module__], "apply_rotary_pos_emb", apply_rotary_pos_emb)

    @property
    def num_layers(self) -> int:
        return len(self.inner.layers)

    def embed(self, ids: list[int]) -> torch.Tensor:
        """[n, D] (Gemma's embedding module applies its own scale)."""
        return self.inner.embed_tokens(torch.tensor(ids))

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) of each layer at positions [n]: one RoPE, or one per layer type (Gemma 3)."""
        if self.layer_types is None:
            cs = self.inner.rotary_emb(x[None], positions[None])
            return [cs] * self.num_layers
        by_type = {t: self.inner.rotary_emb(x[None], positions[None], t) for t in set(self.layer_types)}
        return [by_type[t] for t in self.layer_types]

    def qkv(self, layer: int, hidden: torch.Tensor, cos_sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projections of the normed hidden [n, D] -> q [n, Hq, d], k, v [n, H, d]; q, k normed (where the
        model norms them) and after RoPE."""
        attn, n = self.inner.layers[layer].self_attn, hidden.shape[0]
        q = attn.q_proj(hidden).view(1, n, self.num_q, self.head_dim).transpose(1, 2)
        k = attn.k_proj(hidden).view(1, n, self.num_kv, self.head_dim).transpose(1, 2)
        v = attn.v_proj(hidden).view(n, self.num_kv, self.head_dim)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = self.rotate(q, k, *cos_sin)
        return q[0].transpose(0, 1), k[0].transpose(0, 1), v

    def sinks(self, layer: int) -> torch.Tensor | None:
        """float32 [Hq] learned sink logits of the layer (gpt-oss), or None."""
        sinks = getattr(self.inner.layers[layer].self_attn, "sinks", None)
        return None if sinks is None else sinks.float()

    def attention_input(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.inner.layers[layer].input_layernorm(x)

    def after_attention(self, layer: int, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The residual stream after the attention output out [n, Hq, d], then the MLP."""
        block = self.inner.layers[layer]
        o = block.self_attn.o_proj(out.reshape(out.shape[0], -1))
        if self.sandwich:
            x = x + block.post_attention_layernorm(o)
            return x + block.post_feedforward_layernorm(block.mlp(block.pre_feedforward_layernorm(x)))
        x = x + o
        if hasattr(block.mlp, "router"):   # gpt-oss's experts: [batch, n, D] in, (hidden, router scores) out
            return x + block.mlp(block.post_attention_layernorm(x)[None])[0][0]
        return x + block.mlp(block.post_attention_layernorm(x))

    def logits(self, x_last: torch.Tensor) -> torch.Tensor:
        """float32 [V] of the last position's hidden [1, D]."""
        logits = self.model.lm_head(self.inner.norm(x_last))[0].float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def window_mask(self, layer: int, allowed: torch.Tensor, start: int) -> torch.Tensor:
        """allowed bool [H, n, T] (keys 0 .. T - 1, queries at start ..) limited to the layer's window."""
        window = self.windows[layer]
        if not window:
            return allowed
        n, keys = allowed.shape[1], allowed.shape[2]
        query = torch.arange(start, start + n)[:, None]
        return allowed & (torch.arange(keys)[None, :] > query - window)[None]
