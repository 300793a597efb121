"""What a serving process knows about Tangram: the loaded profile and its entry.

Built in every scheduler process (one per TP rank; the model runner lives in
the same process) from the path that travelled on ServerArgs, and checked
against the model config SGLang itself loaded, so hub models are checked too.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from tangram_sglang.profile import RatioEntry, TangramProfile

logger = logging.getLogger("tangram_sglang")

POOL_MODE = "ragged"


@dataclass(frozen=True)
class TangramRuntime:
    path: str
    profile: TangramProfile
    entry: RatioEntry
    serving: object = field(default=None, compare=False, repr=False)  # TangramServing (None: profile only)

    def info(self) -> dict:
        """JSON-able summary for /server_info and logs."""
        p, e = self.profile, self.entry
        return {
            "profile": self.path,
            "model": p.model.architecture,
            "method": p.calibration.method,
            "ratio": e.ratio,
            "ratios": list(p.ratios),
            "heads_per_group": p.heads_per_group,
            "grouping": p.grouping,
            "virtual_layers": int(p.model.num_layers * e.num_groups),
            "mean_budget": float(e.budgets.mean()),
            "mean_group_budget": float(e.group_budget.mean()),
            "pool": POOL_MODE,
            "pool_info": _pool_info(self.serving),
        }

    def log_summary(self) -> None:
        i = self.info()
        logger.info(
            "Tangram profile %s: %s, method=%s, ratio=%s, H_p=%d, %d virtual layers, mean budget %.3f",
            i["profile"], i["model"], i["method"], i["ratio"], i["heads_per_group"], i["virtual_layers"],
            i["mean_budget"],
        )


INTEGRITY_ENV = "TANGRAM_INTEGRITY_CHECK"


def _pool_info(serving) -> dict | None:
    """The ragged pool's counters (O(running requests)) and, on demand, the result of its integrity
    check (pool and tree, O(pool)): with TANGRAM_INTEGRITY_CHECK=1 in the server's environment
    (the tests and benchmarks set it), every /server_info runs it."""
    if serving is None or serving.cache is None:
        return None
    info = serving.pool_info()
    if os.environ.get(INTEGRITY_ENV, "0") in ("", "0"):
        info["integrity"] = f"not checked ({INTEGRITY_ENV}=1 checks it on every /server_info)"
        return info
    try:
        serving.check_integrity()
        info["integrity"] = "ok"
    except Exception as exc:  # reported, not raised: /server_info must answer
        info["integrity"] = f"{type(exc).__name__}: {exc}"
    return info
