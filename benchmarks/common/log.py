"""Progress lines of a benchmark: ``[name HH:MM:SS] message``, flushed."""

from __future__ import annotations

import time
from collections.abc import Callable


def logger(name: str) -> Callable[[str], None]:
    def log(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    return log
