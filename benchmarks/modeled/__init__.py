"""Computed from profiles, nothing timed on a device: KV memory reclaimed by ragged paging, tensor-parallel
memory, decode load balance. Results in benchmarks/results/modeled/."""
