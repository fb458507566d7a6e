"""benchmarks/sparsity/: see benchmarks/README.md."""
