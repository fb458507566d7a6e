"""benchmarks/filtering/: see benchmarks/README.md."""
