"""What each piece costs in time: served prefill and decode step against stock SGLang, decode attention
on CPU and GPU, the host control plane. Results in benchmarks/results/timing/."""
