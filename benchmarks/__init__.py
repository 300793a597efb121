"""Benchmarks of tangram_sglang, run from the repository root as ``python -m benchmarks.<kind>.<name>``.

Kinds: ``fidelity`` (answers against full KV and the peers), ``serving`` (real servers under load),
``timing`` (what each piece costs in time), ``modeled`` (computed from profiles); ``common`` holds the
helpers they share. Results go to ``benchmarks/results/<kind>/``, each file stamped by ``common.stamp``.
"""
