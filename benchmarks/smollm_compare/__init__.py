"""benchmarks/smollm_compare/: see benchmarks/README.md."""
