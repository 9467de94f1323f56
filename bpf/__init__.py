"""obshub bpf stage."""
