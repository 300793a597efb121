"""sgl_kernel.quantization: imported at module level by SGLang's GGUF support (ggml_*); never called for
unquantized models. Every name is a placeholder that raises NotImplementedError when called."""

from ._missing import stand_in_getattr

__getattr__ = stand_in_getattr(__name__)
