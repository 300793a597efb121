"""sgl_kernel.kvcacheio: host-cache (HiCache) transfers, imported at module level by SGLang's host memory
pools and never called without ``--enable-hierarchical-cache``; every name is a placeholder that raises
NotImplementedError when called.

``get_device_accessible_ptr`` is absent on purpose, so SGLang's ``except ImportError`` fallback runs
(raw host addresses, right under CUDA's unified addressing). ``transfer_embedding_ranges_direct``
stays a placeholder: one module imports it unguarded, and the embedding cache, which guards it, also
drops it when ``torch.ops.sgl_kernel`` lacks the op, as it does here.
"""

from ._missing import stand_in_getattr

__getattr__ = stand_in_getattr(__name__, absent=frozenset({"get_device_accessible_ptr"}))
