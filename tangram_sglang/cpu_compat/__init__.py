"""Compatibility pieces that let SGLang 0.5.23 serve on a CPU with no GPU build.

Installed by ``launch/setup.sh`` (``python -m tangram_sglang.cpu_compat.install``)
only when the machine has no GPU build of torch. It writes one file,
``tangram_cpu_compat.pth``, into site-packages, which:

1. sets ``SGLANG_USE_CPU_ENGINE=1`` (unless already set), so sglang's
   ``is_cpu()`` is true and its pure-torch CPU paths run;
2. appends ``shims/`` to sys.path (after site-packages, so a real package
   always wins) with two stand-ins:
   - ``sgl_kernel``: sglang imports a few names from it at import time; none
     is called when serving Llama/Qwen2 on a CPU without AMX;
   - ``torchvision``: imported at module level by sglang's multimodal code;
     the registry's build is CUDA-only and breaks on CPU torch.
   Both hand out placeholders that raise NotImplementedError when called.

Nothing in site-packages is edited. ``python -m tangram_sglang.cpu_compat.install
--uninstall`` removes the file.
"""
