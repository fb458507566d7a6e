"""benchmarks/anchor/: see benchmarks/README.md."""
