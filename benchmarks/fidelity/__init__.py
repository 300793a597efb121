"""Multi-turn fidelity: answers of full KV, Tangram, the dense oracle and kvpress on the same conversations.

Run ``python -m benchmarks.fidelity.run``; the answers it records and the code versions they count for
live in benchmarks/results/fidelity/.
"""

from benchmarks.fidelity.settings import base_setting
from benchmarks.fidelity.store import RunStore
from benchmarks.fidelity.versions import code_version, oracle_files

__all__ = ["RunStore", "base_setting", "code_version", "oracle_files"]
