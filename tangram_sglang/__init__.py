"""Tangram for SGLang: non-uniform per-KV-head cache compression made servable.

Re-exports only; submodules stay light to import (the control plane never
imports transformers or sglang).
"""

__version__ = "0.1.0"
