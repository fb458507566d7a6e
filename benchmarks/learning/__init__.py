"""benchmarks/learning/: see benchmarks/README.md."""
