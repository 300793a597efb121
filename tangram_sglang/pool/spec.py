"""PoolSpec: the shape of the ragged page pool, with its derived byte sizes.

Virtual layers v = (l, g) are numbered row-major, v = l * G + g, so every
per-virtual-layer vector in this package has length V = L * G and reshapes to
[L, G].

A page holds P slots of one virtual layer; a slot holds K and V of H_p heads
of head_dim d. Every page has the same size, so one free list serves all
virtual layers:

    page_size_bytes = 2 (K and V) * P * H_p * d * itemsize

Worked example: L=32, G=2 (H=8, H_p=4), d=128, P=16, float16:
page_size_bytes = 2 * 16 * 4 * 128 * 2 = 32 KiB, V = 64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


class PoolError(RuntimeError):
    """Misuse of the pool's bookkeeping (double free, unknown request, ...)."""


class RequestTooLargeError(ValueError):
    """A request whose reservation exceeds the whole pool: it can never be admitted."""


@dataclass(frozen=True, kw_only=True)
class PoolSpec:
    num_layers: int
    num_groups: int
    heads_per_group: int
    head_dim: int
    page_size: int
    num_pages: int
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("num_layers", "num_groups", "heads_per_group", "head_dim", "page_size", "num_pages"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"PoolSpec.{name} must be an int >= 1, got {value!r}")
        if self.dtype not in _ITEMSIZE:
            raise ValueError(f"PoolSpec.dtype must be one of {sorted(_ITEMSIZE)}, got {self.dtype!r}")
        if self.num_pages >= 2**31:
            raise ValueError(f"PoolSpec.num_pages must fit int32, got {self.num_pages}")

    @property
    def num_virtual(self) -> int:
        return self.num_layers * self.num_groups

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.page_size * self.heads_per_group * self.head_dim * self.itemsize

    @property
    def pool_bytes(self) -> int:
        return self.num_pages * self.page_size_bytes

    @classmethod
    def for_bytes(cls, budget_bytes: int, **fields) -> "PoolSpec":
        """The spec with as many pages as fit in budget_bytes (fields: all but num_pages)."""
        probe = cls(num_pages=1, **fields)
        pages = budget_bytes // probe.page_size_bytes
        if pages < 1:
            raise ValueError(f"{budget_bytes} bytes hold no page of {probe.page_size_bytes} bytes")
        return cls(num_pages=int(pages), **fields)

    @classmethod
    def from_profile(cls, profile, *, page_size: int, num_pages: int, dtype: str = "float32") -> "PoolSpec":
        """From a TangramProfile (its model shape, heads_per_group and group count)."""
        entry = profile.select()
        return cls(num_layers=profile.model.num_layers, num_groups=entry.num_groups,
                   heads_per_group=profile.heads_per_group, head_dim=profile.model.head_dim,
                   page_size=page_size, num_pages=num_pages, dtype=dtype)
