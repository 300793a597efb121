"""Stand-in for sgl_kernel on a CPU without a CPU build of it (tangram_sglang.cpu_compat).

With SGLANG_USE_CPU_ENGINE=1, sglang imports a few sgl_kernel names at import
time (cache_move, allocation); on a CPU without AMX none of them is called
while serving Llama/Qwen2 models: the pure-torch fallbacks run. Any name
resolves to a placeholder that raises NotImplementedError if called.
Submodules (sgl_kernel.scalar_type, ...) are deliberately absent so sglang's
own import fallbacks take over.
"""

from tangram_sglang.cpu_compat.placeholder import module_getattr

__version__ = "0.0.0+tangram.cpu.compat"
__getattr__ = module_getattr("sgl_kernel", "no sgl_kernel build for this CPU (tangram_sglang.cpu_compat stand-in)")
