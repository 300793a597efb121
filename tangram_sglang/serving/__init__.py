"""Serving with a Tangram profile inside SGLang: memory pools, radix tree, admission, attention backend.

Wired in by tangram_sglang.sglang.plugin when ``--tangram-profile`` is given; see
runtime.py for the per-process state every piece shares.
"""
