"""A torch-only stand-in for the ``sgl_kernel`` package, for a borrowed GPU without the real one.

SGLang's CUDA code path imports names from ``sgl_kernel`` (sglang-kernel) at import time in many
modules. Where that wheel cannot be installed (it is built against a newer torch than the lent
machine has), ``shims/sgl_kernel`` stands in for it: the ops SGLang calls when serving Llama, Qwen2/3,
Qwen3-MoE and Gemma 3 with ``--attention-backend triton`` are real torch implementations (any device,
float32 inside, the real ops' in-place and return contracts); every other name imports and raises
NotImplementedError naming itself when called; names SGLang imports inside ``try/except ImportError``
with a fallback of its own are left absent so that fallback runs. The table is in
``shims/sgl_kernel/__init__.py``.

Used only where the GPU kit puts ``shims/`` first on PYTHONPATH; nothing here is imported otherwise,
and the CPU set-up keeps its own stand-in (``tangram_sglang.cpu_compat``). The kit also needs
``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1``: the launcher asks the package metadata for sglang-kernel
>= 0.4.9, which a stand-in does not fake.

Performance is torch's, not sgl_kernel's: norms and activations run as a few eager torch ops. Stock
and Tangram servers use the same stand-in, so comparisons between them stay fair.
"""
