"""Stand-in for torchvision (tangram_sglang.cpu_compat): importable, raises when used.

The registry's torchvision is a CUDA build whose fake-op registrations fail on
CPU torch, and there is no CPU build. sglang imports it at module level for
multimodal preprocessing only; text models never call it. Every submodule
(torchvision.transforms.v2.functional, torchvision.io, ...) imports as a
placeholder module; calling anything raises NotImplementedError.
"""

from tangram_sglang.cpu_compat.placeholder import install_submodule_placeholders, module_getattr

_REASON = "torchvision has no CPU build for this torch; tangram_sglang's CPU set-up serves text models only"
__version__ = "0.0.0+tangram.cpu.compat"
__getattr__ = module_getattr("torchvision", _REASON)
install_submodule_placeholders("torchvision", _REASON)
