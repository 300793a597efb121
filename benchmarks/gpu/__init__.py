"""SGLang served on a GPU with and without a profile, in one call of a lent machine (python -m benchmarks.gpu.run)."""
