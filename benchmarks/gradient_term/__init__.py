"""benchmarks/gradient_term/: see benchmarks/README.md."""
