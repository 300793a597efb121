"""Build a TangramProfile from per-head budgets: grouping and split map derived.

Used by the uniform-profile command, by calibration and by the importer of
reference retention data, so every producer derives groups and split maps
the same way.
"""

from __future__ import annotations

import datetime

import numpy as np

from tangram_sglang import __version__
from tangram_sglang.method.grouping import group_heads
from tangram_sglang.method.split_map import profile_split_map
from tangram_sglang.profile.format import CalibrationMeta, ModelShape, RatioEntry, TangramProfile


def make_entry(ratio: float, budgets: np.ndarray, mean: np.ndarray, std: np.ndarray, *,
               heads_per_group: int, grouping: str, parallel_capacity: int) -> RatioEntry:
    """One ratio's entry. budgets, mean, std: float [L, H]."""
    budgets = np.asarray(budgets, dtype=np.float64)
    groups = group_heads(budgets, heads_per_group, grouping)
    return RatioEntry(
        ratio=float(ratio),
        budgets=budgets,
        groups=groups,
        split_map=profile_split_map(budgets, groups, parallel_capacity),
        mean=np.asarray(mean, dtype=np.float64),
        std=np.asarray(std, dtype=np.float64),
    )


def tool_version() -> str:
    return f"tangram_sglang {__version__}"


def today() -> str:
    return datetime.date.today().isoformat()


def build_profile(model: ModelShape, calibration: CalibrationMeta, entries: list[RatioEntry], *,
                  heads_per_group: int, grouping: str, parallel_capacity: int,
                  default_ratio: float | None = None) -> TangramProfile:
    return TangramProfile(
        model=model,
        calibration=calibration,
        heads_per_group=heads_per_group,
        grouping=grouping,
        parallel_capacity=parallel_capacity,
        default_ratio=float(entries[0].ratio if default_ratio is None else default_ratio),
        entries=tuple(entries),
    )
