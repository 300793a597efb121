"""Helpers the benchmarks share: HTTP client, text corpora, model installs, results paths, stamps, logging."""
