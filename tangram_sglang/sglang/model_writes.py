"""What a served model's own code does with K/V besides handing it to attention: made to go through
the Tangram backend, or refused at start-up.

Fused set-KV (Qwen3-MoE, gpt-oss, Bailing-MoE, ...: fused_set_kv_architectures below): the
model file asks ``enable_fused_set_kv_buffer(forward_batch)`` whether to write K/V into SGLang's token
pool inside its rotary kernel, then calls attention with ``save_kv_cache=False``. Under a profile that
pool is a one-page stub and the Tangram backend owns no token pool: the check crashed the scheduler on
a CPU (it asks the backend for the pool) and on a GPU would write into the stub. Each such module's
check answers False once the backend is built, so the model writes through forward_extend /
forward_decode like every other (what SGLang does itself for a pool that is not bf16).

Learned attention sinks (a logit per head that every softmax includes): the ragged kernels have no
such term, so a model whose attention modules carry one is refused when the backend is built. Sliding
windows: each attention layer's window (SGLang's ``sliding_window_size``, window - 1) must be the
profile's, which is what the Tangram data plane masks with.
"""

from __future__ import annotations

import os
import re
import sys

FUSED_CHECK = "enable_fused_set_kv_buffer"
SINK_ATTRS = ("sinks", "attention_sink_bias")


def _never(forward_batch) -> bool:
    return False


def route_kv_writes_through_backend(model) -> list[str]:
    """Point the fused-write check of every SGLang module ``model`` is built from at ``_never``.
    Returns the module names patched (idempotent)."""
    names = {type(m).__module__ for m in model.modules()}
    patched = []
    for name in sorted(names):
        module = sys.modules.get(name)
        if name.startswith("sglang.srt.models.") and getattr(module, FUSED_CHECK, None) is not None:
            setattr(module, FUSED_CHECK, _never)
            patched.append(name)
    return patched


def learned_sinks(model) -> list[str]:
    """Names of the modules of ``model`` that hold a learned attention-sink tensor."""
    return [name for name, m in model.named_modules()
            if any(getattr(m, attr, None) is not None for attr in SINK_ATTRS)]


def window_mismatches(model, windows) -> list[str]:
    """Attention layers whose SGLang window differs from ``windows`` (per layer, 0: full attention)."""
    bad = []
    for name, m in model.named_modules():
        # the attention modules themselves (gpt-oss's decoder layers carry the model's window whatever their type)
        if type(m).__name__ != "RadixAttention" or not hasattr(m, "sliding_window_size"):
            continue
        sws = m.sliding_window_size
        served = int(sws) + 1 if sws is not None and sws >= 0 else 0
        if served != windows[m.layer_id]:
            bad.append(f"{name} (layer {m.layer_id}: window {served}, the profile's {windows[m.layer_id]})")
    return bad


def fused_set_kv_architectures() -> set[str]:
    """Architectures whose SGLang model file may write K/V through enable_fused_set_kv_buffer
    (read from the installed sglang's model sources: their EntryClass names). Served: under a
    profile they write through the Tangram backend instead (route_kv_writes_through_backend)."""
    import sglang.srt.models as models

    folder = list(models.__path__)[0]  # a namespace package: no __file__
    found: set[str] = set()
    for path in sorted(os.listdir(folder)):
        if not path.endswith(".py") or path == "utils.py":
            continue
        with open(os.path.join(folder, path), encoding="utf-8") as f:
            text = f.read()
        if "enable_fused_set_kv_buffer" not in text:
            continue
        m = re.search(r"^EntryClass\s*=\s*(\[[^\]]*\]|\w+)", text, re.M)
        if m:
            found.update(re.findall(r"\w+", m.group(1)))
    return found
