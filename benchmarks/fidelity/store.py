"""Recorded answers of the fidelity benchmark, and the code versions known to give the same answers."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.fidelity.tasks import Conversation


def digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
    return h.hexdigest()[:12]


class RunStore:
    """Recorded answers, one JSON line each, keyed by (model, setting, ratio, conversation, ids, version).

    ``equivalent`` (a JSON file beside the runs) records code versions checked to give the same
    answers as an older one (``--carry-from``): rows of the older version also answer for the newer.
    """

    def __init__(self, path: str):
        self.path, self.lock, self.rows = path, threading.Lock(), {}
        self.run_keys: set[str] = set()  # keys of rows actually run (not aliased through an equivalence)
        self.equiv_path = os.path.join(os.path.dirname(path), "fidelity_versions.json")
        self.equivalent = json.load(open(self.equiv_path)) if os.path.exists(self.equiv_path) else {}
        newer: dict[str, list[str]] = {}
        for new, info in self.equivalent.items():
            newer.setdefault(info["same_as"], []).append(new)
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    if line.strip():
                        row = json.loads(line)
                        self.rows[row["key"]] = row
                        self.run_keys.add(row["key"])
                        self._alias(row, newer)

    def _alias(self, row: dict, newer: dict) -> None:
        """Rows answer for every equivalent newer version; the latest recorded row wins over older
        aliases (a pool row reads the last full run), never over a row run at that version."""
        base, version = row["key"].rsplit("|", 1)
        for new in newer.get(version, ()):
            if f"{base}|{new}" not in self.run_keys:
                self.rows[f"{base}|{new}"] = row
            self._alias({"key": f"{base}|{new}", **{k: v for k, v in row.items() if k != "key"}}, newer)

    def record_equivalence(self, new: str, old: str, evidence: str) -> None:
        self.equivalent[new] = {"same_as": old, "evidence": evidence, "date": time.strftime("%Y-%m-%d")}
        with open(self.equiv_path, "w") as f:
            json.dump(self.equivalent, f, indent=1)

    @staticmethod
    def key(model, setting, ratio, conv: Conversation, version) -> str:
        return "|".join([model, setting, f"{ratio:g}", conv.id, digest(json.dumps(conv.prompt)), version])

    def add(self, row: dict) -> None:
        with self.lock:
            self.rows[row["key"]] = row
            self.run_keys.add(row["key"])
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
