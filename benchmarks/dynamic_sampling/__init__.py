"""benchmarks/dynamic_sampling/: see benchmarks/README.md."""
