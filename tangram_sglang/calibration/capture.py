"""See every attention layer's q, k, v (after RoPE) inside a Hugging Face forward.

``register_capture_attention()`` adds an attention implementation named
``tangram_capture`` to transformers' registries (idempotent): it is SDPA with
SDPA's masks, plus one call per layer to the callback stored on the
attention module by ``capturing(model, callback)``:

    callback(layer_idx, q [1, Hq, n, d], k [1, H, T, d], v [1, H, T, d])

q holds the chunk's queries; k and v the whole cache after this chunk's
update (T = tokens so far), so the chunk's own keys are k[..., -n:, :].
``hidden_inputs(model, sink)`` calls sink(layer_idx, hidden [n, D]) with each
attention layer's input (after its input norm), for scorers that read it.
Works for every model whose attention calls ``ALL_ATTENTION_FUNCTIONS``
(Llama, Qwen2/3, Mistral, Gemma ...), without touching their source.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

CAPTURE_IMPL = "tangram_capture"
_ATTR = "_tangram_capture"


def _capture_forward(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    callback = getattr(module, _ATTR, None)
    if callback is not None:
        callback(module.layer_idx, query, key, value)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register_capture_attention() -> str:
    """Make ``attn_implementation="tangram_capture"`` loadable; returns the name."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(CAPTURE_IMPL, _capture_forward)
    AttentionMaskInterface.register(CAPTURE_IMPL, sdpa_mask)
    return CAPTURE_IMPL


def attention_modules(model) -> list:
    """The model's attention modules (those with a layer_idx and a q projection), by layer."""
    mods = [m for m in model.modules() if hasattr(m, "layer_idx") and
            (hasattr(m, "q_proj") or hasattr(m, "qkv_proj")) and type(m).__name__.endswith("Attention")]
    if not mods:
        raise ValueError(f"found no attention modules in {type(model).__name__}")
    return sorted(mods, key=lambda m: m.layer_idx)


@contextmanager
def capturing(model, callback: Callable):
    """Route every attention layer's tensors to ``callback`` while inside the block."""
    if getattr(model.config, "_attn_implementation", None) != CAPTURE_IMPL:
        raise ValueError(f"load the model with attn_implementation={CAPTURE_IMPL!r} "
                         f"(got {model.config._attn_implementation!r})")
    mods = attention_modules(model)
    for m in mods:
        setattr(m, _ATTR, callback)
    try:
        yield
    finally:
        for m in mods:
            setattr(m, _ATTR, None)


@contextmanager
def hidden_inputs(model, sink):
    """Call sink(layer, hidden [n, D]) with every attention layer's input while inside the block."""
    handles = []
    for mod in attention_modules(model):
        def hook(m, args, kwargs, layer=mod.layer_idx):
            x = kwargs.get("hidden_states", args[0] if args else None)
            sink(layer, x[0])
        handles.append(mod.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
