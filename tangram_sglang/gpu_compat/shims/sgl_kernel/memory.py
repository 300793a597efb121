"""``weak_ref_tensor`` for SGLang's CUDA-graph capture, in Python."""

from __future__ import annotations

import torch

from ._missing import stand_in_getattr

__getattr__ = stand_in_getattr(__name__)


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Return ``tensor`` itself, a strong reference where the real op returns a non-owning alias.

    SGLang's piecewise and breakable CUDA-graph capture hand intermediate outputs through this so the
    graph pool may reuse their memory for later captures. Keeping them alive is always correct (no
    block can then be reused while a captured graph still addresses it); it only costs the pool the
    memory of those tensors for as long as SGLang holds them.
    """
    return tensor
