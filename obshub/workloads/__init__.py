"""Small, real training workloads used by tests, demos and benchmarks."""
