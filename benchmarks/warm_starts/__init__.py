"""benchmarks/warm_starts/: see benchmarks/README.md."""
