"""Real SGLang servers under load: multi-turn throughput at the same KV bytes (concurrency), replicas
behind sglang-router, memory pressure and a soak. Results in benchmarks/results/serving/."""
