"""benchmarks/reuse/: see benchmarks/README.md."""
