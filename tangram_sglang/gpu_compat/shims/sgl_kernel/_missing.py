"""Module ``__getattr__`` for the stand-in: placeholders for unknown names, AttributeError for absent ones."""

from __future__ import annotations

from tangram_sglang.cpu_compat.placeholder import module_getattr

REASON = (
    "not implemented by tangram_sglang.gpu_compat, the torch stand-in for sgl_kernel "
    "(it covers what SGLang calls for Llama/Qwen/Gemma 3 with the triton attention backend)"
)


def stand_in_getattr(module_name: str, absent: frozenset[str] = frozenset()):
    """``module.__getattr__``: a name in ``absent`` raises AttributeError (so ``from m import name`` raises
    ImportError and SGLang's own fallback runs); any other name is a Placeholder that raises
    NotImplementedError naming ``module_name.name`` when called."""
    placeholder = module_getattr(module_name, REASON)

    def __getattr__(name: str):
        if name in absent:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r} (absent on purpose)")
        return placeholder(name)

    return __getattr__
